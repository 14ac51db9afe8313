"""A reward model as TRL's RewardTrainer leaves it, and real-weights reward models (SmolLM2, MiniLM), with no card
written by hand: score equals transformers', export passes the parity gate in fp32 (int8 and OpenVINO gated where
this machine runs them), serve batches by token budget, audit puts it beside the length baselines."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from foreign_models import native_rewards, trl_reward_model
from starlette.testclient import TestClient

from clfjudge.audit import run_audit
from clfjudge.card import CARD_NAME, JudgeCard
from clfjudge.cli import main
from clfjudge.judges.base import Judge, as_point
from clfjudge.models.onnx_session import PROVIDERS
from clfjudge.serving.reward import as_record
from clfjudge.serving.server import create_app

FIXTURES = Path(__file__).parent / "fixtures" / "data"
CONVERSATIONS = [("Question 3?", "A detailed and helpful answer, because it explains why."),
                 ("Question 3?", "no"), ("Why is the sky blue?", "  Light scatters.  ")]


@pytest.fixture(scope="module")
def trl_model(tmp_path_factory):
    pytest.importorskip("trl", reason="the dev extra installs trl (TRL's RewardTrainer)")
    return trl_reward_model(tmp_path_factory.mktemp("trl") / "rm")


def test_trl_reward_model_scores_as_transformers_and_learned_the_preference(trl_model):
    judge = Judge.load(trl_model)
    got = [judge.score(q, a).value for q, a in CONVERSATIONS]  # plain-text questions: as one text, as TRL does
    assert got == pytest.approx(native_rewards(trl_model, CONVERSATIONS, "text"), abs=1e-5)
    chat = [s.value for s in judge.score_batch([as_record([{"role": "user", "content": q}], a, i)
                                                for i, (q, a) in enumerate(CONVERSATIONS)])]
    assert chat == pytest.approx(native_rewards(trl_model, CONVERSATIONS, "chat-template"), abs=1e-5)
    assert chat[0] > chat[1]  # four steps on "detailed beats no", in its chat template
    read_as_chat = Judge.load(trl_model, model_input="chat-template")
    assert read_as_chat.score(*CONVERSATIONS[0]).value == pytest.approx(chat[0], abs=1e-5)
    assert read_as_chat.compare(*CONVERSATIONS[0], CONVERSATIONS[1][1]).verdict.value == "A"


def test_trl_reward_model_exports_through_the_gate_and_serves(trl_model, tmp_path):
    providers = [p for p in ("openvino",) if PROVIDERS.get(p).available()]
    out = tmp_path / "onnx"
    assert main(["export", str(trl_model), "--out", str(out), "--n", "16", "--int8", "--fallback",
                 *[f"--provider={p}" for p in providers]]) == 0
    report = json.loads((out / "parity_report.json").read_text())
    assert report["variants"]["model.onnx"]["passed"] and report["variants"]["model.onnx"]["max_abs_diff"] < 1e-4
    for p in providers:
        assert report["variants"][f"model.onnx @ {p}"]["passed"]
    int8 = report["variants"].get("model_quantized.onnx") or report["refused"]["variants"]["model_quantized.onnx"]
    assert int8["precision"] == "int8"  # gated: written where it passed, refused with the reason where not
    card = JudgeCard.load(trl_model)
    assert card.training["origin"]["weights_sha256"] and card.truncation["input"] == "trl"

    judge = Judge.load(out, variant="fp32", max_batch_tokens=64)
    items = [{"question": q, "answer": a} for q, a in CONVERSATIONS]
    with TestClient(create_app(judge)) as client:
        got = client.post("/score", json={"items": items}).json()["results"]
        metrics = client.get("/metrics").text
    assert [r["score"] for r in got] == pytest.approx(native_rewards(trl_model, CONVERSATIONS, "text"), abs=1e-4)
    real = next(line for line in metrics.splitlines() if line.startswith('clfjudge_tokens_total{kind="real"}'))
    assert int(real.split()[-1]) == sum(n for [n] in judge.sequence_lengths(
        [as_point(i) for i in items]))  # the server batched by the judge's own token counts


def test_trl_reward_model_audits_beside_the_length_baselines(trl_model, tmp_path, monkeypatch):
    monkeypatch.setenv("CLFJUDGE_DATA", str(FIXTURES))
    (trl_model / CARD_NAME).unlink(missing_ok=True)
    metrics = run_audit([str(trl_model)], tmp_path / "audit", suites=["cross-scheme", "length"], bootstrap=0,
                        progress=False)
    assert {"baseline:longer", "baseline:shorter"} <= set(metrics["judges"])
    assert any(name.startswith("rm (reward") for name in metrics["judges"])
    assert (tmp_path / "audit" / "report.md").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["smollm2", "minilm"])
def test_a_real_weights_reward_model_scores_as_transformers_and_exports(alias, tmp_path):
    """SmolLM2-135M-Instruct (its own chat template) and all-MiniLM-L6-v2 (text pairs) saved as one-output
    sequence-classification models, as a user saves a reward model."""
    from clfjudge.export.onnx import export_judge
    from clfjudge.models.backbones import BackboneNotAvailableError, load_seq_cls, load_tokenizer, resolve_backbone

    try:
        info = resolve_backbone(alias)
    except (BackboneNotAvailableError, OSError) as exc:
        pytest.skip(f"offline weights {alias!r} are not set up here (clfjudge models setup): {exc}")
    tokenizer = load_tokenizer(info)
    model = load_seq_cls(info, 1, "regression", tokenizer=tokenizer)
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    reading = "text" if info.family == "decoder" else "text-pair"  # plain-text questions, as TRL reads them
    judge = Judge.load(tmp_path / "rm")
    got = [judge.score(q, a).value for q, a in CONVERSATIONS]
    assert got == pytest.approx(native_rewards(tmp_path / "rm", CONVERSATIONS, reading), abs=1e-4)
    result = export_judge(tmp_path / "rm", tmp_path / "onnx", n_records=16)
    assert result.report["variants"]["model.onnx"]["passed"]
