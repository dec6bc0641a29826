"""The stages' models: tokenizer and model loading in the recipe's dtype, LoRA config, device settings, and the
final save (LoRA merged, so the next stage loads a plain checkpoint)."""

from __future__ import annotations

from pathlib import Path

import torch

import nanocomposer.smeared_llama  # noqa: F401  (registers the embedded base's model type before any load)
from nanocomposer.common import first_line, print0
from nanocomposer.config import ConfigError
from nanocomposer.dtypes import native_bf16, resolve_dtype

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


def _from_pretrained(name: str, revision: str | None, dtype, attn_implementation: str | None = None):
    """`AutoModelForCausalLM.from_pretrained`, every failure and every missing weight a ConfigError naming `name`."""
    from transformers import AutoModelForCausalLM

    where = f"model_name_or_path {name}"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(name, revision=revision, dtype=dtype,
                                                           attn_implementation=attn_implementation,
                                                           output_loading_info=True)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # missing or corrupt files, shape mismatches, an unknown architecture
        raise ConfigError(f"{where}: the weights do not load ({first_line(e)})") from e
    # transformers initialises missing weights at random and only logs it: training on from there is garbage.
    missing, mismatched = sorted(info.get("missing_keys", ())), list(info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise ConfigError(f"{where}: incomplete weights: missing {missing[:3]}{' ...' if len(missing) > 3 else ''}"
                          f"{f', shape mismatches {mismatched[:3]}' if mismatched else ''}")
    return model


def load_model(model_args, training_args):
    """`AutoModelForCausalLM` in the recipe's dtype (fp32 unless set; `auto`: nanocomposer.dtypes) with the KV cache off.

    The cache must be off while training: when the model builds a cache it skips transformers' packed-
    sequence detection (masking_utils only looks at `position_ids` with no cache and no attention mask),
    and packed documents would silently attend to each other.
    """
    device = "cuda" if torch.cuda.is_available() and not getattr(training_args, "use_cpu", False) else "cpu"
    dtype = resolve_dtype(model_args.dtype, device)
    if model_args.dtype == "auto":
        print0(f"dtype auto -> {str(dtype).removeprefix('torch.')} "
               f"({'native' if native_bf16(device) else 'no native'} bf16 on this {device})")
    model = _from_pretrained(model_args.model_name_or_path, model_args.model_revision, dtype,
                             attn_implementation=model_args.attn_implementation)
    model.config.use_cache = False
    return model


def peft_config(model_args):
    """A LoRA config from TRL's ModelConfig (`use_peft`, `lora_r`, ...), or None."""
    from trl import get_peft_config

    return get_peft_config(model_args)


def save_final_model(model, tokenizer, output_dir: Path, *, source: str, revision: str | None = None) -> None:
    """Save a plain transformers checkpoint: LoRA adapters are merged so the next stage loads it as is.

    `source` (and `revision`) name the checkpoint the model was loaded from (`model_name_or_path`).

    The merge must keep the update. A LoRA update is small next to the weights it changes (|delta|/|W| 3e-4 after 16
    GRPO steps): merged into bf16 weights, any part of it under half a bf16 step (0.2-0.4% of a weight) rounds
    away, and 92% of that update did (`python -m bench.merge_precision`). So where the base ran in half precision
    (`dtype: auto` on a bf16 device), the adapter is merged into `source` read again in fp32 and the model is saved
    in fp32: the half-precision copy was for compute, the fp32 checkpoint is the master copy (as in mixed-precision
    training), so chained stages and real-time cycles add their updates without losing the earlier ones. The saved
    model is the policy that was trained up to the base's own compute rounding.
    """
    from peft import PeftModel

    if isinstance(model, PeftModel):
        if model.get_base_model().get_input_embeddings().weight.dtype in (torch.float16, torch.bfloat16):
            try:
                model = _fp32_master(model, source, revision)
            except (ConfigError, RuntimeError) as e:  # the trained update is kept, unmerged, before saying so
                kept = Path(output_dir) / "adapter"
                model.save_pretrained(kept)
                raise ConfigError(f"merging the trained adapter into {source} read again in fp32: {e}; the adapter "
                                  f"is saved unmerged in {kept}") from e
        model = model.merge_and_unload()
    model.config.use_cache = True  # restored for generation; training turned it off (see load_model)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)


def _fp32_master(model, source: str, revision: str | None):
    """`model`'s trained adapter on `source`'s weights in fp32 (see save_final_model)."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    name = model.active_adapter
    master = _from_pretrained(source, revision, torch.float32)  # read again: the fp32 weights, not the bf16 copy
    master = get_peft_model(master, model.peft_config[name])
    result = set_peft_model_state_dict(master, get_peft_model_state_dict(model, adapter_name=name))
    unexpected = list(getattr(result, "unexpected_keys", ()) or ())
    missing = [k for k in getattr(result, "missing_keys", ()) or () if "lora_" in k or "modules_to_save" in k]
    if unexpected or missing:
        raise RuntimeError(f"the trained adapter does not fit {source} read in fp32: "
                           f"unexpected {unexpected[:3]}, missing {missing[:3]}")
    return master


def configure_device(training_args) -> None:
    """Without CUDA: train on the CPU, in the weights' own dtype (no autocast).

    Activation checkpointing is left as the recipe sets it: the CPU presets that score long episodes need it
    (recipes/smol/rl.yaml: one 4,096-token episode's LoRA forward and backward peaks at 10.1 GB without it, 7.1 GB
    with it; bench/grpo_memory.py), and the tiny presets turn it off themselves.
    """
    if torch.cuda.is_available():
        return
    if training_args.bf16 or training_args.fp16:
        raise ConfigError("this machine has no CUDA device and the recipe asks for bf16/fp16: use a CPU recipe (bf16: false)")
    training_args.use_cpu = True
