"""ledger: bank accounts with exact decimal money."""

from ledger.account import Account, InsufficientFunds, Transaction
from ledger.book import Ledger, LedgerError
from ledger.money import Money

__all__ = ["Account", "InsufficientFunds", "Ledger", "LedgerError", "Money", "Transaction"]
