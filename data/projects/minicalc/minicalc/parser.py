"""A recursive-descent parser from tokens to an expression tree."""

from __future__ import annotations

from dataclasses import dataclass

from minicalc.lexer import Token, tokenize


class ParseError(ValueError):
    """The tokens do not form an expression."""


@dataclass(frozen=True)
class Number:
    value: float


@dataclass(frozen=True)
class Name:
    identifier: str


@dataclass(frozen=True)
class UnaryOp:
    operator: str
    operand: Node


@dataclass(frozen=True)
class BinaryOp:
    operator: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Call:
    function: str
    arguments: tuple[Node, ...]


Node = Number | Name | UnaryOp | BinaryOp | Call


class _Parser:
    """Holds the token cursor; one method per grammar rule (see README)."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.index = 0

    @property
    def current(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def accept(self, *operators: str) -> Token | None:
        """Consumes and returns the current token if it is one of `operators`."""
        if self.current.kind == "OP" and self.current.text in operators:
            return self.advance()
        return None

    def expect(self, operator: str) -> None:
        if self.accept(operator) is None:
            raise self.error(f"expected {operator!r}")

    def error(self, message: str) -> ParseError:
        token = self.current
        found = "end of input" if token.kind == "END" else repr(token.text)
        return ParseError(f"{message} at offset {token.position}, found {found}")

    def expression(self) -> Node:
        node = self.term()
        while (token := self.accept("+", "-")) is not None:
            node = BinaryOp(token.text, node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while (token := self.accept("*", "/", "%")) is not None:
            node = BinaryOp(token.text, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.accept("-") is not None:
            return UnaryOp("-", self.unary())
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        if self.accept("^") is not None:
            return BinaryOp("^", base, self.unary())
        return base

    def atom(self) -> Node:
        token = self.current
        if token.kind == "NUMBER":
            self.advance()
            return Number(float(token.text))
        if token.kind == "NAME":
            self.advance()
            if self.accept("(") is None:
                return Name(token.text)
            arguments: list[Node] = []
            if self.accept(")") is None:
                arguments.append(self.expression())
                while self.accept(",") is not None:
                    arguments.append(self.expression())
                self.expect(")")
            return Call(token.text, tuple(arguments))
        if self.accept("(") is not None:
            node = self.expression()
            self.expect(")")
            return node
        raise self.error("expected a number, name or '('")


def parse(source: str) -> Node:
    """Parses `source` into an expression tree.

    Raises:
        LexError: on a character that starts no token.
        ParseError: on a syntax error, naming the offset.
    """
    parser = _Parser(tokenize(source))
    node = parser.expression()
    if parser.current.kind != "END":
        raise parser.error("unexpected token")
    return node
