"""clfjudge distill: a teacher whose rule is known (the shorter answer wins, the opposite of what length teaches) is
learnt by a student that has never seen a gold label; the teacher's labels are read once and reused."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import yaml

from clfjudge import testing
from clfjudge.cli import main
from clfjudge.data.records import CLASS_OF_VERDICT, PairRecord, Verdict
from clfjudge.judges.base import Judge
from clfjudge.judges.embedding import SOFT_TARGET, soft_rows
from clfjudge.judges.verdict import questions_from, verdict_card
from clfjudge.training.distill import TEACHER_LABELS

WORDS = "apple river stone cloud green music paper light north window garden silver".split()


def pairs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        short, long_ = rng.randint(1, 4), rng.randint(8, 20)
        a, b = (" ".join(rng.choices(WORDS, k=k)) for k in (short, long_))
        if rng.random() < 0.5:
            a, b = b, a
        out.append({"question": f"Question {i} about {rng.choice(WORDS)} {seed}?", "answer_a": a, "answer_b": b})
    return out


def shorter_wins(row: dict) -> float:
    return 0.9 if len(row["answer_a"]) < len(row["answer_b"]) else 0.1


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_soft_targets_are_weighted_rows():
    records = [PairRecord(id="1", question="q", answer_a="a", answer_b="b", verdict=Verdict.A,
                          meta={SOFT_TARGET: 0.8})]
    x = np.array([[1.0], [-1.0]])  # the pair, then the swapped pair
    x2, y, groups, w = soft_rows(records, x, np.array([0, 0]), None)
    a, b = CLASS_OF_VERDICT[Verdict.A], CLASS_OF_VERDICT[Verdict.B]
    assert x2.shape == (4, 1) and list(y) == [a, a, b, b] and list(groups) == [0, 0, 0, 0]
    assert w == pytest.approx([0.8, 0.2, 0.2, 0.8])  # swapped: A wins with 1 - 0.8


@pytest.fixture(scope="module")
def student_recipe(tiny_llama_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("student") / "student.yaml"
    path.write_text(yaml.safe_dump({"backbone": str(tiny_llama_dir), "head": "embedding",
                                    "embedding": {"features": [], "use_length": True, "layer": 1,
                                                  "head_params": {"C": 1.0}}}))
    return path


def test_the_student_learns_the_teachers_rule(student_recipe, tmp_path):
    pool = pairs(160, seed=1)
    held = pairs(40, seed=2)
    labelled = [{**p, "winner": "A" if shorter_wins(p) > 0.5 else "B"} for p in held]
    predictions = write_jsonl(tmp_path / "teacher.jsonl", [{**p, "p_a": shorter_wins(p)} for p in pool + held])
    pool_file = write_jsonl(tmp_path / "pool.jsonl", pool)  # unlabelled: the teacher labels it
    eval_file = write_jsonl(tmp_path / "eval.jsonl", labelled)
    out = tmp_path / "out"
    assert main(["distill", str(predictions), "--pool", str(pool_file), "--config", str(student_recipe),
                 "--out", str(out), "--eval", str(eval_file)]) == 0
    report = json.loads((out / "distill_report.json").read_text())
    assert report["pool_pairs"] == 160 and report["holdout_pairs"] > 0
    assert report["agreement_holdout"]["decision_agreement"] >= 0.95
    scored = report["evals"][str(eval_file)]
    assert scored["teacher"] == 100.0 and scored["student"] >= 95.0 and scored["longer"] == 0.0
    student = Judge.load(out / "student")
    assert student.compare("Which?", "paper", "green river stone cloud music paper light north").verdict is Verdict.A
    assert student.card.training["distilled_from"]["soft_targets"] == TEACHER_LABELS
    assert (out / "distill_report.md").read_text().startswith("# Distillation of predictions file")


def test_a_judge_teaches_once(student_recipe, tmp_path):
    """A judge directory as the teacher: its labels are cached and a second student reads none again."""
    model = testing.tiny_llama(tmp_path / "chat", chat=True)
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    verdict_card(str(model), questions_from(["correct"], "t"), precision="fp32").save(teacher)
    pool_file = write_jsonl(tmp_path / "pool.jsonl", pairs(24, seed=3))
    out = tmp_path / "out"
    args = ["distill", str(teacher), "--pool", str(pool_file), "--config", str(student_recipe), "--out", str(out),
            "--holdout", "0.25"]
    assert main(args) == 0
    cache = (out / TEACHER_LABELS).read_text().splitlines()
    assert len(cache) == 24 and all(0 <= json.loads(line)["p_a"] <= 1 for line in cache)
    assert main(args) == 0
    assert (out / TEACHER_LABELS).read_text().splitlines() == cache  # nothing labelled again


def test_bad_predictions_are_refused_with_file_and_line(student_recipe, tmp_path):
    bad = tmp_path / "teacher.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer_a": "a", "answer_b": "b", "p_a": 1.5}) + "\n")
    pool = write_jsonl(tmp_path / "pool.jsonl", [{"question": "q", "answer_a": "a", "answer_b": "b"}])
    assert main(["distill", str(bad), "--pool", str(pool), "--config", str(student_recipe),
                 "--out", str(tmp_path / "o")]) == 2


def test_a_second_teacher_does_not_reuse_the_first_ones_labels(student_recipe, tmp_path):
    pool = pairs(40, seed=5)
    pool_file = write_jsonl(tmp_path / "pool.jsonl", pool)
    shorter = write_jsonl(tmp_path / "shorter.jsonl", [{**p, "p_a": shorter_wins(p)} for p in pool])
    longer = write_jsonl(tmp_path / "longer.jsonl", [{**p, "p_a": 1 - shorter_wins(p)} for p in pool])
    out = tmp_path / "out"
    for teacher in (shorter, longer):
        assert main(["distill", str(teacher), "--pool", str(pool_file), "--config", str(student_recipe),
                     "--out", str(out), "--holdout", "0.2"]) == 0
    report = json.loads((out / "distill_report.json").read_text())
    assert report["teacher"] == f"predictions file {longer}"
    rows = [json.loads(line) for line in (out / TEACHER_LABELS).read_text().splitlines()]
    assert len(rows) == 80 and {r["teacher"] for r in rows} == {f"predictions file {t}" for t in (shorter, longer)}
    student = Judge.load(out / "student")  # learnt the second teacher's rule: the longer answer wins
    assert student.compare("Which?", "paper", "green river stone cloud music paper light north").verdict is Verdict.B


def test_a_pool_inside_the_output_is_refused_before_anything_is_written(student_recipe, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    pool = [{**p, "p_a": shorter_wins(p)} for p in pairs(8, seed=6)]
    inside = write_jsonl(out / "distill_report.json", pool)
    before = inside.read_bytes()
    assert main(["distill", str(inside), "--pool", str(inside), "--config", str(student_recipe),
                 "--out", str(out)]) == 2
    assert "same file" in capsys.readouterr().err and inside.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["distill_report.json"]
