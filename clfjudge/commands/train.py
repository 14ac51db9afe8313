"""`clfjudge train --config RECIPE.yaml [--set key=value ...]`: fine-tune a classifier judge."""
from __future__ import annotations

import argparse
import os


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="fine-tune a classifier judge from a YAML recipe (train/*.yaml)")
    p.add_argument("--config", required=True, help="recipe YAML (keys: clfjudge.training.TrainConfig fields)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key (repeatable), e.g. --set lr=1e-5 --set budgets.answer=200")
    # The deepspeed launcher passes --local_rank; torchrun passes LOCAL_RANK in the environment.
    p.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=None,
                   help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..training import TrainConfig, train

    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    config = TrainConfig.from_yaml(args.config, args.overrides)
    out = train(config)
    print(out)
    return 0
