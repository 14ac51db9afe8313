"""JudgeLM validation set (HF dataset BAAI/JudgeLM-100K; not in the shared data root here).

The source path is a directory holding the two official files:
- ``judgelm_val_5k.jsonl``: question_id, question_body, answer1_body, answer2_body, answer1_model_id,
  answer2_model_id, answer1_metadata / answer2_metadata ({"decoding_method": ...});
- ``judgelm_val_5k_gpt4.jsonl``: review_id, question_id, answer1_id, answer2_id, reviewer_id, metadata,
  text (GPT-4's judgement, first line "s1 s2"), score [s1, s2] (1-10 each).

They are joined on question_id (UnlimitedJudge zips them by position). Pairs whose GPT-4 score is [-1, -1]
(GPT-4 gave no usable judgement) are excluded and counted, as UnlimitedJudge drops them (151 of 5000 there).
The verdict follows from the score pair with margin 0; the scores are kept for regression heads.
"""
from __future__ import annotations

from pathlib import Path

from ..readers import iter_jsonl
from ..records import LoadResult, Loc
from .base import SOURCES, Source
from .common import Collector, Fields, finite_number

NAME = "judgelm-val"
QUESTIONS, JUDGEMENTS = "judgelm_val_5k.jsonl", "judgelm_val_5k_gpt4.jsonl"
_FAILED = (-1.0, -1.0)


def _score_pair(f: Fields) -> tuple[float, float]:
    score = f.get("score")
    pair = [finite_number(s) for s in score] if isinstance(score, list) else []
    if len(pair) != 2 or None in pair:
        raise f.loc.error("score", f"must be a pair of numbers [s1, s2], got {score!r:.200}")
    return pair[0], pair[1]


def _question_id(f: Fields) -> object:
    qid = f.get("question_id")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise f.loc.error("question_id", f"must be a string or an integer, got {qid!r:.80}")
    return qid


def _judgements(path: Path) -> dict[object, tuple[Fields, tuple[float, float]]]:
    by_question: dict[object, tuple[Fields, tuple[float, float]]] = {}
    for line, obj in iter_jsonl(path):
        f = Fields(obj, Loc(str(path), line))
        qid = _question_id(f)
        if qid in by_question:
            raise f.loc.error("question_id", f"second judgement for question {qid!r}")
        by_question[qid] = (f, _score_pair(f))
    return by_question


def load(path: Path) -> LoadResult:
    out = Collector(NAME)
    judgements = _judgements(path / JUDGEMENTS)
    matched = 0
    for line, obj in iter_jsonl(path / QUESTIONS):
        f = Fields(obj, Loc(str(path / QUESTIONS), line))
        qid = _question_id(f)
        if qid not in judgements:
            raise f.loc.error("question_id", f"{qid!r} has no GPT-4 judgement in {path / JUDGEMENTS}")
        judged, score = judgements[qid]
        matched += 1
        texts = dict(question=f.text("question_body"), answer_a=f.text("answer1_body"),
                     answer_b=f.text("answer2_body"))
        if score == _FAILED:
            out.exclude("GPT-4 score [-1, -1] (no usable judgement)", f.loc)
            continue
        out.pair(
            f.loc,
            id=f"{NAME}:{qid}",
            scores=score,
            model_a=f.optional_text("answer1_model_id"),
            model_b=f.optional_text("answer2_model_id"),
            meta={"gpt4_judgement": judged.optional_text("text"), "review_id": judged.obj.get("review_id")},
            **texts,
        )
    if matched != len(judgements):
        out.note(f"{len(judgements) - matched} GPT-4 judgement(s) have no question in {QUESTIONS}")
    return out.result()


SOURCES.register(NAME, Source(
    name=NAME, arity="pair", role="test", default_path="judgelm", loader=load,
    license="CC BY-NC 4.0 (BAAI/JudgeLM-100K)",
    description="JudgeLM val 5k: GPT-4 1-10 score pairs; [-1,-1] judgements excluded", tags=("gpt-4",),
))
