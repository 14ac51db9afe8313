"""Nothing a command reads is lost to what it writes: `clfjudge score` refuses an output, rejected or progress path
that is the same file as its input, the judge's files or another output (by name, symlink or hard link) and leaves
every file as it was; outputs are replaced whole; an undecodable input line is rejected with its line and byte
offset; OS errors and bad options are one line with the documented exit status."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from tiny_judges import make_judge

from clfjudge.cli import EXIT_JUDGE, EXIT_OS, EXIT_USAGE, main
from clfjudge.cli import os_error_line as main_line
from clfjudge.outputs import SamePathError, check_apart, check_writable, replace_whole, write_whole

Q = "What is the capital of France?"


@pytest.fixture(scope="module")
def judge_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    return make_judge(tiny_bert_dir, tmp_path_factory.mktemp("cls3") / "judge")


def _pairs(n: int = 3) -> str:
    return "".join(json.dumps({"id": f"p{i}", "question": Q, "answer_a": "Paris.", "answer_b": "Lyon " * i}) + "\n"
                   for i in range(n))


def _snapshot(*roots: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry under the roots: a symlink's target, a file's bytes (so a change of either shows)."""
    seen = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            seen[str(p)] = ("link", os.readlink(p)) if p.is_symlink() else ("file", p.read_bytes()) \
                if p.is_file() else ("dir", "")
    return seen


def _layout(tmp: Path, name: str) -> list[str]:
    """Files for one same-path case, and the score options that name them."""
    inp, out = tmp / "in.jsonl", tmp / "out.jsonl"
    inp.write_text(_pairs())
    out.write_text('{"id": "old", "an earlier run": true}\n')
    if name == "output is input":
        return ["--input", str(inp), "--output", str(inp)]
    if name == "rejected is input":
        return ["--input", str(inp), "--output", str(out), "--rejected", str(inp)]
    if name == "rejected is output":
        return ["--input", str(inp), "--output", str(out), "--rejected", str(out)]
    if name == "rejected is a new output":  # neither exists yet: the same name is the same file
        return ["--input", str(inp), "--output", str(tmp / "new.jsonl"), "--rejected", str(tmp / "new.jsonl")]
    if name == "output symlinks to input":
        (tmp / "link.jsonl").symlink_to(inp)
        return ["--input", str(inp), "--output", str(tmp / "link.jsonl")]
    if name == "input symlinks to output":
        (tmp / "link.jsonl").symlink_to(out)
        return ["--input", str(tmp / "link.jsonl"), "--output", str(out)]
    if name == "output hard-links input":
        os.link(inp, tmp / "hard.jsonl")
        return ["--input", str(inp), "--output", str(tmp / "hard.jsonl")]
    if name == "rejected symlinks to output":
        (tmp / "rej.jsonl").symlink_to(out)
        return ["--input", str(inp), "--output", str(out), "--rejected", str(tmp / "rej.jsonl")]
    if name == "rejected hard-links input":
        os.link(inp, tmp / "rej.jsonl")
        return ["--input", str(inp), "--output", str(out), "--rejected", str(tmp / "rej.jsonl")]
    if name == "rejected is the progress file":
        return ["--input", str(inp), "--output", str(out), "--rejected", str(tmp / "out.jsonl.progress.json")]
    if name == "input is the partial output":
        (tmp / "out.jsonl.partial").write_text(_pairs())
        return ["--input", str(tmp / "out.jsonl.partial"), "--output", str(out)]
    if name == "output symlinks through a directory":
        (tmp / "alias").symlink_to(tmp)
        return ["--input", str(inp), "--output", str(tmp / "alias" / "in.jsonl")]
    if name == "output through a missing folder is input":  # the writer makes nd, so nd/.. is tmp
        return ["--input", str(inp), "--output", str(tmp / "nd" / ".." / "in.jsonl")]
    if name == "rejected through a missing folder is input":  # nothing rejected: the stale rejected file goes
        return ["--input", str(inp), "--output", str(out), "--rejected", str(tmp / "nd" / ".." / "in.jsonl")]
    if name == "output through missing folders and a symlink":
        (tmp / "sub").mkdir()
        (tmp / "sub" / "up").symlink_to(tmp / "sub")
        return ["--input", str(inp), "--output", str(tmp / "sub" / "up" / "a" / "b" / ".." / ".." / ".." / "in.jsonl")]
    raise AssertionError(name)


CASES = ["output is input", "rejected is input", "rejected is output", "rejected is a new output",
         "output symlinks to input", "input symlinks to output", "output hard-links input",
         "rejected symlinks to output", "rejected hard-links input", "rejected is the progress file",
         "input is the partial output", "output symlinks through a directory",
         "output through a missing folder is input", "rejected through a missing folder is input",
         "output through missing folders and a symlink"]


@pytest.mark.parametrize("case", CASES)
def test_score_refuses_an_output_that_is_an_input_or_another_output(judge_dir, tmp_path, capsys, case):
    argv = _layout(tmp_path, case)
    before = _snapshot(tmp_path, judge_dir)
    assert main(["score", str(judge_dir), *argv]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is the same file as" in err and "refused" in err, err
    assert _snapshot(tmp_path, judge_dir) == before


@pytest.mark.parametrize("resume", [False, True])
def test_score_refuses_to_write_over_a_judge_file(judge_dir, tmp_path, capsys, resume):
    inp = tmp_path / "in.jsonl"
    inp.write_text(_pairs())
    before = _snapshot(judge_dir)
    argv = ["score", str(judge_dir), "--input", str(inp), "--output", str(tmp_path / "out.jsonl"),
            "--rejected", str(judge_dir / "judge_card.json"), *(["--resume"] if resume else [])]
    assert main(argv) == EXIT_USAGE
    assert "the same file as a file of JUDGE_DIR" in capsys.readouterr().err
    assert _snapshot(judge_dir) == before


@pytest.mark.parametrize("name", ["model.safetensors", "judge_card.json"])
def test_a_missing_folder_and_dotdot_do_not_reach_a_judge_file(judge_dir, tmp_path, capsys, name):
    inp = tmp_path / "in.jsonl"
    inp.write_text(_pairs())
    before = _snapshot(tmp_path, judge_dir)
    argv = ["score", str(judge_dir), "--input", str(inp), "--output", str(judge_dir / "nd" / ".." / name)]
    assert main(argv) == EXIT_USAGE
    assert f"the same file as a file of JUDGE_DIR ({judge_dir / name})" in capsys.readouterr().err
    assert _snapshot(tmp_path, judge_dir) == before


def test_audit_out_through_a_missing_folder_is_not_its_sets_folder(judge_dir, tmp_path, capsys):
    data = tmp_path / "metrics.json"  # a set named as the audit's own metrics file
    data.write_text(json.dumps([json.loads(line) for line in _pairs().splitlines()]))
    before = _snapshot(tmp_path, judge_dir)
    assert main(["audit", str(judge_dir), "--sets", str(data), "--out", str(tmp_path / "nd5" / "..")]) == EXIT_USAGE
    assert "the metrics" in capsys.readouterr().err
    assert _snapshot(tmp_path, judge_dir) == before


def test_audit_refuses_sets_where_its_figures_go(judge_dir, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text(_pairs())
    (tmp_path / "audit").mkdir()
    for name in ("length_bias.png", "agreement_pairs.jsonl.png"):
        (tmp_path / "audit" / name).symlink_to(data)
        before = _snapshot(tmp_path, judge_dir)
        assert main(["audit", str(judge_dir), "--sets", str(data), "--out", str(tmp_path / "nd" / ".." / "audit")]) \
            == EXIT_USAGE
        assert "figure" in capsys.readouterr().err
        assert _snapshot(tmp_path, judge_dir) == before
        (tmp_path / "audit" / name).unlink()


def test_an_audit_through_a_missing_folder_makes_no_folder_on_the_way(judge_dir, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text(_pairs())  # no verdicts: the audit stops once it has made --out
    assert main(["audit", str(judge_dir), "--sets", str(data), "--out", str(tmp_path / "nd" / ".." / "audit")]) \
        == EXIT_USAGE
    assert "pairs.jsonl" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]


def test_score_writes_its_output_whole_and_removes_a_stale_rejected_file(judge_dir, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(_pairs())
    out.write_text("old\n")
    (tmp_path / "out.jsonl.rejected.jsonl").write_text("an earlier run's rejections\n")
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(out)]) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["p0", "p1", "p2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_invalid_utf8_is_rejected_with_its_line_and_byte_offset(judge_dir, tmp_path, capsys):
    inp, out = tmp_path / "latin1.jsonl", tmp_path / "out.jsonl"
    lines = _pairs().encode().splitlines(keepends=True)
    bad = json.dumps({"id": "fr", "question": "Où est Paris ?", "answer_a": "En France.", "answer_b": "Là."},
                     ensure_ascii=False).encode("latin-1") + b"\n"
    inp.write_bytes(lines[0] + bad + lines[1])
    column = bad.index(b"\xf9")  # "ù" in Latin-1: not UTF-8
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(out)]) == 1
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["p0", "p1"]
    rejected = json.loads((tmp_path / "out.jsonl.rejected.jsonl").read_text())
    assert rejected["line"] == 2
    assert (f"not valid utf-8: byte 0xf9 at byte offset {column} of the line ({len(lines[0]) + column} of the file)"
            in rejected["error"])
    assert "scored 2, rejected 1" in capsys.readouterr().out
    # read as the encoding it is in, every line is scored, the text as written
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(out), "--encoding", "latin-1"]) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["p0", "fr", "p1"]
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(out), "--encoding", "utf-16"]) == 2
    assert "only an encoding that writes ASCII as ASCII" in capsys.readouterr().err
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(out), "--encoding", "klingon"]) == 2
    assert "no such encoding" in capsys.readouterr().err


def test_a_directory_as_output_is_one_line_and_the_os_exit_status(judge_dir, tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text(_pairs())
    (tmp_path / "outdir").mkdir()
    for option in ("--output", "--rejected"):
        argv = ["--output", str(tmp_path / "out.jsonl"), option, str(tmp_path / "outdir")]
        assert main(["score", str(judge_dir), "--input", str(inp), *argv]) == EXIT_OS
        err = capsys.readouterr().err
        assert err == f"clfjudge: error: {tmp_path / 'outdir'}: is a directory, not a file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "outdir"]


def test_every_writing_command_refuses_an_output_that_is_an_input(judge_dir, tmp_path, capsys):
    """export, calibrate, audit and train check their outputs with the same rule before reading anything."""
    data = tmp_path / "pairs.jsonl"
    data.write_text(_pairs())
    (tmp_path / "link").symlink_to(judge_dir)
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "metrics.json").symlink_to(data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"backbone: {judge_dir}\nhead: cls3\nsources: [{data}]\n")
    before = _snapshot(tmp_path, judge_dir)
    for argv, role in [
        (["export", str(judge_dir), "--out", str(tmp_path / "link")], "--out"),
        (["calibrate", str(judge_dir), "--source", str(judge_dir / "judge_card.json")], "the judge card"),
        (["audit", str(judge_dir), "--sets", str(data), "--out", str(tmp_path / "audit")], "the metrics"),
        (["train", "--recipe", str(recipe), "--set", f"output_dir={tmp_path / 'link'}"], "output_dir"),
    ]:
        assert main(argv) == EXIT_USAGE, argv
        err = capsys.readouterr().err
        assert err.startswith(f"clfjudge: error: {role} ") and "is the same file as" in err, err
        assert _snapshot(tmp_path, judge_dir) == before


@pytest.mark.parametrize("argv, words", [
    (["score", "j", "--input", "i", "--output", "o", "--threads", "-3"], "argument --threads: -3 is out of range"),
    (["serve", "j", "--threads", "0"], "argument --threads: 0 is out of range"),
    (["serve", "j", "--port", "70000"], "argument --port: 70000 is out of range: it must be from 0 to 65535"),
    (["serve", "j", "--port", "http"], "argument --port: 'http' is not an integer"),
])
def test_out_of_range_numbers_are_argparse_errors(capsys, argv, words):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == EXIT_USAGE and words in capsys.readouterr().err


def test_a_judge_with_sharded_pickled_weights_loads(judge_dir, tmp_path):
    """pytorch_model.bin.index.json (shards read as tensors only) is a judge's weights too, not "no model found"."""
    import shutil

    import torch
    from transformers import AutoModelForSequenceClassification

    from clfjudge.judges.base import Judge

    sharded = tmp_path / "judge"
    shutil.copytree(judge_dir, sharded)
    (sharded / "model.safetensors").unlink()
    state = AutoModelForSequenceClassification.from_pretrained(judge_dir).state_dict()
    names = sorted(state)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        shard = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save({k: state[k].clone() for k in part}, sharded / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    pair = {"question": Q, "answer_a": "Paris.", "answer_b": "Lyon."}
    assert Judge.load(sharded).compare_batch([pair])[0].p_a == pytest.approx(
        Judge.load(judge_dir).compare_batch([pair])[0].p_a, abs=1e-6)


# -- the helpers every writing command uses -----------------------------------------------------------------

def test_check_apart_compares_files_not_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("a")
    check_apart({"--input": a}, {"--output": b, "--report": tmp_path / "c", "--unset": None})
    os.link(a, b)
    with pytest.raises(SamePathError, match=re.escape(f"--output {b} is the same file as --input ({a})")):
        check_apart({"--input": a}, {"--output": b})
    with pytest.raises(SamePathError, match="--second .* is the same file as --first"):
        check_apart({}, {"--first": tmp_path / "new", "--second": tmp_path / "x" / ".." / "new"})


def test_check_writable_names_the_file_and_the_reason(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        check_writable(tmp_path / "file" / "out.jsonl")
    with pytest.raises(NotADirectoryError):
        check_writable(tmp_path / "file", directory=True)
    check_writable(tmp_path, directory=True)
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a read-only file system answers (not root)
    with pytest.raises(PermissionError) as refused:
        check_writable(tmp_path / "file")
    assert main_line(refused.value) == f"{tmp_path / 'file'}: is read-only"
    with pytest.raises(PermissionError) as refused:
        check_writable(tmp_path / "new" / "out.jsonl")
    assert main_line(refused.value) == f"{tmp_path / 'new' / 'out.jsonl'}: cannot write in {tmp_path}"


def test_an_export_that_cannot_be_written_fails_before_its_work(judge_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only directory (the tests run as root)
    assert main(["export", str(judge_dir), "--out", str(tmp_path / "onnx")]) == EXIT_OS
    assert capsys.readouterr().err == f"clfjudge: error: {tmp_path / 'onnx'}: cannot write in {tmp_path}\n"
    assert list(tmp_path.iterdir()) == []


def test_replace_whole_leaves_the_old_file_when_the_write_fails(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old")
    path.chmod(0o640)
    with pytest.raises(RuntimeError), replace_whole(path) as f:
        f.write("half of the new")
        raise RuntimeError("the disk is full")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]
    write_whole(path, "new")
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o640
    with pytest.raises(IsADirectoryError):
        write_whole(tmp_path, "x")


# -- outputs that are not regular files: written through, never replaced -----------------------------------

def _device(tmp: Path, name: str, minor: int) -> Path:
    """A character device that is /dev/<name> (1, minor), made in ``tmp`` where this user may (as root: a writer
    that replaced it would replace this copy, not the machine's), else the machine's own (which a user who cannot
    make devices cannot replace either)."""
    import stat

    path = tmp / "dev" / name
    path.parent.mkdir(exist_ok=True)
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except PermissionError:
        return Path("/dev") / name
    path.chmod(0o666)
    return path


def test_score_writes_through_a_fifo_and_dev_null(judge_dir, tmp_path, capsys):
    import threading

    inp, fifo, null = tmp_path / "in.jsonl", tmp_path / "scores.fifo", _device(tmp_path, "null", 3)
    inp.write_text(_pairs() + "not json\n")
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(fifo)]) == 1
    reader.join(30)
    assert [json.loads(line)["id"] for line in got[0].decode().splitlines()] == ["p0", "p1", "p2"]
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["dev", "in.jsonl", "scores.fifo"]
    assert "rejected" in capsys.readouterr().err  # no rejected file beside a FIFO: the rejection is printed
    for option in ("--output", "--rejected"):
        argv = ["--output", str(tmp_path / "out.jsonl"), option, str(null)]
        assert main(["score", str(judge_dir), "--input", str(inp), *argv]) == 1
        assert null.is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev", "in.jsonl", "out.jsonl", "scores.fifo"]
    assert [p.name for p in null.parent.iterdir()] == ["null"]
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(null), "--resume"]) == EXIT_USAGE
    assert "is a device or FIFO" in capsys.readouterr().err


def test_score_to_dev_full_is_one_os_error_line(judge_dir, tmp_path, capsys):
    inp, full = tmp_path / "in.jsonl", _device(tmp_path, "full", 7)
    inp.write_text(_pairs())
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(full)]) == EXIT_OS
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"clfjudge: error: {full}: No space left on device", err
    assert full.is_char_device() and [p.name for p in full.parent.iterdir()] == ["full"]


def test_score_to_dev_stdout_keeps_the_summary_out_of_the_scores(judge_dir, tmp_path):
    import subprocess
    import sys

    inp, stdout = tmp_path / "in.jsonl", tmp_path / "stdout"
    inp.write_text(_pairs())
    stdout.symlink_to("/proc/self/fd/1")  # what /dev/stdout is, where a writer that replaced it harms nothing
    done = subprocess.run([sys.executable, "-m", "clfjudge.cli", "score", str(judge_dir), "--input", str(inp),
                           "--output", str(stdout)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["id"] for line in done.stdout.splitlines()] == ["p0", "p1", "p2"]
    assert "lines read 3: scored 3" in done.stderr
    assert stdout.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "stdout"]


def test_a_symlink_output_is_written_through_not_replaced(judge_dir, tmp_path):
    inp, real, link = tmp_path / "in.jsonl", tmp_path / "real" / "out.jsonl", tmp_path / "out.jsonl"
    inp.write_text(_pairs())
    real.parent.mkdir()
    real.write_text("old\n")
    link.symlink_to(real)
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(link)]) == 0
    assert link.is_symlink() and [json.loads(line)["id"] for line in real.read_text().splitlines()] == ["p0", "p1",
                                                                                                       "p2"]
    report = tmp_path / "report.md"
    report.symlink_to(tmp_path / "real" / "report.md")  # dangling: its target is made
    write_whole(report, "new")
    assert report.is_symlink() and (tmp_path / "real" / "report.md").read_text() == "new"
    null = _device(tmp_path, "null", 3)
    write_whole(null, "nothing")
    assert null.is_char_device()


# -- small things a careless user meets -----------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["score", "j", "--input", "i", "--output", "o", "--threads", "0"],
                                  ["serve", "j", "--port", "70000"], ["score", "j"], ["score", "j", "--bogus"]])
def test_a_usage_error_is_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == EXIT_USAGE and len(err.splitlines()) == 1, err
    assert err.startswith(f"clfjudge {argv[0]}: error: ") and err.endswith(f"(see clfjudge {argv[0]} --help)\n")


def test_an_input_directory_is_named_as_the_option(judge_dir, tmp_path, capsys):
    (tmp_path / "shards").mkdir()
    argv = ["score", str(judge_dir), "--input", str(tmp_path / "shards"), "--output", str(tmp_path / "out.jsonl")]
    assert main(argv) == EXIT_USAGE
    assert capsys.readouterr().err.startswith(f"clfjudge: error: --input {tmp_path / 'shards'} is a directory")


def test_a_bom_on_line_one_is_no_part_of_the_record(judge_dir, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    torn = '{"id": "torn", "question": "unterminated'  # the last line, cut short
    inp.write_bytes(b"\xef\xbb\xbf" + _pairs().encode() + torn.encode())
    assert main(["score", str(judge_dir), "--input", str(inp), "--output", str(out)]) == 1
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["p0", "p1", "p2"]
    rejected = json.loads((tmp_path / "out.jsonl.rejected.jsonl").read_text())
    assert rejected["line"] == 4 and " at at " not in rejected["error"]
    column = torn.index('"unterminated') + 1
    assert rejected["error"] == f"invalid JSON: Unterminated string starting at (column {column})"


def test_a_card_whose_kind_and_scheme_disagree_says_so(judge_dir):
    from dataclasses import replace

    from clfjudge.judges.base import Judge

    judge = Judge.load(judge_dir)
    judge.card = replace(judge.card, arity="point")  # a pointwise card over a pairwise head and template
    with pytest.raises(ValueError, match="its card's arity is 'point' but its head and scheme .* compare only; the "
                                         "card contradicts itself"):
        judge.require("score")


@pytest.fixture(scope="module")
def verdict_dir(tmp_path_factory) -> Path:
    from clfjudge import testing
    from clfjudge.judges.verdict import questions_from, verdict_card

    root = tmp_path_factory.mktemp("verdict")
    model = testing.tiny_llama(root / "model", chat=True)
    verdict_card(str(model), questions_from(["correct"], "test"), precision="fp32").save(root)
    return root


@pytest.mark.parametrize(("judge", "signum"), [("judge_dir", "SIGTERM"), ("judge_dir", "SIGINT"),
                                                ("verdict_dir", "SIGTERM")])
def test_a_stopped_export_leaves_no_temporary_folder(request, tmp_path, judge, signum):
    import signal
    import subprocess
    import sys
    import time

    judge_dir = request.getfixturevalue(judge)
    # on a loaded machine a signal can land only as the export ends; then it must have ended whole (its folder, no
    # temporary one), and the stop is tried again: one of three tries has to be a stop that leaves nothing
    for attempt in range(3):
        out = tmp_path / f"try{attempt}"
        out.mkdir()
        proc = subprocess.Popen([sys.executable, "-m", "clfjudge.cli", "export", str(judge_dir), "--out",
                                 str(out / "onnx"), "--n", "8"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 240
        while not any(p.name.startswith(".onnx.") for p in out.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "the export ended before its temporary folder"
            time.sleep(0.02)
        # a signal that lands inside a library's finalizer is swallowed there (Python ignores exceptions raised in
        # __del__); a user stops again, and so does this test, until the export has ended
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(getattr(signal, signum))
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        err = proc.communicate(timeout=120)[1].decode(errors="replace")
        if proc.returncode != 0:  # 143 / 130: stopped by its own exception; -15: ended by the signal, no cleanup ran
            assert list(out.iterdir()) == [], f"exit status {proc.returncode}: {err[-2000:]}"
            return
        assert [p.name for p in out.iterdir()] == ["onnx"], err[-2000:]
    raise AssertionError(f"three exports ran to the end through {signum}: {err[-2000:]}")


class SessionFailed(Exception):
    """What a runtime raises for a part of the judge that fails mid-run (onnxruntime's errors are plain Exceptions)."""


def test_a_judge_failing_mid_run_is_a_judge_error_and_the_run_resumes(judge_dir, tmp_path, capsys, monkeypatch):
    from clfjudge.scoring import batch

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(_pairs(6))
    real, calls = batch.judge_chunk, []

    def fails_second(*args, **kwargs):  # the second chunk reaches a part that fails (a graph opened late)
        calls.append(1)
        if len(calls) == 2:
            raise SessionFailed("continuation.onnx: protobuf parsing failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(batch, "judge_chunk", fails_second)
    argv = ["score", str(judge_dir), "--input", str(inp), "--output", str(out), "--chunk-size", "2"]
    assert main(argv) == EXIT_JUDGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    assert err.splitlines()[-1] == (f"clfjudge: error: judge {judge_dir} cannot be used: SessionFailed: "
                                    "continuation.onnx: protobuf parsing failed")
    assert "lines 1-2 of" in err and "--resume" in err
    monkeypatch.setattr(batch, "judge_chunk", real)
    assert main([*argv, "--resume"]) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [f"p{i}" for i in range(6)]
