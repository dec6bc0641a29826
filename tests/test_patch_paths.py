"""env/patch_paths.py: a path a patch names is resolved inside its root when it is used, every symlink
followed, and read without following a link out; an error never carries the text of a host file."""

import os

import pytest
from conftest import SENTINEL

from env.patch_paths import PatchError, read_text_inside, resolve_inside


def test_paths_resolve_inside_their_root_at_access_time(tmp_path, host):
    root = tmp_path / "root"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg/a.py").write_text("a\n")
    os.symlink(host, root / "out")  # a repo symlink pointing outside
    os.symlink("pkg", root / "inner")  # one that stays inside
    os.symlink("/etc", root / "etc")
    assert resolve_inside(root, "inner/a.py") == (root / "pkg/a.py").resolve()
    for rel in ("out/SENTINEL.txt", "etc/passwd", "../host/SENTINEL.txt", "/etc/passwd", ".", "pkg/../.."):
        with pytest.raises(PatchError):
            resolve_inside(root, rel)
    with pytest.raises(PatchError) as err:
        read_text_inside(root, "out/SENTINEL.txt")
    assert SENTINEL not in str(err.value)
    assert read_text_inside(root, "inner/a.py") == "a\n"


def test_read_regular_refuses_a_directory_and_a_fifo_without_leaking_a_descriptor(tmp_path):
    from env.patch_paths import read_regular

    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    open_fds = len(os.listdir("/proc/self/fd"))
    for name in ("dir", "fifo"):
        with pytest.raises(PatchError, match=f"^{name} is not a regular file$"):
            read_regular(tmp_path / name, name)
    assert len(os.listdir("/proc/self/fd")) == open_fds
