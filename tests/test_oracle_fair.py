"""The oracle's SFT data is fair: every unmarked call is grounded in what the agent had seen at that turn,
and the reactive oracle still solves the tasks (noop still fails them). The checker itself catches the
old oracle's habits (names from the gold patch, line ranges nobody cited, claims of passing tests)."""

from pathlib import Path

import pytest

from data.build_tasks import build, parse_args
from data.grounding import grounding_report, trajectory_report
from env.episode import run_episode
from env.grading import grade
from env.policies import OraclePolicy
from env.tasks import load_task_set

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fair_tasks(tmp_path_factory):
    """One task per family from a repo-tier and two micro projects, plus the hand-made samples."""
    out = tmp_path_factory.mktemp("tasks")
    build(parse_args(["--out", str(out), "--projects", str(ROOT / "data" / "projects"), "--only",
                      "iniconf,micro_roman,micro_clamp", "--per-project", "1", "--seed", "3", "--workers", "2",
                      "--overwrite"]))
    return load_task_set(out) + load_task_set(ROOT / "data" / "samples")


@pytest.fixture(scope="module")
def oracle_runs(fair_tasks):
    """(task, trajectory, marked turns) per task; many near-miss edits (marked, so not counted)."""
    runs = []
    for i, task in enumerate(fair_tasks):
        policy = OraclePolicy(seed=i, recovery_rate=0.5)
        runs.append((task, run_episode(task, policy), policy.marked_turns))
    return runs


def test_oracle_solves_every_task_with_every_unmarked_call_grounded(oracle_runs):
    for task, traj, marked in oracle_runs:
        assert traj.solved and traj.exit_status == "submitted", (task.id, traj.grade.get("output", "")[-400:])
        report = trajectory_report(traj, marked)
        assert report.grounded_rate == 1.0, (task.id, [(c.turn, c.name, c.reason) for c in report.ungrounded])
        assert not report.wasted, (task.id, dict(report.wasted))  # no greps for nothing, no empty test runs
        assert not grade(task, task.repo_dir, "").solved, f"noop solves {task.id}"
    assert {"fix_bug", "fix_lint", "implement_function", "locate"} <= {t.meta.get("family") for t, _, _ in oracle_runs}
    assert any(marked for _, _, marked in oracle_runs)  # the recovery data is still there, and marked


def test_micro_tasks_run_their_tests(oracle_runs):
    micro = [(t, traj) for t, traj, _ in oracle_runs if t.meta.get("tier") == "micro"
             and t.meta.get("family") != "locate" and ROOT / "data" / "samples" not in t.root.parents]
    assert micro  # factory tasks (a hand-made sample may keep some tests hidden)
    for task, traj in micro:
        runs = [m["content"] for m in traj.messages if m["role"] == "tool" and "exit code" in m["content"]]
        assert runs and "no tests ran" not in runs[0] and "[exit code 1]" in runs[0], task.id  # it fails: informative


def _turns(*calls_and_results):
    """Messages and turn records for a scripted trajectory: ((name, arguments), result) per turn."""
    messages = [{"role": "system", "content": "sys"},
                {"role": "user", "content": "The test `tests/test_a.py::test_add` fails.\n\nFiles:\npkg/a.py\n"
                                            "pkg/b.py\ntests/test_a.py\n"}]
    turns = []
    for (name, arguments), result in calls_and_results:
        messages.append({"role": "assistant", "content": "..."})
        messages.append({"role": "tool", "name": name, "content": result})
        turns.append({"calls": [{"name": name, "arguments": arguments, "malformed": False}]})
    return messages, turns


FAILING = ("tests/test_a.py:4: in test_add\n    assert add(2, 3) == 5\npkg/a.py:7: in add\nE  assert -1 == 5\n"
           "[exit code 1]")
READ = "   6| def add(a, b):\n   7|     return a - b\n   8| "


def test_checker_accepts_a_grounded_fix():
    report = grounding_report(*_turns(
        (("run_tests", {}), FAILING),
        (("grep", {"pattern": r"def add\b"}), "pkg/a.py:6:def add(a, b):"),
        (("read_file", {"path": "pkg/a.py", "start_line": 3, "end_line": 12}), READ),
        (("edit_file", {"path": "pkg/a.py", "old_str": "    return a - b\n", "new_str": "    return a + b\n"}),
         "Edited pkg/a.py at line 7: replaced 1 line(s) with 1."),
        (("run_tests", {}), "1 passed\n[exit code 0]"),
        (("submit", {"summary": "Fixed add in pkg/a.py; the tests pass."}), "Submitted."),
    ))
    assert report.grounded_rate == 1.0, [(c.name, c.reason) for c in report.ungrounded]


@pytest.mark.parametrize("bad_call, why", [
    (("grep", {"pattern": r"(def|class) subtract\b"}), "not in the context"),  # a name only the patch knows
    (("read_file", {"path": "pkg/b.py", "start_line": 40, "end_line": 60}), "no line number"),
    (("read_file", {"path": "pkg/c.py"}), "not in the context"),
    (("edit_file", {"path": "pkg/a.py", "old_str": "    return a - b\n", "new_str": "x"}), "read_file"),
    (("submit", {"summary": "Fixed add in pkg/a.py; the tests pass."}), "tests pass"),
    (("submit", {"summary": "pkg/b.py"}), "not in the context"),  # the file list proves no answer
    (("search", {"query": "subtract numbers"}), "not in the context"),
])
def test_checker_flags_what_the_context_does_not_support(bad_call, why):
    report = grounding_report(*_turns((("run_tests", {}), FAILING), (bad_call, "whatever")))
    assert [c.grounded for c in report.calls] == [True, False] and why in report.calls[1].reason
    marked = grounding_report(*_turns((("run_tests", {}), FAILING), (bad_call, "whatever")), marked_turns={1})
    assert marked.grounded_rate == 1.0 and marked.summary()["marked"] == 1


def test_checker_counts_wasted_calls():
    report = grounding_report(*_turns((("grep", {"pattern": "test_add"}), "No matches for 'test_add' in ."),
                                      (("run_tests", {}), "no tests ran in 0.01s\n[exit code 5]")))
    assert dict(report.wasted) == {"grep without matches": 1, "test run that ran no tests": 1}
