import pytest

from running_mean import moving_average, running_mean


def test_running_mean():
    assert running_mean([2, 4, 6, 8]) == [2.0, 3.0, 4.0, 5.0]
    assert running_mean([5]) == [5.0]
    assert running_mean([]) == []


def test_running_mean_accepts_iterators():
    assert running_mean(iter([1, 0])) == [1.0, 0.5]


def test_moving_average():
    assert moving_average([1, 2, 3, 4, 5], 2) == [1.5, 2.5, 3.5, 4.5]
    assert moving_average([1, 2, 3, 4, 5], 3) == [2.0, 3.0, 4.0]
    assert moving_average([3, 6], 1) == [3.0, 6.0]


def test_moving_average_window_longer_than_input():
    assert moving_average([1, 2], 3) == []
    assert moving_average([1, 2, 3], 3) == [2.0]


def test_moving_average_rejects_bad_window():
    with pytest.raises(ValueError, match="window must be at least 1, got 0"):
        moving_average([1], 0)
