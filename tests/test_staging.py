"""Staging a user's repository (env.workspace.stage_tree, episodes.stage_repo): regular files, directories and
symlinks only, caps checked before anything is copied, no file opened that is not a regular file.

Run as root (device nodes can be made) and, for what depends on permissions, again as uid 65534."""

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from env import workspace as ws_mod
from env.workspace import StagingError, make_workspace, remove_workspace, stage_tree

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_hang():
    """A staging that opens a FIFO or reads a device hangs or runs for minutes: fail in 20 s instead."""
    def boom(*_):
        raise TimeoutError("staging hung (opened a FIFO or read a device?)")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def make_device(path: Path) -> bool:
    """A /dev/zero character device at `path` (root only); False where not permitted."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except (PermissionError, OSError):
        return False
    return True


def hostile_repo(root: Path) -> dict:
    """A repository with every kind of entry; returns what should be skipped (name -> kind)."""
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o4755)  # setuid: dropped
    (root / "link_in").symlink_to("pkg/mod.py")
    (root / "link_zero").symlink_to("/dev/zero")  # copied as a link, never read
    (root / "link_dir").symlink_to("/etc")
    os.mkfifo(root / "pipe")
    skipped = {"pipe": "FIFO"}
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "sock"))
        skipped["sock"] = "socket"
    except OSError:
        pass
    finally:
        sock.close()
    if make_device(root / "pkg" / "zero"):
        skipped["pkg/zero"] = "character device"
    return skipped


def test_stage_tree_copies_files_dirs_links_and_skips_special_files(tmp_path):
    src = tmp_path / "repo"
    skipped = hostile_repo(src)
    dest = tmp_path / "staged"
    report = stage_tree(src, dest, max_bytes=10_000, max_files=100, files_flag="--max-files")
    assert (dest / "pkg" / "mod.py").read_text() == "X = 1\n"
    assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o755
    for name, target in (("link_in", "pkg/mod.py"), ("link_zero", "/dev/zero"), ("link_dir", "/etc")):
        assert (dest / name).is_symlink() and os.readlink(dest / name) == target
    assert dict(report.skipped) == skipped
    for name in skipped:
        assert not os.path.lexists(dest / name)
    assert (report.files, report.symlinks, report.dirs) == (2, 3, 1)
    assert report.bytes == len("X = 1\n") + len("#!/bin/sh\n")
    assert "pipe" in report.describe_skipped() and "FIFO" in report.describe_skipped()


def test_a_device_node_is_never_read(tmp_path):
    src = tmp_path / "repo"
    src.mkdir()
    if not make_device(src / "zero"):
        pytest.skip("mknod not permitted here")
    (src / "a.py").write_text("a\n")
    t0 = time.perf_counter()
    report = stage_tree(src, tmp_path / "staged", max_bytes=None, max_files=None)  # no cap at all: still not read
    assert time.perf_counter() - t0 < 2
    assert report.skipped == [("zero", "character device")] and report.bytes == 2
    assert sorted(os.listdir(tmp_path / "staged")) == ["a.py"]


def test_dev_as_the_repository_copies_no_device(tmp_path):
    t0 = time.perf_counter()
    try:
        report = stage_tree(Path("/dev"), tmp_path / "staged", max_bytes=64 * 1024 * 1024, max_files=20_000)
    except StagingError as e:  # a host whose /dev is over a cap: refused, and nothing copied
        assert "at most" in str(e) and not (tmp_path / "staged").exists()
        return
    assert time.perf_counter() - t0 < 10
    assert any(why in ("character device", "block device") for _, why in report.skipped)
    for dirpath, dirnames, filenames in os.walk(tmp_path / "staged"):
        for name in filenames + dirnames:
            mode = os.lstat(os.path.join(dirpath, name)).st_mode
            assert stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)


@pytest.mark.parametrize("n, cap, message", [
    (250, 100, "repo has 250 files and directories; at most 100 (--max-files)"),
    (250, 10, "repo has more than 100 files and directories; at most 10 (--max-files)"),  # the walk stops early
])
def test_too_many_files_is_refused_before_copying(tmp_path, n, cap, message):
    src = tmp_path / "repo"
    src.mkdir()
    for i in range(n):
        (src / f"f{i}").write_bytes(b"")
    dest = tmp_path / "staged"
    with pytest.raises(StagingError) as exc:
        stage_tree(src, dest, max_bytes=None, max_files=cap, files_flag="--max-files")
    assert str(exc.value) == message
    assert not dest.exists()  # walked first: nothing written


def test_too_many_bytes_is_refused_before_copying(tmp_path):
    src = tmp_path / "repo"
    src.mkdir()
    (src / "big.bin").write_bytes(b"x" * 3_000_000)
    with (src / "sparse.bin").open("wb") as f:  # apparent size counts: a copy would write all of it
        f.truncate(5 * 1024 * 1024 * 1024)
    dest = tmp_path / "staged"
    with pytest.raises(StagingError) as exc:
        stage_tree(src, dest, max_bytes=1024 * 1024, max_files=None, bytes_flag="--max-mb")
    msg = str(exc.value)
    assert msg.startswith(f"repo has {3_000_000 + 5 * 1024 ** 3} bytes in files") and "at most 1048576" in msg
    assert msg.endswith("(--max-mb)") and not dest.exists()


def test_a_file_that_grows_past_the_cap_while_copied_stops_the_copy(tmp_path):
    src = tmp_path / "repo"
    src.mkdir()
    (src / "log").write_bytes(b"x" * 100)
    plan, report = ws_mod._walk(src, 1000, 10, label="repo", bytes_flag="--max-mb", files_flag=None, grant=False)
    (src / "log").write_bytes(b"x" * 5000)  # same inode, grown since the walk
    (tmp_path / "staged").mkdir()
    with pytest.raises(StagingError, match="grew past 1000 bytes .*--max-mb"):
        ws_mod._copy_plan(src, tmp_path / "staged", plan, report, 1000, grant=False, bytes_flag="--max-mb")


def test_an_entry_swapped_after_the_walk_is_not_followed(tmp_path):
    src = tmp_path / "repo"
    src.mkdir()
    (src / "a.py").write_text("a\n")
    (src / "b.py").write_text("b\n")
    (src / "c.py").write_text("c\n")
    plan, report = ws_mod._walk(src, None, None, label="repo", bytes_flag=None, files_flag=None, grant=False)
    (src / "a.py").unlink()
    (src / "a.py").symlink_to("/etc/passwd")  # O_NOFOLLOW: not read through
    (src / "b.py").unlink()
    os.mkfifo(src / "b.py")  # O_NONBLOCK + fstat: never read, never blocks
    (src / "c.new").write_text("another file\n")
    os.replace(src / "c.new", src / "c.py")  # another inode than the walk saw
    dest = tmp_path / "staged"
    dest.mkdir()
    ws_mod._copy_plan(src, dest, plan, report, None, grant=False)
    assert sorted(report.skipped) == [("a.py", "changed while copying"), ("b.py", "changed while copying"),
                                      ("c.py", "changed while copying")]
    assert os.listdir(dest) == []


def test_stage_repo_with_a_fifo_and_a_device(tmp_path):
    from nanocomposer.agent.episodes import stage_repo

    src = tmp_path / "repo"
    skipped = hostile_repo(src)
    task = stage_repo(src, "x")
    try:
        assert (task.repo_dir / "pkg" / "mod.py").read_text() == "X = 1\n"
        assert not os.path.lexists(task.repo_dir / "pipe")
        staged = task.meta["staged"]
        assert {p: why for p, why in staged["skipped"]} == skipped and staged["skipped_count"] == len(skipped)
        json.dumps(task.meta)  # the server logs it
    finally:
        remove_workspace(task.root)


def test_a_huge_repository_fails_fast_naming_the_cap(tmp_path):
    from nanocomposer.agent.episodes import STAGING_PREFIX, stage_repo

    src = tmp_path / "repo"
    src.mkdir()
    for d in range(25):
        (src / f"d{d}").mkdir()
        for i in range(999):
            (src / f"d{d}" / f"f{i}").write_bytes(b"")
    before = set(Path(tempfile.gettempdir()).glob(f"{STAGING_PREFIX}{os.getpid()}-*"))
    t0 = time.perf_counter()
    with pytest.raises(StagingError) as exc:
        stage_repo(src, "x", files_flag="--max-files")
    took = time.perf_counter() - t0
    assert str(exc.value) == "repo has 25000 files and directories; at most 20000 (--max-files)"
    assert took < 3, took
    assert set(Path(tempfile.gettempdir()).glob(f"{STAGING_PREFIX}{os.getpid()}-*")) == before  # nothing left


def test_make_workspace_refuses_what_its_tmpfs_cannot_hold_before_copying(tmp_path):
    if ws_mod._mount_refused[0]:
        pytest.skip("no tmpfs workspaces here (not root, or no CAP_SYS_ADMIN)")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4200):  # a 1 MB workspace holds 4096 inodes
        (src / f"f{i}").write_bytes(b"")
    t0 = time.perf_counter()
    with pytest.raises(StagingError, match=r"has 4200 files and directories; at most 4095 \(the workspace's inode cap\)"):
        make_workspace(src, parent=tmp_path, size_mb=1)
    assert time.perf_counter() - t0 < 2
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # the workspace was removed (and unmounted)


# ------------------------------------------------------------------ as a normal user (uid 65534)
def nobody_python() -> str | None:
    for exe in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not exe:
            continue
        try:
            proc = subprocess.run([exe, "-c", "import env.workspace"], user=65534, group=65534, cwd="/",
                                  env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True,
                                  timeout=60, check=False)
        except (PermissionError, OSError):
            continue
        if proc.returncode == 0:
            return exe
    return None


@pytest.fixture
def shared_dir():
    """A directory uid 65534 can reach (pytest's tmp_path lives under a root-only 0700 parent)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to uid 65534")
    d = Path(tempfile.mkdtemp(prefix="staging-test-"))
    d.chmod(0o755)
    yield d
    remove_workspace(d)


def run_as_nobody(code: str, cwd: Path) -> dict:
    exe = nobody_python()
    if exe is None:
        pytest.skip("no python that uid 65534 may run")
    script = cwd / "script.py"
    script.write_text(textwrap.dedent(code))
    script.chmod(0o644)
    proc = subprocess.run([exe, str(script)], user=65534, group=65534, cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_as_a_normal_user_unreadable_and_special_entries_are_skipped_not_chmodded(shared_dir):
    src = shared_dir / "repo"
    skipped = hostile_repo(src)
    (src / "secret.txt").write_text("root only\n")
    (src / "secret.txt").chmod(0o600)  # root's, unreadable to uid 65534
    (src / "private").mkdir()
    (src / "private" / "x").write_text("x")
    (src / "private").chmod(0o700)
    for p in [src, *src.rglob("*")]:
        if not p.is_symlink() and p.is_dir() and p.name != "private":
            p.chmod(0o755)
    out = shared_dir / "out"
    out.mkdir()
    os.chown(out, 65534, 65534)
    result = run_as_nobody(f"""
        import json, os
        from pathlib import Path
        from env.workspace import StagingError, stage_tree
        r = stage_tree(Path({str(src)!r}), Path({str(out)!r}) / "staged", max_bytes=10_000, max_files=100)
        try:
            stage_tree(Path({str(src)!r}), Path({str(out)!r}) / "staged2", max_bytes=10_000, max_files=3,
                       files_flag="--max-files")
            capped = None
        except StagingError as e:
            capped = str(e)
        print(json.dumps({{"skipped": r.skipped, "files": sorted(os.listdir(Path({str(out)!r}) / "staged")),
                           "capped": capped}}))
    """, shared_dir)
    assert {p: why for p, why in result["skipped"]} == {**skipped, "secret.txt": "unreadable",
                                                        "private": "unreadable directory"}
    assert "secret.txt" not in result["files"] and "pkg" in result["files"]
    assert result["capped"].startswith("repo has ") and result["capped"].endswith("; at most 3 (--max-files)")
    assert stat.S_IMODE((src / "secret.txt").stat().st_mode) == 0o600  # a user's tree is never chmod-ed
    assert stat.S_IMODE((src / "private").stat().st_mode) == 0o700


def test_as_a_normal_user_apply_into_a_read_only_directory_changes_nothing_and_edits_are_exact(shared_dir):
    os.chown(shared_dir, 65534, 65534)  # the user's own directory
    result = run_as_nobody(f"""
        import json, os, shutil
        from pathlib import Path
        from env.tools import CodeTools, call_tool
        from nanocomposer.agent.changes import ApplyError, apply_changes, compute_changes
        root = Path({str(shared_dir)!r}) / "mine"
        base = root / "base"
        (base / "ro").mkdir(parents=True)
        (base / "ro" / "f.txt").write_bytes(b"one\\r\\ntwo\\r\\n")
        (base / "w.txt").write_text("w\\n")
        work = root / "work"
        shutil.copytree(base, work)
        tools = CodeTools(work)
        edited = call_tool(tools, "edit_file", {{"path": "ro/f.txt", "old_str": "two\\n", "new_str": "2\\n"}})
        call_tool(tools, "edit_file", {{"path": "w.txt", "old_str": "w", "new_str": "W"}})
        repo = root / "repo"
        shutil.copytree(base, repo)
        (repo / "ro").chmod(0o555)
        try:
            apply_changes(repo, work, compute_changes(base, work))
            err = None
        except ApplyError as e:
            err = [str(e), e.partial]
        print(json.dumps({{"edited": edited, "bytes": (work / "ro" / "f.txt").read_bytes().decode(), "err": err,
                           "w": (repo / "w.txt").read_text(), "f": (repo / "ro" / "f.txt").read_bytes().decode(),
                           "left": sorted(os.listdir(repo)) + sorted(os.listdir(repo / "ro"))}}))
    """, shared_dir)
    assert result["edited"].startswith("Edited ro/f.txt at line 2") and result["bytes"] == "one\r\n2\r\n"
    assert result["err"][0].startswith("preparing the changes failed (Permission denied")
    assert result["err"][0].endswith("nothing was applied") and result["err"][1] is False
    assert result["w"] == "w\n" and result["f"] == "one\r\ntwo\r\n"
    assert result["left"] == ["ro", "w.txt", "f.txt"]  # no temporaries or backups left behind
