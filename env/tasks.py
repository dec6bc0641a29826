"""The public task format, and the one grader every stage uses.

A task is a directory:

    task.json    {"id": str, "instruction": str, "test_command": str, "timeout_s": int (optional),
                  ...any extra keys: family, tier, project, split, gold_answer}
    repo/        the files the agent starts with
    hidden/      optional: laid over the final workspace before grading (the agent never sees it)
    gold.patch   optional: a unified diff against repo/ (a/ b/ paths) that solves the task

A task set is a directory of task directories (searched recursively, so a factory output
`out/<split>/<id>/` is a task set, and so is each split).

`grade()` is THE checker: `eval.py` calls it and the RL `outcome` reward calls it, so the
two cannot drift apart (nanochat's `reward()` reuses `evaluate()` for the same reason).
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SUBMISSION_FILE = ".submission.txt"  # the submitted summary, written before grading
REQUIRED_KEYS = {"id": str, "instruction": str, "test_command": str}
DEFAULT_TIMEOUT_S = 60


class TaskError(ValueError):
    """A task directory that cannot be used; the message names the task and the problem."""


@dataclass
class Task:
    id: str
    instruction: str
    test_command: str
    root: Path
    timeout_s: int = DEFAULT_TIMEOUT_S
    meta: dict = field(default_factory=dict)

    @property
    def repo_dir(self) -> Path:
        return self.root / "repo"

    @property
    def hidden_dir(self) -> Path | None:
        hidden = self.root / "hidden"
        return hidden if hidden.is_dir() else None

    @property
    def gold_patch(self) -> str | None:
        patch = self.root / "gold.patch"
        return patch.read_text() if patch.is_file() else None

    @property
    def gold_answer(self) -> str | None:
        """For answer-graded families (locate): what a correct submission says."""
        return self.meta.get("gold_answer")


def load_task(path: str | Path) -> Task:
    root = Path(path)
    where = f"task directory {str(root)!r}"
    if not root.is_dir():
        raise TaskError(f"{where}: not a directory")
    spec_file = root / "task.json"
    if not spec_file.is_file():
        raise TaskError(f"{where}: missing task.json")
    try:
        spec = json.loads(spec_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TaskError(f"{where}: task.json is not valid JSON ({e})") from None
    if not isinstance(spec, dict):
        raise TaskError(f"{where}: task.json must hold a JSON object, got {type(spec).__name__}")
    for key, typ in REQUIRED_KEYS.items():
        if key not in spec:
            raise TaskError(f"{where}: task.json lacks required key {key!r}")
        if not isinstance(spec[key], typ) or not spec[key].strip():
            raise TaskError(f"{where}: task.json key {key!r} must be a non-empty string")
    timeout_s = spec.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise TaskError(f"{where}: task.json key 'timeout_s' must be a positive integer, got {timeout_s!r}")
    if not (root / "repo").is_dir():
        raise TaskError(f"{where}: missing repo/ directory")
    if (root / "hidden").exists() and not (root / "hidden").is_dir():
        raise TaskError(f"{where}: hidden must be a directory")
    meta = {k: v for k, v in spec.items() if k not in (*REQUIRED_KEYS, "timeout_s")}
    return Task(spec["id"], spec["instruction"], spec["test_command"], root.resolve(), timeout_s, meta)


def load_task_set(path: str | Path) -> list[Task]:
    """All tasks below `path` (a task directory itself is a set of one), sorted by id."""
    root = Path(path)
    if not root.is_dir():
        raise TaskError(f"task set {str(root)!r}: not a directory")
    if (root / "task.json").is_file():
        return [load_task(root)]
    dirs = sorted({p.parent for p in root.rglob("task.json") if "repo" not in p.relative_to(root).parts})
    if not dirs:
        raise TaskError(f"task set {str(root)!r}: no task directories (no task.json found below it)")
    tasks, seen = [], {}
    for d in dirs:
        task = load_task(d)
        if task.id in seen:
            raise TaskError(f"task set {str(root)!r}: duplicate task id {task.id!r} in {seen[task.id]} and {d}")
        seen[task.id] = d
        tasks.append(task)
    return sorted(tasks, key=lambda t: t.id)


def _files(tree: Path | dict[str, str]) -> dict[str, str]:
    if isinstance(tree, dict):
        return dict(tree)
    return {
        p.relative_to(tree).as_posix(): p.read_text()
        for p in sorted(tree.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _write_tree(dest: Path, tree: Path | dict[str, str]) -> None:
    if isinstance(tree, Path):
        shutil.copytree(tree, dest, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", ".ruff_cache", ".pytest_cache", ".hypothesis", ".mypy_cache"))
        return
    dest.mkdir(parents=True, exist_ok=True)
    for rel, text in tree.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def write_task(dest: Path, *, id: str, instruction: str, test_command: str, repo: Path | dict[str, str],
               hidden: dict[str, str] | Path | None = None, gold_patch: str | None = None,
               timeout_s: int = DEFAULT_TIMEOUT_S, **meta) -> Path:
    """Write a task directory in the public format; returns its path."""
    dest = Path(dest)
    if dest.exists():
        raise TaskError(f"task directory {str(dest)!r} already exists")
    dest.mkdir(parents=True)
    spec = {"id": id, "instruction": instruction, "test_command": test_command, "timeout_s": timeout_s, **meta}
    (dest / "task.json").write_text(json.dumps(spec, indent=2, ensure_ascii=False) + "\n")
    _write_tree(dest / "repo", repo)
    if hidden:
        _write_tree(dest / "hidden", hidden)
    if gold_patch:
        (dest / "gold.patch").write_text(gold_patch)
    return dest


def make_patch(before: Path | dict[str, str], after: Path | dict[str, str]) -> str:
    """A unified diff (a/ b/ paths, `patch -p1` style) turning `before` into `after`."""
    old, new = _files(before), _files(after)
    chunks = []
    for rel in sorted(old.keys() | new.keys()):
        a, b = old.get(rel), new.get(rel)
        if a == b:
            continue
        diff = difflib.unified_diff(
            (a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
            fromfile=f"a/{rel}" if a is not None else "/dev/null",
            tofile=f"b/{rel}" if b is not None else "/dev/null",
        )
        for line in diff:
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)


def apply_patch(workspace: Path, patch: str) -> None:
    """Apply a unified diff inside `workspace` (raises TaskError with patch's output if it fails)."""
    proc = subprocess.run(
        ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-s"],
        input=patch, text=True, cwd=workspace, capture_output=True, check=False,
    )
    if proc.returncode != 0:
        raise TaskError(f"patch does not apply in {workspace}: {(proc.stdout + proc.stderr).strip()[:2000]}")


_PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|error|errors)\b")


def parse_test_counts(output: str) -> tuple[int | None, int | None]:
    """(passed, failed) from a pytest summary line, or (None, None) when there is none."""
    found = _PYTEST_COUNTS.findall(output)
    if not found:
        return None, None
    passed = sum(int(n) for n, kind in found if kind == "passed")
    failed = sum(int(n) for n, kind in found if kind != "passed")
    return passed, failed


@dataclass
class Grade:
    solved: bool
    returncode: int | None
    timed_out: bool
    output: str
    passed: int | None = None  # pytest counts when the output has a summary line
    failed: int | None = None
    command_s: float = 0.0  # time the test command itself ran

    @property
    def pass_fraction(self) -> float:
        """Share of passing tests (partial credit); 1/0 from `solved` when counts are unknown."""
        if self.solved:
            return 1.0
        if self.passed is None or not (self.passed + (self.failed or 0)):
            return 0.0
        return self.passed / (self.passed + (self.failed or 0))


def grade(task: Task, workspace: Path, submission: str = "") -> Grade:
    """Grade the agent's final workspace: copy it, lay hidden/ over it, run test_command.

    The copy keeps the agent's workspace intact (trajectories can be inspected later) and
    means the hidden files overwrite whatever the agent did to its own copies of them.
    """
    from env.sandbox import Sandbox
    from env.workspace import make_workspace, overlay, remove_workspace

    graded = make_workspace(Path(workspace), prefix="grade-")
    try:
        if task.hidden_dir is not None:
            overlay(task.hidden_dir, graded)
        (graded / SUBMISSION_FILE).write_text(submission or "")
        with Sandbox(graded) as sandbox:
            result = sandbox.run(task.test_command, timeout_s=task.timeout_s)
    finally:
        remove_workspace(graded)
    passed, failed = parse_test_counts(result.output)
    return Grade(result.returncode == 0 and not result.timed_out, result.returncode, result.timed_out,
                 result.output, passed, failed, result.wall_s)


