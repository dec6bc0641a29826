import pytest

from chunking import chunk, pad_chunks, sliding_window


def test_chunk():
    assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunk([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]
    assert chunk([1, 2], 5) == [[1, 2]]
    assert chunk([], 3) == []


def test_sliding_window():
    assert sliding_window([1, 2, 3, 4], 2) == [[1, 2], [2, 3], [3, 4]]
    assert sliding_window([1, 2, 3, 4, 5], 3, step=2) == [[1, 2, 3], [3, 4, 5]]
    assert sliding_window([1, 2, 3], 3) == [[1, 2, 3]]
    assert sliding_window([1, 2], 3) == []
    assert sliding_window([1, 2], 1) == [[1], [2]]


def test_pad_chunks():
    assert pad_chunks([1, 2, 3], 2, 0) == [[1, 2], [3, 0]]
    assert pad_chunks([1, 2], 2, 0) == [[1, 2]]
    assert pad_chunks([1], 4, None) == [[1, None, None, None]]
    assert pad_chunks([], 2, 0) == []


@pytest.mark.parametrize("call", [lambda: chunk([1], 0), lambda: sliding_window([1], 0), lambda: sliding_window([1], 1, 0)])
def test_rejects_non_positive_sizes(call):
    with pytest.raises(ValueError, match="must be at least 1"):
        call()
