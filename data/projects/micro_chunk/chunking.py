"""Chunks and sliding windows over lists."""

from typing import TypeVar

T = TypeVar("T")


def chunk(items: list[T], size: int) -> list[list[T]]:
    """Consecutive pieces of `size` items; the last piece may be shorter."""
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    return [items[start : start + size] for start in range(0, len(items), size)]


def sliding_window(items: list[T], size: int, step: int = 1) -> list[list[T]]:
    """Every full window of `size` items, starting `step` items apart."""
    if size < 1 or step < 1:
        raise ValueError(f"size and step must be at least 1, got {size} and {step}")
    return [items[start : start + size] for start in range(0, len(items) - size + 1, step)]


def pad_chunks(items: list[T], size: int, fill: T) -> list[list[T]]:
    """Like `chunk`, but the last piece is padded with `fill` to full size."""
    pieces = chunk(items, size)
    if pieces and len(pieces[-1]) < size:
        pieces[-1] = pieces[-1] + [fill] * (size - len(pieces[-1]))
    return pieces
