"""What the training stages share: output dirs and resume, input checks, model loading and saving, W&B,
the resolved config and the model card, and CPT's document packing.

Every check here runs before any training step and stops the script with one line naming the bad input
(`fail`), not a traceback from deep inside transformers.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import torch
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
WANDB_PROJECT = "nanocomposer"


def fail(message: str) -> NoReturn:
    """Stop the stage: exit status 1 and `error: message` on stderr."""
    raise SystemExit(f"error: {message}")


def print0(*args: Any) -> None:
    """Print once per job (rank 0) when launched with torchrun/accelerate, always otherwise."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, flush=True)


# --------------------------------------------------------------------------- run directory


def prepare_output_dir(script_args, training_args, stage: str) -> tuple[Path, str | None]:
    """Point the trainer at `<runs_dir>/<run>/<stage>/` and decide where training starts.

    Returns the output dir and the checkpoint to resume from (None: start fresh). An output dir that
    already holds checkpoints is only reused with `--resume`, so a run is never silently overwritten.
    """
    from transformers.trainer_utils import get_last_checkpoint

    if training_args.output_dir in (None, "trainer_output"):  # "trainer_output": TrainingArguments' default
        training_args.output_dir = str(Path(script_args.runs_dir) / script_args.run / stage)
    output_dir = Path(training_args.output_dir)
    last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    if script_args.resume:
        if last is None:
            fail(f"--resume: no checkpoint-* directory in {output_dir} (is --run {script_args.run!r} right?)")
        return output_dir, last
    if last is not None:
        fail(f"{output_dir} already holds {Path(last).name}; pass --resume to continue it or choose another --run")
    output_dir.mkdir(parents=True, exist_ok=True)
    return output_dir, None


def configure_device(training_args) -> None:
    """Without CUDA: fp32 on CPU and no activation checkpointing (field notes, pitfalls 1 and 2).

    bf16 on CPU is 4-15x slower than fp32 here, and recomputing activations buys nothing at these sizes.
    """
    if torch.cuda.is_available():
        return
    if training_args.bf16 or training_args.fp16:
        fail("this machine has no CUDA device and the recipe asks for bf16/fp16: use a CPU recipe (bf16: false)")
    training_args.use_cpu = True
    training_args.gradient_checkpointing = False
    if hasattr(training_args, "activation_checkpointing"):
        training_args.activation_checkpointing = False


# --------------------------------------------------------------------------- inputs


def check_model_path(model_name_or_path: str | None) -> None:
    """Fail clearly unless `model_name_or_path` loads as a transformers model config."""
    from transformers import AutoConfig

    if not model_name_or_path:
        fail("model_name_or_path is not set (in the recipe or as --model_name_or_path)")
    path = Path(model_name_or_path)
    if path.exists() and not (path / "config.json").is_file():
        fail(f"model_name_or_path {model_name_or_path}: not a model directory (no config.json)")
    looks_local = path.is_absolute() or model_name_or_path.startswith(".") or model_name_or_path.count("/") != 1
    if not path.exists() and looks_local:  # a Hub id is exactly "org/name"
        fail(f"model_name_or_path {model_name_or_path}: no such directory")
    try:
        AutoConfig.from_pretrained(model_name_or_path)
    except (OSError, ValueError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fail(f"model_name_or_path {model_name_or_path}: not a local model directory nor a cached Hub model "
             f"({first_line})")


def load_splits(dataset_path: str | None, splits: list[str], columns: list[str]):
    """The requested splits of a DatasetDict saved with `save_to_disk`, each checked for `columns`."""
    from datasets import DatasetDict, load_from_disk

    if not dataset_path:
        fail("dataset_path is not set (in the recipe or as --dataset_path)")
    path = Path(dataset_path)
    if not (path / "dataset_dict.json").is_file():
        fail(f"dataset_path {dataset_path}: not a DatasetDict saved with save_to_disk (no dataset_dict.json)")
    dataset_dict = load_from_disk(str(path))
    for split in splits:
        if split not in dataset_dict:
            fail(f"dataset_path {dataset_path}: no {split!r} split (has {sorted(dataset_dict)})")
        missing = [c for c in columns if c not in dataset_dict[split].column_names]
        if missing:
            fail(f"dataset_path {dataset_path}[{split!r}]: missing columns {missing} "
                 f"(has {dataset_dict[split].column_names})")
        if len(dataset_dict[split]) == 0:
            fail(f"dataset_path {dataset_path}[{split!r}]: the split is empty")
    return DatasetDict({split: dataset_dict[split] for split in splits})


def read_manifest(dataset_path: str) -> dict | None:
    """The builder's manifest.json beside a saved dataset, if there is one."""
    path = Path(dataset_path) / "manifest.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


# --------------------------------------------------------------------------- model


def load_tokenizer(model_name_or_path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    if tokenizer.pad_token is None:  # base checkpoints without one (Llama); labels mask padding anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(model_args, training_args):
    """`AutoModelForCausalLM` in the recipe's dtype (fp32 unless `dtype` is set) with the KV cache off.

    The cache must be off while training: when the model builds a cache it skips transformers' packed-
    sequence detection (masking_utils only looks at `position_ids` with no cache and no attention mask),
    and packed documents would silently attend to each other.
    """
    from transformers import AutoModelForCausalLM

    dtype = model_args.dtype if model_args.dtype not in (None, "auto") else torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        dtype=dtype,
        attn_implementation=model_args.attn_implementation,
    )
    model.config.use_cache = False
    return model


def peft_config(model_args):
    """A LoRA config from TRL's ModelConfig (`use_peft`, `lora_r`, ...), or None."""
    from trl import get_peft_config

    return get_peft_config(model_args)


def save_final_model(model, tokenizer, output_dir: Path) -> None:
    """Save a plain transformers checkpoint: LoRA adapters are merged so the next stage loads it as is."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    model.config.use_cache = True  # restored for generation; training turned it off (see load_model)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)


# --------------------------------------------------------------------------- CPT packing


def document_separator_id(tokenizer, separator: str | None) -> int:
    """Token id appended after every CPT document: `separator`, else <|endoftext|>, else EOS."""
    token = separator or ("<|endoftext|>" if "<|endoftext|>" in tokenizer.get_vocab() else tokenizer.eos_token)
    token_id = tokenizer.convert_tokens_to_ids(token) if token is not None else None
    if token_id is None or token_id == tokenizer.unk_token_id:
        fail(f"document_separator {token!r} is not a token of the tokenizer")
    return token_id


def pack_documents(dataset, tokenizer, block_size: int, separator_id: int, desc: str = "packing"):
    """Tokenize `text` documents and cut the stream into blocks of exactly `block_size` tokens.

    Every block is full (no padding). `position_ids` restart at 0 where a document (or the part of one
    that continues from the previous block) starts: with no attention mask, transformers' masking_utils
    turns that into block-causal attention (`find_packed_sequence_indices`), so no token attends across
    a document boundary. The first token of each segment gets label -100: nothing before it in its
    attention window could predict it. Leftover tokens after the last full block of each map batch are
    dropped (reported by `packing_stats`).
    """

    def tokenize(batch):
        ids = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
        return {"input_ids": [doc + [separator_id] for doc in ids]}

    def group(batch):
        blocks = {"input_ids": [], "position_ids": [], "labels": []}
        ids, positions = [], []
        for doc in batch["input_ids"]:
            ids.extend(doc)
            positions.extend(range(len(doc)))
        for start in range(0, len(ids) - block_size + 1, block_size):
            block_ids = ids[start:start + block_size]
            block_pos = positions[start:start + block_size]
            offset = block_pos[0]  # > 0: the block opens inside a document, whose rest restarts at 0 here
            for i in range(block_size):
                if i > 0 and block_pos[i] == 0:
                    break
                block_pos[i] -= offset
            blocks["input_ids"].append(block_ids)
            blocks["position_ids"].append(block_pos)
            blocks["labels"].append([-100 if p == 0 else t for t, p in zip(block_ids, block_pos)])
        return blocks

    tokenized = dataset.map(tokenize, batched=True, remove_columns=dataset.column_names, desc=f"{desc}: tokenize")
    n_tokens = sum(len(ids) for ids in tokenized["input_ids"])
    packed = tokenized.map(group, batched=True, batch_size=1000, remove_columns=tokenized.column_names,
                           desc=f"{desc}: blocks of {block_size}")
    stats = {"documents": len(dataset), "tokens": n_tokens, "blocks": len(packed),
             "tokens_kept": len(packed) * block_size}
    stats["kept_fraction"] = stats["tokens_kept"] / n_tokens if n_tokens else 0.0
    return packed, stats


# --------------------------------------------------------------------------- config, W&B, model card


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
    """`config.yaml`: the resolved arguments plus run facts (git commit, data, hardware)."""
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
