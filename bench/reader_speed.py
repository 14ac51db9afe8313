"""How fast a frozen decoder reads answers after their questions, per path, and what each path does to the vectors.

    OMP_NUM_THREADS=2 .venv/bin/python bench/reader_speed.py --reader qwen-coder-1.5b --layer 21 [--answers 24]
        [--threads 2] [--repeats 3] [--paths "pytorch fp32 all" "pytorch bf16" "onnx int8" ...]

For any decoder (an alias such as ``smollm2``, ``qwen-coder-0.5b``, ``qwen-coder-1.5b``, a directory or a hub id)
and the layer an embedding judge would read, the paths the library has: PyTorch fp32 running every layer (the
model as loaded, the same layer pooled), PyTorch fp32 cut at the layer (``DecoderEmbedder``: the layers above it
are dropped), PyTorch bf16 cut (autocast; on a CPU without bf16 the library reads fp32 and the row says so), and
the exported reader (``reader.onnx``, the library's export of the cut model) run by onnxruntime in fp32, the same
graph with dynamic int8 weights (``quantize_onnx``, this CPU's int8 settings) and with weight-only int4
(``MatMulNBits``), and compiled by OpenVINO in bf16 where it runs. Each path runs in its own process with
``--threads`` threads; inputs are real PandaLM test answers read after their questions, cold (no cache), in the
library's token limits and batches. Reported: answers/s (median of ``--repeats`` reads), peak RSS, and each
path's pooled vectors against PyTorch fp32 cut (min and mean cosine).
Writes bench/results/reader_speed_<reader>_<date>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, path_rows, write  # noqa: E402

PATHS = ("pytorch fp32 all", "pytorch fp32", "pytorch bf16", "onnx fp32", "onnx int8", "onnx int4", "openvino bf16")
REFERENCE = "pytorch fp32"
ONNX = {"onnx fp32": ("reader.onnx", "cpu"), "onnx int8": ("reader_quantized.onnx", "cpu"),
        "onnx int4": ("reader_int4.onnx", "cpu"),
        "openvino bf16": ("reader.onnx", "openvino-bf16")}


def inputs(n: int) -> tuple[list[str], list[str]]:
    """The first answers of the PandaLM test set, each with its question."""
    from clfjudge.data.sources import load

    questions, answers = [], []
    for r in load("pandalm-test").records:
        for a in (r.answer_a, r.answer_b):
            if len(answers) < n:
                questions.append(r.question)
                answers.append(a)
    return questions, answers


def embedder(reader: str, layer: int, precision: str):
    from clfjudge.embedders.decoder import DecoderEmbedder

    return DecoderEmbedder(reader, layer=layer, precision=precision, cache_dir="")


def export(reader: str, layer: int, directory: Path, questions: list[str], answers: list[str]) -> dict[str, Any]:
    """The library's reader graph of ``reader`` cut at ``layer`` (fp32) and its dynamic int8 copy, in ``directory``;
    the card-like ``runtime.reader`` entry an ``OnnxDecoderReader`` needs."""
    from clfjudge.export.embedding import export_reader
    from clfjudge.export.quantize import int8_settings, quantize_int4, quantize_onnx

    e = embedder(reader, layer, "fp32")
    e._load()
    sample = [(e._prompt_ids(q), e._answer_ids(a)) for q, a in zip(questions[:2], answers[:2])]
    start = time.monotonic()
    export_reader(e, directory / "reader.onnx", sample)
    exported = time.monotonic() - start
    start = time.monotonic()
    quantize_onnx(directory / "reader.onnx", directory / "reader_quantized.onnx", int8_settings(), external=True)
    quantized = time.monotonic() - start
    start = time.monotonic()
    quantize_int4(directory / "reader.onnx", directory / "reader_int4.onnx")
    int4 = time.monotonic() - start
    e._tokenizer.save_pretrained(directory)
    before, after = e.template_parts()
    entry = {"backbone": reader, "depth": e._depth, "hidden_size": e._model.config.hidden_size,
             "eos_token_id": e._eos, "template": [before, after], "primary": "fp32"}
    (directory / "reader.json").write_text(json.dumps(entry))
    return {"export_s": round(exported, 1), "int8_s": round(quantized, 1), "int4_s": round(int4, 1),
            "bytes": {f.name: f.stat().st_size for f in directory.iterdir() if f.suffix in (".onnx", ".data")}}


def run_path(path: str, reader: str, layer: int, n: int, repeats: int, threads: int, onnx_dir: str,
             out: str) -> dict[str, Any]:
    """One path in this process: the median answers/s over ``repeats`` cold reads; the vectors go to ``out``."""
    import torch

    torch.set_num_threads(threads)
    questions, answers = inputs(n)
    if path in ONNX:
        from clfjudge.embedders.decoder import DEFAULT_MAX_ANSWER_TOKENS, DEFAULT_MAX_PROMPT_TOKENS
        from clfjudge.embedders.onnx_reader import OnnxDecoderReader
        from clfjudge.options import LoadOptions

        file, provider = ONNX[path]
        entry = json.loads((Path(onnx_dir) / "reader.json").read_text())
        config = {"layer": layer, "max_prompt_tokens": DEFAULT_MAX_PROMPT_TOKENS,
                  "max_answer_tokens": DEFAULT_MAX_ANSWER_TOKENS}
        e = OnnxDecoderReader(onnx_dir, entry, config, LoadOptions(provider=provider, variant=file, threads=threads),
                              cache_dir="")
    else:
        precision = "bf16" if path == "pytorch bf16" else "fp32"
        e = embedder(reader, layer, precision)
        if path == "pytorch fp32 all":  # every layer runs, the same layer is pooled: the model as loaded
            from transformers import AutoModel

            from clfjudge.embedders.memory import return_freed_buffers
            from clfjudge.models.backbones import resolve_backbone

            return_freed_buffers()  # as DecoderEmbedder._load
            full = AutoModel.from_pretrained(resolve_backbone(reader).path_or_id, dtype=torch.float32).eval()
            full.layers[e._resolved_layer() - 1].register_forward_hook(e._capture)
            e._load_tokenizer()
            e._model = full
    e.shared_prefix_min = 10 ** 9  # every answer read whole, on every path
    e._load()
    e.embed_answers(questions[:4], answers[:4])  # warm-up: kernels and buffers are set up on the first read
    rates, vectors = [], None
    for _ in range(repeats):
        e.clear_cache()
        start = time.perf_counter()
        vectors = e.embed_answers(questions, answers)
        rates.append(len(answers) / (time.perf_counter() - start))
    np.save(out, vectors)
    return {"answers_per_s": statistics.median(rates), "runs": [round(r, 3) for r in rates],
            "precision": getattr(e, "precision", None),
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss it does not carry the parent's over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def markdown(d: dict[str, Any]) -> str:
    m = d["machine"]
    setting = (f"{m['cpu']}, {d['threads']} threads; commit {m['commit']}. {d['answers']} real PandaLM test answers "
               f"(mean {d['answer_chars_mean']:.0f} characters) read after their questions, cold, each path in its "
               f"own process; median of {d['repeats']} reads. Cosine: each path's pooled vectors against PyTorch "
               "fp32 cut at the same layer.")
    lines = [f"# Reading speed: {d['reader']} at layer {d['layer']} ({m['date'][:10]})", "", setting, ""]
    if d["export"]:
        e = d["export"]
        lines += [f"Export: reader graph in {e['export_s']} s, int8 in {e['int8_s']} s, int4 in {e['int4_s']} s; "
                  + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in e["bytes"].items()), ""]
    lines += ["| path | answers/s | x PyTorch fp32 all layers | min cosine | mean cosine | peak RSS MB |",
              "|---|---|---|---|---|---|"]
    base = d["rows"].get("pytorch fp32 all", {}).get("answers_per_s")
    lines += path_rows(d["rows"], base, 6, lambda r: (
        f"{r['min_cosine']:.5f} | {r['mean_cosine']:.5f}" if "min_cosine" in r else "- | -")
        + f" | {r['peak_rss_mb']:.0f}")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reader", required=True)
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--answers", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    p.add_argument("--results", type=Path, default=None, help="results folder (default bench/results)")
    p.add_argument("--one-path", help=argparse.SUPPRESS)  # internal: run one path in this process
    p.add_argument("--onnx-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_path:
        print(json.dumps(run_path(args.one_path, args.reader, args.layer, args.answers, args.repeats, args.threads,
                                  args.onnx_dir, args.out)))
        return 0
    from clfjudge.machine import probe

    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="reader_speed."))
    rows: dict[str, Any] = {}
    exported = None
    if any(path in ONNX for path in args.paths):
        exported = export(args.reader, args.layer, tmp, *inputs(args.answers))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for path in args.paths:
        if path == "openvino bf16" and not (runs := probe().openvino_bf16()):
            rows[path] = {"skipped": f"does not run here: {runs.why}"}
            continue
        cmd = [sys.executable, __file__, "--reader", args.reader, "--layer", str(args.layer), "--answers",
               str(args.answers), "--threads", str(args.threads), "--repeats", str(args.repeats),
               "--one-path", path, "--onnx-dir", str(tmp), "--out", str(tmp / f"{path}.npy")]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            rows[path] = {"failed": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"}
            continue
        rows[path] = json.loads(done.stdout.strip().splitlines()[-1])
        print(path, rows[path], flush=True)
    if (tmp / f"{REFERENCE}.npy").exists():
        ref = np.load(tmp / f"{REFERENCE}.npy")
        for path, r in rows.items():
            if (tmp / f"{path}.npy").exists():
                cos = np.sum(np.load(tmp / f"{path}.npy") * ref, 1)  # vectors are L2-normalised
                r["min_cosine"], r["mean_cosine"] = float(cos.min()), float(cos.mean())
    questions, answers = inputs(args.answers)
    result = {"machine": machine(args.threads), "reader": args.reader, "layer": args.layer,
              "answers": len(answers), "answer_chars_mean": float(np.mean([len(a) for a in answers])),
              "threads": args.threads, "repeats": args.repeats, "export": exported, "rows": rows,
              "wall_time_s": round(time.monotonic() - started, 1)}
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    name = f"reader_speed_{Path(args.reader).name}"
    extra = {"results": args.results} if args.results else {}
    print(f"wrote {write(name, result, markdown(result), **extra)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
