"""`clfjudge run --out DIR`: the main job (data -> train -> export -> audit -> report) on the default."""
from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_recipe


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..pipeline import ORDER, PROFILES, REFERENCE_JUDGES

    p = subparsers.add_parser("run", help="the main job: check the data, train the default judge, export it to "
                                          "ONNX behind the parity gate, audit it, write the report")
    p.add_argument("--out", type=Path, default=Path("runs/main"), help="run directory (default: runs/main)")
    add_recipe(p, "training recipe file (default: the profile's; for the full and quick profiles the bundled "
                  "clfjudge/configs/recipes/main-smollm2.yaml)", required=False, type=Path, default=None,
               metavar="RECIPE.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key (repeatable)")
    p.add_argument("--profile", choices=PROFILES.names(), default="full",
                   help="full: the README's main job; quick: the same path on a small real slice (CI); quality: a "
                        "chat model's own verdict (Qwen2.5-Coder-1.5B, about one answer a second on 2 cores: "
                        "hours; exported behind the parity gate, audited on the fastest run that "
                        "passed; docs/training.md)")
    p.add_argument("--steps", nargs="+", choices=ORDER, help="run only these steps (later ones reuse run.json)")
    p.add_argument("--judges", nargs="+", default=list(REFERENCE_JUDGES),
                   help="judges audited beside the trained one (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys
    import traceback

    from ..outputs import check_apart, target
    from ..pipeline import RunConfig, StepFailed
    from ..pipeline import run as run_pipeline
    from . import USER_ERRORS

    check_apart([("--recipe", args.recipe)], [("the run record", args.out / "run.json"),
                                              ("the data statistics", args.out / "data_stats.json")])
    args.out = target(args.out)  # where the OS puts it: no folder made for a "missing/.." on the way
    try:
        record = run_pipeline(RunConfig(out=args.out, recipe=args.recipe, overrides=args.overrides,
                                        profile=args.profile, steps=args.steps, judges=args.judges))
    except StepFailed as failed:
        # a user's mistake, or a file the system cannot write (its name and reason), reads best as one line
        if not isinstance(failed.__cause__, (*USER_ERRORS, OSError)):
            traceback.print_exception(failed.__cause__, file=sys.stderr)
        print(f"[clfjudge run] {failed}", file=sys.stderr)
        return 1
    print(f"[clfjudge run] done: {args.out / 'run.json'}"
          + (f"; report: {record['outputs']['audit']['report']}" if "audit" in record["outputs"] else ""))
    return 0
