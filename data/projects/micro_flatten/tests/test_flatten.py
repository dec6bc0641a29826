import pytest

from flatten import flatten, flatten_depth


def test_flatten_any_depth():
    assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]
    assert flatten([(1, 2), [], [[3]]]) == [1, 2, 3]
    assert flatten([]) == []


def test_flatten_keeps_strings_whole():
    assert flatten(["ab", ["cd"]]) == ["ab", "cd"]


def test_flatten_depth():
    nested = [1, [2, [3, [4]]]]
    assert flatten_depth(nested, 0) == [1, [2, [3, [4]]]]
    assert flatten_depth(nested, 1) == [1, 2, [3, [4]]]
    assert flatten_depth(nested, 2) == [1, 2, 3, [4]]
    assert flatten_depth(nested, 10) == [1, 2, 3, 4]


def test_flatten_depth_returns_a_copy():
    nested = [1, 2]
    assert flatten_depth(nested, 0) is not nested


def test_flatten_depth_rejects_negative():
    with pytest.raises(ValueError, match="depth must not be negative, got -1"):
        flatten_depth([1], -1)
