"""`clfjudge score --engine ray` on a local Ray instance (two CPUs): the same bytes as the single-process scorer
shard by shard, Parquet shards, a run killed with SIGKILL and run again (nothing lost, nothing doubled, finished
shards not redone), and the default path without Ray. Skipped only where the ray extra is not installed."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_judges import make_judge

from clfjudge.cli import main

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'clfjudge[ray]')")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

REPO = Path(__file__).parents[1]
Q = "What is the capital of France?"
ANSWERS = ["Paris.", "The cat sat on the mat.", "Paris is the capital and largest city of France. " * 3,
           "Lyon, which is a city.", "", "It could be Marseille or Paris or Nice."]
OPTIONS = ["--chunk-size", "3", "--batch-size", "2"]  # several chunks per shard, several batches per chunk


def _pair(i: int, tag: str) -> dict:
    return {"id": f"{tag}{i}", "question": Q, "answer_a": ANSWERS[i % 6], "answer_b": ANSWERS[(i * 5 + 1) % 6]}


def _shard_lines(tag: str, n: int) -> list[str]:
    """Good pairs with a bad JSON line, a blank line, a missing field, a repeated id and a line without an id."""
    lines = [json.dumps(_pair(i, tag)) for i in range(n)]
    lines[2] = "{not json"
    lines[4] = ""
    lines[6] = json.dumps({"id": f"{tag}-short", "question": Q, "answer_a": "x"})
    lines[8] = json.dumps(_pair(1, tag))
    lines[9] = json.dumps({k: v for k, v in _pair(9, tag).items() if k != "id"})
    return lines


@pytest.fixture(scope="module")
def judge_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    return make_judge(tiny_bert_dir, tmp_path_factory.mktemp("ray-judge") / "judge")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Three JSONL shards (one in a sub-directory) and a Parquet shard, and the Parquet rows as JSONL (``ref/``,
    outside the input) for the single-process scorer, which reads JSONL only."""
    root = tmp_path_factory.mktemp("shards")
    (root / "in" / "more").mkdir(parents=True)
    for name, n in (("a", 14), ("b", 11), ("more/c", 12)):
        (root / "in" / f"{name}.jsonl").write_text("\n".join(_shard_lines(name[-1], n)) + "\n")
    with (root / "in" / "b.jsonl").open("ab") as f:  # a Latin-1 line: rejected with its byte offset, as locally
        f.write(json.dumps({"id": "b-fr", "question": "Où ?", "answer_a": "Là.", "answer_b": "Ici."},
                           ensure_ascii=False).encode("latin-1") + b"\n" + json.dumps(_pair(11, "b")).encode())
    rows = [_pair(i, "pq") for i in range(7)]
    rows[3] = {**rows[3], "answer_b": None}  # a null field: rejected, as a JSON null would be
    pq.write_table(pa.Table.from_pylist(rows), root / "in" / "d.parquet", row_group_size=3)
    (root / "ref").mkdir()
    (root / "ref" / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _score(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["score", *args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def single_process(judge_dir, shards, tmp_path_factory) -> dict[str, tuple[bytes, list[dict], str]]:
    """Each shard scored alone by the single-process scorer: (output bytes, rejected rows, summary)."""
    out = tmp_path_factory.mktemp("single")
    want = {}
    for name, src in (("a", "in/a.jsonl"), ("b", "in/b.jsonl"), ("more/c", "in/more/c.jsonl"),
                      ("d", "ref/d.jsonl")):
        dst = out / f"{name.replace('/', '_')}.jsonl"
        code, stdout, _ = _score(str(judge_dir), "--input", str(shards / src), "--output", str(dst), *OPTIONS)
        assert code == 1  # every shard has a rejected line
        rejected = [json.loads(x) for x in Path(f"{dst}.rejected.jsonl").read_text().splitlines()]
        want[name] = dst.read_bytes(), rejected, stdout.splitlines()[0]
    return want


def _check_output(out: Path, shards: Path, want) -> None:
    for name, (output, rejected, _) in want.items():
        assert (out / f"{name}.jsonl").read_bytes() == output, name
        got = [json.loads(x) for x in (out / f"{name}.rejected.jsonl").read_text().splitlines()]
        source = shards / "in" / (f"{name}.parquet" if name == "d" else f"{name}.jsonl")
        assert [r.pop("file") for r in got] == [str(source.resolve())] * len(got)
        assert got == rejected, name
    assert not list(out.rglob(".*.tmp"))


def _summary(want) -> str:
    """The summary of the four shards together, from the single-process summaries' counts."""
    read = scored = rejected = blank = 0
    for _, _, line in want.values():
        words = line.replace(",", "").split()
        read, scored = read + int(words[2].rstrip(":")), scored + int(words[4])
        rejected, blank = rejected + int(words[6]), blank + (int(words[8]) if "blank" in words else 0)
    return f"lines read {read}: scored {scored}, rejected {rejected}, blank {blank}"


def test_ray_engine_writes_what_the_single_process_scorer_writes(ray_cluster, judge_dir, shards, single_process,
                                                                 tmp_path):
    out = tmp_path / "out"
    code, stdout, stderr = _score(str(judge_dir), "--input", str(shards / "in"), "--output", str(out),
                                  "--engine", "ray", "--actors", "2", *OPTIONS)
    assert code == 1, stderr[-3000:]
    _check_output(out, shards, single_process)
    assert stdout.splitlines()[0].startswith(_summary(single_process) + ", duplicate ids 3")
    assert f"rejected {(shards / 'in' / 'a.jsonl').resolve()}:3: invalid JSON" in stderr
    assert f"rejected {(shards / 'in' / 'b.jsonl').resolve()}:12: not valid utf-8: byte 0xf9" in stderr
    # the same command again finds every shard done and scores nothing
    code, stdout_again, stderr = _score(str(judge_dir), "--input", str(shards / "in"), "--output", str(out),
                                        "--engine", "ray", "--actors", "2", *OPTIONS)
    assert code == 1 and stdout_again == stdout
    assert "4 of 4 shard(s) finished by an earlier run: skipped" in stderr and "scoring" not in stderr
    # another judge option into the same directory is refused, naming what changed
    code, _, stderr = _score(str(judge_dir), "--input", str(shards / "in"), "--output", str(out),
                             "--engine", "ray", "--symmetric", *OPTIONS)
    assert code == 2 and "symmetric was False, now True" in stderr


def test_a_judge_that_cannot_start_is_a_one_line_error(ray_cluster, judge_dir, shards, tmp_path):
    """The actors fail to start (a pair judge asked to score answers): exit status 2 and the judge's own words;
    the settings of that run do not hold the directory, since no shard was finished with them."""
    from clfjudge.scoring import ray_engine

    out = tmp_path / "out"
    code, _, err = _score(str(judge_dir), "--input", str(shards / "in" / "b.jsonl"), "--output", str(out),
                          "--engine", "ray", "--actors", "1", "--task", "score")
    assert code == 2
    assert ("clfjudge: error: the judge actors could not start: ValueError: this cls3 judge (pair) cannot score; "
            "it can compare") in err
    ray_engine._check_settings(ray_engine.Layout(out), {"task": "compare"})  # not refused


KILLED_DRIVER = """
import os, signal, sys
from clfjudge.cli import main
from clfjudge.scoring import ray_engine
add, committed = ray_engine.ShardWriter.add, []
commit = ray_engine.ShardWriter.commit
def committing(self, size):
    commit(self, size)
    committed.append(self.shard.name)
def dying(self, row):
    lines = add(self, row)
    if committed and self.shard.name not in committed:  # a chunk of the second shard is written: no more
        for f in self.files:
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return lines
ray_engine.ShardWriter.add, ray_engine.ShardWriter.commit = dying, committing
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_run_run_again_loses_and_doubles_nothing(ray_cluster, judge_dir, shards, single_process, tmp_path):
    """The driver is killed (SIGKILL: nothing runs after it) once one shard is renamed into place and a chunk of
    the next is in its temporary file; the same command again skips the finished shard (its file is not
    rewritten) and leaves the single-process scorer's bytes for every shard."""
    out = tmp_path / "out"
    args = ["score", str(judge_dir), "--input", str(shards / "in"), "--output", str(out), "--engine", "ray",
            "--address", ray_cluster, "--actors", "2", *OPTIONS]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", KILLED_DRIVER, *args], cwd=REPO, env=env, capture_output=True,
                          timeout=900)
    assert done.returncode == -9, done.stderr.decode()[-3000:]
    finished = [p for p in out.rglob("*.jsonl") if not p.name.endswith(".rejected.jsonl")]
    assert len(finished) == 1
    partial = [p for p in out.rglob(".*.jsonl.tmp") if not p.name.endswith(".rejected.jsonl.tmp")]
    assert len(partial) == 1 and partial[0].stat().st_size > 0
    before = finished[0].stat()
    code, stdout, stderr = _score(*args[1:])
    assert code == 1, stderr[-3000:]
    assert "1 of 4 shard(s) finished by an earlier run: skipped" in stderr
    assert (finished[0].stat().st_ino, finished[0].stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    _check_output(out, shards, single_process)
    assert stdout.splitlines()[0].startswith(_summary(single_process) + ", duplicate ids 3")


def test_bad_ray_inputs_and_options_are_named(judge_dir, tmp_path):
    """What is refused before Ray starts: a Parquet column JSON cannot hold, no input, local-only options."""
    pq.write_table(pa.table({"id": ["x"], "question": [b"bytes"]}), tmp_path / "bad.parquet")
    code, _, err = _score(str(judge_dir), "--input", str(tmp_path / "bad.parquet"), "--output",
                          str(tmp_path / "o"), "--engine", "ray")
    assert code == 2 and f"{tmp_path / 'bad.parquet'}: column 'question' is binary" in err
    code, _, err = _score(str(judge_dir), "--input", str(tmp_path / "*.jsonl"), "--output", str(tmp_path / "o"),
                          "--engine", "ray")
    assert code == 2 and "no .jsonl or .parquet file" in err
    code, _, err = _score(str(judge_dir), "--input", str(tmp_path / "bad.parquet"), "--output",
                          str(tmp_path / "o"), "--engine", "ray", "--resume")
    assert code == 2 and "--resume applies to --engine local" in err
    code, _, err = _score(str(judge_dir), "--input", str(tmp_path / "bad.parquet"), "--output",
                          str(tmp_path / "o"), "--actors", "2")
    assert code == 2 and "--actors applies to --engine ray" in err


def test_an_output_that_is_or_is_inside_the_input_is_refused(judge_dir, shards, tmp_path):
    """Before Ray starts: a shard's output would be the shard itself, or the outputs would be read as shards."""
    before = {p: p.read_bytes() for p in (shards / "in").rglob("*") if p.is_file()}
    code, _, err = _score(str(judge_dir), "--input", str(shards / "in"), "--output", str(shards / "in"),
                          "--engine", "ray")
    assert code == 2 and "is the same file as an input shard" in err
    code, _, err = _score(str(judge_dir), "--input", str(shards / "in"), "--output", str(shards / "in" / "out"),
                          "--engine", "ray")
    assert code == 2 and "is inside --input" in err
    code, _, err = _score(str(judge_dir), "--input", str(shards / "in"), "--output", str(tmp_path / "o"),
                          "--engine", "ray", "--encoding", "latin-1")
    assert code == 2 and "--encoding applies to --engine local" in err
    assert {p: p.read_bytes() for p in (shards / "in").rglob("*") if p.is_file()} == before


def test_a_ray_client_address_is_refused_before_anything_is_written(judge_dir, shards, tmp_path, monkeypatch):
    """Ray Data, which the scorer runs on, does not work through Ray Client: ``ray://`` (given or in RAY_ADDRESS) is
    refused with the ways that do work, before the output directory is made."""
    args = [str(judge_dir), "--input", str(shards / "in" / "a.jsonl"), "--output", str(tmp_path / "o"),
            "--engine", "ray"]
    code, _, err = _score(*args, "--address", "ray://127.0.0.1:10001")
    assert code == 2 and "--address ray://127.0.0.1:10001: clfjudge score --engine ray runs on Ray Data" in err
    assert "--address auto" in err and "ray job submit" in err
    monkeypatch.setenv("RAY_ADDRESS", "ray://10.0.0.1:10001")
    code, _, err = _score(*args)
    assert code == 2 and "RAY_ADDRESS ray://10.0.0.1:10001: clfjudge score --engine ray" in err
    assert not (tmp_path / "o").exists()


def test_the_single_process_path_does_not_import_ray(judge_dir, shards, tmp_path):
    script = ("import sys\nfrom clfjudge.cli import main\n"
              f"code = main(['score', {str(judge_dir)!r}, '--input', {str(shards / 'in' / 'a.jsonl')!r}, "
              f"'--output', {str(tmp_path / 'out.jsonl')!r}])\n"
              "assert code == 1, code\nprint(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().splitlines()[-1] == "[]"


def test_asking_a_local_ray_for_more_actors_than_it_has_stops_with_a_clear_error(judge_dir, shards, tmp_path):
    """Ray would wait forever to place them. In a process of its own, so that clfjudge starts the local instance
    (in this one it would join the module's)."""
    script = ("import sys\nfrom clfjudge.cli import main\n"
              f"sys.exit(main(['score', {str(judge_dir)!r}, '--input', {str(shards / 'in' / 'b.jsonl')!r}, "
              f"'--output', {str(tmp_path / 'out')!r}, '--engine', 'ray', '--actors', '4096']))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "RAY_worker_niceness": "0"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, timeout=600)
    err = done.stderr.decode()
    assert done.returncode == 2, err[-3000:]
    assert "4096 actor(s) need 4096 CPUs" in err and "a local Ray instance cannot place them" in err, err[-3000:]


def test_a_finished_shard_whose_input_changed_is_refused_even_at_the_same_size(tmp_path):
    """The skip check compares the input's SHA-256, not only its size: a label flipped in place is found."""
    from clfjudge.scoring import ray_engine
    from clfjudge.scoring.batch import Tally

    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(_pair(0, "x")) + "\n")
    shard, layout = ray_engine.Shard(str(path), "in", "jsonl"), ray_engine.Layout(tmp_path / "out")
    writer = ray_engine.ShardWriter(shard, layout)
    writer.add({"first": 1, "last": 1, "rows": "{}\n", "rejected": "", "tally": json.dumps(Tally().to_dict())})
    writer.commit(ray_engine.input_digest(str(path)))
    assert ray_engine._finished(shard, layout) is not None  # unchanged: skipped
    text = path.read_text()
    path.write_text(text.replace('"verdict": "A"', '"verdict": "B"') if '"verdict": "A"' in text
                    else text.replace("a", "b", 1))
    assert path.stat().st_size == len(text.encode())
    with pytest.raises(ValueError, match=r"was scored from .*sha256 [0-9a-f]{12}\.\.\.\), not from"):
        ray_engine._finished(shard, layout)


def test_an_input_that_changes_while_it_is_scored_is_not_written(ray_cluster, judge_dir, shards, tmp_path,
                                                                   monkeypatch):
    from clfjudge.scoring import ray_engine

    real, calls = ray_engine.input_digest, []

    def changing(path):  # the file as the run starts, then another content of the same size
        calls.append(path)
        return real(path) if len(calls) == 1 else {**real(path), "sha256": "0" * 64}

    monkeypatch.setattr(ray_engine, "input_digest", changing)
    out = tmp_path / "out"
    code, _, err = _score(str(judge_dir), "--input", str(shards / "in" / "b.jsonl"), "--output", str(out),
                          "--engine", "ray", "--actors", "1", *OPTIONS)
    assert code == 2 and "changed while it was scored" in err, err[-3000:]
    assert not (out / "b.jsonl").exists()
