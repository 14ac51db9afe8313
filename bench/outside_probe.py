"""Reliability probe: `clfjudge score` opens no file outside its judge's directory and destroys no data.

    .venv/bin/python bench/outside_probe.py

Builds a tiny random fine-tuned judge (a BERT cls3 judge, as tests/tiny_judges.py lays it out), then runs the real
command line `clfjudge score DIR --input in.jsonl --output out.jsonl` in a subprocess for each case:

- control: the judge as it is scores (exit 0), and the trace shows its own weights opened (so the trace sees opens);
- a ``model.safetensors`` symlink to another tiny model's weights, and a ``tokenizer.json`` symlink to a secret
  marker file in another temporary directory: each run under ``strace -f -y -e trace=open,openat,openat2`` must
  exit 3 (the judge error of docs/scoring.md) naming the file, and no open in any process or thread may succeed on
  the outside target, whether by its own name or through the link (``-y`` prints the file each returned descriptor
  really is; a stat or readlink of it is allowed, an open is not). To show the check can fail, ``cat`` through the
  same link, traced the same way, must be caught;
- ``--output`` = ``--input``, ``--rejected`` = ``--output`` and ``--output nd/../in.jsonl`` (``nd`` missing: the
  writer would make it): exit 2, and every file in the run's directory and the judge's directory byte-identical
  afterwards;
- the OpenVINO path (where the openvino extra is installed): the judge exported with ``--provider openvino`` scores
  with it under ``strace -e trace=socket,connect,open*`` and an empty HOME: no internet socket is made (OpenVINO's
  telemetry would resolve and reach an analytics host) and nothing under HOME is opened or made (it would read and
  write HOME/intel).

Prints one line per case and writes bench/results/outside_probe_DATE.md (and .json) with the machine and commit.
Needs strace (Linux); about two minutes on two cores (the OpenVINO export included)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine, write

from clfjudge import testing

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from tiny_judges import make_judge  # noqa: E402  (the test suite's builder of judge directories)

STRACE = shutil.which("strace") or "/usr/bin/strace"
TRACED = [STRACE, "-f", "-y", "-s", "4096", "-e", "trace=open,openat,openat2", "-o"]  # + the trace file, argv
# `pid openat(dirfd, "path", flags) = 3</real/path>`: the call's path and the file the descriptor really is
OPEN = re.compile(r'open(?:at2?)?\((?:[^,]*, )?"((?:[^"\\]|\\.)*)".*\)\s+=\s+(-?\d+)(?:<(.*)>)?')


def _score(judge: Path, work: Path, *options: str, trace: Path | None = None) -> tuple[int, str]:
    argv = [sys.executable, "-m", "clfjudge.cli", "score", str(judge), *options]
    if trace is not None:
        argv = [*TRACED, str(trace), *argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    return done.returncode, done.stderr


def _opened(trace: Path, target: Path, cwd: Path) -> list[str]:
    """The trace lines whose open succeeded on ``target``: by its own name, through a link, or as the fd's file."""
    real = os.path.realpath(target)
    hits = []
    for line in trace.read_text(errors="replace").splitlines():
        if not (m := OPEN.search(line)) or int(m[2]) < 0:
            continue
        if m[3] == real or os.path.realpath(cwd / m[1]) == real:
            hits.append(line.strip())
    return hits


def _snapshot(*roots: Path) -> dict[str, bytes | str]:
    return {str(p): (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes() if p.is_file() else "dir")
            for root in roots for p in sorted(root.rglob("*"))}


def _pairs(path: Path) -> None:
    path.write_text("".join(json.dumps({"id": f"p{i}", "question": "Capital of France?", "answer_a": "Paris.",
                                        "answer_b": "Lyon " * i}) + "\n" for i in range(3)))


def _link_case(tmp: Path, judge: Path, name: str, target: Path) -> tuple[bool, str]:
    probe = tmp / f"probe-{name}"
    shutil.copytree(judge, probe)
    (probe / name).unlink()
    (probe / name).symlink_to(target)
    work = tmp / f"run-{name}"
    work.mkdir()
    _pairs(work / "in.jsonl")
    trace = work / "trace.txt"
    code, err = _score(probe, work, "--input", "in.jsonl", "--output", "out.jsonl", trace=trace)
    hits = _opened(trace, target, work)
    calls = sum(1 for line in trace.read_text(errors="replace").splitlines() if OPEN.search(line))
    # the detector itself: `cat` through the same link must show up as an open of the target
    subprocess.run([*TRACED, str(work / "cat.txt"), "cat", str(probe / name)], capture_output=True)
    seen = bool(_opened(work / "cat.txt", target, work))
    ok = code == 3 and name in err and not hits and seen and not (work / "out.jsonl").exists()
    return ok, (f"{name} -> {target.parent.name}/{target.name}: exit {code} (want 3), file named in the error: "
                f"{name in err}, {calls} opens traced, {len(hits)} of the target"
                f"{': ' + hits[0][:160] if hits else ''} (`cat` through the link is caught: {seen})")


def _same_path_case(tmp: Path, judge: Path, name: str, options: list[str]) -> tuple[bool, str]:
    work = tmp / f"run-{name}"
    work.mkdir()
    _pairs(work / "in.jsonl")
    (work / "out.jsonl").write_text('{"id": "old", "an earlier run": true}\n')
    before = _snapshot(work, judge)
    code, _ = _score(judge, work, *options)
    same = _snapshot(work, judge) == before
    return code == 2 and same, f"{' '.join(options)}: exit {code} (want 2), every file byte-identical: {same}"


NETWORK = [STRACE, "-f", "-y", "-s", "256", "-e", "trace=socket,connect,open,openat,openat2", "-o"]
INTERNET = re.compile(r"socket\(AF_INET6?\b|connect\(.*AF_INET6?\b")


def _openvino_case(tmp: Path, judge: Path) -> tuple[bool, str]:
    import importlib.util

    if importlib.util.find_spec("openvino") is None:
        return True, "not run: the openvino extra is not installed"
    from clfjudge.export.onnx import export_judge

    exported = export_judge(judge, tmp / "judge-openvino", n_records=8, providers=["openvino"]).out_dir
    work, home = tmp / "run-openvino", tmp / "home"
    work.mkdir()
    home.mkdir()
    _pairs(work / "in.jsonl")
    trace = work / "trace.txt"
    # not as a CI job: OpenVINO's telemetry stays off there by itself
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HOME=str(home))
    argv = [*NETWORK, str(trace), sys.executable, "-m", "clfjudge.cli", "score", str(exported), "--input", "in.jsonl",
            "--output", "out.jsonl", "--provider", "openvino"]
    code = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True).returncode
    lines = trace.read_text(errors="replace").splitlines()
    internet = [line.strip() for line in lines if INTERNET.search(line)]
    in_home = [line.strip() for line in lines if (m := OPEN.search(line)) and int(m[2]) >= 0
               and (m[3] or os.path.realpath(work / m[1])).startswith(str(home))]
    made = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    ok = code == 0 and not internet and not in_home and not made
    return ok, (f"exit {code} (want 0), {len(lines)} calls traced, internet sockets {len(internet)}"
                f"{': ' + internet[0][:160] if internet else ''}, opens under HOME {len(in_home)}, made under HOME "
                f"{made or 'nothing'}")


def main() -> int:
    run = {"machine": machine(threads=1), "strace": STRACE, "cases": {}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        judge = make_judge(testing.tiny_bert(tmp / "backbone"), tmp / "judge", "cls3")
        other = testing.tiny_llama(tmp / "elsewhere" / "other-model") / "model.safetensors"
        secret = tmp / "elsewhere" / "secret.txt"
        secret.write_text("SECRET MARKER: a judge must never open this file\n")
        work = tmp / "run-control"
        work.mkdir()
        _pairs(work / "in.jsonl")
        code, _ = _score(judge, work, "--input", "in.jsonl", "--output", "out.jsonl", trace=work / "trace.txt")
        own = _opened(work / "trace.txt", judge / "model.safetensors", work)
        cases = {"control (untouched judge)": (code == 0 and bool(own),
                                               f"exit {code} (want 0), its model.safetensors opened {len(own)}x"),
                 "(a) weights linked outside": _link_case(tmp, judge, "model.safetensors", other),
                 "(b) tokenizer linked to a secret": _link_case(tmp, judge, "tokenizer.json", secret),
                 "(c) --output = --input": _same_path_case(tmp, judge, "output-is-input",
                                                            ["--input", "in.jsonl", "--output", "in.jsonl"]),
                 "(c) --rejected = --output": _same_path_case(
                     tmp, judge, "rejected-is-output",
                     ["--input", "in.jsonl", "--output", "out.jsonl", "--rejected", "out.jsonl"]),
                 "(c) --output through a missing folder": _same_path_case(
                     tmp, judge, "output-through-nd", ["--input", "in.jsonl", "--output", "nd/../in.jsonl"]),
                 "(d) OpenVINO: no socket, nothing in HOME": _openvino_case(tmp, judge)}
    lines = []
    for name, (ok, what) in cases.items():
        lines.append(f"{'PASS' if ok else 'FAIL'} {name}: {what}")
        run["cases"][name] = {"pass": ok, "checked": what}
        print(lines[-1], flush=True)
    m = run["machine"]
    md = (f"# outside_probe {m['date']}\n\ncommit {m['commit']}, {m['cpu']} ({m['cores']} cores), Python "
          f"{m['python']}, strace {STRACE}\n\n" + "".join(f"- {line}\n" for line in lines))
    print(write("outside_probe", run, md))
    return 0 if all(ok for ok, _ in cases.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
