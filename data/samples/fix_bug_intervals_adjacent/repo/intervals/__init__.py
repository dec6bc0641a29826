"""intervals: half-open intervals and normalized interval sets."""

from intervals.interval import Interval
from intervals.intervalset import IntervalSet

__all__ = ["Interval", "IntervalSet"]
