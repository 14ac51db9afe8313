"""Data sources: ``load(name)``, ``SOURCES`` (the registry). Each module registers its loaders."""
from __future__ import annotations

import importlib

from .base import SOURCES, Source

# One line per source module.
_MODULES = [
    "pandalm",
    "autoj",
    "judgelm",
    "prometheus",
    "llmbar",
    "mtbench",
    "alpacaeval",
    "arena",
    "hh_rlhf",
    "llmeval2",
    "ultrafeedback",
]
for _m in _MODULES:
    importlib.import_module(f"{__name__}.{_m}")


def load(name: str, path=None):
    return SOURCES.get(name).load(path)


__all__ = ["SOURCES", "Source", "load"]
