"""Aggregate episode metrics: one definition shared by eval.py, the SFT report and RL monitors."""

from __future__ import annotations

from collections import Counter

from env.episode import Trajectory


def summarize(trajectories: list[Trajectory], wall_s: float | None = None) -> dict:
    n = len(trajectories)
    calling_turns = [t for tr in trajectories for t in tr.turns if t["calls"]]
    parallel = sum(sum(not c["malformed"] for c in t["calls"]) > 1 for t in calling_turns)
    calls = sum(tr.tool_calls for tr in trajectories)
    tool_mix = Counter(c["name"] for tr in trajectories for t in tr.turns for c in t["calls"] if not c["malformed"])
    solved = sum(tr.solved for tr in trajectories)
    return {
        "n": n,
        "solved": solved,
        "solve_rate": solved / n if n else 0.0,
        "mean_turns": sum(len(tr.turns) for tr in trajectories) / n if n else 0.0,
        "tool_calls": calls,
        "parallel_call_rate": parallel / len(calling_turns) if calling_turns else 0.0,
        "malformed_calls": sum(tr.malformed_calls for tr in trajectories),
        "malformed_rate": sum(tr.malformed_calls for tr in trajectories) / calls if calls else 0.0,
        "exit_statuses": dict(sorted(Counter(tr.exit_status for tr in trajectories).items())),
        "tool_mix": dict(sorted(tool_mix.items())),
        "wall_s": round(wall_s if wall_s is not None else sum(tr.wall_s for tr in trajectories), 3),
    }
