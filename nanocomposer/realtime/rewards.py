"""Session rewards: the episode facts RL already uses (env/rewards.py `episode_facts`) plus what the user did.

    facts = session_facts(record, live, ...)            # one per session
    values = component_values(funcs, facts)            # {name: [value or None per session]}

The components are env/rewards.py's registry entries named in the recipe (`edit_kept`, `edit_reverted`,
`dissatisfied`, `latency`, `malformed`, `failed_actions`, ...), built by `get_reward_funcs` with the two hack
switches, so the trainer and the logs compute the same numbers. Each is logged on its own every cycle.
"""

from __future__ import annotations

import math

from env.rewards import episode_facts

LIVE_KEYS = ("kept", "reverted", "dissatisfied")


def session_facts(record: dict, live: dict, *, max_turns: int, token_budget: int, max_wall_s: float,
                  malformed_handling: str) -> dict:
    """episode_facts of the session's record (SessionStore.export_record) with the user's outcome as `live`."""
    facts = episode_facts(record, max_turns=max_turns, token_budget=token_budget, max_wall_s=max_wall_s)
    facts["live"] = {k: bool(live[k]) for k in LIVE_KEYS}
    facts["dropped"] = malformed_handling == "drop" and facts["malformed_calls"] > 0  # hack 1: leaves training
    return facts


def component_values(funcs: list, facts: list[dict]) -> dict[str, list[float | None]]:
    completions = [None] * len(facts)
    return {f.__name__: f(completions, episode=facts) for f in funcs}


def reward_summary(funcs: list, weights: list[float] | None, facts: list[dict]) -> dict[str, float]:
    """Mean of every component (over the sessions it scores) and of the weighted sum, for the cycle's log."""
    values = component_values(funcs, facts)
    weights = weights or [1.0] * len(funcs)
    out: dict[str, float] = {}
    for name, vals in values.items():
        scored = [v for v in vals if v is not None]
        out[f"rewards/{name}/mean"] = sum(scored) / len(scored) if scored else math.nan
    totals = []
    for i in range(len(facts)):
        row = [vals[i] for vals in values.values()]
        if all(v is None for v in row):
            continue  # dropped (hack 1): no reward at all
        totals.append(sum(w * v for w, v in zip(weights, row, strict=True) if v is not None))
    out["reward/mean"] = sum(totals) / len(totals) if totals else math.nan
    out["reward/scored_sessions"] = float(len(totals))
    return out
