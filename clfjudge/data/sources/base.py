"""The source registry: one small loader per official file format.

A ``Source`` names a data set, its arity (pair / point), its role (test / train), the default file(s)
under the data root, and a loader ``path -> LoadResult``. Adding a source is one module + one
``SOURCES.register`` call; ``clfjudge.data.sources.load(name)`` is the only entry point callers need.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...paths import data_root
from ...registry import Registry
from ..records import LoadResult


@dataclass(frozen=True)
class Source:
    name: str
    arity: str  # "pair" | "point"
    role: str  # "test" | "train" | "probe"
    default_path: str  # relative to the data root (file or directory)
    loader: Callable[[Path], LoadResult]
    license: str = ""
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    # answer_a is always the same (baseline) model: the answer order predicts the label, a shortcut an
    # order-sensitive judge must not be trained on without ``randomize_order`` (training/data.py)
    fixed_order: bool = False

    def path(self, root: Path | None = None) -> Path:
        return (root or data_root()) / self.default_path

    def available(self, root: Path | None = None) -> bool:
        return self.path(root).exists()

    def load(self, path: Path | str | None = None) -> LoadResult:
        p = Path(path) if path is not None else self.path()
        if not p.exists():
            raise FileNotFoundError(
                f"source {self.name!r}: {p} does not exist (point clfjudge at the official file with "
                f"--path, or set CLFJUDGE_DATA to the data root)"
            )
        result = self.loader(p)
        for rec in result.records:
            if rec.source != self.name:
                raise AssertionError(f"loader of {self.name!r} produced a record with source {rec.source!r}")
        return result


SOURCES: Registry[Source] = Registry("source")
