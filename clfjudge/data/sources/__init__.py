"""Data sources: ``load(name)``, ``SOURCES`` (the registry). Each module registers its loaders.

``load_usable("name" | "name:N", select)`` is the one way a caller (training, the export parity gate, ``clfjudge
calibrate``) loads a source and keeps the records it can use, counting the others by reason; the caller then draws
its own seeded sample of N."""
from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..records import LoadResult, Record
from .base import SOURCES, Source

# One line per source module.
_MODULES = [
    "pandalm",
    "autoj",
    "judgelm",
    "prometheus",
    "llmbar",
    "mtbench",
    "alpacaeval",
    "arena",
    "hh_rlhf",
    "llmeval2",
    "ultrafeedback",
]
for _m in _MODULES:
    importlib.import_module(f"{__name__}.{_m}")


def load(name: str, path=None):
    return SOURCES.get(name).load(path)


def parse_source(spec: str) -> tuple[str, int | None]:
    """``"name"`` or ``"name:N"`` (a seeded sample of N usable records; nested: N < M samples a prefix of M's)."""
    name, sep, limit = spec.partition(":")
    if not sep:
        return name, None
    if not limit.isdigit() or int(limit) <= 0:
        raise ValueError(f"source {spec!r}: expected name or name:N with N a positive integer")
    return name, int(limit)


@dataclass
class Usable:
    """One source's records a caller can use (``load_usable``)."""

    name: str
    limit: int | None  # the N of "name:N": how many the caller samples
    loaded: LoadResult  # everything the loader read, and what it excluded
    records: list[Record]  # what ``select`` kept
    excluded: Counter  # what ``select`` did not keep, by reason


def load_usable(spec: str, select: Callable[[Sequence[Record]], tuple[list[Record], Counter]]) -> Usable:
    """Load the source ``spec`` names ("name" or "name:N") and keep what ``select`` (a head's ``select``: records ->
    kept, excluded by reason) keeps."""
    name, limit = parse_source(spec)
    loaded = load(name)
    kept, excluded = select(loaded.records)
    return Usable(name, limit, loaded, kept, excluded)


__all__ = ["SOURCES", "Source", "Usable", "load", "load_usable", "parse_source"]
