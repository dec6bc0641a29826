import pytest

from clamp import clamp, lerp, remap


def test_clamp_inside_and_at_bounds():
    assert clamp(5, 0, 10) == 5
    assert clamp(0, 0, 10) == 0
    assert clamp(10, 0, 10) == 10


def test_clamp_outside():
    assert clamp(-3, 0, 10) == 0
    assert clamp(12, 0, 10) == 10


def test_clamp_rejects_reversed_range():
    with pytest.raises(ValueError, match="low 5 is greater than high 1"):
        clamp(3, 5, 1)
    assert clamp(3, 2, 2) == 2


def test_lerp():
    assert lerp(10, 20, 0) == 10
    assert lerp(10, 20, 1) == 20
    assert lerp(10, 20, 0.25) == 12.5
    assert lerp(20, 10, 0.25) == 17.5


def test_remap():
    assert remap(5, 0, 10, 0, 100) == 50
    assert remap(2, 0, 8, 100, 200) == 125
    assert remap(15, 0, 10, 0, 100) == 100
    assert remap(-1, 0, 10, 0, 100) == 0
    assert remap(5, 0, 10, 100, 0) == 50
    assert remap(1, 0, 4, 100, 0) == 75
    assert remap(15, 10, 20, 0, 100) == 50


def test_remap_rejects_empty_input_range():
    with pytest.raises(ValueError, match="input range is empty"):
        remap(1, 3, 3, 0, 1)
