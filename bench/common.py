"""What every benchmark records: date, machine, threads, load, commit; and where results go."""
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


def write(name: str, data: dict[str, Any], markdown: str) -> Path:
    day = data["machine"]["date"][:10]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}_{day}.json").write_text(json.dumps(data, indent=2, default=float) + "\n")
    path = RESULTS / f"{name}_{day}.md"
    path.write_text(markdown)
    return path


def vs_longer_cell(d: dict[str, Any] | None) -> str:
    """A table cell for a paired difference to longer-answer-wins (metrics.paired_difference)."""
    if not d:
        return "-"
    return f"{d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] ({d['won']} / {d['lost']})"
