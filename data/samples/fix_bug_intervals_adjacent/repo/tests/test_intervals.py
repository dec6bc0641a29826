import pytest

from intervals import Interval, IntervalSet


def test_interval_rejects_reversed_bounds():
    with pytest.raises(ValueError, match="end 1 is before its start 2"):
        Interval(2, 1)


def test_interval_length_empty_and_repr():
    assert Interval(2, 5).length == 3
    assert Interval(3, 3).is_empty()
    assert not Interval(3, 4).is_empty()
    assert repr(Interval(1, 2.5)) == "Interval(1, 2.5)"


def test_interval_contains_is_half_open():
    interval = Interval(1, 3)
    assert interval.contains(1)
    assert interval.contains(2.999)
    assert not interval.contains(3)
    assert not interval.contains(0.5)


def test_intersection_and_span():
    assert Interval(1, 5).intersection(Interval(3, 8)) == Interval(3, 5)
    assert Interval(3, 8).intersection(Interval(1, 5)) == Interval(3, 5)
    assert Interval(1, 2).intersection(Interval(2, 3)) is None
    assert Interval(1, 2).span(Interval(5, 6)) == Interval(1, 6)
    assert Interval(5, 6).span(Interval(1, 2)) == Interval(1, 6)


def test_subtract():
    assert Interval(0, 10).subtract(Interval(3, 5)) == [Interval(0, 3), Interval(5, 10)]
    assert Interval(0, 10).subtract(Interval(0, 5)) == [Interval(5, 10)]
    assert Interval(0, 10).subtract(Interval(5, 12)) == [Interval(0, 5)]
    assert Interval(2, 4).subtract(Interval(0, 10)) == []
    assert Interval(0, 2).subtract(Interval(2, 4)) == [Interval(0, 2)]
    assert Interval(1, 1).subtract(Interval(5, 6)) == []


def test_intervals_sort_by_start_then_end():
    assert sorted([Interval(2, 3), Interval(1, 5), Interval(1, 2)]) == [
        Interval(1, 2),
        Interval(1, 5),
        Interval(2, 3),
    ]


def test_set_sorts_and_merges_overlapping():
    intervals = IntervalSet([Interval(5, 7), Interval(1, 3), Interval(2, 4)])
    assert list(intervals) == [Interval(1, 4), Interval(5, 7)]
    assert len(intervals) == 2


def test_set_ignores_empty_intervals():
    assert len(IntervalSet([Interval(2, 2)])) == 0


def test_set_contains_points():
    intervals = IntervalSet([Interval(1, 3), Interval(5, 8)])
    assert 1 in intervals
    assert 2.5 in intervals
    assert 3 not in intervals
    assert 4 not in intervals
    assert 7 in intervals
    assert 0 not in intervals
    assert 8 not in intervals
    assert 1 not in IntervalSet()


def test_set_remove_splits():
    intervals = IntervalSet([Interval(0, 10), Interval(20, 30)])
    intervals.remove(Interval(5, 25))
    assert list(intervals) == [Interval(0, 5), Interval(25, 30)]


def test_total_length():
    assert IntervalSet([Interval(0, 2), Interval(1, 4), Interval(10, 11)]).total_length() == 5
    assert IntervalSet().total_length() == 0


def test_intersection_sweep():
    left = IntervalSet([Interval(0, 5), Interval(10, 15)])
    right = IntervalSet([Interval(3, 12), Interval(14, 20)])
    expected = IntervalSet([Interval(3, 5), Interval(10, 12), Interval(14, 15)])
    assert left & right == expected
    assert right & left == expected
    assert (left & IntervalSet()) == IntervalSet()


def test_intersection_with_one_long_interval():
    many = IntervalSet([Interval(1, 2), Interval(3, 4), Interval(5, 6)])
    assert many & IntervalSet([Interval(0, 10)]) == many


def test_difference_operator():
    left = IntervalSet([Interval(0, 10)])
    right = IntervalSet([Interval(2, 3), Interval(8, 12)])
    assert left - right == IntervalSet([Interval(0, 2), Interval(3, 8)])
    assert list(left) == [Interval(0, 10)]


def test_gaps():
    busy = IntervalSet([Interval(9, 12), Interval(13, 17)])
    assert busy.gaps(Interval(8, 18)) == [Interval(8, 9), Interval(12, 13), Interval(17, 18)]
    assert busy.gaps(Interval(10, 11)) == []
    assert IntervalSet().gaps(Interval(1, 2)) == [Interval(1, 2)]
