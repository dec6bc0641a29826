"""The task ladder: procedurally generated rungs, from copying a word to fixing a one-operator bug.

The curated families need a source project and teach a tiny model little until it can already use
the tools; the ladder's rungs isolate one skill each, on repos made up on the spot with fresh random
identifiers, so nothing can be answered from memory:

    ladder_copy      copy a string from the prompt into the answer (submit it)
    ladder_locate    find where a name is defined among 8-12 files (answer `path` or `path:line`)
    ladder_edit      an edit fully specified in the instruction (old and new text given)
    ladder_ask       a new value only the user knows: ask (`ask_user`), then set it
    ladder_constant  a constant whose right value only the failing test's output shows
    ladder_operator  a one-operator bug in a short function, with a visible failing test

(above them: the `micro` and `repo` tiers of the project families). Each rung module exposes
`FAMILY` and `generate(split, seed, count, stats)`; this module holds what they share: names,
layouts, filler code, checkers, and the seeded generate-validate loop.

Generation is seeded per task (`<seed>:<split>:<family>:<index>`), so train and held-out tasks never
share a generator seed; and every invented identifier (function, constant, module, package, code
word) belongs to one side by a hash of its text (`split_side`), so held-out tasks never reuse a
name any training task used. Tasks are graded by env.grading.grade like every other family: a hidden
`check_answer.py` for answer rungs, the pristine tests in hidden/ for edit rungs; every candidate is
validated (the untouched repo fails, the reference solution passes) before it is kept.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Iterator

from data.families.base import TaskSpec, count, validated

TIER = "ladder"
TEST_COMMAND = "python -m pytest -q -x -p no:cacheprovider tests"
CHECKER = "check_answer.py"
CANDIDATES_PER_TASK = 4  # give up after this many rejected candidates per wanted task
TIMEOUT_S = 30

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kl", "l", "m", "n", "p", "pl", "r", "s", "st", "t", "tr",
           "v", "z", "sh", "ch", "th")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ee")
_CODAS = ("", "", "", "n", "r", "s", "l", "k", "x", "m")


def split_side(split: str) -> int:
    """0 for train, 1 for every held-out split: identifiers of the two sides never coincide."""
    return 0 if split == "train" else 1


def identifier_side(name: str) -> int:
    return hashlib.sha256(name.lower().encode()).digest()[0] & 1


class Names:
    """Fresh pronounceable identifiers for one task, all on its split's side, never repeated in the task."""

    def __init__(self, rng: random.Random, split: str):
        self.rng, self.side, self.used = rng, split_side(split), set()
        self.made: list[str] = []  # every identifier handed out, as written

    def _word(self) -> str:
        rng = self.rng
        return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 2))) + \
            rng.choice(_CODAS)

    def _fresh(self, make: Callable[[], str]) -> str:
        while True:
            name = make()
            if name.lower() not in self.used and identifier_side(name) == self.side and len(name) >= 4:
                self.used.add(name.lower())
                self.made.append(name)
                return name

    def module(self) -> str:
        return self._fresh(self._word)

    def function(self) -> str:
        return self._fresh(lambda: "_".join(self._word() for _ in range(self.rng.randint(2, 3))))

    def constant(self) -> str:
        return self._fresh(lambda: "_".join(self._word() for _ in range(2)).upper())

    def klass(self) -> str:
        return self._fresh(lambda: "".join(self._word().capitalize() for _ in range(2)))

    def code_word(self) -> str:
        return self._fresh(lambda: f"{self._word()}-{self.rng.randint(100, 9999)}-{self._word()}")


def layout(rng: random.Random, names: Names, n_modules: int) -> tuple[list[str], dict[str, str]]:
    """`n_modules` module paths in a flat, one-package or nested-package layout, and the __init__ files."""
    kind = rng.choice(("flat", "package", "nested"))
    if kind == "flat":
        return [f"{names.module()}.py" for _ in range(n_modules)], {}
    top = names.module()
    dirs = [top] if kind == "package" else [f"{top}/{names.module()}" for _ in range(rng.randint(2, 3))]
    inits = {f"{top}/__init__.py": ""} | {f"{d}/__init__.py": "" for d in dirs}
    return [f"{rng.choice(dirs)}/{names.module()}.py" for _ in range(n_modules)], inits


def import_path(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


# Small pure functions: (body template, parameters, a generator of test inputs). `{k}` is a small constant.
# Each body has at least one operator that data.mutations can flip.
FUNCTIONS: tuple[tuple[str, tuple[str, ...], Callable[[random.Random], tuple]], ...] = (
    ("    return {p0} + {p1} * {k}\n", ("a", "b"), lambda r: (r.randint(-9, 9), r.randint(-9, 9))),
    ("    return ({p0} - {p1}) * {k}\n", ("left", "right"), lambda r: (r.randint(0, 20), r.randint(0, 20))),
    ("    if {p0} > {p1}:\n        return {p0} - {p1}\n    return {p1} - {p0}\n", ("x", "y"),
     lambda r: (r.randint(-9, 9), r.randint(-9, 9))),
    ("    total = 0\n    for item in {p0}:\n        total += item * {k}\n    return total\n", ("items",),
     lambda r: ([r.randint(0, 9) for _ in range(r.randint(2, 5))],)),
    ("    return [v for v in {p0} if v >= {k}]\n", ("values",),
     lambda r: ([r.randint(0, 9) for _ in range(r.randint(3, 6))],)),
    ("    count = 0\n    for v in {p0}:\n        if v % {k} == 0:\n            count += 1\n    return count\n",
     ("numbers",), lambda r: ([r.randint(1, 30) for _ in range(r.randint(3, 6))],)),
    ("    if {p0} < {p1}:\n        return {p1}\n    return {p0} + {k}\n", ("low", "high"),
     lambda r: (r.randint(0, 12), r.randint(0, 12))),
    ("    return {p0} // {k} + {p0} % {k}\n", ("n",), lambda r: (r.randint(0, 60),)),
)


def function_source(rng: random.Random, name: str, index: int | None = None) -> tuple[str, int]:
    """A small function named `name`; returns (source, index into FUNCTIONS)."""
    index = rng.randrange(len(FUNCTIONS)) if index is None else index
    body, params, _ = FUNCTIONS[index]
    filled = body.format(k=rng.randint(2, 5), **{f"p{i}": p for i, p in enumerate(params)})
    return f"def {name}({', '.join(params)}):\n{filled}", index


def call_value(source: str, name: str, args: tuple):
    """What `name(*args)` returns under `source` (generated code only: pure arithmetic, no imports)."""
    namespace: dict = {}
    exec(compile(source, "<ladder>", "exec"), namespace)  # noqa: S102 - our own generated functions
    return namespace[name](*args)


def filler_module(rng: random.Random, names: Names, n_functions: int) -> tuple[str, list[str]]:
    """A module of `n_functions` small functions (and now and then a constant); returns (source, names)."""
    parts, defined = [], []
    if rng.random() < 0.5:
        constant = names.constant()
        parts.append(f"{constant} = {rng.randint(2, 99)}\n")
        defined.append(constant)
    for _ in range(n_functions):
        name = names.function()
        parts.append(function_source(rng, name)[0])
        defined.append(name)
    return "\n\n".join(parts), defined


def settings_repo(rng: random.Random, names: Names) -> tuple[dict[str, str], str, dict[str, int]]:
    """A repo of 2-6 filler modules in a random layout, one of which (`home`) is to start with 2-4 settings
    constants: (every file, home's filler included, home, {constant: value})."""
    modules, inits = layout(rng, names, rng.randint(2, 6))
    sources = {path: filler_module(rng, names, rng.randint(1, 2))[0] for path in modules}
    home = rng.choice(modules)
    constants = {names.constant(): rng.randint(2, 500) for _ in range(rng.randint(2, 4))}
    return sources | inits, home, constants


def with_settings(constants: dict[str, int], filler: str) -> str:
    """A module's text: `NAME = value` lines, then the filler code (if any)."""
    settings = "".join(f"{name} = {value}\n" for name, value in constants.items())
    return f"{settings}\n\n{filler}" if filler else settings


def settings_test(home: str, constants: dict[str, int]) -> tuple[str, str, str]:
    """(test path, test function name, test module) asserting every constant's value."""
    test_name = f"test_{home.rsplit('/', 1)[-1].removesuffix('.py')}_settings"
    return test_path(home), test_name, test_module(import_path(home), list(constants),
                                                   {test_name: [f"assert {n} == {v}" for n, v in constants.items()]})


def answer_checker(answer: str, decoys: list[str], line_required: bool, modules: list[str]) -> str:
    """hidden/check_answer.py: exit 0 iff .submission.txt gives `answer` and none of `decoys`.

    For a path answer (`modules` given) it must name exactly that module of the repo (listing every file
    does not pay), and with `line_required` as `path:LINE` with the right line.
    """
    return _CHECKER.format(answer=answer, decoys=decoys, line_required=line_required, modules=modules)


# Self-contained (stdlib only): it runs in the sandbox on the graded copy.
_CHECKER = '''"""Grades an answer: .submission.txt must give the expected answer and nothing it must not."""
import re
import sys
from pathlib import Path

ANSWER = {answer!r}
DECOYS = {decoys!r}
LINE_REQUIRED = {line_required!r}
MODULES = {modules!r}

text = Path(".submission.txt").read_text() if Path(".submission.txt").exists() else ""
problems = [f"it names {{d!r}}" for d in DECOYS if d in text]
if MODULES:
    path, _, line = ANSWER.partition(":")
    named = {{}}
    for token, number in re.findall(r"([\\w./-]+\\.py)(?::(\\d+))?", text):
        token = token.removeprefix("./")
        for module in MODULES:
            if token == module or token.endswith("/" + module):
                named.setdefault(module, set()).add(number)
    if set(named) != {{path}}:
        problems.append(f"expected the module {{path}}, it names {{sorted(named) or 'none'}}")
    elif LINE_REQUIRED and named[path] != {{line}}:
        problems.append(f"expected {{ANSWER}}, it gives lines {{sorted(named[path])}}")
elif ANSWER not in re.findall(r"[\\w-]+", text) and ANSWER not in text.split():
    problems.append(f"expected {{ANSWER!r}} in the answer")
if problems:
    print("wrong answer: " + "; ".join(problems))
    sys.exit(1)
sys.exit(0)
'''


def task_seed(seed: int, split: str, family: str, index: int) -> str:
    return f"{seed}:{split}:{family}:{index}"


def generate(family: str, make: Callable[[random.Random, Names], TaskSpec | None], split: str, seed: int,
             count_wanted: int, stats: Counter | None = None) -> Iterator[TaskSpec]:
    """Up to `count_wanted` validated tasks of one rung; candidate i is made from its own seed alone."""
    made, index = 0, 0
    while made < count_wanted and index < CANDIDATES_PER_TASK * max(count_wanted, 1):
        generator_seed = task_seed(seed, split, family, index)
        index += 1
        rng = random.Random(generator_seed)
        names = Names(rng, split)
        spec = make(rng, names)
        if spec is None:
            count(stats, "rejected: no candidate from this seed")
            continue
        count(stats, "candidates")
        spec.id = f"{family}-{split}-{hashlib.sha256(generator_seed.encode()).hexdigest()[:10]}"
        spec.timeout_s = TIMEOUT_S
        spec.meta = {"family": family, "tier": TIER, "project": f"{family}@{split}", "split": split,
                     "generator_seed": generator_seed, "identifiers": sorted(names.made), **spec.meta}
        if validated(spec, stats).ok:
            made += 1
            yield spec


def call_text(name: str, args: tuple) -> str:
    return f"{name}({', '.join(map(repr, args))})"


def test_module(import_from: str, imported: list[str], tests: dict[str, list[str]]) -> str:
    """A pytest module: `from import_from import imported`, then one test function per entry of lines."""
    parts = [f"from {import_from} import {', '.join(imported)}\n"]
    for test_name, lines in tests.items():
        parts.append(f"def {test_name}():\n" + "".join(f"    {line}\n" for line in lines))
    return "\n\n".join(parts)


def test_path(module_path: str) -> str:
    return f"tests/test_{module_path.rsplit('/', 1)[-1]}"
