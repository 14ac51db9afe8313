"""What the research scripts share: where their results go (``research/results``, written by the benchmarks'
``machine`` / ``write``) and the rows of the embedding-judge studies (predictors trained on pairs, one embedder
per encoder) and their reports, scored by the library's ``metrics.evaluate_pairs`` / ``evaluate_points``."""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.common

from bench.common import machine  # noqa: E402,F401  (the studies record it)
from bench.common import write as bench_write  # noqa: E402
from clfjudge.batching import Budget
from clfjudge.data import sources  # noqa: E402
from clfjudge.data.records import PairRecord, PointRecord, Verdict  # noqa: E402
from clfjudge.embedders import make_embedder  # noqa: E402
from clfjudge.judges.embedding import EmbeddingModel  # noqa: E402
from clfjudge.judges.features import longer_answer_wins, majority_verdict  # noqa: E402
from clfjudge.machine import cpu_model  # noqa: E402,F401  (the studies record it)
from clfjudge.metrics import evaluate_pairs, evaluate_points  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def write(name: str, data: dict[str, Any], markdown: str, results: Path = RESULTS) -> Path:
    """``research/results/NAME_DATE.{json,md}`` (or under ``results``)."""
    return bench_write(name, data, markdown, results)


def vs_longer_cell(d: dict[str, Any] | None) -> str:
    """A table cell for a paired difference to longer-answer-wins (metrics.paired_difference)."""
    if not d:
        return "-"
    return f"{d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] ({d['won']} / {d['lost']})"


# -- the embedding-judge benches: data, predictors, reports --------------------------------------------------

LLMBAR = ["llmbar-natural", "llmbar-neighbor", "llmbar-gptinst", "llmbar-gptout", "llmbar-manual"]

# A pair predictor is trained on records and returns a function: test pairs -> (verdicts in the given order,
# verdicts with the answers swapped). A point predictor likewise returns test points -> scores.
PairJudge = Callable[[Sequence[PairRecord]], tuple[list[Verdict], list[Verdict]]]
PairPredictor = Callable[[Sequence[PairRecord]], PairJudge]
PointPredictor = Callable[[Sequence[PointRecord]], Callable[[Sequence[PointRecord]], np.ndarray]]


def load(name: str) -> list:
    result = sources.load(name)
    if result.excluded:
        print(f"  {name}: {len(result.records)} records, excluded {dict(result.excluded)}", flush=True)
    return list(result.records)


@dataclass
class Embedders:
    """One shared embedder per encoder (a sentence encoder, or a decoder reading answers after their
    questions), backed by an on-disk cache."""

    cache_dir: Path
    by_encoder: dict[str, Any] = field(default_factory=dict)

    def path(self, embedder) -> Path:
        return self.cache_dir / (embedder.cache_id.replace("|", "_").replace("=", "") + ".npz")

    def get(self, spec: str):
        """``spec``: an encoder, or "DECODER@LAYER" for a decoder's layer other than the middle one."""
        if spec not in self.by_encoder:
            encoder, _, layer = spec.partition("@")
            embedder = make_embedder(encoder, budget=Budget(16), show_progress=True,
                                     **({"layer": int(layer)} if layer else {}))
            if self.path(embedder).exists():
                embedder.load_cache(self.path(embedder))
            self.by_encoder[spec] = embedder
        return self.by_encoder[spec]

    def save(self) -> None:
        for embedder in self.by_encoder.values():
            embedder.save_cache(self.path(embedder))


@dataclass(frozen=True)
class Variant:
    """One embedding-judge configuration (a row of the tables)."""

    encoder: str
    head: str
    use_length: bool
    features: tuple[str, ...] | None = None  # None: the judge's default groups
    label: str = ""  # what the feature set is, for the table
    auto_c: bool = False  # logreg C chosen by question-grouped CV inside the training fold (else C = 0.01)

    @property
    def name(self) -> str:
        return (f"{self.encoder} {self.head}{' ' + self.label if self.label else ''} "
                f"{'+' if self.use_length else '-'}len{' C=auto' if self.auto_c else ''}")

    def judge(self, embedders: Embedders, arity: str) -> EmbeddingModel:
        embedder = embedders.get(self.encoder)
        return EmbeddingModel(backbone=embedder.backbone, head=self.head, arity=arity, features=self.features,
                              use_length=self.use_length, head_params={"C": "auto"} if self.auto_c else None,
                              embedder=embedder)


def both_orders(predict: Callable[[Sequence[PairRecord]], list[Verdict]]) -> PairJudge:
    return lambda test: (predict(test), predict([p.swapped() for p in test]))


def judge_predictor(variant: Variant, embedders: Embedders, extra: Sequence[PairRecord] = ()) -> PairPredictor:
    return lambda train: both_orders(variant.judge(embedders, "pair").fit([*train, *extra]).predict)


def majority_predictor(train: Sequence[PairRecord]) -> PairJudge:
    verdict = majority_verdict(train)
    return both_orders(lambda test: [verdict] * len(test))


def longer_predictor(train: Sequence[PairRecord]) -> PairJudge:
    return both_orders(longer_answer_wins)


def pair_report(records: Sequence[PairRecord], forward: Sequence[Verdict],
                backward: Sequence[Verdict]) -> dict[str, Any]:
    """A row's verdicts on labelled pairs in both answer orders (``metrics.evaluate_pairs``: accuracy, f1,
    agreement, consistency, counts), and its accuracy on the pairs whose gold verdict is not a tie."""
    decisive = [i for i, r in enumerate(records) if r.verdict is not Verdict.TIE]
    return {**evaluate_pairs(records, forward, backward),
            "accuracy_non_tie_gold": float(np.mean([forward[i] == records[i].verdict for i in decisive]))
            if decisive else None, "n_non_tie_gold": len(decisive)}


def point_report(records: Sequence[PointRecord], pred: np.ndarray) -> dict[str, Any]:
    """A row's scores of labelled answers (``metrics.evaluate_points``); a constant prediction has none."""
    if np.ptp(pred) == 0:
        return {"n": len(records), "pearson": None, "kendall": None, "spearman": None,
                "note": "constant prediction: correlations undefined"}
    m = evaluate_points(records, pred.tolist())
    return {k: m[k] for k in ("n", "pearson", "kendall", "spearman")}
