"""Answers per second of one reward model, side by side: clfjudge's served path vs transformers fp32 vs
sentence-transformers CrossEncoder (torch / onnx / openvino backends and their quantized variants), on the same pairs.

    python bench/rm_speed.py [--models minilm smollm2] [--rm DIR ...] [--pairs 128] [--threads 2] [--repeats 3]
                             [--train-steps 60] [--source autoj-test] [--work DIR] [--results DIR]

Reward models: each ``--rm DIR`` (a transformers sequence-classification directory, e.g. one TRL's RewardTrainer
saved), and for each ``--models`` alias (offline weights: minilm, mpnet, smollm2) one trained here with TRL's
RewardTrainer for ``--train-steps`` steps on hh-rlhf preference pairs (conversational: the decoder's chat template;
an encoder gets text pairs) so decisions are not the near-ties of a random head.

Each model is exported by ``clfjudge export`` (fp32 + int8 with ``--fallback``, OpenVINO gated where installed);
the rows then read the same answers (both answers of ``--pairs`` pairs of ``--source``):
- clfjudge served: ``Judge.load(export)`` as ``clfjudge serve`` loads it (provider auto: the fastest run the gate
  passed; token-budget batches of ``--max-batch-tokens``), and its int8 file where the gate kept one;
- transformers fp32: ``AutoModelForSequenceClassification`` on the model's own input (chat template / text pair),
  batches of ``--batch`` in input order;
- CrossEncoder (sentence-transformers) with backend torch, onnx, openvino, and its dynamic-int8 ONNX export; it
  reads (question, answer) as a text pair (its only input format; a decoder RM was trained on its chat template,
  which the agreement then shows). Its onnx / openvino backends need optimum, which cannot be installed beside
  transformers 5, and its static-int8 OpenVINO export calibrates on a hub data set: a row that cannot run says
  why.
Threads pinned (torch, onnxruntime intra-op, OpenVINO); each timing is the median of ``--repeats`` passes after a
warm-up pass. Agreement: the fraction of pairs whose decision (which answer gets the higher reward) matches
transformers fp32. Results: ``bench/results/rm_speed_DATE.{json,md}`` (``--results`` elsewhere) with date, machine,
threads, load and commit.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import common
import numpy as np

Scorer = Callable[[Sequence[tuple[str, str]]], np.ndarray]


def train_rm(alias: str, out: Path, steps: int, threads: int, lr: float = 2e-5, head_only: bool = False) -> Path:
    """A reward model from offline weights, trained ``steps`` steps by TRL's RewardTrainer on hh-rlhf pairs;
    ``head_only``: the backbone frozen, only the score head trained (a linear probe: a 0.5B model's full
    fine-tuning is hours on 2 cores, and the bench needs decisive rewards, not a good reward model)."""
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


def timed(scorer: Scorer, items: Sequence[tuple[str, str]], repeats: int) -> tuple[float, np.ndarray]:
    rewards = np.asarray(scorer(items), dtype=np.float64)  # warm-up, and the rewards for agreement
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        scorer(items)
        times.append(time.perf_counter() - start)
    return statistics.median(times), rewards


def clfjudge_scorer(directory: Path, args, variant: str | None = None) -> Scorer:
    from clfjudge.judges.base import Judge

    judge = Judge.load(directory, variant=variant, threads=args.threads, batch_size=args.batch,
                       max_batch_tokens=args.max_batch_tokens)
    return lambda items: [s.value for s in judge.score_batch([{"question": q, "answer": a} for q, a in items])]


def transformers_scorer(directory: Path, args) -> Scorer:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory, dtype=torch.float32).eval()
    chat = bool(tokenizer.chat_template) and model.config.model_type not in ("bert", "mpnet", "deberta-v2")

    def encode(batch):
        if chat:
            texts = [tokenizer.apply_chat_template([{"role": "user", "content": q},
                                                    {"role": "assistant", "content": a}], tokenize=False)
                     for q, a in batch]
            return tokenizer(texts, add_special_tokens=False, padding=True, truncation=True, max_length=4096,
                             return_tensors="pt")
        return tokenizer([q for q, _ in batch], [a for _, a in batch], padding=True, truncation=True,
                         max_length=512, return_tensors="pt")

    def score(items):
        out = []
        with torch.inference_mode():
            for i in range(0, len(items), args.batch):
                out.extend(model(**encode(items[i:i + args.batch])).logits[:, 0].tolist())
        return out

    return score


def cross_encoder_scorer(directory: Path, args, backend: str, quantized: bool = False) -> Scorer:
    """sentence-transformers' CrossEncoder on (question, answer) pairs; ``quantized``: its dynamic-int8 ONNX export
    (onnx) or static-int8 OpenVINO export (openvino), loaded by file name."""
    import torch
    from sentence_transformers import CrossEncoder

    def load(**model_kwargs):
        return CrossEncoder(str(directory), backend=backend, num_labels=1, activation_fn=torch.nn.Identity(),
                            model_kwargs=model_kwargs or None)

    model = load()
    if quantized and backend == "onnx":
        from sentence_transformers.backend import export_dynamic_quantized_onnx_model

        from clfjudge.export.onnx import cpu_isa

        isa = cpu_isa()
        export_dynamic_quantized_onnx_model(model, isa, str(directory))
        model = load(file_name=f"onnx/model_qint8_{isa}.onnx")
    elif quantized:  # static quantization calibrates on a hub data set (glue/sst2 by default)
        raise NotImplementedError("OpenVINO static int8 needs a calibration data set from the hub; not run offline")
    return lambda items: model.predict(list(items), batch_size=args.batch, convert_to_numpy=True)


def rows_for(rm: Path, items: Sequence[tuple[str, str]], args) -> list[dict[str, Any]]:
    import torch

    from clfjudge.export.onnx import export_judge
    from clfjudge.models.onnx_session import PROVIDERS

    torch.set_num_threads(args.threads)
    onnx_dir = Path(args.work) / f"{rm.name}-onnx"
    if not (onnx_dir / "model.onnx").is_file():
        providers = [p for p in ("openvino",) if PROVIDERS.get(p).available()]
        export_judge(rm, onnx_dir, int8=True, fallback=True, providers=providers, n_records=args.gate_records)
    scorers: dict[str, Callable[[], Scorer]] = {
        "transformers fp32": lambda: transformers_scorer(rm, args),
        "clfjudge served (auto)": lambda: clfjudge_scorer(onnx_dir, args),
        "clfjudge int8": lambda: clfjudge_scorer(onnx_dir, args, "int8"),
        "CrossEncoder torch": lambda: cross_encoder_scorer(rm, args, "torch"),
        "CrossEncoder onnx": lambda: cross_encoder_scorer(rm, args, "onnx"),
        "CrossEncoder onnx int8": lambda: cross_encoder_scorer(rm, args, "onnx", quantized=True),
        "CrossEncoder openvino": lambda: cross_encoder_scorer(rm, args, "openvino"),
        "CrossEncoder openvino int8": lambda: cross_encoder_scorer(rm, args, "openvino", quantized=True),
    }
    rows, reference = [], None
    for name, build in scorers.items():
        row: dict[str, Any] = {"model": rm.name, "backend": name}
        try:
            seconds, rewards = timed(build(), items, args.repeats)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run here is a row saying why
            rows.append({**row, "unavailable": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(f"  {name}: not run ({rows[-1]['unavailable'][:120]})", flush=True)
            continue
        decisions = np.sign(rewards[0::2] - rewards[1::2])
        reference = decisions if reference is None else reference
        row.update(answers_per_s=len(items) / seconds, seconds=seconds,
                   agreement=float(np.mean(decisions == reference)))
        rows.append(row)
        print(f"  {name}: {row['answers_per_s']:.1f} answers/s, agreement {row['agreement']:.2%}", flush=True)
    base = next(r["answers_per_s"] for r in rows if r["backend"] == "transformers fp32")
    for r in rows:
        if "answers_per_s" in r:
            r["vs_transformers"] = r["answers_per_s"] / base
    return rows


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]], args) -> str:
    lines = [f"# Reward-model speed, {meta['date']}", "",
             f"{meta['cpu']}, {args.threads} threads (pinned), load at start {meta['loadavg_at_start']}, commit "
             f"{meta['commit']}; {args.pairs} pairs of {args.source} ({2 * args.pairs} answers), median of "
             f"{args.repeats} passes; agreement: same decision as transformers fp32.", "",
             "| model | backend | answers/s | x transformers | agreement |", "|---|---|---:|---:|---:|"]
    for r in rows:
        if "unavailable" in r:
            lines.append(f"| {r['model']} | {r['backend']} | not run: {r['unavailable'][:90]} | | |")
        else:
            lines.append(f"| {r['model']} | {r['backend']} | {r['answers_per_s']:.1f} | {r['vs_transformers']:.2f} | "
                         f"{r['agreement']:.2%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["minilm", "smollm2"])
    parser.add_argument("--rm", nargs="*", type=Path, default=[])
    parser.add_argument("--source", default="autoj-test")
    parser.add_argument("--pairs", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-batch-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--gate-records", type=int, default=64)
    parser.add_argument("--work", default="runs/rm_speed")
    parser.add_argument("--results", default=None, help="results directory (default bench/results)")
    args = parser.parse_args()
    meta = common.machine(args.threads)  # the commit is read in the repository, before results move elsewhere
    if args.results:
        common.RESULTS = Path(args.results)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    from clfjudge.data import sources

    pairs = random.Random(0).sample(list(sources.load(args.source).records), args.pairs)
    items = [item for p in pairs for item in ((p.question, p.answer_a), (p.question, p.answer_b))]
    models = [*args.rm, *(train_rm(a, Path(args.work) / f"{a}-rm", args.train_steps, args.threads)
                          for a in args.models)]
    rows = []
    for rm in models:
        print(f"{rm}:", flush=True)
        rows += rows_for(rm, items, args)
    print(common.write("rm_speed", {"machine": meta, "args": {k: str(v) for k, v in vars(args).items()},
                                    "rows": rows}, markdown(meta, rows, args)))


if __name__ == "__main__":
    main()
