"""The sandbox's pids cgroups: the fork bound that holds for root, and a way to find every survivor of a run.

One parent cgroup per Sandbox (all its runs together: Limits.episode_nproc) and one child per run
(Limits.nproc); a run's processes are killed through its cgroup's member list, which no setsid or
double fork escapes. Idle cgroups are reused (at most MAX_IDLE_CGROUPS) and a crashed process's
are swept by the next one (`sweep_stale`). Probed once; where no writable pids hierarchy exists
(`pids_cgroup_parent()` is None) the sandbox falls back to RLIMIT_NPROC, which does not bind root,
and says so (env/sandbox.py's docstring, "Processes").
"""

from __future__ import annotations

import functools
import os
import re
import signal
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

from env.workspace import pid_alive


def warn_loudly(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    print(f"\n!!! nanocomposer sandbox WARNING: {message}\n", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# pids cgroup: the fork bound that works for root, and a way to find every survivor of a run


def _mountinfo() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) for each mount of this process."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fstype, _source, super_opts = (post.split() + ["", ""])[:3]
            mounts.append((pre.split()[4], fstype, super_opts))
    return mounts


@functools.cache
def pids_cgroup_parent() -> Path | None:
    """A directory under which per-run pids cgroups can be created, or None (probed once)."""
    try:
        own = {}
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                own[controllers] = path
        for mountpoint, fstype, opts in _mountinfo():
            if fstype == "cgroup" and "pids" in opts.split(","):  # v1
                key = next((k for k in own if "pids" in k.split(",")), None)
                base = Path(mountpoint) / own.get(key, "/").lstrip("/")
                parent = base / "nanocomposer-sandbox"
                parent.mkdir(exist_ok=True)
                return parent if _try_child_cgroup(parent) else None
        for mountpoint, fstype, _ in _mountinfo():
            if fstype == "cgroup2" and "pids" in (Path(mountpoint) / "cgroup.controllers").read_text().split():
                # v2 forbids processes in inner cgroups with controllers, so use a fresh top-level one.
                (Path(mountpoint) / "cgroup.subtree_control").write_text("+pids")
                parent = Path(mountpoint) / "nanocomposer-sandbox"
                parent.mkdir(exist_ok=True)
                (parent / "cgroup.subtree_control").write_text("+pids")
                return parent if _try_child_cgroup(parent) else None
    except OSError:
        return None
    return None


def _try_child_cgroup(parent: Path) -> bool:
    probe = parent / f"probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        (probe / "pids.max").write_text("8")
        probe.rmdir()
        return True
    except OSError:
        return False


class PidsCgroup:
    """A pids cgroup: caps a process count, and lets us kill everything in it afterwards.

    A Sandbox has one for the episode (`sandbox-<owner pid>-<hex>`, pids.max = Limits.episode_nproc)
    and, nested under it, one per concurrent run (`run-<hex>`, pids.max = Limits.nproc), pooled and
    reused, because a fresh one per run (mkdir, then rmdir only after the last zombie is reaped) sat
    on every command's critical path. Nested pids cgroups are hierarchical on v1 and v2: a fork
    fails when either limit is reached."""

    def __init__(self, path: Path, max_pids: int | None = None, nest: bool = False):
        self.path = path
        if max_pids is not None:  # make it (None: adopt an existing one, for the sweep)
            path.mkdir()
            try:
                (path / "pids.max").write_text(str(max_pids))
                if nest and (path / "cgroup.subtree_control").exists():  # v2: let children use pids
                    (path / "cgroup.subtree_control").write_text("+pids")
            except OSError:
                path.rmdir()
                raise
        # How the launching sh joins: by writing 0 ("myself"). On v1, `tasks` moves only the writing
        # thread, which skips the global threadgroup lock that a `cgroup.procs` write takes (an RCU
        # grace period: measured 1-25 ms, worst under load); sh has one thread, so all of it moves.
        # v2 has only cgroup.procs.
        tasks = self.path / "tasks"
        self.join_file = tasks if tasks.exists() else self.path / "cgroup.procs"

    def charged(self) -> int:
        """Processes counted against pids.max: the live ones plus zombies not yet reaped. The init
        bwrap leaves in its pid namespace is orphaned at exit, and the orphan reaper (pid 1) may take
        seconds (~2 s here), so a cgroup is only reused once this is 0 and a run gets all of nproc."""
        try:
            return int((self.path / "pids.current").read_text())
        except FileNotFoundError:
            return 0

    def peak(self) -> int | None:
        """Most processes charged at once since creation (pids.peak, kernel >= 6.1 on v2, 6.x v1)."""
        try:
            return int((self.path / "pids.peak").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:  # removed (Sandbox.close from another thread): nothing is in it
            return []

    def kill_all(self, grace_s: float = 2.0) -> bool:
        """SIGKILL everything in the cgroup until it is empty; False if something is left after `grace_s`."""
        deadline = time.monotonic() + grace_s
        kill_file = self.path / "cgroup.kill"  # v2, kernel >= 5.14: atomic
        has_kill_file = kill_file.exists()
        while pids := self.pids():
            if time.monotonic() > deadline:
                return False
            if has_kill_file:
                kill_file.write_text("1")
            for pid in pids:  # v1: kill repeatedly until empty; pids.max bounds what can respawn
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)
        return True

    def remove(self, grace_s: float = 2.0, warn: bool = True) -> bool:
        """Kill what is left and delete the cgroup (its child cgroups first); False (after a warning)
        if it cannot be deleted."""
        deadline = time.monotonic() + grace_s
        children = [c for c in self.path.iterdir() if c.is_dir()] if self.path.is_dir() else []
        results = [PidsCgroup(child).remove(grace_s, warn) for child in children]  # each, even after a failure
        emptied = all(results)
        if emptied and self.kill_all(grace_s):
            while True:
                try:
                    self.path.rmdir()  # EBUSY until the killed processes' zombies are reaped
                    return True
                except FileNotFoundError:
                    return True
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.001)
        if warn:
            warn_loudly(f"sandbox cgroup {self.path} still has processes after {grace_s}s; leaving it")
        return False


# A Sandbox's idle cgroups beyond this are removed: sequential runs cycle through about
# (runs per second) x (orphan-reaping delay) of them, parallel tool calls a few more.
MAX_IDLE_CGROUPS = 8
# An episode cgroup or a probe, named after the pid that made it. Older versions named theirs
# `sandbox-<hex>`, with no owner: the sweep leaves those alone, as an idle one may belong to a live
# harness still running old code.
_OWNED_CGROUP = re.compile(r"^(?:sandbox|probe)-(\d+)-[0-9a-f]+$")


def sweep_stale() -> list[Path]:
    """Remove the cgroups of harness processes that died without closing their Sandboxes (SIGKILL),
    killing whatever is still inside first; returns what was removed. Runs once per process at the
    first Sandbox; call it at start-up to clean at once. Cheap: one directory listing. The pid check
    assumes the harnesses sharing a cgroup tree share one pid namespace (true here: the tree is our
    own cgroup's)."""
    parent = pids_cgroup_parent()
    if parent is None:
        return []
    removed = []
    for entry in sorted(parent.iterdir()):
        owned = _OWNED_CGROUP.match(entry.name)
        if owned and not pid_alive(int(owned.group(1))) and PidsCgroup(entry).remove(grace_s=1.0, warn=False):
            removed.append(entry)
    return removed


@functools.cache
def sweep_once() -> None:
    try:
        sweep_stale()
    except OSError:  # housekeeping must never stop an episode from starting
        pass


def remove_cgroups(cgroups: list[PidsCgroup], episode: PidsCgroup | None, lock: threading.Lock) -> None:
    """Sandbox.close and its garbage-collection / interpreter-exit fallback (holds no Sandbox ref)."""
    with lock:
        doomed = cgroups[:]
        cgroups.clear()
    for cgroup in doomed:  # outside the lock: a run in flight may be killed here, and checks in after
        cgroup.remove()
    if episode is not None:
        episode.remove()


