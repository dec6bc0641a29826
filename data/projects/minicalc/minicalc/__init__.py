"""minicalc: parse and evaluate arithmetic expressions."""

from minicalc.evaluator import FUNCTIONS, EvaluationError, evaluate, evaluate_tree
from minicalc.lexer import LexError, Token, tokenize
from minicalc.parser import BinaryOp, Call, Name, Number, ParseError, UnaryOp, parse

__all__ = [
    "FUNCTIONS",
    "BinaryOp",
    "Call",
    "EvaluationError",
    "LexError",
    "Name",
    "Number",
    "ParseError",
    "Token",
    "UnaryOp",
    "evaluate",
    "evaluate_tree",
    "parse",
    "tokenize",
]
