import pytest

from durations import format_duration, parse_duration


@pytest.mark.parametrize(
    "text, seconds",
    [("45s", 45), ("2m", 120), ("1h30m", 5400), ("1d2h3m4s", 93784), (" 10M ", 600), ("0s", 0)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "h", "1x", "1h 30m", "5m1h", "1m1m"])
def test_parse_duration_rejects_invalid(text):
    with pytest.raises(ValueError, match="duration|order"):
        parse_duration(text)


@pytest.mark.parametrize(
    "seconds, text",
    [(0, "0s"), (59, "59s"), (60, "1m"), (3601, "1h1s"), (93784, "1d2h3m4s"), (86400, "1d")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_format_duration_rejects_negative():
    with pytest.raises(ValueError, match="must not be negative, got -1"):
        format_duration(-1)
