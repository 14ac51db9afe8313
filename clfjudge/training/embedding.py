"""``clfjudge train`` for ``head: embedding``: a frozen encoder (a sentence encoder, or a decoder reading each
answer after its question) plus a scikit-learn head, on the same splits as every other head (``build_splits``:
held-out fold, decontamination, dev split, mixed-in sources), scored on dev / held-out / eval sources beside
the baselines. Minutes on a CPU, no gradient steps through the backbone.

Options live under the config key ``embedding`` (see ``OPTIONS``); the backbone is the config's ``backbone``.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.records import Record
from ..models.heads import Head

if TYPE_CHECKING:
    from ..judges.embedding import EmbeddingModel
    from .config import TrainConfig

EMBEDDING = "embedding"
# option -> what it does (unknown options are refused, naming these)
OPTIONS = {
    "kind": "pair (verdicts) or point (scores); default pair",
    "head": "logreg | gbdt (pairs), ridge | gbdt (points); default logreg / ridge",
    "features": "feature groups (judges.embedding.PAIR_FEATURES / POINT_FEATURES); default the judge's",
    "use_length": "add the length feature groups; default true",
    "head_params": "scikit-learn parameters of the head; default {C: auto} for logreg",
    "weighting": "training weights: [length] balances longer- and shorter-answer wins per source, [source] the "
                 "sources (judges.embedding.training_weights); default none",
    "length_at_prediction": "factor on the fitted length coefficients at prediction (0: removed); default 1",
    "layer": "decoder backbones: the layer whose states are pooled; default the middle one",
    "max_prompt_tokens": "decoder backbones: prompt (template + question) budget",
    "max_answer_tokens": "decoder backbones: answer budget",
    "stats": "decoder backbones: also compute token statistics (PMI with the question; feature group token_stats)",
    "stats_tokens": "decoder backbones: token statistics over each answer's first N tokens (default all)",
    "precision": "decoder backbones: fp32 | bf16 | auto (bf16 where the CPU has AMX / AVX512-BF16)",
    "batch_size": "embedding batch size",
    "device": "where the backbone reads: cpu (default) | cuda",
    "verdict": "a chat model whose verdict on each answer is a feature (feature group verdict_diff / verdict): "
               "{backbone, questions [, precision, max_question_tokens, max_answer_tokens, batch_size]} "
               "(judges.verdict; the stacked judge)",
}
EMBEDDER_OPTIONS = ("layer", "max_prompt_tokens", "max_answer_tokens", "stats", "stats_tokens", "precision",
                    "batch_size", "device")


class EmbeddingDataHead(Head):
    """The data side of the embedding judge for the shared split builder: labelled pairs or points."""

    name = EMBEDDING
    num_labels = 0
    problem_type = ""
    scheme_suffix = EMBEDDING
    best_metric = "accuracy"
    position_invariant = True  # the judge averages both answer orders: swap augmentation adds nothing

    def __init__(self, kind: str) -> None:
        self.kind = kind  # type: ignore[misc]

    def _unusable(self, record: Record) -> str | None:
        if record.kind != self.kind:
            return f"{record.kind} record (this embedding judge is a {self.kind} judge)"
        from ..judges.embedding import KINDS

        label = KINDS[self.kind].label_field
        if getattr(record, label) is None:
            return f"{self.kind} without a {label}"
        return None


def model_from_config(cfg: TrainConfig) -> EmbeddingModel:
    from ..judges.embedding import EmbeddingModel

    options = dict(cfg.embedding)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"train config: embedding: unknown option(s) {unknown}; known: "
                         + "; ".join(f"{k}: {v}" for k, v in OPTIONS.items()))
    kind = options.get("kind", "pair")
    head = options.get("head")
    logreg = (head or "logreg") == "logreg" and kind == "pair"
    return EmbeddingModel(
        encoder=cfg.backbone, head=head, kind=kind, features=options.get("features"),
        use_length=bool(options.get("use_length", True)),
        head_params=options.get("head_params", {"C": "auto"} if logreg else None), seed=cfg.seed,
        weighting=options.get("weighting", ()), length_at_prediction=float(options.get("length_at_prediction", 1.0)),
        embedder_options={k: options[k] for k in EMBEDDER_OPTIONS if k in options} or None,
        verdict=options.get("verdict"))


def evaluate(judge: EmbeddingModel, records: Sequence[Record]) -> dict[str, Any]:
    """``metrics``' evaluation of a labelled set; pairs also with both answer orders and beside the baselines."""
    from ..metrics import evaluate_pairs, evaluate_points

    if judge.kind == "point":
        return evaluate_points(records, judge.predict(records).tolist())
    return evaluate_pairs(records, judge.predict(records), judge.predict([r.swapped() for r in records]),
                          baselines=True)


def train_embedding(cfg: TrainConfig) -> Path:
    """Fit the embedding judge on the training split and write its directory (head + judge card)."""
    from .data import build_splits

    start = time.monotonic()
    judge = model_from_config(cfg)
    splits = build_splits(cfg, EmbeddingDataHead(judge.kind))
    judge.fit(splits.train)
    validation = {name: evaluate(judge, records)
                  for name, records in [("dev", splits.dev), ("test", splits.test),
                                        *((f"eval:{n}", r) for n, r in splits.evals.items())] if records}
    training = {"sources": splits.sources, "split": splits.counts, "config": asdict(cfg),
                "content": splits.content,
                "wall_time_s": round(time.monotonic() - start, 1)}
    return judge.save(cfg.output_dir, validation=validation, training=training)
