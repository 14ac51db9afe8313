"""A tiny name -> object registry, shared by sources, schemes, parsers, heads, judge kinds and audit suites.

Adding a data source (or scheme, parser, ...) is adding one module that calls ``REGISTRY.register``;
nothing else branches on names. An entry can also be a lazy target, ``"package.module:attribute"``: a low module
names what a higher one implements without importing it, so imports stay one-way. ``get`` imports it on first use
(as lm-eval's registry does), so a caller never tells a lazy entry from a plain one.
"""
from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
_MISSING = object()


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[Hashable, T | str] = {}  # as registered: an object or a lazy "module:attribute" target
        self._loaded: dict[Hashable, T] = {}  # lazy targets already imported

    def register(self, name: Hashable, item: T | str | None = None):
        """Register ``item`` (or a lazy ``"module:attribute"`` target) under ``name``; usable as
        ``reg.register(name, obj)`` or as a decorator."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            if isinstance(obj, str):
                _split(obj)  # a malformed target is refused now, not at its first use
            self._items[name] = obj
            return obj

        return add(item) if item is not None else add

    def unregister(self, name: Hashable) -> None:
        if name not in self._items:
            self.get(name)  # raises, naming the known ones
        del self._items[name]
        self._loaded.pop(name, None)

    @contextlib.contextmanager
    def override(self, name: Hashable, item: T | str) -> Iterator[T | str]:
        """``item`` under ``name`` inside the block (in place of an entry of that name, if any), and what was
        there before restored after it: for tests, since registries are process-global."""
        before, loaded = self._items.pop(name, _MISSING), self._loaded.pop(name, _MISSING)
        try:
            self.register(name, item)
            yield item
        finally:
            self._items.pop(name, None)
            self._loaded.pop(name, None)
            if before is not _MISSING:
                self._items[name] = before
            if loaded is not _MISSING:
                self._loaded[name] = loaded

    def get(self, name: Hashable) -> T:
        """The entry under ``name``, a lazy target imported (once) and returned as the attribute it names."""
        if name in self._loaded:
            return self._loaded[name]
        try:
            item = self._items[name]
        except KeyError:
            known = ", ".join(map(str, self.names())) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; known: {known}") from None
        if not isinstance(item, str):
            return item
        self._loaded[name] = resolve(item)
        return self._loaded[name]

    def names(self) -> list:
        return sorted(self._items)

    def items(self) -> Iterator[tuple[Any, T]]:
        """Every entry, in name order, lazy targets imported."""
        return iter([(name, self.get(name)) for name in self.names()])

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)


def undone_after(register: Callable[[Any, T], Any], unregister: Callable[[Any], Any]):
    """A context manager ``(name, item)`` that registers ``item`` with ``register`` for the block and undoes it with
    ``unregister`` after it (for tests: the registries are process-global)."""

    @contextlib.contextmanager
    def registered(name: Any, item: T) -> Iterator[T]:
        register(name, item)
        try:
            yield item
        finally:
            unregister(name)

    return registered


def lazy(factory: Callable[[], T]) -> Callable[[], T]:
    """Memoise a zero-argument factory (for things too heavy to build at import time)."""
    cache: list[T] = []

    def get() -> T:
        if not cache:
            cache.append(factory())
        return cache[0]

    return get


def _split(target: str) -> tuple[str, str]:
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"lazy target {target!r}: expected 'package.module:attribute'")
    return module, attr


def resolve(target: Any) -> Any:
    """A lazy target ``"package.module:attribute"`` -> the attribute, importing its module; anything that is not a
    string (the object itself) is returned as it is. ``Registry.get`` calls it for its entries."""
    if not isinstance(target, str):
        return target
    module, attr = _split(target)
    return getattr(importlib.import_module(module), attr)
