"""Unified diffs: the one parser that every use of a patch goes through.

    parse_patch(text)               -> Patch: its file sections, each hunk read by the counts of its @@ header

Task validation (env/tasks.py), the gold patch's edit calls (env/policies.py), the applier
(env/patch_apply.py: the task factory's gold check, the simulated users' verdict, the sample repos) all read
a diff here, so a line one of them takes for a file header cannot be a hunk line to another: hunk lines are
counted by the ranges of their `@@ -l,s +l,s @@` header, never guessed from their look. The paths a patch
names are checked by env/patch_paths.py, which also holds PatchError. Nothing shells out to `patch`, whose
own reading of the text could differ.

Accepted: unified diffs as `diff -u`, difflib and git write them, with `patch -p1` names (the first path
component, a/ or b/, is stripped); `/dev/null` for an added or deleted file; git's extended headers (new/deleted
file mode, old/new mode, rename and copy from/to, similarity and index lines, binary markers); git-quoted names
("a/with \\"quote\\".py", C-style and octal escapes, decoded as UTF-8); `\\ No newline at end of file`; patches
whose every line ends in CRLF (read as LF; applied to a CRLF file with CRLF); text before, between and after the
file sections (a commit message) unless it looks like a header.

Refused (PatchError, one line naming the patch line and the problem, never echoing hunk text): absolute paths,
`..` components, control characters (NUL, tab, newline...) and lone surrogates in names; names with no prefix
for -p1 to strip; a hunk whose lines do not add up to its header's counts, or a hunk line past those counts;
malformed @@ headers; overlapping or out-of-order hunks; a `\\ No newline` marker not at the end of the file; a
header line out of place (`+++ ` without `--- `, `@@` without file headers, git headers outside `diff --git`);
context diffs; two sections naming one path; a non-git section naming two different files; file modes other than
100644, 100755 and 120000. What applying refuses: env/patch_apply.py.

This module imports only the standard library and env/patch_paths.py (env/ must not pull in torch and the like).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from env.patch_paths import PatchError, path_problem, shown

MODES = {0o100644: 0o644, 0o100755: 0o755}  # git file modes -> permission bits
SYMLINK_MODE = 0o120000
_HUNK_HEADER = re.compile(r"^@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@(?: .*)?$")
_BINARY_DATA = re.compile(r"^(?:literal \d+|delta \d+|[A-Za-z][0-9A-Za-z!#$%&()*+;<=>?@^_`{|}~-]*|)$")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_GIT_HEADERS = ("old mode ", "new mode ", "deleted file mode ", "new file mode ", "copy from ", "copy to ",
                "rename from ", "rename to ", "similarity index ", "dissimilarity index ", "index ")
_OUT_OF_PLACE = ("+++ ", "@@", "old mode ", "new mode ", "deleted file mode ", "new file mode ", "copy from ",
                 "copy to ", "rename from ", "rename to ", "Binary files ", "GIT binary patch")


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[tuple[str, str], ...]  # (tag " ", "-" or "+", text with its "\n" unless marked as the last)
    line: int  # where its @@ header is in the patch (1-based)

    @property
    def old_lines(self) -> list[str]:
        return [text for tag, text in self.lines if tag != "+"]

    @property
    def new_lines(self) -> list[str]:
        return [text for tag, text in self.lines if tag != "-"]


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # relative to the patched tree (after -p1); None: the file is added
    new_path: str | None  # None: the file is deleted
    hunks: tuple[Hunk, ...] = ()
    old_mode: int | None = None  # git modes (0o100644, 0o100755, 0o120000) where the headers give them
    new_mode: int | None = None
    copy: bool = False  # git "copy from/to": the old file stays
    binary: bool = False  # git's "Binary files ... differ" / "GIT binary patch": no text to apply
    line: int = 0  # where the section starts in the patch (1-based)

    @property
    def paths(self) -> list[str]:
        return list(dict.fromkeys(p for p in (self.old_path, self.new_path) if p is not None))


@dataclass(frozen=True)
class Patch:
    files: tuple[FilePatch, ...]
    crlf: bool = False  # every line of the text ended in CRLF (read as LF)

    @property
    def paths(self) -> list[str]:
        """Every path the patch touches (old and new names), in order of appearance."""
        return list(dict.fromkeys(p for f in self.files for p in f.paths))


def _unquote(text: str, where: str) -> tuple[str, str]:
    """A git C-style quoted name at the start of `text` -> (the name, the rest of `text` after it)."""
    out, i = bytearray(), 1
    while i < len(text):
        c = text[i]
        if c == '"':
            try:
                return out.decode("utf-8"), text[i + 1:]
            except UnicodeDecodeError:
                raise PatchError(f"{where}: a quoted file name is not UTF-8") from None
        if c == "\\":
            nxt = text[i + 1: i + 2]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
            elif re.fullmatch(r"[0-3][0-7]{2}", text[i + 1: i + 4]):
                out.append(int(text[i + 1: i + 4], 8))
                i += 4
            else:
                raise PatchError(f"{where}: a quoted file name has an unknown escape {shown(chr(92) + nxt)}")
        else:
            out += c.encode("utf-8", "surrogatepass")
            i += 1
    raise PatchError(f"{where}: a quoted file name has no closing quote")


def _header_name(raw: str, where: str) -> str:
    """The file name of a `--- ` / `+++ ` line (what follows the marker): quoted, or up to a tab (a timestamp
    follows it), trailing blanks dropped."""
    if raw.startswith('"'):
        name, rest = _unquote(raw, where)
        if rest and not rest.startswith("\t"):
            raise PatchError(f"{where}: unexpected text after the quoted file name")
        return name
    return raw.split("\t", 1)[0].rstrip(" ")


def _git_names(rest: str, where: str) -> tuple[str, str] | None:
    """(a-name, b-name) of `diff --git <rest>`, or None when unquoted names with spaces make it ambiguous
    (the ---/+++ or rename headers then say)."""
    if rest.startswith('"'):
        a, after = _unquote(rest, where)
        if not after.startswith(" "):
            raise PatchError(f"{where}: malformed 'diff --git' line")
        after = after[1:]
        b = _unquote(after, where)[0] if after.startswith('"') else after
        return a, b
    if rest.endswith('"') and ' "' in rest:
        cut = rest.index(' "')
        b, tail = _unquote(rest[cut + 1:], where)
        if tail:
            raise PatchError(f"{where}: malformed 'diff --git' line")
        return rest[:cut], b
    if len(rest) % 2 == 1 and rest[len(rest) // 2] == " ":  # "a/NAME b/NAME": the same name twice
        a, b = rest[: len(rest) // 2], rest[len(rest) // 2 + 1:]
        if a.partition("/")[2] == b.partition("/")[2] != "":
            return a, b
    if rest.count(" ") == 1:
        a, b = rest.split(" ")
        return a, b
    return None


def _strip_one(raw: str, where: str) -> str:
    """A name as written in a ---/+++ or `diff --git` header -> the path `patch -p1` uses (checked)."""
    if problem := path_problem(raw):
        raise PatchError(f"{where}: file name {shown(raw)} {problem}")
    parts = PurePosixPath(raw).parts
    if len(parts) < 2:
        raise PatchError(f"{where}: file name {shown(raw)} has no leading directory (a/, b/) for -p1 to strip")
    return PurePosixPath(*parts[1:]).as_posix()


def _plain(raw: str, where: str) -> str:
    """A name of a rename/copy header (written without a/ b/ prefixes), checked."""
    if problem := path_problem(raw):
        raise PatchError(f"{where}: file name {shown(raw)} {problem}")
    return PurePosixPath(raw).as_posix()


def _mode(value: str, where: str) -> int:
    if not re.fullmatch(r"[0-7]{6}", value.strip()):
        raise PatchError(f"{where}: malformed file mode {shown(value)}")
    mode = int(value, 8)
    if mode not in MODES and mode != SYMLINK_MODE:
        raise PatchError(f"{where}: file mode {value.strip()} is not supported (only 100644, 100755, 120000)")
    return mode


class _Reader:
    def __init__(self, text: str):
        if not isinstance(text, str):
            raise PatchError(f"a patch must be text, got {type(text).__name__}")
        lines = text.split("\n")  # "\n" only: str.splitlines would also split at \r, \f, \x1c, \u2028...
        if lines and lines[-1] == "":
            lines.pop()
        self.crlf = "\n" in text and text.count("\r\n") == text.count("\n")
        self.lines = [line.removesuffix("\r") for line in lines] if self.crlf else lines
        self.i = 0

    def peek(self, k: int = 0) -> str | None:
        return self.lines[self.i + k] if self.i + k < len(self.lines) else None

    def header(self, k: int = 0) -> str | None:
        """A structural line (header, @@): a stray CR of a mixed-ending patch is not part of it."""
        line = self.peek(k)
        return line.removesuffix("\r") if line is not None else None

    def where(self, k: int = 0) -> str:
        return f"line {self.i + k + 1}"


def parse_patch(text: str) -> Patch:
    """Read a unified diff (module docstring for what is accepted and refused); PatchError if malformed."""
    r = _Reader(text)
    files: list[FilePatch] = []
    after_hunk = False
    while (line := r.header()) is not None:
        if line.startswith("diff --git "):
            files.append(_git_section(r))
            after_hunk = bool(files[-1].hunks)
            continue
        if line.startswith("--- "):
            if not (r.header(1) or "").startswith("+++ "):
                raise PatchError(f"{r.where()}: a '--- ' file header not followed by a '+++ ' header")
            files.append(_traditional_section(r))
            after_hunk = True
            continue
        if line.startswith("*** ") and (r.header(1) or "").startswith("--- "):
            raise PatchError(f"{r.where()}: a context diff ('*** ' headers); only unified diffs are supported")
        if stray := next((h for h in _OUT_OF_PLACE if line.startswith(h)), None):
            raise PatchError(f"{r.where()}: a {shown(stray.strip())} line out of place (no file header before it, "
                             "or a hunk whose @@ header counts fewer lines)")
        raw = r.peek()
        if after_hunk and raw[:1] in (" ", "+", "-") and raw.rstrip("\r") != "-- ":
            raise PatchError(f"{r.where()}: a hunk line past the end of the hunk (its @@ header counts fewer lines)")
        after_hunk = False
        r.i += 1  # text outside any file section (a commit message, a "diff -u ..." or "Index:" line)
    if not files:
        raise PatchError("the patch has no file sections ('--- ' / '+++ ' or 'diff --git' headers)")
    seen: dict[str, int] = {}
    for f in files:
        for p in f.paths:
            if p in seen:
                raise PatchError(f"line {f.line}: names {shown(p)} again (also in the section at line {seen[p]})")
            seen[p] = f.line
    return Patch(tuple(files), r.crlf)


def _file_headers(r: _Reader) -> tuple[str, str, str]:
    """Consume a ---/+++ pair; (old raw name, new raw name, where)."""
    where = r.where()
    old = _header_name(r.header()[4:], where)
    new = _header_name(r.header(1)[4:], r.where(1))
    r.i += 2
    return old, new, where


def _traditional_section(r: _Reader) -> FilePatch:
    start = r.i + 1
    old_raw, new_raw, where = _file_headers(r)
    old = None if old_raw == "/dev/null" else _strip_one(old_raw, where)
    new = None if new_raw == "/dev/null" else _strip_one(new_raw, r.where(-1))
    if old is None and new is None:
        raise PatchError(f"{where}: both file headers are /dev/null")
    if old is not None and new is not None and old != new:
        raise PatchError(f"{where}: names two different files ({shown(old_raw)} and {shown(new_raw)}) without a "
                         "'diff --git' rename header")
    hunks = _hunks(r, new_file=old is None, deleted=new is None)
    if not hunks:
        raise PatchError(f"{where}: file headers with no hunk after them")
    return FilePatch(old, new, hunks, line=start)


def _git_section(r: _Reader) -> FilePatch:
    start, where = r.i + 1, r.where()
    names = _git_names(r.header()[len("diff --git "):], where)
    git_old = git_new = None
    if names is not None:
        git_old, git_new = _strip_one(names[0], where), _strip_one(names[1], where)
    r.i += 1
    ext: dict[str, str] = {}
    binary = False
    while (line := r.header()) is not None:
        key = next((h for h in _GIT_HEADERS if line.startswith(h)), None)
        if key is not None:
            if key in ext:
                raise PatchError(f"{r.where()}: a second {shown(key.strip())} header in one section")
            value = line[len(key):]
            ext[key] = _unquote(value, r.where())[0] if key.endswith(("from ", "to ")) and value.startswith('"') \
                else value
            if key.endswith(("from ", "to ")):
                ext[key] = _plain(ext[key], r.where())
            r.i += 1
        elif line.startswith("Binary files ") and line.endswith(" differ"):
            binary = True
            r.i += 1
            break
        elif line == "GIT binary patch":
            binary = True
            r.i += 1
            while (data := r.header()) is not None and _BINARY_DATA.match(data) and not data.startswith("diff "):
                r.i += 1
            break
        else:
            break
    new_file, deleted = "new file mode " in ext, "deleted file mode " in ext
    if new_file and deleted:
        raise PatchError(f"{where}: a section both adds and deletes its file")
    renamed = "rename from " in ext or "rename to " in ext
    copied = "copy from " in ext or "copy to " in ext
    if renamed + copied + new_file + deleted > 1 or (renamed or copied) and not (
            ("rename from " in ext and "rename to " in ext) or ("copy from " in ext and "copy to " in ext)):
        raise PatchError(f"{where}: inconsistent git headers (rename/copy/new/deleted)")
    old_mode = _mode(ext.get("old mode ") or ext.get("deleted file mode ") or "100644", where) \
        if ("old mode " in ext or deleted) else None
    new_mode = _mode(ext.get("new mode ") or ext.get("new file mode ") or "100644", where) \
        if ("new mode " in ext or new_file) else None
    if "index " in ext and (m := re.fullmatch(r"[0-9a-f]+\.\.[0-9a-f]+ ([0-7]{6})", ext["index "].strip())):
        old_mode = new_mode = old_mode or _mode(m.group(1), where)  # unchanged mode of a modified entry
    if (old_mode == SYMLINK_MODE) != (new_mode == SYMLINK_MODE) and old_mode and new_mode:
        raise PatchError(f"{where}: a mode change between a file and a symlink")
    # Every source of a name must agree: diff --git, rename/copy, and ---/+++.
    olds = [git_old, ext.get("rename from "), ext.get("copy from ")]
    news = [git_new, ext.get("rename to "), ext.get("copy to ")]
    hunks: tuple[Hunk, ...] = ()
    if not binary and (r.header() or "").startswith("--- "):
        if not (r.header(1) or "").startswith("+++ "):
            raise PatchError(f"{r.where()}: a '--- ' file header not followed by a '+++ ' header")
        old_raw, new_raw, hwhere = _file_headers(r)
        if (old_raw == "/dev/null") != new_file or (new_raw == "/dev/null") != deleted:
            raise PatchError(f"{hwhere}: /dev/null headers disagree with the git new/deleted file headers")
        olds.append(None if old_raw == "/dev/null" else _strip_one(old_raw, hwhere))
        news.append(None if new_raw == "/dev/null" else _strip_one(new_raw, hwhere))
        hunks = _hunks(r, new_file=new_file, deleted=deleted)
        if not hunks:
            raise PatchError(f"{hwhere}: file headers with no hunk after them")
    old_names, new_names = {n for n in olds if n is not None}, {n for n in news if n is not None}
    if len(old_names) > 1 or len(new_names) > 1:
        names = sorted(old_names | new_names)
        raise PatchError(f"{where}: the section's headers name different files ({', '.join(map(shown, names))})")
    old = None if new_file else next(iter(old_names), None) or next(iter(new_names), None)
    new = None if deleted else next(iter(new_names), None) or next(iter(old_names), None)
    if old is None and new is None:
        raise PatchError(f"{where}: cannot tell the file names from the 'diff --git' line (quote names with spaces)")
    if old is not None and new is not None and old != new and not (renamed or copied):
        raise PatchError(f"{where}: names two different files without a rename or copy header")
    if not (hunks or binary or new_file or deleted or renamed or copied or old_mode != new_mode):
        raise PatchError(f"{where}: a 'diff --git' section that changes nothing")
    return FilePatch(old, new, hunks, old_mode, new_mode, copied, binary, start)


def _hunks(r: _Reader, new_file: bool, deleted: bool) -> tuple[Hunk, ...]:
    hunks: list[Hunk] = []
    ended = {"old": False, "new": False}  # a "\ No newline" marker closed that side of the file
    while (line := r.header()) is not None and line.startswith("@@"):
        where, header_line = r.where(), r.i + 1
        m = _HUNK_HEADER.match(line)
        if not m:
            raise PatchError(f"{where}: malformed hunk header (expected '@@ -l[,s] +l[,s] @@')")
        old_start, new_start = int(m.group(1)), int(m.group(3))
        old_count = int(m.group(2)) if m.group(2) is not None else 1
        new_count = int(m.group(4)) if m.group(4) is not None else 1
        if old_start == 0 and old_count:
            raise PatchError(f"{where}: a hunk at old line 0 must remove no lines")
        if new_start == 0 and new_count:
            raise PatchError(f"{where}: a hunk at new line 0 must add no lines")
        if (new_file and (old_start or old_count)) or (deleted and (new_start or new_count)):
            raise PatchError(f"{where}: hunk ranges disagree with the added/deleted file ({shown(line[:40])})")
        if hunks:
            prev = hunks[-1]
            if ended["old"] or ended["new"]:
                raise PatchError(f"{where}: a hunk after the end of the file ('\\ No newline at end of file')")
            first = old_start - 1 if old_count else old_start
            prev_first = prev.old_start - 1 if prev.old_count else prev.old_start
            if first < prev_first + prev.old_count:
                raise PatchError(f"{where}: hunks overlap or are out of order")
        r.i += 1
        body: list[tuple[str, str]] = []
        old_left, new_left = old_count, new_count
        while True:
            raw = r.peek()
            if raw is not None and raw.startswith("\\"):  # "\ No newline at end of file" (any language)
                if not body:
                    raise PatchError(f"{r.where()}: a '\\' line with no hunk line before it")
                tag, text = body[-1]
                if not text.endswith("\n"):
                    raise PatchError(f"{r.where()}: two '\\' lines for one hunk line")
                body[-1] = (tag, text[:-1])
                for side in (("old",) if tag == "-" else ("new",) if tag == "+" else ("old", "new")):
                    ended[side] = True
                r.i += 1
                continue
            if old_left == 0 and new_left == 0:
                break
            if raw is None:
                raise PatchError(f"{where}: the patch ends inside this hunk ({old_left} old and {new_left} new "
                                 "lines its header counts are missing)")
            tag, text = (" ", "") if raw in ("", "\r") else (raw[:1], raw[1:])
            sides = {" ": ("old", "new"), "-": ("old",), "+": ("new",)}.get(tag)
            if sides is None:
                raise PatchError(f"{r.where()}: not a hunk line (' ', '-' or '+'); the @@ header at {where} counts "
                                 f"{old_left} more old and {new_left} more new lines")
            if ("old" in sides and old_left == 0) or ("new" in sides and new_left == 0):
                raise PatchError(f"{r.where()}: more {'/'.join(sides)} lines than the @@ header at {where} counts")
            if any(ended[s] for s in sides):
                raise PatchError(f"{r.where()}: a line after '\\ No newline at end of file'")
            old_left -= "old" in sides
            new_left -= "new" in sides
            body.append((tag, text + "\n"))
            r.i += 1
        hunks.append(Hunk(old_start, old_count, new_start, new_count, tuple(body), header_line))
    return tuple(hunks)

