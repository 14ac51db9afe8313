"""Post-hoc calibration of pair judges, fitted on labelled validation pairs and stored in the judge card.

Two parameters, applied by the runtime (``Calibration.from_card``):

- **temperature** T for softmax heads (``cls3``; the embedding judge, whose log-probabilities play the role
  of logits): probabilities = softmax(logits / T), T fitted by minimising the negative log-likelihood of the
  gold verdicts (Guo et al. 2017). It changes how sure the probabilities are, never the argmax.
  Reward heads are calibrated by their own Davidson tie model instead (``RewardHead.calibrate``).
- **tie margin** m: the verdict is TIE when P(TIE) is the largest probability or when |P(A) - P(B)| <= m.
  m is searched on the validation pairs shown in both orders to maximise the Auto-J agreement (a pair counts
  only if both orders agree with each other and with the gold verdict), so a judge that hesitates between
  the answers says TIE instead of flipping with the answer order.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data.records import CLASS_OF_VERDICT, Verdict
from ..models.heads import Cls3Head, PairOutputs, RewardHead, fit_davidson
from ..registry import Registry

if TYPE_CHECKING:
    from ..card import JudgeCard

# Largest number of candidate tie margins tried (quantiles of |P(A) - P(B)| when there are more).
MAX_MARGIN_CANDIDATES = 400
TEMPERATURE_BOUNDS = (0.05, 20.0)


@dataclass(frozen=True)
class Calibration:
    temperature: float = 1.0
    tie_margin: float | None = None  # None: plain argmax over (P(TIE), P(A), P(B))

    @classmethod
    def from_card(cls, card: JudgeCard) -> Calibration:
        cal = card.calibration or {}
        margin = cal.get("tie_margin")
        return cls(temperature=float(cal.get("temperature", 1.0)),
                   tie_margin=None if margin is None else float(margin))

    def scale(self, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, dtype=np.float64) / self.temperature

    def verdicts(self, outputs: PairOutputs) -> list[Verdict]:
        if self.tie_margin is None:
            return outputs.verdicts()
        return decide(outputs, self.tie_margin)


def decide(outputs: PairOutputs, tie_margin: float) -> list[Verdict]:
    """TIE when P(TIE) is the largest or |P(A) - P(B)| <= tie_margin, else the likelier answer."""
    p_a, p_tie, p_b = outputs.p_a, outputs.p_tie, outputs.p_b
    tie = (p_tie >= np.maximum(p_a, p_b)) | (np.abs(p_a - p_b) <= tie_margin)
    return [Verdict.TIE if t else Verdict.A if a > b else Verdict.B for t, a, b in zip(tie, p_a, p_b)]


# -- temperature scaling ----------------------------------------------------------------------------------

def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of integer class ``labels`` under softmax(logits / temperature)."""
    from scipy.special import log_softmax

    logp = log_softmax(np.asarray(logits, dtype=np.float64) / temperature, axis=1)
    return -float(logp[np.arange(len(labels)), labels].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The temperature minimising the validation NLL (bounded 1-D search over log T)."""
    from scipy.optimize import minimize_scalar

    lo, hi = (math.log(b) for b in TEMPERATURE_BOUNDS)
    res = minimize_scalar(lambda t: nll(logits, labels, math.exp(t)), bounds=(lo, hi), method="bounded")
    return float(math.exp(res.x))


# -- tie margin -------------------------------------------------------------------------------------------

def search_tie_margin(forward: PairOutputs, reversed_: PairOutputs, gold: Sequence[Verdict]) -> dict[str, Any]:
    """The tie margin maximising Auto-J agreement on pairs judged in both orders (``reversed_[i]`` is pair i
    with its answers swapped). Ties in the objective go to the higher forward accuracy, then the smaller
    margin. Returns the margin (None when plain argmax is best) and the agreement with and without it."""
    from ..metrics import autoj_agreement

    gaps = np.abs(np.concatenate([forward.p_a - forward.p_b, reversed_.p_a - reversed_.p_b]))
    candidates = np.unique(gaps)
    if candidates.size > MAX_MARGIN_CANDIDATES:
        candidates = np.unique(np.quantile(gaps, np.linspace(0, 1, MAX_MARGIN_CANDIDATES)))

    def score(margin: float | None) -> tuple[float, float]:
        cal = Calibration(tie_margin=margin)
        m = autoj_agreement(gold, cal.verdicts(forward), cal.verdicts(reversed_))
        return m.agreement, m.forward_accuracy

    base = score(None)
    best_margin, best = None, base
    for margin in candidates:
        current = score(float(margin))
        if current > best:
            best_margin, best = float(margin), current
    return {"tie_margin": best_margin, "agreement_argmax": base[0], "agreement": best[0],
            "forward_accuracy": best[1]}


# -- fitting per head -------------------------------------------------------------------------------------

def _softmax_fit(raw_f: np.ndarray, raw_r: np.ndarray, gold: Sequence[Verdict],
                 current: Mapping[str, Any]) -> tuple[dict[str, Any], PairOutputs, PairOutputs]:
    labels = np.array([CLASS_OF_VERDICT[v] for v in gold] + [CLASS_OF_VERDICT[v.swapped()] for v in gold])
    logits = np.vstack([raw_f, raw_r])
    temperature = fit_temperature(logits, labels)
    entry = {"method": "temperature", "temperature": temperature,
             "nll_before": nll(logits, labels, float(current.get("temperature", 1.0))),
             "nll_after": nll(logits, labels, temperature)}
    head, cal = Cls3Head(), Calibration(temperature=temperature)
    return entry, head.outputs(cal.scale(raw_f)), head.outputs(cal.scale(raw_r))


def _davidson_fit(raw_f: np.ndarray, raw_r: np.ndarray, gold: Sequence[Verdict],
                  current: Mapping[str, Any]) -> tuple[dict[str, Any], PairOutputs, PairOutputs]:
    both = [*gold, *(v.swapped() for v in gold)]
    margins = np.concatenate([RewardHead.rewards(r).reshape(-1, 2) @ np.array([1.0, -1.0]) for r in (raw_f, raw_r)])
    # raw outputs already hold the length offsets (Judge.raw_outputs); the coefficient is kept as trained
    length_coef = float(current.get("length_coef", 0.0))
    before = RewardHead(float(current.get("scale", 1.0)), float(current.get("nu", 0.0)), length_coef=length_coef)
    head = RewardHead(*fit_davidson(margins, both), length_coef=length_coef)
    entry = {"method": "davidson", **head.card_fields()["calibration"],
             "nll_before": _pair_nll(before.outputs(np.vstack([raw_f, raw_r])), both),
             "nll_after": _pair_nll(head.outputs(np.vstack([raw_f, raw_r])), both)}
    return entry, head.outputs(raw_f), head.outputs(raw_r)


def _pair_nll(outputs: PairOutputs, gold: Sequence[Verdict]) -> float:
    p = np.stack([outputs.p_tie, outputs.p_a, outputs.p_b], axis=1)  # study class order
    picked = p[np.arange(len(gold)), [CLASS_OF_VERDICT[v] for v in gold]]
    return -float(np.log(np.clip(picked, 1e-12, None)).mean())


# head name -> fit(raw forward, raw reversed, gold, current card entry)
#   -> (new card entry, calibrated outputs forward, calibrated outputs reversed)
CALIBRATORS: Registry = Registry("calibrator")
CALIBRATORS.register("cls3", _softmax_fit)
CALIBRATORS.register("embedding", _softmax_fit)  # raw outputs are log-probabilities in class order
CALIBRATORS.register("reward", _davidson_fit)
CALIBRATORS.register("reward-binary", _davidson_fit)  # its raw outputs are rewards (log-odds) as well
CALIBRATORS.register("verdict", _davidson_fit)  # two rewards per pair: verdict log-odds (pairwise: +-margin / 2)


def fit_calibration(head: str, raw_forward: np.ndarray, raw_reversed: np.ndarray, gold: Sequence[Verdict],
                    current: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Fit the head's calibration and the tie margin on labelled pairs scored in both answer orders.

    ``raw_*``: the judge's raw outputs (``Judge.raw_outputs``) on the pairs and on the swapped pairs.
    ``current``: the card's calibration so far (the "before" of the reported NLL).
    Returns the new ``judge_card.calibration`` entry."""
    if head not in CALIBRATORS:
        raise ValueError(f"a {head!r} judge has nothing to calibrate (calibration applies to pair judges: "
                         f"{', '.join(CALIBRATORS.names())})")
    # fitted on both answer orders: a preference file that lists the chosen answer first has one verdict per order
    if len(gold) < 2 or len(set(gold) | {v.swapped() for v in gold}) < 2:
        raise ValueError(f"calibration needs labelled pairs with at least two distinct verdicts in either answer "
                         f"order, got {len(gold)} pairs with verdicts {sorted({v.value for v in gold})}")
    entry, fwd, rev = CALIBRATORS.get(head)(np.asarray(raw_forward), np.asarray(raw_reversed), gold,
                                          current or {})
    return {**entry, **search_tie_margin(fwd, rev, gold), "n_pairs": len(gold)}
