"""Embeddings cached on disk between runs: ``$CLFJUDGE_EMBEDDING_CACHE/<embedder identity>/shard-*.npz``.

Reading thousands of answers with a frozen decoder costs minutes of CPU; the vectors depend only on the
embedder's identity (``cache_id``: model, layer, budgets, statistics, precision) and the text. An embedder with a
cache directory loads every shard of its identity on first use and appends one shard per batch of new vectors
(written to a temporary name and renamed, so a killed run leaves no half-written shard). Shards are plain
arrays (``allow_pickle=False``); the identity is checked on load. ``CachedEmbedder`` is the base every embedder
keeps its vectors through (memory, disk, ``.npz`` files, ``scratch``).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

ENV = "CLFJUDGE_EMBEDDING_CACHE"
DEFAULT_MEMORY_ITEMS = 65_536  # vectors an embedder keeps in memory (a training pool's texts fit; an RL loop's don't)


class MemoryCache(OrderedDict):
    """An embedder's vectors in memory, least recently used first: beyond ``max_items`` (None: no bound) the
    oldest are forgotten, so a judge in a long RL loop reading ever new completions keeps a bounded memory (a
    forgotten text is read again if it comes back)."""

    def __init__(self, max_items: int | None = DEFAULT_MEMORY_ITEMS) -> None:
        super().__init__()
        self.max_items = max_items

    @property
    def max_items(self) -> int | None:
        return self._max_items

    @max_items.setter
    def max_items(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"the in-memory cache holds a positive number of vectors (or None: no bound), got "
                             f"{value!r}")
        self._max_items = value
        self._evict()

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        self._evict()

    def update(self, items=(), /, **kw) -> None:
        for key, value in (items.items() if hasattr(items, "items") else items):
            self[key] = value

    def _evict(self) -> None:
        while self._max_items is not None and len(self) > self._max_items:
            self.popitem(last=False)

    def known(self, keys: Iterable[str]) -> dict[str, np.ndarray]:
        """The cached vectors of ``keys`` (marked as recently used)."""
        return {k: self[k] for k in dict.fromkeys(keys) if k in self}


def default_root() -> Path:
    """Where ``clfjudge run`` and the benches keep embeddings unless $CLFJUDGE_EMBEDDING_CACHE says otherwise."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "clfjudge" / "embeddings"


def cache_root(explicit: str | Path | None = None) -> Path | None:
    value = explicit if explicit is not None else os.environ.get(ENV)
    return Path(value) if value else None


class DiskCache:
    def __init__(self, root: Path, cache_id: str) -> None:
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in cache_id)[:80]
        self.cache_id = cache_id
        self.directory = Path(root) / f"{slug}-{hashlib.blake2b(cache_id.encode(), digest_size=6).hexdigest()}"

    def load_into(self, cache: dict[str, np.ndarray]) -> int:
        """Add every stored vector to ``cache``; returns how many were added."""
        before = len(cache)
        for shard in sorted(self.directory.glob("shard-*.npz")):
            with np.load(shard, allow_pickle=False) as data:
                if str(data["encoder"]) != self.cache_id:
                    raise ValueError(f"{shard}: embedding cache of {str(data['encoder'])!r}, not {self.cache_id!r}")
                cache.update(zip(data["keys"].tolist(), data["vectors"]))
        return len(cache) - before

    def append(self, keys: list[str], vectors: np.ndarray) -> Path | None:
        if not keys:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        digest = hashlib.blake2b("".join(keys).encode(), digest_size=8).hexdigest()
        path = self.directory / f"shard-{digest}.npz"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            np.savez(f, keys=np.array(keys, dtype="U32"), vectors=np.asarray(vectors), encoder=np.array(self.cache_id))
        tmp.replace(path)
        return path


class Cached:
    """What an embedder needs from the disk cache: ``load`` once before its first lookup (if a cache directory
    is set), ``store`` what it computed."""

    def __init__(self, cache_dir: str | Path | None) -> None:
        self.cache_dir = cache_dir
        self._disk: DiskCache | None = None
        self._opened = False
        self._paused = False  # inside ``scratch``: nothing is stored

    def load(self, cache_id: str, memory: dict[str, np.ndarray]) -> None:
        if not self._opened:
            self._opened = True
            root = cache_root(self.cache_dir)
            if root is not None:
                self._disk = DiskCache(root, cache_id)
                self._disk.load_into(memory)

    def store(self, keys: list[str], vectors: np.ndarray) -> None:
        if self._disk is not None and not self._paused:
            self._disk.append(keys, vectors)


@contextlib.contextmanager
def scratch(embedder: CachedEmbedder):
    """Readings ``embedder`` makes inside are forgotten when it ends: none is stored on disk, and those it added to
    its in-memory cache are removed (a judge's warm-up reads made-up texts that no user asked for). The disk cache
    is loaded first, so what it holds stays in memory."""
    embedder.cached(())
    before = set(embedder.memory)
    embedder._disk._paused = True
    try:
        yield
    finally:
        embedder._disk._paused = False
        for key in set(embedder.memory) - before:
            del embedder.memory[key]


class CachedEmbedder:
    """What every embedder shares: its vectors in memory (``MemoryCache``, bounded by ``memory_items``) and on disk
    (``cache_dir``, default $CLFJUDGE_EMBEDDING_CACHE if set), under its identity ``cache_id``. A subclass reads
    the vectors ``cached`` does not hold and hands them to ``store``."""

    cache_id: str  # the embedder's identity: what its vectors depend on besides the text

    def __init__(self, cache_dir: str | Path | None = None, memory_items: int | None = DEFAULT_MEMORY_ITEMS) -> None:
        self._cache = MemoryCache(memory_items)  # least recently used vectors forgotten beyond memory_items
        self._disk = Cached(cache_dir)

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def memory(self) -> MemoryCache:
        """The in-memory vectors; ``memory.max_items`` bounds them (least recently used forgotten first)."""
        return self._cache

    def cached(self, keys: Iterable[str]) -> dict[str, np.ndarray]:
        """The vectors of ``keys`` held in memory, the disk cache loaded into memory on first use."""
        self._disk.load(self.cache_id, self._cache)
        return self._cache.known(keys)

    def store(self, keys: list[str], vectors: np.ndarray) -> None:
        """Keep newly read vectors in memory and on disk."""
        self._cache.update(zip(keys, vectors))
        self._disk.store(list(keys), vectors)

    def clear_cache(self) -> None:
        """Forget every stored vector (a long-running judge can bound its memory this way)."""
        self._cache.clear()

    def scratch(self):
        """A context whose readings are forgotten when it ends (``cache.scratch``)."""
        return scratch(self)

    def save_cache(self, path: str | Path) -> Path:
        return save_vectors(path, self._cache, self.cache_id)

    def load_cache(self, path: str | Path) -> int:
        """Add the vectors stored at ``path``; returns how many were added. The file must come from an embedder
        with the same identity."""
        return load_vectors(path, self._cache, self.cache_id)


def save_vectors(path: str | Path, cache: dict[str, np.ndarray], cache_id: str) -> Path:
    """Write an embedder's cache (hash key -> vector) to ``path`` (.npz), tagged with the embedder's identity."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(cache)
    matrix = np.stack([cache[k] for k in keys]) if keys else np.zeros((0, 0), np.float32)
    with open(path, "wb") as f:  # a file object keeps numpy from appending ".npz" to the name
        np.savez(f, keys=np.array(keys, dtype="U32"), vectors=matrix, encoder=np.array(cache_id))
    return path


def load_vectors(path: str | Path, cache: dict[str, np.ndarray], cache_id: str) -> int:
    """Add the vectors stored at ``path`` to ``cache``; returns how many were added. The file must come from
    an embedder with the same identity (encoder spec and, for decoders, layer and truncation)."""
    with np.load(path) as data:
        stored = str(data["encoder"])
        if stored != cache_id:
            raise ValueError(f"{path}: embedding cache of encoder {stored!r}, not {cache_id!r}")
        before = len(cache)
        cache.update(zip(data["keys"].tolist(), data["vectors"]))
    return len(cache) - before
