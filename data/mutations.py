"""Bug injection by AST mutation, with minimal textual edits.

Each operator walks the parsed module and proposes edits to the *source text*: only the
characters of the mutated node (or operator token) change, so the diff against the original
is one or two lines and the rest of the file is byte-identical (`ast.unparse` would reformat
the whole file and leak the edit through formatting noise).

Only code inside function bodies is mutated: module-level code runs at import time, where a
mutation tends to break every test at once (a boring task), and docstrings are never touched.

    >>> [m.description for m in enumerate_mutations("def double(n):\\n    return n * 2\\n")]
    ['`*` -> `//`', '`2` -> `1`', '`return n * 2` -> `return None`']
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from data import pyast


@dataclass(frozen=True)
class Mutation:
    operator: str  # key in MUTATORS
    lineno: int  # 1-based line of the edit in the original source
    function: str  # qualified name of the enclosing function, e.g. "Config.get"
    description: str  # what changed, for logs and metadata (never shown to the agent)
    mutated_source: str


@dataclass(frozen=True)
class _Edit:
    start: int  # character offsets into the source
    end: int
    text: str


def _apply(text: str, edits: list[_Edit]) -> str:
    out, cursor = [], 0
    for edit in sorted(edits, key=lambda e: e.start):
        out.append(text[cursor:edit.start])
        out.append(edit.text)
        cursor = edit.end
    out.append(text[cursor:])
    return "".join(out)


class _Source:
    """A module's text, AST and the maps the operators share (offsets, parents, functions)."""

    def __init__(self, text: str):
        self.text = text
        self.tree = pyast.parse(text)
        # ast offsets are (line, UTF-8 byte column); keep per-line text to convert to characters
        self.lines = text.splitlines(keepends=True)
        self.line_starts = [0]
        for line in self.lines:
            self.line_starts.append(self.line_starts[-1] + len(line))
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.functions: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
        self._collect_functions(self.tree, "")
        # Top-level statements and class members as (start, end, prefix): a candidate is checked
        # by re-parsing only the block it edits (a method under a `class _:` header), which keeps
        # enumeration linear in file size instead of re-parsing the whole module per candidate.
        self.blocks: list[tuple[int, int, str]] = []
        for stmt in self.tree.body:
            for member, prefix in ([(m, "class _:\n") for m in stmt.body] if isinstance(stmt, ast.ClassDef)
                                   else [(stmt, "")]):
                first = min([member.lineno, *(d.lineno for d in getattr(member, "decorator_list", ()))])
                self.blocks.append((self.line_starts[first - 1], self.line_starts[member.end_lineno], prefix))
        self._block_dumps: dict[int, str] = {}

    def _collect_functions(self, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                self.functions.append((name, child))
                self._collect_functions(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                self._collect_functions(child, prefix + child.name + ".")
            else:
                self._collect_functions(child, prefix)

    def offset(self, lineno: int, col_byte: int) -> int:
        line = self.lines[lineno - 1]
        return self.line_starts[lineno - 1] + len(line.encode()[:col_byte].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    def changes_behaviour(self, edits: list[_Edit]) -> bool:
        """True when the edited top-level statement parses and its AST differs from the original."""
        index = next((i for i, (start, end, _) in enumerate(self.blocks)
                      if all(start <= e.start and e.end <= end for e in edits)), None)
        if index is None:
            return False
        start, end, prefix = self.blocks[index]
        block = self.text[start:end]
        if index not in self._block_dumps:
            self._block_dumps[index] = ast.dump(pyast.parse(prefix + block))
        shifted = [_Edit(e.start - start, e.end - start, e.text) for e in edits]
        try:
            mutated = ast.dump(pyast.parse(prefix + _apply(block, shifted)))
        except SyntaxError:
            return False
        return mutated != self._block_dumps[index]

    def apply(self, edits: list[_Edit]) -> str:
        return _apply(self.text, edits)

    def body_nodes(self) -> Iterator[tuple[str, ast.AST]]:
        """(function name, node) for every node in a function body (nested functions report themselves)."""
        for name, func in self.functions:
            for stmt in func.body:
                if not _is_docstring(func, stmt):
                    yield from ((name, node) for node in _walk_own(stmt))

    def operator_edit(self, left: ast.AST, right: ast.AST, old: str, new: str) -> _Edit | None:
        """Replace the operator token `old` found between two operand nodes.

        The gap may hold parentheses and whitespace; anything else (a comment, a line
        continuation) makes the edit ambiguous, so the candidate is skipped.
        """
        start, end = self.span(left)[1], self.span(right)[0]
        gap = self.text[start:end]
        if " ".join(gap.replace("(", " ").replace(")", " ").split()) != old:
            return None
        # multi-word operators ("not in", "is not") may be spread over several spaces
        words = old.split()
        at = gap.index(words[0])
        stop = at + len(words[0])
        for word in words[1:]:
            stop = gap.index(word, stop) + len(word)
        return _Edit(start + at, start + stop, new)


def _walk_own(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk that does not descend into nested function or class definitions."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield from _walk_own(child)


def _is_docstring(func: ast.AST, stmt: ast.stmt) -> bool:
    return (stmt is func.body[0] and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _mutation(src: _Source, operator: str, node: ast.AST, function: str, description: str,
              edits: list[_Edit | None]) -> Mutation | None:
    if not edits or any(e is None for e in edits):
        return None
    if any(src.text.count("\n", e.start, e.end) > 1 for e in edits):
        return None  # keep the diff to one or two lines: a long edited span reads like a rewrite
    if not src.changes_behaviour(edits):
        return None
    return Mutation(operator, node.lineno, function, description, src.apply(edits))


_ATOMIC = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List, ast.Tuple, ast.Dict)


def _wrap(src: _Source, node: ast.AST) -> str:
    """The node's text, parenthesised unless it is atomic (safe inside a larger expression)."""
    text = src.segment(node)
    return text if isinstance(node, _ATOMIC) else f"({text})"


# ---------------------------------------------------------------------------------------------
# Operators. Each takes a _Source and yields Mutations; the registry at the bottom names them.

_BINOP_SWAP = {
    ast.Add: (ast.Sub, "+", "-"), ast.Sub: (ast.Add, "-", "+"),
    ast.Mult: (ast.FloorDiv, "*", "//"), ast.FloorDiv: (ast.Mult, "//", "*"),
    ast.Div: (ast.Mult, "/", "*"), ast.Mod: (ast.FloorDiv, "%", "//"),
    ast.BitAnd: (ast.BitOr, "&", "|"), ast.BitOr: (ast.BitAnd, "|", "&"),
    ast.LShift: (ast.RShift, "<<", ">>"), ast.RShift: (ast.LShift, ">>", "<<"),
}


def mutate_binary_op(src: _Source) -> Iterator[Mutation]:
    """Arithmetic/bitwise operator swap: `a + b` -> `a - b`, `a * b` -> `a // b`, ..."""
    for func, node in src.body_nodes():
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
            if isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) and isinstance(
                    node.left.value, str):
                continue  # "%s" % x is string formatting, not arithmetic
            _, old, new = _BINOP_SWAP[type(node.op)]
            edit = src.operator_edit(node.left, node.right, old, new)
            yield _mutation(src, "binary_op", node, func, f"`{old}` -> `{new}`", [edit])
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAP:
            _, old, new = _BINOP_SWAP[type(node.op)]
            edit = src.operator_edit(node.target, node.value, old + "=", new + "=")
            yield _mutation(src, "binary_op", node, func, f"`{old}=` -> `{new}=`", [edit])


_COMPARE_FLIP = {
    ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is"),
}


def mutate_compare(src: _Source) -> Iterator[Mutation]:
    """Comparison flip: boundary (`<` <-> `<=`) or negation (`==` <-> `!=`, `in` <-> `not in`)."""
    for func, node in src.body_nodes():
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            old, new = _COMPARE_FLIP[type(op)]
            edit = src.operator_edit(operands[i], operands[i + 1], old, new)
            yield _mutation(src, "compare", node, func, f"`{old}` -> `{new}`", [edit])


def mutate_bool_op(src: _Source) -> Iterator[Mutation]:
    """Boolean connective swap: `a and b` <-> `a or b`."""
    for func, node in src.body_nodes():
        if isinstance(node, ast.BoolOp):
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            edit = src.operator_edit(node.values[0], node.values[1], old, new)
            yield _mutation(src, "bool_op", node, func, f"`{old}` -> `{new}`", [edit])


def _int_literal(node: ast.AST) -> int | None:
    """The value of `3` or `-3` written as a literal, else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_literal(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _is_slice_bound(src: _Source, node: ast.AST) -> bool:
    parent = src.parent.get(node)
    while isinstance(parent, ast.UnaryOp):
        parent = src.parent.get(parent)
    return isinstance(parent, ast.Slice)


def mutate_constant(src: _Source) -> Iterator[Mutation]:
    """Off-by-one in an integer literal: `n` -> `n + 1` for 0 and 1, `n - 1` otherwise."""
    for func, node in src.body_nodes():
        if (isinstance(node, ast.Constant) and type(node.value) is int
                and not _is_slice_bound(src, node)):  # slice bounds belong to mutate_slice
            new = node.value + 1 if node.value <= 1 else node.value - 1
            start, end = src.span(node)
            yield _mutation(src, "constant", node, func, f"`{node.value}` -> `{new}`",
                            [_Edit(start, end, str(new))])


def mutate_slice(src: _Source) -> Iterator[Mutation]:
    """Off-by-one in a slice bound: `x[a:b]` -> `x[a:b + 1]` (upper) or `x[a + 1:b]` (lower)."""
    for func, node in src.body_nodes():
        if not isinstance(node, ast.Slice):
            continue
        for bound_name in ("upper", "lower"):
            bound = getattr(node, bound_name)
            if bound is None:
                continue
            start, end = src.span(bound)
            value = _int_literal(bound)
            new = str(value + 1) if value is not None else f"{_wrap(src, bound)} + 1"
            yield _mutation(src, "slice", node, func, f"{bound_name} bound `{src.segment(bound)}` -> `{new}`",
                            [_Edit(start, end, new)])


def _assigned_names(func: ast.AST) -> dict[str, int]:
    """Local names of a function (parameters and assignment targets) -> first line bound."""
    names: dict[str, int] = {}
    args = func.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None and arg.arg not in ("self", "cls"):
            names.setdefault(arg.arg, func.lineno)
    for node in _walk_own(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.setdefault(node.id, node.lineno)
            names[node.id] = min(names[node.id], node.lineno)
    return names


def mutate_wrong_variable(src: _Source) -> Iterator[Mutation]:
    """Wrong variable: a read of local `x` becomes a read of another local bound earlier."""
    for func_name, func in src.functions:
        local = _assigned_names(func)
        for stmt in func.body:
            for node in _walk_own(stmt):
                if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in local):
                    continue
                # the nearest other local already bound above this line: a plausible slip, not a NameError
                others = [(line, name) for name, line in local.items() if name != node.id and line < node.lineno]
                if not others:
                    continue
                _, other = max(others)
                start, end = src.span(node)
                yield _mutation(src, "wrong_variable", node, func_name, f"`{node.id}` -> `{other}`",
                                [_Edit(start, end, other)])


def mutate_swap_arguments(src: _Source) -> Iterator[Mutation]:
    """Swapped arguments: `f(a, b)` -> `f(b, a)` (first two positional arguments)."""
    for func, node in src.body_nodes():
        if not isinstance(node, ast.Call) or len(node.args) < 2:
            continue
        first, second = node.args[0], node.args[1]
        if isinstance(first, ast.Starred) or isinstance(second, ast.Starred):
            continue
        a, b = src.segment(first), src.segment(second)
        if a == b:
            continue
        yield _mutation(src, "swap_arguments", node, func, f"`{a}, {b}` -> `{b}, {a}`",
                        [_Edit(*src.span(first), b), _Edit(*src.span(second), a)])


def mutate_swap_operands(src: _Source) -> Iterator[Mutation]:
    """Swapped operands of a non-commutative operator: `a - b` -> `b - a`, `a < b` -> `b < a`."""
    non_commutative = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
    for func, node in src.body_nodes():
        if isinstance(node, ast.BinOp) and isinstance(node.op, (*non_commutative, ast.Add)):
            if isinstance(node.op, ast.Add) and not any(
                    isinstance(side, ast.Constant) and isinstance(side.value, str) for side in (node.left, node.right)):
                continue  # `+` only does not commute on strings (and lists, which we cannot see)
            a, b = src.segment(node.left), src.segment(node.right)
            if a == b or "\n" in a or "\n" in b:
                continue
            yield _mutation(src, "swap_operands", node, func, f"operands of `{a} ... {b}` swapped",
                            [_Edit(*src.span(node.left), _wrap(src, node.right)),
                             _Edit(*src.span(node.right), _wrap(src, node.left))])


def mutate_negate_condition(src: _Source) -> Iterator[Mutation]:
    """Negated condition of an `if`, `while`, conditional expression or comprehension filter."""
    for func, node in src.body_nodes():
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = node.ifs
        else:
            continue
        for test in tests:
            start, end = src.span(test)
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                new = src.segment(test.operand)
                if not isinstance(test.operand, _ATOMIC):
                    new = f"({new})"
            else:
                new = f"not {_wrap(src, test)}"
            yield _mutation(src, "negate_condition", test, func, f"condition `{src.segment(test)}` negated",
                            [_Edit(start, end, new)])


def mutate_wrong_return(src: _Source) -> Iterator[Mutation]:
    """Wrong return value: `return True` <-> `return False`, otherwise `return <expr>` -> `return None`."""
    for func, node in src.body_nodes():
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        value = node.value
        if isinstance(value, ast.Constant) and value.value is None:
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            new = str(not value.value)
        else:
            new = "None"
        start, end = src.span(value)
        yield _mutation(src, "wrong_return", node, func, f"`return {src.segment(value)}` -> `return {new}`",
                        [_Edit(start, end, new)])


_DROPPABLE = (ast.Expr, ast.AugAssign, ast.Assign, ast.Continue, ast.Break)


def mutate_drop_statement(src: _Source) -> Iterator[Mutation]:
    """Dropped statement: a call, augmented assignment, re-assignment, `break` or `continue` vanishes.

    A plain assignment is only dropped when its targets are bound earlier too (otherwise the
    mutant just raises NameError). The statement's lines are removed; a block left empty gets `pass`.
    """
    for func_name, func in src.functions:
        local = _assigned_names(func)
        for node in _walk_own(func):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                for stmt in block:
                    if not isinstance(stmt, _DROPPABLE) or _is_docstring(node, stmt):
                        continue
                    if isinstance(stmt, ast.Expr) and not isinstance(stmt.value, (ast.Call, ast.Await)):
                        continue
                    if isinstance(stmt, ast.Assign) and not all(
                            isinstance(t, ast.Name) and local.get(t.id, stmt.lineno) < stmt.lineno
                            or isinstance(t, (ast.Attribute, ast.Subscript)) for t in stmt.targets):
                        continue
                    edit = _drop_lines(src, stmt, only_statement=len(block) == 1)
                    text = src.segment(stmt).splitlines()[0]
                    yield _mutation(src, "drop_statement", stmt, func_name, f"dropped `{text}`", [edit])


def _drop_lines(src: _Source, stmt: ast.stmt, only_statement: bool) -> _Edit | None:
    start, end = src.span(stmt)
    line_start = src.line_starts[stmt.lineno - 1]
    line_end = src.line_starts[stmt.end_lineno]
    # the statement must own its lines (no `a; b`, no `if x: a` on one line)
    if src.text[line_start:start].strip() or src.text[end:line_end].strip() not in ("", ";"):
        return None
    if src.text[end:line_end].strip().startswith("#"):
        return None
    if only_statement:
        indent = src.text[line_start:start]
        return _Edit(line_start, line_end, f"{indent}pass\n")
    return _Edit(line_start, line_end, "")


MUTATORS: dict[str, Callable[[_Source], Iterator[Mutation | None]]] = {
    "binary_op": mutate_binary_op,
    "compare": mutate_compare,
    "bool_op": mutate_bool_op,
    "constant": mutate_constant,
    "slice": mutate_slice,
    "wrong_variable": mutate_wrong_variable,
    "drop_statement": mutate_drop_statement,
    "swap_arguments": mutate_swap_arguments,
    "swap_operands": mutate_swap_operands,
    "negate_condition": mutate_negate_condition,
    "wrong_return": mutate_wrong_return,
}


def enumerate_mutations(source: str, operators: list[str] | None = None) -> list[Mutation]:
    """Every mutation of `source` the operators propose, deterministic, sorted by (line, operator).

    Candidates that do not parse, or whose AST equals the original (a no-op edit), are dropped
    (checked on the edited block, see `_Source.changes_behaviour`), as are exact duplicates
    (two operators producing the same text).
    """
    unknown = set(operators or ()) - MUTATORS.keys()
    if unknown:
        raise ValueError(f"unknown mutation operator(s) {sorted(unknown)}; known: {sorted(MUTATORS)}")
    src = _Source(source)
    found: dict[str, Mutation] = {}
    for name in operators or MUTATORS:
        for mutation in MUTATORS[name](src):  # None: not expressible as a small edit, or a no-op
            if mutation is not None and mutation.mutated_source not in found:
                found[mutation.mutated_source] = mutation
    order = list(MUTATORS)
    return sorted(found.values(), key=lambda m: (m.lineno, order.index(m.operator), m.description))
