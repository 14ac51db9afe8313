"""The capability probe (clfjudge/machine.py) and every machine-dependent choice on simulated machines: no bf16,
AVX2 only, AMX, arm64, CUDA present. Each choice goes through ``machine.probe()``, so replacing it makes this machine
look like another one; a choice that falls back says why, in run.json, the judge card and /metrics."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient
from tiny_judges import make_judge

from clfjudge import machine
from clfjudge.card import JudgeCard
from clfjudge.cli import main
from clfjudge.export.onnx import export_judge
from clfjudge.export.quantize import int8_settings
from clfjudge.judges.base import Judge
from clfjudge.machine import Machine, decoder_precision, training_precision
from clfjudge.models.onnx_session import PROVIDERS, resolve_provider, runnable_providers
from clfjudge.options import LoadOptions
from clfjudge.pipeline import PROFILES, STEPS, RunConfig, RunState, StepFailed, _needs, resume_command, run
from clfjudge.testing import SIMULATED_MACHINES, simulated_machine

# what each simulated machine should get: (auto decoder precision on CPU, int8 ISA, providers that run)
EXPECTED = {
    "avx512-bf16": ("bf16", "avx512_vnni", {"cpu", "openvino", "openvino-bf16"}),
    "avx512-vnni": ("fp32", "avx512_vnni", {"cpu", "openvino"}),
    "avx2": ("fp32", "avx2", {"cpu", "openvino"}),
    "amx": ("bf16", "avx512_vnni", {"cpu", "openvino", "openvino-bf16"}),
    "arm64": ("fp32", "arm64", {"cpu"}),
    "cuda": ("fp32", "avx512_vnni", {"cpu", "cuda", "openvino"}),
}


@pytest.fixture(params=sorted(SIMULATED_MACHINES))
def simulated(request, monkeypatch):
    """This test, once on each simulated machine."""
    sim = simulated_machine(request.param)
    monkeypatch.setattr(machine, "probe", lambda: sim)
    return request.param


def as_machine(monkeypatch, name: str, isa_cap: str | None = None) -> Machine:
    sim = simulated_machine(name, isa_cap)
    monkeypatch.setattr(machine, "probe", lambda: sim)
    return sim


def test_expectations_cover_every_simulated_machine():
    assert set(EXPECTED) == set(SIMULATED_MACHINES)


# --- the probe itself ------------------------------------------------------------------------------------------------
def test_a_failing_probe_means_does_not_run_and_says_why(monkeypatch):
    def broken() -> tuple[bool, str]:
        raise RuntimeError("driver exploded")

    monkeypatch.setitem(machine.PROBES, "torch_cuda", broken)
    monkeypatch.setitem(machine.PROBES, "openvino", broken)
    sim = Machine(arch="x86_64", cpu="test", flags=frozenset())
    assert not sim.cuda() and "driver exploded" in sim.cuda().why
    assert not sim.openvino() and "RuntimeError" in sim.openvino().why
    assert not sim.ort_cuda() and not sim.cuda_bf16() and not sim.openvino_bf16()
    described = {name: c.runs for name, c in sim.capabilities().items()}
    assert described == dict.fromkeys(described, False)


def test_this_machine_is_described_without_raising():
    record = machine.describe({"precision": "fp32"})
    assert record["cores"] and set(record["capabilities"]) >= {"cpu_bf16", "cuda", "openvino", "openvino_bf16"}
    assert all(set(c) == {"runs", "why"} and c["why"] for c in record["capabilities"].values())
    assert record["int8_isa"]["value"] in ("avx512_vnni", "avx512", "avx2", "arm64")
    assert record["choices"] == {"precision": "fp32"}


@pytest.mark.parametrize(("cap", "bf16", "isa"), [
    (None, True, "avx512_vnni"), ("AVX512_CORE_BF16", True, "avx512_vnni"),
    ("AVX512_CORE_VNNI", False, "avx512_vnni"), ("AVX512_CORE", False, "avx512"), ("AVX2", False, "avx2"),
])
def test_the_onednn_isa_cap_caps_what_the_probe_reports(monkeypatch, cap, bf16, isa):
    sim = as_machine(monkeypatch, "avx512-bf16", cap)
    assert bool(sim.cpu_bf16()) is bf16 and sim.int8_isa()[0] == isa
    if cap and not bf16:
        assert "capped away" in sim.cpu_bf16().why and cap in sim.cpu_bf16().why
        assert not sim.openvino_bf16()  # OpenVINO ignores the cap: the probe does not


def test_the_cap_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv(machine.ISA_CAP_ENV, "avx2")
    machine._this_machine.cache_clear()
    try:
        assert machine.probe().isa_cap == "AVX2" and not machine.probe().cpu_bf16()
    finally:
        monkeypatch.delenv(machine.ISA_CAP_ENV)
        machine._this_machine.cache_clear()


# --- the machine matrix --------------------------------------------------------------------------------------------
def test_decoder_and_training_precision(simulated):
    auto, _, _ = EXPECTED[simulated]
    precision, why = decoder_precision("auto")
    assert precision == auto and why
    asked, why = decoder_precision("bf16")
    assert asked == auto  # bf16 asked for on a CPU without it reads in fp32 and says why
    if auto == "fp32":
        assert "does not run here" in why
    gpu = decoder_precision("auto", device="cuda")[0]
    assert gpu == ("bf16" if simulated == "cuda" else "fp32")
    assert training_precision("bf16")[0] == ("bf16" if simulated == "cuda" else "fp32")
    assert training_precision("fp16")[0] == ("fp16" if simulated == "cuda" else "fp32")


# not "cuda": TrainingArguments itself checks for a real GPU when asked for bf16 (the choice is covered by
# test_decoder_and_training_precision, the real run by bench/gpu_check.sh)
@pytest.mark.parametrize("name", [name for name in sorted(SIMULATED_MACHINES) if name != "cuda"])
def test_training_arguments_follow_the_probe(name, tmp_path, monkeypatch):
    from clfjudge.models.heads import HEADS
    from clfjudge.training.config import TrainConfig, training_arguments

    as_machine(monkeypatch, name)
    cfg = TrainConfig(backbone="unused", sources=["pandalm-test"], precision="bf16", output_dir=str(tmp_path))
    args = training_arguments(cfg, HEADS.get("cls3")(), tmp_path, has_dev=False)
    assert not args.bf16 and not args.fp16 and args.use_cpu


def test_int8_settings_and_providers(simulated):
    _, isa, runs = EXPECTED[simulated]
    assert int8_settings("auto").isa == isa
    assert {name for name, p in PROVIDERS.items() if p.available()} == runs
    kept, skipped = runnable_providers(["openvino-bf16", "cuda", "openvino"])
    assert set(kept) == runs & {"openvino-bf16", "cuda", "openvino"} and all(skipped.values())


def test_the_main_jobs_export_gates_what_runs_here(simulated, tmp_path, monkeypatch):
    """The full profile asks for openvino-bf16: gated where it runs, left out (and run.json says why) elsewhere."""
    from clfjudge.export import onnx as export

    calls = []

    def fake_export(judge_dir, out_dir, options):
        calls.append(list(options.providers))
        gate = {"max_abs_diff": 0.0, "agreement": 1.0, "metric_delta": 0.0, "on_boundary": 0, "records_per_s": 3.0}
        return SimpleNamespace(out_dir=out_dir, primary="model.onnx",
                               report={"variants": {"model.onnx": {"precision": "fp32", **gate, "passed": True}}})

    monkeypatch.setattr(export, "export_judge", fake_export)
    state = RunState(RunConfig(out=tmp_path), PROFILES.get("full"),
                     outputs={"train": {"judge_dir": str(tmp_path / "judge")}})
    out = STEPS.get("export")(state)
    bf16 = "openvino-bf16" in EXPECTED[simulated][2]
    assert calls == [["openvino-bf16"] if bf16 else []]
    assert out["providers"]["gated"] == calls[0]
    assert bool(out["providers"]["not_run_here"]) is not bf16


def test_auto_loads_the_served_run_only_where_it_runs(simulated):
    onnx = {"primary": "reader.onnx", "served": {"file": "reader.onnx", "provider": "openvino-bf16"}}
    variant, provider, why = resolve_provider(LoadOptions(), onnx)
    if "openvino-bf16" in EXPECTED[simulated][2]:
        assert (variant, provider) == (None, "openvino-bf16")
    else:
        assert (variant, provider) == (None, "cpu") and "does not run here" in why
    onnx["served"] = {"file": "model.onnx", "provider": "cuda"}
    assert resolve_provider(LoadOptions(), onnx)[1] == ("cuda" if simulated == "cuda" else "cpu")


# --- real exports, scoring and serving on a machine without bf16 ----------------------------------------------------
@pytest.fixture(scope="module")
def bf16_served_export(tiny_bert_dir, tmp_path_factory):
    """A tiny classifier exported here, its card saying it was served by openvino-bf16 (as on a bf16 machine)."""
    judge_dir = make_judge(tiny_bert_dir, tmp_path_factory.mktemp("cls3") / "judge")
    result = export_judge(judge_dir, tmp_path_factory.mktemp("onnx") / "judge", n_records=8)
    card = JudgeCard.load(result.out_dir)
    key = "model.onnx @ openvino-bf16"
    card.runtime["onnx"].update(gated=[key], served={"file": "model.onnx", "provider": "openvino-bf16",
                                                     "records_per_s": 99.0})
    card.save(result.out_dir)
    return judge_dir, result.out_dir


def test_export_on_a_machine_without_bf16_leaves_the_bf16_provider_out(bf16_served_export, tmp_path, monkeypatch):
    as_machine(monkeypatch, "avx512-vnni")
    judge_dir, _ = bf16_served_export
    result = export_judge(judge_dir, tmp_path / "out", n_records=8, providers=["openvino-bf16", "openvino"])
    assert result.report["passed"] and "model.onnx @ openvino" in result.report["variants"]
    assert not any(key.endswith("openvino-bf16") for key in result.report["variants"])
    runtime = JudgeCard.load(result.out_dir).runtime["machine"]
    assert runtime["providers"]["openvino"] == {"gated": True}
    assert runtime["providers"]["openvino-bf16"]["gated"] is False
    assert "bf16" in runtime["providers"]["openvino-bf16"]["why"]
    assert runtime["int8_isa"]["value"] == "avx512_vnni"


def test_score_and_serve_a_bf16_served_judge_on_a_machine_without_bf16(bf16_served_export, tmp_path, monkeypatch):
    as_machine(monkeypatch, "avx2")
    _, onnx_dir = bf16_served_export
    judge = Judge.load(onnx_dir)
    assert judge.runtime_choice["provider"] == "cpu" and "does not run here" in judge.runtime_choice["why"]
    items = tmp_path / "pairs.jsonl"
    items.write_text(json.dumps({"question": "2+2?", "answer_a": "4", "answer_b": "5"}) + "\n")
    assert main(["score", str(onnx_dir), "--input", str(items), "--output", str(tmp_path / "out.jsonl")]) == 0
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 1
    from clfjudge.serving.server import create_app

    with TestClient(create_app(judge, warm_up=False)) as client:
        metrics = client.get("/metrics").text
    assert 'clfjudge_runtime_info{backend="onnx",provider="cpu",file="model.onnx",why="the export served' in metrics
    assert 'clfjudge_machine_capability{name="cpu_bf16",why="CPU has no bf16 instructions' in metrics
    assert 'clfjudge_machine_capability{name="openvino",why="OpenVINO compiles for this CPU"} 1' in metrics


def test_asking_for_a_provider_that_does_not_run_here_is_a_clear_error(bf16_served_export, monkeypatch):
    as_machine(monkeypatch, "avx2")
    _, onnx_dir = bf16_served_export
    with pytest.raises(ValueError, match="provider 'openvino-bf16' does not run on this machine: CPU has no bf16"):
        Judge.load(onnx_dir, provider="openvino-bf16")


# --- a failed step keeps what earlier steps wrote and says how to resume --------------------------------------------
def test_a_failed_late_step_prints_the_resume_command_and_keeps_the_training(tmp_path, override, capsys):
    judge_dir = tmp_path / "run" / "judge"

    def fake_train(state):
        judge_dir.mkdir(parents=True)
        (judge_dir / "judge_card.json").write_text("{}")
        return {"judge_dir": str(judge_dir)}

    def broken_export(state):
        raise MemoryError("out of memory in the gate")

    override(STEPS, "train", fake_train)
    override(STEPS, "export", broken_export)
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "--profile", "quick", "--set", "max_steps=2", "--steps", "train", "export",
            "audit"]
    assert main(args) == 1
    err = capsys.readouterr().err
    resume = f"clfjudge run --out {out} --set max_steps=2 --profile quick --steps export audit"
    assert "step 'export' failed (MemoryError: out of memory in the gate)" in err and resume in err
    assert "Traceback" in err  # the cause, for whoever fixes it
    record = json.loads((out / "run.json").read_text())
    assert record["outputs"]["train"] == {"judge_dir": str(judge_dir)} and (judge_dir / "judge_card.json").exists()
    assert "MemoryError" in record["steps"]["export"]["failed"]

    # the printed command resumes: the export reads the kept training output, the train timing stays recorded
    override(STEPS, "export", lambda state: {"onnx_dir": _needs(state, "train", "judge_dir")})
    override(STEPS, "audit", lambda state: {"report": "r"})
    assert main(resume.split()[1:]) == 0
    record = json.loads((out / "run.json").read_text())
    assert list(record["steps"]) == ["train", "export", "audit"]
    assert record["outputs"]["export"] == {"onnx_dir": str(judge_dir)}


def test_the_resume_command_names_only_what_differs_from_the_defaults(tmp_path):
    config = RunConfig(out=tmp_path / "r")
    assert resume_command(config, ["audit"]) == f"clfjudge run --out {tmp_path / 'r'} --steps audit"
    config = RunConfig(out=tmp_path / "my run", recipe=tmp_path / "x.yaml", judges=["semscore"])
    assert "--recipe" in resume_command(config, ["export"]) and "'" in resume_command(config, ["export"])
    assert resume_command(config, ["export"]).endswith("--steps export --judges semscore")


def test_an_interrupted_step_is_recorded_and_not_wrapped(tmp_path, override):
    def interrupted(state):
        raise KeyboardInterrupt

    override(STEPS, "data", interrupted)
    said = []
    with pytest.raises(KeyboardInterrupt):
        run(RunConfig(out=tmp_path, steps=["data"]), log=said.append)
    assert "resume with" in said[-1] and "failed" in json.loads((tmp_path / "run.json").read_text())["steps"]["data"]
    assert not issubclass(KeyboardInterrupt, StepFailed)


def test_nothing_in_the_package_tests_the_machine_but_the_probe():
    """Every machine-dependent choice goes through clfjudge/machine.py: no other module reads CPU flags, asks
    torch / onnxruntime / OpenVINO what they can run, or decides on CUDA by itself."""
    import re
    from pathlib import Path

    import clfjudge

    package = Path(clfjudge.__file__).parent
    probes = re.compile(r"cuda\.is_available|is_bf16_supported|/proc/cpuinfo|OPTIMIZATION_CAPABILITIES|"
                        r"get_available_providers|platform\.machine|platform\.processor")
    offenders = [f"{p.relative_to(package)}:{n}" for p in package.rglob("*.py") if p.name != "machine.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1) if probes.search(line)]
    assert offenders == []
    assert (package / "machine.py").exists() and probes.search((package / "machine.py").read_text())


# --- the GPU check: ready for a machine with a GPU, says so without one --------------------------------------------
def _gpu_check(*args: str, env: dict | None = None):
    import os
    import subprocess
    import sys

    from clfjudge.paths import REPO_ROOT

    env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(REPO_ROOT / "bench" / "gpu_check.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_gpu_check_says_it_did_not_run_without_a_gpu(tmp_path):
    if machine.probe().cuda():
        pytest.skip("this machine has a GPU: bench/gpu_check.sh runs for real here")
    done = _gpu_check(str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == f"gpu_check: not run: {machine.probe().cuda().why}"
    assert json.loads((tmp_path / "machine.json").read_text())["capabilities"]["cuda"]["runs"] is False


@pytest.mark.slow
def test_the_gpu_checks_pass_on_the_cpu(tmp_path):
    """The same checks on the CPU (``--cpu``), so the script does not rot between GPU sessions."""
    import os
    import subprocess
    import sys

    from clfjudge.paths import REPO_ROOT

    env = {**os.environ, "CLFJUDGE_DATA": str(REPO_ROOT / "tests" / "fixtures" / "data"),
           "CLFJUDGE_EMBEDDING_CACHE": str(tmp_path / "embeddings")}
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "gpu_check.py"), str(tmp_path), "--cpu"],
                          env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("gpu_check")]
    assert done.returncode == 0 and lines[-1] == "gpu_check: all checks passed", (lines, done.stderr[-2000:])
    assert len([line for line in lines if ": ok (" in line]) == 6
