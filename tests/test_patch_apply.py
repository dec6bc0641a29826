"""env/patch_apply.py: applying a parsed diff to a tree, and make_patch. Every hunk is matched before anything
is written; a path is resolved inside its root when it is read and again when it is written, so a symlink in the
tree or one the patch makes never carries a write outside it; make_patch writes what the parser reads back."""

import os
import random

import pytest
from conftest import SENTINEL, host_state

from env.patch_apply import apply_patch, make_patch, plan_patch
from env.patch_paths import PatchError
from env.patches import parse_patch


def test_quoted_and_spaced_names_apply_to_the_right_files(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "with space.txt").write_text("a\n")
    (ws / "café.py").write_text("x = 1\n")
    (ws / 'q"uote.txt').write_text("q\n")
    patch = ("diff --git a/with space.txt b/with space.txt\n--- a/with space.txt\n+++ b/with space.txt\n"  # as
             "@@ -1 +1 @@\n-a\n+b\n"  # nanocomposer/agent/changes.py writes it (no tab; `patch -p1` got 'with')
             'diff --git "a/caf\\303\\251.py" "b/caf\\303\\251.py"\n--- "a/caf\\303\\251.py"\n'
             '+++ "b/caf\\303\\251.py"\n@@ -1 +1 @@\n-x = 1\n+x = 2\n'
             'diff --git "a/q\\"uote.txt" "b/q\\"uote.txt"\n--- "a/q\\"uote.txt"\t2024-01-01\n'
             '+++ "b/q\\"uote.txt"\t2024-01-01\n@@ -1 +1 @@\n-q\n+Q\n'
             "--- a/new dir/new file.txt\t\n+++ b/new dir/new file.txt\t\n@@ -0,0 +1 @@\n+n\n")
    (ws / "new dir").mkdir()
    (ws / "new dir/new file.txt").write_text("")
    assert parse_patch(patch).paths == ["with space.txt", "café.py", 'q"uote.txt', "new dir/new file.txt"]
    apply_patch(ws, patch)
    assert (ws / "with space.txt").read_text() == "b\n" and (ws / "café.py").read_text() == "x = 2\n"
    assert (ws / 'q"uote.txt').read_text() == "Q\n" and (ws / "new dir/new file.txt").read_text() == "n\n"
    assert not (ws / "with").exists()


@pytest.mark.parametrize("target", ["etc", "out"])
def test_apply_refuses_to_touch_through_a_symlink_leaving_the_root(tmp_path, host, target):
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink("/etc" if target == "etc" else str(host), ws / target)
    before = host_state(host)
    for patch in (f"--- a/{target}/passwd\n+++ b/{target}/passwd\n@@ -1 +1 @@\n-root\n+evil\n",
                  f"--- /dev/null\n+++ b/{target}/cron\n@@ -0,0 +1 @@\n+evil\n",
                  f"--- a/{target}/SENTINEL.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-{SENTINEL}\n"):
        with pytest.raises(PatchError, match="outside its tree") as err:
            apply_patch(ws, patch)
        assert SENTINEL not in str(err.value)
    assert host_state(host) == before


def test_symlinks_a_patch_makes_stay_inside_and_are_never_written_through(tmp_path, host):
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg/a.py").write_text("a\n")

    def link(name, target):
        return (f"diff --git a/{name} b/{name}\nnew file mode 120000\n--- /dev/null\n+++ b/{name}\n@@ -0,0 +1 @@\n"
                f"+{target}\n\\ No newline at end of file\n")

    for patch in (link("l", str(host)), link("l", "../host"), link("pkg/l", "../.."), link("l", "."),
                  link("l", "pkg") + "--- /dev/null\n+++ b/l/evil.py\n@@ -0,0 +1 @@\n+x\n"):
        with pytest.raises(PatchError):
            apply_patch(ws, patch)
    assert sorted(p.name for p in ws.iterdir()) == ["pkg"]
    apply_patch(ws, link("alias.py", "pkg/a.py"))
    assert os.readlink(ws / "alias.py") == "pkg/a.py"
    # a text diff of a symlink entry changes its target, the git way; it never writes into the file it names
    retarget = "diff --git a/alias.py b/alias.py\n--- a/alias.py\n+++ b/alias.py\n@@ -1 +1 @@\n-pkg/a.py\n" \
               "\\ No newline at end of file\n+pkg\n\\ No newline at end of file\n"
    apply_patch(ws, retarget)
    assert os.readlink(ws / "alias.py") == "pkg" and (ws / "pkg/a.py").read_text() == "a\n"


def test_no_newline_at_end_of_file(tmp_path):
    before, after = {"a.txt": "one\ntwo"}, {"a.txt": "one\nTWO"}
    patch = make_patch(before, after)
    assert patch.count("\\ No newline at end of file") == 2
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\ntwo")
    apply_patch(ws, patch)
    assert (ws / "a.txt").read_text() == "one\nTWO"
    apply_patch(ws, make_patch({"a.txt": "one\nTWO"}, {"a.txt": "one\nTWO\nthree\n"}))
    assert (ws / "a.txt").read_text() == "one\nTWO\nthree\n"
    for bad, problem in [
        ("--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n-one\n\\ No newline at end of file\n-TWO\n+x\n+y\n",
         "after '\\\\ No newline"),
        ("--- a/a.txt\n+++ b/a.txt\n\\ No newline at end of file\n", "no hunk after"),
        ("--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n\\ No newline at end of file\n+x\n@@ -3 +3 @@\n-t\n+u\n",
         "after the end of the file"),
    ]:
        with pytest.raises(PatchError, match=problem):
            parse_patch(bad)


def test_crlf_patches(tmp_path):
    before, after = {"a.txt": "one\ntwo\n"}, {"a.txt": "one\n2\n"}
    crlf_patch = make_patch(before, after).replace("\n", "\r\n")
    assert parse_patch(crlf_patch).crlf and parse_patch(crlf_patch).paths == ["a.txt"]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_bytes(b"one\ntwo\n")
    apply_patch(ws, crlf_patch)  # a patch saved with CRLF endings, applied to an LF file
    assert (ws / "a.txt").read_bytes() == b"one\n2\n"
    (ws / "a.txt").write_bytes(b"one\r\ntwo\r\n")
    apply_patch(ws, crlf_patch)  # ... and to a CRLF file: the file keeps its CRLF endings
    assert (ws / "a.txt").read_bytes() == b"one\r\n2\r\n"
    (ws / "a.txt").write_bytes(b"one\r\ntwo\r\n")
    apply_patch(ws, make_patch({"a.txt": "one\r\ntwo\r\n"}, {"a.txt": "one\r\n3\r\n"}))  # git-style: CRs in lines
    assert (ws / "a.txt").read_bytes() == b"one\r\n3\r\n"


def test_text_around_sections_is_fine_and_a_failed_hunk_writes_nothing(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    (ws / "b.txt").write_text("b\n")
    patch = ("From 1234 Mon Sep 17 00:00:00 2001\nSubject: fix\n\n---\n a.txt | 2 +-\n\n"
             "diff --git a/a.txt b/a.txt\nindex 1111111..2222222 100644\n--- a/a.txt\n+++ b/a.txt\n"
             "@@ -1 +1 @@\n-a\n+A\n\n-- \n2.39.5\n")
    apply_patch(ws, patch)
    assert (ws / "a.txt").read_text() == "A\n"
    two = make_patch({"a.txt": "A\n", "b.txt": "b\n"}, {"a.txt": "AA\n", "b.txt": "B\n"}).replace("-b\n", "-nope\n")
    with pytest.raises(PatchError, match="hunk 1 of 'b.txt'"):
        apply_patch(ws, two)
    assert (ws / "a.txt").read_text() == "A\n"  # the first file was not written either


def test_hunks_apply_at_an_offset_without_fuzz(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "x.txt").write_text("pad\npad\nctx\nold\nctx2\n")
    apply_patch(ws, "--- a/x.txt\n+++ b/x.txt\n@@ -1,3 +1,3 @@\n ctx\n-old\n+new\n ctx2\n")
    assert (ws / "x.txt").read_text() == "pad\npad\nctx\nnew\nctx2\n"
    with pytest.raises(PatchError, match="does not match"):
        apply_patch(ws, "--- a/x.txt\n+++ b/x.txt\n@@ -1,3 +1,3 @@\n ctx\n-old \n+new\n ctx2\n")


def test_modes_and_renames(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "run.sh").write_text("echo hi\n")
    apply_patch(ws, "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n")
    assert os.stat(ws / "run.sh").st_mode & 0o777 == 0o755
    apply_patch(ws, "diff --git a/run.sh b/bin/go.sh\nsimilarity index 90%\nrename from run.sh\nrename to bin/go.sh\n"
                    "--- a/run.sh\n+++ b/bin/go.sh\n@@ -1 +1 @@\n-echo hi\n+echo bye\n")
    assert not (ws / "run.sh").exists() and (ws / "bin/go.sh").read_text() == "echo bye\n"
    assert os.stat(ws / "bin/go.sh").st_mode & 0o777 == 0o755
    changes = plan_patch(ws, "diff --git a/bin/go.sh b/copy.sh\ncopy from bin/go.sh\ncopy to copy.sh\n")
    assert [(c.path, c.before is None, c.after is None) for c in changes] == [("copy.sh", True, False)]


# ------------------------------------------------------------------------------------------ round trip
def test_make_patch_and_the_parser_round_trip_odd_text(tmp_path):
    """make_patch splits lines where the parser does (at "\\n" only), so form feeds, \\u2028, lone CRs and
    missing final newlines round-trip."""
    rng = random.Random(7)
    alphabet = ["a", "b", " ", "\t", "\x0c", "\u2028", "\r", "é", "+++ b/../x", "--- a/../x", "@@ -1 +1 @@", "\\"]
    for case in range(60):
        def text():
            lines = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(0, 8))]
            return "\n".join(lines) + rng.choice(["", "\n"])
        before = {f"f{i}.txt": text() for i in range(3)}
        after = {k: text() if rng.random() < 0.7 else v for k, v in before.items()}
        if rng.random() < 0.3:
            after.pop("f0.txt")
        if rng.random() < 0.3:
            after["new/g.txt"] = text()
        patch = make_patch(before, after)
        if not patch:
            continue
        ws = tmp_path / f"ws{case}"
        ws.mkdir()
        for rel, content in before.items():
            (ws / rel).write_bytes(content.encode())
        apply_patch(ws, patch)
        got = {p.relative_to(ws).as_posix(): p.read_bytes().decode() for p in ws.rglob("*") if p.is_file()}
        expected = {}
        for rel in before.keys() | after.keys():  # difflib writes nothing between two empty texts
            old, new = before.get(rel), after.get(rel)
            result = old if not (old or new) else new
            if result is not None:
                expected[rel] = result
        assert got == expected, (case, patch)
