"""Progress as answers are read (``clfjudge.progress``): ``clfjudge score`` on a tiny random verdict judge reports
each batch of answers, with its tokens, while one chunk of lines is still being scored, in plain lines where standard
error is not a terminal; with no meter open nothing is shown."""
from __future__ import annotations

import io
import json
import re

import pytest

from clfjudge import progress, testing

ANSWERS = ["Paris.", "Berlin is the capital.", "It is Paris, on the Seine.", "Lyon.", "Paris!", "Marseille, I think."]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    return testing.tiny_verdict_judge(tmp_path_factory.mktemp("progress"))


def test_score_reports_every_answer_as_it_is_read(judge_dir, tmp_path, monkeypatch, capsys):
    from clfjudge.cli import main

    monkeypatch.setattr(progress, "LINE_SECONDS", 0.0)  # a line at every report
    rows = tmp_path / "in.jsonl"
    # different questions: no shared prefix, so every answer is its own batch of one
    rows.write_text("".join(json.dumps({"question": f"Question {i}: what is the capital of France?", "answer": a})
                            + "\n" for i, a in enumerate(ANSWERS)))
    assert main(["score", str(judge_dir), "--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
                 "--batch-size", "1"]) == 0
    err = capsys.readouterr().err
    shown = [line for line in err.split("\n") if "scoring" in line]
    assert shown and not any("\r" in line for line in shown)  # not a terminal: whole lines
    counts = [int(n) for n in re.findall(r"scoring: (\d+) answers read", err)]
    # one chunk holds all six lines: the answers are reported one by one before it is written, then the lines
    assert counts[:len(ANSWERS)] == list(range(1, len(ANSWERS) + 1)), err
    tokens = [int(t.replace(",", "")) for t in re.findall(r"answers read \([^)]*\), ([\d,]+) tokens", err)]
    assert tokens[0] > 10 and tokens == sorted(tokens) and len(set(tokens[:len(ANSWERS)])) == len(ANSWERS)
    assert "line 6 (100% of the input) done" in err


def test_a_meter_shows_steps_and_nothing_without_one():
    stream = io.StringIO()
    progress.advance(5, 100)  # no meter open: nothing, anywhere
    with progress.meter("export", stream=stream) as shown:
        progress.step("gate int8")
        progress.advance(2, 40)
        assert (shown.answers, shown.tokens) == (2, 40)
    with progress.meter("export", enabled=False) as hidden:
        assert hidden is None
        progress.advance(3)
    text = stream.getvalue()
    assert text.splitlines()[0] == "export: gate int8"
    assert re.search(r"export: 2 answers read \([\d.]+/s\), 40 tokens", text)


def test_the_rates_count_from_the_last_step(monkeypatch):
    """An export quantizes for minutes before its gate reads: the gate's answers/s are its own, not over the export."""
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    meter = progress.Meter("export", stream, every=0)
    now[0] = 100.0
    meter.step("gate fp32 (fp32) on 16 pairs")
    now[0] = 110.0
    meter.advance(20, 2000)
    assert stream.getvalue().splitlines()[-1] == "export: 20 answers read (2.00/s), 2,000 tokens (200/s), 110 s"


def test_a_stop_whose_exception_was_swallowed_is_raised_again_at_the_next_report():
    import signal

    from clfjudge import progress

    progress.stop(signal.SIGINT)  # as the command's handler records it before raising (a finalizer may drop that)
    try:
        with pytest.raises(KeyboardInterrupt):
            progress.advance(1)
        with pytest.raises(KeyboardInterrupt):
            progress.step("gate fp32")
        progress.stop(signal.SIGTERM)
        with pytest.raises(SystemExit) as stopped:
            progress.note("1/2")
        assert stopped.value.code == 128 + signal.SIGTERM
    finally:
        progress.stop(None)
    progress.advance(1)  # the command is over: reports raise nothing


def test_a_signal_during_a_held_cleanup_arrives_after_it(tmp_path):
    import os
    import signal

    from clfjudge.outputs import discard

    folder = tmp_path / ".onnx.x"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "f").write_text("x")
    removed = []

    def cleanup_stopped_midway(path, ignore_errors=False):  # a second Ctrl-C lands while the folder is removed
        os.kill(os.getpid(), signal.SIGINT)
        removed.append(path)
        shutil_rmtree(path, ignore_errors=ignore_errors)

    import shutil

    shutil_rmtree = shutil.rmtree
    shutil.rmtree = cleanup_stopped_midway
    # a run started in the background by a shell without job control inherits SIGINT ignored: Ctrl-C as a terminal
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            discard(folder)
    finally:
        shutil.rmtree = shutil_rmtree
        signal.signal(signal.SIGINT, previous)
    assert removed == [folder] and not folder.exists()
