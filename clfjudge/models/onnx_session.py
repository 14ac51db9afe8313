"""Sessions on an exported ONNX file as every ONNX judge opens them: the classifier backend
(``judges.model.OnnxBackend``) and the embedding judge's decoder reader (``embedders.onnx_reader.OnnxDecoderReader``).

A ``provider`` names what runs the file (``runtimes.PROVIDERS``, filled by the runtimes ``clfjudge/runtimes.py``
registers): onnxruntime on the CPU or on CUDA (``open_cpu`` / ``open_cuda`` here), or OpenVINO compiling the same
file for the CPU in f32 or bf16 (``models.openvino_session``, the optional ``openvino`` extra). Every session answers
the same three calls as an ``onnxruntime.InferenceSession``: ``get_inputs()``, ``get_outputs()`` (items with a
``.name``) and ``run(output_names | None, feed)``.

A provider whose ``precision`` is not fp32 computes other numbers than the exported file's fp32: it runs a judge only
where ``clfjudge export --provider NAME`` measured it through the parity gate (``check_gated``).

``provider="auto"`` (``Judge.load``'s default) runs a judge as its export measured fastest among the runs the gate
passed (the card's ``runtime.onnx.served``: file and provider), where this machine has that provider; else, or when
a variant is named, onnxruntime on the CPU.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..machine import Capability
from ..options import LoadOptions
from ..registry import resolve
from ..runtimes import PROVIDERS, Provider  # the runtimes and their providers (clfjudge/runtimes.py)


def _onnxruntime_session(path: Path, threads: int | None, execution_providers: list[str]) -> Any:
    """An ``onnxruntime.InferenceSession``; ``threads``: intra-op threads (one inter-op thread), default
    onnxruntime's."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=execution_providers)


def open_cpu(path: Path, threads: int | None) -> Any:
    return _onnxruntime_session(path, threads, ["CPUExecutionProvider"])


def open_cuda(path: Path, threads: int | None) -> Any:
    return _onnxruntime_session(path, threads, ["CUDAExecutionProvider", "CPUExecutionProvider"])


AUTO = "auto"  # Judge.load's provider: the card's served run where this machine has it (``resolve_provider``)


def provider_info(name: str) -> Provider:
    """The provider ``name`` (``ValueError`` naming the known ones)."""
    if name not in PROVIDERS:
        raise ValueError(f"unknown provider {name!r}; known: {', '.join(PROVIDERS.names())}")
    return PROVIDERS.get(name)


def resolve_provider(options: LoadOptions, onnx_runtime: Mapping[str, Any]) -> tuple[str | None, str, str]:
    """The (variant, provider, why) an ONNX judge loads with, of the caller's ``options``. ``provider`` "auto" with no
    ``variant`` named: the file and provider the export served (the card's ``runtime.onnx.served``: the fastest run
    its parity gate passed) if that provider runs on this machine; otherwise, and for a named variant, onnxruntime's
    CPU provider."""
    provider, variant = options.provider, options.variant
    if provider != AUTO:
        return variant, provider, "asked for"
    served = onnx_runtime.get("served") or {}
    name, file = served.get("provider", "cpu"), served.get("file")
    if variant is not None or not file:
        return variant, "cpu", "a variant was named" if variant is not None else "the export served no other run"
    runs = PROVIDERS.get(name).available() if name in PROVIDERS else Capability(False, f"unknown provider {name!r}")
    if not runs:
        return variant, "cpu", f"the export served {gate_key(file, name)}, which does not run here: {runs.why}"
    return (None if file == onnx_runtime.get("primary") else file), name, f"served by the export: {runs.why}"


def runnable_providers(names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``names`` split into those that run on this machine and the others, each with why it does not."""
    runs = {name: provider_info(name).available() for name in dict.fromkeys(names)}
    return [n for n, c in runs.items() if c], {n: c.why for n, c in runs.items() if not c}


def inference_session(path: str | Path, provider: str = "cpu", threads: int | None = None) -> Any:
    """A session of ``provider`` on the ONNX file ``path`` (or an OpenVINO IR .xml, for the OpenVINO providers);
    ``threads``: its intra-op threads (None: its default).
    A file whose external data would be read from outside its directory is refused first, whatever the runtime."""
    from ..untrusted import check_onnx_external_data

    try:
        if Path(path).suffix != ".xml":  # an OpenVINO IR reads the .bin of its own name beside it, nothing else
            check_onnx_external_data(path)
        entry = provider_info(provider)
        if not (runs := entry.available()):
            raise ValueError(f"provider {provider!r} does not run on this machine: {runs.why}")
        return resolve(entry.open)(Path(path), threads)
    except (ValueError, OSError, ImportError):  # clfjudge's own refusals, the system's errors, a missing runtime
        raise
    except Exception as exc:  # a file the runtime cannot read (corrupt, truncated): named, as the judge's error
        reason = " ".join(str(exc).split())  # runtimes' messages span lines
        raise ValueError(f"{path}: cannot be opened ({provider}): {type(exc).__name__}: {reason}") from exc


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
