"""Shared pieces of the source loaders: field access that names the raw field on error, and a collector
that builds validated records, counts exclusions by reason and refuses duplicate ids."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..readers import iter_json_array
from ..records import SHOWN_EXCLUDED, LoadResult, Loc, PairRecord, PointRecord, Record

SPLIT = "split"  # meta key naming a source's split (hh-rlhf subset, ultrafeedback train/eval, ...)
V = TypeVar("V")


class Fields:
    """One raw record (a JSON object or CSV row) and where it came from; errors name the raw field."""

    def __init__(self, obj: Any, loc: Loc) -> None:
        if not isinstance(obj, dict):
            raise loc.error(None, f"expected a JSON object, got {type(obj).__name__}")
        self.obj, self.loc = obj, loc

    def has(self, name: str) -> bool:
        return self.obj.get(name) is not None

    def get(self, name: str) -> Any:
        if name not in self.obj:
            raise self.loc.error(name, "is missing")
        return self.obj[name]

    def text(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str):
            raise self.loc.error(name, f"must be a string, got {type(value).__name__}: {value!r}")
        return value

    def optional_text(self, name: str) -> str | None:
        return self.text(name) if self.has(name) else None

    def number(self, name: str) -> float:
        value = self.get(name)
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError, OverflowError):  # OverflowError: an integer beyond float range
            number = math.nan
        if not math.isfinite(number):
            raise self.loc.error(name, f"is not a finite number: {value!r}")
        return number

    def choice(self, name: str, mapping: Mapping[Any, V]) -> V:
        """The mapped value of a label field; anything outside ``mapping`` is an error naming the field."""
        value = self.get(name)
        try:
            if isinstance(value, bool) and not any(isinstance(k, bool) for k in mapping):
                raise KeyError(value)  # JSON false / true is not the label 0 / 1, though Python says False == 0
            return mapping[value]
        except (KeyError, TypeError):
            allowed = ", ".join(repr(k) for k in mapping)
            raise self.loc.error(name, f"must be one of {allowed}; got {value!r}") from None


class Collector:
    """Builds one source's records; every exclusion is counted by reason, duplicate ids are errors."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.records: list[Record] = []
        self.excluded: Counter = Counter()
        self.notes: list[str] = []
        self.examples: list[str] = []
        self._first_loc: dict[str, Loc] = {}
        self._empty_answers = 0

    def _add(self, record: Record, loc: Loc) -> Record:
        first = self._first_loc.setdefault(record.id, loc)
        if first is not loc:
            raise loc.error("id", f"duplicate record id {record.id!r} (first at {first.file}:{first.line})")
        self.records.append(record)
        return record

    def pair(self, loc: Loc, **kw: Any) -> PairRecord:
        record = PairRecord.build(loc, source=self.source, allow_empty_answers=True, **kw)
        self._empty_answers += not record.answer_a.strip() or not record.answer_b.strip()
        return self._add(record, loc)

    def point(self, loc: Loc, **kw: Any) -> PointRecord:
        record = PointRecord.build(loc, source=self.source, allow_empty_answers=True, **kw)
        self._empty_answers += not record.answer.strip()
        return self._add(record, loc)

    def exclude(self, reason: str, loc: Loc | None = None, field_name: str | None = None) -> None:
        """Count a record left out; ``loc`` (and the field that decided it) name it among the first few."""
        self.excluded[reason] += 1
        if loc is not None and len(self.examples) < SHOWN_EXCLUDED:
            self.examples.append(str(loc.error(field_name, reason)))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def result(self) -> LoadResult:
        notes = list(self.notes)
        if self._empty_answers:
            notes.append(f"{self._empty_answers} record(s) keep an empty answer (the model produced no text)")
        return LoadResult(self.records, Counter(self.excluded), notes, list(self.examples))


def finite_number(value: Any) -> float | None:
    """``value`` as a float if it is a finite JSON number (not a bool, not an integer beyond float range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def array_records(path: Path, id_field: str | None = None) -> Iterator[tuple[int, Loc, Any]]:
    """(index, location, element) of each element of a JSON-array data file. The location names the element's
    index and, when it has one, its own id (``id_field``) beside the line: a minified array is all on line 1."""
    for index, (line, obj) in enumerate(iter_json_array(path)):
        own = obj.get(id_field) if id_field and isinstance(obj, dict) else None
        yield index, Loc(str(path), line, index, None if own is None else str(own)), obj


def data_files(path: Path, pattern: str) -> list[Path]:
    """``path`` itself if it is a file, else the files under it matching ``pattern`` (sorted: stable ids)."""
    if path.is_file():
        return [path]
    found = sorted(p for p in path.glob(pattern) if p.is_file())
    if not found:
        raise FileNotFoundError(f"{path}: no files matching {pattern!r}")
    return found


def relative_name(file: Path, root: Path) -> str:
    """``file`` relative to the directory a source was loaded from (for ids and meta)."""
    return file.relative_to(root).as_posix() if root.is_dir() else file.name
