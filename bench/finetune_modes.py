"""Training step speed of a checkpoint on this CPU: full fine-tuning vs LoRA, fp32 vs bf16, side by side.

    python -m bench.finetune_modes --model artifacts/base --seq 512 --steps 2
    python -m bench.finetune_modes --model artifacts/base --modes full,lora --dtypes float32,bfloat16 --threads 2

One row of `--seq` random token ids, the last `--labelled` share labelled (an SFT row's assistant part);
forward + backward + AdamW step; the best of `--steps` steps after none of warm-up is reported (the first step
pays allocation). Every arm runs in this process one after the other, so compare the ratios, not the seconds,
on a shared machine. LoRA: rank 16, alpha 32, every linear layer (peft's `all-linear`).
"""

from __future__ import annotations

import argparse
import json
import time


def measure(model_path: str, mode: str, dtype_name: str, seq: int, steps: int, labelled: float) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    import nanocomposer.smeared_llama  # noqa: F401 -- registers the tiny preset's architecture (any base can be timed)

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype_name))
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, seq), generator=generator)
    labels = ids.clone()
    labels[:, : int(seq * (1 - labelled))] = -100
    best = float("inf")
    for _ in range(steps):
        started = time.perf_counter()
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        best = min(best, time.perf_counter() - started)
    return {"mode": mode, "dtype": dtype_name, "seq": seq, "seconds": round(best, 3),
            "tokens_per_s": round(seq / best, 1), "trainable": sum(p.numel() for p in params)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="artifacts/base")
    p.add_argument("--modes", default="full,lora")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--labelled", type=float, default=0.3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.seq < 8 or args.steps < 1 or not 0 < args.labelled <= 1:
        p.error("--seq must be at least 8, --steps at least 1, --labelled in (0, 1]")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for mode in args.modes.split(","):
        for dtype in args.dtypes.split(","):
            if mode not in ("full", "lora") or dtype not in ("float32", "bfloat16", "float16"):
                p.error(f"unknown mode {mode!r} or dtype {dtype!r} (modes: full, lora; dtypes: float32, bfloat16)")
            rows.append(measure(args.model, mode, dtype, args.seq, args.steps, args.labelled))
            r = rows[-1]
            print(f"{r['mode']:>4} {r['dtype']:>8}: {r['seconds']:6.2f} s/step  {r['tokens_per_s']:7.1f} tokens/s  "
                  f"({r['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x the first arm; {r['trainable']:,} trainable)",
                  flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"threads": torch.get_num_threads(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
