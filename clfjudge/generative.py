"""The study's generative baseline as a judge: the same decoder, prompt and hyperparameters as a classifier head,
but the LM head writes the judgement (trained by ``training.generative.train_generative``, or any causal LM
zero-shot in a scheme with a parser).

``GenerativeJudge``: greedy decoding of left-padded, length-bucketed batches; every output is read by the
scheme's released-judge parser. A failed parse stays a failure: it is counted (``ParseStats``) and scored as wrong
(pairs) or left out and counted (scores), never turned into a verdict or a score.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .data.records import PairRecord, PointRecord, Record
from .prompts.parsers import PARSERS, Parsed, ParseStats
from .prompts.schemes import SCHEMES, target
from .prompts.truncation import TruncationPolicy, TruncationReport

GENERATIVE = "generative"  # the judge card's head name
DEFAULT_SCHEMES = {"pair": "decoder-pair-gen", "point": "decoder-point-gen"}
DEFAULT_SCHEME = DEFAULT_SCHEMES["pair"]


@dataclass
class PromptEncoder:
    """Prompt ids (the classifier's truncation policy, shortened by the target budget) and, for training,
    the target ids + EOS with the prompt positions masked out of the loss."""

    tokenizer: Any
    scheme: str
    policy: TruncationPolicy
    use_reference: bool = False
    report: TruncationReport = field(default_factory=TruncationReport)

    def prompt_ids(self, record: Record) -> list[int]:
        from .prompts.encoding import Encoder

        encoder = Encoder(self.tokenizer, self.scheme, self.policy, self.use_reference, report=self.report)
        return encoder.encode(record)["input_ids"]

    def example(self, record: Record) -> dict[str, list[int]]:
        prompt = self.prompt_ids(record)
        answer = self.tokenizer(target(record, self.scheme), add_special_tokens=False)["input_ids"]
        answer = answer + [self.tokenizer.eos_token_id]
        return {"input_ids": prompt + answer, "attention_mask": [1] * (len(prompt) + len(answer)),
                "labels": [-100] * len(prompt) + answer}


class GenerativeJudge:
    """A causal LM that judges by writing: ``generate`` gives parsed outputs, ``verdicts`` verdicts (None =
    parse failure) and ``scores`` scores (None = parse failure). ``runtime.GenerateJudge`` serves it behind the
    ``Judge`` interface (``Judge.load`` of a generative judge directory)."""

    def __init__(self, model, tokenizer, scheme: str, max_length: int, max_new_tokens: int,
                 use_reference: bool = False, batch_size: int = 8, name: str = "") -> None:
        self.model, self.tokenizer, self.scheme = model.eval(), tokenizer, SCHEMES.get(scheme)
        if self.scheme.parser is None:
            raise ValueError(f"scheme {scheme!r} has no output parser: it cannot be used generatively")
        self.parser = PARSERS.get(self.scheme.parser)
        self.max_new_tokens, self.batch_size, self.name = max_new_tokens, batch_size, name or scheme
        self.prompts = PromptEncoder(tokenizer, scheme, TruncationPolicy(max_length=max_length - max_new_tokens),
                                     use_reference)
        self.stats = ParseStats()

    @classmethod
    def load(cls, directory: str | Path, batch_size: int = 8) -> GenerativeJudge:
        """A directory written by ``train_generative``."""
        from .card import JudgeCard
        from .models.backbones import load_causal_lm, resolve_backbone

        card = JudgeCard.load(directory)
        if card.head != GENERATIVE:
            raise ValueError(f"{directory}: judge_card.json field 'head' is {card.head!r}, not {GENERATIVE!r}")
        info = resolve_backbone(directory)
        tokenizer = _tokenizer(info)
        return cls(load_causal_lm(info, tokenizer=tokenizer), tokenizer, card.scheme, card.max_length,
                   card.runtime["max_new_tokens"], bool(card.truncation.get("use_reference")), batch_size,
                   name=Path(directory).name)

    @classmethod
    def from_backbone(cls, backbone: str, scheme: str, max_length: int = 1024, max_new_tokens: int = 64,
                      batch_size: int = 8) -> GenerativeJudge:
        """An untrained (zero-shot) causal LM judging in ``scheme``."""
        from .models.backbones import load_causal_lm, resolve_backbone

        info = resolve_backbone(backbone)
        tokenizer = _tokenizer(info)
        return cls(load_causal_lm(info, tokenizer=tokenizer), tokenizer, scheme, max_length, max_new_tokens,
                   batch_size=batch_size, name=f"{backbone} zero-shot")

    def generate(self, records: Sequence[Record]) -> list[Parsed]:
        import torch

        prompts = [self.prompts.prompt_ids(r) for r in records]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # length buckets: less padding
        texts: list[str] = [""] * len(prompts)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                batch = self.tokenizer.pad([{"input_ids": prompts[i]} for i in idx], padding=True,
                                           return_tensors="pt")
                out = self.model.generate(**batch, max_new_tokens=self.max_new_tokens, do_sample=False,
                                          pad_token_id=self.tokenizer.pad_token_id,
                                          eos_token_id=self.tokenizer.eos_token_id)
                new = out[:, batch["input_ids"].shape[1]:]
                for i, ids in zip(idx, new):
                    texts[i] = self.tokenizer.decode(ids, skip_special_tokens=True)
        return [self.stats.add(self.parser.name, self.parser(text)) for text in texts]

    def verdicts(self, records: Sequence[PairRecord]) -> list:
        """Verdicts (pairwise-grading schemes: the verdict their score pair implies); None = parse failure."""
        return [p.verdict if p.ok else None for p in self.generate(records)]

    def scores(self, records: Sequence[PointRecord]) -> list[float | None]:
        return [p.score if p.ok else None for p in self.generate(records)]


def _tokenizer(info):
    from .models.backbones import load_tokenizer

    return load_tokenizer(info, padding_side="left")  # generation continues every prompt at its end

