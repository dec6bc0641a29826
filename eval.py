"""Harness-native benchmark: run policies on task sets, each episode in a fresh sandbox, graded by env.grading.grade.

    python eval.py --tasks samples --policy gold --output results.json
    python eval.py --tasks factory:test humaneval --policy runs/demo/sft --output sft.json --workers 8
    python eval.py --tasks factory:test --policy runs/demo/rl --samples 4 --temperature 0.8 --output rl.json
    python eval.py --tasks factory:test humaneval:40 --compare runs/demo/cpt runs/demo/sft runs/demo/rl \\
        --out-dir runs/demo/eval --wandb --run demo
    python eval.py --config recipes/smol/eval.yaml --policy runs/demo/sft --output sft.json   # flags override
    python eval.py ... --resume                # continue a killed run from its episodes file

Task sets (env/task_sets.py): `samples`, `factory:<split>[/<family>][/<tier>]`, `humaneval[:N]` (external:
reported beside ours, never trained on), or any task directory. Policies: gold | noop | oracle |
replay:FILE | a checkpoint directory (from_pretrained or PEFT adapter) or hub id, generated with transformers
or, on a GPU with vllm installed, vLLM (--backend; auto picks vllm there; vLLM needs merged checkpoints and
takes $NANOCOMPOSER_VLLM_GPU_MEMORY, default 0.85, of the GPU). Episodes are played by env.runner.run_tasks
in this one process: --workers episodes at once, their tools in threads; a policy that batches generation
gets the turns of all waiting episodes in one call, and one that cannot runs episodes one at a time.
--processes N splits them over N worker processes, each loading the policy (CPU generation on N cores).
Budgets and sampling (--max-turns, --max-new-tokens, --temperature, ...) are env.budget.Budget's fields.

Outputs: results.json {"summary": {n, solved, solve_rate, solve_rate_ci95, pass@1..k, mean_turns, tool_calls,
tool_call_validity, parallel_call_rate, malformed_calls, ask_user_rate, mean_completion_tokens, exit_statuses,
tool_mix, turn_share, episode_wall_s, wall_s, task_sets: {name: {...same...}}, config}, "tasks": [one
Trajectory.to_record per episode: id, task_set, sample, seed, solved, exit_status, error, n_turns, turns
(with each turn's text: `replay:` reads them), messages, ...]}, and beside it <name>.episodes.jsonl, the
same records appended as episodes finish, with <name>.episodes.jsonl.run.json, the settings they were played
with: --resume continues from them (and refuses other settings). Metric definitions: env/metrics.py.
Bad arguments fail before any work with one line and exit status 2; Ctrl-C (or SIGTERM) exits 130 with
the finished episodes on disk and one line saying how to resume.

--compare writes to --out-dir: <label>/results.json (+ episodes.jsonl) per policy, compare.json, compare.md,
solve_rate.png and tool_mix.png; all policies run the same tasks with the same seeds, and differences from
the first policy come with paired-bootstrap 95% intervals (nanocomposer/reporting.py).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from data.humaneval import ensure_humaneval
from env.budget import Budget
from env.episode import EpisodeConfig, Trajectory
from env.metrics import BOOTSTRAP_RESAMPLES
from env.results import ResultsFileError
from env.runner import Interrupted, ProcessFailed, TaskRef
from env.task_sets import TaskSet, humaneval_cache, resolve_task_set
from env.tasks import Task, TaskError, spread_subset
from nanocomposer import reporting
from nanocomposer.config import RecipeParser
from nanocomposer.policies import (
    POLICY_BACKENDS,
    build_policy,
    is_scripted,
    needs_torch,
    policy_label,
    resolve_backend,
    run_policy,
)

__all__ = ["main", "make_parser", "parse_args", "resolve_backend", "run_benchmark"]


@dataclass
class EvalArguments:
    """What to evaluate and where the results go; budgets and sampling are env.budget.Budget's."""

    tasks: list[str] | None = field(default=None, metadata={
        "help": "task sets: samples | factory:<split>[/<family>][/<tier>] | humaneval[:N] | a directory"})
    policy: str | None = field(default=None, metadata={
        "help": "gold | noop | oracle | replay:FILE | a checkpoint directory or hub id"})
    compare: list[str] | None = field(default=None, metadata={
        "help": "several policies on the same tasks and seeds; the first is the baseline"})
    output: str | None = field(default=None, metadata={"help": "results JSON path (--policy)"})
    out_dir: str | None = field(default=None, metadata={"help": "comparison outputs (--compare)"})
    resume: bool = field(default=False, metadata={"help": "skip the episodes already in the episodes file"})
    workers: int = field(default=4, metadata={"help": "episodes played at once (threads; generation batched)"})
    processes: int = field(default=1, metadata={
        "help": "worker processes, each with its own copy of the policy and a share of --workers: on a CPU, "
                "generation on that many cores (the vllm backend stays in 1)"})
    samples: int = field(default=1, metadata={"help": "episodes per task, seeds seed..seed+k-1 (pass@1..k)"})
    limit: int | None = field(default=None, metadata={
        "help": "only N tasks of each set, evenly spaced over it by id (so every family of a mixed set is in)"})
    backend: str = field(default="auto", metadata={"help": "generation backend for checkpoints: auto = vllm on a "
                                                           "GPU with vllm installed, else transformers",
                                                   "choices": list(POLICY_BACKENDS)})
    tasks_root: str | None = field(default=None, metadata={"help": "factory output for factory:* ($NANOCOMPOSER_TASKS)"})
    humaneval_dir: str | None = field(default=None, metadata={"help": "HumanEval cache ($NANOCOMPOSER_HUMANEVAL)"})
    bootstrap: int = field(default=BOOTSTRAP_RESAMPLES, metadata={"help": "resamples for difference intervals"})
    wandb: bool = field(default=False, metadata={"help": "log to W&B (offline unless WANDB_MODE is set)"})
    run: str = field(default="eval", metadata={"help": "W&B group (the pipeline run name)"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar or table"})


class EvalParser(RecipeParser):
    """The stages' recipe parser (unknown keys named with the file, recipe values typed like flags), minus its
    per-name value rules: env.budget.Budget validates the budget keys itself (for eval, temperature 0 means
    greedy) and `parse_args` checks the rest."""

    def parse_known_args(self, args=None, namespace=None):
        return argparse.ArgumentParser.parse_known_args(self, args, namespace)


def make_parser() -> RecipeParser:
    return EvalParser((EvalArguments, Budget), prog="eval.py", description=__doc__)


def parse_args(argv: list[str] | None = None) -> tuple[EvalArguments, Budget]:
    """Arguments from --config YAML and flags (flags win); every error exits 2 with one line, before any work."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    args, budget = parser.parse_args_and_config(argv)
    if args.policy and args.compare:  # one from the YAML, the other on the command line: the flag wins
        given = {a.split("=")[0] for a in argv}
        if "--compare" in given and "--policy" not in given:
            args.policy = None
        elif "--policy" in given and "--compare" not in given:
            args.compare = None
        else:
            parser.error("--policy and --compare are mutually exclusive")
    checks = [(not args.tasks, "--tasks is required (on the command line or in --config)"),
              (not (args.policy or args.compare), "one of --policy or --compare is required"),
              (args.policy and not args.output, "--policy needs --output"),
              (args.compare and not args.out_dir, "--compare needs --out-dir"),
              (args.output and Path(args.output).is_dir(), f"--output {args.output!r} is a directory, not a file"),
              (args.output and not Path(args.output or ".").parent.is_dir(),
               f"--output directory {str(Path(args.output or '.').parent)!r} does not exist"),
              (args.out_dir and Path(args.out_dir).exists() and not Path(args.out_dir).is_dir(),
               f"--out-dir {args.out_dir!r} is a file, not a directory"),
              (args.limit is not None and args.limit < 1, f"--limit must be >= 1, got {args.limit}")]
    checks += [(getattr(args, n) < 1, f"--{n} must be >= 1, got {getattr(args, n)}")
               for n in ("workers", "processes", "samples", "bootstrap")]
    for bad, message in checks:
        if bad:
            parser.error(message)
    return args, budget


def episodes_path(results_json: Path) -> Path:
    return results_json.with_name(results_json.stem + ".episodes.jsonl")


def run_benchmark(task_sets: list[TaskSet], policy_spec: str, config: EpisodeConfig, *, workers: int = 1,
                  sampling: dict | None = None, samples: int = 1, backend: str = "auto", progress: bool = True,
                  results_path: Path | None = None, resume: bool = False, limit: int | None = None,
                  processes: int = 1) -> dict:
    """results.json for one policy on several task sets: overall and per-set summaries, one record per episode.

    A set's tasks that did not load (`TaskSet.invalid`) are played too: each becomes one invalid_task record
    with the reason, so a broken task counts as a failure instead of vanishing. `limit`: N tasks (valid or
    not) of each set, evenly spaced over it by id (ids start with the family, so every family is in).
    """
    refs = []
    for ts in task_sets:
        fields = {"task_set": ts.name}
        valid = [TaskRef(t, {**fields, "family": t.meta.get("family"), "tier": t.meta.get("tier")}) for t in ts.tasks]
        invalid = [TaskRef(Path(d), {**fields, "family": None, "tier": None}) for d, _ in getattr(ts, "invalid", [])]
        ordered = sorted(valid + invalid, key=lambda r: r.id)
        refs += ordered if limit is None else spread_subset(ordered, limit)
    records, wall_s, workers = run_policy(policy_spec, refs, config, sampling, samples=samples, workers=workers,
                                          backend=backend, results_path=results_path, resume=resume,
                                          progress=progress, processes=processes)
    sampling = sampling or {}
    facts = {"samples": samples, "seed": int(sampling.get("seed", 0) or 0), "workers": workers,
             "processes": processes,
             "backend": backend, "sampling": {k: v for k, v in sampling.items() if k != "seed"},
             "episode": config.budgets()}
    return reporting.results_file(records, task_sets, policy_spec, policy_label(policy_spec), facts, wall_s)


def evaluate(tasks: list[Task], policy_spec: str, config: EpisodeConfig, workers: int = 1, progress: bool = True,
             sampling: dict | None = None, samples: int = 1, backend: str = "auto") -> tuple[list[Trajectory], float]:
    """(trajectories, wall s) of `policy_spec` on `tasks`. Kept for train_sft.py's harness check until it calls
    nanocomposer.policies.run_policy itself (no module should import a stage script)."""
    records, wall_s, _ = run_policy(policy_spec, tasks, config, sampling, samples=samples, workers=workers,
                                    backend=backend, progress=progress)
    return [Trajectory.from_record(r) for r in records], wall_s


def task_record(traj: Trajectory, **extra) -> dict:
    """Kept for train_sft.py (see `evaluate`): the one record, Trajectory.to_record."""
    return traj.to_record(**extra)


def main(argv: list[str] | None = None) -> int:
    args, budget = parse_args(argv)

    def fail(msg: str) -> int:
        print(f"eval.py: error: {msg}", file=sys.stderr)
        return 2

    specs = args.compare or [args.policy]
    labels = [policy_label(s) for s in specs]
    if len(set(labels)) != len(labels):
        return fail(f"--compare: two policies share a label ({labels}); labels are the paths' last two parts")
    sampling = budget.sampling()
    backend = args.backend
    try:
        if any(s == "humaneval" or s.startswith("humaneval:") for s in args.tasks):
            ensure_humaneval(humaneval_cache(args.humaneval_dir))  # built on first use, then read as task dirs
        task_sets = [resolve_task_set(s, tasks_root_dir=args.tasks_root, humaneval_dir=args.humaneval_dir)
                     for s in args.tasks]
        if any(needs_torch(s) for s in specs):  # scripted and endpoint-only evals need no torch
            backend = resolve_backend(args.backend)
        for spec in specs:  # every policy must load before any episode runs (a vLLM engine starts later, once)
            build_policy(spec, sampling, backend, start_engine=False)
    except (TaskError, ValueError, RuntimeError, OSError) as e:  # ModelLoadError, BackendUnavailable: RuntimeError
        return fail(str(e))
    if args.samples > 1 and budget.temperature == 0 and any(not is_scripted(s) for s in specs):
        print("eval.py: warning: --samples > 1 with --temperature 0 (greedy) repeats identical episodes",
              file=sys.stderr)
    config = EpisodeConfig.from_budget(budget)
    run = {"workers": args.workers, "processes": args.processes, "sampling": sampling, "samples": args.samples,
           "backend": backend,
           "progress": not args.quiet, "resume": args.resume, "limit": args.limit}
    out_dir = Path(args.out_dir) if args.compare else None
    outputs = [Path(args.output)] if args.policy else [out_dir / reporting.slug(label) / "results.json"
                                                       for label in labels]
    results = {}
    try:
        for spec, label, output in zip(specs, labels, outputs):
            output.parent.mkdir(parents=True, exist_ok=True)
            results[label] = run_benchmark(task_sets, spec, config, results_path=episodes_path(output), **run)
            reporting.write_json_atomic(output, results[label])
    except Interrupted as e:
        command = shlex.join(["python", "eval.py", *(sys.argv[1:] if argv is None else argv)])
        print(f"eval.py: {e}; resume with: {command}{'' if args.resume else ' --resume'}", file=sys.stderr)
        return 130
    except ResultsFileError as e:
        return fail(str(e))
    except ProcessFailed as e:  # not a bad argument: exit 1, with what finished on disk for --resume
        print(f"eval.py: error: {e}", file=sys.stderr)
        return 1
    if args.policy:
        if not args.quiet:
            reporting.print_table(results[labels[0]], f"{args.policy} on {' '.join(args.tasks)}")
        if args.wandb:
            reporting.wandb_log(args.run, f"{args.run}-eval-{labels[0]}", outputs[0].parent,
                                results[labels[0]]["summary"]["config"], results[labels[0]]["summary"],
                                {"episodes": reporting.task_table(results[labels[0]])})
        return 0
    reporting.report_comparison(results, out_dir, resamples=args.bootstrap, seed=budget.seed, quiet=args.quiet,
                                wandb_group=args.run if args.wandb else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
