"""A memoizing decorator backed by `LRUCache`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, ParamSpec, TypeVar

from cachekit.lru import LRUCache

P = ParamSpec("P")
R = TypeVar("R")


def make_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """A cache key for a call; keyword order does not matter.

    Raises:
        TypeError: naming the argument that is not hashable.
    """
    key = (args, tuple(sorted(kwargs.items())))
    try:
        hash(key)
    except TypeError:
        raise TypeError(f"memoized arguments must be hashable, got {args!r} {kwargs!r}") from None
    return key


def memoize(capacity: int = 128) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Caches a function's results by its arguments, keeping the `capacity` most recent.

    The wrapped function exposes its cache as `.cache` (an `LRUCache`).
    """

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        cache: LRUCache[Hashable, R] = LRUCache(capacity)
        # A sentinel tells a cached None apart from a miss.
        missing = object()

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            key = make_key(args, kwargs)
            cached = cache.get(key, missing)  # type: ignore[arg-type]
            if cached is not missing:
                return cached  # type: ignore[return-value]
            result = function(*args, **kwargs)
            cache.put(key, result)
            return result

        wrapper.cache = cache  # type: ignore[attr-defined]
        return wrapper

    return decorate
