"""The loop's processes: `agent.py serve` (one for the whole loop) and the simulated users (one per cycle).

Both are real processes talking HTTP, as in production. Each is started with PR_SET_PDEATHSIG, so a killed
loop (kill -9 included) takes them with it and a restarted loop starts fresh ones on the same database and
registry (the server marks sessions it was running `interrupted`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from env.budget import Budget
from nanocomposer.agent.serve import read_token

REPO_ROOT = Path(__file__).resolve().parents[2]
PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """The agent server did not start or answered with an error; the message says which."""


try:  # loaded here, in the parent: between fork and exec the child only makes the one call
    _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except OSError:  # not glibc: the children then outlive a kill -9 of the loop (a clean stop still ends them)
    _PRCTL = None


def _die_with_parent() -> None:
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def budget_flags(budget: Budget) -> list[str]:
    """`agent.py serve`'s flags for every field of `budget` (the server's sessions play under all of it)."""
    flags = ["--max-turns", str(budget.max_turns), "--max-new-tokens", str(budget.max_new_tokens),
             "--session-timeout-s", repr(float(budget.max_wall_s)), "--max-malformed-turns",
             str(budget.max_malformed_turns), "--max-output-chars", str(budget.max_output_chars),
             "--command-timeout-s", repr(float(budget.command_timeout_s)),
             "--temperature", repr(float(budget.temperature)), "--top-p", repr(float(budget.top_p)),
             "--seed", str(budget.seed)]
    for flag, value in (("--max-tokens", budget.max_tokens), ("--max-context", budget.max_context)):
        if value is not None:  # None (no cap, the model's context) is the flags' default
            flags += [flag, str(value)]
    return flags


def serve_command(registry: Path, db: Path, *, workers: int, budget: Budget, backend: str) -> list[str]:
    """`agent.py serve --port 0` on `registry` and `db`, its sessions under `budget` (the loop's: the preset's
    episode budget and the trainer's sampling). `budget.seed` is the server's sampling seed: with the users'
    per-conversation sample keys it fixes every session's sampling seeds, so a replayed cycle (or the other
    arm of an A/B) samples its conversations with the same seeds."""
    return [sys.executable, str(REPO_ROOT / "agent.py"), "serve", "--port", "0", "--registry", str(registry),
            "--db", str(db), "--workers", str(workers), *budget_flags(budget), "--answer-timeout-s", "30",
            "--backend", backend, "--max-queue", "1024"]


class AgentServer:
    """`serve_command(registry, db, **serve_options)` as a process; `url` once healthy."""

    def __init__(self, registry: Path, db: Path, *, log: Path, start_timeout_s: float = 120, **serve_options):
        cmd = serve_command(registry, db, **serve_options)
        self.log_file = open(log, "a")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=self.log_file, text=True,
                                     preexec_fn=_die_with_parent)  # noqa: PLW1509 (one prctl call, no locks)
        line = self.proc.stdout.readline()
        if "agent server on http://" not in line:
            self.stop()
            raise ServerError(f"agent.py serve did not start (first line {line.strip()!r}; log {log})")
        self.url = line.split()[3]
        # Every client sends the server's token (written 0600 beside the database at start; docs/agent-server.md).
        self.token = read_token(db)
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if self.http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise ServerError(f"agent server at {self.url} never became healthy (log {log})")
            time.sleep(0.2)

    def current(self) -> str | None:
        return self.http.get("/admin/versions").json()["current"]

    def promote(self, version: str) -> None:
        r = self.http.post("/admin/promote", json={"version": version})
        if r.status_code != 200:
            raise ServerError(f"POST /admin/promote {version!r}: {r.status_code} {r.json().get('error')}")

    def idle(self) -> bool:
        health = self.http.get("/health").json()
        return health["queued"] == 0 and health["running"] == 0

    def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.idle():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    def stop(self) -> None:
        if getattr(self, "http", None) is not None:
            self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log_file.close()


def run_users(url: str, tasks: str, sessions: int, *, recipe: str, seed: int, offset: int, task_limit: int,
              start: int, report: Path, log: Path, token: str, timeout_s: float | None = None) -> dict:
    """Conversations start .. start + sessions - 1 of simulated users (`python -m env.users`, its own process)
    with population seed `seed`, drawing from tasks [offset, offset + task_limit) of the sorted set
    (env.users.draw_tasks). A run cut short continues with `start` past the conversations it played: the
    same users, tasks and sample keys as uncut, none played twice.

    With `timeout_s` the users are stopped (SIGTERM) when it passes: their open sessions run on in the server and
    are collected if they end before the cut-off. Returns the users' report, which says `stopped` and what was
    played when cut short (only {"stopped": True, "after_s": ...} if the users did not stop within 30 s).
    """
    cmd = [sys.executable, "-m", "env.users", "--server", url, "--tasks", tasks, "--sessions", str(sessions),
           "--recipe", recipe, "--seed", str(seed), "--offset", str(offset), "--task-limit", str(task_limit),
           "--start", str(start), "--report", str(report)]
    report.unlink(missing_ok=True)  # what is read back below is this run's
    with open(log, "a") as log_file:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log_file, stderr=log_file,
                                env={**os.environ, "NANOCOMPOSER_TOKEN": token},  # not in argv: ps shows argv
                                preexec_fn=_die_with_parent)  # noqa: PLW1509 (one prctl call, no locks)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the users leave within a long-poll and write their report
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            try:
                return {**json.loads(report.read_text()), "stopped": True, "after_s": timeout_s}
            except (OSError, ValueError):  # killed before its report was written
                return {"stopped": True, "after_s": timeout_s}
    if rc != 0:
        raise ServerError(f"simulated users exited with status {rc} (log {log})")
    return json.loads(report.read_text())
