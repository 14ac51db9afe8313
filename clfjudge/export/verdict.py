"""``clfjudge export`` for verdict judges.

One graph per question of the card: ``judges.verdict.verdict_module`` (token ids + attention mask -> the log-odds of
the question's verdict tokens at each row's last real token, right padding), with dynamic batch and sequence axes,
written by the TorchScript exporter with eager attention as the decoder reader's graphs are (``export.embedding``;
opset 18: ``OPSET``). Beside each, the same graph with weight-only int4 matrices (``quantize.quantize_int4``; the
verdict tokens' rows of the output layer stay fp32). The questions' graphs hold the same decoder, so the weights of
every graph kept are written once (``shared_weights``: ``weights.data``; a model past protobuf's 2 GB is read from
side files by the same route). Beside each fp32 graph, the same decoder reading after a key/value cache
(``cached_graph``: rows after one prompt's cache -> their log-odds and the cache after them), so that answers to one
question read it once, as the PyTorch reader does: the question's first tokens read after an empty cache give the
cache its answers are read after. It is checked against the whole graph on the gate's first pairs, whole and shared
(max |Δ log-odds| within fp32's ``max_abs_diff``; ``shared_prefix`` in the report), and left out where it reads
otherwise. The lossy variants read whole prompts.

Beside them, where this machine makes them, the OpenVINO IR variants of ``export.verdict_quant`` (NNCF int8 and int4
weights, int8 weights and activations: ``ExportOptions.openvino`` says which) and, with ``--int8``, onnxruntime's
dynamic int8.

The parity gate (clfjudge/configs/parity.yaml) reads a seeded sample of real labelled pairs (the card's sources, else
the parity config's pair sources) through every run and, beside them, through the PyTorch judge in fp32 (read once,
in the runs' chunks, only as far as the runs get; its weights are freed while the quantizers run): max |log-odds diff|
and its quantiles, pairwise decision agreement and the accuracy delta, and, where ``ExportOptions.obvious`` names a
set of pairs no judge should get wrong, that every lossy run decides each of them as fp32 does. A lossy run reads the
whole sample (its agreement needs the pairs); an fp32 run, the same function up to float rounding, reads the head of
it that fits the config's compute budget (``gate.within_budget``: for a 1.5B, the config's min_records). A run of an
IR variant uses the OpenVINO provider this machine's probe picks (bf16 activations where it runs them). An fp32 run
that fails refuses the export (nothing is written); a lossy variant that fails is left out and the report's
``refused`` says by how much it missed (a bf16 ``--provider`` too, with ``fallback``).

The directory: the graphs, the tokenizer files, parity_report.json, signature.json and the card
(``runtime.backend: verdict-onnx``, the questions, ``runtime.onnx.files``: variant -> one file per question).
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import progress
from ..batching import Budget
from ..card import JudgeCard
from ..judges.verdict import VerdictJudge, VerdictReader, open_reader
from ..judges.verdict_onnx import (
    BACKEND,
    GRAPH_INPUTS,
    GRAPH_OUTPUT,
    OnnxVerdictReader,
    cached_graph_file,
    graph_file,
    ir_provider,
    is_ir,
)
from ..models.heads import RewardHead
from ..models.onnx_session import gate_key
from ..options import LoadOptions
from ..outputs import discard
from . import gate, quantize, quiet, signature, verdict_quant
from .directory import ExportResult, check_out_dir, hidden_beside
from .options import ExportOptions
from .parity import ParityConfig
from .shared_weights import share_weights

REPORT_NAME = "parity_report.json"
OPSET = 18  # OpenVINO 2026.4 reads opset 17's ReduceLogSumExp (axes an attribute) as a reduction over every axis
PRIMARY = "fp32"
SHARED_CHECK_PAIRS = 4  # pairs the cached graphs are checked on: fp32 against fp32, float rounding or a bug
# the lossy files: one that fails the gate is left out (bf16 providers are left out with ``fallback`` only)
LOSSY = frozenset({"int4", "int8", *(v.precision for _, v in verdict_quant.VARIANTS.items())})
# what a verdict judge's export cannot do, and why (``ExportOptions.refuse``)
CANNOT = {"optimize": "its graphs have no separate optimized copy (onnxruntime optimizes them as it loads)",
          "opset": f"its graphs are written at opset {OPSET}, the one OpenVINO reads their reductions right at",
          "trust_pickle": "a verdict judge holds no pickles (a chat model's safetensors and its card)"}


def _trace_inputs(prompt: list[int]):
    """Two right-padded rows of different lengths (the prompt and its first half), so the traced graph has the
    padded path."""
    import torch

    rows = [prompt, prompt[:len(prompt) // 2 + 1]]
    ids = torch.zeros((2, len(prompt)), dtype=torch.long)
    mask = torch.zeros((2, len(prompt)), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    return ids, mask


def export_graph(module, path: Path, prompt: list[int]) -> None:
    """Write one ``verdict_module`` to ``path``, its tensors in ``path.name + ".data"`` beside it. The exporter writes
    into a folder of its own first: past 2 GB it puts every tensor in a file named after it, which the graphs of two
    questions would share."""
    import onnx
    import torch

    scratch = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", dir=path.parent))
    try:
        axes = {name: {0: "batch", 1: "sequence"} for name in GRAPH_INPUTS} | {GRAPH_OUTPUT: {0: "batch"}}
        with torch.inference_mode(), quiet.torch_onnx_export():
            torch.onnx.export(module, _trace_inputs(prompt), str(scratch / path.name), input_names=list(GRAPH_INPUTS),
                              output_names=[GRAPH_OUTPUT], dynamic_axes=axes, dynamo=False, opset_version=OPSET)
        onnx.save(onnx.load(str(scratch / path.name)), str(path), save_as_external_data=True,
                  all_tensors_to_one_file=True, location=path.name + ".data")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cached_graph(module):
    """``module`` (a ``verdict_module``) as the graph that reads after a key/value cache: the rows' own tokens (right
    padded), the mask of cache and tokens (batch, past + sequence) and one prompt's cache (batch 1, broadcast to the
    batch in the graph; positions go on from its length) -> each row's log-odds, as ``module`` reads the whole
    prompt, and every layer's cache after the rows (``present.{i}.key`` / ``.value``). With a cache of length 0 it
    reads whole prompts; one prompt's shared first tokens read so give the cache its answers are read after."""
    import torch
    from transformers import DynamicCache

    class Cached(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = module

        def forward(self, input_ids, attention_mask, *past):
            batch = input_ids.shape[0]
            layers = [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in zip(past[0::2],
                                                                                                  past[1::2])]
            cache = DynamicCache(layers, config=self.module.decoder.config)
            states = self.module.decoder(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                                         use_cache=True).last_hidden_state
            present = tuple(t for layer in cache.layers for t in (layer.keys, layer.values))
            return (self.module._log_odds(states, attention_mask[:, past[0].shape[2]:]), *present)

    return Cached().eval()


def export_cached_graph(module, directory: Path, index: int, prompt: list[int], shared: int) -> dict[str, Any]:
    """Write question ``index``'s ``cached_graph`` (fp32, eager attention, its tensors in a side file until
    ``share_weights``), traced on ``prompt`` split after its first ``shared`` tokens. Returns its file and the shape
    of an empty cache (batch 1, kv heads, 0, head size)."""
    import onnx
    import torch

    from ..embedders.onnx_reader import cache_names

    name = cached_graph_file(index)
    n_layers = module.decoder.config.num_hidden_layers
    present, past = cache_names(n_layers, "present"), cache_names(n_layers, "past_key_values")
    head, tail = prompt[:shared], prompt[shared:]
    scratch = Path(tempfile.mkdtemp(prefix=f".verdict-{index}-cached.", dir=directory))
    try:
        with torch.inference_mode(), quiet.torch_onnx_export():
            cache = [t for pair in module.prefix(torch.tensor([head]), torch.ones((1, len(head)), dtype=torch.long))
                     for t in pair]
            ids, own = _trace_inputs(tail if len(tail) > 1 else tail * 2)
            mask = torch.cat([torch.ones((ids.shape[0], len(head)), dtype=own.dtype), own], dim=1)
            axes = {"input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "past_sequence + sequence"},
                    **{k: {2: "past_sequence"} for k in past}, GRAPH_OUTPUT: {0: "batch"},
                    **{k: {0: "batch", 2: "past_sequence + sequence"} for k in present}}
            torch.onnx.export(cached_graph(module), (ids, mask, *cache), str(scratch / name),
                              input_names=["input_ids", "attention_mask", *past],
                              output_names=[GRAPH_OUTPUT, *present],
                              dynamic_axes=axes, dynamo=False, opset_version=OPSET)
        onnx.save(onnx.load(str(scratch / name)), str(directory / name), save_as_external_data=True,
                  all_tensors_to_one_file=True, location=name + ".data")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"file": name, "empty_cache": [1, int(cache[0].shape[1]), 0, int(cache[0].shape[3])]}


def head_nodes(path: Path) -> list[str]:
    """The graph's products outside the decoder (the verdict rows of the output layer): kept fp32 by int4."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type == "MatMul" and not n.name.startswith("/decoder/")]


def export_graphs(reader: VerdictReader, directory: Path, prompts: Sequence[list[int]], int4: bool = True,
                  shared: Sequence[int] | None = None) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Every question's graph of ``reader`` in ``directory`` (``prompts``: one prompt per question, to trace), with
    ``int4`` each one's weight-only int4 copy, and with ``shared`` (per prompt, where its shared first tokens end)
    each one's graph that reads after a key/value cache (``export_cached_graph``; ``info["shared_prefix"]``).
    Returns the files per variant (one per question, in order) and what was done; each file keeps its tensors in a
    side file until ``share_weights``."""
    files: dict[str, list[str]] = {PRIMARY: [], **({"int4": []} if int4 else {})}
    info: dict[str, Any] = {"exporter": "legacy", "opset": OPSET, "inputs": list(GRAPH_INPUTS),
                            "output": GRAPH_OUTPUT}
    for k, (module, prompt) in enumerate(zip(reader.modules, prompts)):
        if hasattr(module.decoder, "set_attn_implementation"):
            module.decoder.set_attn_implementation("eager")  # no SDPA NaN guard in the graph (onnx.py)
        export_graph(module, directory / graph_file(PRIMARY, k), prompt)
        files[PRIMARY].append(graph_file(PRIMARY, k))
        if int4:
            fp32 = directory / graph_file(PRIMARY, k)
            info["int4"] = quantize.quantize_int4(fp32, directory / graph_file("int4", k),
                                                  nodes_to_exclude=head_nodes(fp32))
            files["int4"].append(graph_file("int4", k))
    if shared is not None:
        made = [export_cached_graph(module, directory, k, prompt, max(1, min(n, len(prompt) - 1)))
                for k, (module, prompt, n) in enumerate(zip(reader.modules, prompts, shared))]
        info["shared_prefix"] = {"variants": [PRIMARY], "files": [m["file"] for m in made],
                                 "empty_cache": made[0]["empty_cache"]}
    return files, info


def _bytes(directory: Path, names: Sequence[str]) -> int:
    return sum(p.stat().st_size for name in names for p in verdict_quant.graph_paths(directory, name))


def _runs(files: dict[str, list[str]], precisions: dict[str, str], providers: Sequence[str]) -> list[gate.GateRun]:
    """Every file on onnxruntime's CPU, an IR variant on the OpenVINO provider this machine picks for it (a
    weights-only one on f32 activations too), then fp32 on each of ``providers``."""
    runs = []
    for name, graphs in files.items():
        if is_ir(graphs):
            picked = ir_provider(name, bf16_gated=True)[0]
            on = [picked, "openvino"] if verdict_quant.VARIANTS.get(name).weights_only else [picked]
            runs += [gate.GateRun(gate_key(name, provider), name, provider, precisions[name])
                     for provider in dict.fromkeys(on)]
        else:
            runs.append(gate.GateRun(name, name, "cpu", precisions[name]))
    return runs + gate.gate_runs({PRIMARY: {"precision": "fp32"}}, PRIMARY, providers)[1:]


def log_odds_diff(reference: VerdictJudge, ref_raw, raw) -> dict[str, float]:
    """|Δ log-odds| of a run against the reference's readings of the same answers: p50, p95 and max (pairwise: the
    margins)."""
    import numpy as np

    diff = np.abs(np.asarray(raw) - np.asarray(ref_raw))
    diff = 2 * diff[:, 0] if reference.pairwise else diff.ravel()
    return {q: float(np.quantile(diff, level)) for q, level in (("p50", 0.5), ("p95", 0.95), ("max", 1.0))}


def _obvious_check(reference: VerdictJudge, candidate: VerdictJudge, obvious) -> dict[str, Any]:
    """How many of the obvious pairs ``candidate`` decides otherwise than the reference (which must hold all)."""
    records, want = obvious
    got = gate.decisions(candidate, candidate.raw_outputs(records))
    changed = [r.id for r, a, b in zip(records, want, got) if a != b]
    return {"n": len(records), "changed": len(changed), "changed_ids": changed[:20]}


def _gate(reference: VerdictJudge, readings: gate.ReferenceReadings, directory: Path, files: dict[str, list[str]],
          precisions: dict[str, str], records, fp32_n: int, parity: ParityConfig, options: ExportOptions,
          obvious_pairs=None) -> dict[str, Any]:
    """Every run (``_runs``, fp32 on each of ``options.providers`` too) against the PyTorch readings of ``records``
    (``readings``: read as far as the runs get): a lossy run on every record, stopping as soon as it fails whatever
    the rest gives, an fp32 run on the first ``fp32_n``; each lossy run must also decide ``obvious_pairs`` (the pairs
    and the reference's decisions) as the reference does."""
    variants = {}
    reader = reference.reader
    for run in _runs(files, precisions, options.providers):
        onnx_reader = candidate = None  # the last run's session is freed before the next one loads
        thresholds = parity.for_precision(run.precision)
        lossy = run.precision != "fp32"
        run_records = records if lossy else records[:fp32_n]
        progress.step(f"gate {run.key} ({run.precision}) on {len(run_records)} pairs")
        try:
            onnx_reader = OnnxVerdictReader([directory / f for f in files[run.file]], reader.tokenizer,
                                            reader.questions, run.options(parity.batch_size),
                                            max_question_tokens=reader.budgets["question"],
                                            max_answer_tokens=reader.budgets["answer"])
        except ValueError as exc:  # a lossy file its runtime cannot compile is refused, not the export
            if not lossy:
                raise
            variants[run.key] = {"precision": run.precision, "provider": run.provider, "passed": False,
                                 "failures": [f"cannot be run: {str(exc).split(': ', 1)[-1][:300]}"]}
            continue
        candidate = VerdictJudge(reference.card, onnx_reader, parity.batch_size)
        measured = gate.compare_to_reference(
            reference, candidate, run_records, readings, thresholds.boundary_eps,
            **({"chunk": readings.chunk, "stop": thresholds} if lossy else {}))
        read = run_records[:(measured.get("stopped_early") or {}).get("read", len(run_records))]
        measured["log_odds_diff"] = log_odds_diff(reference, readings.first(len(read)),
                                                  candidate.raw_outputs(read))  # remembered
        measured["pairs"] = len(read)
        entry = gate.gate_entry(run, measured, thresholds)
        if obvious_pairs is not None and lossy:
            entry["obvious"] = _obvious_check(reference, candidate, obvious_pairs)
            if entry["obvious"]["changed"]:
                entry["failures"].append(f"obvious pairs: {entry['obvious']['changed']} of {len(obvious_pairs[0])} "
                                         "decided otherwise than fp32")
                entry["passed"] = False
        variants[run.key] = entry
    return variants


def _drop_refused(report: dict[str, Any], files: dict[str, list[str]], directory: Path, fallback: bool) -> None:
    """Lossy files that failed (and with ``fallback`` a bf16 provider) go to the report's ``refused`` when every fp32
    run passed; the graphs no run kept are deleted."""
    failed = [v["precision"] for v in report["variants"].values() if not v["passed"] and v["precision"] != "fp32"]
    if not failed or not (fallback or set(failed) <= LOSSY):
        return
    before = dict(files)
    if gate.drop_refused(report, files, directory):
        for name in set(before) - set(files):
            for graph in before[name]:
                verdict_quant.remove_graph(directory, graph)


def _shared_check(reference: VerdictJudge, directory: Path, primary: list[str], exported: dict[str, Any], records,
                  parity: ParityConfig) -> dict[str, Any]:
    """The cached graphs against the fp32 graphs on onnxruntime: each of the first ``SHARED_CHECK_PAIRS`` of
    ``records`` read by the whole graph, then by the cached graph, whole (after an empty cache) and with its answers
    after their question's shared first tokens (every group shared, however little it saves); max |Δ log-odds|
    within fp32's ``max_abs_diff``. Graphs that fail are deleted and left out of ``exported``."""
    import numpy as np

    entry = exported.get("shared_prefix")
    if not entry:
        return {"made": False}
    reader = reference.reader
    records = records[:SHARED_CHECK_PAIRS]
    progress.step(f"checking the cached graphs against the whole graphs on {len(records)} pairs")
    calls = [[r] if reference.pairwise else VerdictJudge._points(r) for r in records]
    read = {}
    # one graph's weights in memory at a time: the whole graph's reader is gone before the cached graphs open
    for name, cached, share in (("whole graph", None, False), ("cached, whole", entry["files"], False),
                                ("cached, shared", entry["files"], True)):
        onnx_reader = OnnxVerdictReader([directory / f for f in primary], reader.tokenizer, reader.questions,
                                        LoadOptions(provider="cpu", variant=PRIMARY, budget=Budget(parity.batch_size)),
                                        [directory / f for f in cached] if cached else None, entry["empty_cache"],
                                        eager=False, share_prefix=share,
                                        max_question_tokens=reader.budgets["question"],
                                        max_answer_tokens=reader.budgets["answer"])
        onnx_reader.min_saved = 0.0
        read[name] = np.concatenate([onnx_reader.log_odds(c) for c in calls]) if calls else np.zeros((0, 1))
        del onnx_reader
    diff = {name: float(np.abs(values - read["whole graph"]).max(initial=0.0)) for name, values in read.items()
            if name != "whole graph"}
    limit = parity.for_precision(PRIMARY).max_abs_diff
    passed = limit is None or max(diff.values()) <= limit
    check = {"made": True, "pairs": len(records), "max_abs_diff": max(diff.values()), "by_reading": diff,
             "threshold": limit, "passed": passed}
    if not passed:
        for name in exported.pop("shared_prefix")["files"]:
            for path in (directory / name, directory / f"{name}.data"):
                path.unlink(missing_ok=True)
    return check


def _obvious_records(reference: VerdictJudge, spec: str | None):
    """The pairs of ``spec`` (a source or data file) with the reference's decisions, which must be right on each."""
    if spec is None:
        return None
    from ..data import sources

    records = sources.load_usable(spec, RewardHead().select).records
    if not records:
        raise ValueError(f"obvious pairs {spec!r}: no pairs with a verdict")
    return records, gate.decisions(reference, reference.raw_outputs(records))


def _calibration_prompts(card: JudgeCard, reader: VerdictReader, parity: ParityConfig,
                         options: ExportOptions) -> list[list[list[int]]]:
    """Per question, the prompts that set the int8 activation ranges of a calibrated variant (ov-int8,
    ov-int8-mixed): ``CALIBRATION_PAIRS`` pairs of the gate's source drawn with another seed than the gate's slice."""
    pairs, _ = gate.validation_records(card, RewardHead(), replace(parity, seed=parity.seed + 1),
                                       options.with_(n_records=verdict_quant.CALIBRATION_PAIRS), arity="pair")
    points = pairs if reader.questions[0].pairwise else [p for r in pairs for p in VerdictJudge._points(r)]
    return [[reader.prompt_ids(q, r) for r in points] for q in reader.questions]


def _fp32_share(reference: VerdictJudge, records, parity: ParityConfig) -> tuple[int, dict[str, Any]]:
    """How many of ``records`` an fp32 run reads (``gate.within_budget`` on each record's prompt tokens, every
    question's), and the budget's numbers (empty: all of them, no budget)."""
    reader = reference.reader
    lengths = [[len(reader.prompt_ids(q, x)) for q in reader.questions
                for x in ([r] if q.pairwise else VerdictJudge._points(r))] for r in records]
    kept, info = gate.within_budget(records, lengths, gate.decoder_parameters(reader.modules[0].decoder), parity)
    return len(kept), info


def _variants(options: ExportOptions) -> list[str]:
    """The lossy variants of ``verdict_quant`` to make besides int4: ``options.openvino`` (None: every OpenVINO
    variant), and dynamic int8 with ``options.int8``. An unknown name is refused before any work."""
    names = list(verdict_quant.OPENVINO_VARIANTS if options.openvino is None else options.openvino)
    for name in names:
        if verdict_quant.VARIANTS.get(name).runtime != "openvino":
            raise ValueError(f"--openvino {name}: not an OpenVINO variant (the OpenVINO variants: "
                             f"{', '.join(verdict_quant.OPENVINO_VARIANTS)}; dynamic int8 is --int8)")
    return names + (["int8"] if options.int8 else [])


def export_verdict_judge(judge_dir: Path, out_dir: Path, options: ExportOptions) -> ExportResult:
    """``options.int4``: the weight-only int4 copy beside fp32 (None, by default: a verdict judge offers it whatever
    is asked); ``options.int8``: onnxruntime's dynamic int8 too; ``options.openvino``: the IR variants to make where
    this machine can; ``options.obvious``: pairs every lossy run must decide as fp32 does. The options a verdict
    judge cannot honour (``CANNOT``) are refused. Each step is said on the open ``progress`` meter."""
    judge_dir, out = Path(judge_dir), Path(out_dir)
    options.refuse(CANNOT, f"{judge_dir}: a verdict judge")
    card = JudgeCard.load(judge_dir)
    if card.runtime.get("backend") == BACKEND:
        raise ValueError(f"{judge_dir} is an exported verdict judge already; export the judge it came from "
                         f"({card.runtime.get('onnx', {}).get('exported_from')})")
    quantized = _variants(options)
    check_out_dir(out)
    parity = options.parity or ParityConfig.load()
    # the judge compares pairs whatever its questions ask, so the gate reads pairs with a verdict
    records, validation = gate.validation_records(card, RewardHead(), parity, options, arity="pair")
    fp32_card = replace(card, runtime={**card.runtime, "precision": "fp32"})

    def open_reference() -> VerdictJudge:
        return VerdictJudge(fp32_card, open_reader(fp32_card, judge_dir, budget=Budget(parity.batch_size)),
                            parity.batch_size)

    reference = open_reference()
    fp32_n, fp32_budget = _fp32_share(reference, records, parity)
    obvious_set = _obvious_records(reference, options.obvious)
    reader = reference.reader
    first = records[0] if reference.pairwise else reference._points(records[0])[0]
    calibrated = any(verdict_quant.VARIANTS.get(name).calibrated for name in quantized)
    calibration = _calibration_prompts(card, reader, parity, options) if calibrated else None
    settings = (quantize.int8_settings(options.isa, options.int8_config or quantize.INT8_CONFIG)
                if options.int8 else None)
    int4 = options.int4 is not False
    tmp = hidden_beside(out)
    try:
        tmp.mkdir(mode=0o700)
        progress.step("writing the fp32 graphs" + (" and their int4 copies" if int4 else ""))
        traced = [reader.prompt(q, first) for q in reader.questions]
        files, exported = export_graphs(reader, tmp, [ids for ids, _ in traced], int4, [n for _, n in traced])
        # the quantizers need the memory more (a mmapped checkpoint's pages too); the gate loads the weights again
        reader.release()
        precisions = {PRIMARY: "fp32", **({"int4": "int4"} if int4 else {})}
        keep = head_nodes(tmp / files[PRIMARY][0])
        width = verdict_quant.group_size(reader.modules[0].decoder.config)

        def inputs(question: int, variant) -> verdict_quant.QuantInputs:
            return verdict_quant.QuantInputs(keep, width, verdict_quant.calibration_feeds(
                calibration[question]) if calibration else (), settings)

        made, made_info, not_made = verdict_quant.make_variants(quantized, tmp, files[PRIMARY], inputs, graph_file,
                                                                progress.step)
        files |= made
        precisions |= {name: made_info[name]["precision"] for name in made}
        exported["quantized"] = {**made_info, **{name: {"skipped": why} for name, why in not_made.items()}}
        progress.step(f"loading the reference (PyTorch fp32) for the gate on {len(records)} pairs of "
                      f"{validation['source']}")
        reference = open_reference()
        # read beside the runs, as far as they get: a lossy run that fails stops after its first chunks
        readings = gate.ReferenceReadings(reference, records, parity.batch_size * gate.GATE_CHUNK_BATCHES)
        report = {"judge_dir": str(judge_dir), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "validation": {**validation, "batch_size": parity.batch_size,
                                 **({"fp32_budget": fp32_budget} if fp32_budget else {}),
                                 **({"obvious": {"source": options.obvious, "n": len(obvious_set[0])}}
                                    if obvious_set else {})},
                  "export": exported, "primary": PRIMARY,
                  "variants": _gate(reference, readings, tmp, files, precisions, records, fp32_n, parity, options,
                                    obvious_set)}
        report["validation"]["reference_read"] = readings.read
        report["passed"] = all(v["passed"] for v in report["variants"].values())
        reference.reader.release()  # the gate is read; the cached graphs' check opens sessions of the same weights
        report["shared_prefix"] = _shared_check(reference, tmp, files[PRIMARY], exported, records[:fp32_n], parity)
        _drop_refused(report, files, tmp, options.fallback)
        if not report["passed"]:
            raise gate.ParityError(gate.parity_message(report), report)
        progress.step("writing the judge")
        sizes = {name: _bytes(tmp, graphs) for name, graphs in files.items()}
        shared = share_weights(tmp, [graph for graphs in files.values() if not is_ir(graphs) for graph in graphs]
                               + list(exported.get("shared_prefix", {}).get("files", ())))
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
        reader.tokenizer.save_pretrained(tmp)
        card.runtime = {**card.runtime, "backend": BACKEND, "onnx": {
            "primary": PRIMARY, "files": files, "bytes": sizes,
            **{k: v for k, v in exported.items() if k != "int4" or k in files}, "shared_weights": shared,
            "gated": gate.gated(report), "served": gate.served(report),
            "batch_tolerance": gate.batch_tolerances(report),
            "parity": {"report": REPORT_NAME, "source": validation["source"], "n": validation["n"],
                       **{name: {k: v[k] for k in ("max_abs_diff", "agreement", "metric_delta", "on_boundary",
                                                   "log_odds_diff")}
                          for name, v in report["variants"].items()}},
            "exported_from": str(judge_dir.resolve())}}
        signature.finish(tmp, out, card, signature.verdict(card, reader, tmp))
    except BaseException:
        discard(tmp)
        raise
    return ExportResult(out, PRIMARY, report)
