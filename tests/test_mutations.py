"""Mutation operators: every mutant parses, differs by a small textual edit, and changes behaviour."""

import ast
import difflib

import pytest

from data.mutations import MUTATORS, enumerate_mutations

# operator -> (snippet defining f, inputs). Every mutant the operator proposes on the snippet must
# change f's behaviour on at least one input (return value or exception type).
CASES = {
    "binary_op": ("def f(a, b):\n    return a + b * 2\n", [(3, 5)]),
    "compare": ("def f(a, b):\n    return a < b\n", [(1, 1), (1, 2), (2, 1)]),
    "bool_op": ("def f(a, b):\n    return a and b\n", [(True, False), (False, True)]),
    "constant": ("def f(xs):\n    return xs[0] * 10\n", [([1, 2, 3],)]),
    "slice": ("def f(xs):\n    return xs[1:3]\n", [([1, 2, 3, 4, 5],)]),
    "wrong_variable": ("def f(a, b):\n    c = a * 2\n    return c + b\n", [(1, 10)]),
    "drop_statement": ("def f(xs):\n    out = []\n    for x in xs:\n        out.append(x)\n    return out\n",
                       [([1, 2],)]),
    "swap_arguments": ("def f(a, b):\n    return pow(a, b)\n", [(2, 3)]),
    "swap_operands": ("def f(a, b):\n    return a - b\n", [(5, 2)]),
    "negate_condition": ("def f(x):\n    if x > 0:\n        return 1\n    return -1\n", [(1,), (-1,)]),
    "wrong_return": ("def f(x):\n    if x:\n        return True\n    return x * 2\n", [(1,), (0,)]),
}


def behaviour(source: str, inputs: list[tuple]) -> list:
    namespace: dict = {}
    exec(compile(source, "<snippet>", "exec"), namespace)  # noqa: S102  (our own snippets)
    results = []
    for args in inputs:
        try:
            results.append(("ok", namespace["f"](*args)))
        except Exception as e:  # noqa: BLE001  (a mutant that raises is a behaviour change too)
            results.append(("raises", type(e).__name__))
    return results


def test_every_operator_has_a_case():
    assert set(CASES) == set(MUTATORS)


@pytest.mark.parametrize("operator", sorted(CASES))
def test_operator_mutants_parse_differ_and_change_behaviour(operator):
    source, inputs = CASES[operator]
    mutants = enumerate_mutations(source, operators=[operator])
    assert mutants, f"{operator} proposed nothing on its snippet"
    original = behaviour(source, inputs)
    for m in mutants:
        assert m.operator == operator
        ast.parse(m.mutated_source)
        assert m.mutated_source != source
        assert behaviour(m.mutated_source, inputs) != original, f"{operator}: {m.description} is equivalent"


MODULE = '''"""Docstring with a + b and x < 3 in it."""

LIMIT = 10  # module level: never mutated


def total(values, start=0):
    """Sum of values from start, capped at LIMIT."""
    result = start
    for value in values[1:]:
        if value > 0 and value < LIMIT:
            result += value * 2
    return min(result, LIMIT - 1)


class Box:
    def scale(self, factor):
        return [item * factor for item in self.items if item is not None]
'''


def test_edits_are_minimal_and_leave_the_rest_byte_identical():
    mutants = enumerate_mutations(MODULE)
    assert {m.operator for m in mutants} == set(MUTATORS)
    original_lines = MODULE.splitlines(keepends=True)
    for m in mutants:
        mutated_lines = m.mutated_source.splitlines(keepends=True)
        changed = [line for line in difflib.ndiff(original_lines, mutated_lines) if line[:1] in "+-"]
        assert 1 <= len(changed) <= 4, (m.description, changed)  # one or two lines replaced (or one dropped)
        assert mutated_lines[:2] == original_lines[:2]  # docstring and header untouched
        assert "LIMIT = 10  # module level" in m.mutated_source
        assert m.function in ("total", "Box.scale")


def test_enumeration_is_deterministic_and_deduplicated():
    first, second = enumerate_mutations(MODULE), enumerate_mutations(MODULE)
    assert first == second
    assert len({m.mutated_source for m in first}) == len(first)


def test_operator_token_edit_keeps_parentheses_and_spacing():
    source = "def f(a, b):\n    return (a)  +  (b * 3)\n"
    [binary] = [m for m in enumerate_mutations(source, ["binary_op"]) if "+" in m.description]
    assert binary.mutated_source == "def f(a, b):\n    return (a)  -  (b * 3)\n"
    [not_in] = enumerate_mutations("def f(x, s):\n    return x not  in s\n", ["compare"])
    assert not_in.mutated_source == "def f(x, s):\n    return x in s\n"


def test_non_ascii_source_offsets():
    source = 'def f(name):\n    return "héllo " + name if len(name) > 2 else "ø"\n'
    for m in enumerate_mutations(source):
        ast.parse(m.mutated_source)
    [compare] = enumerate_mutations(source, ["compare"])
    assert compare.mutated_source == source.replace("> 2", ">= 2")


def test_drop_only_statement_leaves_pass():
    source = "def f(log):\n    if log:\n        log.append(1)\n    return log\n"
    [drop] = enumerate_mutations(source, ["drop_statement"])
    assert drop.mutated_source == "def f(log):\n    if log:\n        pass\n    return log\n"


def test_unknown_operator_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown mutation operator"):
        enumerate_mutations("def f():\n    return 1\n", ["no_such_operator"])
