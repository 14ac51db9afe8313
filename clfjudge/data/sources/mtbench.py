"""MT-Bench human judgements (HF dataset lmsys/mt_bench_human_judgments, split "human": 3355 votes; not in
the shared data root here).

Official format: parquet files ``data/human-*.parquet`` (a JSONL export with the same columns is accepted
too) with question_id, model_a, model_b, winner ("model_a" / "model_b" / "tie" / "tie (bothbad)"), judge,
conversation_a / conversation_b (lists of {role, content}), turn (1 or 2). Both ties map to TIE; the raw
winner is kept in meta. Line numbers of parquet rows are 1-based row numbers.

question = the first user message. Turn 1: the answers are the first assistant replies. Turn 2 (the vote
is about the whole two-turn exchange, and the two models' first replies differ): each answer is that model's
first reply followed by "User: {second question}" and "Assistant: {second reply}". split = "turn1"/"turn2".
The same pair is often judged by several people; each vote is its own record (id = "mtbench-human:{row}").
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..readers import iter_jsonl
from ..records import LoadResult, Loc, Verdict
from .base import SOURCES, Source
from .common import SPLIT, Collector, Fields, data_files

NAME = "mtbench-human"
_WINNER = {"model_a": Verdict.A, "model_b": Verdict.B, "tie": Verdict.TIE, "tie (bothbad)": Verdict.TIE}
_TURNS = {1: 2, 2: 4}  # turn -> messages the conversation must hold


def _rows(path: Path) -> Iterator[tuple[int, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from enumerate(pq.read_table(path).to_pylist(), start=1)
    else:
        yield from iter_jsonl(path)


def _messages(f: Fields, name: str, needed: int) -> list[str]:
    conversation = f.get(name)
    if not isinstance(conversation, list) or len(conversation) < needed:
        raise f.loc.error(name, f"must be a list of at least {needed} messages, got {conversation!r:.200}")
    texts = []
    for k, (message, role) in enumerate(zip(conversation[:needed], ["user", "assistant"] * 2)):
        if not isinstance(message, dict) or message.get("role") != role or not isinstance(message.get("content"), str):
            raise f.loc.error(name, f"message {k} must be {{'role': {role!r}, 'content': <text>}}, "
                                    f"got {message!r:.200}")
        texts.append(message["content"])
    return texts


def _answer(messages: list[str]) -> str:
    if len(messages) == 2:
        return messages[1]
    return f"{messages[1]}\n\nUser: {messages[2]}\n\nAssistant: {messages[3]}"


def load(path: Path) -> LoadResult:
    out = Collector(NAME)
    index = 0
    for file in data_files(path, "human-*.parquet"):
        for line, obj in _rows(file):
            f = Fields(obj, Loc(str(file), line))
            turn = f.choice("turn", {t: t for t in _TURNS})
            conv_a = _messages(f, "conversation_a", _TURNS[turn])
            conv_b = _messages(f, "conversation_b", _TURNS[turn])
            if conv_a[0::2] != conv_b[0::2]:
                raise f.loc.error("conversation_b", "its user messages differ from conversation_a's")
            out.pair(
                f.loc,
                id=f"{NAME}:{index}",
                question=conv_a[0],
                answer_a=_answer(conv_a),
                answer_b=_answer(conv_b),
                verdict=f.choice("winner", _WINNER),
                model_a=f.text("model_a"),
                model_b=f.text("model_b"),
                meta={SPLIT: f"turn{turn}", "turn": turn, "winner": f.obj["winner"], "judge": f.obj.get("judge"),
                      "question_id": f.get("question_id")},
            )
            index += 1
    return out.result()


SOURCES.register(NAME, Source(
    name=NAME, arity="pair", role="test", default_path="mt_bench_human_judgments/data", loader=load,
    license="CC BY 4.0 (lmsys/mt_bench_human_judgments)",
    description="MT-Bench human pairwise votes (turn 1 and 2), ties included", tags=("human",),
))
