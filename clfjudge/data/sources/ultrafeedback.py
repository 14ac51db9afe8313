"""UltraFeedback binarized sample (kkminions888-ops/ultrafeedback-dpo-noise-study
``data/processed/{train,eval}_clean.jsonl``: 1000 + 200 pairs drawn from trl-lib/ultrafeedback_binarized).

Fields: prompt, chosen, rejected (plain strings), source_index, metadata {score_chosen, score_rejected} (GPT-4
ratings, kept in meta). chosen = the highest-rated completion: it is answer_a with verdict A; randomising the
answer order is the training code's job. Pairs whose chosen and rejected texts are identical carry no
preference and are excluded (counted). split = "train" / "eval"; id = "ultrafeedback:{split}:{line index}".
"""
from __future__ import annotations

from pathlib import Path

from ..readers import iter_jsonl
from ..records import LoadResult, Loc, Verdict
from .base import SOURCES, Source
from .common import SPLIT, Collector, Fields, data_files

NAME = "ultrafeedback"


def load(path: Path) -> LoadResult:
    out = Collector(NAME)
    for file in data_files(path, "*_clean.jsonl"):
        split = file.name.removesuffix("_clean.jsonl")
        for index, (line, obj) in enumerate(iter_jsonl(file)):
            f = Fields(obj, Loc(str(file), line))
            question, chosen, rejected = f.text("prompt"), f.text("chosen"), f.text("rejected")
            if chosen == rejected:
                out.exclude("chosen and rejected answers are identical", f.loc, "rejected")
                continue
            ratings = f.obj.get("metadata") if isinstance(f.obj.get("metadata"), dict) else {}
            out.pair(
                f.loc,
                id=f"{NAME}:{split}:{index}",
                question=question,
                answer_a=chosen,
                answer_b=rejected,
                verdict=Verdict.A,
                meta={SPLIT: split, "source_index": f.obj.get("source_index"),
                      "score_chosen": ratings.get("score_chosen"), "score_rejected": ratings.get("score_rejected")},
            )
    return out.result()


SOURCES.register(NAME, Source(
    name=NAME, arity="pair", role="train", default_path="ultrafeedback-sample/data/processed", loader=load,
    license="not stated in the sample repo (upstream UltraFeedback / trl-lib cards: MIT, not verified)",
    description="UltraFeedback binarized sample: GPT-4-rated chosen/rejected pairs (train 1000 / eval 200)",
    tags=("gpt-4",),
))
