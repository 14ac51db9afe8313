"""research/obvious_pairs.py: the hand-written floor set is balanced as it claims, bad rows are named, and the
script scores a judge directory beside the two length rules (a tiny random judge: the script runs, the numbers
of the length rules are exact)."""
from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from clfjudge.data.records import RecordError, Verdict
from tests.tiny_judges import make_judge

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("obvious_pairs", REPO / "research" / "obvious_pairs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_set_is_balanced_by_length_and_order(script):
    records = script.load_pairs()
    assert len(records) == 60 and len({r.question for r in records}) == 60
    balance = Counter((r.meta["worse_is_longer"], r.verdict) for r in records)
    assert balance == {(True, Verdict.A): 15, (True, Verdict.B): 15, (False, Verdict.A): 15, (False, Verdict.B): 15}
    kinds = Counter(r.meta["kind"] for r in records)
    assert {"wrong fact", "wrong calculation", "wrong prime", "off-topic", "refusal"} == set(kinds)
    capital = next(r for r in records if r.question == "What is the capital of France?")
    better = capital.answer_a if capital.verdict is Verdict.A else capital.answer_b
    assert better == "Paris."


def write_pairs(path: Path, **override) -> Path:
    """A good row on line 1, the row under test on line 2."""
    good = {"question": "3 + 3?", "answer_a": "It is 7.", "answer_b": "6.", "winner": "B", "worse_is_longer": True}
    row = {"question": "2 + 2?", "answer_a": "4.", "answer_b": "It is 5, as everyone knows.", "winner": "A",
           "worse_is_longer": True, **override}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize(("override", "field", "message"), [
    ({"worse_is_longer": False}, "worse_is_longer",
     "is false, but the worse answer has 27 characters and the better 2"),
    ({"worse_is_longer": "yes"}, "worse_is_longer", "must be true or false, got 'yes'"),
    ({"winner": "TIE"}, "winner", "must be A or B, got 'TIE'"),
    ({"answer_b": None}, "answer_b", ""),
])
def test_bad_rows_are_named_by_file_line_and_field(script, tmp_path, override, field, message):
    path = write_pairs(tmp_path / "pairs.jsonl", **override)
    with pytest.raises(RecordError) as err:
        script.load_pairs(path)
    assert (err.value.file, err.value.line, err.value.field) == (str(path), 2, field)
    assert message in err.value.message


def test_scores_a_judge_beside_the_length_rules(script, tiny_bert_dir, tmp_path):
    judge = make_judge(tiny_bert_dir, tmp_path / "judge", "cls3")
    assert script.main([str(judge), "--out", str(tmp_path / "results"), "--name", "obvious_test"]) == 0
    (json_path,) = (tmp_path / "results").glob("obvious_test_*.json")
    report = json.loads(json_path.read_text())
    longer, shorter, tiny = report["rows"]
    assert (longer["worse longer"], longer["worse shorter"], longer["accuracy"]) == (0.0, 1.0, 0.5)
    assert (shorter["worse longer"], shorter["worse shorter"], shorter["accuracy"]) == (1.0, 0.0, 0.5)
    assert tiny["name"] == str(judge) and len(tiny["right"]) == 60 and 0.0 <= tiny["mean_p_better"] <= 1.0
    assert tiny["accuracy"] == pytest.approx((tiny["worse longer"] + tiny["worse shorter"]) / 2)
    assert tiny["vs_longer"]["estimate"] == pytest.approx(tiny["accuracy"] - 0.5)
    md = json_path.with_suffix(".md").read_text()
    assert "| longer answer wins | 0.0 | 100.0 | 50.0 |" in md and f"| {judge} |" in md


def test_forced_choice_counts_a_tie_or_nan_as_undecided(script):
    assert script.forced_choice(0.6, 0.3) is Verdict.A and script.forced_choice(0.2, 0.5) is Verdict.B
    assert script.forced_choice(0.4, 0.4) is None and script.forced_choice(float("nan"), float("nan")) is None
