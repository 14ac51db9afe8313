"""`clfjudge audit --engine ray` on a local Ray instance (two CPUs): the judge directories predict on Ray actors and
the audit's metrics.json and report.md are the local audit's, byte for byte; errors on the actors are said in one
line; the local audit does not import Ray. Skipped only where the ray extra is not installed."""
from __future__ import annotations

import contextlib
import io
import json
import operator
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_judges import make_judge

from clfjudge.cli import main
from clfjudge.paths import data_root

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'clfjudge[ray]')")

REPO = Path(__file__).parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "data"
REAL_DATA = (data_root() / "pandalm" / "data" / "testset-v1.json").exists()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """This process predicts with one thread, as each actor does (one CPU each): a sum split over two threads
    rounds differently in the last bits, and the two audits are compared byte for byte. (In a full test run
    test_backbones already sets one thread at import; run alone, this module would otherwise use every core.)"""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def judges(tiny_bert_dir, tmp_path_factory) -> list[str]:
    """A pair judge (3-way classifier) and a point judge (regression), random init: each is applied to the sets
    of the other arity too, through the study's transforms."""
    root = tmp_path_factory.mktemp("ray-audit-judges")
    return [str(make_judge(tiny_bert_dir, root / "cls3", "cls3")),
            str(make_judge(tiny_bert_dir, root / "regression", "regression"))]


def _audit(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["audit", *args])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("data", [
    pytest.param((FIXTURES, "3"), id="fixtures"),
    pytest.param((None, "12"), id="shared-data", marks=pytest.mark.skipif(
        not REAL_DATA, reason="needs ../shared/data (present in CI)")),
])
def test_the_audit_on_ray_writes_the_local_audit(ray_cluster, judges, data, tmp_path, monkeypatch):
    """Every available test set, a --limit'ed seeded slice of each (the fixtures: every set of the audit; the
    shared data: real records, enough for bootstrap CIs): the same metrics.json and report.md both ways."""
    root, limit = data
    if root is not None:
        monkeypatch.setenv("CLFJUDGE_DATA", str(root))
    common = [*judges, "--limit", limit, "--bootstrap", "20"]
    code, _, err = _audit(*common, "--out", str(tmp_path / "local"))
    assert code == 0, err[-3000:]
    assert "actor(s) on Ray" not in err
    code, _, err = _audit(*common, "--out", str(tmp_path / "ray"), "--engine", "ray", "--actors", "2")
    assert code == 0, err[-3000:]
    metrics = json.loads((tmp_path / "ray" / "metrics.json").read_text())
    n_sets = len(metrics["sets"])
    assert n_sets >= 11
    for name in metrics["judges"]:  # each judge directory's sets went to the actors, not the baselines
        if not name.startswith("baseline:"):
            assert f"audit: {name}: {n_sets} call(s) on 2 actor(s) on Ray" in err
    # the baselines are predicted here (the progress meter names them), never on the actors
    assert not any("baseline" in line and "Ray" in line for line in err.splitlines())
    for file in ("metrics.json", "report.md"):
        assert (tmp_path / "ray" / file).read_bytes() == (tmp_path / "local" / file).read_bytes(), file
    rows = metrics["suites"]["cross-scheme"]["rows"]
    assert all("accuracy" in rows[name]["pandalm-test"] for name in metrics["judges"])  # not n/a
    # the predictions are cached as the local audit caches them: a re-run starts no actor, says the same
    before = (tmp_path / "ray" / "metrics.json").read_bytes()
    code, _, err = _audit(*common, "--out", str(tmp_path / "ray"), "--engine", "ray", "--actors", "2")
    assert code == 0 and "actor(s) on Ray" not in err
    assert (tmp_path / "ray" / "metrics.json").read_bytes() == before


def test_a_judge_that_cannot_load_on_the_actors_is_a_one_line_error(ray_cluster, judges, tmp_path, monkeypatch):
    """A judge directory whose weights are gone: its card names it in the report, but the actors cannot load it;
    exit status 2 and the loader's own words, no report written."""
    monkeypatch.setenv("CLFJUDGE_DATA", str(FIXTURES))
    broken = tmp_path / "broken"
    shutil.copytree(judges[0], broken)
    for weights in broken.glob("*.safetensors"):
        weights.unlink()
    code, _, err = _audit(str(broken), "--sets", "pandalm-test", "--out", str(tmp_path / "out"), "--engine", "ray",
                          "--actors", "1", "--bootstrap", "0")
    assert code == 2
    line = next(x for x in err.splitlines() if x.startswith("clfjudge: error:"))
    assert line.startswith("clfjudge: error: the judge actors could not start: ") and str(broken) in line, err
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_an_error_in_a_call_is_raised_as_itself(ray_cluster):
    """``map_on_actors``: results by call index; a call that raises stops the run with its own exception type (a
    KeyError / ValueError stays one for ``clfjudge``'s one-line errors), the actor's traceback as a note; an
    actor that cannot build its state is named as such."""
    from clfjudge.scoring import ray_engine

    options = ray_engine.RayOptions(actors=2)
    calls = [("a",), ("b",), ("a",)]
    got = dict(ray_engine.map_on_actors(dict, {"a": 1, "b": 2}, operator.getitem, calls, options, "test"))
    assert got == {0: 1, 1: 2, 2: 1}
    with pytest.raises(KeyError, match="'c'") as raised:
        list(ray_engine.map_on_actors(dict, {"a": 1}, operator.getitem, [("a",), ("c",)], options, "test"))
    assert any("raised on a Ray actor" in note for note in raised.value.__notes__)
    with pytest.raises(ValueError, match="the judge actors could not start: .*JSONDecodeError"):
        list(ray_engine.map_on_actors(json.loads, {"s": "{bad"}, operator.getitem, [("a",)], options, "test"))


def test_engine_options_are_checked_before_anything_runs(tmp_path, monkeypatch):
    """Ray's options without --engine ray, a pool of no actor: refused; --engine ray with no judge directory says
    that every prediction is made in this process (the baselines) and sends nothing to Ray."""
    monkeypatch.setenv("CLFJUDGE_DATA", str(FIXTURES))
    code, _, err = _audit("baseline:longer", "--out", str(tmp_path / "a"), "--actors", "2")
    assert code == 2 and "--actors applies to --engine ray" in err
    code, _, err = _audit("baseline:longer", "--out", str(tmp_path / "a"), "--engine", "ray", "--actors", "0")
    assert code == 2 and "--actors must be positive" in err
    code, _, err = _audit("baseline:longer", "--sets", "pandalm-test", "--out", str(tmp_path / "b"), "--engine",
                          "ray", "--bootstrap", "0")
    assert code == 0 and "none of the judges is a judge directory" in err and "actor(s) on Ray" not in err
    assert (tmp_path / "b" / "metrics.json").is_file()


def test_the_local_audit_does_not_import_ray(judges, tmp_path):
    script = ("import sys\nfrom clfjudge.cli import main\n"
              f"code = main(['audit', {judges[0]!r}, '--sets', 'pandalm-test', '--bootstrap', '0', "
              f"'--out', {str(tmp_path / 'out')!r}])\n"
              "assert code == 0, code\nprint(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CLFJUDGE_DATA": str(FIXTURES)}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().splitlines()[-1] == "[]"


def test_more_actors_than_the_cluster_has_are_refused_here_and_waited_for_on_a_cluster(capsys):
    """Ray waits without a timeout for resources to place an actor: a local instance started by clfjudge cannot
    grow, so asking it for more is an error; a cluster may autoscale, so there it is a warning."""
    from clfjudge.scoring import ray_engine

    cpu = ray_engine.RayOptions(actors=3)
    with pytest.raises(ValueError, match=r"3 actor\(s\) need 3 CPUs \(the cluster has 2\): a local Ray instance"):
        ray_engine.check_placeable(3, cpu, {"CPU": 2.0}, can_grow=False)
    ray_engine.check_placeable(3, cpu, {"CPU": 2.0}, can_grow=True)
    assert "warning: 3 actor(s) need 3 CPUs (the cluster has 2); Ray waits" in capsys.readouterr().err
    ray_engine.check_placeable(2, cpu, {"CPU": 2.0}, can_grow=False)  # fits: nothing said
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match=r"1 GPUs \(the cluster has 0\)"):  # no GPU at all: it would wait forever
        ray_engine.check_placeable(2, ray_engine.RayOptions(gpus_per_actor=0.5), {"CPU": 2.0}, can_grow=False)



CLIENT_CLUSTER = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                        "ray_client_server_port": int(sys.argv[1])})
print("up", flush=True)
sys.stdin.read()  # until the test closes it
cluster.shutdown()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RAY_CLIENT_FAILURE = ("Initialization failure from server:\nTraceback (most recent call last):\n  ...\n"
                      "psutil.ZombieProcess: PID still exists but it's a zombie (pid=4242)")


@pytest.mark.parametrize("failures", [0, 1, 3, 4])
def test_ray_client_connects_with_bounded_retries(monkeypatch, failures):
    """A loaded head may fail to start a client's server at first: ray:// is tried CLIENT_TRIES times, then one
    line; any other address once. No cluster and no clock: ray.init and the waits are stand-ins."""
    from clfjudge.scoring import ray_engine

    calls, waits = [], []

    def init(address=None, **_):
        calls.append(address)
        if len(calls) <= failures:
            raise Exception(RAY_CLIENT_FAILURE)  # Ray's client raises bare Exceptions

    monkeypatch.setattr(ray_engine.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_engine.ray, "init", init)
    monkeypatch.setattr(ray_engine.ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray_engine.time, "sleep", waits.append)
    address = "ray://head:10001"
    if failures < ray_engine.CLIENT_TRIES:
        assert ray_engine._connect(address) is True
        assert len(calls) == failures + 1 and waits == [2 * n for n in range(1, failures + 1)]
    else:
        with pytest.raises(ConnectionError) as caught:
            ray_engine._connect(address)
        assert str(caught.value) == (f"cannot connect to Ray at {address} after {ray_engine.CLIENT_TRIES} tries: "
                                     "Initialization failure from server:")
        assert len(calls) == ray_engine.CLIENT_TRIES
    calls.clear()
    if failures:
        with pytest.raises(ConnectionError, match="cannot connect to Ray at head:6379 after 1 try: "):
            ray_engine._connect("head:6379")  # a cluster's own address: Ray's own waits, no retry here
        assert len(calls) == 1


def test_the_audit_runs_through_ray_client(judges, tmp_path):
    """From a machine outside the cluster (a Ray Client driver, ``--address ray://HOST:PORT``): the judge
    directories predict on the cluster's actors and the audit is the local audit, byte for byte. The cluster runs
    in a process of its own with a Ray Client server, as ``ray start --head`` would."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CLFJUDGE_DATA": str(FIXTURES),
           "RAY_worker_niceness": "0"}
    env.pop("RAY_ADDRESS", None)
    cluster = subprocess.Popen([sys.executable, "-c", CLIENT_CLUSTER, str(port)], cwd=REPO, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert cluster.stdout.readline().strip() == "up"
        common = [*judges, "--sets", "pandalm-test", "autoj-test", "--limit", "3", "--bootstrap", "20"]
        script = f"import sys\nfrom clfjudge.cli import main\nsys.exit(main({['audit', *common]!r} + sys.argv[1:]))"
        runs = {}
        for name, extra in (("local", []), ("client", ["--engine", "ray", "--address", f"ray://127.0.0.1:{port}",
                                                       "--actors", "2"])):
            runs[name] = subprocess.run([sys.executable, "-c", script, "--out", str(tmp_path / name), *extra],
                                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            if name == "client" and "cannot connect to Ray at ray://" in runs[name].stderr:
                # Ray's client server failed to start this client's server process on every try (a race inside
                # Ray's proxier, seen on a loaded machine): what clfjudge owes is the one line, tested here, and the
                # bounded retries, tested without a cluster (test_ray_client_connects_with_bounded_retries)
                assert runs[name].returncode == 4 and runs[name].stderr.count("\n") == 1, runs[name].stderr
                pytest.skip(f"Ray could not serve a client on this machine: {runs[name].stderr.strip()}")
            assert runs[name].returncode == 0, runs[name].stderr[-3000:]
    finally:
        cluster.communicate(timeout=120)  # closes stdin: the cluster shuts down
    assert "2 call(s) on 2 actor(s) on Ray" in runs["client"].stderr
    for file in ("metrics.json", "report.md"):
        assert (tmp_path / "client" / file).read_bytes() == (tmp_path / "local" / file).read_bytes(), file
