"""The lossy variants of a verdict judge's export (``export.verdict``), each made from a question's fp32 graph and
then gated like it: OpenVINO IR files through NNCF (``nncf.compress_weights``, ``nncf.quantize``), and onnxruntime's
dynamic int8. In every one the verdict tokens' rows of the output layer stay fp32 (``export.verdict.head_nodes``):
a handful of columns that carry the decision.

- ``ov-int8-weights``: int8 weights (per output channel, asymmetric); activations as the provider runs them.
- ``ov-int4-weights``: int4 weights (symmetric groups along the input axis) for ``INT4_RATIO`` of the matrices, the
  rest (and the input embeddings) int8, NNCF's data-free mixed precision.
- ``ov-int8``: int8 weights and activations (``nncf.quantize``, SmoothQuant for transformers), the activations'
  ranges measured on a few real prompts that are not the gate's.
- ``ov-int8-mixed``: ``ov-int8`` with the MLPs' down projections left out (``MIXED_KEEP``), run at the provider's
  precision: their inputs (after the gated activation) hold the outliers that one int8 scale per tensor cannot
  cover, as in LLM.int8() and SmoothQuant.
- ``int8``: onnxruntime's dynamic int8 (``export.quantize.quantize_onnx`` with this CPU's settings, clfjudge/configs/
  int8.yaml), asked for with ``--int8``.

``ExportOptions.openvino`` names the IR variants to make (None: ``OPENVINO_VARIANTS``).

An IR file runs on OpenVINO alone (``judges.verdict_onnx.ir_provider`` picks bf16 or f32 activations from the
machine probe); a variant this machine cannot make (OpenVINO or NNCF not installed, OpenVINO not running here, a
quantizer error) is left out, and the parity report says why.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..machine import Capability
from ..registry import Registry
from . import quantize, quiet

INT4_RATIO = 0.8  # NNCF's share of int4 matrices: the rest stay int8, picked by its data-free sensitivity
GROUP_SIZES = (128, 64, 32)  # int4 groups: the largest that divides the decoder's widths (else per channel)
CALIBRATION_PAIRS = 8  # the pairs whose prompts set ov-int8's activation ranges (their answers: twice as many)
MIXED_KEEP = (r".*/mlp/down_proj/MatMul",)  # ov-int8-mixed: node-name patterns of the graphs export.verdict writes


@dataclass(frozen=True)
class QuantInputs:
    """What a quantizer needs besides the fp32 graph: the nodes kept fp32, the int4 group size, the calibration
    feeds of this question's graph (``calibration_feeds``) and the dynamic int8 settings (``--int8``)."""

    keep_fp32: Sequence[str] = ()
    group_size: int = GROUP_SIZES[0]
    calibration: Sequence[Mapping[str, np.ndarray]] = ()
    int8_settings: Any = None


@dataclass(frozen=True)
class QuantVariant:
    """``make(fp32 graph, destination, inputs) -> what was done``; ``precision``: its thresholds in parity.yaml;
    ``runtime``: "openvino" (an IR file) or "onnxruntime" (an ONNX file)."""

    make: Callable[[Path, Path, QuantInputs], dict[str, Any]]
    precision: str
    runtime: str = "openvino"
    calibrated: bool = False  # it needs ``QuantInputs.calibration``
    # weights alone compressed: OpenVINO multiplies them by f32 activations in int8, quantized at run time per small
    # group (``models.openvino_session``), nearer fp32 than bf16 activations, so the gate runs both where bf16 runs
    weights_only: bool = False


def _ignored(names: Sequence[str], patterns: Sequence[str] = ()):
    import nncf

    return nncf.IgnoredScope(names=list(names), patterns=list(patterns), validate=False)


def _save_ir(model, dst: Path) -> None:
    from ..machine import import_openvino

    import_openvino().save_model(model, str(dst), compress_to_fp16=False)


def _read(src: Path):
    from ..machine import openvino_core

    return openvino_core().read_model(str(src))


def weights_int8(src: Path, dst: Path, inputs: QuantInputs) -> dict[str, Any]:
    import nncf

    with quiet.nncf():
        model = nncf.compress_weights(_read(src), mode=nncf.CompressWeightsMode.INT8_ASYM,
                                      ignored_scope=_ignored(inputs.keep_fp32))
    _save_ir(model, dst)
    return {"quantization": "NNCF weight compression", "mode": "int8_asym", "per": "output channel",
            "fp32_nodes": len(inputs.keep_fp32)}


def weights_int4(src: Path, dst: Path, inputs: QuantInputs) -> dict[str, Any]:
    import nncf

    with quiet.nncf():
        model = nncf.compress_weights(_read(src), mode=nncf.CompressWeightsMode.INT4_SYM, ratio=INT4_RATIO,
                                      group_size=inputs.group_size, ignored_scope=_ignored(inputs.keep_fp32))
    _save_ir(model, dst)
    return {"quantization": "NNCF weight compression", "mode": "int4_sym", "ratio": INT4_RATIO,
            "group_size": inputs.group_size, "backup": "int8_asym", "fp32_nodes": len(inputs.keep_fp32)}


def _static(src: Path, dst: Path, inputs: QuantInputs, keep_patterns: Sequence[str] = ()) -> dict[str, Any]:
    import nncf

    if not inputs.calibration:
        raise ValueError("no calibration prompts")
    model = _read(src)
    kept = [op.get_friendly_name() for op in model.get_ops() if op.get_type_name() == "MatMul"
            and any(re.fullmatch(p, op.get_friendly_name()) for p in keep_patterns)]
    if keep_patterns and not kept:
        raise ValueError(f"no MatMul matches {list(keep_patterns)}")
    with quiet.nncf():
        model = nncf.quantize(model, nncf.Dataset(list(inputs.calibration)),
                              model_type=nncf.ModelType.TRANSFORMER, subset_size=len(inputs.calibration),
                              ignored_scope=_ignored([*inputs.keep_fp32, *kept]))
    _save_ir(model, dst)
    return {"quantization": "NNCF post-training int8 (weights and activations)", "model_type": "transformer",
            "calibration_prompts": len(inputs.calibration), "fp32_nodes": len(inputs.keep_fp32),
            **({"not_quantized": {"patterns": list(keep_patterns), "matmuls": len(kept)}} if keep_patterns else {})}


def int8_static(src: Path, dst: Path, inputs: QuantInputs) -> dict[str, Any]:
    return _static(src, dst, inputs)


def int8_static_mixed(src: Path, dst: Path, inputs: QuantInputs) -> dict[str, Any]:
    return _static(src, dst, inputs, MIXED_KEEP)


def dynamic_int8(src: Path, dst: Path, inputs: QuantInputs) -> dict[str, Any]:
    return quantize.quantize_onnx(src, dst, inputs.int8_settings, external=True)


VARIANTS: Registry[QuantVariant] = Registry("verdict quantized variant")
VARIANTS.register("ov-int8-weights", QuantVariant(weights_int8, "int8-weights", weights_only=True))
VARIANTS.register("ov-int4-weights", QuantVariant(weights_int4, "int4-weights", weights_only=True))
VARIANTS.register("ov-int8", QuantVariant(int8_static, "int8-static", calibrated=True))
VARIANTS.register("ov-int8-mixed", QuantVariant(int8_static_mixed, "int8-static", calibrated=True))
VARIANTS.register("int8", QuantVariant(dynamic_int8, "int8", runtime="onnxruntime"))
OPENVINO_VARIANTS = ("ov-int8-weights", "ov-int4-weights", "ov-int8")  # made by default where they can be


def can_make(name: str) -> Capability:
    """Whether this machine makes (and so can gate) variant ``name``: an IR variant needs NNCF and a running
    OpenVINO (``machine.probe``)."""
    import importlib.util

    from .. import machine

    if VARIANTS.get(name).runtime != "openvino":
        return Capability(True, "onnxruntime")
    if not (runs := machine.probe().openvino()):
        return runs
    if importlib.util.find_spec("nncf") is None:
        return Capability(False, "nncf is not installed (pip install 'clfjudge[openvino]')")
    return Capability(True, "OpenVINO and NNCF run here")


def group_size(config: Any) -> int:
    """The largest of ``GROUP_SIZES`` dividing the decoder's hidden and intermediate widths; -1 (per channel) if
    none does."""
    widths = [int(w) for w in (getattr(config, "hidden_size", 0), getattr(config, "intermediate_size", 0)) if w]
    return next((g for g in GROUP_SIZES if all(w % g == 0 for w in widths)), -1)


def calibration_feeds(prompts: Sequence[Sequence[int]]) -> list[dict[str, np.ndarray]]:
    """One graph input per prompt (batch of one, no padding)."""
    return [{"input_ids": np.asarray([p], dtype=np.int64), "attention_mask": np.ones((1, len(p)), dtype=np.int64)}
            for p in prompts]


def make_variants(names: Sequence[str], directory: Path, fp32_files: Sequence[str],
                  inputs: Callable[[int, QuantVariant], QuantInputs], file_of: Callable[[str, int], str],
                  on_step: Callable[[str], None] = lambda step: None
                  ) -> tuple[dict[str, list[str]], dict[str, Any], dict[str, str]]:
    """Each variant of ``names`` made from every question's fp32 graph in ``directory`` (``inputs(question,
    variant)``: its quantizer's inputs; ``file_of(name, question)``: its file). Returns the files per variant made,
    what was done per variant, and why each one left out was."""
    files: dict[str, list[str]] = {}
    info: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in names:
        variant = VARIANTS.get(name)
        if not (ok := can_make(name)):
            skipped[name] = f"not made: {ok.why}"
            continue
        on_step(f"making {name}")
        made: list[str] = []
        try:
            for k, src in enumerate(fp32_files):
                made.append(file_of(name, k))
                info[name] = {"precision": variant.precision,
                              **variant.make(directory / src, directory / made[-1], inputs(k, variant))}
        except Exception as exc:  # noqa: BLE001 - a quantizer's failure leaves its variant out, said in the report
            skipped[name] = f"could not be made: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            info.pop(name, None)
            for graph in made:
                remove_graph(directory, graph)
            continue
        files[name] = made
    return files, info, skipped


def graph_paths(directory: Path, name: str) -> list[Path]:
    """A graph's file and its side files (ONNX external data, an IR's .bin)."""
    return list(directory.glob(Path(name).stem + ".*"))


def remove_graph(directory: Path, name: str) -> None:
    for path in graph_paths(directory, name):
        path.unlink()
