"""`clfjudge score --engine ray` on one machine: the single-process scorer vs judge actors on a local Ray instance
(1 and 2 actors), on the same real pairs.

    python bench/ray_scale.py [--judge DIR] [--source hh-rlhf] [--n 8192] [--shards 4] [--actors 1 2]

The pairs are the first N of a source (real questions and answers), written as JSONL shards of N / shards lines
each; the single-process scorer reads them concatenated (one process, one judge load). Shards are a multiple of
--chunk-size long and every line is valid, so both cut the same chunks, and the Ray outputs, concatenated, must be
the single-process output byte for byte: the bench checks that and records it.

Each configuration is `clfjudge score` run as a subprocess and timed end to end, as a user would see it (interpreter
start, judge load, and for Ray starting a local instance and its actors). Without --judge the judge is the tiny
random-weight BERT judge of the tests (tests/tiny_judges.py: 2 layers, hidden size 32): the figures are then the
engine's overhead and scaling around a small model, not a production judge's speed. Ray's workers run at the
driver's niceness here (RAY_worker_niceness=0; Ray's default is +15), as the single-process runs do.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import machine, write

from clfjudge.data import sources

REPO = Path(__file__).resolve().parents[1]


def tiny_judge(root: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_judges import make_judge

    from clfjudge import testing

    return make_judge(testing.tiny_bert(root / "tiny-bert"), root / "judge")


def write_shards(source: str, n: int, shards: int, chunk_size: int, root: Path) -> tuple[Path, Path]:
    records = [r for r in sources.load(source).records if r.arity == "pair"][:n]
    if len(records) < n:
        raise SystemExit(f"{source} has {len(records)} pairs, fewer than --n {n}")
    per = n // shards
    if per % chunk_size or n % shards:
        raise SystemExit(f"--n / --shards ({n} / {shards}) must be a multiple of --chunk-size {chunk_size}")
    lines = [json.dumps({k: v for k, v in {"id": r.id, "question": r.question, "answer_a": r.answer_a,
                                           "answer_b": r.answer_b, "rubric": r.rubric,
                                           "reference": r.reference}.items() if v is not None}) + "\n"
             for r in records]
    (root / "shards").mkdir()
    for i in range(shards):
        (root / "shards" / f"part-{i:03d}.jsonl").write_text("".join(lines[i * per:(i + 1) * per]))
    (root / "all.jsonl").write_text("".join(lines))
    return root / "shards", root / "all.jsonl"


def timed(args: list[str]) -> tuple[float, str]:
    # Ray starts its workers 15 steps nicer than the driver (so the driver and raylet keep priority); next to the
    # other jobs of a shared machine that starves the judge actors. Every configuration runs at one niceness.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "RAY_worker_niceness": "0"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "clfjudge.cli", *args], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"clfjudge {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, done.stdout.splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--judge", type=Path, help="judge directory (default: the tests' tiny BERT judge)")
    p.add_argument("--source", default="hh-rlhf")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv)
    meta = machine(threads=2)

    with tempfile.TemporaryDirectory(prefix="ray-scale-") as tmp:
        root = Path(tmp)
        judge = args.judge or tiny_judge(root)
        shard_dir, whole = write_shards(args.source, args.n, args.shards, args.chunk_size, root)
        common = ["--chunk-size", str(args.chunk_size)]
        rows: list[dict[str, Any]] = []
        configs = [("single process, 1 thread", ["--threads", "1"], None),
                   ("single process, 2 threads", ["--threads", "2"], None)]
        configs += [(f"ray, {k} actor{'s' if k > 1 else ''} (1 thread each)", ["--engine", "ray", "--actors", str(k)],
                     k) for k in args.actors]
        reference = None
        for name, extra, actors in configs:
            for repeat in range(args.repeats):
                out = root / f"out-{len(rows)}"
                load = os.getloadavg()[0]  # other jobs share this machine: what each row ran beside
                if actors is None:
                    seconds, summary = timed(["score", str(judge), "--input", str(whole), "--output",
                                              str(out.with_suffix(".jsonl")), *common, *extra])
                    produced = out.with_suffix(".jsonl").read_bytes()
                else:
                    seconds, summary = timed(["score", str(judge), "--input", str(shard_dir), "--output", str(out),
                                              *common, *extra])
                    produced = b"".join(p.read_bytes() for p in sorted(out.glob("part-*.jsonl")))
                reference = reference or produced
                rows.append({"config": name, "repeat": repeat, "loadavg_1min_before": load, "seconds": seconds,
                             "pairs_per_s": args.n / seconds,
                             "summary": summary, "identical_to_single_process": produced == reference})
                print(f"{name}: {seconds:.1f} s, {args.n / seconds:.1f} pairs/s, identical "
                      f"{produced == reference}", file=sys.stderr)

    report = {"machine": meta, "judge": str(args.judge) if args.judge else "tests/tiny_judges.py tiny BERT (random)",
              "source": args.source, "n": args.n, "shards": args.shards, "chunk_size": args.chunk_size, "rows": rows}
    base = rows[0]["seconds"]
    lines = [f"# `clfjudge score`: single process vs `--engine ray` ({meta['date'][:10]})", "",
             f"{args.n} real pairs of {args.source} (first N) in {args.shards} JSONL shards; judge: "
             f"{report['judge']}; --chunk-size {args.chunk_size}. Machine: {meta['cpu']}, {meta['cores']} cores, "
             f"load average at start {', '.join(f'{x:.1f}' for x in meta['loadavg_at_start'])} (shared with other "
             f"jobs); commit {meta['commit']}. Each row is `clfjudge score` in a subprocess, timed end to end "
             "(interpreter, judge load, and for Ray a local instance and its actors started); Ray's workers at the "
             "driver's niceness (RAY_worker_niceness=0).", "",
             "| configuration | load avg before | wall s | pairs/s | vs single process, 1 thread | output identical |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['loadavg_1min_before']:.1f} | {r['seconds']:.1f} | "
                     f"{r['pairs_per_s']:.1f} | {base / r['seconds']:.2f}x | "
                     f"{'yes' if r['identical_to_single_process'] else 'NO'} |")
    print(write("ray_scale", report, "\n".join(lines) + "\n"))
    return 0 if all(r["identical_to_single_process"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
