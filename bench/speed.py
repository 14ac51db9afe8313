"""Judgements per second: PyTorch fp32 vs onnxruntime fp32 vs onnxruntime int8, at fixed sequence lengths.

    python bench/speed.py JUDGE_DIR [JUDGE_DIR ...] [--lengths 256 512] [--batch 16] [--pairs 64] [--threads 2]

Each judge (a PyTorch judge directory from `clfjudge train`) is exported once through the parity gate (fp32,
int8 quantized from fp32, and separately graph-optimized fp32) next to itself. Inputs are real Auto-J test
pairs rendered in the judge's scheme, cut to the length by the judge's truncation policy and padded to exactly
that length, so every backend sees identical tensors.
Threads are pinned (torch.set_num_threads, ORT intra-op); each timing is the median of --repeats passes; the
speed-up ratios are measured in the same run. Decision agreement is against PyTorch fp32.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import machine, write

# Two exports per judge: plain fp32 + int8 quantized from it, and the graph-optimized fp32. (int8 quantized
# from the optimized graph failed the parity gate's 99% decision agreement on the briefly trained judges.)
EXPORTS = {"onnx": {"int8": True}, "onnx-optimized": {"optimize": True}}
# The bench measures decision agreement itself (every row): the gate is set to measure, not to refuse.
MEASURE_ONLY = ("int8.min_agreement=0", "int8.max_metric_delta=1")
BACKENDS = {"onnxruntime fp32": ("onnx", "fp32"), "onnxruntime fp32 optimized": ("onnx-optimized", "optimized"),
            "onnxruntime int8": ("onnx", "int8")}


def encoded_batches(judge, records, length: int, batch: int) -> list[dict[str, np.ndarray]]:
    from clfjudge.prompts.encoding import Encoder
    from clfjudge.prompts.truncation import TruncationPolicy

    policy = TruncationPolicy(**{**judge.card.truncation["policy"], "max_length": length})
    judge.encoder = Encoder(judge.tokenizer, judge.card.scheme, policy)
    seqs = [s for r in records for s in judge.encode(r)]
    return [dict(judge.tokenizer.pad(seqs[i:i + batch], padding="max_length", max_length=length,
                                     return_tensors="np")) for i in range(0, len(seqs), batch)]


def timed(backend: Callable, batches, repeats: int) -> tuple[float, np.ndarray]:
    out = np.concatenate([backend(b) for b in batches])  # warm-up, and the outputs for agreement
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for b in batches:
            backend(b)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def decisions(head: str, logits: np.ndarray) -> np.ndarray:
    if head == "reward":  # two sequences per pair: which answer gets the higher reward
        r = logits.reshape(-1, 2)
        return np.sign(r[:, 0] - r[:, 1])
    return logits.argmax(axis=1) if logits.shape[1] > 1 else np.rint(logits[:, 0])


def bench_judge(judge_dir: Path, args) -> list[dict[str, Any]]:
    import torch

    from clfjudge.data.sources import load
    from clfjudge.export.onnx import export_judge
    from clfjudge.export.parity import ParityConfig
    from clfjudge.judges.base import ONNX_VARIANTS, Judge
    from clfjudge.judges.model import OnnxBackend

    exports = {}
    for suffix, options in EXPORTS.items():
        exports[suffix] = judge_dir.parent / f"{judge_dir.name}-{suffix}"
        if not exports[suffix].exists():
            export_judge(judge_dir, exports[suffix], parity=ParityConfig.load(overrides=MEASURE_ONLY), **options)
    torch.set_num_threads(args.threads)
    judge = Judge.load(judge_dir, backend="torch", threads=args.threads)
    records = load("autoj-test").records[: args.pairs]
    backends = {"pytorch fp32": judge.backend} | {
        name: OnnxBackend(exports[suffix] / ONNX_VARIANTS[variant], threads=args.threads)
        for name, (suffix, variant) in BACKENDS.items()}
    rows = []
    for length in args.lengths:
        batches = encoded_batches(judge, records, length, args.batch)
        base_time, base_out = None, None
        for name, backend in backends.items():
            seconds, out = timed(backend, batches, args.repeats)
            if base_time is None:
                base_time, base_out = seconds, out
            rows.append({"judge": judge_dir.name, "head": judge.card.name, "backbone": judge.card.backbone,
                         "length": length, "backend": name, "pairs": len(records), "seconds": seconds,
                         "judgements_per_s": len(records) / seconds, "speedup_vs_pytorch": base_time / seconds,
                         "decision_agreement": float(np.mean(decisions(judge.card.name, out)
                                                             == decisions(judge.card.name, base_out))),
                         "max_abs_logit_diff": float(np.abs(out - base_out).max())})
            print(rows[-1])
    return rows


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]], args) -> str:
    lines = [f"# Judge speed: PyTorch vs onnxruntime fp32 / int8 ({meta['date']})", "",
             f"CPU: {meta['cpu']} ({meta['cores']} cores), {meta['threads']} thread(s) pinned, load average at start "
             f"{tuple(round(x, 2) for x in meta['loadavg_at_start'])}; commit {meta['commit']}. "
             f"Real Auto-J test pairs ({args.pairs}), padded to the length, batch {args.batch} sequences, "
             f"median of {args.repeats} passes.", "",
             "| judge | length | backend | judgements/s | × PyTorch fp32 | decision agreement | max abs logit diff |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['judge']} ({r['head']}, {r['backbone']}) | {r['length']} | {r['backend']} | "
              f"{r['judgements_per_s']:.1f} | {r['speedup_vs_pytorch']:.2f} | {100 * r['decision_agreement']:.1f}% | "
              f"{r['max_abs_logit_diff']:.4f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("judges", nargs="+", type=Path)
    parser.add_argument("--lengths", nargs="+", type=int, default=[256, 512])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    meta = machine(args.threads)
    rows = [row for judge in args.judges for row in bench_judge(judge, args)]
    print(write("speed", {"machine": meta, "args": vars(args) | {"judges": [str(j) for j in args.judges]},
                          "rows": rows}, markdown(meta, rows, args)))


if __name__ == "__main__":
    main()
