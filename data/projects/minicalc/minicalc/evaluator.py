"""Evaluates expression trees."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from minicalc.parser import BinaryOp, Call, Name, Node, Number, UnaryOp, parse


class EvaluationError(ValueError):
    """The expression is well formed but cannot be computed (unknown name, division by zero...)."""


def _round(value: float, digits: float = 0) -> float:
    """`round` for calculator values: every number is a float, so `digits` is too."""
    if digits != int(digits):
        raise ValueError(f"digits must be a whole number, got {digits}")
    return round(value, int(digits))


FUNCTIONS: dict[str, Callable[..., float]] = {
    "abs": abs,
    "sqrt": math.sqrt,
    "min": min,
    "max": max,
    "round": _round,
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


def _binary(operator: str, left: float, right: float) -> float:
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    if operator in ("/", "%"):
        if right == 0:
            raise EvaluationError("division by zero")
        return left / right if operator == "/" else left % right
    if operator == "^":
        return left**right
    raise EvaluationError(f"unknown operator {operator!r}")


def evaluate_tree(node: Node, variables: Mapping[str, float] | None = None) -> float:
    """Computes the value of `node`; `variables` shadow the constants `pi` and `e`."""
    names = {**CONSTANTS, **(variables or {})}
    if isinstance(node, Number):
        return node.value
    if isinstance(node, Name):
        if node.identifier not in names:
            raise EvaluationError(f"unknown name {node.identifier!r}")
        return float(names[node.identifier])
    if isinstance(node, UnaryOp):
        return -evaluate_tree(node.operand, variables)
    if isinstance(node, BinaryOp):
        left = evaluate_tree(node.left, variables)
        right = evaluate_tree(node.right, variables)
        return _binary(node.operator, left, right)
    if isinstance(node, Call):
        function = FUNCTIONS.get(node.function)
        if function is None:
            raise EvaluationError(f"unknown function {node.function!r}")
        arguments = [evaluate_tree(argument, variables) for argument in node.arguments]
        try:
            return float(function(*arguments))
        except (TypeError, ValueError) as error:
            raise EvaluationError(f"{node.function}(): {error}") from None
    raise TypeError(f"not an expression node: {node!r}")


def evaluate(source: str, variables: Mapping[str, float] | None = None) -> float:
    """Parses and evaluates `source`."""
    return evaluate_tree(parse(source), variables)
