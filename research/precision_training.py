"""Training the default judge in bf16 vs fp32: how much faster, and does the judge decide the same?

Training the default judge is reading: a frozen SmolLM2 reads every pool answer after its question up to layer 8
(bf16 autocast where the CPU has AMX / AVX512-BF16, the recipe's ``precision: auto``), and the logistic regression
on top fits in seconds. So this bench reads the same pool sample and evaluation sets at both precisions, set by set
in turns (a shared machine's load falls on both alike), times the reading, fits the default's head (information
length + layer-8 mean, length-balanced source weights, C = 0.03: ``reader_probe.fit``) on each precision's
readings, and compares the two judges' decisions on every evaluation set and their scores minus "longer answer
wins". Readings are cached per precision under ``--cache`` (a re-run only fits; its timings are then the first
run's).

    OMP_NUM_THREADS=2 .venv/bin/python research/precision_training.py [--cap 300]

Writes research/results/precision_training_<date>.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reader_probe as rp  # noqa: E402
from common import machine, write  # noqa: E402

PRECISIONS = ("fp32", "bf16")
SETS = ("pandalm-test", "llmbar-natural", "llmbar-neighbor", "llmbar-gptinst", "llmbar-gptout", "llmbar-manual",
        "llmbar-faireval", "llmbar-llmeval2", *rp.DEV)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cap", type=int, default=300, help="pairs per pool source")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "clfjudge" / "precision")
    args = p.parse_args()
    started = time.monotonic()
    named = {n: recs[:args.cap] if n.startswith("pool:") else recs for n, recs in rp.load_sets().items()
             if n.startswith("pool:") or n in SETS}
    timing = {prec: {"seconds": 0.0, "answers": 0, "tokens": 0} for prec in PRECISIONS}
    data = {}
    for name, recs in named.items():
        for prec in PRECISIONS:
            begun = time.monotonic()
            path = rp.read("smollm2", [8], name, recs, args.cache / prec, prec)
            log = path.with_suffix(".timing.json")
            if not log.exists():  # the first read of this set at this precision: keep its time
                log.write_text(json.dumps({"seconds": time.monotonic() - begun, **_size(recs)}))
            for key, value in json.loads(log.read_text()).items():
                timing[prec][key] += value
            z = np.load(path)
            data.setdefault(prec, {})[name] = rp.Pairs(recs, {"mean8": z["mean8"],
                                                              "index": dict(zip(z["keys"], range(len(z["keys"]))))})
    margins = {}
    for prec in PRECISIONS:
        margin = rp.head([data[prec][n] for n in named if n.startswith("pool:")], "mean8", "info", 0.03, True)
        margins[prec] = {n: margin(data[prec][n]) for n in SETS}
    rows = {}
    for n in SETS:
        pairs = data["fp32"][n]
        won = {prec: (margins[prec][n] > 0) == (pairs.y == 1) for prec in PRECISIONS}
        rows[n] = {"pairs": len(pairs.y),
                   "agreement": float(100 * np.mean((margins["fp32"][n] > 0) == (margins["bf16"][n] > 0))),
                   **{prec: float(100 * won[prec].mean() - pairs.longer) for prec in PRECISIONS}}
    for prec in PRECISIONS:
        t = timing[prec]
        t["answers_per_s"], t["tokens_per_s"] = t["answers"] / t["seconds"], t["tokens"] / t["seconds"]
    result = {"machine": machine(int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()),
              "cap": args.cap, "timing": timing, "sets": rows,
              "wall_time_s": round(time.monotonic() - started, 1)}
    print(f"wrote {write('precision_training', result, markdown(result))}")
    return 0


def _size(records: list) -> dict:
    """The answers and tokens ``rp.read`` reads for these records (the reader's own tokenizer and template)."""
    from clfjudge.embedders.decoder import DecoderEmbedder

    reader = DecoderEmbedder("smollm2", layer=8, max_prompt_tokens=rp.MAX_PROMPT, max_answer_tokens=rp.MAX_ANSWER)
    items = {rp.text_key(r.question, a): (r.question, a) for r in records for a in (r.answer_a, r.answer_b)}
    tokens = sum(len(reader.prompt_ids(q)) + len(reader.answer_ids(a)) for q, a in items.values())
    return {"answers": len(items), "tokens": tokens}


def markdown(result: dict) -> str:
    m, t = result["machine"], result["timing"]
    speedup = t["bf16"]["tokens_per_s"] / t["fp32"]["tokens_per_s"]
    lines = [f"# Training the default judge: bf16 vs fp32 ({m['date'][:10]})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores ({', '.join(m['matmul_flags']) or 'no bf16/AMX flags'}), "
             f"{m['threads']} threads, load at start {m['loadavg_at_start'][0]:.1f}; commit {m['commit']}; "
             f"{result['wall_time_s']} s. The default recipe's reading (SmolLM2 up to layer 8, prompts <= "
             f"{rp.MAX_PROMPT} and answers <= {rp.MAX_ANSWER} tokens) of {result['cap']} pairs per pool source and "
             "of the evaluation sets, each set read at both precisions in turn; the head fitted on each. "
             "Reading times are those of each set's first read, cached beside it (a re-run only fits: its wall "
             "time is the fit's).",
             "",
             "| precision | answers | tokens | seconds | answers/s | tokens/s |", "|---|---|---|---|---|---|"]
    for prec in PRECISIONS:
        x = t[prec]
        lines.append(f"| {prec} | {x['answers']} | {x['tokens']} | {x['seconds']:.0f} | {x['answers_per_s']:.1f} | "
                     f"{x['tokens_per_s']:.0f} |")
    lines += ["", f"bf16 reads **{speedup:.2f}x** as fast as fp32 (the training's cost; the fit takes seconds).", "",
              "| set | pairs | decisions the same | fp32 judge − longer wins | bf16 judge − longer wins |",
              "|---|---|---|---|---|"]
    for name, r in result["sets"].items():
        lines.append(f"| {name} | {r['pairs']} | {r['agreement']:.1f}% | {r['fp32']:+.1f} | {r['bf16']:+.1f} |")
    pairs = sum(r["pairs"] for r in result["sets"].values())
    same = sum(r["pairs"] * r["agreement"] for r in result["sets"].values()) / pairs
    lines.append(f"| all | {pairs} | {same:.2f}% | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
