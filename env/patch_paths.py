"""Paths a patch names: checked, resolved inside their tree when used, read without following a link out.

    path_problem(rel)               why a path named by a patch is unacceptable, or None
    resolve_inside(root, rel)       `rel` resolved inside `root` now (every symlink followed), or PatchError
    open_regular(path, what, ...)   a regular file opened for reading (the final component never followed)
    read_regular(path, what)        a regular file's bytes (the final component never followed), bounded
    read_text_inside(root, rel)     a file's text, read through resolve_inside

PatchError is the one error of the patch modules: env/patches.py (the parser) and env/patch_apply.py (the
applier) raise it, and so does every read here. Task validation (env/tasks.py) and the gold policy's edits
(env/policies.py) read repo/ files through these functions too, so a symlink planted in a tree is never
followed out of it.

This module imports only the standard library (env/ must not pull in torch and the like).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import BinaryIO

MAX_FILE_BYTES = 64 * 1024 * 1024  # a file a patch reads or writes; beyond it is not a source file
_SURROGATE = re.compile("[\ud800-\udfff]")


class PatchError(ValueError):
    """A patch that cannot be read or applied; the message is one line naming the problem (and its line)."""


def shown(text: str, limit: int = 80) -> str:
    """A path or value for a one-line error message: repr (which escapes surrogates and control characters),
    shortened to `limit` characters."""
    quoted = repr(text)
    return quoted if len(quoted) <= limit else quoted[: limit - 4] + "...'"


def path_problem(rel: str) -> str | None:
    """Why `rel` (a path a patch names, relative to the tree it patches) is unacceptable, or None."""
    if not isinstance(rel, str) or not rel:
        return "is empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        return "contains a control character (NUL, tab, newline...)"
    if _SURROGATE.search(rel):
        return "is not valid UTF-8 text"
    pure = PurePosixPath(rel)
    if pure.is_absolute():
        return "is an absolute path (a patch may only touch files inside its tree)"
    if ".." in pure.parts:
        return "leaves the tree ('..')"
    if not pure.parts:
        return "names no file"
    return None


def resolve_inside(root: str | Path, rel: str) -> Path:
    """`rel` resolved inside `root` at the time of the call: every existing symlink followed, the result
    checked to lie in `root`'s real path (`root` itself is refused: a patch names files). Raises PatchError
    for a path `path_problem` refuses, a symlink escape or a symlink loop. Call it where the file is used."""
    if problem := path_problem(rel):
        raise PatchError(f"path {shown(rel)} {problem}")
    try:
        root_real = Path(root).resolve(strict=True)
        resolved = (root_real / PurePosixPath(rel)).resolve(strict=False)
    except (OSError, RuntimeError) as e:  # a missing root, a symlink loop (RuntimeError before Python 3.13)
        raise PatchError(f"path {shown(rel)} cannot be resolved ({type(e).__name__})") from None
    if resolved == root_real or not resolved.is_relative_to(root_real):
        raise PatchError(f"path {shown(rel)} resolves outside its tree (through a symlink)")
    return resolved


def resolve_dir(root_real: Path, rel_dir: str) -> Path:
    """A directory named by a patch path's parent ("" for the root), resolved inside the root."""
    return root_real if rel_dir in ("", ".") else resolve_inside(root_real, rel_dir)


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)


def open_regular(path: Path, what: str, error: Callable[[str], Exception],
                 detail: Callable[[OSError], str]) -> BinaryIO:
    """The regular file at `path` opened for reading in binary: the final component not followed, no blocking
    on a FIFO, no controlling terminal taken, and the file type checked on the descriptor, not only by name.
    Anything else raises the caller's `error`: "<what> cannot be read<detail(the OSError)>" or "<what> is not a
    regular file"."""
    try:
        fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise error(f"{what} cannot be read{detail(e)}") from None
    # checked on the bare descriptor: os.fdopen itself refuses a directory (IsADirectoryError, descriptor left open)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise error(f"{what} is not a regular file")
    return os.fdopen(fd, "rb")


def read_regular(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at `path` (a resolved path; the final component is not followed), at most
    `limit` of them; PatchError naming `what` for anything else (a symlink, FIFO, device, a bigger file)."""
    with open_regular(path, what, PatchError, lambda e: f" ({type(e).__name__})") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise PatchError(f"{what} is {size} bytes; at most {limit}")
        return f.read(limit + 1)


def read_text_inside(root: str | Path, rel: str) -> str:
    """The text of file `rel` of `root` (UTF-8, universal newlines, as Path.read_text gives it), read through
    `resolve_inside` at this moment: a symlink planted to a host file is refused, never followed out."""
    data = read_regular(resolve_inside(root, rel), f"file {shown(rel)}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PatchError(f"file {shown(rel)} is not UTF-8 text") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")

