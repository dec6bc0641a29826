"""ladder_ask (rung between edit and constant): a new value that only the user knows; ask, then set it.

The instruction names the setting but not its new value, and nothing in the repo shows it: the
visible tests check the other settings only (their pristine copies in hidden/ check this one too).
The agent asks (`ask_user`), reads the file, edits the line with the value the answer gave, and
submits. The task's `user_answer` is what the harness answers, and what a simulated user says when
it answers from its hidden spec (env/users.py). This is the rung where a question is the right move,
so a policy can learn when to ask, and a reward that makes questions free (the free-questions hack) has a
skill to overuse.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

from data.families import ladder
from data.families.base import TaskSpec
from env.patch_apply import make_patch

FAMILY = "ladder_ask"

_TEMPLATES = (
    "Please set `{constant}`{where} to the new value we agreed on. Ask me for the number.",
    "`{constant}`{where} needs the value from this morning's review. I know it: just ask me.",
    ("Change the setting `{constant}`{where} to the number the team picked; it is not written down anywhere "
     "in the repo, so ask me what it is."),
    "We have a new value for `{constant}`{where}. Ask me what it should be, then update the code.",
)
_ANSWERS = ("It should be {value}.", "{value}", "Set it to {value}, please.", "The new value is {value}.")


def make(rng: random.Random, names: ladder.Names) -> TaskSpec:
    files, home, constants = ladder.settings_repo(rng, names)
    target = rng.choice(list(constants))
    old_value = constants[target]
    # the new value shares no digits' run with the old one, so neither contains the other
    new_value = rng.choice([v for v in range(2, 500) if str(v) not in str(old_value) and str(old_value) not in str(v)])
    before = ladder.with_settings(constants, files[home])
    after = ladder.with_settings({**constants, target: new_value}, files[home])
    # the visible test checks the other settings only; its pristine copy in hidden/ checks the new value too
    test_file, _, visible = ladder.settings_test(home, {n: v for n, v in constants.items() if n != target})
    _, _, hidden = ladder.settings_test(home, {**constants, target: new_value})
    repo = files | {test_file: visible, home: before}
    where = f" in `{home}`" if rng.random() < 0.5 else ""
    return TaskSpec(id="", instruction=rng.choice(_TEMPLATES).format(constant=target, where=where),
                    test_command=ladder.TEST_COMMAND, repo=repo, hidden={test_file: hidden},
                    gold_patch=make_patch(repo, {**repo, home: after}),
                    meta={"file": home, "symbol": target, "user_answer": rng.choice(_ANSWERS).format(value=new_value)})


def generate(split: str, seed: int, count: int, stats: Counter | None = None) -> Iterator[TaskSpec]:
    return ladder.generate(FAMILY, make, split, seed, count, stats)
