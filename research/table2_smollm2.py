"""Paper Table 2 (study 004) at CPU scale: a classification head vs the generative baseline on the same decoder.

    OMP_NUM_THREADS=2 .venv/bin/python research/table2_smollm2.py [--retrain] [--speed-pairs 32] [--threads 2]

Trains the recipes train/cpu/table2-*.yaml (SmolLM2-135M classification head, SmolLM2-135M generative baseline,
MiniLM classification head: same data, split, hyperparameters; the decoders the same prompt; and the frozen
SmolLM2 embedding judge on the same pairs, no gradient steps) with
`clfjudge train`, one after another, and reports each judge's held-out metrics (from its judge card: accuracy
and macro F1 in the forward order, Auto-J agreement and position consistency over both orders, parse failures)
beside the paper's PandaLM columns and the two baselines. Then, on the held-out pairs, the F1 between the
judges' verdicts (as the study's Fig. 2) and judgements/s (threads pinned, median of 3 passes over
--speed-pairs pairs, one pair per judgement, batch 8). A judge directory that already holds a card is reused.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write  # noqa: E402

from clfjudge.paths import REPO_ROOT  # noqa: E402

RECIPES = {
    "SmolLM2-135M classification": "table2-smollm2-cls3.yaml",
    "SmolLM2-135M generation": "table2-smollm2-gen.yaml",
    "MiniLM-L6 classification": "table2-minilm-cls3.yaml",
    "SmolLM2-135M frozen + logistic regression": "table2-smollm2-embedding.yaml",
}
# Paper Table 2 (T004-2), PandaLM test, trained on PandaLM's 300k train set: acc, macro F1.
PAPER = {"Vicuna-7B generation": (72.37, 60.78), "Vicuna-7B classification": (70.87, 60.34),
         "DeBERTa classification": (72.27, 51.75)}


def recipe_config(recipe: str):
    from clfjudge.training.config import TrainConfig

    return TrainConfig.from_yaml(REPO_ROOT / "train" / "cpu" / recipe, [])


def train(recipe: str, retrain: bool) -> Path:
    from clfjudge.card import CARD_NAME

    out = REPO_ROOT / recipe_config(recipe).output_dir
    if retrain or not (out / CARD_NAME).exists():
        subprocess.run([sys.executable, "-m", "clfjudge.cli", "train", "--recipe",
                        str(REPO_ROOT / "train" / "cpu" / recipe), "--set", f"output_dir={out}"],
                       check=True, cwd=REPO_ROOT)
    return out


def held_out(recipe: str):
    """The recipe's held-out fold (splits are deterministic: the same records the card was scored on)."""
    from clfjudge.models.heads import HEADS
    from clfjudge.training.data import build_splits

    cfg = recipe_config(recipe)
    return build_splits(cfg, HEADS.get("cls3")()).test


def load(judge_dir: Path, threads: int):
    from clfjudge.card import JudgeCard
    from clfjudge.judges.base import Judge
    from clfjudge.judges.generative import GENERATIVE, GenerativeReader

    head = JudgeCard.load(judge_dir).head
    if head == GENERATIVE:
        judge = GenerativeReader.load(judge_dir, batch_size=8)
        return lambda recs: judge.verdicts(recs)
    judge = Judge.load(judge_dir, backend="sklearn" if head == "embedding" else "torch", threads=threads,
                       batch_size=8)

    def predict(recs):
        if head == "embedding":  # time the embedding too: texts seen in an earlier pass are cached
            judge.model.embedder.clear_cache()
        return [c.verdict for c in judge.compare_batch(recs)]
    return predict


def card_row(name: str, judge_dir: Path) -> dict[str, Any]:
    from clfjudge.card import JudgeCard

    card = JudgeCard.load(judge_dir)
    test = card.validation["test"]
    return {"judge": name, "dir": str(judge_dir.relative_to(REPO_ROOT)), "n": test["n"],
            "accuracy": test["accuracy"], "f1": test["f1"], "agreement": test.get("agreement"),
            "consistency": test.get("consistency"), "n_failed": test.get("n_failed", 0),
            "baselines": test["baselines"], "train_records": card.training["split"]["train"],
            "steps": card.training.get("global_steps", 0), "train_wall_s": card.training["wall_time_s"]}


def main() -> None:
    import torch

    from clfjudge.metrics import agreement_matrix

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--speed-pairs", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    dirs = {name: train(recipe, args.retrain) for name, recipe in RECIPES.items()}
    rows = [card_row(name, d) for name, d in dirs.items()]
    torch.set_num_threads(args.threads)
    records = held_out(next(iter(RECIPES.values())))
    verdicts, speed = {}, {}
    for name, d in dirs.items():
        predict = load(d, args.threads)
        verdicts[name] = predict(records)
        sample = records[: args.speed_pairs]
        passes = []
        for _ in range(3):
            start = time.perf_counter()
            predict(sample)
            passes.append(time.perf_counter() - start)
        speed[name] = len(sample) / statistics.median(passes)
    gold = {"gold (human majority)": [r.verdict for r in records]}
    matrix = agreement_matrix({**gold, **verdicts}, "verdict", failures="exclude").as_dict()
    for row in rows:
        row["judgements_per_s"] = speed[row["judge"]]
    cls, gen = speed["SmolLM2-135M classification"], speed["SmolLM2-135M generation"]
    result = {"machine": machine(args.threads), "threads": args.threads, "held_out_pairs": len(records), "rows": rows,
              "paper_pandalm": PAPER, "f1_between_judges": matrix, "speed_ratio_cls_over_gen": cls / gen,
              "recipes": RECIPES}
    write("table2_smollm2", result, markdown(result))


def markdown(r: dict[str, Any]) -> str:
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}"  # noqa: E731
    base = r["rows"][0]["baselines"]
    lines = [f"# Table 2 at CPU scale: classification head vs generative baseline ({r['machine']['date']})", "",
             f"Machine: {r['machine']['cpu']}, {r['threads']} threads. PandaLM test, fold 0 of a 10-fold split "
             f"grouped by instruction: {r['held_out_pairs']} held-out pairs; the judges are trained on the rest "
             "(capped, see the recipes train/cpu/table2-*.yaml). Accuracy / F1 in the forward order, a parse "
             "failure counted wrong; agreement = right in both orders (Auto-J protocol).", "",
             "| judge | train pairs | steps | train s | acc | macro F1 | agreement | consistency | parse failures "
             "| judgements/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['judge']} | {row['train_records']} | {row['steps']} | {row['train_wall_s']:.0f} | "
                     f"{pct(row['accuracy'])} | {pct(row['f1'])} | {pct(row['agreement'])} | "
                     f"{pct(row['consistency'])} | {row['n_failed']} | {row['judgements_per_s']:.1f} |")
    for name, m in base.items():
        lines.append(f"| baseline: {name} | | | | {pct(m['accuracy'])} | {pct(m['f1'])} | | | | |")
    for name, (acc, f1) in r["paper_pandalm"].items():
        lines.append(f"| paper: {name} (300k PandaLM pairs) | | | | {acc:.1f} | {f1:.1f} | | | | |")
    lines += ["", f"Classification head / generative baseline speed on SmolLM2: "
              f"{r['speed_ratio_cls_over_gen']:.2f}x (median of 3 passes over the first pairs, batch 8).", "",
              "F1 (%) between the judges' forward verdicts on the held-out pairs (paper Fig. 2 on JudgeLM: "
              "gen vs cls 83.3, cls vs DeBERTa 84.5):", ""]
    m = r["f1_between_judges"]
    names = m["names"]
    lines += ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i, a in enumerate(names):
        lines.append(f"| {a} | " + " | ".join(pct(m["values"][i][j]) for j in range(len(names))) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
