"""Server health under big bodies: how long /healthz and /metrics take while the server parses, tokenizes and
judges bodies near its size limit.

    python bench/serve_health.py JUDGE_DIR [--clients 4] [--seconds 20] [--threads 2] [--body-bytes 1000000]

Starts one `clfjudge serve` subprocess (default limits), then ``--clients`` clients each post, one after another,
/compare bodies of about ``--body-bytes`` (items of long answers under the 32,000-character limit, distinct text per
body, so no cache answers) for ``--seconds``, while one more client polls /healthz and /metrics every 50 ms. Records
the probes' p50 / p99 / max latency (the server's aim: p99 under 100 ms) and the big requests' status codes and
latency. The run ends by itself.
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

TEXT = ("The committee reviewed the proposal in detail, weighed its costs against the expected benefits, and asked "
        "the authors to clarify how the results would be measured and reported. ")
MAX_CHARS = 30_000  # under the server's default 32,000 characters per text


def body(n: int, size: int) -> dict[str, Any]:
    """A /compare batch of about ``size`` bytes; ``n`` makes its texts distinct from every other body's."""
    answer = (TEXT * (MAX_CHARS // len(TEXT) + 1))[:MAX_CHARS]
    items = [{"question": f"Question {n}.{i}?", "answer_a": f"{n}.{i}a {answer}", "answer_b": f"{n}.{i}b {answer}"}
             for i in range(max(1, size // (2 * MAX_CHARS)))]
    return {"items": items}


def quantiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
    return {"n": len(values), "p50_ms": 1000 * statistics.median(values), "p99_ms": 1000 * q[98],
            "max_ms": 1000 * max(values)}


async def measure(url: str, clients: int, seconds: float, size: int) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    probes: dict[str, list[float]] = {"/healthz": [], "/metrics": []}
    big: list[float] = []
    codes: dict[str, int] = {}

    async def poster(cid: int, http: httpx.AsyncClient) -> None:
        n = 0
        while time.monotonic() < stop:
            start = time.perf_counter()
            try:
                code = str((await http.post(url + "/compare", json=body(cid * 100_000 + n, size))).status_code)
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            big.append(time.perf_counter() - start)
            codes[code] = codes.get(code, 0) + 1
            n += 1

    async def prober(http: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            for path, took in probes.items():
                start = time.perf_counter()
                (await http.get(url + path)).raise_for_status()
                took.append(time.perf_counter() - start)
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 4)) as http:
        await asyncio.gather(prober(http), *(poster(c, http) for c in range(clients)))
    return {"probes": {path: quantiles(took) for path, took in probes.items()}, "big_requests": quantiles(big),
            "codes": codes, "loadavg": os.getloadavg()[0]}


async def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            try:
                if (await client.get(url + "/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError("server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("judge", type=Path)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--body-bytes", type=int, default=1_000_000)
    args = parser.parse_args()
    meta = machine(args.threads)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "clfjudge.cli", "serve", str(args.judge), "--port", str(port),
                             "--threads", str(args.threads), "--timeout-s", "600"],
                            env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        asyncio.run(wait_ready(url, proc))
        result = asyncio.run(measure(url, args.clients, args.seconds, args.body_bytes))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(result, flush=True)
    lines = [f"# Server health under big bodies ({meta['date']})", "",
             f"CPU: {meta['cpu']} ({meta['cores']} cores, shared with other jobs), judge threads {args.threads}; "
             f"commit {meta['commit']}; judge `{args.judge}`; {args.clients} clients posting bodies of about "
             f"{args.body_bytes} bytes for {args.seconds:g} s while /healthz and /metrics are polled every 50 ms; "
             f"big requests: {result['codes']}, p50 {result['big_requests']['p50_ms']:.0f} ms; load average "
             f"{result['loadavg']:.1f}.", "",
             "| endpoint | probes | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|"]
    lines += [f"| {path} | {q['n']} | {q['p50_ms']:.1f} | {q['p99_ms']:.1f} | {q['max_ms']:.1f} |"
              for path, q in result["probes"].items()]
    report = {"machine": meta, "judge": str(args.judge), "clients": args.clients, "seconds": args.seconds,
              "body_bytes": args.body_bytes, **result}
    print(write("serve_health", report, "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()
