"""The Judge runtime (torch / onnxruntime / scikit-learn backends), calibration and `clfjudge score` /
`clfjudge calibrate`, on tiny random judges, a small embedding judge and real PandaLM slices."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from scipy.special import softmax
from tiny_judges import make_judge

from clfjudge.card import SCHEMA_VERSION, JudgeCard
from clfjudge.cli import main
from clfjudge.data.records import Loc, PairRecord, RecordError, Verdict
from clfjudge.export.onnx import export_judge
from clfjudge.judges.base import Comparison, Judge, Score
from clfjudge.judges.calibration import Calibration, decide, fit_calibration, fit_temperature, nll, search_tie_margin
from clfjudge.judges.model import FineTunedJudge
from clfjudge.models.heads import PairOutputs, davidson_probs

Q = "What is the capital of France?"
ANSWERS = ["Paris.", "The cat sat on the mat.", "Paris is the capital and largest city of France. " * 5,
           "Lyon, which is a city.", "", "I do not know, but it could be Marseille or Paris or Nice."]


@pytest.fixture(scope="module")
def cls3_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    return make_judge(tiny_bert_dir, tmp_path_factory.mktemp("cls3") / "judge")


@pytest.fixture(scope="module")
def onnx_dir(cls3_dir, tmp_path_factory) -> Path:
    return export_judge(cls3_dir, tmp_path_factory.mktemp("onnx") / "judge", n_records=8).out_dir


@pytest.fixture(scope="module")
def reward_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    return make_judge(tiny_bert_dir, tmp_path_factory.mktemp("reward") / "judge", head="reward")


@pytest.fixture(scope="module")
def regression_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    return make_judge(tiny_bert_dir, tmp_path_factory.mktemp("regression") / "judge", head="regression",
                      gain=400.0)


def pairs(n: int = 6) -> list[dict]:
    return [{"id": f"p{i}", "question": Q, "answer_a": ANSWERS[i % len(ANSWERS)],
             "answer_b": ANSWERS[(i * 5 + 1) % len(ANSWERS)]} for i in range(n)]


# -- loading ----------------------------------------------------------------------------------------------

def test_load_picks_the_backend_from_the_directory(cls3_dir, onnx_dir, tmp_path):
    assert Judge.load(cls3_dir).backend_name == "torch"
    assert Judge.load(onnx_dir).backend_name == "onnx"
    assert Judge.load(cls3_dir, backend="torch", threads=1).backend_name == "torch"
    with pytest.raises(FileNotFoundError, match="ONNX files only"):
        Judge.load(onnx_dir, backend="torch")
    with pytest.raises(ValueError, match="applies to ONNX"):
        Judge.load(cls3_dir, variant="int8")
    with pytest.raises(FileNotFoundError, match="holds \\['model.onnx'\\]"):
        Judge.load(onnx_dir, variant="int8")
    with pytest.raises(KeyError, match="unknown judge backend"):
        Judge.load(cls3_dir, backend="tensorrt")
    with pytest.raises(ValueError, match="provider 'cuda'"):
        Judge.load(onnx_dir, provider="cuda")  # this onnxruntime build has no CUDA provider
    with pytest.raises(FileNotFoundError, match="judge_card.json is missing"):
        Judge.load(tmp_path)
    bare = tmp_path / "bare"
    bare.mkdir()
    JudgeCard.load(cls3_dir).save(bare)
    with pytest.raises(FileNotFoundError, match="no model found"):
        Judge.load(bare)


def test_load_options_are_one_typed_value(cls3_dir):
    """Judge.load's keywords build one LoadOptions, the value every loader takes; a misspelt option or a bad
    budget is refused before anything loads."""
    from clfjudge.batching import Budget
    from clfjudge.options import LoadOptions

    options = LoadOptions(backend="torch", threads=1, budget=Budget(4, 256, 0.5))
    assert LoadOptions.of(backend="torch", threads=1, batch_size=4, max_batch_tokens=256, max_padding=0.5) == options
    judge = Judge.load(cls3_dir, options)
    assert judge.budget == Budget(4, 256, 0.5) and judge.batch_size == 4
    with pytest.raises(TypeError, match=r"unknown judge load option\(s\) \['thread'\]"):
        Judge.load(cls3_dir, thread=2)
    with pytest.raises(TypeError, match="not both"):
        Judge.load(cls3_dir, options, threads=2)
    with pytest.raises(ValueError, match="max_padding must be a fraction"):
        Judge.load(cls3_dir, max_padding=2.0)
    with pytest.raises(ValueError, match="memory_items must be a positive"):
        LoadOptions(memory_items=0)


@pytest.mark.parametrize("damage, where, words", [
    (lambda text: text.replace('"', "", 1), ":2:", "not valid JSON: Expecting property name"),
    (lambda text: "[" + text + "]", ":?:", "a judge card is a JSON object, got list"),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "kind"}), ":?:",
     "field 'kind': is missing"),
    (lambda text: json.dumps({**json.loads(text), "max_length": "512"}), ":?:", "field 'max_length': must be int"),
    (lambda text: json.dumps({**json.loads(text), "runtime": []}), ":?:", "field 'runtime': must be dict"),
])
def test_a_corrupt_card_names_its_file(cls3_dir, tmp_path, damage, where, words):
    card = tmp_path / "judge_card.json"
    card.write_text(damage((cls3_dir / "judge_card.json").read_text()))
    with pytest.raises(RecordError) as err:
        Judge.load(tmp_path)
    assert str(err.value).startswith(f"{card}{where}") and words in str(err.value)
    card.write_bytes(b'{"head": "\xff"}')
    with pytest.raises(RecordError, match=f"{card}:\\?: not a readable judge card"):
        JudgeCard.load(tmp_path)


def _card() -> JudgeCard:
    return JudgeCard(kind="fine-tuned", head="cls3", arity="pair", backbone="minilm", scheme="encoder-pair",
                     max_length=128, label_map={"0": "A", "1": "tie", "2": "B"},
                     truncation={"policy": {"answer": 200}}, calibration={"temperature": 1.5},
                     runtime={"format": "hf"}, created="2026-01-01T00:00:00+00:00")


def _version_2(card: JudgeCard) -> dict:
    """``card`` as version 2 wrote it: the kind or the head in ``head``, pair / point in ``kind``."""
    data = {k: v for k, v in asdict(card).items() if k != "arity"}
    return {**data, "head": card.head or card.kind, "kind": card.arity, "schema_version": 2}


@pytest.mark.parametrize("card", [_card(), replace(_card(), kind="verdict", head="", arity="point"),
                                  replace(_card(), kind="embedding", head="")])
def test_an_older_card_loads_in_the_current_layout(tmp_path, card):
    v2 = _version_2(card)
    v1 = {k: v for k, v in v2.items() if k != "schema_version"}  # what cards before version 2 hold
    for old in (v1, v2):
        (tmp_path / "judge_card.json").write_text(json.dumps(old, indent=2, sort_keys=True))
        loaded = JudgeCard.load(tmp_path)
        assert loaded == card and loaded.schema_version == SCHEMA_VERSION == 3
        assert loaded.name == old["head"]  # what a version-2 card called the judge, still its name


def test_an_old_card_of_an_unregistered_kind_keeps_its_name_as_the_kind(tmp_path):
    (tmp_path / "judge_card.json").write_text(json.dumps({**_version_2(_card()), "head": "toy-rule"}))
    loaded = JudgeCard.load(tmp_path)
    assert (loaded.kind, loaded.head, loaded.arity) == ("toy-rule", "", "pair")
    with pytest.raises(ValueError, match="field 'kind': 'toy-rule' is no registered judge kind"):
        Judge.load(tmp_path)


def test_a_saved_card_carries_the_schema_version(tmp_path):
    card = _card()
    card.schema_version = 1  # whatever the object says, a save writes the current layout
    data = json.loads(card.save(tmp_path).read_text())
    assert data["schema_version"] == 3
    assert (data["kind"], data["head"], data["arity"]) == ("fine-tuned", "cls3", "pair")
    assert JudgeCard.load(tmp_path) == _card()


@pytest.mark.parametrize("version, words", [
    (99, "field 'schema_version': is 99, newer than the 3 this clfjudge reads"),
    ("2", "field 'schema_version': must be an int >= 1, got '2'"),
    (0, "field 'schema_version': must be an int >= 1, got 0"),
])
def test_a_card_of_an_unknown_schema_version_is_refused(tmp_path, version, words):
    path = tmp_path / "judge_card.json"
    path.write_text(json.dumps({**asdict(_card()), "schema_version": version, "a_future_key": 1}))
    with pytest.raises(RecordError) as err:
        JudgeCard.load(tmp_path)
    assert str(err.value).startswith(f"{path}:?: ") and words in str(err.value)


def test_a_card_arity_is_pair_or_point(tmp_path):
    path = tmp_path / "judge_card.json"
    path.write_text(json.dumps({**asdict(_card()), "arity": "triple"}))
    with pytest.raises(RecordError, match="field 'arity': must be one of pair, point, got 'triple'"):
        JudgeCard.load(tmp_path)


def test_torch_and_onnx_judges_agree(cls3_dir, onnx_dir):
    torch_out = Judge.load(cls3_dir).compare_batch(pairs())
    onnx_out = Judge.load(onnx_dir).compare_batch(pairs())
    for t, o in zip(torch_out, onnx_out):
        np.testing.assert_allclose([t.p_a, t.p_tie, t.p_b], [o.p_a, o.p_tie, o.p_b], atol=1e-5)
        assert t.verdict == o.verdict


# -- compare / score --------------------------------------------------------------------------------------

def test_compare_returns_typed_calibrated_results(cls3_dir):
    judge = Judge.load(cls3_dir)
    result = judge.compare(Q, "Paris.", "The cat sat on the mat.")
    assert isinstance(result, Comparison) and isinstance(result.verdict, Verdict)
    assert result.p_a + result.p_tie + result.p_b == pytest.approx(1.0)
    best = max([(result.p_tie, Verdict.TIE), (result.p_a, Verdict.A), (result.p_b, Verdict.B)])[1]
    assert result.verdict is best and result.margin is None
    assert result.to_dict()["verdict"] == result.verdict.value
    records = [PairRecord.build(Loc("mem", i), **p, verdict="A", allow_empty_answers=True)
               for i, p in enumerate(pairs())]
    from_records = judge.compare_batch(records)
    from_dicts = judge.compare_batch(pairs())
    assert [r.p_a for r in from_records] == pytest.approx([r.p_a for r in from_dicts])
    assert judge.compare_batch([]) == []
    assert judge.truncation["records"] >= 2 * len(pairs())


def test_length_bucketing_restores_the_input_order(cls3_dir):
    batched = Judge.load(cls3_dir, batch_size=2)
    items = pairs(12)
    records = [PairRecord.build(Loc(), **p, unlabelled=True, allow_empty_answers=True) for p in items]
    lengths = [len(batched.encode(record)[0]["input_ids"]) for record in records]
    assert lengths != sorted(lengths)  # the order really changes inside raw_outputs
    together = batched.compare_batch(items)
    alone = [batched.compare_batch([p])[0] for p in items]
    for t, a in zip(together, alone):
        np.testing.assert_allclose([t.p_a, t.p_tie, t.p_b], [a.p_a, a.p_tie, a.p_b], atol=1e-5)


def test_symmetric_compare_is_order_invariant(cls3_dir):
    judge = Judge.load(cls3_dir)
    a, b = "Paris.", "Lyon is a large city in the south-east of France."
    plain, plain_rev = judge.compare(Q, a, b), judge.compare(Q, b, a)
    assert abs(plain.p_a - plain_rev.p_b) > 1e-4  # the plain cross-encoder does depend on the order
    sym, sym_rev = judge.compare(Q, a, b, symmetric=True), judge.compare(Q, b, a, symmetric=True)
    assert (sym.p_a, sym.p_tie, sym.p_b) == (sym_rev.p_b, sym_rev.p_tie, sym_rev.p_a)
    assert sym.verdict == sym_rev.verdict.swapped()
    forward = judge.compare_batch(pairs(), symmetric=True)
    swapped = judge.compare_batch([{**p, "answer_a": p["answer_b"], "answer_b": p["answer_a"]} for p in pairs()],
                                  symmetric=True)
    for f, s in zip(forward, swapped):
        np.testing.assert_allclose([f.p_a, f.p_tie, f.p_b], [s.p_b, s.p_tie, s.p_a], atol=1e-6)


def test_bad_inputs_and_wrong_tasks_are_named(cls3_dir, regression_dir):
    judge = Judge.load(cls3_dir)
    with pytest.raises(RecordError, match="<batch item>:2: field 'answer_b': is missing"):
        judge.compare_batch([pairs(1)[0], {"question": Q, "answer_a": "x"}])
    with pytest.raises(RecordError, match="field 'question': must be a string"):
        judge.compare_batch([{"question": 3, "answer_a": "x", "answer_b": "y"}])
    with pytest.raises(ValueError, match="cls3 judge \\(pair\\) cannot score; it can compare"):
        judge.score(Q, "Paris.")
    with pytest.raises(ValueError, match="cannot compare"):
        Judge.load(regression_dir).compare(Q, "a", "b")


def test_regression_judge_scores_on_its_scale(regression_dir):
    judge = Judge.load(regression_dir)
    scores = judge.score_batch([{"question": Q, "answer": a} for a in ANSWERS])
    assert all(isinstance(s, Score) and 1.0 <= s.value <= 5.0 for s in scores)
    assert len({round(s.value, 6) for s in scores}) > 1
    assert judge.score(Q, ANSWERS[2]).value == pytest.approx(scores[2].value, abs=1e-5)


def test_reward_judge_compares_and_scores(reward_dir):
    judge = Judge.load(reward_dir)
    assert judge.position_invariant and judge.tasks == {"compare", "score"}
    a, b = "Paris.", "The cat sat on the mat."
    result = judge.compare(Q, a, b)
    assert result.margin == pytest.approx(judge.score(Q, a).value - judge.score(Q, b).value, abs=1e-5)
    swapped = judge.compare(Q, b, a, symmetric=True)  # invariant by construction: one pass suffices
    assert (swapped.p_b == pytest.approx(result.p_a, abs=1e-6)
            and swapped.margin == pytest.approx(-result.margin, abs=1e-5))


# -- calibration ------------------------------------------------------------------------------------------

def test_temperature_scaling_fixes_an_overconfident_judge():
    rng = np.random.default_rng(0)
    true_logits = rng.normal(0, 1.2, size=(3000, 3))
    labels = np.array([rng.choice(3, p=p) for p in softmax(true_logits, axis=1)])
    overconfident = 4.0 * true_logits
    temperature = fit_temperature(overconfident, labels)
    assert temperature == pytest.approx(4.0, rel=0.15)
    assert nll(overconfident, labels, temperature) < nll(overconfident, labels) - 0.3
    # scaling never changes the argmax
    assert (Calibration(temperature).scale(overconfident).argmax(1) == overconfident.argmax(1)).all()


def _outputs(p_a, p_b) -> PairOutputs:
    p_a, p_b = np.asarray(p_a, float), np.asarray(p_b, float)
    return PairOutputs(p_a=p_a, p_tie=1 - p_a - p_b, p_b=p_b)


def test_tie_margin_search_maximises_autoj_agreement():
    # ties look like near-equal P(A) and P(B) but P(TIE) is never the largest, so argmax never says TIE
    gold = [Verdict.A, Verdict.B, Verdict.TIE, Verdict.TIE, Verdict.A, Verdict.TIE]
    fwd = _outputs([0.7, 0.2, 0.46, 0.43, 0.6, 0.44], [0.2, 0.7, 0.44, 0.45, 0.3, 0.47])
    rev = _outputs([0.2, 0.7, 0.45, 0.44, 0.3, 0.45], [0.7, 0.2, 0.45, 0.44, 0.6, 0.44])
    found = search_tie_margin(fwd, rev, gold)
    assert found["agreement_argmax"] == pytest.approx(3 / 6) and found["agreement"] == 1.0
    assert found["tie_margin"] == pytest.approx(0.03)  # the smallest margin that catches every tie
    assert decide(fwd, found["tie_margin"]) == gold
    assert Calibration(tie_margin=found["tie_margin"]).verdicts(fwd) == gold


def test_fit_calibration_per_head():
    rng = np.random.default_rng(1)
    margins = rng.normal(0, 2, 600)
    probs = davidson_probs(margins, 1.5, 0.5)
    gold = [(Verdict.A, Verdict.TIE, Verdict.B)[rng.choice(3, p=p)] for p in probs]
    rewards = np.stack([margins, np.zeros_like(margins)], axis=1)
    entry = fit_calibration("reward", rewards, rewards[:, ::-1], gold, {"scale": 1.0, "nu": 0.0})
    assert entry["method"] == "davidson" and entry["scale"] == pytest.approx(1.5, rel=0.25)
    assert entry["nll_after"] < entry["nll_before"] and entry["n_pairs"] == 600
    logits = np.log(probs[:, [1, 0, 2]]) * 3  # class order TIE, A, B; overconfident by 3
    entry = fit_calibration("cls3", logits, logits[:, [0, 2, 1]], gold)
    assert entry["temperature"] == pytest.approx(3.0, rel=0.25) and entry["nll_after"] < entry["nll_before"]
    with pytest.raises(ValueError, match="nothing to calibrate"):
        fit_calibration("regression", logits, logits, gold)
    with pytest.raises(ValueError, match="two distinct verdicts"):
        fit_calibration("cls3", logits[:5], logits[:5], [Verdict.TIE] * 5)
    # a preference file lists the chosen answer first: one verdict per order is enough, both orders are fitted
    first = fit_calibration("reward", rewards[:50], rewards[:50, ::-1], [Verdict.A] * 50)
    assert first["n_pairs"] == 50 and np.isfinite(first["scale"])


def test_runtime_applies_the_card_calibration(cls3_dir, tmp_path):
    calibrated = tmp_path / "calibrated"
    shutil.copytree(cls3_dir, calibrated)
    card = JudgeCard.load(calibrated)
    card.calibration = {"temperature": 3.0}
    card.save(calibrated)
    plain, hot = Judge.load(cls3_dir), Judge.load(calibrated)
    raw = plain.raw_outputs([PairRecord.build(Loc(), **p, unlabelled=True, allow_empty_answers=True) for p in pairs()])
    expected = softmax(raw / 3.0, axis=1)  # TIE, A, B
    got = hot.compare_batch(pairs())
    np.testing.assert_allclose([[c.p_tie, c.p_a, c.p_b] for c in got], expected, atol=1e-6)
    card.calibration = {"temperature": 1.0, "tie_margin": 1.0}  # every pair is within the margin
    card.save(calibrated)
    assert {c.verdict for c in Judge.load(calibrated).compare_batch(pairs())} == {Verdict.TIE}


def test_calibrate_cli_writes_the_card(cls3_dir, tmp_path, capsys):
    judge_dir = tmp_path / "judge"
    shutil.copytree(cls3_dir, judge_dir)
    assert main(["calibrate", str(judge_dir), "--source", "pandalm-test:40", "--batch-size", "8"]) == 0
    cal = JudgeCard.load(judge_dir).calibration
    assert cal["method"] == "temperature" and cal["fitted_on"]["source"] == "pandalm-test"
    assert cal["fitted_on"]["n"] == 40 and cal["fitted_on"]["excluded"] == {"beyond the sample of 40": 959}
    assert cal["nll_after"] <= cal["nll_before"] and "tie_margin" in cal
    judge = Judge.load(judge_dir)
    assert judge.calibration.temperature == pytest.approx(cal["temperature"])
    assert "calibration written" in capsys.readouterr().out


# -- embedding judges -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_embedding_judge_through_the_runtime(tmp_path):
    from clfjudge.data import sources
    from clfjudge.judges.embedding import EmbeddingModel

    records = [r for r in sources.load("pandalm-test").records if r.verdict is not Verdict.TIE][:60]
    fitted = EmbeddingModel(head_params={"C": 1.0}).fit(records[:40])
    fitted.save(tmp_path / "emb")
    judge = Judge.load(tmp_path / "emb")
    assert judge.backend_name == "sklearn" and judge.tasks == {"compare"}
    got = judge.compare_batch(records[40:])
    expected = fitted.predict_proba(records[40:])  # columns A, TIE, B
    np.testing.assert_allclose([[c.p_a, c.p_tie, c.p_b] for c in got], expected, atol=1e-6)


# -- clfjudge score ---------------------------------------------------------------------------------------

def _write_input(path: Path) -> Path:
    good = pairs(5)
    lines = [json.dumps(good[0]), json.dumps(good[1]), "{not json", json.dumps({"question": Q, "answer_a": "x"}),
             "", json.dumps(good[2]), json.dumps(["a", "list"]), json.dumps(good[3]),
             json.dumps({k: v for k, v in good[4].items() if k != "id"})]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_score_cli_reports_bad_lines_and_keeps_going(cls3_dir, tmp_path, capsys):
    src, out = _write_input(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    code = main(["score", str(cls3_dir), "--input", str(src), "--output", str(out), "--chunk-size", "2",
                 "--batch-size", "2"])
    assert code == 1  # some lines were rejected
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p0", "p1", "p2", "p3", "in.jsonl:9"]
    assert set(rows[0]) == {"id", "p_a", "p_tie", "p_b", "verdict"}
    rejected = [json.loads(line) for line in (tmp_path / "out.jsonl.rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rejected] == [(3, None), (4, "answer_b"), (7, None)]
    assert "invalid JSON" in rejected[0]["error"] and "expected a JSON object" in rejected[2]["error"]
    captured = capsys.readouterr()
    assert "lines read 9: scored 5, rejected 3, blank 1" in captured.out
    assert f"rejected {src}:4: field 'answer_b': is missing" in captured.err
    # the same pairs scored through the API give the same numbers
    api = Judge.load(cls3_dir).compare_batch(pairs(4))
    assert [r["p_a"] for r in rows[:4]] == pytest.approx([c.p_a for c in api], abs=1e-6)


def test_score_cli_isolates_inputs_the_judge_cannot_take(cls3_dir, tmp_path, monkeypatch, capsys):
    original = FineTunedJudge.raw_outputs

    def picky(self, records):
        if any(r.question == "BOOM" for r in records):
            raise ValueError("cannot encode BOOM")
        return original(self, records)

    monkeypatch.setattr(FineTunedJudge, "raw_outputs", picky)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    items = pairs(4)
    items[2]["question"] = "BOOM"
    src.write_text("".join(json.dumps(p) + "\n" for p in items))
    assert main(["score", str(cls3_dir), "--input", str(src), "--output", str(out), "--symmetric"]) == 1
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["p0", "p1", "p3"]
    rejected = json.loads((tmp_path / "out.jsonl.rejected.jsonl").read_text())
    assert rejected["line"] == 3 and "cannot encode BOOM" in rejected["error"]
    assert "scored 3, rejected 1" in capsys.readouterr().out


def test_score_cli_clean_run_and_tasks(reward_dir, onnx_dir, tmp_path, capsys):
    src, out = tmp_path / "answers.jsonl", tmp_path / "rewards.jsonl"
    src.write_text("".join(json.dumps({"id": f"a{i}", "question": Q, "answer": a}) + "\n"
                           for i, a in enumerate(ANSWERS)))
    assert main(["score", str(reward_dir), "--input", str(src), "--output", str(out), "--task", "score"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    judge = Judge.load(reward_dir)
    assert [r["score"] for r in rows] == pytest.approx([judge.score(Q, a).value for a in ANSWERS], abs=1e-5)
    assert not (tmp_path / "rewards.jsonl.rejected.jsonl").exists()
    assert "lines read 6: scored 6, rejected 0" in capsys.readouterr().out
    assert main(["score", str(reward_dir), "--input", str(src), "--output", str(out), "--task", "score",
                 "--symmetric"]) == 2
    assert main(["score", str(onnx_dir), "--input", str(src), "--output", str(out), "--task", "score"]) == 2
    assert "cannot score" in capsys.readouterr().err


def test_score_cli_rejects_a_lone_surrogate_and_keeps_the_chunk(cls3_dir, tmp_path, capsys):
    """A lone surrogate is valid JSON but no tokenizer takes it: that line is rejected (naming its field), the
    other lines of its chunk are scored."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    items = [json.dumps(p) for p in pairs(4)]
    items[1] = items[1].replace('"answer_b": "', '"answer_b": "\\ud800', 1)
    src.write_text("\n".join(items) + "\n")
    assert main(["score", str(cls3_dir), "--input", str(src), "--output", str(out)]) == 1
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["p0", "p2", "p3"]
    rejected = json.loads((tmp_path / "out.jsonl.rejected.jsonl").read_text())
    assert (rejected["line"], rejected["field"]) == (2, "answer_b")
    assert "not valid Unicode" in rejected["error"]
    assert "scored 3, rejected 1" in capsys.readouterr().out


# -- clfjudge score: a crash loses no line, --resume continues --------------------------------------------

def _resumable_input(path: Path) -> Path:
    """Good lines, bad lines, a blank line and two repeated ids, spread over chunks of 3 records."""
    p = pairs(8)
    lines = [p[0], p[1], "{not json", "", p[2], p[3], p[1], p[4], {"id": "x", "question": Q, "answer_a": "a"},
             p[5], p[0], p[6], p[7]]
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return path


def _partial(path: Path) -> Path:
    """Where a run writes ``path`` until it completes."""
    return path.with_name(path.name + ".partial")


def _score(judge_dir: Path, src: Path, out: Path, *extra: str) -> int:
    return main(["score", str(judge_dir), "--input", str(src), "--output", str(out), "--chunk-size", "3", *extra])


@pytest.fixture(scope="module")
def uninterrupted(cls3_dir, tmp_path_factory):
    """(output bytes, rejected bytes, exit code, summary line) of a run that is not interrupted."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    src, out = _resumable_input(tmp / "in.jsonl"), tmp / "out.jsonl"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = _score(cls3_dir, src, out)
    summary = stdout.getvalue().splitlines()[0]
    assert summary.startswith("lines read 13: scored 10, rejected 2, blank 1, duplicate ids 2")
    assert not (tmp / "out.jsonl.progress.json").exists()
    return out.read_bytes(), (tmp / "out.jsonl.rejected.jsonl").read_bytes(), code, summary


def _check_resumed(tmp_path: Path, cls3_dir: Path, uninterrupted, capsys) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    want_out, want_rejected, want_code, want_summary = uninterrupted
    capsys.readouterr()
    assert _score(cls3_dir, src, out, "--resume") == want_code
    assert out.read_bytes() == want_out and (tmp_path / "out.jsonl.rejected.jsonl").read_bytes() == want_rejected
    assert capsys.readouterr().out.splitlines()[0] == want_summary  # counts (duplicates too) span the two runs
    assert not (tmp_path / "out.jsonl.progress.json").exists()
    assert not _partial(out).exists() and not _partial(tmp_path / "out.jsonl.rejected.jsonl").exists()


@pytest.mark.parametrize("crash_at, accounted", [(1, 0), (2, 5), (4, 12)])
def test_score_crash_leaves_a_valid_prefix_and_resume_completes_it(cls3_dir, tmp_path, monkeypatch, capsys,
                                                                    uninterrupted, crash_at, accounted):
    """The judge fails (not on an input) at its ``crash_at``-th chunk: the output holds the chunks before it,
    the progress file and stderr say which lines are accounted for, and --resume gives an uninterrupted run's
    lines exactly, without duplicating any."""
    src, out = _resumable_input(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    original, calls = FineTunedJudge.raw_outputs, [0]

    def failing(self, records):
        calls[0] += 1
        if calls[0] == crash_at + 1:  # the first call is the judge's self-test, before any line is read
            raise RuntimeError("the accelerator fell off the bus")
        return original(self, records)

    monkeypatch.setattr(FineTunedJudge, "raw_outputs", failing)
    assert _score(cls3_dir, src, out) == 3  # the judge's fault: exit 3, the checkpoint kept
    monkeypatch.setattr(FineTunedJudge, "raw_outputs", original)
    progress = json.loads((tmp_path / "out.jsonl.progress.json").read_text())
    assert progress["line"] == accounted
    err = capsys.readouterr().err
    assert "fell off" in err and f"lines 1-{accounted} of {src} are accounted for" in err
    assert not out.exists()  # written under its partial name until the run completes
    written = _partial(out).read_bytes()
    assert uninterrupted[0].startswith(written) and written.endswith(b"\n") == bool(written)
    assert progress["files"]["output"]["bytes"] == len(written)
    _check_resumed(tmp_path, cls3_dir, uninterrupted, capsys)


def test_score_disk_failure_mid_write_is_cut_back_and_resumed(cls3_dir, tmp_path, monkeypatch, capsys,
                                                              uninterrupted):
    """The disk fills up halfway through writing the third chunk's lines: the half-written lines are cut off, the
    error is one line naming the file, and the output of an earlier run is left as it was."""
    from clfjudge.scoring.files import Sink

    src, out = _resumable_input(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    out.write_bytes(b"an earlier run's output\n")
    original, calls = Sink.write, [0]

    def disk_full(self, data):
        if self.path == _partial(out):
            calls[0] += 1
            if calls[0] == 3:
                original(self, data[: len(data) // 2])
                self.file.flush()
                raise OSError(28, "No space left on device", str(self.path))
        original(self, data)

    monkeypatch.setattr(Sink, "write", disk_full)
    assert _score(cls3_dir, src, out) == 4
    assert capsys.readouterr().err.splitlines()[-1] == f"clfjudge: error: {_partial(out)}: No space left on device"
    monkeypatch.setattr(Sink, "write", original)
    assert out.read_bytes() == b"an earlier run's output\n"
    written = _partial(out).read_bytes()
    assert written and uninterrupted[0].startswith(written) and written.endswith(b"\n")
    assert json.loads((tmp_path / "out.jsonl.progress.json").read_text())["line"] == 8
    _check_resumed(tmp_path, cls3_dir, uninterrupted, capsys)


def test_score_killed_hard_resumes_from_its_last_checkpoint(cls3_dir, tmp_path, capsys, uninterrupted):
    """SIGKILL (no handler runs) after the second chunk's lines reached the file but before its checkpoint: the
    output is longer than the progress file says, and --resume cuts the unaccounted lines before going on."""
    src, out = _resumable_input(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    script = f"""
import os, signal, sys
from clfjudge.cli import main
from clfjudge.scoring import files
commit, calls = files.Sink.commit, [0]
def dying(self):
    if self.path.name == "out.jsonl.partial":
        calls[0] += 1
        if calls[0] == 3:  # 1: the start, 2: after chunk 1, 3: after chunk 2
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    return commit(self)
files.Sink.commit = dying
sys.exit(main(["score", {str(cls3_dir)!r}, "--input", {str(src)!r}, "--output", {str(out)!r}, "--chunk-size", "3"]))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[1], env=env,
                          capture_output=True, timeout=300)
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    progress = json.loads((tmp_path / "out.jsonl.progress.json").read_text())
    assert progress["line"] == 5 and _partial(out).stat().st_size > progress["files"]["output"]["bytes"]
    _check_resumed(tmp_path, cls3_dir, uninterrupted, capsys)


def test_score_resume_refuses_what_does_not_match(cls3_dir, tmp_path, monkeypatch, capsys):
    src, out = _resumable_input(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    assert _score(cls3_dir, src, out, "--resume") == 2
    assert "no progress file" in capsys.readouterr().err
    original, calls = FineTunedJudge.raw_outputs, [0]

    def failing(self, records):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("out of memory")
        return original(self, records)

    monkeypatch.setattr(FineTunedJudge, "raw_outputs", failing)
    assert _score(cls3_dir, src, out) == 3  # the judge failed mid-run: the checkpoint is kept
    monkeypatch.setattr(FineTunedJudge, "raw_outputs", original)
    capsys.readouterr()
    assert _score(cls3_dir, src, out, "--resume", "--symmetric") == 2
    assert "symmetric was False, now True" in capsys.readouterr().err
    part = _partial(out)
    written = part.read_bytes()
    part.write_bytes(written.replace(b'"p0"', b'"P0"', 1))  # the accounted-for output was edited
    assert _score(cls3_dir, src, out, "--resume") == 2
    assert f"{part} differs from what the interrupted run recorded" in capsys.readouterr().err
    part.write_bytes(written[:-5])
    assert _score(cls3_dir, src, out, "--resume") == 2
    assert f"{part} is shorter than what the interrupted run recorded" in capsys.readouterr().err
    part.write_bytes(written)
    src.write_text(src.read_text().replace("p0", "q0", 1))  # the input read so far changed
    assert _score(cls3_dir, src, out, "--resume") == 2
    assert "the input changed" in capsys.readouterr().err
    src.write_text(src.read_text().replace("q0", "p0", 1))
    assert _score(cls3_dir, src, out, "--resume") == 1  # as it was: it goes on


def test_score_warns_about_duplicate_ids(cls3_dir, tmp_path, capsys):
    src, out = _resumable_input(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    assert _score(cls3_dir, src, out) == 1
    captured = capsys.readouterr()
    assert "duplicate ids 2" in captured.out
    assert "warning: 2 scored line(s) repeat an id already in the output, e.g. 'p1' (line 7), 'p0' (line 11)" \
        in captured.err
