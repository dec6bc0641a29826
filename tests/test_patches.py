"""env/patches.py: the one unified-diff parser, and every use of it. Hunk lines are counted by their @@ headers
(a body line that looks like a header stays a body line), every path is checked when parsed and resolved inside
its root when read or written, and no gold edit, applied patch or error message ever carries a file from outside
the root. Applying alone: tests/test_patch_apply.py; resolving paths: tests/test_patch_paths.py."""

import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest
from conftest import SENTINEL, host_state

from data.oracle import OraclePolicy
from env.patch_apply import apply_patch, make_patch
from env.patch_paths import PatchError
from env.patches import parse_patch
from env.policies import GoldPolicy, patch_edits
from env.tasks import TaskError, load_task, write_task

REPO = {"calc/ops.py": "def add(a, b):\n    return a - b\n", "tests/test_ops.py": "from calc.ops import add\n"}
OPS = REPO["calc/ops.py"]


def task_with(parent: Path, gold_patch: str, task_id: str = "t", repo: dict | None = None):
    root = write_task(parent / task_id, id=task_id, instruction="Fix add.", test_command="python -m pytest -q",
                      repo=repo or REPO, gold_patch=gold_patch)
    return load_task(root)


def tree_text(root: Path) -> str:
    """Every regular file's bytes below `root` (symlinks not followed), for 'no host content here' checks."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                out.append(p.read_bytes().decode("utf-8", "replace"))
    return "\n".join(out)


def hunk_patch(path: str = "calc/ops.py", extra: list[str] = ()) -> str:
    """A patch of calc/ops.py whose hunk has the hunk lines `extra` (counted in its header) after the fix."""
    body = ["-    return a - b", "+    return a + b", *extra]
    old = 2 + sum(line[:1] in "- " for line in extra)
    new = 2 + sum(line[:1] in "+ " for line in extra)
    return (f"--- a/{path}\n+++ b/{path}\n@@ -1,{old} +1,{new} @@\n def add(a, b):\n" + "\n".join(body) + "\n")


# ------------------------------------------------------------------------------------------ the attack
def test_header_lines_inside_a_hunk_are_hunk_lines_not_files(tmp_path, host):
    """The bug: a hunk line `+++ b/../../..` passed validation (bodies skipped) and was then taken for a
    header by a second parser, which read the host file through the scratch copy into a gold edit_file."""
    tmp_name = (host / "tmp-name").read_text()
    evil = [f"+++ b/{'../' * 12}{host.relative_to('/')}/SENTINEL.txt", f"+++ b/../../{tmp_name}",
            f"+-- a/../../{tmp_name}", "+++ b/../../../../../../../../etc/passwd", "+diff --git a/../x b/../x"]
    task = task_with(tmp_path / "set", hunk_patch(extra=evil))
    assert parse_patch(task.gold_patch).paths == ["calc/ops.py"]
    assert parse_patch(hunk_patch(extra=[f"--- a/../../{tmp_name}"])).paths == ["calc/ops.py"]  # a removed line
    calls = patch_edits(task)
    assert [c["path"] for c in calls] == ["calc/ops.py"]
    assert calls[0]["arguments"]["new_str"].count("../") > 0  # the lines are text added to ops.py, nothing more
    dumped = json.dumps(calls)
    assert SENTINEL not in dumped and "root:" not in dumped
    gold = GoldPolicy()
    gold.reset(task)
    assert SENTINEL not in json.dumps(gold.turns)
    oracle = OraclePolicy(seed=0)
    oracle.reset(task)
    assert SENTINEL not in json.dumps(oracle.edits, default=str)


def test_a_gold_episode_of_the_attack_never_shows_the_host_file(tmp_path, host):
    from env.episode import run_episode

    task = task_with(tmp_path / "set", hunk_patch(extra=[f"+++ b/{'../' * 12}{host.relative_to('/')}/SENTINEL.txt"]))
    traj = run_episode(task, GoldPolicy())
    assert traj.turns and SENTINEL not in json.dumps(traj.to_record(token_ids=True), default=str)
    assert host_state(host)["SENTINEL.txt"] == (SENTINEL + "\n").encode()


def test_an_undercounted_hunk_makes_its_header_looking_line_an_error(tmp_path):
    patch = "--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -2 +2 @@\n-    return a - b\n+    return a + b\n" \
            "+++ b/../../etc/passwd\n"
    with pytest.raises(PatchError, match="line 6: a '\\+\\+\\+' line out of place"):
        parse_patch(patch)
    root = write_task(tmp_path / "t", id="under", instruction="i", test_command="true", repo=REPO, gold_patch=patch)
    with pytest.raises(TaskError, match=r"task 'under' .*gold\.patch line 6"):
        load_task(root)


# ------------------------------------------------------------------------------------------ names
@pytest.mark.parametrize("name, problem", [
    ("a/../../evil.py", "leaves the tree"),
    ("a/calc/../../x", "leaves the tree"),
    ("/etc/passwd", "absolute path"),
    ("a/x\x00y", "control character"),
    ("a/x\x01y", "control character"),
    ("a/x\ud800y", "not valid UTF-8"),
    ("evil.py", "no leading directory"),
    ('"a/..\\057..\\057etc\\057passwd"', "leaves the tree"),  # octal escapes for '/'
    ('"a/x\\ty"', "control character"),
    ('"a/x\\qy"', "unknown escape"),
    ('"a/x', "no closing quote|malformed 'diff --git' line"),
    ('"a/\\377\\376"', "not UTF-8"),
])
def test_bad_names_are_refused_with_one_line(name, problem):
    for patch in (f"--- {name}\n+++ {name}\n@@ -0,0 +1 @@\n+x\n",
                  f"diff --git {name} {name}\nnew file mode 100644\n--- /dev/null\n+++ {name}\n@@ -0,0 +1 @@\n+x\n"):
        with pytest.raises(PatchError) as err:
            parse_patch(patch)
        assert re.search(problem, str(err.value)) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("header", ["rename from", "rename to", "copy from", "copy to"])
def test_git_rename_and_copy_names_are_checked(header):
    lines = {"rename from": "calc/ops.py", "rename to": "calc/new.py", "copy from": "calc/ops.py",
             "copy to": "calc/new.py"}
    kind = header.split()[0]
    lines = {k: v for k, v in lines.items() if k.startswith(kind)}
    lines[header] = "../../etc/cron.d/x"
    patch = "diff --git a/calc/ops.py b/calc/new.py\n" + "".join(f"{k} {v}\n" for k, v in lines.items())
    with pytest.raises(PatchError, match="leaves the tree"):
        parse_patch(patch)


def test_names_that_disagree_are_refused():
    for patch, problem in [
        ("--- a/x.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n", "two different files"),
        ("diff --git a/x.py b/x.py\n--- a/y.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n", "different files"),
        ("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n--- a/x.py\n+++ b/x.py\n@@ -3 +3 @@\n-a\n+b\n", "again"),
        ("diff --git a/x.py b/x.py\nnew file mode 100644\n--- a/x.py\n+++ b/x.py\n@@ -0,0 +1 @@\n+b\n",
         "/dev/null headers disagree"),
        ("diff --git a/x b/x\nnew file mode 160000\n", "not supported"),
        ("diff --git a/x b/x\n", "changes nothing"),
    ]:
        with pytest.raises(PatchError, match=problem):
            parse_patch(patch)


# ------------------------------------------------------------------------------------------ symlinks
def test_gold_edits_never_read_through_a_symlink_planted_after_loading(tmp_path, host):
    task = task_with(tmp_path / "set", make_patch(REPO, {**REPO, "calc/ops.py": OPS.replace("-", "+")}))
    ops = task.repo_dir / "calc/ops.py"
    ops.unlink()
    os.symlink(host / "SENTINEL.txt", ops)  # the task directory changed after load_task checked it
    with pytest.raises(TaskError) as err:
        patch_edits(task)
    assert SENTINEL not in str(err.value) and "task 't'" in str(err.value)
    ops.unlink()
    shutil.rmtree(task.repo_dir / "calc")
    os.symlink(host, task.repo_dir / "calc")  # the whole directory now points at the host
    with pytest.raises(TaskError, match="outside its tree") as err:
        patch_edits(task)
    assert SENTINEL not in str(err.value)


def test_a_gold_patch_that_became_a_symlink_is_not_read(tmp_path, host):
    task = task_with(tmp_path / "set", make_patch(REPO, {**REPO, "calc/ops.py": OPS.replace("-", "+")}))
    (host / "evil.patch").write_text(hunk_patch(extra=[f"+{SENTINEL}"]))
    (task.root / "gold.patch").unlink()
    os.symlink(host / "evil.patch", task.root / "gold.patch")
    with pytest.raises(TaskError, match="regular file"):
        patch_edits(task)


# ------------------------------------------------------------------------------------------ /dev/null, EOF, CRLF
def test_added_and_deleted_files_through_dev_null(tmp_path):
    after = {"calc/ops.py": OPS, "calc/new.py": "NEW = 1\n"}  # tests/test_ops.py deleted, calc/new.py added
    patch = make_patch(REPO, after)
    assert "--- /dev/null\n+++ b/calc/new.py" in patch and "--- a/tests/test_ops.py\n+++ /dev/null" in patch
    parsed = parse_patch(patch)
    assert [(f.old_path, f.new_path) for f in parsed.files] == [(None, "calc/new.py"), ("tests/test_ops.py", None)]
    task = task_with(tmp_path / "set", patch)
    calls = patch_edits(task)
    assert calls == [
        {"name": "edit_file", "arguments": {"path": "calc/new.py", "old_str": "", "new_str": "NEW = 1\n"},
         "path": "calc/new.py", "symbol": None},
        {"name": "run", "arguments": {"command": "rm tests/test_ops.py"}, "path": "tests/test_ops.py", "symbol": None}]
    ws = tmp_path / "ws"
    shutil.copytree(task.repo_dir, ws)
    apply_patch(ws, patch)
    assert (ws / "calc/new.py").read_text() == "NEW = 1\n" and not (ws / "tests/test_ops.py").exists()
    with pytest.raises(PatchError, match="already exists"):
        apply_patch(ws, make_patch({}, {"calc/new.py": "again\n"}))
    with pytest.raises(PatchError, match="does not exist"):
        apply_patch(ws, "--- a/gone.py\n+++ b/gone.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="leave text"):
        apply_patch(ws, "--- a/calc/ops.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-def add(a, b):\n")
    # git's way: an empty file added and deleted with no hunk at all
    apply_patch(ws, "diff --git a/empty.txt b/empty.txt\nnew file mode 100644\nindex 0000000..e69de29\n")
    assert (ws / "empty.txt").read_bytes() == b""
    apply_patch(ws, "diff --git a/empty.txt b/empty.txt\ndeleted file mode 100644\nindex e69de29..0000000\n")
    assert not (ws / "empty.txt").exists()


# ------------------------------------------------------------------------------------------ malformed hunks
@pytest.mark.parametrize("body, problem", [
    ("@@ -1,2 +1,2 @@\n-a\n+b\n", "ends inside this hunk"),  # counts more lines than there are
    ("@@ -1 +1 @@\n-a\n+b\n+c\n", "past the end of the hunk"),  # a line past its counts
    ("@@ -1 +1 @@\n-a\n-b\n+c\n", "more old lines"),
    ("@@ -1,3 +1,3 @@\n-a\n+b\n x\n*junk\n", "not a hunk line"),
    ("@@ -1 +1\n-a\n+b\n", "malformed hunk header"),
    ("@@ -a +1 @@\n-a\n+b\n", "malformed hunk header"),
    ("@@ -1 +1 @@ \n-a\n+b\n", None),  # a trailing blank after @@ is git's empty section name
    ("@@ -" + "9" * 5000 + " +1 @@\n-a\n+b\n", "malformed hunk header"),
    ("@@ -0,1 +1 @@\n-a\n+b\n", "old line 0"),
    ("@@ -3 +3 @@\n-a\n+b\n@@ -1 +1 @@\n-a\n+b\n", "out of order"),
    ("", "no hunk after"),
])
def test_malformed_hunks(body, problem):
    patch = "--- a/x.txt\n+++ b/x.txt\n" + body
    if problem is None:
        parse_patch(patch)
        return
    with pytest.raises(PatchError, match=problem) as err:
        parse_patch(patch)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("patch, problem", [
    ("+++ b/x.txt\n@@ -1 +1 @@\n-a\n+b\n", "out of place"),
    ("@@ -1 +1 @@\n-a\n+b\n", "out of place"),
    ("--- a/x.txt\nnot a header\n", "not followed by a '\\+\\+\\+ '"),
    ("rename from a\nrename to b\n", "out of place"),
    ("*** a/x.txt\n--- b/x.txt\n***************\n", "context diff"),
    ("just prose\n", "no file sections"),
])
def test_malformed_structure(patch, problem):
    with pytest.raises(PatchError, match=problem):
        parse_patch(patch)


# ------------------------------------------------------------------------------------------ seeded fuzz
def _bad_paths(host: Path) -> list[str]:
    tmp_name = (host / "tmp-name").read_text()
    up = "../" * 12
    return [f"{up}{host.relative_to('/')}/SENTINEL.txt", f"../../{tmp_name}", f"../../../../{tmp_name}",
            str(host / "SENTINEL.txt"), "out/SENTINEL.txt", "calc/../../host/SENTINEL.txt", "out/../out/SENTINEL.txt",
            f"./{up}etc/passwd", "out", f"{up}{host.relative_to('/')}"]


def _quote(rng: random.Random, path: str) -> str:
    return '"' + "".join(f"\\{ord(c):03o}" if c == "/" and rng.random() < 0.5 else c for c in path) + '"'


def _hostile_patch(rng: random.Random, host: Path) -> str:
    bad = rng.choice(_bad_paths(host))
    name = rng.choice([f"a/{bad}", f"b/{bad}", bad, _quote(rng, f"a/{bad}")])
    good = make_patch(REPO, {**REPO, "calc/ops.py": OPS.replace("a - b", "a + b")}).splitlines(keepends=True)
    evil_lines = [f"+++ {name}\n", f"--- {name}\n", f"diff --git {name} {name}\n", f"rename to {bad}\n",
                  f"+++ b/{bad}\n", "@@ -0,0 +1 @@\n", "\\ No newline at end of file\n", "new file mode 120000\n",
                  f"+{bad}\n", f"-{bad}\n", f" {bad}\n"]
    kind = rng.randrange(7)
    if kind == 0:  # header-looking lines inside a hunk, its counts kept right or not
        lines = list(good)
        at = rng.randrange(3, len(lines) + 1)
        extra = [rng.choice(evil_lines) for _ in range(rng.randint(1, 3))]
        lines[at:at] = extra
        if rng.random() < 0.6:
            adds = sum(line.startswith("+") for line in extra)
            rems = sum(line.startswith(("-", " ")) for line in extra)
            ctx = sum(line.startswith(" ") for line in extra)
            lines[2] = f"@@ -1,{2 + rems} +1,{2 + adds + ctx} @@\n"
        return "".join(lines)
    if kind == 1:  # a bad name in a header
        return f"--- {name}\n+++ {name}\n@@ -0,0 +1 @@\n+evil\n"
    if kind == 2:  # a deletion or modification of a host file
        return f"--- {name}\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
    if kind == 3:  # git rename / copy of a host file into the repo
        verb = rng.choice(["rename", "copy"])
        return f"diff --git a/{bad} b/stolen.txt\n{verb} from {bad}\n{verb} to stolen.txt\n"
    if kind == 4:  # a symlink out, then something through it
        target = rng.choice([str(host), "../" * rng.randint(1, 6) + "host", "out", "calc/../.."])
        patch = (f"diff --git a/lnk b/lnk\nnew file mode 120000\n--- /dev/null\n+++ b/lnk\n@@ -0,0 +1 @@\n"
                 f"+{target}\n\\ No newline at end of file\n")
        return patch + rng.choice(["", "--- /dev/null\n+++ b/lnk/SENTINEL.txt\n@@ -0,0 +1 @@\n+x\n",
                                   "--- a/lnk/SENTINEL.txt\n+++ b/lnk/SENTINEL.txt\n@@ -1 +1 @@\n-x\n+y\n"])
    if kind == 5:  # a good patch, randomly mutated line by line
        lines = list(good)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(3)
            i = rng.randrange(len(lines))
            if op == 0:
                lines[i] = rng.choice(evil_lines)
            elif op == 1:
                lines.insert(i, rng.choice(evil_lines))
            else:
                del lines[i]
        return "".join(lines)
    pieces = [rng.choice(evil_lines + good) for _ in range(rng.randint(1, 12))]  # random soup
    return "".join(pieces)


def test_seeded_fuzz_of_hostile_patches_never_leaks_a_host_file(tmp_path, host):
    """Hostile patches (seeded, reproducible) against gold edits, the gold policy and application: each
    is refused with a one-line error or does something inside its root; never does a gold edit, an
    applied tree or an error carry the sentinel, and the host files are never changed."""
    rng = random.Random(31)
    before = host_state(host)
    outcomes = {"refused at load": 0, "refused later": 0, "gold edits": 0, "applied": 0, "not applied": 0}
    for case in range(400):
        patch = _hostile_patch(rng, host)
        assert SENTINEL not in patch
        root = write_task(tmp_path / "set" / f"c{case}", id=f"c{case}", instruction="Fix add.",
                          test_command="true", repo=REPO, gold_patch=patch)
        try:
            task = load_task(root)
        except TaskError as e:
            assert SENTINEL not in str(e) and "\n" not in str(e), (case, patch)
            outcomes["refused at load"] += 1
            task = None
        if task is not None:
            os.symlink(host, task.repo_dir / "out")  # planted after loading: read at access time, refused
            try:
                calls = patch_edits(task)
                GoldPolicy().reset(task)
                outcomes["gold edits"] += 1
                assert SENTINEL not in json.dumps(calls), (case, patch)
                assert all(".." not in c["path"].split("/") and not c["path"].startswith("/") for c in calls)
            except TaskError as e:
                assert SENTINEL not in str(e), (case, patch)
                outcomes["refused later"] += 1
        ws = tmp_path / "ws" / f"c{case}"
        shutil.copytree(root / "repo", ws, symlinks=True)
        if not (ws / "out").is_symlink():
            os.symlink(host, ws / "out")
        try:
            apply_patch(ws, patch)
            outcomes["applied"] += 1
        except PatchError as e:
            assert SENTINEL not in str(e) and "\n" not in str(e), (case, patch)
            outcomes["not applied"] += 1
        assert SENTINEL not in tree_text(ws), (case, patch)
        for p in ws.rglob("*"):
            if p.is_symlink() and p != ws / "out":
                assert Path(os.path.realpath(p)).is_relative_to(ws.resolve()), (case, patch)
        assert host_state(host) == before, (case, patch)
    # the fuzz reached every outcome, so its assertions were not vacuous
    print(outcomes)
    assert all(n > 0 for n in outcomes.values()), outcomes
