"""The one record model every source loads into and every downstream step reads.

Two kinds:
- ``PairRecord``: a question and two answers, labelled by a verdict (A / B / TIE) and/or a score pair;
- ``PointRecord``: a question and one answer with a score on a stated scale.

Validation errors name the file, the line and the field (``RecordError``); loaders never drop a record
silently: anything they exclude is counted by reason in a ``LoadResult``.
"""
from __future__ import annotations

import enum
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


class RecordError(ValueError):
    """Bad input, located: ``file:line: field: message``; ``file:line: record i (id 'x'): field: message`` for an
    element of a JSON array (a minified array is all on line 1, so its index and own id say which one)."""

    def __init__(self, file: str | None, line: int | None, field_name: str | None, message: str, *,
                 index: int | None = None, record_id: str | None = None) -> None:
        self.file, self.line, self.field, self.message = file, line, field_name, message
        self.index, self.record_id = index, record_id
        where = f"{file or '<memory>'}:{line if line is not None else '?'}"
        if index is not None:
            where += f": record {index}" + (f" (id {record_id[:80]!r})" if record_id is not None else "")
        super().__init__(f"{where}: field {field_name!r}: {message}" if field_name else f"{where}: {message}")


@dataclass(frozen=True)
class Loc:
    """Where a raw record came from (for error messages): file and line, and for an element of a JSON array its
    0-based index and its own id (when the format has one)."""

    file: str | None = None
    line: int | None = None
    index: int | None = None
    record_id: str | None = None

    def error(self, field_name: str | None, message: str) -> RecordError:
        return RecordError(self.file, self.line, field_name, message, index=self.index, record_id=self.record_id)


class Verdict(str, enum.Enum):
    A = "A"
    B = "B"
    TIE = "TIE"

    def swapped(self) -> Verdict:
        return {Verdict.A: Verdict.B, Verdict.B: Verdict.A, Verdict.TIE: Verdict.TIE}[self]

    @property
    def win(self) -> int:
        """The win coding ``metrics`` scores (UnlimitedJudge's): A -> 1, TIE -> 0, B -> -1."""
        return {Verdict.A: 1, Verdict.TIE: 0, Verdict.B: -1}[self]

    @classmethod
    def from_win(cls, win: int) -> Verdict:
        return cls.A if win > 0 else cls.B if win < 0 else cls.TIE

    @classmethod
    def from_scores(cls, s_a: float, s_b: float, margin: float = 0.0) -> Verdict:
        """Score pair -> verdict with a tie margin (UnlimitedJudge uses margin 0)."""
        diff = s_a - s_b
        return cls.A if diff > margin else cls.B if diff < -margin else cls.TIE


# Class index used by every 3-way head: UnlimitedJudge's coding (0 = tie, 1 = answer 1, 2 = answer 2).
CLASS_OF_VERDICT = {Verdict.TIE: 0, Verdict.A: 1, Verdict.B: 2}
VERDICT_OF_CLASS = {v: k for k, v in CLASS_OF_VERDICT.items()}


def _text(loc: Loc, name: str, value: Any, *, required: bool, allow_empty: bool = False) -> str | None:
    if value is None:
        if required:
            raise loc.error(name, "is missing")
        return None
    if not isinstance(value, str):
        raise loc.error(name, f"must be a string, got {type(value).__name__}")
    if required and not allow_empty and not value.strip():
        raise loc.error(name, "is empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800") is valid JSON but no tokenizer takes it
        raise loc.error(name, f"is not valid Unicode text: {exc.reason} at character {exc.start} "
                              f"({value[exc.start]!r})") from None
    return value


def _number(loc: Loc, name: str, value: Any) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise loc.error(name, f"is not a number: {value!r:.80}") from None
    if not math.isfinite(x):
        raise loc.error(name, f"is not finite: {value!r}")
    return x


@dataclass(frozen=True)
class PairRecord:
    id: str
    question: str
    answer_a: str
    answer_b: str
    verdict: Verdict | None = None
    scores: tuple[float, float] | None = None
    rubric: str | None = None
    reference: str | None = None
    source: str = ""
    scenario: str | None = None
    model_a: str | None = None
    model_b: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    arity = "pair"

    @classmethod
    def build(cls, loc: Loc, **kw: Any) -> PairRecord:
        """Validate raw values (naming file, line and field on error) and build a record.

        When only ``scores`` is given the verdict is derived with margin 0, as UnlimitedJudge does.
        ``allow_empty_answers=True`` accepts an empty answer (real test sets hold empty model outputs).
        """
        empty_ok = kw.pop("allow_empty_answers", False)
        for name in ("question", "answer_a", "answer_b"):
            kw[name] = _text(loc, name, kw.get(name), required=True, allow_empty=empty_ok and name != "question")
        for name in ("rubric", "reference", "scenario", "model_a", "model_b"):
            kw[name] = _text(loc, name, kw.get(name), required=False)
        scores = kw.get("scores")
        if scores is not None:
            if not isinstance(scores, Sequence) or len(scores) != 2:
                raise loc.error("scores", f"must be a pair of numbers, got {scores!r}")
            kw["scores"] = (_number(loc, "scores", scores[0]), _number(loc, "scores", scores[1]))
        verdict = kw.get("verdict")
        if verdict is not None and not isinstance(verdict, Verdict):
            try:
                verdict = Verdict(str(verdict).upper())
            except ValueError:
                raise loc.error("verdict", f"must be A, B or TIE, got {verdict!r}") from None
        if verdict is None and kw.get("scores") is not None:
            verdict = Verdict.from_scores(*kw["scores"])
        if verdict is None and scores is None and not kw.pop("unlabelled", False):
            raise loc.error("label", "a pair needs a verdict or a score pair")
        kw.pop("unlabelled", None)
        kw["verdict"] = verdict
        kw["id"] = str(kw.get("id") if kw.get("id") is not None else f"{loc.file}:{loc.line}")
        kw.setdefault("meta", {})
        return cls(**kw)

    def swapped(self) -> PairRecord:
        """The same pair with the answers (and the label) in the other order."""
        return replace(
            self,
            answer_a=self.answer_b,
            answer_b=self.answer_a,
            verdict=self.verdict.swapped() if self.verdict else None,
            scores=(self.scores[1], self.scores[0]) if self.scores else None,
            model_a=self.model_b,
            model_b=self.model_a,
            meta={**self.meta, "swapped": not self.meta.get("swapped", False)},
        )


@dataclass(frozen=True)
class PointRecord:
    id: str
    question: str
    answer: str
    score: float | None
    scale: tuple[float, float] = (1.0, 5.0)
    rubric: str | None = None
    reference: str | None = None
    source: str = ""
    scenario: str | None = None
    model: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    arity = "point"

    @classmethod
    def build(cls, loc: Loc, **kw: Any) -> PointRecord:
        empty_ok = kw.pop("allow_empty_answers", False)
        for name in ("question", "answer"):
            kw[name] = _text(loc, name, kw.get(name), required=True, allow_empty=empty_ok and name == "answer")
        for name in ("rubric", "reference", "scenario", "model"):
            kw[name] = _text(loc, name, kw.get(name), required=False)
        lo, hi = kw.get("scale", (1.0, 5.0))
        kw["scale"] = (float(lo), float(hi))
        score = kw.get("score")
        if score is None:
            if not kw.pop("unlabelled", False):
                raise loc.error("score", "is missing")
        else:
            score = _number(loc, "score", score)
            if not lo <= score <= hi:
                raise loc.error("score", f"{score} is outside the scale [{lo}, {hi}]")
        kw.pop("unlabelled", None)
        kw["score"] = score
        kw["id"] = str(kw.get("id") if kw.get("id") is not None else f"{loc.file}:{loc.line}")
        kw.setdefault("meta", {})
        return cls(**kw)


Record = PairRecord | PointRecord


SHOWN_EXCLUDED = 5  # excluded rows named one by one (file:row: field: message) in every command's output


@dataclass
class LoadResult:
    """What a loader returns: the records, a count of everything it excluded by reason, and the first excluded rows
    named (``file:row: field: message``)."""

    records: list[Record]
    excluded: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    @property
    def n_excluded(self) -> int:
        return sum(self.excluded.values())

    def account(self) -> dict[str, Any]:
        """What every command reports of a load (console, JSON outputs, report, judge card)."""
        return {"records": len(self.records), "excluded": self.n_excluded,
                "excluded_by_reason": dict(self.excluded.most_common()),
                "first_excluded": self.examples[:SHOWN_EXCLUDED]}


def exclusion_lines(name: str, account: dict[str, Any]) -> list[str]:
    """An ``account`` (``LoadResult.account``, or one with more reasons) as console / report lines: the reasons
    with their counts, then the first excluded rows."""
    by_reason = account.get("excluded_by_reason") or {}
    if not by_reason:
        return []
    total = sum(by_reason.values())
    lines = [f"{name}: {total} row(s) excluded: " + "; ".join(f"{reason}: {n}" for reason, n in by_reason.items())]
    lines += [f"  {example}" for example in account.get("first_excluded") or ()]
    return lines


# ---------------------------------------------------------------------------------------------------
# datasets.Dataset conversion (training and scoring consume Arrow tables)

_PAIR_FIELDS = [f.name for f in fields(PairRecord)]
_POINT_FIELDS = [f.name for f in fields(PointRecord)]


def _row(rec: Record) -> dict[str, Any]:
    row = asdict(rec)
    if isinstance(rec, PairRecord):
        row["verdict"] = rec.verdict.value if rec.verdict else None
        row["scores"] = list(rec.scores) if rec.scores else None
    else:
        row["scale"] = list(rec.scale)
    row["meta"] = json.dumps(rec.meta, sort_keys=True, default=str)
    return row


def to_dataset(records: Iterable[Record]):
    """Records (all of one kind) -> ``datasets.Dataset``; ``meta`` is stored as a JSON string."""
    import datasets

    records = list(records)
    if len({type(r) for r in records}) > 1:
        raise ValueError("to_dataset needs records of one kind (all pairs or all points)")
    rows = [_row(r) for r in records]
    names = _POINT_FIELDS if records and isinstance(records[0], PointRecord) else _PAIR_FIELDS
    return datasets.Dataset.from_dict({n: [r[n] for r in rows] for n in names})


def from_dataset(ds) -> list[Record]:
    is_point = "answer" in ds.column_names
    out: list[Record] = []
    for row in ds:
        row = dict(row)
        row["meta"] = json.loads(row["meta"]) if row.get("meta") else {}
        if is_point:
            row["scale"] = tuple(row["scale"])
            out.append(PointRecord(**row))
        else:
            row["verdict"] = Verdict(row["verdict"]) if row["verdict"] else None
            row["scores"] = tuple(row["scores"]) if row["scores"] else None
            out.append(PairRecord(**row))
    return out
