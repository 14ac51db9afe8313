"""How a judge directory is opened: ``LoadOptions``, built once by whoever loads a judge (the CLI, ``Judge.load``'s
keywords, the Ray engine's actors, the audit, ``reward_function``) and handed down to the loader of the judge's kind
(``kinds.LOADERS``: ``loader(directory, card, options)``), which hands each option to the part that uses it.

Below every subpackage (it imports only ``batching``), so that judges/, scoring/ and serving/ read one type.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from .batching import DEFAULT_BATCH_SIZE, Budget

AUTO = "auto"


@dataclass(frozen=True)
class LoadOptions:
    """``backend``: "auto" (what the card names, else what the directory holds) or a loader name
    (``kinds.LOADERS``). ``provider``: what runs an ONNX file (``models.onnx_session.PROVIDERS``) or "auto" (the
    fastest run the export's parity gate passed, where this machine has it; "cpu" for a judge that is not ONNX).
    ``variant``: for ONNX, "fp32" | "optimized" | "int8" or a file name (None: the card's primary file).
    ``threads``: intra-op threads (None: the runtime's default). ``budget``: rows, padded tokens and padding per
    forward pass (``batching.Budget``), owned by the caller. ``trust_pickle``: allow pickles a directory holds (runs
    code from it). ``model_input``: how a model without a judge card reads (question, answer): "trl" |
    "chat-template" | "text" | "text-pair" (``prompts.model_input.INPUTS``). ``memory_items``: how many readings
    the judge's reader keeps in memory (least recently used forgotten first; None: the reader's default); a judge
    without a reader cache refuses it (``refuse_memory``)."""

    backend: str = AUTO
    provider: str = AUTO
    variant: str | None = None
    threads: int | None = None
    budget: Budget = field(default_factory=Budget)
    trust_pickle: bool = False
    model_input: str | None = None
    memory_items: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be a positive number or None, got {self.threads}")
        if self.memory_items is not None and (isinstance(self.memory_items, bool)
                                              or not isinstance(self.memory_items, int) or self.memory_items < 1):
            raise ValueError(f"memory_items must be a positive number of readings or None, got {self.memory_items!r}")

    @property
    def batch_size(self) -> int:
        return self.budget.max_batch_size

    @classmethod
    def of(cls, batch_size: int = DEFAULT_BATCH_SIZE, max_batch_tokens: int | None = None,
           max_padding: float | None = None, **options: Any) -> LoadOptions:
        """The options from ``Judge.load``'s keywords (the budget's three given one by one); an unknown keyword is
        a TypeError naming the known ones."""
        known = {f.name for f in fields(cls)} - {"budget"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown judge load option(s) {unknown}; known: batch_size, max_batch_tokens, "
                            f"max_padding, {', '.join(sorted(known))}")
        return cls(budget=Budget(batch_size, max_batch_tokens, max_padding), **options)

    def with_(self, **changes: Any) -> LoadOptions:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return replace(self, **changes)

    def refuse_memory(self, judge: str) -> None:
        """For a judge with no reader cache: ``memory_items`` is refused, not ignored."""
        if self.memory_items is not None:
            raise ValueError(f"memory_items={self.memory_items}: {judge} keeps no readings in memory (only an "
                             "embedding judge's reader and a verdict judge's do)")
