"""Training throughput of our CPT and SFT setups against a plain `transformers.Trainer` baseline.

    python -m bench.train --steps 20
    python -m bench.train --steps 50 --model artifacts/base --corpus artifacts/data/corpus --sft-data artifacts/data/sft/dataset

Same model, same data, same process, one after the other:
- CPT, ours: `Trainer` on packed blocks (train_cpt.py; recipes/tiny/cpt.yaml batch and block size).
  Baseline: `Trainer` on one document per row, truncated to the block size, padded per batch
  (`DataCollatorForLanguageModeling`), the usual run_clm-without-grouping setup.
- SFT, ours: TRL `SFTTrainer` with the tiny recipe (assistant-only loss, bfd packing, padding-free).
  Baseline: `Trainer` on the same rendered conversations (truncated to max_length), assistant-only
  labels, padded per batch.

Tokens/s counts real (non-padding) tokens only; padding is the share of padded positions in the batches
the model saw. Inputs that are missing are built on the fly in a temp dir: a base model of the default
size trained on the stdlib, a corpus of stdlib files, SFT trajectories of the oracle on data/samples.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


class CountingCollator:
    """Wraps a collator and counts real and padded token positions of every batch it builds."""

    def __init__(self, collator):
        self.collator = collator
        self.real = 0
        self.total = 0

    def __call__(self, features):
        batch = self.collator(features)
        self.total += batch["input_ids"].numel()
        mask = batch.get("attention_mask")
        self.real += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        return batch


def timed_train(trainer) -> dict:
    counter = CountingCollator(trainer.data_collator)
    trainer.data_collator = counter
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    return {"steps": trainer.state.global_step, "seconds": seconds, "tokens_per_s": counter.real / seconds,
            "padding": 1 - counter.real / counter.total if counter.total else 0.0}


def bench_args(stage: str, steps: int, out: Path, model: str, data: str, *extra: str):
    module = __import__(f"train_{stage}")
    return module.make_parser().parse_args_and_config([
        "--config", str(REPO_ROOT / f"recipes/tiny/{stage}.yaml"), "--model_name_or_path", model,
        "--dataset_path", data, "--max_steps", str(steps), "--eval_strategy", "no", "--eval_on_start", "false",
        "--save_strategy", "no", "--report_to", "none", "--logging_steps", str(steps), "--output_dir", str(out),
        "--disable_tqdm", "true", *extra,
    ])


def bench_cpt(steps: int, model_path: str, corpus: str, work: Path) -> list[tuple]:
    from transformers import DataCollatorForLanguageModeling, Trainer, default_data_collator

    from nanocomposer.inputs import load_splits
    from nanocomposer.model_io import load_model, load_tokenizer
    from nanocomposer.packing import document_separator_id, pack_documents

    script_args, training_args, model_args = bench_args("cpt", steps, work / "cpt", model_path, corpus)
    training_args.use_cpu = not torch.cuda.is_available()
    tokenizer = load_tokenizer(model_path)
    train = load_splits(corpus, ["train"], ["text"])["train"]
    blocks, _ = pack_documents(train, tokenizer, script_args.block_size,
                               document_separator_id(tokenizer, None), desc="bench")
    ours = timed_train(Trainer(model=load_model(model_args, training_args), args=training_args,
                               train_dataset=blocks, processing_class=tokenizer,
                               data_collator=default_data_collator))

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=script_args.block_size,
                         add_special_tokens=False)

    documents = train.map(tokenize, batched=True, remove_columns=train.column_names)
    baseline = timed_train(Trainer(model=load_model(model_args, training_args), args=training_args,
                                   train_dataset=documents, processing_class=tokenizer,
                                   data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False)))
    return [("CPT", "ours: packed blocks, block-causal", ours),
            ("CPT", "baseline: Trainer, 1 doc/row, padded", baseline)]


def bench_sft(steps: int, model_path: str, sft_data: str, work: Path) -> list[tuple]:
    from transformers import DataCollatorForSeq2Seq, Trainer
    from trl import SFTTrainer

    from nanocomposer.inputs import load_splits
    from nanocomposer.model_io import load_model, load_tokenizer

    _, training_args, model_args = bench_args("sft", steps, work / "sft", model_path, sft_data)
    training_args.use_cpu = not torch.cuda.is_available()
    tokenizer = load_tokenizer(model_path)
    train = load_splits(sft_data, ["train"], ["messages", "tools"])["train"].select_columns(["messages", "tools"])
    ours = timed_train(SFTTrainer(model=load_model(model_args, training_args), args=training_args,
                                  train_dataset=train, processing_class=tokenizer))

    def render(row):
        rendered = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), tokenize=True,
                                                 return_dict=True, return_assistant_tokens_mask=True)
        ids = rendered["input_ids"][: training_args.max_length]
        mask = rendered["assistant_masks"][: training_args.max_length]
        return {"input_ids": ids, "attention_mask": [1] * len(ids),
                "labels": [t if m else -100 for t, m in zip(ids, mask)]}

    conversations = train.map(render, remove_columns=train.column_names)
    training_args.per_device_train_batch_size = 2  # ~ the tokens of one packed 4k row
    baseline = timed_train(Trainer(model=load_model(model_args, training_args), args=training_args,
                                   train_dataset=conversations, processing_class=tokenizer,
                                   data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True)))
    return [("SFT", "ours: SFTTrainer, bfd packing, padding-free", ours),
            ("SFT", "baseline: Trainer, 2 convs/batch, padded", baseline)]


def ensure_inputs(args, work: Path) -> None:
    """Fill in missing --model/--corpus/--sft-data with small stand-ins built in `work`."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if not (Path(args.model) / "config.json").is_file():
        from nanocomposer.model import build_base

        print(f"[bench] no model at {args.model}: building a default-size base on the stdlib", flush=True)
        args.model = str(build_base(work / "base", stdlib))
    if not (Path(args.corpus) / "dataset_dict.json").is_file():
        from datasets import Dataset, DatasetDict

        print(f"[bench] no corpus at {args.corpus}: using 300 stdlib files", flush=True)
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:300]]
        DatasetDict({"train": Dataset.from_dict({"text": texts})}).save_to_disk(str(work / "corpus"))
        args.corpus = str(work / "corpus")
    if not (Path(args.sft_data) / "dataset_dict.json").is_file():
        from data.build_sft import build

        print(f"[bench] no SFT data at {args.sft_data}: oracle trajectories on data/samples", flush=True)
        build(REPO_ROOT / "data/samples", work / "sft", variants=2, seed=0, workers=2, limit=None)
        args.sft_data = str(work / "sft" / "dataset")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.train", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per setup")
    parser.add_argument("--model", default="artifacts/base")
    parser.add_argument("--corpus", default="artifacts/data/corpus")
    parser.add_argument("--sft-data", default="artifacts/data/sft/dataset")
    parser.add_argument("--only", choices=["cpt", "sft"], default=None)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO_ROOT))  # train_cpt / train_sft are top-level scripts
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        work = Path(tmp)
        ensure_inputs(args, work)
        rows = []
        if args.only in (None, "cpt"):
            rows += bench_cpt(args.steps, args.model, args.corpus, work)
        if args.only in (None, "sft"):
            rows += bench_sft(args.steps, args.model, args.sft_data, work)

    print(f"\ntorch threads {torch.get_num_threads()}, {args.steps} steps per setup, model {args.model}")
    print(f"{'stage':5} {'setup':46} {'tokens/s':>9} {'padding':>8} {'vs baseline':>12}")
    for i, (stage, name, result) in enumerate(rows):
        baseline = rows[i + 1][2] if i % 2 == 0 else result
        ratio = result["tokens_per_s"] / baseline["tokens_per_s"]
        print(f"{stage:5} {name:46} {result['tokens_per_s']:9,.0f} {result['padding']:8.1%} {ratio:11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
