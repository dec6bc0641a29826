"""An exact amount of money with two decimal places."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from functools import total_ordering

CENT = Decimal("0.01")


@total_ordering
class Money:
    """An immutable amount, always rounded half-up to whole cents.

    Built from a string, int or Decimal; floats are refused because they cannot
    represent most cent amounts exactly.
    """

    __slots__ = ("amount",)

    def __init__(self, amount: str | int | Decimal = 0) -> None:
        if isinstance(amount, float):
            raise TypeError("Money does not accept floats; pass a string such as '0.10'")
        try:
            value = Decimal(amount)
        except InvalidOperation:
            raise ValueError(f"not an amount of money: {amount!r}") from None
        if not value.is_finite():
            raise ValueError(f"not an amount of money: {amount!r}")
        object.__setattr__(self, "amount", value.quantize(CENT, rounding=ROUND_HALF_UP))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Money is immutable")

    def __repr__(self) -> str:
        return f"Money('{self.amount}')"

    def __str__(self) -> str:
        sign = "-" if self.amount < 0 else ""
        return f"{sign}${abs(self.amount):,.2f}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Money):
            return NotImplemented
        return self.amount == other.amount

    def __lt__(self, other: Money) -> bool:
        return self.amount < other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def __add__(self, other: Money) -> Money:
        return Money(self.amount + other.amount)

    def __sub__(self, other: Money) -> Money:
        return Money(self.amount - other.amount)

    def __neg__(self) -> Money:
        return Money(-self.amount)

    def __mul__(self, factor: int | Decimal) -> Money:
        """Scales by an int or Decimal factor, rounding the result to cents."""
        if isinstance(factor, float):
            raise TypeError("multiply Money by an int or Decimal, not a float")
        return Money(self.amount * factor)

    def is_positive(self) -> bool:
        return self.amount > 0

    def allocate(self, parts: int) -> list[Money]:
        """Splits into `parts` amounts that differ by at most a cent and sum exactly to self.

        The leftover cents go to the first parts: Money("10").allocate(3) gives
        3.34, 3.33, 3.33.
        """
        if parts < 1:
            raise ValueError(f"parts must be at least 1, got {parts}")
        cents = int(self.amount / CENT)
        base, leftover = divmod(cents, parts)
        return [Money(Decimal(base + (1 if index < leftover else 0)) * CENT) for index in range(parts)]


def total(amounts: list[Money]) -> Money:
    """The sum of `amounts` (zero for an empty list)."""
    result = Money()
    for amount in amounts:
        result = result + amount
    return result
