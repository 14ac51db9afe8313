"""`clfjudge score MODEL --input in.jsonl --output out.jsonl`: batch scoring of a JSONL file, streamed in
chunks; and `clfjudge calibrate JUDGE_DIR --source NAME`: fit temperature / tie margin into the judge card.

Input lines are JSON objects: pairs {"id", "question", "answer_a", "answer_b", "rubric"?, "reference"?} for
compare, answers {"id", "question", "answer", ...} for score. Each output line is the input id and the result.
A bad line (invalid JSON, a missing or mistyped field, an input the judge cannot encode) is reported with its
line number and field, written to the rejected file, and scoring goes on; the summary accounts for every line.

No line is lost. After each chunk the output and rejected files are flushed to disk and OUTPUT.progress.json
records the last input line fully accounted for, with the size and SHA-256 of the input read so far and of
both files. A run that stops (the judge or the disk fails, the process is killed) leaves that progress file;
``--resume`` checks that the input and the files still match it, cuts anything written after it (a chunk
that was being written) and goes on from the next line, so the output equals an uninterrupted run's. A run
that finishes removes it.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ..data.records import PairRecord, Record, RecordError
from ..registry import Registry
from ..serving.batch import Chunk, Tally, chunk_lines, reason, rejected_text, row_text, score_chunk
from .common import (
    add_engine_options,
    add_model_input,
    add_provider,
    add_trust_pickle,
    check_local_options,
    ray_engine,
    ray_options,
)

TASKS = ("auto", "compare", "score")
SHOWN_REJECTIONS = 10
PROGRESS_VERSION = 1


def _judge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="auto",
                   help="auto (what the judge card names, else what the directory holds) or a loader: torch, onnx, "
                        "sklearn, generate, or one registered in clfjudge.judges.base.LOADERS")
    add_provider(p)
    p.add_argument("--variant", default=None, help="ONNX file: fp32 | optimized | int8 | a file name "
                                                   "(default: the card's primary)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads of the backend")
    p.add_argument("--batch-size", type=int, default=16, help="records per forward pass")
    add_trust_pickle(p)
    add_model_input(p)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("score", help="score a JSONL file of pairs (compare) or answers (score) with a judge",
                              epilog="exit status: 0 every line scored, 1 some lines rejected (see the rejected "
                                     "file), 2 a usage or input error")
    p.add_argument("model", metavar="MODEL",
                   help="judge directory (trained, exported to ONNX, embedding or generative judge), or a reward "
                        "model without a card (a directory or hf:OWNER/NAME[@REV]: docs/your-model.md)")
    p.add_argument("--input", required=True,
                   help="JSONL input, one pair or answer per line (--engine ray: JSONL or Parquet files: a file, a "
                        "glob or a directory of shards)")
    p.add_argument("--output", required=True,
                   help="JSONL output, one line per scored input line (--engine ray: a directory, one output file "
                        "per input shard)")
    p.add_argument("--rejected", default=None,
                   help="JSONL file of rejected lines with line number, field and error "
                        "(default: OUTPUT.rejected.jsonl; --engine ray: SHARD.rejected.jsonl in the output directory)")
    p.add_argument("--task", default="auto", choices=TASKS,
                   help="compare pairs or score answers (auto: from the judge; a reward judge can do both)")
    p.add_argument("--symmetric", action="store_true", help="judge both answer orders and average (compare)")
    p.add_argument("--chunk-size", type=int, default=512, help="lines held in memory at a time")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from OUTPUT.progress.json (same model, input and options; "
                        "--engine ray resumes by itself: finished shards are skipped)")
    _judge_options(p)
    add_engine_options(p, ENGINES.names(), "local: this process; ray: judge actors on a Ray cluster (Ray Data), "
                                           "one per CPU slot")
    p.set_defaults(func=run_score)

    c = subparsers.add_parser("calibrate", help="fit temperature scaling and an Auto-J tie margin on labelled "
                                                "pairs and store them in judge_card.json")
    c.add_argument("judge_dir", metavar="JUDGE_DIR")
    c.add_argument("--source", required=True, metavar="NAME[:N]",
                   help="labelled pair source (held out from training: not a training or evaluation source)")
    c.add_argument("--n", dest="n_records", type=int, default=512, help="pairs sampled from the source")
    c.add_argument("--seed", type=int, default=0)
    _judge_options(c)
    c.set_defaults(func=run_calibrate)


# -- score --------------------------------------------------------------------------------------------------

class Sink:
    """An output file written in chunks. ``commit`` makes what was written durable and returns the file's state
    (bytes, SHA-256); ``rollback`` cuts the file back to the last commit. Resuming verifies the committed prefix
    of an existing file against a recorded state and cuts what follows it."""

    def __init__(self, path: Path, state: dict[str, Any] | None = None) -> None:
        self.path = path
        if state is None:
            self.file: BinaryIO = open(path, "wb")
            self.hash = hashlib.sha256()
        else:
            if not path.is_file():
                raise FileNotFoundError(f"--resume: {path} is missing; the interrupted run had written "
                                        f"{state['bytes']} bytes to it: start over without --resume")
            self.file = open(path, "r+b")
            self.hash = _verified_prefix(self.file, state, path)
            self.file.truncate(state["bytes"])  # a chunk written after the last commit is not accounted for
            self.file.seek(state["bytes"])
        self.size = self.file.tell()
        self.committed = (self.size, self.hash.copy())

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.hash.update(data)
        self.size += len(data)

    def commit(self) -> dict[str, Any]:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.committed = (self.size, self.hash.copy())
        return {"path": str(self.path), "bytes": self.size, "sha256": self.hash.hexdigest()}

    def rollback(self) -> None:
        self.size, committed = self.committed
        self.hash = committed.copy()
        with contextlib.suppress(OSError, ValueError):  # best effort: --resume cuts the file back anyway
            self.file.seek(self.size)
            self.file.truncate(self.size)
            self.file.flush()

    def close(self) -> None:
        self.file.close()


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


@dataclass
class Progress:
    """The resumable state of a run, written to OUTPUT.progress.json after each chunk (atomically)."""

    path: Path
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
        tmp = self.path.with_name(self.path.name + ".tmp")
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


def _lines(path: Path, start: int = 0, line: int = 0) -> Iterator[tuple[int, str, bytes]]:
    """(line number, text, raw bytes) of each line from byte offset ``start`` (line ``line`` + 1 on)."""
    with open(path, "rb") as f:
        f.seek(start)
        for number, raw in enumerate(f, start=line + 1):
            yield number, raw.decode("utf-8", errors="replace"), raw


def _input_prefix_hash(path: Path, progress: Progress) -> hashlib._Hash:
    """The SHA-256 of the part of the input the interrupted run accounted for; ValueError if it changed."""
    with open(path, "rb") as f:
        try:
            return _verified_prefix(f, {"bytes": progress.input_bytes, "sha256": progress.input_sha256}, path)
        except ValueError:
            raise ValueError(f"--resume: the first {progress.input_bytes} bytes of {path} are not those the "
                             "interrupted run read; the input changed: start over without --resume") from None


def _reject(err: RecordError, tally: Tally, rejected_file: Sink, shown: list[int]) -> None:
    tally.rejected += 1
    tally.reasons[reason(err)] += 1
    rejected_file.write(rejected_text(err).encode())
    if shown[0] < SHOWN_REJECTIONS:
        print(f"rejected {err}", file=sys.stderr)
        shown[0] += 1


def _seen_ids(path: Path, size: int) -> set[str]:
    """The ids in the first ``size`` bytes of an output file (to count duplicates across a resumption)."""
    seen: set[str] = set()
    with open(path, "rb") as f:
        while f.tell() < size:
            seen.add(json.loads(f.readline())["id"])
    return seen


def run_score(args: argparse.Namespace) -> int:
    return ENGINES.get(args.engine)(args)


def run_local(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..judges.base import Judge

    check_local_options(args)
    src, out = Path(args.input), Path(args.output)
    if not src.is_file():
        raise FileNotFoundError(f"input {src} does not exist")
    if args.chunk_size < 1:
        raise ValueError("--chunk-size must be positive")
    rejected_path = Path(args.rejected) if args.rejected else out.with_name(out.name + ".rejected.jsonl")
    progress_path = out.with_name(out.name + ".progress.json")
    # What must be the same to resume (with the same --chunk-size and --batch-size too, the output is byte for
    # byte an uninterrupted run's; other sizes can move scores by float noise only).
    settings = {"model": str(Path(args.model).resolve()), "input": str(src.resolve()), "task": args.task,
                "symmetric": args.symmetric, "rejected": str(rejected_path.resolve()), "backend": args.backend,
                "variant": args.variant}
    progress = Progress.load(progress_path, settings) if args.resume else Progress(progress_path, settings)
    if not args.resume and progress_path.exists():
        print(f"starting over: {progress_path} of an interrupted run is replaced (--resume continues it)",
              file=sys.stderr)
    judge = Judge.load(args.model, backend=args.backend, provider=args.provider, variant=args.variant,
                       threads=args.threads, batch_size=args.batch_size, trust_pickle=args.trust_pickle,
                       model_input=args.model_input)
    task = ("compare" if judge.card.kind == "pair" else "score") if args.task == "auto" else args.task
    judge.require(task)
    if args.symmetric and task != "compare":
        raise ValueError("--symmetric applies to compare, not to score")
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.resume:
        input_hash = _input_prefix_hash(src, progress)
        sink, rejected = Sink(out, progress.files["output"]), Sink(rejected_path, progress.files["rejected"])
        tally, seen = Tally.from_dict(progress.tally), _seen_ids(out, sink.size)
        print(f"resuming after line {progress.line} of {src}", file=sys.stderr)
    else:
        input_hash, sink, rejected, tally, seen = hashlib.sha256(), Sink(out), Sink(rejected_path), Tally(), set()
    shown = [0]

    def checkpoint(line: int, offset: int) -> None:
        """Everything up to ``line`` is on disk: record it (the files first, then the progress that names them)."""
        files = {"output": sink.commit(), "rejected": rejected.commit()}
        progress.advance(line, offset, input_hash.hexdigest(), files, tally.to_dict())

    def flush(chunk: Chunk) -> None:
        for err in chunk.rejections:
            _reject(err, tally, rejected, shown)
        tally.blank += chunk.blank
        if not chunk.records:
            return
        results, errors = score_chunk(judge, task, chunk.records, args.symmetric, str(src))
        for line, row in results:
            tally.count_id(seen, row["id"], line)
        sink.write("".join(map(row_text, (row for _, row in results))).encode())
        tally.scored += len(results)
        for err in errors:
            _reject(err, tally, rejected, shown)

    start_line, offset = progress.line, progress.input_bytes
    line = start_line  # the last line accounted for, also when nothing is left to read

    def numbered(bar) -> Iterator[tuple[int, str]]:
        """The input's lines from the checkpoint on; what has been read is added to the offset and hash."""
        nonlocal line, offset
        for line, text, raw in _lines(src, offset, start_line):
            tally.read += 1
            offset += len(raw)
            input_hash.update(raw)
            bar.update(len(raw))
            yield line, text

    try:
        checkpoint(start_line, offset)
        with tqdm(total=src.stat().st_size, initial=offset, unit="B", unit_scale=True, desc="scoring",
                  file=sys.stderr) as bar:
            for chunk in chunk_lines(numbered(bar), str(src), task, args.chunk_size):
                flush(chunk)
                checkpoint(chunk.last, offset)
            checkpoint(line, offset)
    except BaseException:  # the judge, the disk, Ctrl-C: the files end at the last checkpoint, which says so
        sink.rollback()
        rejected.rollback()
        print(f"clfjudge score: interrupted; lines 1-{progress.line} of {src} are accounted for in {out} and "
              f"{rejected_path} (progress: {progress_path}); run the same command with --resume to go on",
              file=sys.stderr)
        raise
    finally:
        sink.close()
        rejected.close()
    progress_path.unlink()

    if tally.rejected > SHOWN_REJECTIONS:
        print(f"... {tally.rejected - SHOWN_REJECTIONS} more rejections in {rejected_path}", file=sys.stderr)
    if not tally.rejected:
        rejected_path.unlink()
    if tally.duplicate_warning():
        print(tally.duplicate_warning(), file=sys.stderr)
    print(tally.summary())
    print(f"results: {out}" + (f"; rejected lines: {rejected_path}" if tally.rejected else ""))
    return 1 if tally.rejected else 0


def run_ray(args: argparse.Namespace) -> int:
    """`--engine ray`: the input's shards scored by judge actors into the output directory (serving/ray_engine.py)."""
    from ..judges.base import open_card

    for option, given in (("--rejected", args.rejected), ("--resume", args.resume)):
        if given:
            raise ValueError(f"{option} applies to --engine local (--engine ray writes SHARD.rejected.jsonl beside "
                             "each output shard, and a re-run skips finished shards)")
    if args.chunk_size < 1:
        raise ValueError("--chunk-size must be positive")
    threads = args.threads or 1  # per actor, each asking Ray for as many CPUs
    options = ray_options(args, cpus_per_actor=threads)
    engine = ray_engine()
    shards = engine.find_shards(args.input)
    card = open_card(args.model, args.model_input)[1]
    task = ("compare" if card.kind == "pair" else "score") if args.task == "auto" else args.task
    if args.symmetric and task != "compare":
        raise ValueError("--symmetric applies to compare, not to score")
    load = {"backend": args.backend, "provider": args.provider, "variant": args.variant, "threads": threads,
            "batch_size": args.batch_size, "trust_pickle": args.trust_pickle, "model_input": args.model_input}
    # What must be the same for the shards of two runs to be one output (byte for byte what a single run writes).
    settings = {"model": str(Path(args.model).resolve()), "task": task, "symmetric": args.symmetric,
                "backend": args.backend, "variant": args.variant, "chunk_size": args.chunk_size,
                "batch_size": args.batch_size}
    out = Path(args.output)
    tally, rejected = engine.score_shards(str(Path(args.model).resolve()), shards, out, task=task,
                                          symmetric=args.symmetric, chunk_size=args.chunk_size, load=load,
                                          options=options, settings=settings)
    if tally.duplicate_warning():
        print(tally.duplicate_warning(), file=sys.stderr)
    print(tally.summary())
    print(f"results: {out} ({len(shards)} shard(s))" + (f"; rejected lines: {', '.join(map(str, rejected))}"
                                                        if rejected else ""))
    return 1 if tally.rejected else 0


# `clfjudge score --engine NAME`: each engine is ``run(args) -> exit status``; a new engine is one more line.
ENGINES: Registry[Callable[[argparse.Namespace], int]] = Registry("scoring engine")
ENGINES.register("local", run_local)
ENGINES.register("ray", run_ray)


# -- calibrate ----------------------------------------------------------------------------------------------

def labelled_pairs(records: Sequence[Record]) -> tuple[list[PairRecord], Counter]:
    kept, excluded = [], Counter()
    for rec in records:
        if not isinstance(rec, PairRecord):
            excluded[f"{rec.kind} record (calibration needs pairs)"] += 1
        elif rec.verdict is None:
            excluded["pair without a verdict"] += 1
        else:
            kept.append(rec)
    return kept, excluded


def run_calibrate(args: argparse.Namespace) -> int:
    from ..data import sources
    from ..export.onnx import card_sources
    from ..judges.base import Judge, open_card
    from ..judges.calibration import fit_calibration

    judge = Judge.load(args.judge_dir, backend=args.backend, provider=args.provider, variant=args.variant,
                       threads=args.threads, batch_size=args.batch_size, trust_pickle=args.trust_pickle,
                       model_input=args.model_input)
    name, limit = sources.parse_source(args.source)
    if name in card_sources(judge.card):
        print(f"warning: {name} is a training or evaluation source of this judge: calibrating on it makes the "
              "probabilities and its reported metrics optimistic", file=sys.stderr)
    usable = sources.load_usable(args.source, labelled_pairs)
    loaded, pairs, excluded = usable.loaded, usable.records, usable.excluded
    n = limit or args.n_records
    if len(pairs) > n:
        excluded[f"beyond the sample of {n}"] += len(pairs) - n
        pairs = random.Random(args.seed).sample(pairs, n)
    raw_f = judge.raw_outputs(pairs)
    raw_r = judge.raw_outputs([p.swapped() for p in pairs])
    entry = fit_calibration(judge.card.head, raw_f, raw_r, [p.verdict for p in pairs], judge.card.calibration)
    entry["fitted_on"] = {"source": name, "n": len(pairs), "seed": args.seed, "loaded": len(loaded.records),
                          "excluded": dict(excluded), "excluded_by_loader": dict(loaded.excluded),
                          "backend": judge.backend_name}
    card = open_card(args.judge_dir, args.model_input)[1]  # a model without a card gets one, with the calibration
    card.calibration = {**card.calibration, **entry}
    card.save(args.judge_dir)
    print(json.dumps({k: v for k, v in entry.items() if k != "fitted_on"}, indent=2))
    print(f"calibration written to {Path(args.judge_dir) / 'judge_card.json'} ({len(pairs)} pairs of {name})")
    return 0
