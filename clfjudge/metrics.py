"""The metrics of the paper "An Empirical Study of LLM-as-a-Judge for LLM Evaluation: Fine-tuned Judge Models
are Task-specific Classifiers", computed the way its code computes them (UnlimitedJudge ``calculate_metrics``).

- Pairwise selection: verdicts coded as wins (A -> 1, TIE -> 0, B -> -1); accuracy and *macro* precision /
  recall / F1 over the three classes (scikit-learn, labels fixed to [1, 0, -1], zero_division=0).
- Auto-J agreement: each pair is judged in both answer orders; a pair is correct only if the two verdicts
  are position-consistent (forward == swapped(reversed)) AND equal to gold; agreement = correct / N,
  consistency = consistent / N.
- Pointwise grading: Pearson, Kendall tau and Spearman (scipy).

A prediction that failed to parse is ``None``. It is never scored as a class: every metric takes an explicit
``failures`` policy, reports it, and reports ``n_failed``:

- ``"error"``: refuse to score (ValueError naming the count);
- ``"count_wrong"``: keep the item and count it as wrong (it matches no class, so it is a false negative
  of its gold class and a false positive of none; a failed side of a swapped pair makes it inconsistent);
- ``"exclude"``: drop the item; ``n_scored`` says how many remain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats
from sklearn.metrics import f1_score

from .data.records import PairRecord, PointRecord, Verdict
from .registry import Registry

# UnlimitedJudge's class order: win, tie, lose.
LABELS = [1, 0, -1]
LABEL_NAMES = {1: Verdict.A.value, 0: Verdict.TIE.value, -1: Verdict.B.value}
# Code of a failed prediction: no class has it and its negation is no class either.
FAILED = 9

MaybeVerdict = Verdict | None


# ---------------------------------------------------------------------------------------------------
# failure policies


def _refuse(failed: np.ndarray) -> np.ndarray:
    if failed.any():
        raise ValueError(
            f"{int(failed.sum())} of {failed.size} predictions failed to parse; pass failures='count_wrong' "
            f"or failures='exclude' to score them"
        )
    return np.ones_like(failed)


FAILURE_POLICIES: Registry[Callable[[np.ndarray], np.ndarray]] = Registry("failure policy")
FAILURE_POLICIES.register("error", _refuse)
FAILURE_POLICIES.register("count_wrong", lambda failed: np.ones_like(failed))
FAILURE_POLICIES.register("exclude", lambda failed: ~failed)


def _keep(failed: np.ndarray, failures: str) -> np.ndarray:
    """Boolean mask of the items a policy scores (raises for ``"error"`` when anything failed)."""
    return FAILURE_POLICIES.get(failures)(failed)


def _codes(verdicts: Sequence[MaybeVerdict], name: str, *, allow_failed: bool) -> np.ndarray:
    out = np.empty(len(verdicts), dtype=np.int64)
    for i, v in enumerate(verdicts):
        if v is None:
            if not allow_failed:
                raise ValueError(f"{name}[{i}] is None: gold labels cannot be missing")
            out[i] = FAILED
        elif isinstance(v, Verdict):
            out[i] = v.win
        else:
            raise TypeError(f"{name}[{i}] must be a Verdict or None, got {type(v).__name__}: {v!r}")
    return out


def _same_length(**arrays: Sequence[Any]) -> int:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"inputs differ in length: {lengths}")
    return next(iter(lengths.values()))


def _counts(codes: np.ndarray) -> dict[str, int]:
    c = Counter(codes.tolist())
    out = {LABEL_NAMES[k]: int(c.get(k, 0)) for k in LABELS}
    if c.get(FAILED):
        out["failed"] = int(c[FAILED])
    return out


# ---------------------------------------------------------------------------------------------------
# pairwise selection


@dataclass(frozen=True)
class PairwiseMetrics:
    n: int  # items given
    n_scored: int  # items the failure policy kept
    n_failed: int  # predictions that failed to parse
    failures: str
    accuracy: float
    precision: float  # macro over A / TIE / B
    recall: float
    f1: float
    per_class: dict[str, dict[str, float]]
    gold_counts: dict[str, int]
    pred_counts: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def pairwise_metrics(
    gold: Sequence[Verdict], pred: Sequence[MaybeVerdict], failures: str = "error"
) -> PairwiseMetrics:
    """Accuracy and macro P/R/F1 over the three verdict classes, as UnlimitedJudge computes them (sklearn, macro)."""
    n = _same_length(gold=gold, pred=pred)
    g = _codes(gold, "gold", allow_failed=False)
    p = _codes(pred, "pred", allow_failed=True)
    failed = p == FAILED
    keep = _keep(failed, failures)
    gk, pk = g[keep], p[keep]
    if gk.size == 0:
        raise ValueError("nothing left to score")
    pc, rc, fc, sc = _per_class_prf(gk, pk)
    per_class = {
        LABEL_NAMES[lab]: {
            "precision": float(pc[i]),
            "recall": float(rc[i]),
            "f1": float(fc[i]),
            "support": int(sc[i]),
        }
        for i, lab in enumerate(LABELS)
    }
    precision, recall, f1 = pc.mean(), rc.mean(), fc.mean()
    return PairwiseMetrics(
        n=n,
        n_scored=int(gk.size),
        n_failed=int(failed.sum()),
        failures=failures,
        accuracy=float(np.mean(gk == pk)),
        precision=float(precision),
        recall=float(recall),
        f1=float(f1),
        per_class=per_class,
        gold_counts=_counts(g),
        pred_counts=_counts(p),
    )


def _per_class_prf(gold: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-class precision, recall, F1 and support over LABELS, as sklearn's precision_recall_fscore_support(
    labels=LABELS, zero_division=0) computes them (tested against it), without its input validation: the audit
    bootstraps this thousands of times and that validation dominated its run time."""
    labels = np.array(LABELS)[:, None]
    is_gold, is_pred = gold[None, :] == labels, pred[None, :] == labels  # (class, item)
    tp, support, predicted = (is_gold & is_pred).sum(1), is_gold.sum(1), is_pred.sum(1)
    precision = tp / np.maximum(predicted, 1)  # 0 where nothing was predicted (tp is 0 there too)
    recall = tp / np.maximum(support, 1)
    f1 = 2 * precision * recall / np.maximum(precision + recall, np.finfo(float).tiny)
    return precision, recall, f1, support


# ---------------------------------------------------------------------------------------------------
# position consistency and the Auto-J protocol


@dataclass(frozen=True)
class ConsistencyMetrics:
    n: int
    n_scored: int
    n_failed: int  # pairs with at least one failed side
    failures: str
    consistency: float  # forward == swapped(reversed)
    flip_rate: float  # both orders decisive and the same *position* wins, i.e. the chosen answer flips

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AgreementMetrics:
    n: int
    n_scored: int
    n_failed: int
    failures: str
    agreement: float  # consistent and equal to gold
    consistency: float
    forward_accuracy: float  # the forward order alone (Auto-J's "single" protocol), on the scored pairs

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _paired(
    pred_forward: Sequence[MaybeVerdict], pred_reversed: Sequence[MaybeVerdict], failures: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Codes of both orders (the reversed one mapped back to the original order) and the policy's mask."""
    f = _codes(pred_forward, "pred_forward", allow_failed=True)
    r = _codes(pred_reversed, "pred_reversed", allow_failed=True)
    failed = (f == FAILED) | (r == FAILED)
    back = np.where(r == FAILED, FAILED, -r)  # swapped(reversed) in win codes; a failure stays a failure
    return f, back, failed, _keep(failed, failures)


def position_consistency(
    pred_forward: Sequence[MaybeVerdict], pred_reversed: Sequence[MaybeVerdict], failures: str = "error"
) -> ConsistencyMetrics:
    """How often a judge gives the same verdict when the two answers are presented in the other order.

    ``pred_reversed[i]`` is the verdict on pair i shown with its answers swapped, in the swapped order's own
    terms (``A`` = the answer shown first there).
    """
    n = _same_length(pred_forward=pred_forward, pred_reversed=pred_reversed)
    f, back, failed, keep = _paired(pred_forward, pred_reversed, failures)
    fk, bk = f[keep], back[keep]
    if fk.size == 0:
        raise ValueError("nothing left to score")
    valid = (fk != FAILED) & (bk != FAILED)
    flips = valid & (fk != 0) & (bk == -fk)
    return ConsistencyMetrics(
        n=n,
        n_scored=int(fk.size),
        n_failed=int(failed.sum()),
        failures=failures,
        consistency=float(np.mean(valid & (fk == bk))),
        flip_rate=float(np.mean(flips)),
    )


def autoj_agreement(
    gold: Sequence[Verdict],
    pred_forward: Sequence[MaybeVerdict],
    pred_reversed: Sequence[MaybeVerdict],
    failures: str = "error",
) -> AgreementMetrics:
    """The Auto-J protocol: correct only if position-consistent and equal to gold (``pred_reversed`` as in
    :func:`position_consistency`)."""
    n = _same_length(gold=gold, pred_forward=pred_forward, pred_reversed=pred_reversed)
    g = _codes(gold, "gold", allow_failed=False)
    f, back, failed, keep = _paired(pred_forward, pred_reversed, failures)
    gk, fk, bk = g[keep], f[keep], back[keep]
    if gk.size == 0:
        raise ValueError("nothing left to score")
    consistent = (fk == bk) & (fk != FAILED)
    return AgreementMetrics(
        n=n,
        n_scored=int(gk.size),
        n_failed=int(failed.sum()),
        failures=failures,
        agreement=float(np.mean(consistent & (fk == gk))),
        consistency=float(np.mean(consistent)),
        forward_accuracy=float(np.mean(fk == gk)),
    )


# ---------------------------------------------------------------------------------------------------
# pointwise grading


@dataclass(frozen=True)
class Correlations:
    n: int
    n_scored: int
    n_failed: int
    failures: str
    pearson: float
    kendall: float
    spearman: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _scores(values: Sequence[float | None], name: str, *, allow_failed: bool) -> np.ndarray:
    out = np.empty(len(values), dtype=np.float64)
    for i, v in enumerate(values):
        if v is None:
            if not allow_failed:
                raise ValueError(f"{name}[{i}] is None: gold scores cannot be missing")
            out[i] = np.nan
        else:
            out[i] = float(v)
            if not np.isfinite(out[i]):
                raise ValueError(f"{name}[{i}] is not finite: {v!r}")
    return out


def correlations(
    gold: Sequence[float], pred: Sequence[float | None], failures: str = "error"
) -> Correlations:
    """Pearson, Kendall tau (tau-b) and Spearman between predicted and gold scores (scipy)."""
    if failures == "count_wrong":
        raise ValueError("failures='count_wrong' has no meaning for correlations; use 'error' or 'exclude'")
    n = _same_length(gold=gold, pred=pred)
    g = _scores(gold, "gold", allow_failed=False)
    p = _scores(pred, "pred", allow_failed=True)
    failed = np.isnan(p)
    keep = _keep(failed, failures)
    gk, pk = g[keep], p[keep]
    if gk.size < 2:
        raise ValueError(f"correlations need at least 2 scored items, got {gk.size}")
    return Correlations(
        n=n,
        n_scored=int(gk.size),
        n_failed=int(failed.sum()),
        failures=failures,
        pearson=float(stats.pearsonr(gk, pk).statistic),
        kendall=float(stats.kendalltau(gk, pk).statistic),
        spearman=float(stats.spearmanr(gk, pk).statistic),
    )


# ---------------------------------------------------------------------------------------------------
# inter-evaluator agreement (paper Figs 2-3)


def _verdict_f1(a: Sequence[MaybeVerdict], b: Sequence[MaybeVerdict], failures: str) -> float:
    # Per-class F1 is symmetric in its two arguments, so the matrix is symmetric.
    x = _codes(a, "a", allow_failed=True)
    y = _codes(b, "b", allow_failed=True)
    keep = _keep((x == FAILED) | (y == FAILED), failures)
    return float(f1_score(x[keep], y[keep], labels=LABELS, average="macro", zero_division=0))


def _score_pearson(a: Sequence[float | None], b: Sequence[float | None], failures: str) -> float:
    if failures == "count_wrong":
        raise ValueError("failures='count_wrong' has no meaning for correlations; use 'error' or 'exclude'")
    x = _scores(a, "a", allow_failed=True)
    y = _scores(b, "b", allow_failed=True)
    keep = _keep(np.isnan(x) | np.isnan(y), failures)
    return float(stats.pearsonr(x[keep], y[keep]).statistic)


AGREEMENT_KINDS: Registry[Callable[[Sequence[Any], Sequence[Any], str], float]] = Registry("agreement kind")
AGREEMENT_KINDS.register("verdict", _verdict_f1)  # macro F1 (paper Fig. 2)
AGREEMENT_KINDS.register("score", _score_pearson)  # Pearson (paper Fig. 3)


@dataclass(frozen=True)
class AgreementMatrix:
    kind: str
    names: list[str]
    values: list[list[float]]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def agreement_matrix(
    predictions: Mapping[str, Sequence[Any]], kind: str, failures: str = "error"
) -> AgreementMatrix:
    """Pairwise agreement between evaluators on the same items: macro F1 for verdicts, Pearson for scores.

    With ``failures="exclude"`` each cell uses the items on which both evaluators produced an output.
    """
    fn = AGREEMENT_KINDS.get(kind)
    names = list(predictions)
    _same_length(**{name: predictions[name] for name in names})
    values = [[1.0] * len(names) for _ in names]
    for i, a in enumerate(names):
        for j in range(i + 1, len(names)):
            values[i][j] = values[j][i] = fn(predictions[a], predictions[names[j]], failures)
    return AgreementMatrix(kind=kind, names=names, values=values)


# ---------------------------------------------------------------------------------------------------
# bootstrap confidence intervals


@dataclass(frozen=True)
class CI:
    estimate: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _as_sample(values: Sequence[Any]) -> np.ndarray:
    arr = np.asarray(values)
    # Verdict is a str enum: keep the objects (and None) instead of letting numpy turn them into strings.
    return arr if arr.dtype.kind in "biuf" else np.asarray(values, dtype=object)


def bootstrap_ci(
    metric_fn: Callable[..., float | Mapping[str, float]],
    *arrays: Sequence[Any],
    n: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> CI | dict[str, CI]:
    """Percentile bootstrap CI of ``metric_fn(*arrays)``, resampling items jointly across the arrays.

    ``metric_fn`` may return one number or a mapping name -> number (one resampling run then gives a CI per
    name, which is cheaper than one run per metric).
    """
    _same_length(**{f"arrays[{i}]": a for i, a in enumerate(arrays)})
    samples = tuple(_as_sample(a) for a in arrays)
    point = metric_fn(*samples)
    keys = list(point) if isinstance(point, Mapping) else None

    def statistic(*resampled: np.ndarray) -> Any:
        value = metric_fn(*resampled)
        return np.array([value[k] for k in keys]) if keys is not None else value

    result = stats.bootstrap(
        samples,
        statistic,
        n_resamples=n,
        paired=True,
        vectorized=False,
        method="percentile",
        confidence_level=1 - alpha,
        rng=np.random.default_rng(seed),
    )
    low, high = np.atleast_1d(result.confidence_interval.low), np.atleast_1d(result.confidence_interval.high)
    if keys is None:
        return CI(float(point), float(low[0]), float(high[0]))
    return {k: CI(float(point[k]), float(low[i]), float(high[i])) for i, k in enumerate(keys)}


def paired_difference(ours_right: Sequence[bool], theirs_right: Sequence[bool], n: int = 10000,
                      seed: int = 0) -> dict[str, Any]:
    """Accuracy difference of two judges on the same items (per item: right or not), with a paired
    percentile-bootstrap CI (``n`` 0: none, low and high are None), and the items only one of them got right
    ("won" / "lost")."""
    _same_length(ours_right=ours_right, theirs_right=theirs_right)
    diff = np.asarray(ours_right, dtype=float) - np.asarray(theirs_right, dtype=float)
    ci = bootstrap_ci(np.mean, diff, n=n, seed=seed).as_dict() if n > 0 else {
        "estimate": float(diff.mean()) if len(diff) else float("nan"), "low": None, "high": None}
    return {**ci, "won": int((diff > 0).sum()), "lost": int((diff < 0).sum())}


# ---------------------------------------------------------------------------------------------------
# baselines (functions over records, so an audit can run them like any judge)


def _gold(rec: PairRecord) -> Verdict:
    if rec.verdict is None:
        raise ValueError(f"record {rec.id!r} has no verdict")
    return rec.verdict


def majority_class(
    records: Sequence[PairRecord], reference: Sequence[PairRecord] | None = None
) -> list[Verdict]:
    """Predict, for every record, the most frequent gold verdict of ``reference`` (default: ``records``,
    i.e. the best constant predictor on the test set). Count ties resolve in the order A, B, TIE."""
    counts = Counter(_gold(r) for r in (records if reference is None else reference))
    if not counts:
        raise ValueError("majority_class needs at least one labelled record")
    top = max(counts.values())
    winner = next(v for v in (Verdict.A, Verdict.B, Verdict.TIE) if counts[v] == top)
    return [winner] * len(records)


def longer_answer_wins(records: Sequence[PairRecord]) -> list[Verdict]:
    """The longer answer (in characters) wins; equal lengths tie."""
    return [Verdict.from_scores(len(r.answer_a), len(r.answer_b)) for r in records]


def shorter_answer_wins(records: Sequence[PairRecord]) -> list[Verdict]:
    """The shorter answer (in characters) wins; equal lengths tie."""
    return [v.swapped() for v in longer_answer_wins(records)]


BASELINES: Registry[Callable[[Sequence[PairRecord]], list[Verdict]]] = Registry("baseline")
BASELINES.register("majority-class", majority_class)
BASELINES.register("longer-answer-wins", longer_answer_wins)


# ---------------------------------------------------------------------------------------------------
# a judge on labelled records: the one evaluation of training, export, benches and the audit


def pair_baselines(records: Sequence[PairRecord]) -> dict[str, dict[str, float]]:
    """Accuracy and macro F1 of the registered baselines (majority class of the set, longer answer wins)."""
    gold = [r.verdict for r in records]
    scored = {name: pairwise_metrics(gold, fn(records)) for name, fn in BASELINES.items()}
    return {name: {"accuracy": m.accuracy, "f1": m.f1} for name, m in scored.items()}


def evaluate_pairs(
    records: Sequence[PairRecord],
    forward: Sequence[MaybeVerdict],
    swapped: Sequence[MaybeVerdict] | None = None,
    *,
    failures: str = "error",
    baselines: bool = False,
) -> dict[str, Any]:
    """A judge's verdicts on labelled pairs: the paper's pairwise metrics (``PairwiseMetrics``: accuracy, macro
    P/R/F1, counts); with its verdicts on the swapped pairs (``swapped``, in the swapped order's terms) also the
    Auto-J ``agreement`` and position ``consistency``; with ``baselines`` the registered baselines on the same
    pairs (``pair_baselines``). ``failures``: the policy for verdicts that failed to parse (None)."""
    gold = [r.verdict for r in records]
    out = pairwise_metrics(gold, forward, failures=failures).as_dict()
    if swapped is not None:
        both = autoj_agreement(gold, forward, swapped, failures=failures)
        out.update(agreement=both.agreement, consistency=both.consistency)
    if baselines:
        out["baselines"] = pair_baselines(records)
    return out


def evaluate_points(
    records: Sequence[PointRecord], scores: Sequence[float | None], *, failures: str = "error"
) -> dict[str, Any]:
    """A judge's scores of labelled answers: ``Correlations`` with the gold scores. With ``failures="exclude"``
    scores that failed to parse (None) are left out and counted, and with fewer than two left the correlations
    are missing (None), not zero."""
    if failures == "exclude" and sum(s is not None for s in scores) < 2:
        n_failed = sum(s is None for s in scores)
        return {"n": len(scores), "n_scored": len(scores) - n_failed, "n_failed": n_failed,
                "pearson": None, "kendall": None, "spearman": None}
    return correlations([r.score for r in records], scores, failures=failures).as_dict()
