"""`clfjudge serve MODEL --port N`: JSON endpoints /compare, /score, /healthz, /metrics with dynamic batching."""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..serve import Limits

    d = Limits()
    p = subparsers.add_parser("serve", help="serve a judge over HTTP with dynamic batching")
    p.add_argument("model", help="judge directory (PyTorch, ONNX or embedding)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "onnx", "sklearn"])
    p.add_argument("--threads", type=int, help="intra-op threads of the judge")
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size, help="items per judge call")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, help="how long a batch waits to fill")
    p.add_argument("--max-queue", type=int, default=d.max_queue, help="queued items before 503")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s, help="per-request timeout (504)")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--max-items", type=int, default=d.max_items, help="items per request")
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, help="characters per text field")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ..runtime import Judge
    from ..serve import Limits, create_app

    judge = Judge.load(args.model, backend=args.backend, threads=args.threads, batch_size=args.max_batch_size)
    limits = Limits(max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue,
                    timeout_s=args.timeout_s, max_body_bytes=args.max_body_bytes, max_items=args.max_items,
                    max_text_chars=args.max_text_chars)
    uvicorn.run(create_app(judge, limits), host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=int(args.timeout_s) + 1)
    return 0
