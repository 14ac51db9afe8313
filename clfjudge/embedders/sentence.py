"""The sentence encoder of embedding judges: a frozen sentence-transformers model that embeds each distinct
text once (``TextEmbedder``), with an in-memory cache saved to / loaded from ``.npz`` and the on-disk shards of
``embedders.cache``."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cache import DEFAULT_MEMORY_ITEMS, Cached, MemoryCache, load_vectors, save_vectors, scratch

DEFAULT_ENCODER = "minilm"


def resolve_encoder(spec: str) -> str:
    """Alias ("minilm", "mpnet"), hub id or local directory -> what SentenceTransformer should load."""
    from ..models.backbones import resolve_backbone

    return str(resolve_backbone(spec).path_or_id)


def _text_key(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


class TextEmbedder:
    """A frozen sentence-transformers encoder that embeds each distinct text once (L2-normalised) and keeps
    the vector, so answers repeated across pairs, folds and judges sharing one embedder are encoded once.
    The memory cache can be saved to / loaded from an ``.npz`` file (keyed by a hash of each text).
    Answers are embedded on their own: ``embed_answers`` ignores the questions."""

    kind = "sentence"

    def __init__(self, encoder: str = DEFAULT_ENCODER, *, batch_size: int = 32, device: str = "cpu",
                 show_progress: bool = False, cache_dir: str | Path | None = None,
                 memory_items: int | None = DEFAULT_MEMORY_ITEMS) -> None:
        self.encoder = encoder
        self.batch_size = batch_size
        self.device = device
        self.show_progress = show_progress
        self._model = None
        self._cache = MemoryCache(memory_items)  # least recently used vectors forgotten beyond memory_items
        self._disk = Cached(cache_dir)  # default: $CLFJUDGE_EMBEDDING_CACHE, if set

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind}

    truncation_policy = "the encoder truncates each text to max_seq_length tokens"

    @property
    def cache_id(self) -> str:
        return self.encoder

    @property
    def model(self):
        if self._model is None:
            from ..machine import default_ds_accelerator

            default_ds_accelerator()
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(resolve_encoder(self.encoder), device=self.device)
        return self._model

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def memory(self) -> MemoryCache:
        """The in-memory vectors; ``memory.max_items`` bounds them (least recently used forgotten first)."""
        return self._cache

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, rows L2-normalised; only texts not seen before are encoded."""
        if not texts:
            raise ValueError("embed() needs at least one text")
        keys = [_text_key(t) for t in texts]
        self._disk.load(self.cache_id, self._cache)
        found = self._cache.known(keys)
        missing = {k: t for k, t in zip(keys, texts) if k not in found}
        if missing:
            vectors = np.asarray(self.model.encode(list(missing.values()), batch_size=self.batch_size,
                                                   normalize_embeddings=True, convert_to_numpy=True,
                                                   show_progress_bar=self.show_progress), dtype=np.float32)
            found.update(zip(missing, vectors))
            self._cache.update(zip(missing, vectors))
            self._disk.store(list(missing), vectors)
        return np.stack([found[k] for k in keys])

    def embed_answers(self, questions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        if len(questions) != len(answers):
            raise ValueError(f"{len(questions)} questions for {len(answers)} answers")
        return self.embed(answers)

    stats = False

    def answer_stats(self, questions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        raise ValueError(f"{self.encoder} is a sentence encoder: token statistics need a decoder backbone")

    def clear_cache(self) -> None:
        """Forget every stored vector (a long-running judge can bound its memory this way)."""
        self._cache.clear()

    def scratch(self):
        """A context whose readings are forgotten when it ends (``cache.scratch``)."""
        return scratch(self)

    def save_cache(self, path: str | Path) -> Path:
        return save_vectors(path, self._cache, self.cache_id)

    def load_cache(self, path: str | Path) -> int:
        """Add the vectors stored at ``path``; returns how many were added. The file must come from the same
        encoder spec."""
        return load_vectors(path, self._cache, self.cache_id)
