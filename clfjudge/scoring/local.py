"""``clfjudge score --engine local``: a file scored in this process, streamed in chunks.

A bad line (invalid JSON, a missing or mistyped field, an input the judge cannot encode) is reported with its
line number and field, written to the rejected file, and scoring goes on; the summary accounts for every line.
After each chunk the output and rejected files are flushed and the progress file records the last line fully
accounted for (``scoring.files``); ``resume`` cuts anything written after it and goes on from the next line, so
the output equals an uninterrupted run's. A run that finishes removes the progress file.
"""
from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..data.formats import ReadOptions
from ..data.records import RecordError
from .batch import Chunk, Tally, chunk_lines, reason, rejected_text, row_text, score_chunk
from .files import Progress, Sink, open_input, seen_ids

SHOWN_REJECTIONS = 10


@dataclass
class ScoreJob:
    """One run of the local engine: the judge (``Judge.load``'s arguments), the files and the reading options."""

    model: str
    input: str
    output: str
    rejected: str | None = None
    task: str = "auto"
    symmetric: bool = False
    chunk_size: int = 512
    resume: bool = False
    backend: str = "auto"
    provider: str = "auto"
    variant: str | None = None
    threads: int | None = None
    batch_size: int = 16
    trust_pickle: bool = False
    model_input: str | None = None  # how a reward model without a card reads (question, answer)
    options: ReadOptions = field(default_factory=ReadOptions)
    format: str | None = None  # as given (recorded in the progress file: a resumed run must read alike)
    columns: str | None = None


def score_file(job: ScoreJob) -> int:
    """Score ``job.input`` into ``job.output`` in this process (the module doc); the exit status: 0 every line
    scored, 1 some lines rejected."""
    from tqdm import tqdm

    from ..judges.base import Judge

    src, out = open_input(job.input), Path(job.output)
    if job.chunk_size < 1:
        raise ValueError("--chunk-size must be positive")
    rejected_path = Path(job.rejected) if job.rejected else out.with_name(out.name + ".rejected.jsonl")
    progress_path = out.with_name(out.name + ".progress.json")
    # What must be the same to resume (with the same --chunk-size and --batch-size too, the output is byte for
    # byte an uninterrupted run's; other sizes can move scores by float noise only).
    settings = {"model": str(Path(job.model).resolve()), "input": src.identity, "task": job.task,
                "symmetric": job.symmetric, "rejected": str(rejected_path.resolve()), "backend": job.backend,
                "variant": job.variant, "format": job.format, "columns": job.columns}
    options = job.options
    progress = Progress.load(progress_path, settings) if job.resume else Progress(progress_path, settings)
    if not job.resume and progress_path.exists():
        print(f"starting over: {progress_path} of an interrupted run is replaced (--resume continues it)",
              file=sys.stderr)
    judge = Judge.load(job.model, backend=job.backend, provider=job.provider, variant=job.variant,
                       threads=job.threads, batch_size=job.batch_size, trust_pickle=job.trust_pickle,
                       model_input=job.model_input)
    task = ("compare" if judge.card.kind == "pair" else "score") if job.task == "auto" else job.task
    judge.require(task)
    if job.symmetric and task != "compare":
        raise ValueError("--symmetric applies to compare, not to score")
    out.parent.mkdir(parents=True, exist_ok=True)
    if job.resume:
        input_hash = src.prefix_hash(progress)
        sink, rejected = Sink(out, progress.files["output"]), Sink(rejected_path, progress.files["rejected"])
        tally, seen = Tally.from_dict(progress.tally), seen_ids(out, sink.size)
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
        results, errors = score_chunk(judge, task, chunk.records, job.symmetric, str(src))
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
        for line, text, raw in src.lines(offset, start_line):
            tally.read += 1
            offset += len(raw)
            input_hash.update(raw)
            bar.update(len(raw))
            yield line, text

    try:
        checkpoint(start_line, offset)
        with tqdm(total=src.total(), initial=offset, unit="B", unit_scale=True, desc="scoring",
                  file=sys.stderr) as bar:
            for chunk in chunk_lines(numbered(bar), str(src), task, job.chunk_size, options):
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


def _reject(err: RecordError, tally: Tally, rejected_file: Sink, shown: list[int]) -> None:
    tally.rejected += 1
    tally.reasons[reason(err)] += 1
    rejected_file.write(rejected_text(err).encode())
    if shown[0] < SHOWN_REJECTIONS:
        print(f"rejected {err}", file=sys.stderr)
        shown[0] += 1
