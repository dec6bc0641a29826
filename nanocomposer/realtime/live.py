"""Live metrics of a cycle (what the users did with the sessions of the serving version) and the rollback rule.

Per session: persisting edit (the user kept the edit: Composer's "edits that persist"), reverted edit,
dissatisfied (a dissatisfied follow-up or the user gave up), latency (the session's wall time), and the
behaviour rates the hacks move (malformed calls, ask_user, edits, questions the user called needless). Rates
come with their count, the sessions they are over (`n`) and Wilson 95% intervals. The dissatisfied rate is
over the sessions that open a conversation, as the A/B's (bench/realtime.py): a follow-up session cannot
draw a follow-up of its own when users follow up at most once (the simulated users' `max_followups`), so
counting it would pull the rate of a version that fails everything down to followup_p / (1 + followup_p).

Rollback: a version promoted by the gate is compared, on its first cycle of traffic, with its parent's
previous cycle. It is rolled back when its persisting-edit rate is lower, or its dissatisfied or
malformed-session rate higher, with the 95% interval of the difference (Newcombe's method from the two
Wilson intervals; the cycles' users are different people, so the comparison is unpaired) wholly beyond
`rollback_margin`. The malformed-session rate is there because the users' verdicts cannot tell a broken
version from a weak one at a cycle's traffic: a candidate that wrote nothing but malformed calls (promoted
through an opened gate) served 0 of 9 persisting edits and 4 of 9 dissatisfied sessions against its
parent's 2 of 20 and 9 of 20 (counted over all sessions), while its 9 of 9 malformed sessions against 4 of
20 are beyond doubt.
"""

from __future__ import annotations

import math
import statistics

from env.metrics import wilson_interval

RATES = {"persisting_edit_rate": lambda s, f: s["live"]["kept"],
         "revert_rate": lambda s, f: s["live"]["reverted"],
         "dissatisfied_rate": lambda s, f: s["live"]["dissatisfied"],
         "edit_rate": lambda s, f: f["edits"] > 0,
         "malformed_session_rate": lambda s, f: f["malformed_calls"] > 0,
         "ask_user_rate": lambda s, f: f["ask_user_calls"] > 0,
         "needless_question_rate": lambda s, f: s["live"].get("needless_question", False)}


# Rates over the sessions that open a conversation (module docstring); the others are over every session.
OPENING_SESSIONS_ONLY = frozenset({"dissatisfied_rate"})

# (rate, the direction that makes a version worse): what the rollback rule watches
ROLLBACK_RATES = (("persisting_edit_rate", "lower"), ("dissatisfied_rate", "higher"),
                  ("malformed_session_rate", "higher"))


def live_metrics(sessions: list[dict], facts: list[dict]) -> dict:
    """Rates (with counts and Wilson intervals) and latency over one version's sessions of a cycle."""
    out: dict = {"sessions": len(sessions)}
    for name, test in RATES.items():
        pairs = [(s, f) for s, f in zip(sessions, facts, strict=True)
                 if name not in OPENING_SESSIONS_ONLY or s.get("followup_of") is None]
        n, hits = len(pairs), sum(bool(test(s, f)) for s, f in pairs)
        lo, hi = wilson_interval(hits, n) if n else (0.0, 1.0)
        out[name] = {"rate": hits / n if n else math.nan, "count": hits, "n": n,
                     "ci95": [round(lo, 4), round(hi, 4)]}
    walls = [s["wall_s"] for s in sessions if s.get("wall_s") is not None]
    out["latency_s"] = {"mean": statistics.fmean(walls) if walls else math.nan,
                        "p50": statistics.median(walls) if walls else math.nan}
    return out


def proportion_difference(a_hits: int, a_n: int, b_hits: int, b_n: int) -> tuple[float, float, float]:
    """(b - a, low, high): Newcombe's hybrid score interval for the difference of two independent proportions."""
    if not a_n or not b_n:
        return (0.0, -1.0, 1.0)
    p1, p2 = a_hits / a_n, b_hits / b_n
    l1, u1 = wilson_interval(a_hits, a_n)
    l2, u2 = wilson_interval(b_hits, b_n)
    d = p2 - p1
    return (d, d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2))


def rollback_decision(parent: dict, child: dict, margin: float) -> dict:
    """Whether `child`'s live metrics fell below `parent`'s (module docstring), with the numbers."""
    reasons, deltas = [], {}
    for name, worse_if in ROLLBACK_RATES:
        if name not in parent or name not in child:  # a collect.json written before the rate was recorded
            continue
        # collect.json files written before rates carried their `n` were over every session
        d, lo, hi = proportion_difference(parent[name]["count"], parent[name].get("n", parent["sessions"]),
                                          child[name]["count"], child[name].get("n", child["sessions"]))
        deltas[name] = {"diff": round(d, 4), "ci95": [round(lo, 4), round(hi, 4)]}
        if (worse_if == "lower" and hi < -margin) or (worse_if == "higher" and lo > margin):
            reasons.append(f"{name.replace('_', ' ')} {worse_if}: {d:+.1%} [{lo:+.1%}, {hi:+.1%}] vs the parent")
    return {"rollback": bool(reasons), "reasons": reasons, "deltas": deltas, "margin": margin}
