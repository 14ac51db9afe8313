"""Splits are grouped by normalized question and deterministic; decontamination counts per evaluation set."""
from __future__ import annotations

import numpy as np
import pytest

from clfjudge.data.records import PairRecord, PointRecord, Verdict
from clfjudge.data.sources import load
from clfjudge.data.splits import (
    decontaminate,
    group_ids,
    group_kfold,
    line_set_key,
    normalize_instruction,
    question_overlaps,
    train_dev_split,
)

VERDICTS = [Verdict.A, Verdict.B, Verdict.TIE]


def pairs(n_questions: int = 40, per_question: int = 3) -> list[PairRecord]:
    """Each question appears ``per_question`` times, spelled with other case, spacing and end punctuation."""
    spellings = ["{q}", "  {Q}!", "{q}?\n"]
    return [
        PairRecord(id=f"u:{i}:{j}",
                   question=spellings[j % 3].format(q=f"question number {i}", Q=f"QUESTION  number {i}"),
                   answer_a="a", answer_b="b", verdict=VERDICTS[(i + j) % 3], source="unit")
        for i in range(n_questions) for j in range(per_question)
    ]


def questions_of(records, idx) -> set[str]:
    return {normalize_instruction(records[i].question) for i in idx}


def test_normalize_instruction():
    assert normalize_instruction("  What is\tthe  Capital?!\n") == "what is the capital"
    assert normalize_instruction("«Hello», world.") == "hello», world"
    assert normalize_instruction("...") == ""
    assert normalize_instruction("C++") == "c++"  # '+' is a symbol, not punctuation


def test_line_set_key_ignores_line_order_and_blank_lines():
    assert line_set_key("Rewrite the sentence.\n\nI has a cat") == line_set_key("i has a cat\nRewrite the sentence")
    assert line_set_key("a b") != line_set_key("a\nb")


def test_group_ids():
    ids = group_ids(pairs(3, 3))
    assert list(ids) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_group_kfold_is_grouped_complete_and_deterministic():
    records = pairs()
    folds = group_kfold(records, k=5, seed=13)
    assert len(folds) == 5
    test_union = np.concatenate([test for _, test in folds])
    assert sorted(test_union) == list(range(len(records)))
    for train, test in folds:
        assert not questions_of(records, train) & questions_of(records, test)
        assert {records[i].verdict for i in test} == set(VERDICTS)  # stratified
    again = group_kfold(records, k=5, seed=13)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(folds, again))
    other = group_kfold(records, k=5, seed=14)
    assert any(not np.array_equal(a[1], b[1]) for a, b in zip(folds, other))


def test_group_kfold_points_and_unlabelled():
    points = [PointRecord(id=f"p{i}", question=f"q{i % 10}", answer="x", score=1 + i % 5, source="unit")
              for i in range(50)]
    for train, test in group_kfold(points, k=5, seed=0):
        assert not questions_of(points, train) & questions_of(points, test)
    unlabelled = [PairRecord(id=f"n{i}", question=f"q{i % 8}", answer_a="a", answer_b="b", source="unit")
                  for i in range(24)]
    folds = group_kfold(unlabelled, k=4, seed=0)
    assert sorted(np.concatenate([t for _, t in folds])) == list(range(24))
    with pytest.raises(ValueError, match="k >= 2"):
        group_kfold(unlabelled, k=1, seed=0)


def test_train_dev_split_grouped_and_deterministic():
    records = pairs(50, 2)
    train, dev = train_dev_split(records, dev_fraction=0.2, seed=3)
    assert sorted(np.concatenate([train, dev])) == list(range(len(records)))
    assert not questions_of(records, train) & questions_of(records, dev)
    assert len(questions_of(records, dev)) == 10  # 20% of the 50 questions
    again = train_dev_split(records, dev_fraction=0.2, seed=3)
    assert np.array_equal(train, again[0]) and np.array_equal(dev, again[1])
    with pytest.raises(ValueError):
        train_dev_split(records, dev_fraction=1.0, seed=3)


def _pair(rid: str, question: str, source: str = "train") -> PairRecord:
    return PairRecord(id=rid, question=question, answer_a="a", answer_b="b", verdict=Verdict.A, source=source)


def test_decontaminate_counts_per_eval_set():
    train = [_pair("t0", "Name the capital of France."), _pair("t1", "name the CAPITAL of france"),
             _pair("t2", "Rewrite it.\n\nThe cat are here"), _pair("t3", "Something unrelated"),
             _pair("t4", "Shared by both sets")]
    evals = {"e1": [_pair("e1:0", "Name the capital of France?", "e1"), _pair("e1:1", "shared by both sets", "e1")],
             "e2": [_pair("e2:0", "The cat are here\nRewrite it", "e2"), _pair("e2:1", "Shared by both sets!", "e2")],
             "e3": [_pair("e3:0", "never seen", "e3")]}
    kept, removed, report = decontaminate(train, evals)
    assert [r.id for r in kept] == ["t3"] and removed == 4
    assert report == {"e1": 3, "e2": 2, "e3": 0}
    # records instead of a mapping: grouped by their source
    _, removed, report = decontaminate(train, [r for rs in evals.values() for r in rs])
    assert (removed, report) == (4, {"e1": 3, "e2": 2, "e3": 0})


# ---------------------------------------------------------------------------------------------------------
# real data


def test_real_group_kfold_on_pandalm():
    records = load("pandalm-test").records
    folds = group_kfold(records, k=5, seed=0)
    assert len(np.unique(group_ids(records))) == 170
    for train, test in folds:
        assert not questions_of(records, train) & questions_of(records, test)


def test_real_overlaps_between_sources():
    named = {name: load(name).records for name in
             ("alpacaeval-gpt4", "pandalm-test", "autoj-test", "prometheus-vicuna", "llmbar-faireval",
              "llmeval2", "llmbar-llmeval2", "autoj-single-train")}
    overlaps = question_overlaps(named)
    assert overlaps[("alpacaeval-gpt4", "prometheus-vicuna")] == (80, 80)  # all 80 Vicuna-bench questions
    assert overlaps[("alpacaeval-gpt4", "llmbar-faireval")] == (66, 66)
    assert overlaps[("alpacaeval-gpt4", "pandalm-test")] == (29, 168)  # 168 of 170 with parts reordered
    assert overlaps[("alpacaeval-gpt4", "autoj-test")] == (11, 11)
    assert overlaps[("autoj-single-train", "autoj-test")] == (62, 62)
    assert overlaps[("llmeval2", "llmbar-llmeval2")] == (66, 66)  # LLMBar prefixed the other 134 queries
    assert ("llmeval2", "pandalm-test") not in overlaps


def test_real_decontamination_of_alpacaeval():
    evals = {name: load(name).records
             for name in ("pandalm-test", "autoj-test", "prometheus-vicuna", "llmbar-faireval")}
    train = load("alpacaeval-gpt4").records
    kept, removed, report = decontaminate(train, evals)
    assert report == {"autoj-test": 286, "llmbar-faireval": 1711, "pandalm-test": 4360, "prometheus-vicuna": 2075}
    assert removed == len(train) - len(kept) == 6487  # FairEval questions are Vicuna-bench questions
