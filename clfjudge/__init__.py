"""clfjudge: classifier judges for LLM evaluation.

Importing the package is cheap and never touches the network; heavy libraries load on first use: the public
names below are resolved lazily (PEP 562), so ``import clfjudge`` imports none of torch, transformers or sklearn.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> "module:attribute"
_LAZY = {
    "Judge": "clfjudge.judges.base:Judge",
    "TrainConfig": "clfjudge.training.config:TrainConfig",
    "train": "clfjudge.training.trainer:train",
    "export_judge": "clfjudge.export.onnx:export_judge",
    "run_audit": "clfjudge.audit:run_audit",
    "reward_function": "clfjudge.serving.reward:reward_function",
    "best_of_n": "clfjudge.serving.reward:best_of_n",
}
__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'clfjudge' has no attribute {name!r}")
    module, _, attr = _LAZY[name].partition(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
