"""ladder_edit (rung c): an edit fully specified in the instruction: the old text and the new text.

The agent reads the file, copies the line, and replaces it; the visible tests describe the new
behaviour (their pristine copies in hidden/ grade it).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator

from data.families import ladder
from data.families.base import TaskSpec
from env.patch_apply import make_patch

FAMILY = "ladder_edit"

_TEMPLATES = (
    "In `{path}`, change `{old}` to `{new}`.",
    "Please edit {path}: in `{function}`, the line `{old}` should read `{new}`.",
    "Replace `{old}` with `{new}` in {path}; the tests already describe the new behaviour.",
    "Small change request for `{function}` ({path}): make `{old}` into `{new}`.",
)
_WITH_CONSTANT = [i for i, (body, _, _) in enumerate(ladder.FUNCTIONS) if "{k}" in body]


def make(rng: random.Random, names: ladder.Names) -> TaskSpec | None:
    modules, inits = ladder.layout(rng, names, rng.randint(2, 6))
    sources = {path: ladder.filler_module(rng, names, rng.randint(1, 2))[0] for path in modules}
    home = rng.choice(modules)
    function = names.function()
    index = rng.choice(_WITH_CONSTANT)
    original, _ = ladder.function_source(rng, function, index)
    line = next(text for text in original.splitlines() if re.search(r"\b[2-5]\b", text))
    k = int(re.search(r"\b([2-5])\b", line).group(1))
    new_k = rng.choice([v for v in range(2, 10) if v != k])
    old_text, new_text = line.strip(), re.sub(rf"\b{k}\b", str(new_k), line.strip(), count=1)
    changed = original.replace(line, line.replace(old_text, new_text), 1)
    before = f"{sources[home]}\n\n{original}" if sources[home] else original
    after = f"{sources[home]}\n\n{changed}" if sources[home] else changed
    if before.count(old_text) != 1:
        return None
    inputs = [ladder.FUNCTIONS[index][2](rng) for _ in range(3)]
    checks = [f"assert {ladder.call_text(function, args)} == {ladder.call_value(changed, function, args)!r}"
              for args in inputs]
    if all(ladder.call_value(changed, function, a) == ladder.call_value(original, function, a) for a in inputs):
        return None
    test_file = ladder.test_path(home)
    tests = {test_file: ladder.test_module(ladder.import_path(home), [function], {f"test_{function}": checks})}
    repo = sources | inits | tests | {home: before}
    return TaskSpec(id="", instruction=rng.choice(_TEMPLATES).format(path=home, function=function, old=old_text,
                                                                     new=new_text),
                    test_command=ladder.TEST_COMMAND, repo=repo, hidden=tests,
                    gold_patch=make_patch(repo, {**repo, home: after}), meta={"file": home, "function": function})


def generate(split: str, seed: int, count: int, stats: Counter | None = None) -> Iterator[TaskSpec]:
    return ladder.generate(FAMILY, make, split, seed, count, stats)
