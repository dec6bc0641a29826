"""Agent server benchmark: simulated users against `agent.py serve`, nothing lost, and what the server adds.

    python -m bench.server [--sessions 200] [--workers 4] [--tasks samples] [--policy oracle]
                           [--recipe recipes/tiny/users.yaml] [--bare 40] [--json out.json]

1. Bare: `run_episode` on the same tasks in `--workers` threads (no server): episode wall time, episodes/s.
2. Served: a fresh server process (`--workers` workers, a temporary database and registry) and the simulated
   population (env/users.py) playing `--sessions` conversations (follow-ups come on top). Then the checks:
   every accepted session is in the database and ended, every feedback event sent is stored.
3. Latency: per session, what the user waited (POST to seeing the end) against the episode's own wall time
   inside the server; the difference is what the server adds (queue wait, staging, diff, database writes,
   long-poll delivery), reported with and without the queue wait.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.harness import pct
from env.episode import EpisodeConfig, run_episode
from env.task_sets import resolve_task_set
from env.users import Simulation, load_population
from nanocomposer.agent.serve import read_token
from nanocomposer.policies import build_policy

ROOT = Path(__file__).resolve().parents[1]


def stats_s(xs: list[float]) -> dict:
    return {"p50_s": round(pct(xs, 0.5), 3), "p95_s": round(pct(xs, 0.95), 3), "n": len(xs)} if xs else {}


def bench_bare(tasks, policy_spec: str, episodes: int, workers: int) -> dict:
    def one(i: int) -> float:
        return run_episode(tasks[i % len(tasks)], build_policy(policy_spec), EpisodeConfig()).wall_s

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        walls = list(pool.map(one, range(episodes)))
    wall = time.perf_counter() - t0
    return {"episodes": episodes, "workers": workers, "episodes_per_s": round(episodes / wall, 3),
            "episode_wall": stats_s(walls)}


def start_server(tmp: Path, policy: str, workers: int) -> tuple[subprocess.Popen, str]:
    """The server process and its URL; its token is in the file it prints (`read_token(db)`)."""
    cmd = [sys.executable, str(ROOT / "agent.py"), "serve", "--port", "0", "--workers", str(workers),
           "--max-queue", "1000", "--model", policy, "--db", str(tmp / "sessions.db"), "--registry",
           str(tmp / "registry")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "agent server on http://" not in line:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return proc, line.split()[3]


def check_database(db: Path, report: dict) -> dict:
    with sqlite3.connect(db) as conn:
        statuses = dict(conn.execute("SELECT status, COUNT(*) FROM sessions GROUP BY status").fetchall())
        stored = {r[0] for r in conn.execute("SELECT id FROM sessions")}
        feedback = conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0]
        turns = conn.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
    accepted = set(report["accepted_ids"])
    return {"accepted": len(accepted), "in_database": len(stored), "missing": len(accepted - stored),
            "not_ended": sum(n for s, n in statuses.items() if s in ("queued", "running", "waiting")),
            "statuses": statuses, "feedback_sent": report["feedback_sent"], "feedback_stored": feedback,
            "turns_stored": turns,
            "nothing_lost": accepted == stored and feedback == report["feedback_sent"]
            and not report["unfinished_after_drain"]}


def bench_served(tasks, policy: str, sessions: int, workers: int, recipe: str) -> dict:
    pop = load_population(recipe)
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        proc, url = start_server(Path(tmp), policy, workers)
        try:
            report = Simulation(url, tasks, pop, token=read_token(Path(tmp) / "sessions.db")).run(sessions)
            checks = check_database(Path(tmp) / "sessions.db", report)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    lat = report["latencies"]
    return {"conversations": sessions, "population": recipe, "users_concurrency": pop.concurrency,
            "wall_s": report["wall_s"], "sessions_per_s": report["sessions_per_s"], "checks": checks,
            "user_stats": report["stats"], "feedback_by_kind": report["feedback_by_kind"],
            "client_latency": stats_s([x["client_s"] for x in lat]),
            "episode_wall_in_server": stats_s([x["wall_s"] for x in lat if x["wall_s"] is not None]),
            "queue_wait": stats_s([x["queue_s"] for x in lat]),
            "added_by_server": stats_s([x["client_s"] - (x["wall_s"] or 0) for x in lat]),
            "added_by_server_excluding_queue": stats_s([x["client_s"] - (x["wall_s"] or 0) - x["queue_s"]
                                                        for x in lat])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--tasks", default="samples")
    p.add_argument("--policy", default="oracle")
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "tiny" / "users.yaml"))
    p.add_argument("--bare", type=int, default=40, help="bare run_episode episodes for the baseline")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    tasks = resolve_task_set(args.tasks).tasks
    result = {"tasks": args.tasks, "policy": args.policy,
              "bare": bench_bare(tasks, args.policy, args.bare, args.workers),
              "served": bench_served(tasks, args.policy, args.sessions, args.workers, args.recipe)}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["served"]["checks"]["nothing_lost"] else 1


if __name__ == "__main__":
    sys.exit(main())
