"""ladder_constant (rung d): a constant has the wrong value; only the failing test's output shows the right one.

The instruction names neither the constant nor the value: the agent runs the tests, reads the
assertion (`assert 3 == 7` under `assert LIMIT == 7`), finds the constant, and fixes it in the code.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

from data.families import ladder
from data.families.base import TaskSpec
from env.patch_apply import make_patch

FAMILY = "ladder_constant"

_TEMPLATES = (
    "The tests fail because a setting in the code has the wrong value. Fix the value in the code, not the test.",
    "`{test}` is failing. One of the constants is off; the test output shows what it should be. Please fix it.",
    "Run the tests: a configured value is wrong. Correct the constant so the tests pass (leave the tests alone).",
    "After the last config change the test suite is red. Find the constant with the wrong value and fix it.",
)


def make(rng: random.Random, names: ladder.Names) -> TaskSpec:
    files, home, constants = ladder.settings_repo(rng, names)
    wrong = rng.choice(list(constants))
    bad_value = rng.choice([v for v in range(2, 500) if v != constants[wrong] and str(v) not in
                            str(constants[wrong])])
    fixed = ladder.with_settings(constants, files[home])
    broken = ladder.with_settings({**constants, wrong: bad_value}, files[home])
    test_file, test_name, test_text = ladder.settings_test(home, constants)
    repo = files | {test_file: test_text, home: broken}
    return TaskSpec(id="", instruction=rng.choice(_TEMPLATES).format(test=f"{test_file}::{test_name}"),
                    test_command=ladder.TEST_COMMAND, repo=repo, hidden={test_file: test_text},
                    gold_patch=make_patch(repo, {**repo, home: fixed}), meta={"file": home, "symbol": wrong})


def generate(split: str, seed: int, count: int, stats: Counter | None = None) -> Iterator[TaskSpec]:
    return ladder.generate(FAMILY, make, split, seed, count, stats)
