"""`clfjudge serve JUDGE_DIR --port N`: JSON endpoints /compare, /score, /healthz, /metrics with dynamic batching."""
from __future__ import annotations

import argparse
import os
import sys

from .common import int_in, judge_options, load_options

API_KEY_ENV = "CLFJUDGE_API_KEY"


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..batching import DEFAULT_MAX_PADDING
    from ..serving.server import Limits

    d = Limits()
    p = subparsers.add_parser("serve", help="serve a judge over HTTP with dynamic batching")
    p.add_argument("model", metavar="JUDGE_DIR", help="judge directory (PyTorch, ONNX, embedding or generative), or a "
                   "reward model without a card (docs/your-model.md)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int_in(0, 65535), default=8000, help="TCP port (0: one the system picks)")
    judge_options(p, d.budget.max_batch_size, "items per judge call", alias="--max-batch-size")
    p.add_argument("--max-batch-tokens", type=int, default=d.budget.max_batch_tokens,
                   help="token budget of a judge call and of each forward pass, padding included (rows x longest "
                        "sequence, in the judge's own tokens); queued requests join the call in arrival order. 0: no "
                        "budget, calls are cut at --batch-size only")
    p.add_argument("--max-padding", type=float, default=DEFAULT_MAX_PADDING,
                   help="the fraction of a forward pass that may be padding (a CPU computes padding at full cost "
                        "and gains little from bigger batches; 1: any, as on a GPU)")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms,
                   help="how long an idle judge waits for more requests before a call (0: none; requests that "
                        "arrive during a call are batched into the next one anyway)")
    p.add_argument("--max-queue", type=int, default=d.max_queue, help="queued items before 503")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s, help="per-request timeout (504)")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--read-timeout-s", type=float, default=d.read_timeout_s,
                   help="time a request's whole body may take to arrive (408 after: a slow client, or one that "
                        "sends less than its Content-Length)")
    p.add_argument("--max-items", type=int, default=d.max_items, help="items per request")
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, help="characters per text field")
    p.add_argument("--max-json-depth", type=int, default=d.max_json_depth, help="nesting of a JSON body")
    p.add_argument("--header-timeout-s", type=float, default=d.header_timeout_s,
                   help="time a connection may take to send a request's head, from opening or from its last answer "
                        "(then it is closed: idle and half-sent requests do not hold the server's files)")
    p.add_argument("--max-connections", type=int, default=d.max_connections,
                   help="connections open at once, lowered to fit the file limit (ulimit -n); a new one closes the "
                        "oldest idle one")
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                   help="start listening without first judging made-up inputs shaped like the biggest call "
                        "(Judge.warm_up: the first requests then pay for loading and memory growth); one short "
                        "item is judged all the same, so a judge that cannot score never starts")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /compare, /score and /metrics (default: "
                        f"${API_KEY_ENV}; the variable keeps the key out of the process list)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..batching import Budget
    from ..judges.base import JudgeError, load_ready
    from ..serving.listen import bind, is_loopback, serve
    from ..serving.server import Limits, create_app

    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if api_key is not None and not api_key.strip():
        raise ValueError("--api-key is empty")
    # the server's budget: it cuts the server's calls, and the judge is loaded with it to cut its forward passes
    budget = Budget(args.batch_size, args.max_batch_tokens or None, args.max_padding)
    limits = Limits(budget=budget, max_wait_ms=args.max_wait_ms,
                    max_queue=args.max_queue, timeout_s=args.timeout_s, max_body_bytes=args.max_body_bytes,
                    read_timeout_s=args.read_timeout_s, header_timeout_s=args.header_timeout_s,
                    max_connections=args.max_connections, max_items=args.max_items,
                    max_text_chars=args.max_text_chars, max_json_depth=args.max_json_depth)
    load = load_options(args, budget)
    # the options, then the address (CannotListen: exit 5), then the judge, which takes seconds to minutes to load
    sock = bind(args.host, args.port)
    if api_key is None and not is_loopback(sock):
        print(f"clfjudge serve: warning: listening on {args.host} without an API key: anyone who can reach this "
              f"port can use the judge (set {API_KEY_ENV} or --api-key)", file=sys.stderr)
    try:
        # a judge that cannot score exits here (JudgeError) and is never reported healthy
        judge = load_ready(args.model, load)
        app = create_app(judge, limits, api_key=api_key, warm_up=args.warm_up)
        if not serve(app, sock, limits, graceful_s=args.timeout_s):
            raise JudgeError(args.model, app.state.service.startup_error or "it failed at start-up")
    finally:
        sock.close()
    return 0
