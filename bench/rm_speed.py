"""Reward models side by side: what users run today (transformers fp32 / bf16, sentence-transformers' CrossEncoder)
against every path of clfjudge's export (ONNX fp32, OpenVINO f32 / bf16, dynamic int8, weight-only int4), on the same
pairs, each path in its own process.

    OMP_NUM_THREADS=2 python bench/rm_speed.py [--models minilm smollm2 qwen-coder-0.5b] [--rm DIR ...]
        [--pairs 48] [--max-tokens 320] [--threads 2] [--repeats 2] [--paths ...] [--onednn-max-cpu-isa ISA]
        [--train-steps 12] [--work runs/rm_speed] [--results DIR]

Reward models: each ``--rm DIR`` (a transformers sequence-classification directory, e.g. one TRL's RewardTrainer
saved), and for each ``--models`` alias (offline weights) one trained here by TRL's RewardTrainer on hh-rlhf pairs
(conversational for a decoder, text pairs for an encoder; a decoder of 0.5B or more as a linear probe, the backbone
frozen) so that decisions are not the near-ties of a random head.

Fair inputs: only pairs of ``--source`` whose every answer, as each path reads it (the model's chat template for a
decoder, a (question, answer) text pair for an encoder), fits in ``--max-tokens``: no path cuts anything, so the
agreement column measures arithmetic, not truncation policies.

Each model is exported once by ``clfjudge export`` with every variant (``--int8 --int4``, ``--provider openvino``
and ``openvino-bf16`` where it runs), the lossy thresholds opened so that every file is written and measured; the
gate's verdict at the shipped thresholds (clfjudge/configs/parity.yaml) is a column, and the row a user is served
(``Judge.load``'s default: the fastest run that passes the shipped gate) is marked. The export's seconds per step
come from its parity report.

Each path runs in its own process pinned to ``--threads`` (torch, onnxruntime, OpenVINO): a warm-up on one batch,
then ``--repeats`` timed passes over every answer (median); peak RSS of the process. Agreement: the fraction of pairs
whose decision (which answer gets the higher reward) is transformers fp32's; max |delta reward| against it.
``--onednn-max-cpu-isa`` caps oneDNN (``ONEDNN_MAX_CPU_ISA``, e.g. AVX512_CORE_VNNI: a CPU without bf16) in every
path's process. Results: bench/results/rm_speed[_CAP]_DATE.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

REFERENCE = "transformers fp32"
# path -> (ONNX variant, provider) for clfjudge's export
CLFJUDGE = {"clfjudge onnx fp32": ("fp32", "cpu"), "clfjudge openvino f32": ("fp32", "openvino"),
            "clfjudge openvino bf16": ("fp32", "openvino-bf16"), "clfjudge int8": ("int8", "cpu"),
            "clfjudge int4": ("int4", "cpu")}
PATHS = (REFERENCE, "transformers bf16", "CrossEncoder torch", *CLFJUDGE)
GATE_KEY = {"clfjudge onnx fp32": "model.onnx", "clfjudge openvino f32": "model.onnx @ openvino",
            "clfjudge openvino bf16": "model.onnx @ openvino-bf16", "clfjudge int8": "model_quantized.onnx",
            "clfjudge int4": "model_int4.onnx"}
Scorer = Callable[[Sequence[tuple[str, str]]], Sequence[float]]


def train_rm(alias: str, out: Path, steps: int, threads: int, lr: float | None = None) -> Path:
    """A reward model from offline weights, trained ``steps`` steps by TRL's RewardTrainer on hh-rlhf pairs. A
    decoder's backbone is frozen and only its score head trained (a linear probe, learning rate 1e-3: full
    fine-tuning is hours on 2 cores, and the bench needs decisive rewards, not a good reward model); an encoder is
    fine-tuned whole (1e-4)."""
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from clfjudge.data import sources
    from clfjudge.models.backbones import load_seq_cls, load_tokenizer, resolve_backbone
    from clfjudge.models.heads import RewardHead

    if (out / "config.json").is_file():
        return out
    info = resolve_backbone(alias)
    tokenizer = load_tokenizer(info)
    model = load_seq_cls(info, 1, "regression", tokenizer=tokenizer)
    head_only = info.family == "decoder"
    lr = lr or (1e-3 if head_only else 1e-4)
    if head_only:
        head = model.score  # the sequence-classification head of a decoder (``classifier`` on encoders)
        for p in model.parameters():
            p.requires_grad_(False)
        for p in head.parameters():
            p.requires_grad_(True)
    records = [r for r in sources.load_usable("hh-rlhf", RewardHead().select).records if r.verdict.value != "TIE"]
    records = random.Random(0).sample(records, min(len(records), steps * 8))
    chat = info.family == "decoder"

    def row(r) -> dict[str, Any]:
        good, bad = (r.answer_a, r.answer_b) if r.verdict.value == "A" else (r.answer_b, r.answer_a)
        if chat:  # conversational: TRL applies the chat template, as clfjudge reads a decoder RM
            return {"prompt": [{"role": "user", "content": r.question}],
                    "chosen": [{"role": "assistant", "content": good}],
                    "rejected": [{"role": "assistant", "content": bad}]}
        # an encoder RM reads text pairs: token ids given as TRL's pre-tokenized columns
        ids = [tokenizer(r.question, a, truncation=True, max_length=512)["input_ids"] for a in (good, bad)]
        return {"chosen_ids": ids[0], "rejected_ids": ids[1]}

    args = RewardConfig(output_dir=str(out.with_name(out.name + "-run")), max_steps=steps,
                        per_device_train_batch_size=8, learning_rate=lr, max_length=512, report_to=[],
                        save_strategy="no", logging_steps=10, use_cpu=True, seed=0, dataloader_num_workers=0)
    trainer = RewardTrainer(model=model, args=args, processing_class=tokenizer,
                            train_dataset=Dataset.from_list([row(r) for r in records]))
    trainer.train()
    trainer.save_model(str(out))
    return out


def is_encoder(directory: Path) -> bool:
    """An encoder reward model reads (question, answer) text pairs; one whose tokenizer has a chat template, it."""
    from transformers import AutoTokenizer

    return not AutoTokenizer.from_pretrained(directory).chat_template


def fair_items(rm: Path, args) -> list[tuple[str, str]]:
    """Both answers of the first ``--pairs`` pairs (seeded order) whose every input fits ``--max-tokens``."""
    from transformers import AutoTokenizer

    from clfjudge.data import sources

    tokenizer = AutoTokenizer.from_pretrained(rm)
    encoder = is_encoder(rm)

    def length(question: str, answer: str) -> int:
        if encoder:
            return len(tokenizer(question, answer)["input_ids"])
        text = tokenizer.apply_chat_template([{"role": "user", "content": question},
                                              {"role": "assistant", "content": answer}], tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    pairs = list(sources.load(args.source).records)
    random.Random(0).shuffle(pairs)
    items: list[tuple[str, str]] = []
    for p in pairs:
        if len(items) == 2 * args.pairs:
            break
        both = [(p.question, p.answer_a), (p.question, p.answer_b)]
        if all(length(q, a) <= args.max_tokens for q, a in both):
            items += both
    return items


def export(rm: Path, onnx_dir: Path) -> dict[str, Any]:
    """Every variant of ``rm`` written (lossy thresholds opened) and its parity report; the shipped gate's
    verdict per run and the run it would serve."""
    from clfjudge.export.onnx import export_judge
    from clfjudge.export.parity import ParityConfig
    from clfjudge.models.onnx_session import runnable_providers

    if not (onnx_dir / "parity_report.json").is_file():  # every variant written: the lossy gates opened
        opened = [f"{p}.{k}={v}" for p in ("int8", "int4", "bf16")
                  for k, v in (("min_agreement", 0), ("max_metric_delta", 1), ("min_cosine", 0))]
        providers, _ = runnable_providers(["openvino", "openvino-bf16"])
        export_judge(rm, onnx_dir, int8=True, int4=True, providers=providers,
                     parity=ParityConfig.load(overrides=opened))
    report = json.loads((onnx_dir / "parity_report.json").read_text())
    shipped = ParityConfig.load()
    verdicts = {key: shipped.for_precision(v["precision"]).failures(v) for key, v in report["variants"].items()}
    passing = [k for k, f in verdicts.items() if not f]
    served = max(passing, key=lambda k: report["variants"][k]["records_per_s"]) if passing else None
    return {"seconds": report.get("seconds"), "validation": {k: report["validation"].get(k) for k in
                                                             ("source", "n", "budget", "chunk_records")},
            "gate": {k: {"agreement": v["agreement"], "max_abs_diff": v["max_abs_diff"],
                         "records_per_s": v["records_per_s"], "failures": verdicts[k]}
                     for k, v in report["variants"].items()},
            "served": served, "bytes": {n: m.get("bytes") for n, m in
                                        json.loads((onnx_dir / "judge_card.json").read_text())["runtime"]["onnx"]
                                        ["files"].items()}}


# -- one path, in its own process -------------------------------------------------------------------------------

def transformers_scorer(rm: Path, batch: int, dtype: str) -> Scorer:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(rm)
    model = AutoModelForSequenceClassification.from_pretrained(rm, dtype=getattr(torch, dtype)).eval()
    encoder = is_encoder(rm)

    def encode(chunk):
        if encoder:
            return tokenizer([q for q, _ in chunk], [a for _, a in chunk], padding=True, return_tensors="pt")
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                                               tokenize=False) for q, a in chunk]
        return tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")

    def score(items):
        out: list[float] = []
        with torch.inference_mode():
            for i in range(0, len(items), batch):
                out += model(**encode(items[i:i + batch])).logits[:, 0].float().tolist()
        return out

    return score


def cross_encoder_scorer(rm: Path, batch: int) -> Scorer:
    import torch
    from sentence_transformers import CrossEncoder

    if not is_encoder(rm):
        raise NotImplementedError("a decoder reward model reads its chat template; CrossEncoder reads text pairs")
    model = CrossEncoder(str(rm), backend="torch", num_labels=1, activation_fn=torch.nn.Identity())
    return lambda items: model.predict(list(items), batch_size=batch, convert_to_numpy=True).tolist()


def clfjudge_scorer(onnx_dir: Path, path: str, args) -> Scorer:
    from clfjudge.judges.base import Judge

    variant, provider = CLFJUDGE[path]
    judge = Judge.load(onnx_dir, variant=variant, provider=provider, threads=args.threads, batch_size=args.batch,
                       max_batch_tokens=args.max_batch_tokens)
    return lambda items: [s.value for s in judge.score_batch([{"question": q, "answer": a} for q, a in items])]


def run_path(path: str, rm: Path, onnx_dir: Path, items_file: Path, out: Path, args) -> dict[str, Any]:
    import torch
    from reader_speed import peak_rss_mb

    torch.set_num_threads(args.threads)
    items = [tuple(x) for x in json.loads(items_file.read_text())]
    if path.startswith("transformers"):
        scorer = transformers_scorer(rm, args.batch, "float32" if path.endswith("fp32") else "bfloat16")
    elif path == "CrossEncoder torch":
        scorer = cross_encoder_scorer(rm, args.batch)
    else:
        scorer = clfjudge_scorer(onnx_dir, path, args)
    scorer(items[:args.batch])  # warm-up: one batch
    times, rewards = [], None
    for _ in range(args.repeats):
        began = time.perf_counter()
        rewards = np.asarray(scorer(items), dtype=np.float64)
        times.append(time.perf_counter() - began)
    np.save(out, rewards)
    seconds = statistics.median(times)
    return {"answers_per_s": len(items) / seconds, "seconds": seconds, "peak_rss_mb": round(peak_rss_mb())}


# -- the side by side -----------------------------------------------------------------------------------------

def rows_for(rm: Path, args, env: dict[str, str]) -> dict[str, Any]:
    from clfjudge.machine import probe

    work = Path(args.work)
    onnx_dir = work / f"{rm.name}-onnx"
    started = time.perf_counter()
    if not (onnx_dir / "parity_report.json").is_file():  # in its own process: this one stays idle while paths run
        subprocess.run([sys.executable, __file__, "--export-only", "--rm", str(rm), "--onnx-dir", str(onnx_dir)],
                       env=env, check=True)
    exported = export(rm, onnx_dir)
    items = fair_items(rm, args)
    items_file = work / f"{rm.name}-items.json"
    items_file.write_text(json.dumps(items))
    rows: dict[str, dict[str, Any]] = {}
    for path in args.paths:
        if path == "clfjudge openvino bf16" and not (runs := probe().openvino_bf16()):
            rows[path] = {"skipped": f"does not run here: {runs.why}"}
            continue
        if path == "CrossEncoder torch" and not is_encoder(rm):
            rows[path] = {"skipped": "encoders only: CrossEncoder reads (question, answer) text pairs, a decoder "
                                     "reward model its chat template"}
            continue
        out = work / f"{rm.name}-{path.replace(' ', '_')}.npy"
        cmd = [sys.executable, __file__, "--one-path", path, "--rm", str(rm), "--onnx-dir", str(onnx_dir),
               "--items", str(items_file), "--out", str(out), "--threads", str(args.threads), "--repeats",
               str(args.repeats), "--batch", str(args.batch), "--max-batch-tokens", str(args.max_batch_tokens)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"
            rows[path] = {"failed": last[:300]}
        else:
            rows[path] = {**json.loads(done.stdout.strip().splitlines()[-1]), "rewards": str(out)}
        print(f"  {path}: {rows[path]}", flush=True)
    compare(rows, exported)
    return {"model": rm.name, "pairs": len(items) // 2, "answers": len(items), "export": exported,
            "rows": rows, "wall_s": round(time.perf_counter() - started, 1)}


def compare(rows: dict[str, dict[str, Any]], exported: dict[str, Any]) -> None:
    ref = np.load(rows[REFERENCE]["rewards"]) if "rewards" in rows.get(REFERENCE, {}) else None
    for path, r in rows.items():
        if "rewards" not in r:
            continue
        rewards = np.load(r.pop("rewards"))
        if ref is not None:
            r["agreement"] = float(np.mean(np.sign(rewards[0::2] - rewards[1::2]) == np.sign(ref[0::2] - ref[1::2])))
            r["max_abs_diff"] = float(np.abs(rewards - ref).max())
            r["vs_transformers"] = r["answers_per_s"] / rows[REFERENCE]["answers_per_s"]
        if path in GATE_KEY:
            gate = exported["gate"].get(GATE_KEY[path])
            r["gate"] = "not gated" if gate is None else "refused: " + "; ".join(gate["failures"]) \
                if gate["failures"] else "passes"
            r["served"] = GATE_KEY[path] == exported["served"]


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    cap = f"; oneDNN capped at {result['onednn_max_cpu_isa']}" if result["onednn_max_cpu_isa"] else ""
    lines = [f"# Reward models side by side, {m['date'][:10]}", "",
             f"{m['cpu']} ({', '.join(m['matmul_flags']) or 'no bf16/vnni flags'}), {result['threads']} threads "
             f"pinned{cap}; load at start {m['loadavg_at_start']}; commit {m['commit']}. Pairs of "
             f"{result['source']} whose every input fits {result['max_tokens']} tokens (nothing cut by any path); "
             f"median of {result['repeats']} passes after a one-batch warm-up, each path in its own process. "
             "Agreement: same decision as transformers fp32 on the same pair. **Served**: what `Judge.load` runs by "
             "default (the fastest run the shipped gate passes).", ""]
    for model in result["models"]:
        e = model["export"]
        secs = e.get("seconds") or {}
        lines += [f"## {model['model']} ({model['pairs']} pairs, {model['answers']} answers)", "",
                  f"Export with every variant gated: {secs.get('total', float('nan')):.0f} s "
                  f"({', '.join(f'{k} {v:.0f}' for k, v in secs.items() if k != 'total')}); gate slice "
                  f"{e['validation']['n']} records of {e['validation']['source']}.", "",
                  "| path | answers/s | x transformers fp32 | agreement | max abs delta reward | peak RSS MB | "
                  "shipped gate |", "|---|---:|---:|---:|---:|---:|---|"]
        for path, r in model["rows"].items():
            if "answers_per_s" not in r:
                lines.append(f"| {path} | {r.get('skipped') or 'failed: ' + r.get('failed', '')} | | | | | |")
                continue
            name = f"**{path} (served)**" if r.get("served") else path
            lines.append(f"| {name} | {r['answers_per_s']:.2f} | {r.get('vs_transformers', float('nan')):.2f}x | "
                         f"{r.get('agreement', float('nan')):.1%} | {r.get('max_abs_diff', float('nan')):.2g} | "
                         f"{r['peak_rss_mb']} | {r.get('gate', '-')} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["minilm", "smollm2", "qwen-coder-0.5b"])
    parser.add_argument("--rm", nargs="*", type=Path, default=[])
    parser.add_argument("--source", default="autoj-test")
    parser.add_argument("--pairs", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-batch-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--train-steps", type=int, default=12, help="steps of a reward model trained here (the MiniLM "
                                                                       "one of the results: 60)")
    parser.add_argument("--onednn-max-cpu-isa", default=None, metavar="ISA")
    parser.add_argument("--work", default="runs/rm_speed")
    parser.add_argument("--results", type=Path, default=None, help="results directory (default bench/results)")
    parser.add_argument("--one-path", help=argparse.SUPPRESS)  # internal: one path in this process
    parser.add_argument("--export-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--onnx-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--items", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export_only:
        export(args.rm[0], args.onnx_dir)
        return 0
    if args.one_path:
        print(json.dumps(run_path(args.one_path, args.rm[0], args.onnx_dir, args.items, args.out, args)))
        return 0
    if args.onednn_max_cpu_isa:  # before the machine probe first runs: it reads the cap
        os.environ["ONEDNN_MAX_CPU_ISA"] = args.onednn_max_cpu_isa
    meta = common.machine(args.threads)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    models = [*args.rm, *(train_rm(a, Path(args.work) / f"{a}-rm", args.train_steps, args.threads)
                          for a in args.models)]
    result = {"machine": meta, "source": args.source, "max_tokens": args.max_tokens, "threads": args.threads,
              "repeats": args.repeats, "onednn_max_cpu_isa": args.onednn_max_cpu_isa, "models": []}
    for rm in models:
        print(f"{rm}:", flush=True)
        result["models"].append(rows_for(rm, args, env))
    name = "rm_speed" + (f"_{args.onednn_max_cpu_isa.lower()}" if args.onednn_max_cpu_isa else "")
    tag = "_".join(m["model"] for m in result["models"])
    print(common.write(f"{name}_{tag}", result, markdown(result), **({"results": args.results} if args.results
                                                                     else {})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
