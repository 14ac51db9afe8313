"""An exported verdict judge (``clfjudge export``, ``export.verdict``) run without PyTorch's model: each question's
graph (``verdict.verdict_module`` as ONNX: token ids + attention mask -> log-odds) in a session of
``models.onnx_session`` (onnxruntime on the CPU or CUDA, OpenVINO in f32 or bf16), behind the verdict reader's own
prompts, truncation, batches and memory (``verdict.VerdictReader``), so both paths read the same token ids.

The card's ``runtime.onnx.files`` maps each variant (``fp32``; ``int4`` where the parity gate passed it) to one file
per question, in the order of ``runtime.questions``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..card import JudgeCard
from ..models.onnx_session import check_gated, inference_session, provider_info, resolve_provider
from ..untrusted import inside
from .base import Judge, LoadOptions
from .verdict import (
    DEFAULT_MAX_ANSWER_TOKENS,
    DEFAULT_MAX_QUESTION_TOKENS,
    DEFAULT_QUESTION,
    VerdictJudge,
    VerdictQuestion,
    VerdictReader,
    questions_from,
    reader_options,
)

BACKEND = "verdict-onnx"  # the exported card's runtime.backend (clfjudge/kinds.py)
GRAPH_INPUTS, GRAPH_OUTPUT = ("input_ids", "attention_mask"), "log_odds"
VARIANT_SUFFIX = {"fp32": "", "int4": "_int4"}


def graph_file(variant: str, index: int) -> str:
    """The file of question ``index``'s graph in ``variant``."""
    return f"verdict-{index}{VARIANT_SUFFIX[variant]}.onnx"


def load_tokenizer(directory: Path):
    """The tokenizer the export copied (its chat template, pad token and vocabulary as the PyTorch judge had them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    tokenizer.padding_side = "right"
    return tokenizer


class _Graph:
    """One question's graph in a session: (ids, mask) int64 arrays -> log-odds (batch,)."""

    def __init__(self, path: Path, provider: str, threads: int | None) -> None:
        self.session = inference_session(path, provider, threads)

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run([GRAPH_OUTPUT], {"input_ids": ids, "attention_mask": mask})[0]


class OnnxVerdictReader(VerdictReader):
    """A ``VerdictReader`` whose forward pass is ``files`` (one exported graph per question) run by ``provider``."""

    def __init__(self, files: Sequence[Path], tokenizer, questions: Sequence[VerdictQuestion], *,
                 variant: str = "fp32", provider: str = "cpu", threads: int | None = None, **kw: Any) -> None:
        if len(files) != len(questions):
            raise ValueError(f"{len(files)} graph files for {len(questions)} verdict questions")
        self._provider, self._threads = provider, threads
        super().__init__(list(files), tokenizer, questions, precision="fp32", **kw)
        arithmetic = provider_info(provider).precision
        self.precision = f"onnx-{variant}" + ("" if arithmetic == "fp32" else f"-{provider}")
        self.precision_why = f"the {variant} graphs run by {provider} ({arithmetic})"

    def _modules(self, files: list[Path]) -> list[_Graph]:
        return [_Graph(path, self._provider, self._threads) for path in files]

    def _run(self, module, prompts: list[tuple[list[int], int]]) -> list[float]:
        return self._read(module, [ids for ids, _ in prompts])  # the graphs take whole prompts: no shared cache

    def _read(self, module, prompts: list[list[int]], prefix: None = None) -> list[float]:
        values = [math.nan] * len(prompts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for chunk in self.budget.batches([len(p) for p in prompts]):
            width = max(len(prompts[i]) for i in chunk)
            ids = np.full((len(chunk), width), pad, dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for row, i in enumerate(chunk):
                ids[row, :len(prompts[i])] = prompts[i]
                mask[row, :len(prompts[i])] = 1
            for i, value in zip(chunk, module(ids, mask).tolist()):
                values[i] = float(value)
        return values


def open_onnx_reader(directory: Path, card: JudgeCard, variant: str, provider: str = "cpu",
                     threads: int | None = None, batch_size: int = 8, **kw: Any) -> OnnxVerdictReader:
    """The reader of an exported verdict judge's ``variant`` (a key of the card's ``runtime.onnx.files``)."""
    files = (card.runtime.get("onnx") or {}).get("files") or {}
    if variant not in files:
        raise ValueError(f"{directory}: variant {variant!r} is not in this export (it has {', '.join(files)})")
    where = f"{directory / 'judge_card.json'} field 'runtime.onnx.files.{variant}'"
    paths = [inside(directory, name, where) for name in files[variant]]
    questions = questions_from(card.runtime.get("questions") or [DEFAULT_QUESTION], str(directory))
    return OnnxVerdictReader(paths, load_tokenizer(directory), questions, variant=variant, provider=provider,
                             threads=threads,
                             max_question_tokens=int(card.truncation.get("max_question_tokens",
                                                                         DEFAULT_MAX_QUESTION_TOKENS)),
                             max_answer_tokens=int(card.truncation.get("max_answer_tokens",
                                                                       DEFAULT_MAX_ANSWER_TOKENS)),
                             batch_size=batch_size, **kw)


def _load_verdict_onnx(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    runtime = card.runtime.get("onnx") or {}
    if "files" not in runtime:
        raise ValueError(f"{directory}: a verdict judge that was not exported has no ONNX graphs; run clfjudge "
                         "export first, or load it with backend='verdict'")
    variant, provider, why = resolve_provider(options.provider, options.variant, runtime)
    variant = variant or runtime["primary"]
    check_gated(directory, runtime, variant, provider)
    reader = open_onnx_reader(directory, card, variant, provider, options.threads, **reader_options(options))
    judge = VerdictJudge(card, reader, options.budget)
    judge.backend_name = f"onnx ({variant}{'' if provider == 'cpu' else ', ' + provider})"
    judge.runtime_choice = {"provider": provider, "file": variant, "why": why}
    return judge
