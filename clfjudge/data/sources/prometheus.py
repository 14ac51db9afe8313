"""Prometheus absolute-grading data (1-5 rubric scores by GPT-4).

- ``prometheus-mtbench`` / ``prometheus-vicuna``: prometheus-eval ``eval/benchmark/data/{mt_bench,vicuna}_eval.json``
  (320 each = 80 questions x 4 response sources). Each record holds the full Prometheus prompt in
  ``instruction``; it is parsed back into question, answer, reference and rubric. ``gpt4_score`` holds three
  GPT-4 samples; the label is their **mean** (the Prometheus paper correlates against GPT-4 sampled 3x; the
  mean keeps the information of all three samples, which are also kept in meta). id = "{source}:{idx}:{model}".
- ``prometheus-ind`` / ``prometheus-ood``: Feedback Bench (``feedback_collection_test.json`` = seen rubrics,
  ``feedback_collection_ood_test.json`` = unseen rubrics; HF prometheus-eval/Feedback-Bench, not in the
  shared data here). A JSON list of records with the Feedback Collection fields orig_instruction,
  orig_response, orig_reference_answer, orig_criteria, orig_score1..5_description, orig_feedback,
  orig_score, plus the rendered prompt ``instruction`` and ``output``. When the orig_* fields are absent the
  prompt in ``instruction`` is parsed instead. The label is ``gpt4_score`` when present (the field
  UnlimitedJudge reads), else ``orig_score`` (the GPT-4 score of the data generation). id = "{source}:{0-based index}".

The rubric is kept whole ("[criteria]\\nScore 1: ...\\n...Score 5: ...", as the Prometheus prompt shows it);
the bare criteria (what UnlimitedJudge's prompts show) and the five descriptions are in meta.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..formats import FORMATS, Format, ReadOptions, Row
from ..records import LoadResult
from .base import SOURCES, Source
from .common import Collector, Fields, array_records, finite_number

_PROMPT = re.compile(
    r"###The instruction to evaluate:\n(?P<question>.*?)\n\n###Response to evaluate:\n(?P<answer>.*?)\n\n"
    r"###Reference Answer \(Score 5\):\n(?P<reference>.*?)\n\n###Score Rubrics:\n(?P<rubric>.*?)\n\n###Feedback:",
    re.S,
)
_RUBRIC = re.compile(r"\[(?P<criteria>.*)\]" + "".join(rf"\nScore {k}: (?P<s{k}>.*)" for k in range(1, 6)), re.S)
SCALE = (1.0, 5.0)
_LICENSE = "Apache-2.0 (prometheus-eval/prometheus-eval)"


@dataclass(frozen=True)
class AbsolutePrompt:
    question: str
    answer: str
    reference: str
    criteria: str
    descriptions: tuple[str, ...]  # Score 1..5

    @property
    def rubric(self) -> str:
        return f"[{self.criteria}]" + "".join(f"\nScore {k}: {d}" for k, d in enumerate(self.descriptions, 1))

    def meta(self) -> dict:
        return {"criteria": self.criteria, "score_descriptions": list(self.descriptions)}


def parse_absolute_prompt(f: Fields, name: str = "instruction") -> AbsolutePrompt:
    """Split a Prometheus absolute-grading prompt back into its parts (errors name ``name``)."""
    match = _PROMPT.search(f.text(name))
    if match is None:
        raise f.loc.error(name, "not a Prometheus absolute-grading prompt (instruction / response / "
                                "reference / score rubric sections not found)")
    rubric = _RUBRIC.fullmatch(match["rubric"])
    if rubric is None:
        raise f.loc.error(name, "score rubric is not '[criteria]' followed by 'Score 1:' .. 'Score 5:' lines")
    return AbsolutePrompt(match["question"], match["answer"], match["reference"], rubric["criteria"],
                          tuple(rubric[f"s{k}"] for k in range(1, 6)))


def prompt_from_fields(f: Fields) -> AbsolutePrompt:
    """The same parts from the Feedback Collection's orig_* fields."""
    return AbsolutePrompt(
        f.text("orig_instruction"), f.text("orig_response"), f.text("orig_reference_answer"),
        f.text("orig_criteria"), tuple(f.text(f"orig_score{k}_description") for k in range(1, 6)),
    )


def _gpt4_samples(f: Fields) -> list[float]:
    samples = f.get("gpt4_score")
    if isinstance(samples, str):  # some copies store the list as a string, e.g. "[3, 2, 3]"
        try:
            samples = json.loads(samples)
        except (ValueError, RecursionError):
            raise f.loc.error("gpt4_score", f"is not a list of scores: {samples!r:.200}") from None
    numbers = [finite_number(s) for s in samples] if isinstance(samples, list) else []
    if not numbers or None in numbers:
        raise f.loc.error("gpt4_score", f"must be a non-empty list of numbers, got {samples!r:.200}")
    return numbers


def _bench_loader(name: str):
    def load(path: Path) -> LoadResult:
        out = Collector(name)
        for _, loc, obj in array_records(path, "idx"):
            f = Fields(obj, loc)
            prompt, samples = parse_absolute_prompt(f), _gpt4_samples(f)
            model = f.text("response_source")
            out.point(
                f.loc,
                id=f"{name}:{f.get('idx')}:{model}",
                question=prompt.question, answer=prompt.answer, reference=prompt.reference,
                rubric=prompt.rubric, score=sum(samples) / len(samples), scale=SCALE,
                scenario=f.optional_text("category"), model=model,
                meta={**prompt.meta(), "gpt4_samples": samples, "gpt4_feedback": f.obj.get("gpt4_feedback")},
            )
        return out.result()

    return load


def _feedback_bench_loader(name: str):
    def load(path: Path) -> LoadResult:
        out = Collector(name)
        for index, loc, obj in array_records(path):
            f = Fields(obj, loc)
            prompt = prompt_from_fields(f) if f.has("orig_instruction") else parse_absolute_prompt(f)
            label = "gpt4_score" if f.has("gpt4_score") or not f.has("orig_score") else "orig_score"
            out.point(
                f.loc,
                id=f"{name}:{index}",
                question=prompt.question, answer=prompt.answer, reference=prompt.reference,
                rubric=prompt.rubric, score=f.number(label), scale=SCALE,
                meta={**prompt.meta(), "label_field": label, "feedback": f.obj.get("orig_feedback")},
            )
        return out.result()

    return load


for _name, _file, _what in (
    ("prometheus-mtbench", "mt_bench_eval.json", "80 MT-Bench questions x 4 models"),
    ("prometheus-vicuna", "vicuna_eval.json", "80 Vicuna-bench questions x 4 models"),
):
    SOURCES.register(_name, Source(
        name=_name, arity="point", role="test", default_path=f"prometheus/eval/benchmark/data/{_file}",
        loader=_bench_loader(_name), license=_LICENSE,
        description=f"Prometheus absolute grading, {_what}; label = mean of 3 GPT-4 1-5 scores",
        tags=("gpt-4",),
    ))

for _name, _file, _what in (
    ("prometheus-ind", "feedback_collection_test.json", "seen rubrics"),
    ("prometheus-ood", "feedback_collection_ood_test.json", "unseen rubrics"),
):
    SOURCES.register(_name, Source(
        name=_name, arity="point", role="test", default_path=f"prometheus/eval/benchmark/data/{_file}",
        loader=_feedback_bench_loader(_name), license="see HF prometheus-eval/Feedback-Bench",
        description=f"Feedback Bench ({_what}): 1-5 rubric scores by GPT-4", tags=("gpt-4",),
    ))


def build_feedback_collection(row: Row, options: ReadOptions, labelled: bool) -> dict:
    """A row of the Feedback Collection (HF prometheus-eval/Feedback-Collection, Prometheus' training set) or of
    Feedback Bench, as a user's data: read as the Feedback Bench loader reads its records, labelled by orig_score."""
    f = Fields(dict(row.values), row.loc)
    prompt = prompt_from_fields(f) if f.has("orig_instruction") else parse_absolute_prompt(f)
    out = {"question": prompt.question, "answer": prompt.answer, "reference": prompt.reference,
           "rubric": prompt.rubric, "scale": SCALE, "meta": prompt.meta()}
    if labelled:
        out["score"] = f.number("orig_score")
    if row.has("id"):
        out["id"] = str(row.raw("id"))
    return out


FORMATS.register("feedback-collection", Format(
    "feedback-collection", "point", -1, ("orig_instruction", "orig_response"), ("orig_score",),
    build_feedback_collection,
    description="Prometheus' Feedback Collection / Feedback Bench rows (orig_instruction, orig_response, "
                "orig_reference_answer, orig_criteria, orig_score1..5_description, orig_score 1-5)"))
