"""`clfjudge score --engine ray`: batch scoring on a Ray cluster (Ray Data), resumable shard by shard.

The input is a set of shards (JSONL or Parquet files: a file, a glob or a directory). Ray Data reads them with
``ChunkSource``, which cuts each shard into the chunks the single-process scorer would make of it
(``batch.chunk_lines``); ``map_batches`` sends one chunk at a time to a pool of ``JudgeActor``s, each of which
loads the judge once (one actor per CPU slot, or per GPU share); the driver writes what comes back, in input order,
one output file per shard. So each shard's output is byte for byte what ``clfjudge score`` writes for that file
alone, with the same --chunk-size and --batch-size.

Exactly once: a shard's output and rejected lines go to temporary files, and are renamed into place once the
shard's last chunk is in (its tally in ``.clfjudge/``, the output renamed last: its presence marks the shard
done). A run that stops leaves finished shards and temporary files; the same command again skips the finished
shards and scores the others from their start, so the output directory ends up as an uninterrupted run's.

``map_on_actors`` is the same actor pool for callers with whole calls rather than shards: each actor builds its
state once (a judge loaded once) and runs one call at a time (``clfjudge audit --engine ray``: one test set's
predictions per call).

Imports Ray: only ``--engine ray`` (``clfjudge score``, ``clfjudge audit``), or a caller of ``score_shards`` or
``map_on_actors``, imports this module.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
from ray.data.datasource import FileBasedDatasource

from ..data.records import Loc, RecordError
from ..options import LoadOptions
from ..outputs import SamePathError, check_apart
from .batch import Chunk, Tally, chunk_lines, decode_line, reason, rejected_text, row_text, score_chunk

FORMATS = {".jsonl": "jsonl", ".parquet": "parquet"}
STATE_DIR = ".clfjudge"  # in the output directory: the run's settings and each finished shard's tally
SHOWN_REJECTIONS = 10
# Parquet column types whose values JSON represents as they are (a row is read as the JSON object of its columns)
_JSON_TYPES = ("is_string", "is_large_string", "is_integer", "is_floating", "is_boolean", "is_null", "is_list",
               "is_large_list", "is_struct")


@dataclass(frozen=True)
class Shard:
    path: str  # absolute
    name: str  # output name: the path relative to the input's root, without its suffix
    format: str  # "jsonl" | "parquet"


def find_shards(spec: str) -> list[Shard]:
    """The shards of ``--input``: a JSONL or Parquet file, a glob of them, or a directory (searched recursively;
    files of other kinds in it are left out, and said so)."""
    path = Path(spec)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        kept = [p for p in files if p.suffix in FORMATS]
        if len(kept) < len(files):
            print(f"{len(files) - len(kept)} file(s) under {path} are not .jsonl or .parquet and are not read, "
                  f"e.g. {[p.name for p in files if p.suffix not in FORMATS][:3]}", file=sys.stderr)
        root = path
    elif glob.has_magic(spec):
        files = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
        kept = files
        root = Path(os.path.commonpath([p.parent.resolve() for p in files])) if files else None
    elif path.is_file():
        files = kept = [path]
        root = path.parent
    else:
        raise FileNotFoundError(f"input {spec} does not exist")
    if not kept:
        raise FileNotFoundError(f"input {spec}: no .jsonl or .parquet file")
    shards = []
    for p in kept:
        if p.suffix not in FORMATS:
            raise ValueError(f"input {p}: expected a .jsonl or .parquet file")
        name = p.resolve().relative_to(root.resolve()).with_suffix("").as_posix()
        shards.append(Shard(str(p.resolve()), name, FORMATS[p.suffix]))
    names = [s.name for s in shards] + [s.name + ".rejected" for s in shards]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ValueError(f"input {spec}: two shards would write the same output file ({clashes[0]}.jsonl); "
                         "rename one")
    for shard in shards:
        if shard.format == "parquet":
            _check_parquet_schema(shard.path)
    return shards


def _check_parquet_schema(path: str) -> None:
    import pyarrow.parquet as pq

    for f in pq.read_schema(path):
        if not any(getattr(pa.types, test)(f.type) for test in _JSON_TYPES):
            raise ValueError(f"{path}: column {f.name!r} is {f.type}; clfjudge reads Parquet columns of strings, "
                             "numbers, booleans, lists and structs (a row is read as the JSON object of its columns)")


# -- reading: shards -> chunks ----------------------------------------------------------------------------

def _jsonl_lines(f: pa.NativeFile) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of a byte stream split at b"\\n" only, as the single-process scorer reads a file."""
    rest, number = b"", 0
    while block := f.read(1 << 20):
        parts = (rest + block).split(b"\n")
        rest = parts.pop()
        for raw in parts:
            number += 1
            yield number, raw + b"\n"
    if rest:
        yield number + 1, rest


def _parquet_lines(f: pa.NativeFile) -> Iterator[tuple[int, bytes]]:
    """(row number, the row as a JSON object, in UTF-8) of a Parquet file, row group by row group."""
    import pyarrow.parquet as pq

    number = 0
    pf = pq.ParquetFile(f)
    for group in range(pf.num_row_groups):
        for row in pf.read_row_group(group).to_pylist():
            number += 1
            yield number, json.dumps(row).encode()


_LINES = {"jsonl": _jsonl_lines, "parquet": _parquet_lines}
CHUNK_SCHEMA = pa.schema([("file", pa.string()), ("first", pa.int64()), ("last", pa.int64()),
                          ("final", pa.bool_()), ("offset", pa.int64()), ("lines", pa.list_(pa.binary()))])


def _decoded(path: str, first: int, offset: int, lines: Iterable[bytes]) -> Iterator[tuple[int, str | RecordError]]:
    """Numbered lines of ``path`` from line ``first`` (at byte ``offset``) as text, or as the rejection of a line
    that is not UTF-8 (``batch.decode_line``), on the reader's side and the actors' alike."""
    for number, raw in enumerate(lines, start=first):
        yield number, decode_line(raw, Loc(path, number), offset)
        offset += len(raw)


class ChunkSource(FileBasedDatasource):
    """Ray Data source: one row per chunk of a shard (file, first and last line, whether it is the shard's last
    chunk, the lines' text). The chunks are cut as ``chunk_lines`` cuts them, so their records match the
    single-process scorer's calls to the judge; a shard with no line is one empty final chunk."""

    def __init__(self, shards: Sequence[Shard], task: str, chunk_size: int) -> None:
        super().__init__([s.path for s in shards])
        self.formats = {s.path: s.format for s in shards}
        self.task, self.chunk_size = task, chunk_size

    def _open_input_source(self, filesystem, path: str, **open_args) -> pa.NativeFile:
        if self.formats[path] == "parquet":  # Parquet needs random access, not a stream
            return filesystem.open_input_file(path)
        return super()._open_input_source(filesystem, path, **open_args)

    def _read_stream(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        texts: list[bytes] = []
        offset = [0, 0]  # where the current chunk starts, where the next line starts

        def numbered() -> Iterator[tuple[int, str | RecordError]]:
            for number, raw in _LINES[self.formats[path]](f):
                texts.append(raw)
                offset[1] += len(raw)  # before the yield: a chunk is cut while its last line's yield is pending
                yield from _decoded(path, number, offset[1] - len(raw), [raw])

        # One chunk per block, so that the chunks of one shard spread over the actors. A chunk is yielded once
        # the next one is cut (or the shard ends): only then is it known whether it is the shard's last.
        previous: tuple[Chunk, int, list[bytes]] | None = None
        for chunk in chunk_lines(numbered(), path, self.task, self.chunk_size):
            if previous is not None:
                yield self._block(path, *previous, final=False)
            previous = chunk, offset[0], texts[:]
            offset[0] = offset[1]
            texts.clear()
        yield self._block(path, *(previous or (Chunk(first=1, last=0), 0, [])), final=True)

    @staticmethod
    def _block(path: str, chunk: Chunk, offset: int, texts: list[bytes], final: bool) -> pa.Table:
        return pa.Table.from_pylist([{"file": path, "first": chunk.first, "last": chunk.last, "final": final,
                                      "offset": offset, "lines": texts}], schema=CHUNK_SCHEMA)


# -- scoring: chunks -> rows ------------------------------------------------------------------------------

RESULT_SCHEMA = pa.schema([("file", pa.string()), ("first", pa.int64()), ("last", pa.int64()),
                           ("final", pa.bool_()), ("rows", pa.string()), ("rejected", pa.string()),
                           ("tally", pa.string())])


class JudgeActor:
    """A Ray actor that holds the judge (loaded once) and scores chunks: each comes back as its output lines, its
    rejected lines (file, line, field, error) and its tally, as ``clfjudge score`` writes and counts them."""

    def __init__(self, model: str, load: LoadOptions, task: str, symmetric: bool, chunk_size: int) -> None:
        from ..judges.base import load_ready

        self.judge = load_ready(model, load)  # a judge that cannot score fails the actor, not every line
        self.judge.require(task)
        self.task, self.symmetric, self.chunk_size = task, symmetric, chunk_size

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.Table.from_pylist([self.score(row) for row in batch.to_pylist()], schema=RESULT_SCHEMA)

    def score(self, row: dict[str, Any]) -> dict[str, Any]:
        path, texts = row["file"], row["lines"]
        chunks = list(chunk_lines(_decoded(path, row["first"], row["offset"], texts), path, self.task,
                                  self.chunk_size))
        if len(chunks) > 1:  # the reader cut it with the same rule; two chunks here would be a bug
            raise RuntimeError(f"{path}: lines {row['first']}-{row['last']} hold more than one chunk")
        tally, out, rejected = Tally(read=len(texts)), [], []
        for chunk in chunks:
            tally.blank += chunk.blank
            errors = list(chunk.rejections)
            if chunk.records:
                results, judge_errors = score_chunk(self.judge, self.task, chunk.records, self.symmetric, path)
                out = [row_text(r) for _, r in results]
                errors += judge_errors
            tally.scored, tally.rejected = len(out), len(errors)
            tally.reasons.update(reason(e) for e in errors)
            rejected = [rejected_text(e, with_file=True) for e in errors]
        return {**{k: row[k] for k in ("file", "first", "last", "final")}, "rows": "".join(out),
                "rejected": "".join(rejected), "tally": json.dumps(tally.to_dict())}


# -- writing: rows -> shard files, renamed when complete ---------------------------------------------------

@dataclass
class Layout:
    """Where a shard's files go in the output directory."""

    out: Path

    def output(self, shard: Shard) -> Path:
        return self.out / f"{shard.name}.jsonl"

    def rejected(self, shard: Shard) -> Path:
        return self.out / f"{shard.name}.rejected.jsonl"

    def state(self, shard: Shard) -> Path:
        return self.out / STATE_DIR / f"{shard.name}.json"

    @staticmethod
    def temporary(path: Path) -> Path:
        return path.with_name(f".{path.name}.tmp")


def check_layout(spec: str, shards: Sequence[Shard], out: Path) -> None:
    """Before anything is written: no shard's output or rejected file is an input shard (``outputs.check_apart``),
    and the output directory is not inside the input directory, where a re-run would read the outputs as shards."""
    layout = Layout(out)
    check_apart([("an input shard", s.path) for s in shards],
                [(role, path) for s in shards
                 for role, path in (("an output file", layout.output(s)), ("a rejected file", layout.rejected(s)))])
    root, where = Path(spec).resolve(), out.resolve()
    if Path(spec).is_dir() and (where == root or root in where.parents):
        raise SamePathError(f"--output {out} is inside --input {spec}: a re-run would read the outputs as input "
                            "shards; name a directory outside it")


def _write_atomically(path: Path, text: str) -> None:
    tmp = Layout.temporary(path)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter:
    """One shard's output and rejected lines, written to temporary files and renamed into place by ``commit``."""

    def __init__(self, shard: Shard, layout: Layout) -> None:
        self.shard, self.layout = shard, layout
        self.paths = [layout.output(shard), layout.rejected(shard)]
        for p in self.paths:
            p.parent.mkdir(parents=True, exist_ok=True)
        self.files = [open(Layout.temporary(p), "wb") for p in self.paths]
        self.tally = Tally()
        self.next_line = 1

    def add(self, row: dict[str, Any]) -> list[str]:
        """Append a scored chunk (chunks come in input order: a gap or a repeat would lose or double lines)."""
        if row["first"] != self.next_line:
            raise RuntimeError(f"{self.shard.path}: chunk of lines {row['first']}-{row['last']} arrived when line "
                               f"{self.next_line} was expected; the output of this shard is not written")
        self.next_line = row["last"] + 1
        self.files[0].write(row["rows"].encode())
        self.files[1].write(row["rejected"].encode())
        self.tally.add(Tally.from_dict(json.loads(row["tally"])))
        return row["rejected"].splitlines()

    def commit(self, source: dict[str, Any]) -> None:
        """The shard is complete: make its files durable, then rename them into place, the output last.
        ``source``: the input's ``input_digest`` as it was scored."""
        for f in self.files:
            f.flush()
            os.fsync(f.fileno())
            f.close()
        output, rejected = self.paths
        if self.tally.rejected:
            os.replace(Layout.temporary(rejected), rejected)
        else:
            Layout.temporary(rejected).unlink()
            rejected.unlink(missing_ok=True)
        state = self.layout.state(self.shard)
        state.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(state, json.dumps({"input": self.shard.path, **source, "tally": self.tally.to_dict()},
                                            indent=1) + "\n")
        os.replace(Layout.temporary(output), output)
        _fsync_dir(output.parent)

    def abandon(self) -> None:
        for f in self.files:
            f.close()


def input_digest(path: str) -> dict[str, Any]:
    """What identifies an input file's content: its size and SHA-256 (the single-process scorer's --resume
    checks the same)."""
    with open(path, "rb") as f:
        return {"bytes": os.fstat(f.fileno()).st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def _finished(shard: Shard, layout: Layout) -> Tally | None:
    """The tally of a shard an earlier run finished, or None; an error if its input changed since (size and
    SHA-256; a state written before the hash was recorded is checked by size)."""
    state_path = layout.state(shard)
    if not layout.output(shard).is_file() or not state_path.is_file():
        return None
    state = json.loads(state_path.read_text(encoding="utf-8"))
    now = input_digest(shard.path)
    if state["input"] != shard.path or any(state[k] != now[k] for k in now if k in state):
        was = f"{state['bytes']} bytes" + (f", sha256 {state['sha256'][:12]}..." if "sha256" in state else "")
        raise ValueError(f"{layout.output(shard)} was scored from {state['input']} ({was}), not from {shard.path} "
                         f"({now['bytes']} bytes, sha256 {now['sha256'][:12]}...): remove it (and {state_path}) "
                         "to score this shard again, or use another output directory")
    return Tally.from_dict(state["tally"])


def _check_settings(layout: Layout, settings: dict[str, Any]) -> None:
    """The output directory holds one run's output: a re-run must use the same judge and options."""
    path = layout.out / STATE_DIR / "settings.json"
    if path.is_file():
        before = json.loads(path.read_text(encoding="utf-8"))
        changed = {k: (v, settings.get(k)) for k, v in before.items() if settings.get(k) != v}
        if changed and not any(p.name != path.name for p in path.parent.rglob("*.json")):
            changed = {}  # no shard was finished with the old settings: nothing to keep consistent with
            _write_atomically(path, json.dumps(settings, indent=1) + "\n")
        if changed:
            what = "; ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in changed.items())
            raise ValueError(f"{layout.out} holds the output of a run with other settings ({what}); re-run with the "
                             "same judge and options to finish it, or use another output directory")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, json.dumps(settings, indent=1) + "\n")


# -- the run ----------------------------------------------------------------------------------------------

@dataclass
class RayOptions:
    address: str | None = None  # None: a Ray instance already started in this process, else RAY_ADDRESS, else local
    actors: int | None = None  # None: one per CPU of the cluster (or per GPU share with gpus_per_actor)
    gpus_per_actor: float = 0.0
    cpus_per_actor: float = 1.0


_started_locally = False  # whether the Ray instance in use was started here (it has this machine and cannot grow)
CLIENT_TRIES = 4  # connecting through Ray Client (ray://): tries, 2, 4, 6 s apart


def _connect(address: str | None) -> bool:
    """Connect to Ray (or start a local instance); True if this call did, so the caller shuts it down."""
    global _started_locally
    if ray.is_initialized():
        return False
    local = {"include_dashboard": False} if address is None and "RAY_ADDRESS" not in os.environ else {}
    target = address if address is not None else os.environ.get("RAY_ADDRESS", "")
    tries = CLIENT_TRIES if target.startswith("ray://") else 1
    for attempt in range(1, tries + 1):
        try:
            ray.init(address=address, logging_level="warning", log_to_driver=False, **local)
            break
        except Exception as e:  # noqa: BLE001 - Ray's client raises bare Exceptions; retried, then one line
            # a loaded head can fail to start the client's own server process at first (it then says so)
            with contextlib.suppress(Exception):
                ray.shutdown()
            if attempt == tries:
                reason = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
                raise ConnectionError(f"cannot connect to Ray at {target} after {tries} "
                                      f"{'try' if tries == 1 else 'tries'}: {reason}") from None
            time.sleep(2 * attempt)
    _started_locally = bool(local)
    return True


@contextlib.contextmanager
def connected(address: str | None) -> Iterator[None]:
    """Ray for the block (``_connect``); a local instance started for it is shut down after it."""
    global _started_locally
    started = _connect(address)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
            _started_locally = False


def check_not_ray_client(address: str | None) -> None:
    """Ray Data, which the scoring runs on, does not work through Ray Client (ray-project/ray#42739): refuse a
    ``ray://`` address (given or in RAY_ADDRESS) before anything starts, instead of failing inside Ray."""
    given = address if address is not None else os.environ.get("RAY_ADDRESS", "")
    if given.startswith("ray://"):
        where = "--address" if address is not None else "RAY_ADDRESS"
        raise ValueError(f"{where} {given}: clfjudge score --engine ray runs on Ray Data, which does not work "
                         "through Ray Client (ray://). Run it on a node of the cluster (--address auto, or "
                         "HEAD_IP:6379), or submit it there as a Ray job (ray job submit -- clfjudge score ...); "
                         "clfjudge audit --engine ray does work through ray://")


def _pool_size(options: RayOptions, calls: int | None = None) -> int:
    """How many actors to start (at most ``calls``), checked against what the cluster has (``check_placeable``)."""
    resources = ray.cluster_resources()
    if options.actors is not None:
        if options.actors < 1:
            raise ValueError("--actors must be positive")
        size = options.actors
    else:
        per = ("GPU", options.gpus_per_actor) if options.gpus_per_actor else ("CPU", options.cpus_per_actor)
        size = max(1, int(resources.get(per[0], 0) // per[1]))
    size = size if calls is None else min(size, calls)
    check_placeable(size, options, resources, can_grow=not _started_locally)
    return size


def check_placeable(size: int, options: RayOptions, resources: dict[str, float], can_grow: bool) -> None:
    """Ray waits, without a timeout, for resources to place an actor. Asking for more than the cluster has is an
    error on a local instance started here (it cannot grow) and a warning on a cluster (an autoscaler may add
    nodes; until then the run waits)."""
    need = {"CPU": size * options.cpus_per_actor, "GPU": size * options.gpus_per_actor}
    short = [f"{need[k]:g} {k}s (the cluster has {resources.get(k, 0):g})" for k in need
             if need[k] > resources.get(k, 0) + 1e-9]
    if not short:
        return
    message = f"{size} actor(s) need {' and '.join(short)}"
    if not can_grow:
        raise ValueError(f"{message}: a local Ray instance cannot place them; ask for fewer --actors (or fewer "
                         "CPUs / GPUs per actor)")
    print(f"warning: {message}; Ray waits until the cluster can place them", file=sys.stderr)


def score_shards(model: str, shards: Sequence[Shard], out: Path, *, task: str, symmetric: bool, chunk_size: int,
                 load: LoadOptions, options: RayOptions, settings: dict[str, Any]) -> tuple[Tally, list[Path]]:
    """Score the shards not yet finished in ``out``; the tally of every shard and the rejected files there."""
    check_not_ray_client(options.address)
    layout = Layout(out)
    out.mkdir(parents=True, exist_ok=True)
    _check_settings(layout, settings)
    done = {s: t for s in shards if (t := _finished(s, layout)) is not None}
    todo = [s for s in shards if s not in done]
    if done:
        print(f"{len(done)} of {len(shards)} shard(s) finished by an earlier run: skipped", file=sys.stderr)
    if todo:
        with connected(options.address):
            _run(model, todo, layout, task=task, symmetric=symmetric, chunk_size=chunk_size, load=load,
                 options=options)
    total = Tally()
    for shard in shards:
        total.add(_finished(shard, layout))
    seen: set[str] = set()
    for shard in shards:  # duplicate ids over the whole output, as the single-process scorer counts them
        with open(layout.output(shard), encoding="utf-8") as f:
            for line in f:
                total.count_id(seen, json.loads(line)["id"], layout.output(shard).name)
    return total, [layout.rejected(s) for s in shards if layout.rejected(s).is_file()]


def _actor_start_errors(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The rows; if the judge actors cannot start (a judge that cannot do the task, a backend or provider it does
    not have), a ValueError with the error the judge raised: ``clfjudge`` says it in one line and exits with 2.
    Ray keeps only its text (the last line of the actor's traceback), not the exception."""
    try:
        yield from rows
    except ray.exceptions.ActorDiedError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        if "creation task" not in str(exc) or not lines:
            raise
        raise ValueError(f"the judge actors could not start: {lines[-1]}") from exc


def _run(model: str, shards: Sequence[Shard], layout: Layout, *, task: str, symmetric: bool, chunk_size: int,
         load: LoadOptions, options: RayOptions) -> None:
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # each shard's chunks reach the driver in line order
    size = _pool_size(options)
    print(f"scoring {len(shards)} shard(s) with {size} judge actor(s) on Ray", file=sys.stderr)
    sources = {s.path: input_digest(s.path) for s in shards}  # each input as the run starts, before any is read
    # Reading and cutting chunks is light next to judging them: the read tasks take no CPU slot, so that every
    # slot can hold an actor (a read task waiting for a slot the actors hold would stall the pipeline).
    ds = ray.data.read_datasource(ChunkSource(shards, task, chunk_size), num_cpus=0)
    ds = ds.map_batches(JudgeActor, batch_size=1, batch_format="pyarrow",
                        compute=ray.data.ActorPoolStrategy(size=size),
                        fn_constructor_kwargs={"model": model, "load": load, "task": task, "symmetric": symmetric,
                                               "chunk_size": chunk_size},
                        num_cpus=options.cpus_per_actor, num_gpus=options.gpus_per_actor or None)
    by_path = {s.path: s for s in shards}
    writers: dict[str, ShardWriter] = {}
    shown = 0
    try:
        for row in _actor_start_errors(ds.iter_rows()):
            path = row["file"]
            writer = writers.get(path)
            if writer is None:
                writer = writers[path] = ShardWriter(by_path[path], layout)
            for line in writer.add(row):
                if shown < SHOWN_REJECTIONS:
                    rejected = json.loads(line)
                    print(f"rejected {RecordError(path, rejected['line'], rejected['field'], rejected['error'])}",
                          file=sys.stderr)
                    shown += 1
            if row["final"]:
                now = input_digest(path)
                if now != sources[path]:  # the lines scored are not all from one version of the file
                    raise ValueError(f"{path} changed while it was scored ({sources[path]['bytes']} bytes, then "
                                     f"{now['bytes']}); its output is not written: score it again")
                writer.commit(now)
                del writers[path]
    finally:
        for writer in writers.values():  # unfinished shards keep their temporary files; the next run redoes them
            writer.abandon()
    if writers:
        raise RuntimeError(f"Ray Data ended before the last chunk of {sorted(writers)}; they are not written")


# -- whole calls on judge actors (clfjudge audit --engine ray) ----------------------------------------------

class _Holder:
    """A Ray actor that holds ``build(**kwargs)`` (a judge, loaded once) and runs ``work(state, *call)``."""

    def __init__(self, build: Callable[..., Any], kwargs: dict[str, Any], work: Callable[..., Any]) -> None:
        self.state, self.work = build(**kwargs), work

    def run(self, index: int, call: tuple) -> tuple[int, Any]:
        return index, self.work(self.state, *call)


def _task_errors(results: Iterator[Any]) -> Iterator[Any]:
    """The results; an error a call raised on an actor is raised here as itself (a ValueError stays one, so
    ``clfjudge`` says it in one line), with the actor's traceback as a note."""
    try:
        yield from results
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if not isinstance(cause, Exception) or isinstance(cause, ray.exceptions.RayError):
            raise
        cause.add_note(f"raised on a Ray actor: {exc}")
        raise cause from None


def map_on_actors(build: Callable[..., Any], kwargs: dict[str, Any], work: Callable[..., Any],
                  calls: Sequence[tuple], options: RayOptions, what: str) -> Iterator[tuple[int, Any]]:
    """``work(build(**kwargs), *call)`` for each call, on a pool of actors that each run ``build`` once (as
    ``JudgeActor`` loads its judge once) and take one call at a time, in the order given as actors come free;
    yields (the call's index, its result) as calls finish. Ray must be connected (``connected``). ``build`` and
    ``work`` go to the actors by reference (module-level functions or classes). A call that raises stops the
    run with its error (``_task_errors``), an actor that cannot start with the error ``build`` raised."""
    if not calls:
        return
    size = _pool_size(options, len(calls))
    print(f"{what}: {len(calls)} call(s) on {size} actor(s) on Ray", file=sys.stderr)
    holder = ray.remote(_Holder).options(num_cpus=options.cpus_per_actor, num_gpus=options.gpus_per_actor)
    actors = [holder.remote(build, kwargs, work) for _ in range(size)]
    pool = ray.util.ActorPool(actors)
    try:
        for index, call in enumerate(calls):
            pool.submit(lambda actor, value: actor.run.remote(*value), (index, call))

        def results() -> Iterator[tuple[int, Any]]:
            while pool.has_next():
                yield pool.get_next_unordered()

        yield from _actor_start_errors(_task_errors(results()))
    finally:
        for actor in actors:
            ray.kill(actor)
