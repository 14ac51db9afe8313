"""Line-numbered readers for the official file formats (JSONL, JSON arrays / dicts, CSV, zip and gzip).

Every reader yields the 1-based line on which a record starts, so loaders can build ``Loc(file, line)``
and every error names the file and line. A malformed line raises ``RecordError``; nothing is skipped
except blank JSONL lines and blank CSV lines.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import re
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .records import RecordError

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_CSV_FIELD_LIMIT = 1 << 30  # arena responses exceed csv's default 128 KiB cell limit
# What the gzip / zip modules raise for damaged archives (CRC, truncation, unknown compression, encryption,
# a missing member).
_CORRUPT = (OSError, EOFError, zlib.error, zipfile.BadZipFile, NotImplementedError, RuntimeError, KeyError,
            ValueError)


def _json_error(exc: Exception) -> str:
    """The message of a JSON value that ``json`` refuses: a syntax error, nesting beyond the recursion limit,
    or an integer beyond the int-string conversion limit (a ValueError that is not a JSONDecodeError)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {exc.msg}"
    if isinstance(exc, RecursionError):
        return "invalid JSON: nested too deeply"
    return f"invalid JSON: {exc}"


def location(path: Path | str, member: str | None = None) -> str:
    """How a file (or a member of a zip archive) is named in error messages."""
    return f"{path}!{member}" if member else str(path)


def _zip_member(archive: zipfile.ZipFile, path: Path, member: str | None) -> str:
    if member is not None:
        return member
    names = [n for n in archive.namelist() if not n.startswith("__MACOSX/") and not n.endswith("/")]
    if len(names) != 1:
        raise RecordError(str(path), None, None, f"expected one data file in the zip archive, found {names}")
    return names[0]


def _unpack(path: Path, member: str | None) -> tuple[bytes, str | None]:
    raw = path.read_bytes()  # a missing or unreadable file raises as such, before any unpacking
    try:
        if path.suffix == ".gz":
            return gzip.decompress(raw), None
        if path.suffix == ".zip":
            with zipfile.ZipFile(io.BytesIO(raw)) as archive:
                member = _zip_member(archive, path, member)
                return archive.read(member), member
    except RecordError:
        raise
    except _CORRUPT as exc:  # a damaged archive names its file, like a damaged line does
        what = "gzip" if path.suffix == ".gz" else "zip"
        raise RecordError(location(path, member), None, None, f"not a valid {what} file: {exc!r}") from None
    return raw, None


def read_text(path: Path | str, member: str | None = None) -> tuple[str, str]:
    """(text, location) of a plain, ``.gz`` or ``.zip`` file (``member``: which file inside the zip)."""
    path = Path(path)
    data, member = _unpack(path, member)
    where = location(path, member)
    try:
        return data.decode("utf-8"), where
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RecordError(where, line, None, f"not valid UTF-8: {exc.reason}") from None


def iter_jsonl(path: Path | str, member: str | None = None) -> Iterator[tuple[int, Any]]:
    """(line, object) for each non-blank line of a JSONL file (plain, ``.gz``, or a member of a ``.zip``)."""
    text, where = read_text(path, member)
    # split on "\n" only: str.splitlines would also break inside strings holding U+2028, U+0085, ...
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            column = f" (column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            raise RecordError(where, line_no, None, _json_error(exc) + column) from None
        yield line_no, obj


class _Scanner:
    """Walks a JSON document element by element with ``raw_decode``, tracking line numbers."""

    def __init__(self, text: str, where: str) -> None:
        self.text, self.where = text, where
        self.pos, self._line, self._line_pos = 0, 1, 0

    def line_at(self, pos: int) -> int:
        if pos < self._line_pos:  # only moves forward in practice; recount from the start otherwise
            self._line, self._line_pos = 1, 0
        self._line += self.text.count("\n", self._line_pos, pos)
        self._line_pos = pos
        return self._line

    def error(self, pos: int, message: str, index: int | None = None) -> RecordError:
        return RecordError(self.where, self.line_at(pos), None, message, index=index)

    def skip_space(self) -> None:
        self.pos = _WHITESPACE.match(self.text, self.pos).end()

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos : self.pos + 1]

    def expect(self, chars: str, what: str) -> str:
        char = self.peek()
        if not char or char not in chars:
            found = repr(char) if char else "end of file"
            raise self.error(self.pos, f"invalid JSON: expected {what}, found {found}")
        self.pos += 1
        return char

    def value(self, index: int | None = None) -> tuple[int, Any]:
        """(line, value) of the JSON value at the position (``index``: its place in the array, for errors)."""
        self.skip_space()
        start = self.pos
        try:
            obj, self.pos = _DECODER.raw_decode(self.text, start)
        except (ValueError, RecursionError) as exc:
            raise self.error(getattr(exc, "pos", start), _json_error(exc), index) from None
        return self.line_at(start), obj

    def elements(self, close: str) -> Iterator[None]:
        """Positions the scanner at each element of the open container until ``close``."""
        if self.peek() == close:
            self.pos += 1
            return
        while True:
            yield
            if self.expect("," + close, f"',' or '{close}'") == close:
                return

    def end(self) -> None:
        self.skip_space()
        if self.pos != len(self.text):
            raise self.error(self.pos, "invalid JSON: extra data after the top-level value")


def _document(path: Path | str, member: str | None, opening: str, what: str) -> _Scanner:
    text, where = read_text(path, member)
    scanner = _Scanner(text.removeprefix("\ufeff"), where)
    scanner.expect(opening, f"a top-level JSON {what}")
    return scanner


def iter_json_array(path: Path | str, member: str | None = None) -> Iterator[tuple[int, Any]]:
    """(line of the element's first character, element) for a file holding one top-level JSON list."""
    scanner = _document(path, member, "[", "list")
    for index, _ in enumerate(scanner.elements("]")):
        yield scanner.value(index)
    scanner.end()


def iter_json_dict(path: Path | str, member: str | None = None) -> Iterator[tuple[int, str, Any]]:
    """(line of the key, key, value) for a file holding one top-level JSON object of records."""
    scanner = _document(path, member, "{", "object")
    for _ in scanner.elements("}"):
        line, key = scanner.value()
        if not isinstance(key, str):
            raise scanner.error(scanner.pos, "invalid JSON: object keys must be strings")
        scanner.expect(":", "':'")
        _, value = scanner.value()
        yield line, key, value
    scanner.end()


def iter_csv(path: Path | str) -> Iterator[tuple[int, dict[str, str]]]:
    """(line the row starts on, {column: cell}) for a CSV file with a header row.

    Quoted cells may span lines; the line reported is the row's first. A row with a different number of
    cells than the header is an error, not a silently padded row.
    """
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    where = str(path)
    text, _ = read_text(path)
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
    header: list[str] | None = None
    end_of_previous = 0
    try:
        for row in reader:
            start, end_of_previous = end_of_previous + 1, reader.line_num
            if not row:
                continue
            if header is None:
                header = row
                continue
            if len(row) != len(header):
                raise RecordError(where, start, None, f"row has {len(row)} cells, the header has {len(header)}")
            yield start, dict(zip(header, row))
    except csv.Error as exc:
        raise RecordError(where, reader.line_num, None, f"invalid CSV: {exc}") from None
    if header is None:
        raise RecordError(where, 1, None, "empty CSV file (no header row)")
