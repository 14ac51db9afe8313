"""HTTP serving for a judge: Starlette app + dynamic batching.

Requests are authenticated (optional API key), read (within ``read_timeout_s``), then parsed, validated and measured
in the judge's own tokens (``Judge.sequence_lengths``) in a worker thread, so that the event loop, and /healthz and
/metrics with it, stays free while a big body is tokenized; then queued (bounded: 503 when full), merged by one
batching task into judge calls, run in a worker thread (the judge is not re-entrant, so one call at a time), and
answered. A call waits at most ``max_wait_ms`` (default 0, as text-embeddings-inference's continuous batching) to
fill, then takes queued requests in arrival order, up to the server's budget (``Limits.budget``, a
``batching.Budget``: ``max_batch_size`` items, ``max_batch_tokens`` padded tokens; ``batching.next_call``:
text-embeddings-inference's queue and token budget, which its router owns as this server owns its own); requests
that arrive while the judge runs are queued for the next call, so under load calls fill without waiting; a request
waiting longer than ``timeout_s`` gets 504. Before it listens, the server warms the judge up (``Judge.warm_up``:
sessions loaded, memory grown for the biggest call), or without warm-up judges one short item (``Judge.self_test``):
a judge that cannot score never starts serving, so never reports healthy. On shutdown the server stops accepting
(503), drains what is queued, then stops the batcher.

Status codes say whose fault it is: 4xx for anything the client sent (the message names the item and field),
5xx only for the server (503 and 504 carry on under load; 503 says when to retry). A judge call that fails (a
runtime error in a part of the judge) is 503 too, logged in one line per cause (``LOG``, no traceback): judging is
a pure function of the input, so a retry may land on a healthy replica. Every answer, errors included, is a JSON
object; an error is ``{"error": message}``.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..batching import DEFAULT_MAX_BATCH_TOKENS, Budget, next_call, padded_tokens
from ..data.formats import is_own_item
from ..data.records import Loc, RecordError
from .openapi import ITEMS, OPTIONS, openapi_schema

PAIR_FIELDS = {"question": True, "answer_a": True, "answer_b": True, "rubric": False, "reference": False}
POINT_FIELDS = {"question": True, "answer": True, "rubric": False, "reference": False}
# A JSON string, or an unterminated one up to the end: a pattern that cannot fail once it has started never
# backtracks, so stripping strings is linear even for a body of 100k unclosed quotes.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# A failed judge call's line (``clfjudge serve`` writes one per cause and interval: serving.listen)
LOG = logging.getLogger("clfjudge.serve")


# the `clfjudge serve` option of each limit, for the messages that refuse one
FLAGS = {name: "--" + name.replace("_", "-") for name in (
    "max_queue", "max_items", "max_text_chars", "max_body_bytes", "max_json_depth", "max_connections", "timeout_s",
    "read_timeout_s", "header_timeout_s", "max_wait_ms")}


@dataclass(frozen=True)
class Limits:
    # items and padded tokens per judge call (no token budget: items only); ``clfjudge serve`` loads its judge with
    # the same budget, so the judge cuts its forward passes by it too
    budget: Budget = Budget(32, DEFAULT_MAX_BATCH_TOKENS)
    max_wait_ms: float = 0.0  # on a CPU, waiting for company costs the lone request more than batching saves
    max_queue: int = 256  # queued items (not requests)
    timeout_s: float = 30.0
    max_body_bytes: int = 1 << 20
    read_timeout_s: float = 10.0  # the whole body must arrive within this (a slow client, a lying Content-Length)
    header_timeout_s: float = 10.0  # a request's head, within this of the connection opening or its last answer
    max_connections: int = 1000  # open at once (``listen.connection_plan`` lowers it to the file limit)
    max_items: int = 64  # items per request
    max_text_chars: int = 32_000
    max_json_depth: int = 8  # a valid body nests 3 deep ({"items": [{...}]}), a conversation's text part 7
    retry_after_s: int = 1  # the Retry-After of a 503

    def __post_init__(self) -> None:
        """A limit that would refuse everything (or allow nothing to arrive) is refused here, not served."""
        positive = ("max_queue", "max_items", "max_text_chars", "max_body_bytes", "max_json_depth", "max_connections",
                    "timeout_s", "read_timeout_s", "header_timeout_s")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{FLAGS.get(name, name)} must be positive, got {getattr(self, name)}")
        if not self.max_wait_ms >= 0:
            raise ValueError(f"{FLAGS['max_wait_ms']} cannot be negative, got {self.max_wait_ms}")


class HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


@dataclass
class Pending:
    items: list[dict[str, Any]]
    symmetric: bool
    future: asyncio.Future
    lengths: tuple[int, ...] = ()  # token lengths of the sequences the judge reads for its items
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
        seconds = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
        self.latency = Histogram("clfjudge_request_seconds", seconds)
        self.queue_time = Histogram("clfjudge_queue_seconds", seconds)  # enqueued -> its judge call starts
        # per judge call, padding included, as the judge cuts it into forward passes (and both passes of a
        # symmetric comparison by a judge that reads both orders)
        self.batch_tokens = Histogram("clfjudge_batch_tokens", [2 ** k for k in range(6, 17)])
        self.padding = Histogram("clfjudge_batch_padding_fraction", [0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1])
        self.tokens = Counter()  # "real" / "padded" token positions computed
        self.warm_up_s: float | None = None  # how long the judge's warm-up took (None: not warmed up)
        self.info: list[str] = []  # constant series: what runs the judge here and why (``runtime_info``)

    def observe_call(self, real: int, padded: int) -> None:
        self.batch_tokens.observe(padded)
        self.padding.observe(1 - real / padded)
        self.tokens["real"] += real
        self.tokens["padded"] += padded

    def render(self, queue_depth: int) -> str:
        lines = ["# TYPE clfjudge_requests_total counter"]
        lines += [f'clfjudge_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                  for (e, s), n in sorted(self.requests.items())]
        lines += self.batch_size.render() + self.latency.render() + self.queue_time.render()
        lines += self.batch_tokens.render() + self.padding.render()
        lines += ["# TYPE clfjudge_tokens_total counter"]
        lines += [f'clfjudge_tokens_total{{kind="{k}"}} {self.tokens[k]}' for k in ("real", "padded")]
        lines += ["# TYPE clfjudge_queue_depth gauge", f"clfjudge_queue_depth {queue_depth}"]
        if self.warm_up_s is not None:
            lines += ["# TYPE clfjudge_warm_up_seconds gauge", f"clfjudge_warm_up_seconds {self.warm_up_s:.6f}"]
        return "\n".join(lines + self.info) + "\n"


def _label(value: Any) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def runtime_info(judge: Any) -> list[str]:
    """Constant /metrics series: what runs the judge on this machine and why (``Judge.runtime_choice``), and what
    this machine can run (``machine.probe``), each capability 1 or 0 with its reason."""
    from ..machine import probe

    choice = {"backend": getattr(judge, "backend_name", ""), **getattr(judge, "runtime_choice", {})}
    labels = ",".join(f'{k}="{_label(v)}"' for k, v in choice.items())
    lines = ["# TYPE clfjudge_runtime_info gauge", f"clfjudge_runtime_info{{{labels}}} 1",
             "# TYPE clfjudge_machine_capability gauge"]
    lines += [f'clfjudge_machine_capability{{name="{name}",why="{_label(c.why)}"}} {int(c.runs)}'
              for name, c in probe().capabilities().items()]
    return lines


class Batcher:
    """Merges queued requests of one task into judge calls. ``run(items, symmetric)`` returns one JSON-able
    result per item; ``plan(lengths)`` is how the judge cuts a call's sequences into forward passes (for the
    padding metrics) and ``passes(symmetric)`` how many times it reads them."""

    def __init__(self, run: Callable[[list[dict[str, Any]], bool], list[dict[str, Any]]], limits: Limits,
                 stats: Stats, plan: Callable[[list[int]], list[list[int]]] | None = None,
                 passes: Callable[[bool], int] = lambda _symmetric: 1) -> None:
        self.run, self.limits, self.stats = run, limits, stats
        self.plan = plan or (lambda lengths: [list(range(len(lengths)))])
        self.passes = passes
        self.queue: list[Pending] = []  # oldest first
        self.arrived = asyncio.Event()
        self.queued_items = 0
        self.inflight = 0  # items taken off the queue and being judged
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop())

    async def submit(self, items: list[dict[str, Any]], symmetric: bool,
                     lengths: Sequence[int] = ()) -> list[dict[str, Any]]:
        if self.queued_items + len(items) > self.limits.max_queue:
            raise HTTPError(503, f"queue full ({self.queued_items} items waiting, "
                                 f"limit {self.limits.max_queue}); retry later")
        pending = Pending(items, symmetric, asyncio.get_running_loop().create_future(), tuple(lengths))
        self.queued_items += len(items)
        self.queue.append(pending)
        self.arrived.set()
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), self.limits.timeout_s)
        except asyncio.TimeoutError:
            pending.future.cancel()  # the batcher skips it if it is still queued
            raise HTTPError(504, f"not judged within {self.limits.timeout_s} s") from None

    def _full(self) -> bool:
        """Whether what is queued already fills a call (no use waiting for more)."""
        if self.queued_items >= self.limits.budget.max_batch_size:
            return True
        budget = self.limits.budget.max_batch_tokens
        return budget is not None and sum(sum(p.lengths) for p in self.queue) >= budget

    async def _loop(self) -> None:
        while True:
            await self.arrived.wait()
            deadline = time.monotonic() + self.limits.max_wait_ms / 1000
            while not self._full() and (left := deadline - time.monotonic()) > 0:
                self.arrived.clear()
                try:
                    await asyncio.wait_for(self.arrived.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch = self._take()
            if self.queue:  # cleared while waiting: what is left is the next call's
                self.arrived.set()
            else:
                self.arrived.clear()
            if not batch:
                continue
            self.inflight = sum(len(p.items) for p in batch)
            try:
                await self._judge(batch)
            finally:
                self.inflight = 0

    def _take(self) -> list[Pending]:
        """Off the queue: the requests of the next call (``batching.next_call`` among those of the oldest
        request's order mode: one judge call per mode), and the timed-out ones nobody waits for."""
        gone = [p for p in self.queue if p.future.done()]
        self.queued_items -= sum(len(p.items) for p in gone)
        live = [p for p in self.queue if not p.future.done()]
        if not live:
            self.queue = []
            return []
        same = [p for p in live if p.symmetric is live[0].symmetric]
        budget = self.limits.budget
        chosen = [same[i] for i in next_call([(len(p.items), p.lengths) for p in same],
                                             budget.max_batch_size, budget.max_batch_tokens)]
        taken = {id(p) for p in chosen}
        self.queue = [p for p in live if id(p) not in taken]
        self.queued_items -= sum(len(p.items) for p in chosen)
        return chosen

    async def _judge(self, batch: list[Pending]) -> None:
        now = time.monotonic()
        self.stats.batch_size.observe(sum(len(p.items) for p in batch))
        for p in batch:
            self.stats.queue_time.observe(now - p.enqueued)
        lengths = [n for p in batch for n in p.lengths]
        if lengths:  # a judge that cannot count its tokens, or a call of cache hits only, has none
            passes = self.passes(batch[0].symmetric)
            padded = sum(padded_tokens([lengths[i] for i in chunk]) for chunk in self.plan(lengths))
            self.stats.observe_call(passes * sum(lengths), passes * padded)
        await self._call(batch, batch[0].symmetric)

    async def _call(self, group: list[Pending], symmetric: bool) -> None:
        items = [item for p in group for item in p.items]
        try:
            results = await asyncio.to_thread(self.run, items, symmetric)
        except Exception as exc:  # a failing judge call fails its requests, not the server
            if len(group) > 1:  # and one request must not fail the others merged with it: judge each alone
                for p in group:
                    await self._call([p], symmetric)
                return
            if not group[0].future.done():
                group[0].future.set_exception(_judge_error(exc))
            return
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


def _judge_error(exc: Exception) -> HTTPError:
    if isinstance(exc, RecordError):  # an input the checks at validation let through: still the client's
        return HTTPError(422, f"the judge cannot take this input: {exc.message}")
    LOG.error("a judge call failed, answered 503: %s: %s", type(exc).__name__, exc)
    return HTTPError(503, f"judge error: {type(exc).__name__}: {exc}")


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in a JSON text, counted without recursion (brackets inside strings
    skipped): ``json`` recurses once per level, so a deep body must be refused before it is parsed."""
    import numpy as np

    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if not brackets:
        return 0
    codes = np.frombuffer(brackets.encode("ascii"), dtype=np.uint8)
    return int(np.cumsum(np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)).max())


async def read_body(request, limits: Limits) -> bytes:
    """The body, read no further than ``max_body_bytes`` (413 beyond, whether or not it declared its size) and
    for no longer than ``read_timeout_s`` (408: a client that sends slowly, or less than its Content-Length,
    does not hold its connection and a worker forever)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise HTTPError(400, f"header 'Content-Length' is not a byte count: {declared[:40]!r}")
        if int(declared) > limits.max_body_bytes:
            raise HTTPError(413, f"body of {int(declared)} bytes, limit {limits.max_body_bytes}")
    chunks, size = [], 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise HTTPError(413, f"body of over {limits.max_body_bytes} bytes, limit {limits.max_body_bytes}")
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), limits.read_timeout_s)
    except asyncio.TimeoutError:
        raise HTTPError(408, f"body not received within {limits.read_timeout_s} s ({size} bytes came"
                             + (f" of the {declared} declared)" if declared is not None else ")"),
                        {"Connection": "close"}) from None
    return b"".join(chunks)


def parse_body(raw: bytes, limits: Limits) -> Any:
    """The JSON value of a body; HTTPError(400) for bytes that are not UTF-8 or not JSON, or nest too deep."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPError(400, f"body is not valid UTF-8: {exc.reason} at byte {exc.start}") from None
    depth = json_depth(text)
    if depth > limits.max_json_depth:
        raise HTTPError(400, f"body nests {depth} levels deep, limit {limits.max_json_depth}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise HTTPError(400, f"body is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer beyond Python's int-string limit
        raise HTTPError(400, f"body is not valid JSON: {exc}") from None


ASKS = {"compare": "a pair to compare", "score": "an answer to score"}
TAKES = {"compare": "pairs", "score": "single answers"}


def item_schema(item: dict[str, Any], task: str) -> tuple[str, dict[str, Any]]:
    """The declared item format (``openapi.ITEMS``) an item is in: clfjudge's own if it has one of its fields, else
    the format it shares the most fields with (None when it shares none)."""
    formats = list(ITEMS[task].items())
    if is_own_item(item, "pair" if task == "compare" else "point"):
        return formats[0]
    shared = [len(set(item) & (set(schema["properties"]) - {"id"})) for _, schema in formats[1:]]
    return formats[1 + shared.index(max(shared))] if max(shared) else (None, {})


def validate(body: Any, task: str, limits: Limits,
             build: Callable[..., Any] | None = None) -> tuple[list[Any], bool, list[Any]]:
    """The request's items (one object, or {"items": [...]}), its symmetric flag and its items' ids (None where
    an item has none); HTTPError(422) names the item and field. Every item is checked against its declared format
    (``openapi.ITEMS``): a field the document does not declare is refused, in every format alike. ``build(item,
    loc)`` (``as_pair`` / ``as_point``) applies the runtime's checks too."""
    if not isinstance(body, dict):
        raise HTTPError(422, f"body must be a JSON object, got {type(body).__name__}")
    options = set(OPTIONS[task])
    batch = "items" in body
    if batch and set(body) - {"items"} - options:
        shape = '{"items": [...], "symmetric": false}' if options else '{"items": [...]}'
        raise HTTPError(422, f"unknown field(s) {sorted(set(body) - {'items'} - options)} beside 'items'; "
                             f"a batch is {shape}")
    symmetric = body.get("symmetric", False) if options else False
    if not isinstance(symmetric, bool):
        raise HTTPError(422, "field 'symmetric' must be true or false")
    items = body["items"] if batch else [{k: v for k, v in body.items() if k not in options}]
    if not isinstance(items, list) or not items:
        raise HTTPError(422, "field 'items' must be a non-empty list")
    if len(items) > limits.max_items:
        raise HTTPError(413, f"field 'items': {len(items)} items, limit {limits.max_items} per request")
    fields = PAIR_FIELDS if task == "compare" else POINT_FIELDS
    clean, ids = [], []
    for i, item in enumerate(items):
        where = f"items[{i}]" if batch else "body"
        if not isinstance(item, dict):
            raise HTTPError(422, f"{where} must be an object")
        name, schema = item_schema(item, task)
        unknown = set(item) - set(schema.get("properties", {"id": None}))
        other = "score" if task == "compare" else "compare"
        for other_name, other_schema in ITEMS[other].items():  # an item of the other endpoint's formats
            if unknown and set(other_schema["required"]) <= set(item) <= set(other_schema["properties"]):
                raise HTTPError(422, f"{where}: a {other_name} is {ASKS[other]}; /{task} takes {TAKES[task]}: "
                                     + "; ".join(f"{n} {sorted(s['properties'])}" for n, s in ITEMS[task].items()))
        if unknown:
            beside = (" ('symmetric' goes beside 'items', for the whole batch)"
                      if batch and "symmetric" in unknown and options else "")
            expected = (f"a {name} has {sorted(schema['properties'])}" if name else "expected the fields of one of: "
                        + "; ".join(f"{n} {sorted(s['properties'])}" for n, s in ITEMS[task].items()))
            raise HTTPError(422, f"{where}: unknown field(s) {sorted(unknown)}{beside}; {expected}")
        ident = item.get("id")
        if "id" in item and (not isinstance(ident, (str, int)) or isinstance(ident, bool)):
            raise HTTPError(422, f"{where}: field 'id' must be a string or an integer")
        ids.append(ident)
        if build is not None and name != next(iter(ITEMS[task])):
            clean.append(foreign_item(item, where, fields, limits))
            continue
        for field_name, required in fields.items():
            value = item.get(field_name)
            if value is None:
                if required:
                    raise HTTPError(422, f"{where}: field '{field_name}' is required")
                continue
            if not isinstance(value, str):
                raise HTTPError(422, f"{where}: field '{field_name}' must be a string")
            if len(value) > limits.max_text_chars:
                raise HTTPError(413, f"{where}: field '{field_name}' has {len(value)} characters, "
                                     f"limit {limits.max_text_chars}")
        clean.append({k: item[k] for k in fields if item.get(k) is not None})
        if build is not None:
            try:
                build(clean[-1], Loc())
            except RecordError as err:
                raise HTTPError(422, f"{where}: field {err.field!r}: {err.message}" if err.field
                                else f"{where}: {err.message}") from None
    return clean, symmetric, ids


def foreign_item(item: dict[str, Any], where: str, fields: dict[str, bool], limits: Limits):
    """An item in another of the ecosystem's formats (TRL's prompt / chosen / rejected, prompt / completion,
    messages; ``data.formats``) as the record it names, checked as clfjudge's own items are; 422 names the field."""
    from ..data.formats import item_record

    arity = "pair" if "answer_a" in fields else "point"
    try:
        record = item_record(item, Loc(), labelled=False, arity=arity)
    except RecordError as err:
        raise HTTPError(422, f"{where}: field {err.field!r}: {err.message}" if err.field
                        else f"{where}: {err.message}") from None
    for name in fields:
        value = getattr(record, name, None)
        if value is not None and len(value) > limits.max_text_chars:
            raise HTTPError(413, f"{where}: field '{name}' has {len(value)} characters (as read from the item's "
                                 f"{sorted(item)}), limit {limits.max_text_chars}")
    return record


def bearer_key_ok(header: str | None, key: bytes) -> bool:
    """Whether an Authorization header carries ``Bearer <key>`` (constant-time comparison)."""
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("latin-1", "replace"), key)


class JudgeService:
    """One judge served over HTTP: one method per route (``compare``, ``score``, ``healthz``, ``metrics``,
    ``openapi``), the startup and shutdown around them (``lifespan``) and the Starlette app that routes to them
    (``app``). ``judge``: a clfjudge.judges.base.Judge, or anything with compare_batch / score_batch, ``card`` and
    ``tasks``. The server's budget (``limits.budget``) cuts its calls; the judge only reports what it reads
    (``sequence_lengths``)."""

    def __init__(self, judge, limits: Limits = Limits(), api_key: str | None = None, warm_up: bool = True) -> None:
        from ..judges.base import as_pair, as_point

        self.judge, self.limits, self.warm_up = judge, limits, warm_up
        self.stats = Stats()
        self.stats.info = runtime_info(judge)
        self.tasks: Sequence[str] = sorted(judge.tasks)
        # Each endpoint's runtime check of an item (an empty question, text that is not Unicode), run at validation
        # so that a judge call does not fail on a client's input.
        self.inputs = {"compare": as_pair, "score": as_point}
        self.key = api_key.encode("utf-8") if api_key else None
        self.schema = openapi_schema(judge, self.tasks, limits, secured=self.key is not None)
        self.runners = {
            "compare": lambda items, sym: [c.to_dict() for c in judge.compare_batch(items, symmetric=sym)],
            "score": lambda items, _sym: [s.to_dict() for s in judge.score_batch(items)],
        }
        self.batchers: dict[str, Batcher] = {}
        self.startup_error: Exception | None = None
        self.accepting = True
        # Parsing, validation and tokenization of bodies (up to max_body_bytes each) run here, off the event loop.
        # One thread: the judge's tokenizer is shared with the judge call running beside it, and more preparers
        # would only queue on the interpreter lock; the loop meanwhile answers /healthz and /metrics.
        self.preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clfjudge-prepare")

    # -- what a request goes through ----------------------------------------------------------------------
    def prepare(self, task: str, raw: bytes) -> tuple[list[Any], bool, list[int], list[Any], bool]:
        """A body -> its items, symmetric flag, token lengths, ids, and whether it was a batch; run in
        ``preparer``."""
        body = parse_body(raw, self.limits)
        build = self.inputs[task]
        items, symmetric, ids = validate(body, task, self.limits, build)
        return items, symmetric, self.lengths(items, build), ids, "items" in body

    def lengths(self, items: list[dict[str, Any]], build) -> list[int]:
        """The token lengths of every sequence the judge reads for these items (none when it cannot tell)."""
        measure = getattr(self.judge, "sequence_lengths", None)
        per_record = None if measure is None else measure([build(item) for item in items])
        return [] if per_record is None else [n for seqs in per_record for n in seqs]

    def plan(self, call_lengths: list[int]) -> list[list[int]]:
        """A call's sequences in forward passes, as the judge loaded with this server's budget cuts them."""
        return self.limits.budget.batches(call_lengths)

    def passes(self, symmetric: bool) -> int:
        """How many times a call reads its sequences: a judge that is not position-invariant reads both orders."""
        return 2 if symmetric and not getattr(self.judge, "position_invariant", False) else 1

    def check_key(self, request) -> None:
        if self.key is not None and not bearer_key_ok(request.headers.get("authorization"), self.key):
            raise HTTPError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                            {"WWW-Authenticate": 'Bearer realm="clfjudge"'})

    def error_response(self, exc: HTTPError):
        from starlette.responses import JSONResponse

        headers = dict(exc.headers or {})
        if exc.status == 503:
            headers["Retry-After"] = str(self.limits.retry_after_s)
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)

    async def judged(self, task: str, request):
        """The answer to a /compare or /score request (what both routes do)."""
        from starlette.requests import ClientDisconnect
        from starlette.responses import JSONResponse

        start = time.monotonic()
        try:
            self.check_key(request)
            if task not in self.tasks:
                served = ", ".join("/" + t for t in self.tasks)
                raise HTTPError(404, f"this {self.judge.card.name} judge cannot {task}; it serves {served}")
            if not self.accepting:
                raise HTTPError(503, "server is shutting down")
            raw = await read_body(request, self.limits)
            items, symmetric, sizes, ids, batch = await asyncio.get_running_loop().run_in_executor(
                self.preparer, self.prepare, task, raw)
            results = await self.batchers[task].submit(items, symmetric, sizes)
            results = [r if i is None else {"id": i, **r} for i, r in zip(ids, results)]
            response = JSONResponse({"results": results} if batch else results[0])
        except HTTPError as exc:
            response = self.error_response(exc)
        except ClientDisconnect:  # the client left mid-body: nobody reads the answer, and it is no server fault
            response = JSONResponse({"error": "client disconnected"}, status_code=499)
        except Exception:
            self.stats.requests[(task, 500)] += 1  # answered (JSON) by the app's handler, and logged
            raise
        self.stats.requests[(task, response.status_code)] += 1
        self.stats.latency.observe(time.monotonic() - start)
        return response

    # -- routes -------------------------------------------------------------------------------------------
    async def compare(self, request):
        return await self.judged("compare", request)

    async def score(self, request):
        return await self.judged("score", request)

    async def healthz(self, _request):
        from starlette.responses import JSONResponse

        card = self.judge.card
        return JSONResponse({"status": "ok" if self.accepting else "draining", "kind": card.kind, "head": card.head,
                             "backbone": card.backbone, "backend": getattr(self.judge, "backend_name", ""),
                             "tasks": list(self.tasks)})

    async def metrics(self, request):
        from starlette.responses import PlainTextResponse

        try:
            self.check_key(request)
        except HTTPError as exc:
            return self.error_response(exc)
        return PlainTextResponse(self.stats.render(sum(b.queued_items for b in self.batchers.values())))

    async def openapi(self, _request):
        from starlette.responses import JSONResponse

        return JSONResponse(self.schema)

    @staticmethod
    async def http_exception(_request, exc):  # unknown path, wrong method
        from starlette.responses import JSONResponse

        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @staticmethod
    async def server_error(_request, exc: Exception):
        from starlette.responses import JSONResponse

        return JSONResponse({"error": f"internal server error ({type(exc).__name__})"}, status_code=500)

    # -- startup and shutdown -----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, _app):
        judge = self.judge
        try:
            if self.warm_up and hasattr(judge, "warm_up"):  # before the server listens: no request pays for it
                start = time.monotonic()
                await asyncio.to_thread(judge.warm_up, self.limits.budget.max_batch_size)
                self.stats.warm_up_s = time.monotonic() - start
            elif hasattr(judge, "self_test"):  # one real judgement all the same: a judge that fails it never serves
                await asyncio.to_thread(judge.self_test)
        except Exception as exc:
            self.startup_error = exc  # the judge's fault: ``clfjudge serve`` exits 3 with it
            raise
        for task in self.tasks:
            self.batchers[task] = Batcher(self.runners[task], self.limits, self.stats, self.plan, self.passes)
            self.batchers[task].start()
        yield
        self.accepting = False
        for b in self.batchers.values():
            await b.drain()
        self.preparer.shutdown(wait=False)

    def app(self):
        """The Starlette app routing to this service (``app.state.stats``: its counters)."""
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route

        routes = [Route("/compare", self.compare, methods=["POST"]), Route("/score", self.score, methods=["POST"]),
                  Route("/healthz", self.healthz), Route("/metrics", self.metrics),
                  Route("/openapi.json", self.openapi)]
        app = Starlette(routes=routes, lifespan=self.lifespan,
                        exception_handlers={HTTPException: self.http_exception, Exception: self.server_error})
        app.state.stats = self.stats
        app.state.service = self
        return app


def create_app(judge, limits: Limits = Limits(), api_key: str | None = None, warm_up: bool = True):
    """A Starlette app serving ``judge`` (``JudgeService``). With ``api_key``, /compare, /score and /metrics need
    ``Authorization: Bearer <key>``; /healthz stays open (load balancers probe it). ``warm_up``: run
    ``judge.warm_up`` (if it has one) at startup, before the server listens; without it, ``judge.self_test`` (one
    short item) runs there instead."""
    return JudgeService(judge, limits, api_key, warm_up).app()
