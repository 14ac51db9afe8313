"""Make a record fit a judge's maximum input length, field by field, and account for every cut.

``truncate(record, scheme, tokenizer, policy)`` returns a record whose rendering tokenizes to at most
``policy.max_length`` tokens (special tokens included; or whose input, as a ``View`` shows it, does):

1. if the full rendering fits, the record is returned untouched;
2. the template's own cost is measured by rendering the record with its shown fields emptied; what is left
   of ``max_length`` is the space for the fields;
3. each field gets up to its budget (tokens; ``answer`` is per answer). Budgets not set in the policy are
   shares of that space (``DEFAULT_SHARES``; the answers split what the other fields' budgets leave), and
   space a short field does not use goes to the fields that are still too long;
4. a conversation's question (``data/conversation.py``) first loses its oldest turns while it is over its
   allocation (the system prompt after the other earlier turns; the final user turn is never dropped), counted as
   ``EARLIER_TURNS`` in the report;
5. a field over its allocation keeps its head and its tail joined by " … " (an answer's conclusion and a
   question's final instruction live at the end). No field is ever dropped: a cut field keeps at least
   its first and last token;
6. the result is rendered and counted again, and the space shrunk by any overshoot until it fits
   (tokenizing a field alone and in context can differ by a token or two at the boundaries).

Cuts are made at token boundaries through the fast tokenizer's offset mapping, so the kept text is the
original text (casing, spacing, markup) and works alike for WordPiece, BPE and SentencePiece tokenizers.
A record whose template alone leaves no room for the fields raises ``TruncationError``.
"""
from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..data.conversation import TURNS, drop_oldest, flatten
from ..data.records import Record
from .schemes import SCHEMES, render

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ELLIPSIS = " … "
EARLIER_TURNS = "earlier turns"  # report key: tokens of a conversation's oldest turns dropped from its question
BUDGET_KEYS = ("question", "answer", "rubric", "reference")
# Share of the field space each field is guaranteed when everything is long; answers split the rest.
DEFAULT_SHARES = {"question": 0.25, "rubric": 0.15, "reference": 0.2}
_BUDGET_KEY = {"question": "question", "answer": "answer", "answer_a": "answer", "answer_b": "answer",
               "rubric": "rubric", "reference": "reference"}


def _is_number(x: Any) -> bool:
    """A finite int or float (not a bool): what a length, a budget or a fraction can be."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return False
    return isinstance(x, numbers.Integral) or math.isfinite(x)  # an int beyond float range is still a number


class TruncationError(ValueError):
    """The record cannot be made to fit (the template alone is too long for ``max_length``)."""


@dataclass
class TruncationPolicy:
    max_length: int = 512
    budgets: dict[str, float] = field(default_factory=dict)  # tokens per field; "answer" is per answer
    head_fraction: float = 0.5  # share of a cut field's kept tokens taken from its head (the rest: tail)

    def __post_init__(self) -> None:
        if not _is_number(self.max_length) or self.max_length != int(self.max_length) or self.max_length < 1:
            raise ValueError(f"TruncationPolicy: max_length must be a positive integer, got {self.max_length!r}")
        if not isinstance(self.budgets, dict):
            raise ValueError(f"TruncationPolicy: budgets must be a mapping of field -> tokens, got {self.budgets!r}")
        unknown = set(self.budgets) - set(BUDGET_KEYS)
        if unknown:
            raise ValueError(f"TruncationPolicy: unknown budget field(s) {sorted(map(str, unknown))}; "
                             f"use {BUDGET_KEYS}")
        bad = {k: v for k, v in self.budgets.items() if not (_is_number(v) and v >= 1)}
        if bad:
            raise ValueError(f"TruncationPolicy: budgets are token counts >= 1, got {bad}")
        if not (_is_number(self.head_fraction) and 0.0 < self.head_fraction < 1.0):
            raise ValueError(f"TruncationPolicy: head_fraction must be in (0, 1), got {self.head_fraction!r}")

    def budgets_for(self, fields: list[str], space: int) -> dict[str, int]:
        """Token budget of each shown field, given the space the template leaves."""
        out: dict[str, int] = {}
        for f in fields:
            key = _BUDGET_KEY[f]
            if key in self.budgets:
                out[f] = int(self.budgets[key])
            elif key != "answer":
                out[f] = int(DEFAULT_SHARES[key] * space)
        answers = [f for f in fields if f not in out]
        if answers:
            rest = max(0, space - sum(out.values())) // len(answers)
            out.update({f: rest for f in answers})
        return out


@dataclass(frozen=True)
class TruncationInfo:
    record_id: str
    scheme: str
    length_before: int  # tokens of the full rendering
    length_after: int
    removed: Mapping[str, int] = field(default_factory=dict)  # field -> tokens removed (cut fields only)

    @property
    def truncated(self) -> bool:
        return bool(self.removed)


@dataclass
class TruncationReport:
    """Truncation over a data set: how many records were cut, and which fields by how much."""

    records: int = 0
    truncated: int = 0
    fields: Counter = field(default_factory=Counter)  # field -> records where it was cut
    tokens_removed: Counter = field(default_factory=Counter)  # field -> tokens removed in total
    longest: int = 0  # longest full rendering seen, in tokens

    def add(self, info: TruncationInfo) -> None:
        self.records += 1
        self.truncated += info.truncated
        self.longest = max(self.longest, info.length_before)
        for f, n in info.removed.items():
            self.fields[f] += 1
            self.tokens_removed[f] += n

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "truncated": self.truncated,
            "fraction_truncated": self.truncated / self.records if self.records else 0.0,
            "longest_tokens": self.longest,
            "fields": {f: {"records": self.fields[f], "tokens_removed": self.tokens_removed[f]}
                       for f in sorted(self.fields)},
        }


def _count(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    return len(tokenizer(text, verbose=False)["input_ids"])


def _spans(tokenizer: PreTrainedTokenizerBase, text: str) -> list[tuple[int, int]]:
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(f"truncation cuts at token offsets and needs a fast tokenizer, got {type(tokenizer).__name__}")
    return [tuple(o) for o in tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                        verbose=False)["offset_mapping"]]


def allocate(lengths: Mapping[str, int], budgets: Mapping[str, int], space: int, floor: int) -> dict[str, int]:
    """Tokens each field may keep: its budget, then what short fields leave over, shared among long ones.

    Every field keeps at least ``min(length, floor)``; budgets that together exceed ``space`` are scaled down.
    """
    if sum(lengths.values()) <= space:
        return dict(lengths)
    least = {f: min(n, floor) for f, n in lengths.items()}
    if sum(least.values()) > space:
        raise TruncationError(f"{space} tokens of space cannot hold the minimum of each field {least}")
    alloc = {f: max(least[f], min(lengths[f], budgets[f])) for f in lengths}
    over = sum(alloc.values()) - space
    if over > 0:  # budgets oversubscribed: shrink the part of each allocation above its minimum
        above = {f: alloc[f] - least[f] for f in alloc}
        total = sum(above.values())
        for f in alloc:
            alloc[f] -= -(-over * above[f] // total)  # ceil, so the sum ends at or below space
    left = space - sum(alloc.values())
    while left > 0:  # water-filling: equal shares to the fields still too long, smallest need first
        hungry = sorted((f for f in alloc if alloc[f] < lengths[f]), key=lambda f: lengths[f] - alloc[f])
        if not hungry:
            break
        share = max(1, left // len(hungry))
        for f in hungry:
            give = min(share, lengths[f] - alloc[f], left)
            alloc[f] += give
            left -= give
    return alloc


def _cut(text: str, spans: list[tuple[int, int]], keep: int, head_fraction: float) -> tuple[str, int]:
    """Keep ``keep`` tokens of ``text``: its head and its tail joined by the ellipsis. Returns (text, kept)."""
    keep = max(2, keep)
    head = min(keep - 1, max(1, round(keep * head_fraction)))
    tail = keep - head
    head_end = spans[head - 1][1]
    tail_start = max(head_end, spans[len(spans) - tail][0])
    return text[:head_end].rstrip() + ELLIPSIS + text[tail_start:].lstrip(), head + tail


def _drop_earlier_turns(record: Record, tokenizer: PreTrainedTokenizerBase,
                        allowance: Callable[[Record], int]) -> tuple[Record, int]:
    """A conversation's question without its oldest turns while it is longer than its ``allowance`` (the tokens the
    allocation would leave it) and a turn other than the final user turn is left; the record and the tokens dropped."""
    turns = record.meta.get(TURNS)
    if not turns:
        return record, 0
    length = start = len(_spans(tokenizer, record.question))
    while length > allowance(record) and (shorter := drop_oldest(turns)) is not None:
        turns = shorter
        record = replace(record, question=flatten(turns), meta={**record.meta, TURNS: [list(t) for t in turns]})
        length = len(_spans(tokenizer, record.question))
    return record, start - length


@dataclass(frozen=True)
class View:
    """How a record is shown to the model, for truncation: the fields that may be cut (in order), and the number
    of tokens the whole input takes. A scheme's view renders its template (``scheme_view``); a foreign model's
    renders the model's own input (its chat template, or a text pair: ``prompts.model_input``)."""

    name: str
    fields: tuple[str, ...]
    length: Callable[[Record], int]


def scheme_view(scheme_name: str, tokenizer: PreTrainedTokenizerBase) -> View:
    scheme = SCHEMES.get(scheme_name)
    return View(scheme_name, scheme.fields, lambda record: _count(tokenizer, render(record, scheme)))


def truncate(record: Record, scheme_name: str | View, tokenizer: PreTrainedTokenizerBase,
             policy: TruncationPolicy) -> tuple[Record, TruncationInfo]:
    """``record`` with fields cut so that ``render(record, scheme_name)`` (or a ``View``'s input) fits
    ``policy.max_length`` tokens; a conversation loses its oldest turns before its question is cut."""
    view = scheme_name if isinstance(scheme_name, View) else scheme_view(scheme_name, tokenizer)
    scheme_name = view.name
    before = view.length(record)
    if before <= policy.max_length:
        return record, TruncationInfo(record.id, scheme_name, before, before)
    fields = [f for f in view.fields if getattr(record, f) is not None]
    overhead = view.length(replace(record, **{f: "" for f in fields}))
    ellipsis = len(tokenizer(ELLIPSIS, add_special_tokens=False, verbose=False)["input_ids"])
    space = policy.max_length - overhead

    def allowance(rec: Record) -> int:
        lengths = {f: len(_spans(tokenizer, getattr(rec, f))) for f in fields}
        try:
            return allocate(lengths, policy.budgets_for(fields, space), space, floor=2 + ellipsis)["question"]
        except TruncationError:  # too little space for any field: the allocation below says so
            return lengths["question"]

    turns_dropped = 0
    if "question" in fields and space > 0:
        record, turns_dropped = _drop_earlier_turns(record, tokenizer, allowance)
    texts = {f: getattr(record, f) for f in fields}
    spans = {f: _spans(tokenizer, t) for f, t in texts.items()}
    lengths = {f: len(s) for f, s in spans.items()}
    where = f"record {record.id!r} (source {record.source!r}), scheme {scheme_name!r}"
    while True:
        if space < 1:
            raise TruncationError(f"{where}: the template alone takes {overhead} of {policy.max_length} tokens")
        try:
            alloc = allocate(lengths, policy.budgets_for(fields, space), space, floor=2 + ellipsis)
        except TruncationError as exc:
            raise TruncationError(f"{where}: {exc} (template: {overhead} tokens, max_length "
                                  f"{policy.max_length})") from None
        cut, removed = {}, ({EARLIER_TURNS: turns_dropped} if turns_dropped else {})
        for f in fields:
            if alloc[f] < lengths[f]:
                cut[f], kept = _cut(texts[f], spans[f], alloc[f] - ellipsis, policy.head_fraction)
                removed[f] = lengths[f] - kept
        out = replace(record, **cut)
        after = view.length(out)
        if after <= policy.max_length:
            return out, TruncationInfo(record.id, scheme_name, before, after, removed)
        space -= after - policy.max_length
