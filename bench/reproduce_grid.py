"""The CPU-scale reproduction: train every recipe in train/cpu/, export each to int8 through the parity gate,
audit them all beside the released judges' files and SemScore, and write the report. Generative judges
(``head: generative``) have no ONNX form: they are audited as ``gen:`` judges with PyTorch.

    python bench/reproduce_grid.py [--recipes train/cpu/*.yaml] [--out bench/results/grid_audit_<date>] [--limit N]

Judges that already exist under runs/grid-cpu/ are reused (delete them to retrain). Each recipe's wall time
is in its judge card; the audit's report.md / metrics.json / PNGs land in --out.
"""
from __future__ import annotations

import argparse
from datetime import date
from pathlib import Path

from clfjudge.audit import run_audit
from clfjudge.card import JudgeCard
from clfjudge.export import export_judge
from clfjudge.generative import GENERATIVE
from clfjudge.pipeline import REFERENCE_JUDGES
from clfjudge.training import TrainConfig, train

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", type=Path, default=sorted((REPO / "train" / "cpu").glob("*.yaml")))
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "grid-cpu")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"grid_audit_{date.today().isoformat()}")
    parser.add_argument("--limit", type=int, help="records per test set in the audit (default: all)")
    args = parser.parse_args()

    judges = []
    for recipe in args.recipes:
        judge_dir = args.runs / recipe.stem
        onnx_dir = args.runs / f"{recipe.stem}-onnx"
        if not (judge_dir / "judge_card.json").exists():
            print(f"[grid] training {recipe}")
            train(TrainConfig.from_yaml(recipe, [f"output_dir={judge_dir}"]))
        if JudgeCard.load(judge_dir).head == GENERATIVE:
            judges.append(f"gen:{judge_dir}")
            continue
        if not onnx_dir.exists():
            print(f"[grid] exporting {judge_dir} (int8, parity gate)")
            export_judge(judge_dir, onnx_dir, int8=True)
        judges.append(str(onnx_dir))
    run_audit([*judges, *REFERENCE_JUDGES], args.out, limit=args.limit)
    print(f"[grid] report: {args.out / 'report.md'}")


if __name__ == "__main__":
    main()
