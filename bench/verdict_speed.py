"""How fast a verdict judge reads, per path, how close each path's decisions stay to PyTorch fp32, and what share of
the machine's matmul peak each path reaches.

    OMP_NUM_THREADS=2 .venv/bin/python bench/verdict_speed.py --model qwen-coder-0.5b|qwen-coder-1.5b [--pairs 32]
        [--groups 4] [--n 4] [--pool alpacaeval-gpt4:2000 ...] [--question correct] [--threads 2] [--repeats 3]
        [--paths "pytorch fp32" "openvino int8" ...] [--onednn-max-cpu-isa AVX512_CORE_VNNI]

A verdict judge (``judges.verdict``) on a chat model (an alias such as ``qwen-coder-1.5b``, a directory or a hub id)
asks one pointwise question of the card's presets about each answer. Two workloads from the pool (``--pool``, as
``clfjudge label`` reads it): ``--pairs`` pairs, each read as the judge compares it (its two answers in one call,
the question read once where that pays), and ``--groups`` best-of-``--n`` groups (the answers to one question in
one call, as ``best_of_n`` and a GRPO group read them). The paths:

- ``pytorch fp32`` / ``pytorch bf16``: the library's reader as loaded (bf16 where the CPU has it; else it reads fp32
  and the row says so), with shared-prefix reading;
- ``transformers b1`` / ``transformers batched``: what a user would write (``AutoModelForCausalLM.from_pretrained``
  as it loads, ``apply_chat_template``, the full output layer, log P(yes) - log P(no) of the last position), one
  prompt at a time and in batches of 8 (left padding), on the judge's token ids;
- ``onnx fp32`` / ``onnx int4``: the export's graph (and its MatMulNBits copy) on onnxruntime;
- ``openvino bf16`` (the fp32 graph compiled in bf16), ``openvino int8`` / ``openvino int4`` (NNCF int8 / int4
  weights, on the provider the probe picks), ``openvino int8 f32`` (the int8 weights with f32 activations, which
  OpenVINO quantizes as it reads them), ``openvino int8 static`` (int8 weights and activations) and
  ``openvino int8 static mixed`` (the same, the MLPs' down projections left unquantized): the export's OpenVINO
  variants (``export.verdict_quant``), on the OpenVINO provider this machine's probe picks but where named.

Each path runs in its own process pinned to ``--threads`` cores, cold (the judge's memory emptied before each read),
median of ``--repeats`` reads. Reported per path and workload: answers/s, prompt tokens/s, the tokens each path
really read (shared prefixes read once), decision agreement with PyTorch fp32 (a pair's winner; a group's best
answer), max |delta log-odds|, and the share of the matmul peak: tokens read x 2 x parameters (the decoder's,
without its embeddings and output layer, of which a verdict reads two rows) per second over the peak GFLOP/s of the
path's arithmetic measured in the same run (``decoder_speed.matmul_peak``: torch fp32 / bf16, onnxruntime int8). Writes
bench/results/verdict_speed_<model>[_<isa cap>]_<date>.{json,md}.
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
from common import machine, write_run  # noqa: E402
from decoder_speed import matmul_peak  # noqa: E402
from reader_speed import peak_rss_mb  # noqa: E402
from verdict_share import best_of_n_groups  # noqa: E402

REFERENCE = "pytorch fp32"
TRANSFORMERS = {"transformers b1": 1, "transformers batched": 8}
# path -> (export variant, provider: None = the OpenVINO provider the probe picks for an IR variant)
EXPORTED = {"onnx fp32": ("fp32", "cpu"), "onnx int4": ("int4", "cpu"), "openvino bf16": ("fp32", "openvino-bf16"),
            "openvino int8": ("ov-int8-weights", None), "openvino int8 f32": ("ov-int8-weights", "openvino"),
            "openvino int4": ("ov-int4-weights", None),
            "openvino int8 static": ("ov-int8", None), "openvino int8 static mixed": ("ov-int8-mixed", None)}
PATHS = ("pytorch fp32", "pytorch bf16", *TRANSFORMERS, *EXPORTED)
POOL = ("alpacaeval-gpt4:2000", "arena-votes:500", "hh-rlhf:500", "llmeval2:500")
CALIBRATION_PAIRS = 8


def card(model: str, question: str, precision: str = "fp32"):
    from clfjudge.judges.verdict import questions_from, verdict_card

    return verdict_card(model, questions_from([question], "--question"), precision=precision)


def workloads(pool: list[str], pairs: int, groups: int, n: int, seed: int) -> dict[str, list[list]]:
    """Each workload as the calls the judge gets: a pair's two answers, or a group's answers, per call."""
    import random

    from clfjudge.data.records import PointRecord
    from clfjudge.training.labels import load_pool

    records, _ = load_pool(pool, seed)
    chosen = random.Random(seed).sample(records, min(pairs, len(records)))
    calls = [[PointRecord(id=f"{r.id}:{s}", question=r.question, answer=a, score=None)
              for s, a in (("a", r.answer_a), ("b", r.answer_b))] for r in chosen]
    return {"pairs": calls, f"best-of-{n}": best_of_n_groups(records, groups, n, seed)}


def calibration(pool: list[str], seed: int) -> list:
    """Pool pairs of another seed than the measured ones: ov-int8's activation ranges."""
    return [p for call in workloads(pool, CALIBRATION_PAIRS, 0, 4, seed + 1)["pairs"] for p in call]


def export(model: str, question: str, directory: Path, paths: list[str], pool: list[str], seed: int) -> dict:
    """The library's graph of the judge, its int4 copy and the OpenVINO variants ``paths`` need, with the tokenizer
    and a card naming them (what ``judges.verdict_onnx.open_onnx_reader`` opens)."""
    from clfjudge.export import verdict_quant
    from clfjudge.export.verdict import export_graphs, head_nodes
    from clfjudge.judges.verdict import open_reader
    from clfjudge.judges.verdict_onnx import BACKEND, graph_file

    judge_card = card(model, question)
    reader = open_reader(judge_card)
    points = calibration(pool, seed)
    start = time.monotonic()
    ids, shared = reader.prompt(reader.questions[0], points[0])
    files, info = export_graphs(reader, directory, [ids], int4="onnx int4" in paths, shared=[shared])
    seconds = {"fp32": round(time.monotonic() - start, 1)}
    wanted = [EXPORTED[p][0] for p in paths
              if p in EXPORTED and EXPORTED[p][0] in verdict_quant.VARIANTS and
              verdict_quant.VARIANTS.get(EXPORTED[p][0]).runtime == "openvino"]
    inputs = verdict_quant.QuantInputs(
        head_nodes(directory / files["fp32"][0]), verdict_quant.group_size(reader.modules[0].decoder.config),
        verdict_quant.calibration_feeds([reader.prompt_ids(reader.questions[0], p) for p in points]))
    for name in dict.fromkeys(wanted):
        start = time.monotonic()
        made, made_info, skipped = verdict_quant.make_variants([name], directory, files["fp32"],
                                                               lambda k, v: inputs, graph_file)
        files |= made
        info[name] = made_info.get(name) or {"skipped": skipped.get(name)}
        seconds[name] = round(time.monotonic() - start, 1)
    reader.tokenizer.save_pretrained(directory)
    replace(judge_card, runtime={**judge_card.runtime, "backend": BACKEND,
                                 "onnx": {"primary": "fp32", "files": files,
                                          "shared_prefix": info["shared_prefix"]}}).save(directory)
    return {"seconds": seconds, "variants": info, "files": list(files),
            "bytes": {name: sum(p.stat().st_size for g in graphs for p in verdict_quant.graph_paths(directory, g))
                      for name, graphs in files.items()}}


def parameters(model: str) -> int:
    """The decoder's parameters a token multiplies through (all but the input embeddings), counted on the meta
    device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from clfjudge.models.backbones import resolve_backbone

    config = AutoConfig.from_pretrained(resolve_backbone(model).path_or_id)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    skip = {id(p) for p in lm.get_input_embeddings().parameters()}
    tied = lm.get_output_embeddings()  # the verdict reads two rows of the output layer, not the vocabulary
    skip |= {id(p) for p in tied.parameters()} if tied is not None else set()
    return sum(p.numel() for p in lm.parameters() if id(p) not in skip)


class TransformersReader:
    """The verdict as a user writes it with transformers: the model as ``from_pretrained`` loads it, its full output
    layer, the last position's log P(yes) - log P(no), ``batch`` prompts at a time (left padding)."""

    def __init__(self, model: str, question: str, batch: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from clfjudge.judges.verdict import open_reader, verdict_token_ids
        from clfjudge.models.backbones import resolve_backbone

        self.judge_reader = open_reader(card(model, question))  # its prompts: the same token ids
        self.model = AutoModelForCausalLM.from_pretrained(resolve_backbone(model).path_or_id).eval()
        self.question, self.batch = self.judge_reader.questions[0], batch
        self.yes, self.no = verdict_token_ids(self.judge_reader.tokenizer, self.question)
        self.pad = self.judge_reader.tokenizer.pad_token_id or 0
        self.precision, self.why = str(self.model.dtype).replace("torch.", ""), "as from_pretrained loads it"
        self.tokens_read, self.torch = 0, torch

    def log_odds(self, records) -> np.ndarray:
        torch = self.torch
        prompts = [self.judge_reader.prompt_ids(self.question, r) for r in records]
        out = []
        with torch.inference_mode():
            for i in range(0, len(prompts), self.batch):
                rows = prompts[i:i + self.batch]
                width = max(map(len, rows))
                ids = torch.tensor([[self.pad] * (width - len(r)) + r for r in rows])
                mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
                logp = self.model(input_ids=ids, attention_mask=mask).logits[:, -1].float().log_softmax(-1)
                out += (logp[:, self.yes].logsumexp(-1) - logp[:, self.no].logsumexp(-1)).tolist()
                self.tokens_read += ids.numel()
        return np.array(out)[:, None]


def open_path(path: str, model: str, question: str, onnx_dir: str, threads: int):
    if path in TRANSFORMERS:
        return TransformersReader(model, question, TRANSFORMERS[path])
    if path in EXPORTED:
        from clfjudge.card import JudgeCard
        from clfjudge.judges.verdict_onnx import ir_provider, open_onnx_reader
        from clfjudge.options import LoadOptions

        variant, provider = EXPORTED[path]
        provider = provider or ir_provider(variant, bf16_gated=True)[0]
        return open_onnx_reader(Path(onnx_dir), JudgeCard.load(onnx_dir),
                                LoadOptions(provider=provider, variant=variant, threads=threads))
    from clfjudge.judges.verdict import open_reader

    return open_reader(card(model, question, "bf16" if path == "pytorch bf16" else "fp32"))


def run_path(path: str, args) -> dict[str, Any]:
    """One path in this process, pinned to ``threads`` cores: per workload the median over ``repeats`` cold reads;
    the log-odds go to ``out``."""
    import torch

    from clfjudge import progress

    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:args.threads]))
    torch.set_num_threads(args.threads)
    loads = workloads(args.pool, args.pairs, args.groups, args.n, args.seed)
    reader = open_path(path, args.model, args.question, args.onnx_dir, args.threads)
    reader.log_odds(loads["pairs"][0])  # warm-up: kernels and buffers are set up on the first read
    rows, values = {}, {}
    for name, calls in loads.items():
        rates, tokens = [], 0
        for _ in range(args.repeats):
            if hasattr(reader, "memory"):
                reader.memory.clear()
            read_before = getattr(reader, "tokens_read", 0)
            with open(os.devnull, "w") as sink, progress.meter("bench", stream=sink) as shown:
                start = time.perf_counter()
                values[name] = np.concatenate([reader.log_odds(call)[:, 0] for call in calls])
                took = time.perf_counter() - start
            tokens = shown.tokens or getattr(reader, "tokens_read", 0) - read_before
            rates.append(took)
        answers = sum(map(len, calls))
        prompt_tokens = sum(len(p) for call in calls for p in prompts(reader, call))
        seconds = statistics.median(rates)
        rows[name] = {"answers": answers, "answers_per_s": answers / seconds, "prompt_tokens": prompt_tokens,
                      "prompt_tokens_per_s": prompt_tokens / seconds, "tokens_read": tokens,
                      "tokens_read_per_s": tokens / seconds, "seconds": [round(t, 3) for t in rates]}
    np.savez(args.out, **values)
    precision = getattr(reader, "precision", "?")
    return {"workloads": rows, "precision": precision, "why": getattr(reader, "precision_why", None)
            or getattr(reader, "why", None), "peak_rss_mb": peak_rss_mb()}


def prompts(reader, call) -> list[list[int]]:
    judge_reader = getattr(reader, "judge_reader", reader)
    return [judge_reader.prompt_ids(judge_reader.questions[0], p) for p in call]


def arithmetic(path: str, precision: str, bf16: bool) -> str:
    """The matmul peak a path is held against: what its products compute in."""
    if path in ("onnx int4", "openvino int8 static", "openvino int8 static mixed", "openvino int8 f32"):
        return "int8"  # MatMulNBits at accuracy level 4, int8 activations (mixed: most; f32: quantized as read)
    if path.startswith("openvino"):
        return "bf16" if bf16 else "fp32"  # weights decompressed to the activations' precision
    return "bf16" if "bf16" in precision else "fp32"


def compare(rows: dict[str, Any], directory: Path, calls: dict[str, list[int]]) -> None:
    """Per workload, each path's decisions against PyTorch fp32's: a pair's winner, a group's best answer."""
    if not (directory / f"{REFERENCE}.npz").exists():
        return
    ref = np.load(directory / f"{REFERENCE}.npz")
    for path, r in rows.items():
        if "workloads" not in r or not (directory / f"{path}.npz").exists():
            continue
        got = np.load(directory / f"{path}.npz")
        for name, w in r["workloads"].items():
            sizes = calls[name]
            cuts = np.cumsum([0] + sizes)
            picks = [(int(np.argmax(got[name][a:b])), int(np.argmax(ref[name][a:b]))) for a, b in zip(cuts, cuts[1:])]
            w["agreement"] = float(np.mean([x == y for x, y in picks]))
            w["max_abs_diff"] = float(np.abs(got[name] - ref[name]).max())


def markdown(d: dict[str, Any]) -> str:
    m = d["machine"]
    cap = f"; oneDNN capped at {d['onednn_max_cpu_isa']}" if d["onednn_max_cpu_isa"] else ""
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in d["matmul_peak_gflops"].items())
    lines = [f"# Verdict judge reading speed: {d['model']} ({m['date'][:10]})", "",
             f"{m['cpu']} ({', '.join(m['matmul_flags'])}), {d['threads']} threads (pinned){cap}; commit "
             f"{m['commit']}; load at start {m['loadavg_at_start'][0]:.2f}. Question {d['question']!r}; pool "
             f"{' '.join(d['pool'])}; {d['parameters'] / 1e6:.0f}M decoder parameters; matmul peak {peaks} GFLOP/s "
             f"(same run). Each path in its own process, cold, median of {d['repeats']} reads. Agreement: decisions "
             "as PyTorch fp32's (a pair's winner, a group's best answer).", ""]
    if d["export"]:
        e = d["export"]
        lines += ["Export: " + ", ".join(f"{k} {v} s" for k, v in e["seconds"].items()) + "; sizes "
                  + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in e["bytes"].items()), ""]
    for name in d["workloads"]:
        lines += [f"## {name} ({d['workloads'][name]} calls)", "",
                  "| path | answers/s | x PyTorch fp32 | prompt tokens/s | tokens read/s | of peak | agreement | "
                  "max abs diff | precision | peak RSS MB |", "|---|---|---|---|---|---|---|---|---|---|"]
        base = d["rows"].get(REFERENCE, {}).get("workloads", {}).get(name, {}).get("answers_per_s")
        for path, r in d["rows"].items():
            w = r.get("workloads", {}).get(name)
            if w is None:
                lines.append(f"| {path} | {r.get('skipped') or 'failed: ' + r.get('failed', '')} |" + " |" * 8)
                continue
            ratio = f"{w['answers_per_s'] / base:.2f}x" if base else "-"
            lines.append(f"| {path} | {w['answers_per_s']:.2f} | {ratio} | {w['prompt_tokens_per_s']:.0f} | "
                         f"{w['tokens_read_per_s']:.0f} | {w['peak_share']:.0%} ({w['peak']}) | "
                         f"{w.get('agreement', float('nan')):.1%} | {w.get('max_abs_diff', float('nan')):.3g} | "
                         f"{r['precision']} | {r['peak_rss_mb']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "--backbone", dest="model", default="qwen-coder-0.5b")
    p.add_argument("--question", default="correct", help="a pointwise preset of clfjudge/configs/verdict.yaml")
    p.add_argument("--pool", nargs="+", default=list(POOL))
    p.add_argument("--pairs", type=int, default=32)
    p.add_argument("--groups", type=int, default=4, help="best-of-N groups")
    p.add_argument("--n", type=int, default=4, help="answers per group")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak-seconds", type=float, default=2.0, help="seconds each matmul peak is measured for")
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    p.add_argument("--onednn-max-cpu-isa", default=None, metavar="ISA",
                   help="ONEDNN_MAX_CPU_ISA for every path (e.g. AVX512_CORE_VNNI: a CPU without bf16)")
    p.add_argument("--results", type=Path, default=None, help="results folder (default bench/results)")
    p.add_argument("--one-path", help=argparse.SUPPRESS)  # internal: run one path in this process
    p.add_argument("--onnx-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_path:
        print(json.dumps(run_path(args.one_path, args)))
        return 0
    from clfjudge.machine import probe

    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="verdict_speed."))
    paths = list(args.paths)
    exported = export(args.model, args.question, tmp, paths, args.pool, args.seed) \
        if any(path in EXPORTED for path in paths) else None
    peaks = {prec: matmul_peak(prec, args.threads, args.peak_seconds) for prec in ("fp32", "bf16", "int8")}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.onednn_max_cpu_isa:
        env["ONEDNN_MAX_CPU_ISA"] = args.onednn_max_cpu_isa
    rows: dict[str, Any] = {}
    for path in paths:
        if path == "openvino bf16" and not (runs := probe().openvino_bf16()):
            rows[path] = {"skipped": f"does not run here: {runs.why}"}
            continue
        if path in EXPORTED and EXPORTED[path][0] not in exported["files"]:
            rows[path] = {"skipped": f"not made: {exported['variants'].get(EXPORTED[path][0])}"}
            continue
        cmd = [sys.executable, __file__, "--model", args.model, "--question", args.question, "--pool", *args.pool,
               "--pairs", str(args.pairs), "--groups", str(args.groups), "--n", str(args.n), "--seed", str(args.seed),
               "--threads", str(args.threads), "--repeats", str(args.repeats), "--one-path", path,
               "--onnx-dir", str(tmp), "--out", str(tmp / f"{path}.npz")]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            rows[path] = {"failed": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"}
            continue
        rows[path] = json.loads(done.stdout.strip().splitlines()[-1])
        print(path, json.dumps(rows[path]["workloads"]), flush=True)
    loads = workloads(args.pool, args.pairs, args.groups, args.n, args.seed)
    compare(rows, tmp, {name: [len(c) for c in calls] for name, calls in loads.items()})
    n_params = parameters(args.model)
    bf16 = bool(probe().openvino_bf16())
    for path, r in rows.items():
        for w in r.get("workloads", {}).values():
            w["peak"] = arithmetic(path, r["precision"], bf16)
            w["peak_share"] = w["tokens_read_per_s"] * 2 * n_params / peaks[w["peak"]]
    result = {"machine": machine(args.threads), "model": args.model, "question": args.question, "pool": args.pool,
              "workloads": {name: len(calls) for name, calls in loads.items()}, "parameters": n_params,
              "threads": args.threads, "repeats": args.repeats, "onednn_max_cpu_isa": args.onednn_max_cpu_isa,
              "matmul_peak_gflops": {k: v / 1e9 for k, v in peaks.items()}, "export": exported, "rows": rows,
              "wall_time_s": round(time.monotonic() - started, 1)}
    shutil.rmtree(tmp)
    written = write_run("verdict_speed", args.model, args.onednn_max_cpu_isa, result, markdown(result), args.results)
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
