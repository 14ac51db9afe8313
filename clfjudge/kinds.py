"""The judge kinds: one entry per kind names, lazily, what loads it, what trains it and what exports it.

A judge kind is what a judge directory's card says it is (``head``) and what ``Judge.load`` opens it with
(``runtime.backend``). Its loader lives in ``judges/``, its trainer in ``training/``, its exporter in ``export/``,
and those modules build on one another in that order, so the entry names them as ``"module:function"`` targets
(``registry.resolve``) and imports none of them: this module sits below every subpackage and any of them may read
it. ``register_kind`` fills the three registries the runtime dispatches on (``LOADERS``: backend name -> loader,
``TRAINERS``: head name -> trainer, ``EXPORTERS``: head name -> exporter); registering a kind once makes its
directories loadable (``Judge.load``, ``clfjudge score / serve / audit``), trainable (``clfjudge train`` with
``head: NAME``) and exportable (``clfjudge export``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .registry import Registry


@dataclass(frozen=True)
class JudgeKind:
    """``loaders``: backend name (the card's ``runtime.backend``) -> loader ``(directory, card, options) -> Judge``
    (``options``: the caller's ``options.LoadOptions``, built once and handed down). ``trainer``: ``(TrainConfig) ->
    Path``, trains ``head: NAME`` (None: the fine-tuned heads' Trainer loop, for heads in ``models.heads.HEADS``).
    ``exporter``: ``(judge_dir, out_dir, *, int8, isa, source, n_records, parity, int8_config, fallback, providers)
    -> ExportResult`` (None: the fine-tuned heads' ONNX export; a kind without ONNX form is refused there). Targets
    are ``"module:function"`` strings, or the function itself."""

    loaders: Mapping[str, Callable[..., Any] | str]
    trainer: Callable[..., Any] | str | None = None
    exporter: Callable[..., Any] | str | None = None
    help: str = field(default="", compare=False)


KINDS: Registry[JudgeKind] = Registry("judge kind")
LOADERS: Registry[Callable[..., Any] | str] = Registry("judge backend")
TRAINERS: Registry[Callable[..., Any] | str] = Registry("trainer")
EXPORTERS: Registry[Callable[..., Any] | str] = Registry("exporter")


def register_kind(name: str, kind: JudgeKind) -> JudgeKind:
    """Register a judge kind (``name``: the card's ``head``) and its loaders, trainer and exporter."""
    wanted = ([(LOADERS, backend) for backend in kind.loaders] + [(TRAINERS, name)] * bool(kind.trainer)
              + [(EXPORTERS, name)] * bool(kind.exporter) + [(KINDS, name)])
    taken = [f"{registry.kind} {key!r}" for registry, key in wanted if key in registry]
    if taken:  # checked first, so that a refused kind leaves nothing half-registered
        raise ValueError(f"judge kind {name!r}: {', '.join(taken)} is registered already")
    KINDS.register(name, kind)
    for backend, loader in kind.loaders.items():
        LOADERS.register(backend, loader)
    if kind.trainer:
        TRAINERS.register(name, kind.trainer)
    if kind.exporter:
        EXPORTERS.register(name, kind.exporter)
    return kind


# The built-in kinds. The fine-tuned heads (cls3, regression, reward: ``models.heads.HEADS``) train in the Trainer
# loop and export through ``export.onnx``'s own path; an exported judge of any kind loads with the onnx backend.
register_kind("fine-tuned", JudgeKind(
    loaders={"torch": "clfjudge.judges.model:_load_torch", "onnx": "clfjudge.judges.model:_load_onnx"},
    help="a classification / regression / reward head fine-tuned with its backbone; PyTorch or ONNX"))
register_kind("embedding", JudgeKind(
    loaders={"sklearn": "clfjudge.judges.embedding:_load_sklearn"},
    trainer="clfjudge.training.embedding:train_embedding",
    exporter="clfjudge.export.embedding:export_embedding_judge",
    help="a frozen encoder or decoder reader + a scikit-learn head"))
register_kind("generative", JudgeKind(
    loaders={"generate": "clfjudge.judges.generative:_load_generate"},
    trainer="clfjudge.training.generative:train_generative",
    help="a causal LM that writes its judgement (no ONNX form)"))
register_kind("verdict", JudgeKind(
    loaders={"verdict": "clfjudge.judges.verdict:_load_verdict",
             "verdict-onnx": "clfjudge.judges.verdict_onnx:_load_verdict_onnx"},
    trainer="clfjudge.training.verdict:train_verdict",
    exporter="clfjudge.export.verdict:export_verdict_judge",
    help="a chat model's own verdict: log-odds of its yes / no (or A / B) reply token, one forward pass; PyTorch "
         "or ONNX"))
