"""Harness benchmark: workspace reset, per-tool latency, sandbox spawn overhead, episode throughput.

    python -m bench.harness [--tasks data/samples] [--reps 20] [--json out.json]

Targets (issue 2): workspace reset < 10 ms for a 50-file repo; sandboxed spawn <= 2x a bare
spawn; harness overhead (everything but the commands themselves) < 10% of an oracle episode.
Episodes are played by env.runner.run_tasks (the runner every stage uses), 1 and 4 at once.
Timings on a shared 2-core machine are noisy: compare medians from the same run.

Eval throughput, the one runner vs the process pool it replaced (measured in one script, old, new, new, old,
on the shared 2-core machine at load ~10-16; the tiny preset's base model with random weights, built by
`python -m nanocomposer.model build --out /tmp/base --corpus data/projects`, so every episode is one greedy
128-token turn; 5 sample tasks x 4 samples = 20 episodes):

    python eval.py --tasks samples --policy /tmp/base --samples 4 --temperature 0 --max-turns 8 \
        --max-new-tokens 128 --output out.json --workers W

    old eval.py (commit bfacb17: 2 worker processes, 1 torch thread each), --workers 2   0.47 and 0.91 episodes/s
    new eval.py (run_tasks, batched), OMP_NUM_THREADS=1, --workers 2                      0.57 episodes/s
    new eval.py, OMP_NUM_THREADS=1, --workers 20 (all 20 episodes in one batch)          1.84 episodes/s
    new eval.py, torch's default 2 threads, --workers 2                                   0.15 episodes/s

So 2.0x to 3.9x the old throughput (2.7x against the old runs' mean) once generation runs on one torch thread;
with torch's default threads an oversubscribed 2-core machine makes the in-process generation 6x slower
than the old pool (the RL rollout sets its generation threads for that reason: nanocomposer/rollout.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from data.oracle import OraclePolicy
from env.episode import EpisodeConfig
from env.runner import run_tasks
from env.sandbox import Sandbox, detect_backend
from env.tasks import load_task, load_task_set
from env.tools import CodeTools, call_tool
from env.workspace import make_workspace, remove_workspace


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def ms(xs: list[float]) -> dict:
    return {"p50_ms": round(pct(xs, 0.5) * 1000, 2), "p95_ms": round(pct(xs, 0.95) * 1000, 2)}


def bench_workspace(reps: int) -> dict:
    src = Path(tempfile.mkdtemp(prefix="bench-src-"))
    for i in range(50):
        (src / f"pkg{i % 5}").mkdir(exist_ok=True)
        (src / f"pkg{i % 5}" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    made: list[Path] = []
    copy = timed(lambda: made.append(make_workspace(src)), reps)
    remove = []
    for ws in made:
        t0 = time.perf_counter()
        remove_workspace(ws)
        remove.append(time.perf_counter() - t0)
    remove_workspace(src)
    return {"files": 50, "copy": ms(copy), "remove": ms(remove),
            "reset": ms([a + b for a, b in zip(copy, remove)])}


def bench_spawn(reps: int) -> dict:
    ws = Path(tempfile.mkdtemp(prefix="bench-spawn-"))
    sandbox = Sandbox(ws)
    py = [sys.executable, "-c", "pass"]
    bare = timed(lambda: subprocess.run(py, check=True), reps)
    boxed = timed(lambda: sandbox.run(py), reps)
    sandbox.close()
    remove_workspace(ws)
    return {"backend": sandbox.backend,
            "bare": ms(bare), "sandboxed": ms(boxed), "ratio_p50": round(pct(boxed, .5) / pct(bare, .5), 2)}


def bench_tools(task_dir: Path, reps: int) -> dict:
    task = load_task(task_dir)
    ws = make_workspace(task.repo_dir)
    tools = CodeTools(ws, task)
    first = min(p.relative_to(ws).as_posix() for p in ws.rglob("*.py"))
    calls = {
        "read_file": {"path": first},
        "edit_file": {"path": "bench_new.py", "old_str": "", "new_str": "X = 1\n"},
        "grep": {"pattern": "def "},
        "search": {"query": "parse the value and return the result"},
        "run": {"command": "true"},
        "lint": {"path": "."},
        "run_tests": {},
        "ask_user": {"question": "which file?"},
        "submit": {"summary": "done"},
    }
    out = {}
    for name, args in calls.items():
        def once(name=name, args=args):
            call_tool(tools, name, args)
            if name == "edit_file":
                (ws / "bench_new.py").unlink()
        n = max(3, reps // 4) if name in ("run_tests", "lint") else reps
        out[name] = ms(timed(once, n))
    remove_workspace(ws)
    return out


def bench_episodes(tasks: list, concurrency: int, rounds: int) -> dict:
    """Oracle episodes through env.runner.run_tasks, `concurrency` at once (tools in threads), `rounds` per task."""
    t0 = time.perf_counter()
    records = run_tasks(tasks, OraclePolicy, EpisodeConfig(), samples=rounds, concurrency=concurrency,
                        progress=False)
    wall = time.perf_counter() - t0
    episode_wall = sum(r["wall_s"] for r in records)
    command = sum(r["command_s"] for r in records)
    return {"concurrency": concurrency, "episodes": len(records), "episodes_per_s": round(len(records) / wall, 3),
            "solved": sum(r["solved"] for r in records),
            # Parallel calls overlap in time, so summed command time can exceed their wall share:
            # this overhead figure is a lower bound when episodes contain parallel commands.
            "harness_overhead_share": round(max(0.0, 1 - command / episode_wall), 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="data/samples")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2, help="passes over the task set per episode benchmark")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    tasks = [t for t in load_task_set(args.tasks) if t.gold_patch or t.gold_answer]
    results = {
        "backend": detect_backend(),
        "workspace": bench_workspace(args.reps),
        "spawn": bench_spawn(args.reps),
        "tools": bench_tools(tasks[0].root, args.reps),
        "episodes": [bench_episodes(tasks, c, args.rounds) for c in (1, 4)],
    }
    w, s = results["workspace"], results["spawn"]
    print(f"sandbox backend: {results['backend']}")
    print(f"workspace reset (50 files): p50 {w['reset']['p50_ms']} ms (copy {w['copy']['p50_ms']}, "
          f"remove {w['remove']['p50_ms']})   target < 10 ms")
    print(f"spawn python -c pass: bare {s['bare']['p50_ms']} ms, sandboxed {s['sandboxed']['p50_ms']} ms, "
          f"ratio {s['ratio_p50']}x   target <= 2x")
    print("tool latency (ms):  " + "  ".join(f"{k} {v['p50_ms']}/{v['p95_ms']}" for k, v in results["tools"].items())
          + "   (p50/p95)")
    for e in results["episodes"]:
        print(f"oracle episodes, {e['concurrency']} at once: {e['episodes_per_s']} episodes/s "
              f"({e['solved']}/{e['episodes']} solved), harness overhead {e['harness_overhead_share']:.1%}"
              f"   target < 10%")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
