"""locate: "Where is `X` defined?" — exercises search and grep; graded by the submitted answer.

Contract with the harness: the answer is the file path, relative to the repo root. It is stored
as `gold_answer` in task.json (the gold policy submits it as its summary); there is no gold.patch.
`hidden/check_answer.py` reads `.submission.txt` (written by `grade()` from the submit summary)
and exits 0 iff the submission names the defining file and no other module of the repo, so
listing every file does not pass.

Only symbols defined exactly once in the project's modules are asked about, and only in projects
with at least two modules (with one file the question answers itself).
"""

from __future__ import annotations

import ast
import random
from collections import Counter, defaultdict
from collections.abc import Iterator

from data import pyast
from data.families.base import SourceProject, TaskSpec, count, task_id, validated

FAMILY = "locate"
CHECKER = "check_answer.py"

_TEMPLATES = (
    "Where is {kind} `{name}` defined? Answer with the file path.",
    "Which file defines {kind} `{name}`? Reply with its path relative to the repository root.",
    "I need to change {kind} `{name}`, but I can't find it. In which file is it defined? Give the path.",
)

# The checker is self-contained (stdlib only) because it runs inside the sandbox on the graded copy.
_CHECKER_TEMPLATE = '''"""Grades a locate answer: exit 0 iff .submission.txt names {answer!r} and no other module."""
import re
import sys
from pathlib import Path

ANSWER = {answer!r}
MODULES = {modules!r}

text = Path(".submission.txt").read_text() if Path(".submission.txt").exists() else ""
mentioned = set()
for token in re.findall(r"[\\w./-]+\\.py\\b", text):
    token = token.removeprefix("./")
    mentioned.update(m for m in MODULES if token == m or token.endswith("/" + m))
if mentioned == {{ANSWER}}:
    sys.exit(0)
print(f"expected the answer {{ANSWER}}, the submission names {{sorted(mentioned) or 'no module'}}")
sys.exit(1)
'''


def checker_source(answer: str, modules: list[str]) -> str:
    """hidden/check_answer.py for one question."""
    return _CHECKER_TEMPLATE.format(answer=answer, modules=list(modules))


def definitions(project: SourceProject) -> dict[str, list[tuple[str, str]]]:
    """Qualified name -> [(kind, path)] for classes, functions, methods and module constants."""
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for path in project.source_files:
        tree = pyast.parse(project.files[path])
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found[node.name].append(("the class", path))
                for member in node.body:
                    if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and not (
                            member.name.startswith("__") and member.name.endswith("__")):
                        found[f"{node.name}.{member.name}"].append(("the method", path))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[node.name].append(("the function", path))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if name.isupper() and not name.startswith("__"):
                    found[name].append(("the constant", path))
    return found


def generate(project: SourceProject, rng: random.Random, max_tasks: int,
             stats: Counter | None = None) -> Iterator[TaskSpec]:
    modules = project.source_files
    if len(modules) < 2:
        count(stats, "rejected: fewer than two modules")
        return
    unique = sorted((name, places[0]) for name, places in definitions(project).items() if len(places) == 1)
    rng.shuffle(unique)
    made = 0
    for name, (kind, path) in unique:
        if made >= max_tasks:
            return
        count(stats, "candidates")
        spec = TaskSpec(
            id=task_id(project, FAMILY, name),
            instruction=rng.choice(_TEMPLATES).format(kind=kind, name=name),
            test_command=f"python {CHECKER}",
            repo=project.visible_repo(),
            hidden={CHECKER: checker_source(path, modules)},
            timeout_s=30,
            meta={"family": FAMILY, "tier": project.tier, "project": project.name, "symbol": name,
                  "gold_answer": path},
        )
        if validated(spec, stats).ok:
            made += 1
            yield spec
