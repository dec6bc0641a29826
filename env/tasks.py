"""The public task format: loading, validation and writing of task directories.

A task is a directory:

    task.json    {"id": str, "instruction": str, "test_command": str, "timeout_s": int (optional),
                  ...any extra keys: family, tier, project, split, gold_answer}
    repo/        the files the agent starts with
    hidden/      optional: laid over the final workspace before grading (the agent never sees it)
    gold.patch   optional: a unified diff against repo/ (a/ b/ paths) that solves the task

A task set is a directory of task directories (searched recursively, so a factory output
`out/<split>/<id>/` is a task set, and so is each split).

Task directories are not trusted. `load_task` refuses (TaskError naming the task and the path)
anything that would let a task read or write host files or hang the harness: repo/, hidden/,
task.json or gold.patch resolving outside the task directory; a symlink in repo/ or hidden/ that
is absolute, loops, or leaves its tree; FIFOs, sockets and devices; file names that are not
UTF-8; a gold.patch that env/patches.py (the one diff parser every use of a patch goes through) or
env/patch_paths.py refuses: malformed hunks, names that are absolute, hold `..` or control characters, or
resolve outside repo/ through a symlink, binary or symlink changes (edit_file calls cannot make them); a task.json that is
not a small UTF-8 JSON object with the documented types. `load_task_set` loads the good tasks of a set and lists the
bad ones with their reasons (`TaskList.invalid`), so one broken task costs one record, not the run.

`write_task` writes a task directory (its gold.patch made by env/patch_apply.py's `make_patch`);
env/patch_apply.py's `apply_patch` applies one. Grading: env/grading.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from env import patch_paths, patches
from env.patch_paths import shown

log = logging.getLogger(__name__)

REQUIRED_KEYS = {"id": str, "instruction": str, "test_command": str}
# Optional keys the harness reads: a value of another type would surface later as a crash mid-run.
OPTIONAL_STRING_KEYS = ("visible_test_command", "user_answer", "gold_answer", "family", "tier", "project",
                        "split", "symbol")
DEFAULT_TIMEOUT_S = 60
MAX_TIMEOUT_S = 24 * 3600
MAX_TASK_JSON_BYTES = 1024 * 1024  # instructions and metadata; real ones are a few KB
MAX_GOLD_PATCH_BYTES = 16 * 1024 * 1024
MAX_JSON_DEPTH = 32
MAX_TREE_DEPTH = 64  # directories in repo/ or hidden/; deeper trees are attacks on recursive copies
_SURROGATE = re.compile("[\ud800-\udfff]")


class TaskError(ValueError):
    """A task directory that cannot be used; the message names the task and the problem."""


@dataclass
class Task:
    id: str
    instruction: str
    test_command: str
    root: Path
    timeout_s: int = DEFAULT_TIMEOUT_S
    meta: dict = field(default_factory=dict)

    @property
    def repo_dir(self) -> Path:
        return self.root / "repo"

    @property
    def hidden_dir(self) -> Path | None:
        hidden = self.root / "hidden"
        return hidden if hidden.is_dir() else None

    @property
    def gold_patch(self) -> str | None:
        """gold.patch as text (no newline translation: env/patches.py reads CRLF itself), read now without
        following a symlink; None when there is none. TaskError if it became something else since loading."""
        return _read_gold_patch(self.root / "gold.patch", f"task {shown(self.id)}")

    @property
    def gold_answer(self) -> str | None:
        """For answer-graded families (locate): what a correct submission says."""
        return self.meta.get("gold_answer")


def _resolves_inside(path: Path, base: Path) -> bool:
    """Whether `path`, with every symlink followed, lies in `base` (a resolved directory); loops do not."""
    try:
        real = path.resolve(strict=False)
    except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13)
        return False
    return real == base or real.is_relative_to(base)


def walk_tree(root: str | Path):
    """os.walk(root) top-down, never following symlinks, without recursion: Python 3.11's os.walk recurses
    once per level, so a tree 1,000 directories deep (one `mkdir -p` away) raises RecursionError. Yields
    (dirpath, dirnames, filenames) like os.walk (symlinks to directories among the filenames, since they
    are not entered); pruning `dirnames` in place works the same. Unreadable directories are skipped."""
    stack = [os.fspath(root)]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError:
            continue
        dirnames, filenames = [], []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            (dirnames if is_dir else filenames).append(entry.name)
        yield top, dirnames, filenames
        stack.extend(os.path.join(top, d) for d in reversed(dirnames))


def _check_json_value(value, where: str, key: str) -> None:
    """No lone surrogates (unwritable as UTF-8) and no absurd nesting anywhere in a task.json value."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise TaskError(f"{where}: task.json key {key!r} is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(item, str) and _SURROGATE.search(item):
            raise TaskError(f"{where}: task.json key {key!r} holds a lone surrogate (not valid unicode text)")
        if isinstance(item, dict):
            stack += [(k, depth + 1) for k in item] + [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, depth + 1) for v in item]


def _read_spec(root: Path, where: str) -> dict:
    spec_file = root / "task.json"
    if not spec_file.exists() and not spec_file.is_symlink():
        raise TaskError(f"{where}: missing task.json")
    if spec_file.is_symlink() or not spec_file.is_file():
        raise TaskError(f"{where}: task.json must be a regular file (not a symlink, directory or FIFO)")
    size = spec_file.stat().st_size
    if size > MAX_TASK_JSON_BYTES:
        raise TaskError(f"{where}: task.json is {size} bytes; at most {MAX_TASK_JSON_BYTES}")
    try:
        spec = json.loads(spec_file.read_bytes().decode("utf-8-sig"))  # a BOM (Windows editors) is fine
    except UnicodeDecodeError as e:
        raise TaskError(f"{where}: task.json is not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise TaskError(f"{where}: task.json is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise TaskError(f"{where}: task.json is nested too deeply") from None
    except ValueError as e:  # e.g. an integer of 4,300+ digits
        raise TaskError(f"{where}: task.json cannot be read ({str(e)[:120]})") from None
    if not isinstance(spec, dict):
        raise TaskError(f"{where}: task.json must hold a JSON object, got {type(spec).__name__}")
    return spec


def _check_spec(spec: dict, where: str) -> int:
    """Types and values of the keys the harness reads; returns timeout_s."""
    for key, typ in REQUIRED_KEYS.items():
        if key not in spec:
            raise TaskError(f"{where}: task.json lacks required key {key!r}")
        if not isinstance(spec[key], typ) or not spec[key].strip():
            raise TaskError(f"{where}: task.json key {key!r} must be a non-empty string")
    for key, value in spec.items():
        _check_json_value(value, where, key)
    task_id = spec["id"]
    if len(task_id) > 200 or task_id.startswith(".") or any(c in task_id for c in "/\\") or \
            any(ord(c) < 32 or ord(c) == 127 for c in task_id):
        raise TaskError(f"{where}: task id {shown(task_id)} must be at most 200 characters, with no slashes or "
                        "control characters and no leading dot (runners use it in file names)")
    for key in ("test_command", *OPTIONAL_STRING_KEYS):
        value = spec.get(key)
        if value is not None and not isinstance(value, str):
            raise TaskError(f"{where}: task.json key {key!r} must be a string, got {type(value).__name__}")
        if key.endswith("command") and value and "\0" in value:
            raise TaskError(f"{where}: task.json key {key!r} contains a NUL byte")
    timeout_s = spec.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise TaskError(f"{where}: task.json key 'timeout_s' must be an integer from 1 to {MAX_TIMEOUT_S}, "
                        f"got {shown(str(timeout_s), 40)}")
    return timeout_s


def _check_tree(tree: Path, where: str) -> None:
    """Every entry of repo/ or hidden/ is a directory, a regular file, or a relative symlink that stays in `tree`."""
    tree_real = tree.resolve()
    for dirpath, dirnames, filenames in walk_tree(tree):
        dirnames.sort()
        for name in sorted(dirnames + filenames):  # sorted: the same entry is named on every machine
            path = Path(dirpath) / name
            rel = path.relative_to(tree.parent).as_posix()
            if rel.count("/") > MAX_TREE_DEPTH:
                raise TaskError(f"{where}: {shown(rel[:60] + '...')} is nested more than {MAX_TREE_DEPTH} "
                                "directories deep")
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise TaskError(f"{where}: file name {shown(rel)} is not valid UTF-8") from None
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                target = os.readlink(path)
                if os.path.isabs(target):
                    raise TaskError(f"{where}: {shown(rel)} is a symlink to the absolute path {shown(target)}; "
                                    "only relative links inside the tree are allowed")
                if not _resolves_inside(path, tree_real):
                    raise TaskError(f"{where}: {shown(rel)} is a symlink to {shown(target)}, which loops or "
                                    f"resolves outside {tree.name}/")
            elif not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise TaskError(f"{where}: {shown(rel)} is not a regular file or directory (a FIFO, socket "
                                "or device would hang or break the copy)")


def _check_subdir(root: Path, name: str, where: str, required: bool) -> bool:
    """repo/ or hidden/: a real directory of the task, never a link (to the host, or repo -> hidden, which
    would show the agent the hidden tests); False when absent and optional."""
    path = root / name
    if path.is_symlink():
        raise TaskError(f"{where}: {name} is a symlink to {shown(os.readlink(path))}; it must be a real directory "
                        "inside the task directory")
    if not path.exists():
        if required:
            raise TaskError(f"{where}: missing {name}/ directory")
        return False
    if not path.is_dir():
        raise TaskError(f"{where}: {name} must be a directory")
    _check_tree(path, where)
    return True


def _read_gold_patch(patch: Path, where: str) -> str | None:
    """The text of a gold.patch: a regular file (opened without following a symlink, so never a host file),
    at most MAX_GOLD_PATCH_BYTES, UTF-8, newlines as written; None when absent."""
    try:
        mode = patch.lstat().st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(mode):
        raise TaskError(f"{where}: gold.patch must be a regular file (not a symlink, directory or FIFO)")
    try:
        data = patch_paths.read_regular(patch, "gold.patch", MAX_GOLD_PATCH_BYTES)  # opened without following a link
    except patch_paths.PatchError as e:
        raise TaskError(f"{where}: {e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"{where}: gold.patch is not UTF-8 ({e.reason} at byte {e.start})") from None


def check_gold_patch(text: str, repo: Path, where: str) -> patches.Patch:
    """Parse a gold patch with env/patches.py and check what a gold policy needs of it: every path resolves
    inside `repo` now, and every change is text a file's edit_file calls can make (no binary, no symlink).
    TaskError `<where>: gold.patch ...` naming the problem otherwise."""
    try:
        parsed = patches.parse_patch(text)
        for f in parsed.files:
            if f.binary:
                raise patch_paths.PatchError(f"line {f.line}: a binary change of {shown(f.paths[0])} "
                                             "(edit_file calls cannot make it)")
            if patches.SYMLINK_MODE in (f.old_mode, f.new_mode):
                raise patch_paths.PatchError(f"line {f.line}: a symlink change of {shown(f.paths[0])} "
                                             "(edit_file calls cannot make it)")
            for rel in f.paths:
                patch_paths.resolve_inside(repo, rel)
    except patch_paths.PatchError as e:
        raise TaskError(f"{where}: gold.patch {e}") from None
    return parsed


def _check_gold_patch(root: Path, where: str) -> None:
    text = _read_gold_patch(root / "gold.patch", where)
    if text is not None:
        check_gold_patch(text, root / "repo", where)


def load_task(path: str | Path) -> Task:
    """Load and check one task directory; TaskError (naming the directory and the offending path) if unusable."""
    root = Path(path)
    where = f"task directory {shown(str(root), 200)}"
    try:
        if not root.is_dir():
            raise TaskError(f"{where}: not a directory")
        spec = _read_spec(root, where)
        if isinstance(spec.get("id"), str) and spec["id"].strip():
            where = f"task {shown(spec['id'])} ({where})"
        timeout_s = _check_spec(spec, where)
        _check_subdir(root, "repo", where, required=True)
        _check_subdir(root, "hidden", where, required=False)
        _check_gold_patch(root, where)
        root_real = root.resolve(strict=True)
    except (OSError, RuntimeError) as e:  # unreadable entries, symlink loops in the walk, names too long
        raise TaskError(f"{where}: cannot be read ({type(e).__name__}: {e})") from None
    meta = {k: v for k, v in spec.items() if k not in (*REQUIRED_KEYS, "timeout_s")}
    return Task(spec["id"], spec["instruction"], spec["test_command"], root_real, timeout_s, meta)


class TaskList(list):
    """The tasks of a set (a plain list of Task), plus `invalid`: (directory, reason) for each task
    directory that could not be loaded; a runner records those as failures and runs the rest."""

    def __init__(self, tasks=(), invalid: list[tuple[Path, str]] | None = None):
        super().__init__(tasks)
        self.invalid: list[tuple[Path, str]] = list(invalid or [])


def _task_dirs(root: Path) -> list[Path]:
    """Directories holding a task.json below `root`; never inside a task's repo/ or hidden/, never via symlinks."""
    found = []
    for dirpath, dirnames, filenames in walk_tree(root):
        names = set(dirnames) | set(filenames)
        if "task.json" in names:
            found.append(Path(dirpath))
            dirnames[:] = [d for d in dirnames if d not in ("repo", "hidden")]
        dirnames[:] = [d for d in dirnames if d != "repo"]
    return sorted(found)


def load_task_set(path: str | Path, *, strict: bool = False) -> TaskList:
    """All tasks below `path` (a task directory itself is a set of one), sorted by id.

    A task directory that fails `load_task` (or repeats an earlier directory's id) does not stop the
    others: it is logged and listed in the result's `invalid` as (directory, reason). `strict=True`
    raises on the first one instead. A set with no valid task at all is a TaskError."""
    root = Path(path)
    if not root.is_dir():
        raise TaskError(f"task set {shown(str(root), 200)}: not a directory")
    if (root / "task.json").exists() or (root / "task.json").is_symlink():
        return TaskList([load_task(root)])
    dirs = _task_dirs(root)
    if not dirs:
        raise TaskError(f"task set {shown(str(root), 200)}: no task directories (no task.json found below it)")
    tasks, invalid, seen = [], [], {}
    for d in dirs:
        try:
            task = load_task(d)
            if task.id in seen:
                raise TaskError(f"task {shown(task.id)} ({shown(str(d), 200)}): duplicate task id, also in "
                                f"{shown(str(seen[task.id]), 200)}")
        except TaskError as e:
            if strict:
                raise
            log.warning("skipping invalid task: %s", e)
            invalid.append((d, str(e)))
            continue
        seen[task.id] = d
        tasks.append(task)
    if not tasks:
        raise TaskError(f"task set {shown(str(root), 200)}: none of its {len(dirs)} task directories is valid; "
                        f"first: {invalid[0][1]}")
    return TaskList(sorted(tasks, key=lambda t: t.id), invalid)


def _write_tree(dest: Path, tree: Path | dict[str, str]) -> None:
    if isinstance(tree, Path):
        shutil.copytree(tree, dest, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", ".ruff_cache", ".pytest_cache", ".hypothesis", ".mypy_cache"))
        return
    dest.mkdir(parents=True, exist_ok=True)
    for rel, text in tree.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def write_task(dest: Path, *, id: str, instruction: str, test_command: str, repo: Path | dict[str, str],
               hidden: dict[str, str] | Path | None = None, gold_patch: str | None = None,
               timeout_s: int = DEFAULT_TIMEOUT_S, **meta) -> Path:
    """Write a task directory in the public format; returns its path."""
    dest = Path(dest)
    if dest.exists():
        raise TaskError(f"task directory {str(dest)!r} already exists")
    dest.mkdir(parents=True)
    spec = {"id": id, "instruction": instruction, "test_command": test_command, "timeout_s": timeout_s, **meta}
    (dest / "task.json").write_text(json.dumps(spec, indent=2, ensure_ascii=False) + "\n")
    _write_tree(dest / "repo", repo)
    if hidden:
        _write_tree(dest / "hidden", hidden)
    if gold_patch:
        (dest / "gold.patch").write_text(gold_patch)
    return dest


def spread_subset(items: list, n: int) -> list:
    """`n` items evenly spaced over `items` (deterministic; covers the whole list, not its start)."""
    if n >= len(items):
        return list(items)
    return [items[(i * len(items)) // n] for i in range(n)]


NO_FAMILY = "none"  # the family of a task whose task.json names none


def family_of(task: Task) -> str:
    """The task's family (task.json `family`), or NO_FAMILY: what samples, splits and eval tables group by."""
    return str(task.meta.get("family") or NO_FAMILY)
