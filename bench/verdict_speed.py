"""How fast a verdict judge reads answers, per path, and what each path does to its log-odds.

    OMP_NUM_THREADS=2 .venv/bin/python bench/verdict_speed.py [--backbone qwen-coder-0.5b] [--question correct]
        [--answers 24] [--threads 2] [--repeats 3] [--paths "pytorch fp32" "onnx int4" ...]
        [--onednn-max-cpu-isa AVX512_CORE]

A verdict judge (``judges.verdict``) on any chat model (an alias such as ``qwen-coder-0.5b``, a directory or a hub
id) asks one pointwise question of the card's presets (``clfjudge/configs/verdict.yaml``) about each answer and reads
log P(yes) - log P(no) of its reply's first token in one forward pass. The paths: PyTorch fp32, PyTorch bf16
(autocast; on a CPU without bf16 the library reads fp32 and the row says so), and the library's export of the
judge's graph (``export.verdict.export_graphs``) run by onnxruntime in fp32, the same graph with weight-only int4
matrices (MatMulNBits), and compiled by OpenVINO in bf16 where it runs. Each path runs in its own process pinned to
``--threads`` cores (torch, onnxruntime and OpenVINO threads alike); inputs are real PandaLM test answers with their
questions, cold (the judge's memory emptied before each read), in the judge's token budgets and batches.
``--onednn-max-cpu-isa`` caps oneDNN's instruction set in every path's process (``ONEDNN_MAX_CPU_ISA``, e.g.
AVX512_CORE: below bf16) to measure a CPU without bf16 on one with it. Reported: answers/s (median of ``--repeats``
reads), peak RSS, and each path's log-odds against PyTorch fp32 (sign agreement and max |difference|).
Writes bench/results/verdict_speed_<backbone>[_<isa cap>]_<date>.{json,md}.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, path_rows, write  # noqa: E402
from reader_speed import inputs, peak_rss_mb  # noqa: E402

PATHS = ("pytorch fp32", "pytorch bf16", "onnx fp32", "openvino bf16", "onnx int4")
REFERENCE = "pytorch fp32"
ONNX = {"onnx fp32": ("fp32", "cpu"), "onnx int4": ("int4", "cpu"), "openvino bf16": ("fp32", "openvino-bf16")}


def card(backbone: str, question: str, precision: str = "fp32"):
    from clfjudge.judges.verdict import questions_from, verdict_card

    return verdict_card(backbone, questions_from([question], "--question"), precision=precision)


def points(n: int) -> list:
    from clfjudge.data.records import PointRecord

    return [PointRecord(id=str(i), question=q, answer=a, score=None) for i, (q, a) in enumerate(zip(*inputs(n)))]


def export(backbone: str, question: str, directory: Path, n: int) -> dict[str, Any]:
    """The library's graph of the judge (fp32) and its int4 copy in ``directory``, with the tokenizer and a card
    naming them (what ``judges.verdict_onnx.open_onnx_reader`` opens)."""
    from clfjudge.export.verdict import export_graphs
    from clfjudge.judges.verdict import open_reader
    from clfjudge.judges.verdict_onnx import BACKEND

    judge_card = card(backbone, question)
    reader = open_reader(judge_card)
    start = time.monotonic()
    files, info = export_graphs(reader, directory, [reader.prompt_ids(reader.questions[0], points(n)[0])])
    exported = time.monotonic() - start
    reader.tokenizer.save_pretrained(directory)
    replace(judge_card, runtime={**judge_card.runtime, "backend": BACKEND,
                                 "onnx": {"primary": "fp32", "files": files}}).save(directory)
    return {"export_s": round(exported, 1), "int4": info.get("int4"),
            "bytes": {name: sum(p.stat().st_size for p in directory.glob(graphs[0] + "*"))
                      for name, graphs in files.items()}}


def run_path(path: str, backbone: str, question: str, n: int, repeats: int, threads: int, onnx_dir: str,
             out: str) -> dict[str, Any]:
    """One path in this process, pinned to ``threads`` cores: the median answers/s over ``repeats`` cold reads; the
    log-odds go to ``out``."""
    import torch

    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:threads]))
    torch.set_num_threads(threads)
    records = points(n)
    if path in ONNX:
        from clfjudge.card import JudgeCard
        from clfjudge.judges.verdict_onnx import open_onnx_reader

        variant, provider = ONNX[path]
        reader = open_onnx_reader(Path(onnx_dir), JudgeCard.load(onnx_dir), variant, provider, threads)
    else:
        from clfjudge.judges.verdict import open_reader

        reader = open_reader(card(backbone, question, "bf16" if path == "pytorch bf16" else "fp32"))
    reader.log_odds(records[:4])  # warm-up: kernels and buffers are set up on the first read
    rates, values = [], None
    for _ in range(repeats):
        reader.memory.clear()
        start = time.perf_counter()
        values = reader.log_odds(records)[:, 0]
        rates.append(len(records) / (time.perf_counter() - start))
    np.save(out, values)
    return {"answers_per_s": statistics.median(rates), "runs": [round(r, 3) for r in rates],
            "precision": reader.precision, "why": reader.precision_why, "truncated": reader.truncated,
            "peak_rss_mb": peak_rss_mb()}


def markdown(d: dict[str, Any]) -> str:
    m = d["machine"]
    cap = f"; oneDNN capped at {d['onednn_max_cpu_isa']}" if d["onednn_max_cpu_isa"] else ""
    setting = (f"{m['cpu']}, {d['threads']} threads (pinned){cap}; commit {m['commit']}. Question "
               f"{d['question']!r} about {d['answers']} real PandaLM test answers (mean {d['answer_chars_mean']:.0f} "
               f"characters) with their questions, cold, each path in its own process; median of {d['repeats']} "
               "reads. Agreement: the sign of each path's log-odds against PyTorch fp32's.")
    lines = [f"# Verdict judge reading speed: {d['backbone']} ({m['date'][:10]})", "", setting, ""]
    if d["export"]:
        e = d["export"]
        lines += [f"Export: {e['export_s']} s for both graphs; "
                  + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in e["bytes"].items()), ""]
    lines += ["| path | answers/s | x PyTorch fp32 | sign agreement | max abs diff | precision | peak RSS MB |",
              "|---|---|---|---|---|---|---|"]
    base = d["rows"].get(REFERENCE, {}).get("answers_per_s")
    lines += path_rows(d["rows"], base, 7, lambda r: (
        f"{r['sign_agreement']:.1%} | {r['max_abs_diff']:.3g}" if "sign_agreement" in r else "- | -")
        + f" | {r['precision']} | {r['peak_rss_mb']:.0f}")
    return "\n".join(lines) + "\n"


def compare(rows: dict[str, Any], directory: Path) -> None:
    """Each path's log-odds against PyTorch fp32's: sign agreement and max |difference|."""
    if not (directory / f"{REFERENCE}.npy").exists():
        return
    ref = np.load(directory / f"{REFERENCE}.npy")
    for path, r in rows.items():
        if (directory / f"{path}.npy").exists():
            values = np.load(directory / f"{path}.npy")
            r["sign_agreement"] = float(np.mean(np.sign(values) == np.sign(ref)))
            r["max_abs_diff"] = float(np.abs(values - ref).max())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", default="qwen-coder-0.5b")
    p.add_argument("--question", default="correct", help="a pointwise preset of clfjudge/configs/verdict.yaml")
    p.add_argument("--answers", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    p.add_argument("--onednn-max-cpu-isa", default=None, metavar="ISA",
                   help="ONEDNN_MAX_CPU_ISA for every path (e.g. AVX512_CORE: a CPU without bf16)")
    p.add_argument("--results", type=Path, default=None, help="results folder (default bench/results)")
    p.add_argument("--one-path", help=argparse.SUPPRESS)  # internal: run one path in this process
    p.add_argument("--onnx-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_path:
        print(json.dumps(run_path(args.one_path, args.backbone, args.question, args.answers, args.repeats,
                                  args.threads, args.onnx_dir, args.out)))
        return 0
    from clfjudge.machine import probe

    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="verdict_speed."))
    rows: dict[str, Any] = {}
    exported = None
    if any(path in ONNX for path in args.paths):
        exported = export(args.backbone, args.question, tmp, args.answers)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.onednn_max_cpu_isa:
        env["ONEDNN_MAX_CPU_ISA"] = args.onednn_max_cpu_isa
    for path in args.paths:
        if path == "openvino bf16" and not (runs := probe().openvino_bf16()):
            rows[path] = {"skipped": f"does not run here: {runs.why}"}
            continue
        cmd = [sys.executable, __file__, "--backbone", args.backbone, "--question", args.question, "--answers",
               str(args.answers), "--threads", str(args.threads), "--repeats", str(args.repeats),
               "--one-path", path, "--onnx-dir", str(tmp), "--out", str(tmp / f"{path}.npy")]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            rows[path] = {"failed": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"}
            continue
        rows[path] = json.loads(done.stdout.strip().splitlines()[-1])
        print(path, rows[path], flush=True)
    compare(rows, tmp)
    questions, answers = inputs(args.answers)
    result = {"machine": machine(args.threads), "backbone": args.backbone, "question": args.question,
              "answers": len(answers), "answer_chars_mean": float(np.mean([len(a) for a in answers])),
              "threads": args.threads, "repeats": args.repeats, "onednn_max_cpu_isa": args.onednn_max_cpu_isa,
              "export": exported, "rows": rows, "wall_time_s": round(time.monotonic() - started, 1)}
    shutil.rmtree(tmp)
    name = f"verdict_speed_{Path(args.backbone).name}"
    if args.onednn_max_cpu_isa:
        name += f"_{args.onednn_max_cpu_isa.lower()}"
    extra = {"results": args.results} if args.results else {}
    print(f"wrote {write(name, result, markdown(result), **extra)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
