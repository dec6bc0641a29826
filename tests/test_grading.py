"""env/grading.py: the one checker. It grades a copy of the workspace with hidden/ laid over it and the
submission written into it, leaves the agent's workspace as it was, counts pytest's summary for partial credit,
and turns a workspace it cannot copy into an unsolved grade with the reason. Grading hostile workspaces (FIFOs,
sockets, a planted submission link): tests/test_hostile_tasks.py."""

import shutil

from env.grading import SUBMISSION_FILE, Grade, grade, parse_test_counts
from env.tasks import load_task, write_task


def test_pytest_counts_and_partial_credit():
    assert parse_test_counts("===== 3 passed, 1 failed, 2 errors in 0.1s =====") == (3, 3)
    assert parse_test_counts("no summary here") == (None, None)
    assert Grade(False, 1, False, "", passed=3, failed=1).pass_fraction == 0.75
    assert Grade(True, 0, False, "").pass_fraction == 1.0  # solved without counts
    assert Grade(False, 1, False, "").pass_fraction == 0.0 and Grade(False, 1, False, "", 0, 0).pass_fraction == 0.0


def test_grade_runs_on_a_copy_with_hidden_files_and_the_submission(calc_task, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(calc_task.repo_dir, ws)
    unsolved = grade(calc_task, ws)
    assert not unsolved.solved and (unsolved.passed, unsolved.failed) == (1, 1) and unsolved.pass_fraction == 0.5
    (ws / "calc/ops.py").write_text((ws / "calc/ops.py").read_text().replace("a - b", "a + b"))
    (ws / "tests/test_ops.py").write_text("")  # the agent's copy of the tests does not count: hidden/ wins
    solved = grade(calc_task, ws)
    assert solved.solved and solved.returncode == 0 and solved.passed == 2 and solved.command_s > 0
    assert (ws / "tests/test_ops.py").read_text() == "" and not (ws / SUBMISSION_FILE).exists()  # untouched


def test_the_submission_is_written_for_answer_checkers(tmp_path):
    task = load_task(write_task(tmp_path / "t", id="t", instruction="Where?", repo={"a.txt": "a\n"},
                                test_command=f"grep -q 'a.txt' {SUBMISSION_FILE}", gold_answer="a.txt"))
    assert grade(task, task.repo_dir, "It is in a.txt.").solved
    assert not grade(task, task.repo_dir, "").solved


def test_a_workspace_that_cannot_be_copied_grades_unsolved_with_the_reason(calc_task, tmp_path):
    result = grade(calc_task, tmp_path / "missing")
    assert not result.solved and result.output.startswith("grading failed")
