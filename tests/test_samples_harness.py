"""Every hand-made sample task, through the real harness: gold and oracle solve it, noop does not."""

from pathlib import Path

import pytest

from env.episode import run_episode
from env.tasks import load_task_set
from nanocomposer.policies import scripted_policy

SAMPLES = load_task_set(Path(__file__).resolve().parents[1] / "data" / "samples")


@pytest.mark.parametrize("task", SAMPLES, ids=lambda t: t.id)
def test_gold_and_oracle_solve_noop_does_not(task):
    for policy, should_solve in (("gold", True), ("oracle", True), ("noop", False)):
        traj = run_episode(task, scripted_policy(policy))
        assert traj.exit_status == "submitted", (policy, traj.exit_status, traj.error, len(traj.turns))
        assert traj.solved is should_solve, (policy, traj.grade.get("output", "")[-800:])
        assert traj.malformed_calls == 0
