"""Server health under idle connections: /healthz while a client holds many connections that send nothing or half
a request head, with the server's file limit below their number.

    python bench/serve_idle.py JUDGE_DIR [--idle 300] [--file-limit 256] [--seconds 20] [--reconnect-s 1]

Starts one `clfjudge serve` subprocess with its file limit (``ulimit -n``) at ``--file-limit``, opens ``--idle``
connections to it (half send nothing, half the first lines of a request head and no more), and reopens each one
the server closes after ``--reconnect-s``, for ``--seconds``; meanwhile /healthz is asked every 20 ms on a new
connection each time, as a load balancer does. Records the probes' p50 / p99 / max latency, failed probes and how
many bytes the server wrote to stderr. Passes when p99 < 100 ms, no probe failed and stderr < 10 KB (exit 1
otherwise). The run ends by itself.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import machine, write

HALF_HEAD = b"POST /compare HTTP/1.1\r\nHost: probe\r\nContent-Type: application/json\r\n"
P99_MS, STDERR_BYTES = 100.0, 10_000


async def hold(port: int, n: int, stop: float, reconnect_s: float, counts: dict[str, int]) -> None:
    """Connection ``n``, reopened ``reconnect_s`` after each time the server closes it, until ``stop``."""
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            counts["refused"] += 1
            await asyncio.sleep(reconnect_s)
            continue
        counts["opened"] += 1
        try:
            if n % 2:
                writer.write(HALF_HEAD)
            await asyncio.wait_for(reader.read(), max(0.0, stop - time.monotonic()))
            counts["closed_by_server"] += 1
        except (asyncio.TimeoutError, OSError):
            pass
        finally:
            writer.close()
        await asyncio.sleep(reconnect_s)


async def probe(port: int, timeout: float = 5.0) -> float | None:
    """Seconds /healthz took on a new connection (None: no 200 within ``timeout``)."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), timeout)
        writer.close()
    except (asyncio.TimeoutError, OSError):
        return None
    return time.perf_counter() - start if answer.startswith(b"HTTP/1.1 200") else None


async def measure(port: int, idle: int, seconds: float, reconnect_s: float) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    counts = {"opened": 0, "closed_by_server": 0, "refused": 0}
    holders = [asyncio.create_task(hold(port, n, stop, reconnect_s, counts)) for n in range(idle)]
    await asyncio.sleep(1.0)  # the idle connections are open before the first probe
    took: list[float] = []
    failed = 0
    while time.monotonic() < stop:
        t = await probe(port)
        if t is None:
            failed += 1
        else:
            took.append(t)
        await asyncio.sleep(0.02)
    await asyncio.gather(*holders)
    q = statistics.quantiles(took, n=100) if len(took) > 1 else took * 99
    return {"probes": len(took) + failed, "failed": failed, "p50_ms": 1000 * statistics.median(took) if took else None,
            "p99_ms": 1000 * q[98] if took else None, "max_ms": 1000 * max(took) if took else None,
            "idle": counts, "loadavg": os.getloadavg()[0]}


def start_server(judge: Path, file_limit: int, threads: int, stderr) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (file_limit, file_limit))

    proc = subprocess.Popen([sys.executable, "-m", "clfjudge.cli", "serve", str(judge), "--port", str(port),
                             "--threads", str(threads)], env={**os.environ, "OMP_NUM_THREADS": str(threads)},
                            stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=limit_files)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("judge", type=Path)
    parser.add_argument("--idle", type=int, default=300)
    parser.add_argument("--file-limit", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--reconnect-s", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # this client holds the idle connections
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.idle + 256)), hard))
    meta = machine(args.threads)
    with tempfile.TemporaryFile() as stderr:
        proc, port = start_server(args.judge, args.file_limit, args.threads, stderr)
        try:
            result = asyncio.run(measure(port, args.idle, args.seconds, args.reconnect_s))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        stderr.seek(0)
        err = stderr.read()
    result["stderr_bytes"] = len(err)
    result["stderr_head"] = err[:2000].decode(errors="replace")
    result["passed"] = (result["failed"] == 0 and result["p99_ms"] is not None and result["p99_ms"] < P99_MS
                        and len(err) < STDERR_BYTES)
    print(result, flush=True)
    lines = [f"# Server health under idle connections ({meta['date']})", "",
             f"CPU: {meta['cpu']} ({meta['cores']} cores, shared with other jobs); commit {meta['commit']}; judge "
             f"`{args.judge}`; {args.idle} connections held (half silent, half a partial request head, each reopened "
             f"{args.reconnect_s:g} s after the server closes it) for {args.seconds:g} s against a server with its "
             f"file limit at {args.file_limit}; /healthz on a new connection every 20 ms; load average "
             f"{result['loadavg']:.1f}.", "",
             "| probes | failed | p50 ms | p99 ms | max ms | server stderr bytes | idle opened / closed by server | "
             "passed |", "|---|---|---|---|---|---|---|---|",
             f"| {result['probes']} | {result['failed']} | {result['p50_ms'] or 0:.1f} | {result['p99_ms'] or 0:.1f} "
             f"| {result['max_ms'] or 0:.1f} | {len(err)} | {result['idle']['opened']} / "
             f"{result['idle']['closed_by_server']} | {result['passed']} |", "",
             "Server stderr:", "", "```", result["stderr_head"].rstrip(), "```"]
    report = {"machine": meta, **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, **result}
    print(write("serve_idle", report, "\n".join(lines) + "\n"))
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
