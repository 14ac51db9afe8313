"""How OpenVINO's dynamic quantization of activations trades speed against the verdict on a verdict judge's int8
weights: the ``ov-int8-weights`` variant run with f32 activations, which OpenVINO's CPU plugin quantizes to int8 per
group of input channels as it reads them (``DYNAMIC_QUANTIZATION_GROUP_SIZE``; 0 turns it off), beside the fp32
graph in f32 (the reference: PyTorch fp32 within 1e-5, as the export's gate measures) and, where the CPU runs bf16,
both graphs with bf16 activations (which OpenVINO does not quantize).

    OMP_NUM_THREADS=2 .venv/bin/python bench/ov_dynamic_quant.py --model qwen-coder-1.5b [--pairs 8]
        [--group-sizes 0 32 64 128 256] [--threads 2] [--repeats 3] [--onednn-max-cpu-isa AVX512_CORE_VNNI]

The pairs are ``verdict_speed``'s (pool pairs, each read as the judge compares it); each run is its own process pinned
to ``--threads`` cores, warm (one pair read first), median of ``--repeats`` reads with the judge's memory emptied.
Reported per run: answers/s, x the reference, |delta log-odds| p50 / max and the pairs decided as the reference does.
Writes bench/results/ov_dynamic_quant_<model>[_<isa cap>]_<date>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, machine_line, write_run  # noqa: E402
from verdict_speed import POOL, export, workloads  # noqa: E402

REFERENCE = "fp32 graph, f32"


def runs(group_sizes: list[int], bf16: bool) -> dict[str, tuple[str, str, int | None]]:
    """name -> (variant, provider, group size: None = the library's)."""
    out = {REFERENCE: ("fp32", "openvino", None)}
    out |= {(f"int8 weights, f32, group {g}" if g else "int8 weights, f32, not quantized"):
            ("ov-int8-weights", "openvino", g) for g in group_sizes}
    if bf16:
        out |= {"fp32 graph, bf16": ("fp32", "openvino-bf16", None),
                "int8 weights, bf16": ("ov-int8-weights", "openvino-bf16", None)}
    return out


def run_one(variant: str, provider: str, group: int | None, args) -> dict[str, Any]:
    from clfjudge.card import JudgeCard
    from clfjudge.judges.verdict_onnx import open_onnx_reader
    from clfjudge.models import openvino_session
    from clfjudge.options import LoadOptions

    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:args.threads]))
    if group is not None:
        openvino_session.DYNAMIC_QUANTIZATION_GROUP = group  # read when the session compiles
    calls = workloads(args.pool, args.pairs, 0, 4, args.seed)["pairs"]
    reader = open_onnx_reader(Path(args.onnx_dir), JudgeCard.load(args.onnx_dir),
                              LoadOptions(provider=provider, variant=variant, threads=args.threads))
    reader.log_odds(calls[0])  # warm-up
    seconds = []
    for _ in range(args.repeats):
        reader.memory.clear()
        start = time.perf_counter()
        values = np.concatenate([reader.log_odds(call)[:, 0] for call in calls])
        seconds.append(time.perf_counter() - start)
    np.save(args.out, values)
    return {"answers": len(values), "seconds": [round(s, 2) for s in seconds],
            "answers_per_s": len(values) / statistics.median(seconds),
            "group_size": openvino_session.DYNAMIC_QUANTIZATION_GROUP if provider == "openvino" else None}


def compare(rows: dict[str, Any], directory: Path) -> None:
    ref = np.load(directory / "0.npy")
    for i, row in enumerate(rows.values()):
        if "answers_per_s" not in row:
            continue
        got = np.load(directory / f"{i}.npy")
        diff = np.abs(got - ref)
        row |= {"p50_abs_diff": float(np.median(diff)), "max_abs_diff": float(diff.max()),
                "pairs_agree": int((np.sign(got[0::2] - got[1::2]) == np.sign(ref[0::2] - ref[1::2])).sum()),
                "pairs": len(ref) // 2}


def markdown(d: dict[str, Any]) -> str:
    title = f"# OpenVINO dynamic quantization of a verdict judge's int8 weights: {d['model']}"
    lines = [f"{title} ({d['machine']['date'][:10]})", "",
             f"{machine_line(d['machine'], d['onednn_max_cpu_isa'])} {d['pairs']} pool pairs "
             f"({' '.join(d['pool'])}, seed {d['seed']}), question {d['question']!r}; each run in its own process, "
             f"warm, median of {d['repeats']} reads. Reference: the fp32 graph on OpenVINO f32.", "",
             "| run | answers/s | x reference | \\|Δ log-odds\\| p50 | max | pairs as the reference |",
             "|---|---|---|---|---|---|"]
    base = d["rows"][REFERENCE].get("answers_per_s")
    for name, r in d["rows"].items():
        if "answers_per_s" not in r:
            lines.append(f"| {name} | {r.get('failed') or r.get('skipped')} | | | | |")
            continue
        lines.append(f"| {name} | {r['answers_per_s']:.2f} | {r['answers_per_s'] / base:.2f}x | "
                     f"{r['p50_abs_diff']:.3f} | {r['max_abs_diff']:.3f} | {r['pairs_agree']} of {r['pairs']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen-coder-1.5b")
    p.add_argument("--question", default="correct")
    p.add_argument("--pool", nargs="+", default=list(POOL))
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--group-sizes", type=int, nargs="+", default=[0, 32, 64, 128, 256])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--onednn-max-cpu-isa", default=None, metavar="ISA")
    p.add_argument("--results", type=Path, default=None, help="results folder (default bench/results)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: "variant|provider|group" in this process
    p.add_argument("--onnx-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        variant, provider, group = args.one.split("|")
        print(json.dumps(run_one(variant, provider, int(group) if group else None, args)))
        return 0
    from clfjudge.machine import probe

    started, where = time.monotonic(), machine(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="ov_dynamic_quant."))
    exported = export(args.model, args.question, tmp, ["openvino int8"], args.pool, args.seed)
    if "ov-int8-weights" not in exported["files"]:
        raise SystemExit(f"ov-int8-weights was not made here: {exported['variants'].get('ov-int8-weights')}")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.onednn_max_cpu_isa:
        env["ONEDNN_MAX_CPU_ISA"] = args.onednn_max_cpu_isa
    bf16 = bool(probe().openvino_bf16()) and not args.onednn_max_cpu_isa
    rows: dict[str, Any] = {}
    for i, (name, (variant, provider, group)) in enumerate(runs(args.group_sizes, bf16).items()):
        cmd = [sys.executable, __file__, "--model", args.model, "--question", args.question, "--pool", *args.pool,
               "--pairs", str(args.pairs), "--seed", str(args.seed), "--threads", str(args.threads),
               "--repeats", str(args.repeats), "--one", f"{variant}|{provider}|{'' if group is None else group}",
               "--onnx-dir", str(tmp), "--out", str(tmp / f"{i}.npy")]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        rows[name] = (json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else
                      {"failed": (done.stderr.strip().splitlines() or ["no output"])[-1]})
        print(name, json.dumps(rows[name]), flush=True)
    compare(rows, tmp)
    result = {"machine": where, "model": args.model, "question": args.question, "pool": args.pool,
              "pairs": args.pairs, "seed": args.seed, "threads": args.threads, "repeats": args.repeats,
              "onednn_max_cpu_isa": args.onednn_max_cpu_isa, "export": exported, "rows": rows,
              "wall_time_s": round(time.monotonic() - started, 1)}
    shutil.rmtree(tmp)
    written = write_run("ov_dynamic_quant", args.model, args.onednn_max_cpu_isa, result, markdown(result),
                        args.results)
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
