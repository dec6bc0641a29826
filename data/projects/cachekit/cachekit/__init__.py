"""cachekit: LRU and TTL caches and a memoizing decorator."""

from cachekit.lru import CacheStats, LRUCache
from cachekit.memo import memoize
from cachekit.ttl import TTLCache

__all__ = ["CacheStats", "LRUCache", "TTLCache", "memoize"]
