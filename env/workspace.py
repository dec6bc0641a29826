"""Per-episode workspaces: fresh copies of a task repo, strict path resolution, hidden-test overlay.

Every tool that takes a path from the model goes through `resolve_in`, so the agent can never name
a file outside its workspace, whether by `..`, an absolute path, or a symlink it planted itself.
`overlay` is written with the same distrust: the agent may have replaced a file or directory that
hidden/ is about to write with a symlink pointing anywhere, so overlay removes such entries instead
of writing through them.

Where workspaces live, and why (the agent's files must never be a way up to a higher privilege):
- Under one private parent per harness uid, `<tmp>/nanocomposer-<uid>` (mode 0700, owned by that
  uid, refused if it is anything else), each in a 0700 directory named `<prefix><pid>-<random>`
  after the process that made it. Other local users cannot reach a workspace at all.
- Run as root, each workspace is its own tmpfs mount (`nosuid,nodev`, `size=size_mb`, a capped
  inode count): a real disk cap per workspace (writes past it fail with ENOSPC), and setuid bits on
  it are ignored by the host kernel. Without the privilege to mount (a normal user), it is a plain
  directory and `env.sandbox.Sandbox` checks its size after every run instead.
- Copies (`make_workspace`, so also grading's copy of the agent's workspace) never carry setuid or
  setgid bits, extended attributes (file capabilities) or special files (FIFOs, sockets, device
  nodes: a planted FIFO would hang or crash the copy); regular files, directories and symlinks
  (copied as links, never followed) are copied with their permission bits and mtimes.
- A harness killed with SIGKILL cannot remove its workspaces: `sweep_stale_workspaces` removes those
  whose owning pid is dead (run once per process at the first `make_workspace`; call it at start-up).
  The pid check assumes every harness sharing the directory shares one pid namespace.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path, PurePosixPath


class PathError(ValueError):
    """A tool-supplied path that is malformed or leaves the workspace."""


def resolve_in(root: Path, rel: str, *, must_exist: bool = False) -> Path:
    """Resolve `rel` (as given by a tool call) to a real path inside `root`.

    Rejects: non-strings, NUL bytes, absolute paths, any `..` component, and anything whose
    symlink-resolved location is outside `root`. "" means the root itself. Returns the fully
    resolved path, so callers act on exactly what was checked.
    """
    if not isinstance(rel, str):
        raise PathError(f"path must be a string, got {type(rel).__name__}: {rel!r}")
    if "\0" in rel:
        raise PathError(f"path {rel!r} contains a NUL byte")
    rel = rel or "."
    pure = PurePosixPath(rel)
    if pure.is_absolute():
        raise PathError(f"path {rel!r} is absolute; use a path relative to the workspace root")
    if ".." in pure.parts:
        raise PathError(f"path {rel!r} leaves the workspace ('..' is not allowed)")
    root_real = Path(root).resolve(strict=True)
    resolved = (root_real / pure).resolve(strict=False)  # follows every symlink that exists
    if resolved != root_real and not resolved.is_relative_to(root_real):
        raise PathError(f"path {rel!r} resolves outside the workspace (symlink escape to {resolved})")
    if must_exist and not resolved.exists():
        raise PathError(f"path {rel!r} does not exist in the workspace")
    return resolved


DEFAULT_DISK_MB = 1024  # size cap of a workspace (env.sandbox.Limits.disk_mb uses the same default)
_INODES_PER_MB = 64  # inode cap of a tmpfs workspace per MB of size: 65536 files for 1 GiB
_NO_PRIVILEGE_BITS = ~(stat.S_ISUID | stat.S_ISGID) & 0o7777
_MOUNT_SOURCE = "nanocomposer-ws"  # the tmpfs "device" name: how our workspace mounts are recognised
_OWNED_NAME = re.compile(r"-(\d+)-[a-z0-9_]{8}$")  # <prefix><pid>-<mkdtemp's 8 random characters>
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_libc = ctypes.CDLL(None, use_errno=True)


def workspaces_root() -> Path:
    """The private parent of this uid's workspaces: `<tmp>/nanocomposer-<uid>`, created 0700 if missing.

    Refused (PermissionError) when something else stands there: a symlink, a file, or a directory
    another user owns (someone could otherwise read, or swap, what we copy into it)."""
    root = Path(tempfile.gettempdir()) / f"nanocomposer-{os.geteuid()}"
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"workspace parent {root} is not a directory owned by uid {os.geteuid()}; "
                              "remove it (someone else made it) and retry")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(root, 0o700)
    return root


def make_workspace(src: Path, parent: Path | None = None, prefix: str = "ws-",
                   size_mb: int = DEFAULT_DISK_MB) -> Path:
    """Copy the task repo `src` into a new private workspace and return its path.

    The workspace is `<parent>/<prefix><pid>-<random>` (parent: `workspaces_root()` by default), mode
    0700; run as root, a tmpfs of `size_mb` is mounted on it first (see the module docstring). The copy
    keeps symlinks as symlinks (never followed), permission bits without setuid/setgid, and mtimes.
    """
    src = Path(src)
    if not src.is_dir():
        raise FileNotFoundError(f"workspace source {src} is not a directory")
    if not isinstance(size_mb, int) or size_mb < 1:
        raise ValueError(f"workspace size_mb must be a positive int, got {size_mb!r}")
    if parent is None:
        parent = workspaces_root()
        _sweep_once(parent)
    dst = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
    try:
        _mount_capped_tmpfs(dst, size_mb)
        _copy_tree(src, dst)
    except BaseException:
        remove_workspace(dst)
        raise
    return dst


_mount_refused = [os.geteuid() != 0]  # set after the first EPERM: root without CAP_SYS_ADMIN (containers)


def _mount_capped_tmpfs(path: Path, size_mb: int) -> bool:
    """Mount a private tmpfs capped at `size_mb` on `path`; False when this process may not mount."""
    if _mount_refused[0]:
        return False
    options = f"size={size_mb}m,nr_inodes={max(4096, size_mb * _INODES_PER_MB)},mode=0700"
    if _libc.mount(_MOUNT_SOURCE.encode(), os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                   options.encode()) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EPERM, errno.EACCES):
        _mount_refused[0] = True
        return False
    raise OSError(err, f"mounting the workspace tmpfs on {path}: {os.strerror(err)}")


def _our_mounts() -> set[str]:
    """Mount points of workspace tmpfs mounts (ours, by their source name) in this mount namespace."""
    points = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields = post.split()
            if len(fields) >= 2 and fields[0] == "tmpfs" and fields[1] == _MOUNT_SOURCE:
                points.add(pre.split()[4].replace("\\040", " "))
    return points


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy the contents of `src` into the existing directory `dst` (see make_workspace). Iterative:
    an agent's workspace may nest deeper than Python's recursion limit."""
    pending = [(str(src), str(dst))]
    finish: list[tuple[str, os.stat_result]] = []  # directories: modes and mtimes last (0555 ones too)
    while pending:
        source_dir, target_dir = pending.pop()
        for entry in _scandir(source_dir):
            source, target = os.path.join(source_dir, entry.name), os.path.join(target_dir, entry.name)
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(source), target)
            elif stat.S_ISDIR(st.st_mode):
                os.mkdir(target, 0o700)
                pending.append((source, target))
                finish.append((target, st))
            elif stat.S_ISREG(st.st_mode):  # FIFOs, sockets, device nodes: never part of a task's code
                _copy_file(source, target)
                _copy_mode_and_times(target, st)
    for target, st in reversed(finish):  # children before parents: a parent's mtime is set last
        _copy_mode_and_times(target, st)


def _copy_mode_and_times(target: str, st: os.stat_result) -> None:
    os.chmod(target, stat.S_IMODE(st.st_mode) & _NO_PRIVILEGE_BITS)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def _scandir(path: str | Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except PermissionError:  # a directory the agent made unreadable (only non-root callers get here)
        _grant_owner(path, stat.S_IRWXU)
        with os.scandir(path) as it:
            return list(it)


def _copy_file(source: str, target: str) -> None:
    try:
        shutil.copyfile(source, target, follow_symlinks=False)
    except PermissionError:  # a file the agent made unreadable (only non-root callers get here)
        _grant_owner(source, stat.S_IRUSR)
        shutil.copyfile(source, target, follow_symlinks=False)


def _grant_owner(path: str | Path, bits: int) -> None:
    """Add owner permission `bits` to `path` (ours, never a symlink): the agent's chmod 000 must not
    break a copy, and the agent may change its own files anyway."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"cannot read {path} (owned by uid {st.st_uid})")
    os.chmod(path, stat.S_IMODE(st.st_mode) | bits)


def _remove_entry(path: Path) -> None:
    """Remove a file, symlink or directory tree at `path` without following symlinks."""
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        remove_workspace(path)


def overlay(src: Path, dst: Path) -> None:
    """Lay every file of `src` over `dst` (hidden tests before grading); `src` wins on conflicts.

    Anything in `dst` standing where `src` has a directory or file (a symlink, or the wrong kind of
    entry) is removed first, so the copy never writes through an agent-made symlink.
    """
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise FileNotFoundError(f"overlay source {src} is not a directory")
    if dst.is_symlink() or not dst.is_dir():
        raise NotADirectoryError(f"overlay target {dst} is not a real directory")
    for dirpath, dirnames, filenames in os.walk(src):  # top-down: parents are fixed before children
        rel = Path(dirpath).relative_to(src)
        target_dir = dst / rel
        if target_dir.is_symlink() or (target_dir.exists() and not target_dir.is_dir()):
            _remove_entry(target_dir)
        target_dir.mkdir(exist_ok=True)
        entries = filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]
        for name in entries:  # os.walk lists symlinks to dirs as dirs; copy them as links
            target = target_dir / name
            if target.is_symlink() or target.exists():
                _remove_entry(target)
            shutil.copy2(Path(dirpath) / name, target, follow_symlinks=False)
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]


def remove_workspace(path: Path) -> None:
    """Remove a workspace: unmount it if it is one of our tmpfs mounts (that frees it at once), else
    rmtree, including entries the agent made read-only (chmod 000 dirs, 444 files). Idempotent."""

    def make_writable_and_retry(func, failed_path, _exc_info):
        # Only non-root callers get here (root ignores modes). Open up the entry and its parent,
        # then retry once; a second failure propagates instead of looping.
        for p in (os.path.dirname(failed_path), failed_path):
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
        if os.path.isdir(failed_path) and not os.path.islink(failed_path):
            shutil.rmtree(failed_path)
        else:
            func(failed_path)

    path = Path(path)
    if path.is_symlink():
        path.unlink()
        return
    if not path.exists():
        return
    if os.path.ismount(path) and str(path.resolve()) in _our_mounts():
        if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:  # detach: a straggler cannot keep it busy
            err = ctypes.get_errno()
            raise OSError(err, f"unmounting workspace {path}: {os.strerror(err)}")
        path.rmdir()
        return
    try:
        shutil.rmtree(path, onerror=make_writable_and_retry)
    except RecursionError:  # nested deeper than Python's recursion limit: rm walks it without recursion
        for step in (["rm", "-rf", "--one-file-system"], ["chmod", "-R", "u+rwx"], ["rm", "-rf", "--one-file-system"]):
            subprocess.run([*step, "--", str(path)], check=False, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if not path.exists() and not path.is_symlink():
                return
        raise OSError(f"could not remove workspace {path}") from None


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (sweeps of leftovers use it to tell a dead owner from a live one).

    A zombie is dead: it has exited and will never remove what it left, but it keeps its pid until its
    parent reaps it, and a killed run's orphans wait for pid 1, which some container inits never do."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc here: ask the kernel, which cannot tell a zombie apart
        pass
    else:
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def sweep_stale_workspaces(parent: Path | None = None) -> list[Path]:
    """Remove workspaces left by a harness that died without removing them (SIGKILL): those in `parent`
    (default `workspaces_root()`) and our tmpfs mounts anywhere, whose owning pid is dead. Returns
    what was removed. Cheap: one listing and one read of /proc/self/mountinfo."""
    parent = workspaces_root() if parent is None else Path(parent)
    candidates = set(parent.iterdir())
    if not _mount_refused[0]:
        candidates |= {Path(point) for point in _our_mounts()}
    return remove_dead_owned(candidates, _OWNED_NAME)


def remove_dead_owned(entries, owner_pattern: re.Pattern) -> list[Path]:
    """Remove each entry whose name carries an owner pid (`owner_pattern`'s group 1) that is no longer alive;
    names without one are left alone (nothing says whose they are). Returns what was removed."""
    removed = []
    for entry in sorted(entries):
        owner = owner_pattern.search(entry.name)
        if owner is None or pid_alive(int(owner.group(1))):
            continue
        try:
            remove_workspace(entry)
        except OSError:
            continue  # removed concurrently by another sweeper, or not removable: try again next time
        removed.append(entry)
    return removed


@functools.cache
def _sweep_once(parent: Path) -> None:
    """sweep_stale_workspaces once per process and parent (at the first make_workspace)."""
    try:
        sweep_stale_workspaces(parent)
    except OSError:  # a sweep is housekeeping: it must never stop an episode from starting
        pass
