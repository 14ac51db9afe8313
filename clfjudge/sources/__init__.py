"""Data sources: ``load(name)``, ``SOURCES`` (the registry). Each module registers its loaders."""
from __future__ import annotations

import importlib

from .base import SOURCES, Source

# One line per source module.
_MODULES = [
]
for _m in _MODULES:
    importlib.import_module(f"{__name__}.{_m}")


def load(name: str, path=None):
    return SOURCES.get(name).load(path)


__all__ = ["SOURCES", "Source", "load"]
