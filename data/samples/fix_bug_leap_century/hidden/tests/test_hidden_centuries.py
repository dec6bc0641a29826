"""Centuries are leap years only when divisible by 400."""

# Import grouping differs between this folder and the task workspace (where leapyear is first-party).
# ruff: noqa: I001

import pytest

from leapyear import day_of_year, days_in_month, is_leap_year


@pytest.mark.parametrize("year", [1600, 2000, 2400])
def test_every_fourth_century_is_leap(year):
    assert is_leap_year(year)


@pytest.mark.parametrize("year", [1700, 1800, 1900, 2100])
def test_other_centuries_are_not_leap(year):
    assert not is_leap_year(year)


def test_ordinary_years_unchanged():
    assert is_leap_year(2024)
    assert not is_leap_year(2023)


def test_february_and_year_length_in_2000():
    assert days_in_month(2000, 2) == 29
    assert day_of_year(2000, 12, 31) == 366
