"""What a batch scoring run reads and writes, so that no line is lost: the input (``open_input``: a JSONL file read
line by line, or a table read by datasets, each row a line), the output and rejected files (``Sink``: appended,
flushed, cut back to the last checkpoint) and the progress file (``Progress``) that records the last input line
fully accounted for with the size and SHA-256 of what was read and written, so that a resumed run continues
exactly where an interrupted one stopped."""
from __future__ import annotations

import codecs
import contextlib
import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ..data.records import Loc, RecordError
from ..outputs import is_stream
from .batch import decode_line

PROGRESS_VERSION = 2  # 2: the output is written to OUTPUT.partial until the run completes


class Sink:
    """An output file written in chunks. ``commit`` makes what was written durable and returns the file's state
    (bytes, SHA-256); ``rollback`` cuts the file back to the last commit. Resuming verifies the committed prefix
    of an existing file against a recorded state and cuts what follows it. A device or FIFO is written as it goes
    (flushed, nothing to sync or cut back); no path: nothing is kept (what is written is printed elsewhere)."""

    def __init__(self, path: Path | None, state: dict[str, Any] | None = None) -> None:
        self.path = path
        self.stream = path is None or is_stream(path)
        if path is None:
            self.file: BinaryIO | None = None
            self.hash = hashlib.sha256()
        elif state is None:
            self.file = open(path, "wb")
            self.hash = hashlib.sha256()
        else:
            if not path.is_file():
                raise FileNotFoundError(f"--resume: {path} is missing; the interrupted run had written "
                                        f"{state['bytes']} bytes to it: start over without --resume")
            self.file = open(path, "r+b")
            self.hash = _verified_prefix(self.file, state, path)
            self.file.truncate(state["bytes"])  # a chunk written after the last commit is not accounted for
            self.file.seek(state["bytes"])
        self.size = 0 if self.stream else self.file.tell()
        self.committed = (self.size, self.hash.copy())

    def write(self, data: bytes) -> None:
        if self.file is not None:
            with self._named():
                self.file.write(data)
        self.hash.update(data)
        self.size += len(data)

    def commit(self) -> dict[str, Any]:
        if self.file is not None:
            with self._named():
                self.file.flush()
        if not self.stream:  # a pipe cannot be synced
            os.fsync(self.file.fileno())
        self.committed = (self.size, self.hash.copy())
        return {"path": str(self.path), "bytes": self.size, "sha256": self.hash.hexdigest()}

    def rollback(self) -> None:
        self.size, committed = self.committed
        self.hash = committed.copy()
        if self.stream:
            return
        with contextlib.suppress(OSError, ValueError):  # best effort: --resume cuts the file back anyway
            self.file.seek(self.size)
            self.file.truncate(self.size)
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):  # a failed write has said why; what is left unwritten is lost anyway
                self.file.close()

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """An OS error of a write names the file (a full device says only "No space left on device")."""
        try:
            yield
        except OSError as exc:
            if exc.filename is not None:
                raise
            raise type(exc)(exc.errno, exc.strerror, str(self.path)) from None


def _verified_prefix(f: BinaryIO, state: dict[str, Any], path: Path) -> hashlib._Hash:
    """The SHA-256 of the first ``state["bytes"]`` bytes of ``f``; ValueError unless they are what was recorded."""
    digest, left = hashlib.sha256(), state["bytes"]
    while left > 0 and (block := f.read(min(left, 1 << 20))):
        digest.update(block)
        left -= len(block)
    if left > 0 or digest.hexdigest() != state["sha256"]:
        found = "is shorter than" if left > 0 else "differs from"
        raise ValueError(f"--resume: {path} {found} what the interrupted run recorded ({state['bytes']} bytes, "
                         f"sha256 {state['sha256'][:12]}...); it was changed since: start over without --resume")
    return digest


def progress_temporary(path: Path) -> Path:
    """Where the progress file is written before it is renamed over the last one."""
    return path.with_name(path.name + ".tmp")


@dataclass
class Progress:
    """The resumable state of a run, written to OUTPUT.progress.json after each chunk (atomically)."""

    path: Path | None  # None: a run that cannot be resumed (its output is a stream): kept in memory alone
    settings: dict[str, Any]  # what must not change between a run and its resumption
    line: int = 0  # last input line accounted for
    input_bytes: int = 0
    input_sha256: str = hashlib.sha256().hexdigest()
    files: dict[str, Any] = field(default_factory=dict)  # "output" / "rejected" -> Sink.commit() state
    tally: dict[str, Any] = field(default_factory=dict)

    def advance(self, line: int, input_bytes: int, input_sha256: str, files: dict[str, Any],
                tally: dict[str, Any]) -> None:
        """Record a new checkpoint: on disk first (atomically), then in memory, so both always agree."""
        data = {"version": PROGRESS_VERSION, "settings": self.settings, "line": line, "input_bytes": input_bytes,
                "input_sha256": input_sha256, "files": files, "tally": tally}
        if self.path is not None:
            tmp = progress_temporary(self.path)
            tmp.write_text(json.dumps(data, indent=1) + "\n")
            os.replace(tmp, self.path)
        self.line, self.input_bytes, self.input_sha256, self.files, self.tally = (line, input_bytes, input_sha256,
                                                                                  files, tally)

    @classmethod
    def load(cls, path: Path, settings: dict[str, Any]) -> Progress:
        if not path.is_file():
            raise FileNotFoundError(f"--resume: no progress file {path} (nothing to resume: a finished run removes "
                                    "it; run without --resume)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") != PROGRESS_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {PROGRESS_VERSION}")
            progress = cls(path, data["settings"], data["line"], data["input_bytes"], data["input_sha256"],
                           data["files"], data["tally"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"--resume: {path} is not a progress file of clfjudge score ({exc})") from None
        changed = {k: (v, settings.get(k)) for k, v in progress.settings.items() if settings.get(k) != v}
        if changed:
            what = "; ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in changed.items())
            raise ValueError(f"--resume: this run differs from the interrupted one ({what}); resume with the same "
                             "model, input and options, or start over without --resume")
        return progress


def _lines(path: Path, start: int = 0, line: int = 0,
           encoding: str = "utf-8") -> Iterator[tuple[int, str | RecordError, bytes]]:
    """(line number, text, raw bytes) of each line from byte offset ``start`` (line ``line`` + 1 on); a line not
    in ``encoding`` comes as its rejection."""
    with open(path, "rb") as f:
        f.seek(start)
        for number, raw in enumerate(f, start=line + 1):
            yield number, decode_line(raw, Loc(str(path), number), start, encoding), raw
            start += len(raw)


def _input_prefix_hash(path: Path, progress: Progress) -> hashlib._Hash:
    """The SHA-256 of the part of the input the interrupted run accounted for; ValueError if it changed."""
    with open(path, "rb") as f:
        try:
            return _verified_prefix(f, {"bytes": progress.input_bytes, "sha256": progress.input_sha256}, path)
        except ValueError:
            raise ValueError(f"--resume: the first {progress.input_bytes} bytes of {path} are not those the "
                             "interrupted run read; the input changed: start over without --resume") from None


@dataclass
class LineInput:
    """A JSONL file, read line by line; a run resumes at a byte offset."""

    path: Path
    encoding: str = "utf-8"
    sample: int | None = None  # "FILE:N": N of its lines (``kept_lines``)

    @property
    def identity(self) -> str:
        return str(self.path.resolve())

    def __str__(self) -> str:
        return str(self.path)

    def total(self) -> int:
        return self.path.stat().st_size

    def lines(self, start: int, line: int) -> Iterator[tuple[int, str | RecordError, bytes]]:
        return _lines(self.path, start, line, self.encoding)

    def prefix_hash(self, progress: Progress) -> hashlib._Hash:
        return _input_prefix_hash(self.path, progress)


@dataclass
class TableInput:
    """A Parquet / CSV / JSON file, a ``save_to_disk`` directory or ``hf:OWNER/NAME[:SPLIT]``, read by 🤗 datasets
    (``data.sources.files``): each row is scored as the JSON object of one line, its row number (from 1) standing
    for the line number; a run resumes after a row, once the rows before it are checked unchanged."""

    spec: str
    sample: int | None = None  # "SPEC:N": N of its rows (``kept_lines``)

    def __post_init__(self) -> None:
        from ..data.sources.files import DataSpec, read_table

        self.data = DataSpec.parse(self.spec)
        self.dataset = read_table(self.data)

    @property
    def identity(self) -> str:
        return str(self.data.path) if self.data.path is not None else self.spec

    def __str__(self) -> str:
        return self.identity

    def total(self) -> None:
        return None  # bytes of the rows' JSON text, not known before they are read

    def lines(self, start: int, line: int) -> Iterator[tuple[int, str, bytes]]:
        for index in range(line, self.dataset.num_rows):
            text = json.dumps(self.dataset[index], ensure_ascii=False, default=str)
            yield index + 1, text, (text + "\n").encode()

    def prefix_hash(self, progress: Progress) -> hashlib._Hash:
        digest, size = hashlib.sha256(), 0
        for _, _, raw in itertools.islice(self.lines(0, 0), progress.line):
            digest.update(raw)
            size += len(raw)
        if (size, digest.hexdigest()) != (progress.input_bytes, progress.input_sha256):
            raise ValueError(f"--resume: the first {progress.line} rows of {self} are not those the interrupted run "
                             "read; the input changed: start over without --resume")
        return digest


TABLE_SUFFIXES = (".parquet", ".csv", ".json", ".gz", ".bz2", ".xz", ".zst")


def check_encoding(encoding: str) -> str:
    """``--encoding``: a codec Python knows that keeps ASCII as it is (the lines are split at the byte \\n and
    read as JSON), else a ValueError."""
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(f"--encoding {encoding}: no such encoding (e.g. utf-8, latin-1, cp1252)") from None
    if '{"\n'.encode(name, errors="replace") != b'{"\n':
        raise ValueError(f"--encoding {encoding}: lines are split at the byte \\n, so only an encoding that writes "
                         "ASCII as ASCII can be read (utf-8, latin-1, cp1252, ...; convert the file first)")
    return name


def open_input(text: str, encoding: str | None = None) -> LineInput | TableInput:
    """What ``--input`` names: a JSONL file (read by lines, in ``encoding``; default UTF-8), else a table that
    datasets reads; "SPEC:N": a seeded sample of N of its non-blank lines (rows), as "name:N" reads N records in
    every command."""
    codec = check_encoding(encoding or "utf-8")
    path = Path(text)
    name, n = input_sample(text)
    if n is not None:
        src = open_input(name, encoding)
        src.sample = n
        return src
    if path.is_file() and path.suffix.lower() not in TABLE_SUFFIXES:
        return LineInput(path, codec)
    if encoding is not None:
        raise ValueError(f"--encoding applies to a JSONL input, not to {text} (read by datasets)")
    if not path.exists() and not text.startswith("hf:"):
        raise FileNotFoundError(f"input {path} does not exist")
    if path.is_dir() and not any((path / name).is_file() for name in SAVED_DATASET):
        raise ValueError(f"--input {text} is a directory: name a data file (JSONL, Parquet, CSV, JSON) or a datasets "
                         "save_to_disk directory (a directory of files is scored with --engine ray)")
    return TableInput(text)


SAVED_DATASET = ("state.json", "dataset_dict.json")  # what datasets' save_to_disk writes in its directory


def input_sample(text: str) -> tuple[str, int | None]:
    """``--input`` without its ":N" and N (None: no sample, or a file whose name ends so)."""
    from ..data.sources import parse_source

    if Path(text).exists():
        return text, None
    try:
        return parse_source(text)
    except ValueError:
        return text, None


def kept_lines(src: LineInput | TableInput) -> set[int] | None:
    """The line (row) numbers a "SPEC:N" input scores: a seeded sample of N of its non-blank lines (as
    ``data.sources.sample`` draws records); None: every line."""
    from ..data.sources import sample

    if src.sample is None:
        return None
    if isinstance(src, TableInput):
        numbers = list(range(1, src.dataset.num_rows + 1))
    else:
        numbers = [number for number, _, raw in _lines(src.path, encoding=src.encoding) if raw.strip()]
    return set(sample(numbers, src.sample, str(src)))


def seen_ids(path: Path, size: int) -> set[str]:
    """The ids in the first ``size`` bytes of an output file (to count duplicates across a resumption)."""
    seen: set[str] = set()
    with open(path, "rb") as f:
        while f.tell() < size:
            seen.add(json.loads(f.readline())["id"])
    return seen
