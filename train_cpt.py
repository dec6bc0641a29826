"""Stage 1: continued pretraining (CPT) of a base model on the packed code corpus.

    python train_cpt.py --config recipes/smol/cpt.yaml --run demo                 # CPU, SmolLM2-135M (default)
    python train_cpt.py --config recipes/tiny/cpt.yaml --run demo                 # CPU, the from-scratch tiny model
    python train_cpt.py --config recipes/gpu/cpt.yaml --run r1                    # one GPU, Qwen2.5-Coder-0.5B
    python train_cpt.py --config recipes/tiny/cpt.yaml --run demo --resume        # continue after a crash
    python train_cpt.py --config recipes/tiny/cpt.yaml --max_steps 50 --report_to none   # CLI beats YAML

Output: runs/<run>/cpt/ with the model and tokenizer (LoRA merged), config.yaml, README.md (model card),
data_manifest.json, checkpoints and the offline W&B run.

Plain `transformers.Trainer` rather than TRL's SFTTrainer: on CPU it is ~1.6x faster (SFTTrainer's
chunked LM-head loss) and SFTTrainer's default bfd packing truncates every document to max_length.
Packing is ours (`nanocomposer.packing.pack_documents`): full blocks, no
padding, `position_ids` restarting at every document so attention is block-causal (no cross-document
leakage; tests/test_train_cpt.py checks the logits of a document alone and packed). That holds for a forward
without a KV cache, as in training: with one, transformers skips its packed-sequence detection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from transformers import Trainer, TrainingArguments, default_data_collator
from trl import ModelConfig

from nanocomposer.common import print0, run_main
from nanocomposer.config import ArgumentError, ConfigError, CPTScriptArguments, RecipeParser
from nanocomposer.copy_eval import CopyAccuracyCallback, make_probes
from nanocomposer.copy_warmup import FIRST_ID, copy_warmup_blocks, distinct_ids
from nanocomposer.inputs import check_model_path, load_splits
from nanocomposer.model_io import configure_device, load_model, load_tokenizer, peft_config, save_final_model
from nanocomposer.packing import document_separator_id, pack_documents
from nanocomposer.run_dir import prepare_output_dir
from nanocomposer.run_record import finish_wandb, perplexity, start_stage_run, write_model_card

STAGE = "cpt"


@dataclass
class CPTArguments(CPTScriptArguments):
    """CPTScriptArguments plus the copy-rich data mix and the copy metric (nanocomposer/copy_eval.py)."""

    mix_dataset_path: str | None = field(
        default=None,
        metadata={"help": "A second corpus saved like dataset_path (e.g. data/build_copy_corpus.py's) whose "
                          "train split is mixed into the training documents; evaluation stays on dataset_path."},
    )
    mix_fraction: float = field(
        default=0.0, metadata={"help": "Share of the training characters taken from mix_dataset_path, in [0, 1); "
                                       "0: off (the path is not read), as when a recipe's mix is ablated."}
    )
    copy_eval_probes: int = field(
        default=0, metadata={"help": "Log eval/copy_accuracy on this many held-out copy probes at every "
                                     "evaluation (0: off)."}
    )
    copy_warmup_steps: int = field(
        default=0, metadata={"help": "Optimizer steps of repeated random token runs before the code blocks "
                                     "(nanocomposer/copy_warmup.py): copying forms on them first. 0: off."}
    )
    copy_replay_fraction: float = field(
        default=0.0, metadata={"help": "Share of the rows after the warm-up that are repeated random token runs, "
                                       "spread through the code in the run's shuffled order, so the copying "
                                       "circuit keeps a gradient of its own. In [0, 1); 0: off."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.copy_eval_probes < 0:
            raise ArgumentError("copy_eval_probes", self.copy_eval_probes, "must be >= 0 (0: off)")
        if self.copy_warmup_steps < 0:
            raise ArgumentError("copy_warmup_steps", self.copy_warmup_steps, "must be >= 0 (0: off)")
        if not 0 <= self.copy_replay_fraction < 1:
            raise ArgumentError("copy_replay_fraction", self.copy_replay_fraction, "must be in [0, 1) (0: off)")
        if self.mix_dataset_path is None and self.mix_fraction != 0:
            raise ArgumentError("mix_fraction", self.mix_fraction, "needs mix_dataset_path")
        if not 0 <= self.mix_fraction < 1:
            raise ArgumentError("mix_fraction", self.mix_fraction, "must be in [0, 1) (0: off)")


class PackedCausalLMTrainer(Trainer):
    """`Trainer` that logs perplexity next to every eval loss (held-out code perplexity)."""

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "eval_loss" in logs:
            logs["eval_perplexity"] = perplexity(logs["eval_loss"])
        super().log(logs, *args, **kwargs)


def arrange_copy_rows(train_blocks, script_args: CPTArguments, training_args: TrainingArguments, vocab_size: int):
    """(rows in training order, {"copy_warmup_blocks": n, "copy_replay_blocks": m}): the warm-up rows first, then
    the code blocks with `copy_replay_fraction` of repeated-run rows among them, shuffled with the run's seed.
    The Trainer's sampler becomes sequential so the warm-up comes first (and a resumed run skips exactly the
    rows it already trained on). A run longer than one pass over the rows starts the next epoch with the
    warm-up again and the rest in the same order."""
    from datasets import concatenate_datasets

    per_step = (training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
                * max(1, training_args.world_size))
    warmup_rows = script_args.copy_warmup_steps * per_step
    replay_rows = round(len(train_blocks) * script_args.copy_replay_fraction / (1 - script_args.copy_replay_fraction))
    try:
        # one stream of rows: the warm-up's rows are the first ones, so warm-up and replay never share a row
        copy_rows = copy_warmup_blocks(warmup_rows + replay_rows, script_args.block_size, vocab_size,
                                       training_args.seed).cast(train_blocks.features)
    except ValueError as e:
        raise ConfigError(f"copy_warmup_steps {script_args.copy_warmup_steps} / copy_replay_fraction "
                          f"{script_args.copy_replay_fraction}: {e}") from None
    training_args.train_sampling_strategy = "sequential"
    rest = train_blocks
    if replay_rows:
        rest = concatenate_datasets([train_blocks, copy_rows.select(range(warmup_rows, warmup_rows + replay_rows))])
    rest = rest.shuffle(seed=training_args.seed).flatten_indices()
    rows = concatenate_datasets([copy_rows.select(range(warmup_rows)), rest]) if warmup_rows else rest
    return rows, {"copy_warmup_blocks": warmup_rows, "copy_replay_blocks": replay_rows}


def main(script_args: CPTArguments, training_args: TrainingArguments, model_args: ModelConfig) -> dict:
    ################
    # Checks and output dir (everything that can be wrong fails here, before any model is loaded)
    ################
    output_dir, checkpoint = prepare_output_dir(script_args, training_args, STAGE)
    configure_device(training_args)
    model_config = check_model_path(model_args.model_name_or_path)
    max_positions = getattr(model_config, "max_position_embeddings", None)
    if max_positions is not None and max_positions < script_args.block_size:
        raise ConfigError(f"block_size {script_args.block_size}: exceeds the model's max_position_embeddings="
                          f"{max_positions}")
    dataset = load_splits(script_args.dataset_path, [script_args.dataset_train_split,
                                                     script_args.dataset_test_split], ["text"])
    train_documents = dataset[script_args.dataset_train_split]
    if script_args.mix_dataset_path is not None and script_args.mix_fraction > 0:
        from data.build_copy_corpus import mix_corpora

        extra = load_splits(script_args.mix_dataset_path, ["train"], ["text"])["train"]
        try:
            train_documents = mix_corpora(train_documents, extra, script_args.mix_fraction, training_args.seed)
        except ValueError as e:
            raise ConfigError(f"mix_dataset_path {script_args.mix_dataset_path}: {e}") from None
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    separator_id = document_separator_id(tokenizer, script_args.document_separator)
    try:
        copy_probes = (make_probes(tokenizer, script_args.copy_eval_probes, max_context=script_args.block_size)
                       if script_args.copy_eval_probes else None)
    except ValueError as e:
        raise ConfigError(f"copy_eval_probes {script_args.copy_eval_probes}: {e}") from None

    ################
    # Data: packed blocks
    ################
    train_blocks, train_stats = pack_documents(train_documents, tokenizer,
                                               script_args.block_size, separator_id, desc="train")
    eval_blocks, eval_stats = pack_documents(dataset[script_args.dataset_test_split], tokenizer,
                                             script_args.block_size, separator_id, desc="validation")
    if len(train_blocks) == 0 or len(eval_blocks) == 0:
        raise ConfigError(f"dataset_path {script_args.dataset_path}: fewer than block_size={script_args.block_size} tokens "
             f"in a split (train {train_stats['tokens']}, validation {eval_stats['tokens']})")
    if script_args.max_eval_blocks is not None:
        eval_blocks = eval_blocks.select(range(min(script_args.max_eval_blocks, len(eval_blocks))))
    if script_args.copy_warmup_steps or script_args.copy_replay_fraction:
        train_blocks, copy_stats = arrange_copy_rows(train_blocks, script_args, training_args, len(tokenizer))
        train_stats.update(copy_stats)
    print0(f"[cpt] train: {train_stats['documents']:,} docs, {train_stats['tokens']:,} tokens -> "
           f"{train_stats['blocks']:,} blocks of {script_args.block_size} ({train_stats['kept_fraction']:.1%} kept); "
           f"validation: {len(eval_blocks):,} blocks")

    ################
    # Model, W&B, trainer
    ################
    model = load_model(model_args, training_args)
    lora = peft_config(model_args)
    if lora is not None:
        from peft import get_peft_model

        model = get_peft_model(model, lora)

    facts, wandb_run = start_stage_run(STAGE, script_args, training_args, model_args, output_dir,
                                       {"train": train_stats, "validation": eval_stats}, script_args.dataset_path)

    trainer = PackedCausalLMTrainer(
        model=model,
        args=training_args,
        train_dataset=train_blocks,
        eval_dataset=eval_blocks,
        processing_class=tokenizer,
        data_collator=default_data_collator,  # fixed-size blocks: stack, no padding, no attention mask
    )
    if copy_probes:
        trainer.add_callback(CopyAccuracyCallback(copy_probes, trainer.log, repeat_distinct=(
            distinct_ids(len(tokenizer)) if len(tokenizer) > FIRST_ID + 1 else None)))

    ################
    # Train, evaluate, save
    ################
    started = time.perf_counter()
    train_result = trainer.train(resume_from_checkpoint=checkpoint)
    train_seconds = time.perf_counter() - started
    # Reuse the scheduled evaluation of the last step when there is one, else evaluate now.
    final_eval = next((log for log in trainer.state.log_history
                       if "eval_loss" in log and log["step"] == trainer.state.global_step), None)
    final_eval = final_eval or trainer.evaluate()
    # The step-0 evaluation (`eval_on_start`); kept in log_history across a resume.
    initial_eval = next((log for log in trainer.state.log_history if "eval_loss" in log and log["step"] == 0), None)

    save_final_model(trainer.model, tokenizer, output_dir, source=model_args.model_name_or_path,
                     revision=model_args.model_revision)
    steps_run = trainer.state.global_step - (int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0)
    tokens_per_second = (steps_run * training_args.per_device_train_batch_size
                         * training_args.gradient_accumulation_steps * max(1, training_args.world_size)
                         * script_args.block_size / train_seconds) if train_seconds else 0.0
    metrics = {
        "global_step": trainer.state.global_step,
        "train_loss": train_result.training_loss,
        "initial_eval_loss": initial_eval["eval_loss"] if initial_eval else None,
        "initial_eval_perplexity": initial_eval["eval_perplexity"] if initial_eval else None,
        "final_eval_loss": final_eval["eval_loss"],
        "final_eval_perplexity": final_eval["eval_perplexity"],
        "final_copy_accuracy": next((log["eval_copy_accuracy"] for log in reversed(trainer.state.log_history)
                                     if "eval_copy_accuracy" in log), None),
        "train_tokens_per_second": tokens_per_second,
        "train_seconds": train_seconds,
    }
    write_model_card(
        output_dir,
        f"nanocomposer CPT: {script_args.run}",
        f"Continued pretraining of `{model_args.model_name_or_path}` on `{script_args.dataset_path}` "
        f"(packed blocks of {script_args.block_size} tokens, block-causal attention"
        f"{', LoRA merged' if lora is not None else ''}). Git commit `{facts['git_commit']}`.",
        {"Result": metrics, "Data": {f"train {k}": v for k, v in train_stats.items()}
         | {f"validation {k}": v for k, v in eval_stats.items()}},
    )
    # transformers' example-script files: train_results.json and the whole log history (every eval's metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    finish_wandb(wandb_run, {f"final/{k}": v for k, v in metrics.items() if v is not None})
    # Trainer.end() is new in transformers 5.2x; 5.17 (the GPU stack) ends the trackers through accelerate
    trainer.end() if hasattr(trainer, "end") else trainer.accelerator.end_training()
    print0(f"[cpt] eval loss {metrics['initial_eval_loss']} -> {metrics['final_eval_loss']:.4f} "
           f"(perplexity {metrics['final_eval_perplexity']:.1f}); {tokens_per_second:,.0f} tokens/s; "
           f"saved to {output_dir}")
    return metrics


def make_parser() -> RecipeParser:
    return RecipeParser((CPTArguments, TrainingArguments, ModelConfig))


if __name__ == "__main__":
    run_main(main, make_parser())
