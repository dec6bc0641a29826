"""Harness-native benchmark: run policies on task sets, each episode in a fresh sandbox, graded by env.tasks.grade.

    python eval.py --tasks samples --policy gold --output results.json
    python eval.py --tasks factory:test humaneval --policy runs/demo/sft --output sft.json --workers 2
    python eval.py --tasks factory:test --policy runs/demo/rl --samples 4 --temperature 0.8 --output rl.json
    python eval.py --tasks factory:test humaneval:40 --compare runs/demo/cpt runs/demo/sft runs/demo/rl \\
        --out-dir runs/demo/eval --wandb --run demo
    python eval.py --config recipes/tiny/eval.yaml --workers 2          # flags override the YAML

Task sets (env/task_sets.py): `samples`, `factory:<split>[/<family>][/<tier>]`, `humaneval[:N]` (external:
reported beside ours, never trained on), or any task directory. Policies: gold | noop | oracle |
replay:FILE | a checkpoint directory (from_pretrained or PEFT adapter) or hub id, generated with transformers
or, on a GPU with vllm installed, vLLM (--backend; auto picks vllm there). The vllm backend runs all episodes in
one process (one engine holds the GPU; --workers > 1 falls back to 1 with a warning), needs merged checkpoints
(not adapters), and takes $NANOCOMPOSER_VLLM_GPU_MEMORY (default 0.85) of the GPU; it is tested against a fake
vllm module on CPU and has not yet been run on a GPU by us.

results.json: {"summary": {n, solved, solve_rate, solve_rate_ci95, pass@1..k, mean_turns, tool_calls,
tool_call_validity, parallel_call_rate, malformed_calls, ask_user_rate, mean_completion_tokens,
exit_statuses, tool_mix, turn_share, episode_wall_s, wall_s, task_sets: {name: {...same...}}, config},
"tasks": [{id, task_set, sample, seed, solved, exit_status, turns, tool_calls, malformed_calls, wall_s,
turn_calls, messages, ...}]}. Metric definitions: env/metrics.py.

--compare writes to --out-dir: <label>/results.json per policy, compare.json, compare.md, solve_rate.png
and tool_mix.png; all policies run the same tasks with the same seeds, and differences from the first
policy come with paired-bootstrap 95% intervals.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from env.episode import EpisodeConfig, Trajectory, run_episode
from env.metrics import BOOTSTRAP_RESAMPLES, CATEGORIES, compare_paired, summarize
from env.task_sets import TaskSet, resolve_task_set
from env.tasks import Task, TaskError
from nanocomposer.policies import (
    BACKENDS,
    SAMPLING_KEYS,
    build_policy,
    is_scripted,
    policy_label,
    resolve_backend,
    seed_policy,
    single_process_workers,
)

WANDB_PROJECT = "nanocomposer"
_WORKER_POLICY = None  # built once per worker process: loading a checkpoint costs seconds


def _init_worker(policy_spec: str, sampling: dict, threads: int | None, backend: str = "auto") -> None:
    global _WORKER_POLICY
    if threads:
        import torch

        torch.set_num_threads(threads)
    _WORKER_POLICY = build_policy(policy_spec, sampling, backend)


def _run_one(job: tuple[str, EpisodeConfig, int]) -> Trajectory:
    from env.tasks import load_task

    task_dir, config, seed = job
    seed_policy(_WORKER_POLICY, seed)
    return run_episode(load_task(task_dir), _WORKER_POLICY, config)


def evaluate(tasks: list[Task], policy_spec: str, config: EpisodeConfig, workers: int = 1,
             progress: bool = True, sampling: dict | None = None, samples: int = 1,
             backend: str = "auto") -> tuple[list[Trajectory], float]:
    """Run every task `samples` times (seeds seed..seed+samples-1), each episode in a fresh sandbox.

    Trajectories come back task-major, sample-minor, whatever the worker count.
    """
    from tqdm import tqdm

    global _WORKER_POLICY
    sampling = dict(sampling or {})
    base_seed = int(sampling.pop("seed", 0) or 0)
    if not is_scripted(policy_spec):
        backend = resolve_backend(backend)
        workers = single_process_workers(workers, [policy_spec], backend)
    t0 = time.perf_counter()
    jobs = [(str(t.root), config, base_seed + s) for t in tasks for s in range(samples)]
    bar = tqdm(total=len(jobs), desc=f"eval {policy_label(policy_spec)}", unit="episode", disable=not progress)
    results: list[Trajectory] = []
    if workers <= 1:
        _init_worker(policy_spec, sampling, None, backend)
        try:
            for job in jobs:
                results.append(_run_one(job))
                bar.update()
        finally:  # a vLLM engine holds the GPU until closed: the next policy of a --compare needs it
            if hasattr(_WORKER_POLICY, "close"):
                _WORKER_POLICY.close()
                _WORKER_POLICY = None
    else:  # one torch thread per worker: on 2 cores, two 1-thread workers beat one 2-thread worker
        threads = None if is_scripted(policy_spec) else 1
        with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker,
                                 initargs=(policy_spec, sampling, threads, backend)) as pool:
            for traj in pool.map(_run_one, jobs):
                results.append(traj)
                bar.update()
    bar.close()
    return results, time.perf_counter() - t0


def task_record(traj: Trajectory, **extra) -> dict:
    return {**traj.summary(), **extra, "submission": traj.submission, "error": traj.error, "grade": traj.grade,
            "turn_calls": [t["calls"] for t in traj.turns], "messages": traj.messages}


# --------------------------------------------------------------------------- one policy


def run_benchmark(task_sets: list[TaskSet], policy_spec: str, config: EpisodeConfig, *, workers: int = 1,
                  sampling: dict | None = None, samples: int = 1, backend: str = "auto",
                  progress: bool = True) -> dict:
    """results.json for one policy on several task sets: overall and per-set summaries, one record per episode."""
    tasks = [t for ts in task_sets for t in ts.tasks]
    trajectories, wall_s = evaluate(tasks, policy_spec, config, workers, progress, sampling, samples, backend)
    seed = int((sampling or {}).get("seed", 0) or 0)
    records, i = [], 0
    for ts in task_sets:
        for task in ts.tasks:
            for s in range(samples):
                records.append(task_record(trajectories[i], task_set=ts.name, sample=s, seed=seed + s,
                                           family=task.meta.get("family"), tier=task.meta.get("tier")))
                i += 1
    per_set = {}
    for ts in task_sets:
        recs = [r for r in records if r["task_set"] == ts.name]
        per_set[ts.name] = {**summarize(recs, sum(r["wall_s"] for r in recs)), "kind": ts.kind, "label": ts.label,
                            "source": ts.source}
    summary = {**summarize(records, wall_s), "policy": policy_spec, "label": policy_label(policy_spec),
               "tasks": " ".join(ts.name for ts in task_sets), "task_sets": per_set,
               "config": {"samples": samples, "seed": seed, "workers": workers, "backend": backend,
                          "sampling": {k: v for k, v in (sampling or {}).items() if k in SAMPLING_KEYS},
                          "episode": {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                                      if f.repr}}}
    return {"summary": summary, "tasks": records}


def print_table(results: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=title)
    for col in ("task", "set", "sample", "solved", "exit", "turns", "calls", "malformed", "wall s"):
        table.add_column(col)
    for r in results["tasks"]:
        table.add_row(r["id"], r["task_set"], str(r["sample"]), "yes" if r["solved"] else "no", r["exit_status"],
                      str(r["turns"]), str(r["tool_calls"]), str(r["malformed_calls"]), f"{r['wall_s']:.2f}")
    console.print(table)
    for name, s in [*results["summary"]["task_sets"].items(), ("all", results["summary"])]:
        label = s.get("label", name)
        lo, hi = s["solve_rate_ci95"]
        console.print(
            f"[bold]{label}[/bold]: solved {s['solved']}/{s['n']} ({s['solve_rate']:.1%}, 95% CI {lo:.1%}-{hi:.1%})"
            f" | validity {s['tool_call_validity']:.1%} | mean turns {s['mean_turns']:.2f} | parallel "
            f"{s['parallel_call_rate']:.1%} | malformed {s['malformed_calls']} | exits {s['exit_statuses']} | "
            f"{s['wall_s']:.1f} s")


# --------------------------------------------------------------------------- comparison


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def build_comparison(results: dict[str, dict], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict:
    """compare.json: per-policy summaries and, for every other policy, its difference from the first one."""
    labels = list(results)
    baseline = labels[0]
    set_names = list(results[baseline]["summary"]["task_sets"])
    scopes = ["all", *set_names]

    def records(label: str, scope: str) -> list[dict]:
        recs = results[label]["tasks"]
        return [dict(r, id=f"{r['task_set']}::{r['id']}") for r in recs if scope == "all" or r["task_set"] == scope]

    def summary(label: str, scope: str) -> dict:
        s = results[label]["summary"]
        return s if scope == "all" else s["task_sets"][scope]

    keep = ("n", "n_tasks", "solved", "solve_rate", "solve_rate_ci95", "tool_call_validity", "mean_turns",
            "mean_completion_tokens", "parallel_call_rate", "ask_user_rate", "malformed_calls", "exit_statuses",
            "tool_mix", "turn_share", "episode_wall_s", "wall_s", "kind", "label")
    return {
        "baseline": baseline,
        "task_sets": {name: results[baseline]["summary"]["task_sets"][name]["label"] for name in set_names},
        "config": results[baseline]["summary"]["config"],
        "policies": {label: {"spec": results[label]["summary"]["policy"],
                             "metrics": {scope: {k: v for k, v in summary(label, scope).items()
                                                 if k in keep or k.startswith("pass@")} for scope in scopes}}
                     for label in labels},
        "differences": {label: {scope: compare_paired(records(baseline, scope), records(label, scope), resamples, seed)
                                for scope in scopes}
                        for label in labels[1:]},
    }


def comparison_markdown(comparison: dict) -> str:
    labels = list(comparison["policies"])
    base = comparison["baseline"]
    lines = [f"# Eval comparison (baseline: {base})", "",
             (f"Same tasks and seeds for every policy ({comparison['config']['samples']} sample(s) per task, "
              f"seed {comparison['config']['seed']}). Solve rates with Wilson 95% intervals; differences from "
              f"{base} with paired-bootstrap 95% intervals over tasks."), ""]
    scopes = ["all", *comparison["task_sets"]]
    scope_label = {"all": "all tasks", **comparison["task_sets"]}
    lines += ["## Solve rate", "", "| task set | " + " | ".join(labels) + " |",
              "|---|" + "---|" * len(labels)]
    for scope in scopes:
        cells = []
        for label in labels:
            m = comparison["policies"][label]["metrics"][scope]
            lo, hi = m["solve_rate_ci95"]
            cell = f"{_pct(m['solve_rate'])} [{_pct(lo)}, {_pct(hi)}]"
            if label != base:
                d = comparison["differences"][label][scope]
                cell += f"<br>Δ {d['diff']:+.1%} [{d['ci95'][0]:+.1%}, {d['ci95'][1]:+.1%}]"
            cells.append(cell)
        lines.append(f"| {scope_label[scope]} (n={comparison['policies'][base]['metrics'][scope]['n_tasks']}) | "
                     + " | ".join(cells) + " |")
    rows = [("tool-call validity", lambda m: _pct(m["tool_call_validity"])),
            ("mean turns", lambda m: _num(m["mean_turns"])),
            ("mean completion tokens", lambda m: _num(m["mean_completion_tokens"], 0)),
            ("parallel-call rate", lambda m: _pct(m["parallel_call_rate"])),
            ("ask_user rate", lambda m: _pct(m["ask_user_rate"])),
            ("malformed calls", lambda m: str(m["malformed_calls"])),
            ("wall s / episode", lambda m: _num(m["episode_wall_s"].get("mean"))),
            ("exit statuses", lambda m: ", ".join(f"{k} {v}" for k, v in m["exit_statuses"].items())),
            *[(f"turns: {c}", lambda m, c=c: _pct(m["turn_share"].get(c, 0.0))) for c in CATEGORIES]]
    extra = sorted({k for label in labels for k in comparison["policies"][label]["metrics"]["all"]
                    if k.startswith("pass@") and k != "pass@1"}, key=lambda k: int(k[5:]))
    rows[1:1] = [(k, lambda m, k=k: _pct(m.get(k))) for k in extra]
    lines += ["", "## Behaviour (all tasks)", "", "| metric | " + " | ".join(labels) + " |",
              "|---|" + "---|" * len(labels)]
    for name, fmt in rows:
        lines.append(f"| {name} | " + " | ".join(fmt(comparison["policies"][label]["metrics"]["all"])
                                               for label in labels) + " |")
    return "\n".join(lines) + "\n"


def plot_comparison(comparison: dict, out_dir: Path) -> list[Path]:
    """solve_rate.png (per policy, one line per task set, Wilson error bars) and tool_mix.png (turn shares)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(comparison["policies"])
    x = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(3.6 + 1.3 * len(labels), 3.6), dpi=110)
    scopes = ["all", *comparison["task_sets"]] if len(comparison["task_sets"]) > 1 else list(comparison["task_sets"])
    for j, scope in enumerate(scopes):
        offset = 0.06 * (j - (len(scopes) - 1) / 2)  # side by side, so the error bars do not hide each other
        ms = [comparison["policies"][label]["metrics"][scope] for label in labels]
        rates = [m["solve_rate"] for m in ms]
        err = [[r - m["solve_rate_ci95"][0] for r, m in zip(rates, ms)],
               [m["solve_rate_ci95"][1] - r for r, m in zip(rates, ms)]]
        ax.errorbar([i + offset for i in x], rates, yerr=err, marker="o", capsize=3,
                    label="all tasks" if scope == "all" else comparison["task_sets"][scope])
    ax.set_xticks(x, labels, rotation=20, ha="right")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("solve rate (95% CI)")
    ax.set_title("Solve rate per policy")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    solve_png = out_dir / "solve_rate.png"
    fig.savefig(solve_png, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.45 * len(labels)), dpi=110)
    left = [0.0] * len(labels)
    for category in CATEGORIES:
        shares = [comparison["policies"][label]["metrics"]["all"]["turn_share"].get(category, 0.0) for label in labels]
        if any(shares):
            ax.barh(labels, shares, left=left, label=category)
            left = [a + b for a, b in zip(left, shares)]
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of turns")
    ax.set_title("How turns are spent")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    mix_png = out_dir / "tool_mix.png"
    fig.savefig(mix_png, bbox_inches="tight")
    plt.close(fig)
    return [solve_png, mix_png]


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label.replace("/", "__")).strip("_") or "policy"


# --------------------------------------------------------------------------- W&B


def flatten_metrics(summary: dict, prefix: str = "") -> dict:
    """Numeric leaves of a summary as `a/b/c` keys (W&B charts and run comparison read these)."""
    out = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_metrics(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
        elif isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
            out[f"{name}_lo"], out[f"{name}_hi"] = value
    return out


def wandb_log(run_group: str, name: str, directory: Path, config: dict, summary: dict,
              tables: dict[str, tuple[list[str], list[list]]] | None = None, images: list[Path] = ()) -> str:
    """One offline (unless WANDB_MODE says otherwise) W&B run, job_type eval; returns the run directory."""
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    run = wandb.init(project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), group=run_group, job_type="eval",
                     name=name, dir=str(directory), config=config, reinit="finish_previous")
    try:
        metrics = flatten_metrics({k: v for k, v in summary.items() if k != "config"})
        run.summary.update(metrics)
        log = {key: wandb.Table(columns=columns, data=rows) for key, (columns, rows) in (tables or {}).items()}
        log.update({p.stem: wandb.Image(str(p)) for p in images})
        if log:
            run.log(log)
        return str(Path(run.dir).parent)
    finally:
        run.finish()


def _task_table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["task_set", "id", "sample", "solved", "exit_status", "turns", "tool_calls", "malformed_calls", "wall_s"]
    return columns, [[r[c] for c in columns] for r in results["tasks"]]


def _compare_table(comparison: dict) -> tuple[list[str], list[list]]:
    columns = ["policy", "scope", "solve_rate", "ci_lo", "ci_hi", "diff_vs_baseline", "diff_lo", "diff_hi",
               "tool_call_validity", "mean_turns", "parallel_call_rate"]
    rows = []
    for label, p in comparison["policies"].items():
        for scope, m in p["metrics"].items():
            d = comparison["differences"].get(label, {}).get(scope)
            rows.append([label, scope, m["solve_rate"], *m["solve_rate_ci95"],
                         d["diff"] if d else 0.0, *(d["ci95"] if d else [0.0, 0.0]),
                         m["tool_call_validity"], m["mean_turns"], m["parallel_call_rate"]])
    return columns, rows


# --------------------------------------------------------------------------- CLI


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a temp file beside `path`, then rename: a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
    os.replace(tmp, path)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="YAML of any of these options (keys as dest names); flags override")
    p.add_argument("--tasks", nargs="+", default=None,
                   help="task sets: samples | factory:<split>[/<family>][/<tier>] | humaneval[:N] | a directory")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--policy", default=None, help="gold | noop | oracle | replay:FILE | a checkpoint directory")
    who.add_argument("--compare", nargs="+", default=None, metavar="POLICY",
                     help="several policies on the same tasks and seeds; the first is the baseline")
    p.add_argument("--output", default=None, help="results JSON path (--policy)")
    p.add_argument("--out-dir", default=None, help="comparison outputs (--compare)")
    p.add_argument("--workers", type=int, default=1, help="episodes run in parallel processes")
    p.add_argument("--samples", type=int, default=1, help="episodes per task, seeds seed..seed+k-1 (pass@1..k)")
    p.add_argument("--seed", type=int, default=0, help="first sampling seed (checkpoint policies, oracle)")
    p.add_argument("--max-turns", type=int, default=EpisodeConfig.max_turns)
    p.add_argument("--max-tokens", type=int, default=None, help="completion-token budget per episode")
    p.add_argument("--max-wall-s", type=float, default=EpisodeConfig.max_wall_s)
    p.add_argument("--max-output-chars", type=int, default=EpisodeConfig.max_output_chars)
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks of each set (sorted by id)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per turn (checkpoint policies)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (checkpoint policies)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-context", type=int, default=None, help="default: the model's position limit")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="generation backend for checkpoint policies: auto = vllm on a GPU with vllm installed, "
                        "else transformers; vllm runs episodes in one process and reserves "
                        "$NANOCOMPOSER_VLLM_GPU_MEMORY (default 0.85) of the GPU (tested on CPU against a fake "
                        "vllm only, not yet on a GPU)")
    p.add_argument("--tasks-root", default=None, help="task factory output for factory:* ($NANOCOMPOSER_TASKS)")
    p.add_argument("--humaneval-dir", default=None, help="HumanEval task cache ($NANOCOMPOSER_HUMANEVAL)")
    p.add_argument("--bootstrap", type=int, default=BOOTSTRAP_RESAMPLES, help="resamples for difference intervals")
    p.add_argument("--wandb", action="store_true", help="log to W&B (offline unless WANDB_MODE is set)")
    p.add_argument("--run", default="eval", help="W&B group (the pipeline run name)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    return p


def load_config(path: str, parser: argparse.ArgumentParser) -> dict:
    """YAML options as parser defaults (so flags still win); unknown keys and bad types name the file."""
    where = f"--config {path}"
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{where}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of option: value, got {type(data).__name__}")  # noqa: TRY004
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    values = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in actions:
            raise ValueError(f"{where}: unknown option {key!r} (options: {', '.join(sorted(actions))})")
        action = actions[dest]
        if action.nargs == "+":
            value = [str(v) for v in value] if isinstance(value, list) else str(value).split()
        elif value is not None and action.type is not None:
            try:
                value = action.type(value)
            except (TypeError, ValueError):
                raise ValueError(f"{where}: {key}: {value!r} is not a valid {action.type.__name__}") from None
        if action.choices is not None and value not in action.choices:
            raise ValueError(f"{where}: {key}: {value!r} is not one of {', '.join(map(str, action.choices))}")
        values[dest] = value
    if values.get("policy") and values.get("compare"):
        raise ValueError(f"{where}: give policy or compare, not both")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser()
    pre, _ = parser.parse_known_args(argv)
    if pre.config:
        try:
            config = load_config(pre.config, parser)
        except ValueError as e:
            parser.error(str(e))
        if config.get("policy") or config.get("compare"):  # a flag for the other one replaces it
            given = argv if argv is not None else sys.argv[1:]
            if "--policy" in given:
                config.pop("compare", None)
            if "--compare" in given:
                config.pop("policy", None)
        parser.set_defaults(**config)
    args = parser.parse_args(argv)
    if not args.tasks:
        parser.error("--tasks is required (on the command line or in --config)")
    if not (args.policy or args.compare):
        parser.error("one of --policy or --compare is required")
    if args.policy and args.compare:
        parser.error("--policy and --compare are mutually exclusive")
    if args.policy and not args.output:
        parser.error("--policy needs --output")
    if args.compare and not args.out_dir:
        parser.error("--compare needs --out-dir")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def fail(msg: str) -> int:
        print(f"eval.py: error: {msg}", file=sys.stderr)
        return 2

    for name in ("workers", "samples", "bootstrap"):
        if getattr(args, name) < 1:
            return fail(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.output and not Path(args.output).parent.is_dir():
        return fail(f"--output directory {str(Path(args.output).parent)!r} does not exist")
    specs = args.compare or [args.policy]
    labels = [policy_label(s) for s in specs]
    if len(set(labels)) != len(labels):
        return fail(f"--compare: two policies share a label ({labels}); labels are the paths' last two parts")
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
                "max_context": args.max_context, "seed": args.seed}
    backend = args.backend
    try:
        task_sets = [resolve_task_set(s, tasks_root_dir=args.tasks_root, humaneval_dir=args.humaneval_dir)
                     for s in args.tasks]
        if any(not is_scripted(s) for s in specs):  # scripted-only evals need no torch
            backend = resolve_backend(args.backend)
        for spec in specs:  # every policy must load before any episode runs (a vLLM engine starts later, once)
            build_policy(spec, sampling, backend, start_engine=False)
    except (TaskError, ValueError, RuntimeError, OSError) as e:  # ModelLoadError, BackendUnavailable: RuntimeError
        return fail(str(e))
    workers = single_process_workers(args.workers, specs, backend)
    if args.limit:
        task_sets = [dataclasses.replace(ts, tasks=ts.tasks[: args.limit]) for ts in task_sets]
    if args.samples > 1 and args.temperature == 0 and any(not is_scripted(s) for s in specs):
        print("eval.py: warning: --samples > 1 with --temperature 0 (greedy) repeats identical episodes",
              file=sys.stderr)
    config = EpisodeConfig(max_turns=args.max_turns, max_tokens=args.max_tokens, max_wall_s=args.max_wall_s,
                           max_output_chars=args.max_output_chars)
    run_kwargs = {"workers": workers, "sampling": sampling, "samples": args.samples, "backend": backend,
                  "progress": not args.quiet}
    if args.policy:
        results = run_benchmark(task_sets, args.policy, config, **run_kwargs)
        output = Path(args.output)
        write_json_atomic(output, results)
        if not args.quiet:
            print_table(results, f"{args.policy} on {' '.join(args.tasks)}")
        if args.wandb:
            wandb_log(args.run, f"{args.run}-eval-{labels[0]}", output.parent, results["summary"]["config"],
                      results["summary"], {"episodes": _task_table(results)})
        return 0

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for spec, label in zip(specs, labels):
        results[label] = run_benchmark(task_sets, spec, config, **run_kwargs)
        (out_dir / slug(label)).mkdir(exist_ok=True)
        write_json_atomic(out_dir / slug(label) / "results.json", results[label])
    comparison = build_comparison(results, resamples=args.bootstrap, seed=args.seed)
    write_json_atomic(out_dir / "compare.json", comparison)
    markdown = comparison_markdown(comparison)
    (out_dir / "compare.md").write_text(markdown, encoding="utf-8")
    plots = plot_comparison(comparison, out_dir)
    if not args.quiet:
        print(markdown)
        print(f"wrote {out_dir}/compare.json, compare.md, {', '.join(p.name for p in plots)}")
    if args.wandb:
        for label in labels:  # one run per policy: W&B's run comparison lines them up
            wandb_log(args.run, f"{args.run}-eval-{label}", out_dir, {**comparison["config"], "policy": label},
                      results[label]["summary"])
        wandb_log(args.run, f"{args.run}-eval-compare", out_dir, {**comparison["config"], "policies": labels},
                  {"differences": comparison["differences"]}, {"compare": _compare_table(comparison)}, plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
