"""Data sources: a conformance suite run on every registered source (real file when present, hand-written
fixture in the official format always), located errors for malformed input in every format, the label
semantics of each loader, real counts, and the `clfjudge data` command."""
from __future__ import annotations

import csv
import gzip
import io
import json
import math
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clfjudge.cli import main
from clfjudge.data.readers import iter_jsonl, location
from clfjudge.data.records import (
    LoadResult,
    Loc,
    PairRecord,
    PointRecord,
    RecordError,
    Verdict,
    from_dataset,
    to_dataset,
)
from clfjudge.data.sources import SOURCES, load
from clfjudge.data.sources.common import Fields
from clfjudge.data.sources.prometheus import parse_absolute_prompt, prompt_from_fields

FIXTURES = Path(__file__).parent / "fixtures" / "data"
ALL_SOURCES = SOURCES.names()
HH_SUBSETS = ("harmless-base", "helpful-base")
PARQUET = "mt_bench_human_judgments/data/human-00000-of-00001.parquet"
LLMEVAL2_ZIP = "llmeval2/WideDeep/evaluation_data/LLMEval2_benchmark.json.zip"


def build_fixture_root(dest: Path) -> Path:
    """Copy the hand-written fixtures and pack the ones whose official format is binary (gzip, zip, parquet)."""
    shutil.copytree(FIXTURES, dest)
    for subset in HH_SUBSETS:
        plain = dest / "hh-rlhf/data" / subset / "test.jsonl"
        plain.with_name("test.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
        plain.unlink()
    member = dest / LLMEVAL2_ZIP.removesuffix(".zip")
    with zipfile.ZipFile(dest / LLMEVAL2_ZIP, "w") as archive:
        archive.write(member, member.name)
        archive.writestr(f"__MACOSX/._{member.name}", b"\0")  # as in the official archive
    member.unlink()
    human = dest / PARQUET
    rows = [obj for _, obj in iter_jsonl(human.with_name("human.jsonl"))]
    pq.write_table(pa.Table.from_pylist(rows), human)
    human.with_name("human.jsonl").unlink()
    return dest


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory) -> Path:
    return build_fixture_root(tmp_path_factory.mktemp("fixtures") / "data")


# --------------------------------------------------------------------------------------------------------
# conformance (like scikit-learn's estimator checks): every source, fixture and real data


def check_conformance(name: str, result: LoadResult) -> None:
    source = SOURCES.get(name)
    assert isinstance(result, LoadResult) and result.records, f"{name}: no records"
    record_type = {"pair": PairRecord, "point": PointRecord}[source.arity]
    ids = [r.id for r in result.records]
    assert len(set(ids)) == len(ids), f"{name}: duplicate ids"
    for r in result.records:
        assert isinstance(r, record_type) and r.source == name and r.id.startswith(f"{name}:")
        assert r.question.strip()
        if isinstance(r, PairRecord):
            assert isinstance(r.verdict, Verdict)
            if r.scores is not None:
                assert all(math.isfinite(s) for s in r.scores) and Verdict.from_scores(*r.scores) is r.verdict
        else:
            lo, hi = r.scale
            assert r.score is not None and lo <= r.score <= hi
    assert all(isinstance(k, str) and v > 0 for k, v in result.excluded.items())
    sample = result.records[:50]
    back = from_dataset(to_dataset(sample))
    assert back == sample and [r.meta for r in back] == [r.meta for r in sample]


@pytest.mark.parametrize("name", ALL_SOURCES)
def test_fixture_conformance(name, fixture_root):
    source = SOURCES.get(name)
    assert source.available(fixture_root), f"no fixture for {name} under tests/fixtures/data"
    first = source.load(source.path(fixture_root))
    check_conformance(name, first)
    assert [r.id for r in source.load(source.path(fixture_root)).records] == [r.id for r in first.records]


@pytest.mark.parametrize("name", [n for n in ALL_SOURCES if SOURCES.get(n).available()])
def test_real_conformance(name):
    check_conformance(name, load(name))


# records kept + excluded = rows in the official files (MANIFEST counts)
REAL_COUNTS = {
    "pandalm-test": (999, 0), "autoj-test": (1392, 0), "autoj-single-train": (960, 0),
    "llmbar-natural": (100, 0), "llmbar-neighbor": (134, 0), "llmbar-gptinst": (92, 0),
    "llmbar-gptout": (47, 0), "llmbar-manual": (46, 0), "llmbar-case-constraint": (89, 0),
    "llmbar-case-negation": (59, 0), "llmbar-case-normal": (59, 0), "llmbar-case-base9": (54, 0),
    "llmbar-case-base10": (54, 0), "llmbar-faireval": (66, 0), "llmbar-llmeval2": (200, 0),
    "prometheus-mtbench": (320, 0), "prometheus-vicuna": (320, 0),
    "alpacaeval-gpt4": (26 * 805 - 42, 42), "alpacaeval-gpt4turbo": (7 * 805 - 1, 1),
    "arena-bias": (12521, 0), "arena-votes": (6192, 6329), "hh-rlhf": (8552 - 36, 36), "llmeval2": (2553 - 275, 275),
    "ultrafeedback": (1200 - 5, 5),
}


@pytest.mark.parametrize("name", sorted(REAL_COUNTS))
def test_real_counts(name):
    result = load(name)
    assert (len(result.records), result.n_excluded) == REAL_COUNTS[name]


def test_every_available_source_has_a_real_count():
    assert {n for n in ALL_SOURCES if SOURCES.get(n).available()} == set(REAL_COUNTS)


# --------------------------------------------------------------------------------------------------------
# malformed input: bad JSON (or a bad CSV row), a missing field, a bad label -> RecordError(file, line, field)


@dataclass(frozen=True)
class Malformed:
    source: str
    file: str  # relative to the data root
    fmt: str  # json | jsonl | jsonl.gz | zip | csv | parquet
    missing: str  # field removed from the second record
    bad: tuple[str, Any]  # (field, invalid value) set on the second record
    bad_file: str | None = None  # where the label lives, when not in ``file``


MALFORMED = [
    Malformed("pandalm-test", "pandalm/data/testset-v1.json", "json", "response2", ("annotator3", 4)),
    Malformed("autoj-test", "auto-j/data/test/testdata_pairwise.jsonl", "jsonl", "prompt", ("label", "1")),
    Malformed("autoj-single-train", "auto-j/data/training/single_traindata.jsonl", "jsonl", "usrmsg",
              ("pred_score", "ten")),
    Malformed("judgelm-val", "judgelm/judgelm_val_5k.jsonl", "jsonl", "answer2_body", ("score", [None, 3]),
              bad_file="judgelm/judgelm_val_5k_gpt4.jsonl"),
    Malformed("prometheus-mtbench", "prometheus/eval/benchmark/data/mt_bench_eval.json", "json", "instruction",
              ("gpt4_score", ["four"])),
    Malformed("prometheus-ind", "prometheus/eval/benchmark/data/feedback_collection_test.json", "json",
              "orig_response", ("orig_score", "five")),
    Malformed("prometheus-ood", "prometheus/eval/benchmark/data/feedback_collection_ood_test.json", "json",
              "instruction", ("gpt4_score", "n/a")),
    Malformed("llmbar-natural", "llmbar/Dataset/LLMBar/Natural/dataset.json", "json", "output_2", ("label", 0)),
    Malformed("mtbench-human", PARQUET, "parquet", "conversation_b", ("winner", "model_c")),
    Malformed("alpacaeval-gpt4", "alpaca_eval/results/vicuna-13b/alpaca_eval_gpt4/annotations.json", "json",
              "output_1", ("preference", 3)),
    Malformed("alpacaeval-gpt4turbo", "alpaca_eval/results/claude-2/weighted_alpaca_eval_gpt4_turbo/annotations.json",
              "json", "instruction", ("preference", 2.5)),
    Malformed("arena-bias", "arena-55k-unifiedbias/test_data/left_win.csv", "csv", "response_b",
              ("winner_model_a", "2")),
    Malformed("arena-votes", "arena-55k-unifiedbias/test_data/left_win.csv", "csv", "prompt",
              ("winner_model_b", "yes")),
    Malformed("hh-rlhf", "hh-rlhf/data/harmless-base/test.jsonl.gz", "jsonl.gz", "rejected", ("chosen", 5)),
    Malformed("llmeval2", LLMEVAL2_ZIP, "zip", "response1", ("human", "model3")),
    Malformed("ultrafeedback", "ultrafeedback-sample/data/processed/train_clean.jsonl", "jsonl", "chosen",
              ("rejected", ["not", "text"])),
]


def _read(path: Path, fmt: str) -> list[dict]:
    if fmt == "json":
        return json.loads(path.read_text(encoding="utf-8"))
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"), newline="")))
    if fmt == "parquet":
        return pq.read_table(path).to_pylist()
    return [obj for _, obj in iter_jsonl(path)]


def _write(path: Path, fmt: str, rows: list[Any], broken: int | None = None) -> list[int]:
    """Write ``rows`` in ``fmt`` (row ``broken`` as invalid JSON / a row with an extra cell); return the line
    each row starts on."""
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
        return list(range(1, len(rows) + 1))
    if fmt == "csv":
        buffer, lines, line = io.StringIO(), [], 2
        writer = csv.writer(buffer, lineterminator="\n")
        header = list(rows[0])
        writer.writerow(header)
        for i, row in enumerate(rows):
            cells = [row[c] for c in header] + (["extra"] if i == broken else [])
            writer.writerow(cells)
            lines.append(line)
            line += 1 + sum(str(c).count("\n") for c in cells)
        path.write_text(buffer.getvalue(), encoding="utf-8")
        return lines
    dumps = ['{"broken": }' if i == broken else json.dumps(row, ensure_ascii=False) for i, row in enumerate(rows)]
    if fmt == "json":
        path.write_text("[\n" + ",\n".join(dumps) + "\n]\n", encoding="utf-8")
        return list(range(2, len(rows) + 2))
    text = "".join(d + "\n" for d in dumps)
    if fmt == "jsonl":
        path.write_text(text, encoding="utf-8")
    elif fmt == "jsonl.gz":
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:  # zip
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(path.name.removesuffix(".zip"), text)
    return list(range(1, len(rows) + 1))


def _where(path: Path, fmt: str) -> str:
    return location(path, path.name.removesuffix(".zip")) if fmt == "zip" else str(path)


CASES = [
    pytest.param(spec, mode, id=f"{spec.source}-{mode}")
    for spec in MALFORMED
    for mode in ("bad-json", "missing", "bad-label")
    if not (mode == "bad-json" and spec.fmt == "parquet")  # parquet is not JSON
]


@pytest.mark.parametrize("spec, mode", CASES)
def test_malformed_input_raises_located_error(spec, mode, fixture_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(fixture_root, root)
    target = root / (spec.bad_file if mode == "bad-label" and spec.bad_file else spec.file)
    rows = _read(target, spec.fmt)
    assert len(rows) >= 2
    field = None
    if mode == "missing":
        field = spec.missing
        for row in rows if spec.fmt == "csv" else rows[1:2]:  # a CSV column is missing from every row
            del row[field]
    elif mode == "bad-label":
        field, value = spec.bad
        rows[1][field] = value
    lines = _write(target, spec.fmt, rows, broken=1 if mode == "bad-json" else None)
    source = SOURCES.get(spec.source)
    with pytest.raises(RecordError) as err:
        source.load(source.path(root))
    expected_line = lines[0] if spec.fmt == "csv" and mode == "missing" else lines[1]
    assert (err.value.file, err.value.line, err.value.field) == (_where(target, spec.fmt), expected_line, field)
    assert f"{_where(target, spec.fmt)}:{expected_line}" in str(err.value)


def test_every_format_has_a_malformed_case():
    modules = {SOURCES.get(n).loader.__module__ for n in ALL_SOURCES}
    assert modules == {SOURCES.get(spec.source).loader.__module__ for spec in MALFORMED}


@pytest.mark.parametrize("spec", [s for s in MALFORMED if s.fmt == "json"], ids=lambda s: s.source)
def test_json_array_sources_name_a_bad_record_by_index_and_id(spec, fixture_root, tmp_path):
    """A JSON-array file written on one line (as many exports are): every record is on line 1, so the error
    names the record's index in the array, and its own id where the format has one."""
    target = tmp_path / Path(spec.file).name
    source = SOURCES.get(spec.source)
    rows = _read(fixture_root / spec.file, "json")
    field, value = spec.bad
    rows[1][field] = value
    target.write_text(json.dumps(rows), encoding="utf-8")
    with pytest.raises(RecordError) as err:
        source.loader(target)
    own_id = {"pandalm-test": "idx", "prometheus-mtbench": "idx"}.get(spec.source)
    assert (err.value.line, err.value.index, err.value.field) == (1, 1, field)
    where = f"{target}:1: record 1" + (f" (id {str(rows[1][own_id])!r})" if own_id else "")
    assert str(err.value).startswith(f"{where}: field {field!r}")


# --------------------------------------------------------------------------------------------------------
# label semantics of each loader, on the fixtures


def _by_id(name: str, root: Path) -> tuple[dict[str, Any], LoadResult]:
    source = SOURCES.get(name)
    result = source.load(source.path(root))
    return {r.id.removeprefix(f"{name}:"): r for r in result.records}, result


def test_pandalm(fixture_root):
    recs, result = _by_id("pandalm-test", fixture_root)
    assert (recs["0"].question.startswith("If you have any questions")
            and "\nRewrite the sentence" in recs["0"].question)
    assert (recs["0"].verdict, recs["0"].model_a, recs["0"].model_b) == (Verdict.B, "bloom-7b", "llama-7b")
    assert recs["1"].answer_a == "True" and recs["1"].verdict is Verdict.A  # JSON true; votes 1, 1, 0
    assert recs["1"].question == "Verify the correctness of the given statement: the Earth orbits the Sun."
    assert recs["2"].verdict is Verdict.TIE and recs["2"].answer_b == ""  # 1-1-1 split; empty response kept
    assert recs["3"].verdict is Verdict.A and recs["3"].meta["annotators"] == [1, 2, 1]
    assert any(n.startswith("1 pair(s) with a 1-1-1") for n in result.notes)
    assert any(n.startswith("1 pair(s) where only annotator1 and annotator3") for n in result.notes)


def test_pandalm_real_notes():
    notes = load("pandalm-test").notes
    assert any(n.startswith("0 pair(s) with a 1-1-1") for n in notes)
    assert any(n.startswith("49 pair(s) where only annotator1 and annotator3") for n in notes)


def test_autoj(fixture_root):
    recs, _ = _by_id("autoj-test", fixture_root)
    assert [recs[i].verdict for i in "012"] == [Verdict.A, Verdict.B, Verdict.TIE]
    assert recs["1"].scenario == "code_generation"
    single, _ = _by_id("autoj-single-train", fixture_root)
    assert single["0"].question == "Give me three tips for better sleep."
    assert single["0"].answer.endswith("3. Keep the room cool.") and single["0"].score == 7.0
    assert single["1"].score == 2.0 and single["1"].scale == (1.0, 10.0)  # pred_score given as a string


def test_judgelm_joins_on_question_id_and_counts_failed_judgements(fixture_root):
    recs, result = _by_id("judgelm-val", fixture_root)
    assert set(recs) == {"0", "1"} and result.excluded == {"GPT-4 score [-1, -1] (no usable judgement)": 1}
    assert recs["0"].scores == (10.0, 2.0) and recs["0"].verdict is Verdict.A
    assert recs["1"].scores == (8.0, 8.0) and recs["1"].verdict is Verdict.TIE
    assert recs["0"].model_a == "vicuna-13b"


def test_prometheus_bench_parses_the_prompt(fixture_root):
    recs, _ = _by_id("prometheus-mtbench", fixture_root)
    r = recs["81:chatgpt"]
    assert r.question.endswith("User: Write a haiku about autumn.\n\nAssistant: ")
    assert r.answer == "Crimson leaves drifting\nquiet rivers carry them\nthe year exhales slow"
    assert r.reference == "Red leaves fall softly\n..."
    assert r.rubric.startswith("[Is the explanation clear for a beginner?]\nScore 1: Confusing throughout.")
    assert r.rubric.endswith("Score 5: Perfectly clear and well structured.")
    assert r.meta["criteria"] == "Is the explanation clear for a beginner?"
    assert r.score == pytest.approx(14 / 3) and r.meta["gpt4_samples"] == [5.0, 4.0, 5.0]
    assert (r.model, r.scenario, r.scale) == ("chatgpt", "writing", (1.0, 5.0))


def test_feedback_bench_fields_and_prompt_agree(fixture_root):
    path = SOURCES.get("prometheus-ind").path(fixture_root)
    for i, obj in enumerate(json.loads(path.read_text(encoding="utf-8"))):
        f = Fields(obj, Loc(str(path), i))
        assert prompt_from_fields(f) == parse_absolute_prompt(f)
    ind, _ = _by_id("prometheus-ind", fixture_root)
    assert ind["0"].score == 4.0 and ind["0"].meta["label_field"] == "orig_score"
    ood, _ = _by_id("prometheus-ood", fixture_root)
    assert ood["0"].score == 5.0 and ood["0"].question == "List three primary colours."
    assert ood["0"].meta["label_field"] == "gpt4_score"


def test_mtbench_turns_and_ties(fixture_root):
    recs, _ = _by_id("mtbench-human", fixture_root)
    assert recs["0"].answer_a == "Soft rain on the roof" and recs["0"].verdict is Verdict.A
    assert recs["1"].verdict is Verdict.TIE and recs["1"].meta["winner"] == "tie (bothbad)"
    assert recs["1"].answer_b == "Rain is wet.\n\nUser: Now make it about snow.\n\nAssistant: Snow is cold."
    assert recs["1"].meta["split"] == "turn2" and recs["2"].verdict is Verdict.B


def test_alpacaeval_preferences(fixture_root):
    recs, result = _by_id("alpacaeval-gpt4", fixture_root)
    got = {k: r.verdict for k, r in recs.items()}
    assert got == {"vicuna-13b:0": Verdict.B, "vicuna-13b:1": Verdict.A, "vicuna-13b:2": Verdict.TIE,
                   "vicuna-13b:4": Verdict.TIE}
    assert result.excluded == {"preference is null (the annotator gave no judgement)": 1}
    assert recs["vicuna-13b:0"].meta["annotations_file"] == "vicuna-13b/alpaca_eval_gpt4/annotations.json"
    turbo, _ = _by_id("alpacaeval-gpt4turbo", fixture_root)
    weighted = turbo["claude-2/weighted_alpaca_eval_gpt4_turbo:0"]
    assert weighted.verdict is Verdict.A and weighted.meta["p_b"] == pytest.approx(0.2173)
    assert turbo["claude-2/weighted_alpaca_eval_gpt4_turbo:1"].verdict is Verdict.B
    cot = turbo["gemini-pro/alpaca_eval_cot_gpt4_turbo_fn:0"]
    assert cot.verdict is Verdict.A and cot.answer_b == "" and cot.meta["split"] == "alpaca_eval_cot_gpt4_turbo_fn"
    assert turbo["gemini-pro/alpaca_eval_cot_gpt4_turbo_fn:1"].verdict is Verdict.TIE


def test_arena_keeps_repeated_pairs_with_unique_ids(fixture_root):
    recs, _ = _by_id("arena-bias", fixture_root)
    repeated = [r for r in recs.values() if r.meta["arena_id"] == "30192"]
    assert len(repeated) == 2 and len({r.id for r in repeated}) == 2
    assert {r.verdict for r in repeated} == {Verdict.A, Verdict.B}  # the same pair in both orders
    assert recs["left_win:0"].answer_b == "I'm really excited to start working with\nsuch a talented team."
    assert recs["same_verbo:0"].meta == {"split": "same_verbo", "arena_id": "4411", "round": "1", "length_diff": "2"}


def test_hh_rlhf_shared_context(fixture_root):
    recs, result = _by_id("hh-rlhf", fixture_root)
    lock = recs["harmless-base:0"]
    assert lock.question == "Human: How do I pick a lock?" and lock.verdict is Verdict.A
    assert lock.answer_b == "Insert a tension wrench and rake the pins."
    drag = recs["harmless-base:1"]  # the dialogues diverge at the last shared Assistant turn
    assert drag.question.endswith("Human: Isn't that drag kings?")
    assert drag.answer_b == "Yes.  Human: Are you sure?\n\nAssistant: Yes."
    assert result.excluded == {"chosen and rejected answers are identical": 1}
    assert "1 pair(s) diverge before the last Assistant turn" in result.notes[0]


def test_llmeval2_and_ultrafeedback(fixture_root):
    recs, result = _by_id("llmeval2", fixture_root)
    assert result.excluded == {"empty query": 1}
    assert [recs[k].verdict for k in ("0", "2", "3")] == [Verdict.A, Verdict.B, Verdict.TIE]
    uf, result = _by_id("ultrafeedback", fixture_root)
    assert set(uf) == {"train:0", "eval:0"} and result.excluded == {"chosen and rejected answers are identical": 1}
    assert uf["train:0"].meta["score_chosen"] == 9.0 and uf["train:0"].verdict is Verdict.A


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SOURCES.get("pandalm-test").load(tmp_path / "nope.json")


# --------------------------------------------------------------------------------------------------------
# clfjudge data


def test_cli_stats_json_lists_every_source_and_split(fixture_root, capsys):
    assert main(["data", "stats", "--json", "--root", str(fixture_root)]) == 0
    rows = json.loads(capsys.readouterr().out)
    totals = {r["source"]: r for r in rows if r["split"] == "all"}
    assert set(totals) == set(ALL_SOURCES) and all(r["available"] for r in rows)
    assert totals["pandalm-test"]["records"] == 4 and totals["pandalm-test"]["ties"] == 1
    assert totals["alpacaeval-gpt4"]["excluded"] == 1
    assert totals["prometheus-vicuna"]["ties"] is None
    hh = {r["split"]: r["records"] for r in rows if r["source"] == "hh-rlhf"}
    assert hh == {"all": 3, "harmless-base": 2, "helpful-base": 1}


def test_cli_stats_absent_files_are_not_errors(tmp_path, capsys):
    assert main(["data", "stats", "--json", "--root", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(ALL_SOURCES)
    assert all(not r["available"] and r["records"] == 0 for r in rows)


def test_cli_stats_table_and_malformed_file(fixture_root, tmp_path, capsys):
    assert main(["data", "stats", "--root", str(fixture_root), "--source", "autoj-test"]) == 0
    assert "autoj-test" in capsys.readouterr().out
    root = tmp_path / "data"
    shutil.copytree(fixture_root, root)
    bad = root / "auto-j/data/test/testdata_pairwise.jsonl"
    bad.write_text(bad.read_text(encoding="utf-8").replace('"label": 1', '"label": 7'), encoding="utf-8")
    assert main(["data", "stats", "--root", str(root)]) == 2
    assert f"{bad}:2: field 'label'" in capsys.readouterr().err


def test_cli_show_renders_records(fixture_root, capsys):
    from clfjudge.prompts.schemes import SCHEMES

    scheme = next(name for name, s in SCHEMES.items() if s.arity == "pair")
    root = ["--root", str(fixture_root)]
    assert main(["data", "show", "--source", "pandalm-test", "--scheme", scheme, "-n", "2", *root]) == 0
    out = capsys.readouterr().out
    assert out.count("===== pandalm-test:") == 2 and "Canberra" not in out and "Rewrite the sentence" in out
    # the older spelling (a positional NAME) still works, hidden from --help; both at once is an error
    assert main(["data", "show", "pandalm-test", "--scheme", scheme, "-n", "2", *root]) == 0
    assert capsys.readouterr().out == out
    assert main(["data", "show", "pandalm-test", "--source", "pandalm-test", "--scheme", scheme, *root]) == 2


def test_cli_overlap(fixture_root, capsys):
    assert main(["data", "overlap", "--json", "--root", str(fixture_root)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"questions_of": "alpacaeval-gpt4", "found_in": "alpacaeval-gpt4turbo", "exact": 1,
            "line_set_or_exact": 1, "distinct_questions": 4} in rows
