"""Running and moving averages."""

from collections import deque
from collections.abc import Iterable


def running_mean(values: Iterable[float]) -> list[float]:
    """The mean of the first 1, 2, ... n values."""
    means = []
    total = 0.0
    for count, value in enumerate(values, start=1):
        total += value
        means.append(total / count)
    return means


def moving_average(values: Iterable[float], window: int) -> list[float]:
    """Means of every full window of `window` consecutive values."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    recent: deque[float] = deque()
    total = 0.0
    averages = []
    for value in values:
        recent.append(value)
        total += value
        if len(recent) > window:
            total -= recent.popleft()
        if len(recent) == window:
            averages.append(total / window)
    return averages
