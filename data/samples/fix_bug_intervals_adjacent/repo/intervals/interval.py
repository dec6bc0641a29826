"""A half-open interval of numbers."""

from __future__ import annotations

from dataclasses import dataclass

Number = int | float


@dataclass(frozen=True, order=True)
class Interval:
    """The numbers `x` with `start <= x < end`; an interval with `start == end` is empty.

    Ordering compares `(start, end)`, which is what sorting a set of intervals needs.
    """

    start: Number
    end: Number

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval end {self.end} is before its start {self.start}")

    def __repr__(self) -> str:
        return f"Interval({self.start}, {self.end})"

    @property
    def length(self) -> Number:
        return self.end - self.start

    def is_empty(self) -> bool:
        return self.start == self.end

    def contains(self, point: Number) -> bool:
        """Whether `point` lies inside; the end itself is outside."""
        return self.start <= point < self.end

    def overlaps(self, other: Interval) -> bool:
        """Whether the two share at least one point (merely touching does not count)."""
        return self.start < other.end and other.start < self.end

    def touches(self, other: Interval) -> bool:
        """Whether they overlap or are adjacent, i.e. their union is one interval."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other: Interval) -> Interval | None:
        """The common part, or None when they do not overlap."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def span(self, other: Interval) -> Interval:
        """The smallest interval covering both."""
        return Interval(min(self.start, other.start), max(self.end, other.end))

    def subtract(self, other: Interval) -> list[Interval]:
        """The parts of self outside `other`: zero, one or two non-empty intervals."""
        if not self.overlaps(other):
            return [self] if not self.is_empty() else []
        pieces = []
        if self.start < other.start:
            pieces.append(Interval(self.start, other.start))
        if other.end < self.end:
            pieces.append(Interval(other.end, self.end))
        return pieces
