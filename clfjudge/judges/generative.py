"""The generative baseline of "An Empirical Study of LLM-as-a-Judge for LLM Evaluation: Fine-tuned Judge Models are
Task-specific Classifiers" as a judge: the same decoder, prompt and hyperparameters as a classifier head, but the
LM head writes the judgement (trained by ``training.generative.train_generative``, or any causal LM zero-shot in a
scheme with a parser).

``GenerativeReader``: greedy decoding of left-padded, length-bucketed batches; every output is read by the
scheme's released-judge parser. A failed parse stays a failure: it is counted (``ParseStats``) and scored as wrong
(pairs) or left out and counted (scores), never turned into a verdict or a score.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..card import JudgeCard
from ..data.records import Loc, PairRecord, PointRecord, Record, Verdict
from ..prompts.parsers import PARSERS, Parsed, ParseStats
from ..prompts.schemes import SCHEMES, target
from ..prompts.truncation import TruncationPolicy, TruncationReport
from .base import (
    BATCH,
    DEFAULT_BATCH_SIZE,
    Budget,
    Comparison,
    Judge,
    LoadOptions,
    PairInput,
    PointInput,
    Score,
    loads,
    read_item,
)

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
        from ..prompts.encoding import Encoder

        encoder = Encoder(self.tokenizer, self.scheme, self.policy, self.use_reference, report=self.report)
        return encoder.encode(record)["input_ids"]

    def example(self, record: Record) -> dict[str, list[int]]:
        prompt = self.prompt_ids(record)
        answer = self.tokenizer(target(record, self.scheme), add_special_tokens=False)["input_ids"]
        answer = answer + [self.tokenizer.eos_token_id]
        return {"input_ids": prompt + answer, "attention_mask": [1] * (len(prompt) + len(answer)),
                "labels": [-100] * len(prompt) + answer}


class GenerativeReader:
    """A causal LM that judges by writing: ``generate`` gives parsed outputs, ``verdicts`` verdicts (None =
    parse failure) and ``scores`` scores (None = parse failure). ``GenerativeJudge`` (below) serves it behind the
    ``Judge`` interface (``Judge.load`` of a generative judge directory)."""

    def __init__(self, model, tokenizer, scheme: str, max_length: int, max_new_tokens: int,
                 use_reference: bool = False, batch_size: int = DEFAULT_BATCH_SIZE, name: str = "") -> None:
        self.model, self.tokenizer, self.scheme = model.eval(), tokenizer, SCHEMES.get(scheme)
        if self.scheme.parser is None:
            raise ValueError(f"scheme {scheme!r} has no output parser: it cannot be used generatively")
        self.parser = PARSERS.get(self.scheme.parser)
        self.max_new_tokens, self.batch_size, self.name = max_new_tokens, batch_size, name or scheme
        self.prompts = PromptEncoder(tokenizer, scheme, TruncationPolicy(max_length=max_length - max_new_tokens),
                                     use_reference)
        self.stats = ParseStats()

    @classmethod
    def load(cls, directory: str | Path, batch_size: int = DEFAULT_BATCH_SIZE) -> GenerativeReader:
        """A directory written by ``train_generative``."""
        from ..card import JudgeCard
        from ..models.backbones import load_causal_lm, resolve_backbone

        card = JudgeCard.load(directory)
        if card.kind != GENERATIVE:
            raise ValueError(f"{directory}: judge_card.json field 'kind' is {card.kind!r}, not {GENERATIVE!r}")
        info = resolve_backbone(directory)
        tokenizer = _tokenizer(info)
        return cls(load_causal_lm(info, tokenizer=tokenizer), tokenizer, card.scheme, card.max_length,
                   card.runtime["max_new_tokens"], bool(card.truncation.get("use_reference")), batch_size,
                   name=Path(directory).name)

    @classmethod
    def from_backbone(cls, backbone: str, scheme: str, max_length: int = 1024, max_new_tokens: int = 64,
                      batch_size: int = DEFAULT_BATCH_SIZE) -> GenerativeReader:
        """An untrained (zero-shot) causal LM judging in ``scheme``."""
        from ..models.backbones import load_causal_lm, resolve_backbone

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
    from ..models.backbones import load_tokenizer

    return load_tokenizer(info, padding_side="left")  # generation continues every prompt at its end


# -- its runtime judge (Judge.load) ------------------------------------------------------------------------

class GenerativeJudge(Judge):
    """A generative judge (``head: generative``, or any causal LM zero-shot): ``generative.GenerativeReader``
    writes the judgement greedily and the scheme's parser reads it. A pair scheme compares, a point scheme scores.

    A parsed verdict is certain (one-hot probabilities); ``symmetric`` also judges the swapped pair (in the same
    batches) and averages the two one-hots: the verdict both orders give, TIE when they differ. Every result
    carries the generated text(s); one the parser cannot read is ``parsed=False``, never a default verdict or
    score (a symmetric result is unparsed if either order is). ``rank`` is the base class's: point schemes score
    each answer, pair schemes play every pair in both orders, and an unparsed game counts for neither answer."""

    backend_name = "generate"

    def __init__(self, card: JudgeCard, generator: GenerativeReader,
                 budget: Budget | int = DEFAULT_BATCH_SIZE) -> None:
        super().__init__(card, ("compare",) if generator.scheme.arity == "pair" else ("score",), budget)
        self.generator = generator
        self.generator.batch_size = self.batch_size  # decoding runs rows only: no token budget applies
        self.encoder = generator.prompts  # its truncation report, like FineTunedJudge.encoder's

    @classmethod
    def zero_shot(cls, backbone: str, scheme: str, batch_size: int = DEFAULT_BATCH_SIZE) -> GenerativeJudge:
        """An untrained causal LM judging in ``scheme`` (one with a parser), with a card that says so."""
        from .generative import GENERATIVE, GenerativeReader

        gen = GenerativeReader.from_backbone(backbone, scheme, batch_size=batch_size)
        runtime = {"backend": "generate", "max_new_tokens": gen.max_new_tokens, "decoding": "greedy"}
        card = JudgeCard(kind=GENERATIVE, arity=gen.scheme.arity, backbone=backbone, scheme=scheme,
                         max_length=gen.prompts.policy.max_length + gen.max_new_tokens,
                         label_map={"parser": gen.parser.name}, runtime=runtime)
        return cls(card, gen, batch_size)

    @property
    def truncation(self) -> dict[str, Any]:
        return self.encoder.report.to_dict()

    def raw_outputs(self, records: Sequence[PairRecord | PointRecord]) -> np.ndarray:
        raise ValueError(f"this {self.card.kind} judge writes its verdict: it has no logits (nothing to "
                         "calibrate)")

    def compare_batch(self, items: Sequence[PairInput], symmetric: bool = False) -> list[Comparison]:
        self.require("compare")
        records = [read_item(item, Loc(BATCH, i), "pair") for i, item in enumerate(items, start=1)]
        if not symmetric:
            return [_written_comparison([p]) for p in self.generator.generate(records)]
        parsed = self.generator.generate(records + [r.swapped() for r in records])
        return [_written_comparison([f, b]) for f, b in zip(parsed[:len(records)], parsed[len(records):])]

    def score_batch(self, items: Sequence[PointInput]) -> list[Score]:
        self.require("score")
        records = [read_item(item, Loc(BATCH, i), "point") for i, item in enumerate(items, start=1)]
        return [Score(p.score if p.ok else math.nan, parsed=p.ok, generated=(p.raw,))
                for p in self.generator.generate(records)]


def _written_comparison(parsed: Sequence[Parsed]) -> Comparison:
    """A comparison from the parsed output of the pair (and of the swapped pair, second)."""
    texts = tuple(p.raw for p in parsed)
    if not all(p.ok and p.verdict is not None for p in parsed):
        return Comparison(math.nan, math.nan, math.nan, None, parsed=False, generated=texts)
    verdicts = [parsed[0].verdict, *(p.verdict.swapped() for p in parsed[1:])]
    p_a, p_tie, p_b = (sum(v is side for v in verdicts) / len(verdicts)
                       for side in (Verdict.A, Verdict.TIE, Verdict.B))
    return Comparison(p_a, p_tie, p_b, verdicts[0] if len(set(verdicts)) == 1 else Verdict.TIE, generated=texts)


@loads()
def _load_generate(directory: Path, card: JudgeCard, options: LoadOptions) -> Judge:
    from .generative import GenerativeReader

    return GenerativeJudge(card, GenerativeReader.load(directory, options.batch_size), options.budget)
