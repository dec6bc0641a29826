"""RL rewards: a registry of components, each a TRL reward function over the episode facts.

    reward_funcs: [outcome, malformed, turns, parallel, length, latency, lint, failed_actions]
    reward_weights: [1.0, 0.2, 0.05, 0.05, 0.05, 0.02, 0.1, 0.1]          # in the recipe, next to the names

Each component has TRL's signature `f(completions, **kwargs) -> list[float | None]` and reads the rollout
extra `episode` (one `episode_facts` dict per completion, computed by the rollout from the episode's record,
`Trajectory.to_record`), never the completion text: the outcome is the grade `run_episode` computed with
`env.grading.grade`, the checker eval.py uses, so the reward cannot drift from eval.
TRL logs every component's mean and std per step (`rewards/<name>/mean|std`), never only the sum.

Shaping (the original recipe also rewards efficiency: fewer turns, shorter and faster episodes, parallel
tool calls) is small next to the outcome: `turns`, `length` and `latency` are costs in
[-1, 0] (share of the episode budget spent), `parallel` is a credit in [0, 1] (share of tool-calling turns
that issue two or more independent read-only calls together: env.metrics' parallel-read rate).

The original recipe reports two reward hacks, and their fixes; each has a switch, to reproduce it for the
ablations:
- malformed calls dropped, `malformed_handling`: "penalize" (the fix: each malformed call is an explicit negative) or "drop"
  (the broken variant: an episode with a malformed call leaves training; every component returns None for
  it, which TRL turns into a NaN reward, excludes from the group baseline and gives advantage 0, and the
  rollout zeroes its loss mask).
- free questions, `ask_user_handling`: "penalize" (the fix: `failed_actions` counts questions like failed edits, and
  in the real-time loop `needless_question` charges a question the user did not need what a reverted edit costs)
  or "free" (the broken variant: only failed edits cost, so asking instead of editing is free; both return 0).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from env.metrics import independent_reads, is_parallel_turn, ran_tests_before_submit, runs_tests

TEST_FILE = re.compile(r"(^|/)(tests?/|test_[^/]*\.py$|[^/]*_test\.py$|conftest\.py$)")
TOKEN_LIMIT_EXITS = {"max_tokens", "max_context"}  # the episode was cut by a token limit, not ended by the model
MALFORMED_CAP = 5  # one turn can hold many broken blocks; the cost of one episode stays bounded
MALFORMED_HANDLING = ("penalize", "drop")
ASK_USER_HANDLING = ("penalize", "free")

RewardFunc = Callable[..., list[float | None]]


# --------------------------------------------------------------------------- facts


def episode_facts(episode, *, max_turns: int, token_budget: int, max_wall_s: float,
                  lint_new_errors: int | None = None) -> dict:
    """What the rewards and monitors read about one episode (a JSON-safe dict).

    `episode` is the episode record (`Trajectory.to_record`, what the runner returns) or a Trajectory (read
    through its record). Counts the record already holds (turns, malformed calls, completion tokens) are
    taken from it, and per-turn rates use env.metrics' definitions: `parallel_turns` are the turns
    `is_parallel_turn` counts (the `behaviour/parallel_call_rate` monitor), `parallel_read_turns` those with
    two or more distinct read-only calls (`independent_reads`, what the `parallel` reward pays for).
    `token_budget` normalises `length` (completion tokens the episode could have spent); `lint_new_errors` is
    the ruff error count of the final workspace minus that of the starting repo (None: not measured).
    """
    record = episode if isinstance(episode, dict) else episode.to_record()
    turns = record["turns"]
    valid = [c for turn in turns for c in turn["calls"] if not c["malformed"]]
    calling_turns = [turn["calls"] for turn in turns if turn["calls"]]
    edits = [c for c in valid if c["name"] == "edit_file"]
    submitted = any(c["name"] == "submit" for c in valid)
    return {
        "task_id": record["id"],
        "exit_status": record["exit_status"],
        "solved": bool(record["solved"]),
        "pass_fraction": float((record.get("grade") or {}).get("pass_fraction", float(bool(record["solved"])))),
        "turns": record["n_turns"],
        "max_turns": max_turns,
        "completion_tokens": record["completion_tokens"] or 0,
        "token_budget": token_budget,
        "wall_s": float(record["wall_s"]),
        "max_wall_s": max_wall_s,
        "calls": record["tool_calls"],
        "malformed_calls": record["malformed_calls"],
        "calling_turns": len(calling_turns),
        "parallel_turns": sum(is_parallel_turn(calls) for calls in calling_turns),
        "parallel_read_turns": sum(independent_reads(calls) >= 2 for calls in calling_turns),
        "edits": len(edits),
        "failed_edits": sum(c["error"] is not None for c in edits),
        "ask_user_calls": sum(c["name"] == "ask_user" for c in valid),
        "test_files_touched": len({c["arguments"].get("path") for c in edits
                                   if TEST_FILE.search(str(c["arguments"].get("path", "")))}),
        "ran_tests": any(runs_tests(c) for c in valid),
        "submitted": submitted,
        "submit_without_test_run": ran_tests_before_submit([turn["calls"] for turn in turns]) is False,
        "truncated": any(turn["truncated"] for turn in turns) or record["exit_status"] in TOKEN_LIMIT_EXITS,
        "lint_new_errors": lint_new_errors,
        "dropped": False,  # set by the rollout under malformed_handling="drop"
    }


def _facts(kwargs: dict, name: str) -> list[dict]:
    if "episode" not in kwargs:
        raise KeyError(f"reward {name!r} reads the rollout extra 'episode' (one episode_facts dict per completion), "
                       f"which is missing: is the trainer using nanocomposer.rollout's rollout_func?")
    return kwargs["episode"]


# --------------------------------------------------------------------------- components


def outcome(completions, **kwargs) -> list[float]:
    """1 when the hidden tests pass (env.grading.grade, as in eval), else 0."""
    return [1.0 if e["solved"] else 0.0 for e in _facts(kwargs, "outcome")]


def outcome_submitted(completions, **kwargs) -> list[float]:
    """1 when the hidden tests pass and the model submitted, else 0: the outcome of a finished episode only.

    `outcome` grades the final workspace however the episode ended, so a fix the model never submitted earns
    as much as a submitted one; GRPO on SmolLM2 learned to run out of turns (docs/rl.md, section 4). `unfinished`
    charges a missing submit on every episode and overshot: an unsolved episode that submits at once beat one
    that kept trying. Here an unsubmitted episode scores what an unsolved one does, so submitting pays only
    with a fix."""
    return [1.0 if e["solved"] and e["submitted"] else 0.0 for e in _facts(kwargs, "outcome_submitted")]


def outcome_partial(completions, **kwargs) -> list[float]:
    """Share of passing hidden tests (1 when solved): partial credit."""
    return [float(e["pass_fraction"]) for e in _facts(kwargs, "outcome_partial")]


def malformed(completions, **kwargs) -> list[float]:
    """-1 per malformed tool call (at most MALFORMED_CAP): the explicit negative that fixes
    malformed calls being dropped from the loss."""
    return [-float(min(e["malformed_calls"], MALFORMED_CAP)) for e in _facts(kwargs, "malformed")]


def turns(completions, **kwargs) -> list[float]:
    """Minus the share of the turn budget used."""
    return [-e["turns"] / max(e["max_turns"], 1) for e in _facts(kwargs, "turns")]


def parallel(completions, **kwargs) -> list[float]:
    """Share of tool-calling turns that issue two or more distinct read-only calls together."""
    return [e["parallel_read_turns"] / e["calling_turns"] if e["calling_turns"] else 0.0
            for e in _facts(kwargs, "parallel")]


def length(completions, **kwargs) -> list[float]:
    """Minus the share of the completion-token budget used (the model's own tokens only)."""
    return [-min(e["completion_tokens"] / max(e["token_budget"], 1), 1.0) for e in _facts(kwargs, "length")]


def latency(completions, **kwargs) -> list[float]:
    """Minus the share of the wall-clock budget the episode took."""
    return [-min(e["wall_s"] / e["max_wall_s"], 1.0) if e["max_wall_s"] > 0 else 0.0
            for e in _facts(kwargs, "latency")]


def lint(completions, **kwargs) -> list[float | None]:
    """-1 when the final workspace has more ruff errors than the starting repo; None when not measured."""
    return [None if e["lint_new_errors"] is None else -1.0 if e["lint_new_errors"] > 0 else 0.0
            for e in _facts(kwargs, "lint")]


def truncated(completions, **kwargs) -> list[float]:
    """-1 for an episode cut by a token limit (a turn hit max_new_tokens, or max_tokens/max_context)."""
    return [-1.0 if e["truncated"] else 0.0 for e in _facts(kwargs, "truncated")]


def unfinished(completions, **kwargs) -> list[float]:
    """-1 when the model never called submit (it ran out of turns, time or tokens, or stopped calling tools).

    The grader scores the final workspace whether or not the model submitted, so without this an episode that
    works until the turn budget and is graded there costs only its `turns` share: GRPO on one task learned to
    stop submitting (14 of 16 episodes ran out of turns). Not in any recipe: at weight 0.5 it overshot, and the
    policy learned to submit at once, unedited (docs/rl.md, section 4)."""
    return [0.0 if e["submitted"] else -1.0 for e in _facts(kwargs, "unfinished")]


def make_failed_actions(penalize_questions: bool = True) -> RewardFunc:
    """Minus (failed edits [+ ask_user calls]) over the turn budget, floored at -1.

    With `penalize_questions=False` a question costs nothing while a failed edit does: Composer's free-questions hack,
    where the model learned to defer risky edits by asking clarifying questions.
    """

    def failed_actions(completions, **kwargs) -> list[float]:
        out = []
        for e in _facts(kwargs, "failed_actions"):
            count = e["failed_edits"] + (e["ask_user_calls"] if penalize_questions else 0)
            out.append(-min(count / max(e["max_turns"], 1), 1.0))
        return out

    failed_actions.__doc__ = make_failed_actions.__doc__
    return failed_actions


# --------------------------------------------------------------------------- live sessions (real-time RL)
# Components of the agent server's sessions (nanocomposer/realtime): the facts also hold `live`, what the user
# did with the session by the cycle's cut-off: {"kept", "reverted", "dissatisfied", "needless_question"}
# (booleans; `dissatisfied`: a dissatisfied follow-up or the user gave up; `needless_question`: the user said a
# question was needless, env/users.py). Malformed calls, latency and ask_user (`failed_actions`, with
# the free-questions switch) are the components above, read from the same facts.


def _live(kwargs: dict, name: str) -> list[dict]:
    facts = _facts(kwargs, name)
    if any("live" not in e for e in facts):
        raise KeyError(f"reward {name!r} reads the user's feedback (facts['live']), which only agent-server "
                       "sessions have (nanocomposer/realtime); it cannot score offline rollouts")
    return [e["live"] for e in facts]


def edit_kept(completions, **kwargs) -> list[float]:
    """1 when the user kept the session's edit (Composer's "edits that persist"), else 0."""
    return [1.0 if live["kept"] else 0.0 for live in _live(kwargs, "edit_kept")]


def edit_reverted(completions, **kwargs) -> list[float]:
    """-1 when the user applied the session's edit and reverted it."""
    return [-1.0 if live["reverted"] else 0.0 for live in _live(kwargs, "edit_reverted")]


def dissatisfied(completions, **kwargs) -> list[float]:
    """-1 when the user sent a dissatisfied follow-up or gave up waiting."""
    return [-1.0 if live["dissatisfied"] else 0.0 for live in _live(kwargs, "dissatisfied")]


def needless_question(completions, **kwargs) -> list[float]:
    """-1 when the user said the session's question was needless: the request already said everything.

    The rebalance of the free-questions hack: `failed_actions` charges a question 1/max_turns of its weight
    whether or not it was needed, so a question stays cheaper than a risky edit (`edit_reverted`). At the weight
    of `edit_reverted`, a needless question costs what a reverted edit costs, and a needed one nothing."""
    return [-1.0 if live.get("needless_question") else 0.0 for live in _live(kwargs, "needless_question")]


REWARDS: dict[str, RewardFunc] = {
    "outcome": outcome,
    "outcome_submitted": outcome_submitted,
    "outcome_partial": outcome_partial,
    "malformed": malformed,
    "turns": turns,
    "parallel": parallel,
    "length": length,
    "latency": latency,
    "lint": lint,
    "failed_actions": make_failed_actions(penalize_questions=True),
    "truncated": truncated,
    "unfinished": unfinished,
    "edit_kept": edit_kept,
    "edit_reverted": edit_reverted,
    "dissatisfied": dissatisfied,
    "needless_question": needless_question,
}


def drop_marked(func: RewardFunc) -> RewardFunc:
    """`func`, returning None for episodes marked `dropped` (malformed_handling="drop")."""

    @functools.wraps(func)
    def wrapped(completions, **kwargs):
        values = func(completions, **kwargs)
        return [None if e["dropped"] else v for e, v in zip(_facts(kwargs, func.__name__), values, strict=True)]

    return wrapped


def _free_questions(func: RewardFunc) -> RewardFunc:
    """`func` with every question free: 0 for every session (the free-questions switch)."""

    @functools.wraps(func)
    def wrapped(completions, **kwargs):
        return [0.0 if v is not None else None for v in func(completions, **kwargs)]

    return wrapped


def get_reward_funcs(names: list[str], *, malformed_handling: str = "penalize",
                     ask_user_handling: str = "penalize") -> list[RewardFunc]:
    """The reward functions named in a recipe, with the hack switches applied (see the module docstring)."""
    if malformed_handling not in MALFORMED_HANDLING:
        raise ValueError(f"malformed_handling={malformed_handling!r}: expected one of {MALFORMED_HANDLING}")
    if ask_user_handling not in ASK_USER_HANDLING:
        raise ValueError(f"ask_user_handling={ask_user_handling!r}: expected one of {ASK_USER_HANDLING}")
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise ValueError(f"unknown reward functions {unknown}; the registry (env/rewards.py) has {sorted(REWARDS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"reward_funcs {names}: a component is listed twice")
    funcs = []
    for name in names:
        func = REWARDS[name]
        if name == "failed_actions":
            func = make_failed_actions(penalize_questions=ask_user_handling == "penalize")
        elif name == "needless_question" and ask_user_handling == "free":
            func = _free_questions(func)
        funcs.append(drop_marked(func) if malformed_handling == "drop" else func)
    return funcs
