"""Chat messages as the ecosystem writes them (TRL's conversational format: a list of ``{"role", "content"}``,
content a string or a list of parts ``[{"type": "text", "text": ...}]``) -> the text a judge reads.

A conversation's prompt becomes one question: the last user turn alone when there is nothing before it, else every
turn with its role label ("System:", "User:", "Assistant:") so that the system prompt and the earlier turns reach
the judge whatever its scheme (``FLATTENING``). The turns stay in the record's ``meta[TURNS]``, with a list content
as it was given (a lone user turn too: a prompt given as messages is conversational, ``is_conversational``), so that
a model with its own chat template reads the messages themselves (``messages``) and truncation can drop the oldest
of them first (``prompts/truncation.py``) and keep the last user turn whole.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

from .records import Loc

# record meta: the prompt's turns, [[role, text], ...] (a third item: the content as given, where it was a list of
# parts), the last one the final user turn
TURNS = "turns"
ROLE_LABELS = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
TURN_SEPARATOR = "\n\n"
# How a judge that reads one question sees a conversation (the card and the run's log say so).
FLATTENING = ("flattened: a multi-turn prompt is read as one question, each turn after its role label (System:, "
              "User:, Assistant:, Tool:), joined by a blank line (a lone user turn as it is); list content: its text "
              "parts joined")
log = logging.getLogger(__name__)
_NOTED: set[str] = set()
Turn = tuple  # (role, text) or (role, text, parts): parts, the content as given where it was a list


def is_conversational(meta: dict[str, Any]) -> bool:
    """Whether the record's prompt was given as messages (TRL's conversational format), even a lone user turn."""
    return TURNS in meta


def loses_shape(meta: dict[str, Any]) -> bool:
    """Whether reading the prompt as one question loses something: earlier turns, a system prompt, list content."""
    prompt = meta.get(TURNS)
    return bool(prompt) and (len(prompt) > 1 or len(prompt[0]) > 2)


def note_flattened(reader: str, metas: Iterable[dict[str, Any]]) -> None:
    """Say once per run and reader (a judge's input format) that it reads conversations flattened, the first time
    it meets one."""
    if reader not in _NOTED and any(loses_shape(meta) for meta in metas):
        _NOTED.add(reader)
        log.warning("note: %s reads conversations %s", reader, FLATTENING)


def is_messages(value: Any) -> bool:
    """A list of chat messages (what ``trl.data_utils.is_conversational`` looks for: dicts with a role)."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


def content_text(content: Any, loc: Loc, field: str) -> str:
    """A message's content as text: a string, or the text parts of a list of parts joined (a non-text part is an
    error naming the field: a text judge cannot read an image)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise loc.error(field, f"content must be a string or a list of parts, got {type(content).__name__}")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise loc.error(f"{field}[{i}]", f"only text parts can be judged, got {str(part)[:80]!r}")
        texts.append(part["text"])
    return "".join(texts)


def turns(value: Any, loc: Loc, field: str) -> list[Turn]:
    """(role, text) of each message of ``value``; anything else is an error naming the field and the message."""
    if not isinstance(value, list) or not value:
        raise loc.error(field, f"must be a non-empty list of {{'role', 'content'}} messages, got {str(value)[:80]!r}")
    out = []
    for i, message in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise loc.error(where, f"a message is a {{'role', 'content'}} mapping, got {str(message)[:80]!r}")
        if message["role"] not in ROLE_LABELS:
            raise loc.error(f"{where}.role", f"unknown role {message['role']!r}; known: {sorted(ROLE_LABELS)}")
        if message.get("content") is None:
            raise loc.error(f"{where}.content", "is missing")
        content = message["content"]
        text = content_text(content, loc, f"{where}.content")
        out.append((message["role"], text) if isinstance(content, str) else (message["role"], text, content))
    return out


def flatten(prompt: Sequence[Turn]) -> str:
    """The question a judge reads: the lone user turn as it is, else every turn after its role label."""
    if len(prompt) == 1 and prompt[0][0] == "user":
        return prompt[0][1]
    return TURN_SEPARATOR.join(f"{ROLE_LABELS[role]}: {text}" for role, text, *_ in prompt)


def prompt_question(prompt: Sequence[Turn], loc: Loc, field: str) -> tuple[str, dict[str, Any]]:
    """(question, meta) of a conversational prompt; it must end with a user turn (what the answer replies to)."""
    if prompt[-1][0] != "user":
        raise loc.error(field, f"a prompt must end with a user turn, it ends with {prompt[-1][0]!r}")
    return flatten(prompt), {TURNS: [list(t) for t in prompt]}


def answer_text(completion: Sequence[Turn], loc: Loc, field: str) -> str:
    """An answer given as messages: its assistant turn(s); a completion of several turns keeps their labels."""
    if completion[0][0] != "assistant":
        raise loc.error(field, f"a completion starts with an assistant turn, got {completion[0][0]!r}")
    if len(completion) == 1:
        return completion[0][1]
    return TURN_SEPARATOR.join(f"{ROLE_LABELS[role]}: {text}" for role, text, *_ in completion)


def messages(question: str, answer: str, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation as a chat model reads it: the prompt's turns as given (system prompt, earlier turns, list
    content), then the answer as the assistant's reply. A question without turns, or one cut beyond its earlier
    turns by truncation (it no longer equals its turns), is one user turn."""
    prompt = meta.get(TURNS)
    if prompt and flatten(prompt) == question:
        head = [{"role": t[0], "content": t[2] if len(t) > 2 else t[1]} for t in prompt]
    else:
        head = [{"role": "user", "content": question}]
    return [*head, {"role": "assistant", "content": answer}]


def drop_oldest(prompt: Sequence[Turn]) -> list[Turn] | None:
    """The prompt without its oldest turn other than the system prompt (the system prompt goes last), or None when
    only the final user turn is left."""
    prompt = list(prompt)
    if len(prompt) <= 1:
        return None
    first = 1 if prompt[0][0] in ("system", "developer") and len(prompt) > 2 else 0
    return prompt[:first] + prompt[first + 1:]


def split_shared_prefix(chosen: list, rejected: list) -> tuple[list, list, list]:
    """TRL's implicit prompt on messages (``trl.data_utils.extract_prompt``): the longest common run of turns is
    the prompt, the rest of each conversation is its answer."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    return chosen[:n], chosen[n:], rejected[n:]


ASSISTANT_MARKER = "\n\nAssistant:"  # HH-RLHF-style dialogues: "\n\nHuman: ...\n\nAssistant: ..."


def split_at_assistant(chosen: str, rejected: str) -> tuple[str, str, str] | None:
    """(shared context, rest of chosen, rest of rejected) of two plain-text dialogues: their common prefix cut at
    its last "Assistant:" turn (a cut mid-turn would give each side a different context); None without one."""
    cut = os.path.commonprefix([chosen, rejected]).rfind(ASSISTANT_MARKER)
    if cut < 0:
        return None
    start = cut + len(ASSISTANT_MARKER)
    return chosen[:cut].strip(), chosen[start:].strip(), rejected[start:].strip()


def split_shared_text(chosen: str, rejected: str) -> tuple[str, str, str]:
    """TRL's implicit prompt on plain text: a dialogue's shared context (``split_at_assistant``), else the common
    prefix of the two texts up to its last whitespace (never mid-word)."""
    dialogue = split_at_assistant(chosen, rejected)
    if dialogue is not None:
        return dialogue
    common = os.path.commonprefix([chosen, rejected])
    cut = max(common.rfind(" "), common.rfind("\n")) + 1
    return chosen[:cut].strip(), chosen[cut:].strip(), rejected[cut:].strip()
