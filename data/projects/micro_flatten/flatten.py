"""Flattening nested lists and tuples."""

from typing import Any


def flatten(nested: list[Any] | tuple[Any, ...]) -> list[Any]:
    """Every non-list, non-tuple item of `nested`, at any depth, in order.

    Strings are items, not sequences to descend into.
    """
    flat: list[Any] = []
    for item in nested:
        if isinstance(item, (list, tuple)):
            flat.extend(flatten(item))
        else:
            flat.append(item)
    return flat


def flatten_depth(nested: list[Any], depth: int) -> list[Any]:
    """Removes at most `depth` levels of nesting; depth 0 returns a shallow copy."""
    if depth < 0:
        raise ValueError(f"depth must not be negative, got {depth}")
    flat: list[Any] = []
    for item in nested:
        if isinstance(item, (list, tuple)) and depth > 0:
            flat.extend(flatten_depth(list(item), depth - 1))
        else:
            flat.append(item)
    return flat
