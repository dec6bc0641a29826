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
