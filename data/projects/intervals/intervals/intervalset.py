"""A set of numbers stored as sorted, disjoint, non-adjacent intervals."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from intervals.interval import Interval, Number


class IntervalSet:
    """A union of intervals kept normalized: sorted, non-empty, and with touching intervals merged.

    Normalization makes equality structural: two sets covering the same points compare equal.
    """

    def __init__(self, intervals: Iterable[Interval] = ()) -> None:
        self._intervals: list[Interval] = []
        for interval in intervals:
            self.add(interval)

    def __iter__(self) -> Iterator[Interval]:
        return iter(self._intervals)

    def __len__(self) -> int:
        """Number of disjoint intervals (not the number of points)."""
        return len(self._intervals)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntervalSet):
            return NotImplemented
        return self._intervals == other._intervals

    def __repr__(self) -> str:
        return f"IntervalSet({self._intervals!r})"

    def __contains__(self, point: Number) -> bool:
        """Whether `point` is covered; binary search over the starts."""
        index = bisect.bisect_right([interval.start for interval in self._intervals], point) - 1
        return index >= 0 and self._intervals[index].contains(point)

    def add(self, interval: Interval) -> None:
        """Adds `interval`, merging it with every interval it touches."""
        if interval.is_empty():
            return
        merged = interval
        kept = []
        for existing in self._intervals:
            if existing.touches(merged):
                merged = merged.span(existing)
            else:
                kept.append(existing)
        bisect.insort(kept, merged)
        self._intervals = kept

    def remove(self, interval: Interval) -> None:
        """Removes the points of `interval`, splitting intervals that straddle it."""
        pieces = []
        for existing in self._intervals:
            pieces.extend(existing.subtract(interval))
        self._intervals = pieces

    def total_length(self) -> Number:
        return sum(interval.length for interval in self._intervals)

    def union(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet([*self._intervals, *other._intervals])

    def intersection(self, other: IntervalSet) -> IntervalSet:
        """Points in both sets, by a merge-style sweep over the two sorted lists."""
        result = []
        left, right = 0, 0
        while left < len(self._intervals) and right < len(other._intervals):
            a, b = self._intervals[left], other._intervals[right]
            common = a.intersection(b)
            if common is not None:
                result.append(common)
            if a.end < b.end:
                left += 1
            else:
                right += 1
        return IntervalSet(result)

    def difference(self, other: IntervalSet) -> IntervalSet:
        result = IntervalSet(self._intervals)
        for interval in other:
            result.remove(interval)
        return result

    def gaps(self, within: Interval) -> list[Interval]:
        """The uncovered parts of `within`, in order."""
        uncovered = IntervalSet([within])
        for interval in self._intervals:
            uncovered.remove(interval)
        return list(uncovered)

    __or__ = union
    __and__ = intersection
    __sub__ = difference
