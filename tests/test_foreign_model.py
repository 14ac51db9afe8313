"""A reward model clfjudge did not write (``save_pretrained`` of a sequence-classification model, no judge card)
is a judge: it scores what transformers scores on the input TRL gives it (a decoder: the chat template over
messages, a plain-text prompt and its answer as one text; an encoder: the text pair), and goes through score,
export (parity gate), serve and audit; a foreign directory is untrusted input."""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from foreign_models import native_rewards, tiny_reward_model
from starlette.testclient import TestClient

from clfjudge.audit import run_audit
from clfjudge.card import CARD_NAME, JudgeCard
from clfjudge.cli import main
from clfjudge.data.records import PointRecord
from clfjudge.judges.base import Judge, as_point
from clfjudge.serving.reward import as_record
from clfjudge.serving.server import create_app

FIXTURES = Path(__file__).parent / "fixtures" / "data"
ARCHS = ("bert", "deberta-v2", "llama", "qwen2", "qwen3", "gemma3")
ENCODERS = ("bert", "deberta-v2")
# Leading / trailing spaces (a template that trims them must be called, not imitated), words the tiny
# vocabularies lack, and an answer long enough that batches are padded.
CONVERSATIONS = [("What is the capital of France?", "  Paris is the capital city.  "),
                 ("Explain why the cat sat.", "Because the mat was warm, and the dog runs quickly. Zebra!"),
                 ("Two?", "three four five code python function returns list sorted order summary " * 3)]
# clfjudge pads a batch to its longest member; transformers here reads each input alone. Padding changes the
# float summation order only: rewards agree to float32 rounding.
TOLERANCE = 1e-4  # float32 sums in another order (thread count, batch padding): ~1e-5 seen


def plain(arch: str) -> str:
    """How the model reads a plain-text question by default: as TRL's GRPOTrainer does on standard data."""
    return "text-pair" if arch in ENCODERS else "text"


def as_messages(conversations: list[tuple[str, str]]) -> list[PointRecord]:
    """Each question given as messages (TRL's conversational format)."""
    return [as_record([{"role": "user", "content": q}], a, i) for i, (q, a) in enumerate(conversations)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("foreign")
    return {arch: tiny_reward_model(arch, root / arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_a_saved_reward_model_scores_what_transformers_scores(models, arch):
    judge = Judge.load(models[arch])
    assert judge.card.head == "reward" and judge.card.scheme == ("text-pair" if arch in ENCODERS else "trl")
    got = [s.value for s in judge.score_batch([{"question": q, "answer": a} for q, a in CONVERSATIONS])]
    want = native_rewards(models[arch], CONVERSATIONS, plain(arch))
    assert got == pytest.approx(want, abs=TOLERANCE)
    if arch not in ENCODERS:  # a conversation given as messages: the model's own chat template
        chat = [s.value for s in judge.score_batch(as_messages(CONVERSATIONS))]
        assert chat == pytest.approx(native_rewards(models[arch], CONVERSATIONS, "chat-template"), abs=TOLERANCE)
    assert len(set(got)) == len(got) and max(got) - min(got) > 10 * TOLERANCE  # the inputs differ, so do rewards
    (q, a), (_, b) = CONVERSATIONS[0], CONVERSATIONS[1]
    c = judge.compare(q, a, b)  # Bradley-Terry: P(A better) = sigmoid(r_A - r_B), no ties
    r_a, r_b = judge.score(q, a).value, judge.score(q, b).value
    assert c.p_a == pytest.approx(1 / (1 + math.exp(-(r_a - r_b))), abs=TOLERANCE) and c.p_tie == 0.0
    assert not (models[arch] / CARD_NAME).exists()  # loading writes nothing


def test_the_described_card_records_where_the_model_came_from(models):
    judge = Judge.load(models["llama"])
    origin = judge.card.training["origin"]
    digest = hashlib.sha256((models["llama"] / "model.safetensors").read_bytes()).hexdigest()
    assert origin["path"] == str(models["llama"].resolve()) and origin["weights_sha256"] == {
        "model.safetensors": digest}
    assert origin["model_type"] == "llama" and judge.card.truncation["input"] == "trl"
    assert judge.card.max_length == 128  # the tokenizer's model_max_length, below the config's 512 positions


def test_the_input_format_can_be_overridden(models):
    for reading in ("text-pair", "chat-template"):  # the chat template: over a plain-text question too
        judge = Judge.load(models["llama"], model_input=reading)
        assert judge.score("Q?", "A.").value == pytest.approx(native_rewards(models["llama"], [("Q?", "A.")],
                                                                             reading)[0], abs=TOLERANCE)
    with pytest.raises(ValueError, match="has no chat template"):
        Judge.load(models["bert"], model_input="chat-template")
    with pytest.raises(KeyError, match="model input format"):
        Judge.load(models["bert"], model_input="vibes")


def test_a_too_long_answer_is_cut_to_the_models_length(models):
    judge = Judge.load(models["qwen3"])
    judge.score("Why?", "the answer goes on and on " * 200)
    assert judge.truncation["truncated"] == 1 and judge.truncation["fields"]["answer"]["records"] == 1
    [[length]] = judge.sequence_lengths([as_point({"question": "Why?", "answer": "x " * 900})])
    assert 100 < length <= 128


def test_a_directory_that_is_no_model_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="judge_card.json is missing, and it is not a transformers model"):
        Judge.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match="not a sequence-classification model"):
        Judge.load(tmp_path)


def test_a_classifier_with_several_outputs_is_refused_naming_its_labels(models, tmp_path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(models["bert"], num_labels=3)
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="3 outputs \\(id2label .*LABEL_2.*needs a judge card"):
        Judge.load(tmp_path)


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_a_two_class_model_is_read_as_the_log_odds_of_its_class_1(arch, tmp_path):
    from clfjudge.export.onnx import export_judge

    model = tiny_reward_model(arch, tmp_path / arch, num_labels=2)
    judge = Judge.load(model)
    assert judge.card.head == "reward-binary" and judge.card.label_map["positive"] == 1
    got = [s.value for s in judge.score_batch([{"question": q, "answer": a} for q, a in CONVERSATIONS])]
    want = native_rewards(model, CONVERSATIONS, plain(arch))  # logit[1] - logit[0]
    assert got == pytest.approx(want, abs=TOLERANCE)
    c = judge.compare(CONVERSATIONS[0][0], CONVERSATIONS[0][1], CONVERSATIONS[1][1])
    other = judge.score(CONVERSATIONS[0][0], CONVERSATIONS[1][1]).value
    assert c.margin == pytest.approx(got[0] - other, abs=TOLERANCE)
    exported = export_judge(model, tmp_path / "onnx", n_records=16).out_dir
    assert Judge.load(exported).score(*CONVERSATIONS[2]).value == pytest.approx(got[2], abs=1e-4)
    signature = json.loads((exported / "signature.json").read_text())
    assert signature["postprocessing"]["columns"] == ["LABEL_0", "LABEL_1"]
    assert "logits[:, 1] - logits[:, 0]" in signature["postprocessing"]["score"]
    from clfjudge.training.config import TrainConfig

    with pytest.raises(ValueError, match="head 'reward-binary' reads released models and is not trained here"):
        TrainConfig.from_dict({"sources": ["pandalm-test"], "head": "reward-binary"})


@pytest.mark.parametrize("arch", ("bert", "llama", "qwen3"))
def test_export_gates_the_model_writes_its_card_and_the_export_scores_the_same(models, arch, tmp_path):
    from clfjudge.export.onnx import export_judge

    result = export_judge(models[arch], tmp_path / "onnx", n_records=16)
    assert result.report["variants"]["model.onnx"]["passed"]
    card = JudgeCard.load(models[arch])  # the first export wrote the card it read the model with
    assert card.training["origin"]["path"] == str(models[arch].resolve()) and card.runtime == {}
    exported = Judge.load(result.out_dir)
    assert exported.backend_name == "onnx" and exported.card.training["origin"] == card.training["origin"]
    items = [{"question": q, "answer": a} for q, a in CONVERSATIONS]
    got = [s.value for s in exported.score_batch(items)]
    assert got == pytest.approx(native_rewards(models[arch], CONVERSATIONS, plain(arch)), abs=1e-4)
    (models[arch] / CARD_NAME).unlink()  # the module's models stay cardless


def test_cli_score_serve_and_audit_without_a_card(models, tmp_path, monkeypatch):
    model = models["qwen2"]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in CONVERSATIONS))
    assert main(["score", str(model), "--input", str(src), "--output", str(out), "--task", "score"]) == 0
    scores = [json.loads(line)["score"] for line in out.read_text().splitlines()]
    assert scores == pytest.approx(native_rewards(model, CONVERSATIONS, "text"), abs=TOLERANCE)

    judge = Judge.load(model, max_batch_tokens=256)
    with TestClient(create_app(judge)) as client:
        got = client.post("/score", json={"items": [{"question": q, "answer": a} for q, a in CONVERSATIONS]})
        assert [r["score"] for r in got.json()["results"]] == pytest.approx(scores, abs=TOLERANCE)
        assert client.post("/compare", json={"question": "q", "answer_a": "a"}).status_code == 422

    monkeypatch.setenv("CLFJUDGE_DATA", str(FIXTURES))
    metrics = run_audit([str(model)], tmp_path / "audit", suites=["cross-scheme", "length"], bootstrap=0,
                        progress=False)
    name = next(n for n in metrics["judges"] if n.startswith("qwen2"))
    assert "baseline:longer" in metrics["judges"] and "baseline:shorter" in metrics["judges"] and name
    assert JudgeCard.load(model).training["origin"]["path"] == str(model.resolve())  # written by the audit
    (model / CARD_NAME).unlink()


def test_reward_function_and_best_of_n_take_the_model_directory(models):
    from clfjudge import best_of_n, reward_function

    model = models["gemma3"]
    prompts = [[{"role": "user", "content": q}] for q, _ in CONVERSATIONS]
    completions = [[{"role": "assistant", "content": a}] for _, a in CONVERSATIONS]
    rewards = reward_function(str(model))(prompts=prompts, completions=completions)
    assert rewards == pytest.approx(native_rewards(model, CONVERSATIONS, "chat-template"), abs=TOLERANCE)
    plain_rewards = reward_function(str(model))(prompts=[q for q, _ in CONVERSATIONS],
                                                completions=[a for _, a in CONVERSATIONS])
    assert plain_rewards == pytest.approx(native_rewards(model, CONVERSATIONS, "text"), abs=TOLERANCE)
    answers = [a for _, a in CONVERSATIONS]
    best, scores = best_of_n(str(model), CONVERSATIONS[0][0], answers)  # a plain-text question, as TRL reads it
    assert scores == pytest.approx(native_rewards(model, [(CONVERSATIONS[0][0], a) for a in answers], "text"),
                                  abs=TOLERANCE)
    assert best == int(np.argmax(scores))


def test_a_hub_id_that_cannot_be_fetched_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache; conftest keeps the hub offline
    with pytest.raises(FileNotFoundError, match="hf:nobody/no-such-rm: the model could not be fetched"):
        Judge.load("hf:nobody/no-such-rm")
    out = tmp_path / "audit"
    assert main(["audit", "hf:nobody/no-such-rm", "--out", str(out)]) != 0
    assert not out.exists()


def test_cli_model_input_overrides_the_input_format(models, tmp_path):
    model = models["llama"]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in CONVERSATIONS))
    assert main(["score", str(model), "--input", str(src), "--output", str(out), "--task", "score",
                 "--model-input", "text-pair"]) == 0
    scores = [json.loads(line)["score"] for line in out.read_text().splitlines()]
    assert scores == pytest.approx(native_rewards(model, CONVERSATIONS, "text-pair"), abs=TOLERANCE)
    with pytest.raises(SystemExit) as usage:
        main(["score", str(model), "--input", str(src), "--output", str(out), "--model-input", "vibes"])
    assert usage.value.code == 2
