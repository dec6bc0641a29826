"""One cycle of simulated users (env/users.py) against the agent server, as its own process.

    python -m nanocomposer.realtime.traffic --server URL --tasks factory:val --sessions 40 \\
        --recipe recipes/tiny/users.yaml --seed 3 --offset 0 --report users.json

What env.users' own CLI does, plus what a loop of cycles needs: the population's seed is the cycle's, and
the task order is shuffled by it, so each cycle's users ask for different tasks (env.users takes conversation
i's task as tasks[i % len(tasks)] from a list sorted by id); `--offset` continues a cycle that was cut short
at its next conversation instead of replaying its first ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path

import httpx

from env.task_sets import resolve_task_set
from env.tasks import TaskError
from env.users import Simulation, load_population


def cycle_tasks(tasks: list, seed: int, offset: int) -> list:
    """The task order of a cycle: shuffled by `seed`, rotated by `offset` conversations."""
    order = list(tasks)
    random.Random(f"traffic:{seed}").shuffle(order)
    k = offset % len(order)
    return order[k:] + order[:k]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--tasks", required=True)
    p.add_argument("--sessions", type=int, required=True)
    p.add_argument("--recipe", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--report", required=True)
    args = p.parse_args(argv)
    try:
        pop = dataclasses.replace(load_population(args.recipe), seed=args.seed)
        tasks = cycle_tasks(resolve_task_set(args.tasks).tasks, args.seed, args.offset)
    except (ValueError, TaskError) as e:
        print(f"traffic: error: {e}", file=sys.stderr)
        return 2
    try:
        report = Simulation(args.server, tasks, pop).run(args.sessions)
    except httpx.HTTPError as e:
        print(f"traffic: error: server {args.server}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
