"""A bounded least-recently-used cache."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING = object()


@dataclass
class CacheStats:
    """Lookup counters of one cache."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        """Hits over all lookups; 0.0 before the first lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


class LRUCache(Generic[K, V]):
    """Maps keys to values, holding at most `capacity` entries.

    Both `get` and `put` mark a key as most recently used; when a new key does not fit,
    the least recently used one is evicted.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.stats = CacheStats()
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Membership test that neither counts as a lookup nor refreshes recency."""
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        """Keys from least to most recently used."""
        return iter(list(self._entries))

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value for `key` (marking it most recently used), else `default`."""
        value = self._entries.get(key, _MISSING)
        if value is _MISSING:
            self.stats.misses += 1
            return default
        self.stats.hits += 1
        self._entries.move_to_end(key)
        return value  # type: ignore[return-value]

    def put(self, key: K, value: V) -> K | None:
        """Stores `value`; returns the evicted key, if one had to go."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self._entries[key] = value
            return None
        self._entries[key] = value
        if len(self._entries) > self.capacity:
            evicted, _ = self._entries.popitem(last=False)
            self.stats.evictions += 1
            return evicted
        return None

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Removes `key` and returns its value, or `default` if it is absent."""
        return self._entries.pop(key, default)

    def peek(self, key: K, default: V | None = None) -> V | None:
        """The value for `key` without touching recency or statistics."""
        return self._entries.get(key, default)

    def resize(self, capacity: int) -> list[K]:
        """Changes the capacity, evicting least recently used keys that no longer fit."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        evicted: list[K] = []
        while len(self._entries) > capacity:
            key, _ = self._entries.popitem(last=False)
            evicted.append(key)
        self.stats.evictions += len(evicted)
        return evicted

    def clear(self) -> None:
        """Drops every entry; statistics are kept."""
        self._entries.clear()
