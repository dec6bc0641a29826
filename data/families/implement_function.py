"""implement_function: a function's body is replaced by `raise NotImplementedError`; docstring and tests stay.

Only functions whose body is a textual block of whole lines are eligible (the edit then touches
just those lines and the gold patch restores them). Functions with a docstring come first: the
docstring is the specification the agent works from.
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from collections.abc import Iterator

from data.families.base import SourceProject, TaskSpec, count, function_nodes, task_id, validated
from env.patch_apply import make_patch

FAMILY = "implement_function"
CANDIDATES_PER_TASK = 3
MIN_BODY_LINES = 2  # a one-line body is a guessing game, not an implementation task

_TEMPLATES = (
    ("Implement `{name}` in {path}. It currently raises NotImplementedError; the docstring says what it "
    "should do{tests_hint}."),
    ("`{name}` ({path}) is only a stub. Please write its body so that it does what its docstring "
    "describes{tests_hint}."),
    "Fill in the missing implementation of `{name}` in {path}{tests_hint}.",
)


def _docstring(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    return ast.get_docstring(func)


def stub_out(source: str, func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """`source` with the body of `func` (after its docstring) replaced by `raise NotImplementedError`.

    None when the body does not start on its own line (e.g. `def f(): return 1`).
    """
    body = func.body[1:] if _docstring(func) is not None else func.body
    if not body:
        return None
    lines = source.splitlines(keepends=True)
    first, last = body[0], body[-1]
    indent = lines[first.lineno - 1][: len(lines[first.lineno - 1]) - len(lines[first.lineno - 1].lstrip())]
    if lines[first.lineno - 1].strip() == "" or len(indent.encode()) != first.col_offset:
        return None
    end = last.end_lineno
    newline = "\n" if lines[end - 1].endswith("\n") else ""
    stubbed = lines[: first.lineno - 1] + [f"{indent}raise NotImplementedError{newline}"] + lines[end:]
    return "".join(stubbed)


def _candidates(project: SourceProject, rng: random.Random) -> list[tuple[str, str, str, bool]]:
    """(path, qualified name, stubbed source, documented), documented functions first, groups shuffled."""
    documented, undocumented = [], []
    for path in project.source_files:
        source = project.files[path]
        for name, func in function_nodes(source):
            if "<locals>" in name:
                continue
            body = func.body[1:] if _docstring(func) is not None else func.body
            if not body or body[-1].end_lineno - body[0].lineno + 1 < MIN_BODY_LINES:
                continue
            stubbed = stub_out(source, func)
            if stubbed is not None:
                has_docstring = _docstring(func) is not None
                (documented if has_docstring else undocumented).append((path, name, stubbed, has_docstring))
    rng.shuffle(documented)
    rng.shuffle(undocumented)
    return documented + undocumented


def generate(project: SourceProject, rng: random.Random, max_tasks: int,
             stats: Counter | None = None) -> Iterator[TaskSpec]:
    made = 0
    tests_hint = "; the tests show the expected behaviour" if project.tier == "repo" else ""
    for tried, (path, name, stubbed, documented) in enumerate(_candidates(project, rng)):
        if made >= max_tasks or tried >= CANDIDATES_PER_TASK * max_tasks:
            return
        count(stats, "candidates")
        repo = project.visible_repo({**project.files, path: stubbed})
        spec = TaskSpec(
            id=task_id(project, FAMILY, path, name),
            instruction=rng.choice(_TEMPLATES if documented else _TEMPLATES[-1:]).format(
                name=name, path=path, tests_hint=tests_hint),
            test_command=project.test_command,
            repo=repo,
            hidden=project.hidden_files,
            gold_patch=make_patch(repo, project.visible_repo()),
            meta={"family": FAMILY, "tier": project.tier, "project": project.name, "file": path, "function": name},
        )
        if validated(spec, stats).ok:
            made += 1
            yield spec
