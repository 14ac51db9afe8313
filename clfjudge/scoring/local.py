"""``clfjudge score --engine local``: a file scored in this process, streamed in chunks.

A bad line (invalid JSON, a missing or mistyped field, an input the judge cannot encode) is reported with its
line number and field, written to the rejected file, and scoring goes on; the summary accounts for every line.
The output and rejected files are written as OUTPUT.partial and REJECTED.partial, renamed into place when the run
completes, so a run that stops leaves earlier files of those names as they were. After each chunk the partial
files are flushed and the progress file records the last line fully accounted for (``scoring.files``);
``resume`` cuts anything written after it and goes on from the next line, so the output equals an uninterrupted
run's. A run that finishes removes the progress file. No file the run writes may be one it reads (``outputs``).
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..data.formats import ReadOptions
from ..data.records import RecordError
from ..options import LoadOptions
from ..outputs import check_apart, check_writable, files_of, identity, is_stream, target
from .batch import (
    INPUT_ERRORS,
    Chunk,
    Tally,
    chunk_lines,
    pick_task,
    reason,
    rejected_text,
    row_text,
    score_chunk,
)
from .files import (
    LineInput,
    Progress,
    Sink,
    TableInput,
    input_sample,
    kept_lines,
    open_input,
    progress_temporary,
    seen_ids,
)

if TYPE_CHECKING:
    from ..judges.base import Judge
    from .escalation import EscalationSpec, Escalator

SHOWN_REJECTIONS = 10


@dataclass
class ScoreJob:
    """One run of the local engine: the judge and how it loads (``load``: its options, the batch budget among them,
    built once by the caller), the files and the reading options."""

    model: str
    input: str
    output: str
    rejected: str | None = None
    task: str = "auto"
    symmetric: bool = False
    chunk_size: int = 512
    resume: bool = False
    load: LoadOptions = field(default_factory=LoadOptions)
    options: ReadOptions = field(default_factory=ReadOptions)
    format: str | None = None  # as given (recorded in the progress file: a resumed run must read alike)
    columns: str | None = None
    encoding: str | None = None  # of a JSONL input (default UTF-8)
    escalate: EscalationSpec | None = None  # the least sure pairs go to a teacher judge (``escalation``)


PARTIAL = ".partial"


def partial(path: Path) -> Path:
    """Where a file of the run is written until the run completes, then renamed into place."""
    return path.with_name(path.name + PARTIAL)


@dataclass
class RunFiles:
    """What a run writes: the output and rejected files (under their ``partial`` names until the run completes)
    and the progress file, each where the OS writes it (a symlink's target: the link stays). A device or FIFO
    (``/dev/stdout``, ``/dev/null``, a named pipe) is written straight through instead, as the run goes: such an
    output has no progress file (it cannot be resumed) and, without ``--rejected``, its rejections are printed,
    every one."""

    output: Path
    rejected: Path | None  # None: printed (a stream output without --rejected)
    progress: Path | None  # None: a stream output, not resumable
    named: dict[str, str]  # "--output" / "--rejected" -> the name as given (messages name it)

    @classmethod
    def of(cls, job: ScoreJob) -> RunFiles:
        named = {"--output": job.output, **({"--rejected": job.rejected} if job.rejected else {})}
        if is_stream(job.output):
            rejected = Path(job.rejected) if job.rejected else None
            return cls(Path(job.output), rejected if rejected is None or is_stream(rejected) else target(rejected),
                       None, named)
        out = target(job.output)
        rejected = Path(job.rejected) if job.rejected else out.with_name(out.name + ".rejected.jsonl")
        return cls(out, rejected if is_stream(rejected) else target(rejected),
                   out.with_name(out.name + ".progress.json"), named)

    def written(self, path: Path) -> Path:
        """Where ``path`` is written while the run goes: its partial file; a stream: itself."""
        return path if is_stream(path) else partial(path)

    def check(self, job: ScoreJob) -> None:
        """Before anything is read or written: no file the run writes is one it reads or another it writes, and
        the output and rejected files can be written."""
        inputs = [("--input", None if job.input.startswith("hf:") else input_sample(job.input)[0]),
                  *files_of(job.model, "a file of JUDGE_DIR"),
                  *(job.escalate.inputs() if job.escalate is not None else ())]
        outputs = [("--output", job.output), ("--rejected", job.rejected or self.rejected),
                   ("the progress file", self.progress),
                   ("the progress file's temporary", self.progress and progress_temporary(self.progress)),
                   ("the partial output", self.written(self.output)),
                   ("the partial rejected file", self.rejected and self.written(self.rejected))]
        check_apart(inputs, [(role, path) for role, path in outputs if not (path and is_stream(path))])
        for path in (self.output, self.rejected):
            if path is not None:
                check_writable(path)
        if job.resume and self.progress is None:
            raise ValueError(f"--resume: --output {job.output} is a device or FIFO, written as the run goes: there "
                             "is nothing to resume (run without --resume)")

    def finish(self, rejected: int) -> None:
        """The run is complete: the partial files become the output and rejected files (a run without
        rejections leaves no rejected file, not even an earlier run's), then the progress file goes."""
        if not is_stream(self.output):
            os.replace(partial(self.output), self.output)
        if self.rejected is not None and not is_stream(self.rejected):
            if rejected:
                os.replace(partial(self.rejected), self.rejected)
            else:
                partial(self.rejected).unlink()
                self.rejected.unlink(missing_ok=True)
        if self.progress is not None:
            self.progress.unlink()


def score_file(job: ScoreJob) -> int:
    """Score ``job.input`` into ``job.output`` in this process (the module doc); the exit status: 0 every line
    scored, 1 some lines rejected."""
    from ..judges.base import load_ready

    if job.chunk_size < 1:
        raise ValueError("--chunk-size must be positive")
    if job.escalate is not None:
        job.escalate.check()
    escalate = None if job.escalate is None else job.escalate.settings()
    files = RunFiles.of(job)
    files.check(job)
    src = open_input(job.input, job.encoding)
    # What must be the same to resume (with the same --chunk-size and --batch-size too, the output is byte for
    # byte an uninterrupted run's; other sizes can move scores by float noise only).
    settings = {"model": str(Path(job.model).resolve()), "input": src.identity, "task": job.task,
                "symmetric": job.symmetric, "rejected": str(files.rejected),
                "backend": job.load.backend, "variant": job.load.variant, "format": job.format, "columns": job.columns,
                "encoding": getattr(src, "encoding", None), "sample": src.sample,
                "escalate": escalate}
    progress = Progress.load(files.progress, settings) if job.resume else Progress(files.progress, settings)
    if not job.resume and files.progress is not None and files.progress.exists():
        print(f"starting over: {files.progress} of an interrupted run is replaced (--resume continues it)",
              file=sys.stderr)
    # a judge that cannot score fails here (JudgeError), not on every line
    judge = load_ready(job.model, job.load)
    task = pick_task(job.task, judge, ((n, text) for n, text, _ in src.lines(0, 0)), job.options)
    judge.require(task)
    if job.symmetric and task != "compare":
        raise ValueError("--symmetric applies to compare, not to score")
    for path in (files.output, files.rejected):
        if path is not None and not is_stream(path):
            path.parent.mkdir(parents=True, exist_ok=True)
    escalator = None if job.escalate is None else job.escalate.escalator(judge, task, job.symmetric, job.load)
    run = _Run(judge, task, job, src, files, progress, escalator)
    run.score()
    files.finish(run.tally.rejected)

    tally = run.tally
    if tally.rejected > SHOWN_REJECTIONS and files.rejected is not None:
        print(f"... {tally.rejected - SHOWN_REJECTIONS} more rejections in {files.rejected}", file=sys.stderr)
    if tally.duplicate_warning():
        print(tally.duplicate_warning(), file=sys.stderr)
    # the summary stays out of the scores when they go to this process's standard output
    summary = sys.stderr if is_stream(files.output) and identity(files.output) == identity("/dev/stdout") \
        else sys.stdout
    print(tally.summary(), file=summary)
    if escalator is not None:
        print(escalator.report(tally), file=summary)
    print(f"results: {files.output}" + (f"; rejected lines: {files.rejected}" if tally.rejected and files.rejected
                                         else ""), file=summary)
    return 1 if tally.rejected else 0


class _Run:
    """One run's state: the sinks (new, or an interrupted run's cut back to its checkpoint), the tally, the ids
    seen and the input's offset and hash up to the last line read."""

    def __init__(self, judge: Judge, task: str, job: ScoreJob, src: LineInput | TableInput, files: RunFiles,
                 progress: Progress, escalator: Escalator | None = None) -> None:
        self.judge, self.task, self.job, self.src, self.files, self.progress = judge, task, job, src, files, progress
        self.escalator = escalator
        out, rejected = files.written(files.output), files.rejected and files.written(files.rejected)
        if job.resume:
            self.input_hash = src.prefix_hash(progress)
            self.sink, self.rejected = Sink(out, progress.files["output"]), Sink(rejected, progress.files["rejected"])
            self.tally, self.seen = Tally.from_dict(progress.tally), seen_ids(out, self.sink.size)
            print(f"resuming after line {progress.line} of {src}", file=sys.stderr)
            if (stated := judge.batch_tolerance()) is not None:  # the rows from here are judged in other batches
                print(f"the rows judged from here may differ from an uninterrupted run's by up to {stated[1]:g} "
                      f"(a row's numbers move with the batch it is judged in; {stated[0]}: the judge card's "
                      "batch_tolerance); every id is still written once", file=sys.stderr)
        else:
            self.input_hash, self.sink, self.rejected = hashlib.sha256(), Sink(out), Sink(rejected)
            self.tally, self.seen = Tally(), set()
        self.shown = [0]
        self.line, self.offset = progress.line, progress.input_bytes  # the last line accounted for, and its end
        self.keep = kept_lines(src)  # "SPEC:N": the lines of the sample

    def checkpoint(self, line: int) -> None:
        """Everything up to ``line`` is on disk: record it (the files first, then the progress that names them)."""
        files = {"output": self.sink.commit(), "rejected": self.rejected.commit()}
        self.progress.advance(line, self.offset, self.input_hash.hexdigest(), files, self.tally.to_dict())

    def flush(self, chunk: Chunk) -> None:
        for err in chunk.rejections:
            _reject(err, self.tally, self.rejected, self.shown)
        self.tally.blank += chunk.blank
        if not chunk.records:
            return
        try:
            results, errors = self.decide(chunk.records)
        except INPUT_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - not an input's fault (those are rejected): a part of the judge's
            from ..judges.base import JudgeError

            if isinstance(exc, JudgeError):  # the teacher's, named already
                raise
            raise JudgeError(self.job.model, exc) from exc
        for line, row in results:
            self.tally.count_id(self.seen, row["id"], line)
        self.sink.write("".join(map(row_text, (row for _, row in results))).encode())
        self.tally.scored += len(results)
        for err in errors:
            _reject(err, self.tally, self.rejected, self.shown)

    def decide(self, records: list) -> tuple[list, list[RecordError]]:
        """The chunk's rows and rejections: the judge's, or with escalation the least sure pairs the teacher's."""
        if self.escalator is None:
            return score_chunk(self.judge, self.task, records, self.job.symmetric, str(self.src))
        results, errors, escalated = self.escalator.score(self.judge, records, str(self.src), self.tally.scored)
        self.tally.escalated += escalated
        return results, errors

    def numbered(self) -> Iterator[tuple[int, str | RecordError]]:
        """The input's lines from the checkpoint on; what has been read is added to the offset and hash."""
        for line, text, raw in self.src.lines(self.offset, self.progress.line):
            self.line = line
            self.offset += len(raw)
            self.input_hash.update(raw)
            if self.keep is None or line in self.keep:
                self.tally.read += 1
                yield line, text

    def score(self) -> None:
        from ..progress import meter

        try:
            self.checkpoint(self.line)
            # the judge's readers count answers (and tokens) as they read them; the lines, per chunk
            with meter("scoring") as shown:
                total = self.src.total()
                for chunk in chunk_lines(self.numbered(), str(self.src), self.task, self.job.chunk_size,
                                         self.job.options):
                    self.flush(chunk)
                    self.checkpoint(chunk.last)
                    share = f" ({self.offset / total:.0%} of the input)" if total else ""
                    shown.note(f"line {chunk.last:,}{share} done")
                self.checkpoint(self.line)
        except BaseException:  # the judge, the disk, Ctrl-C: the files end at the last checkpoint, which says so
            self.sink.rollback()
            self.rejected.rollback()
            if self.files.progress is None:
                print(f"clfjudge score: interrupted after line {self.progress.line} of {self.src}, written to "
                      f"{self.files.output} as it went (a device or FIFO: no resuming; run again)", file=sys.stderr)
                raise
            print(f"clfjudge score: interrupted; lines 1-{self.progress.line} of {self.src} are accounted for in "
                  f"{self.sink.path} and {self.rejected.path} (progress: {self.files.progress}; "
                  f"{self.files.output} is left as it was); run the same command with --resume to go on",
                  file=sys.stderr)
            raise
        finally:
            self.sink.close()
            self.rejected.close()


def _reject(err: RecordError, tally: Tally, rejected_file: Sink, shown: list[int]) -> None:
    tally.rejected += 1
    tally.reasons[reason(err)] += 1
    rejected_file.write(rejected_text(err).encode())
    if shown[0] < SHOWN_REJECTIONS or rejected_file.path is None:  # no rejected file: every one is printed
        print(f"rejected {err}", file=sys.stderr)
        shown[0] += 1
