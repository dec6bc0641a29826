"""Static checks of the hand-made sample tasks in data/samples, independent of the harness.

Each sample is graded here the way the task format prescribes (copy repo/, apply the
patch if any, lay hidden/ over it, write .submission.txt, run test_command), but with
plain subprocesses in temporary directories, so a broken sample is caught even when the
harness itself is broken. The venv's bin/ goes first on PATH, giving `python` and `ruff`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
# Not resolved: the venv's python is a symlink and its directory is what we want on PATH.
VENV_BIN = Path(sys.executable).parent
FAMILIES = {"fix_bug", "implement_function", "fix_lint", "locate"}
REQUIRED_KEYS = {"id": str, "instruction": str, "test_command": str, "timeout_s": int, "family": str, "tier": str}
VISIBLE_TESTS = "python -m pytest -q -p no:cacheprovider tests"
SAMPLE_IDS = sorted(path.name for path in SAMPLES.iterdir() if (path / "task.json").is_file())


def load_task(sample: str) -> dict:
    return json.loads((SAMPLES / sample / "task.json").read_text())


def subprocess_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Third-party pytest plugins in the venv cost ~3 s per run and play no part in whether a
    # sample passes or fails; without them the whole file runs in a fraction of the time.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def make_workspace(sample: str, tmp_path: Path, apply_gold: bool, submission: str = "") -> Path:
    """A graded copy of the sample: repo/ (+ gold.patch) with hidden/ laid over and the submission written."""
    task_dir = SAMPLES / sample
    workspace = tmp_path / "workspace"
    shutil.copytree(task_dir / "repo", workspace)
    patch = task_dir / "gold.patch"
    if apply_gold and patch.is_file():
        applied = subprocess.run(
            ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-i", str(patch)],
            cwd=workspace,
            capture_output=True,
            text=True,
            check=False,
        )
        assert applied.returncode == 0, f"{sample}: gold.patch does not apply:\n{applied.stdout}{applied.stderr}"
    if (task_dir / "hidden").is_dir():
        shutil.copytree(task_dir / "hidden", workspace, dirs_exist_ok=True)
    (workspace / ".submission.txt").write_text(submission)
    return workspace


def run_command(command: str, workspace: Path, timeout_s: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=workspace,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def gold_submission(task: dict) -> str:
    return task.get("gold_answer", "")


def test_samples_cover_every_family():
    families = [load_task(sample)["family"] for sample in SAMPLE_IDS]
    assert set(families) == FAMILIES
    assert families.count("fix_bug") >= 2


@pytest.mark.parametrize("sample", SAMPLE_IDS)
def test_task_is_well_formed(sample):
    task_dir = SAMPLES / sample
    task = load_task(sample)
    for key, kind in REQUIRED_KEYS.items():
        assert isinstance(task.get(key), kind), f"{sample}: task.json needs {key!r} of type {kind.__name__}"
    assert task["id"] == sample
    assert task["family"] in FAMILIES
    assert task["timeout_s"] == 60
    assert (task_dir / "repo").is_dir() and (task_dir / "hidden").is_dir()
    if task["family"] == "locate":
        assert task["test_command"] == "python check_answer.py"
        assert (task_dir / "hidden" / "check_answer.py").is_file()
        assert task.get("gold_answer"), f"{sample}: a locate task needs gold_answer"
    else:
        patch = task_dir / "gold.patch"
        assert patch.is_file() and patch.stat().st_size > 0, f"{sample}: missing or empty gold.patch"
    leftovers = [
        path.relative_to(task_dir)
        for path in task_dir.rglob("*")
        if path.name in ("__pycache__", ".ruff_cache", ".pytest_cache", ".submission.txt")
    ]
    assert leftovers == [], f"{sample}: build leftovers in the sample: {leftovers}"


@pytest.mark.parametrize("sample", SAMPLE_IDS)
def test_visible_tests_pass_on_the_starting_repo(sample, tmp_path):
    """The bug shows only through the instruction and the hidden tests, never as a broken visible suite."""
    workspace = tmp_path / "repo"
    shutil.copytree(SAMPLES / sample / "repo", workspace)
    result = run_command(VISIBLE_TESTS, workspace, timeout_s=60)
    assert result.returncode == 0, f"{sample}: visible tests fail on repo/:\n{result.stdout[-3000:]}"


@pytest.mark.parametrize("sample", SAMPLE_IDS)
def test_unsolved_workspace_fails(sample, tmp_path):
    task = load_task(sample)
    workspace = make_workspace(sample, tmp_path, apply_gold=False)
    result = run_command(task["test_command"], workspace, task["timeout_s"])
    assert result.returncode != 0, f"{sample}: passes without a fix:\n{result.stdout[-3000:]}"


@pytest.mark.parametrize("sample", SAMPLE_IDS)
def test_gold_solution_passes(sample, tmp_path):
    task = load_task(sample)
    workspace = make_workspace(sample, tmp_path, apply_gold=True, submission=gold_submission(task))
    result = run_command(task["test_command"], workspace, task["timeout_s"])
    assert result.returncode == 0, f"{sample}: gold fails:\n{result.stdout[-3000:]}{result.stderr[-2000:]}"


LOCATE_IDS = [sample for sample in SAMPLE_IDS if load_task(sample)["family"] == "locate"]


@pytest.mark.parametrize("sample", LOCATE_IDS)
def test_locate_checker_rejects_wrong_answers(sample, tmp_path):
    task = load_task(sample)
    gold_path = task["gold_answer"].split(":")[0]
    other_file = next(
        path.relative_to(SAMPLES / sample / "repo").as_posix()
        for path in sorted((SAMPLES / sample / "repo").rglob("*.py"))
        if path.relative_to(SAMPLES / sample / "repo").as_posix() != gold_path
    )
    wrong_answers = {
        "other file": f"{other_file}:1",
        "right file, wrong line": f"{gold_path}:1",
        "right file plus a guess": f"{task['gold_answer']} or {other_file}",
        "prose without a path": "It is in the money module.",
    }
    for label, answer in wrong_answers.items():
        workspace = make_workspace(sample, tmp_path / label.replace(" ", "_"), apply_gold=False, submission=answer)
        result = run_command(task["test_command"], workspace, task["timeout_s"])
        assert result.returncode != 0, f"{sample}: checker accepts {label}: {answer!r}"
