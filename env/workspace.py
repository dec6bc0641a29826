"""Per-episode workspaces: fresh copies of a task repo, strict path resolution, hidden-test overlay.

Every tool that takes a path from the model goes through `resolve_in`, so the agent can never name
a file outside its workspace, whether by `..`, an absolute path, or a symlink it planted itself.
`overlay` is written with the same distrust: the agent may have replaced a file or directory that
hidden/ is about to write with a symlink pointing anywhere, so overlay removes such entries instead
of writing through them.
"""

from __future__ import annotations

import os
import shutil
import stat
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


def make_workspace(src: Path, parent: Path | None = None, prefix: str = "ws-") -> Path:
    """Copy the task repo `src` into a new private temp dir and return that dir.

    Symlinks are copied as symlinks (never followed), so a link in the repo cannot pull host files
    into the copy. File modes and mtimes are preserved (copy2).
    """
    src = Path(src)
    if not src.is_dir():
        raise FileNotFoundError(f"workspace source {src} is not a directory")
    dst = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    except BaseException:
        remove_workspace(dst)
        raise
    return dst


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
    """rmtree that also removes entries the agent made read-only (chmod 000 dirs, 444 files)."""

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
    elif path.exists():
        shutil.rmtree(path, onerror=make_writable_and_retry)
