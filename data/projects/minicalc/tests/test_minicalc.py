import math

import pytest

from minicalc import (
    BinaryOp,
    Call,
    EvaluationError,
    LexError,
    Name,
    Number,
    ParseError,
    Token,
    UnaryOp,
    evaluate,
    evaluate_tree,
    parse,
    tokenize,
)


def test_tokenize_kinds_and_positions():
    assert tokenize("x1 + 2.5") == [
        Token("NAME", "x1", 0),
        Token("OP", "+", 3),
        Token("NUMBER", "2.5", 5),
        Token("END", "", 8),
    ]


@pytest.mark.parametrize("text", ["42", "3.14", ".5", "1e3", "2E-2", "6e+1"])
def test_tokenize_number_forms(text):
    assert tokenize(text)[0] == Token("NUMBER", text, 0)


def test_tokenize_multi_digit_exponent_then_operator():
    assert [token.text for token in tokenize("1e123+1")] == ["1e123", "+", "1", ""]


def test_tokenize_incomplete_exponent_is_a_name():
    assert [token.text for token in tokenize("2e")] == ["2", "e", ""]


def test_tokenize_second_dot_ends_number():
    assert [token.text for token in tokenize("1.2.3")][:2] == ["1.2", ".3"]


def test_tokenize_underscore_names_and_empty_input():
    assert tokenize("_a_b")[0] == Token("NAME", "_a_b", 0)
    assert tokenize("   ") == [Token("END", "", 3)]


def test_tokenize_rejects_unknown_character():
    with pytest.raises(LexError, match=r"'\$' at offset 2"):
        tokenize("1 $ 2")


def test_parse_precedence_tree():
    assert parse("1 + 2 * x") == BinaryOp("+", Number(1.0), BinaryOp("*", Number(2.0), Name("x")))


def test_parse_left_associative_subtraction():
    assert parse("8 - 4 - 2") == BinaryOp("-", BinaryOp("-", Number(8.0), Number(4.0)), Number(2.0))


def test_parse_power_is_right_associative():
    assert parse("2 ^ 3 ^ 2") == BinaryOp("^", Number(2.0), BinaryOp("^", Number(3.0), Number(2.0)))


def test_parse_unary_and_call():
    assert parse("-f(1, y)") == UnaryOp("-", Call("f", (Number(1.0), Name("y"))))
    assert parse("g()") == Call("g", ())


@pytest.mark.parametrize(
    "source, message",
    [
        ("1 +", "expected a number, name or '(' at offset 3, found end of input"),
        ("(1 + 2", "expected ')' at offset 6"),
        ("1 2", "unexpected token at offset 2, found '2'"),
        ("f(1,", "expected a number"),
        ("f(1 2)", "expected ')'"),
        (")", "expected a number"),
    ],
)
def test_parse_errors(source, message):
    with pytest.raises(ParseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(source)


@pytest.mark.parametrize(
    "source, value",
    [
        ("2 + 3 * 4", 14.0),
        ("(2 + 3) * 4", 20.0),
        ("10 - 4 - 3", 3.0),
        ("12 / 4 / 3", 1.0),
        ("7 % 4", 3.0),
        ("2 ^ 3 ^ 2", 512.0),
        ("-2 ^ 2", -4.0),
        ("2 ^ -1", 0.5),
        ("--3", 3.0),
        ("2 * -3", -6.0),
        ("1.5e1 + .5", 15.5),
    ],
)
def test_evaluate_arithmetic(source, value):
    assert evaluate(source) == value


def test_evaluate_variables_and_constants():
    assert evaluate("x * y", {"x": 3, "y": 4}) == 12.0
    assert evaluate("pi") == math.pi
    assert evaluate("e", {"e": 1}) == 1.0


def test_evaluate_functions():
    assert evaluate("max(1, 7, 3)") == 7.0
    assert evaluate("min(4, 2)") == 2.0
    assert evaluate("sqrt(16) + abs(-2)") == 6.0
    assert evaluate("round(2.567, 1)") == 2.6
    assert evaluate("round(2.5) + round(3.7)") == 6.0


@pytest.mark.parametrize(
    "source, message",
    [
        ("1 / 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("nope + 1", "unknown name 'nope'"),
        ("nope(1)", "unknown function 'nope'"),
        ("sqrt(-1)", "sqrt"),
        ("max()", "max"),
        ("round(1, 0.5)", "whole number"),
    ],
)
def test_evaluation_errors(source, message):
    with pytest.raises(EvaluationError, match=message):
        evaluate(source)


def test_evaluate_tree_rejects_non_nodes():
    with pytest.raises(TypeError, match="not an expression node"):
        evaluate_tree("1 + 2")


def test_evaluate_tree_unknown_operator():
    with pytest.raises(EvaluationError, match="unknown operator '&'"):
        evaluate_tree(BinaryOp("&", Number(1.0), Number(2.0)))
