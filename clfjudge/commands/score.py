"""`clfjudge score MODEL --input in.jsonl --output out.jsonl`: batch scoring of a JSONL file, streamed in
chunks; and `clfjudge calibrate JUDGE_DIR --source NAME`: fit temperature / tie margin into the judge card.

Input lines are JSON objects: pairs {"id", "question", "answer_a", "answer_b", "rubric"?, "reference"?} for
compare, answers {"id", "question", "answer", ...} for score. Each output line is the input id and the result.
A bad line (invalid JSON, a missing or mistyped field, an input the judge cannot encode) is reported with its
line number and field, written to the rejected file, and scoring goes on; the summary accounts for every line.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from ..records import Loc, PairRecord, Record, RecordError

if TYPE_CHECKING:
    from ..runtime import Judge

TASKS = ("auto", "compare", "score")
# What a judge raises for an input it cannot take (tokenizers raise TypeError for text they cannot encode).
INPUT_ERRORS = (ValueError, TypeError)
SHOWN_REJECTIONS = 10


def _judge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "onnx", "sklearn"])
    p.add_argument("--provider", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--variant", default=None, help="ONNX file: fp32 | optimized | int8 | a file name "
                                                   "(default: the card's primary)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads of the backend")
    p.add_argument("--batch-size", type=int, default=16, help="records per forward pass")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("score", help="score a JSONL file of pairs (compare) or answers (score) with a judge",
                              epilog="exit status: 0 every line scored, 1 some lines rejected (see the rejected "
                                     "file), 2 a usage or input error")
    p.add_argument("model", metavar="MODEL", help="judge directory (trained, exported to ONNX, or embedding judge)")
    p.add_argument("--input", required=True, help="JSONL input, one pair or answer per line")
    p.add_argument("--output", required=True, help="JSONL output, one line per scored input line")
    p.add_argument("--rejected", default=None,
                   help="JSONL file of rejected lines with line number, field and error (default: OUTPUT.rejected.jsonl)")
    p.add_argument("--task", default="auto", choices=TASKS,
                   help="compare pairs or score answers (auto: from the judge; a reward judge can do both)")
    p.add_argument("--symmetric", action="store_true", help="judge both answer orders and average (compare)")
    p.add_argument("--chunk-size", type=int, default=512, help="lines held in memory at a time")
    _judge_options(p)
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

@dataclass
class Tally:
    read: int = 0
    blank: int = 0
    scored: int = 0
    rejected: int = 0
    reasons: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        text = f"lines read {self.read}: scored {self.scored}, rejected {self.rejected}"
        if self.blank:
            text += f", blank {self.blank}"
        if self.reasons:
            text += " (" + ", ".join(f"{reason}: {n}" for reason, n in self.reasons.most_common()) + ")"
        return text


def parse_line(text: str, loc: Loc, task: str) -> Record:
    """One JSONL line -> a pair (compare) or point (score) record; errors name file, line and field."""
    from ..runtime import as_pair, as_point

    try:
        item = json.loads(text)
    except json.JSONDecodeError as exc:
        raise loc.error(None, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(item, dict):
        raise loc.error(None, f"expected a JSON object, got {type(item).__name__}")
    if item.get("id") is None:
        item = {**item, "id": f"{Path(loc.file).name}:{loc.line}"}
    return as_pair(item, loc) if task == "compare" else as_point(item, loc)


def _lines(path: Path) -> Iterator[tuple[int, str, int]]:
    """(line number, text, bytes) of each line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            yield number, raw.decode("utf-8", errors="replace"), len(raw)


def _judge_chunk(judge: "Judge", task: str, records: Sequence[Record], symmetric: bool) -> list[dict[str, Any]]:
    results = judge.compare_batch(records, symmetric=symmetric) if task == "compare" else judge.score_batch(records)
    return [{"id": r.id, **res.to_dict()} for r, res in zip(records, results)]


def _score_chunk(judge: "Judge", task: str, chunk: list[tuple[int, Record]], symmetric: bool,
                 source: str) -> tuple[list[dict[str, Any]], list[RecordError]]:
    """Judge a chunk; if the judge rejects one of its inputs (e.g. one it cannot encode), retry line by line
    so only the bad lines are rejected."""
    try:
        return _judge_chunk(judge, task, [r for _, r in chunk], symmetric), []
    except INPUT_ERRORS:
        if len(chunk) == 1:
            raise
    out, errors = [], []
    for line, record in chunk:
        try:
            out += _judge_chunk(judge, task, [record], symmetric)
        except INPUT_ERRORS as exc:
            errors.append(RecordError(source, line, None, f"the judge cannot take this input: {exc}"))
    return out, errors


def _reason(err: RecordError) -> str:
    """The summary bucket of a rejection: its field, else the kind of error (the message's leading words)."""
    return f"field {err.field!r}" if err.field else re.split(r"[(:]", err.message, maxsplit=1)[0].strip()


def _reject(err: RecordError, tally: Tally, rejected_file, shown: list[int]) -> None:
    tally.rejected += 1
    tally.reasons[_reason(err)] += 1
    rejected_file.write(json.dumps({"line": err.line, "field": err.field, "error": err.message}) + "\n")
    if shown[0] < SHOWN_REJECTIONS:
        print(f"rejected {err}", file=sys.stderr)
        shown[0] += 1


def run_score(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..runtime import Judge

    src, out = Path(args.input), Path(args.output)
    if not src.is_file():
        raise FileNotFoundError(f"input {src} does not exist")
    if args.chunk_size < 1:
        raise ValueError("--chunk-size must be positive")
    judge = Judge.load(args.model, backend=args.backend, provider=args.provider, variant=args.variant,
                       threads=args.threads, batch_size=args.batch_size)
    task = ("compare" if judge.card.kind == "pair" else "score") if args.task == "auto" else args.task
    judge.require(task)
    if args.symmetric and task != "compare":
        raise ValueError("--symmetric applies to compare, not to score")
    rejected_path = Path(args.rejected) if args.rejected else out.with_name(out.name + ".rejected.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    tally, shown = Tally(), [0]

    with open(out, "w") as sink, open(rejected_path, "w") as rejected, \
            tqdm(total=src.stat().st_size, unit="B", unit_scale=True, desc="scoring", file=sys.stderr) as bar:
        chunk: list[tuple[int, Record]] = []

        def flush() -> None:
            results, errors = _score_chunk(judge, task, chunk, args.symmetric, str(src))
            for row in results:
                sink.write(json.dumps(row) + "\n")
            tally.scored += len(results)
            for err in errors:
                _reject(err, tally, rejected, shown)
            sink.flush()  # a crash later leaves every finished chunk on disk
            rejected.flush()
            chunk.clear()

        for number, text, size in _lines(src):
            tally.read += 1
            bar.update(size)
            if not text.strip():
                tally.blank += 1
                continue
            try:
                chunk.append((number, parse_line(text, Loc(str(src), number), task)))
            except RecordError as err:
                _reject(err, tally, rejected, shown)
            if len(chunk) >= args.chunk_size:
                flush()
        if chunk:
            flush()

    if tally.rejected > SHOWN_REJECTIONS:
        print(f"... {tally.rejected - SHOWN_REJECTIONS} more rejections in {rejected_path}", file=sys.stderr)
    if not tally.rejected:
        rejected_path.unlink()
    print(tally.summary())
    print(f"results: {out}" + (f"; rejected lines: {rejected_path}" if tally.rejected else ""))
    return 1 if tally.rejected else 0


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
    from .. import sources
    from ..calibration import fit_calibration
    from ..card import JudgeCard
    from ..export import card_sources
    from ..runtime import Judge
    from ..training import parse_source

    judge = Judge.load(args.judge_dir, backend=args.backend, provider=args.provider, variant=args.variant,
                       threads=args.threads, batch_size=args.batch_size)
    name, limit = parse_source(args.source)
    if name in card_sources(judge.card):
        print(f"warning: {name} is a training or evaluation source of this judge: calibrating on it makes the "
              "probabilities and its reported metrics optimistic", file=sys.stderr)
    loaded = sources.load(name)
    pairs, excluded = labelled_pairs(loaded.records)
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
    card = JudgeCard.load(args.judge_dir)
    card.calibration = {**card.calibration, **entry}
    card.save(args.judge_dir)
    print(json.dumps({k: v for k, v in entry.items() if k != "fitted_on"}, indent=2))
    print(f"calibration written to {Path(args.judge_dir) / 'judge_card.json'} ({len(pairs)} pairs of {name})")
    return 0
