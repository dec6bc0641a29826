"""What a stage run records: the git commit, the resolved config, the W&B run, the dataset manifest and the
model card (README.md in the output directory)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
WANDB_PROJECT = "nanocomposer"




def git_commit() -> str:
    """`<sha>` of the checkout, `+dirty` when tracked files have changed, `unknown` outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def resolved_config(script_args, training_args, model_args) -> dict:
    """All arguments after YAML and CLI, grouped by dataclass (JSON-safe)."""
    return json.loads(json.dumps({
        "script": asdict(script_args),
        "training": training_args.to_dict(),
        "model": asdict(model_args),
    }, default=str))


def save_config(output_dir: Path, config: dict, extra: dict) -> None:
    """`config.yaml`: the resolved arguments plus run facts (git commit, data, hardware); creates the dir."""
    output_dir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({**extra, **config}, sort_keys=False, allow_unicode=True)
    (output_dir / "config.yaml").write_text(text, encoding="utf-8")


def init_wandb(training_args, *, run: str, stage: str, output_dir: Path, config: dict, manifest_path: Path | None):
    """Start the stage's W&B run before the trainer does (its callback then reuses it).

    Offline unless the user set WANDB_MODE; project `nanocomposer`, group = pipeline run, job_type = stage.
    A resumed stage continues the same W&B run (its id is kept in the output dir). The dataset manifest is
    attached as an artifact. Returns the run, or None when the recipe does not report to wandb.
    """
    report_to = training_args.report_to or []
    if "wandb" not in (report_to if isinstance(report_to, list) else [report_to]):
        return None
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    id_file = output_dir / "wandb_run_id.txt"
    run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id)
    wandb_run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT),
        group=run,
        job_type=stage,
        name=f"{run}-{stage}",
        id=run_id,
        resume="allow",
        dir=str(output_dir),
        config=config,
    )
    if manifest_path is not None and manifest_path.is_file():
        artifact = wandb.Artifact(f"{stage}-data-manifest", type="dataset")
        artifact.add_file(str(manifest_path), name="manifest.json")
        wandb_run.log_artifact(artifact)
    return wandb_run


def start_stage_run(stage: str, script_args, training_args, model_args, output_dir: Path, data: dict,
                    data_dir: str | Path):
    """Record what this run of a stage is, before training: the resolved config and facts (stage, git
    commit, data) in `config.yaml`, the data manifest of `data_dir` copied beside the model, and the
    W&B run (None when the recipe does not report to wandb). Returns (facts, wandb_run)."""
    config = resolved_config(script_args, training_args, model_args)
    facts = {"stage": stage, "git_commit": git_commit(), "data": data}
    save_config(output_dir, config, facts)
    manifest = copy_manifest(str(data_dir), output_dir)
    wandb_run = init_wandb(training_args, run=script_args.run, stage=stage, output_dir=output_dir,
                           config={**config, **facts}, manifest_path=manifest)
    return facts, wandb_run


def finish_wandb(wandb_run, summary: dict) -> None:
    if wandb_run is None:
        return
    wandb_run.summary.update(summary)
    wandb_run.finish()


def copy_manifest(dataset_path: str, output_dir: Path) -> Path | None:
    """Copy the dataset's manifest.json into the output dir as `data_manifest.json` (if there is one)."""
    source = Path(dataset_path) / "manifest.json"
    if not source.is_file():
        return None
    target = output_dir / "data_manifest.json"
    shutil.copyfile(source, target)
    return target


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 50 else float("inf")


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_model_card(output_dir: Path, title: str, intro: str, tables: dict[str, dict]) -> None:
    """README.md: a title, a paragraph, and one two-column table per section."""
    lines = [f"# {title}", "", intro, ""]
    for section, rows in tables.items():
        lines += [f"## {section}", "", "| | |", "|---|---|"]
        lines += [f"| {key} | {format_value(value)} |" for key, value in rows.items()]
        lines.append("")
    (output_dir / "README.md").write_text("\n".join(lines), encoding="utf-8")
