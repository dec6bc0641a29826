"""Episode metrics: the one definition shared by eval.py, the SFT harness check, the SFT builder and RL monitors.

Everything takes *episodes*: `env.episode.Trajectory` objects or their records (`Trajectory.to_record`:
dicts with `id`, `solved`, `exit_status`, `turns` (the turn dicts, each with its `calls`),
`completion_tokens`, `wall_s`; records of older results files with a `turn_calls` list are read too), so a
results file read back from disk is summarised exactly like live trajectories.

Definitions (documented once, here):
- solve rate: solved episodes / episodes. With k samples per task it equals the unbiased pass@1.
  95% interval: Wilson score. With k > 1 samples the episodes of one task are not independent, so the
  interval is computed on the tasks (n = tasks, successes = pass@1 x tasks), not on the k x tasks episodes.
- pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k) per task with n samples
  of which c solved, averaged over tasks (reported for k = 1..n).
- tool-call validity: share of assistant turns whose calls all parse and validate. A turn with no call
  counts as invalid: in this harness every turn must call a tool (a turn without one ends the episode
  as `no_tool_call`), so "valid" means the turn did what the protocol asks of it.
- parallel-call rate: share of turns with at least one call that made more than one valid call
  (`is_parallel_turn`; Trajectory.parallel_turns and the RL monitor `behaviour/parallel_call_rate` should
  count the same turns).
- parallel-read rate: share of turns with at least one call that issued two or more *distinct read-only*
  calls together (`independent_reads` >= 2): what the RL `parallel` reward pays for, reported beside it.
- ask_user rate: share of episodes that called `ask_user` at least once.
- turns per solved task: mean turns of the solved episodes (None when none solved): the recipe claims RL
  finishes in fewer turns, which the mean over all episodes hides when the solve rate moves too.
- tested before submit: among episodes with a valid `submit`, the share that ran the tests before it
  (earlier in the same turn counts): a valid `run_tests` call, or a `run` whose command names pytest or
  unittest (`runs_tests`; the RL monitor `behaviour/submit_without_test_rate` is its complement).
- tool budget: `calls_per_tool` counts valid calls by tool; `turn_share` splits each turn *fractionally*
  across the categories of its valid calls (search+grep+read in one turn: 2/3 search, 1/3 read), so shares
  add up to 1 over turns; a turn with no valid call is `invalid`.
- difference of two policies on the same tasks: a paired bootstrap over tasks (2,000 resamples, seeded)
  of the mean per-task difference in solve rate, percentile 95% interval. `paired_normal_interval` (mean
  +- 1.96 standard errors of the per-task differences) is kept as a closed-form cross-check.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

Z95 = 1.959963984540054  # two-sided 95% normal quantile
BOOTSTRAP_RESAMPLES = 2000
TOOL_CATEGORIES = {
    "search": "search", "grep": "search",
    "read_file": "read",
    "edit_file": "edit",
    "run_tests": "test", "run": "test", "lint": "test",
    "ask_user": "ask",
    "submit": "submit",
}
CATEGORIES = ("search", "read", "edit", "test", "ask", "submit", "other", "invalid")
READ_ONLY_TOOLS = {"read_file", "grep", "search", "lint"}  # safe to issue together; `run` may write
TEST_COMMAND = re.compile(r"\bpytest\b|\bunittest\b")


# --------------------------------------------------------------------------- statistics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, fig. 3)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # The product form avoids huge binomials: C(n-c, k)/C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i).
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def wilson_interval(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (successes may be fractional, e.g. pass@1 x tasks)."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: successes={successes} is not in [0, n={n}]")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    if len(a) != len(b):
        raise ValueError(f"paired interval: {len(a)} scores for one policy and {len(b)} for the other")
    return [y - x for x, y in zip(a, b)]


def paired_bootstrap_interval(a: Sequence[float], b: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES,
                              seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean of b - a, low, high): percentile bootstrap over paired per-task scores (tasks resampled)."""
    d = _differences(a, b)
    if not d:
        return (0.0, 0.0, 0.0)
    rng = random.Random(seed)
    n = len(d)
    means = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    lo = means[math.floor(tail * (resamples - 1))]
    hi = means[math.ceil((1 - tail) * (resamples - 1))]
    return (sum(d) / n, lo, hi)


def paired_normal_interval(a: Sequence[float], b: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """(mean of b - a, low, high): mean +- z standard errors of the per-task differences."""
    d = _differences(a, b)
    if not d:
        return (0.0, 0.0, 0.0)
    mean = sum(d) / len(d)
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
    return (mean, mean - z * se, mean + z * se)


# --------------------------------------------------------------------------- turns and calls


def _episode_fields(episode) -> dict:
    """The fields the metrics read, from a Trajectory or an eval.py record."""
    if isinstance(episode, dict):
        turns = episode.get("turns")  # Trajectory.to_record: the turn dicts; older records: a count + turn_calls
        turn_calls = [t["calls"] for t in turns] if isinstance(turns, list) else episode.get("turn_calls") or []
        return {"id": episode["id"], "solved": bool(episode["solved"]), "exit_status": episode["exit_status"],
                "turn_calls": turn_calls, "completion_tokens": episode.get("completion_tokens"),
                "wall_s": float(episode.get("wall_s") or 0.0)}
    return {"id": episode.task_id, "solved": bool(episode.solved), "exit_status": episode.exit_status,
            "turn_calls": [t["calls"] for t in episode.turns], "completion_tokens": episode.completion_tokens,
            "wall_s": round(float(episode.wall_s), 3)}  # as records store it, so both summarize alike


def is_parallel_turn(calls: list[dict]) -> bool:
    """A parallel turn makes more than one valid call (the one definition; see the module docstring)."""
    return sum(not c["malformed"] for c in calls) > 1


def independent_reads(calls: list[dict]) -> int:
    """Distinct valid read-only calls in one turn (the same call twice counts once)."""
    return len({(c["name"], repr(sorted((c.get("arguments") or {}).items()))) for c in calls
                if not c["malformed"] and c["name"] in READ_ONLY_TOOLS})


def runs_tests(call: dict) -> bool:
    """A valid call that runs the tests: `run_tests`, or `run` with a pytest/unittest command."""
    if call["malformed"]:
        return False
    command = str((call.get("arguments") or {}).get("command", ""))
    return call["name"] == "run_tests" or (call["name"] == "run" and bool(TEST_COMMAND.search(command)))


def ran_tests_before_submit(turn_calls: list[list[dict]]) -> bool | None:
    """Whether the tests ran before the episode's first valid `submit`; None without a submit."""
    tested = False
    for calls in turn_calls:
        for c in calls:
            if c["name"] == "submit" and not c["malformed"]:
                return tested
            tested = tested or runs_tests(c)
    return None


def turn_is_valid(calls: list[dict]) -> bool:
    """A turn is valid when it makes at least one call and none is malformed (see module docstring)."""
    return bool(calls) and not any(c["malformed"] for c in calls)


def tool_call_validity(turn_calls: Iterable[list[dict]]) -> float:
    """Share of turns (each a list of call records with a `malformed` flag) that are valid; 0.0 for none."""
    turns = list(turn_calls)
    return sum(turn_is_valid(calls) for calls in turns) / len(turns) if turns else 0.0


def turn_categories(calls: list[dict]) -> dict[str, float]:
    """How one turn splits over the tool-budget categories (fractions summing to 1)."""
    valid = [c["name"] for c in calls if not c["malformed"]]
    if not valid:
        return {"invalid": 1.0}
    shares: dict[str, float] = defaultdict(float)
    for name in valid:
        shares[TOOL_CATEGORIES.get(name, "other")] += 1 / len(valid)
    return dict(shares)


# --------------------------------------------------------------------------- summaries


def pass_at_k_by_task(episodes: Iterable) -> dict[str, float]:
    """pass@k for k = 1..n (n = the fewest samples any task has), averaged over tasks."""
    by_task: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        f = _episode_fields(e)
        by_task[f["id"]].append(f["solved"])
    if not by_task:
        return {}
    n = min(len(v) for v in by_task.values())
    return {f"pass@{k}": sum(pass_at_k(len(v), sum(v), k) for v in by_task.values()) / len(by_task)
            for k in range(1, n + 1)}


def malformed_call_count(fields: dict) -> int:
    """Malformed calls of one episode (its `_episode_fields`)."""
    return sum(c["malformed"] for calls in fields["turn_calls"] for c in calls)


def per_task_scores(episodes: Iterable, score=lambda fields: float(fields["solved"])) -> dict[str, float]:
    """Mean score over each task's samples (the unit the paired comparisons resample); by default solved."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for e in episodes:
        f = _episode_fields(e)
        by_task[f["id"]].append(score(f))
    return {task: sum(v) / len(v) for task, v in by_task.items()}


def summarize(episodes: Iterable, wall_s: float | None = None) -> dict:
    """Aggregate metrics of a list of episodes (Trajectories or eval records); see the module docstring.

    `wall_s` is the run's wall-clock time (episodes overlap with several workers); by default the sum of
    the episodes' times.
    """
    eps = [_episode_fields(e) for e in episodes]
    n = len(eps)
    turns = [calls for e in eps for calls in e["turn_calls"]]
    calling_turns = [calls for calls in turns if calls]
    valid_calls = [c for calls in turns for c in calls if not c["malformed"]]
    calls = sum(len(calls) for calls in turns)
    malformed = calls - len(valid_calls)
    solved = sum(e["solved"] for e in eps)
    tasks = len({e["id"] for e in eps})
    pass_k = pass_at_k_by_task(eps)
    pass1 = pass_k.get("pass@1", 0.0)
    lo, hi = wilson_interval(pass1 * tasks, tasks) if tasks else (0.0, 1.0)
    shares: Counter[str] = Counter()
    for calls_of_turn in turns:
        shares.update(turn_categories(calls_of_turn))
    tokens = [e["completion_tokens"] for e in eps]
    solved_turns = [len(e["turn_calls"]) for e in eps if e["solved"]]
    submits = [t for t in (ran_tests_before_submit(e["turn_calls"]) for e in eps) if t is not None]
    episode_walls = sorted(e["wall_s"] for e in eps)
    return {
        "n": n,
        "n_tasks": tasks,
        "solved": solved,
        "solve_rate": solved / n if n else 0.0,
        "solve_rate_ci95": [round(lo, 4), round(hi, 4)],
        **pass_k,
        "mean_turns": len(turns) / n if n else 0.0,
        "mean_turns_solved": sum(solved_turns) / len(solved_turns) if solved_turns else None,
        "tool_calls": calls,
        "tool_call_validity": tool_call_validity(turns),
        "parallel_call_rate": sum(is_parallel_turn(t) for t in calling_turns) / len(calling_turns)
        if calling_turns else 0.0,
        "parallel_read_rate": sum(independent_reads(t) >= 2 for t in calling_turns) / len(calling_turns)
        if calling_turns else 0.0,
        "malformed_calls": malformed,
        "malformed_rate": malformed / calls if calls else 0.0,
        "tested_before_submit_rate": sum(submits) / len(submits) if submits else None,
        "ask_user_rate": sum(any(c["name"] == "ask_user" and not c["malformed"] for t in e["turn_calls"] for c in t)
                             for e in eps) / n if n else 0.0,
        # Scripted policies have no token counts: the mean is None rather than a made-up 0.
        "mean_completion_tokens": sum(tokens) / n if n and None not in tokens else None,
        "exit_statuses": dict(sorted(Counter(e["exit_status"] for e in eps).items())),
        "tool_mix": dict(sorted(Counter(c["name"] for c in valid_calls).items())),  # calls per tool
        "turn_share": {k: round(shares[k] / len(turns), 4) for k in CATEGORIES if shares[k]} if turns else {},
        "episode_wall_s": {"mean": round(sum(episode_walls) / n, 3), "p50": round(episode_walls[n // 2], 3),
                           "max": round(episode_walls[-1], 3)} if n else {},
        "wall_s": round(wall_s if wall_s is not None else sum(episode_walls), 3),
    }


def summarize_by(episodes: Sequence, key: str) -> dict[str, dict]:
    """`summarize` per value of a record key (e.g. `task_set`, `family`); records only."""
    groups: dict[str, list] = defaultdict(list)
    for e in episodes:
        groups[str(e.get(key))].append(e)
    return {name: summarize(group) for name, group in sorted(groups.items())}


def compare_paired(baseline: Sequence, other: Sequence, resamples: int = BOOTSTRAP_RESAMPLES,
                   seed: int = 0) -> dict:
    """Solve-rate difference (other - baseline) on the tasks both ran, with the paired bootstrap interval, and
    the same for malformed calls per episode (`malformed_per_episode`): whether a change to training made
    broken calls rarer is as much a result as the solve rate (the malformed-calls-dropped hack shows there first)."""
    a, b = per_task_scores(baseline), per_task_scores(other)
    common = sorted(a.keys() & b.keys())
    mean, lo, hi = paired_bootstrap_interval([a[t] for t in common], [b[t] for t in common], resamples, seed)
    _, nlo, nhi = paired_normal_interval([a[t] for t in common], [b[t] for t in common])
    ma, mb = per_task_scores(baseline, malformed_call_count), per_task_scores(other, malformed_call_count)
    m_mean, m_lo, m_hi = paired_bootstrap_interval([ma[t] for t in common], [mb[t] for t in common], resamples, seed)
    return {"diff": round(mean, 4), "ci95": [round(lo, 4), round(hi, 4)], "method": "paired bootstrap over tasks",
            "resamples": resamples, "seed": seed, "normal_ci95": [round(nlo, 4), round(nhi, 4)],
            "n_tasks": len(common), "only_in_one": len(a.keys() ^ b.keys()),
            "malformed_per_episode": {"diff": round(m_mean, 4), "ci95": [round(m_lo, 4), round(m_hi, 4)]}}
