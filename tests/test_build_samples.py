"""data/build_samples.py: a sample's repo is its project with start.patch applied, rebuilt only when stale."""

import json
import shutil

import pytest

from data.build_samples import (
    SAMPLES_DIR,
    STAMP,
    SampleBuildError,
    build_samples,
    project_files,
    project_of,
    write_start_patch,
)

SAMPLE = "fix_bug_leap_century"


@pytest.fixture
def samples(tmp_path):
    """A samples folder holding one sample's committed files (task.json, start.patch, gold.patch, hidden/)."""
    root = tmp_path / "samples"
    src, dst = SAMPLES_DIR / SAMPLE, root / SAMPLE
    dst.mkdir(parents=True)
    for name in ("task.json", "start.patch", "gold.patch"):
        shutil.copy(src / name, dst / name)
    shutil.copytree(src / "hidden", dst / "hidden")
    return root


def test_builds_the_project_with_the_start_patch_applied(samples):
    assert build_samples(samples) == [SAMPLE]
    repo = samples / SAMPLE / "repo"
    assert "year % 100 != 0 or year % 400 == 0" not in (repo / "leapyear.py").read_text()  # the bug is in
    assert not (repo / "project.json").exists() and not (repo / "README.md").exists()  # catalogue / deleted
    project = project_of(samples / SAMPLE)
    assert {p.relative_to(repo) for p in repo.rglob("*") if p.is_file()} <= \
        {p.relative_to(project) for p in project_files(project)}


def test_every_committed_sample_builds_to_what_the_tests_use(tmp_path):
    for task_dir in sorted(p for p in SAMPLES_DIR.iterdir() if (p / "task.json").is_file()):
        copy = tmp_path / task_dir.name
        copy.mkdir()
        for name in ("task.json", "start.patch"):
            shutil.copy(task_dir / name, copy / name)
        assert build_samples(tmp_path) in ([task_dir.name], [])
        built = {p.relative_to(copy / "repo"): p.read_bytes() for p in (copy / "repo").rglob("*") if p.is_file()}
        shipped = {p.relative_to(task_dir / "repo"): p.read_bytes()
                   for p in (task_dir / "repo").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        assert built == shipped, task_dir.name


def test_up_to_date_samples_are_left_alone_and_a_changed_patch_rebuilds(samples):
    build_samples(samples)
    repo_file = samples / SAMPLE / "repo" / "leapyear.py"
    repo_file.write_text("edited by hand\n")
    assert build_samples(samples) == []  # the stamp covers the inputs, not the output
    patch = samples / SAMPLE / "start.patch"
    bug = "+    return year % 4 == 0 and year % 100 != 0\n"
    patch.write_text(patch.read_text().replace(bug, bug[:-1] + "  # the century rule, half of it\n"))
    assert build_samples(samples) == [SAMPLE]
    assert "half of it" in repo_file.read_text()
    assert build_samples(samples, force=True) == [SAMPLE]


def test_a_patch_that_does_not_apply_names_its_file_and_keeps_the_old_repo(samples):
    build_samples(samples)
    before = (samples / SAMPLE / "repo" / "leapyear.py").read_text()
    patch = samples / SAMPLE / "start.patch"
    patch.write_text(patch.read_text().replace(" def is_leap_year", " def is_a_leap_year"))
    with pytest.raises(SampleBuildError, match="start.patch: does not apply"):
        build_samples(samples)
    assert (samples / SAMPLE / "repo" / "leapyear.py").read_text() == before
    assert not [p for p in (samples / SAMPLE).iterdir() if p.name.startswith(".repo-")]  # no half-built folder


@pytest.mark.parametrize("project", ["no_such_project", "../projects/ledger", ""])
def test_an_unknown_project_is_refused(samples, project):
    task_json = samples / SAMPLE / "task.json"
    task_json.write_text(json.dumps({**json.loads(task_json.read_text()), "project": project}))
    with pytest.raises(SampleBuildError, match="project"):
        build_samples(samples)


def test_write_patch_round_trips(samples):
    build_samples(samples)
    original = (samples / SAMPLE / "start.patch").read_text()
    leap = samples / SAMPLE / "repo" / "leapyear.py"
    leap.write_text(leap.read_text() + "\n# a note\n")
    write_start_patch(samples / SAMPLE)
    assert (samples / SAMPLE / "start.patch").read_text() != original and build_samples(samples) == []
    shutil.rmtree(samples / SAMPLE / "repo")
    (samples / SAMPLE / STAMP).unlink()
    assert build_samples(samples) == [SAMPLE] and leap.read_text().endswith("# a note\n")


def test_a_build_killed_midway_is_swept_and_redone(samples):
    """kill -9 between the copy and the rename leaves a temporary folder and maybe no repo/: the next call
    removes the leftover and builds again."""
    (samples / SAMPLE / ".repo-killed" / "repo").mkdir(parents=True)
    assert build_samples(samples) == [SAMPLE]
    assert not list((samples / SAMPLE).glob(".repo-*")) and (samples / SAMPLE / "repo" / "leapyear.py").is_file()
