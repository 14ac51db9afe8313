"""What the benchmarks share: what every run records (date, machine, threads, load, commit) and where results
go. Benchmarks import the library and this module only."""
from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clfjudge.machine import cpu_model, matmul_flags

RESULTS = Path(__file__).resolve().parent / "results"


def machine(threads: int) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=RESULTS.parent).stdout.strip()
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu": cpu_model(),
            "matmul_flags": matmul_flags(), "cores": os.cpu_count(), "threads": threads,
            "loadavg_at_start": os.getloadavg(), "commit": commit,
            "python": platform.python_version()}


def write(name: str, data: dict[str, Any], markdown: str, results: Path = RESULTS) -> Path:
    """``results/NAME_DATE.json`` and ``.md``, dated by the run's start (``data["machine"]["date"]``)."""
    day = data["machine"]["date"][:10]
    results.mkdir(exist_ok=True)
    (results / f"{name}_{day}.json").write_text(json.dumps(data, indent=2, default=float) + "\n")
    path = results / f"{name}_{day}.md"
    path.write_text(markdown)
    return path


def machine_line(m: dict[str, Any], isa_cap: str | None) -> str:
    """The machine a run measured, as its result file's first line says it."""
    cap = f"; oneDNN capped at {isa_cap}" if isa_cap else ""
    return (f"{m['cpu']} ({', '.join(m['matmul_flags'])}), {m['threads']} threads (pinned){cap}; commit "
            f"{m['commit']}; load at start {m['loadavg_at_start'][0]:.2f}.")


def write_run(stem: str, model: str, isa_cap: str | None, data: dict[str, Any], markdown: str,
              results: Path | None = None) -> Path:
    """``write`` under ``STEM_MODEL[_ISA CAP]``: a model's run, named by the oneDNN cap it ran under if any."""
    name = f"{stem}_{Path(model).name}" + (f"_{isa_cap.lower()}" if isa_cap else "")
    return write(name, data, markdown, results or RESULTS)


def path_rows(rows: dict[str, dict[str, Any]], base: float | None, columns: int, cells) -> list[str]:
    """Markdown rows of a per-path speed table: the path, answers/s, the ratio to ``base`` and ``cells(row)`` (the
    path's own columns, already joined); a path that did not run says why across ``columns`` columns."""
    out = []
    for path, r in rows.items():
        if "answers_per_s" not in r:
            out.append(f"| {path} | {r.get('skipped') or 'failed: ' + r.get('failed', '')} |" + " |" * (columns - 2))
            continue
        ratio = f"{r['answers_per_s'] / base:.2f}x" if base else "-"
        out.append(f"| {path} | {r['answers_per_s']:.2f} | {ratio} | {cells(r)} |")
    return out
