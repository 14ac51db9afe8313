"""A user's own data as a source: a data spec names it wherever a built-in source name is accepted.

A spec is a path to a JSONL / JSON / Parquet / CSV file (``.gz`` too), a directory written by
``datasets.Dataset.save_to_disk`` (``DIR:SPLIT`` for a ``DatasetDict``), or ``hf:OWNER/NAME[:SPLIT]`` (a hub data
set, read where a hub is reachable). Every one is read by 🤗 ``datasets`` (``load_dataset("json" | "parquet" |
"csv", data_files=...)``, ``load_from_disk``, ``load_dataset(NAME)``); the rows' format is detected from the
columns (``data/formats.py``) or forced. ``UserSource`` is a ``Source``: it loads into the same records, counts
what it excludes by reason, and ``describe`` says what the judge card records (path, content hash, format).

A bad row (missing column, wrong type, an empty question, a label outside the format) is excluded and counted by
reason (an empty answer is kept and counted in the notes, as the built-in sources keep them);
the first few are kept in the notes with file, row and field, and a source with no usable row is an error.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..formats import Format, ReadOptions, detect
from ..records import SHOWN_EXCLUDED, LoadResult, Loc, RecordError
from .base import Source

HUB = "hf:"
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
SHOWN_BAD_ROWS = 10
IDENTICAL = "chosen and rejected answers are identical"


def is_data_spec(name: str) -> bool:
    """Whether a source name is a data spec rather than a built-in name."""
    return name.startswith(HUB) or "/" in name or "\\" in name or Path(name).suffix.lower() in (*BUILDERS,
                                                                                                 *COMPRESSED)


def _builder(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    while suffixes and suffixes[-1] in COMPRESSED:
        suffixes.pop()
    builder = BUILDERS.get(suffixes[-1] if suffixes else "")
    if builder is None:
        raise ValueError(f"data {path}: not a file clfjudge reads (JSONL, JSON, Parquet or CSV, optionally "
                         f"compressed) nor a directory written by datasets' save_to_disk")
    return builder


@dataclass(frozen=True)
class DataSpec:
    text: str  # as the user wrote it (without :N)
    path: Path | None  # a local file or directory
    hub: str | None  # OWNER/NAME
    split: str | None

    @classmethod
    def parse(cls, text: str) -> DataSpec:
        if text.startswith(HUB):
            name, _, split = text[len(HUB):].partition(":")
            if name.count("/") != 1:
                raise ValueError(f"data {text!r}: expected hf:OWNER/NAME[:SPLIT]")
            return cls(text, None, name, split or None)
        path, split = Path(text), None
        if not path.exists() and ":" in text:  # DIR:SPLIT of a DatasetDict saved to disk
            head, _, split = text.rpartition(":")
            path = Path(head)
        if not path.exists():
            raise FileNotFoundError(f"data {text!r}: {path} does not exist")
        return cls(text, path.resolve(), None, split)


@contextlib.contextmanager
def _datasets_quiet() -> Iterator[None]:
    """datasets logs its own error for a file it cannot read ("Failed to load JSON ... in row 6", its rows counted
    from 0), before the exception that clfjudge turns into one error naming the file and line: keep it off the
    console."""
    from datasets.utils import logging as datasets_logging  # its import sets its loggers' level: set ours after

    level = datasets_logging.get_verbosity()
    datasets_logging.set_verbosity(datasets_logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logging.set_verbosity(level)


def _read(spec: DataSpec):
    """The rows of ``spec`` as a ``datasets.Dataset``; a file datasets cannot read is an error naming it."""
    with _datasets_quiet():
        return _load(spec)


def _load(spec: DataSpec):
    import datasets

    where = spec.text
    try:
        if spec.hub is not None:
            return datasets.load_dataset(spec.hub, split=spec.split or "train")
        if spec.path.is_dir():
            loaded = datasets.load_from_disk(str(spec.path))
            if isinstance(loaded, datasets.DatasetDict):
                if spec.split is None and len(loaded) != 1:
                    raise ValueError(f"data {where}: a DatasetDict with splits {list(loaded)}; name one as "
                                     f"{where}:SPLIT")
                return loaded[spec.split or next(iter(loaded))]
            return loaded
        return datasets.load_dataset(_builder(spec.path), data_files=str(spec.path), split="train")
    except (ValueError, FileNotFoundError):
        raise
    except Exception as exc:  # datasets / pyarrow name the problem, not always the file, never the line
        broken = _broken_json(spec.path) if spec.path is not None and _builder(spec.path) == "json" else None
        if broken is not None:
            raise broken from None
        cause = exc.__cause__ or exc
        raise RecordError(str(spec.path or spec.text), None, None,
                          f"cannot be read as a table: {type(cause).__name__}: {cause}") from None


def _broken_json(path: Path) -> RecordError | None:
    """Where a JSON / JSONL file datasets could not read stops being JSON: its first line that is not (a JSON
    document: where the parser stops), as ``clfjudge score`` names it; None if it parses."""
    from ..readers import iter_jsonl, read_text

    if path.suffix.lower() in COMPRESSED and path.suffix.lower() != ".gz":
        return None  # read_text unpacks gzip only
    try:
        text, where = read_text(path)
        try:
            json.loads(text)
            return None
        except json.JSONDecodeError as exc:
            if text.lstrip().startswith("["):  # one JSON document (an array): its own position
                return RecordError(where, exc.lineno, None, f"invalid JSON: {exc.msg} (column {exc.colno})")
        for _ in iter_jsonl(path):
            pass
    except RecordError as err:
        return err
    return None


def content_hash(spec: DataSpec, dataset) -> str:
    """SHA-256 of the file's bytes (of a directory: its files' names and bytes), or the hub data set's fingerprint."""
    if spec.path is None:
        return f"fingerprint:{dataset._fingerprint}"
    digest = hashlib.sha256()
    files = [spec.path] if spec.path.is_file() else sorted(p for p in spec.path.rglob("*") if p.is_file())
    for file in files:
        if spec.path.is_dir():
            digest.update(file.relative_to(spec.path).as_posix().encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class UserSource(Source):
    """A user's data set as a source (``resolve_user``); loads through ``datasets``, records named ``name``."""

    spec: DataSpec | None = None
    options: ReadOptions = field(default_factory=ReadOptions)
    format: Format | None = None
    columns: tuple[tuple[str, str], ...] = ()  # field -> column, as detected or given
    labelled: bool = True  # False: rows without a label are records too (a pool a teacher labels)

    def path(self, root: Path | None = None) -> Path:
        return self.spec.path if self.spec.path is not None else Path(self.spec.text)

    def available(self, root: Path | None = None) -> bool:
        return True  # resolve_user has opened it

    def load(self, path: Path | str | None = None) -> LoadResult:
        return load_rows(self, _dataset(self.spec))

    def describe(self) -> dict[str, Any]:
        """What a judge card records about this data."""
        dataset = _dataset(self.spec)
        return {"spec": self.spec.text, "path": str(self.spec.path) if self.spec.path else None,
                "hub": self.spec.hub, "split": self.spec.split, "sha256": content_hash(self.spec, dataset),
                "rows": dataset.num_rows, "format": self.format.name, "columns": dict(self.columns),
                **({"scale": list(self.options.scale)} if self.options.scale else {})}


def _stamp(spec: DataSpec) -> tuple:
    """What changes when the data does (size and modification time of its files): the read cache's key."""
    if spec.path is None:
        return ()
    files = [spec.path] if spec.path.is_file() else sorted(p for p in spec.path.rglob("*") if p.is_file())
    return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)


@functools.lru_cache(maxsize=16)
def _read_cached(spec: DataSpec, stamp: tuple):
    return _read(spec)


def _dataset(spec: DataSpec):
    """The data set ``spec`` names, read once per process while its files stay unchanged."""
    return _read_cached(spec, _stamp(spec))


def read_table(spec: DataSpec):
    """The rows ``spec`` names, as a ``datasets.Dataset`` (a bad file is an error naming it)."""
    return _dataset(spec)


def resolve_user(text: str, options: ReadOptions = ReadOptions(), labelled: bool = True) -> UserSource:
    """The source a data spec names (its format detected from the columns unless ``options`` force it)."""
    spec = DataSpec.parse(text)
    dataset = _dataset(spec)
    fmt = detect(dataset.column_names, options, labelled, text)
    columns = fmt.column_map(dataset.column_names, options)
    if labelled and fmt.check_table is not None:
        fmt.check_table(dataset, columns, str(spec.path or text))
    return UserSource(name=text, arity=fmt.arity, role="user", default_path=str(spec.path or text), loader=None,
                      description=f"{fmt.name} rows from {text}", tags=("user",), fixed_order=fmt.chosen_first,
                      spec=spec, options=options, format=fmt, columns=tuple(sorted(columns.items())),
                      labelled=labelled)


def load_rows(source: UserSource, dataset) -> LoadResult:
    """Every row -> a record; bad rows are counted by reason (the first ones named in the notes), never dropped
    silently; no usable row at all is an error."""
    file = str(source.spec.path or source.spec.text)
    records, excluded, bad, seen = [], Counter(), [], {}
    columns = dict(source.columns)
    stem = Path(file).name if source.spec.path is not None else source.spec.text
    for index, values in enumerate(dataset):
        loc = Loc(file, index + 1)
        try:
            record = source.format.record(values, loc, columns, source.options, source.labelled, source.name,
                                          default_id=f"{stem}:{index + 1}")
        except RecordError as err:
            excluded[f"bad row: {_reason(err)}"] += 1
            if len(bad) < SHOWN_BAD_ROWS:
                bad.append(str(err))
            continue
        if record.id in seen:
            excluded["duplicate id"] += 1
            if len(bad) < SHOWN_BAD_ROWS:
                bad.append(f"{file}:{index + 1}: field 'id': duplicate id {record.id!r} (first at row "
                           f"{seen[record.id]})")
            continue
        seen[record.id] = index + 1
        if getattr(record, "answer_a", None) is not None and record.answer_a == record.answer_b:
            excluded[IDENTICAL] += 1
            if len(bad) < SHOWN_BAD_ROWS:
                bad.append(f"{file}:{index + 1}: field 'answer_b': {IDENTICAL}")
            continue
        records.append(record)
    answers = (a for r in records for a in ((r.answer_a, r.answer_b) if r.arity == "pair" else (r.answer,)))
    empty = sum(not a.strip() for a in answers)
    notes = ([f"rows are numbered from 1 (a CSV's header row is not counted): {file}"] if bad else []) + bad
    if excluded:
        notes.append(f"{sum(excluded.values())} row(s) excluded: {dict(excluded)}")
    if empty:
        notes.append(f"{empty} empty answer(s) kept (a model can answer nothing)")
    if not records:
        raise RecordError(file, None, None, f"no usable row in {dataset.num_rows} ({dict(excluded)}); first "
                                            f"problems: {bad[:3]}")
    return LoadResult(records, excluded, notes, examples=bad[:SHOWN_EXCLUDED])


def _reason(err: RecordError) -> str:
    """A bad row's reason without its value (so that rows with the same problem count together)."""
    message = err.message.split(", got ")[0].split(": ")[0]
    return f"field {err.field!r}: {message}" if err.field else message
