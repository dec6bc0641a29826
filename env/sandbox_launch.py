"""How the sandbox launches one command: the backends' argv (bwrap, unshare, rlimits), bwrap's mounts and
identity, the launcher script that sets rlimits and joins the run's cgroup, the child's environment, and
`detect_backend`, the strongest backend that works here (probed once, a fallback warned about loudly).

What each backend covers and what it loses is env/sandbox.py's docstring; `Sandbox` (env/sandbox.py) is the
only caller that runs anything.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from env.sandbox_cgroups import pids_cgroup_parent, warn_loudly
from env.workspace import DEFAULT_DISK_MB

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


def python_roots() -> list[Path]:
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


def child_env(extra: dict[str, str] | None) -> dict[str, str]:
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
# backends


def launcher_script(limits: Limits, join_cgroup: bool, use_nproc_rlimit: bool) -> str:
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
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(None),
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
def bwrap_identity() -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], str | None]:
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
    return SANDBOX_UID if bwrap_identity()[1] else 0


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
    identity = bwrap_identity()[0]
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
    roots = python_roots()
    for root in roots:
        args += [*_parent_dirs_args(root, made), "--ro-bind", str(root), str(root)]
        made.add(root)
    for named, real in _python_aliases(roots):
        args += [*_parent_dirs_args(named, made), "--symlink", str(real), str(named)]
        made.add(named)
    return args + [*_parent_dirs_args(workspace, made), "--bind", str(workspace), str(workspace),
                   "--chdir", str(workspace), "--"]


def backend_argv(backend: str, workspace: Path, limits: Limits) -> tuple[list[str], tuple[int, ...]]:
    """The argv prefix that runs a command under `backend`, and the fds it must inherit."""
    if backend == "bwrap":
        _identity, prefix, fds, _warning = bwrap_identity()
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
        argv, fds = backend_argv(backend, Path(tmp).resolve(), Limits())
        try:
            proc = subprocess.run([*argv, "true"], check=False, cwd=tmp, env=child_env(None), capture_output=True,
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
        warn_loudly(f"sandbox falls back to '{backend}' ({'; '.join(reasons)}). LOST: "
                     f"{_LOST_PROTECTIONS[backend]}. Do not run untrusted policies on a shared machine.")
    elif (warning := bwrap_identity()[3]) is not None:
        warn_loudly(warning)
    if pids_cgroup_parent() is None and os.geteuid() == 0 and (backend != "bwrap" or bwrap_host_uid() == 0):
        warn_loudly("no writable pids cgroup and commands run as root: RLIMIT_NPROC is not enforced for "
                     "uid 0, so fork bombs are bounded only by the wall-clock timeout.")
    return backend


