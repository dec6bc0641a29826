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
- Copies (`stage_tree` for a user's repository; `make_workspace`, so also grading's copy of the agent's
  workspace) never carry setuid or setgid bits, extended attributes (file capabilities) or special
  files (FIFOs, sockets, device nodes are never opened: a planted FIFO would hang the copy, a
  /dev/zero node would fill the disk); regular files, directories and symlinks (copied as links,
  never followed) are copied with their permission bits and mtimes. The tree is walked first and
  its size and entry count checked against caps before a byte is copied; each file is opened with
  O_NOFOLLOW|O_NONBLOCK and fstat-ed (still the regular file the walk saw?) before it is read.
- A harness killed with SIGKILL cannot remove its workspaces: `sweep_stale_workspaces` removes those
  whose owning pid is dead (run once per process at the first `make_workspace`; call it at start-up).
  The pid check assumes every harness sharing the directory shares one pid namespace.

Over 500 lines because: making, staging, overlaying and removing a workspace share one distrustful walk and
copy (no symlink followed, special files skipped, caps checked before a byte is copied) and one ownership
and sweep rule; the security argument above is easier to check in one file.
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
from dataclasses import dataclass, field
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
        if _mount_capped_tmpfs(dst, size_mb):  # fail fast (before copying) on what cannot fit, not with ENOSPC
            _copy_tree(src, dst, max_files=_inode_cap(size_mb) - 1, max_bytes=size_mb * 1024 * 1024)
        else:
            _copy_tree(src, dst)
    except BaseException:
        remove_workspace(dst)
        raise
    return dst


_mount_refused = [os.geteuid() != 0]  # set after the first EPERM: root without CAP_SYS_ADMIN (containers)


def _inode_cap(size_mb: int) -> int:
    return max(4096, size_mb * _INODES_PER_MB)


def _mount_capped_tmpfs(path: Path, size_mb: int) -> bool:
    """Mount a private tmpfs capped at `size_mb` on `path`; False when this process may not mount."""
    if _mount_refused[0]:
        return False
    options = f"size={size_mb}m,nr_inodes={_inode_cap(size_mb)},mode=0700"
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


DEFAULT_STAGE_MAX_FILES = 20_000  # entries (files, directories, symlinks) a staged repository may hold
DEFAULT_STAGE_MAX_BYTES = 512 * 1024 * 1024  # bytes of regular files a staged repository may hold
_WALK_CEILING = 10  # the walk stops counting at this many times max_files (a huge tree fails fast)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1024 * 1024


class StagingError(ValueError):
    """A tree that cannot be staged: over a cap, or not a directory. Nothing is left at the destination."""


@dataclass
class StageReport:
    """What `stage_tree` copied, and what it left out (special files, unreadable entries), by relative path."""

    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (posix relative path, why)

    def describe_skipped(self, limit: int = 5) -> str:
        """One line: how many entries were skipped and the first few (`repr`-quoted names), or ""."""
        if not self.skipped:
            return ""
        shown = ", ".join(f"{path!a} ({why})" for path, why in self.skipped[:limit])
        more = f" and {len(self.skipped) - limit} more" if len(self.skipped) > limit else ""
        return f"{len(self.skipped)} entries not copied: {shown}{more}"


def _special_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def stage_tree(src: Path, dest: Path, max_bytes: int | None = DEFAULT_STAGE_MAX_BYTES,
               max_files: int | None = DEFAULT_STAGE_MAX_FILES, *, label: str = "repo",
               bytes_flag: str | None = None, files_flag: str | None = None) -> StageReport:
    """Copy the tree `src` into the new directory `dest` (created 0700; its parent must exist): the one way a
    user's repository (or any tree the harness did not make) is staged.

    - Only regular files, directories and symlinks are copied; symlinks as links (never followed). FIFOs,
      sockets and character/block devices are never opened: they are skipped and listed in the report, as are
      entries this process may not read (nothing is chmod-ed: the tree is not ours).
    - The whole tree is walked (lstat only) BEFORE anything is copied: more than `max_files` entries (files,
      directories and symlinks) or more than `max_bytes` bytes of regular files is a StagingError naming the
      cap, the value and `files_flag`/`bytes_flag` (the option that raises it), and nothing is written. The
      walk stops counting at 10x max_files, so a huge tree fails in a fraction of a second.
    - Each file is opened with O_NOFOLLOW|O_NONBLOCK and fstat-ed before a byte is read: an entry that became a
      symlink, a FIFO, a device or another file since the walk is skipped ("changed while copying"). Bytes
      read are counted against `max_bytes` again (a file growing meanwhile cannot fill the disk).
    - Permission bits are kept without setuid/setgid, as are mtimes; no extended attributes.
    """
    src, dest = Path(src), Path(dest)
    if src.is_symlink() or not src.is_dir():
        raise StagingError(f"{label} {str(src)!r} is not a directory")
    if os.path.lexists(dest):
        raise FileExistsError(f"staging destination {dest} already exists")
    plan, report = _walk(src, max_bytes, max_files, label=label, bytes_flag=bytes_flag, files_flag=files_flag,
                         grant=False)
    os.mkdir(dest, 0o700)
    try:
        _copy_plan(src, dest, plan, report, max_bytes, grant=False, label=label, bytes_flag=bytes_flag)
    except BaseException:
        remove_workspace(dest)
        raise
    return report


def _cap_hint(flag: str | None) -> str:
    return f" ({flag})" if flag else ""


def _walk(src: Path, max_bytes: int | None, max_files: int | None, *, label: str, bytes_flag: str | None,
          files_flag: str | None, grant: bool) -> tuple[list, StageReport]:
    """Every entry below `src` to copy, parents before children, without following symlinks; caps checked."""
    report = StageReport()
    plan: list[tuple[str, str, os.stat_result]] = []  # (relative path, "dir" | "file" | "link", lstat)
    ceiling = None if max_files is None else max(max_files, 1) * _WALK_CEILING
    count = total = 0
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            entries = _scandir(os.path.join(src, rel_dir), grant)
        except PermissionError:  # only a caller that may not chmod (a user's tree) gets here
            report.skipped.append((rel_dir, "unreadable directory"))
            continue
        except (FileNotFoundError, NotADirectoryError):  # changed since it was listed
            report.skipped.append((rel_dir, "changed while copying"))
            continue
        for entry in entries:
            rel = os.path.join(rel_dir, entry.name) if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # gone since the listing
                continue
            if stat.S_ISDIR(st.st_mode):
                kind = "dir"
                pending.append(rel)
            elif stat.S_ISREG(st.st_mode):
                kind = "file"
                total += st.st_size
            elif stat.S_ISLNK(st.st_mode):
                kind = "link"
            else:  # FIFOs, sockets, devices: never opened, never part of a repository's code
                report.skipped.append((rel, _special_kind(st.st_mode)))
                continue
            count += 1
            if ceiling is not None and count > ceiling:
                raise StagingError(f"{label} has more than {ceiling} files and directories; at most {max_files}"
                                   f"{_cap_hint(files_flag)}")
            plan.append((rel, kind, st))
    if max_files is not None and count > max_files:
        raise StagingError(f"{label} has {count} files and directories; at most {max_files}{_cap_hint(files_flag)}")
    if max_bytes is not None and total > max_bytes:
        raise StagingError(f"{label} has {total} bytes in files ({_human(total)}); at most {max_bytes} "
                           f"({_human(max_bytes)}){_cap_hint(bytes_flag)}")
    return plan, report


def _copy_plan(src: Path, dst: Path, plan: list, report: StageReport, max_bytes: int | None, *, grant: bool,
               label: str = "repo", bytes_flag: str | None = None) -> None:
    finish: list[tuple[str, os.stat_result]] = []  # directories: modes and mtimes last (0555 ones too)
    for rel, kind, st in plan:
        source, target = os.path.join(src, rel), os.path.join(dst, rel)
        if kind == "dir":
            os.mkdir(target, 0o700)
            finish.append((target, st))
            report.dirs += 1
        elif kind == "link":
            try:
                link = os.readlink(source)
            except OSError:  # no longer a symlink
                report.skipped.append((rel, "changed while copying"))
                continue
            os.symlink(link, target)
            report.symlinks += 1
        else:
            budget = None if max_bytes is None else max_bytes - report.bytes
            copied = _copy_regular(source, target, st, budget, grant)
            if isinstance(copied, str):
                report.skipped.append((rel, copied))
                continue
            if copied < 0:
                raise StagingError(f"{label} grew past {max_bytes} bytes ({_human(max_bytes or 0)}) while it was "
                                   f"copied{_cap_hint(bytes_flag)}")
            report.bytes += copied
            report.files += 1
    for target, st in reversed(finish):  # children before parents: a parent's mtime is set last
        os.chmod(target, stat.S_IMODE(st.st_mode) & _NO_PRIVILEGE_BITS)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def _open_source(source: str, grant: bool) -> int | str:
    """A read descriptor of `source` (never following a final symlink, never blocking), or why not."""
    try:
        return os.open(source, _READ_FLAGS)
    except PermissionError:
        if not grant:
            return "unreadable"
        _grant_owner(source, stat.S_IRUSR)  # a file the agent made unreadable (only non-root callers get here)
        return os.open(source, _READ_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return "changed while copying"
    except OSError as e:
        if e.errno == errno.ELOOP:  # became a symlink since the walk
            return "changed while copying"
        raise


def _copy_regular(source: str, target: str, st: os.stat_result, budget: int | None, grant: bool) -> int | str:
    """Copy one regular file (checked on the open descriptor): the bytes copied; -1 when it holds more than
    `budget` bytes; a reason (str) when it is unreadable or no longer the regular file the walk saw."""
    fd = _open_source(source, grant)
    if isinstance(fd, str):
        return fd
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            return "changed while copying"
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            copied = 0
            while True:
                want = _CHUNK if budget is None else min(_CHUNK, budget - copied + 1)
                chunk = os.read(fd, want)
                if not chunk:
                    break
                copied += len(chunk)
                if budget is not None and copied > budget:
                    return -1
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
            os.fchmod(out, stat.S_IMODE(fst.st_mode) & _NO_PRIVILEGE_BITS)
            os.utime(out, ns=(fst.st_atime_ns, fst.st_mtime_ns))
            return copied
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _copy_tree(src: Path, dst: Path, max_files: int | None = None, max_bytes: int | None = None) -> None:
    """Copy the contents of `src` into the existing directory `dst` (see make_workspace): `stage_tree`'s walk
    and copy, where unreadable entries (the agent's chmod 000) are opened up instead of skipped."""
    plan, report = _walk(src, max_bytes, max_files, label=f"workspace source {str(src)!r}",
                         bytes_flag="the workspace's size cap", files_flag="the workspace's inode cap", grant=True)
    _copy_plan(src, dst, plan, report, max_bytes, grant=True, label=f"workspace source {str(src)!r}",
               bytes_flag="the workspace's size cap")


def _scandir(path: str | Path, grant: bool = True) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except PermissionError:  # a directory the agent made unreadable (only non-root callers get here)
        if not grant:
            raise
        _grant_owner(path, stat.S_IRWXU)
        with os.scandir(path) as it:
            return list(it)


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
