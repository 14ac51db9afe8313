"""``clfjudge export`` for verdict judges.

One graph per question of the card: ``judges.verdict.verdict_module`` (token ids + attention mask -> the log-odds of
the question's verdict tokens at each row's last real token, right padding), with dynamic batch and sequence axes,
written by the TorchScript exporter with eager attention as the decoder reader's graphs are (``export.embedding``;
opset 18: ``OPSET``). Beside each, the same graph with weight-only int4 matrices (``onnx.quantize_int4``; the
verdict tokens' rows of the output layer stay fp32). The questions' graphs hold the same decoder, so the weights of
every graph kept are written once (``shared_weights``: ``weights.data``; a model past protobuf's 2 GB is read from
side files by the same route).

The parity gate (clfjudge/configs/parity.yaml) reads a seeded sample of real labelled pairs (the card's sources,
else the parity config's pair sources) through the PyTorch judge in fp32 once, then through every run: max |log-odds
diff|, decision agreement and the accuracy delta. An fp32 run that fails refuses the export (nothing is written);
int4 that fails is left out and the report's ``refused`` says by how much it missed (a bf16 ``--provider`` too, with
``fallback``). The directory: the graphs, the tokenizer files, parity_report.json, signature.json and the card
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

from ..card import JudgeCard
from ..judges.verdict import VerdictJudge, VerdictReader, open_reader
from ..judges.verdict_onnx import BACKEND, GRAPH_INPUTS, GRAPH_OUTPUT, OnnxVerdictReader, graph_file
from ..models.heads import RewardHead
from . import gate, quantize, quiet, signature
from .directory import ExportResult, check_out_dir, hidden_beside
from .options import ExportOptions
from .parity import ParityConfig
from .shared_weights import share_weights

REPORT_NAME = "parity_report.json"
OPSET = 18  # OpenVINO 2026.4 reads opset 17's ReduceLogSumExp (axes an attribute) as a reduction over every axis
PRIMARY = "fp32"
# what a verdict judge's export cannot do, and why (``ExportOptions.refuse``)
NO_INT8 = ("a verdict judge exports weight-only int4 beside fp32, each gated; dynamic int8 is for fine-tuned and "
           "embedding judges")
CANNOT = {"int8": NO_INT8, "isa": NO_INT8, "int8_config": NO_INT8,
          "optimize": "its graphs have no separate optimized copy (onnxruntime optimizes them as it loads)",
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


def head_nodes(path: Path) -> list[str]:
    """The graph's products outside the decoder (the verdict rows of the output layer): kept fp32 by int4."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type == "MatMul" and not n.name.startswith("/decoder/")]


def export_graphs(reader: VerdictReader, directory: Path, prompts: Sequence[list[int]], int4: bool = True
                  ) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Every question's graph of ``reader`` in ``directory`` (``prompts``: one prompt per question, to trace), and
    with ``int4`` each one's weight-only int4 copy. Returns the files per variant (one per question, in order) and
    what was done; each file keeps its tensors in a side file until ``share_weights``."""
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
    return files, info


def _bytes(directory: Path, names: Sequence[str]) -> int:
    return sum(p.stat().st_size for name in names for p in directory.glob(name + "*"))


def _gate(reference: VerdictJudge, ref_raw, directory: Path, files: dict[str, list[str]], records,
          parity: ParityConfig, options: ExportOptions) -> dict[str, Any]:
    """Every variant on onnxruntime's CPU, and fp32 on each of ``options.providers``, against the PyTorch readings."""
    variants = {}
    reader = reference.reader
    for run in gate.gate_runs({name: {"precision": name} for name in files}, PRIMARY, options.providers):
        thresholds = parity.for_precision(run.precision)
        onnx_reader = OnnxVerdictReader([directory / f for f in files[run.file]], reader.tokenizer,
                                        reader.questions, variant=run.file, provider=run.provider,
                                        batch_size=parity.batch_size,
                                        max_question_tokens=reader.budgets["question"],
                                        max_answer_tokens=reader.budgets["answer"])
        candidate = VerdictJudge(reference.card, onnx_reader, parity.batch_size)
        measured = gate.compare_to_reference(reference, candidate, records, ref_raw, thresholds.boundary_eps)
        variants[run.key] = gate.gate_entry(run, measured, thresholds)
    return variants


def _drop_refused(report: dict[str, Any], files: dict[str, list[str]], directory: Path, fallback: bool) -> None:
    """int4 that failed (and with ``fallback`` a bf16 provider) goes to the report's ``refused`` when every fp32 run
    passed; the graphs no run kept are deleted."""
    failed = [v["precision"] for v in report["variants"].values() if not v["passed"] and v["precision"] != "fp32"]
    if not failed or not (fallback or set(failed) == {"int4"}):
        return
    before = dict(files)
    if gate.drop_refused(report, files, directory):
        for name in set(before) - set(files):
            for graph in before[name]:
                for path in directory.glob(graph + "*"):
                    path.unlink()


def export_verdict_judge(judge_dir: Path, out_dir: Path, options: ExportOptions) -> ExportResult:
    """``options.int4``: the weight-only int4 copy beside fp32 (None, by default: a verdict judge offers it whatever
    is asked); the options a verdict judge cannot honour (``CANNOT``) are refused."""
    judge_dir, out = Path(judge_dir), Path(out_dir)
    options.refuse(CANNOT, f"{judge_dir}: a verdict judge")
    card = JudgeCard.load(judge_dir)
    if card.runtime.get("backend") == BACKEND:
        raise ValueError(f"{judge_dir} is an exported verdict judge already; export the judge it came from "
                         f"({card.runtime.get('onnx', {}).get('exported_from')})")
    check_out_dir(out)
    parity = options.parity or ParityConfig.load()
    # the judge compares pairs whatever its questions ask, so the gate reads pairs with a verdict
    records, validation = gate.validation_records(card, RewardHead(), parity, options, kind="pair")
    fp32_card = replace(card, runtime={**card.runtime, "precision": "fp32"})
    reference = VerdictJudge(fp32_card, open_reader(fp32_card, judge_dir, parity.batch_size), parity.batch_size)
    ref_raw = reference.raw_outputs(records)  # read once, for every run
    reader = reference.reader
    first = records[0] if reference.pairwise else reference._points(records[0])[0]
    tmp = hidden_beside(out)
    try:
        tmp.mkdir(mode=0o700)
        files, exported = export_graphs(reader, tmp, [reader.prompt_ids(q, first) for q in reader.questions],
                                        options.int4 is not False)
        report = {"judge_dir": str(judge_dir), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "validation": {**validation, "batch_size": parity.batch_size}, "export": exported,
                  "primary": PRIMARY,
                  "variants": _gate(reference, ref_raw, tmp, files, records, parity, options)}
        report["passed"] = all(v["passed"] for v in report["variants"].values())
        _drop_refused(report, files, tmp, options.fallback)
        if not report["passed"]:
            raise gate.ParityError(gate.parity_message(report), report)
        sizes = {name: _bytes(tmp, graphs) for name, graphs in files.items()}
        shared = share_weights(tmp, [graph for graphs in files.values() for graph in graphs])
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
        reader.tokenizer.save_pretrained(tmp)
        card.runtime = {**card.runtime, "backend": BACKEND, "onnx": {
            "primary": PRIMARY, "files": files, "bytes": sizes,
            **{k: v for k, v in exported.items() if k != "int4" or k in files}, "shared_weights": shared,
            "gated": gate.gated(report), "served": gate.served(report),
            "batch_tolerance": gate.batch_tolerances(report),
            "parity": {"report": REPORT_NAME, "source": validation["source"], "n": validation["n"],
                       **{name: {k: v[k] for k in ("max_abs_diff", "agreement", "metric_delta", "on_boundary")}
                          for name, v in report["variants"].items()}},
            "exported_from": str(judge_dir.resolve())}}
        signature.finish(tmp, out, card, signature.verdict(card, reader, tmp))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(out, PRIMARY, report)
