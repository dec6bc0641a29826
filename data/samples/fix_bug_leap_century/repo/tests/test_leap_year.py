import pytest

from leapyear import day_of_year, days_in_month, is_leap_year


@pytest.mark.parametrize("year, leap", [(2024, True), (2023, False), (1900, False), (2100, False)])
def test_is_leap_year(year, leap):
    assert is_leap_year(year) is leap


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2024, 4) == 30
    assert days_in_month(2024, 12) == 31


@pytest.mark.parametrize("month", [0, 13])
def test_days_in_month_rejects_bad_month(month):
    with pytest.raises(ValueError, match="month must be in 1..12"):
        days_in_month(2024, month)


def test_day_of_year():
    assert day_of_year(2023, 1, 1) == 1
    assert day_of_year(2023, 2, 1) == 32
    assert day_of_year(2023, 3, 1) == 60
    assert day_of_year(2024, 3, 1) == 61
    assert day_of_year(2023, 12, 31) == 365
    assert day_of_year(2024, 12, 31) == 366


def test_day_of_year_rejects_bad_day():
    with pytest.raises(ValueError, match="2023-02 has no day 29"):
        day_of_year(2023, 2, 29)
    with pytest.raises(ValueError, match="has no day 0"):
        day_of_year(2024, 1, 0)
