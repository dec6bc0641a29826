from datetime import date
from decimal import Decimal

import pytest

from ledger import Account, InsufficientFunds, Ledger, LedgerError, Money, Transaction
from ledger.money import total

DAY = date(2024, 3, 10)


def test_money_rounds_half_up_to_cents():
    assert Money("1.005").amount == Decimal("1.01")
    assert Money("1.004").amount == Decimal("1.00")
    assert Money(3).amount == Decimal("3.00")
    assert Money().amount == Decimal("0.00")


def test_money_rejects_floats_and_garbage():
    with pytest.raises(TypeError, match="floats"):
        Money(0.1)
    with pytest.raises(ValueError, match="not an amount of money: 'abc'"):
        Money("abc")
    with pytest.raises(ValueError, match="not an amount"):
        Money("Infinity")


def test_money_is_immutable():
    with pytest.raises(AttributeError, match="immutable"):
        Money("1").amount = Decimal(2)


def test_money_arithmetic_and_comparison():
    assert Money("1.10") + Money("2.20") == Money("3.30")
    assert Money("1") - Money("2.50") == Money("-1.50")
    assert -Money("2") == Money("-2")
    assert Money("2.50") * 3 == Money("7.50")
    assert Money("10") * Decimal("0.333") == Money("3.33")
    assert Money("1") < Money("1.01")
    assert Money("2") >= Money("2.00")
    assert Money("1") != "1"
    assert hash(Money("1")) == hash(Money("1.00"))


def test_money_multiply_rejects_float():
    with pytest.raises(TypeError, match="not a float"):
        Money("1") * 1.5


def test_money_str_and_repr():
    assert str(Money("1234.5")) == "$1,234.50"
    assert str(Money("-3")) == "-$3.00"
    assert repr(Money("2")) == "Money('2.00')"


def test_money_is_positive():
    assert Money("0.01").is_positive()
    assert not Money("0").is_positive()
    assert not Money("-1").is_positive()


def test_allocate_splits_exactly():
    assert Money("10").allocate(3) == [Money("3.34"), Money("3.33"), Money("3.33")]
    assert Money("0.05").allocate(2) == [Money("0.03"), Money("0.02")]
    assert Money("9").allocate(1) == [Money("9")]
    assert total(Money("100").allocate(7)) == Money("100")


def test_allocate_rejects_zero_parts():
    with pytest.raises(ValueError, match="parts must be at least 1"):
        Money("1").allocate(0)


def test_total():
    assert total([]) == Money()
    assert total([Money("1.25"), Money("2"), Money("-0.25")]) == Money("3")


def test_account_deposit_and_withdraw():
    account = Account("a")
    assert account.deposit(Money("10"), DAY) == Transaction(DAY, Money("10"), "deposit")
    assert account.withdraw(Money("4"), DAY) == Transaction(DAY, Money("-4"), "withdrawal")
    assert account.balance == Money("6")


def test_account_rejects_non_positive_amounts():
    account = Account("a")
    with pytest.raises(ValueError, match="a: deposit must be positive"):
        account.deposit(Money("0"), DAY)
    with pytest.raises(ValueError, match="withdrawal must be positive"):
        account.withdraw(Money("-1"), DAY)


def test_account_overdraft_limit():
    account = Account("a", overdraft_limit=Money("50"))
    account.deposit(Money("10"), DAY)
    assert account.available == Money("60")
    account.withdraw(Money("60"), DAY)
    assert account.balance == Money("-50")
    with pytest.raises(InsufficientFunds, match="only \\$0.00 available"):
        account.withdraw(Money("0.01"), DAY)


def test_account_rejects_negative_overdraft_limit():
    with pytest.raises(ValueError, match="overdraft limit must not be negative"):
        Account("a", overdraft_limit=Money("-1"))


def test_balance_on_and_history():
    account = Account("a")
    account.deposit(Money("5"), date(2024, 1, 1))
    account.deposit(Money("7"), date(2024, 1, 2))
    account.withdraw(Money("2"), date(2024, 1, 3))
    assert account.balance_on(date(2023, 12, 31)) == Money()
    assert account.balance_on(date(2024, 1, 2)) == Money("12")
    days = [t.day.day for t in account.history(date(2024, 1, 2), date(2024, 1, 3))]
    assert days == [2, 3]
    assert account.history(date(2024, 1, 1), date(2024, 1, 1))[0].amount == Money("5")
    with pytest.raises(ValueError, match="ends"):
        account.history(date(2024, 1, 3), date(2024, 1, 2))


def test_ledger_open_and_lookup_errors():
    book = Ledger()
    book.open("a")
    with pytest.raises(LedgerError, match="account 'a' already exists"):
        book.open("a")
    with pytest.raises(LedgerError, match="no account 'b'"):
        book.balance("b")


def test_ledger_deposit_withdraw_balance():
    book = Ledger()
    book.open("a", overdraft_limit=Money("5"))
    book.deposit("a", Money("10"), DAY)
    book.withdraw("a", Money("12"), DAY)
    assert book.balance("a") == Money("-2")
    assert book.account("a").overdraft_limit == Money("5")


def test_transfer_moves_money_and_memos():
    book = Ledger()
    book.open("a")
    book.open("b")
    book.deposit("a", Money("100"), DAY)
    book.transfer("a", "b", Money("30"), DAY)
    assert book.balance("a") == Money("70")
    assert book.balance("b") == Money("30")
    assert book.account("a").transactions[-1].memo == "transfer to b"
    assert book.account("b").transactions[-1].memo == "transfer from a"
    assert book.total_holdings() == Money("100")


def test_failed_transfer_records_nothing():
    book = Ledger()
    book.open("a")
    book.open("b")
    book.deposit("a", Money("10"), DAY)
    with pytest.raises(InsufficientFunds):
        book.transfer("a", "b", Money("11"), DAY)
    assert book.balance("a") == Money("10")
    assert book.account("b").transactions == []


def test_transfer_rejects_same_account_and_unknown_target():
    book = Ledger()
    book.open("a")
    book.deposit("a", Money("10"), DAY)
    with pytest.raises(ValueError, match="to itself"):
        book.transfer("a", "a", Money("1"), DAY)
    with pytest.raises(LedgerError):
        book.transfer("a", "nobody", Money("1"), DAY)
    assert book.balance("a") == Money("10")


def test_statement():
    book = Ledger()
    book.open("a")
    book.deposit("a", Money("50"), date(2024, 1, 31))
    book.deposit("a", Money("20"), date(2024, 2, 1))
    book.withdraw("a", Money("5"), date(2024, 2, 29))
    book.deposit("a", Money("1"), date(2024, 3, 1))
    assert book.statement("a", date(2024, 2, 1), date(2024, 2, 29)) == [
        "2024-02-01  opening balance  $50.00",
        "2024-02-01  deposit  $20.00  $70.00",
        "2024-02-29  withdrawal  -$5.00  $65.00",
    ]


def test_apply_interest_skips_overdrawn_and_empty():
    book = Ledger()
    book.open("rich")
    book.open("broke", overdraft_limit=Money("10"))
    book.open("empty")
    book.deposit("rich", Money("1200"), DAY)
    book.withdraw("broke", Money("5"), DAY)
    assert book.apply_interest(Decimal("0.05"), DAY) == {"rich": Money("5")}
    assert book.balance("rich") == Money("1205")
    assert book.balance("broke") == Money("-5")
    assert book.account("rich").transactions[-1].memo == "interest"


def test_apply_interest_rejects_negative_rate():
    with pytest.raises(ValueError, match="must not be negative"):
        Ledger().apply_interest(Decimal("-0.01"), DAY)
