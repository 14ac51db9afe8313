"""clfjudge label: a teacher's labels per answer, read once however many pairs hold an answer, kept through kill -9
and resumed exactly once, refused from another teacher, with their provenance; a student trained from the label
directory alone, with no teacher present."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clfjudge import testing
from clfjudge.cli import main
from clfjudge.judges.verdict import questions_from, verdict_card
from clfjudge.training.labels import LABELS, PAIRS, PROVENANCE, LabelSet, answer_key, read_rows

WORDS = "apple river stone cloud green music paper light north window garden silver".split()


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return testing.tiny_llama(tmp_path_factory.mktemp("chat-llama"), chat=True)


def teacher(directory: Path, model, questions=("correct",)) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    verdict_card(str(model), questions_from(list(questions), "t"), precision="fp32").save(directory)
    return directory


def pool(path: Path, n: int = 24) -> Path:
    """Pairs where one reference answer recurs under each question (as AlpacaEval's reference outputs do)."""
    rows = []
    for i in range(n):
        q = f"Question {i // 4} about {WORDS[i // 4 % len(WORDS)]}?"
        rows.append({"question": q, "answer_a": f"The reference answer to {q}",
                     "answer_b": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + i % 5))})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(*args) -> int:
    return main(["label", *map(str, args)])


def test_every_answer_is_read_once_with_provenance(chat_model, tmp_path, monkeypatch):
    from clfjudge.judges import verdict

    reads = []
    original = verdict.VerdictReader.log_odds
    monkeypatch.setattr(verdict.VerdictReader, "log_odds",
                        lambda self, records: reads.extend(records) or original(self, records))
    t = teacher(tmp_path / "teacher", chat_model, ("correct", "harmless"))
    out = tmp_path / "labels"
    assert run(t, "--pool", pool(tmp_path / "pool.jsonl"), "--out", out, "--pairs", 24, "--chunk", 5) == 0
    keys = [answer_key(r.question, r.answer) for r in reads]
    assert len(keys) == len(set(keys)) == 24 + 6  # 24 own answers, 6 questions' reference answers once each
    labels = read_rows(out / LABELS)
    assert len(labels) == 30 and all(set(r["reward"]) == {"correct", "harmless"} and r["tokens"] > 0 for r in labels)
    provenance = json.loads((out / PROVENANCE).read_text())
    assert provenance["teacher"]["form"] == "pointwise" and provenance["teacher"]["card_hash"]
    assert provenance["teacher"]["card"]["kind"] == "verdict" and provenance["machine"]["cpu"]
    assert provenance["rounds"] == [{**provenance["rounds"][0], "selection": "random", "pairs": 24}]
    labelled = LabelSet(out)
    pair = json.loads((tmp_path / "pool.jsonl").read_text().splitlines()[0])
    assert 0 < labelled.p_a(pair["question"], pair["answer_a"], pair["answer_b"]) < 1
    assert run(t, "--pool", tmp_path / "pool.jsonl", "--out", out, "--pairs", 24) == 0  # nothing left to do
    assert len(read_rows(out / LABELS)) == 30 and len(reads) == 30


def test_another_teacher_is_refused_and_a_torn_line_is_dropped(chat_model, tmp_path, capsys):
    t = teacher(tmp_path / "teacher", chat_model)
    out = tmp_path / "labels"
    data = pool(tmp_path / "pool.jsonl", 8)
    assert run(t, "--pool", data, "--out", out, "--pairs", 4) == 0
    other = teacher(tmp_path / "other", chat_model, ("harmless",))
    assert run(other, "--pool", data, "--out", out, "--pairs", 4) == 2
    assert "another teacher" in capsys.readouterr().err
    rows = (out / LABELS).read_bytes()
    (out / LABELS).write_bytes(rows[:-20])  # a write cut short by a kill
    assert run(t, "--pool", data, "--out", out) == 0
    again = read_rows(out / LABELS)
    assert len(again) == len({r["key"] for r in again}) == len(rows.splitlines())
    (out / LABELS).write_text('{"key": 1}\nnot json\n' + (out / LABELS).read_text())
    assert run(t, "--pool", data, "--out", out) == 2
    assert f"{out / LABELS}:2:" in capsys.readouterr().err


def test_labelling_resumes_exactly_once_after_kill(chat_model, tmp_path):
    t = teacher(tmp_path / "teacher", chat_model)
    data = pool(tmp_path / "pool.jsonl", 40)
    out = tmp_path / "labels"
    cmd = [sys.executable, "-m", "clfjudge.cli", "label", str(t), "--pool", str(data), "--out", str(out),
           "--pairs", "40", "--chunk", "2"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(read_rows(out / LABELS)) < 4 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = len(read_rows(out / LABELS))
    assert 4 <= before < 50, "the kill came before the first labels or after the last"
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    rows = read_rows(out / LABELS)
    assert len(rows) == len({r["key"] for r in rows}) == 40 + 10
    assert len(read_rows(out / PAIRS)) == 40
    whole = tmp_path / "whole"
    assert run(t, "--pool", data, "--out", whole, "--pairs", 40) == 0
    resumed, once = ({r["key"]: r["reward"]["correct"] for r in read_rows(d / LABELS)} for d in (out, whole))
    assert resumed.keys() == once.keys()
    assert max(abs(resumed[k] - once[k]) for k in once) < 1e-4  # the same labels, whatever the process's threads


def test_a_student_learns_from_the_label_directory_alone(chat_model, tmp_path):
    import shutil

    import yaml

    from clfjudge.judges.base import Judge

    t = teacher(tmp_path / "teacher", chat_model)
    out = tmp_path / "labels"
    assert run(t, "--pool", pool(tmp_path / "pool.jsonl", 24), "--out", out, "--pairs", 24) == 0
    shutil.rmtree(t)  # no teacher from here on: the labels carry what it said
    recipe = tmp_path / "student.yaml"
    recipe.write_text(yaml.safe_dump({"backbone": str(chat_model), "head": "embedding",
                                      "embedding": {"features": [], "use_length": True, "layer": 1}}))
    student = tmp_path / "student"
    assert main(["distill", str(out), "--recipe", str(recipe), "--out", str(student), "--holdout", "0.25"]) == 0
    report = json.loads((student / "distill_report.json").read_text())
    assert report["pool_pairs"] == 24 and report["teacher"].startswith(f"labels {out}")
    card = Judge.load(student / "student").card
    provenance = card.training["distilled_from"]["labels"]
    assert provenance["teacher"]["card_hash"] == json.loads((out / PROVENANCE).read_text())["teacher"]["card_hash"]
    # labelling still under way: the pairs whose answers are all labelled are used, the others wait
    rows = (out / LABELS).read_text().splitlines()
    (out / LABELS).write_text("\n".join(rows[:20]) + "\n")
    partial = tmp_path / "partial"
    assert main(["distill", str(out), "--recipe", str(recipe), "--out", str(partial), "--holdout", "0.25"]) == 0
    report = json.loads((partial / "distill_report.json").read_text())
    labelled = LabelSet(out)
    complete = [p for p in labelled.pairs if p["a"] in labelled.labels and p["b"] in labelled.labels]
    assert 0 < report["pool_pairs"] == len(complete) < 24


def test_uncertain_pairs_are_those_the_student_is_least_sure_of(chat_model, tmp_path):
    from clfjudge.judges.base import Judge

    t = teacher(tmp_path / "teacher", chat_model)
    data = pool(tmp_path / "pool.jsonl", 12)
    out = tmp_path / "labels"
    assert run(t, "--pool", data, "--out", out, "--pairs", 4, "--select", "uncertain", "--student", t,
               "--candidates", 12) == 0
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    results = Judge.load(t).compare_batch(rows, symmetric=True)
    certainty = [abs(c.p_a / (c.p_a + c.p_b) - 0.5) for c in results]
    chosen = {row["a"] + row["b"] for row in read_rows(out / PAIRS)}
    keys = [answer_key(r["question"], r["answer_a"]) + answer_key(r["question"], r["answer_b"]) for r in rows]
    least = {keys[i] for i in sorted(range(12), key=certainty.__getitem__)[:4]}
    assert chosen == least and all(row["selection"] == "uncertain" for row in read_rows(out / PAIRS))
    assert run(t, "--pool", data, "--out", out, "--pairs", 2) == 0  # a random round beside it
    assert [r["selection"] for r in read_rows(out / PAIRS)].count("random") == 2
    assert len(json.loads((out / PROVENANCE).read_text())["rounds"]) == 2
