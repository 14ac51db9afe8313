"""Recompute the released judges' published metrics from their released prediction files.

PandaLM-7B and gpt-3.5-turbo on the PandaLM test (accuracy, macro P/R/F1), Auto-J-13B on the Auto-J test
(agreement, consistency), each with percentile bootstrap CIs, beside the published figures and beside "longer
answer wins" on the same records (paired difference). Also:
how the PandaLM gold depends on the annotator votes, and what the study's own tie-breaking code
(UnlimitedJudge ``build_dataset``) does to these numbers.

Writes research/results/released_<YYYY-MM-DD>.json and .md.

    python research/reproduce_released.py [--boot 1000] [--sims 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import scipy
import sklearn

from clfjudge.audit.released import (
    PANDALM_CODES,
    RAW_GOLD,
    RELEASED,
    Aligned,
    ReleasedPredictions,
    gold_verdicts,
    majority_verdict,
    read_pandalm_votes,
)
from clfjudge.data import sources
from clfjudge.data.records import Verdict
from clfjudge.judges.features import longer_answer_wins
from clfjudge.metrics import (
    CI,
    autoj_agreement,
    bootstrap_ci,
    paired_difference,
    pairwise_metrics,
    position_consistency,
)
from clfjudge.paths import data_root

RESULTS = Path(__file__).resolve().parent / "results"
PAIRWISE_KEYS = ("accuracy", "precision", "recall", "f1")
AGREEMENT_KEYS = ("agreement", "consistency", "forward_accuracy")

# Published figures, in percent. "study" = the empirical study's Table 3 (T004-3);
# the authors' own numbers are what their evaluation scripts print on these very files.
PUBLISHED: dict[str, list[dict[str, Any]]] = {
    "pandalm-7b": [
        {"source": "study T004-3", "accuracy": 67.57, "f1": 57.49},
        {
            "source": "PandaLM repo data/compute_metrics.py (comment, run on this file)",
            "accuracy": 66.77,
            "precision": 57.38,
            "recall": 57.50,
            "f1": 57.43,
        },
    ],
    "gpt-3.5-turbo": [
        {"source": "study T004-3", "accuracy": 62.96, "f1": 58.20},
        {
            "source": "PandaLM repo data/compute_metrics.py (comment, run on this file; 'garbage' -> Tie)",
            "accuracy": 71.07,
            "precision": 58.79,
            "recall": 57.36,
            "f1": 57.55,
        },
    ],
    "auto-j-13b": [
        {"source": "study T004-3", "agreement": 54.6},
        {
            "source": "Auto-J repo codes/leaderboard/README.md (pairwise_eval.py on these files)",
            "agreement": 54.96,
            "consistency": 83.41,
            "forward_accuracy": 59.99,
        },
    ],
}


def pct(x: float) -> float:
    return round(100 * x, 2)


def pct_array(x: np.ndarray) -> np.ndarray:
    return np.round(100 * x, 2)


def ci_pct(ci: CI) -> dict[str, float]:
    return {"value": pct(ci.estimate), "low": pct(ci.low), "high": pct(ci.high)}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pairwise_block(gold: list[Verdict], pred: list[Verdict | None], policy: str, args) -> dict[str, Any]:
    m = pairwise_metrics(gold, pred, policy)
    cis = bootstrap_ci(
        lambda g, p: {k: getattr(pairwise_metrics(g, p, policy), k) for k in PAIRWISE_KEYS},
        gold,
        pred,
        n=args.boot,
        seed=args.seed,
    )
    return {
        "failures": policy,
        "n": m.n,
        "n_scored": m.n_scored,
        "n_failed": m.n_failed,
        **{k: ci_pct(cis[k]) for k in PAIRWISE_KEYS},
        "gold_counts": m.gold_counts,
        "pred_counts": m.pred_counts,
        "per_class_f1": {c: pct(v["f1"]) for c, v in m.per_class.items()},
    }


def agreement_block(gold, forward, backward, args) -> dict[str, Any]:
    m = autoj_agreement(gold, forward, backward, "error")
    cis = bootstrap_ci(
        lambda g, f, r: {k: getattr(autoj_agreement(g, f, r, "error"), k) for k in AGREEMENT_KEYS},
        gold,
        forward,
        backward,
        n=args.boot,
        seed=args.seed,
    )
    pc = position_consistency(forward, backward, "error")
    return {
        "failures": "error",
        "n": m.n,
        "n_failed": m.n_failed,
        **{k: ci_pct(cis[k]) for k in AGREEMENT_KEYS},
        "flip_rate": pct(pc.flip_rate),
    }


def vote_patterns(votes: dict[str, tuple[int, int, int]]) -> dict[str, int]:
    """How the PandaLM gold comes about: unanimous, 2-1 (by which annotator is the odd one), 1-1-1."""
    c: Counter = Counter()
    for a1, a2, a3 in votes.values():
        if a1 == a2 == a3:
            c["unanimous"] += 1
        elif len({a1, a2, a3}) == 3:
            c["1-1-1 split"] += 1
        else:
            odd = 1 if a2 == a3 else 2 if a1 == a3 else 3
            c[f"2-1, annotator{odd} outvoted"] += 1
    return dict(sorted(c.items()))


def exact_accuracy(
    votes: np.ndarray,
    random_rows: np.ndarray,
    base: list[Verdict | None],
    pred: list[Verdict | None],
    published: float,
) -> dict[str, float]:
    """Exact distribution of the accuracy under the study's gold: each randomly resolved record is right with
    probability (votes equal to the prediction) / 3, so the count of right records is Poisson-binomial."""
    random_set = set(random_rows.tolist())
    fixed = sum(p is not None and p == b for i, (p, b) in enumerate(zip(pred, base)) if i not in random_set)
    dist = np.array([1.0])
    for row in random_rows:
        p = 0.0 if pred[row] is None else sum(PANDALM_CODES[str(x)] == pred[row] for x in votes[row]) / 3
        dist = np.convolve(dist, [1 - p, p])
    counts = fixed + np.arange(dist.size)
    n = len(pred)
    reachable = counts[dist > 0]
    mean = float(dist @ counts) / n
    # Counts whose rounded accuracy is at least as far from the mean as the published figure, on its side.
    far = (
        pct_array(counts / n) >= published if published >= 100 * mean else pct_array(counts / n) <= published
    )
    return {
        "mean": pct(mean),
        "min": pct(reachable.min() / n),
        "max": pct(reachable.max() / n),
        "p_reaching_published": float(dist[far].sum()),
    }


def study_tiebreak_simulation(
    votes: dict[str, tuple[int, int, int]], preds: dict[str, list[Verdict | None]], sims: int, seed: int
) -> dict[str, Any]:
    """Replay the study's PandaLM gold (UnlimitedJudge src/build_dataset.py): ``if a1 == a2 or a1 == a2:
    a1; elif a2 == a3: a2; else random.choice([a1, a2, a3])``. The repeated condition (a1 == a3 was
    presumably meant) sends every a1 == a3 != a2 record to the unseeded random choice, so the study's gold
    differs from the majority on about a third of those records, and from run to run."""
    ids = list(votes)
    v = np.array([votes[i] for i in ids])
    random_rows = np.flatnonzero((v[:, 0] != v[:, 1]) & (v[:, 1] != v[:, 2]))
    rng = np.random.default_rng(seed)
    picks = v[random_rows, rng.integers(0, 3, size=(sims, random_rows.size))]
    base = [majority_verdict(tuple(row)) for row in v]
    out: dict[str, Any] = {
        "records_resolved_at_random": int(random_rows.size),
        "simulations": sims,
        "judges": {},
    }
    for name, pred in preds.items():
        out["judges"][name] = {
            "accuracy_exact": exact_accuracy(v, random_rows, base, pred, study(name, "accuracy"))
        }
        acc, f1 = np.empty(sims), np.empty(sims)
        for s in range(sims):
            gold = list(base)
            for row, label in zip(random_rows, picks[s]):
                gold[row] = PANDALM_CODES[str(label)]
            m = pairwise_metrics(gold, pred, "count_wrong")
            acc[s], f1[s] = m.accuracy, m.f1
        out["judges"][name] |= {
            metric: {
                "mean": pct(float(x.mean())),
                "p2.5": pct(float(np.percentile(x, 2.5))),
                "p97.5": pct(float(np.percentile(x, 97.5))),
                "min": pct(float(x.min())),
                "max": pct(float(x.max())),
            }
            for metric, x in (("accuracy", acc), ("f1", f1))
        }
    return out


def judge_section(rp: ReleasedPredictions, args) -> dict[str, Any]:
    gold = gold_verdicts(rp.test_source)
    al = rp.align(gold.verdicts)
    section: dict[str, Any] = {
        "test_source": rp.test_source,
        "files": {f: sha256(data_root() / f) for f in rp.files},
        "gold": {"provenance": gold.provenance, "n": len(gold.verdicts), "excluded": dict(gold.excluded)},
        "parse_failures": dict(rp.failed),
        "published": PUBLISHED.get(rp.name, []),
        "against_longer": against_longer(rp, al, args),
    }
    if al.reversed_verdicts is not None:
        section["all"] = agreement_block(al.gold, al.verdicts, al.reversed_verdicts, args)
        return section
    section["all"] = pairwise_block(al.gold, al.verdicts, "count_wrong", args)
    if rp.n_failed:
        section["all_failures_excluded"] = pairwise_block(al.gold, al.verdicts, "exclude", args)
        # Only to line up with the authors' script, which maps unparsed outputs to Tie; not our metric.
        as_tie = [Verdict.TIE if p is None else p for p in al.verdicts]
        section["authors_convention_failures_as_tie"] = {
            k: pct(getattr(pairwise_metrics(al.gold, as_tie), k)) for k in PAIRWISE_KEYS
        }
    return section


def against_longer(rp: ReleasedPredictions, al: Aligned, args) -> dict[str, Any]:
    """The judge's headline metric beside "longer answer wins" on the same records, with the paired
    difference. Per record the judge is right when its verdict equals gold (Auto-J protocol: in both answer
    orders); an unparsed output is wrong. Length is position-consistent, so its agreement is its accuracy."""
    records = {r.id: r for r in sources.load(rp.test_source).records}
    longer = longer_answer_wins([records[i] for i in al.ids])
    right = [v is not None and v == g for v, g in zip(al.verdicts, al.gold)]
    if al.reversed_verdicts is not None:  # reversed verdicts are in the swapped order's own terms
        right = [r and b is not None and b.swapped() == v for r, v, b in zip(right, al.verdicts, al.reversed_verdicts)]
    longer_right = [v == g for v, g in zip(longer, al.gold)]
    headline = (autoj_agreement(al.gold, al.verdicts, al.reversed_verdicts, "error").agreement
                if al.reversed_verdicts is not None
                else pairwise_metrics(al.gold, al.verdicts, "count_wrong").accuracy)
    if not np.isclose(np.mean(right), headline):
        raise AssertionError(f"{rp.name}: per-record rights give {np.mean(right):.4f}, the metric {headline:.4f}")
    diff = paired_difference(right, longer_right, n=args.boot, seed=args.seed)
    return {
        "metric": "agreement" if al.reversed_verdicts is not None else "accuracy",
        "n": len(right),
        "judge": pct(float(np.mean(right))),
        "longer_answer_wins": pct(float(np.mean(longer_right))),
        "difference": {k: pct(diff[k]) for k in ("estimate", "low", "high")},
        "won": diff["won"],
        "lost": diff["lost"],
    }


def pandalm_subsets(
    section: dict[str, Any], rp: ReleasedPredictions, gold: dict[str, Verdict], votes, args
) -> None:
    """Metrics on the strict-majority records and on the unanimous ones."""
    subsets = {
        "strict_majority": [i for i in gold if majority_verdict(votes[i]) is not None],
        "unanimous": [i for i in gold if len(set(votes[i])) == 1],
    }
    by_id = dict(zip(rp.ids, rp.verdicts))
    for name, ids in subsets.items():
        section[name] = pairwise_block([gold[i] for i in ids], [by_id[i] for i in ids], "count_wrong", args)


def machine() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "scikit-learn": sklearn.__version__,
    }


def fmt(block: dict[str, Any], key: str) -> str:
    v = block[key]
    return f"{v['value']:.2f} [{v['low']:.2f}, {v['high']:.2f}]"


def published_cell(published: list[dict[str, Any]], key: str) -> str:
    return " / ".join(f"{p[key]:.2f}" if key in p else "–" for p in published)


def study(name: str, key: str) -> float:
    return next(p[key] for p in PUBLISHED[name] if p["source"] == "study T004-3")


REPORT_TEMPLATE = """\
# Released judges, recomputed from their prediction files ({date})

Machine: {host} ({platform}, {cpus} CPUs), scikit-learn {sklearn}, scipy {scipy}.
95% percentile bootstrap CIs, {resamples} resamples, seed {seed}. Percent.
Published = study T004-3 / what the file's own authors' script prints.

| Judge | Test | Metric | Ours [95% CI] | Published (study / authors) |
|---|---|---|---|---|
{main_rows}

## Against "longer answer wins" on the same records

How far each released judge is from the verbosity baseline (the longer answer wins, equal lengths tie):
the bar every clfjudge head is held to. Paired bootstrap CI of the difference, percentage points; won /
lost = records only the judge / only the baseline gets right.

| Judge | Test | Metric | Judge | Longer answer wins | Difference [95% CI] | won / lost |
|---|---|---|---|---|---|---|
{longer_rows}

## gpt-3.5-turbo parse failures

{g_failed} of {g_n} outputs are "garbage" (unparsed). The rows above count them wrong
(`failures="count_wrong"`). Excluding them (n={g_excl_n}): accuracy {g_excl_acc}, F1 {g_excl_f1}.
Mapping them to Tie, as the PandaLM authors' script does (shown only to line up with their numbers):
accuracy {g_tie_acc:.2f}, P {g_tie_p:.2f}, R {g_tie_r:.2f}, F1 {g_tie_f1:.2f}.

## PandaLM gold

Annotator vote patterns: {patterns}. There is no 1-1-1 split, so the strict-majority subset is the
whole test set (PandaLM-7B accuracy {p_strict_acc}, n={p_strict_n}). On the unanimous records
(n={unanimous_n}): PandaLM-7B accuracy {p_un_acc}, F1 {p_un_f1}; gpt-3.5-turbo accuracy {g_un_acc},
F1 {g_un_f1}.

The study's gold code resolves {n_random} records (annotators 1 and 3 agree against annotator 2) by
an unseeded random choice among the three votes. Replaying it {sims} times on the released predictions:

| Judge | metric | mean | 2.5% | 97.5% | min | max |
|---|---|---|---|---|---|---|
{sim_rows}

Exact accuracy distribution under that gold (Poisson-binomial): {exact_rows}.

## Why the numbers differ

- **PandaLM-7B.** Ours equal, to 0.01, what the PandaLM authors' `data/compute_metrics.py` prints on
  the same file. The study's {p_acc:.2f} / {p_f1:.2f} is {p_dacc:+.2f} accuracy ({p_drec} of {p_n}
  records) and {p_df1:+.2f} F1 from ours. Tie-breaking does not explain it: the test set has no
  1-1-1 split, and the study's own gold code (whose random branch catches the 2-1 records where
  annotator 2 is outvoted) gives this file {p_exact_mean:.2f} accuracy on average and reaches
  {p_acc:.2f} with probability {p_exact_p:.1e}. The study re-ran every released judge itself (vLLM
  decoding, its own output parser, which maps unparsed outputs to tie), so its row comes from other
  generations than the released file.
- **gpt-3.5-turbo.** The study's {g_acc:.2f} / {g_f1:.2f} is not reachable from this file under any
  failure policy (count wrong {g_acc_ours:.2f} / {g_f1_ours:.2f}; excluded {g_excl_acc_v:.2f} /
  {g_excl_f1_v:.2f}; the authors' failures-as-Tie {g_tie_acc:.2f} / {g_tie_f1:.2f}): those figures
  come from other GPT-3.5 predictions. The PandaLM abstract says PandaLM-7B reaches 93.75% of GPT-3.5's
  F1; on the released files the ratio is {ratio:.2f}% (authors' convention), so the PandaLM paper's
  table was not computed from these files either. If the study's GPT-3.5 row is the PandaLM paper's
  (likely, but the paper's table could not be checked here), that ratio puts PandaLM-7B's paper F1 at
  {paper_f1:.2f}.
- **Auto-J-13B.** Ours equal the Auto-J repository's leaderboard output on these files (agreement
  54.96, consistency 83.41, single-order accuracy 59.99). The study's {a_agr} is {a_d:.2f} points lower
  (~{a_pairs} of {a_n} pairs) and lies inside our CI [{a_low:.2f}, {a_high:.2f}]: again the study's own
  re-run. Label coding: the Auto-J files use 0 = response 1, 1 = response 2, 2 = tie, the PandaLM
  files 0 = tie, 1 = response 1, 2 = response 2; both are mapped here as the study maps them.

## Files

{file_rows}
"""


def markdown(report: dict[str, Any]) -> str:
    j, m, boot = report["judges"], report["machine"], report["bootstrap"]
    p, g, a = j["pandalm-7b"], j["gpt-3.5-turbo"], j["auto-j-13b"]
    sim = report["pandalm_gold"]["study_tiebreak_simulation"]
    g_tie, p_exact = g["authors_convention_failures_as_tie"], sim["judges"]["pandalm-7b"]["accuracy_exact"]
    main_rows = [
        f"| {name} | {s['test_source']} (n={s['all']['n']}) | {key} | {fmt(s['all'], key)} | "
        f"{published_cell(s['published'], key)} |"
        for name, s in j.items()
        for key in (AGREEMENT_KEYS if "agreement" in s["all"] else PAIRWISE_KEYS)
    ]
    sim_rows = [
        f"| {name} | {metric} | {d['mean']:.2f} | {d['p2.5']:.2f} | {d['p97.5']:.2f} | {d['min']:.2f} | "
        f"{d['max']:.2f} |"
        for name, res in sim["judges"].items()
        for metric, d in res.items()
        if metric != "accuracy_exact"
    ]
    exact_rows = [
        f"{name}: mean {r['accuracy_exact']['mean']:.2f}, reachable {r['accuracy_exact']['min']:.2f}-"
        f"{r['accuracy_exact']['max']:.2f}, P(reaching the study's {study(name, 'accuracy'):.2f}) = "
        f"{r['accuracy_exact']['p_reaching_published']:.1e}"
        for name, r in sim["judges"].items()
    ]
    longer_rows = [
        f"| {name} | {s['test_source']} (n={d['n']}) | {d['metric']} | {d['judge']:.2f} | "
        f"{d['longer_answer_wins']:.2f} | {d['difference']['estimate']:+.2f} "
        f"[{d['difference']['low']:+.2f}, {d['difference']['high']:+.2f}] | {d['won']} / {d['lost']} |"
        for name, s in j.items()
        for d in [s["against_longer"]]
    ]
    file_rows = [
        f"- {name}: gold {s['gold']['provenance']}; "
        + ", ".join(f"`{f}` sha256 {h[:12]}" for f, h in s["files"].items())
        for name, s in j.items()
    ]
    p_dacc = study("pandalm-7b", "accuracy") - p["all"]["accuracy"]["value"]
    a_d = a["all"]["agreement"]["value"] - study("auto-j-13b", "agreement")
    return REPORT_TEMPLATE.format(
        date=report["date"],
        host=m["host"],
        platform=m["platform"],
        cpus=m["cpus"],
        sklearn=m["scikit-learn"],
        scipy=m["scipy"],
        resamples=boot["resamples"],
        seed=boot["seed"],
        main_rows="\n".join(main_rows),
        longer_rows="\n".join(longer_rows),
        g_failed=g["all"]["n_failed"],
        g_n=g["all"]["n"],
        g_excl_n=g["all_failures_excluded"]["n_scored"],
        g_excl_acc=fmt(g["all_failures_excluded"], "accuracy"),
        g_excl_f1=fmt(g["all_failures_excluded"], "f1"),
        g_tie_acc=g_tie["accuracy"],
        g_tie_p=g_tie["precision"],
        g_tie_r=g_tie["recall"],
        g_tie_f1=g_tie["f1"],
        patterns=report["pandalm_gold"]["vote_patterns"],
        p_strict_acc=fmt(p["strict_majority"], "accuracy"),
        p_strict_n=p["strict_majority"]["n"],
        unanimous_n=p["unanimous"]["n"],
        p_un_acc=fmt(p["unanimous"], "accuracy"),
        p_un_f1=fmt(p["unanimous"], "f1"),
        g_un_acc=fmt(g["unanimous"], "accuracy"),
        g_un_f1=fmt(g["unanimous"], "f1"),
        n_random=sim["records_resolved_at_random"],
        sims=sim["simulations"],
        sim_rows="\n".join(sim_rows),
        exact_rows="; ".join(exact_rows),
        p_acc=study("pandalm-7b", "accuracy"),
        p_f1=study("pandalm-7b", "f1"),
        p_dacc=p_dacc,
        p_drec=round(p_dacc * p["all"]["n"] / 100),
        p_n=p["all"]["n"],
        p_df1=study("pandalm-7b", "f1") - p["all"]["f1"]["value"],
        p_exact_mean=p_exact["mean"],
        p_exact_p=p_exact["p_reaching_published"],
        g_acc=study("gpt-3.5-turbo", "accuracy"),
        g_f1=study("gpt-3.5-turbo", "f1"),
        g_acc_ours=g["all"]["accuracy"]["value"],
        g_f1_ours=g["all"]["f1"]["value"],
        g_excl_acc_v=g["all_failures_excluded"]["accuracy"]["value"],
        g_excl_f1_v=g["all_failures_excluded"]["f1"]["value"],
        ratio=100 * p["all"]["f1"]["value"] / g_tie["f1"],
        paper_f1=0.9375 * study("gpt-3.5-turbo", "f1"),
        a_agr=study("auto-j-13b", "agreement"),
        a_d=a_d,
        a_pairs=round(a_d * a["all"]["n"] / 100),
        a_n=a["all"]["n"],
        a_low=a["all"]["agreement"]["low"],
        a_high=a["all"]["agreement"]["high"],
        file_rows="\n".join(file_rows),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boot", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--sims", type=int, default=2000, help="replays of the study's random tie-breaking")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    released = {name: spec.load() for name, spec in RELEASED.items()}
    judges = {name: judge_section(rp, args) for name, rp in released.items()}

    votes = read_pandalm_votes(data_root() / RAW_GOLD.get("pandalm-test").path)
    pandalm_gold = gold_verdicts("pandalm-test").verdicts
    if list(pandalm_gold) != list(votes):
        raise SystemExit(
            "PandaLM gold ids are not the test file's ids in its order; the tie-break replay needs them"
        )
    pandalm_judges = {n: rp for n, rp in released.items() if rp.test_source == "pandalm-test"}
    for name, rp in pandalm_judges.items():
        pandalm_subsets(judges[name], rp, pandalm_gold, votes, args)
    preds = {n: rp.align(pandalm_gold).verdicts for n, rp in pandalm_judges.items()}

    today = dt.date.today().isoformat()
    report = {
        "date": today,
        "machine": machine(),
        "bootstrap": {"resamples": args.boot, "seed": args.seed, "alpha": 0.05, "method": "percentile"},
        "data_root": str(data_root()),
        "judges": judges,
        "pandalm_gold": {
            "vote_patterns": vote_patterns(votes),
            "study_tiebreak_simulation": study_tiebreak_simulation(votes, preds, args.sims, args.seed),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / f"released_{today}.json", args.out / f"released_{today}.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")
    print(md_path.read_text(encoding="utf-8"))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
