"""Record -> truncated record -> rendered text -> token ids: the one path shared by training and inference.

An ``Encoder`` is built from the same four settings at training time and from a judge card at inference
time (``Encoder.from_card``), so a judge always sees its inputs cut and rendered the way it was trained.
Every truncation is recorded in the encoder's ``TruncationReport``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..data.conversation import FLATTENING, note_flattened
from ..data.records import PairRecord, PointRecord, Record
from .model_input import MODEL_INPUTS, ModelInputEncoder
from .schemes import render
from .truncation import TruncationPolicy, TruncationReport, truncate

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from ..card import JudgeCard

# Answer fields that get a length hint, per record type.
ANSWER_FIELDS: dict[type, tuple[str, ...]] = {PairRecord: ("answer_a", "answer_b"), PointRecord: ("answer",)}


def length_bucket(text: str) -> int:
    """round(2 log2(1 + characters)): one step per factor sqrt(2) in length, 0..~30 for real answers."""
    return round(2 * math.log2(1 + len(text)))


def with_length_hints(record: Record) -> Record:
    """The record with each answer prefixed by "length N: ", N the bucket of its full (untruncated) length.
    Truncation cuts answers to fit the budget, which hides how long they were; the hint keeps that covariate
    (the strongest single predictor of the gold verdicts) visible to the judge as plain tokens."""
    hints = {f: f"length {length_bucket(getattr(record, f))}: {getattr(record, f)}"
             for f in ANSWER_FIELDS[type(record)]}
    return replace(record, **hints)




@dataclass
class Encoder:
    tokenizer: PreTrainedTokenizerBase
    scheme: str
    policy: TruncationPolicy
    use_reference: bool = False  # UnlimitedJudge's ref_drop_ratio = 1.0 means judges never see the reference
    length_hint: bool = False  # prefix each answer with its length bucket (``with_length_hints``)
    report: TruncationReport = field(default_factory=TruncationReport)

    @classmethod
    def from_card(cls, card: JudgeCard, tokenizer: PreTrainedTokenizerBase) -> Encoder:
        """The card's encoder: its scheme's, or a model's own input format where the card names one
        (``truncation.input``: a judge clfjudge did not train, ``prompts.model_input``)."""
        if "input" in card.truncation:
            return ModelInputEncoder.from_card(card, tokenizer)
        policy = TruncationPolicy(**card.truncation["policy"])
        return cls(tokenizer, card.scheme, policy, use_reference=bool(card.truncation.get("use_reference", False)),
                   length_hint=bool(card.truncation.get("length_hint", False)))

    def card_entry(self) -> dict[str, Any]:
        """What ``JudgeCard.truncation`` stores (the report is added by the trainer, per split)."""
        return {"policy": asdict(self.policy), "use_reference": self.use_reference, "length_hint": self.length_hint,
                "conversation": FLATTENING}

    def text(self, record: Record, count: bool = True) -> str:
        """The rendered, truncated text of a record; ``count=False`` leaves the truncation report alone (a length
        estimate before the real encoding must not count a record twice)."""
        note_flattened(f"scheme {self.scheme!r}", [record.meta])
        if not self.use_reference and record.reference is not None:
            record = replace(record, reference=None)
        if self.length_hint:
            record = with_length_hints(record)
        record, info = truncate(record, self.scheme, self.tokenizer, self.policy)
        if count:
            self.report.add(info)
        return render(record, self.scheme)

    def encode(self, record: Record, count: bool = True) -> dict[str, list[int]]:
        """Token ids of one record. The truncation policy makes the text fit; the tokenizer's own cut at
        ``max_length`` is only a guard against off-by-a-few boundary effects of per-field budgeting."""
        enc = self.tokenizer(self.text(record, count), truncation=True, max_length=self.policy.max_length)
        return {k: list(enc[k]) for k in MODEL_INPUTS if k in enc}


def collate(
    tokenizer: PreTrainedTokenizerBase,
    features: Sequence[dict[str, Any]],
    label_dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """Pad a batch of encoded records into tensors.

    Each feature holds k sequences per record (``input_ids`` is a list of k id lists: k = 1 for a cross-encoder,
    2 for a reward head scoring each answer on its own). Sequences are flattened record by record, so the
    model's outputs come back as ``[rec0_seq0, rec0_seq1, rec1_seq0, ...]`` and reshape to (records, k).
    """
    import torch

    keys = [k for k in MODEL_INPUTS if k in features[0]]
    seqs = [{k: f[k][i] for k in keys} for f in features for i in range(len(f["input_ids"]))]
    batch = dict(tokenizer.pad(seqs, padding=True, return_tensors="pt"))
    if "labels" in features[0]:
        batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=label_dtype)
    return batch
