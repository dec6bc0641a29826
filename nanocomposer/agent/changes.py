"""What an agent session changed: listed from the files themselves, shown as a diff, applied exactly.

An agent session never touches the user's repository while it runs: the repository is copied once (the
*base*) and the episode edits its own workspace copy of the base. Afterwards

    snapshot(tree)                      every file and symlink: kind, mode, sha256 of the bytes
    compute_changes(base, workspace)    the entries that differ (added, deleted, modified, mode changed)
    render_diff(base, workspace, ...)   git-style unified diff for display and logs (`patch -p1` applies the
                                        text parts); binary files and symlinks get one line each
    apply_changes(repo, ...)            writes the workspace's actual bytes and modes into the repository,
                                        never by re-parsing the text diff, and only if none of the entries it
                                        touches changed in the repository since the base was copied

Not compared (and never applied): version-control and cache directories (`IGNORED_DIRS`). Tool runs create
caches the user did not ask for, and the repository's history is not the agent's to rewrite.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

IGNORED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
                          ".hypothesis"})
SYMLINK_MODE = 0o120000  # how git writes a symlink's mode


class ApplyError(Exception):
    """The changes cannot be applied; nothing in the repository was modified."""


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


def entry_of(path: Path) -> Entry | None:
    """The entry at `path` (not following a final symlink), or None when there is no file or link there."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return Entry("symlink", 0, _digest(os.fsencode(os.readlink(path))))
    if stat.S_ISREG(st.st_mode):
        return Entry("file", stat.S_IMODE(st.st_mode), _digest(path.read_bytes()))
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
    return os.fsencode(os.readlink(target)) if entry.kind == "symlink" else target.read_bytes()


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
        a, b = f"a/{c.path}", f"b/{c.path}"
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
        lines = difflib.unified_diff(old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
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
            return f"{parent.as_posix()} is no longer a directory in the repository"
    if entry_of(repo / rel) != change.before:
        return f"{change.path} changed in the repository since the session started"
    if change.before is None and (repo / rel).is_dir() and not (repo / rel).is_symlink():
        return f"{change.path} is a directory in the repository"
    return None


def apply_changes(repo: Path, result: Path, changes: list[Change]) -> None:
    """Make every changed entry of `repo` byte- and mode-identical to `result`; ApplyError changes nothing.

    All checks run before the first write; new contents are staged in a temporary directory inside `repo`
    (same filesystem) and moved into place with os.replace, so a reader never sees a half-written file.
    """
    repo, result = Path(repo), Path(result)
    if not repo.is_dir():
        raise ApplyError(f"repository {str(repo)!r} is not a directory")
    problems = [p for p in (_check_target(repo, c) for c in changes) if p]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ApplyError(f"{problems[0]}{more}; nothing was applied")
    staging = Path(tempfile.mkdtemp(prefix=".nanocomposer-apply-", dir=repo))
    try:
        staged = {}
        for i, c in enumerate(changes):
            if c.after is None:
                continue
            tmp, src = staging / str(i), result / c.path
            if c.after.kind == "symlink":
                os.symlink(os.readlink(src), tmp)
            else:
                shutil.copyfile(src, tmp)
                os.chmod(tmp, c.after.mode)
            staged[c.path] = tmp
        for c in changes:
            if c.after is None:
                (repo / c.path).unlink()
                _remove_empty_parents(repo, Path(c.path), result)
        for path, tmp in staged.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, repo / path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_empty_parents(repo: Path, rel: Path, result: Path) -> None:
    """Directories the deletion emptied go too, unless the workspace result still has them."""
    for parent in list(rel.parents)[:-1]:
        d = repo / parent
        if (result / parent).is_dir() or not d.is_dir() or any(d.iterdir()):
            return
        d.rmdir()
