"""The sample tasks' starting repos, built from the projects they are cut from.

    python -m data.build_samples            # build what is missing or stale (make install, tests/conftest.py)
    python -m data.build_samples --force    # rebuild every sample
    python -m data.build_samples --write-patch ID   # after editing data/samples/ID/repo: its start.patch anew

A sample task (`data/samples/<id>/`) is written by hand as a change to one of `data/projects/`: its task.json
names the project (`"project"`) and `start.patch` turns that project into the task's starting state (the bug
put in, the function taken out, the tests that would give the answer away removed). Its `repo/` is made here:
the project's files (not project.json, not caches) with start.patch applied through the harness's one patch
applier (env/patches.py), written to a temporary folder and renamed into place, so a sample is never half
built. Committing only the patch keeps one copy of each project's code in the tree.

A stamp beside `repo/` holds the sha256 of its inputs (the project's files and start.patch); a sample whose
stamp matches is left alone, so calling this from every test process costs a few milliseconds. A lock file
serialises concurrent builds (pytest-xdist workers import the tests' conftest at the same time).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from env.patch_apply import apply_patch
from env.patch_paths import PatchError

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = REPO_ROOT / "data" / "samples"
PROJECTS_DIR = REPO_ROOT / "data" / "projects"
START_PATCH = "start.patch"
STAMP = ".repo.sha256"
LOCK = ".build.lock"
# Not part of a project's code: its catalogue entry and what running its tests leaves behind.
SKIPPED = ("project.json", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache")


class SampleBuildError(RuntimeError):
    pass


def project_of(task_dir: Path) -> Path:
    try:
        name = json.loads((task_dir / "task.json").read_text(encoding="utf-8"))["project"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SampleBuildError(f"{task_dir / 'task.json'}: no readable \"project\" ({e})") from e
    project = PROJECTS_DIR / str(name)
    if not isinstance(name, str) or not name or "/" in name or name.startswith(".") or not project.is_dir():
        raise SampleBuildError(f"{task_dir / 'task.json'}: project {name!r} is not a folder of {PROJECTS_DIR}")
    return project


def project_files(project: Path) -> list[Path]:
    skipped = shutil.ignore_patterns(*SKIPPED)
    files, stack = [], [project]
    while stack:
        folder = stack.pop()
        entries = sorted(folder.iterdir())
        ignored = skipped(str(folder), [e.name for e in entries])
        for entry in entries:
            if entry.name in ignored:
                continue
            (stack if entry.is_dir() else files).append(entry)
    return sorted(files)


def inputs_digest(task_dir: Path, project: Path) -> str:
    digest = hashlib.sha256()
    for path in project_files(project):
        digest.update(str(path.relative_to(project)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(b"start.patch\0" + (task_dir / START_PATCH).read_bytes())
    return digest.hexdigest()


def build_sample(task_dir: Path, *, force: bool = False) -> bool:
    """Build `task_dir/repo` if it is missing or stale; True if it was (re)built."""
    project = project_of(task_dir)
    if not (task_dir / START_PATCH).is_file():
        raise SampleBuildError(f"{task_dir}: no {START_PATCH} (the change that makes {project.name} this task)")
    digest = inputs_digest(task_dir, project)
    stamp, repo = task_dir / STAMP, task_dir / "repo"
    for leftover in task_dir.glob(".repo-*"):  # a build killed before its temporary folder was removed
        shutil.rmtree(leftover, ignore_errors=True)
    if not force and repo.is_dir() and stamp.is_file() and stamp.read_text().strip() == digest:
        return False
    with tempfile.TemporaryDirectory(dir=task_dir, prefix=".repo-") as tmp:
        staged = Path(tmp) / "repo"
        shutil.copytree(project, staged, ignore=shutil.ignore_patterns(*SKIPPED))
        try:
            apply_patch(staged, (task_dir / START_PATCH).read_text(encoding="utf-8"))
        except (PatchError, OSError) as e:
            raise SampleBuildError(f"{task_dir / START_PATCH}: does not apply to {project}: {e}") from e
        old = Path(tmp) / "old"
        if repo.exists():
            repo.rename(old)
        staged.rename(repo)
    stamp.write_text(digest + "\n")
    return True


def write_start_patch(task_dir: Path) -> Path:
    """start.patch anew from the sample's edited `repo/` against its project (git's diff, -p1 names)."""
    project = project_of(task_dir)
    if not (task_dir / "repo").is_dir():
        raise SampleBuildError(f"{task_dir}: no repo/ to write a patch from")
    with tempfile.TemporaryDirectory() as tmp:
        skipped = shutil.ignore_patterns(*SKIPPED)
        shutil.copytree(project, Path(tmp) / "a", ignore=skipped)
        shutil.copytree(task_dir / "repo", Path(tmp) / "b", ignore=skipped)
        diff = subprocess.run(["git", "diff", "--no-index", "--no-color", "--src-prefix=", "--dst-prefix=", "a", "b"],
                              cwd=tmp, capture_output=True, text=True, check=False)
    if diff.returncode not in (0, 1):  # 1: the trees differ
        raise SampleBuildError(f"git diff --no-index failed for {task_dir}: {diff.stderr.strip()}")
    (task_dir / START_PATCH).write_text(diff.stdout, encoding="utf-8")
    (task_dir / STAMP).write_text(inputs_digest(task_dir, project) + "\n")
    return task_dir / START_PATCH


def build_samples(samples_dir: Path = SAMPLES_DIR, *, force: bool = False) -> list[str]:
    """Build every sample's repo under `samples_dir` that needs it; the ids built."""
    if not samples_dir.is_dir():  # a partial copy of the tree (the sandbox tests as a normal user)
        return []
    with open(samples_dir / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return [task_dir.name for task_dir in sorted(samples_dir.iterdir())
                if (task_dir / "task.json").is_file() and build_sample(task_dir, force=force)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data.build_samples", description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild every sample, stale or not")
    parser.add_argument("--write-patch", metavar="ID", help="write sample ID's start.patch from its edited repo/")
    args = parser.parse_args(argv)
    try:
        if args.write_patch:
            print(f"wrote {write_start_patch(SAMPLES_DIR / args.write_patch)}")
        else:
            built = build_samples(force=args.force)
            print(f"sample repos: {len(built)} built ({', '.join(built) or 'all up to date'})")
    except SampleBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
