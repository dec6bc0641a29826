"""Tasks at the edge of competence for RL: those a policy solves sometimes, but not always.

    python eval.py --tasks artifacts/data/tasks/train --policy runs/X/sft --samples 8 --temperature 1 \\
        --max-turns 8 --max-new-tokens 128 --max-wall-s 120 --max-output-chars 2000 \\
        --output runs/X/edge/results.json
    python -m data.select_edge_tasks --results runs/X/edge/results.episodes.jsonl \\
        --tasks artifacts/data/tasks/train --out artifacts/data/edge/X [--min-pass 0 --max-pass 1] [--overwrite] \\
        [--unsolved-by runs/X/edge/greedy.json]
    python train_rl.py --config recipes/tiny/rl.yaml --tasks_dir artifacts/data/edge/X

Why: GRPO scores each episode against the other episodes of its group (the num_generations episodes of one
task): advantage = (reward - group mean) / group std. A task the policy always solves, or never does, gives
every episode of its group the same outcome reward, so the outcome contributes no gradient there (only the
small shaping terms differ); nanocomposer/rollout.py logs the share of such groups as `zero_std_groups/...`.
Training on the tasks whose pass rate over k sampled episodes lies strictly between --min-pass and --max-pass
(default 0 and 1: at least one solved and one failed episode) spends the rollouts where the signal is.

--unsolved-by RESULTS (optional): also drop the kept tasks that these results solve in any episode, e.g. the
same policy's greedy eval of the same tasks (`eval.py --tasks artifacts/data/tasks/train --policy runs/X/sft
--temperature 0 --output runs/X/edge/greedy.json`, with the --limit and budgets of the sampled run).
Why: a sampled pass rate between 0 and 1 does not say the greedy answer is wrong. On the tiny ladder the SFT
model's greedy episodes already solved 23 of its 36 edge tasks; GRPO raised the sampled success on them and
the greedy solve rate did not move (README Results). Keeping only tasks the reference never solves spends
the rollouts where a gain must show as new solves. The reference results must be of the same policy, and
must have played every task that would be kept.

--results: what eval.py (env.runner.run_tasks) writes, one `Trajectory.to_record` per episode with the task
`id`, `sample`, `seed`, `solved` and `exit_status`:
  - an episodes file, `<name>.episodes.jsonl`, with its settings in `<name>.episodes.jsonl.run.json` beside it;
  - eval.py's `<name>.json` (the same records under "tasks"; settings from its summary);
  - a directory: every `*.episodes.jsonl` below it (eval.py --out-dir writes `<label>/results.episodes.jsonl`,
    one per policy). Several files are pooled only when they hold one policy played with the same settings
    (the seed aside: runs with other seeds add samples; the same episode twice is an error).
Records whose episode never tested the policy (`invalid_task`, `harness_error`, `policy_error`) are no
outcomes: they are counted in the manifest and left out of the pass rates.

--tasks: the task set the results were played on (a directory, or a name eval.py takes, e.g. factory:train).
--out: a new task set, the chosen task directories copied (not linked: env/tasks.py does not follow symlinked
task directories) under their paths relative to the source set, and `manifest.json`: the rule, the counts
(tasks seen, samples per task, kept, all solved, all failed, ...), the pass-rate histogram ("solved/samples":
tasks), the results files with their sha256, the run settings and the kept tasks. It is written beside --out
and moved into place only once it loads with env.tasks.load_task_set, so a failure leaves any old --out as it
was. Every refusal is one line on stderr and exit status 2, except an honest empty result: when the results
are sound but no task is at the edge (none in range, or all of those solved by --unsolved-by) the exit status
is 3 (NO_EDGE_EXIT), so a pipeline can skip RL for that policy and still stop on a real error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from data.common import sha256_file, write_manifest
from env.episode import ExitStatus
from env.results import run_facts_path
from env.task_sets import resolve_task_set
from env.tasks import Task, TaskError, load_task_set

MANIFEST = "manifest.json"
MANIFEST_KIND = "edge_tasks"  # marks an output of this tool: --overwrite replaces nothing else
# Statuses of records whose episode did not test the policy (env/runner.py): not outcomes.
NOT_OUTCOMES = (ExitStatus.INVALID_TASK.value, ExitStatus.HARNESS_ERROR.value, ExitStatus.POLICY_ERROR.value)
# Run facts that may differ between pooled files: the seed (other seeds are other samples), and the
# bookkeeping of eval's results.json config.
POOLABLE_FACTS = ("seed", "samples", "workers")


class SelectionError(ValueError):
    """Input that cannot give an honest selection; the message names what and where."""


class NoEdgeTasks(SelectionError):
    """Sound results, but no task lies at the edge: nothing to select (exit status NO_EDGE_EXIT)."""


NO_EDGE_EXIT = 3


@dataclass
class ResultsFile:
    path: Path
    records: list[tuple[str, dict]]  # (where: "file:line", record)
    facts: dict | None  # the settings the episodes were played with, when recorded
    facts_source: str | None = None


@dataclass
class TaskOutcomes:
    solved: int = 0
    samples: int = 0  # outcome episodes
    episodes: int = 0  # all records, failed ones included
    failed: Counter = field(default_factory=Counter)

    @property
    def pass_rate(self) -> float:
        return self.solved / self.samples

    @property
    def bucket(self) -> str:
        return f"{self.solved}/{self.samples}"


# --------------------------------------------------------------------------- reading results


def _check_record(record, where: str) -> dict:
    if not isinstance(record, dict):
        raise SelectionError(f"{where}: not an episode record (a JSON object)")
    for key, types in (("id", str), ("solved", bool), ("exit_status", str)):
        if not isinstance(record.get(key), types):
            raise SelectionError(f"{where}: episode record has no {key!r} of type {types.__name__} "
                                 f"(got {record.get(key)!r}); not a results file of eval.py / env.runner")
    if not any(isinstance(record.get(k), int) and not isinstance(record.get(k), bool) for k in ("seed", "sample")):
        raise SelectionError(f"{where}: episode record of task {record['id']!r} has neither an integer 'seed' nor "
                             "'sample'; cannot tell its episodes apart")
    return record


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SelectionError(f"{path}: cannot be read as JSON ({e})") from None


def read_episodes_jsonl(path: Path) -> ResultsFile:
    """Every line of an episodes file, strictly: a partial last line (a killed eval) is an error too."""
    records = []
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as e:
        raise SelectionError(f"{path}: cannot be read ({e})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except (UnicodeDecodeError, ValueError) as e:
            last = " (the last line: a killed eval? finish it with eval.py --resume)" if number >= len(lines) - 1 \
                else ""
            raise SelectionError(f"{where}: not a JSON line ({e}){last}") from None
        records.append((where, _check_record(record, where)))
    facts_path = run_facts_path(path)
    facts = None
    if facts_path.exists():
        facts = _read_json(facts_path)
        if not isinstance(facts, dict):
            raise SelectionError(f"{facts_path}: not a JSON object of run settings")
    return ResultsFile(path, records, facts, str(facts_path) if facts is not None else None)


def read_results_json(path: Path) -> ResultsFile:
    """eval.py's results.json: {"summary": {policy, config, ...}, "tasks": [records]}."""
    data = _read_json(path)
    if not (isinstance(data, dict) and isinstance(data.get("tasks"), list) and isinstance(data.get("summary"), dict)):
        raise SelectionError(f"{path}: not an eval.py results file (no 'summary' and 'tasks' list)")
    records = [(f"{path}: tasks[{i}]", _check_record(r, f"{path}: tasks[{i}]")) for i, r in enumerate(data["tasks"])]
    summary = data["summary"]
    facts = {"policy": summary.get("policy"), **summary["config"]} if isinstance(summary.get("config"), dict) \
        else None
    return ResultsFile(path, records, facts, f"{path} (summary)" if facts is not None else None)


def read_results(path: str | Path) -> list[ResultsFile]:
    """The results files `path` names (module docstring): one file, or every episodes file below a directory."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.episodes.jsonl") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise SelectionError(f"--results {str(path)!r}: no *.episodes.jsonl below it (eval.py writes "
                                 "<name>.episodes.jsonl beside --output <name>.json, <label>/results.episodes.jsonl "
                                 "under --out-dir)")
        return [read_episodes_jsonl(p) for p in files]
    if not path.is_file():
        raise SelectionError(f"--results {str(path)!r}: no such file or directory")
    return [read_results_json(path) if path.suffix == ".json" else read_episodes_jsonl(path)]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_one_policy(files: list[ResultsFile]) -> tuple[str | None, dict | None]:
    """(the policy name, the run settings) shared by every record and file; SelectionError if they mix."""
    policies: dict[str, list[str]] = defaultdict(list)
    for f in files:
        for where, record in f.records:
            policies[str(record.get("policy"))].append(where)
    if len(policies) > 1:
        seen = ", ".join(f"{name!r} ({len(wheres)} records, first at {wheres[0]})" for name, wheres in policies.items())
        raise SelectionError(f"--results mixes policies: {seen}; select from one policy's episodes")
    with_facts = [f for f in files if f.facts is not None]
    for f in with_facts[1:]:
        first = with_facts[0]
        a, b = ({k: v for k, v in _flat(x.facts).items() if k not in POOLABLE_FACTS} for x in (first, f))
        for key in sorted(a.keys() | b.keys()):
            if a.get(key) != b.get(key):
                raise SelectionError(f"--results mixes settings: {first.facts_source} has {key}={a.get(key)!r}, "
                                     f"{f.facts_source} has {key}={b.get(key)!r}; pool only episodes played alike")
    return next(iter(policies), None), with_facts[0].facts if with_facts else None


# --------------------------------------------------------------------------- pass rates and selection


def task_outcomes(files: list[ResultsFile], tasks: dict[str, Task], tasks_name: str) -> tuple[dict, Counter]:
    """({task id: TaskOutcomes}, Counter of failed-record statuses). Refuses unknown task ids, the same episode
    twice, and tasks played fewer than 2 times."""
    outcomes: dict[str, TaskOutcomes] = defaultdict(TaskOutcomes)
    failed: Counter = Counter()
    episodes: dict[tuple, str] = {}
    unknown: dict[str, str] = {}
    for f in files:
        for where, record in f.records:
            task_id = record["id"]
            key = (task_id, "seed", record["seed"]) if isinstance(record.get("seed"), int) \
                else (task_id, "sample", record["sample"])
            if key in episodes:
                raise SelectionError(f"{where}: task {task_id!r} {key[1]} {key[2]} again (also at {episodes[key]}): "
                                     "the same episode twice (pooled runs must use other seeds)")
            episodes[key] = where
            status = record["exit_status"]
            outcome = outcomes[task_id]
            outcome.episodes += 1
            if status in NOT_OUTCOMES:
                failed[status] += 1
                outcome.failed[status] += 1
                continue
            if task_id not in tasks:
                unknown.setdefault(task_id, where)
                continue
            outcome.samples += 1
            outcome.solved += record["solved"]
    if unknown:
        examples = ", ".join(f"{i!r} ({w})" for i, w in list(unknown.items())[:3])
        raise SelectionError(f"--results holds {len(unknown)} task id(s) that --tasks {tasks_name!r} lacks, e.g. "
                             f"{examples}: these results are of another task set")
    few = {i: o for i, o in outcomes.items() if o.episodes < 2}
    if few:
        task_id, o = next(iter(sorted(few.items())))
        raise SelectionError(f"{len(few)} task(s) have fewer than 2 samples, e.g. {task_id!r} with {o.episodes}: "
                             "a pass rate needs k >= 2 episodes per task (eval.py --samples k --temperature 1)")
    return dict(outcomes), failed


def histogram(outcomes: dict[str, TaskOutcomes]) -> dict[str, int]:
    """{"solved/samples": tasks}, by samples then solved."""
    counts = Counter(o.bucket for o in outcomes.values() if o.samples)
    return {k: counts[k] for k in sorted(counts, key=lambda b: tuple(int(x) for x in b.split("/"))[::-1])}


def classify(o: TaskOutcomes, min_pass: float, max_pass: float) -> str:
    if o.samples < 2:
        return "too_few_outcomes"  # played >= 2 times, but harness failures left fewer than 2 outcomes
    if min_pass < o.pass_rate < max_pass:
        return "kept"
    if o.solved == o.samples:
        return "all_solved"
    if o.solved == 0:
        return "all_failed"
    return "outside_range"


# --------------------------------------------------------------------------- writing the task set


def _relative_dir(task: Task, source: Path) -> Path:
    try:
        rel = task.root.relative_to(source)
    except ValueError:  # a task set whose tasks live elsewhere (cannot happen for a directory set)
        rel = Path(task.root.name)
    return rel if rel.parts else Path(task.root.name)  # --tasks is a single task directory


def check_out(out: Path, source: Path, overwrite: bool) -> None:
    out_real = out.resolve()
    if out_real == source or source in out_real.parents or out_real in source.parents:
        raise SelectionError(f"--out {str(out)!r} and --tasks {str(source)!r} overlap: write the selection "
                             "to a directory of its own")
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise SelectionError(f"--out {str(out)!r} exists; pass --overwrite to replace it")
        manifest = out / MANIFEST
        kind = None
        if out.is_dir() and not out.is_symlink() and manifest.is_file():
            try:
                kind = json.loads(manifest.read_text(encoding="utf-8")).get("kind")
            except (OSError, UnicodeDecodeError, ValueError, AttributeError):
                kind = None
        if kind != MANIFEST_KIND:
            raise SelectionError(f"refusing to --overwrite {str(out)!r}: it is not an output of this tool (no "
                                 f"{MANIFEST} of kind {MANIFEST_KIND!r}); remove it yourself if that is intended")


def write_task_set(out: Path, chosen: list[Task], source: Path, manifest: dict) -> None:
    """Copy `chosen` into a fresh directory beside `out`, check it loads as exactly those tasks, then move it
    into place (an old `out` is removed only after that)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for task in chosen:
            # symlinks=True: a task's relative links inside repo/ stay links (load_task checks them)
            shutil.copytree(task.root, tmp / _relative_dir(task, source), symlinks=True)
        loaded = load_task_set(tmp, strict=True)
        if sorted(t.id for t in loaded) != sorted(t.id for t in chosen):
            raise SelectionError(f"the copied tasks in {tmp} load as other ids than the chosen ones")
        write_manifest(tmp / MANIFEST, manifest)
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- the command


def solved_by_reference(reference: str | Path, policy: str | None, candidates: list[str]) -> set[str]:
    """The `candidates` that the --unsolved-by results solve in some episode. SelectionError when those
    results are of another policy or lack one of the candidates."""
    files = read_results(reference)
    reference_policy, _ = check_one_policy(files)
    if reference_policy != policy:
        raise SelectionError(f"--unsolved-by {str(reference)!r} is of policy {reference_policy!r}, --results of "
                             f"{policy!r}: compare a policy with itself (e.g. its greedy eval)")
    played: dict[str, bool] = {}
    for _, record in (item for f in files for item in f.records):
        if record["exit_status"] not in NOT_OUTCOMES:
            played[record["id"]] = played.get(record["id"], False) or record["solved"]
    missing = [task_id for task_id in candidates if task_id not in played]
    if missing:
        raise SelectionError(f"--unsolved-by {str(reference)!r} has no outcome for {len(missing)} of the "
                             f"{len(candidates)} tasks in range, e.g. {missing[0]!r}: play the same tasks")
    return {task_id for task_id in candidates if played[task_id]}


def select(results: str | Path, tasks: str, out: str | Path, *, min_pass: float = 0.0, max_pass: float = 1.0,
           overwrite: bool = False, unsolved_by: str | Path | None = None) -> dict:
    """Write the edge task set to `out` (module docstring); its manifest. SelectionError / TaskError if refused."""
    out = Path(out)
    task_set = resolve_task_set(tasks)
    if task_set.kind != "harness":
        raise SelectionError(f"--tasks {tasks!r} is an external benchmark ({task_set.label}): never train on it")
    source = Path(task_set.source).resolve()
    check_out(out, source, overwrite)
    by_id = {t.id: t for t in task_set.tasks}
    files = read_results(results)
    if not any(f.records for f in files):
        raise SelectionError(f"--results {str(results)!r} holds no episode records")
    policy, facts = check_one_policy(files)
    outcomes, failed = task_outcomes(files, by_id, tasks)
    verdicts = {task_id: classify(o, min_pass, max_pass) for task_id, o in sorted(outcomes.items())}
    kinds = Counter(verdicts.values())
    hist = histogram(outcomes)
    in_range = [task_id for task_id, v in verdicts.items() if v == "kept"]
    reference_solved = solved_by_reference(unsolved_by, policy, in_range) if unsolved_by is not None else set()
    kept = [task_id for task_id in in_range if task_id not in reference_solved]
    if in_range and not kept:
        raise NoEdgeTasks(f"all {len(in_range)} tasks with {min_pass} < pass rate < {max_pass} are solved by "
                          f"--unsolved-by {str(unsolved_by)!r}: nothing left to select")
    if not kept:
        raise NoEdgeTasks(f"no task has {min_pass} < pass rate < {max_pass}: of {len(outcomes)} tasks "
                          f"{kinds['all_solved']} all solved, {kinds['all_failed']} all failed, "
                          f"{kinds['outside_range']} outside the range, {kinds['too_few_outcomes']} with too few "
                          f"outcomes; histogram (solved/samples: tasks) {hist}"
                          + (f"; {w}" if (w := greedy_warning(facts)) else ""))
    chosen = [by_id[i] for i in kept]
    manifest = {
        "kind": MANIFEST_KIND,
        "rule": f"{min_pass} < solved/samples < {max_pass} over each task's outcome episodes"
                + (", and never solved by the --unsolved-by results" if unsolved_by is not None else ""),
        "min_pass": min_pass, "max_pass": max_pass,
        "unsolved_by": None if unsolved_by is None else {
            "path": str(unsolved_by), "solved_in_range": sorted(reference_solved)},
        "results": str(results),
        "results_files": [{"path": str(f.path), "sha256": sha256_file(f.path), "records": len(f.records),
                           "run_facts": f.facts_source} for f in files],
        "policy": policy, "run_facts": facts,
        "tasks": tasks, "tasks_source": str(source),
        "counts": {"tasks_in_source": len(by_id), "tasks_seen": len(outcomes),
                   "not_evaluated": len(set(by_id) - set(outcomes)), "in_range": len(in_range), "kept": len(kept),
                   "solved_by_reference": len(reference_solved),
                   "all_solved": kinds["all_solved"], "all_failed": kinds["all_failed"],
                   "outside_range": kinds["outside_range"], "too_few_outcomes": kinds["too_few_outcomes"],
                   "records": sum(len(f.records) for f in files), "failed_records": dict(sorted(failed.items()))},
        "samples_per_task": {str(k): v for k, v in sorted(Counter(o.samples for o in outcomes.values()).items())},
        "pass_rate_histogram": hist,
        "kept_tasks": [{"id": t.id, "path": _relative_dir(t, source).as_posix(), "solved": outcomes[t.id].solved,
                        "samples": outcomes[t.id].samples, "pass_rate": round(outcomes[t.id].pass_rate, 4)}
                       for t in chosen],
    }
    write_task_set(out, chosen, source, manifest)
    return manifest


def greedy_warning(facts: dict | None) -> str | None:
    sampling = (facts or {}).get("sampling")
    if isinstance(sampling, dict) and sampling.get("temperature") == 0:
        return ("warning: the episodes were sampled greedily (temperature 0): a model's samples of a task repeat, "
                "so few tasks can land strictly between all-failed and all-solved; eval with --temperature 1")
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m data.select_edge_tasks", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--results", required=True, help="eval.py's episodes JSONL, results.json, or a directory")
    parser.add_argument("--tasks", required=True, help="the task set the results were played on")
    parser.add_argument("--out", required=True, help="the new task set (a directory)")
    parser.add_argument("--min-pass", type=float, default=0.0, help="keep tasks with pass rate > this")
    parser.add_argument("--max-pass", type=float, default=1.0, help="keep tasks with pass rate < this")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier output of this tool in --out")
    parser.add_argument("--unsolved-by", help="results of the same policy (e.g. its greedy eval): drop the tasks "
                        "they solve")
    args = parser.parse_args(argv)
    if not 0.0 <= args.min_pass < args.max_pass <= 1.0:
        parser.error(f"need 0 <= --min-pass < --max-pass <= 1, got {args.min_pass} and {args.max_pass}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        manifest = select(args.results, args.tasks, args.out, min_pass=args.min_pass, max_pass=args.max_pass,
                          overwrite=args.overwrite, unsolved_by=args.unsolved_by)
    except NoEdgeTasks as e:
        print(f"select_edge_tasks: no task at the edge: {e}", file=sys.stderr)
        return NO_EDGE_EXIT
    except (SelectionError, TaskError) as e:
        print(f"select_edge_tasks: error: {e}", file=sys.stderr)
        return 2
    if warning := greedy_warning(manifest["run_facts"]):
        print(f"select_edge_tasks: {warning}", file=sys.stderr)
    c = manifest["counts"]
    print(f"kept {c['kept']} of {c['tasks_seen']} tasks ({manifest['min_pass']} < pass rate < "
          f"{manifest['max_pass']}; all solved {c['all_solved']}, all failed {c['all_failed']}, outside "
          f"{c['outside_range']}, too few outcomes {c['too_few_outcomes']}, failed records "
          f"{c['failed_records'] or 0}"
          + (f", solved by --unsolved-by {c['solved_by_reference']} of {c['in_range']}" if args.unsolved_by else "")
          + f"); histogram {manifest['pass_rate_histogram']} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
