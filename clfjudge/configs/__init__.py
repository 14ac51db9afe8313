"""Configuration the library ships as package data, so that a plain ``pip install`` has it: the parity gate's
thresholds (parity.yaml), int8 settings per CPU (int8.yaml), the ZeRO-2 config (ds_zero2.json) and the main
job's default recipe (recipes/main-smollm2.yaml, and the whole-pool main-smollm2-pool.yaml beside it)."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def config_path(name: str) -> Path:
    """The bundled file ``name`` ("parity.yaml", "recipes/main-smollm2.yaml") as a filesystem path; wheels
    install unpacked, and DeepSpeed and the recipe loader want a path. A file missing from the install fails here."""
    path = Path(str(resources.files(__name__).joinpath(name)))
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not in clfjudge's package data ({path.parent}): a broken install?")
    return path
