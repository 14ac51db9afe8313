"""Metrics against hand-computed cases, the study's own formulas, and scikit-learn / scipy."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score

from clfjudge.data.records import Loc, PairRecord, Verdict
from clfjudge.metrics import (
    BASELINES,
    CI,
    agreement_matrix,
    autoj_agreement,
    bootstrap_ci,
    correlations,
    longer_answer_wins,
    majority_class,
    paired_difference,
    pairwise_metrics,
    position_consistency,
)

A, B, T = Verdict.A, Verdict.B, Verdict.TIE


def random_verdicts(n: int, seed: int, p_fail: float = 0.0) -> list[Verdict | None]:
    rng = random.Random(seed)
    return [None if rng.random() < p_fail else rng.choice([A, B, T]) for _ in range(n)]


# --- pairwise ----------------------------------------------------------------------------------------


def test_pairwise_hand_computed():
    m = pairwise_metrics([A, A, B, T], [A, B, B, A])
    # A: TP 1 FP 1 FN 1 -> P R F1 = 1/2; B: TP 1 FP 1 FN 0 -> P 1/2 R 1 F1 2/3; TIE: nothing right -> 0.
    assert m.accuracy == 0.5
    assert m.precision == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert m.recall == pytest.approx((0.5 + 1 + 0) / 3)
    assert m.f1 == pytest.approx((0.5 + 2 / 3 + 0) / 3)
    assert m.per_class["B"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert m.gold_counts == {"A": 2, "TIE": 1, "B": 1}
    assert m.pred_counts == {"A": 2, "TIE": 0, "B": 2}
    assert (m.n, m.n_scored, m.n_failed, m.failures) == (4, 4, 0, "error")


@pytest.mark.parametrize("seed", range(5))
def test_pairwise_matches_the_study_formula(seed):
    """The study: score pairs -> win lists (margin 0) -> sklearn macro over the classes present."""
    gold, pred = random_verdicts(300, seed), random_verdicts(300, seed + 100)
    as_scores = {A: [1, 0], B: [0, 1], T: [1, 1]}

    def wins(vs):
        return [int(np.sign(as_scores[v][0] - as_scores[v][1])) for v in vs]

    y, p = wins(gold), wins(pred)
    m = pairwise_metrics(gold, pred)
    assert m.accuracy == pytest.approx(accuracy_score(y, p))
    assert m.precision == pytest.approx(precision_score(y, p, average="macro"))
    assert m.recall == pytest.approx(recall_score(y, p, average="macro"))
    assert m.f1 == pytest.approx(f1_score(y, p, average="macro"))


def test_pairwise_failure_policies():
    gold, pred = [A, B, T, A], [A, None, T, B]
    with pytest.raises(ValueError, match="1 of 4 predictions failed"):
        pairwise_metrics(gold, pred)
    wrong = pairwise_metrics(gold, pred, failures="count_wrong")
    assert (wrong.n, wrong.n_scored, wrong.n_failed, wrong.failures) == (4, 4, 1, "count_wrong")
    assert wrong.accuracy == 0.5
    # The failed item is a false negative of its gold class B, and a false positive of no class.
    assert wrong.per_class["B"]["recall"] == 0.0 and wrong.per_class["B"]["support"] == 1
    assert wrong.per_class["B"]["precision"] == 0.0  # the one B predicted was gold A
    assert (wrong.per_class["A"]["precision"], wrong.per_class["A"]["recall"]) == (1.0, 0.5)
    assert wrong.pred_counts == {"A": 1, "TIE": 1, "B": 1, "failed": 1}
    excluded = pairwise_metrics(gold, pred, failures="exclude")
    assert (excluded.n, excluded.n_scored, excluded.n_failed) == (4, 3, 1)
    assert excluded.accuracy == pytest.approx(2 / 3)
    assert excluded.per_class["B"]["support"] == 0
    with pytest.raises(KeyError, match="failure policy"):
        pairwise_metrics(gold, pred, failures="as_tie")
    with pytest.raises(ValueError, match="nothing left"):
        pairwise_metrics([A], [None], failures="exclude")


def test_pairwise_rejects_bad_input():
    with pytest.raises(ValueError, match=r"gold\[1\] is None"):
        pairwise_metrics([A, None], [A, A])
    with pytest.raises(TypeError, match=r"pred\[0\] must be a Verdict"):
        pairwise_metrics([A], ["A"])
    with pytest.raises(ValueError, match="differ in length"):
        pairwise_metrics([A, B], [A])


# --- Auto-J agreement and position consistency -----------------------------------------------------

# (gold, forward, reversed-as-shown): reversed is the verdict on the swapped pair in its own order.
CASES = [
    (A, A, B),  # consistent and right
    (A, A, A),  # forward right, but the first position wins both times: a flip, not counted
    (T, T, T),  # a tie swaps to a tie: consistent and right
    (A, B, A),  # consistent but wrong
    (B, T, A),  # inconsistent, not a flip (one order ties)
]


def _split(cases):
    return [c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases]


def test_autoj_agreement_corner_cases():
    m = autoj_agreement(*_split(CASES))
    assert m.agreement == pytest.approx(2 / 5)
    assert m.consistency == pytest.approx(3 / 5)
    assert m.forward_accuracy == pytest.approx(3 / 5)
    pc = position_consistency(*_split(CASES)[1:])
    assert pc.consistency == pytest.approx(3 / 5)
    assert pc.flip_rate == pytest.approx(1 / 5)


def test_autoj_agreement_failure_policies():
    cases = CASES + [(A, None, B), (T, None, None), (B, B, None)]
    with pytest.raises(ValueError, match="3 of 8 predictions failed"):
        autoj_agreement(*_split(cases))
    wrong = autoj_agreement(*_split(cases), failures="count_wrong")
    assert (wrong.n, wrong.n_scored, wrong.n_failed) == (8, 8, 3)
    # Two failed sides are not "consistent", and a failed side never agrees with gold.
    assert wrong.agreement == pytest.approx(2 / 8) and wrong.consistency == pytest.approx(3 / 8)
    assert wrong.forward_accuracy == pytest.approx(4 / 8)
    excluded = autoj_agreement(*_split(cases), failures="exclude")
    assert (excluded.n_scored, excluded.agreement, excluded.consistency) == (
        5,
        pytest.approx(2 / 5),
        pytest.approx(3 / 5),
    )
    pc = position_consistency(*_split(cases)[1:], failures="count_wrong")
    assert (pc.consistency, pc.flip_rate, pc.n_failed) == (pytest.approx(3 / 8), pytest.approx(1 / 8), 3)


@pytest.mark.parametrize("seed", range(5))
def test_autoj_agreement_matches_the_study_formula(seed):
    """UnlimitedJudge calculate_metrics('auto-j'): reversed wins negated, consistent if equal, correct if also
    equal to gold."""
    gold, fwd, rev = (
        random_verdicts(400, seed),
        random_verdicts(400, seed + 1),
        random_verdicts(400, seed + 2),
    )
    acc = con = 0
    for g, f, r in zip(gold, fwd, rev):
        if f.win == 0 - r.win:
            con += 1
            acc += g.win == f.win
    m = autoj_agreement(gold, fwd, rev)
    assert m.agreement == pytest.approx(acc / 400)
    assert m.consistency == pytest.approx(con / 400)


# --- correlations ------------------------------------------------------------------------------------


def test_correlations_hand_computed_and_scipy():
    assert correlations([1, 2, 3], [1, 2, 3]).pearson == pytest.approx(1.0)
    anti = correlations([1, 2, 3], [3, 2, 1])
    assert (anti.pearson, anti.kendall, anti.spearman) == (
        pytest.approx(-1),
        pytest.approx(-1),
        pytest.approx(-1),
    )
    rng = np.random.default_rng(0)
    gold = rng.integers(1, 6, 200).astype(float)
    pred = gold + rng.normal(0, 1.5, 200)
    c = correlations(gold.tolist(), pred.tolist())
    assert c.pearson == pytest.approx(stats.pearsonr(gold, pred)[0])
    assert c.kendall == pytest.approx(stats.kendalltau(gold, pred)[0])
    assert c.spearman == pytest.approx(stats.spearmanr(gold, pred)[0])


def test_correlations_failures():
    gold, pred = [1.0, 2.0, 3.0, 4.0], [1.0, None, 3.0, 5.0]
    with pytest.raises(ValueError, match="1 of 4"):
        correlations(gold, pred)
    with pytest.raises(ValueError, match="no meaning"):
        correlations(gold, pred, failures="count_wrong")
    c = correlations(gold, pred, failures="exclude")
    assert (c.n, c.n_scored, c.n_failed) == (4, 3, 1)
    assert c.pearson == pytest.approx(stats.pearsonr([1, 3, 4], [1, 3, 5])[0])
    with pytest.raises(ValueError, match="not finite"):
        correlations(gold, [1.0, math.nan, 3.0, 4.0])


# --- agreement matrix --------------------------------------------------------------------------------


def test_agreement_matrix_verdicts_is_symmetric_macro_f1():
    preds = {"x": random_verdicts(200, 1), "y": random_verdicts(200, 2), "z": random_verdicts(200, 3)}
    m = agreement_matrix(preds, "verdict")
    assert m.names == ["x", "y", "z"]
    wins = {k: [v.win for v in vs] for k, vs in preds.items()}
    for i, a in enumerate(m.names):
        assert m.values[i][i] == 1.0
        for j, b in enumerate(m.names):
            if i != j:
                assert m.values[i][j] == pytest.approx(f1_score(wins[a], wins[b], average="macro"))
                assert m.values[i][j] == pytest.approx(f1_score(wins[b], wins[a], average="macro"))


def test_agreement_matrix_scores_and_failures():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 1.0, 4.0, None]
    with pytest.raises(ValueError, match="failed to parse"):
        agreement_matrix({"a": a, "b": b}, "score")
    m = agreement_matrix({"a": a, "b": b}, "score", failures="exclude")
    assert m.values[0][1] == pytest.approx(stats.pearsonr([1, 2, 3], [2, 1, 4])[0])
    with pytest.raises(KeyError, match="agreement kind"):
        agreement_matrix({"a": a}, "kappa")


# --- bootstrap ---------------------------------------------------------------------------------------


def test_bootstrap_ci_accuracy_width_matches_binomial():
    gold = random_verdicts(400, 7)
    pred = [g if i % 10 < 7 else g.swapped() if g is not T else A for i, g in enumerate(gold)]  # 70% right
    ci = bootstrap_ci(lambda g, p: pairwise_metrics(g, p).accuracy, gold, pred, n=400, seed=1)
    assert isinstance(ci, CI) and ci.estimate == pytest.approx(0.7)
    assert ci.low < 0.7 < ci.high
    half = 1.96 * math.sqrt(0.7 * 0.3 / 400)
    assert (ci.high - ci.low) / 2 == pytest.approx(half, rel=0.3)
    again = bootstrap_ci(lambda g, p: pairwise_metrics(g, p).accuracy, gold, pred, n=400, seed=1)
    assert again == ci


def test_bootstrap_ci_dict_and_paired_arrays():
    gold, fwd, rev = random_verdicts(150, 1), random_verdicts(150, 2), random_verdicts(150, 3)
    cis = bootstrap_ci(
        lambda g, f, r: {
            "agreement": autoj_agreement(g, f, r).agreement,
            "consistency": autoj_agreement(g, f, r).consistency,
        },
        gold,
        fwd,
        rev,
        n=100,
    )
    m = autoj_agreement(gold, fwd, rev)
    assert cis["agreement"].estimate == m.agreement and cis["consistency"].estimate == m.consistency
    assert all(c.low <= c.estimate <= c.high for c in cis.values())
    # Identical arrays resampled jointly stay identical: accuracy is 1 in every resample.
    same = bootstrap_ci(lambda g, p: pairwise_metrics(g, p).accuracy, gold, list(gold), n=50)
    assert (same.low, same.high) == (1.0, 1.0)
    with pytest.raises(ValueError, match="differ in length"):
        bootstrap_ci(lambda g, p: 0.0, gold, gold[:-1])


def test_paired_difference_counts_won_and_lost_items_and_is_paired():
    ours = [True] * 60 + [False] * 10 + [True] * 30
    theirs = [True] * 60 + [True] * 10 + [False] * 30
    d = paired_difference(ours, theirs, n=500)
    assert d["estimate"] == pytest.approx(0.2) and (d["won"], d["lost"]) == (30, 10)
    assert d["low"] < 0.2 < d["high"]
    # Paired: the width follows the variance of the per-item differences (the 60 shared right answers are 0s).
    diff = np.array(ours, float) - np.array(theirs, float)
    assert d["high"] - d["low"] == pytest.approx(2 * 1.96 * diff.std() / math.sqrt(diff.size), rel=0.3)
    same = paired_difference(ours, ours, n=50)
    assert (same["estimate"], same["low"], same["high"], same["won"], same["lost"]) == (0.0, 0.0, 0.0, 0, 0)
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference(ours, theirs[:-1])


# --- baselines ---------------------------------------------------------------------------------------


def pair(answer_a: str, answer_b: str, verdict: Verdict | None) -> PairRecord:
    return PairRecord.build(
        Loc("t", 1), question="q", answer_a=answer_a, answer_b=answer_b, verdict=verdict, unlabelled=True
    )


def test_majority_class():
    recs = [pair("a", "b", v) for v in (B, B, A, T)]
    assert majority_class(recs) == [B] * 4
    assert majority_class(recs, reference=[pair("a", "b", T)]) == [T] * 4
    assert majority_class([pair("a", "b", v) for v in (B, A)]) == [A, A]  # count tie -> A first
    with pytest.raises(ValueError, match="no verdict"):
        majority_class([pair("a", "b", None)])


def test_longer_answer_wins():
    recs = [pair("long answer", "short", A), pair("x", "xy", A), pair("same", "size", A)]
    assert longer_answer_wins(recs) == [A, B, T]
    assert set(BASELINES.names()) == {"majority-class", "longer-answer-wins"}


@pytest.mark.parametrize("seed", range(4))
def test_per_class_counts_match_sklearn_with_absent_classes_and_failures(seed):
    """The audit's fast per-class P/R/F1 equals sklearn's (labels fixed to A / TIE / B, zero_division=0)."""
    from sklearn.metrics import precision_recall_fscore_support

    from clfjudge.metrics import FAILED, LABELS, _per_class_prf

    rng = np.random.default_rng(seed)
    gold = rng.choice([1, -1] if seed % 2 else [1, 0, -1], 50)  # no ties in gold on odd seeds
    pred = rng.choice([1, -1, FAILED], 50)  # never TIE: its precision is 0 by zero_division
    ours = _per_class_prf(gold, pred)
    theirs = precision_recall_fscore_support(gold, pred, labels=LABELS, average=None, zero_division=0)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b)
