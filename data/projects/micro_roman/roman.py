"""Integers to Roman numerals and back."""

NUMERALS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]


def to_roman(number: int) -> str:
    """Writes 1..3999 as a Roman numeral."""
    if not 1 <= number <= 3999:
        raise ValueError(f"{number} is outside 1..3999")
    parts = []
    for value, symbol in NUMERALS:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)


def from_roman(numeral: str) -> int:
    """Reads a Roman numeral, rejecting non-canonical forms ("IIII")."""
    values = {symbol: value for value, symbol in NUMERALS if len(symbol) == 1}
    upper = numeral.upper()
    if not upper or any(char not in values for char in upper):
        raise ValueError(f"invalid Roman numeral {numeral!r}")
    total = 0
    for index, char in enumerate(upper):
        following = values[upper[index + 1]] if index + 1 < len(upper) else 0
        total += -values[char] if following > values[char] else values[char]
    if total > 3999 or to_roman(total) != upper:
        raise ValueError(f"invalid Roman numeral {numeral!r}")
    return total
