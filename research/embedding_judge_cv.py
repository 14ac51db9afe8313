"""Real runs of the embedding judge (frozen sentence encoder + scikit-learn head), every row beside the
majority class and "longer answer wins", with and without explicit length features.

Experiments (``--experiments``):
- ``pandalm``, ``autoj``: 5-fold CV grouped by question (3-way, with ties); accuracy, macro F1, accuracy on
  the non-tie gold pairs, position consistency and the Auto-J agreement protocol (both answer orders).
  The "+ X train" rows add the pairs of ``--mix`` X (default: AlpacaEval GPT-4), decontaminated against the
  CV set, to every training fold.
- ``alpacaeval``: AlpacaEval GPT-4 pairs (answer order randomised with ``--seed``: output_1 is always
  text_davinci_003) trained on its own instructions, tested on held-out AlpacaEval instructions and on PandaLM
  test, Auto-J test and the five LLMBar sets, after removing training pairs whose question is in any of
  them. Extra rows add LLMBar-style neighbour hard negatives built from the training pairs only.
- ``prometheus``: a regression judge on Prometheus mt_bench + vicuna eval (5-fold CV grouped by question);
  Pearson / Kendall / Spearman per set and pooled.

Embeddings are cached on disk per encoder (``--cache-dir``), so a rerun only trains heads.
Writes research/results/embedding_judge_<date>.json and .md.

    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 .venv/bin/python research/embedding_judge_cv.py
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    LLMBAR,
    Embedders,
    PairPredictor,
    PointPredictor,
    Variant,
    cpu_model,
    judge_predictor,
    load,
    longer_predictor,
    majority_predictor,
    pair_report,
    point_report,
    vs_longer_cell,
)

from clfjudge.card import library_versions
from clfjudge.data.records import PairRecord, Verdict
from clfjudge.data.splits import decontaminate, group_kfold, train_dev_split
from clfjudge.judges.embedding import AUTO_C_GRID, EmbeddingModel, neighbour_negatives
from clfjudge.judges.features import log_lengths, majority_score
from clfjudge.metrics import paired_difference
from clfjudge.registry import Registry
from clfjudge.training.data import randomize_order

RESULTS = Path(__file__).resolve().parent / "results"
ALPACA = "alpacaeval-gpt4"

def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


# ---------------------------------------------------------------------------------------------------
# predictors


COS_ONLY = ("cos_diff", "cos_sym")


def pair_variants(encoders: Sequence[str], heads: Sequence[str]) -> list[Variant]:
    """Per encoder and with / without length: logreg on the default features and on the question-answer
    similarity scalars only ("(cos)"); gbdt on the similarity scalars only (trees over 1.5k embedding columns
    cost minutes per fit on 2 cores)."""
    configs = {"logreg": [(None, ""), (COS_ONLY, "(cos)")], "gbdt": [(COS_ONLY, "(cos)")]}
    return [Variant(enc, head, use_length, features, label)
            for enc in encoders for head in heads for features, label in configs[head]
            for use_length in (True, False)]


ANSWER_ONLY = ("diff", "abs_diff")


def answer_variants(decoders: Sequence[str], encoders: Sequence[str]) -> list[Variant]:
    """Logreg (C=auto) on the answer vectors only, A - B and |A - B|: per decoder (each answer read after its
    question), with and without length, and the first sentence encoder with length, for comparison."""
    rows = [Variant(dec, "logreg", use_length, ANSWER_ONLY, "(answers)", True)
            for dec in decoders for use_length in (True, False)]
    return rows + [Variant(enc, "logreg", True, ANSWER_ONLY, "(answers)", True) for enc in encoders[:1]]


def pair_rows(encoders: Sequence[str], heads: Sequence[str], embedders: Embedders) -> dict[str, PairPredictor]:
    rows: dict[str, PairPredictor] = {"majority class": majority_predictor, "longer answer wins": longer_predictor}
    rows["logreg on length features only"] = judge_predictor(Variant(encoders[0], "logreg", True, ()), embedders)
    for variant in pair_variants(encoders, heads):
        rows[variant.name] = judge_predictor(variant, embedders)
    return rows


# ---------------------------------------------------------------------------------------------------
# experiments


def against_longer(records: Sequence[PairRecord], out: dict[str, Any], forward: dict[str, list[Verdict]]) -> None:
    """Every row's accuracy difference to longer-answer-wins on the same records, with a paired bootstrap CI."""
    longer = forward.get("longer answer wins")
    if longer is None:
        return
    longer_right = [v == r.verdict for v, r in zip(longer, records)]
    for name, verdicts in forward.items():
        out[name]["vs_longer"] = paired_difference([v == r.verdict for v, r in zip(verdicts, records)], longer_right)


def cross_validate(records: list[PairRecord], rows: dict[str, PairPredictor], k: int, seed: int) -> dict[str, Any]:
    folds = group_kfold(records, k, seed)
    out, forward_of = {}, {}
    for name, predictor in rows.items():
        start = time.perf_counter()
        forward: list[Verdict | None] = [None] * len(records)
        backward: list[Verdict | None] = [None] * len(records)
        fold_acc = []
        for train_idx, test_idx in folds:
            f, b = predictor([records[i] for i in train_idx])([records[i] for i in test_idx])
            for i, fv, bv in zip(test_idx, f, b):
                forward[i], backward[i] = fv, bv
            fold_acc.append(np.mean([fv == records[i].verdict for i, fv in zip(test_idx, f)]))
        forward_of[name] = forward
        out[name] = {**pair_report(records, forward, backward), "fold_accuracy_std": float(np.std(fold_acc)),
                     "seconds": round(time.perf_counter() - start, 1)}
        print(f"    {name:45s} acc {out[name]['accuracy']:.3f} f1 {out[name]['f1']:.3f} "
              f"agree {out[name]['agreement']:.3f} ({out[name]['seconds']}s)", flush=True)
    against_longer(records, out, forward_of)
    return out


def alpaca_encoders(args) -> list[str]:
    """Encoders used wherever the 20k AlpacaEval pairs are embedded (MPNet needs hours for them on 2 cores)."""
    return [e for e in args.encoders if e in args.alpaca_encoders]


def mixed_in(mix: str, source: str, records: Sequence[PairRecord], seed: int) -> tuple[list[PairRecord], dict]:
    """The pairs of ``mix`` (source names joined by "+"), answer order randomised, decontaminated against the
    CV set ``source``."""
    pairs = [p for name in mix.split("+") for p in randomize_order(load(name), seed)[0]]
    kept, removed, _ = decontaminate(pairs, {source: records})
    return kept, {"n_added_per_fold": len(kept), "n_removed_contaminated": removed}


def cv_experiment(source: str, args, embedders: Embedders) -> dict[str, Any]:
    """The pair rows, plus per ``--mix`` entry the logreg rows trained on every fold + that mix."""
    records = load(source)
    rows = pair_rows(args.encoders, args.heads, embedders)
    rows.update({v.name: judge_predictor(v, embedders) for v in answer_variants(args.decoders, args.encoders)})
    mixing = {}
    for mix in [m for m in args.mix if source not in m.split("+")]:
        extra, mixing[mix] = mixed_in(mix, source, records, args.seed)
        for encoder in alpaca_encoders(args):
            for use_length in (True, False):
                rows[f"{Variant(encoder, 'logreg', use_length).name} + {mix} train"] = judge_predictor(
                    Variant(encoder, "logreg", use_length), embedders, extra)
    return {"source": source, "n": len(records), "folds": args.folds, "grouped_by": "normalized question",
            "mixing": mixing, "rows": cross_validate(records, rows, args.folds, args.seed)}


def alpacaeval_experiment(args, embedders: Embedders) -> dict[str, Any]:
    pairs, _ = randomize_order(load(ALPACA), args.seed)
    train_idx, dev_idx = train_dev_split(pairs, args.alpaca_dev_fraction, args.seed)
    dev = [pairs[i] for i in dev_idx]
    evals = {"alpacaeval-dev": dev, **{name: load(name) for name in ["pandalm-test", "autoj-test", *LLMBAR]}}
    train, removed, removed_by_set = decontaminate([pairs[i] for i in train_idx], evals)
    encoders = alpaca_encoders(args)
    rows = pair_rows(encoders, args.heads, embedders)
    negatives_by_encoder = {}
    for encoder in encoders:
        negatives = neighbour_negatives(train, embedders.get(encoder), seed=args.seed)
        negatives_by_encoder[encoder] = len(negatives)
        for copies in (1, 5):
            extra = negatives * copies
            for use_length in (True, False):
                rows[f"{encoder} logreg {'+' if use_length else '-'}len + {copies}x neighbour negatives"] = \
                    judge_predictor(Variant(encoder, "logreg", use_length), embedders, extra)
    out: dict[str, Any] = {}
    for name, predictor in rows.items():
        start = time.perf_counter()
        out[name] = {}
        judge = predictor(train)
        for set_name, test in evals.items():
            out[name][set_name] = pair_report(test, *judge(test))
        out[name]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"    {name:55s} " + " ".join(f"{s[:12]} {out[name][s]['accuracy']:.3f}" for s in evals), flush=True)
    return {"source": ALPACA, "n_pairs": len(pairs), "n_train": len(train), "n_dev": len(dev),
            "dev_fraction_of_questions": args.alpaca_dev_fraction, "n_removed_contaminated": removed,
            "removed_by_eval_set": removed_by_set, "neighbour_negatives": negatives_by_encoder,
            "eval_sets": {k: len(v) for k, v in evals.items()}, "rows": out}


def point_rows(encoders: Sequence[str], heads: Sequence[str], embedders: Embedders,
               decoders: Sequence[str] = ()) -> dict[str, PointPredictor]:
    def judge_rows(encoder: str, head: str, use_length: bool, features=None, label=""):
        def fit(train):
            embedder = embedders.get(encoder)
            return EmbeddingModel(backbone=embedder.backbone, head=head, arity="point", features=features,
                                  use_length=use_length, embedder=embedder).fit(train).predict

        return f"{encoder} {head}{label} {'+' if use_length else '-'}len", fit

    def majority(train):
        score = majority_score(train)
        return lambda test: np.full(len(test), score)

    rows: dict[str, PointPredictor] = {
        "majority score": majority,
        "longer answer scores higher": lambda train: lambda test: log_lengths([r.answer for r in test])[:, 0],
    }
    point_heads = {"logreg": "ridge", "gbdt": "gbdt"}
    for encoder in encoders:
        for head in heads:
            for use_length in (True, False):
                name, fn = judge_rows(encoder, point_heads[head], use_length)
                rows[name] = fn
        name, fn = judge_rows(encoder, "ridge", True, ("q", "a", "qa_prod", "cos", "ref_cos"), " +ref_cos")
        rows[name] = fn
    for decoder in decoders:  # the answer vector alone (a decoder reads it after the question), then all groups
        for use_length in (True, False):
            name, fn = judge_rows(decoder, "ridge", use_length, ("a",), " (answer)")
            rows[name] = fn
        name, fn = judge_rows(decoder, "ridge", True)
        rows[name] = fn
    return rows


def prometheus_experiment(args, embedders: Embedders) -> dict[str, Any]:
    parts = {name: load(name) for name in ("prometheus-mtbench", "prometheus-vicuna")}
    records = [r for recs in parts.values() for r in recs]
    folds = group_kfold(records, args.folds, args.seed)
    out = {}
    for name, predictor in point_rows(args.encoders, args.heads, embedders, args.decoders).items():
        start = time.perf_counter()
        pred = np.zeros(len(records))
        for train_idx, test_idx in folds:
            pred[test_idx] = predictor([records[i] for i in train_idx])([records[i] for i in test_idx])
        out[name] = {"all": point_report(records, pred)}
        for part in parts:
            idx = [i for i, r in enumerate(records) if r.source == part]
            out[name][part] = point_report([records[i] for i in idx], pred[idx])
        out[name]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"    {name:45s} pearson {out[name]['all']['pearson']}", flush=True)
    return {"sources": list(parts), "n": len(records), "folds": args.folds, "grouped_by": "normalized question",
            "note": "gold = mean of the three GPT-4 scores; the judge never sees the rubric, only the "
                    "'+ref_cos' rows see the score-5 reference answer (cosine to the answer)",
            "rows": out}


def transfer_experiment(args, embedders: Embedders) -> dict[str, Any]:
    """Train on all of one human-labelled set, test on the other and on LLMBar: does what a judge learnt on
    one set's questions and answering models carry over to other models and to adversarial pairs?"""
    sets = {name: load(name) for name in ["pandalm-test", "autoj-test", *LLMBAR]}
    rows = {"majority class": majority_predictor, "longer answer wins": longer_predictor,
            Variant(args.encoders[0], "logreg", True).name: judge_predictor(Variant(args.encoders[0], "logreg", True),
                                                                            embedders),
            **{v.name: judge_predictor(v, embedders) for v in answer_variants(args.decoders, args.encoders)}}
    out = {}
    for train_name in ("pandalm-test", "autoj-test"):
        print(f"  train on {train_name}", flush=True)
        evals = {name: recs for name, recs in sets.items() if name != train_name}
        by_set: dict[str, dict[str, Any]] = {name: {} for name in evals}
        forward_of: dict[str, dict[str, list[Verdict]]] = {name: {} for name in evals}
        for row, predictor in rows.items():
            judge = predictor(sets[train_name])
            for name, recs in evals.items():
                forward, backward = judge(recs)
                forward_of[name][row] = forward
                by_set[name][row] = pair_report(recs, forward, backward)
            print(f"    {row:45s} " + " ".join(f"{n} {by_set[n][row]['accuracy']:.3f}" for n in evals), flush=True)
        for name, recs in evals.items():
            against_longer(recs, by_set[name], forward_of[name])
        out[train_name] = by_set
    return {"trained_on": list(out), "eval_sets": {k: len(v) for k, v in sets.items()}, "results": out}


EXPERIMENTS: Registry[Callable[[argparse.Namespace, Embedders], dict[str, Any]]] = Registry("experiment")
EXPERIMENTS.register("pandalm", lambda args, emb: cv_experiment("pandalm-test", args, emb))
EXPERIMENTS.register("autoj", lambda args, emb: cv_experiment("autoj-test", args, emb))
EXPERIMENTS.register("alpacaeval", alpacaeval_experiment)
EXPERIMENTS.register("prometheus", prometheus_experiment)
EXPERIMENTS.register("transfer", transfer_experiment)


# ---------------------------------------------------------------------------------------------------
# report


def _fmt(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [f"# Embedding judge: real runs ({meta['date']})", "",
             f"CPU: {meta['cpu']} ({meta['cores']} cores, OMP_NUM_THREADS={meta['omp_threads']}); "
             f"total wall time {meta['wall_seconds']:.0f} s; commit {meta['git_commit']}; seed {meta['seed']}.",
             f"Encoders: {', '.join(meta['encoders'])}; decoders: {', '.join(meta.get('decoders', [])) or 'none'} "
             "(middle layer, each answer read after its question in the chat template). Logreg C = 0.01 (chosen on "
             "an AlpacaEval instruction split) unless the row says C=auto: chosen from "
             f"{list(AUTO_C_GRID)} by 3-fold question-grouped CV inside each training fold. Features "
             "group-balanced; judges are position-invariant by construction. '(answers)': A - B and |A - B| of the "
             "answer vectors only. Last column: accuracy minus longer-answer-wins accuracy on the same pairs, "
             "paired bootstrap 95% CI (pairs won / lost).", ""]
    ex = result["experiments"]
    for key in ("pandalm", "autoj"):
        if key not in ex:
            continue
        e = ex[key]
        lines += [f"## {e['source']}: {e['folds']}-fold CV grouped by question (n = {e['n']}; wall "
                  f"{e['wall_seconds']:.0f} s)", "",
                  *[f"'+ {mix} train' rows add {m['n_added_per_fold']} pairs of {mix} (answer order randomised) to "
                    f"each training fold ({m['n_removed_contaminated']} removed as contaminated)." for mix, m in
                    e["mixing"].items()], "",
                  "| row | acc | macro F1 | acc (non-tie gold) | Auto-J agreement | position consistency | s | "
                  "acc - longer [95% CI] |", "|---|---|---|---|---|---|---|---|"]
        for name, r in e["rows"].items():
            lines.append(f"| {name} | {_fmt(r['accuracy'])} | {_fmt(r['f1'])} "
                         f"| {_fmt(r['accuracy_non_tie_gold'])} | {_fmt(r['agreement'])} "
                         f"| {_fmt(r['consistency'])} | {r['seconds']} "
                         f"| {vs_longer_cell(r.get('vs_longer'))} |")
        lines.append("")
    if "alpacaeval" in ex:
        e = ex["alpacaeval"]
        sets = list(e["eval_sets"])
        lines += ["## AlpacaEval GPT-4 -> held-out instructions and other schemes "
                  f"(wall {e['wall_seconds']:.0f} s)", "",
                  f"{e['n_pairs']} pairs, answer order randomised; train {e['n_train']} after removing "
                  f"{e['n_removed_contaminated']} contaminated ({e['removed_by_eval_set']}); held-out AlpacaEval "
                  f"{e['n_dev']} pairs. Neighbour negatives per encoder: {e['neighbour_negatives']}. "
                  "Accuracy (3-way; LLMBar has no ties); Auto-J test in brackets: Auto-J agreement.", "",
                  "| row | " + " | ".join(f"{s} ({e['eval_sets'][s]})" for s in sets) + " |",
                  "|---|" + "---|" * len(sets)]
        for name, r in e["rows"].items():
            cells = [_fmt(r[s]["accuracy"]) + (f" [{_fmt(r[s]['agreement'])}]" if s == "autoj-test" else "")
                     for s in sets]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    if "prometheus" in ex:
        e = ex["prometheus"]
        lines += [f"## Prometheus mt_bench + vicuna: regression judge, {e['folds']}-fold CV grouped by question "
                  f"(n = {e['n']}; wall {e['wall_seconds']:.0f} s)", "", e["note"] + ".", "",
                  "| row | Pearson | Kendall | Spearman | Pearson mt_bench | Pearson vicuna |",
                  "|---|---|---|---|---|---|"]
        for name, r in e["rows"].items():
            a = r["all"]
            lines.append(f"| {name} | {_fmt(a['pearson'])} | {_fmt(a['kendall'])} | {_fmt(a['spearman'])} | "
                         f"{_fmt(r['prometheus-mtbench']['pearson'])} | {_fmt(r['prometheus-vicuna']['pearson'])} |")
        lines.append("")
    if "transfer" in ex:
        e = ex["transfer"]
        lines += [f"## Transfer: trained on all of one human-labelled set, tested on the others (wall "
                  f"{e['wall_seconds']:.0f} s)", "",
                  "Accuracy (3-way; LLMBar has no ties); below it, accuracy minus longer-answer-wins on the same "
                  "pairs [paired bootstrap 95% CI].", ""]
        for trained_on, by_set in e["results"].items():
            sets = list(by_set)
            lines += [f"### trained on {trained_on}", "",
                      "| row | " + " | ".join(f"{s} ({e['eval_sets'][s]})" for s in sets) + " |",
                      "|---|" + "---|" * len(sets)]
            for row in by_set[sets[0]]:
                cells = []
                for s in sets:
                    r, d = by_set[s][row], by_set[s][row].get("vs_longer")
                    delta = f"<br>{d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]" if d else ""
                    cells.append(_fmt(r["accuracy"]) + delta)
                lines.append(f"| {row} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", nargs="+", default=EXPERIMENTS.names(), choices=EXPERIMENTS.names())
    parser.add_argument("--encoders", nargs="+", default=["minilm", "mpnet"])
    parser.add_argument("--decoders", nargs="*", default=["smollm2"],
                        help="pandalm / autoj / transfer: decoder backbones whose middle layer embeds each answer "
                             "read after its question")
    parser.add_argument("--heads", nargs="+", default=["logreg", "gbdt"], choices=["logreg", "gbdt"])
    parser.add_argument("--alpaca-encoders", nargs="+", default=["minilm"],
                        help="encoders for the rows that embed the large sets "
                             "(the AlpacaEval transfer experiment and --mix)")
    parser.add_argument("--mix", nargs="*", default=[ALPACA],
                        help="pandalm / autoj: sources mixed into every training fold, one set of rows per entry "
                             "(join sources with '+' to mix them together; an entry naming the CV set is skipped)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpaca-dev-fraction", type=float, default=0.2)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "clfjudge" / "embeddings")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    args = parser.parse_args(argv)

    embedders = Embedders(args.cache_dir)
    start = time.perf_counter()
    experiments = {}
    for name in args.experiments:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        experiments[name] = EXPERIMENTS.get(name)(args, embedders)
        experiments[name]["wall_seconds"] = round(time.perf_counter() - t0, 1)
        embedders.save()
    date = datetime.now(timezone.utc)
    result = {
        "meta": {"date": date.isoformat(timespec="seconds"), "cpu": cpu_model(), "cores": os.cpu_count(),
                 "omp_threads": os.environ.get("OMP_NUM_THREADS", "unset"), "python": sys.version.split()[0],
                 "versions": library_versions(), "git_commit": git_commit(), "seed": args.seed,
                 "encoders": args.encoders, "decoders": args.decoders, "alpaca_encoders": alpaca_encoders(args),
                 "heads": args.heads,
                 "argv": sys.argv[1:],
                 "wall_seconds": round(time.perf_counter() - start, 1)},
        "experiments": experiments,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"embedding_judge_{date.strftime('%Y-%m-%d')}{'_' + args.tag if args.tag else ''}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(f"wrote {args.out / stem}.json and .md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
