"""A stage's output directory: made or resumed, its checkpoints listed and checked, a broken one moved aside."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from nanocomposer.common import print0
from nanocomposer.config import ConfigError
from nanocomposer.engine.checkpoints import WEIGHT_FILES
from nanocomposer.inputs import file_problem, weights_problem

# --------------------------------------------------------------------------- run directory


CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")  # what the Trainer writes (and get_last_checkpoint finds)
INCOMPLETE_PREFIX = "incomplete-"  # an incomplete checkpoint moved aside: no longer matches CHECKPOINT_DIR


def prepare_output_dir(script_args, training_args, stage: str) -> tuple[Path, str | None]:
    """Point the trainer at `<runs_dir>/<run>/<stage>/` and decide where training starts.

    Returns the output dir (not created yet: that waits until every input check has passed) and the
    checkpoint to resume from (None: start fresh). An output dir that already holds checkpoints or a
    finished model is only reused with `--resume`, so a run is never silently overwritten. A checkpoint
    whose save was cut short (`kill -9`, a full disk) is never resumed from: `--resume` takes the newest
    complete one (`checkpoint_problem`) and moves the incomplete ones aside, saying so.
    """
    other = "another --run"
    if training_args.output_dir in (None, "trainer_output"):  # "trainer_output": TrainingArguments' default
        training_args.output_dir = str(Path(script_args.runs_dir) / script_args.run / stage)
    else:
        other = "another --output_dir"
    output_dir = Path(training_args.output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"output dir {output_dir}: exists and is not a directory")
    require_optimizer = not getattr(training_args, "save_only_model", False)
    checkpoints = list_checkpoints(output_dir)  # newest first
    problems = {path: checkpoint_problem(path, require_optimizer) for path in checkpoints}
    complete = next((path for path in checkpoints if problems[path] is None), None)
    incomplete = [path for path in checkpoints if problems[path] is not None]
    if script_args.resume:
        return output_dir, resume_checkpoint(output_dir, stage, complete, incomplete, problems)
    if complete is not None:
        also = f" (and incomplete {', '.join(p.name for p in incomplete)})" if incomplete else ""
        raise ConfigError(f"{output_dir} already holds {complete.name}{also}; pass --resume to continue from it "
                          f"or choose {other}")
    if incomplete:
        raise ConfigError(f"{output_dir} holds only incomplete checkpoints from an interrupted run "
                          f"({describe_problems(incomplete, problems)}); pass --resume to move them aside and "
                          f"start over, or choose {other}")
    finished = [name for name in WEIGHT_FILES if (output_dir / name).is_file()]
    if finished:
        raise ConfigError(f"{output_dir} already holds a finished model ({finished[0]}); choose {other}, "
                          "or move it away first")
    return output_dir, None


def resume_checkpoint(output_dir: Path, stage: str, complete: Path | None, incomplete: list[Path],
                      problems: dict[Path, str | None]) -> str | None:
    """--resume: the newest complete checkpoint, after moving every incomplete one aside (never deleted:
    the Trainer's checkpoint rotation would otherwise count them, and a later save could land on top)."""
    if complete is None and not incomplete:
        raise ConfigError(f"--resume: no checkpoint-* directory in {output_dir} (is --run right?)")
    for path in incomplete:
        if int(os.environ.get("RANK", "0")) == 0:  # one process renames; the others (torchrun) skip it too
            aside = move_aside(path)
            print0(f"[{stage}] --resume: skipping incomplete {path.name} ({problems[path]}); moved it to {aside}")
    if complete is None:
        print0(f"[{stage}] --resume: no complete checkpoint in {output_dir}: starting over from step 0")
        return None
    print0(f"[{stage}] --resume: resuming from {complete} (step {checkpoint_step(complete)})")
    return str(complete)


def list_checkpoints(output_dir: Path) -> list[Path]:
    """The Trainer's `checkpoint-<step>` directories in `output_dir`, newest (highest step) first.

    transformers' `get_last_checkpoint` returns the highest step whether or not its save finished; this
    lists them all so the caller can fall back to the newest complete one.
    """
    if not output_dir.is_dir():
        return []
    found = [path for path in output_dir.iterdir() if path.is_dir() and CHECKPOINT_DIR.match(path.name)]
    return sorted(found, key=checkpoint_step, reverse=True)


def checkpoint_step(path: Path) -> int:
    return int(CHECKPOINT_DIR.match(Path(path).name).group(1))


def checkpoint_problem(path: Path, require_optimizer: bool = True) -> str | None:
    """Why the Trainer could not resume from checkpoint dir `path`, or None when it is complete.

    Complete: everything `Trainer._save_checkpoint` writes is there and parses. It writes the model
    weights, then optimizer.pt and scheduler.pt (not with `save_only_model`), then rng_state.pth, and
    trainer_state.json last; a save cut short misses some, or leaves one truncated. trainer_state.json
    must parse and its global_step match the directory name; weights (full model or PEFT adapter) must
    be whole (`weights_problem`); every torch archive (.pt, .pth, .bin) must open.
    """
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        return "no trainer_state.json: its save did not finish"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"trainer_state.json is not valid JSON ({e})"
    if not isinstance(state, dict) or state.get("global_step") != checkpoint_step(path):
        return f"trainer_state.json does not record global_step {checkpoint_step(path)}"
    problem = weights_problem(path)
    if problem:
        return problem
    needed = ("optimizer.pt", "scheduler.pt") if require_optimizer else ()
    missing = [name for name in needed if not (path / name).is_file()]
    if missing:
        return f"no {' or '.join(missing)}"
    for archive in sorted(path.glob("*.pt")) + sorted(path.glob("*.pth")) + sorted(path.glob("*.bin")):
        problem = file_problem(archive)
        if problem:
            return problem
    return None


def describe_problems(paths: list[Path], problems: dict[Path, str | None]) -> str:
    return "; ".join(f"{path.name}: {problems[path]}" for path in paths)


def move_aside(path: Path) -> Path:
    """Rename `path` to `incomplete-<name>` beside it (`.1`, `.2`, ... if taken); returns the new path."""
    target = path.with_name(INCOMPLETE_PREFIX + path.name)
    n = 0
    while target.exists():
        n += 1
        target = path.with_name(f"{INCOMPLETE_PREFIX}{path.name}.{n}")
    path.rename(target)
    return target
