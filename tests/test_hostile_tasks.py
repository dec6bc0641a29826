"""Hostile task directories: every way a task set could leak host files or crash a run is refused at load
time (TaskError naming the task and the path), never echoes host content, and costs only its own task."""

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from env.grading import Grade, grade
from env.patch_apply import apply_patch, make_patch
from env.patch_paths import PatchError
from env.task_sets import resolve_task_set
from env.tasks import TaskError, load_task, load_task_set, write_task

SECRET = "TOP-SECRET-HOST-CONTENT-7f3a"
REPO = {"calc/ops.py": "def add(a, b):\n    return a - b\n", "tests/test_ops.py": "from calc.ops import add\n"}
FIXED = {**REPO, "calc/ops.py": "def add(a, b):\n    return a + b\n"}


@pytest.fixture
def host(tmp_path) -> Path:
    """A stand-in for host files a task must never reach (secrets, another project)."""
    d = tmp_path / "host"
    d.mkdir()
    (d / "secret.txt").write_text(SECRET + "\n")
    (d / "task.json").write_text(json.dumps({"id": SECRET, "instruction": SECRET, "test_command": "true"}))
    (d / "evil.patch").write_text(f"--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,2 +1,2 @@\n-def add(a, b):\n"
                                  f"+def add(a, b):  # {SECRET}\n     return a - b\n")
    return d


def good_task(parent: Path, task_id: str = "t") -> Path:
    return write_task(parent / task_id, id=task_id, instruction="Fix add.", test_command="python -m pytest -q",
                      repo=REPO, hidden={"tests/test_hidden.py": "def test_h():\n    pass\n"},
                      gold_patch=make_patch(REPO, FIXED), family="fix_bug", tier="micro")


def spec(root: Path, **changes) -> None:
    data = json.loads((root / "task.json").read_text())
    data.update(changes)
    (root / "task.json").write_text(json.dumps(data))


def relink(path: Path, target: str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def make_socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


def patch_naming(name: str) -> str:
    return f"--- {name}\n+++ {name}\n@@ -0,0 +1 @@\n+x\n"


# (case id, how to corrupt a good task directory, a path fragment the error must name)
HOSTILE = [
    ("repo-links-to-host", lambda r, h: relink(r / "repo", str(h)), "repo"),
    ("repo-links-to-hidden", lambda r, h: relink(r / "repo", "hidden"), "repo"),
    ("hidden-links-to-host", lambda r, h: relink(r / "hidden", str(h)), "hidden"),
    ("repo-file-links-to-etc-passwd", lambda r, h: relink(r / "repo/calc/util.py", "/etc/passwd"), "repo/calc/util.py"),
    ("repo-file-links-to-host-secret", lambda r, h: relink(r / "repo/notes.txt", str(h / "secret.txt")),
     "repo/notes.txt"),
    ("repo-link-climbs-out", lambda r, h: relink(r / "repo/calc/up", "../../.."), "repo/calc/up"),
    ("repo-link-into-hidden", lambda r, h: relink(r / "repo/tests/h.py", "../../hidden/tests/test_hidden.py"),
     "repo/tests/h.py"),
    ("repo-symlink-loop", lambda r, h: relink(r / "repo/loop", "loop"), "repo/loop"),
    ("repo-symlink-ping-pong", lambda r, h: (relink(r / "repo/a", "b"), relink(r / "repo/b", "a")), "repo/a"),
    ("hidden-file-links-to-host", lambda r, h: relink(r / "hidden/tests/conftest.py", str(h / "secret.txt")),
     "hidden/tests/conftest.py"),
    ("repo-fifo", lambda r, h: os.mkfifo(r / "repo/pipe"), "repo/pipe"),
    ("hidden-socket", lambda r, h: make_socket(r / "hidden/sock"), "hidden/sock"),
    ("repo-non-utf8-name", lambda r, h: (r / "repo" / os.fsdecode(b"bad\xffname.py")).write_text("x"), "bad"),
    ("gold-patch-dotdot", lambda r, h: (r / "gold.patch").write_text(patch_naming("a/../../evil.py")), "gold.patch"),
    ("gold-patch-absolute", lambda r, h: (r / "gold.patch").write_text(patch_naming("/etc/cron.d/evil")),
     "/etc/cron.d/evil"),
    ("gold-patch-git-rename-out", lambda r, h: (r / "gold.patch").write_text(
        "diff --git a/calc/ops.py b/calc/ops.py\nrename from calc/ops.py\nrename to ../../ops.py\n"), "../../ops.py"),
    ("gold-patch-links-to-host", lambda r, h: relink(r / "gold.patch", str(h / "evil.patch")), "gold.patch"),
    ("gold-patch-not-utf8", lambda r, h: (r / "gold.patch").write_bytes(b"--- a/x\xff\n"), "gold.patch"),
    ("task-json-links-to-host", lambda r, h: relink(r / "task.json", str(h / "task.json")), "task.json"),
    ("task-json-a-list", lambda r, h: (r / "task.json").write_text("[1, 2]"), "task.json"),
    ("task-json-not-json", lambda r, h: (r / "task.json").write_text("{'id': 1"), "task.json"),
    ("task-json-not-utf8", lambda r, h: (r / "task.json").write_bytes(b'{"id": "\xff"}'), "task.json"),
    ("task-json-huge", lambda r, h: spec(r, padding="x" * (2 * 1024 * 1024)), "task.json"),
    ("task-json-deep", lambda r, h: (r / "task.json").write_text(
        '{"id": "t", "instruction": "i", "test_command": "true", "x": ' + "[" * 5000 + "]" * 5000 + "}"),
     "task.json"),
    ("task-json-nested-meta", lambda r, h: spec(r, extra=json.loads("[" * 100 + "]" * 100)), "extra"),
    ("task-json-huge-int", lambda r, h: (r / "task.json").write_text(
        '{"id": "t", "instruction": "i", "test_command": "true", "timeout_s": ' + "9" * 5000 + "}"), "task.json"),
    ("task-json-lone-surrogate", lambda r, h: (r / "task.json").write_text(
        '{"id": "t", "instruction": "fix \\ud800 it", "test_command": "true"}'), "instruction"),
    ("id-not-a-string", lambda r, h: spec(r, id=7), "'id'"),
    ("id-with-slashes", lambda r, h: spec(r, id="../../etc"), "task id"),
    ("instruction-a-list", lambda r, h: spec(r, instruction=["a"]), "'instruction'"),
    ("test-command-a-list", lambda r, h: spec(r, test_command=["rm", "-rf", "/"]), "'test_command'"),
    ("test-command-with-nul", lambda r, h: spec(r, test_command="true\x00; cat /etc/shadow"), "'test_command'"),
    ("visible-test-command-a-dict", lambda r, h: spec(r, visible_test_command={"a": 1}), "visible_test_command"),
    ("user-answer-a-number", lambda r, h: spec(r, user_answer=3), "user_answer"),
    ("timeout-a-string", lambda r, h: spec(r, timeout_s="60"), "timeout_s"),
    ("timeout-a-bool", lambda r, h: spec(r, timeout_s=True), "timeout_s"),
    ("timeout-a-float", lambda r, h: spec(r, timeout_s=1.5), "timeout_s"),
    ("timeout-negative", lambda r, h: spec(r, timeout_s=-1), "timeout_s"),
    ("timeout-astronomical", lambda r, h: spec(r, timeout_s=10**400), "timeout_s"),
    ("timeout-nan", lambda r, h: (r / "task.json").write_text(
        '{"id": "t", "instruction": "i", "test_command": "true", "timeout_s": NaN}'), "timeout_s"),
    ("repo-too-deep", lambda r, h: (r / "repo" / "/".join(["d"] * 80)).mkdir(parents=True), "nested more than 64"),
    ("repo-missing", lambda r, h: shutil.rmtree(r / "repo"), "repo"),
    ("hidden-a-file", lambda r, h: (shutil.rmtree(r / "hidden"), (r / "hidden").write_text("x")), "hidden"),
]


@pytest.mark.parametrize("case, corrupt, names", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_task_is_refused_naming_task_and_path(tmp_path, host, case, corrupt, names):
    root = good_task(tmp_path / "set")
    corrupt(root, host)
    with pytest.raises(TaskError) as err:
        load_task(root)
    message = str(err.value)
    assert str(root) in message, message  # which task
    assert names in message, message  # which path or key
    assert SECRET not in message
    message.encode("utf-8")  # a runner writes it into JSON records


@pytest.mark.parametrize("case, corrupt, names", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_one_hostile_task_does_not_sink_its_set(tmp_path, host, case, corrupt, names):
    bad = good_task(tmp_path / "set", "bad")
    for task_id in ("good-1", "good-2"):
        good_task(tmp_path / "set", task_id)
    corrupt(bad, host)
    tasks = load_task_set(tmp_path / "set")
    assert [t.id for t in tasks] == ["good-1", "good-2"]
    assert [(path, names in reason) for path, reason in tasks.invalid] == [(bad, True)]
    named = resolve_task_set(str(tmp_path / "set"))
    assert [t.id for t in named.tasks] == ["good-1", "good-2"] and named.invalid == [(str(bad), tasks.invalid[0][1])]
    assert SECRET not in json.dumps(named.invalid, ensure_ascii=False) + repr([t.__dict__ for t in tasks])
    with pytest.raises(TaskError, match="bad"):
        load_task_set(tmp_path / "set", strict=True)


def test_a_clean_task_still_loads_with_inside_links(tmp_path):
    root = good_task(tmp_path)
    os.symlink("ops.py", root / "repo/calc/alias.py")  # a relative link that stays in repo/ is fine
    task = load_task(root)
    assert task.id == "t" and task.timeout_s == 60 and task.meta["family"] == "fix_bug"


def test_duplicate_ids_and_all_invalid_sets(tmp_path):
    good_task(tmp_path / "set", "a")
    dup = good_task(tmp_path / "set", "b")
    spec(dup, id="a")
    tasks = load_task_set(tmp_path / "set")
    assert [t.id for t in tasks] == ["a"] and "duplicate task id" in tasks.invalid[0][1]
    only_bad = good_task(tmp_path / "bad-set", "x")
    (only_bad / "task.json").write_text("[]")
    with pytest.raises(TaskError, match="none of its 1 task directories is valid"):
        load_task_set(tmp_path / "bad-set")


def test_task_set_search_does_not_follow_symlinked_directories(tmp_path, host):
    good_task(tmp_path / "set", "a")
    good_task(host, "host-task")
    os.symlink(host, tmp_path / "set" / "link-to-host")
    assert [t.id for t in load_task_set(tmp_path / "set")] == ["a"]


@pytest.mark.parametrize("name", ["a/../../evil.py", "/tmp/evil.py", "a/link/evil.py"])
def test_apply_patch_refuses_paths_outside_the_workspace(tmp_path, host, name):
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(host, ws / "link")
    with pytest.raises(PatchError):
        apply_patch(ws, patch_naming(name))
    assert sorted(p.name for p in host.iterdir()) == ["evil.patch", "secret.txt", "task.json"]


def test_patch_paths_skip_hunk_bodies(tmp_path):
    before = {"notes.sql": "-- see ../docs\nselect 1;\n"}
    after = {"notes.sql": "select 1;\n"}
    patch = make_patch(before, after)
    assert "--- see ../docs" in patch  # a removed line that looks like a header with '..'
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.sql").write_text(before["notes.sql"])
    apply_patch(ws, patch)
    assert (ws / "notes.sql").read_text() == "select 1;\n"


def test_grading_survives_fifos_sockets_and_a_planted_submission_link(tmp_path, host):
    task = load_task(write_task(tmp_path / "t", id="t", instruction="i", repo=REPO, timeout_s=20,
                                test_command="test -f calc/ops.py && cat .submission.txt"))
    ws = tmp_path / "ws"
    shutil.copytree(task.repo_dir, ws)
    os.mkfifo(ws / "pipe")
    make_socket(ws / "sock")
    os.symlink(host / "secret.txt", ws / ".submission.txt")  # the agent hopes grading writes through it
    result = grade(task, ws, "my answer \ud800")
    assert isinstance(result, Grade)
    assert result.solved or "could not be copied" in result.output  # graded, or refused with the reason
    assert (host / "secret.txt").read_text() == SECRET + "\n"  # the host file is untouched
    assert SECRET not in result.output
    result.output.encode("utf-8")
