"""The sentence encoder of embedding judges: a frozen sentence-transformers model that embeds each distinct
text once (``TextEmbedder``), with an in-memory cache saved to / loaded from ``.npz`` and the on-disk shards of
``embedders.cache``."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..batching import Budget
from .cache import CachedEmbedder

DEFAULT_ENCODER = "minilm"


def resolve_encoder(spec: str) -> str:
    """Alias ("minilm", "mpnet"), hub id or local directory -> what SentenceTransformer should load."""
    from ..models.backbones import resolve_backbone

    return str(resolve_backbone(spec).path_or_id)


def _text_key(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


class TextEmbedder(CachedEmbedder):
    """A frozen sentence-transformers encoder that embeds each distinct text once (L2-normalised) and keeps
    the vector, so answers repeated across pairs, folds and judges sharing one embedder are encoded once.
    The memory cache can be saved to / loaded from an ``.npz`` file (keyed by a hash of each text).
    Answers are embedded on their own: ``embed_answers`` ignores the questions."""

    type = "sentence"  # the EMBEDDERS entry

    def __init__(self, backbone: str = DEFAULT_ENCODER, *, budget: Budget = Budget(), device: str = "cpu",
                 show_progress: bool = False, cache_dir: str | Path | None = None, precision: str = "fp32") -> None:
        from .decoder import resolve_precision

        super().__init__(cache_dir)
        self.backbone = backbone
        # sentence-transformers pads each batch itself: of a budget, only its rows apply
        self.batch_size = budget.max_batch_size
        self.device = device
        self.show_progress = show_progress
        # "bf16" / "auto": autocast where the machine has bf16 (1.8x fp32 for MPNet without AMX), cosines within ~1e-3
        self.precision = resolve_precision(precision, device)
        self._model = None

    def config(self) -> dict[str, Any]:
        return {"type": self.type}

    truncation_policy = "the encoder truncates each text to max_seq_length tokens"

    @property
    def cache_id(self) -> str:
        return self.backbone if self.precision == "fp32" else f"{self.backbone}|{self.precision}"

    @property
    def model(self):
        if self._model is None:
            from ..machine import default_ds_accelerator

            default_ds_accelerator()
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(resolve_encoder(self.backbone), device=self.device)
        return self._model

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, rows L2-normalised; only texts not seen before are encoded."""
        if not texts:
            raise ValueError("embed() needs at least one text")
        keys = [_text_key(t) for t in texts]
        found = self.cached(keys)
        missing = {k: t for k, t in zip(keys, texts) if k not in found}
        if missing:
            vectors = self._encode(list(missing.values()))
            found.update(zip(missing, vectors))
            self.store(list(missing), vectors)
        return np.stack([found[k] for k in keys])

    def _encode(self, texts: list[str]) -> np.ndarray:
        from .decoder import autocast

        with autocast(self.precision, self.device):
            vectors = self.model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True,
                                        show_progress_bar=self.show_progress)
        vectors = vectors.float().cpu().numpy()  # normalised in float32, not in bf16
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)

    def embed_answers(self, questions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        if len(questions) != len(answers):
            raise ValueError(f"{len(questions)} questions for {len(answers)} answers")
        return self.embed(answers)

    stats = False

    def answer_stats(self, questions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        raise ValueError(f"{self.backbone} is a sentence encoder: token statistics need a decoder backbone")
