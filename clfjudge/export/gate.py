"""The parity gate every judge kind's export goes through: a seeded slice of real labelled records read by the
PyTorch judge and by every exported run (a file on a provider), compared against the thresholds of the run's
precision (clfjudge/configs/parity.yaml).

``export.parity``'s ``ParityConfig`` / ``Thresholds``: the thresholds and the slice's size; ``validation_records``
(and ``within_budget``, ``decoder_parameters``): the slice; ``compare_to_reference``: the numbers of one run against
the reference (max |logit diff|, decision agreement, the metric delta: accuracy for pair judges, Pearson for point
judges; ``ReferenceReadings``: the reference read only as far as the runs get), for any judge with ``raw_outputs`` /
``pair_outputs`` / ``point_scores``; ``gate_runs`` / ``gate_entry``: the runs of an export and their report entries;
``drop_refused``: ``fallback``'s rule (lossy runs that fail are left out when every fp32 run passed); ``gated`` /
``served``: what the card records. A failing gate raises ``ParityError`` naming the threshold and the numbers.
"""
from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..batching import Budget
from ..card import JudgeCard
from ..data.records import Record
from ..models.heads import Head
from ..models.onnx_session import gate_key, provider_info
from ..options import LoadOptions
from .parity import ParityConfig, Thresholds

if TYPE_CHECKING:
    from ..judges.base import Judge
    from .options import ExportOptions

REPORT_NAME = "parity_report.json"
# Every gate run reads the records in chunks of this many batches (the reference alike), so a failing run stops
# after a chunk rather than after the whole slice: two batches, as a large model's budgeted slice is a few dozen
# records and a lossy run that fails usually fails on its first sixteen.
GATE_CHUNK_BATCHES = 2


class ParityError(ValueError):
    """An exported model disagrees with PyTorch beyond the thresholds; nothing was written."""

    def __init__(self, message: str, report: dict[str, Any]) -> None:
        super().__init__(message)
        self.report = report


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


def validation_records(card: JudgeCard, head: Head, config: ParityConfig, options: ExportOptions,
                       arity: str | None = None) -> tuple[list[Record], dict[str, Any]]:
    """A seeded sample of labelled records the head can judge: ``options.n_records`` of them (None: the parity
    config's count) from ``options.source`` ("name" or "name:N"), else from the card's sources, else from the parity
    config's defaults for ``arity`` (default: the judge's)."""
    from ..data import sources

    n = options.n_records or config.n_records
    if options.source:
        name, limit = sources.parse_source(options.source)
        candidates, n = [name], limit or n
    else:
        candidates = list(dict.fromkeys([*card_sources(card), *config.default_sources.get(arity or card.arity, [])]))
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


def decoder_parameters(model: Any) -> int:
    """Parameters a token's reading multiplies through: all but the input embeddings (a lookup) of ``model``, a
    transformers model."""
    embeddings = model.get_input_embeddings()
    skip = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


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


def read_in_chunks(judge: Judge, records: Sequence[Record], size: int) -> np.ndarray:
    """``judge.raw_outputs`` over consecutive chunks of ``size`` records: the batches every gate run reads alike."""
    return ReferenceReadings(judge, records, size).first(len(records))


class ReferenceReadings:
    """The reference's raw outputs on a slice, read in chunks of ``chunk`` records only as far as the runs compared
    with it get (``first``): where every lossy run fails on its first chunks, a slow reference (a decoder in fp32)
    reads those alone. ``raw``: readings taken already."""

    def __init__(self, judge: Judge, records: Sequence[Record], chunk: int | None = None,
                 raw: np.ndarray | None = None) -> None:
        self.judge, self.records = judge, records
        self.chunk = max(1, chunk or len(records))
        self._raw = None if raw is None else np.asarray(raw)

    @property
    def read(self) -> int:
        """How many records the reference has read."""
        return 0 if self._raw is None else len(self._raw)

    def first(self, n: int) -> np.ndarray:
        """The readings of the first ``n`` records, reading the chunks not read yet."""
        n = min(n, len(self.records))
        while self.read < n:
            part = self.judge.raw_outputs(self.records[self.read:self.read + self.chunk])
            self._raw = part if self._raw is None else np.concatenate([self._raw, part])
        return self._raw[:n]


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

def decisions(judge: Judge, raw: np.ndarray) -> list[Any]:
    """What the judge would answer: calibrated verdicts for pair judges, scores rounded to the scale's
    integer steps for point judges."""
    if "compare" in judge.tasks:
        return judge.calibration.verdicts(judge.pair_outputs(raw))
    return np.rint(judge.point_scores(raw)).tolist()


def _metric(judge: Judge, raw: np.ndarray, records: Sequence[Record]) -> tuple[str, float]:
    from ..metrics import correlations, pairwise_metrics

    if "compare" in judge.tasks:
        return "accuracy", pairwise_metrics([r.verdict for r in records], decisions(judge, raw)).accuracy
    return "pearson", correlations([r.score for r in records], judge.point_scores(raw)).pearson


def decision_slack(judge: Judge, raw: np.ndarray) -> np.ndarray:
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


def compare_to_reference(reference: Judge, candidate: Judge, records: Sequence[Record],
                         ref_raw: np.ndarray | ReferenceReadings | None = None, boundary_eps: float | None = None, *,
                         chunk: int | None = None, stop: Thresholds | None = None) -> dict[str, Any]:
    """Parity numbers of ``candidate`` against ``reference`` on the same records and the same batches.

    ``ref_raw``: the reference's readings (an array, or ``ReferenceReadings`` read as far as the candidate gets;
    None: read here). With ``boundary_eps``, records whose reference decision is within that slack of flipping are
    left out of the agreement and the metric (and counted): an fp32 graph computes the same function up to float
    rounding, which can tip a decision that sits on a boundary (an undertrained judge puts many there); that needs
    every reference reading first.
    With ``chunk``, the candidate reads ``chunk`` records at a time (``read_in_chunks``: read the reference alike);
    with ``stop`` as well, it stops as soon as it fails those thresholds whatever the rest gives, and the numbers
    are those of the records read (``stopped_early`` says how many and why)."""
    ref = ref_raw if isinstance(ref_raw, ReferenceReadings) else ReferenceReadings(reference, records, chunk, ref_raw)
    keep = np.ones(len(records), dtype=bool)
    if boundary_eps:
        keep = decision_slack(reference, ref.first(len(records))) > boundary_eps
    if not keep.any():  # everything on a boundary: compare everything rather than nothing
        keep[:] = True
    size = chunk or len(records)
    parts, seconds, stopped = [], 0.0, None
    for start in range(0, len(records), size):
        began = time.perf_counter()
        parts.append(candidate.raw_outputs(records[start:start + size]))
        seconds += time.perf_counter() - began
        read = start + len(parts[-1])
        if stop is not None and read < len(records):
            raw, ref_read = np.concatenate(parts), ref.first(read)
            agree = np.array([a == b for a, b in zip(decisions(reference, ref_read), decisions(candidate, raw))])
            why = _certain_failure(ref_read, raw, agree[keep[:read]], int(keep.sum()), stop)
            if why:
                stopped = {"read": read, "of": len(records), "why": why}
                break
    raw = np.concatenate(parts)
    n = len(raw)
    ref_raw, keep, records = ref.first(n), keep[:n], records[:n]
    diff = np.abs(raw - ref_raw)
    idx = np.flatnonzero(keep) if keep.any() else np.arange(n)
    kept = [records[i] for i in idx]
    metric, ref_value = _metric(reference, ref_raw[idx], kept)
    value = _metric(candidate, raw[idx], kept)[1]
    agree = np.mean([a == b for a, b in zip(decisions(reference, ref_raw[idx]), decisions(candidate, raw[idx]))])
    return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()), "agreement": float(agree),
            "metric": metric, "metric_reference": float(ref_value), "metric_onnx": float(value),
            "metric_delta": float(value - ref_value), "on_boundary": int(n - len(idx)),
            "records_per_s": n / max(seconds, 1e-9),  # what "served" is chosen by
            **({"stopped_early": stopped} if stopped else {})}

# -- the runs of an export -------------------------------------------------------------------------------

@dataclass(frozen=True)
class GateRun:
    """One file run by one provider through the gate: ``key`` names it in the report and the card."""

    key: str
    file: str
    provider: str
    precision: str

    def options(self, batch_size: int) -> LoadOptions:
        """How a reader runs it: by its provider, its file as the variant, in the gate's batches of ``batch_size``."""
        return LoadOptions(provider=self.provider, variant=self.file, budget=Budget(batch_size))


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


def batch_tolerances(report: Mapping[str, Any]) -> dict[str, float]:
    """The card's ``runtime.onnx.batch_tolerance``: for each run the gate passed, how far a row's numbers may move
    when it is judged in another batch (parity.yaml's ``batch_tolerance`` of its precision; ``Judge.batch_tolerance``
    reads the one a loaded judge runs)."""
    return {key: v["thresholds"]["batch_tolerance"] for key, v in report["variants"].items()
            if v["passed"] and v["thresholds"].get("batch_tolerance") is not None}


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


def parity_message(report: dict[str, Any]) -> str:
    return "parity gate failed, nothing was written: " + " | ".join(_failure_lines(report))
