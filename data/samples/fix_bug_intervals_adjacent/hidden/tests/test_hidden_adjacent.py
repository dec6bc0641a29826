"""Touching intervals [a, b) and [b, c) must fuse into [a, c)."""

from intervals import Interval, IntervalSet


def test_overlaps_versus_touches():
    assert Interval(1, 3).overlaps(Interval(2, 4))
    assert not Interval(1, 3).overlaps(Interval(3, 4))
    assert Interval(1, 3).touches(Interval(3, 4))
    assert Interval(3, 4).touches(Interval(1, 3))
    assert not Interval(1, 2).touches(Interval(3, 4))
    assert Interval(0, 10).overlaps(Interval(4, 5))


def test_set_merges_adjacent_intervals():
    intervals = IntervalSet([Interval(1, 3)])
    intervals.add(Interval(3, 5))
    assert list(intervals) == [Interval(1, 5)]


def test_set_add_bridges_several_intervals():
    intervals = IntervalSet([Interval(0, 1), Interval(2, 3), Interval(4, 5), Interval(9, 10)])
    intervals.add(Interval(1, 4))
    assert list(intervals) == [Interval(0, 5), Interval(9, 10)]


def test_union_operator():
    left = IntervalSet([Interval(0, 2)])
    right = IntervalSet([Interval(2, 3), Interval(7, 9)])
    assert left | right == IntervalSet([Interval(0, 3), Interval(7, 9)])
    assert list(left) == [Interval(0, 2)]


def test_equality_and_repr():
    assert IntervalSet([Interval(0, 1), Interval(1, 2)]) == IntervalSet([Interval(0, 2)])
    assert IntervalSet([Interval(0, 1)]) != [Interval(0, 1)]
    assert repr(IntervalSet([Interval(0, 1)])) == "IntervalSet([Interval(0, 1)])"
