"""Released-judge output parsers: real-looking outputs, garbage, the opt-in study fallback, and real Auto-J outputs."""
from __future__ import annotations

import json

import pytest

from clfjudge.data.records import Verdict
from clfjudge.paths import data_root
from clfjudge.prompts.parsers import PARSERS, parse_all

A, B, TIE = Verdict.A, Verdict.B, Verdict.TIE

# (parser, output, expected value, expected score pair or None)
GOOD = [
    ("judgelm-pair", "8 9\nAssistant 1 gave a correct but brief answer, Assistant 2 ...", B, (8.0, 9.0)),
    ("judgelm-pair", "7,5\nBoth answers ...", A, (7.0, 5.0)),
    ("judgelm-pair", "6, 6\nEqual.", TIE, (6.0, 6.0)),
    ("judgelm-pair", "9.5  7\nextra spaces are tolerated", A, (9.5, 7.0)),
    ("judgelm-point", "7\nThe answer is mostly correct.", 7.0, None),
    ("judgelm-point", " 8.5 \nfine", 8.5, None),
    ("pandalm-pair", "2\n\n### Reason: Response 2 follows the instruction.\n\n### Reference: ...", B, None),
    ("pandalm-pair", "1\n### Reason: ...", A, None),
    ("pandalm-pair", "Tie\n\n### Reason: Both are fine.", TIE, None),
    ("pandalm-point", "4\n### Reason: good", 4.0, None),
    ("pandalm-point", "10\n### Reason: perfect", 10.0, None),
    ("autoj-pair", "1. The key factors ... Response 1 is better.\n\nSo, the final decision is Response 2. ", B, None),
    ("autoj-pair", "... So, the final decision is Response 1.", A, None),
    ("autoj-pair", "The final decision is response 2 at first, but so, the final decision is Tie.", TIE, None),
    ("autoj-point", "The response is accurate ...\n\nRating: [[6]]", 6.0, None),
    ("autoj-point", "Rating: [[2]] at first; after revision: Rating: [[7.5]]", 7.5, None),
    ("prometheus-point", "Feedback: The response addresses the rubric well ... [RESULT] 4", 4.0, None),
    ("prometheus-point", "Feedback: weak. [RESULT] 1\n", 1.0, None),
    ("prometheus-pair", "Feedback: Response 1 is more complete ... [RESULT] 4 2", A, (4.0, 2.0)),
    ("prometheus-pair", "Feedback: ... [RESULT] 3, 5.", B, (3.0, 5.0)),
    ("prometheus-pair", "Feedback: ... [RESULT] 3\n3", TIE, (3.0, 3.0)),
    ("prometheus2-pair", "Feedback: Response A covers every point ... [RESULT] A", A, None),
    ("prometheus2-pair", "Feedback: ... [RESULT] B\n", B, None),
]

GARBAGE = [
    ("judgelm-pair", "Assistant 1: 8, Assistant 2: 9"),
    ("judgelm-pair", "8\nonly one score"),
    ("judgelm-pair", "nan 3\n"),
    ("judgelm-point", "The score is 7"),
    ("judgelm-point", ""),
    ("pandalm-pair", "Response 1 is better"),
    ("pandalm-pair", "tie\n"),  # PandaLM writes "Tie"; the repo compares exactly
    ("pandalm-point", "11\n"),
    ("pandalm-point", "4.5\n"),
    ("autoj-pair", "Response 1 is clearly better."),
    ("autoj-pair", "So, the final decision is neither."),
    ("autoj-point", "Rating: 7"),
    ("autoj-point", "Rating: [[7"),
    ("autoj-point", "Rating: [[seven]]"),
    ("prometheus-point", "Feedback: good. So the overall score is 4"),
    ("prometheus-point", "Feedback: good. [RESULT] 6"),
    ("prometheus-point", "Feedback: good. [RESULT] 4.5"),
    ("prometheus-pair", "Feedback: ... [RESULT] 4"),
    ("prometheus-pair", "Feedback: ... [RESULT] A B"),
    ("prometheus2-pair", "Feedback: ... [RESULT] C"),
    ("prometheus2-pair", "Feedback: ... [RESULT] Both"),
    ("prometheus2-pair", "Response A is better"),
]

# The study repo's defaults for failed parses (src/build_prompt_judge.py).
STUDY_DEFAULTS = {"judgelm-pair": TIE, "judgelm-point": 5.0, "pandalm-pair": TIE, "pandalm-point": 3.0,
                  "autoj-pair": TIE, "autoj-point": 0.0, "prometheus-point": 1.0, "prometheus-pair": TIE}


def test_registry_holds_every_parser_with_its_arity():
    assert set(PARSERS.names()) == set(STUDY_DEFAULTS) | {"prometheus2-pair"}
    for name, parser in PARSERS.items():
        assert parser.arity == name.rsplit("-", 1)[1]


@pytest.mark.parametrize("name,text,value,scores", GOOD)
def test_parses_real_looking_outputs(name, text, value, scores):
    parsed = PARSERS.get(name)(text)
    assert parsed.ok and not parsed.fallback and parsed.reason is None
    assert parsed.value == value and parsed.scores == scores and parsed.raw == text
    assert (parsed.verdict if isinstance(value, Verdict) else parsed.score) == value


@pytest.mark.parametrize("name,text", GARBAGE)
def test_garbage_is_a_failure_not_a_default(name, text):
    parsed = PARSERS.get(name)(text)
    assert not parsed.ok and parsed.value is None and parsed.scores is None and not parsed.fallback
    assert parsed.reason and parsed.raw == text


@pytest.mark.parametrize("name,text", GARBAGE)
def test_study_fallback_is_opt_in_and_still_a_failure(name, text):
    parsed = PARSERS.get(name)(text, study_fallback=True)
    assert not parsed.ok and parsed.reason
    if name in STUDY_DEFAULTS:
        assert parsed.fallback and parsed.value == STUDY_DEFAULTS[name]
    else:  # the study has no default for Prometheus 2 outputs: nothing to fall back to
        assert not parsed.fallback and parsed.value is None


def test_fallback_does_not_touch_successful_parses():
    parsed = PARSERS.get("judgelm-pair")("3 8\nwhy", study_fallback=True)
    assert parsed.ok and not parsed.fallback and parsed.value is B


def test_parse_stats_count_successes_failures_and_fallbacks():
    outputs = ["2\nreason", "1\n", "Tie", "garbage", "Response 2"]
    parsed, stats = parse_all("pandalm-pair", outputs)
    assert [p.value for p in parsed] == [B, A, TIE, None, None]
    parse_all("pandalm-pair", ["nope"], study_fallback=True, stats=stats)
    parse_all("autoj-point", ["Rating: [[9]]"], stats=stats)
    assert stats.to_dict() == {
        "autoj-point": {"total": 1, "ok": 1, "failed": 0, "fallback": 0, "failure_rate": 0.0},
        "pandalm-pair": {"total": 6, "ok": 3, "failed": 3, "fallback": 1, "failure_rate": 0.5},
    }


def test_unknown_parser_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown parser 'gpt4'.*judgelm-pair"):
        parse_all("gpt4", ["x"])


# ---------------------------------------------------------------------------------------------------
# real outputs

AUTOJ = data_root() / "auto-j" / "data"


def test_autoj_rating_parser_on_the_gpt4_training_critiques():
    """Auto-J's pointwise training targets end with "Rating: [[x]]" and carry the rating separately."""
    rows = [json.loads(line) for line in (AUTOJ / "training" / "single_traindata.jsonl").open(encoding="utf-8")]
    parsed, stats = parse_all("autoj-point", [r["target_output"] for r in rows])
    assert stats.to_dict()["autoj-point"]["failed"] == 0 and len(rows) == 960
    assert [p.score for p in parsed] == [float(r["pred_score"]) for r in rows]


def test_autoj_rating_parser_on_autoj_13b_critiques():
    """Auto-J-13B's own critiques: almost all end with a rating; the ones that do not are counted failures."""
    rows = [json.loads(line) for line in (AUTOJ / "outputs" / "critique_example_output.jsonl").open(encoding="utf-8")]
    parsed, stats = parse_all("autoj-point", [r["output"] for r in rows])
    counts = stats.to_dict()["autoj-point"]
    assert counts["total"] == len(rows) == 232
    assert counts["failed"] == sum("Rating: [[" not in r["output"] for r in rows) >= 1
    assert all(1.0 <= p.score <= 10.0 for p in parsed if p.ok)
