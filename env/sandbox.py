"""Run agent commands in a sandbox: bubblewrap when it works, weaker fallbacks (loudly) when not.

Every command the agent (or a grader) runs goes through `Sandbox.run`. It is the only thing standing
between a policy that is being *trained to act* and the machine the team works on, so it errs on the
side of refusing.

What is covered (bwrap backend, measured on the project machine: root, bubblewrap 0.8, kernel 6.x):
- Filesystem: a fresh mount namespace whose root is an empty tmpfs. Read-only binds of /usr (and
  /bin, /lib, /lib64, /sbin as the symlinks or dirs they are), a minimal /etc (only the entries
  listed in `_ETC_ENTRIES`: binding all of /etc would expose /etc/shadow and ssh host keys, because
  the sandbox user owns every root-owned file, see "Identity"), the Python installation
  (`sys.base_prefix`, `sys.prefix`), /proc, a minimal /dev, a private size-capped tmpfs /tmp, and
  the workspace bound read-write at its real path and used as cwd. Nothing else of the host exists:
  not /root, not /work/main, not the repo's .git, not the host /tmp.
- Identity: user namespace with `--uid 65534 --gid 65534 --cap-drop ALL`, and the kernel's
  no_new_privs (bwrap always sets it). Run as root, bwrap maps inner 65534 to host uid 0, so files
  owned by root on the host appear owned by the sandbox user: the root-owned workspace is writable
  with no chown, and read-only binds are enforced by the mount flags, not by ownership.
- Network: a new, empty network namespace (loopback only, nothing listening): connects fail,
  including to services on the host's 127.0.0.1. Also new pid, ipc, uts and cgroup namespaces;
  nested user namespaces are disabled (`--disable-userns`).
- Processes: `--die-with-parent --new-session`; when the command exits or is killed, the pid
  namespace is torn down, so nothing it started survives (background jobs, setsid, double fork).
- Fork bombs: each run gets a pids cgroup of its own for its duration, with
  `pids.max = Limits.nproc`, when a writable pids controller exists (v1 here). A Sandbox keeps the
  cgroups it made and reuses an idle one (emptied: every process in it killed and gone) for its next
  run; concurrent runs take different ones; `close()` removes them. RLIMIT_NPROC is *not* used as
  root: the kernel never enforces it for host uid 0, and under bwrap the sandbox is host uid 0. The
  cgroup also lets every backend kill all survivors.
- Resource limits on every backend, set by the `/bin/sh` that starts the run (`ulimit`, so no extra
  exec; thread-safe, unlike `preexec_fn`): CPU seconds, address space, file size, open files, core
  dumps off. The same sh first moves itself into the run's cgroup, so every descendant is born there.
- Wall-clock timeout: the whole process group (and the cgroup) is SIGKILLed; reading output never
  waits on a pipe a straggler keeps open. Output is read with a cap (head + tail kept), so a flood
  costs bounded memory.
- Environment: built from an allow-list (`_child_env`) plus the caller's `env`; nothing from
  os.environ leaks (API keys, tokens, WANDB_*, HF_*).

What is NOT covered:
- Aggregate memory: RLIMIT_AS is per process; 512 processes x 4 GiB is not bounded. A memory cgroup
  would bound it; not done. The /tmp tmpfs is capped at `Limits.memory_mb` and counts as host RAM.
- Without a writable pids cgroup (typical for non-root users), the fork bound is RLIMIT_NPROC, which
  counts *all* processes of the host uid (including the caller's own), and is absent for root.
- CPU time is per process: many processes each get `cpu_s`; the wall timeout is the real bound.
- Kernel attack surface: no seccomp filter. Anything bubblewrap's namespaces do not isolate
  (e.g. a kernel bug, /proc info about the kernel) is exposed.
- The workspace itself is fully writable: the agent can delete or corrupt it, plant symlinks in it
  (`workspace.resolve_in` and `workspace.overlay` defend the harness side) and fill it up to the
  per-file size limit times the file count (no disk quota).
- Fallback `unshare` (util-linux unshare, network + pid + mount namespaces): no filesystem isolation.
  Run as root, the command can read and write the whole host filesystem (secrets included).
- Fallback `rlimits` (plain subprocess): no network isolation, no filesystem isolation, and a process
  that leaves the process group (setsid) survives the run unless the pids cgroup catches it.
"""

from __future__ import annotations

import functools
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Self

BACKENDS = ("bwrap", "unshare", "rlimits")
SANDBOX_UID = 65534  # "nobody": the uid commands see inside the bwrap user namespace

# /etc entries programs need (dynamic linker, user/group names, locale/time, TLS roots, shell rc,
# Debian's python3 config). Everything else in /etc (shadow, ssh keys, ...) stays outside.
_ETC_ENTRIES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "hosts",
    "host.conf", "localtime", "timezone", "alternatives", "ssl", "ca-certificates",
    "ca-certificates.conf", "bash.bashrc", "profile", "inputrc", "mime.types", "os-release",
    "debian_version", "gitconfig", "python3", "python3.11",
)
_LOST_PROTECTIONS = {
    "unshare": "filesystem isolation (the command sees and, as root, can write the whole host "
    "filesystem: /root, /work, /etc/shadow) and the dropped uid/capabilities",
    "rlimits": "filesystem isolation, network isolation (the command can reach the network and "
    "host services on 127.0.0.1), the pid namespace (setsid'd children can outlive the run unless "
    "a pids cgroup exists) and the dropped uid/capabilities",
}


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 60  # CPU seconds per process (RLIMIT_CPU)
    memory_mb: int = 4096  # address space per process (RLIMIT_AS); also the size cap of /tmp
    file_size_mb: int = 64  # largest file a process may write (RLIMIT_FSIZE)
    open_files: int = 256  # RLIMIT_NOFILE
    nproc: int = 512  # processes per run (pids cgroup), else RLIMIT_NPROC for non-root


@dataclass
class ExecResult:
    output: str  # stdout+stderr merged; when truncated, head and tail with a note in between
    returncode: int | None  # None if killed on timeout
    timed_out: bool
    truncated: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _warn_loudly(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    print(f"\n!!! nanocomposer sandbox WARNING: {message}\n", file=sys.stderr, flush=True)


def _python_roots() -> list[Path]:
    """Directories holding the interpreter and its packages (venv and base install), deduplicated."""
    roots: list[Path] = []
    for p in (sys.base_prefix, sys.prefix):
        real = Path(p).resolve()
        if real.is_relative_to("/usr") or any(real.is_relative_to(r) for r in roots):
            continue
        roots = [r for r in roots if not r.is_relative_to(real)] + [real]
    return roots


def _child_env(extra: dict[str, str] | None) -> dict[str, str]:
    """The child's whole environment: an allow-list, never a filtered copy of os.environ."""
    venv_bin = Path(sys.prefix) / "bin"
    env = {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "TERM": "dumb",
    }
    for key, value in (extra or {}).items():
        if not isinstance(key, str) or not isinstance(value, str) or "=" in key or not key:
            raise ValueError(f"sandbox env entries must be str -> str with a valid name, got {key!r}: {value!r}")
        env[key] = value
    return env


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
def _pids_cgroup_parent() -> Path | None:
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
    probe = parent / f"probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        (probe / "pids.max").write_text("8")
        probe.rmdir()
        return True
    except OSError:
        return False


class _PidsCgroup:
    """A pids cgroup that holds one run at a time: caps its process count, and lets us kill everything
    in it afterwards. Pooled by a Sandbox and reused, because a fresh one per run (mkdir, then rmdir
    only after the last zombie is reaped) sat on every command's critical path."""

    def __init__(self, parent: Path, max_pids: int):
        self.path = parent / f"sandbox-{uuid.uuid4().hex}"
        self.path.mkdir()
        try:
            (self.path / "pids.max").write_text(str(max_pids))
        except OSError:
            self.path.rmdir()
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

    def remove(self, grace_s: float = 2.0) -> bool:
        """Kill what is left and delete the cgroup; False (after a warning) if it cannot be deleted."""
        deadline = time.monotonic() + grace_s
        if self.kill_all(grace_s):
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
        _warn_loudly(f"sandbox cgroup {self.path} still has processes after {grace_s}s; leaving it")
        return False


# A Sandbox's idle cgroups beyond this are removed: sequential runs cycle through about
# (runs per second) x (orphan-reaping delay) of them, parallel tool calls a few more.
_MAX_IDLE_CGROUPS = 8


def _remove_cgroups(cgroups: list[_PidsCgroup], lock: threading.Lock) -> None:
    """Sandbox.close and its garbage-collection / interpreter-exit fallback (holds no Sandbox ref)."""
    with lock:
        doomed = cgroups[:]
        cgroups.clear()
    for cgroup in doomed:  # outside the lock: a run in flight may be killed here, and checks in after
        cgroup.remove()


# --------------------------------------------------------------------------------------------------
# backends


def _launcher_script(limits: Limits, join_cgroup: bool, use_nproc_rlimit: bool) -> str:
    """Script for `/bin/sh -c SCRIPT JOIN_FILE BACKEND... COMMAND...`: [join the cgroup named by $0,]
    set soft = hard = min(requested, our hard limit) (unprivileged-safe) with `ulimit`, exec the rest.
    One small exec instead of sh + prlimit; any failed step exits sh with the error in the output, so
    the command never runs unconfined."""
    wanted = [  # (dash ulimit flag, resource, value, dash's unit for that flag)
        ("t", resource.RLIMIT_CPU, limits.cpu_s, 1),
        ("v", resource.RLIMIT_AS, limits.memory_mb * 1024 * 1024, 1024),
        ("f", resource.RLIMIT_FSIZE, limits.file_size_mb * 1024 * 1024, 512),
        ("n", resource.RLIMIT_NOFILE, limits.open_files, 1),
        ("c", resource.RLIMIT_CORE, 0, 512),
    ]
    if use_nproc_rlimit:
        wanted.append(("p", resource.RLIMIT_NPROC, limits.nproc, 1))
    steps = ['echo 0 > "$0"'] if join_cgroup else []  # 0 = the writer itself
    for flag, res, value, unit in wanted:
        hard = resource.getrlimit(res)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        steps.append(f"ulimit -{flag} {value // unit}")
    return " && ".join([*steps, 'exec "$@"'])


def _root_dir_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    args += ["--dir", "/etc"]
    for entry in _ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    return args


def _backend_argv(backend: str, workspace: Path, limits: Limits) -> list[str]:
    if backend == "bwrap":
        args = [
            "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL",
            "--die-with-parent", "--new-session",
            *_root_dir_args(),
            "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(limits.memory_mb * 1024 * 1024), "--tmpfs", "/tmp",
        ]
        # After the tmpfs: a venv or workspace under /tmp would otherwise be hidden by it.
        for root in _python_roots():
            args += ["--ro-bind", str(root), str(root)]
        return args + ["--bind", str(workspace), str(workspace), "--chdir", str(workspace), "--"]
    if backend == "unshare":
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        return ["unshare", *user, "--net", "--pid", "--mount", "--mount-proc", "--fork", "--kill-child", "--"]
    if backend == "rlimits":
        return []
    raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {BACKENDS} or 'auto'")


@functools.cache
def backend_unavailable_reason(backend: str) -> str | None:
    """None if `backend` runs `true` on this machine, else why not (probed once per backend)."""
    tool = {"bwrap": "bwrap", "unshare": "unshare", "rlimits": None}[backend]
    if tool and shutil.which(tool) is None:
        return f"{tool} is not installed"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as tmp:
        argv = _backend_argv(backend, Path(tmp).resolve(), Limits()) + ["true"]
        try:
            proc = subprocess.run(argv, check=False, cwd=tmp, env=_child_env(None), capture_output=True, text=True,
                                  timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{backend} probe failed: {exc}"
    if proc.returncode != 0:
        return f"{backend} probe exited {proc.returncode}: {proc.stderr.strip()[:300]}"
    return None


@functools.cache
def detect_backend() -> str:
    """The strongest backend that works here: "bwrap" | "unshare" | "rlimits" (probed once)."""
    reasons = []
    for backend in BACKENDS[:-1]:
        reason = backend_unavailable_reason(backend)
        if reason is None:
            break
        reasons.append(reason)
    else:
        backend = "rlimits"
    if backend != "bwrap":
        _warn_loudly(f"sandbox falls back to '{backend}' ({'; '.join(reasons)}). LOST: "
                     f"{_LOST_PROTECTIONS[backend]}. Do not run untrusted policies on a shared machine.")
    if _pids_cgroup_parent() is None and os.geteuid() == 0:
        _warn_loudly("no writable pids cgroup and running as root: RLIMIT_NPROC is not enforced for "
                     "uid 0, so fork bombs are bounded only by the wall-clock timeout.")
    return backend


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


class Sandbox:
    """Runs commands with `workspace` as the only writable host directory (see module docstring).

    Holds pids cgroups between runs: call `close()` (or use `with Sandbox(...) as sb:`) when done;
    garbage collection and interpreter exit close it too, as a fallback."""

    def __init__(self, workspace: Path, *, backend: str = "auto", limits: Limits = Limits(),
                 env: dict[str, str] | None = None, max_output_chars: int = 16000):
        self.workspace = Path(workspace).resolve(strict=True)
        if not self.workspace.is_dir():
            raise NotADirectoryError(f"sandbox workspace {self.workspace} is not a directory")
        if backend == "auto":
            backend = detect_backend()
        elif backend not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {BACKENDS} or 'auto'")
        if max_output_chars < 2:
            raise ValueError(f"max_output_chars must be >= 2, got {max_output_chars}")
        self.backend = backend
        self.limits = limits
        self.max_output_chars = max_output_chars
        self._env = _child_env(env)
        self._cgroup_parent = _pids_cgroup_parent()
        use_nproc_rlimit = self._cgroup_parent is None and os.geteuid() != 0
        self._launcher = ["/bin/sh", "-c", _launcher_script(limits, self._cgroup_parent is not None, use_nproc_rlimit)]
        self._backend_argv = _backend_argv(backend, self.workspace, limits)
        # Every cgroup made and not yet removed; the idle ones are empty and free for the next run.
        self._cgroups: list[_PidsCgroup] = []
        self._idle_cgroups: list[_PidsCgroup] = []
        self._cgroups_lock = threading.Lock()
        self._closed = False
        self._finalizer = weakref.finalize(self, _remove_cgroups, self._cgroups, self._cgroups_lock)

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

    def run(self, command: str | list[str], timeout_s: float = 30.0) -> ExecResult:
        """Run `command` (str: via /bin/bash -c; list: argv) in the workspace; never raises on failure
        of the command itself, only on harness errors (bad arguments, missing binaries, closed sandbox).
        Safe to call from several threads at once."""
        if isinstance(command, str):
            argv = ["/bin/bash", "-c", command]
        elif isinstance(command, list) and command and all(isinstance(a, str) for a in command):
            argv = list(command)
        else:
            raise TypeError(f"command must be a str or a non-empty list of str, got {command!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")

        cgroup = self._check_out_cgroup()
        try:
            return self._run_in(cgroup, argv, timeout_s)
        finally:
            if cgroup is not None:
                self._check_in_cgroup(cgroup)

    def _check_out_cgroup(self) -> _PidsCgroup | None:
        """An empty cgroup for one run (reused, or made now); None when no pids controller is usable."""
        with self._cgroups_lock:
            if self._closed:
                raise RuntimeError(f"sandbox for {self.workspace} is closed")
            if self._cgroup_parent is None:
                return None
            for i, idle in enumerate(self._idle_cgroups):
                if idle.charged() == 0:
                    return self._idle_cgroups.pop(i)
            cgroup = _PidsCgroup(self._cgroup_parent, self.limits.nproc)
            self._cgroups.append(cgroup)
            return cgroup

    def _check_in_cgroup(self, cgroup: _PidsCgroup) -> None:
        """Pool the cgroup again once nothing of the run is left in it (or remove it: pool full, closed)."""
        emptied = cgroup.kill_all()  # usually already empty: one read of cgroup.procs
        if not emptied:  # stays in self._cgroups, so close() tries again; never reused
            _warn_loudly(f"sandbox cgroup {cgroup.path} still has processes after a run; not reusing it")
            return
        with self._cgroups_lock:
            if not self._closed and len(self._idle_cgroups) < _MAX_IDLE_CGROUPS:
                self._idle_cgroups.append(cgroup)
                return
            owned = cgroup in self._cgroups  # False if a concurrent close() took it already
            if owned:
                self._cgroups.remove(cgroup)
        if owned:
            cgroup.remove()

    def _run_in(self, cgroup: _PidsCgroup | None, argv: list[str], timeout_s: float) -> ExecResult:
        join_file = str(cgroup.join_file) if cgroup is not None else "sh"  # $0 of the launcher script
        full_argv = [*self._launcher, join_file, *self._backend_argv, *argv]
        output = _CappedOutput(self.max_output_chars)
        start = time.monotonic()
        proc = subprocess.Popen(full_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=self.workspace, env=self._env,
                                start_new_session=True, close_fds=True)
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
    def _kill_everything(proc: subprocess.Popen, cgroup: _PidsCgroup | None) -> None:
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
