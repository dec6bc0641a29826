"""Task families: each module turns a source project into validated task specs.

A family module exposes `FAMILY` (its name) and
`generate(project, rng, max_tasks, stats=None) -> Iterator[TaskSpec]`; adding a family is one
module plus one line here.

`LADDER` holds the rungs of the task ladder (data/families/ladder.py): they need no source project,
so their `generate(split, seed, count, stats=None) -> Iterator[TaskSpec]` makes a repo per task.
"""

from data.families import (
    fix_bug,
    fix_lint,
    implement_function,
    ladder_ask,
    ladder_constant,
    ladder_copy,
    ladder_edit,
    ladder_locate,
    ladder_operator,
    locate,
)

FAMILIES = {
    fix_bug.FAMILY: fix_bug.generate,
    implement_function.FAMILY: implement_function.generate,
    fix_lint.FAMILY: fix_lint.generate,
    locate.FAMILY: locate.generate,
}

LADDER = {  # in rung order, lowest first
    ladder_copy.FAMILY: ladder_copy.generate,
    ladder_locate.FAMILY: ladder_locate.generate,
    ladder_edit.FAMILY: ladder_edit.generate,
    ladder_ask.FAMILY: ladder_ask.generate,
    ladder_constant.FAMILY: ladder_constant.generate,
    ladder_operator.FAMILY: ladder_operator.generate,
}
