"""ladder_operator (rung e): a one-operator bug in a short function, with a visible failing test.

The bug is one data.mutations edit (an arithmetic or comparison operator) inside the function; the
test calls it with inputs on which the buggy and the correct version disagree.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

from data.families import ladder
from data.families.base import TaskSpec
from data.mutations import enumerate_mutations
from env.patch_apply import make_patch

FAMILY = "ladder_operator"

_TEMPLATES = (
    "`{test}` fails. Find the bug in {path} and fix it; the test is right.",
    "Something is off in `{function}`: its test fails. Please fix the function, not the test.",
    "A recent change broke one operator somewhere; the tests show where. Fix it without touching the tests.",
    "The test suite is red since the last commit. Please track down the bug in the code and fix it.",
)


def make(rng: random.Random, names: ladder.Names) -> TaskSpec | None:
    modules, inits = ladder.layout(rng, names, rng.randint(1, 5))
    sources = {path: ladder.filler_module(rng, names, rng.randint(0, 2))[0] for path in modules}
    home = rng.choice(modules)
    function = names.function()
    original, index = ladder.function_source(rng, function)
    inputs = [ladder.FUNCTIONS[index][2](rng) for _ in range(4)]
    mutations = enumerate_mutations(original, ["binary_op", "compare"])
    rng.shuffle(mutations)
    for mutation in mutations:
        try:
            wrong = [ladder.call_value(mutation.mutated_source, function, a) != ladder.call_value(original, function, a)
                     for a in inputs]
        except (ArithmeticError, TypeError, ValueError):  # a mutant that raises (// 0) is not this rung's bug
            continue
        if any(wrong):
            break
    else:
        return None
    checks = [f"assert {ladder.call_text(function, a)} == {ladder.call_value(original, function, a)!r}"
              for a in inputs]
    fixed = f"{sources[home]}\n\n{original}" if sources[home] else original
    broken = f"{sources[home]}\n\n{mutation.mutated_source}" if sources[home] else mutation.mutated_source
    test_file = ladder.test_path(home)
    tests = {test_file: ladder.test_module(ladder.import_path(home), [function], {f"test_{function}": checks})}
    repo = sources | inits | tests | {home: broken}
    return TaskSpec(id="", instruction=rng.choice(_TEMPLATES).format(test=f"{test_file}::test_{function}",
                                                                     path=home, function=function),
                    test_command=ladder.TEST_COMMAND, repo=repo, hidden=tests,
                    gold_patch=make_patch(repo, {**repo, home: fixed}),
                    meta={"file": home, "function": function, "operator": mutation.operator,
                          "mutation": mutation.description})


def generate(split: str, seed: int, count: int, stats: Counter | None = None) -> Iterator[TaskSpec]:
    return ladder.generate(FAMILY, make, split, seed, count, stats)
