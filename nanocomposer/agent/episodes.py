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
                                    changes and the diff; the caller applies or discards, then `cleanup()`s;
                                    `stopped()` true ends it at its next turn (a server shutting down)

A staged task lives in `<tmp>/agent-session-<pid>-<random>`, named after the process that made it, so
`sweep_stale_sessions` (run when `agent.py serve` and `agent.py run` start) can remove what a killed process
left behind without touching a live server's sessions (as env/workspace.py does for workspaces; the pid check
assumes the processes sharing <tmp> share one pid namespace).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from env.episode import EpisodeConfig, Trajectory, TurnRequest, run_episode
from env.tasks import Task
from env.workspace import (
    DEFAULT_STAGE_MAX_BYTES,
    DEFAULT_STAGE_MAX_FILES,
    StageReport,
    remove_dead_owned,
    remove_workspace,
    stage_tree,
)
from nanocomposer.agent.changes import Change, compute_changes, render_diff

STAGING_PREFIX = "agent-session-"
_STAGING_NAME = re.compile(rf"^{STAGING_PREFIX}(\d+)-[a-z0-9_]{{8}}$")  # <prefix><pid>-<mkdtemp's 8 characters>


def _staging_root(source: Path, max_bytes: int | None = DEFAULT_STAGE_MAX_BYTES,
                  max_files: int | None = DEFAULT_STAGE_MAX_FILES, bytes_flag: str | None = None,
                  files_flag: str | None = None) -> tuple[Path, StageReport]:
    """A new staging directory with `source` copied to its repo/ by `env.workspace.stage_tree`: regular files,
    directories and symlinks only (special files skipped and listed in the report), caps checked before
    copying (StagingError naming the cap)."""
    root = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-"))
    try:
        report = stage_tree(source, root / "repo", max_bytes, max_files, label="repo",
                            bytes_flag=bytes_flag, files_flag=files_flag)
    except BaseException:
        remove_workspace(root)
        raise
    return root, report


def _staging_meta(report: StageReport) -> dict:
    return {"staged": {"files": report.files, "dirs": report.dirs, "symlinks": report.symlinks,
                       "bytes": report.bytes, "skipped": [list(s) for s in report.skipped[:100]],
                       "skipped_count": len(report.skipped)}}


def sweep_stale_sessions(parent: Path | None = None) -> list[Path]:
    """Remove staged sessions (`<parent>/agent-session-<pid>-<random>`, parent: the temp directory) whose
    owning process is dead, e.g. a server killed with SIGKILL; returns what was removed. Names without a
    pid (made before sessions were named after their owner) are left alone: nothing says whose they are."""
    parent = Path(tempfile.gettempdir() if parent is None else parent)
    staged = [e for e in parent.glob(f"{STAGING_PREFIX}*") if not e.is_symlink() and e.is_dir()]
    return remove_dead_owned(staged, _STAGING_NAME)


def stage_repo(repo: Path, instruction: str, test_command: str | None = None,
               gold_patch: str | None = None, *, max_bytes: int | None = DEFAULT_STAGE_MAX_BYTES,
               max_files: int | None = DEFAULT_STAGE_MAX_FILES, bytes_flag: str | None = None,
               files_flag: str | None = None) -> Task:
    """A task over a private copy of `repo` (taken now: later edits to `repo` do not reach the session).

    The copy is `env.workspace.stage_tree`'s: at most `max_files` entries and `max_bytes` bytes of files, checked
    before anything is copied (StagingError, a ValueError, naming the cap and `files_flag`/`bytes_flag`);
    FIFOs, sockets and device nodes are skipped, never opened, and listed in `task.meta["staged"]["skipped"]`."""
    repo = Path(repo).resolve()
    if not repo.is_dir():
        raise NotADirectoryError(f"repository {str(repo)!r} is not a directory")
    root, report = _staging_root(repo, max_bytes, max_files, bytes_flag, files_flag)
    if gold_patch:
        (root / "gold.patch").write_text(gold_patch)
    return Task(f"repo:{repo.name}", instruction, test_command or "", root,
                meta={"source": "repo", "repo": str(repo), "has_tests": bool(test_command), **_staging_meta(report)})


def stage_task_dir(task: Task, instruction: str | None = None) -> Task:
    """The task without its hidden/ directory, in a private copy (its instruction, optionally replaced)."""
    root, _ = _staging_root(task.repo_dir)
    if task.gold_patch:
        (root / "gold.patch").write_text(task.gold_patch)
    meta = {**task.meta, "source": "task_dir", "task_dir": str(task.root), "has_tests": True}
    return Task(task.id, instruction or task.instruction, task.test_command, root, task.timeout_s, meta)


class SessionStopped(RuntimeError):
    """Raised for the policy when its session must end now (the episode ends as policy_error with this)."""


class ObservedPolicy:
    """The policy unchanged, plus a view of the conversation, so a finished turn's tool results can be shown.

    run_episode appends the assistant message and one tool message per call to the list it passes to
    `act`, and only then calls `on_turn`; the last len(calls) messages are that turn's results.

    With an `episode_key`, a policy that samples per request (`act_batch`, a checkpoint) is asked for each turn
    as `TurnRequest(messages, tools, episode_key, turn)`, so its per-turn seeds derive from (its sampling seed,
    the key, the turn) and not from how many sessions the same policy object served before (`act` counts
    them), which depends on the worker a session landed on. Scripted policies are asked with `act`.

    With `stopped`, a turn asked for once it returns true raises SessionStopped instead of generating.
    """

    def __init__(self, policy, episode_key: str | None = None, stopped: Callable[[], bool] | None = None):
        self.policy, self.stopped = policy, stopped
        self.name = getattr(policy, "name", type(policy).__name__)
        self.messages: list[dict] = []
        self.episode_key = episode_key
        self.turn = 0

    def reset(self, task: Task) -> None:
        self.turn = 0
        self.policy.reset(task)

    def act(self, messages: list[dict], tools: list[dict]):
        self.messages = messages
        if self.stopped is not None and self.stopped():
            raise SessionStopped("the session was stopped (the server is shutting down)")
        act_batch = getattr(self.policy, "act_batch", None)
        if self.episode_key is None or not callable(act_batch):
            return self.policy.act(messages, tools)
        (result,) = act_batch([TurnRequest(messages, tools, self.episode_key, self.turn)])
        self.turn += 1
        if isinstance(result, BaseException):
            raise result
        return result

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
                on_turn: Callable[[dict, list[str]], None] | None = None,
                episode_key: str | None = None, stopped: Callable[[], bool] | None = None) -> SessionResult:
    """One episode on a staged task; `on_turn(record, results)` sees each turn with its tool results.
    `episode_key`: what the policy's sampling seeds derive from (ObservedPolicy), recorded in the trajectory.
    `stopped`: polled before each turn; true ends the episode there (ObservedPolicy)."""
    observed = ObservedPolicy(policy, episode_key, stopped)
    config = dataclasses.replace(config or EpisodeConfig(), keep_workspace=True,
                                 on_turn=(lambda record: on_turn(record, observed.results_of(record)))
                                 if on_turn else None)
    try:
        traj = run_episode(task, observed, config, episode_key)
    except BaseException:
        remove_workspace(task.root)
        raise
    if not task.meta.get("has_tests", True):  # no test command: the empty command "passed", which means nothing
        traj.solved, traj.grade = False, {**traj.grade, "solved": None, "note": "no test command"}
    changes = compute_changes(task.repo_dir, Path(traj.workspace))
    return SessionResult(task, traj, changes, render_diff(task.repo_dir, Path(traj.workspace), changes))
