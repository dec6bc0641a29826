"""Grading: THE checker every stage uses.

`eval.py` calls `grade()` and the RL `outcome` reward calls it, so the two cannot drift apart (nanochat's
`reward()` reuses `evaluate()` for the same reason); the task factory's gold check (data/families/base.py) and
the simulated users' verdict (env/users.py) grade with it too. `grade(task, workspace, submission)` copies the
final workspace, lays the task's hidden/ over it, writes the submitted summary to SUBMISSION_FILE in that copy
and runs the task's `test_command` in the sandbox: exit 0 is solved. The task format: env/tasks.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from env.tasks import Task

SUBMISSION_FILE = ".submission.txt"  # the submitted summary, written before grading
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


def _write_submission(graded: Path, submission: str) -> None:
    """Write the submission file, replacing whatever the agent put at that name: a symlink planted there
    must not make the harness write through it to a host file."""
    from env.workspace import remove_workspace

    target = graded / SUBMISSION_FILE
    if target.is_dir() and not target.is_symlink():
        remove_workspace(target)
    elif target.is_symlink() or target.exists():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(submission)


def grade(task: Task, workspace: Path, submission: str = "") -> Grade:
    """Grade the agent's final workspace: copy it, lay hidden/ over it, run test_command.

    The copy keeps the agent's workspace intact (trajectories can be inspected later) and
    means the hidden files overwrite whatever the agent did to its own copies of them. A workspace
    that cannot be copied grades as unsolved, with the reason in `output`; the submission file
    replaces whatever the agent left at its name (a symlink there is never written through).
    """
    from env.sandbox import Sandbox
    from env.workspace import make_workspace, overlay, remove_workspace

    try:
        graded = make_workspace(Path(workspace), prefix="grade-")
    except (OSError, RecursionError) as e:  # what the agent left cannot be copied: ungradable, not a crash
        return Grade(False, None, False, f"grading failed: the workspace could not be copied ({str(e)[:500]})")
    try:
        if task.hidden_dir is not None:
            overlay(task.hidden_dir, graded)
        _write_submission(graded, submission or "")
        with Sandbox(graded) as sandbox:
            result = sandbox.run(task.test_command, timeout_s=task.timeout_s)
    finally:
        remove_workspace(graded)
    passed, failed = parse_test_counts(result.output)
    return Grade(result.returncode == 0 and not result.timed_out, result.returncode, result.timed_out,
                 result.output, passed, failed, result.wall_s)
