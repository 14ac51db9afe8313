"""How much noise the verdict judge's own bf16 reading adds, and where int8 activations lose the verdict.

On the export gate's slice (the judge's gate source, or ``--source``; ``--n`` pairs, the gate's seed) the judge is
read with PyTorch in fp32 and in bf16 (its default reading on a CPU with bf16): decision agreement and |delta
log-odds| of the pair margins, the smallest fp32 margins. During the fp32 reading, every decoder layer's MLP down
projection input is measured: its absolute maximum over the rms of all its values (what one int8 scale per tensor
has to span) and its largest channels. Results: ``research/results/verdict_int8_noise_DATE.{md,json}``.

    OMP_NUM_THREADS=2 .venv/bin/python research/verdict_int8_noise.py runs/verdict-qwen1.5b-teacher --n 32
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from common import machine, write

from clfjudge.batching import Budget
from clfjudge.card import JudgeCard
from clfjudge.export import gate
from clfjudge.export.options import ExportOptions
from clfjudge.export.parity import ParityConfig
from clfjudge.judges.verdict import VerdictJudge, open_reader
from clfjudge.models.heads import RewardHead


def down_proj_hooks(judge: VerdictJudge) -> dict[int, dict[str, Any]]:
    """Per layer, the running absmax, sum of squares, count and per-channel absmax of the down projection's input."""
    decoder = judge.reader.modules[0].decoder
    layers = (decoder.model if hasattr(decoder, "model") else decoder).layers
    stats: dict[int, dict[str, Any]] = {}

    def hook(i: int):
        def record(_module, inputs) -> None:
            x = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
            s = stats.setdefault(i, {"absmax": 0.0, "sq": 0.0, "n": 0, "channels": None})
            s["absmax"] = max(s["absmax"], x.abs().max().item())
            s["sq"] += float((x * x).sum())
            s["n"] += x.numel()
            channel = x.abs().amax(0)
            s["channels"] = channel if s["channels"] is None else s["channels"].maximum(channel)
        return record

    for i, layer in enumerate(layers):
        layer.mlp.down_proj.register_forward_pre_hook(hook(i))
    return stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("judge_dir", type=Path)
    p.add_argument("--n", type=int, default=32, help="pairs of the gate's slice")
    p.add_argument("--source", default=None, help="the gate's source (default: the judge's, as clfjudge export)")
    args = p.parse_args()

    card, parity = JudgeCard.load(args.judge_dir), ParityConfig.load()
    records, validation = gate.validation_records(card, RewardHead(), parity,
                                                  ExportOptions(n_records=args.n, source=args.source), arity="pair")
    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()
    result: dict[str, Any] = {"machine": machine(threads), "judge_dir": str(args.judge_dir),
                              "source": validation["source"], "n": len(records), "readings": {}}
    raw, stats = {}, {}
    for precision in ("fp32", "bf16"):
        c = replace(card, runtime={**card.runtime, "precision": precision})
        judge = VerdictJudge(c, open_reader(c, args.judge_dir, budget=Budget(parity.batch_size)), parity.batch_size)
        if precision == "fp32":
            stats = down_proj_hooks(judge)
        start = time.perf_counter()
        raw[precision] = judge.raw_outputs(records)
        result["readings"][precision] = {"seconds": round(time.perf_counter() - start, 1),
                                         "decisions": [str(d) for d in gate.decisions(judge, raw[precision])]}
        del judge
    fp32, bf16 = (result["readings"][k]["decisions"] for k in ("fp32", "bf16"))
    margins = 2 * np.abs(raw["fp32"][:, 0])
    diff = 2 * np.abs(raw["bf16"][:, 0] - raw["fp32"][:, 0])
    result["bf16"] = {"agreement": float(np.mean([a == b for a, b in zip(fp32, bf16)])),
                      "log_odds_diff": {q: float(np.quantile(diff, lv)) for q, lv in (("p50", .5), ("p95", .95),
                                                                                      ("max", 1.0))},
                      "smallest_fp32_margins": sorted(float(m) for m in margins)[:8]}
    result["down_proj"] = {i: {"absmax_over_rms": s["absmax"] / (s["sq"] / s["n"]) ** 0.5, "absmax": s["absmax"],
                               "top_channels": [float(v) for v in s["channels"].topk(3).values],
                               "median_channel_absmax": float(s["channels"].median())}
                           for i, s in sorted(stats.items())}
    print(f"wrote {write('verdict_int8_noise', result, markdown(result))}")


def markdown(r: dict[str, Any]) -> str:
    m, b = r["machine"], r["bf16"]
    d = b["log_odds_diff"]
    lines = [f"# Verdict judge: bf16's noise and int8's outliers ({m['date'][:10]})", "",
             f"{m.get('cpu', '')}; commit {m.get('commit', '')}; judge {r['judge_dir']}; {r['n']} pairs of "
             f"{r['source']} (the export gate's slice). Reading s: fp32 {r['readings']['fp32']['seconds']}, bf16 "
             f"{r['readings']['bf16']['seconds']}.", "",
             f"PyTorch bf16 against fp32: decision agreement {100 * b['agreement']:.1f}%, |delta log-odds| of the "
             f"pair margins p50 {d['p50']:.3f}, p95 {d['p95']:.3f}, max {d['max']:.3f}; the smallest fp32 margins "
             + ", ".join(f"{x:.2f}" for x in b["smallest_fp32_margins"]) + ".", "",
             "| layer | down_proj input absmax / rms | absmax | top channels | median channel absmax |",
             "|---|---|---|---|---|"]
    for i, s in r["down_proj"].items():
        lines.append(f"| {i} | {s['absmax_over_rms']:.0f} | {s['absmax']:.1f} | "
                     + ", ".join(f"{v:.1f}" for v in s["top_channels"]) + f" | {s['median_channel_absmax']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
