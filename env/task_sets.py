"""Task sets by name, so eval runs say what they measured in one word.

    samples                                   the hand-made sample tasks (data/samples, built by data/build_samples.py)
    factory:<split>[/<family>][/<tier>]       the task factory's split, optionally one family and/or tier
                                              (e.g. factory:test, factory:val/fix_bug, factory:test/micro);
                                              root: $NANOCOMPOSER_TASKS or artifacts/data/tasks
    humaneval[:N]                             HumanEval (external benchmark), all 164 or N evenly spaced
                                              problems; built (by data/humaneval.py, eval.py on first use) into $NANOCOMPOSER_HUMANEVAL or
                                              artifacts/data/humaneval (data/humaneval.py)
    anything else                             a task directory or a directory of task directories

A name that resolves to nothing fails with a TaskError that lists what exists. Task directories that
fail to load do not sink the set: they are listed in `TaskSet.invalid` as (directory, reason), for a
runner to record as failed (a filtered factory set lists every invalid task of its split, since an
unreadable task.json has no family or tier to filter on).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from env.tasks import Task, TaskError, load_task_set, spread_subset

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = REPO_ROOT / "data" / "samples"
DEFAULT_TASKS_ROOT = REPO_ROOT / "artifacts" / "data" / "tasks"
DEFAULT_HUMANEVAL_CACHE = REPO_ROOT / "artifacts" / "data" / "humaneval"
TASKS_ROOT_ENV = "NANOCOMPOSER_TASKS"
HUMANEVAL_CACHE_ENV = "NANOCOMPOSER_HUMANEVAL"
FACTORY_SPLITS = ("train", "val", "test")
NAMED_SETS = ("samples", "factory:<split>[/<family>][/<tier>]", "humaneval[:N]")


@dataclass
class TaskSet:
    name: str  # the spec it was resolved from
    tasks: list[Task]
    kind: str  # "harness" (ours) or "external" (a public benchmark reported beside ours)
    label: str  # how tables print it
    source: str  # the directory it was loaded from
    invalid: list[tuple[str, str]] = field(default_factory=list)  # (task directory, reason) of tasks not loaded


def tasks_root(override: str | Path | None = None) -> Path:
    return Path(override or os.environ.get(TASKS_ROOT_ENV) or DEFAULT_TASKS_ROOT)


def humaneval_cache(override: str | Path | None = None) -> Path:
    return Path(override or os.environ.get(HUMANEVAL_CACHE_ENV) or DEFAULT_HUMANEVAL_CACHE)


def _factory(spec: str, root: Path) -> TaskSet:
    parts = [p for p in spec.split(":", 1)[1].split("/") if p]
    if not parts:
        raise TaskError(f"task set {spec!r}: name a split, e.g. factory:test (splits: {', '.join(FACTORY_SPLITS)})")
    split, filters = parts[0], parts[1:]
    present = [s for s in FACTORY_SPLITS if (root / s).is_dir()]
    if not present:
        raise TaskError(f"task set {spec!r}: no task factory output in {str(root)!r} (run `make data`, or set "
                        f"${TASKS_ROOT_ENV} / --tasks-root to where data/build_tasks.py wrote its splits)")
    if split not in present:
        raise TaskError(f"task set {spec!r}: no split {split!r} in {str(root)!r} (splits: {', '.join(present)})")
    tasks = load_task_set(root / split)
    families = sorted({str(t.meta.get("family")) for t in tasks})
    tiers = sorted({str(t.meta.get("tier")) for t in tasks})
    family = tier = None
    for f in filters:  # each filter names a family or a tier; order does not matter
        if f in families and family is None:
            family = f
        elif f in tiers and tier is None:
            tier = f
        else:
            raise TaskError(f"task set {spec!r}: {f!r} is neither a family ({', '.join(families)}) "
                            f"nor a tier ({', '.join(tiers)}) of split {split!r}, or is given twice")
    chosen = [t for t in tasks if (family is None or t.meta.get("family") == family)
              and (tier is None or t.meta.get("tier") == tier)]
    if not chosen:
        raise TaskError(f"task set {spec!r}: no {family or ''} {tier or ''} tasks in split {split!r}")
    return TaskSet(spec, chosen, "harness", spec, str(root / split), _invalid(tasks))


def _humaneval(spec: str, cache: Path) -> TaskSet:
    count = spec.split(":", 1)[1] if ":" in spec else ""
    if count and not (count.isdigit() and int(count) > 0):
        raise TaskError(f"task set {spec!r}: use humaneval (all 164) or humaneval:N with N a positive integer")
    # Built by data/humaneval.py (eval.py builds it on first use); the harness only reads the task directories.
    if not (cache / "manifest.json").is_file():
        raise TaskError(f"task set {spec!r}: HumanEval is not built in {str(cache)!r}: run "
                        f"`python -m data.humaneval --out {cache}` (eval.py does it on first use)")
    loaded = load_task_set(cache)
    tasks = spread_subset(loaded, int(count)) if count else list(loaded)
    label = "external: HumanEval" + (f" ({len(tasks)} of 164)" if count and len(tasks) < 164 else "")
    return TaskSet(spec, tasks, "external", label, str(cache), _invalid(loaded))


def _invalid(tasks: list[Task]) -> list[tuple[str, str]]:
    return [(str(path), reason) for path, reason in getattr(tasks, "invalid", [])]


def resolve_task_set(spec: str, *, tasks_root_dir: str | Path | None = None,
                     humaneval_dir: str | Path | None = None) -> TaskSet:
    """A named task set or a directory (see the module docstring); TaskError naming what exists otherwise."""
    spec = str(spec).strip()
    if spec == "samples":
        unbuilt = sorted(p.name for p in SAMPLES_DIR.iterdir() if (p / "task.json").is_file() and not (p / "repo").is_dir())
        if unbuilt:  # their repos are made from data/projects, see data/samples/README.md
            raise TaskError(f"task set 'samples': {', '.join(unbuilt)} not built yet: run `python -m data.build_samples` "
                            "(make install does)")
        tasks = load_task_set(SAMPLES_DIR)
        return TaskSet(spec, list(tasks), "harness", spec, str(SAMPLES_DIR), _invalid(tasks))
    if spec.startswith("factory:"):
        return _factory(spec, tasks_root(tasks_root_dir))
    if spec == "humaneval" or spec.startswith("humaneval:"):
        return _humaneval(spec, humaneval_cache(humaneval_dir))
    path = Path(spec)
    if path.is_dir():
        tasks = load_task_set(path)
        return TaskSet(spec, list(tasks), "harness", spec, str(path.resolve()), _invalid(tasks))
    root = tasks_root(tasks_root_dir)
    splits = [s for s in FACTORY_SPLITS if (root / s).is_dir()]
    factory = f"factory:{{{','.join(splits)}}}[/<family>][/<tier>]" if splits else \
        f"factory:<split> (none built yet in {str(root)!r})"
    raise TaskError(f"unknown task set {spec!r}: not a directory and not a named set; named sets: samples, "
                    f"{factory}, humaneval[:N]")
