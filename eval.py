"""Harness-native benchmark: run a policy on a task set, each task in a fresh sandbox, and grade it.

    python eval.py --tasks data/samples --policy gold --output results.json
    python eval.py --tasks artifacts/data/tasks/test --policy oracle --output out.json --workers 2

results.json: {"summary": {n, solved, solve_rate, mean_turns, tool_calls, parallel_call_rate,
malformed_calls, exit_statuses, wall_s, ...}, "tasks": [{id, solved, exit_status, turns, tool_calls,
malformed_calls, wall_s, messages}]}. The grader is env.tasks.grade, the same one the RL
outcome reward calls.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from env.episode import EpisodeConfig, Trajectory, run_episode
from env.metrics import summarize
from env.policies import get_policy
from env.tasks import Task, TaskError, load_task_set

_WORKER_POLICY = None  # built once per worker process: loading a checkpoint costs seconds


def _init_worker(policy_spec: str, policy_kwargs: dict, threads: int | None) -> None:
    global _WORKER_POLICY
    if threads:
        import torch

        torch.set_num_threads(threads)
    _WORKER_POLICY = get_policy(policy_spec, **policy_kwargs)


def _run_one(args: tuple[str, EpisodeConfig]) -> Trajectory:
    from env.tasks import load_task

    task_dir, config = args
    return run_episode(load_task(task_dir), _WORKER_POLICY, config)


def policy_kwargs_for(spec: str, sampling: dict) -> dict:
    """Sampling settings apply to checkpoint policies; scripted ones take none."""
    return sampling if Path(spec).exists() else {}


def evaluate(tasks: list[Task], policy_spec: str, config: EpisodeConfig, workers: int = 1,
             progress: bool = True, sampling: dict | None = None) -> tuple[list[Trajectory], float]:
    """Run every task in a fresh sandbox; trajectories come back in task order."""
    from tqdm import tqdm

    kwargs = policy_kwargs_for(policy_spec, sampling or {})
    t0 = time.perf_counter()
    jobs = [(str(t.root), config) for t in tasks]
    bar = tqdm(total=len(jobs), desc=f"eval {Path(policy_spec).name or policy_spec}", unit="task",
               disable=not progress)
    results: list[Trajectory] = []
    if workers <= 1:
        _init_worker(policy_spec, kwargs, None)
        for job in jobs:
            results.append(_run_one(job))
            bar.update()
    else:  # one torch thread per worker: on 2 cores, two 1-thread workers beat one 2-thread worker
        threads = 1 if kwargs or Path(policy_spec).exists() else None
        with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker,
                                 initargs=(policy_spec, kwargs, threads)) as pool:
            for traj in pool.map(_run_one, jobs):
                results.append(traj)
                bar.update()
    bar.close()
    return results, time.perf_counter() - t0


def task_record(traj: Trajectory) -> dict:
    return {**traj.summary(), "submission": traj.submission, "error": traj.error, "grade": traj.grade,
            "turn_calls": [t["calls"] for t in traj.turns], "messages": traj.messages}


def print_table(summary: dict, trajectories: list[Trajectory], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("task", "solved", "exit", "turns", "calls", "malformed", "wall s"):
        table.add_column(col)
    for tr in trajectories:
        s = tr.summary()
        table.add_row(s["id"], "yes" if s["solved"] else "no", s["exit_status"], str(s["turns"]),
                      str(s["tool_calls"]), str(s["malformed_calls"]), f"{s['wall_s']:.2f}")
    console = Console()
    console.print(table)
    console.print(
        f"solved {summary['solved']}/{summary['n']} ({summary['solve_rate']:.1%}) | mean turns "
        f"{summary['mean_turns']:.2f} | tool calls {summary['tool_calls']} | parallel-call rate "
        f"{summary['parallel_call_rate']:.1%} | malformed {summary['malformed_calls']} | "
        f"exits {summary['exit_statuses']} | {summary['wall_s']:.1f} s")


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a temp file beside `path`, then rename: a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
    os.replace(tmp, path)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", required=True, help="a task directory or a directory of task directories")
    p.add_argument("--policy", required=True, help="gold | noop | oracle | replay:FILE | a checkpoint directory")
    p.add_argument("--output", required=True, help="results JSON path")
    p.add_argument("--workers", type=int, default=1, help="episodes run in parallel processes")
    p.add_argument("--max-turns", type=int, default=EpisodeConfig.max_turns)
    p.add_argument("--max-tokens", type=int, default=None, help="completion-token budget per episode")
    p.add_argument("--max-wall-s", type=float, default=EpisodeConfig.max_wall_s)
    p.add_argument("--max-output-chars", type=int, default=EpisodeConfig.max_output_chars)
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks (sorted by id)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per turn (checkpoint policies)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (checkpoint policies)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (checkpoint policies)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)

    def fail(msg: str) -> int:
        print(f"eval.py: error: {msg}", file=sys.stderr)
        return 2

    if args.workers < 1:
        return fail(f"--workers must be >= 1, got {args.workers}")
    output = Path(args.output)
    if not output.parent.is_dir():
        return fail(f"--output directory {str(output.parent)!r} does not exist")
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": args.seed}
    try:
        tasks = load_task_set(args.tasks)
        get_policy(args.policy, **policy_kwargs_for(args.policy, sampling))  # fail before any episode runs
    except (TaskError, ValueError, RuntimeError, OSError) as e:  # ModelLoadError is a RuntimeError
        return fail(str(e))
    tasks = tasks[: args.limit] if args.limit else tasks
    config = EpisodeConfig(max_turns=args.max_turns, max_tokens=args.max_tokens, max_wall_s=args.max_wall_s,
                           max_output_chars=args.max_output_chars)
    trajectories, wall_s = evaluate(tasks, args.policy, config, args.workers, progress=not args.quiet,
                                    sampling=sampling)
    summary = {**summarize(trajectories, wall_s), "policy": args.policy, "tasks": str(args.tasks)}
    write_json_atomic(output, {"summary": summary, "tasks": [task_record(t) for t in trajectories]})
    if not args.quiet:
        print_table(summary, trajectories, f"{args.policy} on {args.tasks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
