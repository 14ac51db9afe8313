"""`clfjudge train --recipe RECIPE.yaml [--set key=value ...]`: fine-tune a classifier judge."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .common import add_recipe

if TYPE_CHECKING:
    from ..training.config import TrainConfig


class _HelpWithRecipeKeys(argparse.Action):
    """``-h/--help`` that lists the recipe keys with their help and defaults (TrainConfig field metadata). The
    list is built only when asked for, so ``clfjudge --help`` and other commands never import training.config."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace, values, option_string=None) -> None:
        parser.epilog = recipe_keys_epilog()
        parser.print_help()
        parser.exit()


def recipe_keys_epilog() -> str:
    from ..training.config import keys_help

    return ("recipe keys (YAML, or --set KEY=VALUE; clfjudge.training.config.TrainConfig):\n" + keys_help()
            + "\n\nunknown keys are an error that names the closest known ones.")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="fine-tune a classifier judge from a YAML recipe (train/*.yaml)",
                              formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    p.add_argument("-h", "--help", action=_HelpWithRecipeKeys,
                   help="show this help message, with every recipe key, and exit")
    add_recipe(p, "recipe YAML (keys: clfjudge.training.config.TrainConfig fields, listed below)",
               metavar="RECIPE.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe key (repeatable), e.g. --set lr=1e-5 --set budgets.answer=200")
    # The deepspeed launcher passes --local_rank; torchrun passes LOCAL_RANK in the environment.
    p.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=None,
                   help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def check_output_dir(config: TrainConfig) -> None:
    """The judge directory training writes is none it reads: the backbone's (a local directory), a data file or
    directory, the recipe. Then the directory is named where the OS puts it (``outputs.target``), so no folder is
    made for a ``missing/..`` on the way."""
    from ..outputs import check_apart, target

    sources = [*config.sources, *config.eval_sources, *config.extra_train_sources, *config.decontaminate_against]
    inputs = [("backbone", config.backbone), *((f"source {s}", s) for s in sources if Path(s).exists())]
    check_apart(inputs, [("output_dir", config.output_dir)])
    config.output_dir = str(target(config.output_dir))


def run(args: argparse.Namespace) -> int:
    from ..training.config import TrainConfig
    from ..training.trainer import train

    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    config = TrainConfig.from_yaml(args.recipe, args.overrides)
    check_output_dir(config)
    out = train(config)
    for line in excluded_lines(out):
        print(line, file=sys.stderr)
    print(out)
    return 0


def excluded_lines(judge_dir) -> list[str]:
    """What the judge card says each source of the run left out (by the loader, for the head, beyond a sample)."""
    from ..card import JudgeCard
    from ..data.records import exclusion_lines

    recorded = JudgeCard.load(judge_dir).training.get("sources") or {}
    lines = []
    for role, by_name in recorded.items():
        for name, stats in (by_name or {}).items():
            if isinstance(stats, dict):
                reasons = {**stats.get("excluded_by_loader", {}), **stats.get("excluded_for_head", {})}
                lines += exclusion_lines(f"train: {role} source {name}", {
                    "excluded_by_reason": reasons, "first_excluded": stats.get("first_excluded", [])})
    return lines
