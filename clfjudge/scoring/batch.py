"""Batch scoring, the part every engine of `clfjudge score` shares: a line of input -> a record (errors name
file, line and field), lines -> chunks, a chunk -> output rows and rejections, the rows' and rejections' text,
and the run's tally. The single-process engine (clfjudge/cli/score.py) and the Ray engine (``ray_engine``) both
build their chunks with ``chunk_lines`` and their rows with ``score_chunk``, so that the same lines give the same
bytes: a judge sorts the records of a call by length before batching them, so a chunk's records decide its
batches, and a different split can move scores by float noise."""
from __future__ import annotations

import codecs
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..card import TASK_OF_ARITY
from ..data.formats import ReadOptions
from ..data.records import Loc, Record, RecordError

if TYPE_CHECKING:
    from ..judges.base import Judge

# What a judge raises for an input it cannot take (tokenizers raise TypeError for text they cannot encode).
INPUT_ERRORS = (ValueError, TypeError)
SHOWN_DUPLICATES = 5


@dataclass
class Tally:
    read: int = 0
    blank: int = 0
    scored: int = 0
    rejected: int = 0
    reasons: Counter = field(default_factory=Counter)
    duplicates: int = 0  # scored lines whose id is already in the output
    escalated: int = 0  # scored lines the teacher decided (``escalation``)
    duplicate_examples: list[tuple[str, Any]] = field(default_factory=list)  # (id, line or file)

    def summary(self) -> str:
        text = f"lines read {self.read}: scored {self.scored}, rejected {self.rejected}"
        if self.blank:
            text += f", blank {self.blank}"
        if self.duplicates:
            text += f", duplicate ids {self.duplicates}"
        if self.escalated:
            text += f", decided by the teacher {self.escalated}"
        if self.reasons:
            text += " (" + ", ".join(f"{reason}: {n}" for reason, n in self.reasons.most_common()) + ")"
        return text

    def duplicate_warning(self) -> str | None:
        if not self.duplicates:
            return None
        where = ", ".join(f"{i!r} ({'line ' if isinstance(at, int) else ''}{at})"
                          for i, at in self.duplicate_examples)
        return (f"warning: {self.duplicates} scored line(s) repeat an id already in the output, e.g. {where}; "
                "rows with the same id cannot be told apart by id")

    def count_id(self, seen: set[str], row_id: str, at: Any) -> None:
        """Note a scored row's id; ``at`` (its line, or its file) is kept for the first few repeats."""
        if row_id in seen:
            self.duplicates += 1
            if len(self.duplicate_examples) < SHOWN_DUPLICATES:
                self.duplicate_examples.append((row_id, at))
        seen.add(row_id)

    def add(self, other: Tally) -> None:
        """Add another tally's line counts (not its duplicates: those are counted over the whole output)."""
        self.read += other.read
        self.blank += other.blank
        self.scored += other.scored
        self.rejected += other.rejected
        self.escalated += other.escalated
        self.reasons.update(other.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reasons": dict(self.reasons)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tally:
        return cls(**{**data, "reasons": Counter(data["reasons"]),
                      "duplicate_examples": [tuple(x) for x in data["duplicate_examples"]]})


def parse_line(text: str, loc: Loc, task: str, options: ReadOptions = ReadOptions()) -> Record:
    """One JSONL line -> a pair (compare) or point (score) record; errors name file, line and field. A line in
    another format (TRL's prompt / chosen / rejected, prompt / completion, messages: ``data.formats``), or any line
    when ``options`` force a format or map columns, is read as the record it names."""
    from ..judges.base import read_item

    try:
        item = json.loads(text)
    except json.JSONDecodeError as exc:
        # the message may end in "at" ("Unterminated string starting at"): the column follows as its own words
        raise loc.error(None, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(item, dict):
        raise loc.error(None, f"expected a JSON object, got {type(item).__name__}")
    if item.get("id") is None:
        item = {**item, "id": f"{Path(loc.file).name}:{loc.line}"}
    return read_item(item, loc, "pair" if task == "compare" else "point", options)


PEEKED_LINES = 100


def pick_task(task: str, judge: Judge, lines: Iterable[tuple[int, str]], options: ReadOptions = ReadOptions()) -> str:
    """``--task auto``: what the judge does; a judge that does both (a reward judge) does what the input's first
    item asks (``data.formats.item_arity``): pairs compared, single answers (TRL's prompt / completion, messages)
    scored. Only the first lines are read, up to the first one that is an item."""
    from itertools import islice

    from ..data.formats import item_arity

    if task != "auto":
        return task
    default = TASK_OF_ARITY[judge.card.arity]
    if not set(TASK_OF_ARITY.values()) <= judge.tasks:
        return default
    for _, text in islice(lines, PEEKED_LINES):
        try:
            arity = item_arity(json.loads(text), options) if isinstance(text, str) and text.strip() else None
        except ValueError:
            arity = None
        if arity is not None:
            return TASK_OF_ARITY[arity]
    return default


@dataclass
class Chunk:
    """Consecutive lines ``first``..``last`` of one input: the records to judge in one call (with their line
    numbers), the lines rejected while parsing and the number of blank lines. Every line is in one of the three."""

    first: int
    last: int
    records: list[tuple[int, Record]] = field(default_factory=list)
    rejections: list[RecordError] = field(default_factory=list)
    blank: int = 0


def decode_line(raw: bytes, loc: Loc, offset: int, encoding: str = "utf-8") -> str | RecordError:
    """A line's bytes as text, or (never replaced by a stand-in character) the rejection of a line that is not in
    ``encoding``, naming the line and the byte offset (in the line and, ``offset`` being the line's, the file)."""
    # a UTF-8 file may begin with a byte order mark (as some editors save it): no part of the first record
    bom = len(codecs.BOM_UTF8) if loc.line == 1 and raw.startswith(codecs.BOM_UTF8) and \
        codecs.lookup(encoding).name == "utf-8" else 0
    try:
        return raw[bom:].decode(encoding)
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        return loc.error(None, f"not valid {encoding}: byte {raw[at]:#04x} at byte offset {at} of the line "
                               f"({offset + at} of the file); --encoding names another encoding")


def chunk_lines(lines: Iterable[tuple[int, str | RecordError]], source: str, task: str, chunk_size: int,
                options: ReadOptions = ReadOptions()) -> Iterator[Chunk]:
    """Numbered lines of ``source`` -> chunks: a chunk ends at the line that brings its records to
    ``chunk_size``; the last chunk holds what follows the last full one (lines, if not records). A line that
    could not be read as text comes as its rejection (``decode_line``). Lazy: when a chunk is yielded, exactly its
    lines have been read from ``lines``."""
    chunk: Chunk | None = None
    for number, text in lines:
        if chunk is None:
            chunk = Chunk(first=number, last=number)
        chunk.last = number
        if isinstance(text, RecordError):
            chunk.rejections.append(text)
            continue
        if not text.strip():
            chunk.blank += 1
            continue
        try:
            chunk.records.append((number, parse_line(text, Loc(source, number), task, options)))
        except RecordError as err:
            chunk.rejections.append(err)
        if len(chunk.records) >= chunk_size:
            yield chunk
            chunk = None
    if chunk is not None:
        yield chunk


def judge_chunk(judge: Judge, task: str, records: Sequence[Record], symmetric: bool) -> list[dict[str, Any]]:
    results = judge.compare_batch(records, symmetric=symmetric) if task == "compare" else judge.score_batch(records)
    return [{"id": r.id, **res.to_dict()} for r, res in zip(records, results)]


def score_chunk(judge: Judge, task: str, chunk: Sequence[tuple[int, Record]], symmetric: bool,
                source: str) -> tuple[list[tuple[int, dict[str, Any]]], list[RecordError]]:
    """(line, output row) of each scored line of a chunk, and the rejections; if the judge rejects one of its
    inputs (e.g. one it cannot encode), retry line by line so only the bad lines are rejected."""
    try:
        rows = judge_chunk(judge, task, [r for _, r in chunk], symmetric)
        return [(line, row) for (line, _), row in zip(chunk, rows)], []
    except INPUT_ERRORS:
        if len(chunk) == 1:
            raise
    out, errors = [], []
    for line, record in chunk:
        try:
            out += [(line, row) for row in judge_chunk(judge, task, [record], symmetric)]
        except INPUT_ERRORS as exc:
            errors.append(RecordError(source, line, None, f"the judge cannot take this input: {exc}"))
    return out, errors


def row_text(row: dict[str, Any]) -> str:
    """An output line: the input's id and the judge's result."""
    return json.dumps(row) + "\n"


def rejected_text(err: RecordError, with_file: bool = False) -> str:
    """A rejected-file line: line, field and error (and the file, where one output gathers several inputs)."""
    row = {"line": err.line, "field": err.field, "error": err.message}
    return json.dumps({"file": err.file, **row} if with_file else row) + "\n"


def reason(err: RecordError) -> str:
    """The summary bucket of a rejection: its field and what is wrong with it without the value (as the loaders
    count excluded rows), else the kind of error (the message's leading words)."""
    if err.field:
        return f"field {err.field!r}: {err.message.split(', got ')[0].split(': ')[0]}"
    return re.split(r"[(:]", err.message, maxsplit=1)[0].strip()
