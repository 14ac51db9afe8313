"""Audit test sets and suites, declared as data, and the functions that turn predictions into their tables.

A ``TestSet`` names a source, its arity (pair / point) and the metric protocol its paper scores it with (``paper``).
A suite is a function of (sets, judges, predictions) -> a JSON-able table; ``SUITES`` lists them in report order.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from ..data.records import PairRecord, PointRecord, Verdict
from ..metrics import (
    agreement_matrix,
    autoj_agreement,
    bootstrap_ci,
    evaluate_pairs,
    evaluate_points,
    pairwise_metrics,
    position_consistency,
)
from ..registry import Registry
from .judges import Predictions
from .scoreboard import scoreboard

GOLD = "gold"


@dataclass(frozen=True)
class TestSet:
    name: str  # a source in clfjudge.data.sources
    arity: str  # "pair" | "point"
    protocol: str  # a name in PROTOCOLS: how its paper scores this set
    label: str  # column label in the report


TEST_SETS: tuple[TestSet, ...] = (
    TestSet("judgelm-val", "pair", "selection", "JudgeLM"),
    TestSet("pandalm-test", "pair", "selection", "PandaLM"),
    TestSet("autoj-test", "pair", "autoj", "Auto-J"),
    TestSet("prometheus-ind", "point", "grading", "Prometheus ind"),
    TestSet("prometheus-ood", "point", "grading", "Prometheus ood"),
    TestSet("prometheus-mtbench", "point", "grading", "MT Bench (Prometheus eval)"),
    TestSet("prometheus-vicuna", "point", "grading", "Vicuna Bench (Prometheus eval)"),
    TestSet("llmbar-natural", "pair", "llmbar", "Natural"),
    TestSet("llmbar-neighbor", "pair", "llmbar", "Neighbor"),
    TestSet("llmbar-gptinst", "pair", "llmbar", "GPTInst"),
    TestSet("llmbar-gptout", "pair", "llmbar", "GPTOut"),
    TestSet("llmbar-manual", "pair", "llmbar", "Manual"),
    # human preferences processed by LLMBar's authors (ties removed): judged in both orders like LLMBar, but not
    # part of the LLMBar average
    TestSet("llmbar-faireval", "pair", "both-orders", "FairEval"),
    TestSet("llmbar-llmeval2", "pair", "both-orders", "LLMEval²"),
)
LLMBAR = tuple(s for s in TEST_SETS if s.protocol == "llmbar")


# -- metric protocols: (gold records, predictions) -> {metric: value}, the headline first --------------------

def _gold_verdicts(records: Sequence[PairRecord]) -> list[Verdict]:
    return [r.verdict for r in records]


def selection(records, p: Predictions) -> dict[str, float]:
    m = evaluate_pairs(records, p.forward, failures="count_wrong")
    return {"accuracy": m["accuracy"], "f1": m["f1"], "n_failed": m["n_failed"]}


def autoj(records, p: Predictions) -> dict[str, float]:
    if p.reversed is None:  # judged in one order only: the Auto-J protocol cannot be applied
        return {"forward_accuracy": selection(records, p)["accuracy"]}
    m = autoj_agreement(_gold_verdicts(records), p.forward, p.reversed, failures="count_wrong")
    return {"agreement": m.agreement, "consistency": m.consistency, "forward_accuracy": m.forward_accuracy,
            "n_failed": m.n_failed}


def llmbar(records, p: Predictions) -> dict[str, float]:
    """LLMBar accuracy as the Empirical Study of LLM-as-a-Judge (``paper.LLMBAR``) scores it: both answer orders,
    averaged; plus positional agreement."""
    gold = _gold_verdicts(records)
    fwd = selection(records, p)["accuracy"]
    if p.reversed is None:
        return {"accuracy": fwd, "forward_accuracy": fwd}
    rev = pairwise_metrics([g.swapped() for g in gold], p.reversed, failures="count_wrong").accuracy
    pos = position_consistency(p.forward, p.reversed, failures="count_wrong")
    return {"accuracy": (fwd + rev) / 2, "forward_accuracy": fwd, "reversed_accuracy": rev,
            "consistency": pos.consistency, "n_failed": pos.n_failed}  # pairs with a failure in either order


def grading(records, p: Predictions) -> dict[str, float]:
    m = evaluate_points(records, p.scores, failures="exclude")  # fewer than two scores: missing, not zero
    return {k: m[k] for k in ("pearson", "kendall", "spearman", "n_failed")}


PROTOCOLS: Registry[Callable[[Sequence[Any], Predictions], dict[str, float]]] = Registry("metric protocol")
for _fn in (selection, autoj, llmbar, grading):
    PROTOCOLS.register(_fn.__name__, _fn)
PROTOCOLS.register("both-orders", llmbar)


def headline(protocol: str, metrics: Mapping[str, float]) -> str:
    order = {"selection": "accuracy", "autoj": "agreement", "llmbar": "accuracy", "both-orders": "accuracy",
             "grading": "pearson"}
    key = order[protocol]
    return key if key in metrics else "forward_accuracy"


def _ci(protocol: str, records, p: Predictions, n_boot: int) -> dict[str, float] | None:
    """Bootstrap CI of the headline metric, resampling records jointly with their predictions."""
    if n_boot <= 0 or len(records) < 10:
        return None
    fn = PROTOCOLS.get(protocol)
    key = headline(protocol, fn(records, p))
    idx = np.arange(len(records))

    def metric(ix: np.ndarray) -> float:
        ix = ix.astype(int)
        sub = Predictions(**{f: None if getattr(p, f) is None else [getattr(p, f)[i] for i in ix]
                             for f in ("forward", "reversed", "margin", "scores")})
        return fn([records[i] for i in ix], sub)[key]

    return bootstrap_ci(metric, idx, n=n_boot).as_dict()


# -- suites ----------------------------------------------------------------------------------------------

Table = dict[str, Any]
PredTable = Mapping[str, Mapping[str, "Predictions | str"]]  # judge -> set -> predictions or n/a reason


@dataclass
class AuditData:
    sets: list[TestSet]
    records: dict[str, list[PairRecord | PointRecord]]
    judges: list[str]
    preds: PredTable
    bootstrap: int

    def available(self, judge: str, set_name: str) -> Predictions | None:
        p = self.preds[judge].get(set_name)
        return p if isinstance(p, Predictions) else None


def cross_scheme(d: AuditData) -> Table:
    """Every judge on every set with the set's own protocol; Table 3 / Table 4 averages."""
    rows: dict[str, dict[str, Any]] = {}
    for judge in d.judges:
        row: dict[str, Any] = {}
        for s in d.sets:
            p = d.preds[judge].get(s.name)
            if not isinstance(p, Predictions):
                row[s.name] = {"n/a": p}
                continue
            metrics = PROTOCOLS.get(s.protocol)(d.records[s.name], p)
            key = headline(s.protocol, metrics)
            row[s.name] = {**metrics, "headline": key, "transform": p.transform, "notes": p.notes,
                           "seen_in_training": p.seen_in_training,
                           "ci": _ci(s.protocol, d.records[s.name], p, d.bootstrap)}
        row["average_pairwise"] = _average(row, ("judgelm-val:accuracy", "pandalm-test:accuracy",
                                                 "autoj-test:agreement"))
        row["average_pointwise"] = _average(row, ("prometheus-ind:pearson", "prometheus-ood:pearson"))
        row["average_pointwise_eval"] = _average(row, ("prometheus-mtbench:pearson", "prometheus-vicuna:pearson"))
        rows[judge] = row
    return {"rows": rows, "sets": [s.name for s in d.sets],
            "average_note": "pairwise = mean(JudgeLM acc, PandaLM acc, Auto-J agreement) over the sets available "
                            "(Empirical Study Table 3); pointwise = mean(Pearson ind, ood) (Table 4); eval = mean "
                            "Pearson of the Prometheus MT Bench and Vicuna Bench eval files"}


def _average(row: Mapping[str, Any], cells: Sequence[str]) -> dict[str, Any] | None:
    """Mean over the cells whose set is available here; None unless the judge covers all of them (a released
    judge's file covers one test set, and its one number is not an average)."""
    present = [c for c in cells if c.split(":")[0] in row]
    values = [row[s].get(m) for s, m in (c.split(":") for c in present)]
    if not present or any(v is None for v in values):
        return None
    return {"value": float(np.mean(values)), "over": [c.split(":")[0] for c in present]}


def llmbar_suite(d: AuditData) -> Table:
    rows = {}
    for judge in d.judges:
        rows[judge] = {s.name: llmbar(d.records[s.name], p) if (p := d.available(judge, s.name)) else None
                       for s in d.sets if s.protocol == "llmbar"}
        scored = [v["accuracy"] for v in rows[judge].values() if v]
        rows[judge]["average"] = float(np.mean(scored)) if scored else None
    return {"rows": rows}


def position_suite(d: AuditData) -> Table:
    """Flip rate under swap and the share of decisive verdicts that pick the first-shown answer (pooled over
    both orders, so an unbiased judge scores 0.5 whatever the gold distribution)."""
    rows: dict[str, dict[str, Any]] = {}
    for judge in d.judges:
        rows[judge] = {}
        for s in d.sets:
            p = d.available(judge, s.name)
            if s.arity != "pair" or p is None or p.reversed is None:
                continue
            c = position_consistency(p.forward, p.reversed, failures="count_wrong")  # a failure is no agreement
            decisive = [v for v in (*p.forward, *p.reversed) if v in (Verdict.A, Verdict.B)]
            first = float(np.mean([v is Verdict.A for v in decisive])) if decisive else None
            rows[judge][s.name] = {"consistency": c.consistency, "flip_rate": c.flip_rate,
                                   "first_position_preference": first, "n_failed": c.n_failed}
    return {"rows": rows}


def length_suite(d: AuditData) -> Table:
    """Accuracy when the gold winner is the longer vs the shorter answer; how often the judge picks the longer
    answer; Pearson of the judge's margin with the log-length difference."""
    rows: dict[str, dict[str, Any]] = {}
    for judge in d.judges:
        rows[judge] = {}
        for s in d.sets:
            p = d.available(judge, s.name)
            if s.arity != "pair" or p is None:
                continue
            recs = d.records[s.name]
            longer_is_a = [len(r.answer_a) > len(r.answer_b) for r in recs]
            decisive = [i for i, r in enumerate(recs) if r.verdict is not Verdict.TIE and
                        len(r.answer_a) != len(r.answer_b)]
            gold_longer = [i for i in decisive if (recs[i].verdict is Verdict.A) == longer_is_a[i]]
            gold_shorter = [i for i in decisive if i not in set(gold_longer)]
            picks = [i for i in decisive if p.forward[i] in (Verdict.A, Verdict.B)]
            row = {
                "acc_gold_longer": _acc(recs, p.forward, gold_longer), "n_gold_longer": len(gold_longer),
                "acc_gold_shorter": _acc(recs, p.forward, gold_shorter), "n_gold_shorter": len(gold_shorter),
                "picks_longer": float(np.mean([(p.forward[i] is Verdict.A) == longer_is_a[i] for i in picks]))
                if picks else None,
            }
            if p.margin is not None:
                dlen = [np.log1p(len(r.answer_a)) - np.log1p(len(r.answer_b)) for r in recs]
                row["margin_length_pearson"] = float(stats.pearsonr(p.margin, dlen).statistic) \
                    if np.std(p.margin) > 0 else None
            rows[judge][s.name] = row
    return {"rows": rows}


def _acc(records, forward, idx) -> float | None:
    return float(np.mean([forward[i] is records[i].verdict for i in idx])) if idx else None


def truncation_suite(d: AuditData) -> Table:
    rows = {judge: {s.name: p.truncation for s in d.sets if (p := d.available(judge, s.name)) and p.truncation}
            for judge in d.judges}
    return {"rows": {j: r for j, r in rows.items() if r}}


def agreement_suite(d: AuditData) -> Table:
    """Inter-evaluator agreement with gold as one evaluator: macro F1 on pair sets, Pearson on point sets
    (study Figs 2-3), over the judges that cover the set."""
    out = {}
    for s in d.sets:
        recs = d.records[s.name]
        covering = [j for j in d.judges if d.available(j, s.name)]
        if len(covering) < 2:
            continue
        if s.arity == "pair":
            preds = {GOLD: _gold_verdicts(recs), **{j: d.available(j, s.name).forward for j in covering}}
            m = agreement_matrix(preds, "verdict", failures="exclude")
        else:
            preds = {GOLD: [r.score for r in recs], **{j: d.available(j, s.name).scores for j in covering}}
            m = agreement_matrix(preds, "score", failures="exclude")
        out[s.name] = m.as_dict()
    return {"matrices": out}


def system_level_suite(d: AuditData) -> Table:
    """SemScore's protocol (its Table 3): per-system mean of each point judge's score against the per-system mean
    gold score, |Kendall tau| and |Pearson r| across systems."""
    from .semscore import system_level

    out: dict[str, dict[str, Any]] = {}
    for s in d.sets:
        recs = d.records[s.name]
        if s.arity != "point" or len({r.model for r in recs}) < 3:
            continue
        for judge in d.judges:
            p = d.available(judge, s.name)
            if p is None or p.scores is None:
                continue
            kept = [(r.model, v, r.score) for r, v in zip(recs, p.scores) if v is not None]
            res = system_level(*zip(*kept))
            out.setdefault(s.name, {})[judge] = {"kendall_tau": res.kendall_tau, "pearson_r": res.pearson_r,
                                                 "kendall_tau_signed": res.kendall_tau_signed,
                                                 "pearson_r_signed": res.pearson_r_signed,
                                                 "systems": res.systems, "judge_means": res.metric_means,
                                                 "gold_means": res.gold_means}
    return {"sets": out}


SUITES: dict[str, Callable[[AuditData], Table]] = {
    "scoreboard": scoreboard,
    "cross-scheme": cross_scheme,
    "llmbar": llmbar_suite,
    "position": position_suite,
    "length": length_suite,
    "truncation": truncation_suite,
    "agreement": agreement_suite,
    "system-level": system_level_suite,
}
