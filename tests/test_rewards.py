"""env/rewards.py: the registry, each component on hand-built episodes, and the hack switches."""

from pathlib import Path

import pytest
import yaml

from env.episode import Trajectory
from env.rewards import REWARDS, episode_facts, get_reward_funcs

ROOT = Path(__file__).resolve().parents[1]
RL_RECIPES = sorted(ROOT.glob("recipes/*/rl*.yaml"))


def call(name, args, malformed=False, error=None):
    return {"name": name, "arguments": args, "malformed": malformed, "error": error}


def turn(*calls, truncated=False, tokens=10):
    return {"turn": 0, "text": "", "calls": list(calls), "completion_tokens": tokens, "truncated": truncated}


def facts(turns, exit_status="submitted", solved=False, pass_fraction=None, lint=None, wall_s=1.0, **budget):
    grade = {} if pass_fraction is None else {"pass_fraction": pass_fraction}
    traj = Trajectory("t", "p", [], [], turns, exit_status, solved=solved, grade=grade, wall_s=wall_s)
    return episode_facts(traj, max_turns=budget.get("max_turns", 10), token_budget=budget.get("token_budget", 100),
                         max_wall_s=budget.get("max_wall_s", 10.0), lint_new_errors=lint)


def rewards(name, *episodes, **switches):
    (func,) = get_reward_funcs([name], **switches)
    return func([[{"role": "assistant", "content": ""}]] * len(episodes), episode=list(episodes))


READ = call("read_file", {"path": "a.py"})
READ_B = call("read_file", {"path": "b.py"})
SUBMIT = call("submit", {"summary": "done"})


def test_every_registry_name_resolves_to_a_function_of_that_name():
    funcs = get_reward_funcs(list(REWARDS))
    assert [f.__name__ for f in funcs] == list(REWARDS)
    dropped = get_reward_funcs(list(REWARDS), malformed_handling="drop")
    assert [f.__name__ for f in dropped] == list(REWARDS)  # the drop wrapper keeps names (TRL logs by them)


@pytest.mark.parametrize("recipe", RL_RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_recipe_names_registered_rewards_with_one_weight_each(recipe):
    spec = yaml.safe_load(recipe.read_text())
    assert spec["reward_funcs"] and set(spec["reward_funcs"]) <= set(REWARDS)
    assert len(spec["reward_weights"]) == len(spec["reward_funcs"])
    weights = dict(zip(spec["reward_funcs"], spec["reward_weights"]))
    outcome = weights.get("outcome", weights.get("outcome_partial"))
    assert outcome and all(w < outcome for n, w in weights.items() if not n.startswith("outcome")), \
        "shaping terms stay small next to the outcome"


def test_unknown_or_repeated_names_and_bad_switches_fail_clearly():
    with pytest.raises(ValueError, match="unknown reward functions \\['outcom'\\]"):
        get_reward_funcs(["outcom"])
    with pytest.raises(ValueError, match="listed twice"):
        get_reward_funcs(["outcome", "outcome"])
    with pytest.raises(ValueError, match="malformed_handling"):
        get_reward_funcs(["outcome"], malformed_handling="ignore")
    with pytest.raises(KeyError, match="rollout extra 'episode'"):
        REWARDS["outcome"]([[]])


def test_outcome_reads_the_grade_and_partial_credit_is_the_pass_fraction():
    solved, half = facts([turn(SUBMIT)], solved=True), facts([turn(SUBMIT)], pass_fraction=0.5)
    assert rewards("outcome", solved, half) == [1.0, 0.0]
    assert rewards("outcome_partial", solved, half) == [1.0, 0.5]


def test_each_malformed_call_is_an_explicit_negative_up_to_a_cap():
    bad = call(None, None, malformed=True, error="invalid JSON")
    assert rewards("malformed", facts([turn(READ)]), facts([turn(bad, READ), turn(bad)]),
                   facts([turn(*[bad] * 9)])) == [0.0, -2.0, -5.0]


def test_malformed_dropped_switch_drops_malformed_episodes_from_every_component():
    clean, broken = facts([turn(SUBMIT)], solved=True), facts([turn(call(None, None, malformed=True))])
    broken["dropped"] = True  # the rollout marks it under malformed_handling="drop"
    for name in ("outcome", "malformed", "turns"):
        assert rewards(name, clean, broken, malformed_handling="drop")[1] is None
    assert rewards("malformed", clean, broken)[1] == -1.0


def test_efficiency_costs_are_shares_of_the_budget():
    short, long = facts([turn(SUBMIT)], wall_s=1.0), facts([turn(READ)] * 5, wall_s=20.0)
    assert rewards("turns", short, long) == [-0.1, -0.5]
    assert rewards("length", short, long) == [-0.1, -0.5]
    assert rewards("latency", short, long) == [-0.1, -1.0]  # capped at the whole budget


def test_parallel_credits_distinct_read_only_calls_issued_together():
    together = facts([turn(READ, READ_B), turn(SUBMIT)])
    duplicate = facts([turn(READ, READ), turn(SUBMIT)])  # the same read twice is not two independent calls
    edits = facts([turn(call("edit_file", {"path": "a.py", "old_str": "a", "new_str": "b"}), READ)])
    assert rewards("parallel", together, duplicate, edits, facts([])) == [0.5, 0.0, 0.0, 0.0]


def test_lint_penalises_new_errors_only_and_skips_unmeasured_episodes():
    assert rewards("lint", facts([], lint=2), facts([], lint=0), facts([], lint=-3), facts([])) == \
        [-1.0, 0.0, 0.0, None]


def test_free_questions_switch_makes_questions_free():
    failed_edit = call("edit_file", {"path": "a.py", "old_str": "x", "new_str": "y"}, error="old_str was not found")
    asking = facts([turn(call("ask_user", {"question": "which file?"}))] * 4)
    editing = facts([turn(failed_edit)] * 2)
    assert rewards("failed_actions", asking, editing) == [-0.4, -0.2]
    assert rewards("failed_actions", asking, editing, ask_user_handling="free") == [0.0, -0.2]


def test_truncation_marks_token_limits_not_turn_budgets():
    assert rewards("truncated", facts([turn(READ, truncated=True)]), facts([turn(READ)], exit_status="max_context"),
                   facts([turn(READ)], exit_status="max_turns")) == [-1.0, -1.0, 0.0]


def test_unfinished_costs_an_episode_the_model_never_submitted_even_when_the_grader_solves_it():
    malformed_submit = call("submit", {"summary": "s"}, malformed=True, error="bad arguments")
    episodes = [facts([turn(READ), turn(SUBMIT)], solved=True),
                facts([turn(READ)] * 10, exit_status="max_turns", solved=True),  # worked to the budget, graded
                facts([turn(malformed_submit)], exit_status="repeated_malformed"),
                facts([turn(READ, truncated=True)], exit_status="max_context")]
    assert rewards("unfinished", *episodes) == [0.0, -1.0, -1.0, -1.0]


def test_outcome_submitted_pays_only_a_fix_the_model_submitted():
    episodes = [facts([turn(READ), turn(SUBMIT)], solved=True),
                facts([turn(READ)] * 10, exit_status="max_turns", solved=True),  # fixed, never submitted
                facts([turn(SUBMIT)]),  # submitted unfixed
                facts([turn(READ)] * 10, exit_status="max_turns")]
    assert rewards("outcome_submitted", *episodes) == [1.0, 0.0, 0.0, 0.0]
    assert rewards("outcome", *episodes) == [1.0, 1.0, 0.0, 0.0]


def test_facts_track_the_behaviours_the_monitors_report():
    edit_test = call("edit_file", {"path": "tests/test_a.py", "old_str": "1", "new_str": "2"})
    f = facts([turn(READ), turn(edit_test), turn(SUBMIT)])
    assert f["test_files_touched"] == 1 and f["edits"] == 1 and f["submit_without_test_run"]
    g = facts([turn(call("run", {"command": "python -m pytest -q"})), turn(SUBMIT)])
    assert g["ran_tests"] and not g["submit_without_test_run"]


@pytest.mark.parametrize("turns, ran, without", [
    ([turn(call("run_tests", {})), turn(call("submit", {"summary": "s"}))], True, False),
    ([turn(call("run", {"command": "python -m pytest -q"}), call("submit", {"summary": "s"}))], True, False),
    ([turn(call("submit", {"summary": "s"})), turn(call("run_tests", {}))], True, True),
    ([turn(call("run_tests", {}, malformed=True)), turn(call("submit", {"summary": "s"}))], False, True),
    ([turn(call("read_file", {"path": "a.py"}))], False, False),  # never submitted: not "without a test run"
])
def test_test_runs_before_submit_follow_the_metrics_definition(turns, ran, without):
    f = facts(turns)
    assert (f["ran_tests"], f["submit_without_test_run"]) == (ran, without)
