"""The task factory: source projects -> validated task directories, a dataset and a manifest.

    python -m data.build_tasks --out artifacts/data/tasks --projects data/projects \\
        --families fix_bug,implement_function,fix_lint,locate --per-project 20 --seed 0 \\
        [--per-family locate=8] [--held-out-per-project 12] [--stdlib] [--validate] [--workers 2]

Output:
    out/<split>/<task_id>/   task directories in the public format (env/tasks.py)
    out/dataset/             datasets.DatasetDict, one row per task (see `row_from_task`)
    out/splits.json          which project went to which split
    out/manifest.json        seed, args, counts per split/family/tier, sha256 per task,
                             candidate statistics, validation results, timings

Splits are by *source project*: train, val and test never share one, so held-out numbers
measure generalisation to unseen code, not memory of it. Each candidate is validated when it
is made (the untouched repo fails grading, the reference solution passes); `--validate`
additionally runs whole episodes with the `gold` and `noop` policies through the harness.

How many tasks each (project, family) unit makes, at most: `--per-project`, or the family's entry in
`--per-family` (a curriculum knob: e.g. more `locate` questions, which a small model can learn to
answer first); for val/test projects `--held-out-per-project` when given, so the held-out splits can
be made large enough for tight intervals (>= 100 tasks) without growing the training data.

The task ladder (data/families/ladder.py) needs no source project: `--ladder N` makes N tasks per rung
for train and `--ladder-held-out M` M per rung for val and for test (each task from its own seed that
names its split, so train and held-out never share one); `--ladder-only` builds just the ladder. Its
tasks have tier `ladder`, so `factory:test/ladder` is the whole held-out ladder and
`factory:test/ladder_locate` one rung.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from data.common import (
    environment_info,
    prepare_output_dir,
    progress,
    rng_for,
    sha256_file,
    stable_fraction,
    write_manifest,
)
from data.families import FAMILIES, LADDER
from data.families.base import STDLIB_MODULES, SourceProject, load_projects, load_stdlib_project
from env.tasks import Task, TaskError, load_task, write_task

SPLITS = ("train", "val", "test")
SPLIT_FRACTIONS = {"val": 0.15, "test": 0.15}  # the rest is train
DATASET_COLUMNS = ("id", "instruction", "test_command", "timeout_s", "family", "tier", "project", "split",
                   "task_dir", "repo", "hidden", "gold_patch", "meta")


# ------------------------------------------------------------------------------------ splits


def project_group(project: SourceProject) -> str:
    """Splits are stratified by group, so every split sees micro, repo and stdlib projects alike."""
    return "stdlib" if project.kind == "stdlib" else project.tier


def assign_splits(projects: list[SourceProject], seed: int) -> dict[str, list[str]]:
    """Project name -> split, deterministic in (seed, names), every split non-empty.

    Within each group projects are ordered by a seeded hash; the groups are then interleaved so
    the first picks (test, then val) draw from every group in turn.
    """
    if len(projects) < len(SPLITS):
        raise ValueError(f"need at least {len(SPLITS)} source projects to make {SPLITS} splits, "
                         f"got {len(projects)}: {[p.name for p in projects]}")
    groups: dict[str, list[str]] = defaultdict(list)
    for p in sorted(projects, key=lambda p: stable_fraction(seed, "split", p.name)):
        groups[project_group(p)].append(p.name)
    interleaved, queues = [], [groups[g] for g in sorted(groups)]
    while any(queues):
        for queue in queues:
            if queue:
                interleaved.append(queue.pop(0))
    n = len(interleaved)
    n_test = max(1, round(SPLIT_FRACTIONS["test"] * n))
    n_val = max(1, round(SPLIT_FRACTIONS["val"] * n))
    if n_test + n_val >= n:
        n_test, n_val = 1, 1
    return {"test": sorted(interleaved[:n_test]), "val": sorted(interleaved[n_test:n_test + n_val]),
            "train": sorted(interleaved[n_test + n_val:])}


def check_split_leakage(task_dirs_by_split: dict[str, list[Task]]) -> None:
    """Raise if a source project contributes tasks to more than one split."""
    owner: dict[str, str] = {}
    for split, tasks in task_dirs_by_split.items():
        for task in tasks:
            project = task.meta.get("project")
            if project is None:
                raise TaskError(f"task {task.id!r} ({task.root}) has no 'project' in task.json")
            if owner.setdefault(project, split) != split:
                raise ValueError(f"split leakage: project {project!r} has tasks in {owner[project]!r} and {split!r}"
                                 f" (e.g. {task.id!r})")


# ----------------------------------------------------------------------------- dataset form


def _read_tree(root: Path | None) -> dict[str, str]:
    if root is None or not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def row_from_task(task: Task) -> dict:
    """One dataset row holding everything needed to rebuild the task directory (`task_from_row`).

    File trees and the remaining task.json keys are JSON strings: Arrow would otherwise null-fill
    dicts with differing keys.
    """
    return {
        "id": task.id, "instruction": task.instruction, "test_command": task.test_command,
        "timeout_s": task.timeout_s, "family": task.meta.get("family", ""), "tier": task.meta.get("tier", ""),
        "project": task.meta.get("project", ""), "split": task.meta.get("split", ""), "task_dir": str(task.root),
        "repo": json.dumps(_read_tree(task.repo_dir), ensure_ascii=False),
        "hidden": json.dumps(_read_tree(task.hidden_dir), ensure_ascii=False),
        "gold_patch": task.gold_patch or "",
        "meta": json.dumps(task.meta, ensure_ascii=False),
    }


def task_from_row(row: dict, dest: Path) -> Path:
    """Write the task directory a `row_from_task` row describes to `dest`; returns `dest`."""
    missing = [c for c in DATASET_COLUMNS if c not in row]
    if missing:
        raise ValueError(f"dataset row {row.get('id', '?')!r} lacks columns {missing}")
    try:
        repo, hidden, meta = json.loads(row["repo"]), json.loads(row["hidden"]), json.loads(row["meta"])
    except json.JSONDecodeError as e:
        raise ValueError(f"dataset row {row['id']!r}: repo/hidden/meta must be JSON strings ({e})") from None
    return write_task(Path(dest), id=row["id"], instruction=row["instruction"], test_command=row["test_command"],
                      repo=repo, hidden=hidden or None, gold_patch=row["gold_patch"] or None,
                      timeout_s=int(row["timeout_s"]), **meta)


def task_sha256(root: Path) -> str:
    """Content hash of a task directory (paths and bytes of every file, in sorted order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + sha256_file(path).encode() + b"\0")
    return digest.hexdigest()


# ------------------------------------------------------------------------------- source checks


def baseline_failure(project: SourceProject) -> str | None:
    """Why the pristine project is unusable (its tests fail, or a stdlib copy is not the one imported)."""
    from env.sandbox import Sandbox

    with tempfile.TemporaryDirectory(prefix="baseline-") as tmp:
        root = Path(tmp)
        for rel, text in project.files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        result = Sandbox(root).run(project.test_command, timeout_s=120)
        if result.returncode != 0:
            return f"tests fail on the pristine project (rc={result.returncode}): {result.output[-300:]}"
        if project.kind == "stdlib":
            # the local copy must shadow the installed module: a copy that cannot be imported must break the run
            module = project.source_files[0]
            (root / module).write_text("raise ImportError('shadowing sentinel')\n" + project.files[module])
            if Sandbox(root).run(project.test_command, timeout_s=120).returncode == 0:
                return f"the local {module} does not shadow the installed module"
    return None


# ------------------------------------------------------------------------------------ building


def _build_unit(project: SourceProject, family: str, per_project: int, seed: int) -> tuple[list, Counter, float]:
    stats: Counter = Counter()
    start = time.perf_counter()
    specs = list(FAMILIES[family](project, rng_for(seed, "tasks", project.name, family), per_project, stats))
    return specs, stats, time.perf_counter() - start


def _build_ladder_unit(family: str, split: str, count: int, seed: int) -> tuple[list, Counter, float]:
    stats: Counter = Counter()
    start = time.perf_counter()
    specs = list(LADDER[family](split, seed, count, stats))
    return specs, stats, time.perf_counter() - start


def ladder_size(args: argparse.Namespace, split: str) -> int:
    """How many tasks each ladder rung makes for `split`."""
    return args.ladder if split == "train" else args.ladder_held_out


def validate_episodes(tasks: list[Task], workers: int) -> dict:
    """Run `gold` (must solve) and `noop` (must not) through the full harness on every task."""
    from env.episode import EpisodeConfig, run_episode
    from env.policies import get_policy

    def one(task: Task, policy: str) -> tuple[str, str, bool, str]:
        traj = run_episode(task, get_policy(policy), EpisodeConfig())
        return task.id, policy, traj.solved, traj.exit_status

    failures, counts = [], Counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, t, p) for t in tasks for p in ("gold", "noop")]
        for future in progress(as_completed(futures), desc="validate episodes", total=len(futures), unit="ep"):
            task_id, policy, solved, status = future.result()
            counts[f"{policy} solved" if solved else f"{policy} unsolved"] += 1
            if solved != (policy == "gold"):
                failures.append({"id": task_id, "policy": policy, "solved": solved, "exit_status": status})
    return {"episodes": len(futures), "counts": dict(counts), "failures": sorted(failures, key=lambda f: f["id"]),
            "ok": not failures}


def build(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    families = [] if args.ladder_only else [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise SystemExit(f"--families: unknown family {unknown}; known: {sorted(FAMILIES)}")
    rungs = [f.strip() for f in args.ladder_families.split(",") if f.strip()]
    if unknown := [f for f in rungs if f not in LADDER]:
        raise SystemExit(f"--ladder-families: unknown rung {unknown}; known: {list(LADDER)}")
    projects = [] if args.ladder_only else load_projects(Path(args.projects), args.only.split(",") if args.only
                                                         else None)
    if args.stdlib and not args.ladder_only:
        projects += [load_stdlib_project(name) for name in args.stdlib_modules.split(",")]
    out = prepare_output_dir(args.out, args.overwrite, marker_files=["manifest.json"])

    skipped = {}
    for project in progress(projects, desc="baseline tests", unit="project"):
        if (reason := baseline_failure(project)) is not None:
            skipped[project.name] = reason
            print(f"skipping {project.name}: {reason}", file=sys.stderr)
    projects = [p for p in projects if p.name not in skipped]
    splits = assign_splits(projects, args.seed) if projects else {s: [] for s in SPLITS}
    split_of = {name: split for split, names in splits.items() for name in names}
    (out / "splits.json").write_text(json.dumps(splits, indent=2) + "\n")

    units = [(p, f) for p in projects for f in families]
    stats_by_family: dict[str, Counter] = defaultdict(Counter)
    seconds_by_family: Counter = Counter()
    written: list[Path] = []
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        futures = {pool.submit(_build_unit, p, f, unit_size(args, split_of[p.name], f), args.seed): (p, f)
                   for p, f in units}
        bar = progress(as_completed(futures), desc="projects x families", total=len(units), unit="unit")
        for future in bar:
            project, family = futures[future]
            specs, stats, seconds = future.result()
            stats_by_family[family].update(stats)
            seconds_by_family[family] += seconds
            for spec in specs:
                spec.meta["split"] = split_of[project.name]
                written.append(spec.write(out / split_of[project.name] / spec.id))
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(tasks=len(written))
        ladder_units = [(f, s) for s in SPLITS for f in rungs if ladder_size(args, s) > 0]
        futures = {pool.submit(_build_ladder_unit, f, s, ladder_size(args, s), args.seed): (f, s)
                   for f, s in ladder_units}
        for future in progress(as_completed(futures), desc="ladder rungs x splits", total=len(futures), unit="unit"):
            family, split = futures[future]
            specs, stats, seconds = future.result()
            stats_by_family[family].update(stats)
            seconds_by_family[family] += seconds
            written.extend(spec.write(out / split / spec.id) for spec in specs)

    tasks_by_split = {s: sorted((load_task(d) for d in written if d.parent.name == s), key=lambda t: t.id)
                      for s in SPLITS}
    check_split_leakage(tasks_by_split)
    save_dataset(tasks_by_split, out / "dataset")
    build_s = time.perf_counter() - t_start

    counts = {
        "total": len(written),
        "split": {s: len(tasks_by_split[s]) for s in SPLITS},
        "family": dict(Counter(t.meta["family"] for ts in tasks_by_split.values() for t in ts)),
        "tier": dict(Counter(t.meta["tier"] for ts in tasks_by_split.values() for t in ts)),
        "split_family_tier": dict(Counter(f"{s}/{t.meta['family']}/{t.meta['tier']}"
                                          for s, ts in tasks_by_split.items() for t in ts)),
    }
    candidates = sum(st["candidates"] for st in stats_by_family.values())
    manifest = {
        "builder": "data.build_tasks", "seed": args.seed, "args": vars(args), "environment": environment_info(
            "datasets", "ruff", "pytest"),
        "splits": splits, "skipped_projects": skipped, "counts": counts,
        "candidates": {f: dict(st) for f, st in stats_by_family.items()},
        "timings": {"build_s": round(build_s, 1), "candidates": candidates,
                    "candidates_per_s": round(candidates / build_s, 2) if build_s else None,
                    "family_s": {f: round(s, 1) for f, s in seconds_by_family.items()}},
        "tasks": {t.id: {"split": s, "family": t.meta["family"], "tier": t.meta["tier"], "project": t.meta["project"],
                         "sha256": task_sha256(t.root)} for s, ts in tasks_by_split.items() for t in ts},
        "validation": None,
    }
    if args.validate:
        t0 = time.perf_counter()
        manifest["validation"] = validate_episodes([t for ts in tasks_by_split.values() for t in ts], args.workers)
        manifest["timings"]["validate_s"] = round(time.perf_counter() - t0, 1)
    write_manifest(out / "manifest.json", manifest)
    return manifest


def save_dataset(tasks_by_split: dict[str, list[Task]], dest: Path) -> None:
    from datasets import Dataset, DatasetDict, Features, Value

    features = Features({c: Value("int64") if c == "timeout_s" else Value("string") for c in DATASET_COLUMNS})
    rows = {s: [row_from_task(t) for t in tasks] for s, tasks in tasks_by_split.items()}
    # an empty split (a ladder-only build without train tasks) is left out: datasets saves it but cannot load it
    DatasetDict({s: Dataset.from_list(r, features=features) for s, r in rows.items() if r}).save_to_disk(str(dest))


def unit_size(args: argparse.Namespace, split: str, family: str) -> int:
    """At most how many tasks one project of `split` makes for `family` (see the module docstring)."""
    if split != "train" and args.held_out_per_project:
        return args.held_out_per_project
    return args.per_family.get(family, args.per_project)


def parse_per_family(text: str) -> dict[str, int]:
    """`locate=8,fix_bug=4` -> {"locate": 8, "fix_bug": 4}; ValueError naming the bad entry."""
    sizes = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        family, sep, number = entry.partition("=")
        if not sep or family.strip() not in FAMILIES or not number.strip().isdigit() or int(number) < 1:
            raise ValueError(f"--per-family entry {entry!r}: expected FAMILY=N with N >= 1 and FAMILY one of "
                             f"{', '.join(FAMILIES)}")
        sizes[family.strip()] = int(number)
    return sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="artifacts/data/tasks")
    parser.add_argument("--projects", default="data/projects")
    parser.add_argument("--only", default="", help="comma-separated project names (default: all)")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--per-project", type=int, default=20, help="tasks per project and family (at most)")
    parser.add_argument("--per-family", default="", help="per-family sizes that replace --per-project, "
                        "e.g. locate=8,fix_bug=4")
    parser.add_argument("--held-out-per-project", type=int, default=0,
                        help="tasks per project and family in val/test (default: as in train)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stdlib", action="store_true", help="also use stdlib modules with their Lib/test tests")
    parser.add_argument("--stdlib-modules", default=",".join(STDLIB_MODULES))
    parser.add_argument("--ladder", type=int, default=0, help="task-ladder tasks per rung in train")
    parser.add_argument("--ladder-held-out", type=int, default=0, help="task-ladder tasks per rung in val and in test")
    parser.add_argument("--ladder-families", default=",".join(LADDER), help="which ladder rungs (default: all)")
    parser.add_argument("--ladder-only", action="store_true", help="build only the ladder (no source projects)")
    parser.add_argument("--validate", action="store_true", help="run gold/noop episodes on every task")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier output in --out")
    args = parser.parse_args(argv)
    if args.per_project < 1 or args.workers < 1 or args.held_out_per_project < 0:
        parser.error("--per-project and --workers must be >= 1, --held-out-per-project >= 0")
    if args.ladder < 0 or args.ladder_held_out < 0:
        parser.error("--ladder and --ladder-held-out must be >= 0")
    if args.ladder_only and not (args.ladder or args.ladder_held_out):
        parser.error("--ladder-only needs --ladder and/or --ladder-held-out")
    try:
        args.per_family = parse_per_family(args.per_family)
    except ValueError as e:
        parser.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    manifest = build(args)
    counts = manifest["counts"]
    print(f"{counts['total']} tasks -> {args.out}  split {counts['split']}  family {counts['family']}  "
          f"tier {counts['tier']}  ({manifest['timings']['build_s']} s, "
          f"{manifest['timings']['candidates_per_s']} candidates/s)")
    validation = manifest["validation"]
    if validation is not None:
        print(f"validation: {validation['counts']}; failures: {len(validation['failures'])}")
        return 0 if validation["ok"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
