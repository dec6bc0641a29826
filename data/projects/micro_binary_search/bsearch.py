"""Binary search over a sorted list."""

from collections.abc import Sequence


def lower_bound(items: Sequence[int], target: int) -> int:
    """The first index whose item is >= target (len(items) if there is none)."""
    low, high = 0, len(items)
    while low < high:
        middle = (low + high) // 2
        if items[middle] < target:
            low = middle + 1
        else:
            high = middle
    return low


def upper_bound(items: Sequence[int], target: int) -> int:
    """The first index whose item is > target (len(items) if there is none)."""
    low, high = 0, len(items)
    while low < high:
        middle = (low + high) // 2
        if items[middle] <= target:
            low = middle + 1
        else:
            high = middle
    return low


def binary_search(items: Sequence[int], target: int) -> int:
    """The index of the first occurrence of `target`, or -1."""
    index = lower_bound(items, target)
    if index < len(items) and items[index] == target:
        return index
    return -1


def count_occurrences(items: Sequence[int], target: int) -> int:
    return upper_bound(items, target) - lower_bound(items, target)
