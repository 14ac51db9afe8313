"""The verdict judge on a tiny random chat model: its log-odds against transformers' own forward pass, both question
forms, the card-held prompt, batching, and every door a judge goes through (score, compare, rank, reward function,
HTTP, audit, calibration, training)."""
from __future__ import annotations

import json
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from starlette.testclient import TestClient

from clfjudge import best_of_n, reward_function, testing
from clfjudge.card import JudgeCard
from clfjudge.data.records import Verdict
from clfjudge.judges.base import Judge
from clfjudge.judges.verdict import VerdictQuestion, presets, questions_from, verdict_card, verdict_token_ids
from clfjudge.serving.server import create_app

QUESTION = "Name a prime."


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return testing.tiny_llama(tmp_path_factory.mktemp("chat-llama"), chat=True)


def make(directory, model, questions=("correct",), **kw):
    card = verdict_card(str(model), questions_from(list(questions), "test"), precision="fp32", **kw)
    directory.mkdir(parents=True, exist_ok=True)
    card.save(directory)
    return directory


@pytest.fixture(scope="module")
def point_dir(chat_model, tmp_path_factory):
    return make(tmp_path_factory.mktemp("verdict-point"), chat_model)


@pytest.fixture(scope="module")
def pair_dir(chat_model, tmp_path_factory):
    return make(tmp_path_factory.mktemp("verdict-pair"), chat_model, ("better",))


def reference_log_odds(model_dir, question: VerdictQuestion, fields: dict) -> float:
    """What transformers computes: the chat template, a full forward pass, log-softmax of the last position."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    user = question.user
    for key, value in fields.items():
        user = user.replace("{" + key + "}", value)
    messages = ([{"role": "system", "content": question.system}] if question.system else []) + [
        {"role": "user", "content": user}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        logp = torch.log_softmax(model(**ids).logits[0, -1].double(), -1)
    yes, no = verdict_token_ids(tok, question)
    return float(torch.logsumexp(logp[yes], 0) - torch.logsumexp(logp[no], 0))


def test_shipped_questions_load_and_bad_ones_are_refused():
    shipped = presets()
    assert {"correct", "on-topic", "harmless", "better"} <= set(shipped)
    assert shipped["better"].pairwise and not shipped["correct"].pairwise
    with pytest.raises(ValueError, match="placeholders"):
        VerdictQuestion.from_dict("x", {"user": "Is it right?", "positive": "Yes", "negative": "No"}, "f.yaml")
    with pytest.raises(ValueError, match="unknown keys"):
        VerdictQuestion.from_dict("x", {"user": "{question}{answer}", "positive": "Y", "negative": "N", "yes": 1},
                                  "f.yaml")
    with pytest.raises(ValueError, match="unknown verdict question 'nope'"):
        questions_from(["nope"], "recipe.yaml")
    with pytest.raises(ValueError, match="mix pointwise and pairwise"):
        questions_from(["correct", "better"], "recipe.yaml")


def test_the_readme_says_what_the_reward_is():
    """log of P summed over the shipped question's spellings per side (``reference_log_odds`` below computes it)."""

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").split())
    correct = presets()["correct"]
    assert "log ΣP(yes) − log ΣP(no)" in readme and "log P(Yes) − log P(No)" not in readme
    for side in (correct.positive, correct.negative):
        assert ", ".join(f'"{t}"' for t in side) in readme


def test_pointwise_log_odds_match_transformers(point_dir, chat_model):
    judge = Judge.load(point_dir)
    assert judge.tasks == {"score", "compare"} and judge.position_invariant
    for answer in ("7", "9 is a prime number, since it has no divisors."):
        want = reference_log_odds(chat_model, presets()["correct"], {"question": QUESTION, "answer": answer})
        assert judge.score(QUESTION, answer).value == pytest.approx(want, abs=1e-5)


def test_pairwise_reads_both_orders(pair_dir, chat_model):
    judge = Judge.load(pair_dir)
    assert judge.tasks == {"compare"} and not judge.position_invariant
    better = presets()["better"]
    ab = reference_log_odds(chat_model, better, {"question": QUESTION, "answer_a": "7", "answer_b": "9"})
    ba = reference_log_odds(chat_model, better, {"question": QUESTION, "answer_a": "9", "answer_b": "7"})
    one = judge.compare(QUESTION, "7", "9")
    assert one.margin == pytest.approx(ab, abs=1e-5)
    both = judge.compare(QUESTION, "7", "9", symmetric=True)
    assert both.margin == pytest.approx((ab - ba) / 2, abs=1e-5)
    assert both.p_a == pytest.approx(1 - judge.compare(QUESTION, "9", "7", symmetric=True).p_a, abs=1e-6)


def test_a_released_reader_answers_what_it_read_and_refuses_the_rest(point_dir):
    """The export frees the PyTorch weights once its graphs are written: the readings taken stay, a new one fails."""
    judge = Judge.load(point_dir)
    before = judge.score(QUESTION, "7").value
    embeddings = weakref.ref(judge.reader.modules[0].decoder.get_input_embeddings().weight)
    judge.reader.release()
    assert all(p.device.type == "meta" for m in judge.reader.modules for p in m.parameters())
    assert embeddings() is None  # nothing holds the weights (a tied output layer would keep a mmapped file mapped)
    assert judge.score(QUESTION, "7").value == before
    with pytest.raises(RuntimeError, match="released"):
        judge.score(QUESTION, "9")


def test_the_card_holds_the_prompt(chat_model, tmp_path):
    """A question written in the card (not a shipped one) is what the model is asked."""
    own = {"name": "polite", "user": "Q: {question}\nA: {answer}\nIs that polite?", "positive": ["Yes"],
           "negative": ["No"]}
    make(tmp_path, chat_model, (own,))
    assert JudgeCard.load(tmp_path).runtime["questions"][0]["user"] == own["user"]
    want = reference_log_odds(chat_model, VerdictQuestion.from_dict("polite", own, "t"),
                              {"question": QUESTION, "answer": "7"})
    assert Judge.load(tmp_path).score(QUESTION, "7").value == pytest.approx(want, abs=1e-5)


def test_batches_and_truncation_change_nothing_they_should_not(point_dir, tmp_path):
    judge = Judge.load(point_dir, batch_size=3)
    items = [{"question": f"Question {i}?", "answer": "word " * (5 * i + 1)} for i in range(9)]
    batched = [s.value for s in judge.score_batch(items)]
    judge.reader.memory.clear()
    single = [judge.score_batch([item])[0].value for item in items]
    assert np.max(np.abs(np.array(batched) - single)) < 1e-5
    short = Judge.load(make(tmp_path, JudgeCard.load(point_dir).backbone, max_answer_tokens=8))
    long_answer = "word " * 200
    assert short.score(QUESTION, long_answer).value != pytest.approx(judge.score(QUESTION, long_answer).value)
    assert short.truncation["truncated_texts"] == 1


def test_compare_rank_reward_function_and_best_of_n_agree(point_dir):
    judge = Judge.load(point_dir)
    scores = judge.rank(QUESTION, ["7", "9", "12"])
    c = judge.compare(QUESTION, "7", "9")
    assert c.margin == pytest.approx(scores[0] - scores[1], abs=1e-6)
    rewards = reward_function(str(point_dir))(prompts=[QUESTION] * 3, completions=["7", "9", "12"])
    assert rewards == pytest.approx(scores, abs=1e-6)
    best, got = best_of_n(str(point_dir), QUESTION, ["7", "9", "12"])
    assert best == int(np.argmax(scores)) and got == pytest.approx(scores, abs=1e-6)


def test_served_over_http(point_dir):
    judge = Judge.load(point_dir)
    with TestClient(create_app(judge)) as client:
        got = client.post("/score", json={"question": QUESTION, "answer": "7"})
        assert got.status_code == 200
        assert got.json()["score"] == pytest.approx(judge.score(QUESTION, "7").value, abs=1e-6)
        pair = client.post("/compare", json={"question": QUESTION, "answer_a": "7", "answer_b": "9"}).json()
        assert pair["p_a"] == pytest.approx(judge.compare(QUESTION, "7", "9").p_a, abs=1e-6)


FACTS = [("France", "Paris", "Lyon"), ("Japan", "Tokyo", "Osaka"), ("Italy", "Rome", "Milan"),
         ("Spain", "Madrid", "Seville"), ("Canada", "Ottawa", "Toronto"), ("Egypt", "Cairo", "Luxor"),
         ("Kenya", "Nairobi", "Mombasa"), ("Peru", "Lima", "Cusco"), ("Norway", "Oslo", "Bergen"),
         ("Chile", "Santiago", "Valparaiso"), ("Greece", "Athens", "Patras"), ("Poland", "Warsaw", "Krakow")]
PAIRS = [{"prompt": f"Which city is the capital of {country}?", "chosen": f"{right}.",
          "rejected": f"The capital is {wrong}, without a doubt."} for country, right, wrong in FACTS]


def clfjudge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clfjudge.cli", *args], capture_output=True, text=True)


def test_train_calibrate_and_audit_from_the_command_line(chat_model, tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    recipe = tmp_path / "verdict.yaml"
    recipe.write_text(yaml.safe_dump({"backbone": str(chat_model), "head": "verdict", "sources": [str(data)],
                                      "dev_fraction": 0.25, "output_dir": str(tmp_path / "judge"),
                                      "verdict": {"questions": ["correct"], "precision": "fp32"}}))
    done = clfjudge("train", "--config", str(recipe))
    assert done.returncode == 0, done.stderr
    card = JudgeCard.load(tmp_path / "judge")
    assert card.kind == "verdict" and card.calibration["method"] == "davidson"
    assert "training pairs" in card.training["fitted"] and "dev" in card.validation
    done = clfjudge("calibrate", str(tmp_path / "judge"), "--source", str(data))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "audit"
    done = clfjudge("audit", str(tmp_path / "judge"), "--sets", str(data), "--out", str(out))
    assert done.returncode == 0, done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert "pairs" in json.dumps(metrics)
    recipe.write_text(yaml.safe_dump({"backbone": str(chat_model), "head": "verdict",
                                      "output_dir": str(tmp_path / "j2"), "verdict": {"question": "correct"}}))
    done = clfjudge("train", "--config", str(recipe))
    assert done.returncode == 2 and "unknown option(s) ['question']" in done.stderr


def test_the_quality_profile_trains_a_verdict_judge(chat_model, tmp_path):
    """`clfjudge run --profile quality` trains its own recipe (a verdict judge) and audits the judge it trained."""
    from clfjudge.pipeline import PROFILES, RunConfig, recipe_of

    assert recipe_of(RunConfig(out=tmp_path, profile="quality")).name == "quality-verdict.yaml"
    assert PROFILES.get("quality").steps == ("data", "train", "export", "audit")
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    done = clfjudge("run", "--out", str(tmp_path / "run"), "--profile", "quality", "--steps", "train",
                    "--set", f"backbone={chat_model}", "--set", f"sources=[{data}]",
                    "--set", "verdict.precision=fp32")
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["outputs"]["train"]["recipe"].endswith("quality-verdict.yaml")
    assert JudgeCard.load(tmp_path / "run" / "judge").kind == "verdict"


def test_the_quality_profile_exports_its_int8_variant_and_audits_the_fastest_gated_run(chat_model, tmp_path,
                                                                                       monkeypatch):
    """The quality profile's export makes only the mixed int8 variant (no int4, no dynamic int8) and gates it; the
    audit reads the export as it serves, or the trained judge where the export serves fp32 and the judge reads bf16."""
    from clfjudge import machine, pipeline

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    config = pipeline.RunConfig(out=tmp_path / "run", profile="quality", steps=["train", "export"],
                                overrides=[f"backbone={chat_model}", f"sources=[{data}]", "dev_fraction=0.0",
                                           "verdict.precision=bf16"])
    record = pipeline.run(config, log=lambda _: None)
    exported = record["outputs"]["export"]
    onnx = JudgeCard.load(exported["onnx_dir"]).runtime["onnx"]
    assert set(onnx["quantized"]) == {"ov-int8-mixed"}  # made, or skipped with why where OpenVINO / NNCF are not
    assert set(onnx["files"]) <= {"fp32", "ov-int8-mixed"}
    report = json.loads((Path(exported["onnx_dir"]) / "parity_report.json").read_text())
    assert exported["served"]["precision"] == next(v["precision"] for k, v in report["variants"].items()
                                                   if k.split(" @ ")[0] == exported["served"]["file"])
    assert all(s["wall_time_s"] >= 0 for s in record["steps"].values())

    state = pipeline.RunState(config, pipeline.PROFILES.get("quality"), record["outputs"])
    judge_dir = record["outputs"]["train"]["judge_dir"]
    for served, reads, want in (("int8", "bf16", exported["onnx_dir"]), ("fp32", "bf16", judge_dir),
                                ("fp32", "fp32", exported["onnx_dir"])):
        monkeypatch.setattr(machine, "decoder_precision", lambda asked, device="cpu", r=reads: (r, "test"))
        state.outputs["export"]["served"]["precision"] = served
        judge, why = pipeline.audited_judge(state)
        assert judge == want, (served, reads, why)
    # the main job audits what it serves, whatever the trained judge would read in
    assert pipeline.audited_judge(pipeline.RunState(config, pipeline.PROFILES.get("full"),
                                                    record["outputs"]))[0] == exported["onnx_dir"]


def test_a_stacked_judge_reads_the_verdict_as_a_feature(chat_model, tiny_llama_dir, tmp_path):
    """The default judge's kind with the verdict beside the reader's features: trained from a recipe, a reward
    model (score = the head's direction on one answer's features), refused by the reader-only ONNX export."""
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    recipe = tmp_path / "stacked.yaml"
    recipe.write_text(yaml.safe_dump({
        "backbone": str(tiny_llama_dir), "head": "embedding", "sources": [str(data)], "dev_fraction": 0.0,
        "output_dir": str(tmp_path / "judge"),
        "embedding": {"layer": 1, "features": ["diff", "info_length_diff", "verdict_diff"], "use_length": False,
                      "head_params": {"C": 1.0},
                      "verdict": {"backbone": str(chat_model), "questions": ["correct", "on-topic"],
                                  "precision": "fp32"}}}))
    done = clfjudge("train", "--config", str(recipe))
    assert done.returncode == 0, done.stderr
    card = JudgeCard.load(tmp_path / "judge")
    assert card.runtime["verdict"]["questions"] == ["correct", "on-topic"]
    judge = Judge.load(tmp_path / "judge")
    c = judge.compare(QUESTION, "7", "9")
    scores = judge.rank(QUESTION, ["7", "9"])
    assert c.p_a > 0.5 if scores[0] > scores[1] else c.p_a < 0.5
    done = clfjudge("export", str(tmp_path / "judge"), "--out", str(tmp_path / "onnx"))
    assert done.returncode == 2 and "stacked judge" in done.stderr


def test_the_shipped_recipes_parse():
    from clfjudge.configs import config_path
    from clfjudge.training.config import TrainConfig

    zero_shot = TrainConfig.from_yaml("train/cpu/verdict-qwen1.5b.yaml", [])
    assert zero_shot.head == "verdict" and not zero_shot.sources
    stacked = TrainConfig.from_yaml("train/cpu/stacked-smollm2-verdict.yaml", [])
    assert "verdict_diff" in stacked.embedding.features
    assert TrainConfig.from_yaml(config_path("recipes/quality-verdict.yaml"), []).head == "verdict"


@pytest.mark.slow
def test_a_real_offline_chat_model_judges(tmp_path):
    """SmolLM2-135M-Instruct (the offline default reader, a real chat model) as a verdict judge: its log-odds are
    transformers' own forward pass through the model's chat template, and it scores and compares."""
    from clfjudge.models.backbones import resolve_backbone

    make(tmp_path, "smollm2")
    judge = Judge.load(tmp_path)
    model_dir = resolve_backbone("smollm2").path_or_id
    for answer in ("7", "9 is a prime number."):
        want = reference_log_odds(model_dir, presets()["correct"], {"question": QUESTION, "answer": answer})
        assert judge.score(QUESTION, answer).value == pytest.approx(want, abs=1e-4)
    c = judge.compare(QUESTION, "7", "9 is a prime number.", symmetric=True)
    assert c.verdict in (Verdict.A, Verdict.B) and c.p_a + c.p_b == pytest.approx(1.0, abs=1e-6)
