"""fix_lint: lint errors are injected into one module; solved when `ruff check` is clean and tests pass.

Every injector is checked against ruff itself: an injection is kept only if ruff reports the
expected rule code exactly once more than before and nothing else new (the default rule set moves
between ruff versions: 0.17 enables F, B, C4, UP, SIM, ... but no longer E711/E713; and a
textual injector can land in a string). All injections preserve behaviour. The project's
ruff.toml travels in hidden/, so relaxing the lint settings does not pass the grader.
"""

from __future__ import annotations

import ast
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from data import pyast
from data.families.base import SourceProject, TaskSpec, count, function_nodes, task_id, validated
from env.patch_apply import make_patch

FAMILY = "fix_lint"
CANDIDATES_PER_TASK = 3
MAX_INJECTIONS = 3
# --ignore-noqa: a noqa comment silences ruff but fixes nothing, so it must not pass the grader
LINT_COMMAND = "ruff check --no-cache --ignore-noqa ."

_TEMPLATES = (
    ("The lint step fails (`ruff check .`):\n\n```\n{report}\n```\n\nPlease fix these lint errors; the tests "
    "must keep passing."),
    "`ruff check` is not clean any more. Make it pass without changing what the code does.",
    "Clean up the lint errors ruff reports in {path}, without breaking the tests.",
    "CI rejects this change because of lint:\n\n```\n{report}\n```\n\nFix it, please.",
)

_UNUSED_MODULES = ("os", "sys", "re", "json", "math", "itertools", "functools", "collections", "string")


def _offset(lines: list[str], lineno: int, col_byte: int) -> int:
    return sum(len(line) for line in lines[: lineno - 1]) + len(lines[lineno - 1].encode()[:col_byte].decode())


def _replace(source: str, node: ast.AST, text: str) -> str:
    lines = source.splitlines(keepends=True)
    start = _offset(lines, node.lineno, node.col_offset)
    end = _offset(lines, node.end_lineno, node.end_col_offset)
    return source[:start] + text + source[end:]


def inject_unused_import(source: str, rng: random.Random) -> list[tuple[str, str]]:
    """F401: `import <module>` that nothing uses, placed with the other imports."""
    tree = pyast.parse(source)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names} | {node.module for node in ast.walk(tree)
                                             if isinstance(node, ast.ImportFrom) and node.module}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    free = [m for m in _UNUSED_MODULES if m not in imported and m not in names]
    if not free:
        return []
    # after the docstring and any `from __future__` import: the first line a new import may go
    position = 0
    for stmt in tree.body:
        is_doc = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt is tree.body[0]
        if is_doc or (isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"):
            position = stmt.end_lineno
        else:
            break
    lines = source.splitlines(keepends=True)
    module = rng.choice(free)
    prefix = "\n" if position and not any(isinstance(s, (ast.Import, ast.ImportFrom)) for s in tree.body) else ""
    return [(f"unused import `{module}`", "".join(lines[:position]) + f"{prefix}import {module}\n"
             + "".join(lines[position:]))]


def inject_unused_variable(source: str, rng: random.Random) -> list[tuple[str, str]]:
    """F841: a local assigned and never read, at the top of a function body."""
    out = []
    for name, func in function_nodes(source):
        body = func.body[1:] if ast.get_docstring(func) is not None else func.body
        if not body:
            continue
        used = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)}
        params = [a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
                  if a.arg not in ("self", "cls")]
        if not params:
            continue
        param = rng.choice(params)
        local = next((c for c in (f"original_{param}", f"{param}_copy", "previous") if c not in used), None)
        lines = source.splitlines(keepends=True)
        first = body[0]
        line = lines[first.lineno - 1]
        indent = line[: len(line) - len(line.lstrip())]
        if len(indent.encode()) != first.col_offset or local is None:
            continue
        new_line = f"{indent}{local} = {param}\n"
        out.append((f"unused variable `{local}` in `{name}`",
                    "".join(lines[: first.lineno - 1]) + new_line + "".join(lines[first.lineno - 1:])))
    return out


def inject_collection_call(source: str, rng: random.Random) -> list[tuple[str, str]]:
    """C408: an empty `{}` / `[]` literal inside a function becomes `dict()` / `list()`."""
    out = []
    for _, func in function_nodes(source):
        for node in ast.walk(func):
            if isinstance(node, ast.Dict) and not node.keys or isinstance(node, ast.List) and not node.elts:
                call = "dict()" if isinstance(node, ast.Dict) else "list()"
                out.append((f"`{call}` call", _replace(source, node, call)))
    return out


def inject_getattr_constant(source: str, rng: random.Random) -> list[tuple[str, str]]:
    """B009: `obj.attr` (a read) becomes `getattr(obj, "attr")`."""
    out = []
    for _, func in function_nodes(source):
        for node in ast.walk(func):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                    and isinstance(node.value, ast.Name)):
                out.append((f"`getattr({node.value.id}, {node.attr!r})`",
                            _replace(source, node, f'getattr({node.value.id}, "{node.attr}")')))
    return out


def inject_object_base(source: str, rng: random.Random) -> list[tuple[str, str]]:
    """UP004: `class Foo:` becomes `class Foo(object):`."""
    return [(f"`class {m.group(2)}(object)`", source[: m.start()] + f"{m.group(1)}class {m.group(2)}(object):"
             + source[m.end():]) for m in re.finditer(r"^([ \t]*)class (\w+):", source, re.MULTILINE)]


def inject_bare_except(source: str, rng: random.Random) -> list[tuple[str, str]]:
    """E722: `except SomeError:` -> `except:`."""
    out = []
    for match in re.finditer(r"^([ \t]*)except [\w.]+:", source, re.MULTILINE):
        out.append(("bare `except:`", source[: match.start()] + f"{match.group(1)}except:" + source[match.end():]))
    return out


def inject_fstring_without_placeholders(source: str, rng: random.Random) -> list[tuple[str, str]]:
    """F541: an `f` prefix on a plain string literal inside a function."""
    out = []
    for _, func in function_nodes(source):
        skip = {id(func.body[0].value)} if ast.get_docstring(func) is not None else set()
        for node in ast.walk(func):
            if isinstance(node, ast.JoinedStr):
                skip.update(id(v) for v in node.values)
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                    and node.lineno == node.end_lineno):
                segment = ast.get_source_segment(source, node)
                if segment and segment[0] in "'\"" and "{" not in segment and "}" not in segment:
                    out.append((f"f-string without placeholders {segment[:30]}", _replace(source, node, "f" + segment)))
    return out


INJECTORS: dict[str, tuple[str, Callable[[str, random.Random], list[tuple[str, str]]]]] = {
    "unused_import": ("F401", inject_unused_import),
    "unused_variable": ("F841", inject_unused_variable),
    "bare_except": ("E722", inject_bare_except),
    "fstring_without_placeholders": ("F541", inject_fstring_without_placeholders),
    "collection_call": ("C408", inject_collection_call),
    "getattr_constant": ("B009", inject_getattr_constant),
    "object_base": ("UP004", inject_object_base),
}
# Codes an injection may trigger besides its own, fixed by the same edit (an inserted import can
# also unsort the import block).
SIDE_EFFECT_CODES = {"I001"}


def _ruff() -> str:
    ruff = Path(sys.executable).with_name("ruff")
    found = str(ruff) if ruff.exists() else shutil.which("ruff")
    if found is None:
        raise RuntimeError("fix_lint needs the `ruff` executable (in the venv's bin/ or on PATH)")
    return found


def ruff_diagnostics(files: dict[str, str]) -> list[dict]:
    """ruff's JSON diagnostics for a file tree (written to a temp dir so the project's ruff.toml applies)."""
    with tempfile.TemporaryDirectory(prefix="lint-") as tmp:
        for rel, text in files.items():
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_text(text)
        proc = subprocess.run([_ruff(), "check", "--no-cache", "--output-format", "json", "."], cwd=tmp,
                              check=False, capture_output=True, text=True, timeout=60)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"ruff failed ({proc.returncode}): {proc.stderr.strip()[:500]}")
    diagnostics = json.loads(proc.stdout or "[]")
    for d in diagnostics:
        d["filename"] = Path(d["filename"]).resolve().relative_to(Path(tmp).resolve()).as_posix()
    return diagnostics


def _report(diagnostics: list[dict]) -> str:
    return "\n".join(f"{d['filename']}:{d['location']['row']}:{d['location']['column']}: {d['code']} {d['message']}"
                     for d in sorted(diagnostics, key=lambda d: (d["filename"], d["location"]["row"])))


def _inject(project: SourceProject, path: str, rng: random.Random, how_many: int) -> tuple[str, list[str]] | None:
    """`path` with up to `how_many` verified injections of distinct kinds, or None if none fits."""
    source, done = project.files[path], []
    before = Counter(d["code"] for d in ruff_diagnostics(project.files))
    kinds = list(INJECTORS)
    rng.shuffle(kinds)
    for kind in kinds:
        if len(done) == how_many:
            break
        code, injector = INJECTORS[kind]
        options = injector(source, rng)
        if not options:
            continue
        description, candidate = rng.choice(options)
        after = Counter(d["code"] for d in ruff_diagnostics({**project.files, path: candidate}))
        new = after - before
        if new[code] == 1 and set(new) <= {code, *SIDE_EFFECT_CODES} and not before - after:
            source, before = candidate, after
            done.append(f"{code} {description}")
    return (source, done) if done else None


def generate(project: SourceProject, rng: random.Random, max_tasks: int,
             stats: Counter | None = None) -> Iterator[TaskSpec]:
    if ruff_diagnostics(project.files):
        count(stats, "rejected: project not ruff-clean")
        return
    made, tried, seen = 0, 0, set()
    while made < max_tasks and tried < CANDIDATES_PER_TASK * max_tasks:
        tried += 1
        path = rng.choice(project.source_files)
        injected = _inject(project, path, rng, rng.randint(1, MAX_INJECTIONS))
        if injected is None:
            count(stats, "rejected: not enough injection sites")
            continue
        source, injections = injected
        if source in seen:
            continue
        seen.add(source)
        count(stats, "candidates")
        repo = project.visible_repo({**project.files, path: source})
        report = _report(ruff_diagnostics({**project.files, path: source}))
        spec = TaskSpec(
            id=task_id(project, FAMILY, path, source),
            instruction=rng.choice(_TEMPLATES).format(report=report, path=path),
            test_command=f"{LINT_COMMAND} && {project.test_command}",
            repo=repo,
            hidden=project.hidden_files,
            gold_patch=make_patch(repo, project.visible_repo()),
            meta={"family": FAMILY, "tier": project.tier, "project": project.name, "file": path,
                  "injections": injections},
        )
        if validated(spec, stats).ok:
            made += 1
            yield spec
