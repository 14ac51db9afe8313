"""`clfjudge score JUDGE_DIR --input FILE --output out.jsonl`: batch scoring of pairs (compare) or answers (score)
with a judge; the engines live in ``clfjudge.scoring`` (local: this process, resumable; ray: judge actors).

Input lines are JSON objects: pairs {"id", "question", "answer_a", "answer_b", "rubric"?, "reference"?} for
compare, answers {"id", "question", "answer", ...} for score, or the same in TRL's fields (prompt / chosen /
rejected, prompt / completion, messages; ``data.formats``). A Parquet / CSV / JSON file, a save_to_disk directory
or an hf: data set is read by datasets, each row an input line numbered from 1. Each output line is the input id
and the result; a bad line goes to the rejected file with its line number and field, and no line is lost.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from ..registry import Registry
from .common import (
    add_data_options,
    add_engine_options,
    check_local_options,
    judge_options,
    load_options,
    ray_engine,
    ray_options,
    read_options,
)

TASKS = ("auto", "compare", "score")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("score", help="score a file of pairs (compare) or answers (score) with a judge or a "
                                           "reward model (JSONL, Parquet, CSV, a datasets directory)",
                              epilog="exit status: 0 every line scored, 1 some lines rejected (see the rejected "
                                     "file), 2 a usage or input error (an output that is an input included), 3 "
                                     "the judge cannot be loaded or fails mid-run, 4 a file cannot be read or written "
                                     "(docs/scoring.md)")
    p.add_argument("model", metavar="JUDGE_DIR",
                   help="judge directory (trained, exported to ONNX, embedding or generative judge), or a reward "
                        "model without a card (a directory or hf:OWNER/NAME[@REV]: docs/your-model.md)")
    p.add_argument("--input", required=True,
                   help="JSONL input, one pair or answer per line, in clfjudge's fields or TRL's (prompt / chosen / "
                        "rejected, prompt / completion, messages); or a Parquet / CSV / JSON file, a save_to_disk "
                        "directory or hf:OWNER/NAME[:SPLIT], read by datasets, one row per item (--engine ray: "
                        "JSONL or Parquet files: a file, a glob or a directory of shards)")
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
    p.add_argument("--encoding", default=None,
                   help="the encoding of a JSONL input (default utf-8; e.g. latin-1, cp1252): a line not in it is "
                        "rejected with its line and byte offset, never read with stand-in characters")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from OUTPUT.progress.json (same model, input and options; "
                        "--engine ray resumes by itself: finished shards are skipped)")
    e = p.add_argument_group("escalation", "the pairs the judge is least sure of go to a slower teacher judge "
                                           "(docs/scoring.md#escalation; pairs only, --engine local)")
    e.add_argument("--escalate", metavar="TEACHER", default=None,
                   help="the teacher: a judge directory (in practice a verdict judge), loaded only if a pair goes "
                        "to it")
    e.add_argument("--escalate-share", type=float, metavar="F", default=None,
                   help="send at most this share of the pairs, the least sure of each chunk (kept over the whole run)")
    e.add_argument("--escalate-agreement", type=float, metavar="A", default=None,
                   help="send the pairs below the confidence threshold that keeps agreement with the teacher >= A, "
                        "calibrated on --escalate-calibration with an exact binomial bound")
    e.add_argument("--escalate-calibration", metavar="PAIRS", default=None,
                   help="held-out pairs the teacher labelled: a label directory (clfjudge label) or a JSONL file of "
                        "its predictions (question, answer_a, answer_b, p_a)")
    e.add_argument("--escalate-delta", type=float, metavar="DELTA", default=0.1,
                   help="the bound holds at level 1 - DELTA (default 0.1)")
    judge_options(p)
    add_data_options(p)
    add_engine_options(p, ENGINES.names(), "local: this process; ray: judge actors on a Ray cluster (Ray Data), "
                                           "one per CPU slot")
    p.set_defaults(func=run_score)


def run_score(args: argparse.Namespace) -> int:
    return ENGINES.get(args.engine)(args)


def escalation(args: argparse.Namespace):
    """``--escalate`` and its options as an ``EscalationSpec``; None without it (its options alone are refused)."""
    from ..scoring.escalation import EscalationSpec

    if args.escalate is None:
        given = [name for name in ("share", "agreement", "calibration")
                 if getattr(args, f"escalate_{name}") is not None]
        if given:
            raise ValueError(f"--escalate-{given[0]} applies with --escalate TEACHER")
        return None
    return EscalationSpec(args.escalate, args.escalate_share, args.escalate_agreement, args.escalate_calibration,
                          args.escalate_delta)


def run_local(args: argparse.Namespace) -> int:
    from ..scoring.local import ScoreJob, score_file

    escalate = escalation(args)
    check_local_options(args)
    job = ScoreJob(model=args.model, input=args.input, output=args.output, rejected=args.rejected, task=args.task,
                   symmetric=args.symmetric, chunk_size=args.chunk_size, resume=args.resume, load=load_options(args),
                   options=read_options(args), format=args.format, columns=args.columns, encoding=args.encoding,
                   escalate=escalate)
    return score_file(job)


def run_ray(args: argparse.Namespace) -> int:
    """`--engine ray`: the input's shards scored by judge actors into the output directory (scoring/ray_engine.py)."""
    from ..card import TASK_OF_ARITY
    from ..judges.base import open_judge

    for option, given in (("--rejected", args.rejected), ("--resume", args.resume)):
        if given:
            raise ValueError(f"{option} applies to --engine local (--engine ray writes SHARD.rejected.jsonl beside "
                             "each output shard, and a re-run skips finished shards)")
    if args.escalate:
        raise ValueError("--escalate applies to --engine local (a Ray actor holds one judge, not a judge and its "
                         "teacher)")
    if args.encoding:
        raise ValueError("--encoding applies to --engine local (--engine ray reads UTF-8 JSONL and Parquet)")
    if args.format or args.columns or args.scale:
        raise ValueError("--format, --columns and --scale apply to --engine local (--engine ray reads each line's "
                         "format from its fields)")
    if args.chunk_size < 1:
        raise ValueError("--chunk-size must be positive")
    if not Path(args.input).exists() and re.search(r":\d+$", args.input):
        raise ValueError(f"--input {args.input}: a sample (SPEC:N) applies to --engine local (--engine ray scores "
                         "every line of its shards)")
    threads = args.threads or 1  # per actor, each asking Ray for as many CPUs
    options = ray_options(args, cpus_per_actor=threads)
    engine = ray_engine()
    shards = engine.find_shards(args.input)
    engine.check_layout(args.input, shards, Path(args.output))
    card = open_judge(args.model, args.model_input)[1]
    task = TASK_OF_ARITY[card.arity] if args.task == "auto" else args.task
    if args.symmetric and task != "compare":
        raise ValueError("--symmetric applies to compare, not to score")
    load = load_options(args, threads=threads)
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
