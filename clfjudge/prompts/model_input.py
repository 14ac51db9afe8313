"""A model's own input format, for a judge clfjudge did not train: a reward model saved by transformers or TRL reads
(question, answer) the way it was trained, not in a clfjudge scheme.

- ``trl``: what TRL's ``GRPOTrainer`` gives a reward model for each of its data shapes (``reward_funcs=[path]``):
  a prompt given as messages through the chat template (``chat-template`` below), a plain-text prompt as one text
  with its answer (``text`` below); the default for a decoder whose tokenizer has a chat template, so that clfjudge's
  reward is TRL's on every dataset;
- ``chat-template``: the tokenizer's chat template over the conversation as the user gave it (system prompt, every
  turn, list content as given: ``data.conversation.messages``) and the answer as the assistant's reply, tokenized
  as ``tokenizer.apply_chat_template(messages, tokenize=True)`` and TRL's ``GRPOTrainer`` do (the template writes
  every special token, so the tokenizer adds none); what decoder reward models (Llama, Qwen, Gemma, TRL's
  RewardTrainer on conversational data) read;
- ``text``: the prompt and the answer as one text, ``tokenizer(question + answer, add_special_tokens=False)``, as
  TRL's ``GRPOTrainer`` scores a reward model on standard (not conversational) data; the default for a decoder
  whose tokenizer has no chat template (TRL's RewardTrainer on plain-text data);
- ``text-pair``: ``tokenizer(question, answer)``, the encoder reward models' convention (OpenAssistant's
  DeBERTa RMs, cross-encoders).

The last two read a conversation flattened into one question (``data.conversation.FLATTENING``).

A judge card names the format in ``truncation.input``; ``Encoder.from_card`` then builds a ``ModelInputEncoder``
(``INPUTS``), with the same interface as ``Encoder``. A too-long input is cut field by field as a scheme's is
(``truncation.truncate`` through the format's ``View``). Only the question and the answer are shown: rubric and
reference are not part of such a model's input.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..data import conversation
from ..data.records import PointRecord, Record
from ..registry import Registry
from .truncation import TruncationPolicy, TruncationReport, View, truncate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..card import JudgeCard

_FIELDS = ("question", "answer")
# The tokenizer outputs a sequence-classification backbone consumes (others, e.g. offsets, are dropped).
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def messages(record: PointRecord) -> list[dict[str, Any]]:
    """The conversation a chat reward model scores: the prompt's turns as given, the answer as the reply."""
    return conversation.messages(record.question, record.answer, record.meta)


@dataclass(frozen=True)
class InputFormat:
    """``text``: the input as one string (what a log or ``clfjudge score --text`` shows); ``tokens``: its token ids,
    as the model's own tokenizer call makes them."""

    name: str
    text: Callable[[PreTrainedTokenizerBase, PointRecord], str]
    tokens: Callable[[PreTrainedTokenizerBase, PointRecord], Any]
    reads_turns: bool = False  # whether it reads a conversation's messages themselves, else flattened

    @property
    def conversation(self) -> str:
        """How it reads a multi-turn prompt (the card says so)."""
        return ("the model's own chat template over every turn as given" if self.reads_turns
                else conversation.FLATTENING)


def _chat_text(tokenizer: PreTrainedTokenizerBase, record: PointRecord) -> str:
    return tokenizer.apply_chat_template(messages(record), tokenize=False)


def _chat_tokens(tokenizer: PreTrainedTokenizerBase, record: PointRecord) -> Any:
    return tokenizer(_chat_text(tokenizer, record), add_special_tokens=False, verbose=False)


def _plain_text(tokenizer: PreTrainedTokenizerBase, record: PointRecord) -> str:
    return record.question + record.answer


def _plain_tokens(tokenizer: PreTrainedTokenizerBase, record: PointRecord) -> Any:
    return tokenizer(_plain_text(tokenizer, record), add_special_tokens=False, verbose=False)


def _pair_text(tokenizer: PreTrainedTokenizerBase, record: PointRecord) -> str:
    return tokenizer.decode(_pair_tokens(tokenizer, record)["input_ids"])


def _pair_tokens(tokenizer: PreTrainedTokenizerBase, record: PointRecord) -> Any:
    return tokenizer(record.question, record.answer, verbose=False)


def _trl_text(tokenizer: PreTrainedTokenizerBase, record: PointRecord) -> str:
    return (_chat_text if conversation.is_conversational(record.meta) else _plain_text)(tokenizer, record)


def _trl_tokens(tokenizer: PreTrainedTokenizerBase, record: PointRecord) -> Any:
    return (_chat_tokens if conversation.is_conversational(record.meta) else _plain_tokens)(tokenizer, record)


INPUTS: Registry[InputFormat] = Registry("model input format")
INPUTS.register("trl", InputFormat("trl", _trl_text, _trl_tokens, reads_turns=True))
INPUTS.register("chat-template", InputFormat("chat-template", _chat_text, _chat_tokens, reads_turns=True))
INPUTS.register("text", InputFormat("text", _plain_text, _plain_tokens))
INPUTS.register("text-pair", InputFormat("text-pair", _pair_text, _pair_tokens))


@dataclass
class ModelInputEncoder:
    """``Encoder``'s interface over a model's own input format (``INPUTS``)."""

    tokenizer: PreTrainedTokenizerBase
    input: str
    policy: TruncationPolicy
    report: TruncationReport = field(default_factory=TruncationReport)

    def __post_init__(self) -> None:
        self.format = INPUTS.get(self.input)
        if self.input in ("trl", "chat-template") and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"input {self.input!r}: the model's tokenizer has no chat template "
                             "(tokenizer_config.json / chat_template.jinja); use input 'text' (the prompt and the "
                             "answer as one text, as TRL scores standard data) or 'text-pair'")

    @classmethod
    def from_card(cls, card: JudgeCard, tokenizer: PreTrainedTokenizerBase) -> ModelInputEncoder:
        return cls(tokenizer, card.truncation["input"], TruncationPolicy(**card.truncation["policy"]))

    def card_entry(self) -> dict[str, Any]:
        return {"policy": asdict(self.policy), "input": self.input, "conversation": self.format.conversation}

    def _fit(self, record: Record, count: bool) -> PointRecord:
        if not isinstance(record, PointRecord):
            raise ValueError(f"record {record.id!r}: a model read in its own input format ({self.input}) scores one "
                             f"answer at a time, got a {record.arity} record")
        if not self.format.reads_turns:
            conversation.note_flattened(f"model input {self.input!r}", [record.meta])
        view = View(self.input, _FIELDS, lambda r: len(self.format.tokens(self.tokenizer, r)["input_ids"]))
        record, info = truncate(record, view, self.tokenizer, self.policy)
        if count:
            self.report.add(info)
        return record

    def text(self, record: Record, count: bool = True) -> str:
        return self.format.text(self.tokenizer, self._fit(record, count))

    def encode(self, record: Record, count: bool = True) -> dict[str, list[int]]:
        enc = self.format.tokens(self.tokenizer, self._fit(record, count))
        return {k: list(enc[k])[: self.policy.max_length] for k in MODEL_INPUTS if k in enc}
