"""Export a fine-tuned judge to ONNX, optionally graph-optimize and int8-quantize it, and gate the result on
parity with PyTorch.

``export_judge(judge_dir, out_dir)``:
1. ``torch.onnx.export(dynamo=True)`` of the sequence-classification model (inputs input_ids / attention_mask
   [/ token_type_ids] with dynamic batch and sequence axes, output "logits"); the legacy TorchScript exporter
   is the fallback when dynamo fails for an architecture, and the card records which one ran and why;
2. ``--optimize``: onnxruntime's transformer optimizer for BERT-like encoders, else onnxruntime's own offline
   graph optimization -> model_optimized.onnx;
3. ``--int8``: ``quantize_dynamic`` with the CPU ISA's settings (clfjudge/configs/int8.yaml) -> model_quantized.onnx;
   ``--provider NAME`` (repeatable): also gate model.onnx as another provider runs it (``models.onnx_session``:
   openvino, openvino-bf16), at the thresholds of the provider's precision; the card lists what passed
   (``runtime.onnx.gated``) and a provider of another precision than fp32 loads only where it did;
4. the parity gate: a seeded slice of real labelled records (the card's evaluation / training sources, else
   clfjudge/configs/parity.yaml's defaults), encoded by the judge's own encoder and run in padded, length-bucketed
   batches through PyTorch and through every ONNX file; max |logit diff|, decision agreement and the metric
   delta (accuracy for pair judges, Pearson for point judges) are checked against clfjudge/configs/parity.yaml. Any
   failure removes the temporary output and raises ``ParityError`` naming the threshold and the numbers; with
   ``fallback`` (``--fallback``, as ``make main``), lossy runs that fail (int8, a bf16 provider) are dropped instead
   when every fp32 run passed, and the report says why (``refused``);
5. on success the directory is moved into place: the ONNX files (named as optimum's ORTModel* expect),
   config.json, the tokenizer files, judge_card.json (runtime section: files, primary file, exporter,
   parity summary, and ``served``: the run that read the gate's records fastest among those that passed, which
   ``Judge.load(provider="auto")`` runs) and parity_report.json.
"""
from __future__ import annotations

import json
import logging
import random
import secrets
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..card import JudgeCard
from ..configs import config_path
from ..data.records import Record
from ..judges.base import ONNX_VARIANTS, TORCH_WEIGHTS, open_card
from ..judges.foreign import write_card
from ..judges.model import ModelJudge, OnnxBackend, TorchBackend, load_tokenizer
from ..kinds import EXPORTERS  # kinds exported by another module (clfjudge/kinds.py)
from ..models.heads import HEADS, Head
from ..models.onnx_session import gate_key, provider_info
from ..outputs import check_writable
from ..prompts.chat_template import carry_prompt
from ..prompts.encoding import MODEL_INPUTS
from ..registry import Registry
from . import quiet, signature

if TYPE_CHECKING:
    import onnx
    import torch

log = logging.getLogger(__name__)

PARITY_CONFIG = config_path("parity.yaml")
INT8_CONFIG = config_path("int8.yaml")
REPORT_NAME = "parity_report.json"
# Above this many bytes of weights the ONNX protobuf (2 GB limit) keeps its tensors in a side file.
EXTERNAL_DATA_BYTES = 1_500_000_000


class ParityError(ValueError):
    """An exported model disagrees with PyTorch beyond the thresholds; nothing was written."""

    def __init__(self, message: str, report: dict[str, Any]) -> None:
        super().__init__(message)
        self.report = report


# -- configuration ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Thresholds:
    """Parity thresholds of one precision; None = not gated (still measured and reported)."""

    max_abs_diff: float | None = None  # max |ONNX logit - PyTorch logit|
    min_agreement: float | None = None  # fraction of identical decisions
    max_metric_delta: float | None = None  # |metric(ONNX) - metric(PyTorch)|, metric as a fraction (0.01 = 1 point)
    boundary_eps: float | None = None  # records whose PyTorch decision is this close to flipping are not compared
    min_cosine: float | None = None  # embedding judges: the smallest cosine of an ONNX feature vector with PyTorch's
    batch_tolerance: float | None = None  # stated in the card, not gated: how far a row moves in another batch

    def failures(self, measured: Mapping[str, float]) -> list[str]:
        out = []
        for key, what in (("min_cosine", "feature cosine"), ("shared_min_cosine", "shared-prefix feature cosine")):
            if self.min_cosine is not None and key in measured and not measured[key] >= self.min_cosine:
                out.append(f"{what} {measured[key]:.6f} < min_cosine {self.min_cosine:g}")
        if self.max_abs_diff is not None and not measured["max_abs_diff"] <= self.max_abs_diff:
            out.append(f"max |logit diff| {measured['max_abs_diff']:.3g} > max_abs_diff {self.max_abs_diff:g}")
        if self.min_agreement is not None and not measured["agreement"] >= self.min_agreement:
            out.append(f"decision agreement {measured['agreement']:.2%} < min_agreement {self.min_agreement:.2%}")
        if self.max_metric_delta is not None and not abs(measured["metric_delta"]) <= self.max_metric_delta:
            out.append(f"|{measured['metric']} delta| {abs(measured['metric_delta']):.4f} > max_metric_delta "
                       f"{self.max_metric_delta:g}")
        return out


@dataclass(frozen=True)
class ParityConfig:
    thresholds: dict[str, Thresholds]  # precision ("fp32" | "int8" | "bf16") -> thresholds
    n_records: int = 128
    seed: int = 0
    batch_size: int = 8
    default_sources: dict[str, list[str]] = field(default_factory=dict)  # judge kind -> sources to try
    budget_tflop: float | None = None  # compute one run of the gate may take; None: n_records always
    min_records: int = 16  # the budget never cuts the slice below this

    @classmethod
    def load(cls, path: str | Path = PARITY_CONFIG, overrides: Sequence[str] = ()) -> ParityConfig:
        """Read parity.yaml; ``overrides`` are ``PRECISION.KEY=VALUE`` strings (e.g. ``fp32.max_abs_diff=0``)."""
        import yaml

        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
        known = {f.name for f in fields(Thresholds)}
        thresholds: dict[str, dict[str, Any]] = {}
        for precision, values in (raw.get("thresholds") or {}).items():
            unknown = set(values or {}) - known
            if unknown:
                raise ValueError(f"{path}: thresholds.{precision}: unknown key(s) {sorted(unknown)}; "
                                 f"known: {sorted(known)}")
            thresholds[precision] = dict(values or {})
        for item in overrides:
            key, sep, value = item.partition("=")
            precision, dot, name = key.strip().partition(".")
            if not sep or not dot or name not in known:
                raise ValueError(f"--threshold {item!r}: expected PRECISION.KEY=VALUE with KEY in {sorted(known)}")
            parsed = None if value.strip().lower() in ("none", "null") else float(value)
            thresholds.setdefault(precision, {})[name] = parsed
        validation = raw.get("validation") or {}
        return cls(
            thresholds={p: Thresholds(**{k: None if v is None else float(v) for k, v in t.items()})
                        for p, t in thresholds.items()},
            n_records=int(validation.get("n_records", 128)),
            seed=int(validation.get("seed", 0)),
            batch_size=int(validation.get("batch_size", 8)),
            default_sources={k: list(v) for k, v in (validation.get("default_sources") or {}).items()},
            budget_tflop=None if validation.get("budget_tflop") is None else float(validation["budget_tflop"]),
            min_records=int(validation.get("min_records", 16)),
        )

    def for_precision(self, precision: str) -> Thresholds:
        if precision not in self.thresholds:
            raise ValueError(f"parity config has no thresholds for {precision!r} (has {sorted(self.thresholds)})")
        return self.thresholds[precision]


@dataclass(frozen=True)
class Int8Settings:
    """``quantize_dynamic`` settings for one CPU instruction set (see clfjudge/configs/int8.yaml)."""

    isa: str
    weight_type: str = "QInt8"
    per_channel: bool = False
    reduce_range: bool = False
    op_types: tuple[str, ...] = ("MatMul", "Gemm")
    fp32_inputs_from: tuple[str, ...] = ()  # weight products whose input an op of these types makes stay fp32
    fp32_name_patterns: tuple[str, ...] = ()  # nodes whose name contains one of these stay fp32 (e.g. down_proj)


def cpu_isa() -> str:
    """The int8 instruction set of this machine (``machine.Machine.int8_isa``): avx512_vnni | avx512 | avx2 | arm64."""
    from ..machine import probe

    return probe().int8_isa()[0]


def int8_settings(isa: str = "auto", path: str | Path = INT8_CONFIG) -> Int8Settings:
    import yaml

    path = Path(path)
    table = (yaml.safe_load(path.read_text()) or {}).get("isa") or {}
    name = cpu_isa() if isa == "auto" else isa
    if name not in table:
        raise ValueError(f"{path}: no int8 settings for ISA {name!r} (has {sorted(table)})")
    values = dict(table[name] or {})
    for key in ("op_types", "fp32_inputs_from", "fp32_name_patterns"):
        if key in values:
            values[key] = tuple(values[key])
    known = {f.name for f in fields(Int8Settings)} - {"isa"}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"{path}: isa.{name}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    return Int8Settings(isa=name, **values)


# -- validation slice -------------------------------------------------------------------------------------

def card_sources(card: JudgeCard) -> list[str]:
    """Evaluation sources of the judge's training run, then its training sources."""
    sources = card.training.get("sources") or {}
    return [*(sources.get("eval") or {}), *(sources.get("train") or {})]


def card_read_options(card: JudgeCard, name: str):
    """How the judge's training run read the user data ``name`` (its recorded format, columns and scale), so the
    gate reads it alike; a built-in source or data the run did not read: detected."""
    from ..data.formats import ReadOptions

    recorded = card.training.get("sources") or {}
    for role in ("train", "eval"):
        data = ((recorded.get(role) or {}).get(name) or {}).get("data")
        if data:
            return ReadOptions.make(data.get("format"), data.get("columns"), data.get("scale"))
    return ReadOptions()


def validation_records(card: JudgeCard, head: Head, config: ParityConfig, source: str | None = None,
                       n_records: int | None = None, kind: str | None = None) -> tuple[list[Record], dict[str, Any]]:
    """A seeded sample of labelled records the head can judge: from ``source`` ("name" or "name:N"), else
    from the card's sources, else from the parity config's defaults for ``kind`` (default: the judge's kind)."""
    from ..data import sources

    n = n_records or config.n_records
    if source:
        name, limit = sources.parse_source(source)
        candidates, n = [name], limit or n
    else:
        candidates = list(dict.fromkeys([*card_sources(card), *config.default_sources.get(kind or card.kind, [])]))
    skipped: dict[str, str] = {}
    for name in candidates:
        try:
            usable_source = sources.load_usable(name, head.select, card_read_options(card, name))
        except KeyError:
            skipped[name] = "unknown source"
            continue
        except FileNotFoundError as exc:
            skipped[name] = f"not present ({exc})"
            continue
        result, usable, excluded = usable_source.loaded, usable_source.records, usable_source.excluded
        if not usable:
            skipped[name] = f"no records a {head.name} head can judge (excluded: {dict(excluded)})"
            continue
        sample = random.Random(config.seed).sample(usable, min(n, len(usable)))
        info = {"source": name, "loaded": len(result.records), "usable": len(usable), "n": len(sample),
                "seed": config.seed, "excluded_by_loader": dict(result.excluded),
                "excluded_for_head": dict(excluded), "skipped_sources": skipped}
        return sample, info
    raise ValueError(f"no validation records for the parity gate: tried {candidates or '(no sources)'}"
                     f"{': ' + str(skipped) if skipped else ''}; pass --source NAME")


def within_budget(records: Sequence[Record], lengths: Sequence[Sequence[int]], parameters: int,
                  config: ParityConfig) -> tuple[list[Record], dict[str, Any]]:
    """The first records of the (already seeded, shuffled) slice whose reading fits the gate's compute budget:
    about ``2 x parameters`` FLOPs per token, summed over each record's sequences, at most ``budget_tflop`` per run
    (and never fewer than ``min_records``). A 0.5B decoder reads tens of pairs where an encoder reads them all, so
    a gate of six runs stays in minutes on two cores."""
    if config.budget_tflop is None:
        return list(records), {}
    cost = np.cumsum([2.0 * parameters * sum(lens) / 1e12 for lens in lengths])
    keep = max(min(config.min_records, len(records)), int(np.searchsorted(cost, config.budget_tflop, side="right")))
    info = {"budget_tflop": config.budget_tflop, "parameters": parameters,
            "tokens": int(sum(map(sum, lengths[:keep]))),
            "tflop_per_run": round(float(cost[keep - 1]), 3) if keep else 0.0, "kept": keep, "of": len(records)}
    return list(records[:keep]), info


def read_in_chunks(judge: ModelJudge, records: Sequence[Record], size: int) -> np.ndarray:
    """``judge.raw_outputs`` over consecutive chunks of ``size`` records: the batches every gate run reads alike."""
    return np.concatenate([judge.raw_outputs(records[i:i + size]) for i in range(0, len(records), size)])


def _certain_failure(ref_raw: np.ndarray, raw: np.ndarray, agree: np.ndarray, kept_total: int,
                     thresholds: Thresholds) -> str | None:
    """Why a run already fails whatever the records it has not read give (None: it may still pass)."""
    if thresholds.max_abs_diff is not None and np.abs(raw - ref_raw).max() > thresholds.max_abs_diff:
        return "max |logit diff| over the threshold"
    if thresholds.min_agreement is not None:
        allowed = int(np.floor((1.0 - thresholds.min_agreement) * kept_total + 1e-9))
        if int((~agree).sum()) > allowed:
            return f"{int((~agree).sum())} decisions differ, at most {allowed} may"
    return None


# -- decisions and metric ---------------------------------------------------------------------------------

def _decisions(judge: ModelJudge, raw: np.ndarray) -> list[Any]:
    """What the judge would answer: calibrated verdicts for pair judges, scores rounded to the scale's
    integer steps for point judges."""
    if "compare" in judge.tasks:
        return judge.calibration.verdicts(judge.pair_outputs(raw))
    return np.rint(judge.point_scores(raw)).tolist()


def _metric(judge: ModelJudge, raw: np.ndarray, records: Sequence[Record]) -> tuple[str, float]:
    from ..metrics import correlations, pairwise_metrics

    if "compare" in judge.tasks:
        return "accuracy", pairwise_metrics([r.verdict for r in records], _decisions(judge, raw)).accuracy
    return "pearson", correlations([r.score for r in records], judge.point_scores(raw)).pearson


def decision_slack(judge: ModelJudge, raw: np.ndarray) -> np.ndarray:
    """Per record, how far its decision is from flipping: the smallest gap between the quantities the decision
    compares (P(A) vs P(B), the likelier answer vs P(TIE), |P(A) - P(B)| vs the tie margin; for point judges
    the score vs the nearest rounding boundary)."""
    if "compare" not in judge.tasks:
        scores = judge.point_scores(raw)
        return np.abs(scores - np.floor(scores) - 0.5)
    out = judge.pair_outputs(raw)
    gaps = [np.abs(out.p_a - out.p_b), np.abs(out.p_tie - np.maximum(out.p_a, out.p_b))]
    if judge.calibration.tie_margin is not None:
        gaps.append(np.abs(np.abs(out.p_a - out.p_b) - judge.calibration.tie_margin))
    return np.min(gaps, axis=0)


def compare_to_reference(reference: ModelJudge, candidate: ModelJudge, records: Sequence[Record],
                         ref_raw: np.ndarray | None = None, boundary_eps: float | None = None, *,
                         chunk: int | None = None, stop: Thresholds | None = None) -> dict[str, Any]:
    """Parity numbers of ``candidate`` against ``reference`` on the same records and the same batches.

    With ``boundary_eps``, records whose reference decision is within that slack of flipping are left out of
    the agreement and the metric (and counted): an fp32 graph computes the same function up to float rounding,
    which can tip a decision that sits on a boundary (an undertrained judge puts many there).
    With ``chunk``, the candidate reads ``chunk`` records at a time (``read_in_chunks``: read the reference alike);
    with ``stop`` as well, it stops as soon as it fails those thresholds whatever the rest gives, and the numbers
    are those of the records read (``stopped_early`` says how many and why)."""
    ref_raw = reference.raw_outputs(records) if ref_raw is None else ref_raw
    keep = np.ones(len(records), dtype=bool)
    if boundary_eps:
        keep = decision_slack(reference, ref_raw) > boundary_eps
    if not keep.any():  # everything on a boundary: compare everything rather than nothing
        keep[:] = True
    ref_decisions = _decisions(reference, ref_raw)
    size = chunk or len(records)
    parts, seconds, stopped = [], 0.0, None
    for start in range(0, len(records), size):
        began = time.perf_counter()
        parts.append(candidate.raw_outputs(records[start:start + size]))
        seconds += time.perf_counter() - began
        read = start + len(parts[-1])
        if stop is not None and read < len(records):
            raw = np.concatenate(parts)
            agree = np.array([a == b for a, b in zip(ref_decisions[:read], _decisions(candidate, raw))])[keep[:read]]
            why = _certain_failure(ref_raw[:read], raw, agree, int(keep.sum()), stop)
            if why:
                stopped = {"read": read, "of": len(records), "why": why}
                break
    raw = np.concatenate(parts)
    n = len(raw)
    ref_raw, keep, records = ref_raw[:n], keep[:n], records[:n]
    diff = np.abs(raw - ref_raw)
    idx = np.flatnonzero(keep) if keep.any() else np.arange(n)
    kept = [records[i] for i in idx]
    metric, ref_value = _metric(reference, ref_raw[idx], kept)
    value = _metric(candidate, raw[idx], kept)[1]
    agree = np.mean([a == b for a, b in zip(_decisions(reference, ref_raw[idx]), _decisions(candidate, raw[idx]))])
    return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()), "agreement": float(agree),
            "metric": metric, "metric_reference": float(ref_value), "metric_onnx": float(value),
            "metric_delta": float(value - ref_value), "on_boundary": int(n - len(idx)),
            "records_per_s": n / max(seconds, 1e-9),  # what "served" is chosen by
            **({"stopped_early": stopped} if stopped else {})}


# -- ONNX export ------------------------------------------------------------------------------------------

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
        log.warning("dynamo export failed (%s: %s); falling back to the legacy exporter", type(exc).__name__, exc)
        for stale in path.parent.glob(path.name + "*"):
            stale.unlink()
        with quiet.torch_onnx_export():
            torch.onnx.export(wrapped, args, str(path), dynamo=False, opset_version=opset or 17, **common)
        info.update(exporter="legacy", dynamo_error=f"{type(exc).__name__}: {str(exc)[:500]}")
    proto = onnx.load(str(path), load_external_data=False)
    info["opset"] = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return info


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


# -- quantization -----------------------------------------------------------------------------------------

def fp32_nodes(model: onnx.ModelProto, producer_types: Sequence[str]) -> list[str]:
    """Names of the nodes whose first input is produced by an op of one of ``producer_types``."""
    producer = {out: node.op_type for node in model.graph.node for out in node.output}
    return [node.name for node in model.graph.node
            if node.input and producer.get(node.input[0]) in set(producer_types)]


def quantize_onnx(src: Path, dst: Path, settings: Int8Settings, external: bool = False) -> dict[str, Any]:
    """Dynamic int8 quantization. Stale ``value_info`` from the dynamo exporter breaks the quantizer's shape
    inference, so it is cleared first; DefaultTensorType covers fused (optimized) nodes without type info."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src))
    model.graph.ClearField("value_info")
    prepared = dst.with_name(dst.stem + ".prepared.onnx")
    # named after the prepared file, so that the cleanup below finds it (onnx's default name is a random uuid)
    onnx.save(model, str(prepared), save_as_external_data=external, all_tensors_to_one_file=True,
              location=prepared.name + ".data")
    excluded = fp32_nodes(model, settings.fp32_inputs_from)
    excluded += [n.name for n in model.graph.node if n.name not in excluded
                 and any(p in n.name for p in settings.fp32_name_patterns)]
    try:
        with quiet.quantization():
            quantize_dynamic(str(prepared), str(dst), weight_type=QuantType[settings.weight_type],
                             per_channel=settings.per_channel, reduce_range=settings.reduce_range,
                             op_types_to_quantize=list(settings.op_types), nodes_to_exclude=excluded,
                             use_external_data_format=external,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        for leftover in dst.parent.glob(prepared.name + "*"):
            leftover.unlink()
    return {"quantization": "dynamic", **asdict(settings), "fp32_nodes": len(excluded)}


def quantize_int4(src: Path, dst: Path, block_size: int = 32, nodes_to_exclude: Sequence[str] = ()) -> dict[str, Any]:
    """Weight-only int4 (onnxruntime's MatMulNBits, symmetric blocks of ``block_size`` along each weight's input
    axis; accuracy level 4: the activations meet the weights in int8, as the CPU kernels are fastest). ``dst`` keeps
    its tensors in ``dst.name + ".data"``."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=4)
    with quiet.quantization():
        quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), nodes_to_exclude=list(nodes_to_exclude),
                                         algo_config=config)
        quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=True)
    return {"quantization": "weight-only int4 (MatMulNBits)", "block_size": block_size, "symmetric": True,
            "accuracy_level": 4, "fp32_nodes": len(nodes_to_exclude)}


# -- the whole export -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GateRun:
    """One file run by one provider through the gate: ``key`` names it in the report and the card."""

    key: str
    file: str
    provider: str
    precision: str


def gate_runs(files: Mapping[str, Mapping[str, Any]], fp32_file: str, providers: Sequence[str]) -> list[GateRun]:
    """Every exported file on onnxruntime's CPU provider, then the fp32 file on each of ``providers``."""
    runs = [GateRun(name, name, "cpu", meta["precision"]) for name, meta in files.items()]
    return runs + [GateRun(gate_key(fp32_file, p), fp32_file, p, provider_info(p).precision)
                   for p in dict.fromkeys(providers) if p != "cpu"]


def gate_entry(run: GateRun, measured: Mapping[str, Any], thresholds: Thresholds) -> dict[str, Any]:
    """A report's entry for one run: what was measured, against which thresholds, and the verdict."""
    failures = thresholds.failures(measured)
    return {"precision": run.precision, **({"provider": run.provider} if run.provider != "cpu" else {}), **measured,
            "thresholds": asdict(thresholds), "failures": failures, "passed": not failures}


def gated(report: Mapping[str, Any]) -> list[str]:
    """The card's ``runtime.onnx.gated``: the runs of another provider than onnxruntime's CPU that passed."""
    return [key for key, v in report["variants"].items() if v.get("provider", "cpu") != "cpu" and v["passed"]]


def batch_tolerances(report: Mapping[str, Any]) -> dict[str, float]:
    """The card's ``runtime.onnx.batch_tolerance``: for each run the gate passed, how far a row's numbers may move
    when it is judged in another batch (parity.yaml's ``batch_tolerance`` of its precision; ``Judge.batch_tolerance``
    reads the one a loaded judge runs)."""
    return {key: v["thresholds"]["batch_tolerance"] for key, v in report["variants"].items()
            if v["passed"] and v["thresholds"].get("batch_tolerance") is not None}


@dataclass
class ExportResult:
    out_dir: Path
    primary: str
    report: dict[str, Any]


def _check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"output {out} already exists and is not an empty directory; remove it or pick another --out")
    check_writable(out, directory=True)  # before the export's work, not after it
    out.parent.mkdir(parents=True, exist_ok=True)


def hidden_beside(out: Path) -> Path:
    """A new hidden name beside ``out`` for the folder an export fills, then renames to ``out``. Made inside the
    export's ``try`` (not by ``mkdtemp`` before it), so a stop at any moment (Ctrl-C, SIGTERM) finds it removable."""
    return out.parent / f".{out.name}.{secrets.token_hex(6)}"


def drop_refused(report: dict[str, Any], files: dict[str, Any], tmp: Path) -> bool:
    """``fallback``: when the gate refuses only lossy runs (int8 files, providers computing in bf16) and every fp32
    run passed, move them to ``report["refused"]`` (with the gate's message), delete the files no passing run reads,
    and let the export go on with what passed, so nothing is exported or read twice. False (report untouched) when
    there is nothing to drop or an fp32 run failed."""
    variants = report["variants"]
    refused = [name for name, v in variants.items() if v["precision"] != "fp32" and not v["passed"]]
    if not refused or not all(v["passed"] for v in variants.values() if v["precision"] == "fp32"):
        return False
    reason = "refused by the parity gate: " + " | ".join(_failure_lines(report))
    report["refused"] = {"reason": reason, "variants": {n: variants.pop(n) for n in refused}}
    still_read = {name.split(" @ ")[0] for name in variants}
    for name in [f for f in files if f not in still_read]:
        files.pop(name)
        for path in tmp.glob(name + "*"):
            path.unlink()
    report["passed"] = all(v["passed"] for v in variants.values())
    return True


def served(report: Mapping[str, Any]) -> dict[str, Any]:
    """The card's ``runtime.onnx.served``: of the runs the gate passed, the one that read the gate's records
    fastest (file, provider, records/s), which ``Judge.load(provider="auto")`` runs where it can."""
    key, run = max(((k, v) for k, v in report["variants"].items() if v["passed"]),
                   key=lambda kv: kv[1].get("records_per_s", 0.0))
    return {"file": key.split(" @ ")[0], "provider": run.get("provider", "cpu"),
            "records_per_s": round(run.get("records_per_s", 0.0), 2)}


def _failure_lines(report: dict[str, Any]) -> list[str]:
    return [f"{name} ({v['precision']}): " + "; ".join(v["failures"])
            for name, v in report["variants"].items() if v["failures"]]


def _parity_message(report: dict[str, Any]) -> str:
    return "parity gate failed, nothing was written: " + " | ".join(_failure_lines(report))


# Every gate run reads the records in chunks of this many batches (the reference alike), so a failing run stops
# after a chunk rather than after the whole slice: two batches, as a large model's budgeted slice is a few dozen
# records and a lossy run that fails usually fails on its first sixteen.
GATE_CHUNK_BATCHES = 2


class Stopwatch:
    """Seconds per named step of an export (the parity report's ``seconds``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._started = time.perf_counter()

    @contextmanager
    def __call__(self, step: str):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] = round(time.perf_counter() - began, 2)
            self.seconds["total"] = round(time.perf_counter() - self._started, 2)


def decoder_parameters(model: torch.nn.Module) -> int:
    """Parameters a token's reading multiplies through: all but the input embeddings (a lookup)."""
    embeddings = model.get_input_embeddings()
    skip = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def head_products(path: Path) -> list[str]:
    """The graph's classification head: its last weight product (nodes are stored in topological order, and a
    sequence-classification model ends in its score / classifier layer). Weight-only int4 keeps it fp32: a handful
    of columns cost nothing and carry the decision."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    products = [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1
                and n.input[1] in weights]
    return products[-1:]


def write_variants(tmp: Path, model: torch.nn.Module, sample: Mapping[str, np.ndarray], opset: int | None,
                   clock: Stopwatch, *, optimize: bool, quant: Int8Settings | None, int4: bool
                   ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """model.onnx and the asked-for variants in ``tmp``: the files (name -> precision and how it was made) and
    what the exporter did."""
    fp32 = tmp / ONNX_VARIANTS["fp32"]
    with clock("export fp32"):
        exported = export_onnx(model, sample, fp32, opset)
    external = exported["external_data"]
    files: dict[str, dict[str, Any]] = {fp32.name: {"precision": "fp32"}}
    source_for_int8 = fp32
    if optimize:
        optimized = tmp / ONNX_VARIANTS["optimized"]
        with clock("optimize"):
            files[optimized.name] = {"precision": "fp32", **optimize_onnx(fp32, optimized, model.config, external)}
        source_for_int8 = optimized
    if quant is not None:
        quantized = tmp / ONNX_VARIANTS["int8"]
        with clock("int8"):
            files[quantized.name] = {"precision": "int8", "from": source_for_int8.name,
                                     **quantize_onnx(source_for_int8, quantized, quant, external)}
    if int4:
        weight_only = tmp / ONNX_VARIANTS["int4"]
        with clock("int4"):
            files[weight_only.name] = {"precision": "int4", "from": fp32.name,
                                       **quantize_int4(fp32, weight_only, nodes_to_exclude=head_products(fp32))}
    return files, exported


def _write_judge(tmp: Path, out: Path, card: JudgeCard, judge_dir: Path, config: Any, tokenizer: Any,
                 reference: ModelJudge, files: dict[str, Any], exported: dict[str, Any], primary: str,
                 report: dict[str, Any]) -> None:
    """The gate passed: the report, config, tokenizer, signature and card into ``tmp``, then ``tmp`` -> ``out``."""
    validation, variants = report["validation"], report["variants"]
    (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
    config.save_pretrained(tmp)
    if "input" not in card.truncation:  # a foreign model keeps its own chat template
        carry_prompt(tokenizer, card.scheme, reference.encoder.length_hint)
    tokenizer.save_pretrained(tmp)
    signature.write(tmp, signature.sequence_classification(card, config, tokenizer, tmp, files, primary))
    card.runtime = {**card.runtime, "backend": "onnx", "onnx": {
        "primary": primary, "files": files, **exported, "gated": gated(report), "served": served(report),
        "batch_tolerance": batch_tolerances(report),
        "parity": {"report": REPORT_NAME, "source": validation["source"], "n": validation["n"],
                   **{name: {k: v[k] for k in ("max_abs_diff", "agreement", "metric_delta", "on_boundary")}
                      for name, v in variants.items()}},
        "exported_from": str(judge_dir.resolve()),
    }}
    signature.finish(tmp, out, card)


def export_judge(judge_dir: str | Path, out_dir: str | Path, *, providers: Sequence[str] = (),
                 **options: Any) -> ExportResult:
    """Export, optimize / quantize, gate on parity and write the ONNX judge directory (see the module doc and
    ``_export`` for ``options``). ``providers``: also gate the fp32 file as these run it; one that does not run on
    this machine (``machine.probe``: no bf16 for openvino-bf16, no GPU for cuda) is left out with a warning, never
    an error. The card's ``runtime.machine`` says what this machine could run and why."""
    from ..machine import probe
    from ..models.onnx_session import runnable_providers

    kept, skipped = runnable_providers(providers)
    for name, why in skipped.items():
        log.warning("provider %s is not gated: it does not run on this machine (%s)", name, why)
    result = _export(judge_dir, out_dir, providers=kept, **options)
    card = JudgeCard.load(result.out_dir)
    isa, isa_why = probe().int8_isa()
    card.runtime = {**card.runtime, "machine": {
        "cpu": probe().cpu, "int8_isa": {"value": isa, "why": isa_why},
        "providers": {**{name: {"gated": True} for name in kept}, **{name: {"gated": False, "why": why}
                                                                    for name, why in skipped.items()}}}}
    card.save(result.out_dir)
    return result


def _export(judge_dir: str | Path, out_dir: str | Path, *, int8: bool = False, int4: bool = False,
            optimize: bool = False, opset: int | None = None, isa: str = "auto", source: str | None = None,
            n_records: int | None = None, parity: ParityConfig | None = None,
            int8_config: str | Path = INT8_CONFIG, fallback: bool = False,
            providers: Sequence[str] = (), model_input: str | None = None) -> ExportResult:
    """``int4``: also write the weight-only int4 file (``quantize_int4``; the primary unless ``int8``).
    ``providers``: also gate the fp32 file as these run it. ``fallback``: when the gate refuses only lossy runs
    (int8, int4, a bf16 provider) but passes fp32, write what passed and say why in the parity report (``refused``)
    instead of failing. The card's ``runtime.onnx.served`` names the fastest run that passed. ``model_input``: for a
    model without a judge card, its input format (``judges.foreign``)."""
    judge_dir, card = open_card(judge_dir, model_input)  # a model without a card is described (``judges.foreign``)
    out = Path(out_dir)
    if card.head in EXPORTERS:
        return EXPORTERS.get(card.head)(judge_dir, out, int8=int8, isa=isa, source=source, n_records=n_records,
                                        parity=parity, int8_config=int8_config, fallback=fallback,
                                        providers=providers, **({"int4": True} if int4 else {}))
    if card.head not in HEADS:
        raise ValueError(f"{judge_dir}: a {card.head!r} judge has no ONNX export (only fine-tuned heads: "
                         f"{', '.join(HEADS.names())})")
    if not any((judge_dir / name).exists() for name in TORCH_WEIGHTS):
        raise FileNotFoundError(f"{judge_dir}: no PyTorch weights ({' / '.join(TORCH_WEIGHTS)}) to export "
                                "(an exported directory cannot be exported again)")
    _check_out_dir(out)
    parity = parity or ParityConfig.load()
    quant = int8_settings(isa, int8_config) if int8 else None
    clock = Stopwatch()
    tokenizer = load_tokenizer(judge_dir)
    torch_backend = TorchBackend(judge_dir)
    reference = ModelJudge(card, tokenizer, torch_backend, parity.batch_size)
    records, validation = validation_records(card, HEADS.get(card.head).from_card(card), parity, source, n_records)
    records, budget = within_budget(records, reference.sequence_lengths(records),
                                    decoder_parameters(torch_backend.model), parity)
    validation.update(n=len(records), **({"budget": budget} if budget else {}))
    chunk = parity.batch_size * GATE_CHUNK_BATCHES
    with clock("reference"):
        ref_raw = read_in_chunks(reference, records, chunk)
    sample = tokenizer.pad([s for r in records[:2] for s in reference.encode(r)], padding=True, return_tensors="np")
    config = torch_backend.model.config

    tmp = hidden_beside(out)
    try:
        tmp.mkdir(mode=0o700)
        files, exported = write_variants(tmp, torch_backend.model, sample, opset, clock, optimize=optimize,
                                         quant=quant, int4=int4)
        torch_backend.release()  # the reference is read: its weights are not held while the gate runs
        primary = next(ONNX_VARIANTS[k] for k in ("int8", "int4", "optimized", "fp32") if ONNX_VARIANTS[k] in files)
        variants = {}
        for run in gate_runs(files, ONNX_VARIANTS["fp32"], providers):
            thresholds = parity.for_precision(run.precision)
            with clock(f"gate {run.key}"):
                candidate = ModelJudge(card, tokenizer, OnnxBackend(tmp / run.file, run.provider), parity.batch_size)
                measured = compare_to_reference(reference, candidate, records, ref_raw, thresholds.boundary_eps,
                                                chunk=chunk, stop=thresholds)
                del candidate  # one session at a time
            variants[run.key] = gate_entry(run, measured, thresholds)
        for name, meta in files.items():
            meta["bytes"] = sum(p.stat().st_size for p in tmp.glob(name + "*"))
        report = {
            "judge_dir": str(judge_dir), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "validation": {**validation, "batch_size": parity.batch_size, "chunk_records": chunk,
                           "truncated": reference.encoder.report.to_dict()},
            "export": exported, "primary": primary, "variants": variants,
            "passed": all(v["passed"] for v in variants.values()), "seconds": clock.seconds,
        }
        if fallback and drop_refused(report, files, tmp) and primary not in files:
            primary = report["primary"] = ONNX_VARIANTS["optimized"] if optimize else ONNX_VARIANTS["fp32"]
        if not report["passed"]:
            raise ParityError(_parity_message(report), report)
        _write_judge(tmp, out, card, judge_dir, config, tokenizer, reference, files, exported, primary, report)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_card(judge_dir, JudgeCard(**{**asdict(card), "runtime": {}}))
    return ExportResult(out, primary, report)

