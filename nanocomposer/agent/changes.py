"""What an agent session changed: listed from the files themselves, shown as a diff, applied exactly.

An agent session never touches the user's repository while it runs: the repository is copied once (the
*base*) and the episode edits its own workspace copy of the base. Afterwards

    snapshot(tree)                      every file and symlink: kind, mode, sha256 of the bytes
    compute_changes(base, workspace)    the entries that differ (added, deleted, modified, mode changed)
    render_diff(base, workspace, ...)   git-style unified diff for display and logs (`patch -p1` applies the
                                        text parts); binary files and symlinks get one line each; names are
                                        quoted as git's core.quotePath does (`quote_path`), so a name holding
                                        a newline cannot add lines to the diff; contents are verbatim (the
                                        terminal escapes control characters when it shows them)
    apply_changes(repo, ...)            writes the workspace's actual bytes and modes into the repository,
                                        never by re-parsing the text diff, and only if none of the entries it
                                        touches changed in the repository since the base was copied; all or
                                        nothing: see apply_changes

Not compared (and never applied): version-control and cache directories (`IGNORED_DIRS`). Tool runs create
caches the user did not ask for, and the repository's history is not the agent's to rewrite.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

IGNORED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
                          ".hypothesis"})
SYMLINK_MODE = 0o120000  # how git writes a symlink's mode


class ApplyError(Exception):
    """The changes were not applied. `partial` is False when the repository is as it was (nothing written, or
    everything written rolled back: `restored`); True when some entries could not be put back (`unrestored`:
    (path, what it holds now and where its backup is)), and the message says so."""

    def __init__(self, message: str, restored: list[str] | None = None,
                 unrestored: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.restored = list(restored or [])
        self.unrestored = list(unrestored or [])

    @property
    def partial(self) -> bool:
        return bool(self.unrestored)


@dataclass(frozen=True)
class Entry:
    kind: str  # "file" or "symlink"
    mode: int  # permission bits of a file (stat.S_IMODE); 0 for a symlink
    sha256: str  # of the file's bytes, or of the link's target


@dataclass(frozen=True)
class Change:
    path: str  # posix, relative to the tree root
    before: Entry | None  # None: added
    after: Entry | None  # None: deleted

    @property
    def status(self) -> str:
        if self.before is None:
            return "added"
        if self.after is None:
            return "deleted"
        return "modified" if self.before.sha256 != self.after.sha256 or self.before.kind != self.after.kind \
            else "mode"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _read_regular(path: Path) -> bytes:
    """The bytes of the regular file `path`: never through a final symlink, never blocking on a FIFO (the
    descriptor is checked, not only the name); OSError if it is no longer a regular file."""
    fd = os.open(path, _READ_FLAGS)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is no longer a regular file")
        return f.read()


_QUOTE_ESCAPES = {0x07: "\\a", 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0B: "\\v", 0x0C: "\\f", 0x0D: "\\r",
                  0x22: '\\"', 0x5C: "\\\\"}


def quote_path(path: str) -> str:
    """`path` as git writes it in a diff with core.quotePath on (its default): unchanged when it is printable
    ASCII without `"` or `\\`; otherwise in double quotes with C escapes (\\n, \\t, \\", \\\\ ...) and every other
    control or non-ASCII byte (of its UTF-8, or its raw bytes for a name that is not UTF-8) as \\ooo octal.
    Quoted, a name cannot break a diff line, forge one, or send escape sequences to a terminal."""
    raw = os.fsencode(path)
    if all(0x20 <= b < 0x7F and b not in (0x22, 0x5C) for b in raw):
        return path
    out = []
    for b in raw:
        if b in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[b])
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _lines(text: str) -> list[str]:
    """Lines split at "\\n" only, each keeping its end (str.splitlines also splits at \\r, \\f, \\x1c, U+2028...,
    which would make the diff disagree with `patch` and with the bytes)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def entry_of(path: Path) -> Entry | None:
    """The entry at `path` (not following a final symlink), or None when there is no file or link there."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return Entry("symlink", 0, _digest(os.fsencode(os.readlink(path))))
    if stat.S_ISREG(st.st_mode):
        return Entry("file", stat.S_IMODE(st.st_mode), _digest(_read_regular(path)))
    return None  # a directory, fifo, socket...: not a file this module moves


def snapshot(root: Path) -> dict[str, Entry]:
    """Every regular file and symlink below `root` (outside IGNORED_DIRS), by posix relative path."""
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):  # does not descend into symlinked directories
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        here = Path(dirpath)
        links = [d for d in dirnames if (here / d).is_symlink()]
        for name in [*filenames, *links]:
            entry = entry_of(here / name)
            if entry is not None:
                out[(here / name).relative_to(root).as_posix()] = entry
    return out


def compute_changes(base: Path, result: Path) -> list[Change]:
    old, new = snapshot(base), snapshot(result)
    return [Change(p, old.get(p), new.get(p)) for p in sorted(old.keys() | new.keys()) if old.get(p) != new.get(p)]


def _content(root: Path, path: str, entry: Entry | None) -> bytes:
    if entry is None:
        return b""
    target = root / path
    return os.fsencode(os.readlink(target)) if entry.kind == "symlink" else _read_regular(target)


def _git_mode(entry: Entry) -> str:
    return f"{SYMLINK_MODE:o}" if entry.kind == "symlink" else f"{0o100000 | entry.mode:o}"


def _text(data: bytes) -> str | None:
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def render_diff(base: Path, result: Path, changes: list[Change]) -> str:
    """A git-style unified diff of `changes` (display and logs; apply_changes does not read it)."""
    chunks = []
    for c in changes:
        a, b = quote_path(f"a/{c.path}"), quote_path(f"b/{c.path}")
        chunks.append(f"diff --git {a} {b}\n")
        if c.before is None:
            chunks.append(f"new file mode {_git_mode(c.after)}\n")
        elif c.after is None:
            chunks.append(f"deleted file mode {_git_mode(c.before)}\n")
        elif _git_mode(c.before) != _git_mode(c.after):
            chunks.append(f"old mode {_git_mode(c.before)}\nnew mode {_git_mode(c.after)}\n")
        if c.status == "mode":
            continue
        old, new = _content(base, c.path, c.before), _content(result, c.path, c.after)
        old_text, new_text = _text(old), _text(new)
        if old_text is None or new_text is None:
            chunks.append(f"Binary files {a if c.before else '/dev/null'} and {b if c.after else '/dev/null'} differ\n")
            continue
        lines = difflib.unified_diff(_lines(old_text), _lines(new_text),
                                     fromfile=a if c.before else "/dev/null", tofile=b if c.after else "/dev/null")
        for line in lines:
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)


def _check_target(repo: Path, change: Change) -> str | None:
    """Why `change` cannot be applied to `repo` now, or None."""
    rel = Path(change.path)
    for parent in list(rel.parents)[:-1]:  # every directory between the repo root and the file
        p = repo / parent
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            return f"{quote_path(parent.as_posix())} is no longer a directory in the repository"
    target = repo / rel
    if change.before is None and target.is_dir() and not target.is_symlink():
        return f"{quote_path(change.path)} is a directory in the repository"
    if entry_of(target) is None and os.path.lexists(target) and not target.is_dir():
        return f"{quote_path(change.path)} is a FIFO, socket or device in the repository (never replaced)"
    if entry_of(target) != change.before:
        return f"{quote_path(change.path)} changed in the repository since the session started"
    return None


@dataclass
class _Step:
    change: Change
    target: Path
    new: Path | None = None  # the new content, staged beside the target
    backup: Path | None = None  # the old entry, kept beside the target until everything is in place
    done: bool = False


def _sibling(target: Path, tag: str) -> Path:
    """A free hidden name next to `target` (same directory, so same filesystem: os.replace is atomic)."""
    return target.parent / f".{target.name[:80]}.{secrets.token_hex(4)}.nanocomposer-{tag}"


def _stage_new(result: Path, step: _Step) -> None:
    """Write the session's version of the entry next to its target, and check it is what the diff showed."""
    change, src = step.change, result / step.change.path
    for _ in range(8):
        tmp = _sibling(step.target, "new")
        try:
            if change.after.kind == "symlink":
                link = os.readlink(src)
                data = os.fsencode(link)
                os.symlink(link, tmp)
            else:
                data = _read_regular(src)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    step.new = tmp
                    f.write(data)
                    os.fchmod(f.fileno(), change.after.mode)
        except FileExistsError:
            continue
        step.new = tmp
        break
    else:
        raise OSError(f"no free temporary name next to {step.target}")
    _keep_owner(step)
    if _digest(data) != change.after.sha256:
        raise ApplyError(f"{quote_path(change.path)} changed in the session's workspace after the diff was made")


def _keep_owner(step: _Step) -> None:
    """Run as root, the new entry keeps the owner of the one it replaces (or of its directory)."""
    if os.geteuid() != 0:
        return
    try:
        st = os.lstat(step.target if step.change.before is not None else step.target.parent)
        os.chown(step.new, st.st_uid, st.st_gid, follow_symlinks=False)
    except OSError:
        pass


def _make_backup(step: _Step) -> None:
    """A second name for the entry about to be replaced or deleted (a hard link; a copy where links fail)."""
    for _ in range(8):
        backup = _sibling(step.target, "old")
        try:
            os.link(step.target, backup, follow_symlinks=False)
        except FileExistsError:
            continue
        except OSError:  # no hard links here (or protected_hardlinks): copy it
            if step.target.is_symlink():
                os.symlink(os.readlink(step.target), backup)
            else:
                shutil.copy2(step.target, backup, follow_symlinks=False)
        step.backup = backup
        return
    raise OSError(f"no free backup name next to {step.target}")


def _discard(paths) -> list[str]:
    """Remove the given leftovers (temporaries, backups); the ones that would not go, as strings."""
    left = []
    for p in paths:
        if p is None:
            continue
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError:
            left.append(str(p))
    return left


def apply_changes(repo: Path, result: Path, changes: list[Change]) -> list[str]:
    """Make every changed entry of `repo` byte- and mode-identical to `result`, all or nothing.

    1. Checks, before anything is written: each entry it touches is still as the session's base had it.
    2. Prepare (nothing visible changes but new empty directories): each new content is written as a hidden
       temporary beside its target (`.NAME.XXXXXXXX.nanocomposer-new`, same directory, so the rename below is
       atomic) and checked against the hash the diff was made from; each entry to replace or delete gets a
       backup name beside it (`...nanocomposer-old`, a hard link, else a copy).
    3. Commit: every temporary is renamed over its target (os.replace, so a reader never sees a half-written
       file) and every deleted file unlinked. A failure here rolls back every step already done from the
       backups (added files removed), in reverse order.
    4. Backups are removed, and directories that deletions emptied.

    ApplyError when it did not apply: `partial` False means the repository is as it was; True means some entries
    could not be restored, and the message and `unrestored` say which, and where their backups are. Returns the
    leftovers that could not be removed in step 4 (normally none).
    """
    repo, result = Path(repo), Path(result)
    if not repo.is_dir():
        raise ApplyError(f"repository {str(repo)!r} is not a directory")
    problems = [p for p in (_check_target(repo, c) for c in changes) if p]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ApplyError(f"{problems[0]}{more}; nothing was applied")
    steps = [_Step(c, repo / c.path) for c in changes]
    created: list[Path] = []
    try:
        for step in steps:
            if step.change.after is not None:
                for parent in reversed(list(Path(step.change.path).parents)[:-1]):  # outermost first
                    d = repo / parent
                    if not d.is_dir():
                        d.mkdir()
                        created.append(d)
                _stage_new(result, step)
            if step.change.before is not None:
                _make_backup(step)
    except BaseException as e:
        _discard([s.new for s in steps] + [s.backup for s in steps])
        _remove_dirs(created)
        if isinstance(e, ApplyError):
            raise ApplyError(f"{e}; nothing was applied") from None
        if isinstance(e, OSError):
            raise ApplyError(f"preparing the changes failed ({_why(e)}); nothing was applied") from None
        raise
    try:
        for step in steps:
            if step.change.after is not None:
                os.replace(step.new, step.target)
                step.new = None
            else:
                os.unlink(step.target)
            step.done = True
    except BaseException as e:  # noqa: BLE001  (even an interrupt rolls back before it is reported)
        raise _roll_back(steps, created, e) from None
    left = _discard([s.backup for s in steps])
    for c in changes:
        if c.after is None:
            _remove_empty_parents(repo, Path(c.path), result)
    return left


def _why(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return str(e) or type(e).__name__


def _roll_back(steps: list[_Step], created: list[Path], cause: BaseException) -> ApplyError:
    """Undo the committed steps (newest first) from their backups; the ApplyError that says what happened."""
    failed = next((s for s in steps if not s.done), None)
    restored, unrestored, keep = [], [], set()
    for step in reversed([s for s in steps if s.done]):
        name = quote_path(step.change.path)
        try:
            if step.backup is not None:
                os.replace(step.backup, step.target)
                step.backup = None
            else:  # it was added: remove it
                os.unlink(step.target)
            restored.append(step.change.path)
        except OSError as e:
            now = "the session's version" if step.change.after is not None else "nothing (it was deleted)"
            kept = f"; the original is at {quote_path(str(step.backup))}" if step.backup is not None else ""
            unrestored.append((step.change.path, f"{name} holds {now} ({_why(e)}){kept}"))
            keep.add(step.backup)
    _discard([s.new for s in steps] + [s.backup for s in steps if s.backup not in keep])
    _remove_dirs(created)
    where = quote_path(failed.change.path) if failed is not None else "a step"
    head = f"writing {where} failed ({_why(cause)})"
    if unrestored:
        message = (f"partially applied: {head}; could not restore {len(unrestored)} of the {len(restored) + len(unrestored)} "
                   f"entries already written: " + "; ".join(text for _, text in unrestored))
        if restored:
            message += "; restored: " + ", ".join(quote_path(p) for p in restored)
    elif restored:
        message = (f"{head}; rolled back the {len(restored)} entries already written ("
                   + ", ".join(quote_path(p) for p in restored) + "); the repository is unchanged")
    else:
        message = f"{head}; nothing was applied"
    return ApplyError(message, restored, unrestored)


def _remove_dirs(created: list[Path]) -> None:
    for d in reversed(created):  # innermost first
        try:
            d.rmdir()
        except OSError:
            pass


def _remove_empty_parents(repo: Path, rel: Path, result: Path) -> None:
    """Directories the deletion emptied go too, unless the workspace result still has them."""
    for parent in list(rel.parents)[:-1]:
        d = repo / parent
        if (result / parent).is_dir() or not d.is_dir() or any(d.iterdir()):
            return
        d.rmdir()
