"""``clfjudge export`` for fine-tuned judges (a classification / regression / reward head fine-tuned with its
backbone, or a reward model without a card: ``judges.foreign``).

1. ``export.graph.export_onnx`` of the sequence-classification model (dynamo, the TorchScript exporter its
   fallback; the card records which one ran and why) -> model.onnx;
2. ``optimize``: ``export.graph.optimize_onnx`` -> model_optimized.onnx;
3. ``int8``: ``export.quantize.quantize_onnx`` with the CPU ISA's settings (clfjudge/configs/int8.yaml) ->
   model_quantized.onnx; ``int4``: weight-only int4 (``quantize_int4``, the classification head kept fp32) ->
   model_int4.onnx; ``providers``: also gate model.onnx as another provider runs it (``models.onnx_session``:
   openvino, openvino-bf16), at the thresholds of the provider's precision; the card lists what passed
   (``runtime.onnx.gated``) and a provider of another precision than fp32 loads only where it did;
4. the parity gate (``export.gate``): a seeded slice of real labelled records (the card's evaluation / training
   sources, else clfjudge/configs/parity.yaml's defaults), encoded by the judge's own encoder and run in padded,
   length-bucketed batches through PyTorch and through every ONNX file. Any failure removes the temporary output
   and raises ``ParityError``; with ``fallback`` (``--fallback``, as ``make main``), lossy runs that fail (int8,
   a bf16 provider) are dropped instead when every fp32 run passed, and the report says why (``refused``);
5. on success the directory is moved into place: the ONNX files (named as optimum's ORTModel* expect),
   config.json, the tokenizer files, judge_card.json (runtime section: files, primary file, exporter,
   parity summary, and ``served``: the run that read the gate's records fastest among those that passed, which
   ``Judge.load(provider="auto")`` runs) and parity_report.json.
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import progress
from ..card import JudgeCard
from ..judges.base import ONNX_VARIANTS, TORCH_WEIGHTS, open_card
from ..judges.foreign import write_card
from ..judges.model import FineTunedJudge, OnnxBackend, TorchBackend, load_tokenizer
from ..models.heads import HEADS
from ..outputs import discard
from ..prompts.chat_template import carry_prompt
from . import signature
from .directory import ExportResult, check_out_dir, hidden_beside
from .gate import (
    GATE_CHUNK_BATCHES,
    REPORT_NAME,
    ParityError,
    batch_tolerances,
    compare_to_reference,
    decoder_parameters,
    drop_refused,
    gate_entry,
    gate_runs,
    gated,
    parity_message,
    read_in_chunks,
    served,
    validation_records,
    within_budget,
)
from .graph import export_onnx, optimize_onnx
from .options import VERDICT_ONLY, ExportOptions
from .parity import ParityConfig
from .quantize import INT8_CONFIG, Int8Settings, int8_settings, quantize_int4, quantize_onnx

if TYPE_CHECKING:
    import torch

# what a fine-tuned judge's export cannot do, and why (``ExportOptions.refuse``)
CANNOT = {"trust_pickle": "a fine-tuned judge holds no pickles (its weights are safetensors)", **VERDICT_ONLY}


class Stopwatch:
    """Seconds per named step of an export (the parity report's ``seconds``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._started = time.perf_counter()

    @contextmanager
    def __call__(self, step: str):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] = round(time.perf_counter() - began, 2)
            self.seconds["total"] = round(time.perf_counter() - self._started, 2)


def head_products(path: Path) -> list[str]:
    """The graph's classification head: its last weight product (nodes are stored in topological order, and a
    sequence-classification model ends in its score / classifier layer). Weight-only int4 keeps it fp32: a handful
    of columns cost nothing and carry the decision."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    products = [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1
                and n.input[1] in weights]
    return products[-1:]


def write_variants(tmp: Path, model: torch.nn.Module, sample: Mapping[str, np.ndarray], clock: Stopwatch,
                   options: ExportOptions, quant: Int8Settings | None
                   ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """model.onnx and the variants ``options`` asks for in ``tmp`` (int8 with ``quant``): the files (name ->
    precision and how it was made) and what the exporter did."""
    fp32 = tmp / ONNX_VARIANTS["fp32"]
    with clock("export fp32"):
        exported = export_onnx(model, sample, fp32, options.opset)
    external = exported["external_data"]
    files: dict[str, dict[str, Any]] = {fp32.name: {"precision": "fp32"}}
    source_for_int8 = fp32
    if options.optimize:
        optimized = tmp / ONNX_VARIANTS["optimized"]
        with clock("optimize"):
            files[optimized.name] = {"precision": "fp32", **optimize_onnx(fp32, optimized, model.config, external)}
        source_for_int8 = optimized
    if quant is not None:
        quantized = tmp / ONNX_VARIANTS["int8"]
        with clock("int8"):
            files[quantized.name] = {"precision": "int8", "from": source_for_int8.name,
                                     **quantize_onnx(source_for_int8, quantized, quant, external)}
    if options.int4:
        weight_only = tmp / ONNX_VARIANTS["int4"]
        with clock("int4"):
            files[weight_only.name] = {"precision": "int4", "from": fp32.name,
                                       **quantize_int4(fp32, weight_only, nodes_to_exclude=head_products(fp32))}
    return files, exported



def _write_judge(tmp: Path, out: Path, card: JudgeCard, judge_dir: Path, config: Any, tokenizer: Any,
                 reference: FineTunedJudge, files: dict[str, Any], exported: dict[str, Any], primary: str,
                 report: dict[str, Any]) -> None:
    """The gate passed: the report, config, tokenizer, signature and card into ``tmp``, then ``tmp`` -> ``out``."""
    validation, variants = report["validation"], report["variants"]
    (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
    config.save_pretrained(tmp)
    if "input" not in card.truncation:  # a foreign model keeps its own chat template
        carry_prompt(tokenizer, card.scheme, reference.encoder.length_hint)
    tokenizer.save_pretrained(tmp)
    signature.write(tmp, signature.sequence_classification(card, config, tokenizer, tmp, files, primary))
    card.runtime = {**card.runtime, "backend": "onnx", "onnx": {
        "primary": primary, "files": files, **exported, "gated": gated(report), "served": served(report),
        "batch_tolerance": batch_tolerances(report),
        "parity": {"report": REPORT_NAME, "source": validation["source"], "n": validation["n"],
                   **{name: {k: v[k] for k in ("max_abs_diff", "agreement", "metric_delta", "on_boundary")}
                      for name, v in variants.items()}},
        "exported_from": str(judge_dir.resolve()),
    }}
    signature.finish(tmp, out, card)



def export_fine_tuned(judge_dir: Path, out_dir: Path, options: ExportOptions) -> ExportResult:
    """Export, optimize / quantize, gate on parity and write the ONNX judge directory (the module doc). A variant
    the gate refuses fails the export (nothing written), or with ``options.fallback`` is left out and
    ``parity_report.json``'s ``refused`` says by how much it missed."""
    judge_dir, card = open_card(judge_dir, options.model_input)  # a model without a card: described
    out = Path(out_dir)
    options.refuse(CANNOT, f"{judge_dir}: a fine-tuned judge")
    if not any((judge_dir / name).exists() for name in TORCH_WEIGHTS):
        raise FileNotFoundError(f"{judge_dir}: no PyTorch weights ({' / '.join(TORCH_WEIGHTS)}) to export "
                                "(an exported directory cannot be exported again)")
    check_out_dir(out)
    parity = options.parity or ParityConfig.load()
    quant = int8_settings(options.isa, options.int8_config or INT8_CONFIG) if options.int8 else None
    clock = Stopwatch()
    tokenizer = load_tokenizer(judge_dir)
    torch_backend = TorchBackend(judge_dir)
    reference = FineTunedJudge(card, tokenizer, torch_backend, parity.batch_size)
    records, validation = validation_records(card, HEADS.get(card.head).from_card(card), parity, options)
    records, budget = within_budget(records, reference.sequence_lengths(records),
                                    decoder_parameters(torch_backend.model), parity)
    validation.update(n=len(records), **({"budget": budget} if budget else {}))
    chunk = parity.batch_size * GATE_CHUNK_BATCHES
    progress.step(f"reading the reference (PyTorch) on {len(records)} records")
    with clock("reference"):
        ref_raw = read_in_chunks(reference, records, chunk)
    sample = tokenizer.pad([s for r in records[:2] for s in reference.encode(r)], padding=True, return_tensors="np")
    config = torch_backend.model.config

    tmp = hidden_beside(out)
    try:
        tmp.mkdir(mode=0o700)
        progress.step("writing the ONNX graphs")
        files, exported = write_variants(tmp, torch_backend.model, sample, clock, options, quant)
        torch_backend.release()  # the reference is read: its weights are not held while the gate runs
        primary = next(ONNX_VARIANTS[k] for k in ("int8", "int4", "optimized", "fp32") if ONNX_VARIANTS[k] in files)
        variants = {}
        for run in gate_runs(files, ONNX_VARIANTS["fp32"], options.providers):
            thresholds = parity.for_precision(run.precision)
            progress.step(f"gate {run.key} ({run.precision}) on {len(records)} records")
            with clock(f"gate {run.key}"):
                candidate = FineTunedJudge(card, tokenizer, OnnxBackend(tmp / run.file, run.provider),
                                           parity.batch_size)
                measured = compare_to_reference(reference, candidate, records, ref_raw, thresholds.boundary_eps,
                                                chunk=chunk, stop=thresholds)
                del candidate  # one session at a time
            variants[run.key] = gate_entry(run, measured, thresholds)
        for name, meta in files.items():
            meta["bytes"] = sum(p.stat().st_size for p in tmp.glob(name + "*"))
        report = {
            "judge_dir": str(judge_dir), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "validation": {**validation, "batch_size": parity.batch_size, "chunk_records": chunk,
                           "truncated": reference.encoder.report.to_dict()},
            "export": exported, "primary": primary, "variants": variants,
            "passed": all(v["passed"] for v in variants.values()), "seconds": clock.seconds,
        }
        if options.fallback and drop_refused(report, files, tmp) and primary not in files:
            primary = report["primary"] = ONNX_VARIANTS["optimized" if options.optimize else "fp32"]
        if not report["passed"]:
            raise ParityError(parity_message(report), report)
        _write_judge(tmp, out, card, judge_dir, config, tokenizer, reference, files, exported, primary, report)
    except BaseException:
        discard(tmp)
        raise
    write_card(judge_dir, JudgeCard(**{**asdict(card), "runtime": {}}))
    return ExportResult(out, primary, report)
