"""SFT training speed: the recipe's trainer against a plain TRL SFTTrainer, same model, same packed row.

    python -m bench.sft_speed --config recipes/smol/sft.yaml --model artifacts/base --steps 3
    python -m bench.sft_speed --config recipes/smol/sft.yaml --dataset artifacts/smol_ladder/sft/dataset --json out.json

"recipe": what `train_sft.py --config FILE` trains with, built by the same functions (the recipe parsed by
RecipeParser into SFTScriptArguments / SFTConfig / ModelConfig; `load_model` in the recipe's dtype,
`peft_config` from its LoRA keys, `sft_trainer_class`, which on CPU is the labelled-only-head trainer).
"plain": `SFTTrainer` as its documentation shows it, full fine-tuning of the fp32 model with TRL's own loss, on
the same SFTConfig (so the same packing, max_length, assistant-only mask, batch and learning rate).

Both trainers pack the first `--rows` training conversations and take the first packed row; each step is
forward + backward + optimizer step. The arms alternate A/B/A/B after one warm-up step each, in one process, so
compare the ratio, not the seconds, on a shared machine. Tokens/s counts every position of the row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def build_trainers(config: str, model: str | None, dataset: str | None, rows: int, out: str):
    import torch
    from trl import ModelConfig, SFTConfig, SFTTrainer

    from nanocomposer.config import RecipeParser, SFTScriptArguments
    from nanocomposer.dtypes import resolve_dtype
    from nanocomposer.inputs import load_splits
    from nanocomposer.model_io import load_model, load_tokenizer, peft_config
    from nanocomposer.sft_loss import sft_trainer_class

    flags = ["--config", config, "--output_dir", out, "--report_to", "none", "--run", "bench-sft-speed"]
    flags += ["--model_name_or_path", model] if model else []
    flags += ["--dataset_path", dataset] if dataset else []
    script_args, training_args, model_args = RecipeParser((SFTScriptArguments, SFTConfig, ModelConfig)) \
        .parse_args_and_config(flags)
    data = load_splits(script_args.dataset_path, [script_args.dataset_train_split], ["messages", "tools"])
    data = data[script_args.dataset_train_split].select_columns(["messages", "tools"])
    data = data.select(range(min(rows, len(data))))
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    recipe_cls = sft_trainer_class(script_args.labelled_only_head, training_args)
    recipe = recipe_cls(model=load_model(model_args, training_args), args=training_args, train_dataset=data,
                        processing_class=tokenizer, peft_config=peft_config(model_args))
    plain_model_args = ModelConfig(model_name_or_path=model_args.model_name_or_path, dtype="float32")
    plain = SFTTrainer(model=load_model(plain_model_args, training_args), args=training_args, train_dataset=data,
                       processing_class=tokenizer)
    device = "cpu" if getattr(training_args, "use_cpu", False) or not torch.cuda.is_available() else "cuda"
    settings = {"trainer": recipe_cls.__name__, "dtype": str(resolve_dtype(model_args.dtype, device)).removeprefix("torch."), "use_peft": model_args.use_peft,
                "lora_r": model_args.lora_r if model_args.use_peft else None, "max_length": training_args.max_length,
                "model": model_args.model_name_or_path, "dataset": script_args.dataset_path}
    return {"recipe": recipe, "plain": plain}, settings


def one_step(trainer, batch: dict) -> float:
    started = time.perf_counter()
    trainer.training_step(trainer.model, dict(batch))
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def measure(config: str, model: str | None, dataset: str | None, rows: int, steps: int) -> dict:
    import torch

    with tempfile.TemporaryDirectory() as out:
        trainers, settings = build_trainers(config, model, dataset, rows, out)
        batches = {}
        for name, trainer in trainers.items():
            batches[name] = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
            trainer.create_optimizer()
            trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which this bypasses
            trainer.model.train()
        if not torch.equal(batches["recipe"]["input_ids"], batches["plain"]["input_ids"]):
            raise RuntimeError("the two trainers packed different rows: the comparison would not be like for like")
        seconds = {name: [] for name in trainers}
        for i in range(steps + 1):
            for name, trainer in trainers.items():
                took = one_step(trainer, batches[name])
                if i:  # the first step of each arm pays allocation and compilation
                    seconds[name].append(took)
    tokens = batches["recipe"]["input_ids"].size(1)
    labelled = int((batches["recipe"]["labels"] != -100).sum())
    median = {name: statistics.median(s) for name, s in seconds.items()}
    return {**settings, "tokens": tokens, "labelled": labelled, "threads": torch.get_num_threads(), "steps": steps,
            **{f"{name}_s": [round(x, 4) for x in s] for name, s in seconds.items()},
            **{f"{name}_tokens_per_s": round(tokens / median[name], 1) for name in median},
            "speedup_median": round(median["plain"] / median["recipe"], 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="recipes/smol/sft.yaml", help="the SFT recipe whose trainer is measured")
    p.add_argument("--model", default=None, help="override the recipe's model_name_or_path (e.g. artifacts/base)")
    p.add_argument("--dataset", default=None, help="override the recipe's dataset_path")
    p.add_argument("--rows", type=int, default=48, help="conversations to pack (the first packed row is used)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per arm, after one warm-up")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.rows < 1 or args.steps < 1:
        p.error("--rows and --steps must be at least 1")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    result = {**measure(args.config, args.model, args.dataset, args.rows, args.steps),
              "load_before": load_before, "load_after": os.getloadavg()[0]}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
