"""Agent sessions as harness episodes: the user's repository (or a task directory) staged as a `Task`.

A session runs `env.episode.run_episode`, the loop training and eval run, so the model sees the same system
prompt, tools, parsing, budgets and exit statuses. What differs is only where the task comes from:

    stage_repo(repo, instruction)   a private copy of the user's repository becomes the task's repo/ (the base
                                    the session's diff is computed against); no hidden tests; the test command
                                    is the user's or none
    stage_task_dir(task)            simulated traffic: a copy of the task's repo/ (and gold.patch, which only
                                    scripted policies read); hidden/ is NOT staged, so the server never grades
                                    with what only the simulated user knows
    run_session(task, policy, ...)  the episode on a workspace copy of the base; returns the trajectory, the
                                    changes and the diff; the caller applies or discards, then `cleanup()`s
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from env.episode import EpisodeConfig, Trajectory, run_episode
from env.tasks import Task
from env.workspace import remove_workspace
from nanocomposer.agent.changes import Change, compute_changes, render_diff


def _staging_root(source: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="agent-session-"))
    try:
        shutil.copytree(source, root / "repo", symlinks=True)
    except BaseException:
        remove_workspace(root)
        raise
    return root


def stage_repo(repo: Path, instruction: str, test_command: str | None = None,
               gold_patch: str | None = None) -> Task:
    """A task over a private copy of `repo` (taken now: later edits to `repo` do not reach the session)."""
    repo = Path(repo).resolve()
    if not repo.is_dir():
        raise NotADirectoryError(f"repository {str(repo)!r} is not a directory")
    root = _staging_root(repo)
    if gold_patch:
        (root / "gold.patch").write_text(gold_patch)
    return Task(f"repo:{repo.name}", instruction, test_command or "", root,
                meta={"source": "repo", "repo": str(repo), "has_tests": bool(test_command)})


def stage_task_dir(task: Task, instruction: str | None = None) -> Task:
    """The task without its hidden/ directory, in a private copy (its instruction, optionally replaced)."""
    root = _staging_root(task.repo_dir)
    if task.gold_patch:
        (root / "gold.patch").write_text(task.gold_patch)
    meta = {**task.meta, "source": "task_dir", "task_dir": str(task.root), "has_tests": True}
    return Task(task.id, instruction or task.instruction, task.test_command, root, task.timeout_s, meta)


class ObservedPolicy:
    """The policy unchanged, plus a view of the conversation, so a finished turn's tool results can be shown.

    run_episode appends the assistant message and one tool message per call to the list it passes to
    `act`, and only then calls `on_turn`; the last len(calls) messages are that turn's results.
    """

    def __init__(self, policy):
        self.policy = policy
        self.name = getattr(policy, "name", type(policy).__name__)
        self.messages: list[dict] = []

    def reset(self, task: Task) -> None:
        self.policy.reset(task)

    def act(self, messages: list[dict], tools: list[dict]):
        self.messages = messages
        return self.policy.act(messages, tools)

    def results_of(self, record: dict) -> list[str]:
        n = len(record["calls"])
        return [m["content"] for m in self.messages[-n:]] if n else []


@dataclass
class SessionResult:
    task: Task
    trajectory: Trajectory
    changes: list[Change]
    diff: str

    @property
    def base(self) -> Path:
        return self.task.repo_dir

    @property
    def workspace(self) -> Path:
        return Path(self.trajectory.workspace)

    def cleanup(self) -> None:
        remove_workspace(self.workspace)
        remove_workspace(self.task.root)


def run_session(task: Task, policy, config: EpisodeConfig | None = None,
                on_turn: Callable[[dict, list[str]], None] | None = None) -> SessionResult:
    """One episode on a staged task; `on_turn(record, results)` sees each turn with its tool results."""
    observed = ObservedPolicy(policy)
    config = dataclasses.replace(config or EpisodeConfig(), keep_workspace=True,
                                 on_turn=(lambda record: on_turn(record, observed.results_of(record)))
                                 if on_turn else None)
    try:
        traj = run_episode(task, observed, config)
    except BaseException:
        remove_workspace(task.root)
        raise
    if not task.meta.get("has_tests", True):  # no test command: the empty command "passed", which means nothing
        traj.solved, traj.grade = False, {**traj.grade, "solved": None, "note": "no test command"}
    changes = compute_changes(task.repo_dir, Path(traj.workspace))
    return SessionResult(task, traj, changes, render_diff(task.repo_dir, Path(traj.workspace), changes))
