"""Peak memory and time of one GRPO scoring pass: the LoRA forward and backward TRL runs on a step's episodes.

    python -m bench.grpo_memory --model runs/sl3/sft                    # 1x4096 and 4x4096, checkpointing on; 1x4096 off
    python -m bench.grpo_memory --model runs/sl3/sft --shapes 1x2048:on 2x2048:on

Each shape runs in its own process (peak RSS is per process), as TRL's GRPOTrainer scores a micro-batch: TRL's
fused LM head (`add_fused_lm_head`, log-probs and entropy, no full logits) under the LoRA of `--recipe`
(default recipes/smol/rl.yaml: r 32, all-linear), in the checkpoint's dtype, one forward and one backward. Token ids are random; rows after
the first are a quarter padding, as a step's episodes are padded to the longest. What the step adds on top (the
optimizer's LoRA state, the rollout's KV caches, freed before scoring) is small beside these.

Measured with this module's defaults on this project's 2-core CPU (bf16), the SmolLM2-135M SFT model of run sl3,
one process at a time, idle (2026-12-05; docs/log.md):

    shape      checkpointing   time      peak RSS
    1 x 4096   on              26.7 s    7.06 GB
    4 x 4096   on              145.2 s   10.05 GB
    1 x 4096   off             19.2 s    10.05 GB

So a step of 4 episodes scored as 4 micro-batches of 1 holds one episode's activations (7.1 GB) and takes about
4 x 27 = 107 s, against 145 s and 10.1 GB as one batch; without checkpointing one batch of 4 is out of this
machine's 23 GiB (the GRPO runs that were OOM-killed at 24.4 GB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

# One shape, in a fresh interpreter: prints a JSON line {"seconds", "peak_rss_gb", "load_rss_gb"}.
ONE_SHAPE = r"""
import json, resource, sys, time
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
from trl.trainer.utils import add_fused_lm_head

model_path, batch, seq_len, checkpointing = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "on"
lora = json.loads(sys.argv[5])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto")
add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # before PEFT, as TRL does
model = get_peft_model(model, LoraConfig(**lora, task_type="CAUSAL_LM"))
if checkpointing:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
model.train()
ids = torch.randint(0, model.config.vocab_size, (batch, seq_len))
mask = torch.ones_like(ids)
mask[1:, seq_len * 3 // 4:] = 0
load_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
started = time.perf_counter()
out = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100), fused_lm_head=True)
(out.log_probs.sum() + 0.0 * out.entropy.sum()).backward()
print(json.dumps({"seconds": time.perf_counter() - started, "load_rss_gb": load_rss,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}))
"""


def parse_shape(text: str) -> tuple[int, int, str]:
    """'4x4096:on' -> (4, 4096, 'on')."""
    try:
        size, checkpointing = text.split(":")
        batch, seq_len = (int(x) for x in size.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected BATCHxTOKENS:on|off, e.g. 4x4096:on") from None
    if checkpointing not in ("on", "off") or batch < 1 or seq_len < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: expected BATCHxTOKENS:on|off, e.g. 4x4096:on")
    return batch, seq_len, checkpointing


def recipe_lora(recipe: Path) -> dict:
    """The recipe's LoRA as peft.LoraConfig keywords (the same keys TRL's ModelConfig reads)."""
    if not recipe.is_file():
        raise SystemExit(f"grpo_memory: no recipe at {recipe}")
    values = yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}
    missing = [k for k in ("lora_r", "lora_alpha", "lora_target_modules") if k not in values]
    if missing:
        raise SystemExit(f"grpo_memory: {recipe} sets no {', '.join(missing)}: give a recipe with a LoRA")
    return {"r": values["lora_r"], "lora_alpha": values["lora_alpha"],
            "target_modules": values["lora_target_modules"], "lora_dropout": values.get("lora_dropout", 0.0)}


def measure(model: str, batch: int, seq_len: int, checkpointing: str, lora: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", ONE_SHAPE, model, str(batch), str(seq_len), checkpointing,
                           json.dumps(lora)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:  # -9: the kernel's OOM killer; the shape does not fit this machine
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a causal LM checkpoint directory (e.g. runs/sl3/sft)")
    parser.add_argument("--recipe", type=Path, default=Path("recipes/smol/rl.yaml"),
                        help="the RL recipe whose LoRA (lora_r, lora_alpha, lora_target_modules) is measured")
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=[(1, 4096, "on"), (4, 4096, "on"),
                                                                          (1, 4096, "off")],
                        help="BATCHxTOKENS:on|off (activation checkpointing), one process each")
    args = parser.parse_args(argv)
    lora = recipe_lora(args.recipe)
    print("| shape | checkpointing | time | peak RSS |\n|---|---|---|---|")
    for batch, seq_len, checkpointing in args.shapes:
        result = measure(args.model, batch, seq_len, checkpointing, lora)
        cells = ([result["error"], ""] if "error" in result
                 else [f"{result['seconds']:.1f} s", f"{result['peak_rss_gb']:.2f} GB"])
        print(f"| {batch} x {seq_len} | {checkpointing} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
