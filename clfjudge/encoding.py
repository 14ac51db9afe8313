"""Record -> truncated record -> rendered text -> token ids: the one path shared by training and inference.

An ``Encoder`` is built from the same four settings at training time and from a judge card at inference
time (``Encoder.from_card``), so a judge always sees its inputs cut and rendered the way it was trained.
Every truncation is recorded in the encoder's ``TruncationReport``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Sequence

from .records import Record
from .schemes import render
from .truncation import TruncationPolicy, TruncationReport, truncate

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from .card import JudgeCard

# The tokenizer outputs a sequence-classification backbone consumes (others, e.g. offsets, are dropped).
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Encoder:
    tokenizer: "PreTrainedTokenizerBase"
    scheme: str
    policy: TruncationPolicy
    use_reference: bool = False  # the study's ref_drop_ratio = 1.0 means judges never see the reference
    report: TruncationReport = field(default_factory=TruncationReport)

    @classmethod
    def from_card(cls, card: "JudgeCard", tokenizer: "PreTrainedTokenizerBase") -> "Encoder":
        policy = TruncationPolicy(**card.truncation["policy"])
        return cls(tokenizer, card.scheme, policy, use_reference=bool(card.truncation.get("use_reference", False)))

    def card_entry(self) -> dict[str, Any]:
        """What ``JudgeCard.truncation`` stores (the report is added by the trainer, per split)."""
        return {"policy": asdict(self.policy), "use_reference": self.use_reference}

    def text(self, record: Record) -> str:
        if not self.use_reference and record.reference is not None:
            record = replace(record, reference=None)
        record, info = truncate(record, self.scheme, self.tokenizer, self.policy)
        self.report.add(info)
        return render(record, self.scheme)

    def encode(self, record: Record) -> dict[str, list[int]]:
        """Token ids of one record. The truncation policy makes the text fit; the tokenizer's own cut at
        ``max_length`` is only a guard against off-by-a-few boundary effects of per-field budgeting."""
        enc = self.tokenizer(self.text(record), truncation=True, max_length=self.policy.max_length)
        return {k: list(enc[k]) for k in MODEL_INPUTS if k in enc}


def collate(
    tokenizer: "PreTrainedTokenizerBase",
    features: Sequence[dict[str, Any]],
    label_dtype: "torch.dtype | None" = None,
) -> dict[str, "torch.Tensor"]:
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
