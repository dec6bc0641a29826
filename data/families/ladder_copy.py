"""ladder_copy (rung a): copy a string from the prompt into the answer; graded by the submitted text.

The lowest rung: the agent must only call `submit` with the right token. Some wordings add a decoy
token the answer must not contain, so echoing the whole prompt does not pass.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

from data.families import ladder
from data.families.base import TaskSpec

FAMILY = "ladder_copy"

_TEMPLATES = (  # (wording, uses a decoy)
    ("Reply with the code word `{word}` and nothing else.", False),
    ("Please submit this token exactly as written: {word}", False),
    ("The build is tagged {decoy} and the release code is {word}. Submit the release code.", True),
    ("Two tickets came in: {decoy} (closed) and {word} (open). Answer with the open ticket only.", True),
    ("What is the access key in this note? \"Old key {decoy} was revoked; use {word} from now on.\"", True),
)


def make(rng: random.Random, names: ladder.Names) -> TaskSpec:
    template, uses_decoy = rng.choice(_TEMPLATES)
    word, decoy = names.code_word(), names.code_word() if uses_decoy else ""
    modules, inits = ladder.layout(rng, names, rng.randint(1, 4))
    repo = {path: ladder.filler_module(rng, names, rng.randint(1, 2))[0] for path in modules} | inits
    return TaskSpec(id="", instruction=template.format(word=word, decoy=decoy),
                    test_command=f"python {ladder.CHECKER}", repo=repo,
                    hidden={ladder.CHECKER: ladder.answer_checker(word, [decoy] if uses_decoy else [], False, [])},
                    meta={"gold_answer": word})


def generate(split: str, seed: int, count: int, stats: Counter | None = None) -> Iterator[TaskSpec]:
    return ladder.generate(FAMILY, make, split, seed, count, stats)
