"""`clfjudge distill TEACHER --pool SPEC --recipe STUDENT.yaml --out DIR`: a fast student judge learns a teacher's
probabilities on a pool of pairs (training/distill.py)."""
from __future__ import annotations

import argparse

from ..batching import DEFAULT_BATCH_SIZE
from .common import add_batch_size, add_recipe


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "distill", help="label a pool of pairs with a teacher judge once (cached) and train a fast student on its "
                        "probabilities; report their agreement and both on evaluation sets")
    p.add_argument("teacher", metavar="TEACHER",
                   help="a judge directory, a reward model (directory or hf:OWNER/NAME), a label directory of "
                        "clfjudge label (no teacher model needed), or a JSONL file of a judge's predictions "
                        "(question, answer_a, answer_b, p_a [, p_b])")
    p.add_argument("--pool", nargs="+", metavar="SPEC[:N]",
                   help="pairs the teacher labels (labelled or not; labels are ignored): built-in names or your own "
                        "files, save_to_disk directories or hf:OWNER/NAME; with a label directory as TEACHER, the "
                        "pool it was labelled from (its provenance.json) unless given")
    add_recipe(p, "the student's recipe (head: embedding, or head: verdict with verdict.lora: a fine-tuned chat "
                  "model); its sources are the pool, whatever it names",
               metavar="STUDENT.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key (repeatable)")
    p.add_argument("--out", required=True, help="output directory: teacher_labels.jsonl (the cache), student/, "
                                                 "distill_report.json / .md")
    p.add_argument("--eval", nargs="*", default=[], metavar="SPEC[:N]",
                   help="labelled sets both judges are scored on, beside longer- and shorter-answer-wins")
    p.add_argument("--holdout", type=float, default=0.1,
                   help="share of pool questions held out from the student to measure its agreement with the teacher")
    p.add_argument("--seed", type=int, default=0)
    add_batch_size(p, DEFAULT_BATCH_SIZE, "pairs per teacher call")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..outputs import check_apart, target
    from ..training.config import TrainConfig
    from ..training.distill import DistillJob, distill

    if not 0 <= args.holdout < 1:
        raise ValueError(f"--holdout is a share of the pool's questions in [0, 1), got {args.holdout}")
    import json

    from ..training.distill import REPORT, STUDENT_DIR, TEACHER_LABELS
    from ..training.labels import PROVENANCE, is_label_dir

    pool = list(args.pool or [])
    if not pool and is_label_dir(args.teacher):
        pool = json.loads((Path(args.teacher) / PROVENANCE).read_text())["pool"]
    if not pool:
        raise ValueError("--pool is required unless TEACHER is a label directory (clfjudge label)")
    # the student's training sources are the pool (its labels: the teacher's), whatever the recipe names
    config = TrainConfig.from_yaml(args.recipe, [*args.overrides, f"sources={json.dumps(pool)}"])
    out = Path(args.out)
    check_apart([("TEACHER", args.teacher), *((f"--pool {s}", s) for s in pool if Path(s).exists()),
                 *((f"TEACHER {p}", p) for p in Path(args.teacher).glob("*.json*") if Path(args.teacher).is_dir())],
                [("--out", out), *((f"--out {out / name}", out / name) for name in
                                   (f"{REPORT}.json", f"{REPORT}.md", TEACHER_LABELS, STUDENT_DIR))])
    out = target(out)  # where the OS puts it: no folder made for a "missing/.." on the way
    report = distill(DistillJob(args.teacher, tuple(pool), out, tuple(args.eval), args.holdout,
                                args.seed, args.batch_size, str(args.recipe)), config)
    print(out / "distill_report.md")
    agreement = report["agreement_holdout"]
    if agreement:
        print(f"student-teacher agreement on {agreement['pairs']} held-out pairs: "
              f"{100 * agreement['decision_agreement']:.1f}%")
    return 0
