"""Session rewards: the episode facts RL already uses (env/rewards.py `episode_facts`) plus what the user did.

    facts = session_facts(record, live, ...)            # one per session
    values = component_values(funcs, facts)            # {name: [value or None per session]}

The components are env/rewards.py's registry entries named in the recipe (`edit_kept`, `edit_reverted`,
`dissatisfied`, `latency`, `malformed`, `failed_actions`, ...), built by `get_reward_funcs` with the two hack
switches (malformed calls dropped, free questions), so the trainer and the logs compute the same numbers.
Each is logged on its own every cycle.
`reward_by_behaviour` splits the weighted reward by what the session did (asked a question, tried an edit,
neither): a reward that makes a question cheaper than an edit (free questions) shows there as `asked` out-scoring
`edited` before the behaviour rates move.
"""

from __future__ import annotations

import math

from env.rewards import episode_facts

LIVE_KEYS = ("kept", "reverted", "dissatisfied", "needless_question")


def session_facts(record: dict, live: dict, *, max_turns: int, token_budget: int, max_wall_s: float,
                  malformed_handling: str) -> dict:
    """episode_facts of the session's record (SessionStore.export_record) with the user's outcome as `live`."""
    facts = episode_facts(record, max_turns=max_turns, token_budget=token_budget, max_wall_s=max_wall_s)
    facts["live"] = {k: bool(live.get(k)) for k in LIVE_KEYS}
    facts["dropped"] = malformed_handling == "drop" and facts["malformed_calls"] > 0  # malformed calls dropped: leaves training
    return facts


def component_values(funcs: list, facts: list[dict]) -> dict[str, list[float | None]]:
    completions = [None] * len(facts)
    return {f.__name__: f(completions, episode=facts) for f in funcs}


BEHAVIOURS = ("asked", "edited", "neither")


def behaviour_of(facts: dict) -> str:
    """asked: at least one ask_user call; edited: an edit_file call (applied or failed) and no question."""
    return "asked" if facts["ask_user_calls"] else "edited" if facts["edits"] else "neither"


def session_totals(funcs: list, weights: list[float] | None, facts: list[dict]) -> list[float | None]:
    """The weighted reward of every session; None for one that no component scores (malformed calls dropped)."""
    values = component_values(funcs, facts)
    weights = weights or [1.0] * len(funcs)
    totals: list[float | None] = []
    for i in range(len(facts)):
        row = [vals[i] for vals in values.values()]
        totals.append(None if all(v is None for v in row)
                      else sum(w * v for w, v in zip(weights, row, strict=True) if v is not None))
    return totals


def reward_summary(funcs: list, weights: list[float] | None, facts: list[dict]) -> dict[str, float]:
    """Mean of every component (over the sessions it scores) and of the weighted sum, for the cycle's log."""
    out: dict[str, float] = {}
    for name, vals in component_values(funcs, facts).items():
        scored = [v for v in vals if v is not None]
        out[f"rewards/{name}/mean"] = sum(scored) / len(scored) if scored else math.nan
    totals = [t for t in session_totals(funcs, weights, facts) if t is not None]
    out["reward/mean"] = sum(totals) / len(totals) if totals else math.nan
    out["reward/scored_sessions"] = float(len(totals))
    return out


def reward_by_behaviour(funcs: list, weights: list[float] | None, facts: list[dict]) -> dict[str, float]:
    """`reward_by_behaviour/<asked|edited|neither>/{mean,sessions}`: the weighted reward's mean over the scored
    sessions of each behaviour (NaN when there are none) and their count."""
    groups: dict[str, list[float]] = {b: [] for b in BEHAVIOURS}
    for f, total in zip(facts, session_totals(funcs, weights, facts), strict=True):
        if total is not None:
            groups[behaviour_of(f)].append(total)
    out: dict[str, float] = {}
    for b, totals in groups.items():
        out[f"reward_by_behaviour/{b}/mean"] = sum(totals) / len(totals) if totals else math.nan
        out[f"reward_by_behaviour/{b}/sessions"] = float(len(totals))
    return out
