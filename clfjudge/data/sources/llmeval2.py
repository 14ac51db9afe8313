"""LLMEval^2 benchmark (AlibabaResearch/DAMO-ConvAI ``WideDeep/evaluation_data/LLMEval2_benchmark.json.zip``:
one JSONL member, 2553 human-labelled pairs from 15 upstream sets, partly non-English).

Fields: query, response1, response2, human ("model1" / "model2" / "TIE"), dataset (the upstream set, kept in
meta). The 275 "mt-bench" rows have an empty query (their dialogue sits inside the responses); they are
excluded and counted, since a pair without its question cannot be judged as one. id = "llmeval2:{line index}".
The 200 pairs of ``llmbar-llmeval2`` come from here (LLMBar prefixed some queries with an instruction).
The data MANIFEST says this set holds 275 PandaLM-test prompts; that is the count of the empty-query
"mt-bench" rows, and no non-empty query here matches a PandaLM test instruction (checked by prefix as well as
by the contamination keys), so decontaminating against PandaLM removes nothing from this source.
"""
from __future__ import annotations

from pathlib import Path

from ..readers import iter_jsonl, location
from ..records import LoadResult, Loc, Verdict
from .base import SOURCES, Source
from .common import Collector, Fields

NAME = "llmeval2"
MEMBER = "LLMEval2_benchmark.json"
_HUMAN = {"model1": Verdict.A, "model2": Verdict.B, "TIE": Verdict.TIE}


def load(path: Path) -> LoadResult:
    out = Collector(NAME)
    member = MEMBER if path.suffix == ".zip" else None  # the unzipped JSONL works too
    where = location(path, member)
    for index, (line, obj) in enumerate(iter_jsonl(path, member)):
        f = Fields(obj, Loc(where, line))
        fields = dict(question=f.text("query"), answer_a=f.text("response1"), answer_b=f.text("response2"),
                      verdict=f.choice("human", _HUMAN), meta={"dataset": f.optional_text("dataset")})
        if not fields["question"].strip():
            out.exclude("empty query", f.loc, "query")
            continue
        out.pair(f.loc, id=f"{NAME}:{index}", **fields)
    return out.result()


SOURCES.register(NAME, Source(
    name=NAME, arity="pair", role="train",
    default_path="llmeval2/WideDeep/evaluation_data/LLMEval2_benchmark.json.zip", loader=load,
    license="MIT (AlibabaResearch/DAMO-ConvAI); items from 15 upstream sets with their own licenses",
    description="LLMEval^2: 2553 human-labelled pairs (ties) from 15 sources", tags=("human",),
))
