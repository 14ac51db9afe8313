"""The CPU-scale reproduction: train every recipe in train/cpu/, export each to int8 through the parity gate,
audit them all beside the released judges' files and SemScore, and write the report. Generative judges
(``head: generative``) have no ONNX form: their directories are audited as they are, with PyTorch.

    python research/reproduce_grid.py [--recipes train/cpu/*.yaml] [--limit N]
        [--out research/results/grid_audit_<date>]

Each recipe's judge goes to its own output_dir; one that already holds a card is reused (delete it to retrain).
--extra adds judges trained elsewhere (e.g. the main job's runs/main/judge). Each recipe's wall time is in its
judge card; the audit's report.md / metrics.json / PNGs land in --out.
"""
from __future__ import annotations

import argparse
from datetime import date
from pathlib import Path

from clfjudge.audit import run_audit
from clfjudge.card import JudgeCard
from clfjudge.export.gate import ParityError
from clfjudge.export.onnx import export_judge
from clfjudge.judges.generative import GENERATIVE
from clfjudge.pipeline import REFERENCE_JUDGES
from clfjudge.training.config import TrainConfig
from clfjudge.training.trainer import train

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", type=Path, default=sorted((REPO / "train" / "cpu").glob("*.yaml")))
    parser.add_argument("--extra", nargs="*", type=Path, default=[], help="trained judge directories to add")
    parser.add_argument("--out", type=Path,
                        default=REPO / "research" / "results" / f"grid_audit_{date.today().isoformat()}")
    parser.add_argument("--limit", type=int, help="records per test set in the audit (default: all)")
    args = parser.parse_args()

    judges = []
    for recipe in args.recipes:
        judge_dir = REPO / TrainConfig.from_yaml(recipe, []).output_dir
        if not (judge_dir / "judge_card.json").exists():
            print(f"[grid] training {recipe}")
            train(TrainConfig.from_yaml(recipe, [f"output_dir={judge_dir}"]))
    for judge_dir in [REPO / TrainConfig.from_yaml(r, []).output_dir for r in args.recipes] + args.extra:
        onnx_dir = judge_dir.parent / f"{judge_dir.name}-onnx"
        if JudgeCard.load(judge_dir).head == GENERATIVE:
            judges.append(str(judge_dir))
            continue
        if not onnx_dir.exists():
            print(f"[grid] exporting {judge_dir} (int8, parity gate)")
            try:
                export_judge(judge_dir, onnx_dir, int8=True)
            except ParityError as exc:  # int8 tips this judge's decisions: audit its fp32 export instead
                print(f"[grid] int8 refused for {judge_dir}: {exc}; exporting fp32")
                export_judge(judge_dir, onnx_dir)
        judges.append(str(onnx_dir))
    run_audit([*judges, *REFERENCE_JUDGES], args.out, limit=args.limit)
    print(f"[grid] report: {args.out / 'report.md'}")


if __name__ == "__main__":
    main()
