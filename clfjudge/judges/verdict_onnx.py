"""An exported verdict judge (``clfjudge export``, ``export.verdict``) run without PyTorch's model: each question's
graph (``verdict.verdict_module`` as ONNX: token ids + attention mask -> log-odds) in a session of
``models.onnx_session`` (onnxruntime on the CPU or CUDA, OpenVINO in f32 or bf16), behind the verdict reader's own
prompts, truncation, batches and memory (``verdict.VerdictReader``), so both paths read the same token ids.

The card's ``runtime.onnx.files`` maps each variant (``fp32``; the lossy ones the parity gate passed: ``int4``,
``int8``, and the OpenVINO IR files ``ov-int8-weights``, ``ov-int4-weights``, ``ov-int8``, ``ov-int8-mixed`` of
``export.verdict_quant``) to one file per question, in the order of ``runtime.questions``. An IR file runs on OpenVINO
alone: its provider is chosen from this machine's probe (``ir_provider``: bf16 activations where the CPU and OpenVINO
run bf16 and the export gated that run, else f32), never from the machine that exported it.

Where the card lists the fp32 graphs' cached graphs (``runtime.onnx.shared_prefix``: the same decoder reading after a
key/value cache), a run of the fp32 files reads answers to one question after their question's cache, as the PyTorch
reader does (``_Graph``: which runs read with them, and how).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import progress
from ..card import JudgeCard
from ..models.onnx_session import AUTO, check_gated, gate_key, inference_session, provider_info, resolve_provider
from ..untrusted import inside
from .base import Judge, LoadOptions, loads
from .verdict import (
    DEFAULT_MAX_ANSWER_TOKENS,
    DEFAULT_MAX_QUESTION_TOKENS,
    DEFAULT_QUESTION,
    VerdictJudge,
    VerdictQuestion,
    VerdictReader,
    questions_from,
)

log = logging.getLogger(__name__)

BACKEND = "verdict-onnx"  # the exported card's runtime.backend (clfjudge/kinds.py)
GRAPH_INPUTS, GRAPH_OUTPUT = ("input_ids", "attention_mask"), "log_odds"
VARIANT_SUFFIX = {"fp32": ".onnx", "int4": "_int4.onnx", "int8": "_int8.onnx", "ov-int8-weights": "_ov_int8w.xml",
                  "ov-int4-weights": "_ov_int4w.xml", "ov-int8": "_ov_int8.xml",
                  "ov-int8-mixed": "_ov_int8m.xml"}
# the cached graph's session beside the whole one (a bf16 run) opens only where this times its bytes on disk is
# available: OpenVINO holds about twice them (3.9 GB for a 2 GB graph of the 0.5B, f32)
BESIDE_MEMORY_MARGIN = 2.5
IR_PROVIDERS = ("openvino-bf16", "openvino")  # what runs an OpenVINO IR file, the faster first
# the providers that read with an exported judge's cached graph: in fp32 everything (whole prompts after an empty
# cache), in bf16 shared questions beside the gated whole graph; CUDA reads whole prompts (not measured there)
CACHED_ONLY, CACHED_BESIDE = ("cpu", "openvino"), ("openvino-bf16",)


def graph_file(variant: str, index: int) -> str:
    """The file of question ``index``'s graph in ``variant``."""
    return f"verdict-{index}{VARIANT_SUFFIX[variant]}"


def cached_graph_file(index: int) -> str:
    """The file of question ``index``'s graph that reads after a key/value cache (fp32; ``export.verdict.
    cached_graph``)."""
    return f"verdict-{index}-cached.onnx"


def is_ir(files: Sequence[str]) -> bool:
    """Whether a variant's files are OpenVINO IR (an .xml graph, its weights in the .bin of the same name)."""
    return bool(files) and all(str(f).endswith(".xml") for f in files)


def ir_provider(variant: str, bf16_gated: bool) -> tuple[str, str]:
    """The provider an IR ``variant`` runs with on this machine (its probe, not the exporter's): "openvino-bf16"
    where OpenVINO runs bf16 here and ``bf16_gated`` (the export gated the variant so), else "openvino" (f32
    activations: nearer fp32 than a gated bf16 run)."""
    from .. import machine

    probe = machine.probe()
    if not (runs := probe.openvino()):
        raise ValueError(f"variant {variant!r} is an OpenVINO IR and OpenVINO does not run here: {runs.why}")
    bf16 = probe.openvino_bf16()
    if bf16 and bf16_gated:
        return "openvino-bf16", f"an OpenVINO IR variant, bf16 activations: {bf16.why}"
    why = bf16.why if not bf16 else "the export did not gate it in bf16"
    return "openvino", f"an OpenVINO IR variant, f32 activations ({why})"


def _ir_provider(onnx_runtime: dict[str, Any], variant: str) -> tuple[str, str]:
    return ir_provider(variant, gate_key(variant, "openvino-bf16") in onnx_runtime.get("gated", ()))


def choose_run(onnx_runtime: dict[str, Any], options: LoadOptions) -> tuple[str, str, str]:
    """(variant, provider, why) of an exported verdict judge on this machine, of the caller's ``options``:
    ``resolve_provider``'s choice, except that an IR variant (named, or served by the export where OpenVINO runs
    here) runs on the OpenVINO provider this machine's probe picks, or with f32 activations where those were served."""
    from .. import machine

    provider, variant = options.provider, options.variant
    files = onnx_runtime.get("files") or {}
    served_run = onnx_runtime.get("served") or {}
    served = served_run.get("file")
    if (provider == AUTO and variant is None and served in files and is_ir(files[served])
            and machine.probe().openvino()):  # else the primary file, on onnxruntime
        if served_run.get("provider") == "openvino":
            return served, "openvino", "the export's served run: f32 activations (the fastest run its gate passed)"
        return (served, *ir_provider(served, bf16_gated=True))  # bf16 where it runs here, as served; else f32
    chosen, provider, why = resolve_provider(options, onnx_runtime)
    chosen = chosen or onnx_runtime["primary"]
    if is_ir(files.get(chosen, ())) and provider not in IR_PROVIDERS:
        if why == "asked for":
            raise ValueError(f"variant {chosen!r} is an OpenVINO IR, which provider {provider!r} (onnxruntime) does "
                             f"not read; use provider 'auto' or one of {', '.join(IR_PROVIDERS)}")
        return (chosen, *_ir_provider(onnx_runtime, chosen))
    return chosen, provider, why


def load_tokenizer(directory: Path):
    """The tokenizer the export copied (its chat template, pad token and vocabulary as the PyTorch judge had them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    tokenizer.padding_side = "right"
    return tokenizer


class _Graph:
    """One question's graph in a session: (ids, mask) int64 arrays -> log-odds (batch,); with ``cached`` (its graph
    that reads after a key/value cache, and the shape of an empty cache) also ``prefix`` and ``after``. A run in fp32
    on the CPU (``CACHED_ONLY``) reads whole prompts with the cached graph too (after an empty cache: one session, one
    copy of the weights); a bf16 run (``CACHED_BESIDE``) reads them with the whole graph, as the export gated it, and
    opens the cached one beside it when a group first shares its question, where the machine's memory holds it."""

    def __init__(self, path: Path, run: LoadOptions, cached: Path | None = None, empty_cache: Sequence[int] = ()
                 ) -> None:
        self.run, self.sessions = run, {}
        self.paths = {"whole": path, **({"cached": cached} if cached else {})}
        self.shared = cached is not None and run.provider in (*CACHED_ONLY, *CACHED_BESIDE)
        self.cached_only = self.shared and run.provider in CACHED_ONLY
        self.empty = np.zeros(tuple(empty_cache), dtype=np.float32)

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self.cached_only:
            return self.after(None, ids, mask)
        return self._part("whole").run([GRAPH_OUTPUT], {"input_ids": ids, "attention_mask": mask})[0]

    def _part(self, part: str):
        if part not in self.sessions:
            self.sessions[part] = inference_session(self.paths[part], self.run.provider, self.run.threads)
        return self.sessions[part]

    def open(self) -> None:
        """Open the session whole prompts are read with (a file its runtime cannot read is refused here)."""
        self._part("cached" if self.cached_only else "whole")

    def shares(self) -> bool:
        """Whether answers to one question may be read after its shared prefix here: the cached graph exists and is
        open, or the machine's available memory holds its session (else prompts are read whole, said once)."""
        if not self.shared or "cached" in self.sessions or self.cached_only:
            return self.shared
        import psutil

        need = _weight_bytes(self.paths["cached"])
        available = psutil.virtual_memory().available
        if available < BESIDE_MEMORY_MARGIN * need:
            log.warning("note: the exported verdict judge reads whole prompts: its cached graph needs %.1f GB more "
                        "and %.1f GB are available", need / 1e9, available / 1e9)
            self.shared = False
        return self.shared

    def _cached(self, past: list[np.ndarray] | None, ids: np.ndarray, mask: np.ndarray, outputs: list[str] | None):
        session = self._part("cached")
        names = [p.name for p in session.get_inputs()][2:]
        past = past if past is not None else [self.empty] * len(names)
        return session.run(outputs, {"input_ids": ids, "attention_mask": mask, **dict(zip(names, past))})

    def prefix(self, ids: list[int]) -> list[np.ndarray]:
        """The key/value cache of one prompt's first tokens (read after an empty cache): per layer its keys and
        values, (1, heads, length, head size), in the cached graph's input order."""
        return self._cached(None, np.asarray([ids], dtype=np.int64), np.ones((1, len(ids)), dtype=np.int64),
                            None)[1:]

    def after(self, past: list[np.ndarray] | None, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The log-odds of right-padded rows read after ``past`` (``prefix``'s cache, None: empty; ``mask`` covers
        cache and rows)."""
        return self._cached(past, ids, mask, [GRAPH_OUTPUT])[0]


def _weight_bytes(path: Path) -> int:
    """An ONNX graph's bytes: the file and the external data it reads."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return path.stat().st_size + sum(int(e.value) for t in graph.initializer for e in t.external_data
                                     if e.key == "length")


class OnnxVerdictReader(VerdictReader):
    """A ``VerdictReader`` whose forward pass is ``files`` (one exported graph per question, of ``run.variant``) run
    as ``run`` says: the caller's load options with the provider and variant resolved (``choose_run``), whose
    provider and threads open each graph's session and whose budget cuts the reader's batches. With ``cached`` (per
    question, its graph that reads after a key/value cache, and ``empty_cache``: the shape of an empty one) answers
    to one question read their shared first tokens once, as the PyTorch reader does (``share_groups``). ``eager``:
    the sessions whole prompts are read with are opened as the reader is (else when first read)."""

    def __init__(self, files: Sequence[Path], tokenizer, questions: Sequence[VerdictQuestion],
                 run: LoadOptions = LoadOptions(provider="cpu", variant="fp32"), cached: Sequence[Path] | None = None,
                 empty_cache: Sequence[int] = (), eager: bool = True, **kw: Any) -> None:
        if len(files) != len(questions) or (cached is not None and len(cached) != len(questions)):
            raise ValueError(f"{len(files)} graph files and {len(cached or ())} cached graphs for {len(questions)} "
                             "verdict questions")
        variant, provider = run.variant, run.provider
        self.run, self.cached, self.empty_cache = run, cached, tuple(empty_cache)
        super().__init__(list(files), tokenizer, questions, precision="fp32", budget=run.budget, **kw)
        arithmetic = provider_info(provider).precision
        self.precision = f"onnx-{variant}" + ("" if arithmetic == "fp32" else f"-{provider}")
        self.precision_why = f"the {variant} graphs run by {provider} ({arithmetic})"
        for module in self.modules if eager else ():
            module.open()

    def _modules(self, files: list[Path]) -> list[_Graph]:
        return [_Graph(path, self.run, self.cached[k] if self.cached else None, self.empty_cache)
                for k, path in enumerate(files)]

    def _run(self, module, prompts: list[tuple[list[int], int]]) -> list[float]:
        shared, whole = self.share_groups(prompts)
        if shared and not module.shares():
            shared, whole = [], list(range(len(prompts)))
        values = [math.nan] * len(prompts)
        for i, value in zip(whole, self._read(module, [prompts[i][0] for i in whole])):
            values[i] = value
        for head, members in shared:
            past = module.prefix(head)
            progress.advance(0, len(head))
            for i, value in zip(members, self._read(module, [prompts[i][0][len(head):] for i in members], past)):
                values[i] = value
        return values

    def _read(self, module, prompts: list[list[int]], past: list[np.ndarray] | None = None) -> list[float]:
        """Right-padded token-budget batches of ``prompts`` (each after ``past``, one shared prefix's cache, where
        given)."""
        values = [math.nan] * len(prompts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for chunk in self.budget.batches([len(p) for p in prompts]):
            width = max(len(prompts[i]) for i in chunk)
            ids = np.full((len(chunk), width), pad, dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for row, i in enumerate(chunk):
                ids[row, :len(prompts[i])] = prompts[i]
                mask[row, :len(prompts[i])] = 1
            if past is None:
                read = module(ids, mask)
            else:
                mask = np.concatenate([np.ones((len(chunk), past[0].shape[2]), dtype=np.int64), mask], axis=1)
                read = module.after(past, ids, mask)
            for i, value in zip(chunk, read.tolist()):
                values[i] = float(value)
            progress.advance(len(chunk), sum(len(prompts[i]) for i in chunk))
        return values


def open_onnx_reader(directory: Path, card: JudgeCard, run: LoadOptions) -> OnnxVerdictReader:
    """The reader of an exported verdict judge's ``run.variant`` (a key of the card's ``runtime.onnx.files``), run as
    ``run`` says (``OnnxVerdictReader``)."""
    files = (card.runtime.get("onnx") or {}).get("files") or {}
    if run.variant not in files:
        raise ValueError(f"{directory}: variant {run.variant!r} is not in this export (it has {', '.join(files)})")
    where = f"{directory / 'judge_card.json'} field 'runtime.onnx.files.{run.variant}'"
    paths = [inside(directory, name, where) for name in files[run.variant]]
    questions = questions_from(card.runtime.get("questions") or [DEFAULT_QUESTION], str(directory))
    entry = (card.runtime.get("onnx") or {}).get("shared_prefix") or {}
    cached, empty = None, ()
    if run.variant in entry.get("variants", ()):  # the fp32 graphs' weights, whatever runs them
        where = f"{directory / 'judge_card.json'} field 'runtime.onnx.shared_prefix"
        cached = [inside(directory, name, where + ".files'") for name in entry.get("files") or ()]
        empty = entry.get("empty_cache")
        if not (isinstance(empty, list) and len(empty) == 4 and all(isinstance(n, int) and n >= 0 for n in empty)):
            raise ValueError(f"{where}.empty_cache': {empty!r} is not the shape of an empty cache [1, heads, 0, size]")
    return OnnxVerdictReader(paths, load_tokenizer(directory), questions, run, cached, empty,
                             max_question_tokens=int(card.truncation.get("max_question_tokens",
                                                                         DEFAULT_MAX_QUESTION_TOKENS)),
                             max_answer_tokens=int(card.truncation.get("max_answer_tokens",
                                                                       DEFAULT_MAX_ANSWER_TOKENS)))


@loads(providers=None, readings=True)
def _load_verdict_onnx(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    runtime = card.runtime.get("onnx") or {}
    if "files" not in runtime:
        raise ValueError(f"{directory}: a verdict judge that was not exported has no ONNX graphs; run clfjudge "
                         "export first, or load it with backend='verdict'")
    variant, provider, why = choose_run(runtime, options)
    check_gated(directory, runtime, variant, provider)
    reader = open_onnx_reader(directory, card, options.with_(provider=provider, variant=variant))
    judge = VerdictJudge(card, reader, options.budget)
    judge.backend_name = f"onnx ({variant}{'' if provider == 'cpu' else ', ' + provider})"
    judge.runtime_choice = {"provider": provider, "file": variant, "why": why}
    return judge
