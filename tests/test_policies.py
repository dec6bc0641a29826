"""env/policies.py: the scripted policies (gold, noop, replay), the registry's errors, and the gold patch turned
into edit_file calls. (nanocomposer/policies.py, which adds model checkpoints and endpoints to the registry, is
exercised by test_eval.py, test_oracle.py and test_model_policy.py.)"""

import json
import re

import pytest

from data.oracle import OraclePolicy
from env.episode import run_episode
from env.policies import GoldPolicy, ReplayPolicy, _edit_pairs, get_policy


def untimed(text):
    return re.sub(r"in \d+\.\d+s", "in Xs", text)


COMPARED = ("solved", "exit_status", "error", "n_turns", "tool_calls", "malformed_calls", "completion_tokens")


def test_replay_reproduces_a_recorded_trajectory(calc_task, tmp_path):
    recorded = run_episode(calc_task, OraclePolicy(seed=1))
    (tmp_path / "traj.json").write_text(json.dumps(recorded.to_record()))
    (tmp_path / "turns.json").write_text(json.dumps([t["text"] for t in recorded.turns]))
    for source in ("traj.json", "turns.json"):
        replayed = run_episode(calc_task, get_policy(f"replay:{tmp_path / source}"))
        assert [untimed(m["content"]) for m in replayed.messages] == \
            [untimed(m["content"]) for m in recorded.messages]
        assert {k: v for k, v in replayed.to_record().items() if k in COMPARED} == \
            {k: v for k, v in recorded.to_record().items() if k in COMPARED}
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="expected a JSON list"):
        ReplayPolicy(tmp_path / "x.json")


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown policy 'gpt-9'"):
        get_policy("gpt-9")


@pytest.mark.parametrize("old, new", [
    ("a\nb\nc\n", "a\nB\nc\n"),
    ("x = 1\nx = 1\ny = 2\n", "x = 1\nx = 2\ny = 2\n"),  # duplicate lines need context
    ("a\nb\nc\nd\ne\n", "A\nb\nc\nd\nE\n"),
    ("a\nb\n", "a\nb\nc\n"),  # pure insertion
    ("a\na\na\n", "a\na\n"),
])
def test_edit_pairs_rebuild_the_new_text(old, new):
    text = old
    for o, n in _edit_pairs(old, new):
        assert text.count(o) == 1
        text = text.replace(o, n, 1)
    assert text == new


def test_gold_needs_a_patch(calc_task):
    (calc_task.root / "gold.patch").unlink()
    with pytest.raises(ValueError, match="needs a gold.patch"):
        GoldPolicy().reset(calc_task)
