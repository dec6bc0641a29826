"""fix_bug: an AST mutation injects a bug; the agent gets a user-style report of the failing test.

The candidate order is stratified: operators take turns (in an rng order) and each operator's
sites are shuffled, so one prolific operator (wrong_variable proposes the most) does not crowd
out the rest, and at most `MAX_PER_FUNCTION` tasks come from one function.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterator

from data.families.base import (
    FailureReport,
    SourceProject,
    TaskSpec,
    count,
    parse_failure,
    task_id,
    validated,
)
from data.mutations import Mutation, enumerate_mutations
from env.patch_apply import make_patch

FAMILY = "fix_bug"
MAX_PER_FUNCTION = 2
CANDIDATES_PER_TASK = 4  # give up on a project after this many candidates per wanted task

_TEMPLATES_WITH_TEST = (
    "The test `{test}` fails:\n\n```\n{excerpt}\n```\n\nThe test is right. Find the bug in the code and fix it.",
    ("Since the last change, `{test}` is failing with\n\n```\n{excerpt}\n```\n\nCan you track down the bug "
    "and fix it? Please don't change the tests."),
    ("Running the tests gives this failure:\n\n```\n{test}\n{excerpt}\n```\n\nPlease fix the code so the "
    "test suite passes again."),
    "Bug report: `{test}` breaks ({message}). Fix the library code, not the test.",
)
_TEMPLATES_WITHOUT_TEST = (
    "Something is wrong in `{function}` ({path}): the test suite fails. Find the bug and fix it.",
    "The tests fail after a recent edit to {path}. Please find the bug and fix it without touching the tests.",
)


def _ordered_candidates(project: SourceProject, rng: random.Random) -> Iterator[tuple[str, Mutation]]:
    by_operator: dict[str, list[tuple[str, Mutation]]] = defaultdict(list)
    for path in project.source_files:
        for mutation in enumerate_mutations(project.files[path]):
            by_operator[mutation.operator].append((path, mutation))
    for sites in by_operator.values():
        rng.shuffle(sites)
    operators = sorted(by_operator)
    while operators:
        rng.shuffle(operators)
        for op in list(operators):
            if by_operator[op]:
                yield by_operator[op].pop()
            else:
                operators.remove(op)


def instruction(report: FailureReport | None, path: str, function: str, rng: random.Random) -> str:
    if report is None:
        return rng.choice(_TEMPLATES_WITHOUT_TEST).format(function=function, path=path)
    return rng.choice(_TEMPLATES_WITH_TEST).format(test=report.test, excerpt=report.excerpt(),
                                                   message=report.message)


def generate(project: SourceProject, rng: random.Random, max_tasks: int,
             stats: Counter | None = None) -> Iterator[TaskSpec]:
    made, per_function, tried = 0, Counter(), 0
    for path, mutation in _ordered_candidates(project, rng):
        if made >= max_tasks or tried >= CANDIDATES_PER_TASK * max_tasks:
            return
        if per_function[(path, mutation.function)] >= MAX_PER_FUNCTION:
            continue
        tried += 1
        count(stats, "candidates")
        buggy = {**project.files, path: mutation.mutated_source}
        repo = project.visible_repo(buggy)
        spec = TaskSpec(
            id=task_id(project, FAMILY, path, mutation.lineno, mutation.operator, mutation.description),
            instruction="(written after validation, from the failing test output)",
            test_command=project.test_command,
            repo=repo,
            hidden=project.hidden_files,
            gold_patch=make_patch(repo, project.visible_repo()),
            meta={"family": FAMILY, "tier": project.tier, "project": project.name, "file": path,
                  "function": mutation.function, "operator": mutation.operator, "lineno": mutation.lineno,
                  "mutation": mutation.description},
        )
        check = validated(spec, stats)
        if not check.ok:
            continue
        spec.instruction = instruction(parse_failure(check.noop.output), path, mutation.function, rng)
        per_function[(path, mutation.function)] += 1
        made += 1
        yield spec
