"""The judge kinds: one entry per kind names, lazily, what loads it, what trains it and what exports it.

A judge kind is what a judge directory's card says it is (``kind``; the fine-tuned kind's card also names its
``head``) and what ``Judge.load`` opens it with (a backend: ``runtime.backend``, else what the kind finds
in the directory). Its loaders live in ``judges/``, its trainer in ``training/``, its exporter in ``export/``,
and those modules build on one another in that order, so the entry names them as ``"module:function"`` targets
(``Registry.get`` imports them on first use) and imports none of them: this module sits below every subpackage and
any of them may read it. ``register_kind`` fills the registries the runtime dispatches on (``LOADERS``: (kind,
backend) -> loader, ``TRAINERS``: kind -> trainer, ``EXPORTERS``: kind -> exporter); registering a kind once makes
its directories loadable (``Judge.load``, ``clfjudge score / serve / audit``), trainable (``clfjudge train`` with
``head: NAME``) and exportable (``clfjudge export``). Every kind calls its exported form's backend
``runtimes.EXPORTED`` ("onnx"), the form the runtimes (``clfjudge/runtimes.py``) run.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .registry import Registry, resolve, undone_after
from .runtimes import EXPORTED  # the exported form's backend, which the runtimes run (clfjudge/runtimes.py)

Target = Callable[..., Any] | str  # a function, or a lazy "module:function" target


@dataclass(frozen=True)
class JudgeKind:
    """``loaders``: backend name -> loader ``(directory, card, options) -> Judge`` (``options``: the caller's
    ``options.LoadOptions``, built once and handed down); the first is the one a card that names none opens with,
    unless ``detect``. ``trainer``: ``(TrainConfig) -> Path``, trains ``head: NAME`` (None: the fine-tuned heads'
    Trainer loop, for heads in ``models.heads.HEADS``). ``exporter``: ``(judge_dir, out_dir, options) ->
    ExportResult`` (``options``: the caller's ``export.options.ExportOptions``, built once and handed down; it refuses
    what its kind cannot honour, ``ExportOptions.refuse``; None: the kind has no export, and ``clfjudge export``
    refuses it). ``heads``: the card heads besides the kind's own name that are this kind (a collection of names, or
    a lazy target to one). ``detect``: ``(directory, card) -> backend`` for
    a card that names no backend, from the files the directory holds. ``aliases``: other backend names, as older
    cards or users give them -> the loader's. Targets are ``"module:function"`` strings, or the function itself."""

    loaders: Mapping[str, Target] = field(default_factory=dict)
    trainer: Target | None = None
    exporter: Target | None = None
    heads: Collection[str] | str = ()
    detect: Target | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    help: str = field(default="", compare=False)


KINDS: Registry[JudgeKind] = Registry("judge kind")
LOADERS: Registry[Callable[..., Any]] = Registry("judge loader")  # (kind, backend) -> loader
TRAINERS: Registry[Callable[..., Any]] = Registry("trainer")
EXPORTERS: Registry[Callable[..., Any]] = Registry("exporter")


def _entries(name: str, kind: JudgeKind) -> list[tuple[Registry, Any, Any]]:
    return ([(KINDS, name, kind)] + [(LOADERS, (name, backend), loader) for backend, loader in kind.loaders.items()]
            + [(TRAINERS, name, kind.trainer)] * bool(kind.trainer)
            + [(EXPORTERS, name, kind.exporter)] * bool(kind.exporter))


def register_kind(name: str, kind: JudgeKind) -> JudgeKind:
    """Register a judge kind (``name``: the card's ``kind``) and its loaders, trainer and exporter."""
    unknown = {alias: to for alias, to in kind.aliases.items() if to not in kind.loaders}
    if unknown:
        raise ValueError(f"judge kind {name!r}: aliases {unknown} name no backend of its loaders "
                         f"({', '.join(kind.loaders)})")
    entries = _entries(name, kind)
    taken = [f"{registry.kind} {'/'.join(key) if isinstance(key, tuple) else key!r}"
             for registry, key, _ in entries if key in registry]
    if taken:  # checked first, so that a refused kind leaves nothing half-registered
        raise ValueError(f"judge kind {name!r}: {', '.join(taken)} is registered already")
    for registry, key, item in entries:
        registry.register(key, item)
    return kind


def unregister_kind(name: str) -> None:
    for registry, key, _ in reversed(_entries(name, KINDS.get(name))):
        registry.unregister(key)


registered_kind = undone_after(register_kind, unregister_kind)  # ``register_kind`` for a block (tests)


def kind_of(head: str, where: str = "judge_card.json") -> str:
    """The kind a head name is: the kind of that name, else the kind whose ``heads`` hold it (a training recipe's
    ``head``, and a card older than its ``kind`` field)."""
    if head in KINDS:
        return head
    for name, kind in KINDS.items():
        if head in resolve(kind.heads):
            return name
    raise ValueError(f"{where} field 'head': {head!r} is no registered judge kind ({', '.join(KINDS.names())}) "
                     f"nor a head of one")


def backends() -> list[str]:
    """Every backend name some kind loads with (its aliases included)."""
    return sorted({backend for _, backend in LOADERS.names()}
                  | {alias for _, kind in KINDS.items() for alias in kind.aliases})


class UnknownBackend(KeyError):
    """A backend name that no kind has: an option wrong in itself, whatever the judge directory."""


def check_backend(name: str) -> None:
    """Refuse a backend name that no kind has (``UnknownBackend`` naming the known ones)."""
    if name not in backends():
        raise UnknownBackend(f"unknown judge backend {name!r}; known: {', '.join(backends())}")


def check_kind(name: str, where: str = "judge_card.json") -> str:
    """Refuse a card's ``kind`` that no registered judge kind has."""
    if name not in KINDS:
        raise ValueError(f"{where} field 'kind': {name!r} is no registered judge kind ({', '.join(KINDS.names())})")
    return name


def find_loader(directory: Path, card: Any, backend: str = "auto") -> tuple[str, Callable[..., Any]]:
    """The backend and loader that open a judge directory: those of its card's ``kind`` and of ``backend``,
    or for "auto" the backend the card names (``runtime.backend``), else the one the kind's ``detect`` finds in the
    directory, else the kind's first."""
    if backend != "auto":
        check_backend(backend)  # a name no kind has: refused as unknown, the one check of it on a load
    where = str(Path(directory) / "judge_card.json")
    name = check_kind(card.kind, where)
    kind = KINDS.get(name)
    asked = card.runtime.get("backend") if backend == "auto" else backend
    if asked is None:
        if kind.detect is None and not kind.loaders:
            raise ValueError(f"{where}: the {name} judge kind has no loader")
        asked = resolve(kind.detect)(directory, card) if kind.detect else next(iter(kind.loaders))
    chosen = kind.aliases.get(asked, asked)
    if (name, chosen) not in LOADERS:
        whence = f"{where} field 'runtime.backend'" if backend == "auto" else f"{directory}: backend"
        raise ValueError(f"{whence} {asked!r} is not a backend of the {name} kind: it loads "
                         f"with {', '.join(kind.loaders) or 'none'}")
    return chosen, LOADERS.get((name, chosen))


# The built-in kinds. The fine-tuned heads (cls3, regression, reward: ``models.heads.HEADS``) train in the Trainer
# loop.
register_kind("fine-tuned", JudgeKind(  # models.heads.FINE_TUNED
    loaders={"torch": "clfjudge.judges.model:_load_torch", EXPORTED: "clfjudge.judges.model:_load_onnx"},
    exporter="clfjudge.export.fine_tuned:export_fine_tuned",
    heads="clfjudge.models.heads:HEADS", detect="clfjudge.judges.model:detect_backend",
    help="a classification / regression / reward head fine-tuned with its backbone; PyTorch or ONNX"))
register_kind("embedding", JudgeKind(
    loaders={"sklearn": "clfjudge.judges.embedding:_load_sklearn", EXPORTED: "clfjudge.judges.embedding:_load_onnx"},
    trainer="clfjudge.training.embedding:train_embedding",
    exporter="clfjudge.export.embedding:export_embedding_judge",
    help="a frozen encoder or decoder reader + a scikit-learn head; exported: the decoder reader in ONNX"))
register_kind("generative", JudgeKind(
    loaders={"generate": "clfjudge.judges.generative:_load_generate"},
    trainer="clfjudge.training.generative:train_generative",
    help="a causal LM that writes its judgement (no ONNX form)"))
register_kind("verdict", JudgeKind(
    loaders={"verdict": "clfjudge.judges.verdict:_load_verdict",
             EXPORTED: "clfjudge.judges.verdict_onnx:_load_verdict_onnx"},
    aliases={"verdict-onnx": EXPORTED},  # what an exported verdict judge's card names
    trainer="clfjudge.training.verdict:train_verdict",
    exporter="clfjudge.export.verdict:export_verdict_judge",
    help="a chat model's own verdict: log-odds of its yes / no (or A / B) reply token, one forward pass; PyTorch "
         "or ONNX"))
