"""The generalization scoreboard: every judge against "longer answer wins" and "shorter answer wins" on the same
pairs of every set, with a paired bootstrap CI of the difference to length.

A judge that beats length on sets where the longer answer usually wins (PandaLM, Auto-J) may only have learnt
length; one that beats it on LLMBar's adversarial sets (where the longer answer is usually the wrong one) and
on the others too has learnt something else. Each pair earns the credit of its set's protocol (suites.PROTOCOLS):
selection = forward verdict right; autoj = right in both answer orders (ties count: the Auto-J leaderboard's
3-way agreement); llmbar / both-orders = mean over the two orders. ``two_way`` is accuracy on the pairs whose
gold is not a tie, forward order, a predicted tie counting half: comparable across sets with and without ties.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..data.records import PairRecord, Verdict
from ..metrics import paired_difference
from .judges import Predictions

LONGER, SHORTER = "baseline:longer", "baseline:shorter"
ADVERSARIAL = ("llmbar-neighbor", "llmbar-gptinst", "llmbar-gptout", "llmbar-manual")


def pair_credit(protocol: str, records: Sequence[PairRecord], p: Predictions) -> np.ndarray:
    """Per pair, in [0, 1]: what the set's protocol counts for it (its mean is the headline metric)."""
    gold = [r.verdict for r in records]
    forward = np.array([v is g for v, g in zip(p.forward, gold)], dtype=float)
    if protocol == "selection" or p.reversed is None:
        return forward
    reversed_right = np.array([v is g.swapped() for v, g in zip(p.reversed, gold)], dtype=float)
    if protocol == "autoj":  # right only if the verdict survives the swap
        consistent = np.array([v is not None and r is v.swapped() for v, r in zip(p.forward, p.reversed)])
        return forward * consistent
    return (forward + reversed_right) / 2


def two_way(records: Sequence[PairRecord], p: Predictions) -> float | None:
    decided = [(r.verdict, v) for r, v in zip(records, p.forward) if r.verdict is not Verdict.TIE]
    if not decided:
        return None
    return float(np.mean([1.0 if v is g else 0.5 if v is Verdict.TIE else 0.0 for g, v in decided]))


def _consistency(p: Predictions) -> float | None:
    if p.reversed is None:
        return None
    return float(np.mean([v is not None and r is v.swapped() for v, r in zip(p.forward, p.reversed)]))


def scoreboard(d) -> dict[str, Any]:
    """Table: set -> judge -> {value, two_way, consistency, vs_longer (paired CI), seen_in_training}, plus the
    LLMBar adversarial mean per judge."""
    sets: dict[str, Any] = {}
    for s in d.sets:
        if s.arity != "pair" or not d.available(LONGER, s.name):
            continue
        records = d.records[s.name]
        longer = pair_credit(s.protocol, records, d.available(LONGER, s.name))
        rows = {}
        for judge in d.judges:
            p = d.available(judge, s.name)
            if p is None:
                continue
            credit = pair_credit(s.protocol, records, p)
            rows[judge] = {"value": float(credit.mean()), "two_way": two_way(records, p),
                           "consistency": _consistency(p), "seen_in_training": p.seen_in_training,
                           "vs_longer": None if judge == LONGER else
                           paired_difference(credit, longer, n=max(d.bootstrap, 0), seed=0)}
        sets[s.name] = {"protocol": s.protocol, "n": len(records), "label": s.label, "rows": rows}
    adversarial = {}
    for judge in d.judges:
        values = [sets[s]["rows"][judge]["value"] for s in ADVERSARIAL if s in sets and judge in sets[s]["rows"]]
        if len(values) == len(ADVERSARIAL):
            adversarial[judge] = float(np.mean(values))
    return {"sets": sets, "adversarial_mean": adversarial, "adversarial_sets": list(ADVERSARIAL)}
