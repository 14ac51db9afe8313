"""``clfjudge train`` for ``head: embedding``: a frozen encoder (a sentence encoder, or a decoder reading each
answer after its question) plus a scikit-learn head, on the same splits as every other head (``build_splits``:
held-out fold, decontamination, dev split, mixed-in sources), scored on dev / held-out / eval sources beside
the baselines. Minutes on a CPU, no gradient steps through the backbone.

Options live under the config key ``embedding`` (``embedding_config.EmbeddingOptions``); the backbone is the config's
``backbone``.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.records import Record
from ..judges.embedding import EMBEDDING
from ..models.heads import Head

if TYPE_CHECKING:
    from ..judges.embedding import EmbeddingModel
    from .config import TrainConfig


class EmbeddingDataHead(Head):
    """The data side of the embedding judge for the shared split builder: labelled pairs or points."""

    name = EMBEDDING
    num_labels = 0
    problem_type = ""
    scheme_suffix = EMBEDDING
    best_metric = "accuracy"
    position_invariant = True  # the judge averages both answer orders: swap augmentation adds nothing

    def __init__(self, arity: str) -> None:
        self.arity = arity  # type: ignore[misc]

    def _unusable(self, record: Record) -> str | None:
        if record.arity != self.arity:
            return f"{record.arity} record (this embedding judge is a {self.arity} judge)"
        from ..judges.embedding import RECORD_SPECS

        label = RECORD_SPECS[self.arity].label_field
        if getattr(record, label) is None:
            return f"{self.arity} without a {label}"
        return None


def model_from_config(cfg: TrainConfig) -> EmbeddingModel:
    from ..judges.embedding import EmbeddingModel

    options = cfg.embedding  # checked key by key when the recipe was read (embedding_config.EmbeddingOptions)
    logreg = (options.head or "logreg") == "logreg" and options.arity == "pair"
    head_params = options.head_params if options.head_params is not None else {"C": "auto"} if logreg else None
    return EmbeddingModel(
        backbone=cfg.backbone, head=options.head, arity=options.arity, features=options.features,
        use_length=options.use_length, head_params=head_params, seed=cfg.seed, weighting=options.weighting,
        length_at_prediction=options.length_at_prediction, embedder_options=options.reader_options() or None,
        verdict=options.verdict)


def evaluate(judge: EmbeddingModel, records: Sequence[Record]) -> dict[str, Any]:
    """``metrics``' evaluation of a labelled set; pairs also with both answer orders and beside the baselines."""
    from ..metrics import evaluate_pairs, evaluate_points

    if judge.arity == "point":
        return evaluate_points(records, judge.predict(records).tolist())
    return evaluate_pairs(records, judge.predict(records), judge.predict([r.swapped() for r in records]),
                          baselines=True)


def train_embedding(cfg: TrainConfig) -> Path:
    """Fit the embedding judge on the training split and write its directory (head + judge card)."""
    from .data import build_splits

    start = time.monotonic()
    judge = model_from_config(cfg)
    splits = build_splits(cfg, EmbeddingDataHead(judge.arity))
    judge.fit(splits.train)
    validation = {name: evaluate(judge, records)
                  for name, records in [("dev", splits.dev), ("test", splits.test),
                                        *((f"eval:{n}", r) for n, r in splits.evals.items())] if records}
    training = {"sources": splits.sources, "split": splits.counts, "config": asdict(cfg),
                "content": splits.content,
                "wall_time_s": round(time.monotonic() - start, 1)}
    return judge.save(cfg.output_dir, validation=validation, training=training)
