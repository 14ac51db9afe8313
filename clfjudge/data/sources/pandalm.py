"""PandaLM human-annotated test set (WeOpenML/PandaLM ``data/testset-v1.json``, 999 pairs).

Fields: idx, motivation_app, cmp_key ("modelA_modelB"), instruction, input, response1, response2,
annotator1..3 (0 = tie, 1 = response1 better, 2 = response2 better).

Gold label = the **median** of the three votes on the ordinal scale B < TIE < A. It equals the majority
whenever two or three annotators agree, and a 1-1-1 split (one A, one B, one tie vote) becomes TIE: the A and
B votes cancel, which is what the tie vote says. UnlimitedJudge picks a random annotator there instead
(and, through a typo, also when only annotator1 and annotator3 agree); a deterministic rule keeps runs
comparable. How many pairs each case covers is reported in the load notes (the real file has no 1-1-1
split, and 49 pairs where only annotator1 and annotator3 agree, which UnlimitedJudge labels at random).

question = input + "\\n" + instruction when input is non-empty (exactly as UnlimitedJudge), else instruction.
Six responses are JSON ``true`` in the file (a model answered "True"); they are read as that text.
"""
from __future__ import annotations

from pathlib import Path

from ..records import LoadResult, Verdict
from .base import SOURCES, Source
from .common import Collector, Fields, array_records

NAME = "pandalm-test"
_VOTE = {0: Verdict.TIE, 1: Verdict.A, 2: Verdict.B}


def gold_verdict(votes: list[Verdict]) -> Verdict:
    """Median vote on the ordinal scale B < TIE < A (= the majority when there is one)."""
    return Verdict.from_win(sorted(v.win for v in votes)[len(votes) // 2])


def _response(fields: Fields, name: str) -> tuple[str, bool]:
    """The response text, and whether it was a JSON boolean (the model's output was the word itself)."""
    value = fields.get(name)
    return (str(value), True) if isinstance(value, bool) else (fields.text(name), False)


def load(path: Path) -> LoadResult:
    out = Collector(NAME)
    no_majority = study_random = coerced = 0
    for _, loc, obj in array_records(path, "idx"):
        f = Fields(obj, loc)
        votes = [f.choice(f"annotator{i}", _VOTE) for i in (1, 2, 3)]
        no_majority += len(set(votes)) == 3
        study_random += votes[0] == votes[2] != votes[1]
        instruction, given_input = f.text("instruction"), f.text("input")
        (answer_a, bool_a), (answer_b, bool_b) = _response(f, "response1"), _response(f, "response2")
        coerced += bool_a + bool_b
        models = f.text("cmp_key").split("_")
        if len(models) != 2:
            raise f.loc.error("cmp_key", f"expected 'modelA_modelB', got {f.text('cmp_key')!r}")
        out.pair(
            f.loc,
            id=f"{NAME}:{f.get('idx')}",
            question=given_input + "\n" + instruction if given_input.strip() else instruction,
            answer_a=answer_a,
            answer_b=answer_b,
            verdict=gold_verdict(votes),
            scenario=f.text("motivation_app"),
            model_a=models[0],
            model_b=models[1],
            meta={"annotators": [obj["annotator1"], obj["annotator2"], obj["annotator3"]],
                  "instruction": instruction, "input": given_input},
        )
    out.note(f"{no_majority} pair(s) with a 1-1-1 annotator split -> TIE (median vote)")
    out.note(f"{study_random} pair(s) where only annotator1 and annotator3 agree (majority used; "
             "UnlimitedJudge draws a random annotator there)")
    if coerced:
        out.note(f"{coerced} response(s) stored as JSON booleans read as the text 'True'/'False'")
    return out.result()


SOURCES.register(NAME, Source(
    name=NAME, arity="pair", role="test", default_path="pandalm/data/testset-v1.json", loader=load,
    license="Apache-2.0 (WeOpenML/PandaLM)",
    description="PandaLM test set: 999 pairs, 3 human annotators, ties", tags=("human",),
))
