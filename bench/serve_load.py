"""Server load test: token-budget batching vs batching by count vs one request at a time, on loopback.

    python bench/serve_load.py JUDGE_DIR [--clients 1 8 32 64] [--requests 32] [--threads 2] [--max-chars N]
                               [--configs token count one]

Starts one `clfjudge serve` subprocess per configuration (``CONFIGS``; ``--configs`` picks some, "one" is always
run: the ratios are against it) and keeps them all up; then, level by level, runs each configuration in turn (so
that a machine shared with other jobs loads them alike): every client sends its share of real Auto-J test pairs
(httpx, asyncio) and the run records throughput, p50 and p99 latency, every non-200 answer, the server process's
CPU time per request (robust to a shared machine's load), and from /metrics the judge calls' mean size, padded
tokens and padding fraction. Each level sends pairs no earlier level sent, so an embedding judge's reading cache
never answers for the model. The run ends by itself.
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

CONFIGS = {  # id: (label, flags)
    "token": ("token budget (max 32, 4096 tokens, 10% padding, no wait: the server's defaults)",
              ["--batch-size", "32", "--max-batch-tokens", "4096", "--max-padding", "0.1", "--max-wait-ms", "0"]),
    "token-2048": ("token budget 2048 (max 32, 10% padding, no wait)",
                   ["--batch-size", "32", "--max-batch-tokens", "2048", "--max-padding", "0.1",
                    "--max-wait-ms", "0"]),
    "count": ("by count (max 32, 5 ms, no token budget)",
              ["--batch-size", "32", "--max-batch-tokens", "0", "--max-padding", "1", "--max-wait-ms", "5"]),
    "one": ("one at a time (max batch 1)", ["--batch-size", "1", "--max-wait-ms", "0"]),
    # the same two on onnxruntime's CPU provider, for an export whose served run is another provider's
    "token-cpu": ("token budget, onnxruntime CPU", ["--batch-size", "32", "--max-batch-tokens", "4096",
                                                   "--max-padding", "0.1", "--max-wait-ms", "0", "--provider", "cpu"]),
    "one-cpu": ("one at a time, onnxruntime CPU",
                ["--batch-size", "1", "--max-wait-ms", "0", "--provider", "cpu"]),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
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


async def scrape(url: str) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(url + "/metrics")).text
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}


def batching(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """What the judge calls of one level looked like, from the /metrics counters' differences."""
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    calls = delta("clfjudge_batch_size_count")
    padded, real = delta('clfjudge_tokens_total{kind="padded"}'), delta('clfjudge_tokens_total{kind="real"}')
    return {"calls": calls, "mean_items_per_call": delta("clfjudge_batch_size_sum") / calls if calls else None,
            "mean_padded_tokens_per_call": padded / calls if calls else None,
            "padding_fraction": 1 - real / padded if padded else None,
            "mean_queue_s": (delta("clfjudge_queue_seconds_sum") / delta("clfjudge_queue_seconds_count")
                             if delta("clfjudge_queue_seconds_count") else None)}


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process so far (all its threads): what a judge costs, whatever else the shared
    machine runs meanwhile (wall-clock throughput moves with the other jobs' load)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(url: str, payloads: list[dict[str, str]], clients: int, per_client: int,
               pid: int | None = None) -> dict[str, Any]:
    latencies, errors = [], {}

    async def client_loop(cid: int, http: httpx.AsyncClient) -> None:
        for i in range(per_client):
            body = payloads[cid * per_client + i]
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
    before, cpu = await scrape(url), cpu_seconds(pid)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(c, http) for c in range(clients)))
        wall = time.perf_counter() - start
    cpu = cpu_seconds(pid) - cpu
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"clients": clients, "requests": len(latencies), "seconds": wall, "throughput_rps": len(latencies) / wall,
            "p50_ms": 1000 * statistics.median(latencies), "p99_ms": 1000 * q[98], "errors": errors,
            "server_cpu_s_per_request": cpu / len(latencies) if pid is not None else None,
            "loadavg": os.getloadavg()[0], **batching(before, await scrape(url))}


def start_server(judge: Path, flags: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([sys.executable, "-m", "clfjudge.cli", "serve", str(judge), "--port", str(port),
                             "--threads", str(threads), "--max-queue", "4096", "--timeout-s", "600", *flags],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, f"http://127.0.0.1:{port}"


async def run(judge: Path, payloads: list[dict[str, str]], args) -> dict[str, list[dict[str, Any]]]:
    chosen = dict.fromkeys([*args.configs, "one"])
    servers = {CONFIGS[c][0]: start_server(judge, CONFIGS[c][1], args.threads) for c in chosen}
    try:
        for proc, url in servers.values():
            await wait_ready(url, proc)
            await load(url, payloads[-2:], 1, 2)  # warm-up on pairs no level sends
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
        offset = 0
        for clients in args.clients:
            per_client = max(1, args.requests // clients) if clients > 1 else max(1, args.requests // 2)
            level = payloads[offset:offset + clients * per_client]
            offset += len(level)
            for name, (proc, url) in servers.items():
                results[name].append(await load(url, level, clients, per_client, proc.pid))
                print(name, results[name][-1], flush=True)
        return results
    finally:
        for proc, _url in servers.values():
            proc.terminate()
            proc.wait(timeout=60)


def cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main() -> None:
    from clfjudge.data.sources import load as load_source

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("judge", type=Path)
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--requests", type=int, default=32, help="requests per configuration and level "
                                                                 "(1 client: half; at least one per client)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--max-chars", type=int, help="only pairs whose question and answers are this short (a "
                                                      "slow judge on a shared machine; the lengths still vary)")
    args = parser.parse_args()
    payloads = [{"question": r.question, "answer_a": r.answer_a, "answer_b": r.answer_b}
                for r in load_source("autoj-test").records
                if args.max_chars is None or max(len(r.question), len(r.answer_a), len(r.answer_b)) <= args.max_chars]
    meta = machine(args.threads)
    results = asyncio.run(run(args.judge, payloads, args))
    one = {r["clients"]: r for r in results[CONFIGS["one"][0]]}
    lines = [f"# Server load: token-budget batching vs by count vs one at a time ({meta['date']})", "",
             f"CPU: {meta['cpu']} ({meta['cores']} cores, shared with other jobs), judge threads {args.threads}, "
             f"load average at start {tuple(round(x, 2) for x in meta['loadavg_at_start'])}; commit "
             f"{meta['commit']}; judge `{args.judge}`; {len(payloads)} real Auto-J test pairs"
             f"{'' if args.max_chars is None else f' (question and answers at most {args.max_chars} characters)'}, "
             "each level sending pairs no earlier level sent; clients and servers on loopback; the configurations "
             "take turns level by level. Wall-clock figures move with the other jobs' load (last column); the "
             "server's own CPU time per request does much less so.", "",
             "| configuration | clients | requests | req/s | p50 ms | p99 ms | errors | × one-at-a-time | "
             "server CPU s / request | × one-at-a-time by CPU | items / call | padded tokens / call | padding | "
             "load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            lines.append(f"| {name} | {r['clients']} | {r['requests']} | {r['throughput_rps']:.2f} | "
                         f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['errors'] or 0} | "
                         f"{r['throughput_rps'] / one[r['clients']]['throughput_rps']:.2f} | "
                         f"{r['server_cpu_s_per_request']:.2f} | "
                         f"{one[r['clients']]['server_cpu_s_per_request'] / r['server_cpu_s_per_request']:.2f} | "
                         f"{cell(r['mean_items_per_call'], '.1f')} | "
                         f"{cell(r['mean_padded_tokens_per_call'], '.0f')} | "
                         f"{cell(r['padding_fraction'], '.1%')} | {r['loadavg']:.1f} |")
    configs = {CONFIGS[c][0]: CONFIGS[c][1] for c in dict.fromkeys([*args.configs, "one"])}
    report = {"machine": meta, "judge": str(args.judge), "configs": configs, "max_chars": args.max_chars,
              "pairs": len(payloads), "results": results}
    print(write("serve_load", report, "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()
