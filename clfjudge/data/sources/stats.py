"""Per-source (and per-split) summary rows for ``clfjudge data stats``."""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..records import LoadResult, PairRecord, Record, Verdict
from .base import Source
from .common import SPLIT

ALL = "all"  # the split name of a source's total row


@dataclass
class StatsRow:
    source: str
    arity: str
    role: str
    split: str
    records: int
    ties: int | None  # pairs only
    excluded: int | None  # on the total row (exclusions are counted per load, not per split)
    median_answer_chars: float | None  # characters per answer; a pair contributes both answers
    available: bool
    excluded_by_reason: dict[str, int] = field(default_factory=dict)
    first_excluded: list[str] = field(default_factory=list)  # file:row: field: message
    notes: list[str] = field(default_factory=list)
    sampled_from: int | None = None  # "name:N": the usable records the N were drawn from

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _answer_lengths(records: list[Record]) -> list[int]:
    lengths: list[int] = []
    for r in records:
        lengths.extend((len(r.answer_a), len(r.answer_b)) if isinstance(r, PairRecord) else (len(r.answer),))
    return lengths


def _row(source: Source, split: str, records: list[Record], result: LoadResult | None) -> StatsRow:
    lengths = _answer_lengths(records)
    return StatsRow(
        source=source.name, arity=source.arity, role=source.role, split=split, records=len(records),
        ties=sum(r.verdict is Verdict.TIE for r in records) if source.arity == "pair" else None,
        excluded=result.n_excluded if result is not None and split == ALL else None,
        median_answer_chars=statistics.median(lengths) if lengths else None,
        available=True,
        excluded_by_reason=result.account()["excluded_by_reason"] if result is not None and split == ALL else {},
        first_excluded=result.account()["first_excluded"] if result is not None and split == ALL else [],
        notes=list(result.notes) if result is not None and split == ALL else [],
    )


def source_stats(source: Source, root: Path | None = None, limit: int | None = None) -> list[StatsRow]:
    """The total row of ``source`` then one row per split (when its records name splits); ``limit``: of the
    seeded sample of that many usable records "name:N" names (``sources.sample``).

    A source whose file is absent gives one row with available=False and 0 records.
    """
    from . import sample

    if not source.available(root):
        return [StatsRow(source.name, source.arity, source.role, ALL, 0, None, None, None, available=False)]
    result = source.load(source.path(root))
    records = sample(result.records, limit, source.name)
    by_split: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if SPLIT in record.meta:
            by_split[str(record.meta[SPLIT])].append(record)
    rows = [_row(source, ALL, records, result)]
    if len(records) < len(result.records):
        rows[0].sampled_from = len(result.records)
    rows += [_row(source, split, records, None) for split, records in sorted(by_split.items())]
    return rows
