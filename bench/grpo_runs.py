"""GRPO runs side by side, from their training logs: behaviour rates by window of steps, and each run against the
first, paired by step.

    python -m bench.grpo_runs runs/sl3-rl40-lr2e-4-s1 runs/sl3-rl40-lr2e-4-drop-s1 --out runs/claim3.md
    python -m bench.grpo_runs RUN... --metric behaviour/malformed_episode_rate --metric behaviour/edit_rate --window 10

Each RUN is a run directory (`runs/<run>`, whose `rl/` holds the GRPO output) or the GRPO output itself. The log is
the `trainer_state.json` of its newest checkpoint (TRL's `log_history`, one entry per step with train_rl.py's
`behaviour/*`, `exit/*` and `rewards/*` means over the step's episodes), so a run that was cut off is read up to its
last checkpoint.

Per run and metric: the mean over each window of steps (1-10, 11-20, ...), and the steps where every episode failed
(`behaviour/solve_rate` 0: the groups whose advantage is all shaping). Against the first run: the difference of
the means over the steps both logged, with a paired-bootstrap 95% interval over steps (`--from-step` restricts it
to the later steps, where a learned habit shows). Pairing by step is fair when the runs share their seed and task
set, so that step i trains on the same task in both: train_rl.py's sampled trajectories
(`trajectories/step-*.jsonl`) name each step's task, and the table says on how many of the steps both sampled the
tasks matched. A step's rate is over its few episodes (4 in the smol recipe), so the interval is over steps, not
episodes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from env.metrics import paired_bootstrap_interval
from nanocomposer.run_dir import list_checkpoints

DEFAULT_METRICS = ("behaviour/solve_rate", "behaviour/malformed_episode_rate", "behaviour/edit_rate",
                   "exit/max_turns", "exit/submitted", "behaviour/mean_turns")


def grpo_dir(run: Path) -> Path:
    """The GRPO output directory of `run` (a run directory holding rl/, or the output itself)."""
    return run / "rl" if (run / "rl").is_dir() else run


def step_logs(run: Path) -> dict[int, dict]:
    """{step: logged metrics} from the newest checkpoint whose trainer_state.json reads (the Trainer writes it last,
    so a save cut short by a kill is skipped, with a note); ValueError naming what is missing."""
    out = grpo_dir(run)
    skipped = []
    for checkpoint in list_checkpoints(out):
        try:
            history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            skipped.append(f"{checkpoint.name} ({type(e).__name__}: {e})")
            continue
        if skipped:
            print(f"bench.grpo_runs: {out}: skipped {', '.join(skipped)}; reading {checkpoint.name}", file=sys.stderr)
        return {int(h["step"]): h for h in history if isinstance(h, dict) and "step" in h and "behaviour/solve_rate" in h}
    raise ValueError(f"{out}: no checkpoint-* with a readable trainer_state.json"
                     + (f" ({', '.join(skipped)})" if skipped else " (is it a train_rl.py output or run directory?)"))


def step_tasks(run: Path) -> dict[int, set[str]]:
    """{step: task ids} from the sampled trajectories (train_rl.py counts them from 0; the trainer logs from 1)."""
    tasks: dict[int, set[str]] = {}
    for path in sorted((grpo_dir(run) / "trajectories").glob("step-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
                tasks.setdefault(int(record["step"]) + 1, set()).add(str(record["task_id"]))
            except (ValueError, KeyError, TypeError):
                continue
    return tasks


def compare(runs: list[Path], metrics: list[str], window: int = 10, from_step: int = 1) -> dict:
    """The numbers behind the table (module docstring)."""
    logs = [step_logs(r) for r in runs]
    out: dict = {"runs": [str(r) for r in runs], "window": window, "from_step": from_step, "metrics": {}}
    last = max(max(log, default=0) for log in logs)
    windows = [(s, min(s + window - 1, last)) for s in range(1, last + 1, window)]
    out["windows"] = windows
    out["steps"] = [len(log) for log in logs]
    out["all_fail_steps"] = [[s for s, h in sorted(log.items()) if float(h["behaviour/solve_rate"]) == 0.0]
                             for log in logs]
    base_tasks = step_tasks(runs[0])
    out["task_match"] = []
    for run in runs[1:]:
        other = step_tasks(run)
        both = sorted(set(base_tasks) & set(other))
        out["task_match"].append([sum(base_tasks[s] == other[s] for s in both), len(both)])
    for metric in metrics:
        rows = []
        for i, log in enumerate(logs):
            means = []
            for lo, hi in windows:
                vals = [float(log[s][metric]) for s in range(lo, hi + 1) if s in log and metric in log[s]]
                means.append(sum(vals) / len(vals) if vals else None)
            row: dict = {"run": str(runs[i]), "windows": means}
            if i:
                steps = sorted(s for s in set(logs[0]) & set(log) if s >= from_step
                               and metric in logs[0][s] and metric in log[s])
                if steps:
                    d, lo, hi = paired_bootstrap_interval([float(logs[0][s][metric]) for s in steps],
                                                          [float(log[s][metric]) for s in steps])
                    row["vs_first"] = {"diff": d, "ci95": [lo, hi], "steps": len(steps)}
            rows.append(row)
        out["metrics"][metric] = rows
    return out


def markdown(result: dict) -> str:
    runs = result["runs"]
    heads = [f"steps {lo}-{hi}" for lo, hi in result["windows"]]
    lines = [f"# GRPO runs against `{runs[0]}`", "",
             (f"Means of each step's rate by window of steps; Δ is each run minus the first over the steps both "
              f"logged from step {result['from_step']}, paired by step (bootstrap 95% over steps)."), ""]
    lines += ["| run | steps logged | all-fail steps | tasks matched where both sampled |", "|---|---|---|---|"]
    for i, run in enumerate(runs):
        match = "" if not i else "{} of {}".format(*result["task_match"][i - 1])
        fails = result["all_fail_steps"][i]
        lines.append(f"| `{run}` | {result['steps'][i]} | {len(fails)} ({', '.join(map(str, fails)) or 'none'}) | {match} |")
    for metric, rows in result["metrics"].items():
        lines += ["", f"## `{metric}`", "", "| run | " + " | ".join(heads) + " | Δ vs first |",
                  "|---|" + "---|" * (len(heads) + 1)]
        for row in rows:
            cells = ["" if v is None else f"{v:.3f}" for v in row["windows"]]
            vs = row.get("vs_first")
            delta = "" if not vs else f"{vs['diff']:+.3f} [{vs['ci95'][0]:+.3f}, {vs['ci95'][1]:+.3f}] ({vs['steps']} steps)"
            lines.append(f"| `{row['run']}` | " + " | ".join(cells) + f" | {delta} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (runs/<run>) or GRPO outputs; the first is the baseline")
    p.add_argument("--metric", action="append", help=f"a logged metric (repeatable; default {', '.join(DEFAULT_METRICS)})")
    p.add_argument("--window", type=int, default=10, help="steps per window (default 10)")
    p.add_argument("--from-step", type=int, default=1, help="first step of the paired difference (default 1)")
    p.add_argument("--out", type=Path, help="also write the table here (and the numbers beside it as .json)")
    args = p.parse_args(argv)
    if args.window < 1:
        p.error("--window must be >= 1")
    try:
        result = compare(args.runs, args.metric or list(DEFAULT_METRICS), args.window, args.from_step)
    except ValueError as e:
        print(f"bench.grpo_runs: {e}", file=sys.stderr)
        return 2
    text = markdown(result)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
