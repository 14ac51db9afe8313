"""LLMBar (princeton-nlp/LLMBar ``Dataset/**/dataset.json``): JSON lists of {input, output_1, output_2, label}
with label 1 or 2 = the output that follows the instruction better; there are no ties.

- LLMBar proper: Natural (100) and the adversarial Neighbor (134), GPTInst (92), GPTOut (47), Manual (46);
- case-study sets (role "probe"): Constraint, Negation, Normal, Base_9, Base_10;
- sets the LLMBar authors processed from other benchmarks (ties removed): FairEval (66), LLMEval^2 (200).
id = "{source}:{0-based index}".
"""
from __future__ import annotations

from pathlib import Path

from ..records import LoadResult, Verdict
from .base import SOURCES, Source
from .common import Collector, Fields, array_records

_LABEL = {1: Verdict.A, 2: Verdict.B}
SETS = {  # source name -> (directory under llmbar/Dataset, role)
    "llmbar-natural": ("LLMBar/Natural", "test"),
    "llmbar-neighbor": ("LLMBar/Adversarial/Neighbor", "test"),
    "llmbar-gptinst": ("LLMBar/Adversarial/GPTInst", "test"),
    "llmbar-gptout": ("LLMBar/Adversarial/GPTOut", "test"),
    "llmbar-manual": ("LLMBar/Adversarial/Manual", "test"),
    "llmbar-case-constraint": ("CaseStudy/Constraint", "probe"),
    "llmbar-case-negation": ("CaseStudy/Negation", "probe"),
    "llmbar-case-normal": ("CaseStudy/Normal", "probe"),
    "llmbar-case-base9": ("CaseStudy/Base_9", "probe"),
    "llmbar-case-base10": ("CaseStudy/Base_10", "probe"),
    "llmbar-faireval": ("Processed/FairEval", "test"),
    "llmbar-llmeval2": ("Processed/LLMEval^2", "test"),
}


def _loader(name: str):
    def load(path: Path) -> LoadResult:
        out = Collector(name)
        for index, loc, obj in array_records(path):
            f = Fields(obj, loc)
            out.pair(
                f.loc,
                id=f"{name}:{index}",
                question=f.text("input"),
                answer_a=f.text("output_1"),
                answer_b=f.text("output_2"),
                verdict=f.choice("label", _LABEL),
            )
        return out.result()

    return load


for _name, (_directory, _role) in SETS.items():
    SOURCES.register(_name, Source(
        name=_name, arity="pair", role=_role, default_path=f"llmbar/Dataset/{_directory}/dataset.json",
        loader=_loader(_name), license="MIT (princeton-nlp/LLMBar)",
        description=f"LLMBar {_directory}: instruction-following pairs, labels 1/2, no ties", tags=("human",),
    ))
