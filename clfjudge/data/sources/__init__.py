"""Data sources: ``load(name)``, ``SOURCES`` (the registry). Each module registers its loaders.

``resolve(name)`` is the one way every command turns a source name into a ``Source``: a built-in name, or a data
spec naming the user's own data (a file, a ``save_to_disk`` directory, ``hf:OWNER/NAME[:SPLIT]``: ``files.py``).
``load_usable("name" | "name:N", select)`` is the one way a caller (training, the export parity gate, ``clfjudge
calibrate``) loads a source and keeps the records it can use, counting the others by reason; the caller then draws
its own seeded sample of N."""
from __future__ import annotations

import importlib
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..formats import ReadOptions
from ..records import LoadResult, Record
from .base import SOURCES, Source
from .files import UserSource, is_data_spec, resolve_user

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


def resolve(name: str, options: ReadOptions = ReadOptions(), labelled: bool = True) -> Source:
    """The source ``name`` names (without ":N"): a built-in source, else the user's data a data spec names (read
    with ``options``; ``labelled=False``: rows without labels are records too). A name that is neither is an error
    listing the built-in names."""
    if name in SOURCES:
        return SOURCES.get(name)
    if not is_data_spec(name):
        known = ", ".join(SOURCES.names())
        raise KeyError(f"unknown source {name!r}; known: {known}; or your own data: a path to a JSONL / JSON / "
                       "Parquet / CSV file, a save_to_disk directory, or hf:OWNER/NAME[:SPLIT]")
    return resolve_user(name, options, labelled)


def load(name: str, path=None, options: ReadOptions = ReadOptions(), labelled: bool = True):
    return resolve(name, options, labelled).load(path)


def parse_source(spec: str) -> tuple[str, int | None]:
    """``"name"`` or ``"name:N"`` (a seeded sample of N usable records; nested: N < M samples a prefix of M's). A
    data spec may hold colons of its own (``hf:OWNER/NAME:SPLIT``): only a trailing ":N" is a sample size."""
    name, sep, limit = spec.rpartition(":")
    if is_data_spec(spec):
        return (name, int(limit)) if sep and limit.isdigit() and int(limit) > 0 else (spec, None)
    if not sep:
        return spec, None
    if not limit.isdigit() or int(limit) <= 0 or ":" in name:
        raise ValueError(f"source {spec!r}: expected name or name:N with N a positive integer")
    return name, int(limit)


def sample(records: Sequence[Record], n: int | None, name: str, seed: int = 0) -> list[Record]:
    """A seeded sample of at most ``n`` of ``records``, in their order: what "name:N" reads in ``clfjudge data
    stats`` and ``clfjudge audit`` (and what ``--limit`` samples), so both show the same N records."""
    records = list(records)
    if n is not None and len(records) > n:
        keep = sorted(random.Random(f"{seed}:{name}").sample(range(len(records)), n))
        records = [records[i] for i in keep]
    return records


@dataclass
class Usable:
    """One source's records a caller can use (``load_usable``)."""

    name: str
    limit: int | None  # the N of "name:N": how many the caller samples
    loaded: LoadResult  # everything the loader read, and what it excluded
    records: list[Record]  # what ``select`` kept
    excluded: Counter  # what ``select`` did not keep, by reason


def load_usable(spec: str, select: Callable[[Sequence[Record]], tuple[list[Record], Counter]],
                options: ReadOptions = ReadOptions(), labelled: bool = True) -> Usable:
    """Load the source ``spec`` names ("name" or "name:N") and keep what ``select`` (a head's ``select``: records ->
    kept, excluded by reason) keeps."""
    name, limit = parse_source(spec)
    loaded = load(name, options=options, labelled=labelled)
    kept, excluded = select(loaded.records)
    return Usable(name, limit, loaded, kept, excluded)


def describe(name: str, options: ReadOptions = ReadOptions()) -> dict | None:
    """What a judge card records about a user's data (path, content hash, format); None for a built-in source."""
    source = resolve(name, options)
    return source.describe() if isinstance(source, UserSource) else None


__all__ = ["SOURCES", "ReadOptions", "Source", "Usable", "describe", "load", "load_usable", "parse_source",
           "resolve", "sample"]
