"""What every task family shares: source projects, task specs, candidate validation, failure reports.

A family turns a `SourceProject` into `TaskSpec`s (the keyword arguments of `env.tasks.write_task`).
Every candidate goes through `validate()` before it becomes a task: the untouched repo must
fail grading (`noop` does not solve it) and the reference solution must pass (`gold` does),
both graded by `env.grading.grade`, the same checker the RL reward and evaluation use.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
import shutil
import sysconfig
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from data import pyast
from env.grading import Grade, grade
from env.patch_apply import apply_patch
from env.tasks import load_task, write_task

MICRO_PREFIX = "micro_"
# whole visible repo of a micro task (module + its tests): about 900 tokens, so the module, a test run's
# output and the prompt fit a 2,048-token context
MICRO_MAX_CHARS = 3000
VALIDATION_TIMEOUT_S = 10  # a mutant that hangs longer is rejected: every RL rollout would pay for it
SUPPORT_FILES = ("conftest.py", "ruff.toml")  # kept pristine in hidden/ (tests' sys.path, lint rules)
STDLIB_TEST_COMMAND = "python -m unittest -q test_{name}"


@dataclass
class SourceProject:
    """A small real project with tests: a curated one under data/projects/ or a stdlib module."""

    name: str
    description: str
    license: str
    test_command: str
    files: dict[str, str]  # every file of the project except project.json, relative posix paths
    kind: str = "curated"  # "curated" | "stdlib"

    @property
    def tier(self) -> str:
        return "micro" if self.name.startswith(MICRO_PREFIX) else "repo"

    def is_test_file(self, rel: str) -> bool:
        return rel.startswith("tests/") or Path(rel).name.startswith("test_")

    @property
    def source_files(self) -> list[str]:
        """The project's own modules: what families mutate (never tests or support files)."""
        return sorted(rel for rel in self.files if rel.endswith(".py") and not self.is_test_file(rel)
                      and rel not in SUPPORT_FILES)

    @property
    def test_files(self) -> dict[str, str]:
        return {rel: text for rel, text in self.files.items() if self.is_test_file(rel)}

    @property
    def hidden_files(self) -> dict[str, str]:
        """Pristine copies laid over the workspace before grading, so editing tests or lint rules does not pay."""
        return {rel: text for rel, text in self.files.items() if self.is_test_file(rel) or rel in SUPPORT_FILES}

    def visible_repo(self, files: dict[str, str] | None = None) -> dict[str, str]:
        """The agent's starting repo: all files for `repo` tier, the modules and their tests for `micro`.

        A micro task has to fit a tiny model's context, so its README and conftest stay out; its tests
        stay in, so that `run_tests` runs them (without them it reports "no tests ran" and the agent can
        never check its work), and so does ruff.toml, so that `lint` and the lint step of `run_tests`
        flag what the grader flags. Grading still lays the pristine copies from hidden/ over them.
        """
        files = self.files if files is None else files
        if self.tier == "micro":
            keep = [*self.source_files, *sorted(self.test_files), *(f for f in ("ruff.toml",) if f in files)]
            return {rel: files[rel] for rel in keep}
        return dict(files)


def load_project(root: Path) -> SourceProject:
    root = Path(root)
    spec_file = root / "project.json"
    if not spec_file.is_file():
        raise ValueError(f"source project {str(root)!r}: missing project.json")
    try:
        spec = json.loads(spec_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"source project {str(root)!r}: project.json is not valid JSON ({e})") from None
    missing = [k for k in ("name", "description", "license", "test_command") if not spec.get(k)]
    if missing:
        raise ValueError(f"source project {str(root)!r}: project.json lacks {missing}")
    if spec["name"] != root.name:
        raise ValueError(f"source project {str(root)!r}: project.json name {spec['name']!r} != directory name")
    files = {
        p.relative_to(root).as_posix(): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "project.json" and not CACHE_DIRS & set(p.relative_to(root).parts)
        and p.suffix != ".pyc"
    }
    project = SourceProject(spec["name"], spec["description"], spec["license"], spec["test_command"], files)
    if not project.source_files or not project.test_files:
        raise ValueError(f"source project {str(root)!r}: needs at least one module and one test file")
    return project


# tool caches a developer's own runs leave in a project; never part of a task
CACHE_DIRS = {"__pycache__", ".ruff_cache", ".pytest_cache", ".hypothesis", ".mypy_cache", ".git"}


def load_projects(projects_dir: Path, names: list[str] | None = None) -> list[SourceProject]:
    """Every project directory (one holding project.json) under `projects_dir`, sorted by name."""
    projects_dir = Path(projects_dir)
    if not projects_dir.is_dir():
        raise ValueError(f"projects directory {str(projects_dir)!r} does not exist")
    roots = sorted(p.parent for p in projects_dir.glob("*/project.json"))
    if names is not None:
        unknown = set(names) - {r.name for r in roots}
        if unknown:
            raise ValueError(f"unknown project(s) {sorted(unknown)} in {str(projects_dir)!r}")
        roots = [r for r in roots if r.name in names]
    return [load_project(r) for r in roots]


# Small pure-Python stdlib modules whose Lib/test suite runs in about a second and that unittest
# itself does not import (a module unittest imports cannot be shadowed by a local copy without
# breaking the runner; textwrap, fnmatch, difflib, copy, gettext are out for that reason).
STDLIB_MODULES = ("colorsys", "shlex", "graphlib", "fractions", "quopri", "netrc", "getopt", "base64",
                  "cmd", "calendar", "sched", "zipapp")


def load_stdlib_project(name: str) -> SourceProject:
    """Module `<name>.py` + its `Lib/test/test_<name>.py`, run with unittest from the repo root.

    `python -m unittest` puts the working directory first on sys.path, so the local copy shadows
    the installed module; `build_tasks` checks that (a sentinel copy must break the tests).
    """
    lib = Path(sysconfig.get_paths()["stdlib"])
    module, test = lib / f"{name}.py", lib / "test" / f"test_{name}.py"
    if not module.is_file() or not test.is_file():
        raise ValueError(f"stdlib module {name!r}: need {module} and {test}")
    files = {f"{name}.py": module.read_text(), f"test_{name}.py": test.read_text()}
    return SourceProject(f"stdlib_{name}", f"The Python {name} standard-library module and its tests.",
                         "PSF-2.0", STDLIB_TEST_COMMAND.format(name=name), files, kind="stdlib")


# ---------------------------------------------------------------------------------------------


@dataclass
class TaskSpec:
    """One task before it is written: exactly `env.tasks.write_task`'s keyword arguments."""

    id: str
    instruction: str
    test_command: str
    repo: dict[str, str]
    hidden: dict[str, str] | None = None
    gold_patch: str | None = None
    timeout_s: int = 60
    meta: dict = field(default_factory=dict)  # family, tier, project, gold_answer, mutation details...

    def write(self, dest: Path) -> Path:
        return write_task(Path(dest), id=self.id, instruction=self.instruction, test_command=self.test_command,
                          repo=self.repo, hidden=self.hidden, gold_patch=self.gold_patch,
                          timeout_s=self.timeout_s, **self.meta)


def task_id(project: SourceProject, family: str, *parts: object) -> str:
    """Stable id: `<project>-<family>-<8 hex>` where the hash covers what makes the candidate unique."""
    digest = hashlib.sha256(json.dumps([project.name, family, *map(str, parts)]).encode()).hexdigest()
    return f"{project.name}-{family}-{digest[:8]}"


@dataclass
class Validation:
    ok: bool
    reason: str  # why a candidate was rejected ("" when accepted); keys of the manifest's counters
    noop: Grade | None = None
    gold: Grade | None = None


_gold_cache: dict[str, Grade] = {}
_gold_lock = threading.Lock()


def _tree_digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def validate(spec: TaskSpec, timeout_s: float = VALIDATION_TIMEOUT_S) -> Validation:
    """Grade the untouched repo (must fail) and the gold solution (must pass) in the sandbox.

    Gold grades are cached by the exact files graded: for most families the gold state is the
    pristine project, so a project pays for its gold run once, not once per candidate.
    """
    with tempfile.TemporaryDirectory(prefix="candidate-") as tmp:
        task = load_task(spec.write(Path(tmp) / "task"))
        task = dataclasses.replace(task, timeout_s=min(task.timeout_s, int(timeout_s)))
        noop = grade(task, task.repo_dir, "")
        if noop.timed_out:
            return Validation(False, "unsolved repo times out", noop)
        if noop.solved:
            return Validation(False, "unsolved repo passes (equivalent mutant)", noop)
        gold_dir = Path(tmp) / "gold"
        shutil.copytree(task.repo_dir, gold_dir)
        if task.gold_patch:
            apply_patch(gold_dir, task.gold_patch)
        submission = task.gold_answer or ""
        key = _tree_digest(task.test_command, submission, spec.hidden or {},
                           {p.relative_to(gold_dir).as_posix(): p.read_text()
                            for p in sorted(gold_dir.rglob("*")) if p.is_file()})
        with _gold_lock:
            gold = _gold_cache.get(key)
        if gold is None:
            gold = grade(task, gold_dir, submission)
            with _gold_lock:
                _gold_cache[key] = gold
        if not gold.solved:
            return Validation(False, "gold solution fails", noop, gold)
        return Validation(True, "", noop, gold)


def count(stats: Counter | None, key: str) -> None:
    if stats is not None:
        stats[key] += 1


def validated(spec: TaskSpec, stats: Counter | None) -> Validation:
    """`validate`, with the verdict counted in `stats` ("accepted" or "rejected: <reason>")."""
    check = validate(spec)
    count(stats, "accepted" if check.ok else f"rejected: {check.reason}")
    return check


# ---------------------------------------------------------------------------------------------
# Failure reports: the instruction of a bug-fix task reads like a user pasting test output.

_PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+\.py(?:::\S+?)?)(?: - (.*))?$", re.MULTILINE)
_UNITTEST_FAILED = re.compile(r"^(?:FAIL|ERROR): (\w+) \(([\w.]+)\)", re.MULTILINE)
_ERROR_LINE = re.compile(r"^E\s+(.*)$", re.MULTILINE)
_SOURCE_LINE = re.compile(r"^>\s+(.*)$", re.MULTILINE)
_EXCEPTION_LINE = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Exit|Interrupt)\b.*)$", re.MULTILINE)


@dataclass
class FailureReport:
    test: str  # e.g. "tests/test_roman.py::test_round_trip[4-IV]" or "test_shlex.ShlexTest.testQuote"
    message: str  # the exception line, trimmed
    source_line: str  # the failing line of test code ("" when not shown)

    def excerpt(self) -> str:
        lines = [f"> {self.source_line}"] if self.source_line else []
        return "\n".join([*lines, f"E {self.message}"])


def _trim(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_failure(output: str, limit: int = 160) -> FailureReport | None:
    """The first failing test in pytest (-q) or unittest output, or None when none is named."""
    if match := _PYTEST_FAILED.search(output):
        error = _ERROR_LINE.search(output)
        source = _SOURCE_LINE.search(output)
        message = error.group(1) if error else (match.group(2) or "failed")
        return FailureReport(match.group(1), _trim(message, limit), _trim(source.group(1), limit) if source else "")
    if match := _UNITTEST_FAILED.search(output):
        rest = output[match.end():]
        exception = _EXCEPTION_LINE.search(rest)
        return FailureReport(f"{match.group(2)}.{match.group(1)}" if not match.group(2).endswith(match.group(1))
                             else match.group(2), _trim(exception.group(1) if exception else "failed", limit), "")
    return None


def function_nodes(source: str) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of every function and method, in source order."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(pyast.parse(source), "")
    return found
