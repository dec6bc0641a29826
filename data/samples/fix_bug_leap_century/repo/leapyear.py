"""Gregorian calendar arithmetic without the datetime module."""

DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap_year(year: int) -> bool:
    """Divisible by 4, except centuries, except every fourth century."""
    return year % 4 == 0 and year % 100 != 0


def days_in_month(year: int, month: int) -> int:
    if not 1 <= month <= 12:
        raise ValueError(f"month must be in 1..12, got {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return DAYS_IN_MONTH[month - 1]


def day_of_year(year: int, month: int, day: int) -> int:
    """1 for January 1st, up to 365 or 366."""
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError(f"{year}-{month:02d} has no day {day}")
    return sum(days_in_month(year, m) for m in range(1, month)) + day
