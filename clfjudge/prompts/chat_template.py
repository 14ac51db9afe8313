"""A judge's prompt as its tokenizer's chat template, so that tools that only know transformers score the text
clfjudge scores: ``tokenizer.apply_chat_template(prompt + completion messages)`` then
``tokenizer(text, add_special_tokens=False)`` (TRL's ``GRPOTrainer(reward_funcs=["judge_dir"])`` path on
conversational data; a reward model card's usage) gives the token ids ``Encoder.encode`` gives, for inputs within
the judge's ``max_length`` (clfjudge cuts a longer one field by field; the template does not cut). TRL's standard
path (plain-text prompts) feeds the model prompt + completion without any template, which no tokenizer file can
turn into the judge's prompt: there the judge goes in as ``clfjudge.reward_function(judge_dir)``.

The template is the scheme rendered with the conversation read as clfjudge reads it (``data/conversation.py``:
the prompt up to the last user turn as the question, system prompt and earlier turns after their role labels;
what follows as the answer; list content's text parts joined), between the special tokens the tokenizer adds
itself (e.g. ``[CLS]`` ... ``[SEP]``, ``<s>``), written as literals because the caller tokenizes with
``add_special_tokens=False``. Only schemes that show one answer (the reward and regression heads') can be written
so; a length hint (computed from the answer's length) cannot be and is refused.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..data.conversation import ROLE_LABELS
from ..data.records import Loc, PointRecord
from .schemes import SCHEMES, render

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_MARK = {"question": "\ue000clfjudge-question\ue000", "answer": "\ue000clfjudge-answer\ue000"}
_LABELS = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in ROLE_LABELS.items()) + "}"
# The question and the answer as ``data.conversation`` reads them from messages: the prompt is every turn up to the
# last user turn (that turn alone when nothing comes before it, else each turn after its role label, joined by a
# blank line), the answer what follows it; a list content's text parts joined, any other part refused.
_PICK_TURNS = (
    "{%- set labels = " + _LABELS + " -%}"
    "{%- macro text(content) -%}{%- if content is string -%}{{ content }}{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] != 'text' or part['text'] is not string -%}"
    "{{ raise_exception('only text parts can be judged') }}{%- endif -%}{{ part['text'] }}{%- endfor -%}"
    "{%- endif -%}{%- endmacro -%}"
    "{%- macro joined(turns) -%}{%- for m in turns -%}{%- if m['role'] not in labels -%}"
    "{{ raise_exception('unknown role ' ~ m['role']) }}{%- endif -%}{%- if not loop.first -%}{{ '\\n\\n' }}"
    "{%- endif -%}{{ labels[m['role']] ~ ': ' }}{{ text(m['content']) }}{%- endfor -%}{%- endmacro -%}"
    "{%- set last = namespace(user=-1) -%}"
    "{%- for message in messages -%}{%- if message['role'] == 'user' -%}{%- set last.user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- set prompt = messages[:last.user + 1] -%}{%- set reply = messages[last.user + 1:] -%}"
    "{%- set turn = namespace(question='', answer='') -%}"
    "{%- if prompt | length == 1 -%}{%- set turn.question = text(prompt[0]['content']) -%}"
    "{%- else -%}{%- set turn.question = joined(prompt) -%}{%- endif -%}"
    "{%- if reply | length == 1 -%}{%- set turn.answer = text(reply[0]['content']) -%}"
    "{%- else -%}{%- set turn.answer = joined(reply) -%}{%- endif -%}")


def text_template(scheme_name: str) -> str:
    """The scheme's text with ``{question}`` / ``{answer}`` (``{answer_a}`` / ``{answer_b}``) where the record's
    fields go, as another program fills it with ``str.replace`` (a record without rubric or reference)."""
    from ..data.records import PairRecord

    scheme = SCHEMES.get(scheme_name)
    marks = {name: f"\ue000clfjudge-{name}\ue000" for name in ("question", "answer", "answer_a", "answer_b")}
    if scheme.arity == "point":
        record = PointRecord.build(Loc(), question=marks["question"], answer=marks["answer"], unlabelled=True)
    else:
        record = PairRecord.build(Loc(), question=marks["question"], answer_a=marks["answer_a"],
                                  answer_b=marks["answer_b"], unlabelled=True)
    text = render(record, scheme)
    for name, mark in marks.items():
        text = text.replace(mark, "{" + name + "}")
    return text


def _special_tokens(tokenizer: PreTrainedTokenizerBase) -> tuple[str, str]:
    """The special tokens the tokenizer puts before and after one text, as text."""
    bare = tokenizer("x", add_special_tokens=False)["input_ids"]
    full = tokenizer("x")["input_ids"]
    start = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), None)
    if start is None:
        raise ValueError(f"{type(tokenizer).__name__}: its special tokens change the text's own tokens; no chat "
                         "template can reproduce them")
    added = full[:start] + full[start + len(bare):]
    if any(i not in tokenizer.all_special_ids for i in added):
        raise ValueError(f"{type(tokenizer).__name__}: it adds tokens that are not special tokens ({added})")
    prefix, suffix = full[:start], full[start + len(bare):]
    return "".join(tokenizer.convert_ids_to_tokens(prefix)), "".join(tokenizer.convert_ids_to_tokens(suffix))


def _literal(text: str) -> str:
    return "{{ " + json.dumps(text) + " }}" if text else ""


def judge_chat_template(scheme_name: str, tokenizer: PreTrainedTokenizerBase, length_hint: bool = False) -> str:
    """The Jinja chat template that renders a conversation as ``scheme_name`` renders (question, answer)."""
    scheme = SCHEMES.get(scheme_name)
    if scheme.arity != "point":
        raise ValueError(f"scheme {scheme_name!r} shows {scheme.arity} records (two answers in one input): a chat "
                         "template renders one conversation, so only one-answer schemes can be written as one")
    if length_hint:
        raise ValueError("a judge trained with length hints prefixes each answer with its length bucket, which a chat "
                         "template cannot compute; clfjudge.reward_function scores it as trained")
    record = PointRecord.build(Loc(), question=_MARK["question"], answer=_MARK["answer"], unlabelled=True)
    text = render(record, scheme)
    before_question, _, rest = text.partition(_MARK["question"])
    between, _, after_answer = rest.partition(_MARK["answer"])
    if _MARK["question"] in after_answer or _MARK["answer"] in before_question:
        raise ValueError(f"scheme {scheme_name!r} shows the answer before the question or a field twice")
    prefix, suffix = _special_tokens(tokenizer)
    return (_PICK_TURNS + _literal(prefix + before_question) + "{{ turn.question }}" + _literal(between)
            + "{{ turn.answer }}" + _literal(after_answer + suffix))


def carry_prompt(tokenizer: PreTrainedTokenizerBase, scheme_name: str, length_hint: bool = False) -> bool:
    """Give a judge's tokenizer its prompt as chat template where one can express it (a one-answer scheme without
    length hints; what the backbone's tokenizer had is replaced: the judge reads its scheme, not the backbone's
    chat format); True when it did. A pairwise judge's tokenizer is left as it is."""
    if SCHEMES.get(scheme_name).arity != "point" or length_hint:
        return False
    tokenizer.chat_template = judge_chat_template(scheme_name, tokenizer)
    return True
