"""Audit: every suite on the hand-written fixtures in the official formats, released files on the real data."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_judges import make_judge

from clfjudge.audit import run_audit
from clfjudge.audit.judges import DirectoryJudge, build_judge
from clfjudge.audit.suites import SUITES
from clfjudge.cli import main
from clfjudge.paths import data_root

FIXTURES = Path(__file__).parent / "fixtures" / "data"
REAL_DATA = (data_root() / "pandalm" / "data" / "testset-v1.json").exists()


@pytest.fixture()
def fixture_data(monkeypatch):
    monkeypatch.setenv("CLFJUDGE_DATA", str(FIXTURES))


@pytest.fixture(scope="module")
def tiny_pair_judge(tiny_bert_dir, tmp_path_factory):
    return make_judge(tiny_bert_dir, tmp_path_factory.mktemp("cls3"), "cls3")


@pytest.fixture(scope="module")
def tiny_point_judge(tiny_bert_dir, tmp_path_factory):
    return make_judge(tiny_bert_dir, tmp_path_factory.mktemp("regression"), "regression")


def test_every_suite_on_fixtures(fixture_data, tiny_pair_judge, tiny_point_judge, tmp_path):
    m = run_audit([str(tiny_pair_judge), str(tiny_point_judge)], tmp_path, bootstrap=20, progress=False)
    assert set(m["suites"]) == set(SUITES)
    assert {"judgelm-val", "pandalm-test", "autoj-test", "prometheus-ind", "llmbar-natural"} <= set(m["sets"])
    rows = m["suites"]["cross-scheme"]["rows"]
    pair_name, point_name = (n for n in m["judges"] if not n.startswith("baseline"))
    # each judge is applied to the sets of the other arity through the study's transforms, and says so
    assert rows[point_name]["pandalm-test"]["transform"].startswith("w/ trans")
    assert rows[pair_name]["prometheus-ind"]["transform"].startswith("w/ trans")
    assert rows[pair_name]["autoj-test"]["headline"] == "agreement"
    assert 0.0 <= rows["baseline:longer"]["pandalm-test"]["accuracy"] <= 1.0
    assert m["suites"]["position"]["rows"]["baseline:longer"]["pandalm-test"]["consistency"] == 1.0
    assert pair_name in m["suites"]["truncation"]["rows"]
    assert "gold" in m["suites"]["agreement"]["matrices"]["pandalm-test"]["names"]
    report = (tmp_path / "report.md").read_text()
    for heading in ("Cross-scheme", "LLMBar", "Position bias", "Length bias", "Inter-evaluator", "Truncation"):
        assert heading in report
    assert (tmp_path / "agreement_pandalm-test.png").stat().st_size > 0
    assert json.loads((tmp_path / "metrics.json").read_text())["suites"].keys() == m["suites"].keys()


def test_predictions_are_cached(fixture_data, tiny_pair_judge, tmp_path, monkeypatch):
    first = run_audit([str(tiny_pair_judge)], tmp_path, suites=["cross-scheme"], bootstrap=0, progress=False)

    def refuse(*args, **kwargs):
        raise AssertionError("predicted again despite the cache")

    monkeypatch.setattr(DirectoryJudge, "predict", refuse)
    again = run_audit([str(tiny_pair_judge)], tmp_path, suites=["cross-scheme"], bootstrap=0, progress=False)
    assert again["suites"] == first["suites"]


def test_unknown_judge_and_suite_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a judge directory"):
        build_judge(str(tmp_path / "nope"))
    with pytest.raises(KeyError, match="unknown baseline"):
        build_judge("baseline:oracle")
    with pytest.raises(ValueError, match="unknown suite"):
        run_audit(["baseline:longer"], tmp_path, suites=["vibes"], progress=False)
    # a judge that names nothing is refused before any set is loaded or output directory made
    with pytest.raises(FileNotFoundError, match="neither a judge directory"):
        run_audit(["baseline:longer", str(tmp_path / "nope")], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_key_error_is_one_unquoted_line(tiny_pair_judge, capsys):
    """The CLI prints a KeyError's message, not its repr (which would wrap it in quotes)."""
    assert main(["calibrate", str(tiny_pair_judge), "--source", "nope"]) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "clfjudge: error:" in x)
    assert "clfjudge: error: unknown source 'nope'; known: alpacaeval-gpt4, " in line, err


def test_cli_writes_report(fixture_data, tmp_path):
    assert main(["audit", "baseline:longer", "--sets", "pandalm-test", "llmbar-natural", "--out", str(tmp_path),
                 "--bootstrap", "0"]) == 0
    assert (tmp_path / "report.md").exists()


@pytest.mark.skipif(not REAL_DATA, reason="needs ../shared/data (present in CI)")
def test_released_files_on_real_data(tmp_path):
    """The released judges through the audit give the numbers research/reproduce_released.py computes, and n/a
    (not zero) on the sets their files do not cover."""
    m = run_audit(["released:pandalm-7b", "released:auto-j-13b"], tmp_path, suites=["cross-scheme", "position"],
                  sets=["pandalm-test", "autoj-test"], bootstrap=0, progress=False)
    rows = m["suites"]["cross-scheme"]["rows"]
    assert rows["pandalm-7b"]["pandalm-test"]["accuracy"] == pytest.approx(0.6677, abs=1e-4)
    assert rows["pandalm-7b"]["pandalm-test"]["f1"] == pytest.approx(0.5743, abs=1e-4)
    assert rows["auto-j-13b"]["autoj-test"]["agreement"] == pytest.approx(0.5496, abs=1e-4)
    assert "n/a" in rows["pandalm-7b"]["autoj-test"] and "n/a" in rows["auto-j-13b"]["pandalm-test"]
    assert rows["pandalm-7b"]["average_pairwise"] is None  # one set is not an average
    position = m["suites"]["position"]["rows"]
    assert position["auto-j-13b"]["autoj-test"]["consistency"] == pytest.approx(0.8341, abs=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(not REAL_DATA, reason="needs ../shared/data (present in CI)")
def test_semscore_system_level_on_real_slice(tmp_path):
    m = run_audit(["semscore"], tmp_path, suites=["cross-scheme", "system-level"], sets=["prometheus-vicuna"],
                  limit=60, bootstrap=0, progress=False)
    cell = m["suites"]["cross-scheme"]["rows"]["semscore"]["prometheus-vicuna"]
    assert -1.0 <= cell["pearson"] <= 1.0
    system = m["suites"]["system-level"]["sets"]["prometheus-vicuna"]["semscore"]
    assert len(system["systems"]) == 4 and system["kendall_tau"] == pytest.approx(abs(system["kendall_tau_signed"]))


def test_system_level_keeps_the_sign_the_papers_protocol_drops():
    from clfjudge.audit.report import system_section
    from clfjudge.audit.semscore import system_level

    systems = ["a", "a", "b", "b", "c", "c"]
    gold = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    backwards = system_level(systems, [-g for g in gold], gold)  # ranks the three systems in reverse
    assert backwards.kendall_tau == pytest.approx(1.0) and backwards.pearson_r == pytest.approx(1.0)
    assert backwards.kendall_tau_signed == pytest.approx(-1.0) and backwards.pearson_r_signed == pytest.approx(-1.0)
    assert system_level(systems, gold, gold).kendall_tau_signed == pytest.approx(1.0)
    cell = {"kendall_tau": 1.0, "pearson_r": 1.0, "kendall_tau_signed": -1.0, "pearson_r_signed": -1.0,
            "systems": ["a", "b", "c"]}
    lines = system_section({"suites": {"system-level": {"sets": {"vicuna": {"shorter": cell}}}}})
    assert "| vicuna | shorter | 1.000 | 1.000 | -1.000 / -1.000 | 3 |" in lines


def test_only_the_length_baseline_has_a_margin():
    from clfjudge.data.records import PairRecord, Verdict

    recs = [PairRecord(id=str(i), question="q", answer_a="a" * (i + 1), answer_b="bb", verdict=Verdict.A)
            for i in range(4)]
    assert build_judge("baseline:majority").predict("s", "pair", recs).margin is None
    margin = build_judge("baseline:longer").predict("s", "pair", recs).margin
    assert [m > 0 for m in margin] == [False, False, True, True]


def test_sets_the_judge_was_trained_on_are_marked(fixture_data, tiny_bert_dir, tmp_path):
    from clfjudge.card import JudgeCard

    judge_dir = make_judge(tiny_bert_dir, tmp_path / "seen", "cls3")
    card = JudgeCard.load(judge_dir)
    card.training = {"sources": {"train": {"pandalm-test": {"used": 10}}}}
    card.save(judge_dir)
    m = run_audit([str(judge_dir)], tmp_path / "out", suites=["cross-scheme"], bootstrap=0, progress=False,
                  sets=["pandalm-test", "autoj-test"])
    row = next(iter(m["suites"]["cross-scheme"]["rows"].values()))
    assert row["pandalm-test"]["seen_in_training"] and not row["autoj-test"]["seen_in_training"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert " †" in report and "not out-of-distribution" in report


def test_a_judge_changed_in_place_is_not_read_from_the_cache(tmp_path):
    from clfjudge.audit import _cache_path

    judge = tmp_path / "judge"
    judge.mkdir()
    (judge / "judge_card.json").write_text('{"created": "1"}')
    before = _cache_path(tmp_path, str(judge), "pandalm-test")
    (judge / "judge_card.json").write_text('{"created": "2"}')
    assert _cache_path(tmp_path, str(judge), "pandalm-test") != before
    assert _cache_path(tmp_path, "semscore", "x") == _cache_path(tmp_path, "semscore", "x")


def test_a_set_limit_caps_one_set_and_limit_the_rest():
    from clfjudge.audit import load_sets

    _, records, _ = load_sets(["pandalm-test", "autoj-test"], 50, set_limits={"autoj-test": 20})
    assert (len(records["pandalm-test"]), len(records["autoj-test"])) == (50, 20)
    _, again, _ = load_sets(["autoj-test"], None, set_limits={"autoj-test": 20})
    assert [r.id for r in again["autoj-test"]] == [r.id for r in records["autoj-test"]]  # seeded by set, not limit


@pytest.mark.slow
@pytest.mark.skipif(not REAL_DATA, reason="needs ../shared/data (present in CI)")
def test_semscore_in_bf16_matches_fp32():
    from clfjudge.audit.semscore import SemScore

    answers = ["Paris is the capital of France.", "The mitochondria is the powerhouse of the cell.", "42"]
    refs = ["The capital of France is Paris.", "Cells get energy from mitochondria.", "forty-two"]
    fp32 = SemScore(precision="fp32").similarity(answers, refs)
    bf16 = SemScore(precision="bf16").similarity(answers, refs)
    assert fp32[0] > fp32[2] and abs(fp32 - bf16).max() < 1e-2


@pytest.mark.slow
@pytest.mark.skipif(not REAL_DATA, reason="needs ../shared/data (present in CI)")
def test_semscore_reads_through_the_text_embedder_as_sentence_transformers_does():
    from sentence_transformers import SentenceTransformer

    from clfjudge.audit.semscore import SemScore
    from clfjudge.embedders.sentence import TextEmbedder, resolve_encoder

    answers = ["Paris is the capital of France.", "42", "Paris is the capital of France."]
    refs = ["The capital of France is Paris.", "forty-two", "Lyon is in France."]
    semscore = SemScore(precision="fp32")
    assert isinstance(semscore.embedder, TextEmbedder)
    got = semscore.similarity(answers, refs)
    model = SentenceTransformer(resolve_encoder("mpnet"), device="cpu")
    a, b = (model.encode(texts, normalize_embeddings=True) for texts in (answers, refs))
    np.testing.assert_allclose(got, np.sum(a * b, axis=1), atol=1e-5)
    assert len(semscore.embedder) == 5  # each distinct text read once
