from bsearch import binary_search, count_occurrences, lower_bound, upper_bound

ITEMS = [1, 3, 3, 3, 7, 9]


def test_binary_search_finds_first_occurrence():
    assert binary_search(ITEMS, 3) == 1
    assert binary_search(ITEMS, 1) == 0
    assert binary_search(ITEMS, 9) == 5


def test_binary_search_missing():
    assert binary_search(ITEMS, 4) == -1
    assert binary_search(ITEMS, 0) == -1
    assert binary_search(ITEMS, 10) == -1
    assert binary_search([], 1) == -1


def test_lower_bound():
    assert lower_bound(ITEMS, 3) == 1
    assert lower_bound(ITEMS, 4) == 4
    assert lower_bound(ITEMS, 0) == 0
    assert lower_bound(ITEMS, 10) == 6


def test_upper_bound():
    assert upper_bound(ITEMS, 3) == 4
    assert upper_bound(ITEMS, 9) == 6
    assert upper_bound(ITEMS, 0) == 0
    assert upper_bound(ITEMS, 7) == 5


def test_count_occurrences():
    assert count_occurrences(ITEMS, 3) == 3
    assert count_occurrences(ITEMS, 7) == 1
    assert count_occurrences(ITEMS, 5) == 0


def test_agrees_with_linear_scan():
    items = [0, 2, 2, 4, 4, 4, 6, 8, 8]
    for target in range(-1, 10):
        expected = items.index(target) if target in items else -1
        assert binary_search(items, target) == expected
