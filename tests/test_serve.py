"""The HTTP server on tiny real judges: endpoints, validation, dynamic batching, back-pressure, shutdown."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from starlette.testclient import TestClient

from clfjudge.runtime import Judge
from clfjudge.serve import Limits, create_app
from tiny_judges import make_judge

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
    app = create_app(SlowJudge(pair_judge, 0.2), Limits(max_batch_size=16, max_wait_ms=50))
    with TestClient(app) as client, ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: client.post("/compare", json=PAIR).status_code, range(16)))
        metrics = client.get("/metrics").text
    assert codes == [200] * 16
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if not line.startswith("#"))
    batches, single = int(values["clfjudge_batch_size_count"]), int(values['clfjudge_batch_size_bucket{le="1"}'])
    assert float(values["clfjudge_batch_size_sum"]) == 16 and batches < 16 and single < batches  # merged
    assert values["clfjudge_queue_depth"] == "0" and values["clfjudge_request_seconds_count"] == "16"
    assert 'clfjudge_requests_total{endpoint="compare",status="200"} 16' in metrics


def test_full_queue_gives_503_and_nothing_is_lost(pair_judge):
    app = create_app(SlowJudge(pair_judge, 0.3), Limits(max_batch_size=1, max_wait_ms=0, max_queue=2))
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
    app = create_app(SlowJudge(pair_judge, 0.2), Limits(max_batch_size=1, max_wait_ms=0))
    with TestClient(app) as client, ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(client.post, "/compare", json=PAIR) for _ in range(3)]
        time.sleep(0.05)
    # leaving the block ran the shutdown: in-flight and queued requests were still answered
    assert [f.result().status_code for f in futures] == [200, 200, 200]
