"""A ledger of named accounts: transfers, statements and interest."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

from ledger.account import Account
from ledger.money import Money


class LedgerError(KeyError):
    """An account is unknown or already exists."""

    def __str__(self) -> str:
        return str(self.args[0])


class Ledger:
    """Holds accounts by name and moves money between them."""

    def __init__(self) -> None:
        self._accounts: dict[str, Account] = {}

    def open(self, name: str, overdraft_limit: Money | None = None) -> Account:
        if name in self._accounts:
            raise LedgerError(f"account {name!r} already exists")
        account = Account(name, overdraft_limit or Money())
        self._accounts[name] = account
        return account

    def account(self, name: str) -> Account:
        if name not in self._accounts:
            raise LedgerError(f"no account {name!r}")
        return self._accounts[name]

    def deposit(self, name: str, amount: Money, day: date) -> None:
        self.account(name).deposit(amount, day)

    def withdraw(self, name: str, amount: Money, day: date) -> None:
        self.account(name).withdraw(amount, day)

    def balance(self, name: str) -> Money:
        return self.account(name).balance

    def transfer(self, source: str, target: str, amount: Money, day: date) -> None:
        """Moves `amount`; either both sides are recorded or neither is.

        Raises:
            ValueError: for a transfer to the same account.
            InsufficientFunds: if `source` cannot cover it (nothing is recorded).
        """
        if source == target:
            raise ValueError(f"cannot transfer from {source!r} to itself")
        paying, receiving = self.account(source), self.account(target)
        paying.withdraw(amount, day, memo=f"transfer to {target}")
        receiving.deposit(amount, day, memo=f"transfer from {source}")

    def statement(self, name: str, start: date, end: date) -> list[str]:
        """Lines "YYYY-MM-DD  memo  amount  balance" for the range, after an opening line."""
        account = self.account(name)
        running = account.balance_on(start - timedelta(days=1))
        lines = [f"{start.isoformat()}  opening balance  {running}"]
        for transaction in account.history(start, end):
            running = running + transaction.amount
            lines.append(f"{transaction.day.isoformat()}  {transaction.memo}  {transaction.amount}  {running}")
        return lines

    def apply_interest(self, annual_rate: Decimal, day: date) -> dict[str, Money]:
        """Credits one month of interest (annual_rate / 12) to every account in credit.

        Returns the interest credited per account; overdrawn and empty accounts get none.
        """
        if annual_rate < 0:
            raise ValueError(f"annual rate must not be negative, got {annual_rate}")
        credited: dict[str, Money] = {}
        for name, account in self._accounts.items():
            interest = account.balance * (annual_rate / 12)
            if interest.is_positive():
                account.deposit(interest, day, memo="interest")
                credited[name] = interest
        return credited

    def total_holdings(self) -> Money:
        """The sum of every balance (transfers leave it unchanged)."""
        result = Money()
        for account in self._accounts.values():
            result = result + account.balance
        return result

