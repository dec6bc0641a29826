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
- Environment: built from an allow-list (`_child_env`) plus the caller's `env`; nothing from
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
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import re
import resource
import select
import shutil
import signal
import stat
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

from env.workspace import DEFAULT_DISK_MB, pid_alive

SANDBOX_BACKENDS = ("bwrap", "unshare", "rlimits")  # how commands are isolated, strongest first; or "auto"
SANDBOX_UID = 65534  # "nobody": the uid commands see inside bwrap; also their host uid when we are root

# /etc entries programs need (dynamic linker, user/group names, locale/time, TLS roots, shell rc,
# Debian's python3 config). Everything else in /etc (shadow, ssh keys, ssl/private, ...) stays outside.
_ETC_ENTRIES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "hosts",
    "host.conf", "localtime", "timezone", "alternatives", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
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
    memory_mb: int = 4096  # address space per process (RLIMIT_AS)
    file_size_mb: int = 64  # largest file a process may write (RLIMIT_FSIZE)
    open_files: int = 256  # RLIMIT_NOFILE
    nproc: int = 512  # processes per run (its pids cgroup), else RLIMIT_NPROC
    episode_nproc: int = 1024  # processes of all runs of one Sandbox together (its parent pids cgroup)
    max_concurrent_runs: int = 4  # runs of one Sandbox at once; more `run` calls wait for a slot
    disk_mb: int = DEFAULT_DISK_MB  # the workspace's size (see "Disk" in the module docstring)
    tmp_mb: int = 512  # size cap of each run's private /tmp (a tmpfs: host RAM)
    shm_mb: int = 64  # size cap of each run's private /dev/shm (a tmpfs: host RAM)

    def __post_init__(self):
        for name, value in vars(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")


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


def _python_aliases(roots: list[Path]) -> list[tuple[Path, Path]]:
    """(path as the host names it, resolved path) for each python prefix reached through a symlink (a venv
    linked into a checkout): bwrap mounts the resolved roots, and a command naming `sys.executable` by its
    unresolved path (tests, tools that spawn themselves) would find nothing there without a link to them."""
    aliases: list[tuple[Path, Path]] = []
    for p in (sys.base_prefix, sys.prefix):
        named, real = Path(os.path.abspath(p)), Path(p).resolve()
        if named == real or named.is_relative_to("/usr") or any(named == a for a, _ in aliases):
            continue
        if any(named.is_relative_to(r) or r.is_relative_to(named) for r in roots):
            continue  # inside (or around) a mounted root: a link there would shadow or be shadowed by it
        aliases.append((named, real))
    return aliases


def _child_env(extra: dict[str, str] | None) -> dict[str, str]:
    """The child's whole environment: an allow-list, never a filtered copy of os.environ."""
    venv_bin = Path(sys.prefix).resolve() / "bin"  # resolved, as mounted: a venv reached by a symlink works too
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
    probe = parent / f"probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        (probe / "pids.max").write_text("8")
        probe.rmdir()
        return True
    except OSError:
        return False


class _PidsCgroup:
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
        results = [_PidsCgroup(child).remove(grace_s, warn) for child in children]  # each, even after a failure
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
            _warn_loudly(f"sandbox cgroup {self.path} still has processes after {grace_s}s; leaving it")
        return False


# A Sandbox's idle cgroups beyond this are removed: sequential runs cycle through about
# (runs per second) x (orphan-reaping delay) of them, parallel tool calls a few more.
_MAX_IDLE_CGROUPS = 8
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
    parent = _pids_cgroup_parent()
    if parent is None:
        return []
    removed = []
    for entry in sorted(parent.iterdir()):
        owned = _OWNED_CGROUP.match(entry.name)
        if owned and not pid_alive(int(owned.group(1))) and _PidsCgroup(entry).remove(grace_s=1.0, warn=False):
            removed.append(entry)
    return removed


@functools.cache
def _sweep_once() -> None:
    try:
        sweep_stale()
    except OSError:  # housekeeping must never stop an episode from starting
        pass


def _remove_cgroups(cgroups: list[_PidsCgroup], episode: _PidsCgroup | None, lock: threading.Lock) -> None:
    """Sandbox.close and its garbage-collection / interpreter-exit fallback (holds no Sandbox ref)."""
    with lock:
        doomed = cgroups[:]
        cgroups.clear()
    for cgroup in doomed:  # outside the lock: a run in flight may be killed here, and checks in after
        cgroup.remove()
    if episode is not None:
        episode.remove()


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
    made = {Path("/etc")}
    for entry in _ETC_ENTRIES:
        path = Path("/etc", entry)
        if path.exists():  # -try: it may still vanish before bwrap binds it
            args += [*_parent_dirs_args(path, made), "--ro-bind-try", str(path), str(path)]
    return args


@functools.cache
def _root_userns() -> tuple[int | None, str | None]:
    """(fd, None) for a user namespace made once per root process, or (None, why not).

    It maps inner 0 -> host 0 and SANDBOX_UID -> host SANDBOX_UID (uids and gids), and allows no
    nested user namespace (user.max_user_namespaces = 0 inside it, which also binds its children).
    bwrap joins it (`--userns`) and builds the sandbox as inner root, whose capabilities cover the
    files of host root, so root-only paths (a Python under /root, workspaces under 0700 parents) can
    still be bound; then the command drops to SANDBOX_UID with setpriv. bwrap 0.8 cannot do that
    switch itself: with --userns and --uid it calls setuid before mounting, and loses its capabilities."""
    script = 'read go && exec /bin/sh -c "echo 0 > /proc/sys/user/max_user_namespaces"'
    try:
        helper = subprocess.Popen(["unshare", "--user", "--", "/bin/sh", "-c", script], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_child_env(None),
                                  close_fds=True)
    except OSError as exc:
        return None, f"cannot start unshare: {exc}"
    fd = None
    try:
        ours, deadline = os.readlink("/proc/self/ns/user"), time.monotonic() + 10
        while os.readlink(f"/proc/{helper.pid}/ns/user") == ours:  # until it has unshared
            if helper.poll() is not None or time.monotonic() > deadline:
                return None, f"unshare --user did not start: {helper.stderr.read().decode(errors='replace')[:200]}"
            time.sleep(0.0002)
        for kind in ("uid", "gid"):
            Path(f"/proc/{helper.pid}/{kind}_map").write_text(f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n")
        fd = os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        _, err = helper.communicate(b"go\n", timeout=10)  # exec'd as mapped root: may set the sysctl
        if helper.returncode != 0:
            os.close(fd)
            return None, f"cannot disable nested user namespaces: {err.decode(errors='replace').strip()[:200]}"
        return fd, None
    except (OSError, subprocess.SubprocessError) as exc:
        if fd is not None:
            os.close(fd)
        return None, f"cannot make the sandbox user namespace: {exc}"
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()


@functools.cache
def _setpriv() -> str | None:
    """setpriv's real path when it lies under /usr (so it exists inside the sandbox)."""
    found = shutil.which("setpriv")
    real = Path(found).resolve() if found else None
    return str(real) if real is not None and real.is_relative_to("/usr") else None


@functools.cache
def _bwrap_identity() -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], str | None]:
    """(bwrap namespace/identity options, command prefix, fds bwrap needs, a warning or None)."""
    drop = ("--cap-drop", "ALL")
    plain = ("--unshare-all", "--unshare-user", "--disable-userns",
             "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), *drop)
    if os.geteuid() != 0:  # inner SANDBOX_UID maps to our own uid: nothing more to drop
        return plain, (), (), None
    fd, why = _root_userns()
    setpriv = _setpriv()
    if fd is None or setpriv is None:
        why = why or "setpriv (util-linux) is not installed under /usr"
        return plain, (), (), (
            f"bwrap cannot drop to an unprivileged host uid ({why}): sandboxed commands run as HOST ROOT "
            "(a setuid file they make in the workspace is a root shell for any local user; root-owned "
            "files are theirs). Install util-linux's setpriv and unshare.")
    namespaces = ("--userns", str(fd), "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                  "--unshare-cgroup-try")
    # bwrap's last steps run as inner root with only these: chdir into the 0700 workspace (owned by the
    # sandbox uid) needs DAC_READ_SEARCH, setpriv the other three; setpriv then drops every
    # capability, the bounding set included, with the uid.
    keep = ("--cap-add", "CAP_DAC_READ_SEARCH", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            "--cap-add", "CAP_SETPCAP")
    prefix = (setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
              "--inh-caps=-all", "--bounding-set=-all", "--")
    return (*namespaces, *drop, *keep), prefix, (fd,), None


def bwrap_host_uid() -> int:
    """The host uid that commands run as under the bwrap backend: SANDBOX_UID when the harness is
    root (0 only in the warned-about case that setpriv/unshare are missing), else the caller's uid."""
    if os.geteuid() != 0:
        return os.geteuid()
    return SANDBOX_UID if _bwrap_identity()[1] else 0


def _parent_dirs_args(path: Path, made: set[Path]) -> list[str]:
    """`--dir` for each ancestor of `path` not made yet, mode 0755: bwrap 0.8 creates a bind's missing
    parents 0700, which the unprivileged sandbox user could not traverse."""
    args = []
    for ancestor in reversed(path.parents[:-1]):  # from the top, without "/"
        if ancestor not in made:
            args += ["--perms", "0755", "--dir", str(ancestor)]
            made.add(ancestor)
    return args


def _bwrap_argv(workspace: Path, limits: Limits) -> list[str]:
    identity = _bwrap_identity()[0]
    args = ["bwrap", *identity, "--die-with-parent", "--new-session", *_root_dir_args(), "--proc", "/proc"]
    # bwrap 0.8 covers these only when its setup may write the directory (never /proc/sys, whose mode is
    # 0555). The host's /proc/sys shows the same values: sysctl files resolve against the reader's own
    # namespaces (net, uts, ipc), not the proc mount's.
    for entry in ("sys", "sysrq-trigger", "irq", "bus"):
        args += ["--ro-bind-try", f"/proc/{entry}", f"/proc/{entry}"]
    args += ["--dev", "/dev",
             "--perms", "1777", "--size", str(limits.shm_mb * 1024 * 1024), "--tmpfs", "/dev/shm",
             "--perms", "1777", "--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    made = {Path(p) for p in ("/usr", "/etc", "/proc", "/dev", "/tmp")}
    # After the tmpfs: a venv or workspace under /tmp would otherwise be hidden by it.
    roots = _python_roots()
    for root in roots:
        args += [*_parent_dirs_args(root, made), "--ro-bind", str(root), str(root)]
        made.add(root)
    for named, real in _python_aliases(roots):
        args += [*_parent_dirs_args(named, made), "--symlink", str(real), str(named)]
        made.add(named)
    return args + [*_parent_dirs_args(workspace, made), "--bind", str(workspace), str(workspace),
                   "--chdir", str(workspace), "--"]


def _backend_argv(backend: str, workspace: Path, limits: Limits) -> tuple[list[str], tuple[int, ...]]:
    """The argv prefix that runs a command under `backend`, and the fds it must inherit."""
    if backend == "bwrap":
        _identity, prefix, fds, _warning = _bwrap_identity()
        return [*_bwrap_argv(workspace, limits), *prefix], fds
    if backend == "unshare":
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        return ["unshare", *user, "--net", "--pid", "--mount", "--mount-proc", "--fork", "--kill-child", "--"], ()
    if backend == "rlimits":
        return [], ()
    raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {SANDBOX_BACKENDS} or 'auto'")


@functools.cache
def backend_unavailable_reason(backend: str) -> str | None:
    """None if `backend` runs `true` on this machine, else why not (probed once per backend)."""
    tool = {"bwrap": "bwrap", "unshare": "unshare", "rlimits": None}[backend]
    if tool and shutil.which(tool) is None:
        return f"{tool} is not installed"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as tmp:
        argv, fds = _backend_argv(backend, Path(tmp).resolve(), Limits())
        try:
            proc = subprocess.run([*argv, "true"], check=False, cwd=tmp, env=_child_env(None), capture_output=True,
                                  text=True, timeout=20, pass_fds=fds)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{backend} probe failed: {exc}"
    if proc.returncode != 0:
        return f"{backend} probe exited {proc.returncode}: {proc.stderr.strip()[:300]}"
    return None


@functools.cache
def detect_backend() -> str:
    """The strongest backend that works here: "bwrap" | "unshare" | "rlimits" (probed once)."""
    reasons = []
    for backend in SANDBOX_BACKENDS[:-1]:
        reason = backend_unavailable_reason(backend)
        if reason is None:
            break
        reasons.append(reason)
    else:
        backend = "rlimits"
    if backend != "bwrap":
        _warn_loudly(f"sandbox falls back to '{backend}' ({'; '.join(reasons)}). LOST: "
                     f"{_LOST_PROTECTIONS[backend]}. Do not run untrusted policies on a shared machine.")
    elif (warning := _bwrap_identity()[3]) is not None:
        _warn_loudly(warning)
    if _pids_cgroup_parent() is None and os.geteuid() == 0 and (backend != "bwrap" or bwrap_host_uid() == 0):
        _warn_loudly("no writable pids cgroup and commands run as root: RLIMIT_NPROC is not enforced for "
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
        self._env = _child_env(env)
        # The workspace must belong to the sandbox uid when that is not ours (bwrap run as root).
        host_uid = bwrap_host_uid() if backend == "bwrap" else os.geteuid()
        self._owner = (host_uid, host_uid) if host_uid != os.geteuid() else None
        # A workspace that is its own filesystem no larger than disk_mb (make_workspace's tmpfs as root)
        # is capped by the kernel; any other is measured after each run.
        self._disk_capped = _is_capped_mount(self.workspace, limits.disk_mb)
        self._walk_workspace(chown=True)
        self._cgroup_parent = _pids_cgroup_parent()
        if self._cgroup_parent is not None:
            _sweep_once()
        use_nproc_rlimit = self._cgroup_parent is None and (backend == "bwrap" and host_uid != 0
                                                            or os.geteuid() != 0)
        self._launcher = ["/bin/sh", "-c", _launcher_script(limits, self._cgroup_parent is not None, use_nproc_rlimit)]
        self._backend_argv, self._pass_fds = _backend_argv(backend, self.workspace, limits)
        self._run_slots = threading.BoundedSemaphore(limits.max_concurrent_runs)
        # The episode's cgroup (all runs nested in it), every run cgroup made and not yet removed, and
        # the idle ones (empty, free for the next run).
        self._episode = None
        if self._cgroup_parent is not None:
            self._episode = _PidsCgroup(self._cgroup_parent / f"sandbox-{os.getpid()}-{uuid.uuid4().hex[:16]}",
                                        limits.episode_nproc, nest=True)
        self._cgroups: list[_PidsCgroup] = []
        self._idle_cgroups: list[_PidsCgroup] = []
        self._cgroups_lock = threading.Lock()
        self._closed = False
        self._finalizer = weakref.finalize(self, _remove_cgroups, self._cgroups, self._episode, self._cgroups_lock)

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

    def _check_out_cgroup(self) -> _PidsCgroup | None:
        """An empty cgroup for one run (reused, or made now); None when no pids controller is usable."""
        with self._cgroups_lock:
            if self._closed:
                raise SandboxClosed(f"sandbox for {self.workspace} is closed")
            if self._episode is None:
                return None
            for i, idle in enumerate(self._idle_cgroups):
                if idle.charged() == 0:
                    return self._idle_cgroups.pop(i)
            cgroup = _PidsCgroup(self._episode.path / f"run-{uuid.uuid4().hex[:16]}", self.limits.nproc)
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
