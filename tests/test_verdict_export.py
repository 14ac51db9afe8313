"""A verdict judge exported to ONNX (``clfjudge export``, ``export.verdict``) on a tiny random chat LLaMA: the export
scores and compares as PyTorch within the parity gate's fp32 tolerance, loads with the ONNX providers, serves; a
variant that decides otherwise is refused with its gap reported (int4 left out, fp32 failing the export); and
signature.json alone, with onnxruntime and the tokenizer, gives the same log-odds without clfjudge."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clfjudge import testing
from clfjudge.card import JudgeCard
from clfjudge.data.records import PointRecord
from clfjudge.export.gate import ParityError
from clfjudge.export.onnx import export_judge
from clfjudge.export.options import ExportOptions
from clfjudge.export.parity import ParityConfig
from clfjudge.judges.base import Judge
from clfjudge.judges.verdict import questions_from, verdict_card

ITEMS = [("What is the capital of France?", "Paris is the capital."),
         ("Name a prime.", "Nine, because {braces} are odd."),
         ("Name a prime.", "7"),
         ("How do I boil an egg?", "Put it in boiling water for eight minutes, then cool it in cold water.")]
N_RECORDS = 8
LENIENT_INT4 = ["int4.min_agreement=0", "int4.max_metric_delta=1"]  # int4 kept whatever it decides


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("verdict")
    model = testing.tiny_llama(root / "model", chat=True)
    (root / "judge").mkdir()
    verdict_card(str(model), questions_from(["correct", "on-topic"], "test"), precision="fp32").save(root / "judge")
    return root / "judge"


@pytest.fixture(scope="module")
def exported(judge_dir):
    parity = ParityConfig.load(overrides=LENIENT_INT4)
    # openvino: gated where this machine runs it (left out with a warning elsewhere)
    # its OpenVINO IR variants are made and gated in tests/test_verdict_quant.py
    return export_judge(judge_dir, judge_dir.parent / "onnx", n_records=N_RECORDS, parity=parity,
                        providers=["openvino"], openvino=())


def _scores(judge: Judge) -> np.ndarray:
    return np.array([s.value for s in judge.score_batch([{"question": q, "answer": a} for q, a in ITEMS])])


def test_the_export_scores_and_compares_as_pytorch(judge_dir, exported):
    report = exported.report
    assert report["passed"] and {"fp32", "int4"} <= set(report["variants"])
    assert report["validation"]["n"] == N_RECORDS and report["export"]["opset"] == 18
    torch_judge, onnx_judge = Judge.load(judge_dir), Judge.load(exported.out_dir, provider="cpu")
    assert onnx_judge.backend_name == "onnx (fp32)" and onnx_judge.runtime_choice["file"] == "fp32"
    tolerance = ParityConfig.load().for_precision("fp32").max_abs_diff
    assert np.abs(_scores(onnx_judge) - _scores(torch_judge)).max() <= tolerance
    pairs = [{"question": q, "answer_a": a, "answer_b": b} for (q, a), (_, b) in zip(ITEMS, ITEMS[1:])]
    got, want = onnx_judge.compare_batch(pairs), torch_judge.compare_batch(pairs)
    assert [c.verdict for c in got] == [c.verdict for c in want]
    assert np.allclose([c.p_a for c in got], [c.p_a for c in want], atol=1e-5)
    # two questions: two graphs, one copy of the decoder's weights
    card = JudgeCard.load(exported.out_dir)
    assert card.runtime["backend"] == "verdict-onnx" and card.runtime["questions"][1]["name"] == "on-topic"
    assert card.runtime["onnx"]["files"] == {"fp32": ["verdict-0.onnx", "verdict-1.onnx"],
                                             "int4": ["verdict-0_int4.onnx", "verdict-1_int4.onnx"]}
    shared = card.runtime["onnx"]["shared_weights"]
    assert shared["shared_tensors"] > 0 and shared["bytes_after"] < shared["bytes_before"]
    assert not list(exported.out_dir.glob("*.onnx.data")), "every graph reads weights.data"


def test_the_int4_variant_and_the_providers_load(exported):
    int4 = Judge.load(exported.out_dir, variant="int4", provider="cpu")
    assert int4.backend_name == "onnx (int4)" and np.isfinite(_scores(int4)).all()
    assert int4.reader.precision == "onnx-int4"
    if "fp32 @ openvino" in exported.report["variants"]:
        assert exported.report["variants"]["fp32 @ openvino"]["passed"]
        fp32 = _scores(Judge.load(exported.out_dir, provider="cpu"))
        assert np.abs(_scores(Judge.load(exported.out_dir, provider="openvino")) - fp32).max() < 1e-4
    auto = Judge.load(exported.out_dir)  # the fastest run the gate passed
    assert auto.runtime_choice["file"] in ("fp32", "int4")
    with pytest.raises(ValueError, match="variant 'int8' is not in this export"):
        Judge.load(exported.out_dir, variant="int8", provider="cpu")
    with pytest.raises(ValueError, match="parity gate has not measured"):
        Judge.load(exported.out_dir, provider="openvino-bf16")  # not gated (or not on this machine)


def test_the_export_serves(exported):
    from starlette.testclient import TestClient

    from clfjudge.serving.server import create_app

    judge = Judge.load(exported.out_dir, provider="cpu")
    question, answer = ITEMS[0]
    with TestClient(create_app(judge)) as client:
        got = client.post("/score", json={"question": question, "answer": answer})
        assert got.status_code == 200
        assert got.json()["score"] == pytest.approx(judge.score(question, answer).value, abs=1e-6)


LONG_QUESTION = ("Explain in two sentences why the sky is blue, for a child, and name the physical effect that causes "
                 "it so that the child can look it up later.")


def _group() -> list[PointRecord]:
    """Five answers to a long question and two to another: two groups whose question each is read once."""
    answers = ["Because of Rayleigh scattering.", "7", "The sky reflects the ocean.", "{answer} {question}",
               "Blue light scatters more than red light in air."]
    return ([PointRecord(id=f"a{i}", question=LONG_QUESTION, answer=a, score=None) for i, a in enumerate(answers)]
            + [PointRecord(id=f"b{i}", question="Is this another question, asked twice, with its own words?",
                           answer=a, score=None) for i, a in enumerate(["Yes.", "No."])])


@pytest.mark.parametrize("provider", ["cpu", "openvino"])
def test_the_export_reads_a_shared_question_once_as_it_reads_it_whole(judge_dir, exported, provider, monkeypatch):
    from clfjudge.judges import verdict_onnx
    from clfjudge.machine import probe

    check = exported.report["shared_prefix"]
    assert check["made"] and check["passed"] and check["pairs"] > 0 and check["max_abs_diff"] <= 1e-4
    assert set(check["by_reading"]) == {"cached, whole", "cached, shared"}
    entry = JudgeCard.load(exported.out_dir).runtime["onnx"]["shared_prefix"]
    assert entry["variants"] == ["fp32"] and entry["files"] == [verdict_onnx.cached_graph_file(k) for k in range(2)]
    assert entry["empty_cache"][0] == 1 and entry["empty_cache"][2] == 0
    assert "shared_prefix" in json.loads((exported.out_dir / "signature.json").read_text())
    if provider == "openvino" and not (runs := probe().openvino()):
        pytest.skip(f"OpenVINO does not run here: {runs.why}")
    shared = Judge.load(exported.out_dir, provider=provider).reader
    whole = Judge.load(exported.out_dir, provider=provider).reader
    whole.share_prefix = False
    prefixes = []
    original = verdict_onnx._Graph.prefix
    monkeypatch.setattr(verdict_onnx._Graph, "prefix", lambda self, ids: prefixes.append(len(ids)) or
                        original(self, ids))
    got, want = shared.log_odds(_group()), whole.log_odds(_group())
    # a prefix per question asked and group whose sharing pays for itself (as the PyTorch reader decides)
    groups = [len(shared.share_groups([shared.prompt(q, r) for r in _group()])[0]) for q in shared.questions]
    assert len(prefixes) == sum(groups) >= 3 and min(prefixes) >= 16
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(got, Judge.load(judge_dir).reader.log_odds(_group()), atol=1e-4)
    # an fp32 run reads whole prompts with the cached graph too: one session of the weights per question
    assert all(set(m.sessions) == {"cached"} for m in [*shared.modules, *whole.modules])


def test_a_cached_graph_that_reads_otherwise_is_left_out(judge_dir, tmp_path, monkeypatch):
    """A planted cached graph that adds 1 to every log-odds: the check fails, its files are deleted and the judge
    reads whole prompts with the whole graph; the export itself stands."""
    from clfjudge.export import verdict

    real = verdict.cached_graph

    def planted(module):
        import torch

        inner = real(module)

        class Off(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                log_odds, *present = self.inner(*args)
                return (log_odds + 1, *present)

        return Off().eval()

    monkeypatch.setattr(verdict, "cached_graph", planted)
    result = export_judge(judge_dir, tmp_path / "onnx", n_records=N_RECORDS, openvino=(), int4=False)
    check = result.report["shared_prefix"]
    assert not check["passed"] and check["by_reading"]["cached, whole"] == pytest.approx(1, abs=1e-4)
    assert "shared_prefix" not in JudgeCard.load(result.out_dir).runtime["onnx"]
    assert not list(result.out_dir.glob("*cached*"))
    reader = Judge.load(result.out_dir, provider="cpu").reader
    assert reader.cached is None and all(set(m.sessions) == {"whole"} for m in reader.modules)
    np.testing.assert_allclose(reader.log_odds(_group()), Judge.load(judge_dir).reader.log_odds(_group()), atol=1e-4)


def test_a_run_beside_the_whole_graph_opens_the_cached_one_only_where_memory_holds_it(judge_dir, exported,
                                                                                       monkeypatch, caplog):
    """A run in another precision than fp32 reads whole prompts with the gated whole graph, and opens the cached
    graph beside it for shared questions only where the available memory holds it (here: none)."""
    import psutil

    from clfjudge.judges import verdict_onnx

    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 1})())
    reader = Judge.load(exported.out_dir, provider="cpu").reader
    for module in reader.modules:  # as a bf16 run's graphs are, before a group shares its question
        module.cached_only = False
        module.sessions.clear()
    with caplog.at_level("WARNING", logger=verdict_onnx.__name__):
        got = reader.log_odds(_group())
    assert all(not m.shared and set(m.sessions) == {"whole"} for m in reader.modules)
    assert "reads whole prompts" in caplog.text
    np.testing.assert_allclose(got, Judge.load(judge_dir).reader.log_odds(_group()), atol=1e-4)


def _negated_int4(src: Path, dst: Path, **_) -> dict:
    """A planted int4 that answers the other way: the fp32 graph with its log-odds negated."""
    import onnx

    model = onnx.load(str(src))
    output = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{o}_planted" if o == output else o for o in node.output]
    model.graph.node.append(onnx.helper.make_node("Neg", [f"{output}_planted"], [output]))
    onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")
    return {"quantization": "planted"}


def test_a_planted_failing_int4_is_refused_with_its_gap(judge_dir, tmp_path, monkeypatch):
    from clfjudge.export import quantize

    monkeypatch.setattr(quantize, "quantize_int4", _negated_int4)
    result = export_judge(judge_dir, tmp_path / "onnx", n_records=N_RECORDS, openvino=())
    refused = result.report["refused"]
    gap = refused["variants"]["int4"]
    assert gap["agreement"] < 0.99 and not gap["passed"]
    assert f"decision agreement {gap['agreement']:.2%} < min_agreement 99.00%" in refused["reason"]
    assert "int4" not in result.report["variants"]
    files = JudgeCard.load(result.out_dir).runtime["onnx"]["files"]
    assert files["fp32"] == ["verdict-0.onnx", "verdict-1.onnx"] and "int4" not in files
    assert not list(result.out_dir.glob("*int4*"))
    on_disk = json.loads((result.out_dir / "parity_report.json").read_text())
    assert on_disk["refused"]["variants"]["int4"]["agreement"] == gap["agreement"]


def test_the_reference_reads_only_as_far_as_the_runs_get(judge_dir, tmp_path, monkeypatch):
    """A lossy run refused on its first chunk costs the PyTorch reference that chunk alone (a 1.5B's fp32 reading of
    the whole slice took most of an export)."""
    from dataclasses import replace

    from clfjudge.export import quantize

    monkeypatch.setattr(quantize, "quantize_int4", _negated_int4)
    parity = replace(ParityConfig.load(), budget_tflop=1e-12, min_records=2, batch_size=2)  # chunks of 4 pairs
    result = export_judge(judge_dir, tmp_path / "onnx", n_records=N_RECORDS, openvino=(), parity=parity)
    gap = result.report["refused"]["variants"]["int4"]
    assert gap["stopped_early"]["read"] == 4 and gap["pairs"] == 4
    assert result.report["variants"]["fp32"]["pairs"] == 2
    assert result.report["validation"]["reference_read"] == 4 < N_RECORDS


def test_only_a_verdict_judge_takes_the_verdict_options():
    from clfjudge.export import embedding, fine_tuned, verdict

    for name, options in (("--openvino", ExportOptions(openvino=("ov-int8",))), ("--obvious", ExportOptions(
            obvious="obvious.jsonl"))):
        for cannot in (fine_tuned.CANNOT, embedding.CANNOT):
            with pytest.raises(ValueError, match=f"judge cannot honour {name}"):
                options.refuse(cannot, "judge")
        options.refuse(verdict.CANNOT, "judge")  # the verdict exporter takes both, and --int8
    ExportOptions(int8=True, isa="avx2").refuse(verdict.CANNOT, "judge")
    assert ExportOptions(openvino=["ov-int8"]).openvino == ("ov-int8",) and ExportOptions().openvino is None


def test_fp32_failing_the_gate_writes_nothing(judge_dir, tmp_path):
    from clfjudge.cli import main

    assert main(["export", str(judge_dir), "--out", str(tmp_path / "a"), "--n", "4", "--openvino", "none",
                 "--threshold", "fp32.max_abs_diff=-1"]) != 0
    assert not (tmp_path / "a").exists() and not list(tmp_path.iterdir())
    with pytest.raises(ParityError, match=r"fp32 \(fp32\): max \|logit diff\|"):
        export_judge(judge_dir, tmp_path / "b", n_records=4, openvino=(), parity=ParityConfig.load(overrides=[
            "fp32.max_abs_diff=-1"]))
    with pytest.raises(ParityError, match=r"fp32 \(fp32\)"):  # every lossy variant gated after it, int8 too
        export_judge(judge_dir, tmp_path / "c", n_records=4, int8=True, openvino=(),
                     parity=ParityConfig.load(overrides=["fp32.max_abs_diff=-1"]))


def test_fp32_runs_read_the_budgeted_head_of_the_slice_and_lossy_runs_all_of_it(judge_dir, tmp_path):
    from dataclasses import replace

    parity = replace(ParityConfig.load(overrides=LENIENT_INT4), budget_tflop=1e-12, min_records=2)
    result = export_judge(judge_dir, tmp_path / "onnx", n_records=6, openvino=(), parity=parity,
                          providers=["openvino"])
    variants, budget = result.report["variants"], result.report["validation"]["fp32_budget"]
    assert budget["kept"] == 2 and budget["of"] == 6 and budget["budget_tflop"] == 1e-12
    assert variants["fp32"]["pairs"] == 2 and variants["int4"]["pairs"] == 6
    assert result.report["validation"]["reference_read"] == 6  # as far as the int4 run read
    assert all(v["pairs"] == 2 for key, v in variants.items() if v["precision"] == "fp32")
    whole = export_judge(judge_dir, tmp_path / "whole", n_records=6, openvino=(), int4=False,
                         parity=replace(parity, budget_tflop=None))
    assert whole.report["variants"]["fp32"]["pairs"] == 6 and "fp32_budget" not in whole.report["validation"]



def test_no_int4_leaves_the_int4_copy_out(judge_dir, tmp_path):
    from clfjudge.cli import main

    assert main(["export", str(judge_dir), "--out", str(tmp_path / "onnx"), "--n", "2", "--openvino", "none",
                 "--no-int4"]) == 0
    assert JudgeCard.load(tmp_path / "onnx").runtime["onnx"]["files"] == {"fp32": ["verdict-0.onnx", "verdict-1.onnx"]}
    assert not list((tmp_path / "onnx").glob("*int4*"))


def test_a_pairwise_judge_exports_and_compares_as_pytorch(judge_dir, exported, tmp_path):
    with pytest.raises(ValueError, match="exported verdict judge already"):
        export_judge(exported.out_dir, tmp_path / "again")
    (tmp_path / "judge").mkdir()
    verdict_card(str(judge_dir.parent / "model"), questions_from(["better"], "test"), precision="fp32").save(
        tmp_path / "judge")
    result = export_judge(tmp_path / "judge", tmp_path / "onnx", n_records=4, openvino=())
    assert result.report["variants"]["fp32"]["passed"]
    pairs = [{"question": q, "answer_a": a, "answer_b": b} for (q, a), (_, b) in zip(ITEMS, ITEMS[::-1])]
    want = Judge.load(tmp_path / "judge").compare_batch(pairs, symmetric=True)
    got = Judge.load(result.out_dir, provider="cpu").compare_batch(pairs, symmetric=True)
    assert np.allclose([c.p_a for c in got], [c.p_a for c in want], atol=1e-5)
    assert json.loads((result.out_dir / "signature.json").read_text())["questions"][0]["pairwise"]


SIGNATURE_ONLY = r"""
import json, sys
from pathlib import Path
import numpy as np
import onnxruntime as ort
from transformers import AutoTokenizer

directory, items = Path(sys.argv[1]), json.loads(sys.argv[2])
signature = json.loads((directory / "signature.json").read_text())
tokenizer = AutoTokenizer.from_pretrained(str(directory))
out = []
for question in signature["questions"]:
    session = ort.InferenceSession(str(directory / question["graphs"][signature["primary"]]),
                                   providers=["CPUExecutionProvider"])
    rows = []
    for q, a in items:
        messages = [{**m, "content": m["content"].replace("{question}", q).replace("{answer}", a)}
                    for m in question["messages"]]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        rows.append(tokenizer.encode(text, add_special_tokens=False))
    width = max(map(len, rows))
    ids = np.full((len(rows), width), signature["preprocessing"]["pad_token_id"], dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    out.append(session.run(["log_odds"], {"input_ids": ids, "attention_mask": mask})[0].tolist())
assert not any(name.startswith("clfjudge") for name in sys.modules)
print(json.dumps(out))
"""


def test_signature_alone_reproduces_the_scores(exported):
    done = subprocess.run([sys.executable, "-c", SIGNATURE_ONLY, str(exported.out_dir), json.dumps(ITEMS)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    log_odds = np.array(json.loads(done.stdout.strip().splitlines()[-1]))
    judge = Judge.load(exported.out_dir, provider="cpu")

    records = [PointRecord(id=str(i), question=q, answer=a, score=None) for i, (q, a) in enumerate(ITEMS)]
    assert np.allclose(log_odds.T, judge.reader.log_odds(records), atol=1e-5)
    assert np.allclose(log_odds[0], _scores(judge), atol=1e-5)  # the first question decides
    signature = json.loads((exported.out_dir / "signature.json").read_text())
    assert signature["task"] == "verdict" and signature["questions"][0]["positive_token_ids"]
    assert set(signature["graphs"]) == {f for files in signature["variants"].values() for f in files}


def test_the_speed_bench_runs_its_paths_and_compares_their_decisions(judge_dir, tmp_path):
    """Three paths, one of each kind (the reference, the user's transformers reading, an exported graph): each is a
    process of its own, so the run stays well under a minute; the OpenVINO variants are gated in
    tests/test_verdict_quant.py."""
    repo = Path(__file__).resolve().parents[1]
    paths = ["pytorch fp32", "transformers b1", "onnx fp32"]
    done = subprocess.run([sys.executable, str(repo / "bench" / "verdict_speed.py"), "--model",
                           str(judge_dir.parent / "model"), "--pool", "pandalm-test", "--pairs", "3", "--groups", "1",
                           "--n", "2", "--repeats", "1", "--threads", "1", "--peak-seconds", "0.2", "--results",
                           str(tmp_path), "--paths", *paths], capture_output=True, text=True, cwd=repo, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(next(tmp_path.glob("verdict_speed_model_*.json")).read_text())
    rows = result["rows"]
    assert set(rows) == set(paths) and result["machine"]["commit"] and result["parameters"] > 0
    assert set(result["matmul_peak_gflops"]) == {"fp32", "bf16", "int8"}
    for path in paths:
        pairs = rows[path]["workloads"]["pairs"]
        assert pairs["answers"] == 6 and pairs["answers_per_s"] > 0 and 0 < pairs["peak_share"]
        assert pairs["prompt_tokens"] > 0 and 0 < pairs["tokens_read"] and "agreement" in pairs
    fp32, onnx = rows["pytorch fp32"]["workloads"], rows["onnx fp32"]["workloads"]
    assert fp32["pairs"]["max_abs_diff"] == 0 and fp32["pairs"]["agreement"] == 1.0
    assert onnx["pairs"]["max_abs_diff"] < 1e-4 and onnx["best-of-2"]["agreement"] == 1.0
    # the user's transformers reading computes the same log-odds from the full output layer, one answer a call
    user = rows["transformers b1"]["workloads"]["pairs"]
    assert user["max_abs_diff"] < 1e-4 and user["tokens_read"] == fp32["pairs"]["prompt_tokens"]
    assert "| onnx fp32 |" in next(tmp_path.glob("verdict_speed_*.md")).read_text()


def test_a_bf16_run_reads_whole_prompts_with_the_gated_graph_and_shared_ones_beside_it(exported):
    from clfjudge.judges.verdict_onnx import open_onnx_reader
    from clfjudge.machine import probe
    from clfjudge.options import LoadOptions

    if not (runs := probe().openvino_bf16()):
        pytest.skip(f"OpenVINO bf16 does not run here: {runs.why}")
    card = JudgeCard.load(exported.out_dir)
    run = LoadOptions(provider="openvino-bf16", variant="fp32")
    shared, whole = (open_onnx_reader(exported.out_dir, card, run) for _ in range(2))
    whole.share_prefix = False
    got, want = shared.log_odds(_group()), whole.log_odds(_group())
    assert all(set(m.sessions) == {"whole", "cached"} for m in shared.modules)
    assert all(set(m.sessions) == {"whole"} for m in whole.modules)
    np.testing.assert_allclose(got, want, atol=0.1)  # bf16's rounding, read in two graphs


@pytest.mark.parametrize("entry, message", [
    ({"variants": ["fp32"], "files": ["verdict-0-cached.onnx", "verdict-1-cached.onnx"], "empty_cache": "x"},
     "field 'runtime.onnx.shared_prefix.empty_cache': 'x' is not the shape of an empty cache"),
    ({"variants": ["fp32"], "files": ["../elsewhere.onnx", "verdict-1-cached.onnx"], "empty_cache": [1, 2, 0, 4]},
     "field 'runtime.onnx.shared_prefix.files'"),
])
def test_a_card_naming_its_cached_graphs_wrongly_is_refused_with_the_field(exported, tmp_path, entry, message):
    import shutil

    out = tmp_path / "judge"
    shutil.copytree(exported.out_dir, out)
    card = JudgeCard.load(out)
    card.runtime["onnx"]["shared_prefix"] = entry
    card.save(out)
    with pytest.raises(ValueError, match=re.escape(message)):
        Judge.load(out, provider="cpu")


@pytest.mark.parametrize("provider, shared, cached_only", [("cpu", True, True), ("openvino", True, True),
                                                           ("openvino-bf16", True, False), ("cuda", False, False)])
def test_which_runs_read_with_the_cached_graph(exported, provider, shared, cached_only):
    """Per provider, without opening a session: fp32 on the CPU reads everything with the cached graph, OpenVINO bf16
    beside the gated whole graph, CUDA (not measured there) whole prompts with the whole graph."""
    from clfjudge.judges.verdict_onnx import _Graph
    from clfjudge.options import LoadOptions

    entry = JudgeCard.load(exported.out_dir).runtime["onnx"]["shared_prefix"]
    graph = _Graph(exported.out_dir / "verdict-0.onnx", LoadOptions(provider=provider, variant="fp32"),
                   exported.out_dir / entry["files"][0], entry["empty_cache"])
    assert (graph.shared, graph.cached_only, graph.sessions) == (shared, cached_only, {})
