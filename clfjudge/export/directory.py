"""Where an export is written: a new directory (refused if it holds anything), filled under a hidden name beside it
and renamed into place once the parity gate passed, and what an exporter returns."""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..outputs import check_writable


@dataclass
class ExportResult:
    out_dir: Path
    primary: str
    report: dict[str, Any]


def check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"output {out} already exists and is not an empty directory; remove it or pick another --out")
    check_writable(out, directory=True)  # before the export's work, not after it
    out.parent.mkdir(parents=True, exist_ok=True)


def hidden_beside(out: Path) -> Path:
    """A new hidden name beside ``out`` for the folder an export fills, then renames to ``out``. Made inside the
    export's ``try`` (not by ``mkdtemp`` before it), so a stop at any moment (Ctrl-C, SIGTERM) finds it removable."""
    return out.parent / f".{out.name}.{secrets.token_hex(6)}"
