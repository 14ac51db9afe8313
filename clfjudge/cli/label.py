"""`clfjudge label TEACHER --pool SPEC... --out DIR`: a slow judge labels a pool's answers once, into a label
directory that travels without it (training/labels.py); `clfjudge distill DIR` trains a student from it."""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..training.labels import SELECTIONS

    p = subparsers.add_parser(
        "label", help="label a pool's answers (or pairs) with a teacher judge, resumably, into a label directory "
                      "with its provenance (clfjudge distill trains a student from it)")
    p.add_argument("teacher", metavar="TEACHER", help="the teacher: a judge directory (a verdict judge, any judge "
                                                      "that scores or compares) or a reward model")
    p.add_argument("--pool", nargs="+", required=True, metavar="SPEC[:N]",
                   help="where pairs are chosen from (labelled or not; labels are ignored): built-in names or your "
                        "own files; a resumed run names the same pool")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the label directory: provenance.json, pairs.jsonl (chosen pairs), labels.jsonl")
    p.add_argument("--pairs", type=int, default=0, metavar="N",
                   help="pairs chosen by --select the directory holds after this run (the shortfall is chosen now; "
                        "0: only finish labelling the pairs chosen before)")
    p.add_argument("--select", choices=SELECTIONS, default="random",
                   help="random: a seeded sample of the pool; uncertain: where --student is least sure")
    p.add_argument("--student", metavar="JUDGE_DIR", help="the judge whose uncertain pairs --select uncertain picks")
    p.add_argument("--candidates", type=int, default=2000, metavar="N",
                   help="unchosen pool pairs the student reads to pick the uncertain ones from")
    p.add_argument("--decontaminate-against", nargs="*", default=[], metavar="SET",
                   help="evaluation and dev sets: pool pairs whose question is in one are never chosen")
    p.add_argument("--chunk", type=int, default=8, metavar="N",
                   help="pairs per teacher call; their labels are written (and kept through a kill) after each")
    p.add_argument("--limit-s", type=float, metavar="S", help="stop after about S seconds (resume later)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..outputs import check_apart, target
    from ..training.labels import LabelJob, label

    for name, value, least in (("--pairs", args.pairs, 0), ("--candidates", args.candidates, 1),
                               ("--chunk", args.chunk, 1)):
        if value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    out = Path(args.out)
    check_apart([("TEACHER", args.teacher), *((f"--pool {s}", s) for s in args.pool if Path(s).exists())],
                [(f"--out {out / name}", out / name) for name in ("provenance.json", "pairs.jsonl", "labels.jsonl")])
    out = target(out)  # where the OS puts it: no folder made for a "missing/.." on the way
    result = label(LabelJob(args.teacher, tuple(args.pool), out, args.pairs, args.select, args.student,
                            tuple(args.decontaminate_against), args.seed, args.chunk, args.candidates,
                            args.limit_s))
    print(f"{result['labelled']} of {result['total']} labelled in {result['seconds']} s: {out}")
    return 0
