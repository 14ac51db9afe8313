"""The fine-tuned verdict student (``clfjudge distill LABELS`` with ``head: verdict`` and ``verdict.lora``) on a tiny
random chat LLaMA: a teacher whose rule is known (an answer that names an apple is right) labels a pool; the
student's own verdict moves toward the teacher's (its loss falls, it agrees with the teacher on the training pairs
more often than the same model untrained), and the result is a verdict judge that loads, scores and exports like a
zero-shot one, whose card carries the labels' provenance. Bad options are refused in one line before any model is
read."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from clfjudge import testing
from clfjudge.cli import main
from clfjudge.judges.base import Judge
from clfjudge.judges.verdict import VerdictJudge, questions_from, verdict_card
from clfjudge.training.labels import PROVENANCE, LabelSet
from clfjudge.training.verdict_student import MODEL_DIR

WORDS = "river stone cloud green music paper light north window garden silver".split()
# a short question keeps the tiny model's prompts short (the shipped ones hold a system turn and instructions)
QUESTION = {"name": "ok", "user": "{question}\n{answer}\nOk?", "positive": ["Yes", "yes"], "negative": ["No", "no"]}
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"]}


def rule(self, records) -> np.ndarray:
    """The teacher: an answer that names an apple is right (log-odds +2), any other wrong (-2)."""
    return np.array([[2.0 if "apple" in r.answer else -2.0] * len(self.questions) for r in records])


def pool(path: Path, n: int) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for i in range(n):
        good = " ".join(rng.choices(WORDS, k=rng.randint(2, 6)) + ["apple"])
        bad = " ".join(rng.choices(WORDS, k=rng.randint(2, 7)))
        a, b = (good, bad) if rng.random() < 0.5 else (bad, good)
        rows.append({"question": f"Question {i} about {rng.choice(WORDS)}?", "answer_a": a, "answer_b": b})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return testing.tiny_llama(tmp_path_factory.mktemp("chat-llama"), chat=True)


@pytest.fixture(scope="module")
def labels(chat_model, tmp_path_factory):
    """A label directory of ``clfjudge label``: a verdict teacher on the tiny model whose reading is the rule."""
    from clfjudge.judges.verdict import VerdictReader

    root = tmp_path_factory.mktemp("labels")
    teacher = root / "teacher"
    teacher.mkdir()
    verdict_card(str(chat_model), questions_from([QUESTION], "t"), precision="fp32",
                 max_question_tokens=32, max_answer_tokens=24).save(teacher)
    rows = pool(root / "pool.jsonl", 24)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(VerdictReader, "log_odds", rule)
        assert main(["label", str(teacher), "--pool", str(root / "pool.jsonl"), "--out", str(root / "labels"),
                     "--pairs", "24"]) == 0
    return root / "labels", rows


def recipe(path: Path, model, **verdict) -> Path:
    path.write_text(yaml.safe_dump({"backbone": str(model), "head": "verdict", "lr": 1e-2, "epochs": 6,
                                    "batch_size": 8, "warmup_ratio": 0.0, "logging_steps": 1, "seed": 0,
                                    "verdict": {"precision": "fp32", **verdict}}))
    return path


@pytest.fixture(scope="module")
def student(chat_model, labels, tmp_path_factory):
    root = tmp_path_factory.mktemp("student")
    assert main(["distill", str(labels[0]), "--recipe", str(recipe(root / "r.yaml", chat_model, lora=LORA)),
                 "--out", str(root / "out"), "--holdout", "0.25"]) == 0
    return root / "out"


def agreement(judge: Judge, rows: list[dict], teacher: np.ndarray) -> float:
    mine = np.array([c.p_a for c in judge.compare_batch(rows)])
    return float(np.mean((mine > 0.5) == (teacher > 0.5)))


def test_the_students_verdict_moves_toward_the_teachers(chat_model, labels, student, tmp_path):
    directory, rows = labels
    report = json.loads((student / "distill_report.json").read_text())
    judge = Judge.load(student / "student")
    assert isinstance(judge, VerdictJudge) and judge.card.backbone == MODEL_DIR
    assert (student / "student" / MODEL_DIR / "config.json").is_file()
    fine_tuned = judge.card.training["fine_tuned"]
    losses = [h["loss"] for h in fine_tuned["log_history"] if "loss" in h]
    assert fine_tuned["steps"] == len(losses) == 6 * 3  # 18 training pairs: 3 batches an epoch
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])
    assert fine_tuned["pairs_with_rewards"] == fine_tuned["pairs"] == report["student_train_pairs"]
    # the same model untrained: the zero-shot verdict judge of the backbone, asked the same question
    untrained_dir = tmp_path / "untrained"
    untrained_dir.mkdir()
    verdict_card(str(chat_model), questions_from([QUESTION], "t"), precision="fp32",
                 max_question_tokens=32, max_answer_tokens=24).save(untrained_dir)
    labelled = LabelSet(directory)
    teacher = np.array([labelled.p_a(r["question"], r["answer_a"], r["answer_b"]) for r in rows])
    before, after = agreement(Judge.load(untrained_dir), rows, teacher), agreement(judge, rows, teacher)
    assert after >= 0.75 and after > before + 0.2, (before, after)
    # the teacher's question and budgets, its labels' provenance
    assert judge.reader.questions[0].name == "ok" and judge.reader.budgets == {"question": 32, "answer": 24}
    provenance = judge.card.training["distilled_from"]["labels"]
    assert provenance["teacher"]["card_hash"] == json.loads((directory / PROVENANCE).read_text())["teacher"][
        "card_hash"]
    score = judge.score("Question 0 about river?", "green apple").value
    assert np.isfinite(score)


def test_the_student_exports_like_a_zero_shot_verdict_judge(student, tmp_path):
    from clfjudge.export.parity import ParityConfig

    assert main(["export", str(student / "student"), "--out", str(tmp_path / "onnx"), "--n", "4",
                 "--threshold", "int4.min_agreement=0", "--threshold", "int4.max_metric_delta=1"]) == 0
    torch_judge, onnx_judge = Judge.load(student / "student"), Judge.load(tmp_path / "onnx", provider="cpu")
    items = [{"question": "Question 3 about paper?", "answer": a} for a in ("stone apple", "north window", "x")]
    got, want = ([s.value for s in j.score_batch(items)] for j in (onnx_judge, torch_judge))
    assert np.abs(np.array(got) - np.array(want)).max() <= ParityConfig.load().for_precision("fp32").max_abs_diff


@pytest.mark.parametrize(("verdict", "message"), [
    ({}, "give verdict.lora"),
    ({"lora": {"r": 0}}, "verdict.lora.r: expected a positive integer, got 0"),
    ({"lora": {"rank": 8}}, "verdict.lora: unknown option(s) ['rank']"),
    ({"lora": {"target_modules": ["lm_head"]}}, "'lm_head' is the output layer"),
    ({"lora": {"dropout": 1.5}}, "verdict.lora.dropout: expected a number in [0, 1)"),
    ({"lora": {}, "pointwise_weight": -1}, "verdict.pointwise_weight: expected a number >= 0"),
    ({"lora": {}, "questions": ["better"]}, "'better' is pairwise"),
    ({"lora": {}, "questions": ["correct", "harmless"]}, "learns one question"),
])
def test_bad_options_are_refused_in_one_line(chat_model, labels, tmp_path, capsys, verdict, message):
    path = recipe(tmp_path / "bad.yaml", chat_model, **verdict)
    assert main(["distill", str(labels[0]), "--recipe", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and str(path) in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / "student").exists()


def test_clfjudge_train_refuses_a_lora_option(chat_model, tmp_path, capsys):
    path = recipe(tmp_path / "zero-shot.yaml", chat_model, lora=LORA)
    assert main(["train", "--recipe", str(path), "--set", f"output_dir={tmp_path / 'judge'}"]) == 2
    assert "clfjudge distill" in capsys.readouterr().err


def test_the_shipped_student_recipe_parses_against_the_committed_labels():
    from clfjudge.training.config import TrainConfig
    from clfjudge.training.verdict_config import LoraOptions
    from clfjudge.training.verdict_student import peft_config, student_question

    cfg = TrainConfig.from_yaml("train/cpu/student-verdict-lora-smollm2.yaml", [])
    assert cfg.head == "verdict" and cfg.backbone == "smollm2" and cfg.gradient_checkpointing
    assert cfg.verdict.lora == LoraOptions(r=16, alpha=32, dropout=0.05, target_modules=["all-linear"])
    assert peft_config(cfg.verdict.lora).target_modules == "all-linear"  # peft's name for every linear layer
    teacher = json.loads(Path("train/labels/verdict-qwen1.5b/provenance.json").read_text())["teacher"]
    question = student_question(cfg.verdict, teacher["card"], "recipe")
    assert question.to_dict() == teacher["card"]["runtime"]["questions"][0]
