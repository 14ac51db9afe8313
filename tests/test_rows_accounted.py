"""Every row accounted for, in every command: one file with bad rows fed to data stats, train (a tiny fine-tuned
judge), score, audit --sets and calibrate, each excluded row found counted by reason in the console, the JSON
outputs, report.md and the judge card; "FILE:N" reads N rows everywhere; a broken JSON line is an error naming file
and line everywhere; the audit's trained-on mark goes by content; judge directories hold no pickle."""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from tiny_judges import make_judge

from clfjudge.card import JudgeCard
from clfjudge.cli import EXIT_JUDGE, main

N_ROWS = 24
# row (from 1) -> (what is wrong, the loader's reason)
BAD = {3: ("question", "bad row: field 'question': is empty"),
       6: ("answer_b", "bad row: field 'answer_b': is missing"),
       9: ("verdict", "bad row: field 'verdict': must be A, B or TIE"),
       12: ("answer_b", "chosen and rejected answers are identical"),
       15: ("answer_a", "bad row: field 'answer_a': must be a string")}
REASONS = {reason: 1 for _, reason in BAD.values()}
# score judges unlabelled pairs: a pair with two equal answers is scored; the others are rejected
SCORE_REJECTS = {3: "question", 6: "answer_b", 9: "verdict", 15: "answer_a"}


def _rows(offset: int = 0) -> list[dict]:
    rows = []
    for i in range(offset, offset + N_ROWS):
        good, bad = f"{7 + 2 * i} is prime number {i}.", f"{9 + 2 * i} maybe"
        a, b, verdict = (good, bad, "A") if i % 2 else (bad, good, "B")
        rows.append({"question": f"Name prime number {i}.", "answer_a": a, "answer_b": b, "verdict": verdict})
    return rows


def _bad_file(path: Path) -> Path:
    rows = _rows()
    rows[2]["question"] = " "
    del rows[5]["answer_b"]
    rows[8]["verdict"] = "C"
    rows[11]["answer_b"] = rows[11]["answer_a"]
    rows[14]["answer_a"] = 5
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _named(text: str, path: Path) -> None:
    """Each bad row named by file, row and field, and each reason counted once."""
    for row, (field, reason) in BAD.items():
        assert f"{path}:{row}: field '{field}'" in text
        assert f"{reason}: 1" in text


def _first(account: dict, path: Path) -> None:
    assert [line.split(": field")[0] for line in account["first_excluded"]] == [f"{path}:{row}" for row in BAD]


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    return _bad_file(tmp_path_factory.mktemp("data") / "pairs.jsonl")


@pytest.fixture(scope="module")
def judge_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    return make_judge(tiny_bert_dir, tmp_path_factory.mktemp("judge") / "cls3", "cls3")


@pytest.fixture(scope="module")
def trained(tiny_bert_dir, bad, tmp_path_factory):
    """A tiny fine-tuned reward judge trained on the bad file, and what `clfjudge train` printed."""
    out = tmp_path_factory.mktemp("trained")
    recipe = out / "recipe.yaml"
    recipe.write_text(f"backbone: {tiny_bert_dir}\nhead: reward\nsources: [{bad}]\nmax_length: 64\nbatch_size: 8\n"
                      f"max_steps: 1\ndev_fraction: 0.0\nearly_stopping_patience: 0\noutput_dir: {out / 'judge'}\n")
    with pytest.MonkeyPatch.context() as patch:
        import io
        import sys

        err = io.StringIO()
        patch.setattr(sys, "stderr", err)
        assert main(["train", "--config", str(recipe)]) == 0
    return out / "judge", err.getvalue()


def test_data_stats_counts_and_names_every_excluded_row(bad, capsys):
    assert main(["data", "stats", "--source", str(bad)]) == 0
    _named(capsys.readouterr().out, bad)
    assert main(["data", "stats", "--source", str(bad), "--json"]) == 0
    row, = json.loads(capsys.readouterr().out)
    assert (row["records"], row["excluded"], row["excluded_by_reason"]) == (N_ROWS - 5, 5, REASONS)
    _first(row, bad)


def test_train_reports_excluded_rows_in_the_console_and_the_card_and_writes_no_pickle(trained, bad):
    judge, console = trained
    _named(console, bad)
    stats = JudgeCard.load(judge).training["sources"]["train"][str(bad)]
    assert stats["excluded_by_loader"] == REASONS and stats["loaded"] == N_ROWS - 5
    _first(stats, bad)
    # the HF training arguments as JSON, never the training_args.bin pickle; no pickle anywhere in the directory
    assert json.loads((judge / "training_args.json").read_text())["max_steps"] == 1
    assert not list(judge.rglob("*.bin")) and not list(judge.rglob("*.pt")) and not list(judge.rglob("*.pkl"))


def test_score_rejects_each_bad_line_by_reason(judge_dir, bad, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert main(["score", str(judge_dir), "--input", str(bad), "--output", str(out)]) == 1
    captured = capsys.readouterr()
    rejected = [json.loads(x) for x in (tmp_path / "out.jsonl.rejected.jsonl").read_text().splitlines()]
    assert {r["line"]: r["field"] for r in rejected} == SCORE_REJECTS
    for line, field in SCORE_REJECTS.items():
        assert f"rejected {bad}:{line}: field '{field}'" in captured.err
        assert f"field '{field}': " in captured.out  # the summary counts by field and reason
    assert "lines read 24: scored 20, rejected 4" in captured.out


def test_audit_reports_excluded_rows_in_console_metrics_and_report(judge_dir, bad, tmp_path, capsys):
    out = tmp_path / "audit"
    assert main(["audit", str(judge_dir), "--sets", str(bad), "--out", str(out), "--bootstrap", "20"]) == 0
    _named(capsys.readouterr().err, bad)
    entry = json.loads((out / "metrics.json").read_text())["sets"][bad.name]
    assert entry["n"] == N_ROWS - 5 and entry["loaded"]["excluded_by_reason"] == REASONS
    _first(entry["loaded"], bad)
    _named((out / "report.md").read_text(), bad)


def test_calibrate_reports_excluded_rows_in_the_console_and_the_card(judge_dir, bad, tmp_path, capsys):
    judge = Path(shutil.copytree(judge_dir, tmp_path / "judge"))
    assert main(["calibrate", str(judge), "--source", str(bad), "--batch-size", "8"]) == 0
    _named(capsys.readouterr().err, bad)
    fitted = JudgeCard.load(judge).calibration["fitted_on"]
    assert fitted["excluded_by_loader"] == REASONS and fitted["n"] == N_ROWS - 5
    _first(fitted, bad)


def test_a_sample_size_reads_that_many_rows_in_every_command(judge_dir, tiny_bert_dir, bad, tmp_path, capsys):
    spec = f"{bad}:7"
    assert main(["data", "stats", "--source", spec, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["records"] == 7
    assert main(["audit", "baseline:longer", "--sets", spec, "--out", str(tmp_path / "a"), "--bootstrap", "0"]) == 0
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["sets"][bad.name]["n"] == 7
    judge = Path(shutil.copytree(judge_dir, tmp_path / "judge"))
    assert main(["calibrate", str(judge), "--source", spec]) == 0
    assert JudgeCard.load(judge).calibration["fitted_on"]["n"] == 7
    capsys.readouterr()
    assert main(["score", str(judge_dir), "--input", spec, "--output", str(tmp_path / "s.jsonl")]) in (0, 1)
    assert "lines read 7:" in capsys.readouterr().out
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"backbone: minilm\nhead: embedding\nsources: [{spec}]\ndev_fraction: 0.0\n"
                      f"randomize_order: true\noutput_dir: {tmp_path / 'emb'}\n")
    assert main(["train", "--config", str(recipe)]) == 0
    assert JudgeCard.load(tmp_path / "emb").training["sources"]["train"][str(bad)]["used"] == 7
    # a split and a sample of a save_to_disk DatasetDict
    import datasets

    datasets.DatasetDict({"test": datasets.Dataset.from_list(_rows())}).save_to_disk(str(tmp_path / "dd"))
    capsys.readouterr()
    assert main(["data", "stats", "--source", f"{tmp_path / 'dd'}:test:5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["records"] == 5


@pytest.mark.parametrize("argv", [["data", "stats", "--source", "{f}"],
                                  ["audit", "baseline:longer", "--sets", "{f}", "--out", "{tmp}/a"],
                                  ["calibrate", "{judge}", "--source", "{f}"],
                                  ["train", "--config", "{tmp}/r.yaml"]])
def test_a_broken_json_line_is_an_error_naming_file_and_line(judge_dir, tmp_path, capsys, argv):
    broken = tmp_path / "broken.jsonl"
    lines = [json.dumps(r) for r in _rows()]
    lines[3] = '{"question": "x", broken'
    broken.write_text("\n".join(lines) + "\n")
    (tmp_path / "r.yaml").write_text(f"backbone: minilm\nhead: embedding\nsources: [{broken}]\n"
                                     f"output_dir: {tmp_path / 'j'}\n")
    assert main([a.format(f=broken, tmp=tmp_path, judge=judge_dir) for a in argv]) == 2
    assert f"{broken}:4: invalid JSON" in capsys.readouterr().err


def test_the_trained_on_mark_compares_content_not_names(trained, bad, tmp_path):
    judge, _ = trained
    copy = tmp_path / "renamed.jsonl"
    shutil.copy(bad, copy)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in _rows(offset=100)))
    out = tmp_path / "audit"
    assert main(["audit", str(judge), "--sets", str(copy), str(other), "--out", str(out), "--bootstrap", "0"]) == 0
    board = json.loads((out / "metrics.json").read_text())["suites"]["scoreboard"]["sets"]
    row = next(name for name in board["renamed.jsonl"]["rows"] if not name.startswith("baseline:"))
    assert board["renamed.jsonl"]["rows"][row]["seen_in_training"]  # the same pairs under another name
    assert not board["other.jsonl"]["rows"][row]["seen_in_training"]
    # --bootstrap 0: no interval anywhere, not a degenerate one
    assert board["other.jsonl"]["rows"][row]["vs_longer"]["low"] is None
    assert " [" not in (out / "report.md").read_text().split("## Scoreboard")[1].split("##")[0].split("|---|")[1]


def test_a_pickle_that_runs_code_is_refused_in_one_line_naming_the_file_and_the_opt_in(tmp_path, capsys):
    from foreign_models import tiny_reward_model
    from safetensors.torch import load_file

    model = tiny_reward_model("bert", tmp_path / "rm")
    state = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    with (model / "pytorch_model.bin").open("wb") as f:
        pickle.dump({"weights": state, "payload": _Payload(marker)}, f)
    items = tmp_path / "in.jsonl"
    items.write_text(json.dumps({"question": "Q?", "answer": "A."}) + "\n")
    # a judge that cannot load is a judge error (exit 3), before any input is read
    assert main(["score", str(model), "--input", str(items), "--output", str(tmp_path / "o.jsonl")]) == EXIT_JUDGE
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("clfjudge: error:")]
    assert len(error) == 1 and f"{model / 'pytorch_model.bin'}:" in error[0] and "--trust-pickle" in error[0]
    assert not marker.exists()


class _Payload:
    """Unpickling this runs code (writes the marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_score_auto_scores_trl_single_answer_rows_on_a_reward_judge(tiny_bert_dir, tmp_path, capsys):
    judge = make_judge(tiny_bert_dir, tmp_path / "reward", "reward")
    rows = [{"prompt": "Name a prime.", "completion": "Seven."},
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
            {"prompt": [{"role": "user", "content": "Q?"}], "completion": [{"role": "assistant", "content": "A."}]}]
    items = tmp_path / "in.jsonl"
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    assert main(["score", str(judge), "--input", str(items), "--output", str(out)]) == 0
    assert [set(json.loads(line)) for line in out.read_text().splitlines()] == [{"id", "score"}] * 3
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Q?", "chosen": "A.", "rejected": "B."}) + "\n")
    assert main(["score", str(judge), "--input", str(pairs), "--output", str(tmp_path / "p.jsonl")]) == 0
    assert "p_a" in json.loads((tmp_path / "p.jsonl").read_text())
