"""ladder_locate (rung b): where is a name defined, among 8-12 files? Answer `path` or `path:line`.

The name is fresh, so only grep or search finds it; half the time another module imports and uses
it, so the first hit of a plain grep is not always the definition. Graded by a hidden checker on
the submitted text: exactly the defining module (and, when the wording asks for it, the right line).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

from data.families import ladder
from data.families.base import TaskSpec

FAMILY = "ladder_locate"

_TEMPLATES = (  # (wording, wants the line)
    ("Which file defines {kind} `{name}`? Answer with its path.", False),
    ("In which module is {kind} `{name}` defined? Reply with the path relative to the repository root.", False),
    ("Where is {kind} `{name}` defined? Answer as `path/to/file.py:LINE`.", True),
    ("I need the exact location of {kind} `{name}`: give its file and line (`file.py:LINE`).", True),
)


def make(rng: random.Random, names: ladder.Names) -> TaskSpec:
    modules, inits = ladder.layout(rng, names, rng.randint(8, 12))
    sources = {path: ladder.filler_module(rng, names, rng.randint(1, 3))[0] for path in modules}
    home = rng.choice(modules)
    kind = rng.choice(("the function", "the class", "the constant"))
    if kind == "the function":
        name = names.function()
        definition = ladder.function_source(rng, name)[0]
    elif kind == "the class":
        name = names.klass()
        definition = f"class {name}:\n    def __init__(self, value):\n        self.value = value\n"
    else:
        name = names.constant()
        definition = f"{name} = {rng.randint(2, 999)}\n"
    before = sources[home].rstrip("\n")
    sources[home] = f"{before}\n\n\n{definition}" if rng.random() < 0.5 or not before else \
        f"{definition}\n\n{before}\n"
    line = next(i for i, text in enumerate(sources[home].splitlines(), 1)
                if text.startswith((f"def {name}(", f"class {name}:", f"{name} = ")))
    if rng.random() < 0.5:  # a user elsewhere: grep finds more than the definition
        user = rng.choice([m for m in modules if m != home])
        use = f"{name}.__name__" if kind != "the constant" else name
        sources[user] = f"from {ladder.import_path(home)} import {name}\n\n{sources[user]}\n\n" \
                        f"{names.constant()} = {use}\n"
    template, wants_line = rng.choice(_TEMPLATES)
    answer = f"{home}:{line}" if wants_line else home
    return TaskSpec(id="", instruction=template.format(kind=kind, name=name),
                    test_command=f"python {ladder.CHECKER}", repo=sources | inits,
                    hidden={ladder.CHECKER: ladder.answer_checker(answer, [], wants_line, modules)},
                    meta={"gold_answer": answer, "symbol": name})


def generate(split: str, seed: int, count: int, stats: Counter | None = None) -> Iterator[TaskSpec]:
    return ladder.generate(FAMILY, make, split, seed, count, stats)
