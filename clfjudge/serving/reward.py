"""A judge inside a training loop: a reward function with the signature TRL's trainers accept, and best-of-n.

TRL (GRPOTrainer, RLOOTrainer, ...) calls ``reward_func(prompts=..., completions=..., **dataset_columns)`` and
expects one float per completion; prompts and completions are strings, or lists of chat messages
({"role", "content"}, content a string or a list of text parts) for conversational datasets. A conversational
prompt reaches the judge whole: the system prompt and the earlier turns with their role labels, the last user turn
after them (``data/conversation.py``), as every other clfjudge input.

How a judge becomes a reward:
- a reward head or a pointwise judge scores each (prompt, completion) on its own;
- a pairwise 3-way judge needs something to compare with: a ``reference`` column in the dataset (or a fixed
  ``reference=`` string); the reward is P(completion better) - P(reference better), judged in both orders.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..data.conversation import answer_text, turns
from ..data.formats import ReadOptions, item_record
from ..data.records import Loc, PairRecord, PointRecord
from ..judges.base import Judge, LoadOptions

Text = str | list[dict[str, Any]]
_COMPLETION = ReadOptions(format="completion")


def as_record(prompt: Text, completion: Text, index: int) -> PointRecord:
    """One (prompt, completion) of a batch as the record a judge reads: the whole conversation as its question
    (TRL's prompt-completion format, plain or conversational); a bad item raises ``RecordError`` naming it."""
    item = {"id": str(index), "prompt": prompt, "completion": completion}
    return item_record(item, Loc("reward batch", index + 1), labelled=False, options=_COMPLETION)


def reference_text(value: Text, index: int, column: str) -> str:
    """A reference answer: a string or an assistant turn given as messages."""
    if isinstance(value, str):
        return value
    loc = Loc("reward batch", index + 1)
    return answer_text(turns(value, loc, column), loc, column)


def _load(judge: Judge | str | Path, options: LoadOptions | None = None) -> Judge:
    if not isinstance(judge, Judge):
        return Judge.load(judge, options or LoadOptions())
    if options is not None:  # a loaded judge's reader is built: what it keeps was fixed when it loaded
        raise ValueError("load options (memory_items) apply to a judge directory; this judge is loaded already: "
                         "pass its directory, or load it with Judge.load(directory, memory_items=...)")
    return judge


def reward_function(judge: Judge | str | Path, reference: str | None = None, reference_column: str = "reference",
                    memory_items: int | None = None) -> Callable[..., list[float]]:
    """``reward_func(prompts, completions, **kwargs) -> list[float]`` for TRL's ``reward_funcs`` (its ``judge``
    attribute: the judge it calls).
    ``memory_items``: how many readings the judge's reader keeps in memory (least recently used forgotten first;
    default ``embedders.cache.DEFAULT_MEMORY_ITEMS``): an RL loop reads new completions at every step. Only a
    judge directory takes it (``LoadOptions.memory_items``), and only a judge whose reader keeps readings (an
    embedding or verdict judge): another refuses it."""
    judge = _load(judge, None if memory_items is None else LoadOptions(memory_items=memory_items))
    pointwise = "score" in judge.tasks

    def reward_func(prompts: Sequence[Text], completions: Sequence[Text], **kwargs: Any) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        records = [as_record(p, c, i) for i, (p, c) in enumerate(zip(prompts, completions))]
        if pointwise:
            return [s.value for s in judge.score_batch(records)]
        refs = kwargs.get(reference_column) or ([reference] * len(records) if reference is not None else None)
        if refs is None:
            raise ValueError(f"a pairwise {judge.card.name} judge rewards a completion against a reference: pass "
                             f"reference= or give the dataset a '{reference_column}' column")
        pairs = [PairRecord(id=r.id, question=r.question, answer_a=r.answer,
                            answer_b=reference_text(ref, i, reference_column), meta=r.meta)
                 for i, (r, ref) in enumerate(zip(records, refs))]
        results = judge.compare_batch(pairs, symmetric=True)
        return [c.p_a - c.p_b for c in results]

    reward_func.__name__ = f"clfjudge_{judge.card.name}_{Path(str(judge.card.backbone)).name}"
    reward_func.judge = judge  # the judge it calls (loaded here when given a directory)
    return reward_func


def best_of_n(judge: Judge | str | Path, question: str, candidates: Sequence[str]) -> tuple[int, list[float]]:
    """The best candidate's index (the first of equal best scores: identical candidates score alike) and every
    candidate's score (``Judge.rank``)."""
    scores = _load(judge).rank(question, list(candidates))
    return int(np.argmax(scores)), scores
