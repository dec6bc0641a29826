"""Eval throughput side by side in one run: the old process-pool eval.py against today's, on the same tasks.

    git worktree add /tmp/old bfacb17
    python -m bench.eval_speed --old /tmp/old --policy runs/demo-0557/sft --tasks DIR --limit 201 \\
        --arms old,new,new-noreuse --json out.json

Each arm is one eval.py process on the same task directory (a subset of `--limit` tasks, evenly spaced over
the set's sorted ids and copied to a temporary directory, so the old eval.py, whose --limit takes the first N,
plays the very same tasks), greedy, `--max-turns` x `--max-new-tokens`:

- `old`: `<--old>/eval.py --workers 2` (commit bfacb17: two worker processes, one torch thread each, one
  sequence at a time, every turn prefilled from the start of the conversation), run with this repository's venv
  and this repository's model architectures registered (so it loads today's checkpoints);
- `new`: this checkout's `eval.py --config recipes/tiny/eval.yaml --workers W` (one process, the runner,
  batched generation on one thread, the prefix cache: a turn prefills only what the episode's previous turn
  did not already hold);
- `new-noreuse`: the same with the prefix cache off (ModelPolicy's default set to 0 for that process), to
  attribute the gain;
- `new-nostream`: the same with continuous batching off (ModelPolicy.open_stream returns None, so the runner
  batches each round of waiting turns with act_batch and every turn of a round waits for the longest one);
- `new-threads2`: the same generating on 2 torch threads instead of 1;
- `new-processes2`: the same in 2 worker processes (`--processes 2`: each loads the checkpoint, generates on
  one thread and holds half of the --workers episodes; jobs come from one queue).

An arm may be listed several times (`old,new,new,old`): each run is reported, and per arm the median. Reported
per run: wall seconds of the eval process (model load included), episodes/s, CPU seconds of the process and
everything it waited for (its worker processes, sandboxed commands; so the old arm's two workers add up) and
episodes per CPU second, the ratios to `old` (medians), and the behaviour: tool-call validity, mean turns, exit statuses, and how many episodes wrote exactly the same
assistant messages as in the first arm (greedy CPU decoding may break near-ties differently across batch
shapes). Only ratios measured in one run mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ARMS = ("old", "new", "new-noreuse", "new-nostream", "new-threads2", "new-processes2")
# eval.py with one of ModelPolicy's speed-ups off (a subprocess: nothing here imports the stage script)
_RUN_EVAL = "sys.argv = ['eval.py', *sys.argv[1:]]; runpy.run_path('eval.py', run_name='__main__')"
PATCHED = {"new-noreuse": "import runpy, sys, nanocomposer.policy as p; p.DEFAULT_PREFIX_CACHE_POSITIONS = 0; "
                          + _RUN_EVAL,
           "new-nostream": "import runpy, sys, nanocomposer.policy as p; "
                           "p.ModelPolicy.open_stream = lambda self: None; " + _RUN_EVAL,
           "new-threads2": "import runpy, sys, nanocomposer.policies as p; p.GENERATION_CPU_THREADS = 2; "
                           + _RUN_EVAL}


# The old eval.py, with today's model architectures registered first (today's default base is a model type
# the old code predates; its forked worker processes inherit the registration). argv[1]: smeared_llama.py.
OLD_EVAL = ("import importlib.util, runpy, sys; "
            "spec = importlib.util.spec_from_file_location('bench_smeared_llama', sys.argv[1]); "
            "spec.loader.exec_module(importlib.util.module_from_spec(spec)); "
            "sys.argv = ['eval.py', *sys.argv[2:]]; runpy.run_path('eval.py', run_name='__main__')")


def task_dirs(root: Path) -> list[Path]:
    """The task directories directly under `root` (those holding task.json), sorted by name."""
    dirs = sorted(p for p in root.iterdir() if (p / "task.json").is_file())
    if not dirs:
        raise SystemExit(f"bench.eval_speed: no task directories (with task.json) directly under {str(root)!r}")
    return dirs


def evenly_spaced(items: list, n: int | None) -> list:
    if n is None or n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def arm_command(arm: str, args, tasks: Path, output: Path) -> tuple[list[str], Path]:
    """(argv, working directory) of one arm's eval process."""
    python = sys.executable
    budget = ["--max-turns", str(args.max_turns), "--max-new-tokens", str(args.max_new_tokens),
              "--temperature", "0", "--max-output-chars", "2000", "--max-wall-s", "300"]
    if arm == "old":
        return ([python, "-c", OLD_EVAL, str(REPO_ROOT / "nanocomposer" / "smeared_llama.py"), "--tasks", str(tasks),
                 "--policy", str(args.policy), "--workers", "2", "--backend", "transformers", "--output",
                 str(output), "--quiet", *budget], Path(args.old))
    head = [python, "-c", PATCHED[arm]] if arm in PATCHED else [python, "eval.py"]
    processes = "2" if arm == "new-processes2" else "1"
    return ([*head, "--config", "recipes/tiny/eval.yaml", "--tasks", str(tasks), "--policy", str(args.policy),
             "--workers", str(args.workers), "--processes", processes, "--backend", "transformers", "--output",
             str(output), "--quiet", *budget], REPO_ROOT)


def assistant_texts(record: dict) -> list[str]:
    return [m.get("content") or "" for m in record.get("messages", []) if m.get("role") == "assistant"]


def behaviour(results: dict) -> dict:
    s = results["summary"]
    return {"tool_call_validity": round(s["tool_call_validity"], 4), "mean_turns": round(s["mean_turns"], 3),
            "exit_statuses": s["exit_statuses"], "mean_completion_tokens": round(s["mean_completion_tokens"], 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="a checkout of the old eval (git worktree add DIR bfacb17)")
    p.add_argument("--policy", required=True, help="checkpoint directory")
    p.add_argument("--tasks", required=True, help="a directory of task directories (e.g. the held-out project tasks)")
    p.add_argument("--limit", type=int, default=None, help="N tasks evenly spaced over the sorted set (all if unset)")
    p.add_argument("--arms", default="old,new", help=f"comma-separated, in run order (repeats allowed), from "
                                                     f"{', '.join(ARMS)}")
    p.add_argument("--workers", type=int, default=8, help="episodes at once in the new arms")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    if bad := [a for a in arms if a not in ARMS]:
        p.error(f"--arms: unknown {bad} (choose from {', '.join(ARMS)})")
    if not (Path(args.old) / "eval.py").is_file():
        p.error(f"--old {args.old!r}: no eval.py there")
    args.policy = Path(args.policy).resolve()
    chosen = evenly_spaced(task_dirs(Path(args.tasks)), args.limit)
    work = Path(tempfile.mkdtemp(prefix="bench-eval-speed-"))
    try:
        tasks = work / "tasks"
        for d in chosen:
            shutil.copytree(d, tasks / d.name, symlinks=True)
        report = {"tasks": len(chosen), "source": str(args.tasks), "policy": str(args.policy),
                  "workers_new": args.workers, "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens,
                  "runs": [], "arms": {}}
        first_texts: dict | None = None
        for arm in arms:
            output = work / f"{arm}.json"
            command, cwd = arm_command(arm, args, tasks, output)
            t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(command, check=False, cwd=cwd, capture_output=True, text=True)
            wall, cpu1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
            if done.returncode != 0:
                raise SystemExit(f"bench.eval_speed: arm {arm} failed (exit {done.returncode}): "
                                 f"{done.stderr.strip().splitlines()[-1:]}")
            results = json.loads(output.read_text())
            texts = {r["id"]: assistant_texts(r) for r in results["tasks"]}
            first_texts = first_texts or texts
            n = len(results["tasks"])
            row = {"arm": arm, "wall_s": round(wall, 1), "episodes": n, "episodes_per_s": round(n / wall, 4),
                   "cpu_s": round(cpu, 1), "episodes_per_cpu_s": round(n / cpu, 4), **behaviour(results),
                   "same_assistant_messages_as_first_arm": sum(texts[k] == first_texts.get(k) for k in texts)}
            report["runs"].append(row)
            print(f"{arm}: {row}", flush=True)
        for arm in dict.fromkeys(arms):
            runs = [r for r in report["runs"] if r["arm"] == arm]
            report["arms"][arm] = {key: statistics.median(r[key] for r in runs)
                                   for key in ("episodes_per_s", "episodes_per_cpu_s")}
        if "old" in report["arms"]:
            base = report["arms"]["old"]
            for row in report["arms"].values():
                row["x_old"] = round(row["episodes_per_s"] / base["episodes_per_s"], 3)
                row["x_old_per_cpu_s"] = round(row["episodes_per_cpu_s"] / base["episodes_per_cpu_s"], 3)
        print(json.dumps(report, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
