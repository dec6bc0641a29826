"""SFT with the LM head and the loss computed only at labelled positions (`labelled_only_head`).

With assistant-only loss on packed rows only ~20% of positions carry a label, yet transformers' causal-LM
forward projects every position through the LM head, and at vocab 8192 over a 256-wide model the head is a
large share of a tiny model's compute. TRL's SFTTrainer does use a fused head (`add_fused_lm_head`) that
scores only labelled positions, but only on CUDA/XPU with Triton; on CPU it tiles every position.

`LabelledOnlyHeadSFTTrainer` is SFTTrainer with `compute_loss` overridden: it runs the decoder once
(`get_decoder()`, with every input SFTTrainer passes, packed `position_ids` included), gathers the hidden
states whose next-token label is not -100, applies the head to those only, and computes what TRL's
compute_loss computes from its fused outputs: the loss (per-token NLL, or DFT's probability-weighted NLL, summed
and divided by `num_items_in_batch`, else by the labelled count, clamped at 1; times the process count with
`average_tokens_across_devices`), and the logged `entropy`, `mean_token_accuracy` (the label is the first argmax)
and `num_tokens`. Same loss and gradients to float tolerance (tests/test_sft_loss.py).

Whatever it does not reproduce goes to SFTTrainer's own compute_loss, unchanged: a custom
`compute_loss_func`, label smoothing, a MoE auxiliary loss, a model wrapped for distributed training, prompt-
learning PEFT, pre-shifted `shift_labels` (context/sequence parallelism), logits that are not
`lm_head(hidden)` (soft-capping, scaling), multimodal models, and `return_outputs=True` (eval with
`compute_metrics`, which needs the full logits). LoRA works: the decoder and head are the PEFT-injected ones.

`sft_trainer_class(labelled_only_head, training_args)`: this class when the flag is on, or unset and training on
CPU; SFTTrainer otherwise (on GPU TRL's compact fused head already skips unlabelled positions).

Speed: `python -m nanocomposer.sft_loss bench --steps 2 --rows 48` times SFTTrainer optimizer steps (forward,
backward, AdamW; fp32 on CPU) of the tiny base `artifacts/base` on the first packed 4096-token row of
artifacts/data/sft/dataset, the stock loss and the labelled-only one interleaved on the same row and model. Not
yet measured: in this session the 2-core machine was saturated (load 10-14, another job at 180% CPU) and the
run got ~1% of a core. Expected from `python -m bench.model_speed head` (forward+backward of the head
paths on an SFT-shaped row): labelled-only 1.5x the full head and 2.0x TRL's CPU fused head.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from trl import SFTConfig, SFTTrainer

from nanocomposer.common import print0

# Configs whose logits are not lm_head(hidden) (TRL's add_fused_lm_head reads the same names).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                    "logits_scaling")


def causal_lm(model):
    """The transformers model under a PEFT wrapper (its LoRA layers injected in place), or `model` itself."""
    from peft import PeftModel

    return model.get_base_model() if isinstance(model, PeftModel) else model


def unsupported_model(model) -> str | None:
    """Why `model` cannot take the labelled-only path (a short reason), or None if it can."""
    from peft import PeftModel

    if isinstance(model, PeftModel) and model.peft_config[model.active_adapter].is_prompt_learning:
        return "prompt-learning PEFT pads the labels"
    lm = causal_lm(model)
    text_config = lm.config.get_text_config()
    if text_config is not lm.config:
        return f"{type(lm).__name__} is multimodal"
    transforms = [name for name in LOGIT_TRANSFORMS if getattr(text_config, name, None) not in (None, 1.0)]
    if transforms:
        return f"{type(lm).__name__} sets {', '.join(transforms)}: its logits are not lm_head(hidden)"
    if getattr(text_config, "output_router_logits", None) is not None:
        return f"{type(lm).__name__} is a mixture of experts (auxiliary loss)"
    return None


def labelled_head_outputs(model, inputs: dict) -> dict[str, torch.Tensor]:
    """Per labelled position (next-token label != -100, in row-major order): `log_probs` of the label (with
    gradient), `entropy` of the next-token distribution and `is_top1` (the label is the first argmax), both without
    gradient; and `label_mask` (batch, seq_len - 1), as TRL's fused head returns them before scattering.

    The decoder gets every input but `labels` (packed `position_ids`, `attention_mask`, `use_cache`); the head
    and the softmax run only on the gathered hidden states, the softmax in fp32 as transformers' loss does.
    """
    lm = causal_lm(model)
    hidden = lm.get_decoder()(**{k: v for k, v in inputs.items() if k != "labels"}).last_hidden_state
    head = lm.get_output_embeddings()
    next_labels = inputs["labels"][:, 1:].to(head.weight.device)
    mask = next_labels != -100
    targets = next_labels[mask]
    logits = head(hidden[:, :-1].to(head.weight.device)[mask]).float()
    all_log_probs = logits.log_softmax(-1)
    log_probs = all_log_probs.gather(-1, targets[:, None]).squeeze(-1)
    with torch.no_grad():
        entropy = -(all_log_probs.exp() * all_log_probs).sum(-1)
        is_top1 = logits.argmax(-1) == targets
    return {"log_probs": log_probs, "entropy": entropy, "is_top1": is_top1, "label_mask": mask}


class LabelledOnlyHeadSFTTrainer(SFTTrainer):
    """SFTTrainer whose loss projects only labelled positions through the LM head (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.labelled_only_fallback = self._static_fallback()
        if self.labelled_only_fallback:
            print0(f"[sft] labelled_only_head: using SFTTrainer's own loss ({self.labelled_only_fallback})")

    def _static_fallback(self) -> str | None:
        if self.compute_loss_func is not None:
            return "a custom compute_loss_func"
        if self.label_smoother is not None:
            return "label smoothing needs the full logits"
        if self.args.loss_type not in ("nll", "dft"):
            return f"loss_type {self.args.loss_type!r}"
        if self.aux_loss_enabled:
            return "the MoE auxiliary loss"
        return unsupported_model(self.model)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if (self.labelled_only_fallback or return_outputs or "shift_labels" in inputs
                or self.accelerator.unwrap_model(model) is not model):  # DDP/FSDP sync in the wrapper's forward
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        inputs["use_cache"] = False  # as SFTTrainer does
        outputs = labelled_head_outputs(model, inputs)
        per_token_loss = -outputs["log_probs"]
        if self.args.loss_type == "dft":  # SFTTrainer's DFT: the NLL weighted by the label's probability
            per_token_loss = per_token_loss * outputs["log_probs"].exp().detach()
        num_tokens = outputs["label_mask"].sum() if num_items_in_batch is None else num_items_in_batch
        loss = per_token_loss.sum() / torch.as_tensor(num_tokens).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        self._log_metrics(mode, inputs, outputs)
        return loss

    def _log_metrics(self, mode: str, inputs: dict, outputs: dict) -> None:
        """SFTTrainer's entropy, mean_token_accuracy and num_tokens, from the labelled positions."""
        gather = self.accelerator.gather_for_metrics
        num_valid = gather(outputs["label_mask"].sum()).sum()
        entropy_sum = gather(outputs["entropy"].sum()).sum()
        num_correct = gather(outputs["is_top1"].sum()).sum()
        self._metrics[mode]["entropy"].append((entropy_sum / num_valid).item() if num_valid > 0 else 0.0)
        self._metrics[mode]["mean_token_accuracy"].append((num_correct / num_valid).item() if num_valid > 0 else 0.0)
        if mode == "train":  # packed (padding-free) rows carry position_ids and no attention_mask
            if "attention_mask" in inputs:
                tokens = gather(inputs["attention_mask"].sum()).sum().item()
            elif "position_ids" in inputs:
                position_ids = inputs["position_ids"]
                tokens = gather(torch.tensor(position_ids.size(1), device=position_ids.device)).sum().item()
            else:
                raise ValueError("labelled_only_head: expected 'attention_mask' or 'position_ids' in the inputs")
            self._total_train_tokens += tokens // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]


def sft_trainer_class(labelled_only_head: bool | None, training_args) -> type[SFTTrainer]:
    """LabelledOnlyHeadSFTTrainer if `labelled_only_head`, or if it is None (unset) and training runs on CPU."""
    on_cpu = training_args.use_cpu or not torch.cuda.is_available()
    enabled = on_cpu if labelled_only_head is None else labelled_only_head
    return LabelledOnlyHeadSFTTrainer if enabled else SFTTrainer


# --------------------------------------------------------------------------- measurement


def measure_step_seconds(model_path: str, dataset_path: str, *, rows: int = 64, steps: int = 3,
                         max_length: int = 4096) -> dict:
    """Seconds per optimizer step (forward, backward, AdamW) of SFTTrainer's own loss ("stock") and the labelled-only
    one, interleaved A/B/A/B on the same first packed row of `dataset_path`'s train split (its first `rows`
    conversations, packed bfd as recipes/tiny/sft.yaml packs them), after one warm-up step each; fp32 on CPU.
    One trainer serves both: its stock path is its parent's compute_loss (the fallback), so the model, optimizer
    and row are the same."""
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM

    from nanocomposer.model_io import load_tokenizer

    data = load_from_disk(dataset_path)["train"].select_columns(["messages", "tools"])
    data = data.select(range(min(rows, len(data))))
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(output_dir=out, max_length=max_length, packing=True, packing_strategy="bfd",
                         assistant_only_loss=True, per_device_train_batch_size=1, use_cpu=True, report_to="none",
                         learning_rate=1e-4, dataloader_pin_memory=False)
        trainer = LabelledOnlyHeadSFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_path), args=args,
                                             train_dataset=data, processing_class=load_tokenizer(model_path))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which this bypasses
    trainer.model.train()
    times = {"stock": [], "labelled_only": []}
    for i in range(steps + 1):
        for path, seconds in times.items():
            trainer.labelled_only_fallback = "measured" if path == "stock" else None
            started = time.perf_counter()
            trainer.training_step(trainer.model, dict(batch))
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
            if i:  # the first of each is a warm-up
                seconds.append(time.perf_counter() - started)
    labelled = (batch["labels"][:, 1:] != -100).sum().item()
    return {"tokens": batch["input_ids"].size(1), "labelled": labelled, "threads": torch.get_num_threads(),
            **{f"{path}_s": sorted(t) for path, t in times.items()},
            "ratio_median": sorted(times["stock"])[steps // 2] / sorted(times["labelled_only"])[steps // 2]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanocomposer.sft_loss", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="seconds per SFT optimizer step, stock vs labelled-only head")
    bench.add_argument("--model", default="artifacts/base")
    bench.add_argument("--dataset", default="artifacts/data/sft/dataset")
    bench.add_argument("--rows", type=int, default=64, help="conversations to pack (the first packed row is used)")
    bench.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rows < 1:
        parser.error("bench: --steps and --rows must be at least 1")
    load_before = os.getloadavg()[0]
    result = measure_step_seconds(args.model, args.dataset, rows=args.rows, steps=args.steps)
    print({**result, "load_before": load_before, "load_after": os.getloadavg()[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
