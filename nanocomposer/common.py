"""What the training stages share: output dirs and resume, input checks, model loading and saving, W&B,
the resolved config and the model card, and CPT's document packing.

Every input check here runs before any training step and raises `ConfigError` naming the bad input;
`run_main`, every stage's `__main__`, prints it as one line and exits with status 2 (no traceback from deep
inside transformers). `fail` (status 1) is for a stage that ran and failed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import torch
import yaml

from nanocomposer.config import ConfigError, RecipeParser
from nanocomposer.dtypes import native_bf16, resolve_dtype
from nanocomposer.policy import TOKENIZER_FILES, WEIGHT_FILES

REPO_ROOT = Path(__file__).resolve().parent.parent
WANDB_PROJECT = "nanocomposer"


def fail(message: str) -> NoReturn:
    """Stop a stage that ran and failed (not bad input: that is ConfigError): exit status 1, `error: message`."""
    raise SystemExit(f"error: {message}")


def run_main(main: Callable[..., Any], parser: RecipeParser) -> None:
    """A stage's `__main__`: parse recipe and flags, run `main`, and report bad input found on the way
    (a ConfigError) exactly like a bad flag: `<script>: error: <message>` on one line, exit status 2.
    Anything else keeps its traceback: that is a bug, not bad input."""
    arguments = parser.parse_args_and_config()
    try:
        main(*arguments)
    except ConfigError as e:
        parser.error(str(e))


def first_line(error: BaseException) -> str:
    """`Type: first line of the message`, for errors from libraries whose messages span lines."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def print0(*args: Any) -> None:
    """Print once per job (rank 0) when launched with torchrun/accelerate, always otherwise."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, flush=True)


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


def configure_device(training_args) -> None:
    """Without CUDA: fp32 on CPU and no activation checkpointing.

    bf16 on CPU is 4-15x slower than fp32 here, and recomputing activations buys nothing at these sizes.
    """
    if torch.cuda.is_available():
        return
    if training_args.bf16 or training_args.fp16:
        raise ConfigError("this machine has no CUDA device and the recipe asks for bf16/fp16: use a CPU recipe (bf16: false)")
    training_args.use_cpu = True
    training_args.gradient_checkpointing = False
    if hasattr(training_args, "activation_checkpointing"):
        training_args.activation_checkpointing = False


# --------------------------------------------------------------------------- inputs


def check_model_path(model_name_or_path: str | None, *, chat_template: bool = False):
    """The model's config, once the checkpoint is known to be usable; ConfigError naming what is wrong.

    A local directory is checked without loading any weights: config.json parses and has a model_type
    transformers knows, the weights are all there and whole (`weights_problem`), the tokenizer files are
    there, with a chat template when the stage renders conversations (`chat_template`, SFT and RL). A Hub
    id ("org/name") is checked as far as its config, from the cache or the Hub.
    """
    from transformers import AutoConfig

    if not model_name_or_path:
        raise ConfigError("model_name_or_path is not set (in the recipe or as --model_name_or_path)")
    where = f"model_name_or_path {model_name_or_path}"
    path = Path(model_name_or_path)
    looks_local = path.is_absolute() or model_name_or_path.startswith(".") or model_name_or_path.count("/") != 1
    if not path.exists() and looks_local:  # a Hub id is exactly "org/name"
        raise ConfigError(f"{where}: no such directory")
    if path.exists():
        problem = model_dir_problem(path, chat_template)
        if problem:
            raise ConfigError(f"{where}: {problem}")
    try:
        return AutoConfig.from_pretrained(model_name_or_path)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{where}: config.json does not load ({first_line(e)})" if path.exists() else
                          f"{where}: not a local model directory nor a cached Hub model ({first_line(e)})") from None


def model_dir_problem(path: Path, chat_template: bool = False) -> str | None:
    """What keeps the local checkpoint directory `path` from loading for training, or None."""
    if not path.is_dir():
        return "not a directory (a from_pretrained checkpoint is a directory)"
    if not (path / "config.json").is_file():
        if (path / "adapter_config.json").is_file():
            return ("a PEFT adapter without its base model (no config.json): the stages start from a full model; "
                    "merge it first (peft's merge_and_unload, then save_pretrained)")
        inside = sorted(d.name for d in path.iterdir() if (d / "config.json").is_file())
        hint = f"; model directories inside it: {', '.join(inside[:8])}" if inside else ""
        return f"not a model directory (no config.json{hint})"
    config, problem = read_json(path / "config.json")
    if problem:
        return problem
    if not isinstance(config.get("model_type"), str):
        return "config.json has no 'model_type' (transformers needs it to pick the architecture, e.g. \"llama\")"
    problem = weights_problem(path)
    if problem:
        return problem
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return (f"no tokenizer ({' or '.join(TOKENIZER_FILES)}); save it beside the model "
                "(tokenizer.save_pretrained)")
    if chat_template and not (path / "chat_template.jinja").is_file():
        tokenizer_config, problem = read_json(path / "tokenizer_config.json")
        if problem and (path / "tokenizer_config.json").is_file():
            return problem
        if not (tokenizer_config or {}).get("chat_template"):
            return "the tokenizer has no chat template (this stage renders conversations with it)"
    return None


def read_json(file: Path) -> tuple[dict | None, str | None]:
    """(the JSON object in `file`, None), or (None, what is wrong with it)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"no {file.name}"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{file.name} is not valid JSON ({e})"
    if not isinstance(data, dict):
        return None, f"{file.name} must hold a JSON object, not {type(data).__name__}"
    return data, None


SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")


def weights_problem(directory: Path) -> str | None:
    """Why the weights in `directory` (a full model, sharded or not, or a PEFT adapter) would not load,
    or None. Cheap: it reads each file's header or directory, not the tensors, and catches what a cut-short
    copy or save leaves (a missing shard, a truncated file)."""
    index = next((directory / name for name in SHARD_INDEXES if (directory / name).is_file()), None)
    if index is not None:
        data, problem = read_json(index)
        if problem:
            return problem
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            return f"{index.name} has no weight_map"
        files = [directory / name for name in sorted(set(map(str, weight_map.values())))]
    else:
        files = [directory / name for name in SINGLE_WEIGHTS if (directory / name).is_file()][:1]
    if not files:
        return f"no weights (expected one of {', '.join(SINGLE_WEIGHTS + SHARD_INDEXES)})"
    for file in files:
        problem = file_problem(file)
        if problem:
            return problem
    return None


def file_problem(file: Path) -> str | None:
    """Why a weights/optimizer file does not open (missing, empty, truncated), or None."""
    if not file.is_file():
        return f"{file.name} is missing"
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:  # reads the header and checks that the data it describes is all there
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as e:
            return f"{file.name} is truncated or corrupt ({e})"
        return None
    try:  # torch.save writes a zip archive whose directory comes last: a cut-short file has none
        with zipfile.ZipFile(file):
            pass
    except (zipfile.BadZipFile, OSError) as e:
        return f"{file.name} is truncated or not a torch archive ({e})"
    return None


def load_splits(dataset_path: str | None, splits: list[str], columns: list[str]):
    """The requested splits of a DatasetDict saved with `save_to_disk`, each checked for `columns`."""
    from datasets import DatasetDict, load_from_disk
    from pyarrow import ArrowException

    if not dataset_path:
        raise ConfigError("dataset_path is not set (in the recipe or as --dataset_path)")
    path = Path(dataset_path)
    if not path.exists():
        raise ConfigError(f"dataset_path {dataset_path}: no such directory (expected a DatasetDict saved with "
                          "save_to_disk: no dataset_dict.json)")
    if not (path / "dataset_dict.json").is_file():
        raise ConfigError(f"dataset_path {dataset_path}: not a DatasetDict saved with save_to_disk "
                          "(no dataset_dict.json)")
    try:
        dataset_dict = load_from_disk(str(path))
    except (OSError, ValueError, KeyError, TypeError, ArrowException) as e:  # a damaged or foreign save
        raise ConfigError(f"dataset_path {dataset_path}: does not load ({first_line(e)})") from None
    if not isinstance(dataset_dict, DatasetDict):
        raise ConfigError(f"dataset_path {dataset_path}: a single Dataset, not a DatasetDict with splits")
    for split in splits:
        if split not in dataset_dict:
            raise ConfigError(f"dataset_path {dataset_path}: no {split!r} split (has {sorted(dataset_dict)})")
        missing = [c for c in columns if c not in dataset_dict[split].column_names]
        if missing:
            raise ConfigError(f"dataset_path {dataset_path}[{split!r}]: missing columns {missing} "
                              f"(has {dataset_dict[split].column_names})")
        if len(dataset_dict[split]) == 0:
            raise ConfigError(f"dataset_path {dataset_path}[{split!r}]: the split is empty")
    return DatasetDict({split: dataset_dict[split] for split in splits})


# --------------------------------------------------------------------------- model


def load_tokenizer(model_name_or_path: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"model_name_or_path {model_name_or_path}: the tokenizer does not load "
                          f"({first_line(e)})") from None
    if tokenizer.pad_token is None:  # base checkpoints without one (Llama); labels mask padding anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(model_args, training_args):
    """`AutoModelForCausalLM` in the recipe's dtype (fp32 unless set; `auto`: nanocomposer.dtypes) with the KV cache off.

    The cache must be off while training: when the model builds a cache it skips transformers' packed-
    sequence detection (masking_utils only looks at `position_ids` with no cache and no attention mask),
    and packed documents would silently attend to each other.
    """
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() and not getattr(training_args, "use_cpu", False) else "cpu"
    dtype = resolve_dtype(model_args.dtype, device)
    if model_args.dtype == "auto":
        print0(f"dtype auto -> {str(dtype).removeprefix('torch.')} "
               f"({'native' if native_bf16(device) else 'no native'} bf16 on this {device})")
    where = f"model_name_or_path {model_args.model_name_or_path}"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            dtype=dtype,
            attn_implementation=model_args.attn_implementation,
            output_loading_info=True,
        )
    except torch.OutOfMemoryError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as e:  # corrupt files, shape mismatches
        raise ConfigError(f"{where}: the weights do not load ({first_line(e)})") from None
    # transformers initialises missing weights at random and only logs it: training on from there is garbage.
    missing, mismatched = sorted(info.get("missing_keys", ())), list(info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise ConfigError(f"{where}: incomplete weights: missing {missing[:3]}{' ...' if len(missing) > 3 else ''}"
                          f"{f', shape mismatches {mismatched[:3]}' if mismatched else ''}")
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
    # Membership, not `id == unk_token_id`: SmolLM2's unknown token IS <|endoftext|> (id 0).
    token_id = tokenizer.get_vocab().get(token) if token is not None else None
    if token_id is None:
        raise ConfigError(f"document_separator {token!r} is not a token of the tokenizer")
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
