"""Input checks a stage runs before any training step: the model directory, its weights and files, the dataset.
Each raises (or returns) a ConfigError-ready message naming the bad input."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from nanocomposer.common import first_line
from nanocomposer.config import ConfigError
from nanocomposer.engine.checkpoints import TOKENIZER_FILES

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
