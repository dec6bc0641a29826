"""A cache whose entries expire a fixed time after they are written."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from cachekit.lru import CacheStats

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Clock = Callable[[], float]


class TTLCache(Generic[K, V]):
    """Maps keys to values that live for `ttl` seconds after their last write.

    An entry written at time t is visible while `clock() < t + ttl`. The clock defaults
    to `time.monotonic`; tests pass a fake one. An optional `max_size` bounds the cache:
    expired entries are purged first, then the oldest writes are dropped.
    """

    def __init__(self, ttl: float, clock: Clock = time.monotonic, max_size: int | None = None) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        if max_size is not None and max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self.ttl = ttl
        self.max_size = max_size
        self.stats = CacheStats()
        self._clock = clock
        self._entries: dict[K, tuple[float, V]] = {}

    def __len__(self) -> int:
        """Number of live (unexpired) entries."""
        now = self._clock()
        return sum(1 for expires_at, _ in self._entries.values() if now < expires_at)

    def get(self, key: K, default: V | None = None) -> V | None:
        """The live value for `key`, else `default`; an expired entry is removed."""
        entry = self._entries.get(key)
        if entry is not None:
            expires_at, value = entry
            if self._clock() < expires_at:
                self.stats.hits += 1
                return value
            del self._entries[key]
        self.stats.misses += 1
        return default

    def put(self, key: K, value: V) -> None:
        """Stores `value`, restarting its lifetime."""
        self._entries.pop(key, None)
        self._entries[key] = (self._clock() + self.ttl, value)
        if self.max_size is not None and len(self._entries) > self.max_size:
            self.purge_expired()
            while len(self._entries) > self.max_size:
                oldest = next(iter(self._entries))
                del self._entries[oldest]
                self.stats.evictions += 1

    def remaining(self, key: K) -> float:
        """Seconds until `key` expires; 0.0 if it is absent or already expired."""
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        return max(entry[0] - self._clock(), 0.0)

    def purge_expired(self) -> int:
        """Removes every expired entry and returns how many there were."""
        now = self._clock()
        expired = [key for key, (expires_at, _) in self._entries.items() if now >= expires_at]
        for key in expired:
            del self._entries[key]
        return len(expired)
