"""Chatbot Arena human votes, bias subsets (HuihuiChyan/UnifiedBias ``test_data/*.csv``; sampled from
lmsys-arena-human-preference-55k, single-turn, no ties in the snapshot).

CSV columns: id, model_a, model_b, prompt, response_a, response_b, winner_model_a, winner_model_b,
winner_tie (one-hot 0/1), round, and ``longer`` or ``length_diff``. The 13 files are bias probes (position:
left_win/left_los; verbosity: verbo_*, same_verbo; self-preference: self_*), so the same arena pair appears
in several files and, inside the self_* / verbo_* files, in both answer orders. All rows are kept (each is a
distinct probe item); ids are made unique as "arena-bias:{file stem}:{row index}" and the arena id is in
meta["arena_id"]. split = the file stem.

``arena-votes`` is the same files as a training pool: each arena vote once (the first row of its id, files in
name order), every repeat excluded and counted, so no pair is weighted by how many probes it appears in.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..readers import iter_csv
from ..records import LoadResult, Loc, Verdict
from .base import SOURCES, Source
from .common import SPLIT, Collector, Fields, data_files

NAME = "arena-bias"
VOTES = "arena-votes"
_FLAG = {"0": 0, "1": 1}
_WINNER = {"winner_model_a": Verdict.A, "winner_model_b": Verdict.B, "winner_tie": Verdict.TIE}


def _verdict(f: Fields) -> Verdict:
    chosen = [verdict for column, verdict in _WINNER.items() if f.choice(column, _FLAG)]
    if len(chosen) != 1:
        raise f.loc.error("winner_model_a", "winner_model_a / winner_model_b / winner_tie must hold exactly one 1")
    return chosen[0]


def load(path: Path) -> LoadResult:
    out = Collector(NAME)
    for file in data_files(path, "*.csv"):
        for index, (line, row) in enumerate(iter_csv(file)):
            f = Fields(row, Loc(str(file), line))
            bias = {k: row[k] for k in ("longer", "length_diff") if k in row}
            out.pair(
                f.loc,
                id=f"{NAME}:{file.stem}:{index}",
                question=f.text("prompt"),
                answer_a=f.text("response_a"),
                answer_b=f.text("response_b"),
                verdict=_verdict(f),
                model_a=f.text("model_a"),
                model_b=f.text("model_b"),
                meta={SPLIT: file.stem, "arena_id": f.text("id"), "round": f.optional_text("round"), **bias},
            )
    return out.result()


def load_votes(path: Path) -> LoadResult:
    probes = load(path)
    seen: set[str] = set()
    out = LoadResult([], probes.excluded, list(probes.notes))
    for record in probes.records:
        if record.meta["arena_id"] in seen:
            out.excluded["repeat of an arena vote already kept (another probe file or answer order)"] += 1
            continue
        seen.add(record.meta["arena_id"])
        out.records.append(replace(record, id=f"{VOTES}:{record.meta['arena_id']}", source=VOTES))
    return out


SOURCES.register(NAME, Source(
    name=NAME, arity="pair", role="train", default_path="arena-55k-unifiedbias/test_data", loader=load,
    license="not stated (rows from lmsys arena-human-preference-55k)",
    description="Chatbot Arena human votes in 13 bias subsets (position, verbosity, self-preference)",
    tags=("human",),
))
SOURCES.register(VOTES, Source(
    name=VOTES, arity="pair", role="train", default_path="arena-55k-unifiedbias/test_data", loader=load_votes,
    license="not stated (rows from lmsys arena-human-preference-55k)",
    description="Chatbot Arena human votes, each vote once (the bias probes' files deduplicated)",
    tags=("human",),
))
