import pytest

from cachekit import CacheStats, LRUCache, TTLCache, memoize
from cachekit.memo import make_key


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lru_get_and_put():
    cache = LRUCache(2)
    assert cache.put("a", 1) is None
    assert cache.get("a") == 1
    assert cache.get("zz", "default") == "default"
    assert len(cache) == 1


def test_lru_evicts_least_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")
    assert cache.put("c", 3) == "b"
    assert list(cache) == ["a", "c"]
    assert cache.stats.evictions == 1


def test_lru_put_existing_key_refreshes_without_eviction():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.put("a", 10) is None
    assert list(cache) == ["b", "a"]
    assert cache.peek("a") == 10
    assert cache.put("c", 3) == "b"


def test_lru_exactly_at_capacity_keeps_everything():
    cache = LRUCache(3)
    for key in "abc":
        assert cache.put(key, key) is None
    assert len(cache) == 3


def test_lru_stats_and_hit_rate():
    cache = LRUCache(2)
    assert cache.stats.hit_rate == 0.0
    cache.put("a", 1)
    cache.get("a")
    cache.get("a")
    cache.get("b")
    assert (cache.stats.hits, cache.stats.misses) == (2, 1)
    assert cache.stats.hit_rate == pytest.approx(2 / 3)


def test_lru_contains_and_peek_do_not_touch_recency_or_stats():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert "a" in cache
    assert "x" not in cache
    assert cache.peek("a") == 1
    assert cache.peek("x", 0) == 0
    assert cache.put("c", 3) == "a"
    assert cache.stats == CacheStats(hits=0, misses=0, evictions=1)


def test_lru_pop_and_clear():
    cache = LRUCache(3)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.pop("a") == 1
    assert cache.pop("a", "gone") == "gone"
    cache.clear()
    assert len(cache) == 0


def test_lru_resize_evicts_oldest():
    cache = LRUCache(4)
    for index, key in enumerate("abcd"):
        cache.put(key, index)
    assert cache.resize(2) == ["a", "b"]
    assert cache.capacity == 2
    assert list(cache) == ["c", "d"]
    assert cache.stats.evictions == 2
    assert cache.resize(5) == []


@pytest.mark.parametrize("capacity", [0, -1])
def test_lru_rejects_bad_capacity(capacity):
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        LRUCache(capacity)
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        LRUCache(1).resize(capacity)


def test_lru_accepts_capacity_one():
    cache = LRUCache(1)
    cache.put("a", 1)
    assert cache.put("b", 2) == "a"
    assert cache.resize(1) == []


def test_ttl_entry_visible_until_deadline():
    clock = FakeClock()
    cache = TTLCache(ttl=10, clock=clock)
    cache.put("a", 1)
    clock.now += 9.999
    assert cache.get("a") == 1
    clock.now += 0.001
    assert cache.get("a") is None
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_ttl_put_restarts_lifetime():
    clock = FakeClock()
    cache = TTLCache(ttl=10, clock=clock)
    cache.put("a", 1)
    clock.now += 8
    cache.put("a", 2)
    clock.now += 8
    assert cache.get("a") == 2
    assert cache.remaining("a") == pytest.approx(2)


def test_ttl_len_counts_live_entries_only():
    clock = FakeClock()
    cache = TTLCache(ttl=5, clock=clock)
    cache.put("a", 1)
    clock.now += 3
    cache.put("b", 2)
    assert len(cache) == 2
    clock.now += 2
    assert len(cache) == 1


def test_ttl_remaining_and_purge():
    clock = FakeClock()
    cache = TTLCache(ttl=5, clock=clock)
    assert cache.remaining("a") == 0.0
    cache.put("a", 1)
    cache.put("b", 2)
    clock.now += 5
    assert cache.remaining("a") == 0.0
    cache.put("c", 3)
    assert cache.purge_expired() == 2
    assert cache.get("c") == 3


def test_ttl_max_size_purges_expired_before_dropping_live():
    clock = FakeClock()
    cache = TTLCache(ttl=5, clock=clock, max_size=2)
    cache.put("old", 0)
    clock.now += 5
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    assert cache.get("b") == 2
    assert cache.stats.evictions == 0


def test_ttl_max_size_drops_oldest_write():
    clock = FakeClock()
    cache = TTLCache(ttl=50, clock=clock, max_size=2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 3)
    cache.put("c", 4)
    assert cache.get("b") is None
    assert cache.get("a") == 3
    assert cache.stats.evictions == 1


def test_ttl_max_size_one_keeps_latest():
    cache = TTLCache(ttl=5, clock=FakeClock(), max_size=1)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") is None
    assert cache.get("b") == 2


def test_ttl_rejects_bad_arguments():
    with pytest.raises(ValueError, match="ttl must be positive"):
        TTLCache(ttl=0)
    with pytest.raises(ValueError, match="max_size"):
        TTLCache(ttl=1, max_size=0)


def test_memoize_caches_results():
    calls = []

    @memoize(capacity=2)
    def square(x):
        calls.append(x)
        return x * x

    assert square(3) == 9
    assert square(3) == 9
    assert calls == [3]
    assert square.cache.stats.hits == 1
    assert square.__name__ == "square"


def test_memoize_caches_none_and_respects_capacity():
    calls = []

    @memoize(capacity=1)
    def nothing(x):
        calls.append(x)

    nothing(1)
    nothing(1)
    nothing(2)
    nothing(1)
    assert calls == [1, 2, 1]


def test_make_key_ignores_keyword_order_and_rejects_unhashable():
    assert make_key((1,), {"a": 1, "b": 2}) == make_key((1,), {"b": 2, "a": 1})
    assert make_key((1,), {}) != make_key((), {"x": 1})
    with pytest.raises(TypeError, match="must be hashable"):
        make_key(([1],), {})
