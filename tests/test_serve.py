"""The HTTP server on tiny real judges: endpoints, validation, dynamic batching, back-pressure, shutdown."""
from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from starlette.testclient import TestClient
from tiny_judges import make_judge

from clfjudge.batching import DEFAULT_MAX_BATCH_TOKENS, Budget
from clfjudge.judges.base import WARM_UP_CHARS, WARM_UP_TEXT, Judge, as_pair
from clfjudge.serving.server import Limits, create_app


def rows(n: int) -> Budget:
    """A server budget of ``n`` items per call and the default token budget."""
    return Budget(n, DEFAULT_MAX_BATCH_TOKENS)


PAIR = {"question": "Name a prime.", "answer_a": "7", "answer_b": "9 is a prime number."}


@pytest.fixture(scope="module")
def pair_judge(tiny_bert_dir, tmp_path_factory):
    return Judge.load(make_judge(tiny_bert_dir, tmp_path_factory.mktemp("cls3"), "cls3"))


@pytest.fixture(scope="module")
def point_judge(tiny_bert_dir, tmp_path_factory):
    return Judge.load(make_judge(tiny_bert_dir, tmp_path_factory.mktemp("reg"), "regression"))


class SlowJudge:
    """A real judge whose batch calls take at least ``delay`` seconds, to make queues build up."""

    def __init__(self, judge, delay: float) -> None:
        self.judge, self.delay = judge, delay
        self.card, self.tasks = judge.card, judge.tasks
        self.lock = threading.Lock()

    def compare_batch(self, items, symmetric=False):
        time.sleep(self.delay)
        return self.judge.compare_batch(items, symmetric=symmetric)

    def sequence_lengths(self, records):
        return self.judge.sequence_lengths(records)

    def scratch(self):
        return self.judge.scratch()


def test_compare_matches_the_judge(pair_judge):
    with TestClient(create_app(pair_judge)) as client:
        got = client.post("/compare", json=PAIR)
        assert got.status_code == 200
        want = pair_judge.compare(PAIR["question"], PAIR["answer_a"], PAIR["answer_b"])
        assert got.json()["verdict"] == want.verdict.value
        assert got.json()["p_a"] == pytest.approx(want.p_a, abs=1e-6)
        batch = client.post("/compare", json={"items": [PAIR, PAIR], "symmetric": True}).json()["results"]
        assert len(batch) == 2 and batch[0]["p_a"] == pytest.approx(batch[1]["p_a"], abs=1e-6)
        assert client.get("/healthz").json()["tasks"] == ["compare"]
        assert client.post("/score", json={"question": "q", "answer": "a"}).status_code == 404


def test_compare_with_a_generative_judge(tiny_llama_dir, tmp_path):
    from tiny_judges import ScriptedLM, make_generative_judge, prefers_seven

    judge = Judge.load(make_generative_judge(tiny_llama_dir, tmp_path / "gen"))
    judge.generator.model = ScriptedLM(judge.generator.tokenizer, prefers_seven)
    seven_nine = {"question": "Name a prime.", "answer_a": "seven", "answer_b": "nine"}
    with TestClient(create_app(judge, warm_up=False)) as client:  # the scripted LM reads only primes
        got = client.post("/compare", json=seven_nine)
        assert got.status_code == 200
        assert got.json() == {"p_a": 1.0, "p_tie": 0.0, "p_b": 0.0, "verdict": "A", "parsed": True, "generated": ["1"]}
        batch = client.post("/compare", json={"items": [seven_nine, {**seven_nine, "question": "GIBBERISH?"}],
                                              "symmetric": True}).json()["results"]
        assert batch[0]["verdict"] == "A" and batch[0]["generated"] == ["1", "2"]
        assert batch[1]["parsed"] is False and batch[1]["verdict"] is None and batch[1]["p_a"] is None
        assert client.get("/healthz").json()["backend"] == "generate"
        assert client.post("/score", json={"question": "q", "answer": "a"}).status_code == 404


def test_score_endpoint(point_judge):
    with TestClient(create_app(point_judge)) as client:
        got = client.post("/score", json={"question": "Name a prime.", "answer": "7"})
        assert got.status_code == 200
        assert got.json()["score"] == pytest.approx(point_judge.score("Name a prime.", "7").value, abs=1e-6)


@pytest.mark.parametrize("body, status, words", [
    ({"question": "q", "answer_a": "a"}, 422, "'answer_b' is required"),
    ({"question": "q", "answer_a": "a", "answer_b": 3}, 422, "'answer_b' must be a string"),
    ({"question": "q", "answer_a": "a", "answer_b": "b", "colour": "red"}, 422, "unknown field"),
    ({"items": []}, 422, "non-empty list"),
    ({"items": [PAIR, {"question": "q"}]}, 422, "items[1]: field 'answer_a'"),
    ({"question": "q", "answer_a": "x" * 200, "answer_b": "b"}, 413, "'answer_a' has 200 characters"),
    ({"items": [PAIR] * 5}, 413, "5 items, limit 4"),
])
def test_bad_requests_name_the_field(pair_judge, body, status, words):
    with TestClient(create_app(pair_judge, Limits(max_text_chars=100, max_items=4))) as client:
        got = client.post("/compare", json=body)
        assert got.status_code == status
        assert words in got.json()["error"]


def test_bad_json_and_big_body(pair_judge):
    with TestClient(create_app(pair_judge, Limits(max_body_bytes=64))) as client:
        assert client.post("/compare", content=b"{not json").status_code == 400
        big = client.post("/compare", json={**PAIR, "question": "q" * 100})
        assert big.status_code == 413 and "limit 64" in big.json()["error"]


def test_concurrent_requests_are_batched(pair_judge):
    app = create_app(SlowJudge(pair_judge, 0.2), Limits(budget=rows(16), max_wait_ms=50))
    with TestClient(app) as client, ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: client.post("/compare", json=PAIR).status_code, range(16)))
        metrics = client.get("/metrics").text
    assert codes == [200] * 16
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if not line.startswith("#"))
    batches, single = int(values["clfjudge_batch_size_count"]), int(values['clfjudge_batch_size_bucket{le="1"}'])
    assert float(values["clfjudge_batch_size_sum"]) == 16 and batches < 16 and single < batches  # merged
    assert values["clfjudge_queue_depth"] == "0" and values["clfjudge_request_seconds_count"] == "16"
    assert 'clfjudge_requests_total{endpoint="compare",status="200"} 16' in metrics


def test_token_budget_batching_gives_the_same_answers_and_its_metrics(pair_judge):
    """Requests of different lengths, merged under a token budget, get what they get without one; /metrics
    shows the padded tokens per call, the padding fraction and the time spent queued."""
    bodies = [{**PAIR, "answer_b": "nine " * (1 + 7 * (i % 4))} for i in range(12)]
    longest = max(n for seqs in pair_judge.sequence_lengths([as_pair(b) for b in bodies]) for n in seqs)
    answers = {}
    for budget in (None, 2 * longest):  # a call of the longest fits two
        app = create_app(SlowJudge(pair_judge, 0.05), Limits(budget=Budget(8, budget),
                                                             max_wait_ms=20))
        with TestClient(app) as client, ThreadPoolExecutor(6) as pool:
            answers[budget] = list(pool.map(lambda b: client.post("/compare", json=b).json(), bodies))
            metrics = client.get("/metrics").text
    for want, got in zip(answers[None], answers[2 * longest]):
        assert got["verdict"] == want["verdict"] and got["p_a"] == pytest.approx(want["p_a"], abs=1e-5)
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if not line.startswith("#"))
    calls = int(values["clfjudge_batch_tokens_count"])
    assert calls == int(values["clfjudge_batch_size_count"]) and float(values["clfjudge_batch_size_sum"]) == 12
    real, padded = (float(values[f'clfjudge_tokens_total{{kind="{k}"}}']) for k in ("real", "padded"))
    assert 0 < real <= padded == float(values["clfjudge_batch_tokens_sum"])
    assert int(values["clfjudge_batch_padding_fraction_count"]) == calls
    assert int(values["clfjudge_queue_seconds_count"]) == 12
    for name in ("clfjudge_batch_tokens", "clfjudge_batch_padding_fraction", "clfjudge_queue_seconds"):
        assert f"# TYPE {name} histogram" in metrics


def test_full_queue_gives_503_and_nothing_is_lost(pair_judge):
    app = create_app(SlowJudge(pair_judge, 0.3), Limits(budget=rows(1), max_wait_ms=0, max_queue=2))
    with TestClient(app) as client, ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(lambda _: client.post("/compare", json=PAIR).status_code, range(12)))
    assert set(codes) <= {200, 503} and 503 in codes and 200 in codes
    assert sum(app.state.stats.requests.values()) == 12  # every request answered and counted


def test_timeout_gives_504(pair_judge):
    app = create_app(SlowJudge(pair_judge, 0.5), Limits(timeout_s=0.1))
    with TestClient(app) as client:
        got = client.post("/compare", json=PAIR)
    assert got.status_code == 504 and "within 0.1 s" in got.json()["error"]


def test_shutdown_drains_the_queue(pair_judge):
    app = create_app(SlowJudge(pair_judge, 0.2), Limits(budget=rows(1), max_wait_ms=0))
    with TestClient(app) as client, ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(client.post, "/compare", json=PAIR) for _ in range(3)]
        time.sleep(0.05)
    # leaving the block ran the shutdown: in-flight and queued requests were still answered
    assert [f.result().status_code for f in futures] == [200, 200, 200]


# -- whose fault: 4xx naming the item and field for client mistakes, JSON errors everywhere ---------------

def raw_json(body) -> bytes:
    """A JSON body as a client may send it, lone surrogates included (as \\ud800 escapes)."""
    return json.dumps(body).encode()


@pytest.mark.parametrize("content, status, words", [
    (raw_json({**PAIR, "question": ""}), 422, "body: field 'question': is empty"),
    (raw_json({"items": [PAIR, {**PAIR, "question": " \n\t"}]}), 422, "items[1]: field 'question': is empty"),
    (raw_json({"items": [PAIR, {**PAIR, "answer_b": "ok \ud800 no"}]}), 422,
     "items[1]: field 'answer_b': is not valid Unicode text"),
    (raw_json({**PAIR, "rubric": "\udfff"}), 422, "body: field 'rubric': is not valid Unicode"),
    ('{"question": "caf\xe9"}'.encode("latin-1"), 400, "not valid UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "nests 100000 levels deep, limit 8"),
    (raw_json({**PAIR, "id": [[[[[[[[["deep"]]]]]]]]]}), 400, "nests 10 levels deep"),
    (raw_json({"items": [PAIR, "text"]}), 422, "items[1] must be an object"),
    (raw_json({"items": [PAIR], "question": "q"}), 422, "unknown field(s) ['question'] beside 'items'"),
    (b'{"question": ' + b"9" * 5000 + b"}", 400, "body is not valid JSON"),
    (b"", 400, "body is not valid JSON"),
])
def test_client_mistakes_are_4xx_naming_item_and_field(pair_judge, content, status, words):
    with TestClient(create_app(pair_judge)) as client:
        got = client.post("/compare", content=content, headers={"content-type": "application/json"})
        assert (got.status_code, got.headers["content-type"]) == (status, "application/json")
        assert words in got.json()["error"]
        assert client.post("/compare", json=PAIR).status_code == 200  # and the server is fine


@pytest.mark.timeout(60)
def test_the_depth_check_is_linear_on_unclosed_strings(pair_judge):
    """A body of 400k escaped quotes inside an unclosed string: a string pattern that can fail and retry at each
    quote takes hours on it (quadratic); this one answers at once."""
    with TestClient(create_app(pair_judge)) as client:
        got = client.post("/compare", content=b'{"question": "' + b'\\"' * 400_000)
    assert got.status_code == 400 and "not valid JSON" in got.json()["error"]


def test_brackets_inside_strings_do_not_count_as_nesting(pair_judge):
    with TestClient(create_app(pair_judge)) as client:
        got = client.post("/compare", json={**PAIR, "answer_a": "[[[[[[[[[[[[{{{{{{{{" + '\\"]]' * 5})
        assert got.status_code == 200
        assert client.post("/compare", json={**PAIR, "symmetric": True}).status_code == 200


def test_every_error_is_json_and_unexpected_ones_are_500(pair_judge, monkeypatch):
    app = create_app(pair_judge)
    with TestClient(app, raise_server_exceptions=False) as client:
        missing = client.get("/nothing")
        assert missing.status_code == 404 and missing.json() == {"error": "Not Found"}
        wrong = client.get("/compare")
        assert wrong.status_code == 405 and "error" in wrong.json() and wrong.headers["allow"] == "POST"
        monkeypatch.setattr("clfjudge.serving.server.parse_body", lambda raw, limits: 1 / 0)
        broken = client.post("/compare", json=PAIR)
    assert broken.status_code == 500 and broken.json() == {"error": "internal server error (ZeroDivisionError)"}
    assert app.state.stats.requests[("compare", 500)] == 1


class PickyJudge(SlowJudge):
    """Fails (a server fault, not an input error) on any batch holding the question "BOOM"."""

    def compare_batch(self, items, symmetric=False):
        if any(item["question"] == "BOOM" for item in items):
            raise RuntimeError("the model fell over")
        return super().compare_batch(items, symmetric)


def test_a_failing_judge_call_fails_only_the_request_that_broke_it(pair_judge, caplog):
    """The judge's fault, answered 503 (retryable: another replica may judge it) with one log line, no traceback."""
    app = create_app(PickyJudge(pair_judge, 0.05), Limits(budget=rows(16), max_wait_ms=100, retry_after_s=3))
    bodies = [PAIR, {**PAIR, "question": "BOOM"}, PAIR, PAIR]
    with caplog.at_level("INFO"), TestClient(app) as client, ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda body: client.post("/compare", json=body), bodies))
    assert [r.status_code for r in got] == [200, 503, 200, 200]
    assert got[1].json() == {"error": "judge error: RuntimeError: the model fell over"}
    assert got[1].headers["retry-after"] == "3"
    assert app.state.stats.batch_size.count < 4  # the four were merged, then judged apart
    logged = [r for r in caplog.records if r.levelname in ("WARNING", "ERROR", "CRITICAL")]
    assert [(r.name, r.getMessage(), r.exc_info) for r in logged] == [
        ("clfjudge.serve", "a judge call failed, answered 503: RuntimeError: the model fell over", None)]


def test_a_judge_failing_on_every_call_logs_one_line_per_cause(pair_judge):
    """As `clfjudge serve` logs (serving.listen): a judge failing on every request writes one line, then counts."""
    import io
    import logging

    from clfjudge.serving.listen import OncePer, _OnceFilter
    from clfjudge.serving.server import LOG

    stream = io.StringIO()
    once = _OnceFilter(OncePer(stream=stream), lambda: True)
    LOG.addFilter(once)
    try:
        with TestClient(create_app(PickyJudge(pair_judge, 0.0), warm_up=False)) as client:
            codes = [client.post("/compare", json={**PAIR, "question": "BOOM"}).status_code for _ in range(5)]
    finally:
        LOG.removeFilter(once)
    assert codes == [503] * 5 and logging.getLogger("clfjudge.serve").filters == []
    assert stream.getvalue() == ("clfjudge serve: a judge call failed, answered 503: RuntimeError: the model fell "
                                 "over\n")


def test_503_says_when_to_retry(pair_judge):
    app = create_app(SlowJudge(pair_judge, 0.3), Limits(budget=rows(1), max_wait_ms=0, max_queue=1,
                                                        retry_after_s=2))
    with TestClient(app) as client, ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda _: client.post("/compare", json=PAIR), range(6)))
    full = [r for r in got if r.status_code == 503]
    assert full and all(r.headers["retry-after"] == "2" and "queue full" in r.json()["error"] for r in full)


# -- API key ------------------------------------------------------------------------------------------------

def test_api_key_guards_judging_and_metrics_not_health(pair_judge):
    with TestClient(create_app(pair_judge, api_key="s3cret")) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"},
                        {"Authorization": "Bearer"}):
            got = client.post("/compare", json=PAIR, headers=headers)
            assert got.status_code == 401 and got.headers["www-authenticate"].startswith("Bearer")
            assert "Authorization: Bearer" in got.json()["error"]
            assert client.get("/metrics", headers=headers).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert client.post("/compare", json=PAIR, headers=good).status_code == 200
        assert client.post("/compare", content=b"{bad", headers=good).status_code == 400  # key checked first
        assert client.post("/compare", content=b"{bad").status_code == 401
        assert client.get("/metrics", headers=good).status_code == 200
        assert client.get("/healthz").json()["status"] == "ok"


def test_serve_cli_key_from_env_and_open_host_warning(pair_judge, monkeypatch, capsys):
    from clfjudge.cli import main
    from clfjudge.serving import listen

    started = {}
    monkeypatch.setattr(Judge, "load", staticmethod(lambda *a, **kw: pair_judge))
    monkeypatch.setattr(listen, "serve", lambda app, sock, limits, **kw: started.update(app=app) or True)
    monkeypatch.delenv("CLFJUDGE_API_KEY", raising=False)
    assert main(["serve", "judge-dir", "--host", "0.0.0.0", "--port", "0"]) == 0
    assert "listening on 0.0.0.0 without an API key" in capsys.readouterr().err
    for loopback in ("127.0.0.1", "localhost"):  # a host name is judged by the address it was bound to
        assert main(["serve", "judge-dir", "--host", loopback, "--port", "0"]) == 0
        assert "warning" not in capsys.readouterr().err
    monkeypatch.setenv("CLFJUDGE_API_KEY", "from-env")
    assert main(["serve", "judge-dir", "--host", "0.0.0.0", "--port", "0"]) == 0
    assert "warning" not in capsys.readouterr().err
    with TestClient(started["app"]) as client:
        assert client.post("/compare", json=PAIR).status_code == 401
        assert client.post("/compare", json=PAIR, headers={"Authorization": "Bearer from-env"}).status_code == 200
    assert main(["serve", "judge-dir", "--api-key", " "]) == 2


@pytest.mark.parametrize("option, words", [
    ("--max-queue=0", "--max-queue must be positive, got 0"),
    ("--max-items=0", "--max-items must be positive, got 0"),
    ("--timeout-s=0", "--timeout-s must be positive, got 0.0"),
    ("--read-timeout-s=-1", "--read-timeout-s must be positive, got -1.0"),
    ("--max-body-bytes=-1", "--max-body-bytes must be positive, got -1"),
    ("--max-json-depth=0", "--max-json-depth must be positive, got 0"),
    ("--header-timeout-s=nan", "--header-timeout-s must be positive, got nan"),
    ("--max-wait-ms=-5", "--max-wait-ms cannot be negative"),
    ("--port=70000", "argument --port: 70000 is out of range"),
    ("--threads=0", "argument --threads: 0 is out of range"),
])
def test_serve_refuses_a_limit_that_would_refuse_everything_in_one_line(option, words, monkeypatch, capsys):
    """Before the judge loads: one line, exit 2 (argparse's own errors too), where such a server used to start
    healthy and refuse every request."""
    from clfjudge.cli import main

    monkeypatch.setattr(Judge, "load", staticmethod(lambda *a, **kw: pytest.fail("the judge was loaded")))
    try:
        status = main(["serve", "judge-dir", option])
    except SystemExit as exc:  # argparse's usage errors
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2 and words in err and err.count("\n") == 1, err


def test_serve_that_cannot_listen_exits_5_before_loading_the_judge(monkeypatch, capsys):
    import socket

    from clfjudge.cli import EXIT_LISTEN, main

    monkeypatch.setattr(Judge, "load", staticmethod(lambda *a, **kw: pytest.fail("the judge was loaded")))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "judge-dir", "--port", str(port)]) == EXIT_LISTEN == 5
        err = capsys.readouterr().err
        assert err == f"clfjudge: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert main(["serve", "judge-dir", "--host", "host.invalid"]) == 5
    err = capsys.readouterr().err
    assert err.startswith("clfjudge: error: cannot listen on host.invalid:8000: ") and err.count("\n") == 1


def test_serve_says_where_it_listens_and_a_failed_warm_up_is_the_judges_error(pair_judge, monkeypatch, capsys):
    """`clfjudge serve` prints one line with its address once the judge is ready; a judge whose warm-up fails ends
    it with exit 3 and one line, never listening."""
    from clfjudge.cli import main
    from clfjudge.serving import listen

    monkeypatch.setattr(Judge, "load", staticmethod(lambda *a, **kw: pair_judge))
    guarded = listen.server

    def stopped_once_listening(*args, **kwargs):
        server = guarded(*args, **kwargs)

        def stop():
            deadline = time.monotonic() + 30
            while not server.started and time.monotonic() < deadline:
                time.sleep(0.01)
            server.should_exit = True

        threading.Thread(target=stop, daemon=True).start()
        return server

    monkeypatch.setattr(listen, "server", stopped_once_listening)
    assert main(["serve", "judge-dir", "--port", "0"]) == 0
    err = capsys.readouterr().err
    assert re.fullmatch(r"clfjudge serve: listening on http://127\.0\.0\.1:\d+ \(at most \d+ connections\)\n",
                        err), err
    monkeypatch.setattr(type(pair_judge), "warm_up", lambda self, n=None: 1 / 0)
    assert main(["serve", "judge-dir", "--port", "0"]) == 3
    err = capsys.readouterr().err
    assert err == "clfjudge: error: judge judge-dir cannot be used: ZeroDivisionError: division by zero\n", err


# -- a bounded overload of a real server on loopback -------------------------------------------------------

def _serve_in_thread(app):
    """A real uvicorn server on a free loopback port, in a thread; returns (server, thread, base url)."""
    import io
    import socket

    from clfjudge.serving.listen import server as guarded

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = guarded(app, app.state.service.limits, graceful_s=4, log=io.StringIO())
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the server did not start"
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def _offer_load(url: str, rate: float, seconds: float) -> tuple[list, list]:
    """Open-loop load: one /compare request every 1/rate s for ``seconds`` (whatever the answers take), and
    /healthz polled throughout. Returns (status or exception per request, (status, body) per health poll)."""
    import asyncio

    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=20, limits=httpx.Limits(max_connections=500)) as client:
        async def one():
            try:
                return (await client.post("/compare", json=PAIR)).status_code
            except Exception as exc:  # a refused or dropped connection is what this test is looking for
                return exc

        async def health(stop: asyncio.Event):
            polls = []
            while not stop.is_set():
                got = await client.get("/healthz")
                polls.append((got.status_code, got.json()["status"]))
                await asyncio.sleep(0.1)
            return polls

        stop = asyncio.Event()
        poller = asyncio.create_task(health(stop))
        loop = asyncio.get_running_loop()
        start, tasks = loop.time(), []
        while loop.time() - start < seconds:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(max(0.0, start + len(tasks) / rate - loop.time()))
        answers = await asyncio.gather(*tasks)
        stop.set()
        return answers, await poller


@pytest.mark.timeout(60)
def test_overload_on_loopback_sheds_load_without_a_crash(pair_judge):
    """A real server, offered 3x what its judge can do for 4 s: every request is answered 200, 503 (queue full,
    with Retry-After) or 504, none is dropped, /healthz stays up, and the server then stops by itself. The
    judge's delay stands in for a bigger model, so that its capacity is known and a test client can exceed it."""
    import asyncio

    judge = SlowJudge(pair_judge, 0.2)  # slow enough that a test client on a loaded machine can offer 3x its rate
    batch = 2
    took = []
    for _ in range(3):
        t0 = time.monotonic()
        judge.compare_batch([PAIR] * batch)
        took.append(time.monotonic() - t0)
    capacity = batch / sorted(took)[1]  # requests per second the judge can answer (one item each)
    app = create_app(judge, Limits(budget=rows(batch), max_wait_ms=2, max_queue=8, timeout_s=1.0))
    server, thread, url = _serve_in_thread(app)
    try:
        answers, polls = asyncio.run(_offer_load(url, rate=3 * capacity, seconds=4.0))
    finally:
        server.should_exit = True
        thread.join(15)
    assert not thread.is_alive(), "the server did not stop"
    crashes = [a for a in answers if not isinstance(a, int)]
    assert not crashes, f"{len(crashes)} requests got no answer, e.g. {crashes[0]!r}"
    codes = Counter(answers)
    assert set(codes) <= {200, 503, 504} and codes[200] and codes[503], codes
    assert codes[200] <= 1.5 * capacity * 4 + batch * 8  # shedding, not queueing without bound
    assert sum(app.state.stats.requests.values()) == len(answers)  # every request answered and counted
    assert polls and all(p == (200, "ok") for p in polls), polls


def test_a_client_leaving_mid_body_is_not_a_server_error(pair_judge):
    import asyncio

    app = create_app(pair_judge)
    sent = []

    async def run():
        messages = iter([{"type": "http.request", "body": b'{"question": ', "more_body": True},
                         {"type": "http.disconnect"}])

        async def receive():
            return next(messages)

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/compare", "headers": [], "query_string": b"",
                 "http_version": "1.1", "scheme": "http", "server": ("test", 80), "root_path": ""}
        await app(scope, receive, send)

    with TestClient(app):  # runs the lifespan
        asyncio.run(run())
    assert sent[0]["status"] == 499 and app.state.stats.requests == {("compare", 499): 1}


class SlowToMeasure(SlowJudge):
    """A judge that takes ``delay`` seconds to measure a request's tokens (a big body being tokenized)."""

    def sequence_lengths(self, records):
        time.sleep(self.delay)
        return self.judge.sequence_lengths(records)


@pytest.mark.timeout(60)
def test_health_and_metrics_answer_while_a_body_is_being_prepared(pair_judge):
    """Parsing, validating and tokenizing a request run off the event loop: /healthz and /metrics answer at once
    while a request takes 2 s to be measured. (How fast under real load: bench/serve_health.py.)"""
    import httpx

    server, thread, url = _serve_in_thread(create_app(SlowToMeasure(pair_judge, 2.0), warm_up=False))
    try:
        with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=url, timeout=10) as client:
            slow = pool.submit(client.post, "/compare", json=PAIR)
            time.sleep(0.3)  # the request is being measured now
            for path in ("/healthz", "/metrics"):
                start = time.monotonic()
                assert client.get(path).status_code == 200
                assert time.monotonic() - start < 0.5, f"{path} waited for the request being prepared"
            assert not slow.done() and slow.result().status_code == 200
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.mark.timeout(60)
def test_a_body_shorter_than_its_content_length_times_out(pair_judge):
    """A client that declares more bytes than it sends gets 408 after read_timeout_s, and the connection closes."""
    import socket

    server, thread, url = _serve_in_thread(create_app(pair_judge, Limits(read_timeout_s=0.5), warm_up=False))
    try:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /compare HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"question\": ")
            start = time.monotonic()
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            took = time.monotonic() - start
        assert answer.startswith(b"HTTP/1.1 408") and b"body not received within 0.5 s" in answer, answer[:300]
        assert b"of the 1000 declared" in answer and 0.4 < took < 5
    finally:
        server.should_exit = True
        thread.join(15)


class Recording(SlowJudge):
    """A real judge that records the sizes of its calls and its warm-ups."""

    def __init__(self, judge) -> None:
        super().__init__(judge, 0.0)
        self.calls: list[int] = []
        self.warm_ups: list[int | None] = []

    def compare_batch(self, items, symmetric=False):
        self.calls.append(len(items))
        return super().compare_batch(items, symmetric)

    def self_test(self):
        return Judge.self_test(self)

    def warm_up(self, max_items=None):
        self.warm_ups.append(max_items)
        return Judge.warm_up(self, max_items)  # the base method, through this judge's recorded calls

    @property
    def budget(self):
        return self.judge.budget

    @property
    def batch_size(self):
        return self.judge.batch_size


def test_the_server_warms_the_judge_up_before_it_listens(pair_judge):
    judge = Recording(pair_judge)
    with TestClient(create_app(judge, Limits(budget=rows(8)))) as client:
        assert judge.warm_ups == [8] and len(judge.calls) == 2  # the biggest call, then answers sharing a question
        seconds = [line for line in client.get("/metrics").text.splitlines()
                   if line.startswith("clfjudge_warm_up_seconds ")]
        assert len(seconds) == 1 and float(seconds[0].split()[1]) > 0
        assert client.post("/compare", json=PAIR).status_code == 200
    cold = Recording(pair_judge)
    with TestClient(create_app(cold, warm_up=False)) as client:
        assert cold.calls == [1]  # no warm-up, but one real item judged before listening
        assert client.post("/compare", json=PAIR).status_code == 200
        assert cold.warm_ups == [] and "clfjudge_warm_up_seconds" not in client.get("/metrics").text


def test_warm_up_fills_the_token_budget_with_long_answers(tiny_bert_dir, tmp_path):
    directory = make_judge(tiny_bert_dir, tmp_path, "cls3")
    unbudgeted = Recording(Judge.load(directory))
    assert unbudgeted.warm_up(32) == 3 and unbudgeted.calls == [1, 2]  # no budget: one long pair
    budgeted = Recording(Judge.load(directory, max_batch_tokens=2000))
    budgeted.warm_up(32)
    long = (WARM_UP_TEXT * 100)[:WARM_UP_CHARS]  # as many long pairs as the budget holds, in the judge's tokens
    seqs = budgeted.judge.sequence_lengths([as_pair({"question": "Warm-up question 0.", "answer_a": "0a. " + long,
                                                     "answer_b": "0b. " + long})])[0]
    assert budgeted.calls == [min(32, 2000 // (max(seqs) * len(seqs))), 2] and budgeted.calls[0] > 1
    capped = Recording(Judge.load(directory, max_batch_tokens=100_000))
    capped.warm_up(5)
    assert capped.calls == [5, 2]


CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]


def test_the_ecosystems_item_formats_are_judged_as_the_records_they_name(pair_judge, point_judge):
    """TRL's preference items (plain and conversational, content as text parts) and prompt / completion and
    messages items get the answers of the records they stand for."""
    question = "System: Be brief.\n\nUser: Name a prime."
    with TestClient(create_app(pair_judge)) as client:
        got = client.post("/compare", json={"items": [
            {"prompt": "Name a prime.", "chosen": "7", "rejected": "9 is a prime number."},
            {"prompt": CONVERSATION, "chosen": [{"role": "assistant", "content": [{"type": "text", "text": "7"}]}],
             "rejected": [{"role": "assistant", "content": "9"}]},
            {"chosen": [*CONVERSATION, {"role": "assistant", "content": "7"}],
             "rejected": [*CONVERSATION, {"role": "assistant", "content": "9"}]}]})
        assert got.status_code == 200, got.json()
        want = pair_judge.compare_batch([PAIR, {"question": question, "answer_a": "7", "answer_b": "9"}])
        results = got.json()["results"]
        assert results[0]["p_a"] == pytest.approx(want[0].p_a, abs=1e-6)
        assert results[1]["p_a"] == pytest.approx(want[1].p_a, abs=1e-6) == pytest.approx(results[2]["p_a"])
        wrong = client.post("/compare", json={"prompt": "q", "completion": "a"})
        assert wrong.status_code == 422 and "takes pairs" in wrong.json()["error"]
        image = client.post("/compare", json={"prompt": [{"role": "user", "content": [{"type": "image"}]}],
                                              "chosen": "a", "rejected": "b"})
        assert image.status_code == 422 and "field 'prompt[0].content[0]': only text parts" in image.json()["error"]
    with TestClient(create_app(point_judge)) as client:
        got = client.post("/score", json={"items": [
            {"prompt": CONVERSATION, "completion": [{"role": "assistant", "content": "7"}]},
            {"messages": [*CONVERSATION, {"role": "assistant", "content": "7"}]},
            {"prompt": "Name a prime.", "completion": "7"}]})
        assert got.status_code == 200, got.json()
        want = point_judge.score_batch([{"question": question, "answer": "7"},
                                        {"question": "Name a prime.", "answer": "7"}])
        scores = [r["score"] for r in got.json()["results"]]
        assert scores == pytest.approx([want[0].value, want[0].value, want[1].value], abs=1e-6)
        assert scores[0] != pytest.approx(scores[2], abs=1e-6)  # the system prompt is judged too


def test_openapi_describes_the_endpoints_and_item_formats(pair_judge):
    with TestClient(create_app(pair_judge, api_key="k")) as client:
        got = client.get("/openapi.json")
        assert got.status_code == 200
        doc = got.json()
        assert doc["openapi"].startswith("3.")
        assert set(doc["paths"]) == {"/compare", "/healthz", "/metrics", "/openapi.json"}
        assert {"PairItem", "PreferenceItem", "Message", "TextPart"} <= set(doc["components"]["schemas"])
        request = doc["paths"]["/compare"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert len(request["oneOf"]) == 3  # an item of either format posted alone, or a batch of them


def test_openapi_applies_its_security_and_describes_every_accepted_field(pair_judge, point_judge):
    from clfjudge.serving.server import PAIR_FIELDS, POINT_FIELDS

    with TestClient(create_app(pair_judge, api_key="k")) as client:
        doc = client.get("/openapi.json").json()
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        for path, method in (("/compare", "post"), ("/metrics", "get")):
            assert doc["paths"][path][method]["security"] == [{"bearer": []}]
            assert client.request(method.upper(), path, json={}).status_code == 401  # as the document says
        assert "security" not in doc["paths"]["/healthz"]["get"]
        assert client.get("/healthz").status_code == 200
        schemas = doc["components"]["schemas"]
        assert set(PAIR_FIELDS) | {"id"} == set(schemas["PairItem"]["properties"])
        assert set(PAIR_FIELDS) | {"id", "symmetric"} == set(schemas["PairRequest"]["properties"])
        assert "symmetric" in schemas["PreferenceRequest"]["properties"]
        assert "symmetric" not in schemas["PreferenceItem"]["properties"]
        # an item posted alone with its own symmetric is accepted, as PairItem says
        item = {"question": "Name a prime.", "answer_a": "7", "answer_b": "9", "symmetric": True}
        got = client.post("/compare", json=item, headers={"Authorization": "Bearer k"})
        assert got.status_code == 200, got.json()
    with TestClient(create_app(point_judge)) as client:  # no key: nothing to require, no scheme declared
        doc = client.get("/openapi.json").json()
        assert "securitySchemes" not in doc["components"]
        assert all("security" not in op for ops in doc["paths"].values() for op in ops.values())
        assert set(POINT_FIELDS) | {"id"} == set(doc["components"]["schemas"]["PointItem"]["properties"])


# -- connections that send nothing: a head timeout and a cap under the file limit --------------------------

@pytest.mark.timeout(120)
def test_health_answers_under_more_idle_connections_than_the_file_limit_allows(tiny_bert_dir, tmp_path):
    """`clfjudge serve` with its file limit at 64, and 60 connections held that send nothing or half a request head:
    /healthz still answers on new connections (the oldest idle ones are closed to make room), and the server logs
    a line per cause, not per event. (The full-size probe, 300 sockets at a limit of 256: bench/serve_idle.py.)"""
    import os
    import resource
    import socket
    import subprocess
    import sys

    judge = make_judge(tiny_bert_dir, tmp_path / "judge", "cls3")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stderr = (tmp_path / "stderr").open("w+b")
    server = subprocess.Popen(
        [sys.executable, "-m", "clfjudge.cli", "serve", str(judge), "--port", str(port), "--no-warm-up"],
        stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    idle: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 90
        while b"listening on" not in (tmp_path / "stderr").read_bytes():
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()
            time.sleep(0.2)
        for n in range(60):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if n % 2:
                sock.sendall(b"POST /compare HTTP/1.1\r\nHost: x\r\n")
            idle.append(sock)
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as probe:
                probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = b""
                while chunk := probe.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 200") and b'"status":"ok"' in answer, answer[:200]
        closed = 0
        for sock in idle:
            sock.settimeout(0.01)
            try:
                closed += sock.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed += 0
        assert closed >= 10  # made room
    finally:
        for sock in idle:
            sock.close()
        server.terminate()
        server.wait(30)
    log = (tmp_path / "stderr").read_bytes()
    assert len(log) < 10_000 and b"Traceback" not in log, log[-2000:]
    assert log.count(b"closed the oldest idle one") == 1, log


@pytest.mark.timeout(60)
def test_a_connection_that_sends_no_request_head_is_closed(pair_judge):
    """Nothing sent, half a head sent, or nothing after an answer on a kept-alive connection: each is closed
    after the head timeout (where it used to stay open for good)."""
    import socket

    app = create_app(pair_judge, Limits(header_timeout_s=0.5), warm_up=False)
    server, thread, url = _serve_in_thread(app)
    host, port = url.removeprefix("http://").split(":")
    try:
        with (socket.create_connection((host, int(port)), timeout=10) as silent,
              socket.create_connection((host, int(port)), timeout=10) as half,
              socket.create_connection((host, int(port)), timeout=10) as kept):
            half.sendall(b"POST /compare HTTP/1.1\r\nHost: x\r\n")
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"}"):  # the whole answer: head, then its JSON body
                answer += kept.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200")
            kept.sendall(b"GET /heal")
            for sock in (silent, half, kept):
                assert sock.recv(65536) == b""  # closed by the server (a socket timeout here: still open)
    finally:
        server.should_exit = True
        thread.join(15)


# -- the OpenAPI document is the contract: real answers validate against it, fields accepted == fields declared ----

def _validator(doc: dict, schema: dict):
    """A JSON Schema validator of ``schema`` whose references resolve in the OpenAPI document ``doc``."""
    import jsonschema

    return jsonschema.Draft202012Validator({**doc, **schema})


def _answer_schema(doc: dict, path: str, method: str, status: int) -> dict:
    answer = doc["paths"][path][method]["responses"][str(status)]  # KeyError: an undeclared status
    return next(iter(answer["content"].values()))["schema"]


def _request_schema(doc: dict, path: str) -> dict:
    return doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def _check_answer(doc: dict, path: str, method: str, response) -> None:
    schema = _answer_schema(doc, path, method, response.status_code)
    body = response.json() if "json" in response.headers["content-type"] else response.text
    errors = [e.message for e in _validator(doc, schema).iter_errors(body)]
    assert not errors, (path, response.status_code, body, errors[:3])


# One item of every declared format with every field it declares, per endpoint (and the same posted alone).
EVERY_FIELD = {
    "/compare": [
        {**PAIR, "id": "p1", "rubric": "Correctness.", "reference": "7"},
        {"id": 2, "prompt": CONVERSATION,
         "chosen": [{"role": "assistant", "content": [{"type": "text", "text": "7"}]}],
         "rejected": [{"role": "assistant", "content": "9"}]},
    ],
    "/score": [
        {"id": "s1", "question": "Name a prime.", "answer": "7", "rubric": "Correctness.", "reference": "7"},
        {"id": "s2", "prompt": "Name a prime.", "completion": "7"},
        {"id": "s3", "messages": [*CONVERSATION, {"role": "assistant", "content": "7"}]},
    ],
}


@pytest.fixture(scope="module")
def reward_judge(tiny_bert_dir, tmp_path_factory):
    return Judge.load(make_judge(tiny_bert_dir, tmp_path_factory.mktemp("reward"), "reward"))


@pytest.mark.parametrize("name", ["pair_judge", "point_judge", "reward_judge"])
def test_real_answers_of_every_route_validate_against_the_served_document(name, request):
    """Every route's answers (results, batches, errors of each kind, health, metrics, the document itself) match
    what the document the server serves declares for that status; each item's id comes back in its result."""
    judge = request.getfixturevalue(name)
    limits = Limits(max_items=4, max_text_chars=100, max_queue=3, budget=rows(1))
    app = create_app(SlowJudge(judge, 0.3) if name == "pair_judge" else judge, limits, api_key="k", warm_up=False)
    key = {"Authorization": "Bearer k"}
    with TestClient(app) as client:
        doc = client.get("/openapi.json").json()
        _check_answer(doc, "/openapi.json", "get", client.get("/openapi.json"))
        _check_answer(doc, "/healthz", "get", client.get("/healthz"))
        _check_answer(doc, "/metrics", "get", client.get("/metrics", headers=key))
        _check_answer(doc, "/metrics", "get", client.get("/metrics"))  # 401
        for path in [p for p in EVERY_FIELD if p in doc["paths"]]:
            items = EVERY_FIELD[path]
            answers = [client.post(path, json=item, headers=key) for item in items]
            answers.append(client.post(path, json={"items": items}, headers=key))
            assert [a.status_code for a in answers] == [200] * len(answers), [a.json() for a in answers]
            assert [a.json()["id"] for a in answers[:-1]] == [item["id"] for item in items]
            assert [r["id"] for r in answers[-1].json()["results"]] == [item["id"] for item in items]
            assert "id" not in client.post(path, json={k: v for k, v in items[0].items() if k != "id"},
                                           headers=key).json()
            mistakes = [client.post(path, content=b"{", headers=key),  # 400
                        client.post(path, json=items[0]),  # 401
                        client.post(path, json={"items": items * 4}, headers=key),  # 413
                        client.post(path, json={**items[0], "colour": "red"}, headers=key)]  # 422
            assert [m.status_code for m in mistakes] == [400, 401, 413, 422]
            for answer in answers + mistakes:
                _check_answer(doc, path, "post", answer)
        if "/compare" in doc["paths"]:  # the server's own refusals under load: 503 (queue full)
            # a judge slow enough that eight requests at once overflow the queue on any machine
            slow = None if name == "pair_judge" else TestClient(create_app(SlowJudge(judge, 0.3), limits,
                                                                           api_key="k", warm_up=False))
            with slow or contextlib.nullcontext(client) as loaded, ThreadPoolExecutor(8) as pool:
                busy = list(pool.map(lambda _: loaded.post("/compare", json=PAIR, headers=key), range(8)))
            assert 503 in {b.status_code for b in busy}
            for answer in busy:
                _check_answer(doc, "/compare", "post", answer)


def test_the_servers_own_faults_are_answered_as_the_document_declares(pair_judge):
    """503 (the judge failed on a call) and 504 (not judged in time) carry the declared error body too."""
    app = create_app(PickyJudge(pair_judge, 2.0), Limits(timeout_s=1.0), warm_up=False)
    with TestClient(app) as client:
        doc = client.get("/openapi.json").json()
        failed = client.post("/compare", json={**PAIR, "question": "BOOM"})
        late = client.post("/compare", json=PAIR)
    assert (failed.status_code, late.status_code) == (503, 504)
    for answer in (failed, late):
        _check_answer(doc, "/compare", "post", answer)


def test_a_generative_judges_answers_validate_against_the_document(tiny_llama_dir, tmp_path):
    from tiny_judges import ScriptedLM, make_generative_judge, prefers_seven

    judge = Judge.load(make_generative_judge(tiny_llama_dir, tmp_path / "gen"))
    judge.generator.model = ScriptedLM(judge.generator.tokenizer, prefers_seven)
    pairs = [{"question": "Name a prime.", "answer_a": "seven", "answer_b": "nine", "id": "g"},
             {"question": "GIBBERISH?", "answer_a": "seven", "answer_b": "nine"}]  # unparsed: nulls
    with TestClient(create_app(judge, warm_up=False)) as client:
        doc = client.get("/openapi.json").json()
        got = client.post("/compare", json={"items": pairs, "symmetric": True})
        assert got.status_code == 200 and got.json()["results"][1]["verdict"] is None
        _check_answer(doc, "/compare", "post", got)


@pytest.mark.parametrize("path, body", [
    ("/compare", {"items": [{**PAIR, "symmetric": True}]}),  # symmetric is the batch's
    ("/compare", {"prompt": "q", "chosen": "a", "rejected": "b", "colour": "red"}),  # TRL format: refused too
    ("/compare", {"items": [{"chosen": [*CONVERSATION, {"role": "assistant", "content": "7"}],
                             "rejected": [*CONVERSATION, {"role": "assistant", "content": "9"}], "score": 1}]}),
    ("/compare", {**PAIR, "id": [1]}),
    ("/score", {"question": "q", "answer": "a", "symmetric": True}),  # nothing to make symmetric
    ("/score", {"items": [{"question": "q", "answer": "a"}], "symmetric": False}),
    ("/score", {"prompt": "q", "completion": "a", "label": True}),
    ("/score", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "x": 1}),
])
def test_a_field_the_document_does_not_declare_is_refused_in_every_format(pair_judge, point_judge, path, body):
    """Accepted == declared: what the document refuses (an unknown field, symmetric where it does not belong, an id
    that is not a string or integer), the server answers 422 naming the field, in clfjudge's format and TRL's."""
    with TestClient(create_app(pair_judge if path == "/compare" else point_judge, warm_up=False)) as client:
        doc = client.get("/openapi.json").json()
        assert list(_validator(doc, _request_schema(doc, path)).iter_errors(body))  # the document refuses it
        got = client.post(path, json=body)
        assert got.status_code == 422, got.json()
        _check_answer(doc, path, "post", got)


def test_every_body_the_tests_send_and_the_server_judges_is_one_the_document_declares(pair_judge, point_judge):
    for judge in (pair_judge, point_judge):
        with TestClient(create_app(judge, warm_up=False)) as client:
            doc = client.get("/openapi.json").json()
            path = "/compare" if "/compare" in doc["paths"] else "/score"
            items = EVERY_FIELD[path]
            bodies = [*items, {"items": items}, {**items[0], "rubric": None}]
            if path == "/compare":
                bodies += [{**PAIR, "symmetric": True}, {"items": items, "symmetric": True}]
            for body in bodies:
                assert not list(_validator(doc, _request_schema(doc, path)).iter_errors(body)), body
                assert client.post(path, json=body).status_code == 200, body


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["pair_judge", "point_judge"])
def test_an_api_fuzz_run_from_the_document_finds_no_5xx_and_no_schema_violation(name, request):
    """schemathesis generates requests from the served document for every operation and checks each answer: no
    5xx, a declared status and content type, a body that matches the declared schema."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
              response_schema_conformance]
    app = create_app(request.getfixturevalue(name), warm_up=False)
    server, thread, url = _serve_in_thread(app)
    try:
        import httpx

        schema = schemathesis.openapi.from_dict(httpx.get(url + "/openapi.json").json())
        operations = [op.ok() for op in schema.get_all_operations()]
        assert len(operations) == 4  # the judge's endpoint, /healthz, /metrics, /openapi.json
        seen = {op.label: Counter() for op in operations}
        for operation in operations:
            @settings(max_examples=60 if operation.method == "post" else 5, deadline=None, database=None,
                      derandomize=True, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy())
            def fuzz(case):
                seen[case.operation.label][case.call_and_validate(base_url=url, checks=checks).status_code] += 1

            fuzz()
        judged = next(counts for label, counts in seen.items() if label.startswith("POST "))
        assert judged[200] >= 5, seen  # the generated items reach the judge, not only its validation
    finally:
        server.should_exit = True
        thread.join(15)
