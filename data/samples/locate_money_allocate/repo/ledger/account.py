"""One account and its transaction history."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

from ledger.money import Money, total


class InsufficientFunds(Exception):
    """A withdrawal would take the balance below the overdraft limit."""


@dataclass(frozen=True)
class Transaction:
    """A signed movement of money: deposits are positive, withdrawals negative."""

    day: date
    amount: Money
    memo: str = ""


@dataclass
class Account:
    """An account whose balance may not go below `-overdraft_limit`."""

    name: str
    overdraft_limit: Money = field(default_factory=Money)
    transactions: list[Transaction] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.overdraft_limit < Money():
            raise ValueError(f"{self.name}: overdraft limit must not be negative")

    @property
    def balance(self) -> Money:
        return total([transaction.amount for transaction in self.transactions])

    @property
    def available(self) -> Money:
        """How much can still be withdrawn, overdraft included."""
        return self.balance + self.overdraft_limit

    def deposit(self, amount: Money, day: date, memo: str = "deposit") -> Transaction:
        """Adds a positive amount."""
        if not amount.is_positive():
            raise ValueError(f"{self.name}: deposit must be positive, got {amount}")
        transaction = Transaction(day, amount, memo)
        self.transactions.append(transaction)
        return transaction

    def withdraw(self, amount: Money, day: date, memo: str = "withdrawal") -> Transaction:
        """Removes a positive amount, up to the available funds."""
        if not amount.is_positive():
            raise ValueError(f"{self.name}: withdrawal must be positive, got {amount}")
        if amount > self.available:
            raise InsufficientFunds(f"{self.name}: cannot withdraw {amount}, only {self.available} available")
        transaction = Transaction(day, -amount, memo)
        self.transactions.append(transaction)
        return transaction

    def balance_on(self, day: date) -> Money:
        """The balance at the end of `day`."""
        return total([t.amount for t in self.transactions if t.day <= day])

    def history(self, start: date, end: date) -> list[Transaction]:
        """Transactions with `start <= day <= end`, in the order they were made."""
        if end < start:
            raise ValueError(f"history range ends ({end}) before it starts ({start})")
        return [t for t in self.transactions if start <= t.day <= end]
