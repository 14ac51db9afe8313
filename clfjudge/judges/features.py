"""Cheap features shared by the embedding judge and the baselines, and the two baseline judges.

- lengths of texts (characters, words) and their log differences;
- information length: the bytes a text takes compressed (zlib), a length that repetition and boilerplate
  do not inflate;
- question-answer cosine similarity from embeddings computed elsewhere;
- baselines as plain functions: the majority class of a training set, and "longer answer wins" (equal
  lengths -> TIE), the verbosity heuristic every learned judge has to beat.
"""
from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Literal

import numpy as np

from ..data.records import PairRecord, PointRecord, Verdict

LengthUnit = Literal["chars", "words"]


def char_lengths(texts: Sequence[str]) -> np.ndarray:
    return np.fromiter((len(t) for t in texts), dtype=np.float64, count=len(texts))


def word_lengths(texts: Sequence[str]) -> np.ndarray:
    return np.fromiter((len(t.split()) for t in texts), dtype=np.float64, count=len(texts))


_LENGTH_OF_UNIT = {"chars": char_lengths, "words": word_lengths}


def lengths(texts: Sequence[str], unit: LengthUnit = "chars") -> np.ndarray:
    try:
        return _LENGTH_OF_UNIT[unit](texts)
    except KeyError:
        raise ValueError(f"unknown length unit {unit!r}; known: {sorted(_LENGTH_OF_UNIT)}") from None


def log_lengths(texts: Sequence[str]) -> np.ndarray:
    """(n, 2): log(1 + characters), log(1 + words)."""
    return np.log1p(np.stack([char_lengths(texts), word_lengths(texts)], axis=1))


def log_length_difference(texts_a: Sequence[str], texts_b: Sequence[str]) -> np.ndarray:
    """(n, 2): log-length of A minus log-length of B (characters, words); antisymmetric under A <-> B."""
    return log_lengths(texts_a) - log_lengths(texts_b)


ZLIB_LEVEL = 6  # zlib's default level, named so that an export can state it
TEXT_ENCODING = ("utf-8", "surrogatepass")
EMPTY_COMPRESSED = len(zlib.compress(b"", ZLIB_LEVEL))  # 8 bytes: zlib's header and checksum


def information_lengths(texts: Sequence[str]) -> np.ndarray:
    """Bytes each text takes compressed by zlib (level 6), minus the empty text's: how much an answer says
    rather than how long it is. Measured on the pool
    (docs/training.md#how-the-default-was-chosen-the-reader-probe), the information-length
    rule beats the character-length rule out of distribution; padding by repetition barely moves it."""
    # surrogatepass: a lone surrogate (valid JSON, not valid UTF-8) is measured, not an error
    return np.fromiter((len(zlib.compress(t.encode(*TEXT_ENCODING), ZLIB_LEVEL)) - EMPTY_COMPRESSED for t in texts),
                       dtype=np.float64, count=len(texts))


def log_information_lengths(texts: Sequence[str]) -> np.ndarray:
    """(n, 1): log(1 + compressed bytes)."""
    return np.log1p(information_lengths(texts))[:, None]


def log_information_length_difference(texts_a: Sequence[str], texts_b: Sequence[str]) -> np.ndarray:
    """(n, 1): log information length of A minus that of B; antisymmetric under A <-> B."""
    return log_information_lengths(texts_a) - log_information_lengths(texts_b)


def row_cosine(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Cosine similarity of matching rows of two embedding matrices (zero vectors give 0)."""
    if u.shape != v.shape:
        raise ValueError(f"embedding shapes differ: {u.shape} vs {v.shape}")
    norms = np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1)
    dots = np.einsum("ij,ij->i", u, v)
    return np.divide(dots, norms, out=np.zeros_like(dots, dtype=np.float64), where=norms > 0)


# ---------------------------------------------------------------------------------------------------
# Baseline judges


def majority_verdict(train: Sequence[PairRecord]) -> Verdict:
    """The most frequent verdict of labelled training pairs (equal counts resolve in the order A, B, TIE,
    as ``metrics.majority_class`` does)."""
    counts = Counter(r.verdict for r in train if r.verdict is not None)
    if not counts:
        raise ValueError("majority_verdict needs at least one labelled pair")
    order = [Verdict.A, Verdict.B, Verdict.TIE]
    return max(order, key=lambda v: (counts[v], -order.index(v)))


def majority_score(train: Sequence[PointRecord]) -> float:
    """The most frequent score of labelled training points (the smallest one on a tie of counts)."""
    counts = Counter(r.score for r in train if r.score is not None)
    if not counts:
        raise ValueError("majority_score needs at least one labelled point")
    return max(sorted(counts), key=lambda s: counts[s])


def longer_answer_wins(pairs: Sequence[PairRecord], unit: LengthUnit = "chars") -> list[Verdict]:
    """The verbosity baseline: the longer answer wins, equal lengths tie (position-consistent)."""
    diff = lengths([p.answer_a for p in pairs], unit) - lengths([p.answer_b for p in pairs], unit)
    return [Verdict.from_win(int(np.sign(d))) for d in diff]
