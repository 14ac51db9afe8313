"""Schemes: every scheme renders the records of its arity with no leftover slot, golden texts, targets, transforms."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from clfjudge.data.records import PairRecord, PointRecord, RecordError, Verdict
from clfjudge.paths import data_root
from clfjudge.prompts.schemes import (
    SCHEMES,
    RenderError,
    load_schemes,
    pair_to_points,
    point_to_pair,
    points_to_verdict,
    render,
    target,
)

DEFAULT_RUBRIC = "Please rate the helpfulness, relevance, accuracy, level of details of the response."
PLACEHOLDER = re.compile(r"\{(question|answer_a|answer_b|answer|rubric|reference|sep|prompt)\}")

PAIR = PairRecord(id="p1", question="What is the capital of France?", answer_a="Paris.",
                  answer_b="It is Lyon.", verdict=Verdict.A, scores=(9.0, 3.0), source="unit")
POINT = PointRecord(id="q1", question="Name a prime number.", answer="Four.", score=2.0, source="unit")
EXTRAS = {"rubric": "[Is the answer correct?]\nScore 1: wrong\nScore 5: right", "reference": "Seven."}


def _variants(record):
    """The record bare, with a rubric, with a reference, and with both."""
    return [record, replace(record, rubric=EXTRAS["rubric"]), replace(record, reference=EXTRAS["reference"]),
            replace(record, **EXTRAS)]


EXPECTED = {
    "pair": ["autoj-pair", "decoder-pair", "decoder-pair-gen", "encoder-pair", "judgelm-pair", "pandalm-pair",
             "prometheus-pair"],
    "point": ["autoj-point", "decoder-answer", "decoder-point", "decoder-point-gen", "encoder-answer",
              "encoder-point", "judgelm-point", "pandalm-point", "prometheus-point", "prometheus-v1"],
}


def test_registry_has_the_required_schemes_with_their_arities():
    assert SCHEMES.names() == sorted(EXPECTED["pair"] + EXPECTED["point"])
    for arity, names in EXPECTED.items():
        assert all(SCHEMES.get(n).arity == arity for n in names)


@pytest.mark.parametrize("name", sorted(EXPECTED["pair"] + EXPECTED["point"]))
def test_every_scheme_renders_its_records_without_leftover_slots(name):
    scheme = SCHEMES.get(name)
    base = PAIR if scheme.arity == "pair" else POINT
    for rec in _variants(base):
        if rec.reference is None and name == "prometheus-v1":
            with pytest.raises(RenderError, match="needs field 'reference'"):
                render(rec, name)
            continue
        text = render(rec, name)
        assert not PLACEHOLDER.search(text), text
        for f in scheme.fields:
            if getattr(rec, f) is not None:
                assert getattr(rec, f) in text, (name, f)
        other = POINT if scheme.arity == "pair" else PAIR
        with pytest.raises(RenderError, match=f"shows {scheme.arity} records"):
            render(other, name)


@pytest.mark.parametrize("name", ["judgelm-point", "pandalm-point", "autoj-point", "prometheus-point",
                                  "encoder-pair", "encoder-point", "decoder-pair", "decoder-point"])
def test_missing_rubric_falls_back_to_the_default(name):
    rec = PAIR if SCHEMES.get(name).arity == "pair" else POINT
    assert DEFAULT_RUBRIC in render(rec, name)
    assert DEFAULT_RUBRIC not in render(replace(rec, rubric="Judge brevity."), name)


@pytest.mark.parametrize("name", ["encoder-answer", "decoder-answer"])
def test_answer_schemes_show_a_rubric_only_when_the_record_has_one(name):
    assert DEFAULT_RUBRIC not in render(POINT, name)
    assert "Judge brevity." in render(replace(POINT, rubric="Judge brevity."), name)


# ---------------------------------------------------------------------------------------------------
# golden texts

# Study Fig. 5 and Fig. 7 as the paper digest prints them (line breaks of the PDF included).
FIG5 = """You are a helpful and precise assistant for checking the quality of the answer.
[Question]
{question_body}

[The Start of Assistant 1's Answer]
{answer1_body}

[The End of Assistant 1's Answer]

[The Start of Assistant 2's Answer]
{answer2_body}

[The End of Assistant 2's Answer]

[System]
We would like to request your feedback on the performance of two AI assistants in
response to the user question displayed above.
Please rate the helpfulness, relevance, accuracy, level of details of their responses.
Each assistant receives an overall score on a scale of 1 to 10, where a higher score
indicates better overall performance.
Please first output a single line containing only two values indicating the scores
for Assistant 1 and 2, respectively. The two scores are separated by a space. In the
subsequent line, please provide a comprehensive explanation of your evaluation,
avoiding any potential bias and ensuring that the order in which the responses were
presented does not affect your judgment.

### Response:
"""

FIG7 = """Below are two responses for a given task. The task is defined by the Instruction.
Evaluate the responses and generate a reference answer for the task.

### Instruction:
{question_body}

### Response 1:
{answer1_body}

### Response 2:
{answer2_body}

### Evaluation:
"""


def _normalise(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("name,figure", [("judgelm-pair", FIG5), ("pandalm-pair", FIG7)])
def test_released_pair_templates_match_the_figures(name, figure):
    expected = (figure.replace("{question_body}", PAIR.question).replace("{answer1_body}", PAIR.answer_a)
                .replace("{answer2_body}", PAIR.answer_b))
    assert _normalise(render(PAIR, name)) == _normalise(expected)


def test_study_encoder_and_decoder_inputs_exactly():
    rec = replace(PAIR, reference="Paris is the capital.")
    assert render(rec, "encoder-pair") == (
        f"{DEFAULT_RUBRIC}[SEP]Question: {rec.question}[SEP]Reference Answer: Paris is the capital."
        f"[SEP]Response 1: Paris.[SEP]Response 2: It is Lyon.")
    assert render(rec, "encoder-pair", use_reference=False, sep="</s>") == (
        f"{DEFAULT_RUBRIC}</s>Question: {rec.question}</s>Response 1: Paris.</s>Response 2: It is Lyon.")
    assert render(POINT, "encoder-answer") == "Question: Name a prime number.[SEP]Response: Four."
    head = "[INST]We would like to request your feedback on the response to the user question displayed below.\n"
    assert render(rec, "decoder-pair") == (
        f"{head}{DEFAULT_RUBRIC}\n[Question]\n{rec.question}\n\n[Reference Answer]\nParis is the capital.\n\n"
        "[The Start of Response 1]\nParis.\n\n[The End of Response 1]\n\n"
        "[The Start of Response 2]\nIt is Lyon.\n\n[The End of Response 2]\n\n[/INST]")
    assert render(rec, "decoder-pair-gen", use_reference=False).endswith("[The End of Response 2]\n\n[Feedback]\n")
    assert render(POINT, "decoder-point-gen").endswith("[The End of Response]\n\n[Feedback]\n[/INST]")
    assert render(POINT, "decoder-answer") == (
        f"{head}[Question]\nName a prime number.\n\n[The Start of Response]\nFour.\n\n"
        "[The End of Response]\n\n[/INST]")


def test_chat_wrappers_of_released_llama2_judges():
    assert render(PAIR, "autoj-pair").startswith("[INST] You are assessing two submitted responses")
    assert render(PAIR, "autoj-pair").endswith("comparison you've provided. [/INST]")
    text = render(POINT, "prometheus-point")
    assert text.startswith("[INST] <<SYS>>\nYou are a fair evaluator language model.\n<</SYS>>\n\n"
                           "###Task Description:")
    assert text.endswith("###Feedback: [/INST]")


def test_unknown_parameter_is_rejected():
    with pytest.raises(RenderError, match="no parameter"):
        render(PAIR, "judgelm-pair", sep="|")


def test_braces_in_record_text_stay_literal():
    code = "def f(): return {'answer': '{answer_b}'}"
    assert code in render(replace(PAIR, answer_a=code), "judgelm-pair")
    assert "{answer_b}" in render(replace(PAIR, answer_a=code), "encoder-pair")


PROMETHEUS_PROMPT = re.compile(
    r"###The instruction to evaluate:\n(.*)\n\n###Response to evaluate:\n(.*)\n\n"
    r"###Reference Answer \(Score 5\):\n(.*)\n\n###Score Rubrics:\n(.*)\n\n###Feedback: \Z", re.S)


def test_prometheus_v1_reproduces_the_released_benchmark_prompts_byte_for_byte():
    bare = replace(SCHEMES.get("prometheus-v1"), wrap=None)
    n = 0
    for name in ("mt_bench_eval.json", "vicuna_eval.json"):
        rows = json.loads((data_root() / "prometheus/eval/benchmark/data" / name).read_text(encoding="utf-8"))
        for i, row in enumerate(rows):
            question, answer, reference, rubric = PROMETHEUS_PROMPT.search(row["instruction"]).groups()
            rec = PointRecord(id=f"{name}:{i}", question=question, answer=answer, score=None,
                              reference=reference, rubric=rubric)
            assert render(rec, bare) == row["instruction"], rec.id
            n += 1
    assert n == 640


# ---------------------------------------------------------------------------------------------------
# generative targets

TARGETS = {
    "judgelm-pair": "9 3", "pandalm-pair": "1", "autoj-pair": "So, the final decision is Response 1",
    "prometheus-pair": None, "decoder-pair-gen": "1",
    "judgelm-point": "7", "pandalm-point": "7", "autoj-point": "Rating: [[7]]", "decoder-point-gen": "7",
}


@pytest.mark.parametrize("name,expected", sorted(TARGETS.items()))
def test_targets_are_in_the_judges_format_and_parse_back(name, expected):
    if name == "prometheus-pair":
        assert target(replace(PAIR, scores=(4.0, 2.0)), name) == "[RESULT] 4 2"
        return
    rec = PAIR if SCHEMES.get(name).arity == "pair" else replace(POINT, score=7.0, scale=(1.0, 10.0))
    assert target(rec, name) == expected


def test_fractional_scores_are_written_exactly():
    mean_of_three = (3 + 3 + 4) / 3
    assert float(target(replace(POINT, score=mean_of_three), "decoder-point-gen")) == mean_of_three


def test_verdict_targets_cover_ties_and_swaps():
    tie = replace(PAIR, verdict=Verdict.TIE, scores=None)
    assert target(tie, "autoj-pair") == "So, the final decision is Tie"
    assert target(tie, "pandalm-pair") == "Tie"
    assert target(PAIR.swapped(), "autoj-pair") == "So, the final decision is Response 2"
    assert target(PAIR.swapped(), "judgelm-pair") == "3 9"


def test_prometheus_targets_need_integer_scores_on_its_scale():
    assert target(replace(POINT, score=4.0), "prometheus-point") == "[RESULT] 4"
    assert target(replace(POINT, score=5.0, reference="Seven."), "prometheus-v1") == "[RESULT] 5"
    with pytest.raises(RenderError, match="does not parse back"):
        target(replace(POINT, score=3.5), "prometheus-point")
    with pytest.raises(RenderError, match="field 'scale'"):
        target(replace(POINT, score=8.0, scale=(1.0, 10.0)), "prometheus-point")
    with pytest.raises(RenderError, match="outside the scheme's scale"):
        target(PAIR, "prometheus-pair")  # 9 and 3 on a 1-5 prompt


def test_target_errors_name_record_and_field():
    with pytest.raises(RenderError, match=r"record 'p1', scheme 'judgelm-pair': field 'scores'"):
        target(replace(PAIR, scores=None), "judgelm-pair")
    with pytest.raises(RenderError, match="no generative target"):
        target(PAIR, "encoder-pair")


def test_autoj_rating_target_matches_autoj_training_data():
    """The rating in Auto-J's GPT-4 critiques is written exactly as the autoj-point target writes it."""
    path = data_root() / "auto-j/data/training/single_traindata.jsonl"
    for i, line in enumerate(path.open(encoding="utf-8")):
        row = json.loads(line)
        rec = PointRecord(id=str(i), question="q", answer="a", score=float(row["pred_score"]), scale=(1.0, 10.0))
        out = row["target_output"]
        start = out.rfind("Rating: [[")
        assert out[start:out.find("]]", start) + 2] == target(rec, "autoj-point"), i


# ---------------------------------------------------------------------------------------------------
# template files


def _write(tmp_path, body: str):
    path = tmp_path / "bad.yaml"
    path.write_text(body, encoding="utf-8")
    return path


@pytest.mark.parametrize("body,field", [
    ("schemes:\n  s:\n    arity: pair\n    template: '{question} {answer_a} {answer}'\n", "template"),
    ("schemes:\n  s:\n    arity: pair\n    template: '{question} {answer_a}'\n", "template"),
    ("schemes:\n  s:\n    arity: trio\n    template: '{question}'\n", "arity"),
    ("schemes:\n  s:\n    kind: trio\n    template: '{question}'\n", "arity"),
    ("schemes:\n  s:\n    kind: pair\n    arity: pair\n    template: '{question} {answer_a} {answer_b}'\n", "kind"),
    ("schemes:\n  s:\n    arity: point\n    template: '{question} {answer}'\n    parser: nope\n"
     "    target: '{score}'\n", "parser"),
    ("schemes:\n  s:\n    arity: point\n    template: '{question} {answer}'\n    parser: judgelm-pair\n"
     "    target: '{score}'\n", "parser"),
    ("schemes:\n  s:\n    arity: point\n    template: '{question} {answer}'\n    slots:\n      rubric: {}\n",
     "slots.rubric"),
    ("schemes:\n  s:\n    arity: point\n    template: '{question} {answer}'\n    colour: red\n", "colour"),
])
def test_bad_template_files_name_file_line_and_field(tmp_path, body, field):
    path = _write(tmp_path, "# header\n" + body)
    with pytest.raises(RecordError) as err:
        load_schemes(path)
    assert err.value.file == str(path) and err.value.line == 3 and err.value.field == field


def test_a_scheme_file_naming_the_arity_kind_still_loads(tmp_path):
    path = _write(tmp_path, "schemes:\n  s:\n    kind: point\n    template: '{question} {answer}'\n")
    assert [(s.name, s.arity) for s in load_schemes(path)] == [("s", "point")]


def test_invalid_yaml_names_the_line(tmp_path):
    with pytest.raises(RecordError, match=r"(?s)bad\.yaml:\d+: invalid YAML.*line 2, column 6"):
        load_schemes(_write(tmp_path, "schemes:\n  s: [unclosed\n"))


# ---------------------------------------------------------------------------------------------------
# transforms


def test_pair_to_points_grades_each_answer():
    a, b = pair_to_points(PAIR, scale=(1, 10))
    assert (a.answer, a.score, a.scale, a.id) == ("Paris.", 9.0, (1.0, 10.0), "p1:A")
    assert (b.answer, b.score, b.meta["pair_id"], b.meta["position"]) == ("It is Lyon.", 3.0, "p1", "B")
    assert pair_to_points(replace(PAIR, meta={"scale": [1, 10]}))[1].scale == (1.0, 10.0)
    with pytest.raises(RenderError, match="score scale is unknown"):
        pair_to_points(PAIR)
    unscored = pair_to_points(replace(PAIR, scores=None))
    assert [p.score for p in unscored] == [None, None]
    assert render(unscored[0], "encoder-answer") == "Question: What is the capital of France?[SEP]Response: Paris."


def test_points_to_verdict():
    assert points_to_verdict(4, 2) is Verdict.A
    assert points_to_verdict(2, 4.5) is Verdict.B
    assert points_to_verdict(3, 3) is Verdict.TIE
    assert points_to_verdict(None, 3) is None  # a failed grade never becomes a tie


def test_point_to_pair_puts_the_reference_first():
    point = replace(POINT, reference="Seven.", rubric="Is it prime?", scale=(1.0, 5.0))
    pair = point_to_pair(point)
    assert (pair.answer_a, pair.answer_b, pair.reference, pair.rubric) == ("Seven.", "Four.", None, "Is it prime?")
    assert pair.verdict is None and pair.meta["gold_score"] == 2.0 and pair.meta["point_id"] == "q1"
    assert "[The Start of Assistant 1's Answer]\nSeven." in render(pair, "judgelm-pair")
    with pytest.raises(RenderError, match="field 'reference'"):
        point_to_pair(POINT)


@pytest.mark.parametrize("name", sorted(EXPECTED["pair"] + EXPECTED["point"]))
def test_data_that_holds_every_placeholder_is_read_as_text(name):
    """A field is filled once, never read again as a template: with every field holding every placeholder (answer_a
    = "{answer_b}" shows B's text twice if fields are filled one after another), the rendered prompt is the prompt
    of plain marker values with each marker swapped for the field's text."""
    scheme = SCHEMES.get(name)
    every = "".join("{" + p + "}" for p in ("question", "answer_a", "answer_b", "answer", "rubric", "reference",
                                            "sep", "prompt"))
    fields = ("question", "answer_a", "answer_b") if scheme.arity == "pair" else ("question", "answer")
    base = replace(PAIR if scheme.arity == "pair" else POINT, **EXTRAS)
    marked = replace(base, **{f: f"<<{f}>>" for f in (*fields, "rubric", "reference")})
    hostile = replace(base, **{f: f"{f} says {every}" for f in (*fields, "rubric", "reference")})
    expected = render(marked, name)
    for f in (*fields, "rubric", "reference"):
        expected = expected.replace(f"<<{f}>>", f"{f} says {every}")
    assert render(hostile, name) == expected
