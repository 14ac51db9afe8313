"""Server load test: dynamic batching vs one request at a time, at 1 / 8 / 32 concurrent clients on loopback.

    python bench/serve_load.py JUDGE_DIR [--clients 1 8 32] [--requests 64] [--threads 2]

Starts `clfjudge serve` as a subprocess per configuration (max batch 32 / wait 5 ms, and max batch 1), sends
a bounded number of real Auto-J test pairs from each client (httpx, asyncio), records throughput, p50 and p99
latency and every non-200 answer, then stops the server. The run ends by itself.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from common import machine, write

CONFIGS = {"dynamic batching (max 32, 5 ms)": ["--max-batch-size", "32", "--max-wait-ms", "5"],
           "one at a time (max batch 1)": ["--max-batch-size", "1", "--max-wait-ms", "0"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if (await client.get(url + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError("server did not come up")


async def load(url: str, payloads: list[dict[str, str]], clients: int, per_client: int) -> dict[str, Any]:
    latencies, errors = [], {}

    async def client_loop(cid: int, http: httpx.AsyncClient) -> None:
        for i in range(per_client):
            body = payloads[(cid * per_client + i) % len(payloads)]
            start = time.perf_counter()
            try:
                r = await http.post(url + "/compare", json=body)
                code = r.status_code
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            latencies.append(time.perf_counter() - start)
            if code != 200:
                errors[str(code)] = errors.get(str(code), 0) + 1

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(c, http) for c in range(clients)))
        wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    return {"clients": clients, "requests": len(latencies), "seconds": wall, "throughput_rps": len(latencies) / wall,
            "p50_ms": 1000 * statistics.median(latencies), "p99_ms": 1000 * q[98], "errors": errors}


async def run_config(judge: Path, flags: list[str], payloads, args) -> list[dict[str, Any]]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.Popen([sys.executable, "-m", "clfjudge.cli", "serve", str(judge), "--port", str(port),
                             "--threads", str(args.threads), "--max-queue", "4096", "--timeout-s", "120", *flags],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc)
        await load(url, payloads, 1, 4)  # warm-up
        rows = []
        for clients in args.clients:
            per_client = max(1, args.requests // clients) if clients > 1 else args.requests // 2
            rows.append(await load(url, payloads, clients, per_client))
            print(flags, rows[-1])
        return rows
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    from clfjudge.data.sources import load as load_source

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("judge", type=Path)
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=128, help="requests per configuration and level")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    payloads = [{"question": r.question, "answer_a": r.answer_a, "answer_b": r.answer_b}
                for r in load_source("autoj-test").records[:256]]
    meta = machine(args.threads)
    results = {name: asyncio.run(run_config(args.judge, flags, payloads, args)) for name, flags in CONFIGS.items()}
    one = {r["clients"]: r for r in results["one at a time (max batch 1)"]}
    lines = [f"# Server load: dynamic batching vs one at a time ({meta['date']})", "",
             f"CPU: {meta['cpu']} ({meta['cores']} cores), judge threads {args.threads}, load average at start "
             f"{tuple(round(x, 2) for x in meta['loadavg_at_start'])}; commit {meta['commit']}; judge `{args.judge}`; "
             "real Auto-J test pairs; clients and server on loopback.", "",
             "| configuration | clients | requests | req/s | p50 ms | p99 ms | errors | × one-at-a-time |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            lines.append(f"| {name} | {r['clients']} | {r['requests']} | {r['throughput_rps']:.1f} | "
                         f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['errors'] or 0} | "
                         f"{r['throughput_rps'] / one[r['clients']]['throughput_rps']:.2f} |")
    report = {"machine": meta, "judge": str(args.judge), "results": results}
    print(write("serve_load", report, "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()
