"""A verdict judge's int8 / int4 OpenVINO variants (``export.verdict_quant``) on a tiny random chat LLaMA: the export
makes them and gates each on the decisions of the gate's pairs, with |delta log-odds| quantiles in the report; a
planted variant that flips decisions (its log-odds negated) is refused with its gap, on the pairs and on the obvious
pairs; a loaded int8 judge scores within what its gate measured; the OpenVINO provider of a variant is chosen from
the machine's probe."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clfjudge import machine, testing
from clfjudge.card import JudgeCard
from clfjudge.export import verdict_quant
from clfjudge.export.onnx import export_judge
from clfjudge.export.options import ExportOptions
from clfjudge.export.parity import ParityConfig
from clfjudge.export.verdict import export_verdict_judge
from clfjudge.judges.base import Judge
from clfjudge.judges.verdict_onnx import choose_run
from clfjudge.options import LoadOptions

pytest.importorskip("nncf")
if not machine.probe().openvino():
    pytest.skip(f"OpenVINO does not run here: {machine.probe().openvino().why}", allow_module_level=True)

N_RECORDS = 16
ITEMS = [("What is the capital of France?", "Paris is the capital."), ("Name a prime.", "7"),
         ("Name a prime.", "Nine, because {braces} are odd."),
         ("How do I boil an egg?", "Put it in boiling water for eight minutes, then cool it in cold water.")]
OBVIOUS = [{"question": "What is 2 + 2?", "answer_a": "4.", "answer_b": "It is 5, as everyone knows.", "winner": "A"},
           {"question": "Capital of France?", "answer_a": "Berlin.", "answer_b": "Paris.", "winner": "B"},
           {"question": "Is 7 prime?", "answer_a": "Yes, 7 is prime.", "answer_b": "No.", "winner": "A"},
           {"question": "Spell cat.", "answer_a": "dog", "answer_b": "c-a-t", "winner": "B"}]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    return testing.tiny_verdict_judge(tmp_path_factory.mktemp("verdict_quant"))


@pytest.fixture(scope="module")
def exported(judge_dir):
    """``clfjudge export``'s route: every OpenVINO variant made and gated (the onnxruntime int4 copy left out)."""
    return export_judge(judge_dir, judge_dir.parent / "onnx", n_records=N_RECORDS, int4=False)


def _scores(judge: Judge) -> np.ndarray:
    return np.array([s.value for s in judge.score_batch([{"question": q, "answer": a} for q, a in ITEMS])])


def test_the_export_makes_and_gates_every_openvino_variant(exported):
    report = exported.report
    made = report["export"]["quantized"]
    seen = {key.split(" @ ")[0] for key in [*report["variants"], *report.get("refused", {}).get("variants", {})]}
    for name in verdict_quant.OPENVINO_VARIANTS:  # each gated, or left out with the reason
        assert name in seen or "skipped" in made[name], name
    # int8 weights on a decoder this small decide as fp32 on every pair of the gate
    key = next(k for k in report["variants"] if k.startswith("ov-int8-weights @ openvino"))
    entry = report["variants"][key]
    assert entry["passed"] and entry["precision"] == "int8-weights" and entry["agreement"] >= 0.98
    assert entry["thresholds"]["min_agreement"] == 0.98
    diff = entry["log_odds_diff"]
    assert 0 < diff["p50"] <= diff["p95"] <= diff["max"] == pytest.approx(entry["max_abs_diff"])  # really quantized
    card = JudgeCard.load(exported.out_dir)
    assert card.runtime["onnx"]["files"]["ov-int8-weights"] == ["verdict-0_ov_int8w.xml"]
    assert (exported.out_dir / "verdict-0_ov_int8w.bin").exists()
    assert key in card.runtime["onnx"]["gated"] and card.runtime["onnx"]["parity"][key]["log_odds_diff"] == diff
    signature = json.loads((exported.out_dir / "signature.json").read_text())
    assert signature["graphs"]["verdict-0_ov_int8w.xml"]["format"] == "openvino-ir"


def test_a_loaded_int8_judge_scores_within_its_gate(judge_dir, exported):
    card = JudgeCard.load(exported.out_dir)
    int8 = Judge.load(exported.out_dir, variant="ov-int8-weights")
    provider = int8.runtime_choice["provider"]
    assert provider in ("openvino", "openvino-bf16") and int8.reader.precision.startswith("onnx-ov-int8-weights")
    fp32 = _scores(Judge.load(judge_dir))
    # the gate ran the variant on the provider this machine picks, and says how far it moved the log-odds
    tolerance = 2 * card.runtime["onnx"]["parity"][f"ov-int8-weights @ {provider}"]["log_odds_diff"]["max"]
    got = _scores(int8)
    assert np.abs(got - fp32).max() <= tolerance
    assert not np.allclose(got, fp32, atol=1e-7)  # the int8 weights are read, not the fp32 graph
    with pytest.raises(ValueError, match="OpenVINO IR, which provider 'cpu'"):
        Judge.load(exported.out_dir, variant="ov-int8-weights", provider="cpu")


def _negated_ir(src: Path, dst: Path, inputs) -> dict:
    """A planted int8 variant that answers the other way: the fp32 graph with its log-odds negated, as an IR."""
    import onnx

    from clfjudge.machine import import_openvino

    model = onnx.load(str(src))
    output = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{o}_planted" if o == output else o for o in node.output]
    model.graph.node.append(onnx.helper.make_node("Neg", [f"{output}_planted"], [output]))
    planted = dst.with_name("planted.onnx")
    onnx.save(model, str(planted), save_as_external_data=True, location=planted.name + ".data")
    ov = import_openvino()
    ov.save_model(ov.Core().read_model(str(planted)), str(dst), compress_to_fp16=False)
    for path in dst.parent.glob("planted.onnx*"):
        path.unlink()
    return {"quantization": "planted"}


def test_a_planted_variant_that_flips_decisions_is_refused(judge_dir, tmp_path):
    obvious = tmp_path / "obvious.jsonl"
    obvious.write_text("".join(json.dumps(row) + "\n" for row in OBVIOUS))
    planted = verdict_quant.QuantVariant(_negated_ir, "int8-weights")
    # the decisions alone refuse it: the thresholds gate nothing else
    parity = ParityConfig.load(overrides=["int8-weights.max_metric_delta=null"])
    with verdict_quant.VARIANTS.override("ov-int8-weights", planted):
        result = export_verdict_judge(judge_dir, tmp_path / "onnx", ExportOptions(
            n_records=N_RECORDS, int4=False, parity=parity, openvino=("ov-int8-weights",), obvious=str(obvious)))
    refused = result.report["refused"]
    key, gap = next(iter(refused["variants"].items()))
    assert key.startswith("ov-int8-weights @ openvino") and not gap["passed"]
    assert gap["agreement"] < 0.98 and gap["obvious"]["changed"] == len(OBVIOUS)
    assert f"decision agreement {gap['agreement']:.2%} < min_agreement 98.00%" in refused["reason"]
    assert f"obvious pairs: {len(OBVIOUS)} of {len(OBVIOUS)} decided otherwise than fp32" in refused["reason"]
    assert set(result.report["variants"]) == {"fp32"} and result.report["validation"]["obvious"]["n"] == 4
    assert JudgeCard.load(result.out_dir).runtime["onnx"]["files"] == {"fp32": ["verdict-0.onnx"]}
    assert not list(result.out_dir.glob("*_ov_*"))


def test_a_variant_that_cannot_be_made_is_left_out_with_why(judge_dir, tmp_path):
    def broken(src, dst, inputs):
        raise RuntimeError("no kernel for this shape")

    with verdict_quant.VARIANTS.override("ov-int4-weights", verdict_quant.QuantVariant(broken, "int4-weights")):
        result = export_verdict_judge(judge_dir, tmp_path / "onnx", ExportOptions(
            n_records=4, int4=False, openvino=("ov-int4-weights",)))
    skipped = result.report["export"]["quantized"]["ov-int4-weights"]["skipped"]
    assert skipped == "could not be made: RuntimeError: no kernel for this shape"
    assert set(JudgeCard.load(result.out_dir).runtime["onnx"]["files"]) == {"fp32"}
    with pytest.raises(KeyError, match="unknown verdict quantized variant 'int3'"):
        export_verdict_judge(judge_dir, tmp_path / "other", ExportOptions(openvino=("int3",)))
    with pytest.raises(ValueError, match="--openvino int8: not an OpenVINO variant"):
        export_verdict_judge(judge_dir, tmp_path / "other", ExportOptions(openvino=("int8",)))
    assert not (tmp_path / "other").exists()


RUNTIME = {"primary": "fp32", "files": {"fp32": ["verdict-0.onnx"], "ov-int8": ["verdict-0_ov_int8.xml"]},
           "gated": ["ov-int8 @ openvino-bf16"], "served": {"file": "ov-int8", "provider": "openvino-bf16"}}


@pytest.mark.parametrize(("kind", "want"), [
    ("avx512-bf16", ("ov-int8", "openvino-bf16")),  # AMD Zen 4: bf16 activations, as gated
    ("amx", ("ov-int8", "openvino-bf16")),
    ("avx512-vnni", ("ov-int8", "openvino")),  # Intel without bf16: the same int8 file, f32 activations
    ("avx2", ("ov-int8", "openvino")),
    ("arm64", ("fp32", "cpu")),  # no OpenVINO: the fp32 graph on onnxruntime
])
def test_the_provider_of_an_ir_variant_follows_the_machine(monkeypatch, kind, want):
    monkeypatch.setattr(machine, "probe", lambda: testing.simulated_machine(kind))
    assert choose_run(RUNTIME, LoadOptions())[:2] == want
    if kind != "arm64":
        assert choose_run(RUNTIME, LoadOptions(variant="ov-int8"))[:2] == want
    ungated = {**RUNTIME, "gated": []}
    if kind in ("avx512-bf16", "amx"):
        assert choose_run(ungated, LoadOptions(variant="ov-int8"))[:2] == ("ov-int8", "openvino")


@pytest.mark.parametrize(("kind", "want"), [
    # bf16 where it runs, and a weights-only variant on f32 activations too (int8 products of its weights)
    ("amx", ["ov-int8-weights @ openvino-bf16", "ov-int8-weights @ openvino", "ov-int8 @ openvino-bf16"]),
    ("avx512-vnni", ["ov-int8-weights @ openvino", "ov-int8 @ openvino"]),
])
def test_a_weights_only_variant_is_gated_on_f32_activations_too(monkeypatch, kind, want):
    from clfjudge.export.verdict import _runs

    monkeypatch.setattr(machine, "probe", lambda: testing.simulated_machine(kind))
    files = {"fp32": ["verdict-0.onnx"], "ov-int8-weights": ["verdict-0_ov_int8w.xml"],
             "ov-int8": ["verdict-0_ov_int8.xml"]}
    runs = _runs(files, {"fp32": "fp32", "ov-int8-weights": "int8-weights", "ov-int8": "int8-static"}, ())
    assert [r.key for r in runs] == ["fp32", *want]
    # the export serves the faster of the two; a machine with bf16 runs the served one as it was gated
    both = {**RUNTIME, "files": files, "gated": want, "served": {"file": "ov-int8-weights", "provider": "openvino"}}
    assert choose_run(both, LoadOptions())[:2] == ("ov-int8-weights", "openvino")


def test_dynamic_int8_is_made_and_gated_with_int8(judge_dir, tmp_path):
    parity = ParityConfig.load(overrides=["int8.min_agreement=0", "int8.max_metric_delta=1"])  # kept whatever it does
    result = export_verdict_judge(judge_dir, tmp_path / "onnx", ExportOptions(
        n_records=4, int4=False, int8=True, openvino=(), parity=parity))
    assert result.report["export"]["quantized"]["int8"]["quantization"] == "dynamic"
    assert result.report["variants"]["int8"]["precision"] == "int8"
    int8 = Judge.load(result.out_dir, variant="int8", provider="cpu")
    assert int8.reader.precision == "onnx-int8" and np.isfinite(_scores(int8)).all()


def _quantized_inputs(path: Path) -> dict[str, bool]:
    """Per MatMul of an IR file: whether its activation input comes through a FakeQuantize (int8 activations)."""
    model = machine.openvino_core().read_model(str(path))
    return {op.get_friendly_name(): op.input_value(0).get_node().get_type_name() == "FakeQuantize"
            for op in model.get_ops() if op.get_type_name() == "MatMul"}


def test_the_mixed_int8_variant_leaves_the_down_projections_unquantized(judge_dir, tmp_path):
    parity = ParityConfig.load(overrides=["int8-static.min_agreement=0", "int8-static.max_metric_delta=1"])
    result = export_verdict_judge(judge_dir, tmp_path / "onnx", ExportOptions(
        n_records=4, int4=False, openvino=("ov-int8", "ov-int8-mixed"), parity=parity))
    files = JudgeCard.load(result.out_dir).runtime["onnx"]["files"]
    static, mixed = (_quantized_inputs(result.out_dir / files[name][0]) for name in ("ov-int8", "ov-int8-mixed"))
    down = [name for name in static if "/mlp/down_proj/" in name]
    assert down and all(static[name] for name in down) and not any(mixed[name] for name in down)
    others = [name for name in static if "/mlp/up_proj/" in name or "/self_attn/q_proj/" in name]
    assert others and all(static[name] and mixed[name] for name in others)
    made = result.report["export"]["quantized"]["ov-int8-mixed"]
    assert made["not_quantized"] == {"patterns": list(verdict_quant.MIXED_KEEP), "matmuls": len(down)}
    assert made["calibration_prompts"] == result.report["export"]["quantized"]["ov-int8"]["calibration_prompts"] > 0


def test_the_dynamic_quantization_bench_runs_and_compares(judge_dir, tmp_path):
    """bench/ov_dynamic_quant.py on the tiny judge: the reference, int8 weights unquantized and in groups of 32, and
    bf16 where it runs; each run a process of its own."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(repo / "bench" / "ov_dynamic_quant.py"), "--model",
                           str(judge_dir.parent / "model"), "--pool", "pandalm-test", "--pairs", "2", "--repeats", "1",
                           "--threads", "1", "--group-sizes", "0", "32", "--results", str(tmp_path)],
                          capture_output=True, text=True, cwd=repo, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(next(tmp_path.glob("ov_dynamic_quant_model_*.json")).read_text())
    rows = result["rows"]
    assert {"fp32 graph, f32", "int8 weights, f32, not quantized", "int8 weights, f32, group 32"} <= set(rows)
    reference = rows["fp32 graph, f32"]
    assert reference["max_abs_diff"] == 0 and reference["pairs_agree"] == reference["pairs"] == 2
    for row in rows.values():
        assert row["answers"] == 4 and row["answers_per_s"] > 0 and "p50_abs_diff" in row
    assert rows["int8 weights, f32, group 32"]["group_size"] == 32
    assert rows["int8 weights, f32, not quantized"]["max_abs_diff"] > 0  # the int8 weights are read
    assert "| int8 weights, f32, group 32 |" in next(tmp_path.glob("ov_dynamic_quant_*.md")).read_text()
