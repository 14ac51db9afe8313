"""Does a chat model's own verdict judge where a linear head over a reader's states counts words?

The verdict judge (``clfjudge/judges/verdict.py``) asks a chat model a question about one answer and reads
log P(yes) - log P(no) of its reply's first token. Two staged gates, each on pairs no fit read, with paired
bootstrap CIs against longer-answer-wins and against the default judge's features (SmolLM2 layer 8 + information
length, fitted on the whole pool sample as ``bigger_readers.py``'s floor row):

``read``: per-answer log-odds of each ``--question`` by ``--model`` on the named sets, appended to a JSONL cache per
(model, question) so a stopped run loses nothing: ``stage-a`` = the 60 obvious pairs and a seeded 40-pair sample of
each LLMBar case study (the reader probe's dev sets); ``stage-b`` = the probe's pool sample (``--per-source``) and
stage A's samples (the 1.5B reads about one answer in four seconds on 2 cores here: ~700-token prompts).

``stage-a``: the verdict judge alone (sign of r_A - r_B). Gate: obvious pairs >= 75% and >= 60% on the half where
the worse answer is longer.

``stage-b``: the stacked judge, the default's features plus the verdict log-odds in the logistic head, on the reader
probe's selection protocol (leave one pool source out + the LLMBar case studies). Gate: selection mean >= +1.5
over the default's features with the CI's lower bound above 0, and obvious pairs >= 80%.

    OMP_NUM_THREADS=2 .venv/bin/python research/verdict_judge.py read --model qwen-coder-1.5b --sets stage-a
    .venv/bin/python research/verdict_judge.py stage-a --model qwen-coder-1.5b
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bigger_readers import CACHE, OBVIOUS, covering, obvious, records_of  # noqa: E402
from common import machine, write  # noqa: E402
from reader_probe import DEV, group_right, probe_sets, text_key  # noqa: E402

STAGE_A_PAIRS = 40  # per dev set
DEFAULT_FEATURES = ("emb8", "info")  # the default judge's: SmolLM2 layer-8 mean-state difference + information length


def stage_sets(stage: str, per_source: int) -> dict[str, list]:
    """The pairs a stage reads: A = the obvious pairs + a seeded sample of each dev set; B = the pool sample + the
    dev sets whole (+ the obvious pairs, the floor)."""
    named = {OBVIOUS: obvious()}
    for name in DEV:
        pairs = records_of(name)
        named[name] = random.Random(0).sample(pairs, min(STAGE_A_PAIRS, len(pairs)))  # seeded: sets are ordered
    if stage == "stage-a":
        return named
    pool = {n: [r for r in recs if r.verdict is not None and r.verdict.value in ("A", "B")]
            for n, recs in probe_sets(per_source, test=False).items() if n.startswith("pool:")}
    return pool | named


def cache_file(cache: Path, model: str, question: str) -> Path:
    return cache / "verdict" / model / f"{question}.jsonl"


def cached(cache: Path, model: str, question: str) -> dict[str, float]:
    path = cache_file(cache, model, question)
    return {r["key"]: r["value"] for r in map(json.loads, path.open())} if path.exists() else {}


def cmd_read(args: argparse.Namespace) -> int:
    """Every answer of the named stages' sets that some question has not read yet, all questions in one pass over
    the prompts, appended in chunks."""
    from clfjudge.batching import Budget
    from clfjudge.data.records import PointRecord
    from clfjudge.judges.verdict import open_reader, questions_from, verdict_card

    card = verdict_card(args.model, questions_from(args.questions, "--questions"), precision=args.precision)
    reader = open_reader(card, budget=Budget(8))
    print(f"[verdict] {args.model} in {reader.precision} ({reader.precision_why})", flush=True)
    paths = [cache_file(args.cache, args.model, q.name) for q in reader.questions]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for stage in args.sets:
        for name, records in stage_sets(stage, args.per_source).items():
            items = {text_key(r.question, a): (r.question, a) for r in records for a in (r.answer_a, r.answer_b)}
            done = [cached(args.cache, args.model, q.name) for q in reader.questions]
            todo = [key for key in items if not all(key in d for d in done)]
            start = time.monotonic()
            for i in range(0, len(todo), 32):
                chunk = todo[i:i + 32]
                points = [PointRecord(id=key, question=items[key][0], answer=items[key][1], score=None)
                          for key in chunk]
                values = reader.log_odds(points)
                for path, column in zip(paths, values.T):
                    with path.open("a") as sink:
                        sink.writelines(json.dumps({"key": k, "value": float(v)}) + "\n"
                                        for k, v in zip(chunk, column))
            took = time.monotonic() - start
            print(f"[verdict] {name}: {len(todo)} answers in {took:.0f} s "
                  f"({len(todo) / max(took, 1e-9):.2f} answers/s)", flush=True)
    return 0


# -- the tables ----------------------------------------------------------------------------------------------------

def verdict_margins(records: list, values: dict[str, float]) -> np.ndarray:
    return np.array([values[text_key(r.question, r.answer_a)] - values[text_key(r.question, r.answer_b)]
                     for r in records])


def side_rows(records: list, right: np.ndarray) -> dict:
    """Accuracy overall and on each half (worse answer longer / shorter), beside the length rules."""
    from clfjudge.metrics import paired_difference

    gold_a = np.array([r.verdict.value == "A" for r in records])
    len_a, len_b = np.array([len(r.answer_a) for r in records]), np.array([len(r.answer_b) for r in records])
    longer = np.where(len_a == len_b, 0.5, ((len_a > len_b) == gold_a).astype(float))
    worse_longer = np.where(gold_a, len_b > len_a, len_a > len_b)
    return {"pairs": len(records), "accuracy": 100 * right.mean(),
            "worse_longer": 100 * right[worse_longer].mean() if worse_longer.any() else None,
            "worse_shorter": 100 * right[~worse_longer].mean() if (~worse_longer).any() else None,
            "longer": 100 * longer.mean(), "shorter": 100 * (1 - longer).mean(),
            "vs_longer": paired_difference(right.astype(float), longer)}


def default_right(named: dict, cache: Path, per_source: int) -> dict | None:
    """Which pairs of each named set the default judge's features decide right (SmolLM2 layer 8 + information
    length, fitted on the reader probe's whole pool sample, length-balanced); None where SmolLM2 was not read."""
    from bigger_readers import features

    pool = {n: recs for n, recs in probe_sets(per_source, test=False).items() if n.startswith("pool:")}
    if any(covering("smollm2", n, recs, cache) is None for n, recs in {**pool, **named}.items()):
        return None
    data, _ = features({**pool, **named}, ["smollm2:8"], cache)
    right = group_right([data[n] for n in pool], ("smollm2_L8", "info"), balanced=True)
    return {n: right(data[n]).astype(float) for n in named}


def cmd_stage_a(args: argparse.Namespace) -> int:
    from clfjudge.metrics import paired_difference

    values = cached(args.cache, args.model, args.question)
    named = stage_sets("stage-a", args.per_source)
    default = default_right(named, args.cache, args.per_source)
    rows = {}
    for name, records in named.items():
        missing = sum(text_key(r.question, a) not in values for r in records for a in (r.answer_a, r.answer_b))
        if missing:
            print(f"{name}: {missing} answers not read yet: run `read --sets stage-a` first", file=sys.stderr)
            return 1
        gold_a = np.array([r.verdict.value == "A" for r in records])
        right = ((verdict_margins(records, values) > 0) == gold_a).astype(float)
        rows[name] = side_rows(records, right)
        if default is not None:
            rows[name] |= {"default": 100 * default[name].mean(),
                           "vs_default": paired_difference(right, default[name])}
    ob = rows[OBVIOUS]
    gate = {"obvious >= 75": ob["accuracy"] >= 75, "worse longer >= 60": (ob["worse_longer"] or 0) >= 60}
    result = {"machine": machine(int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()),
              "model": args.model, "question": args.question, "rows": rows, "gate": gate, "passed": all(gate.values())}
    path = write(f"verdict_stage_a{args.suffix}", result, markdown_a(result))
    print(Path(path).read_text())
    return 0


def cmd_stage_b(args: argparse.Namespace) -> int:
    """The stacked judge on the selection protocol beside the default's features and the verdict alone."""
    from bigger_readers import bootstrap, features, longer_right, row, selection_mean

    values = cached(args.cache, args.model, args.question)
    named = stage_sets("stage-b", args.per_source)
    missing = {n: sum(text_key(r.question, a) not in values for r in recs for a in (r.answer_a, r.answer_b))
               for n, recs in named.items()}
    if any(missing.values()):
        print(f"not read yet: {missing}: run `read --sets stage-b` first", file=sys.stderr)
        return 1
    data, _ = features(named, ["smollm2:8"], args.cache)
    for name, recs in named.items():
        data[name].verdict = verdict_margins(recs, values)[:, None]
    heads = {"default's features (SmolLM2 L8 + info)": ("smollm2_L8", "info"),
             "stacked (default's features + verdict)": ("smollm2_L8", "info", "verdict"),
             "verdict + info": ("verdict", "info"), "verdict alone (fitted sign)": ("verdict",)}
    rights = {label: row(data, groups, balanced=True) for label, groups in heads.items()}
    rule = {n: ((data[n].verdict[:, 0] > 0) == (data[n].y == 1)).astype(float) for n in data}
    rights["verdict alone (no fit)"] = {n: rule[n] for n in rights[next(iter(rights))]}
    worse_longer = np.array([r.meta["worse_is_longer"] for r in named[OBVIOUS]])
    base = next(iter(rights))
    floors = {label: right.pop(OBVIOUS) for label, right in rights.items()}
    rows = {}
    for label, right in rights.items():
        ci = None if label == base else bootstrap(data, right, rights[base])
        rows[label] = {"sets": {n: 100 * (np.mean(r) - np.mean(longer_right(data[n]))) for n, r in right.items()},
                       "selection_mean": selection_mean(data, right),
                       "vs_default": None if ci is None else
                       {"difference": selection_mean(data, right) - selection_mean(data, rights[base]),
                        "ci_low": ci[0], "ci_high": ci[1]},
                       "obvious": {"all": 100 * floors[label].mean(),
                                   "worse longer": 100 * floors[label][worse_longer].mean(),
                                   "worse shorter": 100 * floors[label][~worse_longer].mean()}}
    stacked = rows["stacked (default's features + verdict)"]
    gate = {"selection >= +1.5 over the default": stacked["vs_default"]["difference"] >= 1.5,
            "CI lower bound > 0": stacked["vs_default"]["ci_low"] > 0,
            "obvious pairs >= 80": stacked["obvious"]["all"] >= 80}
    result = {"machine": machine(int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()),
              "model": args.model, "question": args.question, "per_source": args.per_source,
              "pairs": {n: len(p.y) for n, p in data.items()}, "rows": rows, "gate": gate,
              "passed": all(gate.values())}
    path = write(f"verdict_stage_b{args.suffix}", result, markdown_b(result))
    print(Path(path).read_text())
    return 0


def markdown_b(result: dict) -> str:
    m = result["machine"]
    sets = list(next(iter(result["rows"].values()))["sets"])
    short = [n.removeprefix("pool:").removeprefix("llmbar-case-") for n in sets]
    lines = [f"# Verdict judge, stage B: the stacked judge on the selection protocol ({m['date'][:10]})", "",
             f"The reader probe's protocol: leave one pool source out ({result['per_source']} pairs per source, "
             "the probe's seeded decontaminated sample) + the LLMBar case studies as dev, scored by the all-pool "
             "head; every cell is accuracy minus longer-answer-wins on the same pairs. Heads: logistic regression "
             "over the standardized differences of the named feature groups, both orders, length-balanced, "
             f"C = 0.03. Verdict: {result['model']} asked `{result['question']}`, log P(yes) - log P(no) of A minus "
             "that of B. Obvious pairs: the all-pool head (the floor, never a selection set). Paired bootstrap of "
             "the selection mean against the default's features (pairs resampled within each set).", "",
             f"Machine: {m.get('cpu', '')}, {m.get('threads', '')} threads, commit {m.get('commit', '')}.", "",
             "| head | " + " | ".join(short) + " | selection mean | vs default [95% CI] | obvious all / worse longer "
             "/ worse shorter |", "|---|" + "---|" * (len(sets) + 3)]
    for label, r in result["rows"].items():
        o = r["obvious"]
        lines.append(f"| {label} | " + " | ".join(f"{r['sets'][n]:+.1f}" for n in sets)
                     + f" | {r['selection_mean']:+.1f} | {fmt(r['vs_default']) if r['vs_default'] else '-'} | "
                     f"{o['all']:.0f} / {o['worse longer']:.0f} / {o['worse shorter']:.0f} |")
    lines += ["", "Gate: " + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in result["gate"].items())
              + f" -> **{'passed' if result['passed'] else 'failed'}**", ""]
    return "\n".join(lines)


def fmt(d: dict | None) -> str:
    """A difference with its CI, in points: stage B's own, or metrics.paired_difference's (fractions)."""
    if d is None:
        return "not read"
    if "estimate" in d:
        d = {"difference": 100 * d["estimate"], "ci_low": 100 * d["low"], "ci_high": 100 * d["high"]}
    return f"{d['difference']:+.1f} [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}]"


def markdown_a(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Verdict judge, stage A ({m['date'][:10]})", "",
             f"{result['model']} asked `{result['question']}` about each answer (clfjudge's verdict judge: "
             "log P(yes) - log P(no) of the reply's first token, one forward pass); a pair is decided by the sign "
             "of r_A - r_B. The obvious pairs and a seeded 40-pair sample of each LLMBar case study (the reader "
             "probe's dev sets); nothing is fitted. The default's features: SmolLM2 layer 8 + information length "
             "fitted on the reader probe's pool sample, length-balanced.", "",
             f"Machine: {m.get('cpu', '')}, {m.get('threads', '')} threads, commit {m.get('commit', '')}.", "",
             "| set | pairs | verdict judge | worse longer / shorter | longer wins | shorter wins "
             "| vs longer [95% CI] | default's features | vs default [95% CI] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["rows"].items():
        halves = " / ".join("-" if v is None else f"{v:.1f}" for v in (r["worse_longer"], r["worse_shorter"]))
        lines.append(f"| {name} | {r['pairs']} | {r['accuracy']:.1f} | {halves} | {r['longer']:.1f} | "
                     f"{r['shorter']:.1f} | {fmt(r['vs_longer'])} | "
                     f"{r.get('default', float('nan')):.1f} | {fmt(r.get('vs_default'))} |")
    lines += ["", "Gate: " + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in result["gate"].items())
              + f" -> **{'passed' if result['passed'] else 'failed'}**", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--per-source", type=int, default=150, help="pool pairs per source (the probe's sample)")
    parser.add_argument("--suffix", default="")
    sub = parser.add_subparsers(dest="cmd", required=True)
    read = sub.add_parser("read")
    read.add_argument("--model", default="qwen-coder-1.5b")
    read.add_argument("--questions", nargs="+", default=["correct"])
    read.add_argument("--sets", nargs="+", choices=("stage-a", "stage-b"), default=["stage-a"])
    read.add_argument("--precision", default="auto")
    a = sub.add_parser("stage-a")
    a.add_argument("--model", default="qwen-coder-1.5b")
    a.add_argument("--question", default="correct")
    b = sub.add_parser("stage-b")
    b.add_argument("--model", default="qwen-coder-1.5b")
    b.add_argument("--question", default="correct")
    args = parser.parse_args()
    return {"read": cmd_read, "stage-a": cmd_stage_a, "stage-b": cmd_stage_b}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
