"""Run agent commands in a sandbox: bubblewrap when it works, weaker fallbacks (loudly) when not.

Every command the agent (or a grader) runs goes through `Sandbox.run`. It is the only thing standing
between a policy that is being *trained to act* and the machine the team works on, so it errs on the
side of refusing. One `Sandbox` is one episode (or one grading).

What is covered (bwrap backend; measured on the project machine: bubblewrap 0.8, kernel 6.18, cgroup
v1 pids, both as root and as a normal user; tests/test_sandbox_attacks.py plays each attack):
- Identity, run as root (CI, most users here): bwrap joins a user namespace made once per process
  (`_root_userns`: inner 0 -> host 0, inner 65534 -> host 65534, nested user namespaces disabled in
  it), builds the sandbox as inner root, then `setpriv` switches the command to uid/gid 65534 with
  no capabilities, an empty bounding set and no_new_privs. So the command is HOST uid 65534 (nobody),
  not root: host files are protected by their ordinary permissions, a file it makes is owned by
  65534 (a setuid bit on it gives nobody's rights, never root's), /proc/sys and /proc/sysrq-trigger
  are not writable (and are mounted read-only, with /proc/irq and /proc/bus). The
  workspace is handed to 65534 (chown, never following symlinks) at Sandbox creation and again
  before each run, for files the harness's own tools wrote in between. Cost: setpriv is one more
  exec per run (measured +7% to +17% on a sandboxed `python -c pass`, on a loaded 2-core machine);
  bwrap 0.8/0.9 cannot switch the uid itself after joining a namespace (it calls setuid before
  mounting, and loses the capabilities the mounts need).
- Identity, run as a normal user: inner uid 65534 is the caller's uid (bwrap --unshare-user
  --disable-userns); the command can do what that user can, no more. /proc/sys, sysrq-trigger, irq
  and bus are mounted read-only here too.
- Filesystem: a fresh mount namespace whose root is an empty tmpfs. Read-only binds of /usr (and
  /bin, /lib, /lib64, /sbin as the symlinks or dirs they are), a minimal /etc (only the entries in
  `_ETC_ENTRIES`: TLS roots are /etc/ssl/certs and ca-certificates, never /etc/ssl/private; no
  shadow, no ssh keys), the Python installation (`sys.base_prefix`, `sys.prefix`, resolved; a prefix
  reached through a symlink gets the same link inside, so `sys.executable` runs there), a fresh /proc, a
  minimal /dev, private size-capped tmpfs /tmp (`Limits.tmp_mb`) and /dev/shm (`Limits.shm_mb`),
  and the workspace bound read-write at its real path and used as cwd. Nothing else of the host
  exists: not /root, not /work/main, not the repo's .git, not the host /tmp.
- Disk: run as root, `env.workspace.make_workspace` mounts each workspace as its own tmpfs capped at
  `size_mb` (= `Limits.disk_mb` by default) with a capped inode count, `nosuid,nodev`: a REAL cap,
  writes past it fail with ENOSPC. Otherwise (a normal user cannot mount; or a directory not made by
  make_workspace) there is NO quota: the workspace is measured after every run, and a run that left
  it over `Limits.disk_mb` fails (`ExecResult.disk_exceeded`, a note in the output). That check is
  after the fact: within one run's timeout a command can write far more (bounded by RLIMIT_FSIZE per
  file and the host disk). /tmp and /dev/shm are real caps in every case.
- Setuid files: the workspace tmpfs is nosuid on the host; workspaces sit in 0700 directories
  under a 0700 per-uid parent (no other local user can reach them); every run ends by clearing
  setuid/setgid bits in the workspace; copies (grading's) never carry them, nor xattrs.
- Network: a new, empty network namespace (loopback only, nothing listening): connects fail,
  including to services on the host's 127.0.0.1. Also new pid, ipc, uts and cgroup namespaces.
- Processes: `--die-with-parent --new-session`; when the command exits or is killed, the pid
  namespace is torn down, so nothing it started survives (background jobs, setsid, double fork).
- Fork bombs and parallel calls: a Sandbox runs at most `Limits.max_concurrent_runs` commands at once
  (more calls wait). With a writable pids controller (v1 or v2; root here), the Sandbox has a parent
  pids cgroup (`sandbox-<pid>-<hex>`, pids.max = `Limits.episode_nproc`) holding one child cgroup per
  concurrent run (pids.max = `Limits.nproc`), so the episode as a whole is bounded, however many
  calls or bombs it starts. Without one (a normal user here): RLIMIT_NPROC = `Limits.nproc`, which
  the kernel checks against every process of the host uid (measured: the bound is shared by all
  runs, all sandboxes and the caller's own processes, so one bomb can starve the other runs; the
  user namespaces bwrap makes do not give each run its own count).
- Leftovers of a killed harness: cgroups and workspaces are named after their owner pid;
  `sweep_stale()` (here) and `env.workspace.sweep_stale_workspaces()` remove those whose owner is
  dead, killing what is left inside first. Each runs once per process on first use; runners may call
  them at start-up.
- Resource limits on every backend, set by the `/bin/sh` that starts the run (`ulimit`, so no extra
  exec; thread-safe, unlike `preexec_fn`): CPU seconds, address space, file size, open files, core
  dumps off. The same sh first moves itself into the run's cgroup, so every descendant is born there.
- Wall-clock timeout: the whole process group (and the cgroup) is SIGKILLed; reading output never
  waits on a pipe a straggler keeps open. Output is read with a cap (head + tail kept), so a flood
  costs bounded memory.
- Environment: built from an allow-list (`child_env`) plus the caller's `env`; nothing from
  os.environ leaks (API keys, tokens, WANDB_*, HF_*).

| attack (tests/test_sandbox_attacks.py)         | root (bwrap)                  | normal user (bwrap)           |
|------------------------------------------------|-------------------------------|-------------------------------|
| write /proc/sys/*, /proc/sysrq-trigger         | EACCES, ro mount; host same   | EACCES, ro mount; host same   |
| setuid copy of bash in the workspace           | owned by 65534, bit cleared   | owned by the user, bit cleared |
| read /etc/ssl/private, /etc/shadow             | absent                        | absent                        |
| fill /tmp, /dev/shm                            | ENOSPC at tmp_mb / shm_mb     | same                          |
| fill the workspace                             | ENOSPC at disk_mb (tmpfs)     | call fails after the run      |
| 48 parallel runs, fork bombs                   | <= episode_nproc (cgroup)     | <= nproc for the uid (rlimit) |
| harness SIGKILLed                              | next sweep removes all        | workspaces swept; no cgroups  |

What is NOT covered:
- Aggregate memory: RLIMIT_AS is per process; many processes x 4 GiB is not bounded. A memory cgroup
  would bound it; not done. /tmp, /dev/shm and (as root) the workspace are tmpfs: host RAM.
- Inode count of /tmp and /dev/shm (bwrap 0.8 cannot cap it): bounded by the run's timeout only.
- CPU time is per process: many processes each get `cpu_s`; the wall timeout is the real bound.
- Kernel attack surface: no seccomp filter. Anything bubblewrap's namespaces do not isolate
  (e.g. a kernel bug, /proc info about the kernel) is exposed.
- The workspace itself is fully writable: the agent can delete or corrupt it and plant symlinks in
  it (`workspace.resolve_in` and `workspace.overlay` defend the harness side).
- Host uid 65534 is shared with any other service running as nobody on the machine.
- Run as root: the command inherits bwrap's fd of `_root_userns` (fd 3). It cannot use it (joining
  needs capabilities in that namespace, and it has none). Bind sources below a directory owned by a
  third uid and closed to others (e.g. a workspace under /home/alice, mode 0700) cannot be reached by
  the namespace's root: such runs fail with bwrap's error.
- The stale-owner sweeps assume the harnesses sharing a directory / cgroup tree share a pid
  namespace; a live harness in another pid namespace could have its leftovers taken for dead.
- Root without setpriv or unshare (util-linux): bwrap maps the sandbox to HOST ROOT as before (a
  loud warning says so): the setuid and /proc attacks above are then only partly covered.
- Fallback `unshare` (util-linux unshare, network + pid + mount namespaces): no filesystem isolation.
  Run as root, the command can read and write the whole host filesystem (secrets included).
- Fallback `rlimits` (plain subprocess): no network isolation, no filesystem isolation, and a process
  that leaves the process group (setsid) survives the run unless the pids cgroup catches it.

Split by mechanism: this module is `Sandbox` (a run's lifecycle, output capping, the workspace's ownership
and size); env/sandbox_launch.py builds each backend's argv (bwrap's mounts and identity, `_root_userns`,
the rlimit launcher) and picks the backend; env/sandbox_cgroups.py makes, reuses and sweeps the pids cgroups.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import select
import signal
import stat
import subprocess
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from env.sandbox_cgroups import (
    MAX_IDLE_CGROUPS,
    PidsCgroup,
    pids_cgroup_parent,
    remove_cgroups,
    sweep_once,
    warn_loudly,
)
from env.sandbox_launch import (
    SANDBOX_BACKENDS,
    Limits,
    backend_argv,
    bwrap_host_uid,
    child_env,
    detect_backend,
    launcher_script,
)


@dataclass
class ExecResult:
    output: str  # stdout+stderr merged; when truncated, head and tail with a note in between
    returncode: int | None  # None if killed on timeout
    timed_out: bool
    truncated: bool
    wall_s: float
    disk_exceeded: bool = False  # the workspace outgrew Limits.disk_mb during this run (the output says so)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.disk_exceeded



# --------------------------------------------------------------------------------------------------


class _CappedOutput:
    """Keeps the first and last `cap // 2` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.head_cap, self.tail_cap = cap // 2, cap - cap // 2
        self.head, self.tail = bytearray(), bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > 2 * self.tail_cap + 65536:  # trim in batches: amortized O(1) per byte
            del self.tail[: len(self.tail) - self.tail_cap]

    def text(self) -> tuple[str, bool]:
        tail = self.tail[-self.tail_cap :] if self.tail_cap else b""
        cut = self.total - len(self.head) - len(tail)
        if cut <= 0:
            return (self.head + self.tail).decode("utf-8", "replace"), False
        note = f"\n[... {cut} bytes of output cut; showing the first {len(self.head)} and last {len(tail)} ...]\n"
        return self.head.decode("utf-8", "replace") + note + bytes(tail).decode("utf-8", "replace"), True


_MAX_WALK_DEPTH = 200  # directory levels _walk_tree follows (it holds two fds per level)
_PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID


def _is_capped_mount(path: Path, disk_mb: int) -> bool:
    """True when `path` is a mount point whose whole filesystem is at most `disk_mb` (a capped tmpfs)."""
    if not os.path.ismount(path):
        return False
    fs = os.statvfs(path)
    return fs.f_blocks * fs.f_frsize <= disk_mb * 1024 * 1024


def _walk_tree(root: Path, chown_to: tuple[int, int] | None, strip: bool) -> tuple[int, bool]:
    """(bytes allocated under `root`, whether the walk saw everything); on the way, chown entries to
    `chown_to` and/or clear setuid/setgid bits of regular files. Safe against the agent swapping entries
    for symlinks meanwhile (a run of the same Sandbox may be going on): every step is relative to an
    open directory fd, and nothing is followed (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW, chmod through an
    O_PATH fd). Does not descend past _MAX_WALK_DEPTH levels (then it saw not everything)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    total, complete = 0, True
    top = os.open(root, flags)
    try:
        st = os.fstat(top)
        if chown_to is not None and (st.st_uid, st.st_gid) != chown_to:
            os.fchown(top, *chown_to)
        stack = [(top, os.scandir(top))]
    except BaseException:
        os.close(top)
        raise
    try:
        while stack:
            dir_fd, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                os.close(dir_fd)
                stack.pop()
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                total += st.st_blocks * 512
                if chown_to is not None and (st.st_uid, st.st_gid) != chown_to:
                    os.chown(entry.name, *chown_to, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if len(stack) >= _MAX_WALK_DEPTH:
                        complete = False
                        continue
                    child = os.open(entry.name, flags, dir_fd=dir_fd)
                    stack.append((child, os.scandir(child)))
                elif strip and stat.S_ISREG(st.st_mode) and st.st_mode & _PRIVILEGE_BITS:
                    _clear_privilege_bits(dir_fd, entry.name)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed or swapped (a symlink now: ELOOP is an OSError too) since the listing
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
    finally:
        for dir_fd, entries in stack:
            entries.close()
            os.close(dir_fd)
    return total, complete


def _clear_privilege_bits(dir_fd: int, name: str) -> None:
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & _PRIVILEGE_BITS:
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) & ~_PRIVILEGE_BITS)
    finally:
        os.close(fd)


class SandboxClosed(RuntimeError):
    """`run` on a sandbox that was closed: expected while a run stops (it closes live sandboxes to kill
    what runs), so callers report it as an ordinary failed call, not as a harness bug."""


class Sandbox:
    """Runs commands with `workspace` as the only writable host directory (see module docstring).

    One Sandbox is one episode: its runs share a process bound (a parent pids cgroup) and at most
    `limits.max_concurrent_runs` of them run at once. Run as root under bwrap, it hands the workspace
    to the sandbox uid (chown; again before each run, for files the harness wrote since).
    Holds pids cgroups between runs: call `close()` (or use `with Sandbox(...) as sb:`) when done;
    garbage collection and interpreter exit close it too, as a fallback."""

    def __init__(self, workspace: Path, *, backend: str = "auto", limits: Limits = Limits(),
                 env: dict[str, str] | None = None, max_output_chars: int = 16000):
        self.workspace = Path(workspace).resolve(strict=True)
        if not self.workspace.is_dir():
            raise NotADirectoryError(f"sandbox workspace {self.workspace} is not a directory")
        if backend == "auto":
            backend = detect_backend()
        elif backend not in SANDBOX_BACKENDS:
            raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {SANDBOX_BACKENDS} or 'auto'")
        if max_output_chars < 2:
            raise ValueError(f"max_output_chars must be >= 2, got {max_output_chars}")
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits, got {type(limits).__name__}")
        self.backend = backend
        self.limits = limits
        self.max_output_chars = max_output_chars
        self._env = child_env(env)
        # The workspace must belong to the sandbox uid when that is not ours (bwrap run as root).
        host_uid = bwrap_host_uid() if backend == "bwrap" else os.geteuid()
        self._owner = (host_uid, host_uid) if host_uid != os.geteuid() else None
        # A workspace that is its own filesystem no larger than disk_mb (make_workspace's tmpfs as root)
        # is capped by the kernel; any other is measured after each run.
        self._disk_capped = _is_capped_mount(self.workspace, limits.disk_mb)
        self._walk_workspace(chown=True)
        self._cgroup_parent = pids_cgroup_parent()
        if self._cgroup_parent is not None:
            sweep_once()
        use_nproc_rlimit = self._cgroup_parent is None and (backend == "bwrap" and host_uid != 0
                                                            or os.geteuid() != 0)
        self._launcher = ["/bin/sh", "-c", launcher_script(limits, self._cgroup_parent is not None, use_nproc_rlimit)]
        self.backend_argv, self._pass_fds = backend_argv(backend, self.workspace, limits)
        self._run_slots = threading.BoundedSemaphore(limits.max_concurrent_runs)
        # The episode's cgroup (all runs nested in it), every run cgroup made and not yet removed, and
        # the idle ones (empty, free for the next run).
        self._episode = None
        if self._cgroup_parent is not None:
            self._episode = PidsCgroup(self._cgroup_parent / f"sandbox-{os.getpid()}-{uuid.uuid4().hex[:16]}",
                                        limits.episode_nproc, nest=True)
        self._cgroups: list[PidsCgroup] = []
        self._idle_cgroups: list[PidsCgroup] = []
        self._cgroups_lock = threading.Lock()
        self._closed = False
        self._finalizer = weakref.finalize(self, remove_cgroups, self._cgroups, self._episode, self._cgroups_lock)

    def close(self) -> None:
        """Kill whatever still runs and remove this sandbox's cgroups. Idempotent; `run` then raises."""
        with self._cgroups_lock:
            self._closed = True
            self._idle_cgroups.clear()
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def process_peak(self) -> int | None:
        """Most processes this episode held at once (its cgroup's pids.peak); None without one."""
        return self._episode.peak() if self._episode is not None else None

    def run(self, command: str | list[str], timeout_s: float = 30.0) -> ExecResult:
        """Run `command` (str: via /bin/bash -c; list: argv) in the workspace; never raises on failure
        of the command itself, only on harness errors (bad arguments, missing binaries, closed sandbox).
        Safe to call from several threads at once: beyond `limits.max_concurrent_runs`, calls wait for
        a free slot (the wait does not count against `timeout_s`)."""
        if isinstance(command, str):
            argv = ["/bin/bash", "-c", command]
        elif isinstance(command, list) and command and all(isinstance(a, str) for a in command):
            argv = list(command)
        else:
            raise TypeError(f"command must be a str or a non-empty list of str, got {command!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")

        with self._run_slots:
            cgroup = self._check_out_cgroup()
            try:
                self._walk_workspace(chown=True)  # files the harness wrote since the last run
                result = self._run_in(cgroup, argv, timeout_s)
            finally:
                if cgroup is not None:
                    self._check_in_cgroup(cgroup)
            return self._after_run(result)

    def _walk_workspace(self, chown: bool) -> tuple[int, bool] | None:
        """Before a run: hand harness-made entries to the sandbox uid (chown=True; only when it is
        another uid). After: clear setuid/setgid bits; (bytes used, measured completely)."""
        if chown and self._owner is None:
            return None
        return _walk_tree(self.workspace, chown_to=self._owner if chown else None, strip=not chown)

    def _after_run(self, result: ExecResult) -> ExecResult:
        used, complete = self._walk_workspace(chown=False)
        if self._disk_capped or (complete and used <= self.limits.disk_mb * 1024 * 1024):
            return result
        why = (f"is nested deeper than {_MAX_WALK_DEPTH} directories, too deep to measure" if not complete else
               f"holds {used / 2**20:.0f} MB, over its {self.limits.disk_mb} MB limit")
        note = f"\n[sandbox: the workspace {why}: this call fails; delete files to continue]"
        return dataclasses.replace(result, output=result.output + note, disk_exceeded=True)

    def _check_out_cgroup(self) -> PidsCgroup | None:
        """An empty cgroup for one run (reused, or made now); None when no pids controller is usable."""
        with self._cgroups_lock:
            if self._closed:
                raise SandboxClosed(f"sandbox for {self.workspace} is closed")
            if self._episode is None:
                return None
            for i, idle in enumerate(self._idle_cgroups):
                if idle.charged() == 0:
                    return self._idle_cgroups.pop(i)
            cgroup = PidsCgroup(self._episode.path / f"run-{uuid.uuid4().hex[:16]}", self.limits.nproc)
            self._cgroups.append(cgroup)
            return cgroup

    def _check_in_cgroup(self, cgroup: PidsCgroup) -> None:
        """Pool the cgroup again once nothing of the run is left in it (or remove it: pool full, closed)."""
        emptied = cgroup.kill_all()  # usually already empty: one read of cgroup.procs
        if not emptied:  # stays in self._cgroups, so close() tries again; never reused
            warn_loudly(f"sandbox cgroup {cgroup.path} still has processes after a run; not reusing it")
            return
        with self._cgroups_lock:
            if not self._closed and len(self._idle_cgroups) < MAX_IDLE_CGROUPS:
                self._idle_cgroups.append(cgroup)
                return
            owned = cgroup in self._cgroups  # False if a concurrent close() took it already
            if owned:
                self._cgroups.remove(cgroup)
        if owned:
            cgroup.remove()

    def _run_in(self, cgroup: PidsCgroup | None, argv: list[str], timeout_s: float) -> ExecResult:
        join_file = str(cgroup.join_file) if cgroup is not None else "sh"  # $0 of the launcher script
        full_argv = [*self._launcher, join_file, *self.backend_argv, *argv]
        output = _CappedOutput(self.max_output_chars)
        start = time.monotonic()
        proc = subprocess.Popen(full_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=self.workspace, env=self._env,
                                start_new_session=True, close_fds=True, pass_fds=self._pass_fds)
        try:
            timed_out = self._pump(proc, output, deadline=start + timeout_s)
        finally:
            self._kill_everything(proc, cgroup)
            self._drain(proc, output)
            proc.stdout.close()
        returncode = None if timed_out else proc.returncode
        text, truncated = output.text()
        return ExecResult(text, returncode, timed_out, truncated, time.monotonic() - start)

    @staticmethod
    def _pump(proc: subprocess.Popen, output: _CappedOutput, deadline: float) -> bool:
        """Read output until EOF, process exit, or the deadline; True iff the deadline hit first."""
        fd = proc.stdout.fileno()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return proc.poll() is None
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.05))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:  # all writers closed the pipe; wait for the exit, within the deadline
                    try:
                        proc.wait(timeout=max(remaining, 0.001))
                        return False
                    except subprocess.TimeoutExpired:
                        return True
                output.feed(chunk)
            elif proc.poll() is not None:
                return False  # exited; a leftover child may hold the pipe, the kill below ends it

    @staticmethod
    def _kill_everything(proc: subprocess.Popen, cgroup: PidsCgroup | None) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group leader's pgid outlives it while members live
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if cgroup is not None:  # before draining: a straggler could hold the pipe open
            cgroup.kill_all()

    @staticmethod
    def _drain(proc: subprocess.Popen, output: _CappedOutput, grace_s: float = 1.0) -> None:
        """Read what was written before the kill; give up after `grace_s` if something escaped."""
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + grace_s
        while (remaining := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            output.feed(chunk)

