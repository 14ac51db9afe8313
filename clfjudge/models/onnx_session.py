"""Sessions on an exported ONNX file as every ONNX judge opens them: the classifier backend
(``judges.model.OnnxBackend``) and the embedding judge's decoder reader (``embedders.onnx_reader.OnnxDecoderReader``).

A ``provider`` names what runs the file (``PROVIDERS``, one entry each): onnxruntime on the CPU or on CUDA, or
OpenVINO compiling the same file for the CPU in f32 or bf16 (``models.openvino_session``, the optional ``openvino``
extra). Every session answers the same three calls as an ``onnxruntime.InferenceSession``: ``get_inputs()``,
``get_outputs()`` (items with a ``.name``) and ``run(output_names | None, feed)``.

A provider whose ``precision`` is not fp32 computes other numbers than the exported file's fp32: it runs a judge only
where ``clfjudge export --provider NAME`` measured it through the parity gate (``check_gated``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..registry import Registry, resolve


@dataclass(frozen=True)
class Provider:
    """``open``: (path, threads) -> session, or a lazy "module:function" target; ``precision``: the arithmetic it
    runs the fp32 file in ("fp32": the same function up to float rounding; else a parity gate decides)."""

    open: Callable[[Path, int | None], Any] | str
    precision: str = "fp32"


def _onnxruntime(execution_providers: list[str]) -> Callable[[Path, int | None], Any]:
    def open_session(path: Path, threads: int | None) -> Any:
        """An ``onnxruntime.InferenceSession``; ``threads``: intra-op threads (one inter-op thread), default
        onnxruntime's."""
        import onnxruntime as ort

        if execution_providers[0] not in ort.get_available_providers():
            raise ValueError(f"this onnxruntime build lacks {execution_providers[0]} (available: "
                             f"{ort.get_available_providers()}; for CUDA install onnxruntime-gpu)")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), options, providers=execution_providers)

    return open_session


PROVIDERS: Registry[Provider] = Registry("ONNX provider")
PROVIDERS.register("cpu", Provider(_onnxruntime(["CPUExecutionProvider"])))
PROVIDERS.register("cuda", Provider(_onnxruntime(["CUDAExecutionProvider", "CPUExecutionProvider"])))
PROVIDERS.register("openvino", Provider("clfjudge.models.openvino_session:open_f32"))
PROVIDERS.register("openvino-bf16", Provider("clfjudge.models.openvino_session:open_bf16", precision="bf16"))


def provider_info(name: str) -> Provider:
    if name not in PROVIDERS:
        raise ValueError(f"unknown provider {name!r}; known: {', '.join(PROVIDERS.names())}")
    return PROVIDERS.get(name)


def inference_session(path: str | Path, provider: str = "cpu", threads: int | None = None) -> Any:
    """A session of ``provider`` on the ONNX file ``path``; ``threads``: its intra-op threads (None: its default)."""
    entry = provider_info(provider)
    opener = resolve(entry.open) if isinstance(entry.open, str) else entry.open
    return opener(Path(path), threads)


def gate_key(file: str, provider: str) -> str:
    """How a parity report and a judge card name one file run by one provider (onnxruntime CPU: the file alone)."""
    return file if provider == "cpu" else f"{file} @ {provider}"


def check_gated(directory: Path, onnx_runtime: Mapping[str, Any], file: str, provider: str) -> None:
    """Refuse a provider of another precision than fp32 on a file the export did not gate it on (the card's
    ``runtime.onnx.gated``, written by ``clfjudge export --provider``)."""
    precision = provider_info(provider).precision
    if precision == "fp32" or gate_key(file, provider) in onnx_runtime.get("gated", ()):
        return
    elsewhere = [key.split(" @ ")[0] for key in onnx_runtime.get("gated", ()) if key.endswith(f" @ {provider}")]
    hint = (f"it was gated on {elsewhere[0]}: pass that variant (--variant)" if elsewhere else
            f"export it with `clfjudge export --provider {provider}`")
    raise ValueError(f"{directory}: provider {provider!r} runs {file} in {precision}, which the parity gate has not "
                     f"measured on this judge; {hint}")
