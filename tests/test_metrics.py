"""env/metrics.py: the statistics against known values, and the episode metrics' definitions."""

import math
import random

import pytest

from env.episode import run_episode
from env.metrics import (
    compare_paired,
    paired_bootstrap_interval,
    paired_normal_interval,
    pass_at_k,
    pass_at_k_by_task,
    ran_tests_before_submit,
    summarize,
    tool_call_validity,
    turn_categories,
    wilson_interval,
)
from env.policies import get_policy


def call(name, malformed=False, **arguments):
    return {"name": name, "malformed": malformed, "arguments": arguments}


def record(task_id, solved, turn_calls, tokens=None, wall_s=1.0, exit_status="submitted"):
    return {"id": task_id, "solved": solved, "exit_status": exit_status, "turns": len(turn_calls),
            "turn_calls": turn_calls, "completion_tokens": tokens, "wall_s": wall_s}


@pytest.mark.parametrize("successes, n, expected", [
    (5, 10, (0.2366, 0.7634)),  # the textbook value
    (0, 10, (0.0, 0.2775)),
    (10, 10, (0.7225, 1.0)),
    (1, 20, (0.0089, 0.2361)),
])
def test_wilson_interval_known_values(successes, n, expected):
    lo, hi = wilson_interval(successes, n)
    assert (round(lo, 4), round(hi, 4)) == expected


def test_wilson_interval_rejects_impossible_counts():
    with pytest.raises(ValueError, match="not in"):
        wilson_interval(11, 10)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),          # pass@1 is the plain success rate
    (5, 2, 2, 0.7),          # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (4, 1, 3, 0.75),         # 1 - C(3,3)/C(4,3) = 1 - 1/4
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (6, 0, 3, 0.0),
    (6, 4, 3, 1.0),          # n - c < k: every k-subset holds a solved sample
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_binomial_form_and_rejects_bad_arguments():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    for bad in [(3, 4, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError, match="pass_at_k needs"):
            pass_at_k(*bad)


def test_paired_normal_interval_hand_computed():
    # differences 1, 0, 1, 1: mean 0.75, sample sd 0.5, se 0.25
    mean, lo, hi = paired_normal_interval([0, 0, 0, 0], [1, 0, 1, 1])
    assert mean == 0.75
    assert (lo, hi) == pytest.approx((0.75 - 1.959964 * 0.25, 0.75 + 1.959964 * 0.25), abs=1e-5)


def test_paired_bootstrap_interval():
    assert paired_bootstrap_interval([1, 0, 1], [1, 0, 1]) == (0.0, 0.0, 0.0)
    assert paired_bootstrap_interval([0, 0, 0], [1, 1, 1]) == (1.0, 1.0, 1.0)
    rng = random.Random(1)
    a = [float(rng.random() < 0.4) for _ in range(300)]
    b = [float(x or rng.random() < 0.25) for x in a]  # b solves what a solves and some more
    boot = paired_bootstrap_interval(a, b, seed=3)
    assert boot == paired_bootstrap_interval(a, b, seed=3)  # seeded
    normal = paired_normal_interval(a, b)
    assert boot[0] == pytest.approx(normal[0])
    assert boot[1] == pytest.approx(normal[1], abs=0.015) and boot[2] == pytest.approx(normal[2], abs=0.015)
    assert boot[1] > 0  # a real improvement is detected
    with pytest.raises(ValueError, match="3 scores for one policy and 2"):
        paired_bootstrap_interval([0, 1, 1], [1, 1])


def test_tool_call_validity_counts_turns_without_calls_as_invalid():
    turns = [[call("read_file"), call("grep")], [call("edit_file"), call("x", malformed=True)], [], [call("submit")]]
    assert tool_call_validity(turns) == 0.5
    assert tool_call_validity([]) == 0.0


def test_turn_categories_are_fractional():
    assert turn_categories([call("search"), call("grep"), call("read_file")]) == pytest.approx(
        {"search": 2 / 3, "read": 1 / 3})
    assert turn_categories([call("run_tests"), call("bogus", malformed=True)]) == {"test": 1.0}
    assert turn_categories([call("bogus", malformed=True)]) == {"invalid": 1.0}
    assert turn_categories([call("new_tool")]) == {"other": 1.0}


def test_summarize_records():
    episodes = [
        record("a", True, [[call("grep"), call("read_file")], [call("edit_file")], [call("submit")]], tokens=30),
        record("b", False, [[call("ask_user")], [call("oops", malformed=True)], []], tokens=10,
               exit_status="no_tool_call", wall_s=3.0),
    ]
    s = summarize(episodes, wall_s=2.5)
    assert (s["n"], s["n_tasks"], s["solved"], s["solve_rate"]) == (2, 2, 1, 0.5)
    assert s["pass@1"] == 0.5 and "pass@2" not in s
    assert s["solve_rate_ci95"] == [round(x, 4) for x in wilson_interval(1, 2)]
    assert s["mean_turns"] == 3.0 and s["tool_calls"] == 6 and s["malformed_calls"] == 1
    assert s["tool_call_validity"] == pytest.approx(4 / 6)
    assert s["parallel_call_rate"] == pytest.approx(1 / 5)  # 5 turns with calls, one with two valid calls
    assert s["ask_user_rate"] == 0.5 and s["mean_completion_tokens"] == 20
    assert s["exit_statuses"] == {"no_tool_call": 1, "submitted": 1}
    assert s["tool_mix"] == {"ask_user": 1, "edit_file": 1, "grep": 1, "read_file": 1, "submit": 1}
    assert sum(s["turn_share"].values()) == pytest.approx(1.0, abs=1e-3)
    assert s["turn_share"]["invalid"] == pytest.approx(2 / 6, abs=1e-4)
    assert s["episode_wall_s"] == {"mean": 2.0, "p50": 3.0, "max": 3.0} and s["wall_s"] == 2.5
    assert summarize([record("a", True, [[call("submit")]])])["mean_completion_tokens"] is None
    assert s["mean_turns_solved"] == 3.0  # only "a" solved, in 3 turns
    assert s["tested_before_submit_rate"] == 0.0  # "a" submitted untested; "b" never submitted


@pytest.mark.parametrize("turn_calls, expected", [
    ([[call("run_tests")], [call("submit")]], True),
    ([[call("run_tests"), call("submit")]], True),              # earlier in the same turn counts
    ([[call("submit"), call("run_tests")]], False),             # after the submit does not
    ([[call("run_tests", malformed=True)], [call("submit")]], False),
    ([[call("run", command="pytest -q")], [call("submit")]], True),
    ([[call("run", command="python -m unittest")], [call("submit")]], True),
    ([[call("run", command="ls")], [call("lint")], [call("submit")]], False),
    ([[call("submit", malformed=True)], [call("run_tests")]], None),  # no valid submit: not counted
    ([], None),
])
def test_ran_tests_before_submit(turn_calls, expected):
    assert ran_tests_before_submit(turn_calls) is expected


def test_behaviour_figures_over_solved_and_submitted_episodes():
    episodes = [
        record("a", True, [[call("run_tests")], [call("edit_file")], [call("submit")]]),
        record("b", True, [[call("submit")]]),
        record("c", False, [[call("run_tests"), call("submit")]]),
        record("d", False, [[call("read_file")]], exit_status="max_turns"),
    ]
    s = summarize(episodes)
    assert s["mean_turns_solved"] == 2.0                         # (3 + 1) / 2
    assert s["tested_before_submit_rate"] == pytest.approx(2 / 3)  # a and c of the three that submitted
    nothing = summarize([record("d", False, [[call("read_file")]], exit_status="max_turns")])
    assert nothing["mean_turns_solved"] is None and nothing["tested_before_submit_rate"] is None


def test_pass_at_k_with_samples_and_the_interval_is_per_task():
    episodes = [record("a", x, [[call("submit")]]) for x in (True, False, False)] + \
               [record("b", x, [[call("submit")]]) for x in (True, True, True)]
    assert pass_at_k_by_task(episodes) == pytest.approx({"pass@1": (1 / 3 + 1) / 2, "pass@2": (2 / 3 + 1) / 2,
                                                         "pass@3": 1.0})
    s = summarize(episodes)
    assert s["solve_rate"] == pytest.approx(s["pass@1"])
    assert s["solve_rate_ci95"] == [round(x, 4) for x in wilson_interval(s["pass@1"] * 2, 2)]


def test_compare_paired_uses_common_tasks():
    base = [record(t, False, []) for t in "abcd"]
    other = [record(t, t in "ab", []) for t in "abce"]
    d = compare_paired(base, other, resamples=500)
    assert d["n_tasks"] == 3 and d["only_in_one"] == 2
    assert d["diff"] == pytest.approx(2 / 3, abs=1e-4) and d["ci95"][0] <= d["diff"] <= d["ci95"][1]


def test_compare_paired_reports_malformed_calls_per_episode_over_tasks():
    broken, ok = call("read_file", malformed=True), call("read_file")
    # task a: 0 -> 2 malformed calls; task b: samples with 1 and 3 -> 0 and 0 (per-task mean 2 -> 0); c: 1 -> 1
    base = [record("a", False, [[ok]]), record("b", False, [[broken]]), record("b", False, [[broken, broken],
            [broken]]), record("c", False, [[broken]])]
    other = [record("a", False, [[broken], [broken, ok]]), record("b", True, [[ok]]), record("b", True, [[ok]]),
             record("c", False, [[broken]])]
    m = compare_paired(base, other, resamples=500)["malformed_per_episode"]
    assert m["diff"] == pytest.approx((2 - 2 + 0) / 3, abs=1e-4)
    assert m["ci95"][0] <= m["diff"] <= m["ci95"][1] and m["ci95"][0] < 0 < m["ci95"][1]
    worse = [record(t, False, [[broken, broken]]) for t in "abc"]
    m = compare_paired(base[:1] + base[3:] + [record("b", False, [])], worse, resamples=500)["malformed_per_episode"]
    assert m["diff"] == pytest.approx((2 + 2 + 1) / 3, abs=1e-4) and m["ci95"][0] > 0


def test_trajectories_and_their_records_summarize_alike(calc_task):
    from env.episode import Trajectory

    trajectories = [run_episode(calc_task, get_policy(p)) for p in ("gold", "noop")]
    records = [t.to_record(task_set="x", sample=0) for t in trajectories]
    assert summarize(trajectories, 1.0) == summarize(records, 1.0)
    back = [Trajectory.from_record(r) for r in records]
    assert summarize(back, 1.0) == summarize(trajectories, 1.0)
    assert [b.to_record(task_set="x", sample=0) for b in back] == records


def test_parallel_rates_are_defined_once():
    from env.metrics import independent_reads, is_parallel_turn

    reads = [{"name": "read_file", "arguments": {"path": "a"}, "malformed": False},
             {"name": "read_file", "arguments": {"path": "a"}, "malformed": False},
             {"name": "grep", "arguments": {"pattern": "x"}, "malformed": False}]
    assert independent_reads(reads) == 2 and independent_reads(reads[:2]) == 1 and is_parallel_turn(reads[:2])
    mixed = [{"name": "run", "arguments": {"command": "ls"}, "malformed": False}, call("x", malformed=True)]
    assert not is_parallel_turn(mixed) and independent_reads(mixed) == 0
    s = summarize([record("a", True, [reads, reads[:2], mixed, [call("submit")]])])
    assert s["parallel_call_rate"] == 0.5 and s["parallel_read_rate"] == 0.25
