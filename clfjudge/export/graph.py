"""A Hugging Face sequence-classification model as an ONNX graph (``export_onnx``: ``torch.onnx.export`` with
dynamo, the TorchScript exporter its fallback; inputs input_ids / attention_mask [/ token_type_ids] with dynamic
batch and sequence axes, output "logits"), and the graph optimizers (``optimize_onnx``: onnxruntime's transformer
fusions for BERT-like encoders, else its offline graph optimization)."""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..prompts.encoding import MODEL_INPUTS
from ..registry import Registry
from . import quiet

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Above this many bytes of weights the ONNX protobuf (2 GB limit) keeps its tensors in a side file.
EXTERNAL_DATA_BYTES = 1_500_000_000


def _logits_only(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` behind a forward that returns only the logits tensor (the graph's one output)."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, **extra).logits

    return LogitsOnly(model).eval()


def _export_inputs(model: torch.nn.Module, sample: Mapping[str, np.ndarray]) -> list[str]:
    """The tokenizer outputs the model takes, in the wrapper's argument order."""
    import inspect

    accepted = inspect.signature(model.forward).parameters
    names = [k for k in MODEL_INPUTS if k in sample and k in accepted]
    if names[:2] != ["input_ids", "attention_mask"]:
        raise ValueError(f"export needs input_ids and attention_mask from the tokenizer, got {sorted(sample)}")
    return names


def export_onnx(model: torch.nn.Module, sample: Mapping[str, np.ndarray], path: Path,
                opset: int | None = None) -> dict[str, Any]:
    """Write ``model`` (HF sequence classification) to ``path``; dynamo first, legacy exporter on failure.

    Attention is exported in its eager form: the dynamo exporter writes SDPA with a NaN guard (IsNaN + Where
    over every attention matrix) that took 26% of onnxruntime's time on MiniLM at 16 x 256 tokens (eager
    export: 0.84 -> 0.66 s per batch, same logits)."""
    import onnx
    import torch

    if getattr(model.config, "_attn_implementation", "eager") != "eager" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    names = _export_inputs(model, sample)
    args = tuple(torch.from_numpy(np.asarray(sample[k], dtype=np.int64)) for k in names)
    axes = {k: {0: "batch_size", 1: "sequence_length"} for k in names}
    axes["logits"] = {0: "batch_size"}
    wrapped = _logits_only(model)
    external = sum(p.numel() * p.element_size() for p in model.parameters()) > EXTERNAL_DATA_BYTES
    common = dict(input_names=names, output_names=["logits"], dynamic_axes=axes, verbose=False)
    info: dict[str, Any] = {"inputs": names, "output": "logits", "external_data": external}
    try:
        with quiet.torch_onnx_export():
            torch.onnx.export(wrapped, args, str(path), dynamo=True, opset_version=opset, external_data=external,
                              **common)
        info.update(exporter="dynamo", dynamo_error=None)
    except Exception as exc:  # an architecture dynamo cannot capture: record why, use the TorchScript exporter
        if (stop := _stop_inside(exc)) is not None:
            raise stop from exc  # a Ctrl-C / SIGTERM dynamo caught and wrapped while tracing: the user stopped it
        log.warning("dynamo export failed (%s: %s); falling back to the legacy exporter", type(exc).__name__, exc)
        for stale in path.parent.glob(path.name + "*"):
            stale.unlink()
        with quiet.torch_onnx_export():
            torch.onnx.export(wrapped, args, str(path), dynamo=False, opset_version=opset or 17, **common)
        info.update(exporter="legacy", dynamo_error=f"{type(exc).__name__}: {str(exc)[:500]}")
    proto = onnx.load(str(path), load_external_data=False)
    info["opset"] = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return info


def _stop_inside(exc: BaseException) -> BaseException | None:
    """A KeyboardInterrupt or SystemExit in ``exc``'s causes (dynamo re-raises what interrupted its tracing as one
    of its own errors, an ``Exception``), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


# -- graph optimization -----------------------------------------------------------------------------------

def _transformers_optimizer(src: Path, dst: Path, config: Any, external: bool) -> dict[str, Any]:
    """onnxruntime.transformers fusions for BERT-like encoders. EmbedLayerNormalization fusion stays off: the
    quantizer cannot handle it (optimum's default for the same reason)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_embed_layer_norm = False
    model = optimize_model(str(src), model_type="bert", num_heads=config.num_attention_heads,
                           hidden_size=config.hidden_size, optimization_options=options)
    model.save_model_to_file(str(dst), use_external_data_format=external)
    return {"optimizer": "onnxruntime.transformers (bert)", "fused_ops": model.get_fused_operator_statistics()}


def _session_optimizer(src: Path, dst: Path, config: Any, external: bool) -> dict[str, Any]:
    """onnxruntime's offline graph optimization (extended level: CPU fusions; the file then needs onnxruntime)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(dst)
    if external:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", dst.name + ".data")
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    return {"optimizer": "onnxruntime session (ORT_ENABLE_EXTENDED, offline)"}


GRAPH_OPTIMIZERS: Registry[Callable[[Path, Path, Any, bool], dict[str, Any]]] = Registry("graph optimizer")
GRAPH_OPTIMIZERS.register("transformers-bert", _transformers_optimizer)
GRAPH_OPTIMIZERS.register("ort-session", _session_optimizer)
# model_type -> optimizer; anything else gets onnxruntime's generic offline optimization.
OPTIMIZER_OF_MODEL_TYPE = {"bert": "transformers-bert", "roberta": "transformers-bert",
                           "xlm-roberta": "transformers-bert", "deberta-v2": "transformers-bert"}


def optimize_onnx(src: Path, dst: Path, config: Any, external: bool = False) -> dict[str, Any]:
    name = OPTIMIZER_OF_MODEL_TYPE.get(config.model_type, "ort-session")
    return GRAPH_OPTIMIZERS.get(name)(src, dst, config, external)
