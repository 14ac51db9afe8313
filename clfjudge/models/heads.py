"""Prediction heads: what a backbone is trained to output, with which loss, and how its raw outputs become
verdicts or scores.

Every head sits on a HF ``AutoModelForSequenceClassification`` (a fresh linear layer over the [CLS] token of
an encoder, or over the last non-pad token of a decoder) and differs only in what goes in and what comes out:

- ``cls3``: pairwise cross-encoder; question and both answers in one input, 3 classes coded as in "An Empirical
  Study of LLM-as-a-Judge for LLM Evaluation: Fine-tuned Judge Models are Task-specific Classifiers" (the Empirical
  Study; TIE 0, A 1, B 2), cross-entropy. Not position-invariant: train with ``swap_aug``.
- ``regression``: pointwise; one answer in, one output, MSE against the score normalised to [0, 1] by the
  record's scale; predictions are mapped back to that scale (stored in the card).
- ``reward``: pairwise reward model; each (question, answer) is scored on its own (so each answer gets the
  full length budget and swapping the answers just mirrors the scores), trained with the Bradley-Terry loss
  -log sigma(r_A - r_B) as in TRL's RewardTrainer. Ties: the BT likelihood with half credit, i.e.
  -1/2 [log sigma(d) + log sigma(-d)], which pulls d = r_A - r_B toward 0 (this is binary cross-entropy on d
  with target 1 / 0.5 / 0). Verdict probabilities come from Davidson's (1970) tie model fitted on the dev
  split after training: P(A) : P(TIE) : P(B) = e^{s d/2} : nu : e^{-s d/2}; its argmax is TIE exactly when
  |s d| < 2 ln nu, i.e. a tie threshold on |r_A - r_B|.
  With ``length_covariate`` the reward is r = f(question, answer) + beta * log(1 + characters of the answer),
  beta fixed before training by a Bradley-Terry fit of the length difference alone: an offset, as in a GLM
  (and in length-controlled AlpacaEval), so the network is trained on what length does not already explain.

Heads import numpy only at module level; torch is imported inside the loss, so an ONNX runtime can use a
head's ``outputs`` without torch.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..data.records import CLASS_OF_VERDICT, VERDICT_OF_CLASS, PairRecord, PointRecord, Record, Verdict
from ..registry import Registry

if TYPE_CHECKING:
    import torch

    from ..card import JudgeCard
    from ..prompts.encoding import Encoder


@dataclass
class PairOutputs:
    """Per-pair probabilities of A better / tie / B better (and the reward margin r_A - r_B if any)."""

    p_a: np.ndarray
    p_tie: np.ndarray
    p_b: np.ndarray
    margin: np.ndarray | None = None

    def verdicts(self) -> list[Verdict]:
        """The likeliest outcome; TIE where P(A) == P(B) (identical answers), which no answer wins."""
        best = np.stack([self.p_tie, self.p_a, self.p_b], axis=1).argmax(axis=1)  # study class order
        return [Verdict.TIE if a == b else VERDICT_OF_CLASS[int(c)] for c, a, b in zip(best, self.p_a, self.p_b)]


@dataclass
class PointOutputs:
    scores: np.ndarray


def _mean_over_items(per_item: torch.Tensor, num_items_in_batch: torch.Tensor | int | None) -> torch.Tensor:
    # With gradient accumulation the Trainer passes the number of records in the whole accumulated batch;
    # dividing the sum by it gives the same gradient as one big batch.
    return per_item.sum() / num_items_in_batch if num_items_in_batch is not None else per_item.mean()


class Head:
    name: ClassVar[str]
    arity: ClassVar[str]  # what the judge answers: "pair" (compare two answers) or "point" (score one)
    num_labels: ClassVar[int]
    problem_type: ClassVar[str]
    scheme_suffix: ClassVar[str]  # the scheme is "<backbone family>-<suffix>" unless the config names one
    sequences_per_record: ClassVar[int] = 1
    position_invariant: ClassVar[bool] = False
    label_is_float: ClassVar[bool] = False
    supports_length_covariate: ClassVar[bool] = False
    trainable: ClassVar[bool] = True  # False: a head that only reads a model someone else trained
    best_metric: ClassVar[str]  # dev metric for early stopping / best checkpoint (greater is better)
    # What a judge with this head can do, "compare" and / or "score"; unless a head says: what its kind answers.
    tasks: ClassVar[tuple[str, ...]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not hasattr(cls, "tasks") and hasattr(cls, "arity"):
            cls.tasks = {"pair": ("compare",), "point": ("score",)}[cls.arity]

    def default_scheme(self, family: str) -> str:
        return f"{family}-{self.scheme_suffix}"

    # -- data -------------------------------------------------------------------------------------------
    def select(self, records: Sequence[Record]) -> tuple[list[Record], Counter]:
        """The records this head can learn from, and a count of the others by reason."""
        kept, excluded = [], Counter()
        for rec in records:
            reason = self._unusable(rec)
            if reason:
                excluded[reason] += 1
            else:
                kept.append(rec)
        return kept, excluded

    def _unusable(self, record: Record) -> str | None:
        if not isinstance(record, PairRecord):
            return f"{record.arity} record ({self.name} head needs pairs)"
        if record.verdict is None:
            return "pair without a verdict"
        return None

    def fit(self, records: Sequence[Record]) -> None:
        """Learn whatever the head needs from the training records before training (e.g. a score scale)."""

    def features(self, record: Record, encoder: Encoder) -> dict[str, Any]:
        """Encoded sequences (k per record, see ``encoding.collate``) plus the label."""
        seqs = [encoder.encode(r) for r in self.inputs(record)]
        out: dict[str, Any] = {k: [s[k] for s in seqs] for k in seqs[0]}
        out["labels"] = self.label(record)
        return out

    def inputs(self, record: Record) -> list[Record]:
        """The record(s) the backbone sees for one judgement, in the order of the k sequences."""
        return [record]

    def label(self, record: Record) -> float | int:
        raise NotImplementedError

    # -- training ---------------------------------------------------------------------------------------
    def loss(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        """Trainer ``compute_loss_func``: the per-record loss, normalised over the accumulated batch."""
        raise NotImplementedError

    # -- predictions ------------------------------------------------------------------------------------
    def outputs(self, logits: np.ndarray) -> PairOutputs | PointOutputs:
        """Raw model outputs for N records (shape (N*k, num_labels) or (N, k*num_labels)) -> predictions."""
        raise NotImplementedError

    def adjust(self, logits: np.ndarray, records: Sequence[Record]) -> np.ndarray:
        """Raw model outputs plus whatever the head adds from the records themselves (default: nothing).
        Every path from logits to predictions (training metrics, PyTorch and ONNX judges) goes through it."""
        return logits

    def calibrate(self, logits: np.ndarray, records: Sequence[Record]) -> None:
        """Fit post-hoc parameters on the dev split (after training)."""

    def evaluate(self, outputs: PairOutputs | PointOutputs, records: Sequence[Record],
                 swapped: PairOutputs | None = None) -> dict[str, Any]:
        raise NotImplementedError

    # -- judge card -------------------------------------------------------------------------------------
    def card_fields(self) -> dict[str, Any]:
        """``label_map``, ``score_scale`` and ``calibration`` entries of the judge card."""
        return {"label_map": {}, "score_scale": None, "calibration": {}}

    def id2label(self) -> dict[int, str]:
        """Names of the model's outputs (written to the HF config)."""
        return {0: self.name}

    @staticmethod
    def postprocessing(card: JudgeCard, columns: list[str]) -> dict[str, Any]:
        """How an exported judge with this head turns its graph's outputs (``columns``) into verdicts or scores, in
        words and the card's numbers: the ``postprocessing`` of ``signature.json`` (``export.signature``)."""
        return {"label_map": card.label_map, "calibration": card.calibration}

    @classmethod
    def from_card(cls, card: JudgeCard) -> Head:
        return cls()

    @classmethod
    def from_labels(cls, id2label: dict[str, str]) -> Head:
        """The head reading a model clfjudge did not train (``judges.foreign``), whose config names its outputs
        ``id2label``; a head whose outputs need no names ignores them."""
        return cls()


def _pair_metrics(outputs: PairOutputs, records: Sequence[Record], swapped: PairOutputs | None) -> dict[str, Any]:
    """The Empirical Study's pairwise metrics; with predictions on the swapped pairs also Auto-J agreement and
    consistency."""
    from ..metrics import evaluate_pairs

    return evaluate_pairs(records, outputs.verdicts(), None if swapped is None else swapped.verdicts())


FINE_TUNED = "fine-tuned"  # the judge kind whose card names one of these heads (clfjudge/kinds.py)
HEADS: Registry[type[Head]] = Registry("head")


@HEADS.register("cls3")
class Cls3Head(Head):
    name = "cls3"
    arity = "pair"
    num_labels = 3
    problem_type = "single_label_classification"
    scheme_suffix = "pair"
    best_metric = "accuracy"

    def label(self, record: PairRecord) -> int:
        return CLASS_OF_VERDICT[record.verdict]

    def loss(self, outputs, labels, num_items_in_batch=None):
        import torch.nn.functional as F

        per = F.cross_entropy(outputs["logits"].view(-1, self.num_labels).float(), labels.view(-1), reduction="none")
        return _mean_over_items(per, num_items_in_batch)

    def outputs(self, logits: np.ndarray) -> PairOutputs:
        z = np.asarray(logits, dtype=np.float64).reshape(-1, self.num_labels)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        c = CLASS_OF_VERDICT
        return PairOutputs(p_a=p[:, c[Verdict.A]], p_tie=p[:, c[Verdict.TIE]], p_b=p[:, c[Verdict.B]])

    def evaluate(self, outputs, records, swapped=None):
        return _pair_metrics(outputs, records, swapped)

    def id2label(self) -> dict[int, str]:
        return {i: v.value for v, i in CLASS_OF_VERDICT.items()}

    def card_fields(self) -> dict[str, Any]:
        return {"label_map": {str(i): v for i, v in self.id2label().items()}, "score_scale": None, "calibration": {}}

    @staticmethod
    def postprocessing(card: JudgeCard, columns: list[str]) -> dict[str, Any]:
        cal = card.calibration
        return {"sequences_per_comparison": 1,
                "compare": f"p = softmax(logits / temperature) over the columns {columns}; verdict = argmax"
                           + (" (TIE also when |P(A) - P(B)| <= tie_margin)" if cal.get("tie_margin") else ""),
                "temperature": cal.get("temperature", 1.0), "tie_margin": cal.get("tie_margin")}


@HEADS.register("regression")
class RegressionHead(Head):
    name = "regression"
    arity = "point"
    num_labels = 1
    problem_type = "regression"
    scheme_suffix = "point"
    label_is_float = True
    best_metric = "pearson"

    def __init__(self, scale: Sequence[float] | None = None) -> None:
        self.scale: tuple[float, float] | None = tuple(scale) if scale is not None else None

    def select(self, records):
        # Pairwise *grading* data (a score per answer) trains a pointwise head one answer at a time, as in
        # the Empirical Study's code; a pair with only a verdict has no score to learn and is counted as excluded.
        from ..prompts.schemes import pair_to_points

        points, excluded = [], Counter()
        for rec in records:
            if isinstance(rec, PairRecord):
                if rec.scores is None:
                    excluded["pair without a score pair (regression head needs scores)"] += 1
                    continue
                points.extend(pair_to_points(rec))
            elif rec.score is None:
                excluded["point without a score"] += 1
            else:
                points.append(rec)
        return points, excluded

    def fit(self, records: Sequence[PointRecord]) -> None:
        scales = sorted({tuple(r.scale) for r in records})
        if len(scales) != 1:
            raise ValueError(f"regression head: the training records use several score scales {scales}; "
                             "train one judge per scale (sources with different scales cannot share one output)")
        self.scale = scales[0]

    def _span(self) -> tuple[float, float]:
        if self.scale is None:
            raise ValueError("regression head has no score scale: call fit(records) or load it from a card")
        lo, hi = self.scale
        return lo, hi - lo

    def label(self, record: PointRecord) -> float:
        lo, width = self._span()
        if tuple(record.scale) != self.scale:
            raise ValueError(f"record {record.id}: scale {record.scale} differs from the head's {self.scale}")
        return (record.score - lo) / width

    def loss(self, outputs, labels, num_items_in_batch=None):
        per = (outputs["logits"].view(-1).float() - labels.view(-1).float()) ** 2
        return _mean_over_items(per, num_items_in_batch)

    def outputs(self, logits: np.ndarray) -> PointOutputs:
        lo, width = self._span()
        raw = np.asarray(logits, dtype=np.float64).reshape(-1)
        return PointOutputs(scores=np.clip(lo + raw * width, lo, lo + width))

    def evaluate(self, outputs, records, swapped=None):
        from ..metrics import evaluate_points

        gold = np.array([r.score for r in records], dtype=np.float64)
        return {**evaluate_points(records, outputs.scores), "mse": float(np.mean((gold - outputs.scores) ** 2))}

    def card_fields(self) -> dict[str, Any]:
        lo, width = self._span()
        return {"label_map": {"0": f"score on [{lo:g}, {lo + width:g}], trained as (score - {lo:g}) / {width:g}"},
                "score_scale": [lo, lo + width], "calibration": {}}

    @staticmethod
    def postprocessing(card: JudgeCard, columns: list[str]) -> dict[str, Any]:
        lo, hi = card.score_scale or (0.0, 1.0)
        return {"score": f"clip({lo:g} + logits[:, 0] * {hi - lo:g}, {lo:g}, {hi:g})", "score_scale": [lo, hi]}

    @classmethod
    def from_card(cls, card: JudgeCard) -> RegressionHead:
        return cls(scale=card.score_scale)


# Bradley-Terry target per verdict: P(A beats B); a tie is half a win for each side.
_BT_TARGET = {Verdict.A: 1.0, Verdict.TIE: 0.5, Verdict.B: 0.0}


def bradley_terry_loss(r_a: torch.Tensor, r_b: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-pair loss: -log sigma(r_A - r_B) for A, -log sigma(r_B - r_A) for B, their mean for a tie."""
    import torch.nn.functional as F

    return F.binary_cross_entropy_with_logits(r_a - r_b, target, reduction="none")


def answer_length(text: str) -> float:
    """The length covariate of an answer: log(1 + characters), characters as in the longer-answer baseline."""
    return math.log1p(len(text))


def fit_length_coef(records: Sequence[PairRecord]) -> float:
    """beta of the Bradley-Terry model P(A beats B) = sigma(beta (l_A - l_B)) on the length covariate alone
    (ties as half wins), by maximum likelihood."""
    from scipy.optimize import minimize_scalar

    x = np.array([answer_length(r.answer_a) - answer_length(r.answer_b) for r in records])
    t = np.array([_BT_TARGET[r.verdict] for r in records])

    def nll(beta: float) -> float:
        z = beta * x
        return float(np.mean(np.logaddexp(0.0, z) - t * z))

    return float(minimize_scalar(nll, bounds=(-20.0, 20.0), method="bounded").x)


def davidson_probs(margin: np.ndarray, scale: float, nu: float) -> np.ndarray:
    """Columns P(A), P(TIE), P(B) under Davidson's tie model for reward margins r_A - r_B; nu = 0 (no tie model):
    Bradley-Terry, P(TIE) exactly 0."""
    half = 0.5 * scale * np.asarray(margin, dtype=np.float64)
    logw = np.stack([half, np.full_like(half, math.log(nu) if nu > 0 else -math.inf), -half], axis=1)
    logw -= logw.max(axis=1, keepdims=True)
    w = np.exp(logw)
    return w / w.sum(axis=1, keepdims=True)


def fit_davidson(margin: np.ndarray, verdicts: Sequence[Verdict]) -> tuple[float, float]:
    """Maximum-likelihood (scale, nu) of Davidson's model on labelled margins. With no ties nu goes to ~0
    (never predict a tie); the scale calibrates how sure the probabilities are."""
    from scipy.optimize import minimize

    col = np.array([{Verdict.A: 0, Verdict.TIE: 1, Verdict.B: 2}[v] for v in verdicts])
    margin = np.asarray(margin, dtype=np.float64)

    def nll(theta: np.ndarray) -> float:
        p = davidson_probs(margin, math.exp(theta[0]), math.exp(theta[1]))
        return -float(np.log(np.clip(p[np.arange(len(col)), col], 1e-12, None)).mean())

    res = minimize(nll, x0=np.zeros(2), method="L-BFGS-B", bounds=[(-6.0, 6.0), (-12.0, 4.0)])
    return math.exp(res.x[0]), math.exp(res.x[1])


@HEADS.register("reward")
class RewardHead(Head):
    name = "reward"
    arity = "pair"
    num_labels = 1
    problem_type = "regression"
    scheme_suffix = "answer"
    sequences_per_record = 2
    position_invariant = True
    label_is_float = True
    supports_length_covariate = True
    best_metric = "accuracy"
    tasks = ("compare", "score")  # a reward head also scores one answer: its reward

    def __init__(self, scale: float = 1.0, nu: float = 0.0, length_covariate: bool = False,
                 length_coef: float = 0.0) -> None:
        self.scale, self.nu = scale, nu
        self.length_covariate, self.length_coef = length_covariate, length_coef

    def fit(self, records: Sequence[PairRecord]) -> None:
        if self.length_covariate:
            self.length_coef = fit_length_coef(records)

    def offsets(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        """(records, sequences) length offsets beta * l(answer); a point record is one answer."""
        return self.length_coef * np.array([[answer_length(p.answer) for p in
                                             (self.inputs(r) if isinstance(r, PairRecord) else [r])]
                                            for r in records], dtype=np.float64)

    def adjust(self, logits: np.ndarray, records: Sequence[Record]) -> np.ndarray:
        if not self.length_coef:
            return logits
        logits = np.asarray(logits, dtype=np.float64)
        return (logits.reshape(len(records), -1) + self.offsets(records)).reshape(logits.shape)

    def features(self, record: Record, encoder: Encoder) -> dict[str, Any]:
        out = super().features(record, encoder)
        # The loss needs both answers' offsets beside the target: labels are [target, offset_A, offset_B].
        out["labels"] = [out["labels"], *self.offsets([record])[0]]
        return out

    def inputs(self, record: PairRecord) -> list[Record]:
        from ..prompts.schemes import pair_to_points

        # The answers are only shown, never labelled one by one: drop a score pair whose scale may be unknown.
        return list(pair_to_points(replace(record, scores=None)))

    def label(self, record: PairRecord) -> float:
        return _BT_TARGET[record.verdict]

    def loss(self, outputs, labels, num_items_in_batch=None):
        labels = labels.view(-1, 3).float()
        r = outputs["logits"].view(-1, 2).float() + labels[:, 1:]
        if num_items_in_batch is not None:  # the Trainer counts label entries: 3 per record
            num_items_in_batch = num_items_in_batch / 3
        return _mean_over_items(bradley_terry_loss(r[:, 0], r[:, 1], labels[:, 0]), num_items_in_batch)

    @staticmethod
    def rewards(logits: np.ndarray) -> np.ndarray:
        """Raw per-answer rewards r(question, answer) (the in-loop reward signal)."""
        return np.asarray(logits, dtype=np.float64).reshape(-1)

    def outputs(self, logits: np.ndarray) -> PairOutputs:
        r = self.rewards(logits).reshape(-1, 2)
        margin = r[:, 0] - r[:, 1]
        p = davidson_probs(margin, self.scale, self.nu)
        return PairOutputs(p_a=p[:, 0], p_tie=p[:, 1], p_b=p[:, 2], margin=margin)

    def calibrate(self, logits: np.ndarray, records: Sequence[PairRecord]) -> None:
        r = self.rewards(logits).reshape(-1, 2)
        self.scale, self.nu = fit_davidson(r[:, 0] - r[:, 1], [rec.verdict for rec in records])

    def tie_threshold(self) -> float:
        """|r_A - r_B| below which the verdict is TIE (negative: never)."""
        return 2.0 * math.log(max(self.nu, 1e-300)) / self.scale

    def evaluate(self, outputs, records, swapped=None):
        out = _pair_metrics(outputs, records, swapped)
        decisive = [(m, r.verdict) for m, r in zip(outputs.margin, records) if r.verdict is not Verdict.TIE]
        if decisive:
            out["decisive_accuracy"] = float(np.mean([(m > 0) == (v is Verdict.A) for m, v in decisive]))
        return out

    def card_fields(self) -> dict[str, Any]:
        return {
            "label_map": {"0": "reward r(question, answer); pair verdict from r_A - r_B"},
            "score_scale": None,
            "calibration": {"model": "davidson", "scale": self.scale, "nu": self.nu,
                            "tie_threshold": self.tie_threshold(),
                            "length_coef": self.length_coef, "length_covariate": "log(1 + characters)"},
        }

    @classmethod
    def reward_expression(cls, card: JudgeCard, columns: list[str]) -> str:
        return "logits[:, 0]"

    @classmethod
    def postprocessing(cls, card: JudgeCard, columns: list[str]) -> dict[str, Any]:
        cal = card.calibration
        return {"sequences_per_comparison": 2,
                "score": f"reward r(question, answer) = {cls.reward_expression(card, columns)}"
                + (f" + {cal.get('length_coef', 0.0)} * log(1 + characters of the answer)"
                   if cal.get("length_coef") else ""),
                "compare": "score each answer alone; d = r_A - r_B; P(A) : P(TIE) : P(B) = exp(scale * d / 2) : nu "
                           ": exp(-scale * d / 2) (Davidson; nu = 0: Bradley-Terry, P(A) = sigmoid(scale * d))",
                "scale": cal.get("scale", 1.0), "nu": cal.get("nu", 0.0)}

    @classmethod
    def from_card(cls, card: JudgeCard) -> RewardHead:
        cal = card.calibration
        return cls(scale=float(cal.get("scale", 1.0)), nu=float(cal.get("nu", 0.0)),
                   length_coef=float(cal.get("length_coef", 0.0)))


@HEADS.register("reward-binary")
class BinaryRewardHead(RewardHead):
    """A two-class sequence classifier over (question, answer) read as a reward model (a released model that clfjudge
    did not train, ``judges.foreign``): r = logit[positive] - logit[other], the log-odds of the positive class,
    then everything as ``reward`` (Bradley-Terry / Davidson on r_A - r_B). Read only, not trained here."""

    name = "reward-binary"
    num_labels = 2
    problem_type = "single_label_classification"
    supports_length_covariate = False
    trainable = False

    def __init__(self, positive: int = 1, id2label: dict[str, str] | None = None, **reward: Any) -> None:
        super().__init__(**reward)
        if positive not in (0, 1):
            raise ValueError(f"reward-binary: the positive class is output 0 or 1, got {positive!r}")
        self.positive, self.labels = positive, dict(id2label or {"0": "LABEL_0", "1": "LABEL_1"})

    def adjust(self, logits: np.ndarray, records: Sequence[Record]) -> np.ndarray:
        z = np.asarray(logits, dtype=np.float64).reshape(len(records), -1, 2)
        return z[..., self.positive] - z[..., 1 - self.positive]

    def id2label(self) -> dict[int, str]:
        return {int(k): v for k, v in self.labels.items()}

    def card_fields(self) -> dict[str, Any]:
        out = super().card_fields()
        positive = self.labels[str(self.positive)]
        out["label_map"] = {**{str(k): v for k, v in self.labels.items()}, "positive": self.positive,
                            "reward": f"log-odds of {positive!r}: logit[{self.positive}] - logit[{1 - self.positive}]"}
        return out

    @classmethod
    def reward_expression(cls, card: JudgeCard, columns: list[str]) -> str:
        positive = card.label_map.get("positive", 1)
        return f"logits[:, {positive}] - logits[:, {1 - positive}] (log-odds of {columns[positive]!r})"

    @classmethod
    def from_labels(cls, id2label: dict[str, str]) -> BinaryRewardHead:
        return cls(id2label=id2label)

    @classmethod
    def from_card(cls, card: JudgeCard) -> BinaryRewardHead:
        base = RewardHead.from_card(card)
        labels = {k: v for k, v in card.label_map.items() if k in ("0", "1")}
        return cls(positive=int(card.label_map.get("positive", 1)), id2label=labels or None, scale=base.scale,
                   nu=base.nu)
