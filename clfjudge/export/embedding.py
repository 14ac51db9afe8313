"""``clfjudge export`` for embedding judges whose encoder is a frozen decoder.

One graph per judge, ``reader.onnx``: token ids -> the decoder cut at the layer the judge reads (without token
statistics the layers above it are not in the graph) -> that layer's states mean-pooled over the answer span
(pooling weights are an input) and, with token statistics, the log-probability of every answer token (the
positions that predict them and their ids are inputs, so the LM head runs on answer tokens only). The
linear head stays plain arrays (head.safetensors) applied in NumPy, and the PMI statistics are NumPy too, so
the exported judge runs with onnxruntime + tokenizers alone (``onnx_reader.OnnxDecoderReader``).

Beside it, for answers that share a prompt (best-of-n, reward groups, the unconditional pass of token
statistics), the same layers as two graphs: ``prefix.onnx`` (a prompt -> its key/value cache, and with token
statistics its last final state) and ``continuation.onnx`` (a batch of answers read after that cache, broadcast
from batch 1 in the graph; positions go on from the prompt's length); the card lists them under
``runtime.reader.shared_prefix``. The three graphs hold the same layers, so their weights are written once, in
``weights.data`` beside them (ONNX external data; ``shared_weights.share_weights``; ``runtime.reader.shared_weights``
records the sizes before and after). fp32 only: dynamic int8 already
changes one decision in eight on the reader graph (docs/speed.md#the-default-judge-per-path), so the lossy
variants read a shared prompt with every answer.

Variants: fp32 (``reader.onnx``), dynamic int8 (``reader_quantized.onnx``) and weight-only int4
(``reader_int4.onnx``: the decoder's matrices in MatMulNBits blocks, the LM head of the token statistics fp32;
``lm_head_nodes``), each through the parity gate on real pairs: the pooled vectors' cosine with PyTorch fp32, the
head's probabilities, decision agreement and accuracy (clfjudge/configs/parity.yaml; a variant that fails is refused
and nothing is written, or with ``fallback`` a refused lossy one is left out and the report's ``refused`` says by how
much it missed); for fp32 also the cosine of the vectors read after a shared prompt's cache (``shared_min_cosine``,
gated by ``min_cosine``).
``providers``: ``reader.onnx`` is also gated as each of them runs it (e.g. OpenVINO in bf16,
``models.onnx_session``).
"""
from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..batching import Budget
from ..card import CARD_NAME, JudgeCard
from ..data.records import PairRecord
from ..outputs import discard
from ..untrusted import inside
from . import gate, quiet, signature
from .directory import ExportResult, check_out_dir, hidden_beside
from .options import VERDICT_ONLY, ExportOptions
from .parity import ParityConfig
from .quantize import INT8_CONFIG, int8_settings, quantize_int4, quantize_onnx
from .shared_weights import share_weights

REPORT_NAME = "parity_report.json"
# what an embedding judge's export cannot do, and why (``ExportOptions.refuse``)
CANNOT = {"optimize": "its decoder reader has no separate optimized graph (onnxruntime optimizes it as it loads)",
          "opset": "its reader graphs are written at opset 17, the one its exporter is checked with", **VERDICT_ONLY}


def _answer_log_probs(embedder, lm_head, states, positions, targets):
    """Log-probability of each target token given the final state at its position (the graphs' LM head)."""
    import torch

    chosen = torch.gather(states, 1, positions.unsqueeze(-1).expand(-1, -1, states.shape[-1]))
    logits = lm_head(chosen)
    if embedder._softcap:
        logits = torch.tanh(logits / embedder._softcap) * embedder._softcap
    return torch.gather(torch.log_softmax(logits, dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)


def reader_graph(embedder):
    """The loaded ``DecoderEmbedder``'s model as a module with the reader graph's inputs and outputs."""
    import torch

    embedder._load()
    model, lm_head, stats = embedder._model, embedder._lm_head, embedder.stats

    class Reader(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.lm_head = model, lm_head

        def forward(self, input_ids, attention_mask, pool, positions=None, targets=None):
            final = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            pooled = torch.einsum("bt,btd->bd", pool, embedder._captured)  # the hooked layer's states
            if not stats:
                return pooled
            return pooled, _answer_log_probs(embedder, self.lm_head, final, positions, targets)

    return Reader().eval()


def prefix_graph(embedder):
    """The loaded model as a module: a prompt's token ids -> the key/value cache of every layer in the model (the
    layers up to the pooled one; all of them with token statistics) and, with statistics, the prompt's last
    final state (it predicts the first token of every answer read after it)."""
    import torch

    embedder._load()
    model, n_layers, stats = embedder._model, len(embedder._model.layers), embedder.stats

    class Prefix(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            out = self.model(input_ids=input_ids, use_cache=True)
            cache = [t for keys, values, *_ in list(out.past_key_values)[:n_layers] for t in (keys, values)]
            return (*cache, out.last_hidden_state[:, -1]) if stats else tuple(cache)

    return Prefix().eval()


def continuation_graph(embedder):
    """The loaded model as a module reading a batch of answers after one cached prompt: the prompt's key/value
    cache (batch 1, broadcast to the answers' batch in the graph) -> the pooled layer's states mean-pooled over each
    answer and, with statistics, each scored answer token's log-probability (position 0 is the prompt's last
    state, position j the state of answer token j)."""
    import torch
    from transformers import DynamicCache

    embedder._load()
    model, lm_head, n_layers, stats = embedder._model, embedder._lm_head, len(embedder._model.layers), embedder.stats

    class Continuation(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.lm_head = model, lm_head

        def forward(self, input_ids, attention_mask, pool, *rest):
            batch = input_ids.shape[0]
            past = [t.expand(batch, -1, -1, -1) for t in rest[:2 * n_layers]]
            cache = DynamicCache(ddp_cache_data=list(zip(past[0::2], past[1::2])))
            final = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                               use_cache=True).last_hidden_state
            pooled = torch.einsum("bt,btd->bd", pool, embedder._captured)
            if not stats:
                return pooled
            prefix_state, positions, targets = rest[2 * n_layers:]
            states = torch.cat([prefix_state.unsqueeze(1).expand(batch, 1, -1), final], dim=1)
            return pooled, _answer_log_probs(embedder, self.lm_head, states, positions, targets)

    return Continuation().eval()


def export_reader(embedder, path: Path, sample: Sequence[tuple[list[int], list[int]]]) -> dict[str, Any]:
    """Write the reader graph of ``embedder`` (fp32, eager attention) to ``path``."""
    import onnx
    import torch

    from ..embedders.onnx_reader import graph_feed

    embedder._load()
    if hasattr(embedder._model, "set_attn_implementation"):
        embedder._model.set_attn_implementation("eager")  # no SDPA NaN guard in the graph (onnx.py)
    names = ["input_ids", "attention_mask", "pool", *(("positions", "targets") if embedder.stats else ())]
    feed = graph_feed(list(sample), embedder._eos, embedder.stats_tokens)
    args = tuple(torch.from_numpy(feed[k]) for k in names)
    axes = {k: {0: "batch", 1: "sequence" if k in ("input_ids", "attention_mask", "pool") else "span"}
            for k in names}
    outputs = ["pooled", *(("log_probs",) if embedder.stats else ())]
    axes.update({"pooled": {0: "batch"}, "log_probs": {0: "batch", 1: "span"}})
    with torch.inference_mode(), quiet.torch_onnx_export():
        torch.onnx.export(reader_graph(embedder), args, str(path), input_names=names, output_names=outputs,
                          dynamic_axes={k: v for k, v in axes.items() if k in names + outputs}, dynamo=False,
                          opset_version=17)
    proto = onnx.load(str(path), load_external_data=False)
    return {"inputs": names, "outputs": outputs, "exporter": "legacy", "opset": 17,
            "nodes": len(proto.graph.node)}


def export_shared_prefix(embedder, directory: Path, sample: Sequence[tuple[list[int], list[int]]]) -> dict[str, Any]:
    """Write the shared-prefix graphs of ``embedder`` (fp32, eager attention) into ``directory``: ``prefix.onnx``
    (a prompt -> its key/value cache) and ``continuation.onnx`` (answers read after that cache), named as optimum
    names a decoder's cache (``past_key_values.{i}.key`` in, ``present.{i}.key`` out). ``sample``: (prompt ids,
    answer ids) items whose answers are read after the first one's prompt. The card entry (``runtime.reader.
    shared_prefix``)."""
    import torch

    from ..embedders.onnx_reader import SHARED_PREFIX_FILES, cache_names, continuation_feed

    embedder._load()
    if hasattr(embedder._model, "set_attn_implementation"):
        embedder._model.set_attn_implementation("eager")  # no SDPA NaN guard in the graph (onnx.py)
    n_layers, stats = len(embedder._model.layers), embedder.stats
    prompt = torch.tensor([sample[0][0]])
    present, past = cache_names(n_layers, "present"), cache_names(n_layers, "past_key_values")
    prefix_outputs = [*present, *(("prefix_state",) if stats else ())]
    cache_axes = {2: "past_sequence"}  # batch 1: one prompt, broadcast to the answers in the continuation graph
    with torch.inference_mode(), quiet.torch_onnx_export():
        head = prefix_graph(embedder)
        torch.onnx.export(head, (prompt,), str(directory / SHARED_PREFIX_FILES["prefix"]), input_names=["input_ids"],
                          output_names=prefix_outputs,
                          dynamic_axes={"input_ids": {1: "past_sequence"}, **{k: cache_axes for k in present}},
                          dynamo=False, opset_version=17)
        cached = head(prompt)
        feed = continuation_feed(prompt.shape[1], [body for _, body in sample], embedder._eos,
                                 embedder.stats_tokens)
        names = ["input_ids", "attention_mask", "pool", *past, *(("prefix_state", "positions", "targets")
                                                                 if stats else ())]
        feed.update(zip(past, (t.numpy() for t in cached)))
        if stats:
            feed["prefix_state"] = cached[-1].numpy()
        axes = {"input_ids": {0: "batch", 1: "sequence"}, "pool": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "past_sequence + sequence"}, **{k: cache_axes for k in past},
                "positions": {0: "batch", 1: "span"}, "targets": {0: "batch", 1: "span"}}
        outputs = ["pooled", *(("log_probs",) if stats else ())]
        axes.update({"pooled": {0: "batch"}, "log_probs": {0: "batch", 1: "span"}})
        torch.onnx.export(continuation_graph(embedder), tuple(torch.from_numpy(feed[k]) for k in names),
                          str(directory / SHARED_PREFIX_FILES["continuation"]), input_names=names,
                          output_names=outputs, dynamic_axes={k: v for k, v in axes.items() if k in names + outputs},
                          dynamo=False, opset_version=17)
    return {"variants": ["fp32"], "layers": n_layers, "prefix": SHARED_PREFIX_FILES["prefix"],
            "continuation": SHARED_PREFIX_FILES["continuation"], "prefix_outputs": prefix_outputs,
            "continuation_inputs": names, "continuation_outputs": outputs}


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def _features(embedder, questions: list[str], answers: list[str], shared_prefix_min: int):
    """Vectors (and token statistics) of the answers read afresh (the embedder's in-memory cache is emptied, then
    holds them), prompts shared by at least ``shared_prefix_min`` answers read once for all of them."""
    saved, embedder.shared_prefix_min = embedder.shared_prefix_min, shared_prefix_min
    embedder.clear_cache()
    try:
        return (embedder.embed_answers(questions, answers),
                embedder.answer_stats(questions, answers) if embedder.stats else None)
    finally:
        embedder.shared_prefix_min = saved


def _texts(records: Sequence[PairRecord]) -> tuple[list[str], list[str]]:
    """Both answers of every pair with their questions, as the gate reads them."""
    return [r.question for r in records] * 2, [r.answer_a for r in records] + [r.answer_b for r in records]


def _reference(reference, records: Sequence[PairRecord]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The PyTorch fp32 judge's vectors, token statistics and probabilities on the gate's pairs, read once for
    every variant."""
    vec, stats = _features(reference.embedder, *_texts(records), 10 ** 9)
    return vec, stats, reference.predict_proba(records)  # from the vectors just read


def _parity(reference: tuple, candidate, records: Sequence[PairRecord], thresholds) -> dict[str, Any]:
    """Features (pooled vectors, token statistics), probabilities, decisions and accuracy of ``candidate``
    against the ``reference`` readings (``_reference``) on the same pairs (both answer orders, as the judge
    decides), every answer read whole (its prompt read with it). A candidate with the shared-prefix graphs is read
    once more with each pair's two answers read after their prompt's cache: ``shared_min_cosine`` (gated like
    ``min_cosine``)."""
    from ..metrics import pairwise_metrics

    questions, answers = _texts(records)
    ref_vec, ref_stats, ref_p = reference
    start = time.perf_counter()
    vec, stats = _features(candidate.embedder, questions, answers, 10 ** 9)
    measured: dict[str, Any] = {"min_cosine": _min_cosine(ref_vec, vec),  # what "served" is chosen by
                                "records_per_s": len(records) / max(time.perf_counter() - start, 1e-9)}
    if stats is not None:
        measured["max_stat_diff"] = float(np.abs(ref_stats - stats).max())
    p = candidate.predict_proba(records)  # from the vectors just read
    if candidate.embedder.shares_prefixes:
        shared_vec, shared_stats = _features(candidate.embedder, questions, answers, 2)
        candidate.embedder.clear_cache()
        measured["shared_min_cosine"] = _min_cosine(ref_vec, shared_vec)
        if shared_stats is not None:
            measured["shared_max_stat_diff"] = float(np.abs(ref_stats - shared_stats).max())
    keep = np.ones(len(records), dtype=bool)
    if thresholds.boundary_eps:
        gaps = np.minimum(np.abs(ref_p[:, 0] - ref_p[:, 2]), np.abs(ref_p[:, 1] - ref_p[:, [0, 2]].max(axis=1)))
        keep = gaps > thresholds.boundary_eps
    from ..judges.embedding import verdicts_from_proba

    ref_v, v = verdicts_from_proba(ref_p[keep]), verdicts_from_proba(p[keep])
    gold = [r.verdict for r, k in zip(records, keep) if k]
    measured.update({"max_abs_diff": float(np.abs(p - ref_p).max()),
                     "agreement": float(np.mean([a == b for a, b in zip(ref_v, v)])), "metric": "accuracy",
                     "metric_reference": pairwise_metrics(gold, ref_v).accuracy,
                     "metric_onnx": pairwise_metrics(gold, v).accuracy, "on_boundary": int((~keep).sum())})
    measured["metric_delta"] = measured["metric_onnx"] - measured["metric_reference"]
    return measured


def lm_head_nodes(path: Path) -> list[str]:
    """The reader graph's products outside the decoder: the LM head that scores answer tokens for the token
    statistics. int4 keeps them fp32, as a verdict judge keeps its verdict rows (``verdict.head_nodes``): it runs on
    the scored answer tokens only, so fp32 costs little there, and the statistics are log-probabilities over the
    whole vocabulary, which 4-bit rows would bend for every token."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type == "MatMul" and not n.name.startswith("/model/")]


def _check_exportable(judge_dir: Path, card: JudgeCard, config: dict[str, Any]) -> None:
    """Refuse, before any work, a judge this exporter does not cover."""
    if config["type"] != "decoder":
        raise ValueError(f"{judge_dir}: ONNX export of embedding judges covers decoder embedders; this judge reads "
                         f"with a {config['type']} embedder (serve it with the sklearn backend)")
    if card.arity != "pair":
        raise ValueError(f"{judge_dir}: ONNX export of embedding judges covers pair judges, not {card.arity}")
    if card.runtime.get("verdict"):
        raise ValueError(f"{judge_dir}: a stacked judge reads a chat model's verdict beside its reader; its ONNX "
                         "export covers the reader only, so it is served with the sklearn backend (export the "
                         "verdict judge on its own with clfjudge export)")


def _open_reference(judge_dir: Path, card: JudgeCard, config: dict[str, Any], parity: ParityConfig,
                    options: ExportOptions):
    """The PyTorch fp32 judge every variant is gated against, and its decoder reader (loaded), reading in the
    gate's batches."""
    from ..embedders.decoder import DecoderEmbedder
    from ..judges.embedding import EmbeddingModel

    # the gate reads every record afresh (cache_dir=""): vectors cached by an earlier export or run would let a
    # broken graph pass
    reading = {k: config[k] for k in ("layer", "max_prompt_tokens", "max_answer_tokens", "stats", "stats_tokens")
               if k in config}
    embedder = DecoderEmbedder(card.backbone, **reading, precision="fp32", budget=Budget(parity.batch_size),
                               cache_dir="")
    reference = EmbeddingModel.load(judge_dir, embedder=embedder, trust_pickle=options.trust_pickle)
    embedder._load()
    return embedder, reference


def _reader_entry(judge_dir: Path, card: JudgeCard, embedder, records: Sequence[PairRecord]) -> dict[str, Any]:
    """The card's ``runtime.reader`` as far as the model goes: what the ONNX reader needs to build its inputs."""
    before, after = embedder.template_parts()
    for r in records:  # the exported reader renders prompts from the template's halves: they must agree
        if embedder._ids(embedder._render(r.question)) != embedder._ids(before + r.question + after):
            raise ValueError(f"{judge_dir}: the chat template changes the question {r.id!r}; cannot export")
    return {"backbone": card.backbone, "depth": embedder._depth, "hidden_size": embedder._model.config.hidden_size,
            "eos_token_id": embedder._eos, "template": [before, after]}


def _write_graphs(embedder, records: Sequence[PairRecord], tmp: Path, reader: dict[str, Any], options: ExportOptions,
                  settings) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """``reader.onnx`` and the shared-prefix graphs (their weights written once; ``reader`` gets their entries),
    then the lossy copies ``options`` asks for: dynamic int8 (with ``settings``) and weight-only int4. Returns the
    reader files (name -> precision and how it was made) and how ``reader.onnx`` was exported."""
    from ..embedders.onnx_reader import READER_FILES

    fp32 = READER_FILES["fp32"]
    sample = [(embedder._prompt_ids(r.question), embedder._answer_ids(r.answer_a)) for r in records[:2]]
    exported = export_reader(embedder, tmp / fp32, sample)
    files: dict[str, dict[str, Any]] = {fp32: {"precision": "fp32"}}
    # answers after one cached prompt: the first record's two answers, read after its prompt
    shared = export_shared_prefix(embedder, tmp, sample[:1] + [(sample[0][0], embedder._answer_ids(
        records[0].answer_b))])
    reader["shared_weights"] = share_weights(tmp, [fp32, shared["prefix"], shared["continuation"]])  # one copy
    shared["bytes"] = {shared[k]: (tmp / shared[k]).stat().st_size for k in ("prefix", "continuation")}
    reader["shared_prefix"] = shared
    if options.int8:
        files[READER_FILES["int8"]] = {"precision": "int8", "from": fp32,
                                       **quantize_onnx(tmp / fp32, tmp / READER_FILES["int8"], settings)}
    if options.int4:
        files[READER_FILES["int4"]] = {"precision": "int4", "from": fp32, **quantize_int4(
            tmp / fp32, tmp / READER_FILES["int4"], nodes_to_exclude=lm_head_nodes(tmp / fp32))}
    return files, exported


def _primary(files: dict[str, Any]) -> str:
    """The variant a plain load runs: the fastest lossy file kept (int8 read faster than int4 on every reader:
    docs/speed.md#bigger-readers), else fp32."""
    from ..embedders.onnx_reader import READER_FILES

    return next(v for v in ("int8", "int4", "fp32") if READER_FILES[v] in files)


def _gate(reference_readings: tuple, judge_dir: Path, tmp: Path, reader: dict[str, Any], config: dict[str, Any],
          files: dict[str, dict[str, Any]], records: Sequence[PairRecord], parity: ParityConfig,
          options: ExportOptions) -> dict[str, Any]:
    """Every reader file on onnxruntime's CPU, and ``reader.onnx`` on each of ``options.providers``, against the
    PyTorch readings: the report's ``variants``."""
    from ..embedders.onnx_reader import READER_FILES, OnnxDecoderReader
    from ..judges.embedding import EmbeddingModel

    variants = {}
    for run in gate.gate_runs(files, READER_FILES["fp32"], options.providers):
        thresholds = parity.for_precision(run.precision)
        onnx_reader = OnnxDecoderReader(tmp, {**reader, "primary": _primary(files)}, config,
                                        run.options(parity.batch_size), cache_dir="")
        candidate = EmbeddingModel.load(judge_dir, embedder=onnx_reader, trust_pickle=options.trust_pickle)
        measured = _parity(reference_readings, candidate, records, thresholds)
        variants[run.key] = gate.gate_entry(run, measured, thresholds)
    return variants


def _runtime(card: JudgeCard, judge_dir: Path, reader: dict[str, Any], files: dict[str, Any],
             exported: dict[str, Any], report: dict[str, Any], validation: dict[str, Any]) -> dict[str, Any]:
    """The exported card's ``runtime``: the reader (files, primary), and what the gate measured and served."""
    from ..embedders.onnx_reader import READER_FILES

    primary = _primary(files)
    parity = {name: {k: v[k] for k in ("min_cosine", "shared_min_cosine", "max_abs_diff", "agreement", "metric_delta",
                                       "on_boundary") if k in v} for name, v in report["variants"].items()}
    return {**card.runtime, "backend": "onnx", "reader": {**reader, "primary": primary, "files": files, **exported},
            "onnx": {"primary": READER_FILES[primary], "gated": gate.gated(report),
                     "served": gate.served(report),
                     "batch_tolerance": gate.batch_tolerances(report),
                     "parity": {"report": REPORT_NAME, "source": validation["source"], "n": validation["n"], **parity},
                     "exported_from": str(judge_dir.resolve())}}


def export_embedding_judge(judge_dir: Path, out_dir: Path, options: ExportOptions) -> ExportResult:
    """Export, gate and write an embedding judge's decoder reader (the module doc). ``options.int8`` / ``int4``: also
    write that lossy copy of ``reader.onnx``, gated at its precision's thresholds and made the primary if it passes;
    a refused one fails the export (nothing written), or with ``options.fallback`` is left out and
    ``parity_report.json``'s ``refused`` says by how much it missed."""
    from ..embedders.onnx_reader import READER_FILES
    from ..judges.embedding import embedder_config
    from ..training.embedding import EmbeddingDataHead

    judge_dir, out = Path(judge_dir), Path(out_dir)
    card = JudgeCard.load(judge_dir)
    config = embedder_config(card)
    _check_exportable(judge_dir, card, config)
    options.refuse(CANNOT, f"{judge_dir}: an embedding judge")
    check_out_dir(out)
    parity = options.parity or ParityConfig.load()
    settings = int8_settings(options.isa, options.int8_config or INT8_CONFIG) if options.int8 else None
    records, validation = gate.validation_records(card, EmbeddingDataHead(card.arity), parity, options)
    embedder, reference = _open_reference(judge_dir, card, config, parity, options)
    reader = _reader_entry(judge_dir, card, embedder, records)

    tmp = hidden_beside(out)
    try:
        tmp.mkdir(mode=0o700)
        files, exported = _write_graphs(embedder, records, tmp, reader, options, settings)
        head_file = card.runtime["sklearn_model"]
        shutil.copy(inside(judge_dir, head_file, f"{judge_dir / CARD_NAME} field 'runtime.sklearn_model'"),
                    tmp / head_file)
        embedder._tokenizer.save_pretrained(tmp)
        variants = _gate(_reference(reference, records), judge_dir, tmp, reader, config, files, records, parity,
                         options)
        for name, meta in files.items():  # a weight-only int4 file keeps its tensors in a side file
            meta["bytes"] = sum(p.stat().st_size for p in tmp.glob(name + "*"))
        files[READER_FILES["fp32"]]["external_data"] = reader["shared_weights"]["file"]
        report = {"judge_dir": str(judge_dir), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "validation": {**validation, "batch_size": parity.batch_size}, "export": exported,
                  "primary": READER_FILES[_primary(files)], "variants": variants,
                  "passed": all(v["passed"] for v in variants.values())}
        if options.fallback and gate.drop_refused(report, files, tmp):
            report["primary"] = READER_FILES[_primary(files)]
        if not report["passed"]:
            raise gate.ParityError(gate.parity_message(report), report)
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
        card.runtime = _runtime(card, judge_dir, reader, files, exported, report, validation)
        signature.finish(tmp, out, card, signature.decoder_reader(card, tmp))
    except BaseException:
        discard(tmp)
        raise
    return ExportResult(out, report["primary"], report)
