"""A judge inside a training loop: a reward function with the signature TRL's trainers accept, and best-of-n.

TRL (GRPOTrainer, RLOOTrainer, ...) calls ``reward_func(prompts=..., completions=..., **dataset_columns)`` and
expects one float per completion; prompts and completions are strings, or lists of chat messages
({"role", "content"}) for conversational datasets.

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

from ..judges.base import Judge

Text = str | list[dict[str, Any]]


def as_text(value: Text, where: str) -> str:
    """A plain string from a string or a list of chat messages (the last user turn for a prompt, the
    assistant's content for a completion)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value) and value:
        if where == "prompts":
            users = [m["content"] for m in value if m.get("role") == "user"]
            return users[-1] if users else value[-1]["content"]
        return "".join(m["content"] for m in value if m.get("role", "assistant") == "assistant")
    raise ValueError(f"{where}: expected a string or a list of {{'role', 'content'}} messages, got {value!r:.80}")


def _load(judge: Judge | str | Path) -> Judge:
    return judge if isinstance(judge, Judge) else Judge.load(judge)


def reward_function(judge: Judge | str | Path, reference: str | None = None,
                    reference_column: str = "reference") -> Callable[..., list[float]]:
    """``reward_func(prompts, completions, **kwargs) -> list[float]`` for TRL's ``reward_funcs``."""
    judge = _load(judge)
    pointwise = "score" in judge.tasks

    def reward_func(prompts: Sequence[Text], completions: Sequence[Text], **kwargs: Any) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        questions = [as_text(p, "prompts") for p in prompts]
        answers = [as_text(c, "completions") for c in completions]
        if pointwise:
            return [s.value for s in judge.score_batch(
                [{"question": q, "answer": a} for q, a in zip(questions, answers)])]
        refs = kwargs.get(reference_column) or ([reference] * len(answers) if reference is not None else None)
        if refs is None:
            raise ValueError(f"a pairwise {judge.card.head} judge rewards a completion against a reference: pass "
                             f"reference= or give the dataset a '{reference_column}' column")
        results = judge.compare_batch([{"question": q, "answer_a": a, "answer_b": as_text(r, reference_column)}
                                       for q, a, r in zip(questions, answers, refs)], symmetric=True)
        return [c.p_a - c.p_b for c in results]

    reward_func.__name__ = f"clfjudge_{judge.card.head}_{Path(str(judge.card.backbone)).name}"
    return reward_func


def best_of_n(judge: Judge | str | Path, question: str, candidates: Sequence[str]) -> tuple[int, list[float]]:
    """The best candidate's index and every candidate's score (``Judge.rank``)."""
    scores = _load(judge).rank(question, list(candidates))
    return int(np.argmax(scores)), scores
