"""How fast the frozen-decoder embedding judge reads, on every path, and how far that is from the hardware.

    OMP_NUM_THREADS=1 .venv/bin/python bench/decoder_speed.py JUDGE_DIR [--pairs 48] [--threads 1 2]
        [--paths "onnx fp32" "openvino bf16" ...] [--no-best-of-n] [--name decoder_speed]

For one trained decoder embedding judge (``head: embedding`` on a decoder, e.g. the main job's): PyTorch fp32,
PyTorch bf16 (AMX autocast), onnxruntime fp32 and int8, OpenVINO f32 and bf16 compiling the same reader.onnx (the
judge exported next to itself with ``providers`` openvino / openvino-bf16, gate set to measure; its parity numbers on
the gate's records are reported too), at 1 and 2 threads, each in its own process pinned to that many cores (thread
settings are process-wide; peak RSS is the process's own; the load average after each path is recorded).
Inputs are real PandaLM test pairs at their real lengths, read cold (no cache): judgements/s (both answer orders,
as the judge decides), answers/s, decision agreement with PyTorch fp32. Best-of-8 on real AlpacaEval questions
of >= 100 prompt tokens, with and without the shared-prompt key/value cache, in PyTorch (fp32, bf16) and in
onnxruntime fp32 (the export's prefix.onnx + continuation.onnx against reader.onnx). Every figure is also stated as
achieved FLOP/s (the model's FLOPs per answer counted from its config and the token counts) over the matmul peak
measured in the same run at that precision and thread count.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write  # noqa: E402

PATHS = ("pytorch fp32", "pytorch bf16", "onnx fp32", "onnx int8", "openvino f32", "openvino bf16", "openvino int8")
DEFAULT_PATHS = PATHS[:-1]  # openvino int8 needs nncf, which the openvino extra does not bring
OV_INT8 = "reader_ov_int8.xml"
# path -> (provider, file): OpenVINO compiles reader.onnx, or the NNCF int8 model the bench writes (openvino_int8)
OPENVINO = {"openvino f32": ("openvino", "fp32"), "openvino bf16": ("openvino-bf16", "fp32"),
            "openvino int8": ("openvino", OV_INT8)}
MEASURE_ONLY = ("int8.min_agreement=0", "int8.max_metric_delta=1", "int8.min_cosine=0",
                "bf16.min_agreement=0", "bf16.max_metric_delta=1", "bf16.min_cosine=0")
PRECISION = {"f32": "fp32"}  # a path's precision word -> the matmul peak it is measured against
BEST_OF_N_PATHS = ("pytorch fp32", "pytorch bf16", "onnx fp32")  # the shared-prefix graphs are fp32 only


# -- FLOPs and peaks ----------------------------------------------------------------------------------------

def reading_flops(config, prompt: int, answer: int, layers: int, lm_head_tokens: int) -> float:
    """FLOPs of one reading: ``layers`` decoder layers over prompt + answer tokens (weights 2 FLOPs per MAC,
    causal attention scores and values over the preceding tokens) and the LM head on ``lm_head_tokens``."""
    d, ff = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (d // config.num_attention_heads)
    per_token_layer = 2 * (2 * d * d + 2 * d * kv + 3 * d * ff)
    t = prompt + answer
    attention = 2 * 2 * d * (t * (t + 1) / 2)  # QK^T and AV, each token over the ones before it
    return layers * (t * per_token_layer + attention) + lm_head_tokens * 2 * d * config.vocab_size


def matmul_peak(precision: str, threads: int, seconds: float = 2.0) -> float:
    """FLOP/s of a 512 x 576 x 1536 product (a decoder MLP's shape) in ``precision`` on ``threads`` threads."""
    if precision == "int8":
        return _int8_peak(threads, seconds)
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(512, 576), torch.randn(576, 1536)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.inference_mode()
    with torch.inference_mode(), ctx:
        a2, b2 = (a.bfloat16(), b.bfloat16()) if precision == "bf16" else (a, b)
        for _ in range(3):
            a2 @ b2
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            a2 @ b2
            n += 1
    return n * 2 * 512 * 576 * 1536 / (time.perf_counter() - start)


def _int8_peak(threads: int, seconds: float) -> float:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).integers(-127, 127, (576, 1536), dtype=np.int8), "w")
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [512, 576])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [512, 1536])], [w])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # ort reads <= 13
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(1).integers(0, 255, (512, 576), dtype=np.uint8)
    for _ in range(3):
        session.run(None, {"a": a})
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        session.run(None, {"a": a})
        n += 1
    return n * 2 * 512 * 576 * 1536 / (time.perf_counter() - start)


# -- one path in one process --------------------------------------------------------------------------------

def _judge(path: str, judge_dir: Path, onnx_dir: Path, threads: int):
    from clfjudge.judges.base import Judge

    if path in OPENVINO:
        provider, variant = OPENVINO[path]
        return Judge.load(onnx_dir, variant=variant, provider=provider, threads=threads, batch_size=8).judge
    if path.startswith("onnx"):
        return Judge.load(onnx_dir, variant=path.split()[1], threads=threads, batch_size=8).judge
    import torch

    torch.set_num_threads(threads)
    from clfjudge.batching import Budget
    from clfjudge.card import JudgeCard
    from clfjudge.judges.embedding import EmbeddingModel, embedder_for_card

    card = JudgeCard.load(judge_dir)
    embedder = embedder_for_card(card, budget=Budget(8), precision=path.split()[1])
    return EmbeddingModel.load(judge_dir, embedder=embedder)


def openvino_int8(onnx_dir: Path, answers: int = 96, seed: int = 1) -> dict[str, Any]:
    """``OV_INT8`` beside reader.onnx: NNCF post-training static int8 of the OpenVINO model read from it (transformer
    model type: SmoothQuant, fast bias correction), calibrated on real answers of AlpacaEval GPT-4 Turbo pairs (not
    the bench's PandaLM pairs nor the gate's records), in reader batches of 4. Measured here, not shipped."""
    from clfjudge.models.openvino_session import import_openvino

    ov = import_openvino()  # first: NNCF then finds OpenVINO's telemetry off too
    import nncf

    from clfjudge.card import JudgeCard
    from clfjudge.data import sources
    from clfjudge.embedders.onnx_reader import OnnxDecoderReader, graph_feed
    from clfjudge.judges.embedding import embedder_config

    card = JudgeCard.load(onnx_dir)
    reader = OnnxDecoderReader(onnx_dir, card.runtime["reader"], embedder_config(card))
    reader._load_tokenizer()
    records = random.Random(seed).sample(sources.load("alpacaeval-gpt4turbo").records, answers // 2)
    items = [(reader._prompt_ids(r.question), reader._answer_ids(a))
             for r in records for a in (r.answer_a, r.answer_b)]
    names = card.runtime["reader"]["inputs"]
    feeds = [{k: v for k, v in graph_feed(items[i:i + 4], reader._eos).items() if k in names}
             for i in range(0, len(items), 4)]
    start = time.perf_counter()
    model = nncf.quantize(ov.Core().read_model(str(onnx_dir / "reader.onnx")), nncf.Dataset(feeds),
                          model_type=nncf.ModelType.TRANSFORMER, subset_size=len(feeds))
    ov.save_model(model, str(onnx_dir / OV_INT8))
    return {"file": OV_INT8, "calibration": f"{len(items)} answers of alpacaeval-gpt4turbo (seed {seed})",
            "nncf": nncf.__version__, "seconds": time.perf_counter() - start}


def run_path(args: tuple) -> dict[str, Any]:
    path, judge_dir, onnx_dir, threads, pairs, repeats = args
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:threads]))  # pinned: this many cores, no more
    judge = _judge(path, judge_dir, onnx_dir, threads)
    proba = judge.predict_proba(pairs)  # warm-up (loads the model), and the decisions
    times = []
    for _ in range(repeats):
        judge.embedder.clear_cache()
        start = time.perf_counter()
        judge.predict_proba(pairs)
        times.append(time.perf_counter() - start)
    return {"path": path, "threads": threads, "seconds": statistics.median(times), "proba": proba.tolist(),
            "times": times, "peak_rss_mb": _peak_rss_mb(), "loadavg_after": os.getloadavg()}


def run_best_of_n(args: tuple) -> list[dict[str, Any]]:
    """Best-of-n on one path, each prompt + answer read whole and the answers read after their prompt's cache, in
    one process, the two alternating repeat by repeat (a machine shared with other jobs drifts in speed)."""
    path, judge_dir, onnx_dir, threads, groups, repeats = args
    embedder = _judge(path, judge_dir, onnx_dir, threads).embedder
    if path.startswith("onnx") and not embedder.shares_prefixes:
        raise ValueError(f"{onnx_dir} has no shared-prefix graphs for {path}: delete it to export it again")
    questions = [q for q, answers in groups for _ in answers]
    answers = [a for _, group in groups for a in group]

    def read(shared: bool) -> tuple[float, np.ndarray]:
        embedder.shared_prefix_min = 4 if shared else 10 ** 9
        embedder.clear_cache()
        start = time.perf_counter()
        values = (embedder.answer_stats if embedder.stats else embedder.embed_answers)(questions, answers)
        return time.perf_counter() - start, values

    values = {shared: read(shared)[1] for shared in (False, True)}  # warm-up (loads the model)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for shared in (False, True):
            times[shared].append(read(shared)[0])
    return [{"path": path, "shared": shared, "threads": threads, "seconds": statistics.median(times[shared]),
             "values": values[shared].tolist()} for shared in (False, True)]


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- main ---------------------------------------------------------------------------------------------------

def token_counts(judge_dir: Path, pairs, groups) -> dict[str, Any]:
    from clfjudge.card import JudgeCard
    from clfjudge.judges.embedding import embedder_for_card

    embedder = embedder_for_card(JudgeCard.load(judge_dir))
    embedder._load()
    empty = len(embedder._template(""))

    def reading(question: str, answer: str) -> tuple[int, int]:
        return len(embedder._prompt_ids(question)), len(embedder._answer_ids(answer))

    answers = {(p.question, a) for p in pairs for a in (p.answer_a, p.answer_b)}
    return {"config": embedder._model.config, "layers": embedder._depth if embedder.stats else embedder.layer,
            "stats": embedder.stats, "stats_tokens": embedder.stats_tokens, "empty_prompt": empty,
            "pair_readings": [reading(q, a) for q, a in answers],
            "group_readings": [reading(q, a) for q, group in groups for a in group]}


def flops_of(counts: dict[str, Any], readings: list[tuple[int, int]]) -> float:
    cfg, layers, stats = counts["config"], counts["layers"], counts["stats"]

    def scored(a: int) -> int:  # the tokens whose statistics are computed
        return min(a, counts["stats_tokens"] or a)

    total = sum(reading_flops(cfg, p, a, layers, scored(a) if stats else 0) for p, a in readings)
    if stats:  # the unconditional pass: the empty turn, then the scored tokens of the answer
        total += sum(reading_flops(cfg, counts["empty_prompt"], scored(a), layers, scored(a)) for _, a in readings)
    return total


def best_of_n_groups(n_questions: int, n: int = 8, min_tokens: int = 100, seed: int = 0):
    """(question, n candidate answers) of AlpacaEval instructions whose prompt is >= ``min_tokens`` tokens."""
    from transformers import AutoTokenizer

    from clfjudge.data import sources
    from clfjudge.models.backbones import resolve_backbone

    tok = AutoTokenizer.from_pretrained(resolve_backbone("smollm2").path_or_id)
    by_question: dict[str, set[str]] = {}
    for r in sources.load("alpacaeval-gpt4").records:
        by_question.setdefault(r.question, set()).update((r.answer_a, r.answer_b))
    long = [q for q, answers in by_question.items() if len(answers) >= n and len(tok(q).input_ids) >= min_tokens]
    chosen = random.Random(seed).sample(long, min(n_questions, len(long)))
    return [(q, sorted(by_question[q])[:n]) for q in chosen]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("judge_dir", type=Path)
    p.add_argument("--pairs", type=int, default=48)
    p.add_argument("--questions", type=int, default=6, help="best-of-8 questions")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", nargs="+", default=list(DEFAULT_PATHS), choices=PATHS)
    p.add_argument("--no-best-of-n", dest="best_of_n", action="store_false", help="skip the best-of-8 rows")
    p.add_argument("--name", default="decoder_speed", help="results file: bench/results/NAME_DATE.{json,md}")
    args = p.parse_args()
    if "pytorch fp32" not in args.paths:
        p.error("--paths needs 'pytorch fp32': agreement is measured against it")
    from clfjudge.embedders.cache import ENV

    os.environ.pop(ENV, None)  # read cold: no disk cache in this process or the ones it spawns
    started = machine(max(args.threads))  # its load average is the one at the start

    from clfjudge.data import sources
    from clfjudge.export.onnx import export_judge
    from clfjudge.export.parity import ParityConfig
    from clfjudge.judges.embedding import verdicts_from_proba

    onnx_dir = args.judge_dir.parent / f"{args.judge_dir.name}-onnx-bench"
    providers = list(dict.fromkeys(OPENVINO[p][0] for p in args.paths if p in OPENVINO))
    if not onnx_dir.exists():
        export_judge(args.judge_dir, onnx_dir, int8=True, parity=ParityConfig.load(overrides=MEASURE_ONLY),
                     providers=providers)
    gate = json.loads((onnx_dir / "parity_report.json").read_text())
    missing = [p for p in providers if not any(v.get("provider") == p for v in gate["variants"].values())]
    if missing:
        raise SystemExit(f"{onnx_dir} was exported without the providers {missing}: remove it to export it again")
    int8_ov = None
    if "openvino int8" in args.paths:
        with mp.get_context("spawn").Pool(1) as pool:
            int8_ov = pool.apply(openvino_int8, (onnx_dir,))
    pairs = random.Random(0).sample(sources.load("pandalm-test").records, args.pairs)
    groups = best_of_n_groups(args.questions) if args.best_of_n else []
    counts = token_counts(args.judge_dir, pairs, groups)
    pair_flops, group_flops = flops_of(counts, counts["pair_readings"]), flops_of(counts, counts["group_readings"])

    ctx = mp.get_context("spawn")
    rows, bon = [], []
    for threads in args.threads:
        for path in args.paths:
            with ctx.Pool(1) as pool:
                rows.append(pool.apply(run_path, ((path, args.judge_dir, onnx_dir, threads, pairs, args.repeats),)))
        for path in BEST_OF_N_PATHS if args.best_of_n else ():
            with ctx.Pool(1) as pool:
                bon += pool.apply(run_best_of_n, ((path, args.judge_dir, onnx_dir, threads, groups, args.repeats),))
    with ctx.Pool(1) as pool:
        peaks = {(prec, t): pool.apply(matmul_peak, (prec, t)) for prec in ("fp32", "bf16", "int8")
                 for t in args.threads}

    reference = {r["threads"]: verdicts_from_proba(np.array(r["proba"])) for r in rows if r["path"] == "pytorch fp32"}
    table = []
    for r in rows:
        precision = PRECISION.get(r["path"].split()[1], r["path"].split()[1])
        verdicts = verdicts_from_proba(np.array(r["proba"]))
        achieved = pair_flops / r["seconds"]
        table.append({"path": r["path"], "threads": r["threads"], "pairs_per_s": len(pairs) / r["seconds"],
                      "answers_per_s": len(counts["pair_readings"]) / r["seconds"],
                      "agreement": float(np.mean([a == b for a, b in zip(verdicts, reference[r["threads"]])])),
                      "gflops_per_s": achieved / 1e9, "peak_fraction": achieved / peaks[(precision, r["threads"])],
                      "peak_rss_mb": r["peak_rss_mb"], "seconds_each": r["times"],
                      "loadavg_after": r["loadavg_after"]})
    bon_rows = []
    for r in bon:
        whole = next(b for b in bon if b["threads"] == r["threads"] and b["path"] == r["path"] and not b["shared"])
        bon_rows.append({"path": r["path"], "shared_prefix": r["shared"], "threads": r["threads"],
                         "answers_per_s": len(counts["group_readings"]) / r["seconds"],
                         "speedup": whole["seconds"] / r["seconds"],
                         "max_abs_diff": float(np.abs(np.array(r["values"]) - np.array(whole["values"])).max())})
    data = {"machine": started, "judge": str(args.judge_dir), "pairs": len(pairs),
            "answers": len(counts["pair_readings"]), "pair_gflops": pair_flops / 1e9,
            "mean_tokens": float(np.mean([p + a for p, a in counts["pair_readings"]])),
            "best_of_n": {"questions": len(groups), "n": 8, "gflops": group_flops / 1e9,
                          "mean_prompt_tokens": float(np.mean([p for p, _ in counts["group_readings"]] or [0]))},
            "matmul_peak_gflops": {f"{p} x{t}": v / 1e9 for (p, t), v in peaks.items()},
            "rows": table, "best_of_n_rows": bon_rows, "loadavg_at_end": os.getloadavg(), "openvino_int8": int8_ov,
            "gate": {"validation": gate["validation"],
                     "variants": {k: {m: v[m] for m in ("precision", "agreement", "max_abs_diff", "min_cosine",
                                                        "metric_delta", "on_boundary")}
                                  for k, v in gate["variants"].items()}}}
    print(write(args.name, data, markdown(data)))
    return 0


def markdown(d: dict[str, Any]) -> str:
    m = d["machine"]
    out = [f"# Decoder embedding judge: speed per path ({m['date'][:10]})", "",
           f"{m['cpu']}, {m['cores']} cores; commit {m['commit']}. Judge `{d['judge']}`; {d['pairs']} real PandaLM "
           f"test pairs = {d['answers']} answers read cold (mean {d['mean_tokens']:.0f} tokens with the prompt), "
           f"{d['pair_gflops']:.1f} GFLOP in all (counted from the config). Median of repeated runs, each path in "
           "its own process. Matmul peak: a 512 x 576 x 1536 product measured in the same run: "
           + ", ".join(f"{k} {v:.0f}" for k, v in d["matmul_peak_gflops"].items()) + " GFLOP/s.", "",
           "| path | threads | pairs/s | answers/s | agreement with fp32 | GFLOP/s | of peak | peak RSS MB |",
           "|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['path']} | {r['threads']} | {r['pairs_per_s']:.2f} | {r['answers_per_s']:.2f} | "
            f"{100 * r['agreement']:.1f}% | {r['gflops_per_s']:.0f} | {100 * r['peak_fraction']:.0f}% | "
            f"{r['peak_rss_mb']:.0f} |" for r in d["rows"]]
    out += ["", f"Load average (1, 5, 15 min; other jobs on the machine count) at the start "
            f"{_load(m['loadavg_at_start'])}, at the end {_load(d['loadavg_at_end'])}; after each path: "
            + "; ".join(f"{r['path']} x{r['threads']} {r['loadavg_after'][0]:.2f}" for r in d["rows"]) + ".", ""]
    g = d["gate"]
    out += [f"Parity gate of the bench export ({g['validation']['n']} {g['validation']['source']} pairs, "
            "decisions against PyTorch fp32; the gate's thresholds set to measure):", "",
            "| file @ provider | precision | agreement | max diff of P | min cosine | accuracy delta |",
            "|---|---|---|---|---|---|"]
    out += [f"| {k} | {v['precision']} | {100 * v['agreement']:.2f}% | {v['max_abs_diff']:.2g} | "
            f"{v['min_cosine']:.6f} | {v['metric_delta']:+.4f} |" for k, v in g["variants"].items()]
    if d.get("openvino_int8"):
        q = d["openvino_int8"]
        out += ["", f"openvino int8: {q['file']}, NNCF {q['nncf']} post-training int8 of reader.onnx (transformer "
                f"preset), calibrated on {q['calibration']} in {q['seconds']:.0f} s; not gated, not shipped."]
    if not d["best_of_n_rows"]:
        return "\n".join(out) + "\n"
    b = d["best_of_n"]
    out += ["", f"Best-of-{b['n']} on {b['questions']} AlpacaEval questions "
            f"(mean prompt {b['mean_prompt_tokens']:.0f} tokens); speed-up and max diff against the same path "
            "reading each prompt + answer whole:", "",
            "| path | shared prompt cache | threads | answers/s | speed-up | max diff |", "|---|---|---|---|---|---|"]
    out += [f"| {r['path']} | {'yes' if r['shared_prefix'] else 'no'} | {r['threads']} | {r['answers_per_s']:.2f} | "
            f"{r['speedup']:.2f}x | {r['max_abs_diff']:.1e} |" for r in d["best_of_n_rows"]]
    return "\n".join(out) + "\n"


def _load(loadavg) -> str:
    return " / ".join(f"{x:.2f}" for x in loadavg)


if __name__ == "__main__":
    sys.exit(main())
