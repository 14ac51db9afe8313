"""Anthropic HH-RLHF test splits (``hh-rlhf/data/<subset>/test.jsonl.gz``: harmless-base, helpful-base,
helpful-online, helpful-rejection-sampled; 8552 pairs). Each line is {chosen, rejected}, two full dialogues
"\\n\\nHuman: ... \\n\\nAssistant: ..." that share their context and differ at the end.

The shared context is the longest common prefix of the two dialogues, cut at its last "\\n\\nAssistant:";
question = that context (with its "Human:" / "Assistant:" turns), answers = what follows in each dialogue.
Usually that is the final Assistant turn; in the few pairs whose dialogues diverge earlier (counted in the
notes) an answer holds the remaining turns. Cutting at the chosen dialogue's last "Assistant:" alone (as
common preprocessing scripts do) would give the rejected side a wrong context there.

The chosen (human-preferred) answer is answer_a with verdict A; randomising the answer order is the
training code's job. Pairs whose two answers are identical carry no preference and are excluded (counted),
as are pairs without a shared "Assistant:" turn. split = subset; id = "hh-rlhf:{subset}:{line index}".
"""
from __future__ import annotations

from pathlib import Path

from ..conversation import ASSISTANT_MARKER as ASSISTANT
from ..conversation import split_at_assistant
from ..readers import iter_jsonl
from ..records import LoadResult, Loc, Verdict
from .base import SOURCES, Source
from .common import SPLIT, Collector, Fields, data_files

NAME = "hh-rlhf"


def split_dialogues(chosen: str, rejected: str) -> tuple[str, str, str] | None:
    """(shared context, rest of chosen, rest of rejected), or None when no Assistant turn is shared."""
    return split_at_assistant(chosen, rejected)


def load(path: Path) -> LoadResult:
    out = Collector(NAME)
    diverge_early = 0
    for file in data_files(path, "*/test.jsonl.gz"):
        subset = file.parent.name
        for index, (line, obj) in enumerate(iter_jsonl(file)):
            f = Fields(obj, Loc(str(file), line))
            chosen, rejected = f.text("chosen"), f.text("rejected")
            parts = split_dialogues(chosen, rejected)
            if parts is None:
                out.exclude("no shared dialogue context", f.loc, "chosen")
                continue
            context, answer_chosen, answer_rejected = parts
            if answer_chosen == answer_rejected:
                out.exclude("chosen and rejected answers are identical", f.loc, "rejected")
                continue
            diverge_early += ASSISTANT in answer_chosen or ASSISTANT in answer_rejected
            out.pair(
                f.loc,
                id=f"{NAME}:{subset}:{index}",
                question=context,
                answer_a=answer_chosen,
                answer_b=answer_rejected,
                verdict=Verdict.A,
                meta={SPLIT: subset},
            )
    out.note(f"{diverge_early} pair(s) diverge before the last Assistant turn (answers hold several turns)")
    return out.result()


SOURCES.register(NAME, Source(
    name=NAME, arity="pair", role="train", default_path="hh-rlhf/data", loader=load,
    license="MIT (anthropics/hh-rlhf)",
    description="Anthropic HH-RLHF test splits: human chosen/rejected final Assistant turns", tags=("human",),
))
