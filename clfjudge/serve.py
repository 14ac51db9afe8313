"""HTTP serving for a judge: Starlette app + dynamic batching.

Requests are validated, queued (bounded: 503 when full), merged by one batching task into judge calls of at
most ``max_batch_size`` items or after ``max_wait_ms``, run in a worker thread (the judge is not re-entrant,
so one call at a time), and answered; a request waiting longer than ``timeout_s`` gets 504. On shutdown the
server stops accepting (503), drains what is queued, then stops the batcher.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .records import RecordError

PAIR_FIELDS = {"question": True, "answer_a": True, "answer_b": True, "rubric": False, "reference": False}
POINT_FIELDS = {"question": True, "answer": True, "rubric": False, "reference": False}


@dataclass(frozen=True)
class Limits:
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_queue: int = 256  # queued items (not requests)
    timeout_s: float = 30.0
    max_body_bytes: int = 1 << 20
    max_items: int = 64  # items per request
    max_text_chars: int = 32_000


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Pending:
    items: list[dict[str, Any]]
    symmetric: bool
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, name: str, buckets: Sequence[float]) -> None:
        self.name, self.buckets = name, list(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def render(self) -> list[str]:
        lines = [f"# TYPE {self.name} histogram"]
        lines += [f'{self.name}_bucket{{le="{b:g}"}} {n}' for b, n in zip(self.buckets, self.counts)]
        return lines + [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_sum {self.sum:.6f}",
                        f"{self.name}_count {self.count}"]


class Stats:
    """Counters for /metrics (Prometheus text format)."""

    def __init__(self) -> None:
        self.requests: Counter = Counter()  # (endpoint, status)
        self.batch_size = Histogram("clfjudge_batch_size", [1, 2, 4, 8, 16, 32, 64, 128])
        self.latency = Histogram("clfjudge_request_seconds", [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30])

    def render(self, queue_depth: int) -> str:
        lines = ["# TYPE clfjudge_requests_total counter"]
        lines += [f'clfjudge_requests_total{{endpoint="{e}",status="{s}"}} {n}' for (e, s), n in sorted(self.requests.items())]
        lines += self.batch_size.render() + self.latency.render()
        lines += ["# TYPE clfjudge_queue_depth gauge", f"clfjudge_queue_depth {queue_depth}"]
        return "\n".join(lines) + "\n"


class Batcher:
    """Merges queued requests of one task into judge calls. ``run(items, symmetric)`` returns one JSON-able
    result per item."""

    def __init__(self, run: Callable[[list[dict[str, Any]], bool], list[dict[str, Any]]], limits: Limits,
                 stats: Stats) -> None:
        self.run, self.limits, self.stats = run, limits, stats
        self.queue: asyncio.Queue[Pending] = asyncio.Queue()
        self.queued_items = 0
        self.inflight = 0  # items taken off the queue and being judged
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop())

    async def submit(self, items: list[dict[str, Any]], symmetric: bool) -> list[dict[str, Any]]:
        if self.queued_items + len(items) > self.limits.max_queue:
            raise HTTPError(503, f"queue full ({self.queued_items} items waiting, limit {self.limits.max_queue}); retry later")
        pending = Pending(items, symmetric, asyncio.get_running_loop().create_future())
        self.queued_items += len(items)
        self.queue.put_nowait(pending)
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), self.limits.timeout_s)
        except asyncio.TimeoutError:
            pending.future.cancel()  # the batcher skips it if it is still queued
            raise HTTPError(504, f"not judged within {self.limits.timeout_s} s") from None

    async def _loop(self) -> None:
        while True:
            batch = [await self.queue.get()]
            size = len(batch[0].items)
            deadline = time.monotonic() + self.limits.max_wait_ms / 1000
            while size < self.limits.max_batch_size and (left := deadline - time.monotonic()) > 0:
                try:
                    nxt = await asyncio.wait_for(self.queue.get(), left)
                except asyncio.TimeoutError:
                    break
                batch.append(nxt)
                size += len(nxt.items)
            self.queued_items -= size
            self.inflight = size
            try:
                await self._judge(batch, size)
            finally:
                self.inflight = 0

    async def _judge(self, batch: list[Pending], size: int) -> None:
        self.stats.batch_size.observe(size)
        for symmetric in (False, True):  # one judge call per order mode
            group = [p for p in batch if p.symmetric is symmetric and not p.future.done()]
            if not group:
                continue
            items = [item for p in group for item in p.items]
            try:
                results = await asyncio.to_thread(self.run, items, symmetric)
            except Exception as exc:  # a failing judge call fails its requests, not the server
                for p in group:
                    p.future.set_exception(HTTPError(500, f"judge error: {exc}"))
                continue
            start = 0
            for p in group:
                if not p.future.done():
                    p.future.set_result(results[start:start + len(p.items)])
                start += len(p.items)

    async def drain(self) -> None:
        while self.queued_items or self.inflight:
            await asyncio.sleep(0.01)
        if self.task is not None:
            self.task.cancel()


def validate(body: Any, fields: dict[str, bool], limits: Limits) -> tuple[list[dict[str, Any]], bool]:
    """The request's items (one object, or {"items": [...]}) and its symmetric flag; HTTPError(422) names the
    item and field."""
    if not isinstance(body, dict):
        raise HTTPError(422, f"body must be a JSON object, got {type(body).__name__}")
    symmetric = body.get("symmetric", False)
    if not isinstance(symmetric, bool):
        raise HTTPError(422, "field 'symmetric' must be true or false")
    items = body["items"] if "items" in body else [body]
    if not isinstance(items, list) or not items:
        raise HTTPError(422, "field 'items' must be a non-empty list")
    if len(items) > limits.max_items:
        raise HTTPError(413, f"field 'items': {len(items)} items, limit {limits.max_items} per request")
    clean = []
    for i, item in enumerate(items):
        where = f"items[{i}]" if "items" in body else "body"
        if not isinstance(item, dict):
            raise HTTPError(422, f"{where} must be an object")
        for name, required in fields.items():
            value = item.get(name)
            if value is None:
                if required:
                    raise HTTPError(422, f"{where}: field '{name}' is required")
                continue
            if not isinstance(value, str):
                raise HTTPError(422, f"{where}: field '{name}' must be a string")
            if len(value) > limits.max_text_chars:
                raise HTTPError(413, f"{where}: field '{name}' has {len(value)} characters, limit {limits.max_text_chars}")
        unknown = set(item) - set(fields) - {"id"}
        if unknown:
            raise HTTPError(422, f"{where}: unknown field(s) {sorted(unknown)}; expected {sorted(fields)}")
        clean.append({k: item[k] for k in fields if item.get(k) is not None})
    return clean, symmetric


def create_app(judge, limits: Limits = Limits()):
    """A Starlette app serving ``judge`` (a clfjudge.runtime.Judge or anything with compare_batch/score_batch
    and ``tasks``)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    stats = Stats()
    tasks: Sequence[str] = sorted(judge.tasks)
    runners = {
        "compare": lambda items, sym: [c.to_dict() for c in judge.compare_batch(items, symmetric=sym)],
        "score": lambda items, _sym: [s.to_dict() for s in judge.score_batch(items)],
    }
    fields = {"compare": PAIR_FIELDS, "score": POINT_FIELDS}
    batchers: dict[str, Batcher] = {}
    state = {"accepting": True}

    def endpoint(task: str):
        async def handle(request: Request):
            start = time.monotonic()
            try:
                if task not in tasks:
                    raise HTTPError(404, f"this {judge.card.head} judge cannot {task}; it serves {', '.join('/' + t for t in tasks)}")
                if not state["accepting"]:
                    raise HTTPError(503, "server is shutting down")
                declared = int(request.headers.get("content-length") or 0)
                if declared > limits.max_body_bytes:
                    raise HTTPError(413, f"body of {declared} bytes, limit {limits.max_body_bytes}")
                raw = await request.body()
                if len(raw) > limits.max_body_bytes:
                    raise HTTPError(413, f"body of {len(raw)} bytes, limit {limits.max_body_bytes}")
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise HTTPError(400, f"body is not valid JSON: {exc}") from None
                items, symmetric = validate(body, fields[task], limits)
                results = await batchers[task].submit(items, symmetric)
                status, payload = 200, ({"results": results} if "items" in body else results[0])
            except HTTPError as exc:
                status, payload = exc.status, {"error": exc.message}
            except RecordError as exc:
                status, payload = 422, {"error": str(exc)}
            stats.requests[(task, status)] += 1
            stats.latency.observe(time.monotonic() - start)
            return JSONResponse(payload, status_code=status)

        return handle

    async def healthz(_request: Request):
        card = judge.card
        return JSONResponse({"status": "ok" if state["accepting"] else "draining", "head": card.head,
                             "backbone": card.backbone, "backend": getattr(judge, "backend_name", ""),
                             "tasks": list(tasks)})

    async def metrics(_request: Request):
        return PlainTextResponse(stats.render(sum(b.queued_items for b in batchers.values())))

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        for task in tasks:
            batchers[task] = Batcher(runners[task], limits, stats)
            batchers[task].start()
        yield
        state["accepting"] = False
        for b in batchers.values():
            await b.drain()

    routes = [Route("/compare", endpoint("compare"), methods=["POST"]),
              Route("/score", endpoint("score"), methods=["POST"]),
              Route("/healthz", healthz), Route("/metrics", metrics)]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.stats = stats
    return app
