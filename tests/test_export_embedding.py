"""ONNX export of a decoder embedding judge (tiny random LLaMA with a chat template): the reader graph matches
PyTorch, the exported directory loads through Judge.load without importing PyTorch, int8 and int4 go through the
gate."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from test_decoder_embedder import TEMPLATE, _pairs

from clfjudge.batching import Budget
from clfjudge.card import JudgeCard
from clfjudge.cli.export import _print_variants
from clfjudge.export.gate import ParityError
from clfjudge.export.onnx import export_judge
from clfjudge.export.parity import ParityConfig
from clfjudge.judges.base import Judge
from clfjudge.judges.embedding import EmbeddingModel
from clfjudge.options import LoadOptions
from clfjudge.testing import tiny_llama


@pytest.fixture(scope="module")
def chat_llama_dir(tmp_path_factory):
    backbone = tiny_llama(tmp_path_factory.mktemp("llama"))
    config = json.loads((backbone / "tokenizer_config.json").read_text())
    (backbone / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return backbone


@pytest.fixture(scope="module")
def judge_dir(chat_llama_dir, tmp_path_factory):
    judge = EmbeddingModel(backbone=str(chat_llama_dir), features=("diff", "token_stats"), head_params={"C": 1.0},
                           embedder_options={"layer": 1, "stats_tokens": 4}).fit(_pairs(24))
    return judge.save(tmp_path_factory.mktemp("judge") / "judge")


def _parity(**overrides):
    return ParityConfig.load(overrides=[f"{k}={v}" for k, v in overrides.items()])


def test_fp32_reader_matches_pytorch_and_loads_without_torch(judge_dir, tmp_path):
    out = tmp_path / "onnx"
    result = export_judge(judge_dir, out, n_records=12, parity=_parity())
    fp32 = result.report["variants"]["reader.onnx"]
    assert fp32["passed"] and fp32["min_cosine"] > 0.9999 and fp32["max_stat_diff"] < 1e-3
    assert fp32["agreement"] == 1.0
    # the shared-prefix graphs go through the gate too: each pair's two answers read after their prompt's cache
    assert fp32["shared_min_cosine"] > 0.9999 and fp32["shared_max_stat_diff"] < 1e-4
    assert {"head.safetensors", "judge_card.json", "parity_report.json", "reader.onnx", "prefix.onnx",
            "continuation.onnx", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not list(out.glob("*.joblib")) and not list(out.glob("*.pkl"))
    card = JudgeCard.load(out)
    assert card.runtime["backend"] == "onnx" and card.runtime["reader"]["template"][0].startswith("<s>user: ")
    assert card.runtime["reader"]["shared_prefix"]["variants"] == ["fp32"]

    pairs = _pairs(6, start=30)
    items = [{"question": p.question, "answer_a": p.answer_a, "answer_b": p.answer_b} for p in pairs]
    onnx_judge, torch_judge = Judge.load(out), Judge.load(judge_dir)
    assert onnx_judge.backend_name.startswith("onnx")
    np.testing.assert_allclose([c.p_a for c in onnx_judge.compare_batch(items)],
                               [c.p_a for c in torch_judge.compare_batch(items)], atol=1e-4)
    script = ("import sys, json; from clfjudge.judges.base import Judge; "
              f"j = Judge.load({str(out)!r}); r = j.compare_batch({items!r}); "
              "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules, "
              "'p_a': [c.p_a for c in r]}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert not seen["torch"] and not seen["transformers"]
    np.testing.assert_allclose(seen["p_a"], [c.p_a for c in onnx_judge.compare_batch(items)], atol=1e-6)
    warmed = Judge.load(out, max_batch_tokens=4096)  # a server's warm-up opens every session, shared prefix too
    assert warmed.warm_up() >= 3
    assert warmed.model.embedder._session is not None and warmed.model.embedder._shared is not None
    assert len(warmed.model.embedder) == 0  # and keeps none of its made-up readings
    np.testing.assert_allclose([c.p_a for c in warmed.compare_batch(items)],
                               [c.p_a for c in onnx_judge.compare_batch(items)], atol=1e-6)


def test_int8_reader_goes_through_the_gate(judge_dir, tmp_path):
    # a random tiny model's features barely move under int8, but its decisions sit near ties: the gate measures
    with pytest.raises(ParityError, match="feature cosine"):
        export_judge(judge_dir, tmp_path / "strict", int8=True, n_records=12,
                     parity=_parity(**{"int8.min_cosine": 1.01}))
    assert not (tmp_path / "strict").exists()  # refused: nothing written
    result = export_judge(judge_dir, tmp_path / "int8", int8=True, n_records=12,
                          parity=_parity(**{"int8.min_agreement": 0.0, "int8.max_metric_delta": 1.0}))
    assert result.primary == "reader_quantized.onnx"
    int8_judge = Judge.load(tmp_path / "int8", provider="cpu")  # the primary (auto: the fastest run that passed)
    assert int8_judge.backend_name == "onnx (int8)"
    assert not int8_judge.model.embedder.shares_prefixes  # the shared-prefix graphs are fp32 only
    assert Judge.load(tmp_path / "int8", variant="fp32").backend_name == "onnx (fp32)"


def test_int8_fallback_writes_fp32_when_the_gate_refuses_only_int8(judge_dir, tmp_path):
    result = export_judge(judge_dir, tmp_path / "fallback", int8=True, fallback=True, n_records=12,
                          parity=_parity(**{"int8.min_cosine": 1.01}))
    assert result.primary == "reader.onnx" and list(result.report["variants"]) == ["reader.onnx"]
    assert "feature cosine" in result.report["refused"]["reason"]
    assert not list((tmp_path / "fallback").glob("reader_quantized*"))  # the refused file is not shipped
    assert Judge.load(tmp_path / "fallback").backend_name == "onnx (fp32)"
    with pytest.raises(ParityError, match="max_abs_diff"):  # a failing fp32 variant still fails the export
        export_judge(judge_dir, tmp_path / "broken", int8=True, fallback=True, n_records=12,
                     parity=_parity(**{"int8.min_cosine": 1.01, "fp32.max_abs_diff": -1.0}))


def test_int4_reader_is_exported_gated_loaded_and_scored(judge_dir, tmp_path):
    import onnx

    out = tmp_path / "int4"
    # a random tiny judge's decisions sit near ties: here the gate keeps int4 whatever it decides
    result = export_judge(judge_dir, out, int4=True, n_records=12,
                          parity=_parity(**{"int4.min_agreement": 0.0, "int4.max_metric_delta": 1.0}))
    assert result.primary == "reader_int4.onnx"
    gate = result.report["variants"]["reader_int4.onnx"]
    assert gate["passed"] and gate["precision"] == "int4" and 0.9 < gate["min_cosine"] < 0.99999  # int4 bends them
    files = JudgeCard.load(out).runtime["reader"]["files"]
    assert files["reader_int4.onnx"]["precision"] == "int4" and files["reader_int4.onnx"]["fp32_nodes"] == 1
    assert files["reader_int4.onnx"]["bytes"] == sum(p.stat().st_size for p in out.glob("reader_int4.onnx*"))
    ops = {n.name: n.op_type for n in onnx.load(str(out / "reader_int4.onnx"), load_external_data=False).graph.node}
    assert "MatMulNBits" in ops.values() and ops["/lm_head/MatMul"] == "MatMul"  # token statistics' LM head: fp32
    assert "reader_int4.onnx" in json.loads((out / "signature.json").read_text())["graphs"]

    int4 = Judge.load(out, variant="int4", provider="cpu")
    assert int4.backend_name == "onnx (int4)" and int4.model.embedder.precision == "onnx-int4"
    assert not int4.model.embedder.shares_prefixes  # the shared-prefix graphs are fp32 only
    assert Judge.load(out, provider="cpu").backend_name == "onnx (int4)"  # the primary
    items = [{"question": p.question, "answer_a": p.answer_a, "answer_b": p.answer_b} for p in _pairs(6, start=30)]
    got = [c.p_a for c in int4.compare_batch(items)]
    want = [c.p_a for c in Judge.load(out, variant="fp32", provider="cpu").compare_batch(items)]
    assert np.isfinite(got).all() and got != want
    np.testing.assert_allclose(got, want, atol=0.1)


def test_a_refused_int4_fails_the_export_or_with_fallback_is_left_out_with_its_gap(judge_dir, tmp_path):
    strict = _parity(**{"int4.min_agreement": 1.01, "int4.min_cosine": 1.01})  # no reader meets these
    with pytest.raises(ParityError, match=r"reader_int4.onnx \(int4\): feature cosine"):
        export_judge(judge_dir, tmp_path / "strict", int4=True, n_records=12, parity=strict)
    assert not list(tmp_path.iterdir())  # refused: nothing written

    out = tmp_path / "fallback"
    result = export_judge(judge_dir, out, int4=True, fallback=True, n_records=12, parity=strict)
    refused = result.report["refused"]
    gap = refused["variants"]["reader_int4.onnx"]
    assert not gap["passed"] and gap["agreement"] <= 1.0 and gap["min_cosine"] < 1.0
    assert f"feature cosine {gap['min_cosine']:.6f} < min_cosine 1.01" in refused["reason"]
    assert f"decision agreement {gap['agreement']:.2%} < min_agreement 101.00%" in refused["reason"]
    assert result.primary == "reader.onnx" and list(result.report["variants"]) == ["reader.onnx"]
    assert not list(out.glob("reader_int4*"))  # the refused file is not shipped
    assert set(JudgeCard.load(out).runtime["reader"]["files"]) == {"reader.onnx"}
    on_disk = json.loads((out / "parity_report.json").read_text())
    assert on_disk["refused"]["variants"]["reader_int4.onnx"]["agreement"] == gap["agreement"]
    assert Judge.load(out).backend_name == "onnx (fp32)"
    printed = io.StringIO()
    _print_variants(result.report, printed)  # what clfjudge export prints: the refused run's numbers too
    line = next(x for x in printed.getvalue().splitlines() if "reader_int4.onnx" in x)
    assert f"cosine {gap['min_cosine']:.4f}" in line and f"agreement {gap['agreement']:.2%}" in line
    assert line.endswith("refused, left out")


def test_the_gate_reads_afresh_whatever_the_embedding_cache_holds(judge_dir, tmp_path, monkeypatch):
    """Vectors cached by an earlier run are never what the gate compares: a broken graph could pass on them."""
    from clfjudge.embedders.cache import ENV

    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV, str(cache))
    export_judge(judge_dir, tmp_path / "onnx", n_records=8, parity=_parity())
    assert not cache.exists() or not any(cache.rglob("shard-*"))


@pytest.mark.parametrize("stats", [False, True])
def test_shared_prefix_graphs_read_as_whole(chat_llama_dir, tmp_path, stats):
    """Best-of-n in ONNX: the prompt's key/value cache from prefix.onnx, broadcast to batches of answers in
    continuation.onnx (positions go on from the prompt's length) = each prompt + answer read whole, to 1e-4, at
    prompt and answer lengths the graphs were not traced with."""
    from clfjudge.embedders.decoder import DecoderEmbedder
    from clfjudge.embedders.onnx_reader import OnnxDecoderReader
    from clfjudge.export.embedding import export_reader, export_shared_prefix

    embedder = DecoderEmbedder(str(chat_llama_dir), layer=1, stats=stats, stats_tokens=5 if stats else None)
    embedder._load()
    sample = [(embedder.prompt_ids("Short?"), embedder.answer_ids("An apple.")),
              (embedder.prompt_ids("Short?"), embedder.answer_ids("A red fruit that grows on trees."))]
    export_reader(embedder, tmp_path / "reader.onnx", sample)
    graphs = export_shared_prefix(embedder, tmp_path, sample)
    assert graphs["layers"] == (2 if stats else 1)  # without statistics only the layers up to the pooled one
    assert "past_key_values.0.key" in graphs["continuation_inputs"] and "present.0.value" in graphs["prefix_outputs"]
    embedder._tokenizer.save_pretrained(tmp_path)
    before, after = embedder.template_parts()
    card = {"backbone": str(chat_llama_dir), "depth": 2, "hidden_size": 32, "eos_token_id": embedder.eos_id,
            "template": [before, after], "primary": "fp32"}
    config = {"layer": 1, "max_prompt_tokens": 256, "max_answer_tokens": 384, "stats": stats,
              "stats_tokens": 5 if stats else None}
    three = LoadOptions(provider="cpu", budget=Budget(3))
    shared = OnnxDecoderReader(tmp_path, {**card, "shared_prefix": graphs}, config, three, cache_dir="")
    # an export without the graphs, its card as older exports wrote it (the backbone under "encoder")
    older = {"encoder" if key == "backbone" else key: value for key, value in card.items()}
    old = OnnxDecoderReader(tmp_path, older, config, three, cache_dir="")
    assert shared.shares_prefixes and not old.shares_prefixes and old.backbone == shared.backbone
    prefix = shared.prompt_ids("What is an apple, and why do so many people eat one every single day of the year?")
    bodies = [shared.answer_ids(f"Candidate {i}: " + "the apple is a fruit " * (i + 1)) for i in range(7)]
    whole_vec, whole_lp = shared._read([(prefix, b) for b in bodies], stats)
    vec, lp = shared._read_shared(prefix, bodies, stats)
    np.testing.assert_allclose(vec, whole_vec, atol=1e-4)
    reference, _ = embedder._read([(prefix, b) for b in bodies], False)  # PyTorch, read whole
    np.testing.assert_allclose(vec, reference, atol=1e-4)
    old_vec, _ = old._read_shared(prefix, bodies, stats)  # falls back to reading whole
    np.testing.assert_allclose(old_vec, whole_vec, atol=1e-6)
    if stats:
        for a, b in zip(lp, whole_lp):
            assert len(a) == min(5, len(b)) and np.abs(a - b).max() < 1e-4
    questions = ["What is an apple?"] * 4 + ["Why?"] * 2 + ["Where?"]
    answers = [f"Answer {i}: " + "a fruit " * (i + 1) for i in range(7)]
    rows = shared._answers(questions, answers)  # grouped by prompt: the four answers of one after its cache
    np.testing.assert_allclose(rows, old._answers(questions, answers), atol=1e-4)


def test_min_cosine_gates_the_shared_prefix_graphs_too():
    from clfjudge.export.parity import Thresholds

    failures = Thresholds(min_cosine=0.9999).failures({"min_cosine": 1.0, "shared_min_cosine": 0.98})
    assert failures == ["shared-prefix feature cosine 0.980000 < min_cosine 0.9999"]


def test_a_tiny_export_prints_no_tracer_warning_and_no_quantization_hint(judge_dir, tmp_path, caplog):
    """The decoder reader is traced (TorchScript) and quantized by onnxruntime: the tracer's TracerWarnings and
    onnxruntime's pre-processing hint are silenced around those calls (clfjudge/export/quiet.py)."""
    import logging
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        export_judge(judge_dir, tmp_path / "int8", int8=True, n_records=12,
                     parity=_parity(**{"int8.min_agreement": 0.0, "int8.max_metric_delta": 1.0}))
    assert not [w for w in seen if issubclass(w.category, torch.jit.TracerWarning)]
    assert not [r for r in caplog.records if "pre-processing" in r.getMessage()]


def test_the_quiet_export_silences_only_what_it_names():
    import contextlib
    import logging
    import warnings

    import torch

    from clfjudge.export import quiet

    def traced():
        torch.jit.trace(lambda x: x * x.sum().item(), torch.ones(2))  # a Python number read from a tensor

    def tracer_warnings(quiet_export: bool) -> tuple[int, list[str]]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with quiet.torch_onnx_export() if quiet_export else contextlib.nullcontext():
                traced()
                warnings.warn("still shown", UserWarning, stacklevel=1)
        return (sum(issubclass(w.category, torch.jit.TracerWarning) for w in seen),
                [str(w.message) for w in seen if w.category is UserWarning])

    assert tracer_warnings(quiet_export=False)[0] > 0  # the tracer does warn
    assert tracer_warnings(quiet_export=True) == (0, ["still shown"])  # not inside; other warnings still show
    hint = logging.LogRecord("root", logging.WARNING, "/x/onnxruntime/quantization/quantize.py", 1,
                             "Please consider to run pre-processing before quantization.", None, None)
    other = logging.LogRecord("root", logging.WARNING, "/x/onnxruntime/quantization/quantize.py", 1, "other", None,
                              None)
    with quiet.quantization():
        assert not logging.getLogger().filter(hint) and logging.getLogger().filter(other)
    assert logging.getLogger().filter(hint)  # only inside


def test_the_three_graphs_share_one_copy_of_the_weights_and_describe_themselves(judge_dir, tmp_path):
    import os
    import stat

    out = tmp_path / "onnx"
    old = os.umask(0o022)
    try:
        export_judge(judge_dir, out, n_records=12, parity=_parity())
    finally:
        os.umask(old)
    shared = JudgeCard.load(out).runtime["reader"]["shared_weights"]
    graphs = ["reader.onnx", "prefix.onnx", "continuation.onnx"]
    on_disk = sum((out / g).stat().st_size for g in graphs) + (out / "weights.data").stat().st_size
    assert shared["bytes_after"] == on_disk
    # every large tensor of prefix / continuation is one the reader holds: the weights are on disk once, not 3 times
    reader_tensors = shared["tensors"] - shared["shared_tensors"]
    assert shared["shared_tensors"] >= 2 * reader_tensors - 2
    weights_inline = shared["bytes_before"] - sum((out / g).stat().st_size for g in graphs)
    print(f"reader + prefix + continuation: {shared['bytes_before']} bytes inline ({weights_inline} of weights), "
          f"{on_disk} with {(out / 'weights.data').stat().st_size} of shared weights")
    assert (out / "weights.data").stat().st_size < 0.45 * weights_inline
    signature = json.loads((out / "signature.json").read_text())
    assert set(signature["graphs"]) == set(graphs)
    assert [i["name"] for i in signature["graphs"]["reader.onnx"]["inputs"]][:3] == ["input_ids", "attention_mask",
                                                                                     "pool"]
    assert signature["postprocessing"]["columns"] == ["A", "TIE", "B"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o644}
    assert stat.S_IMODE(out.stat().st_mode) == 0o755


@pytest.mark.parametrize("graph, corrupt", [
    ("prefix.onnx", "the reader's graph"), ("continuation.onnx", "the reader's graph"), ("prefix.onnx", "bytes")])
def test_a_corrupt_shared_prefix_graph_fails_the_start_up_check(judge_dir, tmp_path, graph, corrupt, monkeypatch,
                                                                capsys):
    """A graph only a group of answers to one prompt runs is opened and checked with the reader, so the start-up
    check (one short item) finds it broken: score and serve (even with --no-warm-up) exit 3 with one line naming it
    before any input, where the judge used to start healthy and fail every group of four answers to one prompt."""
    import shutil

    from clfjudge.cli import main
    from clfjudge.judges.base import JudgeError, load_ready
    from clfjudge.serving import listen

    out = tmp_path / "onnx"
    export_judge(judge_dir, out, n_records=12, parity=_parity())
    if corrupt == "the reader's graph":  # a well-formed graph that opens, fed what it does not take
        shutil.copyfile(out / "reader.onnx", out / graph)
    else:  # not ONNX at all: refused before, without naming the file
        (out / graph).write_bytes(b"not an ONNX graph" * 10)
    with pytest.raises(JudgeError, match=graph):
        load_ready(out)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"question": "Name a prime.", "answer_a": "7", "answer_b": "9"}) + "\n")
    capsys.readouterr()
    assert main(["score", str(out), "--input", str(pairs), "--output", str(tmp_path / "scores.jsonl")]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"clfjudge: error: judge {out} cannot be used: ") and graph in err, err
    assert err.count("\n") == 1 and not (tmp_path / "scores.jsonl").exists()
    monkeypatch.setattr(listen, "serve", lambda *a, **kw: pytest.fail("a broken judge was served"))
    assert main(["serve", str(out), "--no-warm-up", "--port", "0"]) == 3
    assert graph in capsys.readouterr().err


KILLED_AFTER = 4  # output writes (chunks): the fourth chunk's rows reach the file, its checkpoint never does
KILL_SCRIPT = """
import os, signal, sys
from clfjudge.cli import main
from clfjudge.scoring import files

real, writes = files.Sink.write, []

def write(self, data):  # kill -9 once the fourth chunk's rows are in the file, before their checkpoint
    real(self, data)
    if data and self.path is not None and self.path.name.endswith(".jsonl.partial"):
        writes.append(1)
        if len(writes) == {killed}:
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)

files.Sink.write = write
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def served_dir(judge_dir, tmp_path_factory):
    """The judge exported with OpenVINO bf16 gated where this machine runs it (left out elsewhere)."""
    out = tmp_path_factory.mktemp("served") / "onnx"
    export_judge(judge_dir, out, n_records=12, parity=_parity(), providers=["openvino-bf16"])
    return out


@pytest.mark.parametrize("provider", ["auto", "openvino-bf16"])
def test_a_killed_score_resumes_within_the_cards_batch_tolerance(served_dir, tmp_path, capsys, provider):
    """kill -9 mid-run, then --resume, on the served path of an exported judge (and on OpenVINO bf16): every id
    once, in order, and every number within the batch tolerance the card states (the rows after the checkpoint are
    read in other batches, and answers the killed run had in memory are read again), which --resume prints."""
    from clfjudge.cli import main

    out = served_dir
    stated = JudgeCard.load(out).runtime["onnx"]["batch_tolerance"]
    assert stated["reader.onnx"] == ParityConfig.load().for_precision("fp32").batch_tolerance
    if provider != "auto" and f"reader.onnx @ {provider}" not in stated:
        pytest.skip(f"{provider} was not gated on this machine")
    pairs = _pairs(24, start=60)
    # five pairs to a question, two answers_a among them: a question straddles the checkpoint (line 12), so the
    # uninterrupted run reads some of the answers after it from memory, the resumed run in its own batches
    lines = [{"id": p.id, "question": pairs[i - i % 5].question, "answer_a": pairs[i % 2].answer_a,
              "answer_b": p.answer_b} for i, p in enumerate(pairs)]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["score", str(out), "--input", str(inp), "--chunk-size", "4", "--provider", provider]
    assert main([*argv, "--output", str(tmp_path / "whole.jsonl")]) == 0
    killed = subprocess.run([sys.executable, "-c", KILL_SCRIPT.replace("{killed}", str(KILLED_AFTER)), *argv,
                             "--output", str(tmp_path / "resumed.jsonl")], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert len((tmp_path / "resumed.jsonl.partial").read_text().splitlines()) == 4 * KILLED_AFTER
    capsys.readouterr()
    assert main([*argv, "--output", str(tmp_path / "resumed.jsonl"), "--resume"]) == 0
    err = capsys.readouterr().err
    run, tolerance = Judge.load(out, provider=provider).batch_tolerance()
    assert f"resuming after line {4 * (KILLED_AFTER - 1)} of" in err
    assert (f"may differ from an uninterrupted run's by up to {tolerance:g} (a row's numbers move with the batch it "
            f"is judged in; {run}: the judge card's batch_tolerance)") in err
    whole, resumed = ([json.loads(row) for row in (tmp_path / name).read_text().splitlines()]
                      for name in ("whole.jsonl", "resumed.jsonl"))
    assert [r["id"] for r in resumed] == [r["id"] for r in whole] == [line["id"] for line in lines]
    assert [r["verdict"] for r in resumed] == [r["verdict"] for r in whole]
    for key in ("p_a", "p_tie", "p_b"):
        assert np.abs(np.array([r[key] for r in resumed]) - [r[key] for r in whole]).max() <= tolerance
