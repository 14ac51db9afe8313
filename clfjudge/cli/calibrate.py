"""`clfjudge calibrate JUDGE_DIR --source NAME[:N]`: fit temperature scaling and an Auto-J tie margin on labelled
pairs held out from training, and store them in the judge card."""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ..data.records import PairRecord, Record, exclusion_lines
from .common import add_data_options, judge_options, load_options, local_inputs, read_options


def register(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser("calibrate", help="fit temperature scaling and an Auto-J tie margin on labelled "
                                                "pairs and store them in judge_card.json")
    c.add_argument("judge_dir", metavar="JUDGE_DIR")
    c.add_argument("--source", required=True, metavar="NAME[:N]",
                   help="labelled pair source (held out from training: not a training or evaluation source): a "
                        "built-in name or your own labelled pairs (a file, a save_to_disk directory, "
                        "hf:OWNER/NAME[:SPLIT])")
    add_data_options(c)
    c.add_argument("--n", dest="n_records", type=int, default=512, help="pairs sampled from the source")
    c.add_argument("--seed", type=int, default=0)
    judge_options(c)
    c.set_defaults(func=run_calibrate)


def labelled_pairs(records: Sequence[Record]) -> tuple[list[PairRecord], Counter]:
    kept, excluded = [], Counter()
    for rec in records:
        if not isinstance(rec, PairRecord):
            excluded[f"{rec.arity} record (calibration needs pairs)"] += 1
        elif rec.verdict is None:
            excluded["pair without a verdict"] += 1
        else:
            kept.append(rec)
    return kept, excluded


def run_calibrate(args: argparse.Namespace) -> int:
    from ..data import sources
    from ..export.gate import card_sources
    from ..judges.base import load_ready, open_card
    from ..judges.calibration import fit_calibration
    from ..outputs import check_apart

    card_path = Path(args.judge_dir) / "judge_card.json"
    check_apart(local_inputs([args.source], "--source"), [("the judge card", card_path)])
    judge = load_ready(args.judge_dir, load_options(args))
    name, limit = sources.parse_source(args.source)
    if name in card_sources(judge.card):
        print(f"warning: {name} is a training or evaluation source of this judge: calibrating on it makes the "
              "probabilities and its reported metrics optimistic", file=sys.stderr)
    options = read_options(args)
    usable = sources.load_usable(args.source, labelled_pairs, options)
    loaded, pairs, excluded = usable.loaded, usable.records, usable.excluded
    n = limit or args.n_records
    if len(pairs) > n:
        excluded[f"beyond the sample of {n}"] += len(pairs) - n
        pairs = random.Random(args.seed).sample(pairs, n)
    for line in exclusion_lines(f"calibrate: {name}", {"excluded_by_reason": {**loaded.excluded, **excluded},
                                                       "first_excluded": loaded.account()["first_excluded"]}):
        print(line, file=sys.stderr)
    raw_f = judge.raw_outputs(pairs)
    raw_r = judge.raw_outputs([p.swapped() for p in pairs])
    entry = fit_calibration(judge.card.name, raw_f, raw_r, [p.verdict for p in pairs], judge.card.calibration)
    entry["fitted_on"] = {"source": name, "n": len(pairs), "seed": args.seed, "loaded": len(loaded.records),
                          "excluded": dict(excluded), "excluded_by_loader": dict(loaded.excluded),
                          "first_excluded": loaded.account()["first_excluded"], "backend": judge.backend_name,
                          **({"data": data} if (data := sources.describe(name, options)) else {})}
    card = open_card(args.judge_dir, args.model_input)[1]  # a model without a card gets one, with the calibration
    card.calibration = {**card.calibration, **entry}
    card.save(args.judge_dir)
    print(json.dumps({k: v for k, v in entry.items() if k != "fitted_on"}, indent=2))
    print(f"calibration written to {Path(args.judge_dir) / 'judge_card.json'} ({len(pairs)} pairs of {name})")
    return 0
