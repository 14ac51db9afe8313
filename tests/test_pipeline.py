"""The main job (`clfjudge run`): step wiring, and the CI slice of the real path end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from clfjudge.card import JudgeCard
from clfjudge.models.onnx_session import gate_key
from clfjudge.paths import data_root
from clfjudge.pipeline import ORDER, RunConfig, StepFailed, run


def test_unknown_step_fails_before_any_work(tmp_path):
    with pytest.raises(KeyError, match="unknown pipeline step"):
        run(RunConfig(out=tmp_path, steps=["data", "deploy"]), log=lambda _: None)
    assert not (tmp_path / "run.json").exists()


def test_the_run_gives_its_steps_the_embedding_cache_and_leaves_the_environment_as_it_was(tmp_path, monkeypatch,
                                                                                         override):
    from clfjudge import pipeline
    from clfjudge.embedders.cache import ENV

    seen = []
    monkeypatch.delenv(ENV, raising=False)
    override(pipeline.STEPS, "probe", lambda state: seen.append(os.environ.get(ENV)) or {})
    record = run(RunConfig(out=tmp_path, steps=["probe"]), log=lambda _: None)
    assert seen[0] and ENV not in os.environ  # set for the steps, unset again for the caller
    assert record["machine"]["cores"] and "matmul_flags" in record["machine"]


def test_a_later_step_says_what_it_needs(tmp_path):
    with pytest.raises(StepFailed, match="output 'judge_dir' of step 'train'") as failed:
        run(RunConfig(out=tmp_path, steps=["export"]), log=lambda _: None)
    assert isinstance(failed.value.__cause__, ValueError)


def test_export_falls_back_to_fp32_when_the_gate_refuses_int8(tmp_path, monkeypatch):
    """A judge whose decisions int8 tips is served as fp32 ONNX from one export, and run.json says why."""
    from types import SimpleNamespace

    from clfjudge import pipeline
    from clfjudge.export import onnx as export
    from clfjudge.models.onnx_session import PROVIDERS

    calls = []

    def fake_export(judge_dir, out_dir, options):
        calls.append((options.int8, options.fallback, list(options.providers)))
        gate = {"max_abs_diff": 0.1, "agreement": 0.9, "metric_delta": 0.0, "on_boundary": 0, "records_per_s": 3.0}
        report = {"variants": {"model.onnx": {"precision": "fp32", **gate, "passed": True}},
                  "refused": {"reason": "refused by the parity gate: decision agreement 90.00% < 99.00%",
                              "variants": {"model_quantized.onnx": {"precision": "int8", **gate, "passed": False}}}}
        return SimpleNamespace(out_dir=out_dir, primary="model.onnx", report=report)

    monkeypatch.setattr(export, "export_judge", fake_export)
    state = pipeline.RunState(RunConfig(out=tmp_path), pipeline.PROFILES.get("full"),
                              outputs={"train": {"judge_dir": str(tmp_path / "judge")}})
    out = pipeline.STEPS.get("export")(state)
    # openvino-bf16 is gated too where the openvino extra is installed
    has_openvino = PROVIDERS.get("openvino-bf16").available()
    assert calls == [(True, True, ["openvino-bf16"] if has_openvino else [])] and out["primary"] == "model.onnx"
    assert out["served"] == {"file": "model.onnx", "provider": "cpu", "records_per_s": 3.0, "precision": "fp32"}
    assert "90.00%" in out["refused"]["reason"]
    assert out["refused"]["parity"]["model_quantized.onnx"]["passed"] is False
    assert list(out["parity"]) == ["model.onnx"]


@pytest.mark.slow
@pytest.mark.skipif(not (data_root() / "pandalm" / "data" / "testset-v1.json").exists(),
                    reason="needs ../shared/data (present in CI)")
def test_quick_main_job_end_to_end(tmp_path):
    """Train the default judge on a small real slice, export it through the parity gate, audit it
    beside the released judges and SemScore: the README's main job, shortened. It runs with oneDNN capped below
    bf16 (``ONEDNN_MAX_CPU_ISA``, which PyTorch and clfjudge's probe honour), so that a path that works only on a CPU
    with bf16 fails here on every machine; tests/test_machine.py covers the other machines' choices."""
    env = {**os.environ, "CLFJUDGE_EMBEDDING_CACHE": str(tmp_path / "embeddings"),  # not the user's cache
           "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}
    done = subprocess.run([sys.executable, "-m", "clfjudge.cli", "run", "--profile", "quick", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["machine"]["isa_cap"] == "AVX512_CORE_VNNI"
    assert record["machine"]["capabilities"]["cpu_bf16"]["runs"] is False
    assert "openvino-bf16" in record["outputs"]["export"]["providers"]["not_run_here"]
    assert JudgeCard.load(record["outputs"]["train"]["judge_dir"]).runtime["read_in"]["precision"] == "fp32"
    assert list(record["steps"]) == list(ORDER)
    assert all(v["passed"] for v in record["outputs"]["export"]["parity"].values())
    served = record["outputs"]["export"]["served"]  # the fastest run that passed, what the audit ran
    assert gate_key(served["file"], served["provider"]) in record["outputs"]["export"]["parity"]
    metrics = json.loads((tmp_path / "audit" / "metrics.json").read_text())
    rows = metrics["suites"]["cross-scheme"]["rows"]
    trained = next(name for name in rows if "judge-onnx" in name)
    assert "accuracy" in rows[trained]["pandalm-test"]
    assert "accuracy" in rows["pandalm-7b"]["pandalm-test"] and "agreement" in rows["auto-j-13b"]["autoj-test"]
    assert "pearson" in rows["semscore"]["prometheus-vicuna"]
    assert (tmp_path / "audit" / "report.md").read_text().startswith("# clfjudge audit")
