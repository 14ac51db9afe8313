"""The verdict judge's shared-prefix reading against reading every prompt whole, on one model, one machine, one run:
best-of-N groups (N answers to one question, as best_of_n / a GRPO group / an AlpacaEval reference outputs' pairs
read them) and pool pairs as the labelling step reads them (a pair's two answers share the question). Each case is
read with sharing on and off, alternately, ``--repeats`` times after a warm-up; medians, the ratio, tokens read and
the largest |difference| of the log-odds.

    python bench/verdict_share.py --judge runs/verdict-qwen1.5b-teacher --threads 2 [--pairs 32] [--groups 4]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from clfjudge.data.records import PairRecord, PointRecord  # noqa: E402


def best_of_n_groups(pool: list[PairRecord], groups: int, n: int, seed: int) -> list[list[PointRecord]]:
    """``groups`` questions of the pool with ``n`` distinct answers each (its pairs' answers)."""
    by_question: dict[str, list[str]] = {}
    for r in pool:
        answers = by_question.setdefault(r.question, [])
        answers += [a for a in (r.answer_a, r.answer_b) if a not in answers]
    full = [q for q, answers in by_question.items() if len(answers) >= n]
    chosen = random.Random(seed).sample(full, min(groups, len(full)))
    return [[PointRecord(id=f"{g}:{k}", question=q, answer=a, score=None)
             for k, a in enumerate(by_question[q][:n])] for g, q in enumerate(chosen)]


def long_question_groups(pool: list[PairRecord], groups: int, n: int) -> list[list[PointRecord]]:
    """The ``groups`` longest questions of the pool (a long dialogue or document before short answers, as a GRPO
    group over a long prompt reads), each with its own pairs' answers, filled to ``n`` with the pool's shortest."""
    by_question: dict[str, list[str]] = {}
    for r in pool:
        answers = by_question.setdefault(r.question, [])
        answers += [a for a in (r.answer_a, r.answer_b) if a not in answers]
    short = sorted({a for r in pool for a in (r.answer_a, r.answer_b) if len(a) > 40}, key=len)[:n]
    longest = sorted(by_question, key=len, reverse=True)[:groups]
    return [[PointRecord(id=f"{g}:{k}", question=q, answer=a, score=None)
             for k, a in enumerate((by_question[q] + short)[:n])] for g, q in enumerate(longest)]


def pair_points(pool: list[PairRecord], pairs: int, seed: int) -> list[PointRecord]:
    sample = random.Random(seed).sample(pool, min(pairs, len(pool)))
    return [PointRecord(id=f"{r.id}:{s}", question=r.question, answer=a, score=None)
            for r in sample for s, a in (("a", r.answer_a), ("b", r.answer_b))]


def measure(reader, calls: list[list[PointRecord]], repeats: int) -> dict:
    """Each call read with sharing on and off, alternately, its memory emptied before each read."""
    q = reader.questions[0]
    prompts = [reader.prompt(q, p) for call in calls for p in call]
    whole_tokens = sum(len(ids) for ids, _ in prompts)
    times: dict[bool, list[float]] = {True: [], False: []}
    values: dict[bool, np.ndarray] = {}
    for _ in range(repeats):
        for share in (True, False):
            reader.share_prefix, reader.memory = share, type(reader.memory)(1 << 20)
            start = time.perf_counter()
            values[share] = np.concatenate([reader.log_odds(call)[:, 0] for call in calls])
            times[share].append(time.perf_counter() - start)
    answers = sum(len(c) for c in calls)
    shared, whole = statistics.median(times[True]), statistics.median(times[False])
    return {"answers": answers, "prompt_tokens": whole_tokens, "shared_s": shared, "whole_s": whole,
            "speedup": whole / shared, "shared_answers_per_s": answers / shared,
            "whole_answers_per_s": answers / whole,
            "max_abs_diff": float(np.max(np.abs(values[True] - values[False]))),
            "decisions_same": None if len(values[True]) % 2 else float(np.mean(
                (values[True][0::2] > values[True][1::2]) == (values[False][0::2] > values[False][1::2])))}


def main() -> int:
    import torch

    from clfjudge.judges.base import Judge
    from clfjudge.training.labels import load_pool

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", required=True, help="a verdict judge directory (pointwise)")
    parser.add_argument("--pool", nargs="+", default=["alpacaeval-gpt4:2000", "arena-votes:500", "hh-rlhf:500",
                                                      "llmeval2:500"])
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--groups", type=int, default=4, help="best-of-N groups")
    parser.add_argument("--n", type=int, default=4, help="answers per group")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="run only the cases whose name holds this text")
    parser.add_argument("--provider", default="auto",
                        help="an exported judge's provider (cpu, openvino, openvino-bf16; default: as it loads)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    judge = Judge.load(args.judge, batch_size=8, provider=args.provider, threads=args.threads)
    reader = judge.reader
    pool, _ = load_pool(args.pool, args.seed)
    groups = best_of_n_groups(pool, args.groups, args.n, args.seed)
    pairs = pair_points(pool, args.pairs, args.seed)
    reader.log_odds(pairs[:2])  # warm-up: the weights paged in, the runtime's first shapes
    cases = {f"best-of-{args.n}, pool questions ({len(groups)}, one call each)": groups,
             f"best-of-{args.n}, the pool's longest questions ({args.groups}, one call each)":
                 long_question_groups(pool, args.groups, args.n),
             f"pool pairs ({args.pairs} pairs, one call)": [pairs]}
    rows = {name: measure(reader, calls, args.repeats) for name, calls in cases.items()
            if not args.only or args.only in name}
    data = {"machine": common.machine(args.threads), "judge": args.judge, "backbone": judge.card.backbone,
            "precision": reader.precision, "pool": args.pool, "rows": rows}
    lines = [f"# Verdict judge: shared-prefix reading vs whole prompts — {data['machine']['date'][:10]}", "",
             f"{judge.card.backbone} ({reader.precision}), {data['machine']['cpu']} "
             f"({', '.join(data['machine']['matmul_flags'])}), {args.threads} threads, commit "
             f"{data['machine']['commit']}, load at start {data['machine']['loadavg_at_start'][0]:.2f}; medians of "
             f"{args.repeats} alternate reads. Pool {' '.join(args.pool)}.", "",
             "| case | answers | prompt tokens | shared s | whole s | speed-up | answers/s shared | answers/s whole | "
             "max abs diff |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['answers']} | {r['prompt_tokens']} | {r['shared_s']:.1f} | {r['whole_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['shared_answers_per_s']:.2f} | {r['whole_answers_per_s']:.2f} | "
                     f"{r['max_abs_diff']:.3f} |")
    provider = judge.runtime_choice.get("provider", "cpu") if getattr(judge, "runtime_choice", None) else "cpu"
    exported = "" if reader.precision in ("fp32", "bf16") else f"_{reader.precision}" + (
        "" if provider == "cpu" or provider in reader.precision else f"-{provider}")
    print(common.write(f"verdict_share_{Path(str(judge.card.backbone)).name}{exported}", data,
                       "\n".join(lines) + "\n"))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
