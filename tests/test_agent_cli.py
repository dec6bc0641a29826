"""agent.py run on a small git repository made here: the diff shown, exact application, refusals that change nothing."""

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AGENT = [sys.executable, str(ROOT / "agent.py")]


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# What the scripted agent does: an edit, a new file in a new directory, a deletion, a binary file, a chmod.
TURNS = [
    call("read_file", path="calc/ops.py"),
    call("edit_file", path="calc/ops.py", old_str="a - b", new_str="a + b") + "\n"
    + call("edit_file", path="docs/usage.md", old_str="", new_str="# Usage\n\nadd(2, 3) == 5\n"),
    call("run", command="rm notes.txt && printf '\\000\\001\\377' > data.bin && chmod +x tools/build.sh"),
    call("submit", summary="Fixed add."),
]
ORIGINAL = {
    "calc/__init__.py": (b"", 0o644),
    "calc/ops.py": (b"def add(a, b):\n    return a - b\n", 0o644),
    "notes.txt": (b"remember the milk\n", 0o644),
    "data.bin": (b"\x89PNG\x00\x00", 0o644),
    "tools/build.sh": (b"#!/bin/sh\necho build\n", 0o644),
}
EXPECTED = {
    **{k: v for k, v in ORIGINAL.items() if k != "notes.txt"},
    "calc/ops.py": (b"def add(a, b):\n    return a + b\n", 0o644),
    "docs/usage.md": (b"# Usage\n\nadd(2, 3) == 5\n", 0o644),
    "data.bin": (b"\x00\x01\xff", 0o644),
    "tools/build.sh": (b"#!/bin/sh\necho build\n", 0o755),
}


def tree(root: Path, skip_git: bool = True) -> dict[str, tuple[str, int]]:
    """Every file below root: sha256 of its bytes and its permission bits."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not (skip_git and rel.parts[0] == ".git"):
            out[rel.as_posix()] = (hashlib.sha256(p.read_bytes()).hexdigest(), stat.S_IMODE(p.stat().st_mode))
    return out


def hashed(files: dict[str, tuple[bytes, int]]) -> dict[str, tuple[str, int]]:
    return {k: (hashlib.sha256(data).hexdigest(), mode) for k, (data, mode) in files.items()}


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    for rel, (data, mode) in ORIGINAL.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        os.chmod(root / rel, mode)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=root, check=True)
    return root


@pytest.fixture
def replay(tmp_path) -> Path:
    path = tmp_path / "turns.json"
    path.write_text(json.dumps(TURNS))
    return path


def run_agent(*args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*AGENT, "run", *map(str, args)], input=stdin, capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)


def test_yes_applies_exactly_and_the_diff_shown_is_the_change(repo, replay, tmp_path):
    git_before = {k: v for k, v in tree(repo, skip_git=False).items() if k.startswith(".git/")}
    out = tmp_path / "change.diff"
    proc = run_agent("--repo", repo, "--model", f"replay:{replay}", "--yes", "--output", out, "fix add")
    assert proc.returncode == 0, proc.stderr
    assert tree(repo) == hashed(EXPECTED)  # byte- and mode-identical to what the episode's workspace holds
    assert {k: v for k, v in tree(repo, skip_git=False).items() if k.startswith(".git/")} == git_before
    diff = out.read_text()
    assert diff in proc.stdout  # shown verbatim
    assert "new file mode 100644\n--- /dev/null\n+++ b/docs/usage.md" in diff
    assert "deleted file mode 100644\n--- a/notes.txt\n+++ /dev/null" in diff
    assert "old mode 100644\nnew mode 100755" in diff and "Binary files a/data.bin and b/data.bin differ" in diff
    assert "-    return a - b\n+    return a + b\n" in diff
    # the text part of the diff is a real patch: applied to the original it gives the same text files
    clean = tmp_path / "clean"
    subprocess.run(["git", "clone", "-q", str(repo), str(clean)], check=True)  # HEAD = the original commit
    subprocess.run(["patch", "-p1", "--batch", "-s"], input=diff, text=True, cwd=clean, check=False)
    for rel in ("calc/ops.py", "docs/usage.md"):
        assert (clean / rel).read_bytes() == EXPECTED[rel][0]
    assert not (clean / "notes.txt").exists()


@pytest.mark.parametrize("how", ["declined", "no-apply", "end-of-input"])
def test_not_applying_leaves_the_repo_byte_identical(repo, replay, how):
    before = tree(repo, skip_git=False)
    flags, stdin = {"declined": ([], "n\n"), "no-apply": (["--no-apply"], ""), "end-of-input": ([], "")}[how]
    proc = run_agent("--repo", repo, "--model", f"replay:{replay}", *flags, "fix add", stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    assert "+    return a + b" in proc.stdout and "not applied" in proc.stdout
    assert tree(repo, skip_git=False) == before


def test_answer_yes_at_the_prompt_applies(repo, replay):
    proc = run_agent("--repo", repo, "--model", f"replay:{replay}", "fix add", stdin="y\n")
    assert proc.returncode == 0, proc.stderr
    assert tree(repo) == hashed(EXPECTED)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("agent.py: error: "), proc.stderr
    return lines[0]


def test_repo_that_is_not_a_directory(tmp_path, replay):
    (tmp_path / "file.txt").write_text("x")
    for bad in (tmp_path / "missing", tmp_path / "file.txt"):
        assert "is not a directory" in one_line_error(run_agent("--repo", bad, "--model", f"replay:{replay}", "x"))
    assert (tmp_path / "file.txt").read_text() == "x"


def test_missing_checkpoint(repo, tmp_path):
    before = tree(repo, skip_git=False)
    line = one_line_error(run_agent("--repo", repo, "--model", tmp_path / "runs" / "nope" / "sft", "--yes", "x"))
    assert "not found" in line and "nope" in line
    assert "replay file" in one_line_error(run_agent("--repo", repo, "--model", f"replay:{tmp_path}/none.json", "x"))
    assert tree(repo, skip_git=False) == before


def read_until(proc: subprocess.Popen, marker: bytes, timeout_s: float = 60) -> tuple[bytearray, threading.Thread]:
    """(the process's stdout so far, its reader thread), once `marker` shows (or the process exits, or time
    runs out); the thread keeps appending to the buffer until EOF, so join it for the rest."""
    seen = bytearray()

    def read() -> None:
        while chunk := proc.stdout.read1(4096):
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    while marker not in seen and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    return seen, reader


def test_dirty_target_file_at_apply_time_is_refused(repo, replay):
    """The user edits a file the agent changed while the session ran: nothing is applied, exit 2."""
    proc = subprocess.Popen([*AGENT, "run", "--repo", str(repo), "--model", f"replay:{replay}", "fix add"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    seen, reader = read_until(proc, b"[y/N]")
    assert b"[y/N]" in seen, seen.decode()
    (repo / "calc/ops.py").write_text("def add(a, b):\n    return b + a  # my own fix\n")
    mine = tree(repo, skip_git=False)
    proc.stdin.write(b"y\n")
    proc.stdin.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    reader.join(timeout=10)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, bytes(seen).decode(), err)
    line = one_line_error(result)
    assert "calc/ops.py changed in the repository since the session started" in line
    assert tree(repo, skip_git=False) == mine  # nothing else was applied either


def test_gold_patch_and_test_command(repo, tmp_path):
    """A test-only gold patch drives the `gold` policy; run_tests runs the user's test command."""
    patch = tmp_path / "gold.patch"
    patch.write_text("--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
                     "-    return a - b\n+    return a + b\n")
    test = "python -c 'from calc.ops import add; assert add(2, 3) == 5'"
    proc = run_agent("--repo", repo, "--model", "gold", "--gold-patch", patch, "--test-command", test, "--yes", "fix")
    assert proc.returncode == 0, proc.stderr
    assert "exit status submitted; tests: pass" in proc.stdout
    assert (repo / "calc/ops.py").read_bytes() == EXPECTED["calc/ops.py"][0]


def test_ask_user_asks_the_person_at_the_terminal(repo, tmp_path):
    """With a TTY on stdin the question is shown and the typed answer is the tool result the model sees."""
    import pty

    path = tmp_path / "ask.json"
    path.write_text(json.dumps([call("ask_user", question="Which rounding mode?"), call("submit", summary="ok")]))
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([*AGENT, "run", "--repo", str(repo), "--model", f"replay:{path}", "--no-apply", "x"],
                            stdin=secondary, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(secondary)
    seen, reader = read_until(proc, b"your answer>")
    assert b"Which rounding mode?" in seen and b"your answer>" in seen, seen.decode()
    os.write(primary, b"banker's rounding\n")
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    reader.join(timeout=10)
    os.close(primary)
    shown = bytes(seen).decode()
    assert "ask_user(question=\"Which rounding mode?\")\n    banker's rounding" in shown


# ------------------------------------------------------------------ changes.py in process (edge cases)
def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_apply_handles_symlinks_and_emptied_directories(tmp_path):
    from nanocomposer.agent.changes import apply_changes, compute_changes, render_diff

    base = tmp_path / "base"
    (base / "pkg/old").mkdir(parents=True)
    (base / "pkg/old/a.py").write_text("a\n")
    (base / "pkg/keep.py").write_text("k\n")
    repo, work = _copy(base, tmp_path / "repo"), _copy(base, tmp_path / "work")
    (work / "pkg/old/a.py").unlink()
    (work / "pkg/old").rmdir()
    (work / "link").symlink_to("pkg/keep.py")
    (work / "pkg/keep.py").write_text("k\nno newline at the end")
    changes = compute_changes(base, work)
    assert [(c.path, c.status) for c in changes] == [("link", "added"), ("pkg/keep.py", "modified"),
                                                      ("pkg/old/a.py", "deleted")]
    diff = render_diff(base, work, changes)
    assert "new file mode 120000" in diff and "\\ No newline at end of file" in diff
    apply_changes(repo, work, changes)
    assert os.readlink(repo / "link") == "pkg/keep.py" and not (repo / "pkg/old").exists()
    assert tree(repo) == tree(work)


def test_apply_refuses_and_writes_nothing(tmp_path):
    from nanocomposer.agent.changes import ApplyError, apply_changes, compute_changes

    base = tmp_path / "base"
    (base / "src").mkdir(parents=True)
    (base / "src/a.py").write_text("a\n")
    work = _copy(base, tmp_path / "work")
    (work / "src/a.py").write_text("b\n")
    (work / "new.py").write_text("new\n")
    changes = compute_changes(base, work)
    # the user created the file the agent adds
    repo = _copy(base, tmp_path / "repo1")
    (repo / "new.py").write_text("mine\n")
    before = tree(repo)
    with pytest.raises(ApplyError, match="new.py changed in the repository"):
        apply_changes(repo, work, changes)
    assert tree(repo) == before and not list(repo.glob(".nanocomposer-apply-*"))
    # a directory on the path became a symlink (writing through it would leave the repository)
    repo = _copy(base, tmp_path / "repo2")
    outside = _copy(base / "src", tmp_path / "outside")
    import shutil

    shutil.rmtree(repo / "src")
    (repo / "src").symlink_to(outside)
    with pytest.raises(ApplyError, match="src is no longer a directory"):
        apply_changes(repo, work, changes)
    assert (outside / "a.py").read_text() == "a\n" and not (repo / "new.py").exists()


BAD_FLAGS = [("--top-p", "1.5", "must be in (0, 1]"), ("--top-p", "0", "must be in (0, 1]"),
             ("--temperature", "-0.5", "must be >= 0"), ("--seed", "-1", "must be an integer >= 0"),
             ("--max-new-tokens", "0", "must be an integer >= 1"), ("--max-turns", "0", "must be an integer >= 1"),
             ("--max-tokens", "0", "must be an integer >= 1 or None"), ("--max-context", "64", "> max_new_tokens=256"),
             ("--max-malformed-turns", "0", "must be an integer >= 1"), ("--max-output-chars", "10", ">= 200"),
             ("--command-timeout-s", "0", "> 0")]


def test_bad_budget_and_sampling_flags_are_one_line_naming_the_flag(repo, tmp_path):
    serve = [*AGENT, "serve", "--port", "0", "--model", "noop", "--db", str(tmp_path / "s.db"),
             "--registry", str(tmp_path / "registry")]
    cases = [(serve, flag, value, must) for flag, value, must in BAD_FLAGS]
    cases += [([*AGENT, "run", "--repo", str(repo), "--model", "noop", "x"], "--top-p", "2", "must be in (0, 1]"),
              ([*AGENT, "run", "--repo", str(repo), "--model", "noop", "x"], "--max-wall-s", "0", "> 0"),
              (serve, "--session-timeout-s", "-1", "> 0"), (serve, "--workers", "0", "at least 1")]
    for cmd, flag, value, must in cases:
        proc = subprocess.run([*cmd, flag, value], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
        line = one_line_error(proc)
        assert line.startswith(f"agent.py: error: {flag} ") and must in line, (flag, line)
    assert not (tmp_path / "s.db").exists() and not (tmp_path / "registry").exists()  # refused before any work


def test_budget_defaults_come_from_budget():
    from env.budget import Budget

    proc = subprocess.run([*AGENT, "serve", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT, check=True)
    text = " ".join(proc.stdout.split())
    for flag, default in [("--max-turns", Budget.max_turns), ("--max-new-tokens", Budget.max_new_tokens),
                          ("--temperature", Budget.temperature), ("--top-p", Budget.top_p), ("--seed", Budget.seed),
                          ("--session-timeout-s", Budget.max_wall_s),
                          ("--max-malformed-turns", Budget.max_malformed_turns),
                          ("--max-output-chars", Budget.max_output_chars),
                          ("--command-timeout-s", Budget.command_timeout_s)]:
        after = text.split(f" {flag} ")[1]
        assert f"(default: {default})" in after.split(" --")[0], (flag, after[:200])


# ------------------------------------------------------------------ staging, exact edits, forged diffs, atomic apply
def test_a_repo_with_a_fifo_and_a_device_node_runs_and_applies(repo, replay):
    os.mkfifo(repo / "pipe")
    device = True
    try:
        os.mknod(repo / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except OSError:
        device = False
    proc = run_agent("--repo", repo, "--model", f"replay:{replay}", "--yes", "fix add")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "not copied" in proc.stdout and "pipe (FIFO)" in proc.stdout
    assert not device or "zero (character device)" in proc.stdout
    assert tree(repo) == hashed(EXPECTED)
    assert stat.S_ISFIFO(os.lstat(repo / "pipe").st_mode)


def test_a_repo_over_the_file_cap_is_one_line_naming_the_flag(repo, replay):
    before = tree(repo, skip_git=False)
    line = one_line_error(run_agent("--repo", repo, "--model", f"replay:{replay}", "--max-files", "3", "--yes", "x"))
    assert "repo has " in line and "at most 3 (--max-files)" in line, line
    line = one_line_error(run_agent("--repo", repo, "--model", f"replay:{replay}", "--max-mb", "0", "x"))
    assert "--max-mb 0: must be at least 1" in line
    assert tree(repo, skip_git=False) == before


def test_editing_a_crlf_file_changes_one_line_and_a_binary_is_left_alone(repo, tmp_path):
    (repo / "win.txt").write_bytes(b"alpha\r\nbeta\r\ngamma\r\n")
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\r\n"
    (repo / "img.png").write_bytes(png)
    turns = tmp_path / "crlf.json"
    turns.write_text(json.dumps([
        call("edit_file", path="win.txt", old_str="beta\n", new_str="BETA\n"),
        call("edit_file", path="img.png", old_str="IHDR", new_str="IHDX"),
        call("submit", summary="ok")]))
    proc = run_agent("--repo", repo, "--model", f"replay:{turns}", "--yes", "x")
    assert proc.returncode == 0, proc.stderr
    assert (repo / "win.txt").read_bytes() == b"alpha\r\nBETA\r\ngamma\r\n"
    assert (repo / "img.png").read_bytes() == png
    assert "binary file" in proc.stdout


def test_a_file_name_or_content_cannot_forge_the_diff_or_reach_the_terminal(repo, tmp_path):
    name = "x\n+++ b/calc/ops.py\n@@ -0,0 +1 @@\n+innocent"
    turns = tmp_path / "forge.json"
    turns.write_text(json.dumps([
        call("edit_file", path=name, old_str="", new_str="\x1b[2J\x1b[1A\rclean\x07\n"),
        call("submit", summary="done \x1b]0;pwned\x07")]))
    proc = run_agent("--repo", repo, "--model", f"replay:{turns}", "--no-apply", "--output", tmp_path / "d.diff", "x")
    assert proc.returncode == 0, proc.stderr
    for ch in ("\x1b", "\x07", "\r"):
        assert ch not in proc.stdout, repr(ch)
    assert "\\x1b[2J" in proc.stdout
    quoted = '"b/x\\n+++ b/calc/ops.py\\n@@ -0,0 +1 @@\\n+innocent"'
    diff = (tmp_path / "d.diff").read_bytes().decode()
    assert f"+++ {quoted}\n" in diff and "\n+++ b/calc/ops.py\n" not in diff
    assert f"+++ {quoted}" in proc.stdout and "\n+++ b/calc/ops.py\n" not in proc.stdout
    assert "+\x1b[2J\x1b[1A\rclean\x07\n" in diff  # the file written by --output is the real patch


def test_quote_path_matches_git(tmp_path):
    from nanocomposer.agent.changes import quote_path

    names = ["plain.py", "with space.py", "tab\there", "new\nline", 'q"uote', "back\\slash", "caf\u00e9", "esc\x1b[0m",
             "del\x7f"]
    root = tmp_path / "g"
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    for n in names:
        (root / n).write_text("x")
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    listed = subprocess.run(["git", "-c", "core.quotePath=true", "ls-files"], cwd=root, capture_output=True,
                            check=True).stdout.decode().splitlines()
    assert sorted(listed) == sorted(quote_path(n) for n in names)


def _two_changes(tmp_path):
    from nanocomposer.agent.changes import compute_changes

    base = tmp_path / "base"
    (base / "src").mkdir(parents=True)
    for n in ("a.py", "b.py", "c.py", "gone.py"):
        (base / "src" / n).write_text(f"{n} old\n")
    work = _copy(base, tmp_path / "work")
    for n in ("a.py", "b.py", "c.py"):
        (work / "src" / n).write_text(f"{n} new\n")
    (work / "src" / "gone.py").unlink()
    (work / "added").mkdir()
    (work / "added" / "n.py").write_text("n\n")
    return base, work, compute_changes(base, work)


@pytest.mark.parametrize("fail_at", [1, 2, 4])
def test_a_failed_rename_rolls_back_everything(tmp_path, monkeypatch, fail_at):
    from nanocomposer.agent import changes as mod

    base, work, changes = _two_changes(tmp_path)
    repo = _copy(base, tmp_path / "repo")
    before = tree(repo)
    real, calls = os.replace, [0]

    def flaky(src, dst):
        calls[0] += 1
        if calls[0] == fail_at and ".nanocomposer-new" in str(src):
            raise OSError(5, "Input/output error", str(dst))
        return real(src, dst)

    monkeypatch.setattr(mod.os, "replace", flaky)
    with pytest.raises(mod.ApplyError) as exc:
        mod.apply_changes(repo, work, changes)
    monkeypatch.undo()
    assert not exc.value.partial and "Input/output error" in str(exc.value)
    assert ("nothing was applied" if fail_at == 1 else "the repository is unchanged") in str(exc.value)
    assert tree(repo) == before  # byte- and mode-identical, the deleted file back too
    assert not [p for p in repo.rglob("*") if "nanocomposer" in p.name] and not (repo / "added").exists()


def test_a_rollback_that_fails_says_exactly_what_changed(tmp_path, monkeypatch):
    from nanocomposer.agent import changes as mod

    base, work, changes = _two_changes(tmp_path)
    repo = _copy(base, tmp_path / "repo")
    real, calls = os.replace, [0]

    def flaky(src, dst):
        calls[0] += 1
        if calls[0] <= 2:  # added/n.py and src/a.py are written...
            return real(src, dst)
        raise OSError(28, "No space left on device", str(dst))  # ...then nothing works, restoring included

    monkeypatch.setattr(mod.os, "replace", flaky)
    with pytest.raises(mod.ApplyError) as exc:
        mod.apply_changes(repo, work, changes)
    monkeypatch.undo()
    msg = str(exc.value)
    assert exc.value.partial and msg.startswith("partially applied: ")
    assert msg.startswith("partially applied: writing src/b.py failed (No space left on device"), msg
    assert [p for p, _ in exc.value.unrestored] == ["src/a.py"] and exc.value.restored == ["added/n.py"]
    assert "src/a.py holds the session's version" in msg and "restored: added/n.py" in msg
    backup = Path(msg.split("the original is at ")[1].split(";")[0])
    assert backup.read_text() == "a.py old\n" and (repo / "src/a.py").read_text() == "a.py new\n"
    assert (repo / "src/b.py").read_text() == "b.py old\n" and not (repo / "added").exists()


def test_apply_refuses_to_replace_a_fifo(tmp_path):
    from nanocomposer.agent.changes import ApplyError, apply_changes, compute_changes

    base = tmp_path / "base"
    base.mkdir()
    work = _copy(base, tmp_path / "work")
    (work / "pipe").write_text("agent file\n")
    repo = _copy(base, tmp_path / "repo")
    os.mkfifo(repo / "pipe")  # skipped by staging, so the session saw no file there
    with pytest.raises(ApplyError, match="pipe is a FIFO, socket or device"):
        apply_changes(repo, work, compute_changes(base, work))
    assert stat.S_ISFIFO(os.lstat(repo / "pipe").st_mode)


def test_sessions_on_a_damaged_database_is_one_line(tmp_path):
    db = tmp_path / "sessions.db"
    db.write_bytes(b"not a database " * 400)
    proc = subprocess.run([*AGENT, "sessions", "--db", str(db)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert str(db) in one_line_error(proc)
