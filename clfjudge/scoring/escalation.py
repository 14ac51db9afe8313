"""Escalation: a fast judge decides every pair, and the pairs it is least sure of go to a slow teacher judge.

The fast judge's confidence in a pair is ``|P(A) - P(B)|`` (for a judge without ties, ``2 |P(A) - 0.5|``); a pair
whose probabilities did not parse has none and is the first to go. Two rules say which pairs go:

- ``share`` F: at most F of the pairs. A file is scored in chunks, so the share is kept over the whole run as it
  streams: after every chunk, ``floor(F * pairs scored so far)`` pairs have gone to the teacher, the least sure of
  each chunk. What a chunk sends depends only on its own pairs and the count before it, which the progress file
  keeps, so a resumed run sends exactly the pairs an uninterrupted one sends.
- ``threshold``: every pair whose confidence is below a threshold calibrated on held-out pairs the teacher labelled
  (``calibrate``): fixed-sequence testing from the most confident threshold down, each step an exact one-sided
  Clopper-Pearson bound at level 1 - delta on the fast judge's agreement with the teacher over the pairs it keeps,
  stopping at the first step whose bound falls below the target (Jung et al., "Trust or Escalate", ICLR 2025).

Agreement means both judges prefer the same answer (P(A) >= P(B), as ``clfjudge distill`` counts it). Only pairs
escalate: a single answer's score has no confidence to rank by, and two judges' scores are on different scales.
The teacher is loaded when the first pair goes to it, never for a run that sends none.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data.records import PairRecord, Record, RecordError
from ..options import LoadOptions
from .batch import INPUT_ERRORS, score_chunk

if TYPE_CHECKING:
    from ..judges.base import Judge

DEFAULT_DELTA = 0.1
STEPS = 20  # thresholds tried: those keeping 1/20, 2/20, ... of the calibration pairs, most confident first
TEACHER, JUDGE = "teacher", "judge"  # who decided an output row (its "decided_by")
SAFETY = 1e-9  # floor(F * n) of a share like 0.1 is not cut one short by float error


# -- the fast judge's confidence ------------------------------------------------------------------------------

def confidence(p_a: float | None, p_b: float | None) -> float:
    """How sure the fast judge is of a pair: |P(A) - P(B)|; NaN where its output did not parse."""
    if p_a is None or p_b is None or math.isnan(p_a) or math.isnan(p_b):
        return math.nan
    return abs(p_a - p_b)


def prefers_a(p_a: float | None, p_b: float | None) -> bool | None:
    """The answer a judge prefers (True: A); None where its output did not parse."""
    return None if math.isnan(confidence(p_a, p_b)) else p_a >= p_b


def least_sure(conf: Sequence[float], k: int) -> list[int]:
    """The indices of the ``k`` least confident items (no confidence first; equal ones in input order)."""
    keys = np.nan_to_num(np.asarray(conf, dtype=np.float64), nan=-np.inf)
    return sorted(np.argsort(keys, kind="stable")[:k].tolist())


def share_count(share: float, n: int) -> int:
    """How many of ``n`` items a share sends: never more than the share."""
    return math.floor(share * n + SAFETY)


@dataclass(frozen=True)
class ShareRule:
    share: float

    def pick(self, conf: Sequence[float], done: int) -> list[int]:
        """The least sure of a chunk, as many as keep the run at ``floor(share * scored)`` (``done``: scored
        before it)."""
        return least_sure(conf, share_count(self.share, done + len(conf)) - share_count(self.share, done))

    def describe(self) -> str:
        return f"the least sure {100 * self.share:g}% of the pairs"


@dataclass(frozen=True)
class ThresholdRule:
    threshold: float  # inf: every pair

    def pick(self, conf: Sequence[float], done: int) -> list[int]:
        keys = np.nan_to_num(np.asarray(conf, dtype=np.float64), nan=-np.inf)
        return np.flatnonzero(keys < self.threshold).tolist()

    def describe(self) -> str:
        return f"the pairs of confidence |P(A) - P(B)| below {self.threshold:.4g}"


# -- calibration ---------------------------------------------------------------------------------------------

def clopper_pearson_lower(agreeing: int, n: int, delta: float) -> float:
    """The exact one-sided lower bound at level 1 - delta of a binomial proportion (``agreeing`` of ``n``)."""
    from scipy.stats import beta

    return 0.0 if agreeing == 0 else float(beta.ppf(delta, agreeing, n - agreeing + 1))


@dataclass(frozen=True)
class Calibrated:
    """The threshold fixed-sequence testing chose: pairs of lower confidence go to the teacher. ``bound``: the
    Clopper-Pearson lower bound on the agreement of the pairs kept (None: no threshold passed, every pair goes);
    ``expected_share``: the share of the calibration pairs below the threshold; ``steps``: each threshold tried."""

    threshold: float
    bound: float | None
    agreement: float | None
    kept: int
    pairs: int
    expected_share: float
    target: float
    delta: float
    steps: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        if self.bound is None:
            return (f"escalation: no threshold keeps agreement >= {self.target:g} with the teacher at level "
                    f"{1 - self.delta:g} on {self.pairs} calibration pairs (first step: {self.steps[0]['bound']:.3f} "
                    "lower bound): every pair goes to the teacher")
        return (f"escalation: threshold {self.threshold:.4g} on |P(A) - P(B)|; the {self.kept} of {self.pairs} "
                f"calibration pairs above it agree with the teacher {100 * self.agreement:.1f}%, lower bound "
                f"{100 * self.bound:.1f}% >= {100 * self.target:g}% at level {1 - self.delta:g}; expected share "
                f"escalated {100 * self.expected_share:.1f}%")


def fewest_to_pass(target: float, delta: float) -> int:
    """The fewest pairs whose bound can reach ``target`` (all of them agreeing: delta ** (1 / n) >= target); a
    smaller step could only fail, and would end the sequence before it starts."""
    return math.ceil(math.log(delta) / math.log(target) - SAFETY) if target < 1 else sys.maxsize


def calibrate_threshold(conf: Sequence[float], agrees: Sequence[bool], target: float, delta: float = DEFAULT_DELTA,
                        steps: int = STEPS) -> Calibrated:
    """Fixed-sequence testing of thresholds on the fast judge's confidence, most confident first: the thresholds
    keep 1/``steps``, 2/``steps``, ... of the pairs (ties kept together), none fewer than ``fewest_to_pass``;
    each is tested on the pairs it keeps
    (Clopper-Pearson lower bound of their agreement with the teacher >= ``target``), and the last one to pass
    before the first failure is chosen. The sequence is fixed before the agreements are looked at, so the chosen
    threshold's bound holds at level 1 - ``delta`` with no correction for the number of steps."""
    keys = np.nan_to_num(np.asarray(conf, dtype=np.float64), nan=-np.inf)
    agrees = np.asarray(agrees, dtype=bool)
    n = len(keys)
    if n == 0:
        raise ValueError("--escalate-calibration: no calibration pair to choose a threshold on")
    order = np.sort(keys)[::-1]
    chosen: dict[str, Any] | None = None
    tried: list[dict[str, Any]] = []
    least = fewest_to_pass(target, delta)
    sizes = sorted(k for k in {max(least, math.ceil(step * n / steps)) for step in range(1, steps + 1)} if k <= n)
    for size in sizes:
        threshold = float(order[size - 1])
        if tried and threshold == tried[-1]["threshold"]:
            continue
        kept = keys >= threshold
        agreeing = int(agrees[kept].sum())
        bound = clopper_pearson_lower(agreeing, int(kept.sum()), delta)
        tried.append({"threshold": threshold, "kept": int(kept.sum()), "agreeing": agreeing, "bound": bound,
                      "passed": bound >= target})
        if bound < target:
            break
        chosen = tried[-1]
    if chosen is None:
        return Calibrated(math.inf, None, None, 0, n, 1.0, target, delta, tried)
    return Calibrated(chosen["threshold"], chosen["bound"], chosen["agreeing"] / chosen["kept"], chosen["kept"], n,
                      float(np.mean(keys < chosen["threshold"])), target, delta, tried)


def calibration_pairs(spec: str) -> tuple[list[PairRecord], list[float]]:
    """Held-out pairs the teacher labelled and its P(A) of each: a label directory (``clfjudge label``: its chosen
    pairs with a label, read from the pool its provenance names) or a JSONL file of the teacher's predictions
    (question, answer_a, answer_b, p_a [, p_b] a line, as ``clfjudge distill`` reads them)."""
    from ..training.distill import PredictionsTeacher
    from ..training.labels import LabelSet, is_label_dir

    path = Path(spec)
    if is_label_dir(path):
        pairs = LabelSet(path).labelled_pairs()
        return [r for r, _ in pairs], [p for _, p in pairs]
    if path.is_file():
        teacher = PredictionsTeacher(path)
        return teacher.records, teacher.label(teacher.records)
    raise FileNotFoundError(f"--escalate-calibration {spec}: neither a label directory (clfjudge label) nor a file "
                            "of the teacher's predictions (JSONL: question, answer_a, answer_b, p_a)")


def calibrate(judge: Judge, spec: str, target: float, delta: float = DEFAULT_DELTA,
              symmetric: bool = False) -> Calibrated:
    """The threshold for ``judge`` that keeps its agreement with the teacher >= ``target`` (``calibrate_threshold``),
    on the pairs of ``spec`` (``calibration_pairs``), judged as the run judges its own."""
    records, teacher_p_a = calibration_pairs(spec)
    if not records:
        raise ValueError(f"--escalate-calibration {spec}: no labelled pair in it")
    _warn_if_trained_on(judge, spec)
    results = judge.compare_batch(records, symmetric=symmetric)
    conf = [confidence(c.p_a, c.p_b) if c.parsed else math.nan for c in results]
    agrees = [c.parsed and prefers_a(c.p_a, c.p_b) == (p >= 0.5) for c, p in zip(results, teacher_p_a)]
    return calibrate_threshold(conf, agrees, target, delta)


def _warn_if_trained_on(judge: Judge, spec: str) -> None:
    """A student distilled from these labels has seen most of their pairs: its agreement on them is optimistic."""
    from ..training.labels import PROVENANCE, is_label_dir

    if not is_label_dir(spec):
        return
    labels = (judge.card.training.get("distilled_from") or {}).get("labels") or {}
    teacher = json.loads((Path(spec) / PROVENANCE).read_text()).get("teacher", {})
    if not labels or labels.get("teacher", {}).get("card_hash") != teacher.get("card_hash"):
        return
    print(f"warning: the judge was distilled from the labels of this teacher; calibrating on {spec} counts the "
          "pairs it was trained on, and the bound is optimistic there: calibrate on held-out pairs", file=sys.stderr)


# -- what the user asks for ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class EscalationSpec:
    """``--escalate TEACHER`` with ``--escalate-share F``, or with ``--escalate-agreement A``,
    ``--escalate-calibration PAIRS`` and ``--escalate-delta``."""

    teacher: str
    share: float | None = None
    agreement: float | None = None
    calibration: str | None = None
    delta: float = DEFAULT_DELTA

    def check(self) -> None:
        """Refuse, before anything is read, what cannot be run (one line naming the option)."""
        from ..judges.foreign import is_hub_id

        if not Path(self.teacher).is_dir() and not is_hub_id(self.teacher):
            raise FileNotFoundError(f"--escalate {self.teacher}: no such judge directory")
        if (self.share is None) == (self.agreement is None):
            raise ValueError("--escalate takes --escalate-share F or --escalate-agreement A (one of them)")
        if self.share is not None and not 0 <= self.share <= 1:
            raise ValueError(f"--escalate-share must be in [0, 1], got {self.share:g}")
        if self.agreement is not None:
            if not 0 < self.agreement <= 1:
                raise ValueError(f"--escalate-agreement must be in (0, 1], got {self.agreement:g}")
            if self.calibration is None:
                raise ValueError("--escalate-agreement needs --escalate-calibration (a label directory or a file "
                                 "of the teacher's predictions on held-out pairs)")
            if not Path(self.calibration).exists():
                raise FileNotFoundError(f"--escalate-calibration {self.calibration}: no such file or directory")
        elif self.calibration is not None:
            raise ValueError("--escalate-calibration applies to --escalate-agreement")
        if not 0 < self.delta < 1:
            raise ValueError(f"--escalate-delta must be in (0, 1), got {self.delta:g}")

    def settings(self) -> dict[str, Any]:
        """What a resumed run must ask for alike (the calibration pairs by content: the same pairs, the same
        threshold)."""
        teacher = Path(self.teacher)
        return {"teacher": str(teacher.resolve()) if teacher.is_dir() else self.teacher, "share": self.share,
                "agreement": self.agreement, "delta": self.delta if self.agreement is not None else None,
                "calibration": None if self.calibration is None else _digest(Path(self.calibration))}

    def inputs(self) -> list[tuple[str, Path]]:
        """The files this escalation reads (no output may be one of them: ``outputs.check_apart``)."""
        from ..outputs import files_of

        calibration = [] if self.calibration is None else [("--escalate-calibration", Path(self.calibration)),
                                                           *files_of(self.calibration, "--escalate-calibration")]
        return [*files_of(self.teacher, "a file of the --escalate judge"), *calibration]

    def escalator(self, judge: Judge, task: str, symmetric: bool, load: LoadOptions) -> Escalator:
        """The run's escalator, for a judge loaded and its task chosen (pairs only)."""
        if task != "compare":
            raise ValueError("--escalate applies to pairs (compare): a single answer's score has no confidence to "
                             "rank by, and two judges' scores are on different scales")
        return Escalator(self, self.rule(judge, symmetric), load, symmetric)

    def rule(self, judge: Judge, symmetric: bool) -> ShareRule | ThresholdRule:
        """The rule of this run: a share, or the threshold calibrated for ``judge`` (said on stderr)."""
        if self.share is not None:
            return ShareRule(self.share)
        calibrated = calibrate(judge, self.calibration, self.agreement, self.delta, symmetric)
        print(calibrated.summary(), file=sys.stderr)
        return ThresholdRule(calibrated.threshold)


def _digest(path: Path) -> str:
    """The content of a calibration file, or of a label directory's files."""
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()) if path.is_dir() else [path]:
        if file.is_file():
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return f"{path.resolve()} (sha256 {digest.hexdigest()[:16]})"


# -- scoring a chunk -------------------------------------------------------------------------------------------

class Escalator:
    """Scores a chunk of pairs: the fast judge reads all of them, the rule picks the ones the teacher decides.
    An output row holds the decision (the teacher's result where it decided), ``decided_by``, the fast judge's
    ``confidence`` and its own result (``judge``). A pair the teacher cannot take keeps the fast judge's decision,
    with the teacher's error beside it."""

    def __init__(self, spec: EscalationSpec, rule: ShareRule | ThresholdRule, load: LoadOptions,
                 symmetric: bool) -> None:
        self.spec, self.rule, self.symmetric = spec, rule, symmetric
        self.load = LoadOptions(threads=load.threads, budget=load.budget, trust_pickle=load.trust_pickle)
        self._teacher: Judge | None = None
        self.seconds = {JUDGE: 0.0, TEACHER: 0.0}

    def report(self, tally: Any) -> str:
        """One line: how many of the scored pairs the teacher decided, by which rule."""
        share = tally.escalated / tally.scored if tally.scored else 0.0
        return (f"escalation: the teacher {self.spec.teacher} decided {tally.escalated} of {tally.scored} pairs "
                f"({100 * share:.1f}%: {self.rule.describe()})")

    def teacher(self) -> Judge:
        from ..judges.base import load_ready

        if self._teacher is None:
            print(f"escalation: loading the teacher {self.spec.teacher}", file=sys.stderr)
            self._teacher = load_ready(self.spec.teacher, self.load)
            self._teacher.require("compare")
        return self._teacher

    def score(self, judge: Judge, chunk: Sequence[tuple[int, Record]], source: str,
              done: int) -> tuple[list[tuple[int, dict[str, Any]]], list[RecordError], int]:
        """(line, row) of each scored pair, the rejections and how many pairs the teacher decided; ``done``: the
        pairs scored before this chunk."""
        start = time.perf_counter()
        results, errors = score_chunk(judge, "compare", chunk, self.symmetric, source)
        self.seconds[JUDGE] += time.perf_counter() - start
        conf = [confidence(row["p_a"], row["p_b"]) for _, row in results]
        rows = [(line, {**row, "decided_by": JUDGE, "confidence": None if math.isnan(c) else c,
                        "judge": {k: v for k, v in row.items() if k != "id"}})
                for (line, row), c in zip(results, conf)]
        picked = self.rule.pick(conf, done)
        if not picked:
            return rows, errors, 0
        teacher = self.teacher()
        record = dict(chunk)
        start = time.perf_counter()
        sent = [(rows[i][0], record[rows[i][0]]) for i in picked]
        try:
            decided, refused = score_chunk(teacher, "compare", sent, self.symmetric, source)
        except INPUT_ERRORS as exc:  # a single pair: score_chunk leaves its error to the caller
            decided, refused = [], [RecordError(source, sent[0][0], None, f"the teacher cannot take it: {exc}")]
        except Exception as exc:  # noqa: BLE001 - the teacher's fault, named as such (exit 3; the run resumes)
            from ..judges.base import JudgeError

            raise JudgeError(self.spec.teacher, exc) from exc
        self.seconds[TEACHER] += time.perf_counter() - start
        by_line = {line: row for line, row in decided}
        why = {err.line: err.message for err in refused}
        for i in picked:
            line, row = rows[i]
            if line in by_line:
                rows[i] = (line, {**by_line[line], "decided_by": TEACHER, "confidence": row["confidence"],
                                  "judge": row["judge"]})
            else:
                rows[i] = (line, {**row, "teacher_error": why[line]})
        return rows, errors, len(by_line)
