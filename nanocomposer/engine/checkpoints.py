"""Checkpoint loading: a `from_pretrained` directory (full model or PEFT adapter) or a hub id, checked before
transformers sees it, so every failure is a `ModelLoadError` naming the path and what is wrong with it.

    model, tokenizer = load_model_and_tokenizer("runs/tiny/sft")          # weights, eval mode
    path, config, eos_ids, tokenizer = load_config_and_tokenizer(path)    # no weights (vLLM loads its own)

Loading is the policy's input, not its job: `nanocomposer.policy.ModelPolicy` takes what this returns, and
benches and tests load through the same checks.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch

import nanocomposer.smeared_llama  # noqa: F401  (registers the embedded architecture before any from_pretrained)
from nanocomposer.dtypes import native_bf16

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# transformers' from_pretrained is not thread-safe: two threads loading at once (the agent server's workers after a
# promotion) both came back without the tied lm_head, in every try. One load at a time per process.
_LOAD_LOCK = threading.Lock()


class ModelLoadError(RuntimeError):
    """A checkpoint that cannot be used; the message names the path and what is wrong with it."""


def is_model_dir(path) -> bool:
    """Whether `path` is a directory that claims to be a checkpoint (config.json or adapter_config.json).

    Cheap (no loading): for routing a policy spec. Whether it actually loads is `load_model_and_tokenizer`'s
    business, which says what is wrong when it does not.
    """
    try:
        p = Path(path)
        return p.is_dir() and ((p / "config.json").is_file() or (p / "adapter_config.json").is_file())
    except (TypeError, OSError):
        return False


def _read_json(file: Path, where: str) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{where}: {file.name} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{where}: {file.name} must hold a JSON object, got {type(data).__name__}")
    return data


def _check_model_dir(path: Path) -> None:
    """The files a full-model checkpoint needs, checked before transformers gives a vaguer error."""
    where = f"checkpoint {str(path)!r}"
    if not (path / "config.json").is_file():
        stages = sorted(p.name for p in path.iterdir() if is_model_dir(p))
        hint = f" (model directories inside it: {', '.join(stages[:8])})" if stages else ""
        raise ModelLoadError(f"{where}: no config.json, so not a from_pretrained directory{hint}")
    config = _read_json(path / "config.json", where)
    if not isinstance(config.get("model_type"), str):
        raise ModelLoadError(f"{where}: config.json has no 'model_type' (keys: {sorted(config)[:10]})")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ModelLoadError(f"{where}: config.json but no weights (expected one of {', '.join(WEIGHT_FILES)})")


def _check_tokenizer_dir(path: Path, where: str) -> None:
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(f"{where}: no tokenizer (expected {' or '.join(TOKENIZER_FILES)} in {str(path)!r})")


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_weights(path: Path, where: str, device: str, dtype=None):
    from transformers import AutoModelForCausalLM

    try:
        # The checkpoint's own dtype, except a bf16/fp16 one on a CPU without bf16 arithmetic, where emulated
        # half precision decodes many times slower than fp32 (nanocomposer.dtypes): upcast, which loses nothing.
        if dtype is None:
            dtype = "auto" if str(device).startswith("cuda") or native_bf16(device) else torch.float32
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype=dtype)
    except Exception as e:  # corrupt safetensors, unknown architecture, shape errors: all name the path
        raise ModelLoadError(f"{where}: weights failed to load: {type(e).__name__}: {e}") from e
    # transformers initialises missing weights at random and only logs it: an eval of that is garbage.
    missing, mismatched = sorted(info.get("missing_keys", ())), list(info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise ModelLoadError(f"{where}: incomplete weights: missing {missing[:5]}{' ...' if len(missing) > 5 else ''}"
                             f"{f', shape mismatches {mismatched[:3]}' if mismatched else ''}")
    return model.to(device)


def _adapter_base(path: Path, where: str) -> Path:
    """The base model directory of a PEFT adapter directory, checked."""
    config = _read_json(path / "adapter_config.json", where)
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ModelLoadError(f"{where}: adapter_config.json has no 'base_model_name_or_path'")
    if not any((path / f).is_file() for f in ADAPTER_WEIGHT_FILES):
        raise ModelLoadError(f"{where}: adapter_config.json but no adapter weights "
                             f"(expected {' or '.join(ADAPTER_WEIGHT_FILES)})")
    # Relative bases are tried against the adapter directory first, then the working directory.
    base_path = path / base if not Path(base).is_absolute() and (path / base).exists() else Path(base)
    if not is_model_dir(base_path):
        raise ModelLoadError(f"{where}: its base model {base!r} is not a local checkpoint directory")
    _check_model_dir(base_path)
    return base_path


def _load_adapter(path: Path, base_path: Path, where: str, device: str):
    """Base model + PEFT adapter, merged in fp32: this is an inference copy (RL passes the live model instead).

    Equivalent to peft's AutoPeftModelForCausalLM, but the base goes through `_load_weights`, so a
    broken base is reported (and missing tensors caught) like any other checkpoint. The merge is in fp32 whatever
    the base's dtype: merged into bf16 weights most of a small update rounds away (model_io.save_final_model).
    """
    try:
        from peft import PeftModel
    except ImportError as e:
        raise ModelLoadError(f"{where}: is a PEFT adapter but peft is not installed") from e
    base_model = _load_weights(base_path, f"base model {str(base_path)!r} of adapter {str(path)!r}", device,
                               dtype=torch.float32)
    try:
        model = PeftModel.from_pretrained(base_model, path)
    except Exception as e:
        raise ModelLoadError(f"{where}: adapter failed to load onto {str(base_path)!r}: {type(e).__name__}: {e}") from e
    return model.merge_and_unload()


def resolve_checkpoint(spec) -> Path:
    """A local path as is; a hub id (`Qwen/Qwen2.5-Coder-1.5B-Instruct`) -> its snapshot directory.

    The snapshot comes from the HF cache (or the hub where reachable and HF_HUB_OFFLINE is unset),
    so a hub model then goes through exactly the same checks as a local checkpoint.
    """
    from env.policies import is_checkpoint_spec

    path = Path(spec)
    if path.exists() or not is_checkpoint_spec(str(spec)):
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(spec)))
    except Exception as e:
        raise ModelLoadError(f"checkpoint {str(spec)!r}: not a local directory, and not loadable as a hub id "
                             f"({type(e).__name__}: {e})") from e


def _locate_checkpoint(path) -> tuple[Path, str, Path | None, Path]:
    """(checkpoint dir, how errors name it, base model dir of an adapter or None, tokenizer dir), all checked
    short of loading weights; the shared first half of both loaders below."""
    path = resolve_checkpoint(path)
    where = f"checkpoint {str(path)!r}"
    if not path.exists():
        raise ModelLoadError(f"{where}: no such file or directory")
    if not path.is_dir():
        raise ModelLoadError(f"{where}: not a directory (a from_pretrained checkpoint is a directory)")
    if (path / "adapter_config.json").is_file():
        base_path = _adapter_base(path, where)
        tokenizer_dir = path if any((path / f).is_file() for f in TOKENIZER_FILES) else base_path
    else:
        _check_model_dir(path)
        base_path, tokenizer_dir = None, path
    _check_tokenizer_dir(tokenizer_dir, where)  # before the (slower) weights
    return path, where, base_path, tokenizer_dir


def _load_tokenizer(tokenizer_dir: Path, where: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except Exception as e:
        raise ModelLoadError(f"{where}: tokenizer in {str(tokenizer_dir)!r} failed to load: {type(e).__name__}: {e}") from e
    check_tokenizer(tokenizer, where)
    return tokenizer


def load_model_and_tokenizer(path, device: str | None = None):
    """(model in eval mode on `device`, tokenizer) from a saved model directory or a PEFT adapter directory.

    Raises `ModelLoadError` naming the path for: a missing path, a directory without config.json
    (or adapter_config.json), config.json that is not JSON or has no model_type, no weight files,
    weights that fail to load (truncated/corrupt safetensors) or leave parameters uninitialised, no
    tokenizer, or a tokenizer without a chat template or EOS token. An adapter's tokenizer is taken
    from the adapter directory when it has one, else from the base model's.
    """
    path, where, base_path, tokenizer_dir = _locate_checkpoint(path)
    device = device or _default_device()
    with _LOAD_LOCK:
        if base_path is not None:
            model = _load_adapter(path, base_path, where, device)
        else:
            model = _load_weights(path, where, device)
        tokenizer = _load_tokenizer(tokenizer_dir, where)
    _keep_only_stop_ids(model)
    return model.eval(), tokenizer


def load_config_and_tokenizer(path) -> tuple[Path, object, list[int], object]:
    """(checkpoint dir, model config, the eos ids its generation config stops on, tokenizer), no weights loaded.

    For the vLLM backend, which loads the weights itself: the same checks as `load_model_and_tokenizer`
    except the weights' contents (vLLM reports those). A PEFT adapter directory is refused: vLLM serves a
    merged model, and merging here would mean loading the base with torch, the cost this path avoids.
    """
    from transformers import AutoConfig, GenerationConfig

    path, where, base_path, tokenizer_dir = _locate_checkpoint(path)
    if base_path is not None:
        raise ModelLoadError(
            f"{where}: is a PEFT adapter directory (base {str(base_path)!r}); the vllm backend needs a merged "
            f"model. Merge it once: peft.AutoPeftModelForCausalLM.from_pretrained({str(path)!r})"
            ".merge_and_unload().save_pretrained(OUT), save the tokenizer into OUT, and evaluate OUT; or use "
            "--backend transformers, which merges in memory")
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:
        raise ModelLoadError(f"{where}: config.json failed to load: {type(e).__name__}: {e}") from e
    # What transformers' generate would stop on: generation_config.json, else the model config (as from_pretrained).
    if (path / "generation_config.json").is_file():
        try:
            generation_config = GenerationConfig.from_pretrained(path)
        except Exception as e:
            raise ModelLoadError(f"{where}: generation_config.json failed to load: {type(e).__name__}: {e}") from e
    else:
        generation_config = GenerationConfig.from_model_config(config)
    return path, config, as_id_list(generation_config.eos_token_id), _load_tokenizer(tokenizer_dir, where)


def as_id_list(ids) -> list[int]:
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)



def _keep_only_stop_ids(model) -> None:
    """Drop every decoding knob a training stage may have saved; keep the token ids generation needs."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=saved.eos_token_id, pad_token_id=saved.pad_token_id,
                                               bos_token_id=saved.bos_token_id)


def check_tokenizer(tokenizer, where: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"{where}: the tokenizer has no chat_template (needed to render tool-calling turns)")
    if tokenizer.eos_token_id is None:
        raise ModelLoadError(f"{where}: the tokenizer has no eos_token (generation would never stop)")
