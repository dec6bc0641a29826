"""Task families: each module turns a source project into validated task specs.

A family module exposes `FAMILY` (its name) and
`generate(project, rng, max_tasks, stats=None) -> Iterator[TaskSpec]`; adding a family is one
module plus one line here.
"""

from data.families import fix_bug, fix_lint, implement_function, locate

FAMILIES = {
    fix_bug.FAMILY: fix_bug.generate,
    implement_function.FAMILY: implement_function.generate,
    fix_lint.FAMILY: fix_lint.generate,
    locate.FAMILY: locate.generate,
}
