"""The gate: a candidate is promoted only if the harness-native benchmark says it is no worse than current.

Both versions play the same held-out tasks with the same seeds through `env.runner.run_tasks` (via
nanocomposer.policies.run_policy, eval.py's path), so the comparison is paired. The candidate is refused when
- its solve rate is worse beyond the interval: the paired-bootstrap 95% interval of (candidate - current)
  lies wholly below -gate_solve_margin (env.metrics.compare_paired);
- its malformed-call rate or ask_user rate rose by more than the recipe allows (dropped malformed calls
  and free questions show up there first), or its edit rate (episodes with at least one successful edit) fell by more than allowed.
Current's results are computed once per version and reused (same tasks, seeds and budgets).

The monitor (`drift_warnings`) compares each candidate with the loop's starting version instead: the gate
judges one step, so a rate that creeps up by less than its threshold every cycle, or a loop run with its gate
opened (the reward-hack reproductions), passes the gate; drift from the start does not pass the monitor. Its
warnings are logged and saved with the gate report; they do not block promotion.
"""

from __future__ import annotations

from env.budget import Budget
from env.episode import EpisodeConfig
from env.metrics import compare_paired, summarize

SLIM_DROP = ("messages", "tools")


def edit_rate(records: list[dict]) -> float:
    """Share of episodes with at least one valid edit_file call that succeeded."""
    edited = [any(c["name"] == "edit_file" and not c["malformed"] and c.get("error") is None
                  for t in r["turns"] for c in t["calls"]) for r in records]
    return sum(edited) / len(edited) if edited else 0.0


def evaluate(spec: str, tasks: list, *, budget: Budget, samples: int, workers: int, backend: str) -> dict:
    """{"records", "summary"} of `spec` on `tasks` under `budget` (the loop's: the preset's episode budget, the
    gate's temperature and the loop's seed), records without messages, to keep the files small."""
    from nanocomposer.policies import run_policy

    records, wall_s, _ = run_policy(spec, tasks, EpisodeConfig.from_budget(budget), budget.sampling(), samples=samples,
                                    workers=workers, backend=backend, progress=False)
    slim = [{k: v for k, v in r.items() if k not in SLIM_DROP} for r in records]
    return {"records": slim, "summary": {**summarize(slim, wall_s), "edit_rate": edit_rate(slim)}}


def decide(current: dict, candidate: dict, *, solve_margin: float, max_malformed_increase: float,
           max_ask_user_increase: float, max_edit_rate_drop: float) -> dict:
    """The gate report: both summaries, the deltas (solve rate with its interval), decision and reasons."""
    solve = compare_paired(current["records"], candidate["records"])
    a, b = current["summary"], candidate["summary"]
    deltas = {"solve_rate": solve,
              "malformed_rate": b["malformed_rate"] - a["malformed_rate"],
              "ask_user_rate": b["ask_user_rate"] - a["ask_user_rate"],
              "edit_rate": b["edit_rate"] - a["edit_rate"],
              "tool_call_validity": b["tool_call_validity"] - a["tool_call_validity"]}
    reasons = []
    if solve["ci95"][1] < -solve_margin:
        reasons.append(f"solve rate worse: {solve['diff']:+.1%} [{solve['ci95'][0]:+.1%}, {solve['ci95'][1]:+.1%}] "
                       f"(paired bootstrap over {solve['n_tasks']} tasks) is wholly below -{solve_margin:.1%}")
    if deltas["malformed_rate"] > max_malformed_increase:
        reasons.append(f"malformed-call rate up {deltas['malformed_rate']:+.1%} (allowed +{max_malformed_increase:.1%})")
    if deltas["ask_user_rate"] > max_ask_user_increase:
        reasons.append(f"ask_user rate up {deltas['ask_user_rate']:+.1%} (allowed +{max_ask_user_increase:.1%})")
    if -deltas["edit_rate"] > max_edit_rate_drop:
        reasons.append(f"edit rate down {deltas['edit_rate']:+.1%} (allowed -{max_edit_rate_drop:.1%})")
    keep = ("n", "n_tasks", "solve_rate", "solve_rate_ci95", "malformed_rate", "ask_user_rate", "edit_rate",
            "tool_call_validity", "mean_turns", "exit_statuses")
    return {"promote": not reasons, "reasons": reasons or ["no metric is worse beyond its threshold"],
            "current": {k: a[k] for k in keep}, "candidate": {k: b[k] for k in keep}, "deltas": deltas,
            "thresholds": {"solve_margin": solve_margin, "max_malformed_increase": max_malformed_increase,
                           "max_ask_user_increase": max_ask_user_increase, "max_edit_rate_drop": max_edit_rate_drop}}


def gate_markdown(report: dict, current: str, candidate: str) -> str:
    a, b, d = report["current"], report["candidate"], report["deltas"]
    s = d["solve_rate"]
    lines = [f"# Gate: {candidate} vs {current}", "",
             f"**Decision: {'promote' if report['promote'] else 'refuse'}** — " + "; ".join(report["reasons"]), "",
             f"| metric | {current} | {candidate} | delta |", "|---|---|---|---|",
             (f"| solve rate | {a['solve_rate']:.1%} [{a['solve_rate_ci95'][0]:.1%}, {a['solve_rate_ci95'][1]:.1%}]"
              f" | {b['solve_rate']:.1%} [{b['solve_rate_ci95'][0]:.1%}, {b['solve_rate_ci95'][1]:.1%}] | "
              f"{s['diff']:+.1%} [{s['ci95'][0]:+.1%}, {s['ci95'][1]:+.1%}] |")]
    for key in ("malformed_rate", "ask_user_rate", "edit_rate", "tool_call_validity"):
        lines.append(f"| {key.replace('_', ' ')} | {a[key]:.1%} | {b[key]:.1%} | {d[key]:+.1%} |")
    lines += [f"| episodes | {a['n']} | {b['n']} | |", "",
              "Solve rates with Wilson 95% intervals; the difference with a paired-bootstrap 95% interval over tasks."]
    return "\n".join(lines) + "\n"


def drift_warnings(start: dict, candidate: dict, *, max_malformed_increase: float, max_ask_user_increase: float,
                   max_edit_rate_drop: float) -> list[str]:
    """The monitor's warnings: the candidate's behaviour rates against the starting version's (gate summaries
    on the same tasks), one line per rate that moved beyond its threshold."""
    warnings = []
    for key, name, limit, sign in (("malformed_rate", "malformed-call rate", max_malformed_increase, 1),
                                   ("ask_user_rate", "ask_user rate", max_ask_user_increase, 1),
                                   ("edit_rate", "edit rate", max_edit_rate_drop, -1)):
        moved = candidate[key] - start[key]
        if sign * moved > limit:
            warnings.append(f"{name} {start[key]:.1%} -> {candidate[key]:.1%} since the start ({moved:+.1%}; "
                            f"threshold {'+' if sign > 0 else '-'}{limit:.1%})")
    return warnings
