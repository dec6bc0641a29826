"""The episode loop: exit statuses, parallel calls, grading, stepping (the policies themselves: test_policies.py)."""

import re
import time
from pathlib import Path

import pytest

from data.oracle import OraclePolicy
from env.episode import EpisodeConfig, ExitStatus, Generation, run_episode
from env.policies import GoldPolicy, get_policy
from env.protocol import format_assistant_turn
from env.workspace import remove_workspace


class Scripted:
    """Writes the given raw turns, then nothing."""

    name = "scripted"

    def __init__(self, *turns):
        self.turns = list(turns)

    def reset(self, task):
        self.queue = list(self.turns)

    def act(self, messages, tools):
        return self.queue.pop(0) if self.queue else ""


def untimed(text):
    return re.sub(r"in \d+\.\d+s", "in Xs", text)


OUTCOME = ("id", "solved", "exit_status", "error", "n_turns", "tool_calls", "malformed_calls", "parallel_turns",
           "completion_tokens")


def outcome(traj):
    """What an episode came to, from its record, without timings."""
    record = traj.to_record()
    return {k: record[k] for k in OUTCOME}


def call(name, **args):
    return format_assistant_turn(None, [(name, args)])


def test_gold_solves_noop_does_not(calc_task):
    gold = run_episode(calc_task, get_policy("gold"))
    noop = run_episode(calc_task, get_policy("noop"))
    assert gold.solved and gold.exit_status == "submitted"
    assert not noop.solved and noop.exit_status == "submitted" and noop.grade["failed"] == 1


def test_exit_statuses(calc_task):
    bad = "<tool_call>\n{oops}\n</tool_call>"
    cases = [
        (Scripted(call("run_tests")) , EpisodeConfig(max_turns=1), "max_turns"),
        (Scripted(bad, bad, bad), EpisodeConfig(max_malformed_turns=3), "repeated_malformed"),
        (Scripted("I think it is fine."), EpisodeConfig(), "no_tool_call"),
        (Scripted(*[call("run", command="sleep 0.3")] * 5), EpisodeConfig(max_wall_s=0.5), "timeout"),
    ]
    for policy, config, expected in cases:
        traj = run_episode(calc_task, policy, config)
        assert traj.exit_status == expected, (expected, outcome(traj))
    traj = run_episode(calc_task, Scripted(bad, bad, bad))
    assert traj.malformed_calls == 3 and all(m["content"].startswith("Malformed tool call: invalid JSON")
                                             for m in traj.messages if m["role"] == "tool")


def test_max_tokens_and_policy_error(calc_task):
    class Tokens(Scripted):
        def act(self, messages, tools):
            return Generation(call("run_tests"), completion_ids=list(range(60)))

    assert run_episode(calc_task, Tokens(), EpisodeConfig(max_tokens=100)).exit_status == "max_tokens"

    class Broken(Scripted):
        def act(self, messages, tools):
            raise RuntimeError("checkpoint is corrupt")

    traj = run_episode(calc_task, Broken())
    assert traj.exit_status == ExitStatus.POLICY_ERROR.value and "checkpoint is corrupt" in traj.error


def test_parallel_calls_run_concurrently_and_answer_in_order(calc_task):
    turn = format_assistant_turn(None, [("run", {"command": "sleep 1; echo first"}),
                                        ("run", {"command": "sleep 1; echo second"}),
                                        ("grep", {"pattern": "def mul"})])
    t0 = time.perf_counter()
    traj = run_episode(calc_task, Scripted(turn, call("submit", summary="x")))
    first_turn_s = traj.turns[0]["env_s"]
    assert first_turn_s < 1.8, f"parallel calls took {first_turn_s:.2f}s"
    tool_msgs = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tool_msgs[0].startswith("first") and tool_msgs[1].startswith("second") and "def mul" in tool_msgs[2]
    assert traj.parallel_turns == 1 and time.perf_counter() - t0 < 10


def test_hidden_tests_overwrite_agent_edits(calc_task):
    """Editing the visible tests to pass does not pay: hidden/ is laid over them before grading."""
    cheat = call("edit_file", path="tests/test_ops.py", old_str="assert add(2, 3) == 5", new_str="assert True")
    traj = run_episode(calc_task, Scripted(cheat, call("run_tests"), call("submit", summary="done")))
    assert "2 passed" in traj.messages[-3]["content"]  # the agent's own run looks green
    assert not traj.solved


def test_parallel_edits_of_one_file_do_not_race(calc_task):
    edits = [("edit_file", {"path": "calc/ops.py", "old_str": f"    return a {op} b\n", "new_str": f"    return {op!r}\n"})
             for op in ("-", "*")]
    traj = run_episode(calc_task, Scripted(format_assistant_turn(None, edits), call("submit", summary="x")),
                       EpisodeConfig(keep_workspace=True))
    text = (Path(traj.workspace) / "calc/ops.py").read_text()
    assert "return '-'" in text and "return '*'" in text
    remove_workspace(Path(traj.workspace))


def test_compaction_hook_rewrites_the_context_before_each_turn(calc_task):
    """Self-summarisation hook (off by default): the policy sees what the compactor returns."""
    seen = []

    class Recording(Scripted):
        def act(self, messages, tools):
            seen.append([m["role"] for m in messages])
            return super().act(messages, tools)

    def keep_prompt_only(messages):
        return messages[:2] + [{"role": "user", "content": "Summary: tests were run."}] if len(messages) > 2 else messages

    traj = run_episode(calc_task, Recording(call("run_tests"), call("submit", summary="x")),
                       EpisodeConfig(compactor=keep_prompt_only))
    assert seen == [["system", "user"], ["system", "user", "user"]]
    assert traj.exit_status == "submitted" and EpisodeConfig().compactor is None


# --------------------------------------------------------------------------- the steppable Episode


def test_episode_steps_like_run_episode(calc_task):
    """Driving Episode by hand gives what run_episode gives; requests carry the key and the turn index."""
    from env.episode import Episode

    whole = run_episode(calc_task, OraclePolicy(seed=2), episode_key="calc#2")
    policy = OraclePolicy(seed=2)
    episode = Episode(calc_task, EpisodeConfig(), "oracle", "calc#2").start()
    assert episode.reset_policy(policy)
    turns = []
    while (request := episode.request()) is not None:
        assert request is episode.request()  # asking twice does not advance the episode
        turns.append((request.episode_key, request.turn))
        episode.step(policy.act(request.messages, request.tools))
    stepped = episode.finish()
    assert turns == [("calc#2", i) for i in range(len(whole.turns))]
    assert [untimed(m["content"]) for m in stepped.messages] == [untimed(m["content"]) for m in whole.messages]
    assert outcome(stepped) == outcome(whole)
    assert stepped.episode_key == "calc#2" and not Path(stepped.workspace).exists()


def test_policy_reset_failure_is_a_policy_error_not_a_crash(calc_task):
    (calc_task.root / "gold.patch").write_text("--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1 +1 @@\n-nope\n+x\n")
    traj = run_episode(calc_task, GoldPolicy())
    assert traj.exit_status == "policy_error" and "patch does not apply" in traj.error and not traj.turns
    assert not traj.solved and not Path(traj.workspace).exists()


def test_exceptions_from_act_batch_end_the_episode_with_their_exit_status(calc_task):
    from env.episode import Episode

    class Overflow(RuntimeError):
        exit_status = "max_context"

    episode = Episode(calc_task, EpisodeConfig()).start()
    episode.request()
    episode.step(Overflow("prompt too long"))
    assert episode.request() is None
    traj = episode.finish()
    assert traj.exit_status == "max_context" and traj.error == "Overflow: prompt too long"


def test_workspace_is_removed_when_the_harness_fails_mid_episode(calc_task, monkeypatch):
    import env.episode

    made = []
    real = env.episode.make_workspace
    monkeypatch.setattr(env.episode, "make_workspace", lambda src: made.append(real(src)) or made[-1])

    def on_turn(record):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run_episode(calc_task, Scripted(call("run_tests")), EpisodeConfig(on_turn=on_turn))
    assert len(made) == 1 and not made[0].exists()


def test_wall_budget_caps_commands_and_is_checked_before_each_turn(calc_task):
    from env.episode import Episode

    episode = Episode(calc_task, EpisodeConfig(max_wall_s=5)).start()
    assert 0 < episode.tools.deadline - time.monotonic() <= 5
    episode.close()
    episode.close()  # idempotent


def test_budgets_are_validated_with_the_key_named():
    from env.budget import Budget, BudgetError

    for bad, key in [({"max_turns": 0}, "max_turns=0"), ({"max_wall_s": -1}, "max_wall_s=-1"),
                     ({"max_output_chars": 1}, "max_output_chars=1"), ({"top_p": 0}, "top_p=0"),
                     ({"max_context": 64, "max_new_tokens": 64}, "max_context=64")]:
        with pytest.raises(BudgetError, match=key):
            Budget(**bad)
    with pytest.raises(BudgetError, match="EpisodeConfig: max_turns=-1: must be an integer >= 1"):
        EpisodeConfig(max_turns=-1)
    assert EpisodeConfig.from_budget(Budget(max_turns=4)).max_turns == 4
    assert EpisodeConfig().max_turns == Budget().max_turns
