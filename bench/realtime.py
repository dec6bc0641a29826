"""Real-time RL measurements: the live A/B of two versions, and the per-cycle behaviour of loops (the hacks).

    python -m bench.realtime ab --a runs/rt/realtime/registry/versions/v0 --b runs/rt/realtime/registry/versions/v5 \\
        --tasks factory:val --sessions 400 --recipe recipes/tiny/users.yaml --budget recipes/tiny/budget.yaml \\
        --out runs/rt/ab
    python -m bench.realtime cycles runs/rt runs/rt-malformed-dropped runs/rt-free-questions --out runs/rt/cycles.md
    python -m bench.realtime behaviours runs/rt-free-questions [--config recipes/tiny/realtime.yaml --ask_user_handling free ...]

`ab`: each arm is its own `agent.py serve` (own registry and database) facing the same simulated users: the
same population seed and task draw, and the same server `--seed`, so conversation i of arm A and of arm B is
the same user with the same task and the same sampling seeds (paired), under the loop's episode budget
(`--budget`, the preset's budget.yaml; flags override it). The tasks are the traffic set's beyond
the loop's training range (nanocomposer/realtime/traffic.py: [K, end) with K = `--traffic-task-limit`, the
loop's `traffic_task_limit`, same default), so no arm is measured on a task a cycle trained on; ab.json
records the range. Arms run one after the other on the same machine (same load for both). Per conversation: the
first session's edit persisted (kept), a dissatisfied follow-up was sent, and the first session's latency
(wall time). Table: each arm's rate (Wilson 95%) or mean, and B - A with a paired-bootstrap 95% interval over
conversations, absolute and relative (Composer reports relative changes: +2.28% persisting edits, -3.13%
dissatisfied follow-ups, -10.3% latency). Writes <out>/ab.json and ab.md. An arm is played in parts of
`--part-size` conversations, each its own server and database, recorded when it finishes
(<out>/<A|B>/parts/<start>/part.json), and a finished arm leaves <out>/<A|B>/arm.json: run the same command again
after an interruption and finished arms and parts are reused, the first unfinished part played again. An arm
can therefore be split over sessions.

`cycles`: one table per loop directory (runs/<run>) from its cycles' collect.json and cycle.json: live
persisting-edit, dissatisfied, malformed-session, ask_user and edit rates, latency, the gate's decision, and
the monitor's warnings (the candidate's drift from v0 on the gate tasks; for a loop that predates the monitor,
computed from its gate reports with the recipe's default thresholds), which is where dropping malformed calls
(more malformed calls) and free questions (questions instead of edits) show across cycles.

`behaviours`: the cycles' sessions split by what they did (asked a question / tried an edit and asked nothing /
neither): how many, the mean weighted reward of each (nanocomposer/realtime/rewards.py `reward_by_behaviour`,
the loop's own numbers), and what the users did with the edits. A reward under which `asked` out-scores
`edited` teaches questions instead of edits (free questions). Loops log it in collect.json; for a loop that predates
that, or to score its sessions under another reward, give the loop's realtime_rl.py flags after the run (its
recipe and overrides): the rewards are recomputed from the database with them.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import sys
import time
from pathlib import Path

from env.metrics import paired_bootstrap_interval, wilson_interval
from nanocomposer.policies import POLICY_BACKENDS
from nanocomposer.reporting import write_json_atomic

METRICS = (("persisting_edits", "rate"), ("dissatisfied_followups", "rate"), ("needless_questions", "rate"),
           ("latency_s", "mean"))


def conversations(db: Path) -> dict[str, dict]:
    """client -> {persisting_edits, dissatisfied_followups, needless_questions, latency_s} of its first session."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        sessions = conn.execute("SELECT id, client, wall_s FROM sessions WHERE parent_id IS NULL AND wall_s IS NOT "
                                "NULL").fetchall()
        kinds: dict[str, set] = {}
        for sid, kind in conn.execute("SELECT session_id, kind FROM feedback"):
            kinds.setdefault(sid, set()).add(kind)
    finally:
        conn.close()
    return {client: {"persisting_edits": float("kept" in kinds.get(sid, set())),
                     "dissatisfied_followups": float("followup_dissatisfied" in kinds.get(sid, set())),
                     "needless_questions": float("question_needless" in kinds.get(sid, set())),
                     "latency_s": float(wall)} for sid, client, wall in sessions}


def arm_budget(args):
    """Both arms' env.budget.Budget: the loop's budget file (`--budget`), the flags given overriding it, sampled at
    `--temperature` with the server seed `--seed`."""
    from env.budget import Budget, load_budget_file

    values = load_budget_file(args.budget) if args.budget and args.budget != "none" else {}
    flags = {"max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens, "max_wall_s": args.session_timeout_s}
    values.update({key: value for key, value in flags.items() if value is not None})
    return Budget(**values, temperature=args.temperature, seed=args.seed)


def arm_settings(spec: str, args, draw: dict) -> dict:
    """What an arm's conversations depend on: a finished arm is reused only when all of it matches."""
    return {"spec": spec, "tasks": args.tasks, "traffic": draw, "sessions": args.sessions, "seed": args.seed,
            "recipe": args.recipe, "budget": args.budget, "max_turns": args.max_turns,
            "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
            "session_timeout_s": args.session_timeout_s, "backend": args.backend}


def finished_arm(out: Path, settings: dict) -> dict | None:
    """The arm in `out` when it finished with these settings (its arm.json); None when it must be played.

    An arm is an hour or more of conversations at 400 a side on CPU, so a rerun after the second arm was cut
    off reuses the first (and an arm cut off itself continues from its last finished part: play_arm). A folder
    from before arms were played in parts, with no arm.json and no parts/, is moved aside (kept, and said),
    since its database would mix its cut-off sessions into the new ones. ValueError for a finished arm played
    with other settings."""
    record = out / "arm.json"
    if record.exists():
        arm = _read_record(record, settings, "the arm")
        print(f"bench.realtime ab: {out.name}: reusing the finished arm in {out} "
              f"({len(arm['conversations'])} conversations)", file=sys.stderr)
        return arm
    if out.exists() and any(out.iterdir()) and not (out / "parts").is_dir():
        _set_aside(out, f"{out} holds an arm that did not finish")
    return None


def _read_record(record: Path, settings: dict, what: str) -> dict:
    """A finished arm's or part's JSON, checked against the settings it must have been played with."""
    try:
        data = json.loads(record.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{record} is not valid JSON ({e}): remove it to play {what} again") from None
    if data.get("settings") != settings:
        changed = sorted(k for k in settings if (data.get("settings") or {}).get(k) != settings[k])
        raise ValueError(f"{record.parent} holds {what} played with other settings ({', '.join(changed)}): give "
                         "another --out, or remove the folder to play it again")
    return data


def _set_aside(folder: Path, why: str) -> None:
    stamp = int(time.time())
    while (aside := folder.with_name(f"{folder.name}.unfinished-{stamp}")).exists():
        stamp += 1
    folder.rename(aside)
    print(f"bench.realtime ab: {why}; moved to {aside}, playing it again", file=sys.stderr)


def finished_parts(parts: Path, settings: dict) -> list[dict]:
    """The arm's finished parts in conversation order, contiguous from conversation 0 (parts/<start>/part.json).
    A part folder without part.json was cut off: it is moved aside, and it and every later part play again."""
    done: list[dict] = []
    for folder in sorted(parts.iterdir() if parts.is_dir() else [], key=lambda f: f.name):
        if not folder.is_dir() or not folder.name.isdigit():
            continue  # a part set aside earlier
        record = folder / "part.json"
        if record.exists() and int(folder.name) == sum(p["sessions"] for p in done):
            done.append(_read_record(record, settings, "a part"))
        else:
            _set_aside(folder, f"{folder} is a part that did not finish (or follows one)")
    return done


def play_part(spec: str, out: Path, args, draw: dict, start: int, sessions: int) -> dict:
    """Conversations start .. start + sessions - 1 of the arm, served by their own `agent.py serve` with its own
    database (parts/<start>/sessions.db), so a part cut off leaves nothing in a finished part's database."""
    from nanocomposer.agent.registry import Registry
    from nanocomposer.realtime.server import AgentServer, run_users

    folder = out / "parts" / f"{start:06d}"
    folder.mkdir(parents=True)
    registry = Registry(out / "registry")
    registry.ensure(spec, "arm")
    budget = arm_budget(args)
    server = AgentServer(registry.root, folder / "sessions.db", workers=args.workers, budget=budget,
                         backend=args.backend, log=out / "server.log")
    try:
        report = run_users(server.url, args.tasks, sessions, recipe=args.recipe, seed=args.seed,
                           offset=draw["offset"], task_limit=draw["task_limit"], start=start,
                           report=folder / "users.json", log=out / "users.log", token=server.token)
        server.wait_idle(budget.max_wall_s + 60)
    finally:
        server.stop()
    part = {"settings": arm_settings(spec, args, draw), "start": start, "sessions": sessions,
            "users": {k: v for k, v in report.items() if k not in ("latencies", "accepted_ids")},
            "conversations": conversations(folder / "sessions.db")}
    write_json_atomic(folder / "part.json", part)  # the rerun's proof that this part finished: never half a file
    return part


def merge_users(reports: list[dict]) -> dict:
    """The users' reports of an arm's parts as one: counts summed, the first part's population and traffic."""
    merged = dict(reports[0]) if reports else {}
    for key in ("conversations", "conversations_started", "accepted", "feedback_sent", "wall_s"):
        merged[key] = sum(r.get(key) or 0 for r in reports)
    for key in ("feedback_by_kind", "stats"):
        merged[key] = {}
        for r in reports:
            for k, v in (r.get(key) or {}).items():
                merged[key][k] = merged[key].get(k, 0) + v
    merged["stopped"] = any(r.get("stopped") for r in reports)
    merged["unfinished_after_drain"] = [x for r in reports for x in r.get("unfinished_after_drain") or []]
    merged["conversation_tasks"] = [x for r in reports for x in r.get("conversation_tasks") or []]
    merged["sessions_per_s"] = round(merged["accepted"] / merged["wall_s"], 3) if merged.get("wall_s") else None
    merged["parts"] = len(reports)
    return merged


def play_arm(spec: str, out: Path, args, draw: dict) -> dict:
    """The arm's conversations in parts of `--part-size`, each recorded when it finishes (parts/<start>/part.json):
    an arm cut off continues with its first unfinished part, and plays the conversations the uncut arm would
    have (same users, tasks and sample keys: env.users with `start`), none twice and none half."""
    settings = arm_settings(spec, args, draw)
    done = finished_parts(out / "parts", settings)
    start = sum(p["sessions"] for p in done)
    if done:
        print(f"bench.realtime ab: {out.name}: {start} of {args.sessions} conversations played in {len(done)} "
              f"finished parts; continuing from conversation {start}", file=sys.stderr)
    while start < args.sessions:
        sessions = min(args.part_size, args.sessions - start)
        done.append(play_part(spec, out, args, draw, start, sessions))
        start += sessions
    arm = {"spec": spec, "settings": settings, "users": merge_users([p["users"] for p in done]),
           "conversations": {c: x for p in done for c, x in p["conversations"].items()}}
    write_json_atomic(out / "arm.json", arm)  # the rerun's proof that this arm finished: never half a file
    return arm


def ab_table(a: dict, b: dict, seed: int = 0) -> dict:
    common = sorted(a.keys() & b.keys())
    rows = {}
    for name, kind in METRICS:
        xa, xb = [a[c][name] for c in common], [b[c][name] for c in common]
        mean_a, mean_b = (statistics.fmean(xa), statistics.fmean(xb)) if common else (0.0, 0.0)
        diff, lo, hi = paired_bootstrap_interval(xa, xb, seed=seed)
        row = {"a": mean_a, "b": mean_b, "diff": diff, "ci95": [lo, hi],
               "relative": diff / mean_a if mean_a else None}
        if kind == "rate":
            row["a_ci95"], row["b_ci95"] = wilson_interval(sum(xa), len(xa)), wilson_interval(sum(xb), len(xb))
        rows[name] = row
    return {"paired_conversations": len(common), "only_in_one_arm": len(a.keys() ^ b.keys()), "metrics": rows}


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _num(x: float) -> str:
    return f"{x:.2f}"


def ab_markdown(table: dict, a: str, b: str, traffic: dict | None = None) -> str:
    where = "" if traffic is None else (
        f" Tasks [{traffic['offset']}, {traffic['offset'] + traffic['task_limit']}) of {traffic['task_set']} "
        f"(families interleaved; {traffic['set_size']} tasks), none of them in the loop's training traffic.")
    lines = [f"# Live A/B: B = {b} vs A = {a}", "",
             (f"{table['paired_conversations']} paired conversations (same users, same tasks); "
              f"{table['only_in_one_arm']} in one arm only.{where}"), "",
             "| metric | A | B | B - A [95% paired bootstrap] | relative |", "|---|---|---|---|---|"]
    for name, kind in METRICS:
        r = table["metrics"][name]
        fmt = _pct if kind == "rate" else _num

        def cell(x, ci=None, fmt=fmt):
            return fmt(x) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "")

        rel = "-" if r["relative"] is None else f"{r['relative']:+.1%}"
        lines.append(f"| {name.replace('_', ' ')} | {cell(r['a'], r.get('a_ci95'))} | {cell(r['b'], r.get('b_ci95'))} "
                     f"| {fmt(r['diff'])} [{fmt(r['ci95'][0])}, {fmt(r['ci95'][1])}] | {rel} |")
    return "\n".join(lines) + "\n"


def ab_traffic(task_set: str, traffic_task_limit: int | None) -> dict:
    """The tasks both arms draw from: the traffic set past the loop's training range. ValueError (naming the
    flag) when that range is empty, TaskError when the set cannot be read."""
    from env.task_sets import resolve_task_set
    from nanocomposer.realtime.traffic import ab_draw

    size = len(resolve_task_set(task_set).tasks)
    try:
        return {"task_set": task_set, **ab_draw(size, traffic_task_limit, "--traffic-task-limit")}
    except ValueError as e:
        raise ValueError(f"{e} (--tasks {task_set!r})") from None


def cmd_ab(args) -> int:
    from env.tasks import TaskError

    out = Path(args.out)
    try:
        draw = ab_traffic(args.tasks, args.traffic_task_limit)
    except (ValueError, TaskError) as e:
        print(f"bench.realtime ab: error: {e}", file=sys.stderr)
        return 2
    arms = {}
    for label, spec in (("A", args.a), ("B", args.b)):
        try:
            arm = finished_arm(out / label, arm_settings(spec, args, draw))
            arms[label] = arm or play_arm(spec, out / label, args, draw)
        except ValueError as e:
            print(f"bench.realtime ab: error: {e}", file=sys.stderr)
            return 2
    table = ab_table(arms["A"]["conversations"], arms["B"]["conversations"], args.seed)
    result = {"a": args.a, "b": args.b, "tasks": args.tasks, "sessions": args.sessions, "seed": args.seed,
              "traffic": draw, **table, "users": {k: v["users"] for k, v in arms.items()}}
    (out / "ab.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "ab.md").write_text(ab_markdown(table, args.a, args.b, draw))
    print((out / "ab.md").read_text())
    return 0


def monitor_warnings(loop: Path, folder: Path) -> list[str] | None:
    """The monitor's warnings for one cycle: saved by the loop, or recomputed from the gate reports (the
    candidate against cycle 1's gate of v0) with RealtimeArguments' default thresholds; None without a gate."""
    from nanocomposer.realtime.config import RealtimeArguments
    from nanocomposer.realtime.gate import drift_warnings

    gate, first = folder / "gate.json", loop / "cycles" / "1" / "gate.json"
    report = json.loads(gate.read_text()) if gate.is_file() else {}
    if "monitor" in report or "candidate" not in report:
        return report.get("monitor")
    start = json.loads(first.read_text()) if first.is_file() else {}
    if start.get("current_name") != "v0" or "current" not in start:
        return None
    defaults = RealtimeArguments.__dataclass_fields__
    return drift_warnings(start["current"], report["candidate"], **{
        name: defaults[f"monitor_{name}"].default
        for name in ("max_malformed_increase", "max_ask_user_increase", "max_edit_rate_drop")})


def cycles_markdown(run_dir: Path) -> str:
    loop = run_dir / "realtime" if (run_dir / "realtime").is_dir() else run_dir
    lines = [f"## {loop}", "", ("| cycle | served by | sessions | persisting edits | dissatisfied | malformed "
                                "sessions | ask_user | needless questions | edit rate | latency s | decision | "
                                "monitor |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for folder in sorted((loop / "cycles").iterdir(), key=lambda p: int(p.name)):
        if not (folder / "cycle.json").is_file():
            continue
        live = json.loads((folder / "collect.json").read_text())["live"]
        cycle = json.loads((folder / "cycle.json").read_text())

        def rate(key: str, live=live) -> str:  # "-": no sessions, or a loop that predates the rate
            return f"{live[key]['rate']:.1%}" if live["sessions"] and key in live else "-"

        decision = cycle.get("decision") or f"rolled back {cycle.get('rolled_back')}"
        warnings = monitor_warnings(loop, folder)
        monitor = "-" if warnings is None else ("; ".join(warnings) or "ok")
        lines.append(f"| {cycle['cycle']} | {cycle['served_by']} | {live['sessions']} | {rate('persisting_edit_rate')} "
                     f"| {rate('dissatisfied_rate')} | {rate('malformed_session_rate')} | {rate('ask_user_rate')} | "
                     f"{rate('needless_question_rate')} | {rate('edit_rate')} | {live['latency_s']['mean']:.1f} | "
                     f"{decision} | {monitor} |")
    return "\n".join(lines) + "\n"


def cmd_cycles(args) -> int:
    text = "\n".join(cycles_markdown(Path(d)) for d in args.runs)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


def behaviour_rows(loop: Path, recipe_args: list[str] | None = None) -> list[dict]:
    """One row per finished cycle: {cycle, served_by, <behaviour>: {sessions, reward, applied, kept, reverted}}.

    The rewards are the ones the loop logged, or recomputed with `recipe_args` (realtime_rl.py flags)."""
    from nanocomposer.realtime.config import RealtimeArguments
    from nanocomposer.realtime.loop import facts_of_sessions
    from nanocomposer.realtime.rewards import BEHAVIOURS, behaviour_of, reward_by_behaviour

    funcs = weights = None
    args = RealtimeArguments()  # a session's behaviour does not depend on the budgets
    if recipe_args:
        from trl import GRPOConfig, ModelConfig

        from env.rewards import get_reward_funcs
        from nanocomposer.config import RecipeParser

        args, training_args, _ = RecipeParser((RealtimeArguments, GRPOConfig, ModelConfig)).parse_args_and_config(
            ["--output_dir", str(loop), *recipe_args])
        funcs = get_reward_funcs(args.reward_funcs, malformed_handling=args.malformed_handling,
                                 ask_user_handling=args.ask_user_handling)
        weights = training_args.reward_weights
    missing = [str(path) for path in (loop / "cycles", loop / "sessions.db") if not path.exists()]
    if missing:  # never let SessionStore create an empty database where a loop's should be
        raise SystemExit(f"{loop}: not a real-time RL loop directory (missing {', '.join(missing)})")
    rows = []
    for folder in sorted((p for p in (loop / "cycles").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        if not (folder / "cycle.json").is_file():
            continue
        collected = json.loads((folder / "collect.json").read_text())
        if funcs is None and "reward_by_behaviour/asked/mean" not in collected["rewards"]:
            raise SystemExit(f"{folder / 'collect.json'} has no reward by behaviour (the loop predates it): give "
                             "the loop's realtime_rl.py flags after the run (--config <recipe> and its overrides)")
        sessions = collected["sessions"]
        facts = facts_of_sessions(loop / "sessions.db", sessions, args)
        rewards = reward_by_behaviour(funcs, weights, facts) if funcs is not None else collected["rewards"]
        cycle = json.loads((folder / "cycle.json").read_text())
        row = {"cycle": cycle["cycle"], "served_by": cycle["served_by"]}
        for b in BEHAVIOURS:
            mine = [x["live"] for x, f in zip(sessions, facts, strict=True) if behaviour_of(f) == b]
            row[b] = {"sessions": len(mine), "reward": rewards[f"reward_by_behaviour/{b}/mean"],
                      **{k: sum(bool(live.get(k)) for live in mine) for k in ("applied", "kept", "reverted")}}
        rows.append(row)
    return rows


def behaviours_markdown(loop: Path, rows: list[dict]) -> str:
    def cell(r: dict) -> str:
        reward = "-" if math.isnan(r["reward"]) else f"{r['reward']:+.3f}"
        return f"{r['sessions']} ({reward})"

    lines = [f"## {loop}", "", "Sessions (mean weighted reward); edits applied / kept / reverted by the users.", "",
             "| cycle | served by | asked | edited | neither | asked - edited | edits applied / kept / reverted |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        a, e = row["asked"]["reward"], row["edited"]["reward"]
        gap = "-" if math.isnan(a) or math.isnan(e) else f"{a - e:+.3f}"
        edits = " / ".join(str(sum(row[b][k] for b in ("asked", "edited", "neither")))
                           for k in ("applied", "kept", "reverted"))
        lines.append(f"| {row['cycle']} | {row['served_by']} | {cell(row['asked'])} | {cell(row['edited'])} | "
                     f"{cell(row['neither'])} | {gap} | {edits} |")
    return "\n".join(lines) + "\n"


def cmd_behaviours(args) -> int:
    if "--out" in args.recipe_args:  # given after the run, where the recipe flags begin
        i = args.recipe_args.index("--out")
        if i + 1 >= len(args.recipe_args):
            raise SystemExit("bench.realtime behaviours: --out needs a file")
        args.out = args.recipe_args[i + 1]
        del args.recipe_args[i:i + 2]
    run = Path(args.run)
    loop = run / "realtime" if (run / "realtime").is_dir() else run
    text = behaviours_markdown(loop, behaviour_rows(loop, args.recipe_args))
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    ab = sub.add_parser("ab", help="live A/B of two versions with the same simulated users")
    ab.add_argument("--a", required=True, help="arm A: a checkpoint directory or scripted policy (the control)")
    ab.add_argument("--b", required=True, help="arm B: the treatment")
    ab.add_argument("--tasks", required=True, help="what the users ask for (the loop's traffic_tasks)")
    ab.add_argument("--traffic-task-limit", type=int, default=None,
                    help="the loop's traffic_task_limit K: the arms draw from the set's tasks [K, end), which "
                         "training traffic never asked for (default: as the loop's, half the set)")
    ab.add_argument("--sessions", type=int, default=400, help="conversations per arm")
    ab.add_argument("--part-size", type=int, default=50,
                    help="conversations per part: an arm cut off continues from its last finished part")
    ab.add_argument("--recipe", default="recipes/tiny/users.yaml")
    ab.add_argument("--seed", type=int, default=12345,
                    help="population seed and server --seed, the same for both arms")
    ab.add_argument("--workers", type=int, default=2)
    ab.add_argument("--budget", default="recipes/tiny/budget.yaml",
                    help="the loop's budget file (its preset's recipes/<preset>/budget.yaml): the sessions' episode "
                         "budget; `none`: env.budget.Budget's defaults")
    ab.add_argument("--max-turns", type=int, default=None, help="override the budget file's max_turns")
    ab.add_argument("--max-new-tokens", type=int, default=None, help="override the budget file's max_new_tokens")
    ab.add_argument("--temperature", type=float, default=1.0, help="as served in the loop")
    ab.add_argument("--session-timeout-s", type=float, default=None, help="override the budget file's max_wall_s")
    ab.add_argument("--backend", default="auto", choices=POLICY_BACKENDS)
    ab.add_argument("--out", required=True)
    cycles = sub.add_parser("cycles", help="per-cycle live behaviour of loops (e.g. the two hack runs)")
    cycles.add_argument("runs", nargs="+", help="runs/<run> (or its realtime/ directory)")
    cycles.add_argument("--out", default=None)
    behaviours = sub.add_parser("behaviours", help="sessions that asked vs edited, and the reward of each (free questions)")
    behaviours.add_argument("run", help="runs/<run> (or its realtime/ directory)")
    behaviours.add_argument("--out", default=None)
    behaviours.add_argument("recipe_args", nargs=argparse.REMAINDER,
                            help="the loop's realtime_rl.py flags (--config <recipe> and its overrides): recompute "
                                 "the rewards with them")
    args = p.parse_args(argv)
    if args.command == "ab" and args.sessions < 1:
        p.error("--sessions must be at least 1")
    if args.command == "ab" and args.part_size < 1:
        p.error("--part-size must be at least 1")
    if args.command == "ab" and args.seed < 0:
        p.error("--seed must be >= 0")
    if args.command == "ab":
        from env.budget import BudgetError

        try:
            arm_budget(args)
        except BudgetError as e:
            p.error(str(e))
    return {"ab": cmd_ab, "cycles": cmd_cycles, "behaviours": cmd_behaviours}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
