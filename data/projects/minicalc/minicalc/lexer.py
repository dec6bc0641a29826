"""Splits an expression into tokens."""

from __future__ import annotations

from dataclasses import dataclass

OPERATORS = frozenset("+-*/%^(),")


class LexError(ValueError):
    """The expression contains a character that starts no token."""


@dataclass(frozen=True)
class Token:
    """One token: `kind` is NUMBER, NAME, OP or END; `position` is its 0-based offset."""

    kind: str
    text: str
    position: int


def _read_number(source: str, start: int) -> int:
    """Returns the offset just past the number starting at `start` (digits, one dot, exponent)."""
    index = start
    seen_dot = False
    while index < len(source) and (source[index].isdigit() or (source[index] == "." and not seen_dot)):
        seen_dot = seen_dot or source[index] == "."
        index += 1
    if index < len(source) and source[index] in "eE":
        exponent = index + 1
        if exponent < len(source) and source[exponent] in "+-":
            exponent += 1
        if exponent < len(source) and source[exponent].isdigit():
            index = exponent
            while index < len(source) and source[index].isdigit():
                index += 1
    return index


def tokenize(source: str) -> list[Token]:
    """Tokenizes `source`; the list always ends with an END token.

    Raises:
        LexError: naming the offending character and its offset.
    """
    tokens: list[Token] = []
    index = 0
    while index < len(source):
        char = source[index]
        if char.isspace():
            index += 1
        elif char.isdigit() or (char == "." and source[index + 1 : index + 2].isdigit()):
            end = _read_number(source, index)
            tokens.append(Token("NUMBER", source[index:end], index))
            index = end
        elif char.isalpha() or char == "_":
            end = index
            while end < len(source) and (source[end].isalnum() or source[end] == "_"):
                end += 1
            tokens.append(Token("NAME", source[index:end], index))
            index = end
        elif char in OPERATORS:
            tokens.append(Token("OP", char, index))
            index += 1
        else:
            raise LexError(f"unexpected character {char!r} at offset {index}")
    tokens.append(Token("END", "", len(source)))
    return tokens
