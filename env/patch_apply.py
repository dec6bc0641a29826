"""Patches against file trees: `apply_patch` writes what a parsed diff changes, `make_patch` writes the diff
between two trees.

    plan_patch(root, patch)         the changes the patch makes to the tree at `root`, computed in memory
    apply_patch(root, patch)        plan_patch, then write: if any hunk fails to match, nothing is written
    make_patch(before, after)       a unified diff (a/ b/ names) turning one tree (a directory or a dict) into another

The patch text is read by env/patches.py, the one parser; files are read and written through env/patch_paths.py.
Refused when applying (PatchError, one line): a path that resolves outside the root (through a symlink in the
tree, checked when the file is read and again when it is written); a symlink the patch creates pointing outside
the root, or a path the patch writes beneath a file or symlink it creates; a target that is a directory, FIFO,
socket or device; a hunk that does not match. Nothing shells out to `patch`, whose own reading could differ.

This module imports only the standard library and env/ (env/ must not pull in torch and the like).
"""

from __future__ import annotations

import difflib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from env.patch_paths import (
    MAX_FILE_BYTES,
    PatchError,
    open_nofollow,
    path_problem,
    read_regular,
    resolve_dir,
    shown,
)
from env.patches import MODES, SYMLINK_MODE, FilePatch, Hunk, Patch, parse_patch


@dataclass(frozen=True)
class Entry:
    kind: str  # "file" or "symlink"
    data: bytes  # a file's bytes, or a link's target
    mode: int | None = None  # a file's permission bits

    def text(self) -> str:
        return self.data.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Change:
    path: str
    before: Entry | None  # None: the patch adds it
    after: Entry | None  # None: the patch deletes it


@dataclass
class _Tree:
    root: Path
    cache: dict[str, Entry | None] = field(default_factory=dict)

    def entry(self, rel: str) -> Entry | None:
        """What is at `rel` now (its parent resolved inside the root, the final component not followed)."""
        if rel not in self.cache:
            self.cache[rel] = _read_entry(self.root, rel)
        return self.cache[rel]


def _locate(root_real: Path, rel: str) -> Path:
    """`rel`'s directory resolved inside the root, joined with its final component (not followed)."""
    pure = PurePosixPath(rel)
    try:
        return resolve_dir(root_real, pure.parent.as_posix()) / pure.name
    except PatchError as e:
        raise PatchError(f"{shown(rel)}: {e}") from None


def _read_entry(root_real: Path, rel: str) -> Entry | None:
    if problem := path_problem(rel):
        raise PatchError(f"path {shown(rel)} {problem}")
    path = _locate(root_real, rel)
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise PatchError(f"{shown(rel)} cannot be read ({type(e).__name__})") from None
    if stat.S_ISLNK(st.st_mode):
        return Entry("symlink", os.fsencode(os.readlink(path)))
    if stat.S_ISREG(st.st_mode):
        return Entry("file", read_regular(path, shown(rel)), stat.S_IMODE(st.st_mode))
    raise PatchError(f"{shown(rel)} is a directory, FIFO, socket or device, not a file a patch can change")


def _split(text: str) -> list[str]:
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _apply_hunks(text: str, hunks: tuple[Hunk, ...], crlf: bool, rel: str) -> str:
    lines = _split(text)
    if crlf and text and text.count("\r\n") == text.count("\n"):  # a CRLF patch (read as LF) on a CRLF file
        def convert(items):
            return [t[:-1] + "\r\n" if t.endswith("\n") else t for t in items]
    else:
        def convert(items):
            return items
    out: list[str] = []
    pos, offset = 0, 0
    for k, h in enumerate(hunks, 1):
        old, new = convert(h.old_lines), convert(h.new_lines)
        want = (h.old_start - 1 if h.old_count else h.old_start) + offset
        last = len(lines) - len(old)  # the last index a match can start at
        found = None
        if not old:  # no context to find it by: only where its header says
            found = want if pos <= want <= len(lines) else None
        else:  # the nearest exact match, as `patch` looks for one (no fuzz)
            for delta in range(max(abs(want - pos), abs(last - want)) + 1):
                for at in ((want,) if delta == 0 else (want - delta, want + delta)):
                    if pos <= at <= last and lines[at:at + len(old)] == old:
                        found = at
                        break
                if found is not None:
                    break
        if found is None:
            raise PatchError(f"hunk {k} of {shown(rel)} (patch line {h.line}) does not match the file")
        out += lines[pos:found] + new
        pos, offset = found + len(old), found - (h.old_start - 1 if h.old_count else h.old_start)
    out += lines[pos:]
    if any(not line.endswith("\n") for line in out[:-1]):
        raise PatchError(f"{shown(rel)}: a line without a newline would end up before the end of the file")
    return "".join(out)


def _new_entry(tree: _Tree, f: FilePatch, before: Entry | None, crlf: bool, rel: str) -> Entry:
    """What `f`'s hunks make of `before` (an empty file when it is added)."""
    kind = "symlink" if f.new_mode == SYMLINK_MODE or (f.new_mode is None and before and before.kind == "symlink") \
        else "file"
    if before is not None and (before.kind == "symlink") != (kind == "symlink"):
        raise PatchError(f"{shown(rel)} is a {before.kind} in the tree but the patch changes it as a {kind}")
    old_text = before.text() if before else ""
    try:
        data = _apply_hunks(old_text, f.hunks, crlf, rel).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise PatchError(f"{shown(rel)}: the patched text is not valid UTF-8") from None
    if len(data) > MAX_FILE_BYTES:
        raise PatchError(f"{shown(rel)} would be {len(data)} bytes; at most {MAX_FILE_BYTES}")
    if kind == "symlink" and f.new_path is not None:
        _check_link_target(tree.root, rel, data)
        return Entry("symlink", data)
    mode = MODES.get(f.new_mode) if f.new_mode else (before.mode if before else None)
    return Entry("file", data, mode)


def _check_link_target(root_real: Path, rel: str, target: bytes) -> None:
    """A symlink the patch makes must point, relatively, at a path inside the tree (not the tree itself)."""
    try:
        name = target.decode("utf-8")
    except UnicodeDecodeError:
        raise PatchError(f"symlink {shown(rel)}: its target is not UTF-8") from None
    if not name or name.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise PatchError(f"symlink {shown(rel)}: target {shown(name)} must be a relative path")
    link_dir = PurePosixPath(rel).parent
    lexical = os.path.normpath((link_dir / name).as_posix())
    if lexical in (".", "..") or lexical.startswith("../"):
        raise PatchError(f"symlink {shown(rel)}: target {shown(name)} leaves the tree")
    try:
        resolved = (resolve_dir(root_real, link_dir.as_posix()) / name).resolve(strict=False)
    except (OSError, RuntimeError):
        raise PatchError(f"symlink {shown(rel)}: target {shown(name)} loops") from None
    if resolved == root_real or not resolved.is_relative_to(root_real):
        raise PatchError(f"symlink {shown(rel)}: target {shown(name)} resolves outside the tree")


def plan_patch(root: str | Path, patch: str | Patch, *, skip_binary: bool = False) -> list[Change]:
    """The changes `patch` makes to the tree at `root`, computed without writing anything (sorted by path).

    Every file is read through its parent resolved inside `root` now (a symlink in the tree pointing out is
    refused; a symlink entry itself is read as its target, the git way). Binary sections have no text to
    apply: PatchError, or left out with `skip_binary` (what `patch -p1` does with them)."""
    parsed = patch if isinstance(patch, Patch) else parse_patch(patch)
    try:
        root_real = Path(root).resolve(strict=True)
    except (OSError, RuntimeError):
        raise PatchError("the tree to patch does not exist") from None
    if not root_real.is_dir():
        raise PatchError("the tree to patch is not a directory")
    tree = _Tree(root_real)
    changes: list[Change] = []
    for f in parsed.files:
        if f.binary:
            if skip_binary:
                continue
            raise PatchError(f"line {f.line}: a binary change of {shown(f.paths[0])}; there is no text to apply")
        src = f.old_path
        before = tree.entry(src) if src is not None else None
        if src is not None and before is None:
            raise PatchError(f"line {f.line}: {shown(src)} does not exist in the tree")
        if f.new_path is not None and f.new_path != src and tree.entry(f.new_path) is not None:
            raise PatchError(f"line {f.line}: {shown(f.new_path)} already exists in the tree")
        if f.new_path is None:
            after = _new_entry(tree, f, before, parsed.crlf, src)
            if after.data:
                raise PatchError(f"line {f.line}: deletes {shown(src)} but its hunks leave text in it")
            changes.append(Change(src, before, None))
            continue
        after = _new_entry(tree, f, before, parsed.crlf, f.new_path)
        if src is not None and src != f.new_path:
            if not f.copy:
                changes.append(Change(src, before, None))
            changes.append(Change(f.new_path, None, after))
        elif after != before:
            changes.append(Change(f.new_path, before, after))
    written = {c.path: c.after for c in changes if c.after is not None}
    for path in written:
        for parent in PurePosixPath(path).parents:
            if parent.as_posix() in written:
                raise PatchError(f"the patch writes {shown(path)} beneath {shown(parent.as_posix())}, which it "
                                 f"makes a {written[parent.as_posix()].kind}")
    return sorted(changes, key=lambda c: c.path)


def apply_patch(root: str | Path, patch: str | Patch, *, skip_binary: bool = False) -> list[Change]:
    """Apply `patch` to the tree at `root` (`patch -p1` names) and return its changes. Every hunk is matched
    first (`plan_patch`): if one fails, PatchError and nothing is written. Each write resolves its directory
    inside `root` again, creates nothing through a symlink, and never follows one at the final component."""
    changes = plan_patch(root, patch, skip_binary=skip_binary)
    root_real = Path(root).resolve(strict=True)
    try:
        for c in changes:
            if c.after is None:
                os.unlink(_locate(root_real, c.path))
        for c in changes:
            if c.after is None:
                continue
            rel = PurePosixPath(c.path)
            parent_rel = rel.parent.as_posix()
            parent = resolve_dir(root_real, parent_rel)
            parent.mkdir(parents=True, exist_ok=True)
            if resolve_dir(root_real, parent_rel) != parent:
                raise PatchError(f"the directory of {shown(c.path)} changed while the patch was applied")
            target = parent / rel.name
            if os.path.islink(target):  # a symlink the patch retargets (never written through)
                os.unlink(target)
            if c.after.kind == "symlink":
                _check_link_target(root_real, c.path, c.after.data)
                os.symlink(os.fsdecode(c.after.data), target)
                continue
            fd = open_nofollow(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with os.fdopen(fd, "wb") as out:
                out.write(c.after.data)
                if c.after.mode is not None:
                    os.fchmod(out.fileno(), c.after.mode)
    except OSError as e:
        raise PatchError(f"writing the patched files failed ({type(e).__name__}: {e.strerror})") from None
    return changes


def _tree_files(tree: Path | dict[str, str]) -> dict[str, str]:
    """{relative path: text} of a directory (newlines as written, CRLF kept; no __pycache__), or a dict as is."""
    if isinstance(tree, dict):
        return dict(tree)
    return {
        p.relative_to(tree).as_posix(): p.read_bytes().decode("utf-8")
        for p in sorted(tree.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def make_patch(before: Path | dict[str, str], after: Path | dict[str, str]) -> str:
    """A unified diff (a/ b/ paths, `patch -p1` style) turning `before` into `after` (directories or
    {path: text} dicts). Lines are split where the parser splits them (at "\\n" only: str.splitlines also
    splits at \\f, \\u2028...), so what it writes parse_patch reads back and apply_patch applies."""
    old, new = _tree_files(before), _tree_files(after)
    chunks = []
    for rel in sorted(old.keys() | new.keys()):
        a, b = old.get(rel), new.get(rel)
        if a == b:
            continue
        diff = difflib.unified_diff(
            _split(a or ""), _split(b or ""),
            fromfile=f"a/{rel}" if a is not None else "/dev/null",
            tofile=f"b/{rel}" if b is not None else "/dev/null",
        )
        for line in diff:
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)
