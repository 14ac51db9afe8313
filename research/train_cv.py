"""Fine-tuned MiniLM judges against the baselines and the embedding judge, on held-out grouped folds.

Experiments (each row trained from a recipe under train/cpu/ with ``--set`` overrides, one ``clfjudge train``
subprocess per fold, ``--jobs`` at a time):

- ``pairs``: PandaLM test and Auto-J test, the 5-fold split grouped by question of research/embedding_judge_cv.py
  (``splits.group_kfold(records, 5, seed 0)``); the fine-tuned rows are trained on the first ``--tune-folds``
  folds, and every row (majority class, longer answer wins, the MiniLM embedding judge) is scored on exactly
  those held-out records, in both answer orders.
- ``prometheus``: a MiniLM regression judge on Prometheus MT Bench + Vicuna Bench, grouped by question.
- ``alpaca``: the main recipe (train/cpu/main-minilm.yaml) and a 3-way cross-encoder on the answer-order-
  randomized pairs (train/cpu/alpacaeval-minilm-cls3.yaml), with the same grouped held-out AlpacaEval fold, scored
  on it and, for transfer, on PandaLM / Auto-J / LLMBar.

A fold whose judge directory already holds a card trained with the same config is reused (``--retrain`` to
force). Run: ``OMP_NUM_THREADS=1 .venv/bin/python research/train_cv.py [--experiments ...] [--tune-folds N]``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    LLMBAR,
    Embedders,
    Variant,
    judge_predictor,
    load,
    longer_predictor,
    machine,
    majority_predictor,
    pair_report,
    point_report,
    vs_longer_cell,
    write,
)

from clfjudge.card import JudgeCard  # noqa: E402
from clfjudge.data.records import PairRecord, PointRecord  # noqa: E402
from clfjudge.judges.base import Judge  # noqa: E402
from clfjudge.metrics import paired_difference  # noqa: E402
from clfjudge.models.heads import HEADS  # noqa: E402
from clfjudge.paths import REPO_ROOT  # noqa: E402
from clfjudge.training.config import TrainConfig  # noqa: E402
from clfjudge.training.data import Splits, build_splits  # noqa: E402

RUNS = REPO_ROOT / "runs" / "training" / "cv"
CPU = REPO_ROOT / "train" / "cpu"
PAIR_SETS = ("pandalm-test", "autoj-test")
PROMETHEUS = ("prometheus-mtbench", "prometheus-vicuna")


@dataclass(frozen=True)
class Row:
    """A fine-tuned row: a recipe plus overrides (the fold and the sources are added per run)."""

    name: str
    recipe: str
    overrides: tuple[str, ...] = ()
    mix_other_sets: bool = False  # pair rows: the other pair sets join the training split (extra_train_sources)


PAIR_ROWS = (
    Row("MiniLM cls3 (swap aug)", "pandalm-minilm-cls3-fold.yaml"),
    Row("MiniLM reward", "pandalm-minilm-reward-fold.yaml"),
    Row("MiniLM reward + length hint", "pandalm-minilm-reward-fold.yaml", ("length_hint=true",)),
    Row("MiniLM reward + length covariate", "pandalm-minilm-reward-fold.yaml", ("length_covariate=true",)),
    Row("MiniLM reward + length covariate + the other human set", "pandalm-minilm-reward-mixed-fold.yaml",
        mix_other_sets=True),
    Row("MiniLM reward + length covariate + neighbour negatives", "pandalm-minilm-reward-fold.yaml",
        ("length_covariate=true", "neighbour_negatives=2")),
)
POINT_ROW = Row("MiniLM regression", "prometheus-minilm-regression-fold.yaml")
# the same held-out AlpacaEval fold and transfer sets for every AlpacaEval-trained row
_ALPACA_SPLIT = ("test_fraction=0.1", f"eval_sources=[pandalm-test,autoj-test,{','.join(LLMBAR)}]",
                 "decontaminate_against=[prometheus-mtbench,prometheus-vicuna]")
ALPACA_ROWS = (
    Row("MiniLM main judge (AlpacaEval GPT-4)", "main-minilm.yaml", _ALPACA_SPLIT),
    Row("MiniLM cls3 (AlpacaEval GPT-4, order randomized, swap aug)", "alpacaeval-minilm-cls3.yaml", _ALPACA_SPLIT),
)


def slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


@dataclass(frozen=True)
class Run:
    row: Row
    tag: str  # where the judge goes under runs/training/cv/
    overrides: tuple[str, ...]

    @property
    def out(self) -> Path:
        return RUNS / self.tag / slug(self.row.name)

    def config(self) -> TrainConfig:
        return TrainConfig.from_yaml(CPU / self.row.recipe, [*self.row.overrides, *self.overrides,
                                                             f"output_dir={self.out}"])


def selected(row: Row, wanted: Sequence[str]) -> bool:
    """A row named exactly by one of ``wanted``, or (none named exactly) whose name contains one of them."""
    exact = [w for w in wanted if w in {r.name for r in PAIR_ROWS}]
    return row.name in exact if exact else any(w in row.name for w in wanted)


def fold_run(row: Row, sources: Sequence[str], folds: int, fold: int, seed: int) -> Run:
    tag = f"{'+'.join(sources)}/fold{fold}"
    mixed = [s for s in PAIR_SETS if s not in sources] if row.mix_other_sets else []
    return Run(row, tag, ("test_fraction=0", f"sources=[{','.join(sources)}]", f"cv_folds={folds}",
                          f"cv_fold={fold}", f"cv_seed={seed}",
                          *([f"extra_train_sources=[{','.join(mixed)}]"] if mixed else [])))


def trained(run: Run) -> bool:
    card = run.out / "judge_card.json"
    if not card.exists():
        return False
    # through TrainConfig, so that a card written before a config key existed compares with its default
    done = {k: v for k, v in asdict(TrainConfig.from_dict(JudgeCard.load(run.out).training["config"])).items()
            if k != "output_dir"}
    want = {k: v for k, v in asdict(run.config()).items() if k != "output_dir"}
    return done == want


def train_all(runs: Sequence[Run], jobs: int, retrain: bool) -> dict[str, float]:
    """Train every run not already trained (``jobs`` subprocesses at a time); wall seconds per judge dir."""
    todo = [r for r in runs if retrain or not trained(r)]

    def one(run: Run) -> None:
        run.out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "clfjudge.cli", "train", "--recipe", str(CPU / run.row.recipe)]
        for item in (*run.row.overrides, *run.overrides, f"output_dir={run.out}"):
            cmd += ["--set", item]
        print(f"  train {run.tag} {run.row.name}", flush=True)
        with open(run.out.parent / f"{run.out.name}.log", "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, todo))
    return {str(r.out): JudgeCard.load(r.out).training["wall_time_s"] for r in runs}


def held_out(run: Run) -> Splits:
    """The records the run trained on and held out (``build_splits`` is deterministic in the config)."""
    cfg = run.config()
    return build_splits(cfg, HEADS.get(cfg.head)())


def judge_pairs(run: Run, test: Sequence[PairRecord]) -> tuple[list, list]:
    judge = Judge.load(run.out, threads=1)
    both = judge.compare_batch(list(test)), judge.compare_batch([r.swapped() for r in test])
    return tuple([c.verdict for c in cs] for cs in both)


def vs_longer(gold: Sequence[PairRecord], ours: Sequence, longer: Sequence) -> dict[str, Any]:
    """Accuracy difference to longer-answer-wins on the same pairs (forward order), paired bootstrap CI."""
    right = lambda verdicts: [v == r.verdict for v, r in zip(verdicts, gold)]  # noqa: E731
    return paired_difference(right(ours), right(longer))


def pairs_experiment(args, embedders: Embedders) -> dict[str, Any]:
    """Every row on the held-out folds; with ``--transfer``, every fold's judge also on the LLMBar sets (no
    fold of theirs is trained on: their rows pool the fold judges, n = set size x folds)."""
    transfer = {name: load(name) for name in (LLMBAR if args.transfer else [])}
    out = {}
    for name in args.sets:
        runs = {row.name: [fold_run(row, [name], args.folds, k, args.seed) for k in range(args.tune_folds)]
                for row in PAIR_ROWS if selected(row, args.rows)}
        walls = train_all([r for rs in runs.values() for r in rs], args.jobs, args.retrain)
        gold: dict[str, list[PairRecord]] = {}
        preds: dict[str, dict[str, tuple[list, list]]] = {}

        def add(where: str, row: str, forward: list, backward: list, preds=preds) -> None:
            f, b = preds.setdefault(where, {}).setdefault(row, ([], []))
            f += forward
            b += backward

        for k in range(args.tune_folds):
            splits = held_out(fold_run(PAIR_ROWS[0], [name], args.folds, k, args.seed))
            train = splits.train[:splits.counts["train"]] + splits.dev  # without the swap-augmented copies
            judged = {"held-out": splits.test, **transfer}
            for where, recs in judged.items():
                gold.setdefault(where, []).extend(recs)
            for row, predictor in (("majority class", majority_predictor), ("longer answer wins", longer_predictor),
                                   ("MiniLM embedding judge (logreg +len)",
                                    judge_predictor(Variant("minilm", "logreg", True), embedders))):
                judge = predictor(train)
                for where, recs in judged.items():
                    add(where, row, *judge(recs))
            for row, rs in runs.items():
                for where, recs in judged.items():
                    add(where, row, *judge_pairs(rs[k], recs))
        held = preds.pop("held-out")
        rows = {row: pair_report(gold["held-out"], f, b) for row, (f, b) in held.items()}
        for row, rs in runs.items():
            rows[row]["train_wall_s"] = [walls[str(r.out)] for r in rs]
            rows[row]["vs_longer"] = vs_longer(gold["held-out"], held[row][0], held["longer answer wins"][0])
        out[name] = {"folds": args.folds, "scored_folds": list(range(args.tune_folds)), "n": len(gold["held-out"]),
                     "rows": rows,
                     "transfer": {where: {"n": len(gold[where]),
                                          "rows": {row: pair_report(gold[where], f, b) for row, (f, b) in ps.items()}}
                                  for where, ps in preds.items()}}
        embedders.save()
    return out


def prometheus_experiment(args, embedders: Embedders) -> dict[str, Any]:
    runs = [fold_run(POINT_ROW, PROMETHEUS, args.folds, k, args.seed) for k in range(args.tune_folds)]
    walls = train_all(runs, args.jobs, args.retrain)
    gold: list[PointRecord] = []
    pred: list[float] = []
    for run in runs:
        test = held_out(run).test
        gold += test
        pred += [s.value for s in Judge.load(run.out, threads=1).score_batch(test)]
    report = point_report(gold, np.array(pred))
    by_source = {name: point_report([g for g in gold if g.source == name],
                                    np.array([p for g, p in zip(gold, pred) if g.source == name]))
                 for name in PROMETHEUS}
    return {"folds": args.folds, "scored_folds": list(range(args.tune_folds)), "n": len(gold),
            "rows": {POINT_ROW.name: {**report, "by_source": by_source,
                                      "train_wall_s": [walls[str(r.out)] for r in runs]}}}


def alpaca_experiment(args, embedders: Embedders) -> dict[str, Any]:
    rows = [row for row in ALPACA_ROWS if any(w in row.name for w in args.alpaca_rows)]
    runs = [Run(row, "alpacaeval", ()) for row in rows]
    walls = train_all(runs, 1, args.retrain)
    parts = {}
    for row, run in zip(rows, runs):
        card = JudgeCard.load(run.out)
        parts[row.name] = {"recipe": row.recipe, "overrides": list(row.overrides), "split": card.training["split"],
                           "train_wall_s": walls[str(run.out)], "validation": card.validation}
    return parts


EXPERIMENTS = {"pairs": pairs_experiment, "prometheus": prometheus_experiment, "alpaca": alpaca_experiment}


# -- report -----------------------------------------------------------------------------------------------

# The empirical study's Table 2 (digest §2.1): fine-tuned judges at full scale on these test sets.
PAPER = {
    "pandalm-test": {"DeBERTa-v3-large cls (paper)": (72.27, 51.75, None),
                     "Vicuna-7B cls (paper)": (70.87, 60.34, None)},
    "autoj-test": {"DeBERTa-v3-large cls (paper)": (None, None, 31.7), "Vicuna-7B cls (paper)": (None, None, 46.8)},
}
PAPER_PROMETHEUS = {"DeBERTa-v3-large cls (paper, ind / ood)": "0.835 / 0.813",
                    "Vicuna-7B cls (paper, ind / ood)": "0.846 / 0.831"}


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def markdown(result: dict[str, Any]) -> str:
    m, ex = result["machine"], result["experiments"]
    lines = [f"# Fine-tuned MiniLM judges: held-out grouped folds ({m['date']})", "",
             f"CPU: {m['cpu']} ({m['cores']} cores, {m['threads']} thread per process, {result['jobs']} "
             f"trainings at a time); commit {m['commit']}; total wall {result['wall_seconds']:.0f} s. Recipes: "
             "train/cpu/*.yaml (+ the overrides named per row).", ""]
    for name, part in ex.get("pairs", {}).items():
        lines += [f"## {name}: fold(s) {part['scored_folds']} of the {part['folds']}-fold split grouped by "
                  f"question (n = {part['n']} held-out pairs)", "",
                  "| row | acc | macro F1 | acc (non-tie gold) | Auto-J agreement | position consistency | "
                  "acc - longer-wins acc [95% CI] (won / lost pairs) | train wall s |",
                  "|---|---|---|---|---|---|---|---|"]
        for row, r in part["rows"].items():
            wall = "+".join(f"{w:.0f}" for w in r.get("train_wall_s", [])) or "-"
            diff = vs_longer_cell(r.get("vs_longer"))
            lines.append(f"| {row} | {_f(r['accuracy'])} | {_f(r['f1'])} | {_f(r['accuracy_non_tie_gold'])} "
                         f"| {_f(r['agreement'])} | {_f(r['consistency'])} | {diff} | {wall} |")
        for row, (acc, f1, agree) in PAPER.get(name, {}).items():
            pct = lambda x: "" if x is None else f"{x / 100:.3f}"  # noqa: E731
            lines.append(f"| {row} | {pct(acc)} | {pct(f1)} | | {pct(agree)} | | | |")
        lines.append("")
        if part.get("transfer"):
            sets = list(part["transfer"])
            lines += [f"Transfer: the same fold judges on LLMBar (accuracy; no ties; each set scored by every fold's "
                      f"judge, n = set size x {len(part['scored_folds'])})", "",
                      "| row | " + " | ".join(f"{w} ({part['transfer'][w]['n']})" for w in sets) + " |",
                      "|---|" + "---|" * len(sets)]
            for row in part["transfer"][sets[0]]["rows"]:
                lines.append(f"| {row} | " + " | ".join(_f(part["transfer"][w]["rows"][row]["accuracy"])
                                                        for w in sets) + " |")
            lines.append("")
    if "prometheus" in ex:
        part = ex["prometheus"]
        lines += [f"## Prometheus MT Bench + Vicuna Bench: regression, fold(s) {part['scored_folds']} of "
                  f"{part['folds']} grouped by question (n = {part['n']} held-out answers)", "",
                  "| row | Pearson | Kendall | Spearman | Pearson mt_bench | Pearson vicuna | train wall s |",
                  "|---|---|---|---|---|---|---|"]
        for row, r in part["rows"].items():
            bs = r["by_source"]
            lines.append(f"| {row} | {_f(r['pearson'])} | {_f(r['kendall'])} | {_f(r['spearman'])} | "
                         f"{_f(bs['prometheus-mtbench']['pearson'])} | {_f(bs['prometheus-vicuna']['pearson'])} | "
                         f"{'+'.join(f'{w:.0f}' for w in r['train_wall_s'])} |")
        lines += [f"| {row} | {v} | | | | | |" for row, v in PAPER_PROMETHEUS.items()]
        lines.append("")
    for name, part in ex.get("alpaca", {}).items():
        lines += [f"## {name}: held-out AlpacaEval instructions and transfer (trained in "
                  f"{part['train_wall_s']:.0f} s)", "",
                  f"Recipe train/cpu/{part['recipe']} with {part['overrides']}; split {part['split']}.", "",
                  "| set | n | judge acc | judge macro F1 | Auto-J agreement | position consistency | "
                  "majority acc | longer-wins acc |", "|---|---|---|---|---|---|---|---|"]
        for key, v in part["validation"].items():
            base = v.get("baselines", {})
            lines.append(f"| {key} | {v['n']} | {_f(v['accuracy'])} | {_f(v['f1'])} | {_f(v.get('agreement'))} | "
                         f"{_f(v.get('consistency'))} | {_f(base.get('majority-class', {}).get('accuracy'))} | "
                         f"{_f(base.get('longer-answer-wins', {}).get('accuracy'))} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    parser.add_argument("--sets", nargs="+", default=list(PAIR_SETS), choices=list(PAIR_SETS))
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--tune-folds", type=int, default=1, help="folds the fine-tuned rows are trained on")
    parser.add_argument("--seed", type=int, default=0, help="fold seed (research/embedding_judge_cv.py uses 0)")
    parser.add_argument("--rows", nargs="+", default=[""],
                        help="fine-tuned pair rows: exact names, or substrings of names")
    parser.add_argument("--alpaca-rows", nargs="+", default=[""], help="AlpacaEval rows: substrings of names")
    parser.add_argument("--transfer", action="store_true", help="also score every pair row on the LLMBar sets")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "clfjudge" / "embeddings")
    parser.add_argument("--name", default="train_cv")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    embedders = Embedders(args.cache_dir)
    result: dict[str, Any] = {"machine": machine(1), "jobs": args.jobs, "argv": sys.argv[1:], "experiments": {}}
    for name in args.experiments:
        print(f"== {name}", flush=True)
        result["experiments"][name] = EXPERIMENTS[name](args, embedders)
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    print(write(args.name, result, markdown(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
