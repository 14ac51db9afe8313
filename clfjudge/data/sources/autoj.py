"""Auto-J (GAIR-NLP/auto-j) data.

- ``autoj-test``: ``data/test/testdata_pairwise.jsonl`` (1392 human-labelled pairs, 58 scenarios x 24).
  Fields scenario, label (0 = response 1 better, 1 = response 2 better, 2 = tie), prompt, "response 1",
  "response 2". id = "autoj-test:{0-based record index}".
- ``autoj-single-train``: ``data/training/single_traindata.jsonl`` (960 pointwise training examples with a
  GPT-4 1-10 rating). The query and the response are cut out of ``usrmsg`` (the Auto-J single-response
  prompt, between "[Query]: " and "[Response]: " in the [BEGIN DATA] block); ``pred_score`` is the label,
  the GPT-4 critique (``target_output``) is kept in meta.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..readers import iter_jsonl
from ..records import LoadResult, Loc, Verdict
from .base import SOURCES, Source
from .common import Collector, Fields

TEST, SINGLE = "autoj-test", "autoj-single-train"
_LABEL = {0: Verdict.A, 1: Verdict.B, 2: Verdict.TIE}
_SINGLE_DATA = re.compile(
    r"\[BEGIN DATA\]\n\*\*\*\n\[Query\]: (?P<query>.*?)\n\*\*\*\n\[Response\]: (?P<response>.*)\n\*\*\*\n\[END DATA\]",
    re.S,
)
_LICENSE = "none stated (GAIR-NLP/auto-j has no LICENSE file)"


def load_test(path: Path) -> LoadResult:
    out = Collector(TEST)
    for index, (line, obj) in enumerate(iter_jsonl(path)):
        f = Fields(obj, Loc(str(path), line))
        out.pair(
            f.loc,
            id=f"{TEST}:{index}",
            question=f.text("prompt"),
            answer_a=f.text("response 1"),
            answer_b=f.text("response 2"),
            verdict=f.choice("label", _LABEL),
            scenario=f.text("scenario"),
        )
    return out.result()


def load_single(path: Path) -> LoadResult:
    out = Collector(SINGLE)
    for index, (line, obj) in enumerate(iter_jsonl(path)):
        f = Fields(obj, Loc(str(path), line))
        match = _SINGLE_DATA.search(f.text("usrmsg"))
        if match is None:
            raise f.loc.error("usrmsg", "no '[BEGIN DATA] *** [Query]: ... *** [Response]: ... *** [END DATA]' block")
        out.point(
            f.loc,
            id=f"{SINGLE}:{index}",
            question=match["query"],
            answer=match["response"],
            score=f.number("pred_score"),
            scale=(1.0, 10.0),
            scenario=f.text("scenario"),
            meta={"critique": f.text("target_output"), "source_dataset": f.optional_text("source_dataset")},
        )
    return out.result()


SOURCES.register(TEST, Source(
    name=TEST, arity="pair", role="test", default_path="auto-j/data/test/testdata_pairwise.jsonl",
    loader=load_test, license=_LICENSE,
    description="Auto-J pairwise test set: 1392 human-labelled pairs with ties, 58 scenarios", tags=("human",),
))
SOURCES.register(SINGLE, Source(
    name=SINGLE, arity="point", role="train", default_path="auto-j/data/training/single_traindata.jsonl",
    loader=load_single, license=_LICENSE,
    description="Auto-J single-response training data: 960 responses with GPT-4 1-10 ratings", tags=("gpt-4",),
))
