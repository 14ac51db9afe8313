"""ONNX export behind the parity gate, on tiny random judges (BERT, DeBERTa-v3, LLaMA) and a real PandaLM slice:
fp32 parity on padded batches of other shapes than the export dummy, decoder last-token pooling under padding,
int8 + graph optimization, the gate refusing an export, the exported directory layout, and config parsing."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_judges import make_judge
from transformers import AutoConfig

from clfjudge.card import JudgeCard
from clfjudge.cli import main
from clfjudge.data.records import Loc, PairRecord
from clfjudge.export.onnx import export_judge
from clfjudge.export.parity import ParityConfig, Thresholds
from clfjudge.export.quantize import cpu_isa, int8_settings
from clfjudge.judges.base import ONNX_VARIANTS, Judge
from clfjudge.judges.model import OnnxBackend, load_tokenizer

N_RECORDS = 24  # real PandaLM-test records, in batches of 8 padded to their longest member
ARCHS = ["tiny_bert_dir", "tiny_deberta_dir", "tiny_llama_dir"]


@pytest.fixture(scope="module")
def judges(request, tmp_path_factory) -> dict[str, Path]:
    """One untrained cls3 judge per tiny backbone."""
    root = tmp_path_factory.mktemp("judges")
    return {arch: make_judge(request.getfixturevalue(arch), root / arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def exported(judges, tmp_path_factory) -> dict[str, Path]:
    """Each judge exported in fp32 through the default gate (parity.yaml thresholds)."""
    root = tmp_path_factory.mktemp("exported")
    return {arch: export_judge(judge, root / arch, n_records=N_RECORDS).out_dir for arch, judge in judges.items()}


@pytest.mark.slow  # the module's three exports take ~30 s together
@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_export_passes_the_gate_on_real_padded_batches(arch, exported):
    out = exported[arch]
    report = json.loads((out / "parity_report.json").read_text())
    variant = report["variants"]["model.onnx"]
    assert report["passed"] and variant["passed"] and variant["failures"] == []
    assert variant["max_abs_diff"] <= 1e-4 and variant["agreement"] == 1.0 and variant["metric_delta"] == 0.0
    assert report["validation"]["source"] == "pandalm-test" and report["validation"]["n"] == N_RECORDS
    # the gate ran on batches of other shapes than the 2-record export dummy
    assert report["validation"]["batch_size"] == 8 and N_RECORDS > 2
    assert report["export"]["exporter"] in ("dynamo", "legacy")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_exported_directory_layout(arch, exported, judges):
    out = exported[arch]
    names = {p.name for p in out.iterdir()}
    assert {"model.onnx", "config.json", "judge_card.json", "parity_report.json", "tokenizer_config.json"} <= names
    assert not names & {"model.safetensors", "pytorch_model.bin"}
    card = JudgeCard.load(out)
    onnx_rt = card.runtime["onnx"]
    assert card.runtime["backend"] == "onnx" and onnx_rt["primary"] == "model.onnx"
    assert onnx_rt["output"] == "logits" and onnx_rt["inputs"][:2] == ["input_ids", "attention_mask"]
    assert onnx_rt["parity"]["model.onnx"]["agreement"] == 1.0
    # everything but the runtime section is the trained judge's card
    original = JudgeCard.load(judges[arch])
    assert (card.head, card.scheme, card.truncation, card.label_map) == \
        (original.head, original.scheme, original.truncation, original.label_map)
    # dynamic axes carry optimum's names
    session = OnnxBackend(out / "model.onnx").session
    assert [i.shape for i in session.get_inputs()][0] == ["batch_size", "sequence_length"]


def _pair(answer_a: str) -> PairRecord:
    return PairRecord.build(Loc("mem", 1), question="What is the capital of France?", answer_a=answer_a,
                            answer_b="The cat sat on the mat.", unlabelled=True)


@pytest.mark.slow
def test_decoder_last_token_pooling_survives_padding_in_onnx(exported):
    out = exported["tiny_llama_dir"]
    judge = Judge.load(out)
    tokenizer = load_tokenizer(out)
    backend = OnnxBackend(out / "model.onnx")
    short, long = judge.encode(_pair("Paris."))[0], judge.encode(_pair("Paris is the capital city. " * 12))[0]
    alone = backend(tokenizer.pad([short], return_tensors="np"))
    batch = tokenizer.pad([short, long], padding=True, return_tensors="np")
    assert (batch["attention_mask"][0] == 0).any()  # the short sequence is padded
    np.testing.assert_allclose(backend(batch)[0], alone[0], atol=1e-5)


@pytest.mark.parametrize("head,gain,source,metric", [("reward", 40.0, "pandalm-test", "accuracy"),
                                                     ("regression", 400.0, "prometheus-vicuna", "pearson")])
def test_reward_and_regression_judges_export(head, gain, source, metric, tiny_bert_dir, tmp_path):
    judge = make_judge(tiny_bert_dir, tmp_path / head, head=head, gain=gain)
    report = export_judge(judge, tmp_path / "onnx", n_records=16).report
    variant = report["variants"]["model.onnx"]
    assert report["passed"] and variant["metric"] == metric and variant["max_abs_diff"] <= 1e-4
    assert report["validation"]["source"] == source  # the default source for the judge's kind


def test_int8_and_optimized_export(judges, tmp_path):
    parity = ParityConfig.load(overrides=["int8.min_agreement=0.8", "int8.max_metric_delta=0.2"])
    result = export_judge(judges["tiny_bert_dir"], tmp_path / "int8", int8=True, optimize=True,
                          n_records=N_RECORDS, parity=parity)
    variants = result.report["variants"]
    assert set(variants) == {"model.onnx", "model_optimized.onnx", "model_quantized.onnx"}
    assert variants["model_optimized.onnx"]["max_abs_diff"] <= 1e-4  # fp32 thresholds for the optimized graph
    quantized = variants["model_quantized.onnx"]
    assert quantized["precision"] == "int8" and quantized["agreement"] >= 0.8
    assert 0 < quantized["max_abs_diff"]  # int8 really changed the numbers
    card = JudgeCard.load(result.out_dir)
    files = card.runtime["onnx"]["files"]
    assert result.primary == card.runtime["onnx"]["primary"] == "model_quantized.onnx"
    assert files["model_quantized.onnx"]["from"] == "model_optimized.onnx"
    assert files["model_quantized.onnx"]["isa"] == cpu_isa()
    assert files["model_quantized.onnx"]["bytes"] < files["model.onnx"]["bytes"]
    # onnxruntime on the CPU runs the primary file unless a variant is named; the default provider ("auto") runs
    # the run the gate timed fastest among those that passed
    assert Path(Judge.load(result.out_dir, provider="cpu").backend.path).name == "model_quantized.onnx"
    assert Path(Judge.load(result.out_dir, variant="fp32").backend.path).name == "model.onnx"
    passed = {k: v for k, v in result.report["variants"].items() if v["passed"]}
    assert card.runtime["onnx"]["served"]["file"] == max(passed, key=lambda k: passed[k]["records_per_s"])
    assert Path(Judge.load(result.out_dir).backend.path).name == card.runtime["onnx"]["served"]["file"]


def test_int8_keeps_products_of_gelu_outputs_in_fp32(judges, tmp_path):
    """clfjudge/configs/int8.yaml: the FFN down-projections (input from Gelu) stay fp32, every other weight
    product is quantized."""
    import onnx

    from clfjudge.export.quantize import fp32_nodes

    parity = ParityConfig.load(overrides=["int8.min_agreement=0", "int8.max_metric_delta=1"])
    result = export_judge(judges["tiny_bert_dir"], tmp_path / "int8", int8=True, n_records=N_RECORDS, parity=parity)
    fp32 = onnx.load(str(result.out_dir / "model.onnx"))
    kept = fp32_nodes(fp32, ["Gelu"])
    layers = JudgeCard.load(result.out_dir).runtime["onnx"]["files"]["model_quantized.onnx"]["fp32_nodes"]
    assert len(kept) == layers == AutoConfig.from_pretrained(judges["tiny_bert_dir"]).num_hidden_layers
    quantized = onnx.load(str(result.out_dir / "model_quantized.onnx"))
    ops = {n.name: n.op_type for n in quantized.graph.node}
    assert all(ops[name] == "MatMul" for name in kept)
    assert sum(op in ("MatMulInteger", "DynamicQuantizeMatMul") for op in ops.values()) > 0


def test_gate_refuses_and_writes_nothing(judges, tmp_path, capsys):
    out = tmp_path / "refused"
    code = main(["export", str(judges["tiny_bert_dir"]), "--out", str(out), "--n", "8",
                 "--threshold", "fp32.max_abs_diff=-1"])  # no export can meet a negative difference
    assert code != 0
    assert not out.exists() and list(tmp_path.iterdir()) == []  # the temporary directory is gone too
    err = capsys.readouterr().err
    assert "parity gate failed" in err and "max_abs_diff -1" in err and "FAILED" in err


def test_int8_fallback_exports_fp32_once_when_int8_is_refused(judges, tmp_path, capsys):
    out = tmp_path / "fallback"
    code = main(["export", str(judges["tiny_bert_dir"]), "--out", str(out), "--n", "8", "--int8", "--fallback",
                 "--threshold", "int8.min_agreement=1.01"])  # no int8 model can agree on more than every pair
    assert code == 0
    card = json.loads((out / "judge_card.json").read_text())
    assert card["runtime"]["onnx"]["primary"] == "model.onnx" and not list(out.glob("model_quantized*"))
    report = json.loads((out / "parity_report.json").read_text())
    assert "min_agreement" in report["refused"]["reason"] and "refused by the parity gate" in capsys.readouterr().err
    assert card["runtime"]["onnx"]["served"]["file"] == "model.onnx"  # the one run left is the one served


def test_export_refuses_existing_output_and_judges_without_weights(judges, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="already exists"):
        export_judge(judges["tiny_bert_dir"], busy)
    assert (busy / "keep.txt").exists()
    emb = tmp_path / "emb"
    emb.mkdir()
    JudgeCard(kind="embedding", arity="pair", backbone="minilm", scheme="embedding", max_length=256).save(emb)
    with pytest.raises(ValueError, match="covers decoder embedders.*sklearn backend"):
        export_judge(emb, tmp_path / "emb-onnx")
    weightless = tmp_path / "weightless"  # e.g. an exported directory
    weightless.mkdir()
    JudgeCard.load(judges["tiny_bert_dir"]).save(weightless)
    with pytest.raises(FileNotFoundError, match="no PyTorch weights"):
        export_judge(weightless, tmp_path / "weightless-onnx")
    assert not (tmp_path / "emb-onnx").exists() and not (tmp_path / "weightless-onnx").exists()


def test_parity_config_parsing(tmp_path):
    default = ParityConfig.load()
    assert default.for_precision("fp32") == Thresholds(max_abs_diff=1e-4, min_agreement=1.0, max_metric_delta=0.001,
                                                       boundary_eps=1e-4, min_cosine=0.9999, batch_tolerance=1e-4)
    assert [default.for_precision(p).batch_tolerance for p in ("int4", "bf16", "int8")] == [1e-4, 5e-3, 5e-2]
    assert default.for_precision("int8").min_agreement == 0.99
    assert default.default_sources["pair"][0] == "pandalm-test"
    tightened = ParityConfig.load(overrides=["int8.max_abs_diff=0.5", "fp32.min_agreement=none"])
    assert (tightened.for_precision("int8").max_abs_diff == 0.5
            and tightened.for_precision("fp32").min_agreement is None)
    with pytest.raises(ValueError, match="PRECISION.KEY=VALUE"):
        ParityConfig.load(overrides=["int8.agreement=1"])
    bad = tmp_path / "parity.yaml"
    bad.write_text("thresholds:\n  fp32: {max_diff: 1}\n")
    with pytest.raises(ValueError, match="unknown key"):
        ParityConfig.load(bad)


def test_thresholds_name_the_failure_with_numbers():
    measured = {"max_abs_diff": 0.2, "agreement": 0.95, "metric": "accuracy", "metric_delta": -0.03}
    failures = Thresholds(max_abs_diff=1e-4, min_agreement=0.99, max_metric_delta=0.01).failures(measured)
    assert len(failures) == 3
    assert "0.2 > max_abs_diff 0.0001" in failures[0] and "95.00% < min_agreement 99.00%" in failures[1]
    assert "|accuracy delta| 0.0300 > max_metric_delta 0.01" in failures[2]
    assert Thresholds().failures(measured) == []


def test_int8_settings_per_isa():
    assert int8_settings("avx512_vnni").weight_type == "QInt8"
    assert int8_settings("avx512").reduce_range is True
    assert int8_settings("avx2").weight_type == "QUInt8"
    assert int8_settings("auto").isa == cpu_isa()
    with pytest.raises(ValueError, match="no int8 settings"):
        int8_settings("sse2")


def test_onnx_variant_names_match_optimum():
    optimum = {"fp32": "model.onnx", "optimized": "model_optimized.onnx", "int8": "model_quantized.onnx"}
    assert {k: ONNX_VARIANTS[k] for k in optimum} == optimum  # optimum has no int4 name: model_int4.onnx is ours


def test_decisions_on_a_boundary_are_set_aside_and_counted():
    """A pair whose P(A) and P(B) are equal up to float rounding is not compared (it can flip at fp32)."""
    from types import SimpleNamespace

    import numpy as np

    from clfjudge.data.records import PairRecord, Verdict
    from clfjudge.export.gate import compare_to_reference, decision_slack
    from clfjudge.judges.calibration import Calibration
    from clfjudge.models.heads import PairOutputs

    class Stub(SimpleNamespace):  # raw rows are (P(A), P(TIE), P(B))
        tasks = frozenset({"compare"})
        calibration = Calibration()

        def raw_outputs(self, records):
            return self.raw

        def pair_outputs(self, raw):
            return PairOutputs(p_a=raw[:, 0], p_tie=raw[:, 1], p_b=raw[:, 2])

    ref = np.array([[0.7, 0.1, 0.2], [0.45, 0.1, 0.45 + 1e-7], [0.2, 0.1, 0.7]])
    cand = ref + np.array([[0, 0, 0], [2e-7, 0, 0], [0, 0, 0]])  # tips the second pair from B to A
    records = [PairRecord(id=str(i), question="q", answer_a="a", answer_b="b", verdict=v)
               for i, v in enumerate([Verdict.A, Verdict.B, Verdict.B])]
    assert decision_slack(Stub(raw=ref), ref)[1] < 1e-6
    strict = compare_to_reference(Stub(raw=ref), Stub(raw=cand), records)
    assert strict["agreement"] == pytest.approx(2 / 3) and strict["on_boundary"] == 0
    tolerant = compare_to_reference(Stub(raw=ref), Stub(raw=cand), records, boundary_eps=1e-4)
    assert tolerant["agreement"] == 1.0 and tolerant["on_boundary"] == 1 and tolerant["metric_delta"] == 0


def test_int4_export_keeps_the_head_fp32_and_loads(tiny_llama_dir, tmp_path):
    """A decoder reward judge's weight-only int4 file: MatMulNBits for the decoder's products, the one-column
    score head left fp32, gated at the int4 thresholds, loadable by variant name."""
    import onnx

    judge = make_judge(tiny_llama_dir, tmp_path / "rm", head="reward", gain=40.0)
    parity = ParityConfig.load(overrides=["int4.min_agreement=0", "int4.max_metric_delta=1"])
    result = export_judge(judge, tmp_path / "int4", int4=True, n_records=16, parity=parity)
    variant = result.report["variants"]["model_int4.onnx"]
    assert variant["precision"] == "int4" and variant["passed"]
    assert result.primary == ONNX_VARIANTS["int4"]
    graph = onnx.load(str(result.out_dir / "model_int4.onnx"), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("MatMulNBits") > 0
    weights = {t.name for t in graph.initializer}
    products = [n.op_type for n in graph.node if n.op_type in ("MatMul", "MatMulNBits") and n.input[1] in weights]
    assert products[-1] == "MatMul" and products.count("MatMul") == 1  # only the score head (last) stayed fp32
    files = JudgeCard.load(result.out_dir).runtime["onnx"]["files"]
    assert files["model_int4.onnx"]["fp32_nodes"] == 1 and files["model_int4.onnx"]["from"] == "model.onnx"
    loaded = Judge.load(result.out_dir, variant="int4", provider="cpu")
    assert Path(loaded.backend.path).name == "model_int4.onnx"
    assert np.isfinite([s.value for s in loaded.score_batch([{"question": "2+2?", "answer": "4"}])]).all()
    assert set(result.report["seconds"]) >= {"reference", "export fp32", "int4", "gate model_int4.onnx", "total"}


def test_a_failing_run_stops_after_its_first_chunk(judges, tmp_path):
    """min_agreement above 1 fails on the first chunk's records: the run stops there (2 batches of 8 = 16 of 40
    records) and the report says so; the fp32 run reads all 40."""
    parity = ParityConfig.load(overrides=["int8.min_agreement=1.01"])
    with pytest.raises(ValueError, match="parity gate failed") as info:
        export_judge(judges["tiny_bert_dir"], tmp_path / "stop", int8=True, n_records=40, parity=parity)
    variants = info.value.report["variants"]
    assert variants["model_quantized.onnx"]["stopped_early"] == {"read": 16, "of": 40,
                                                                 "why": "0 decisions differ, at most -1 may"}
    assert "stopped_early" not in variants["model.onnx"]
    assert not (tmp_path / "stop").exists()


def test_the_compute_budget_cuts_the_slice_but_not_below_its_floor(judges, tmp_path):
    from dataclasses import replace

    from clfjudge.export.gate import within_budget

    parity = replace(ParityConfig.load(), budget_tflop=1e-9, min_records=5)
    result = export_judge(judges["tiny_bert_dir"], tmp_path / "budget", n_records=24, parity=parity)
    budget = result.report["validation"]["budget"]
    assert result.report["validation"]["n"] == budget["kept"] == 5 and budget["of"] == 24
    records = list(range(10))
    kept, info = within_budget(records, [[100, 100]] * 10, 10**9, replace(parity, budget_tflop=1.0, min_records=1))
    assert kept == records[:2] and info["tflop_per_run"] == 0.8  # 0.4 TFLOP a record: two fit in one
    assert within_budget(records, [[1]] * 10, 1, replace(parity, budget_tflop=None))[0] == records


def test_external_data_exports_leave_no_stray_files(judges, tmp_path, monkeypatch):
    """A model exported with external data (over 2 GB in real life) and quantized: every side file belongs to an
    ONNX file the card names; the quantizer's prepared copy and its tensors are gone."""
    from clfjudge.export import graph

    monkeypatch.setattr(graph, "EXTERNAL_DATA_BYTES", 0)
    parity = ParityConfig.load(overrides=["int8.min_agreement=0", "int8.max_metric_delta=1"])
    result = export_judge(judges["tiny_bert_dir"], tmp_path / "ext", int8=True, n_records=8, parity=parity)
    files = JudgeCard.load(result.out_dir).runtime["onnx"]["files"]
    assert result.report["export"]["external_data"]
    data = sorted(p.name for p in result.out_dir.glob("*.data"))
    assert data and all(any(name.startswith(f) for f in files) for name in data), data
    assert not list(result.out_dir.glob("*prepared*"))
