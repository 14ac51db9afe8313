"""`clfjudge audit JUDGE [JUDGE ...] --out DIR`: every judge on every test set and bias probe, with a report."""
from __future__ import annotations

import argparse
from pathlib import Path

from .common import (
    add_data_options,
    add_engine_options,
    add_trust_pickle,
    check_local_options,
    load_options,
    local_inputs,
    ray_options,
    read_options,
)

ENGINES = ("local", "ray")  # where the judge directories predict (--engine)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit", help="cross-scheme, LLMBar, position/length bias, agreement, SemScore; report.md + metrics.json",
        description="A JUDGE is a judge directory (PyTorch / ONNX / embedding / generative), a reward model "
                    "without a card (a directory or hf:OWNER/NAME[@REV]: docs/your-model.md), "
                    "gen:BACKBONE@SCHEME (a causal LM judging zero-shot), released:pandalm-7b | "
                    "released:gpt-3.5-turbo | released:auto-j-13b, semscore, or baseline:longer | baseline:majority "
                    "| baseline:shorter (the baselines are always added).")
    p.add_argument("judges", nargs="+", metavar="JUDGE")
    p.add_argument("--out", type=Path, required=True, help="output directory (report.md, metrics.json, PNGs, cache)")
    p.add_argument("--suites", nargs="+", help="suites to run (default: all)")
    p.add_argument("--sets", nargs="+", help="test sets to use (default: every one available): built-in names or "
                                             "your own labelled data (a file, a save_to_disk directory, "
                                             "hf:OWNER/NAME[:SPLIT])")
    p.add_argument("--limit", type=int, help="seeded sample of at most N records per set")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for CIs (0: none)")
    p.add_argument("--escalate", metavar="TEACHER", default=None,
                   help="a teacher judge directory: the escalation curve of each judge directory named, accuracy "
                        "against the share of pairs sent to the teacher (0, 10, 25, 50, 100%%) with each point's "
                        "reading cost (docs/scoring.md#escalation)")
    add_trust_pickle(p)
    add_data_options(p)
    add_engine_options(p, ENGINES, "local: this process; ray: the judge directories predict on judge actors on a Ray "
                                   "cluster, one test set per call (the other judges predict in this process); "
                                   "the report is the same",
                       gpus_help="GPUs each actor asks Ray for (e.g. 1, 0.5); the actors then run the judge "
                                 "directories on CUDA (--engine local: on the CPU)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..audit import run_audit, set_slug
    from ..outputs import check_apart, target

    figures = [("the length-bias figure", args.out / "length_bias.png"),
               *((f"the agreement figure of {spec}", args.out / f"agreement_{set_slug(spec)}.png")
                 for spec in args.sets or ())]
    check_apart([*local_inputs([*args.judges, *filter(None, [args.escalate])], "JUDGE"),
                 *local_inputs(args.sets or (), "--sets")],
                [("the report", args.out / "report.md"), ("the metrics", args.out / "metrics.json"), *figures])
    args.out = target(args.out)  # where the OS puts it: no folder made for a "missing/.." on the way
    if args.engine == "ray":
        options = ray_options(args)  # one CPU (one thread) per actor
    else:
        check_local_options(args)
        options = None
    run_audit(args.judges, args.out, suites=args.suites, limit=args.limit, bootstrap=args.bootstrap,
              sets=args.sets, load=load_options(args), ray_options=options,
              read_options=read_options(args), escalate=args.escalate)
    print(f"report: {args.out / 'report.md'}; metrics: {args.out / 'metrics.json'}")
    return 0
