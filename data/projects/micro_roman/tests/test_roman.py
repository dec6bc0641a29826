import pytest

from roman import from_roman, to_roman


@pytest.mark.parametrize(
    "number, numeral",
    [(1, "I"), (3, "III"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"),
     (400, "CD"), (944, "CMXLIV"), (1994, "MCMXCIV"), (3999, "MMMCMXCIX")],
)
def test_round_trip(number, numeral):
    assert to_roman(number) == numeral
    assert from_roman(numeral) == number


def test_from_roman_is_case_insensitive():
    assert from_roman("mcmxciv") == 1994


@pytest.mark.parametrize("number", [0, -1, 4000])
def test_to_roman_range(number):
    with pytest.raises(ValueError, match="outside 1..3999"):
        to_roman(number)


@pytest.mark.parametrize("numeral", ["", "IIII", "VX", "IC", "ABC", "MMMM"])
def test_from_roman_rejects_invalid(numeral):
    with pytest.raises(ValueError, match="invalid Roman numeral"):
        from_roman(numeral)
