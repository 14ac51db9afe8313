"""The embedding judge: a frozen sentence encoder embeds the question and the answers, and a scikit-learn
head over those embeddings plus simple features predicts the verdict (pairs) or the score (points).

It trains in seconds and is the baseline every fine-tuned head must beat.

Pairs are position-invariant by construction: every pair feature group is either antisymmetric (its value
flips sign when A and B swap) or symmetric; the head is trained on both answer orders; and
``predict_proba`` averages P(A | A,B) with P(B | B,A) (and P(TIE) over both orders), so swapping the
answers swaps P(A) and P(B) exactly. Length features are behind a switch (``use_length``) so that the
length-bias audit can compare a judge that sees lengths explicitly with one that does not.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..card import JudgeCard
from ..data.conversation import FLATTENING, note_flattened
from ..data.records import CLASS_OF_VERDICT, PairRecord, PointRecord, Record, Verdict
from ..embedders import make_embedder
from ..embedders.decoder import STAT_NAMES
from ..embedders.sentence import DEFAULT_ENCODER, TextEmbedder
from ..models.heads import Cls3Head, PairOutputs
from ..registry import Registry
from .base import DEFAULT_BATCH_SIZE, Budget, Judge, LoadOptions, loads
from .features import (
    EMPTY_COMPRESSED,
    ZLIB_LEVEL,
    log_information_length_difference,
    log_information_lengths,
    log_length_difference,
    log_lengths,
    row_cosine,
)
from .linear_head import LinearHead

# Column order of predict_proba: reversing the columns is exactly swapping the answers.
EMBEDDING = "embedding"  # the judge kind (clfjudge/kinds.py)
PROBA_COLUMNS = (Verdict.A, Verdict.TIE, Verdict.B)


# ---------------------------------------------------------------------------------------------------
# Views: what feature groups read (embeddings and raw texts of n records)


@dataclass(frozen=True)
class PairView:
    q: np.ndarray | None  # None when no feature group reads the questions' own vectors
    a: np.ndarray
    b: np.ndarray
    q_text: Sequence[str]
    a_text: Sequence[str]
    b_text: Sequence[str]
    a_stats: np.ndarray | None = None  # token statistics of the answers (decoder embedders with stats=True)
    b_stats: np.ndarray | None = None
    a_verdict: np.ndarray | None = None  # a chat model's verdict log-odds on each answer (verdict option)
    b_verdict: np.ndarray | None = None

    def swapped(self) -> PairView:
        return replace(self, a=self.b, b=self.a, a_text=self.b_text, b_text=self.a_text, a_stats=self.b_stats,
                       b_stats=self.a_stats, a_verdict=self.b_verdict, b_verdict=self.a_verdict)


@dataclass(frozen=True)
class PointView:
    q: np.ndarray | None
    a: np.ndarray
    q_text: Sequence[str]
    a_text: Sequence[str]
    ref: np.ndarray | None = None
    a_stats: np.ndarray | None = None
    a_verdict: np.ndarray | None = None


Symmetry = Literal["anti", "sym", "point"]


@dataclass(frozen=True)
class FeatureGroup:
    compute: Callable[[Any], np.ndarray]  # view -> (n, d)
    symmetry: Symmetry  # under A <-> B: "anti" flips sign, "sym" unchanged; "point" for pointwise groups
    needs_reference: bool = False
    needs_question: bool = False  # reads the questions' own vectors (a text read alone costs a forward pass)
    needs_stats: bool = False  # reads the answers' token statistics (DecoderEmbedder(stats=True))
    needs_verdict: bool = False  # reads a chat model's verdict on each answer (the judge's ``verdict`` option)
    # antisymmetric groups that are a difference f(A) - f(B): f on one answer (a PointView), so a judge made of
    # such groups scores each answer on its own (``EmbeddingModel.rewards``)
    one_side: Callable[[Any], np.ndarray] | None = None
    length_like: bool = False  # measures how long the answers are: ``length_at_prediction`` scales it
    # what it computes, in the notation of ``NOTATION`` (an export's signature.json states it for other programs)
    formula: str = ""
    columns: int | None = None  # its width; None: the reader's hidden size (a vector group)


# The terms the feature groups' formulas are written in (Q the question, A / B the answers, t any text).
NOTATION = {
    "v(t)": "the embedder's vector of t divided by its L2 norm (left as it is where the norm is 0): for an answer the "
            "reader's pooled output reading it after its question's prompt; for a question read alone, the pooled "
            "output of input_ids = its ids[:max_prompt_tokens + max_answer_tokens] + [eos_token_id], no prompt, "
            "pool 1 / (its tokens) over all of them",
    "c(x, y)": "x . y / (|x| |y|), 0 where either norm is 0",
    "L(t)": "[log1p(number of characters of t, Unicode code points), log1p(len(t.split()), whitespace words)]",
    "I(t)": f"log1p(len(zlib.compress(t.encode('utf-8', 'surrogatepass'), {ZLIB_LEVEL})) - {EMPTY_COMPRESSED}): the "
            f"bytes t takes compressed by zlib at level {ZLIB_LEVEL}, less the {EMPTY_COMPRESSED} an empty text takes",
    "s(t)": "the token statistics of answer t, [mean(pmi), mean(pmi > 0), median(pmi), mean(pmi[:32]), mean(cond), "
            "mean(uncond), log(answer tokens)], pmi = cond - uncond over its scored tokens; cond: the reader's "
            "log_probs after its question's prompt, uncond: the same after the prompt of an empty question",
}


def _col(x: np.ndarray) -> np.ndarray:
    return x[:, None]


PAIR_FEATURES: Registry[FeatureGroup] = Registry("pair feature group")
PAIR_FEATURES.register("diff", FeatureGroup(lambda v: v.a - v.b, "anti", one_side=lambda v: v.a,
                                            formula="v(A) - v(B)"))
PAIR_FEATURES.register("q_diff", FeatureGroup(lambda v: v.q * (v.a - v.b), "anti", needs_question=True,
                                              one_side=lambda v: v.q * v.a, formula="v(Q) * (v(A) - v(B))"))
PAIR_FEATURES.register("abs_diff", FeatureGroup(lambda v: np.abs(v.a - v.b), "sym", formula="|v(A) - v(B)|"))
PAIR_FEATURES.register("prod", FeatureGroup(lambda v: v.a * v.b, "sym", formula="v(A) * v(B)"))
PAIR_FEATURES.register("cos_diff", FeatureGroup(lambda v: _col(row_cosine(v.q, v.a) - row_cosine(v.q, v.b)), "anti",
                                                needs_question=True, one_side=lambda v: _col(row_cosine(v.q, v.a)),
                                                formula="c(v(Q), v(A)) - c(v(Q), v(B))", columns=1))
PAIR_FEATURES.register("cos_sym", FeatureGroup(
    lambda v: np.stack([row_cosine(v.a, v.b), row_cosine(v.q, v.a) + row_cosine(v.q, v.b),
                        np.abs(row_cosine(v.q, v.a) - row_cosine(v.q, v.b))], axis=1), "sym", needs_question=True,
    formula="[c(v(A), v(B)), c(v(Q), v(A)) + c(v(Q), v(B)), |c(v(Q), v(A)) - c(v(Q), v(B))|]", columns=3))
# How much more likely each answer is after its question than after an empty turn (PMI), and its fluency:
# the difference of the two answers' token statistics (embedders.decoder.STAT_NAMES).
PAIR_FEATURES.register("token_stats", FeatureGroup(lambda v: v.a_stats - v.b_stats, "anti", needs_stats=True,
                                                   one_side=lambda v: v.a_stats, formula="s(A) - s(B)",
                                                   columns=len(STAT_NAMES)))
PAIR_FEATURES.register("length_diff", FeatureGroup(lambda v: log_length_difference(v.a_text, v.b_text), "anti",
                                                   one_side=lambda v: log_lengths(v.a_text), length_like=True,
                                                   formula="L(A) - L(B)", columns=2))
PAIR_FEATURES.register("length_sym", FeatureGroup(
    lambda v: np.hstack([np.abs(log_length_difference(v.a_text, v.b_text)),
                         log_lengths(v.a_text) + log_lengths(v.b_text), log_lengths(v.q_text)]), "sym",
    length_like=True, formula="[|L(A) - L(B)|, L(A) + L(B), L(Q)]", columns=6))
# Information length (compressed bytes): the length signal without the padding (features.information_lengths).
PAIR_FEATURES.register("info_length_diff", FeatureGroup(
    lambda v: log_information_length_difference(v.a_text, v.b_text), "anti",
    one_side=lambda v: log_information_lengths(v.a_text), length_like=True, formula="I(A) - I(B)", columns=1))

# A chat model's own verdict on each answer (judges/verdict.py: log P(yes) - log P(no) of each question asked), the
# signal beyond length a reader's states lack: the stacked judge.
PAIR_FEATURES.register("verdict_diff", FeatureGroup(lambda v: v.a_verdict - v.b_verdict, "anti", needs_verdict=True,
                                                    one_side=lambda v: v.a_verdict))

POINT_FEATURES: Registry[FeatureGroup] = Registry("point feature group")
POINT_FEATURES.register("q", FeatureGroup(lambda v: v.q, "point", needs_question=True))
POINT_FEATURES.register("a", FeatureGroup(lambda v: v.a, "point"))
POINT_FEATURES.register("qa_prod", FeatureGroup(lambda v: v.q * v.a, "point", needs_question=True))
POINT_FEATURES.register("cos", FeatureGroup(lambda v: _col(row_cosine(v.q, v.a)), "point", needs_question=True))
POINT_FEATURES.register("token_stats", FeatureGroup(lambda v: v.a_stats, "point", needs_stats=True))
POINT_FEATURES.register("ref_cos", FeatureGroup(lambda v: _col(row_cosine(v.a, v.ref)), "point", needs_reference=True))
POINT_FEATURES.register("length", FeatureGroup(lambda v: np.hstack([log_lengths(v.a_text), log_lengths(v.q_text)]),
                                               "point", length_like=True))
POINT_FEATURES.register("info_length", FeatureGroup(lambda v: log_information_lengths(v.a_text), "point",
                                                    length_like=True))
POINT_FEATURES.register("verdict", FeatureGroup(lambda v: v.a_verdict, "point", needs_verdict=True))


# ---------------------------------------------------------------------------------------------------
# Heads: scikit-learn estimators built from (params, seed, column weights)
#
# Linear heads standardise every column and then weight it by 1/sqrt(width of its feature group), so each
# group has the same total variance. Without this an L2 penalty prefers to spread a signal such as "the
# longer answer wins" over hundreds of correlated embedding columns instead of the one column that carries
# it, and a 2-column length group is drowned by 384-column embedding groups. Trees ignore the weights.

# (head params, seed, column weights, question group of every training row) -> an unfitted estimator
HeadBuilder = Callable[[dict[str, Any], int, np.ndarray, np.ndarray], Any]
# C = "auto": the inverse regularisation strength is chosen from this grid by accuracy over inner folds that
# keep every question (and so both answer orders of a pair) on one side.
AUTO_C_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
AUTO_C_FOLDS = 3


def weight_columns(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return x * weights


def _linear(estimator, weights: np.ndarray):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler

    return make_pipeline(StandardScaler(), FunctionTransformer(weight_columns, kw_args={"weights": weights}),
                         estimator)


def _logreg(params: dict[str, Any], seed: int, weights: np.ndarray, groups: np.ndarray):
    from sklearn.linear_model import LogisticRegression

    params = {"C": 0.01, "max_iter": 5000, **params}
    if params["C"] != "auto":
        return _linear(LogisticRegression(**params), weights)
    from sklearn.model_selection import GridSearchCV, GroupKFold

    n_groups = len(np.unique(groups))
    if n_groups < AUTO_C_FOLDS:
        raise ValueError(f"C='auto' needs at least {AUTO_C_FOLDS} distinct training questions, got {n_groups}")
    folds = list(GroupKFold(n_splits=AUTO_C_FOLDS).split(np.zeros((len(groups), 1)), groups=groups))
    pipeline = _linear(LogisticRegression(**{**params, "C": 1.0}), weights)
    return GridSearchCV(pipeline, {"logisticregression__C": list(AUTO_C_GRID)}, cv=folds, scoring="accuracy")


def _gbdt_classifier(params: dict[str, Any], seed: int, weights: np.ndarray, groups: np.ndarray):
    from sklearn.ensemble import HistGradientBoostingClassifier

    # No early stopping: its random validation split would hold the swapped copies of training pairs.
    defaults = {"learning_rate": 0.05, "max_iter": 300, "max_leaf_nodes": 15, "min_samples_leaf": 40,
                "l2_regularization": 1.0, "early_stopping": False, "random_state": seed}
    return HistGradientBoostingClassifier(**{**defaults, **params})


def _ridge(params: dict[str, Any], seed: int, weights: np.ndarray, groups: np.ndarray):
    from sklearn.linear_model import RidgeCV

    return _linear(RidgeCV(**{"alphas": np.logspace(-2, 3, 11).tolist(), **params}), weights)


def _gbdt_regressor(params: dict[str, Any], seed: int, weights: np.ndarray, groups: np.ndarray):
    from sklearn.ensemble import HistGradientBoostingRegressor

    defaults = {"learning_rate": 0.05, "max_iter": 300, "max_leaf_nodes": 15, "min_samples_leaf": 20,
                "l2_regularization": 1.0, "early_stopping": False, "random_state": seed}
    return HistGradientBoostingRegressor(**{**defaults, **params})


PAIR_HEADS: Registry[HeadBuilder] = Registry("pair head")
PAIR_HEADS.register("logreg", _logreg)
PAIR_HEADS.register("gbdt", _gbdt_classifier)

POINT_HEADS: Registry[HeadBuilder] = Registry("point head")
POINT_HEADS.register("ridge", _ridge)
POINT_HEADS.register("gbdt", _gbdt_regressor)


@dataclass(frozen=True)
class RecordSpec:
    record_type: type
    label_field: str
    features: Registry[FeatureGroup]
    heads: Registry[HeadBuilder]
    default_head: str
    default_features: tuple[str, ...]
    length_features: tuple[str, ...]


RECORD_SPECS: dict[str, RecordSpec] = {
    "pair": RecordSpec(PairRecord, "verdict", PAIR_FEATURES, PAIR_HEADS, "logreg",
                      ("diff", "q_diff", "abs_diff", "cos_diff", "cos_sym"), ("length_diff", "length_sym")),
    "point": RecordSpec(PointRecord, "score", POINT_FEATURES, POINT_HEADS, "ridge",
                       ("q", "a", "qa_prod", "cos"), ("length",)),
}


WEIGHTINGS = ("length", "source")


def training_weights(records: Sequence[Record], weighting: Sequence[str]) -> np.ndarray:
    """Per-record weights (mean 1). "source": every source carries the same total weight, whatever its size.
    "length" (pairs): within each source, the pairs the longer answer wins and those the shorter one wins
    carry the same total weight (ties and equal lengths keep theirs), so "longer wins" is worth nothing in
    training and the head has to learn what else separates the answers."""
    unknown = sorted(set(weighting) - set(WEIGHTINGS))
    if unknown:
        raise ValueError(f"unknown weighting(s) {unknown}; known: {list(WEIGHTINGS)}")
    w = np.ones(len(records))
    sources = np.array([r.source for r in records])
    if "length" in weighting:
        side = np.array([_length_side(r) for r in records])
        for source in np.unique(sources):
            longer, shorter = (sources == source) & (side == 1), (sources == source) & (side == -1)
            if longer.any() and shorter.any():
                total = longer.sum() + shorter.sum()
                w[longer] *= total / (2 * longer.sum())
                w[shorter] *= total / (2 * shorter.sum())
    if "source" in weighting:
        for source in np.unique(sources):
            mask = sources == source
            w[mask] *= len(records) / (len(np.unique(sources)) * w[mask].sum())
    return w * len(w) / w.sum()


def _length_side(record: Record) -> int:
    """+1: the gold winner is the longer answer, -1: the shorter one, 0: a tie, equal lengths or a point."""
    if not isinstance(record, PairRecord) or record.verdict is Verdict.TIE:
        return 0
    diff = len(record.answer_a) - len(record.answer_b)
    if diff == 0:
        return 0
    return 1 if (diff > 0) == (record.verdict is Verdict.A) else -1


# A pair's soft target (record meta): the probability that answer A is the better one, as a teacher judge gave it
# (``training.distill``). A judge fitted on soft targets learns the teacher's probabilities, not its argmax.
SOFT_TARGET = "soft_p_a"


def soft_rows(records: Sequence[PairRecord], x: np.ndarray, groups: np.ndarray, sample_weight: np.ndarray | None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Soft-target cross-entropy as weighted rows: every row of ``x`` (pairs, then the swapped pairs) once as "A
    wins" weighted P(A) and once as "B wins" weighted 1 - P(A) (P(A) of a swapped row: 1 - the pair's)."""
    p = np.array([float(r.meta[SOFT_TARGET]) for r in records])
    if not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"soft targets ({SOFT_TARGET}) must be probabilities in [0, 1]")
    p_a = np.concatenate([p, 1 - p])
    base = np.ones(len(p_a)) if sample_weight is None else sample_weight
    a, b = CLASS_OF_VERDICT[Verdict.A], CLASS_OF_VERDICT[Verdict.B]
    y = np.concatenate([np.full(len(p_a), a), np.full(len(p_a), b)])
    return (np.vstack([x, x]), y, np.concatenate([groups, groups]),
            np.concatenate([base * p_a, base * (1 - p_a)]))


def _fit(estimator, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None):
    """Fit with per-row weights routed to the final estimator (inside a pipeline or a grid search)."""
    if sample_weight is None:
        return estimator.fit(x, y)
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline

    inner = estimator.estimator if isinstance(estimator, GridSearchCV) else estimator
    if isinstance(inner, Pipeline):
        return estimator.fit(x, y, **{f"{inner.steps[-1][0]}__sample_weight": sample_weight})
    return estimator.fit(x, y, sample_weight=sample_weight)


def verdicts_from_proba(proba: np.ndarray) -> list[Verdict]:
    """Argmax over (P(A), P(TIE), P(B)); P(A) == P(B) gives TIE, so a judge that cannot tell the answers
    apart stays position-consistent."""
    out = []
    for p_a, p_tie, p_b in proba:
        if np.isclose(p_a, p_b, rtol=1e-9, atol=1e-12) or p_tie >= max(p_a, p_b):
            out.append(Verdict.TIE)
        else:
            out.append(Verdict.A if p_a > p_b else Verdict.B)
    return out


class EmbeddingModel:
    """What an embedding judge (``EmbeddingJudge``) runs: a frozen embedder's features + a scikit-learn head.

    ``arity="pair"``: heads "logreg" | "gbdt"; ``predict_proba`` -> (n, 3) = P(A), P(TIE), P(B); ``predict`` ->
    verdicts. ``arity="point"``: heads "ridge" | "gbdt"; ``predict`` -> scores clipped to the training scale.
    ``features``: feature group names (see ``PAIR_FEATURES`` / ``POINT_FEATURES``), length groups excluded;
    ``use_length`` adds the length groups. ``embedder``: share one ``TextEmbedder`` across judges (folds)
    so texts are encoded once; it must use the same encoder spec. ``weighting``: training weights
    (``training_weights``: "length" balances longer- and shorter-answer wins, "source" the sources);
    ``length_at_prediction``: the factor on the length features' coefficients after fitting (0: length is
    fitted beside the rest, then removed from the decision).
    """

    def __init__(self, backbone: str = DEFAULT_ENCODER, head: str | None = None, arity: str = "pair",
                 features: Sequence[str] | None = None, use_length: bool = True,
                 head_params: dict[str, Any] | None = None, seed: int = 0,
                 embedder: TextEmbedder | None = None, embedder_options: dict[str, Any] | None = None,
                 weighting: Sequence[str] = (), length_at_prediction: float = 1.0,
                 verdict: dict[str, Any] | None = None) -> None:
        if arity not in RECORD_SPECS:
            raise ValueError(f"unknown arity {arity!r}; known: {sorted(RECORD_SPECS)}")
        spec = RECORD_SPECS[arity]
        self.arity = arity
        self.head = head or spec.default_head
        spec.heads.get(self.head)  # fail early on an unknown head
        self.features = tuple(features if features is not None else spec.default_features)
        in_features = [f for f in self.features if f in spec.length_features]
        if in_features and use_length:
            raise ValueError(f"length groups {in_features} are switched by use_length, not listed in features "
                             "(list them only with use_length=False, to pick some of them)")
        if not self.features and not use_length:
            raise ValueError("no features: give feature groups or use_length=True")
        for name in self.features:
            spec.features.get(name)
        self.use_length = use_length
        self.head_params = dict(head_params or {})
        self.seed = seed
        self.weighting = tuple(weighting)
        training_weights([], self.weighting)  # fail early on an unknown weighting
        if length_at_prediction != 1.0 and not any(spec.features.get(g).length_like for g in self.groups):
            raise ValueError("length_at_prediction scales the length features: it needs use_length=True (or a "
                             "length group such as info_length_diff in features)")
        self.length_at_prediction = float(length_at_prediction)
        if embedder is not None and embedder.backbone != backbone:
            raise ValueError(f"embedder uses backbone {embedder.backbone!r}, the judge was given {backbone!r}")
        self.backbone = backbone
        if embedder is not None and embedder_options:
            raise ValueError("give either an embedder or embedder_options, not both")
        if self._needs("needs_stats"):  # feature groups that read token statistics get an embedder computing them
            embedder_options = {"stats": True, **(embedder_options or {})}
        self.embedder = embedder if embedder is not None else make_embedder(backbone, **(embedder_options or {}))
        if self._needs("needs_stats") and not self.embedder.stats:
            raise ValueError(f"feature groups {[g for g in self.groups if spec.features.get(g).needs_stats]} read "
                             "token statistics: the embedder must be a decoder embedder with stats=True")
        self.verdict = dict(verdict or {})
        if self._needs("needs_verdict") and not self.verdict.get("backbone"):
            raise ValueError(f"feature groups {[g for g in self.groups if spec.features.get(g).needs_verdict]} read a "
                             "chat model's verdict: give the verdict option (backbone, questions)")
        self._verdict_reader = None
        self.model_ = None
        self.fitted_ = None  # the scikit-learn estimator as fit() left it (a loaded judge has only model_)
        self.scale_: tuple[float, float] | None = None
        self.training_: dict[str, Any] = {}

    # -- features ------------------------------------------------------------------------------------
    @property
    def groups(self) -> tuple[str, ...]:
        spec = RECORD_SPECS[self.arity]
        return self.features + (spec.length_features if self.use_length else ())

    def _check(self, records: Sequence[Record], labelled: bool) -> list[Record]:
        spec = RECORD_SPECS[self.arity]
        records = list(records)
        note_flattened("the embedding judge", (r.meta for r in records))
        for r in records:
            if not isinstance(r, spec.record_type):
                raise ValueError(f"record {r.id}: a {self.arity} judge needs {spec.record_type.__name__}, "
                                 f"got {type(r).__name__}")
            if labelled and getattr(r, spec.label_field) is None:
                raise ValueError(f"record {r.id}: field {spec.label_field!r} is missing; fit needs labelled records")
        return records

    def _needs(self, flag: str) -> bool:
        return any(getattr(RECORD_SPECS[self.arity].features.get(g), flag) for g in self.groups)

    def read_verdicts_with(self, reader) -> None:
        """Read verdict log-odds through ``reader`` (anything with ``log_odds(points)``), e.g. a cache of readings
        made once for many fits, instead of the chat model named by the verdict option."""
        self._verdict_reader = reader

    def verdicts(self, questions: Sequence[str], answers: Sequence[str]) -> np.ndarray | None:
        """(n, questions) verdict log-odds of each answer after its question, where a feature group reads them."""
        if not self._needs("needs_verdict"):
            return None
        if self._verdict_reader is None:
            from .verdict import reader_from_options

            self._verdict_reader = reader_from_options(self.verdict)
        points = [PointRecord(id=str(i), question=q, answer=a, score=None)
                  for i, (q, a) in enumerate(zip(questions, answers))]
        return self._verdict_reader.log_odds(points)

    def _pair_view(self, pairs: Sequence[PairRecord]) -> PairView:
        q_text = [p.question for p in pairs]
        a_text = [p.answer_a for p in pairs]
        b_text = [p.answer_b for p in pairs]
        n = len(pairs)
        questions, answers = [*q_text, *q_text], [*a_text, *b_text]
        vectors = self.embedder.embed_answers(questions, answers)
        stats = self.embedder.answer_stats(questions, answers) if self._needs("needs_stats") else None
        q = self.embedder.embed(q_text) if self._needs("needs_question") else None
        verdict = self.verdicts(questions, answers)
        return PairView(q, vectors[:n], vectors[n:], q_text, a_text, b_text,
                        None if stats is None else stats[:n], None if stats is None else stats[n:],
                        None if verdict is None else verdict[:n], None if verdict is None else verdict[n:])

    def _point_view(self, points: Sequence[PointRecord]) -> PointView:
        q_text = [p.question for p in points]
        a_text = [p.answer for p in points]
        ref = None
        if any(POINT_FEATURES.get(g).needs_reference for g in self.groups):
            missing = [p.id for p in points if not p.reference]
            if missing:
                raise ValueError(f"record {missing[0]}: field 'reference' is missing ({len(missing)} records "
                                 f"without one), but feature groups {self.groups} need it")
            ref = self.embedder.embed([p.reference for p in points])
        q = self.embedder.embed(q_text) if self._needs("needs_question") else None
        stats = self.embedder.answer_stats(q_text, a_text) if self._needs("needs_stats") else None
        return PointView(q, self.embedder.embed_answers(q_text, a_text), q_text, a_text, ref, stats,
                         self.verdicts(q_text, a_text))

    def _matrix(self, view: PairView | PointView) -> tuple[np.ndarray, np.ndarray]:
        """The feature matrix and, per column, 1/sqrt(width of its group) (see the note on linear heads)."""
        registry = RECORD_SPECS[self.arity].features
        blocks = [registry.get(g).compute(view) for g in self.groups]
        self.widths_ = [b.shape[1] for b in blocks]
        weights = np.concatenate([np.full(b.shape[1], 1 / np.sqrt(b.shape[1])) for b in blocks])
        return np.hstack(blocks).astype(np.float64), weights

    # -- training ------------------------------------------------------------------------------------
    def fit(self, records: Sequence[Record]) -> EmbeddingModel:
        records = self._check(records, labelled=True)
        if not records:
            raise ValueError("fit needs at least one record")
        if self.arity == "pair":
            view = self._pair_view(records)
            forward, weights = self._matrix(view)
            x = np.vstack([forward, self._matrix(view.swapped())[0]])
            y = np.array([CLASS_OF_VERDICT[r.verdict] for r in records]
                         + [CLASS_OF_VERDICT[r.verdict.swapped()] for r in records])
            if len(set(y.tolist())) < 2:
                raise ValueError("fit needs at least two distinct verdicts after adding swapped pairs "
                                 "(all training pairs are ties)")
            labels = Counter(r.verdict.value for r in records)
        else:
            scales = Counter(r.scale for r in records)
            if len(scales) > 1:
                raise ValueError(f"training points use different score scales {dict(scales)}")
            self.scale_ = next(iter(scales))
            x, weights = self._matrix(self._point_view(records))
            y = np.array([r.score for r in records], dtype=np.float64)
            labels = Counter(str(r.score) for r in records)
        build = RECORD_SPECS[self.arity].heads.get(self.head)
        from ..data.splits import group_ids

        groups = group_ids(records)
        if self.arity == "pair":
            groups = np.concatenate([groups, groups])  # the swapped copy of a pair stays with it
        sample_weight = None
        if self.weighting:
            sample_weight = training_weights(records, self.weighting)
            if self.arity == "pair":
                sample_weight = np.concatenate([sample_weight, sample_weight])
        if self.arity == "pair" and all(SOFT_TARGET in r.meta for r in records):
            x, y, groups, sample_weight = soft_rows(records, x, groups, sample_weight)
        # as scikit-learn fitted it
        self.fitted_ = _fit(build(self.head_params, self.seed, weights, groups), x, y, sample_weight)
        # a linear head is kept as its arrays: what is saved, loaded and exported is exactly what predicts here
        self.model_ = LinearHead.from_estimator(self.fitted_) or self.fitted_
        if self.length_at_prediction != 1.0:
            self._scale_length_columns()
        self.training_ = {
            "n_records": len(records),
            "n_rows": int(x.shape[0]),
            "n_features": int(x.shape[1]),
            # the training cards' layout (training.sources.train.<name>.used): audits mark these sets as seen
            "sources": {"train": {name: {"used": n} for name, n in Counter(r.source for r in records).items()}},
            "labels": dict(sorted(labels.items())),
        }
        if hasattr(self.fitted_, "best_params_"):
            self.training_["chosen_C"] = self.fitted_.best_params_["logisticregression__C"]
        return self

    def _scale_length_columns(self) -> None:
        """Multiply the length groups' coefficients by ``length_at_prediction``: length is fitted beside the
        other features (so they are not asked to explain it) and then shrunk or removed from the decision."""
        if not isinstance(self.model_, LinearHead):
            raise ValueError(f"length_at_prediction needs a linear head, not {self.head!r}")
        start = 0
        for group, width in zip(self.groups, self.widths_):
            if RECORD_SPECS[self.arity].features.get(group).length_like:
                self.model_.coef[:, start:start + width] *= self.length_at_prediction
            start += width

    @property
    def decomposable(self) -> bool:
        """A pair judge of the form r(A) - r(B): every feature group a difference of one-answer terms and a
        linear head. It scores each answer on its own (``rewards``): best-of-n reads n answers, not n^2 pairs."""
        registry = RECORD_SPECS[self.arity].features
        return (self.arity == "pair" and isinstance(self.model_, LinearHead)
                and all(registry.get(g).one_side is not None for g in self.groups))

    def rewards(self, points: Sequence[PointRecord]) -> np.ndarray:
        """r(question, answer) of a decomposable pair judge: its log-odds of A over B is r(A) - r(B) (+ the
        head's intercepts, which are zero by the symmetric training), so rewards rank answers as the judge
        would in every pair."""
        self._require_fitted()
        if not self.decomposable:
            raise ValueError(f"this judge compares pairs through non-difference feature groups {list(self.groups)}; "
                             "only a judge of difference groups (diff, token_stats, length_diff, info_length_diff, "
                             "q_diff, cos_diff) and a linear head scores answers on its own")
        points = list(points)
        note_flattened("the embedding judge", (p.meta for p in points))
        if not points:
            return np.zeros(0)
        q_text, a_text = [p.question for p in points], [p.answer for p in points]
        view = PointView(self.embedder.embed(q_text) if self._needs("needs_question") else None,
                         self.embedder.embed_answers(q_text, a_text), q_text, a_text, None,
                         self.embedder.answer_stats(q_text, a_text) if self._needs("needs_stats") else None,
                         self.verdicts(q_text, a_text))
        registry = RECORD_SPECS[self.arity].features
        x = np.hstack([registry.get(g).one_side(view) for g in self.groups]).astype(np.float64)
        head = self.model_
        rows = {int(c): np.zeros(head.coef.shape[1]) for c in head.classes_}
        if head.coef.shape[0] == 1:  # binary: the sigmoid's logit belongs to classes_[1], classes_[0] is 0
            rows[int(head.classes_[1])] = head.coef[0]
        else:
            rows.update({int(c): head.coef[j] for j, c in enumerate(head.classes_)})
        direction = rows[CLASS_OF_VERDICT[Verdict.A]] - rows[CLASS_OF_VERDICT[Verdict.B]]
        return (x / head.scale * head.weights) @ direction

    def _require_fitted(self) -> None:
        if self.model_ is None:
            raise RuntimeError("the model is not fitted: call fit() or EmbeddingModel.load()")

    # -- prediction ----------------------------------------------------------------------------------
    def _head_proba(self, x: np.ndarray) -> np.ndarray:
        """Head probabilities in PROBA_COLUMNS order (a class absent from training gets 0)."""
        raw = self.model_.predict_proba(x)
        out = np.zeros((x.shape[0], len(PROBA_COLUMNS)))
        column = {CLASS_OF_VERDICT[v]: i for i, v in enumerate(PROBA_COLUMNS)}
        for j, cls in enumerate(self.model_.classes_):
            out[:, column[int(cls)]] = raw[:, j]
        return out

    def predict_proba(self, pairs: Sequence[PairRecord]) -> np.ndarray:
        """(n, 3): P(A), P(TIE), P(B), averaged over both answer orders."""
        if self.arity != "pair":
            raise ValueError("predict_proba is for pair judges; a point judge predicts scores")
        self._require_fitted()
        pairs = self._check(pairs, labelled=False)
        if not pairs:
            return np.zeros((0, len(PROBA_COLUMNS)))
        view = self._pair_view(pairs)
        forward = self._head_proba(self._matrix(view)[0])
        backward = self._head_proba(self._matrix(view.swapped())[0])
        return (forward + backward[:, ::-1]) / 2

    def predict(self, records: Sequence[Record]) -> list[Verdict] | np.ndarray:
        """Verdicts (pair judge) or scores clipped to the training scale (point judge)."""
        self._require_fitted()
        if self.arity == "pair":
            return verdicts_from_proba(self.predict_proba(records))
        records = self._check(records, labelled=False)
        if not records:
            return np.zeros(0)
        scores = self.model_.predict(self._matrix(self._point_view(records))[0])
        return np.clip(scores, *self.scale_)

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, directory: str | Path, validation: dict[str, Any] | None = None,
             training: dict[str, Any] | None = None) -> Path:
        """Write the head (arrays, never a pickle: ``linear_head``) and judge_card.json; the encoder is
        referenced by its spec, not copied. ``training``: more entries for the card's training section (sources,
        splits, config, wall time)."""
        from .linear_head import save_head

        self._require_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        stored = save_head(self.model_, directory)
        max_length = self.embedder.max_seq_length
        card = JudgeCard(
            kind=EMBEDDING,
            arity=self.arity,
            backbone=self.backbone,
            scheme="embedding",
            max_length=max_length,
            label_map={"proba_columns": [v.value for v in PROBA_COLUMNS]} if self.arity == "pair" else {},
            truncation={"max_seq_length": max_length,
                        "policy": f"{self.embedder.truncation_policy}; length features are computed on the full "
                                  "text", "conversation": FLATTENING},
            score_scale=list(self.scale_) if self.scale_ else None,
            training={**self.training_, "head": self.head, "head_params": self.head_params,
                      "features": list(self.groups), "seed": self.seed, "weighting": list(self.weighting),
                      "length_at_prediction": self.length_at_prediction, **(training or {})},
            validation=dict(validation or {}),
            runtime={**stored, "head": self.head,
                     "head_params": self.head_params, "features": list(self.features),
                     "use_length": self.use_length, "seed": self.seed, "normalize_embeddings": True,
                     "embedder": self.embedder.config(),
                     **({"verdict": self.verdict} if self.verdict else {}),
                     # how the features were computed (a runtime choice, not part of the reading's identity)
                     "precision": getattr(self.embedder, "precision_spec", None),
                     # what this machine read the training answers in, and why (``machine.decoder_precision``)
                     "read_in": {"precision": getattr(self.embedder, "precision", "fp32"),
                                 "why": getattr(self.embedder, "precision_why", "encoder: fp32")}},
        )
        card.save(directory)
        return directory

    @classmethod
    def load(cls, directory: str | Path, embedder: TextEmbedder | None = None, *,
             trust_pickle: bool = False) -> EmbeddingModel:
        """Load a saved judge. Nothing in the directory is executed; a head saved as a pickle by an older
        clfjudge loads only with ``trust_pickle=True``."""
        from .linear_head import load_head

        directory = Path(directory)
        card = JudgeCard.load(directory)
        if card.kind != EMBEDDING:
            raise ValueError(f"{directory}: judge_card.json field 'kind' is {card.kind!r}, not {EMBEDDING!r}")
        rt = card.runtime
        judge = cls(backbone=card.backbone, head=rt["head"], arity=card.arity, features=rt["features"],
                    use_length=rt["use_length"], head_params=rt["head_params"], seed=rt["seed"],
                    embedder=embedder if embedder is not None else embedder_for_card(card),
                    weighting=card.training.get("weighting", ()),  # already applied to the stored coefficients:
                    length_at_prediction=card.training.get("length_at_prediction", 1.0),  # on record only
                    verdict=rt.get("verdict"))
        if judge.embedder.config() != embedder_config(card):
            raise ValueError(f"{directory}: the judge was trained with embedder {embedder_config(card)}, the given "
                             f"embedder is {judge.embedder.config()}")
        judge.model_ = load_head(directory, rt, trust_pickle=trust_pickle)
        judge.scale_ = tuple(card.score_scale) if card.score_scale else None
        judge.training_ = {k: card.training[k] for k in ("n_records", "n_rows", "n_features", "sources", "labels")
                           if k in card.training}
        expected = judge.training_.get("n_features")
        got = getattr(judge.model_, "n_features_in_", expected)
        if expected is not None and got != expected:
            raise ValueError(f"{directory / rt['sklearn_model']}: head expects {got} features, the card says "
                             f"{expected}")
        return judge


def embedder_config(card: JudgeCard) -> dict[str, Any]:
    """How a saved embedding judge embeds (cards written before decoder embedders existed: a sentence encoder;
    before token statistics existed: a decoder without them)."""
    config = dict(card.runtime.get("embedder") or {"type": "sentence"})
    config = {"type" if key == "kind" else key: value for key, value in config.items()}  # "kind": its older name
    return {"stats": False, **config} if config["type"] == "decoder" else config


def embedder_for_card(card: JudgeCard, **options):
    """The embedder a saved embedding judge was trained with; ``options``: batch_size, device, precision, ...
    A decoder reads in the precision the judge was trained with ("auto": bf16 where the CPU has AMX /
    AVX512-BF16), unless ``options`` say otherwise."""
    config = embedder_config(card)
    if config["type"] == "decoder" and card.runtime.get("precision") and "precision" not in options:
        options = {**options, "precision": card.runtime["precision"]}
    return make_embedder(card.backbone, **config, **options)


def neighbour_negatives(records: Sequence[PairRecord], embedder: TextEmbedder, *, max_similarity: float = 0.9,
                        seed: int = 0, limit: int | None = None, candidates: int = 1) -> list[PairRecord]:
    """LLMBar-style hard negatives built from training pairs only (LLMBar "Neighbor"; RRM's off-instruction
    augmentation): a fluent answer to a similar but different instruction is the worse answer.

    For every question of ``records`` with a preferred (non-tie) answer (at most ``limit`` questions, a seeded
    sample): the chosen answer is one of its own preferred answers; the rejected one is a preferred answer of one
    of its ``candidates`` nearest other questions by embedding cosine (below ``max_similarity``, so
    near-duplicates are skipped). With one candidate both are drawn the same way, so length does not give the
    label away on average; with more, the rejected answer is the one closest in length to the chosen answer, so
    it does not pair by pair either. Answer order and draws are seeded.
    """
    import random

    rng = random.Random(seed)
    preferred: dict[str, list[str]] = {}
    for r in records:
        if r.verdict in (Verdict.A, Verdict.B):
            preferred.setdefault(r.question, []).append(r.answer_a if r.verdict == Verdict.A else r.answer_b)
    questions = sorted(preferred)
    if len(questions) < 2:
        raise ValueError("neighbour_negatives needs preferred answers for at least two distinct questions")
    emb = embedder.embed(questions)
    similarity = emb @ emb.T
    similarity[(similarity >= max_similarity) | np.eye(len(questions), dtype=bool)] = -np.inf
    chosen_questions = range(len(questions))
    if limit is not None and limit < len(questions):
        chosen_questions = sorted(rng.sample(range(len(questions)), limit))
    out = []
    for i in chosen_questions:
        question = questions[i]
        near = [int(j) for j in np.argsort(-similarity[i])[:candidates] if np.isfinite(similarity[i, j])]
        if not near:
            continue  # every other question is a near-duplicate of this one
        good = rng.choice(preferred[question])
        if candidates == 1:
            j, bad = near[0], rng.choice(preferred[questions[near[0]]])
        else:
            j, bad = min(((j, a) for j in near for a in preferred[questions[j]]),
                         key=lambda o: abs(np.log1p(len(o[1])) - np.log1p(len(good))))
        a, b, verdict = (good, bad, Verdict.A) if rng.random() < 0.5 else (bad, good, Verdict.B)
        out.append(PairRecord(id=f"neighbour-negative:{i}", question=question, answer_a=a, answer_b=b,
                              verdict=verdict, source="neighbour-negatives",
                              meta={"neighbour_question": questions[j], "similarity": float(similarity[i, j])}))
    return out


# -- its runtime judge (Judge.load) ------------------------------------------------------------------------

class EmbeddingJudge(Judge):
    """An embedding judge (frozen sentence encoder + scikit-learn head); its raw outputs for pairs are
    log-probabilities in the 3-way heads' class order (TIE, A, B), so temperature calibration applies as to logits."""

    backend_name = "sklearn"
    position_invariant = True  # EmbeddingModel.predict_proba already averages both answer orders

    def __init__(self, card: JudgeCard, model: EmbeddingModel, budget: Budget | int = DEFAULT_BATCH_SIZE) -> None:
        # a pair judge of difference features also scores one answer: its reward r(question, answer)
        tasks = ("compare", "score") if model.decomposable else ("compare",) if model.arity == "pair" else ("score",)
        super().__init__(card, tasks, budget)
        self.model = model  # its reader batches by the budget it was built with (``_load_sklearn``)

    def keep_readings(self, items: int) -> None:
        self.model.embedder.memory.max_items = items

    def raw_outputs(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        from .embedding import PROBA_COLUMNS

        if self.model.arity == "pair" and records and isinstance(records[0], PointRecord):
            return self.model.rewards(records).reshape(-1, 1)
        if self.model.arity == "point":
            return np.asarray(self.model.predict(records), dtype=np.float64).reshape(-1, 1)
        proba = self.model.predict_proba(records)
        column = {v: i for i, v in enumerate(PROBA_COLUMNS)}
        ordered = np.empty_like(proba)
        for verdict, cls in CLASS_OF_VERDICT.items():
            ordered[:, cls] = proba[:, column[verdict]]
        return np.log(np.clip(ordered, 1e-12, None))

    def sequence_lengths(self, records: Sequence[PairRecord | PointRecord]) -> list[list[int]] | None:
        """The token lengths of what a decoder reader has still to read for each record (its answers after the
        question, and the question alone where a feature needs it); None for a sentence encoder."""
        embedder = self.model.embedder
        if not hasattr(embedder, "pending_lengths"):
            return None
        with_question = self.model._needs("needs_question")
        out = []
        for r in records:
            answers = [r.answer_a, r.answer_b] if isinstance(r, PairRecord) else [r.answer]
            lengths = embedder.pending_lengths([r.question] * len(answers), answers)
            out.append(lengths + (embedder.pending_text_lengths([r.question]) if with_question else []))
        return out

    def scratch(self):
        """The embedder's readings made inside are forgotten (``embedders.cache.scratch``)."""
        return self.model.embedder.scratch()

    def pair_outputs(self, raw: np.ndarray) -> PairOutputs:
        return Cls3Head().outputs(self.calibration.scale(raw))

    def point_scores(self, raw: np.ndarray) -> np.ndarray:
        return raw.reshape(-1)


@loads(providers=("cpu", "cuda"), readings=True)
def _load_sklearn(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    from .embedding import EmbeddingModel, embedder_for_card

    embedder = embedder_for_card(card, budget=options.budget, device=options.provider)
    model = EmbeddingModel.load(directory, embedder=embedder, trust_pickle=options.trust_pickle)
    return EmbeddingJudge(card, model, options.budget)


@loads(providers=None, readings=True)
def _load_onnx(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    """An exported embedding judge: the decoder reader in onnxruntime, the head in NumPy."""
    from ..embedders.onnx_reader import OnnxDecoderReader
    from ..models.onnx_session import check_gated, resolve_provider

    if "reader" not in card.runtime:
        raise ValueError(f"{directory}: an embedding judge that was not exported has no ONNX reader; run "
                         "clfjudge export first, or load it with backend='sklearn'")
    variant, provider, why = resolve_provider(options, card.runtime.get("onnx", {}))
    reader = OnnxDecoderReader(directory, card.runtime["reader"], embedder_config(card),
                               options.with_(provider=provider, variant=variant))
    check_gated(directory, card.runtime.get("onnx", {}), reader.file, provider)
    model = EmbeddingModel.load(directory, embedder=reader, trust_pickle=options.trust_pickle)
    judge = EmbeddingJudge(card, model, options.budget)
    judge.backend_name = f"onnx ({reader.variant}{'' if provider == 'cpu' else ', ' + provider})"
    judge.runtime_choice = {"provider": provider, "file": reader.file, "why": why}
    return judge
