"""A tiny name -> object registry, shared by sources, schemes, parsers, heads and audit suites.

Adding a data source (or scheme, parser, ...) is adding one module that calls ``REGISTRY.register``;
nothing else branches on names. An entry can also be a lazy target, ``"package.module:attribute"`` (read with
``resolve``): a low module names what a higher one implements without importing it, so imports stay one-way.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T | None = None):
        """Register ``item`` under ``name``; usable as ``reg.register(name, obj)`` or as a decorator."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return add(item) if item is not None else add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(sorted(self._items.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)


def lazy(factory: Callable[[], T]) -> Callable[[], T]:
    """Memoise a zero-argument factory (for things too heavy to build at import time)."""
    cache: list[T] = []

    def get() -> T:
        if not cache:
            cache.append(factory())
        return cache[0]

    return get


def resolve(target: Any) -> Any:
    """A lazy registry entry ``"package.module:attribute"`` -> the attribute, importing its module on first use;
    an entry that is not a string (the function itself) is returned as it is."""
    if not isinstance(target, str):
        return target
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"lazy target {target!r}: expected 'package.module:attribute'")
    return getattr(importlib.import_module(module), attr)
