"""Stage 2: tool-call SFT on harness trajectories, then a short check of the model in the harness.

    python train_sft.py --config recipes/smol/sft.yaml --run demo                 # starts from runs/demo/cpt
    python train_sft.py --config recipes/tiny/sft.yaml --run demo                 # the tiny preset
    python train_sft.py --config recipes/gpu/sft.yaml --run r1                    # Qwen2.5-Coder-1.5B-Instruct + LoRA
    python train_sft.py --config recipes/tiny/sft.yaml --run demo --check_tasks artifacts/data/tasks/val --check_limit 8
    python train_sft.py --config recipes/tiny/sft.yaml --run demo --harness_eval_tasks factory:val/ladder

Data: a DatasetDict (save_to_disk) of rows {"messages", "tools" (JSON string), "task_id", "family", "tier"}
written by data/build_sft.py. TRL's SFTTrainer renders each row with the tokenizer's chat template
(`tools` is passed to it; TRL parses the JSON string itself) and, with `assistant_only_loss=True`, trains
only the tokens inside the template's `{% generation %}` markers: assistant bodies and their end-of-turn
token. System, user and tool-result tokens never get a label. On CPU the LM head and the loss are computed
only at labelled positions (`labelled_only_head`, nanocomposer/sft_loss.py): same loss and metrics, less compute.

Sequences longer than `max_length` are truncated (keep_start); how many, and how many assistant tokens
that costs, is measured and printed before training, logged to W&B and written to the model card.

The check (`--check_tasks`): the saved model runs as a policy (nanocomposer.policies.run_policy, through
env.runner.run_tasks like eval.py) on the tasks under the check's budget, the `check_*` arguments (greedy; the
preset's budget.yaml sets them, the same file RL and eval read); tool-call validity (share of assistant turns whose calls all
parse and validate), solve rate and mean turns go to W&B, check.json and the model card. The stage exits
non-zero if the model never emits a valid tool call.

The harness eval during training (`--harness_eval_tasks`, nanocomposer/harness_eval.py): the live model plays
held-out tasks (at most `harness_eval_limit`, spread over their families) at every evaluation, or every
`harness_eval_steps` steps, and at the end; solve rate with its Wilson interval, tool-call validity, malformed
rate and per-family solve rates go to W&B as eval/harness_*, the last measurement to the result and model card.

Output: runs/<run>/sft/ with the model and tokenizer (LoRA merged), config.yaml, README.md, check.json, and
harness_eval/step-<N>.jsonl (the episodes of each harness eval).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from trl import ModelConfig, SFTConfig

from nanocomposer.common import fail, print0, run_main
from nanocomposer.config import ConfigError, RecipeParser, SFTScriptArguments
from nanocomposer.harness_eval import HarnessEvalCallback, plan_harness_eval
from nanocomposer.inputs import check_model_path, load_splits
from nanocomposer.model_io import configure_device, load_model, load_tokenizer, peft_config, save_final_model
from nanocomposer.run_dir import prepare_output_dir
from nanocomposer.run_record import finish_wandb, start_stage_run, write_model_card
from nanocomposer.sft_loss import sft_trainer_class

STAGE = "sft"


def truncation_report(dataset, tokenizer, max_length: int | None, desc: str) -> dict:
    """How many conversations exceed `max_length` tokens and how many assistant tokens truncation drops.

    Renders each row exactly as SFTTrainer does (chat template, `tools`, assistant mask), including TRL's
    swap to a training template with `{% generation %}` markers for Hub templates that lack them (Qwen2.5).
    """
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    from env.protocol import parse_turn

    template = None if has_generation_markers(tokenizer.chat_template) else get_training_chat_template(tokenizer)
    end_of_turn = {tokenizer.eos_token, "<|im_end|>"}

    def measure(row):
        tools = json.loads(row["tools"]) if row["tools"] else None
        rendered = tokenizer.apply_chat_template(
            row["messages"], tools=tools, tokenize=True,
            return_dict=True, return_assistant_tokens_mask=True, chat_template=template,
        )
        mask, ids = rendered["assistant_masks"], rendered["input_ids"]
        kept = mask if max_length is None else mask[:max_length]
        # What the loss trains, span by span (one per assistant turn): it must parse in the harness.
        schemas = {t["function"]["name"]: t["function"] for t in tools or []}
        spans, start = [], None
        for i, m in enumerate([*mask, 0]):
            if m and start is None:
                start = i
            elif not m and start is not None:
                spans.append(ids[start:i])
                start = None
        bad = ""
        for span in spans:
            text = tokenizer.decode(span, skip_special_tokens=False)
            for end in end_of_turn:
                text = text.removesuffix(end) if end else text
            turn = parse_turn(text, schemas)
            if turn.malformed_calls and not bad:
                bad = f"{turn.malformed_calls[0].error}: {text[:160]!r}"
        return {"length": len(ids), "assistant": sum(mask), "assistant_kept": sum(kept), "turns": len(spans),
                "malformed_turn": bad}

    lengths = dataset.map(measure, remove_columns=dataset.column_names, desc=f"{desc}: measuring lengths")
    malformed = [b for b in lengths["malformed_turn"] if b]
    if malformed:
        raise ConfigError(f"{desc}: the chat template renders {len(malformed)} of {len(lengths)} conversations with "
                          f"an assistant turn the harness would reject (first: {malformed[0]}): the model would learn "
                          "malformed calls; rebuild the data with data.build_sft (assistant turns as harness text)")
    rows = list(zip(lengths["length"], lengths["assistant"], lengths["assistant_kept"]))
    truncated = [r for r in rows if max_length is not None and r[0] > max_length]
    assistant = sum(r[1] for r in rows)
    return {
        "examples": len(rows),
        "truncated": len(truncated),
        "truncated_fraction": len(truncated) / len(rows) if rows else 0.0,
        "no_assistant_tokens_left": sum(r[2] == 0 for r in rows),
        "assistant_tokens": assistant,
        "assistant_tokens_kept": sum(r[2] for r in rows),
        "assistant_tokens_lost_fraction": 1 - sum(r[2] for r in rows) / assistant if assistant else 0.0,
        "tokens": sum(r[0] for r in rows),
        "max_tokens": max(r[0] for r in rows),
        "max_length": max_length,
        "assistant_turns_parsed": sum(lengths["turns"]),  # every one (checked above)
    }


def harness_check(model_dir: Path, tasks: list, script_args: SFTScriptArguments) -> tuple[dict, list[dict]]:
    """(metrics, episode records): the saved model as a policy on `tasks` through env.runner.run_tasks, with the
    check's Budget (the preset's budget.yaml, as RL and eval read it), greedy; tool-call validity,
    solve rate, mean turns."""
    from env.episode import EpisodeConfig
    from env.metrics import summarize
    from nanocomposer.policies import run_policy

    budget = script_args.check_budget()
    records, wall_s, _ = run_policy(str(model_dir), tasks, EpisodeConfig.from_budget(budget), budget.sampling(),
                                    workers=script_args.check_workers)
    summary = summarize(records, wall_s)
    metrics = {
        "tasks": summary["n"],
        "tool_call_validity": summary["tool_call_validity"],  # one definition: env/metrics.py
        "valid_calls": summary["tool_calls"] - summary["malformed_calls"],
        "malformed_calls": summary["malformed_calls"],
        "solve_rate": summary["solve_rate"],
        "mean_turns": summary["mean_turns"],
        "exit_statuses": summary["exit_statuses"],
        "wall_s": summary["wall_s"],
        "first_error": next((r["error"] for r in records if r["error"]), ""),
    }
    return metrics, records


def release_accelerator_memory(headroom: float = 0.9, ceiling: float = 0.85) -> float | None:
    """Collect garbage and empty CUDA's cache; unless $NANOCOMPOSER_VLLM_GPU_MEMORY is set, set it to the share
    of the GPU that is free now (x `headroom`, at most `ceiling`): vLLM refuses to start when less than its
    gpu_memory_utilization x total is free. Returns the share set (None: no CUDA, or already set)."""
    import gc
    import os

    import torch

    gc.collect()
    if not torch.cuda.is_available():
        return None
    torch.cuda.empty_cache()
    if os.environ.get("NANOCOMPOSER_VLLM_GPU_MEMORY"):
        return None
    free, total = torch.cuda.mem_get_info()
    share = round(min(ceiling, headroom * free / total), 3)
    os.environ["NANOCOMPOSER_VLLM_GPU_MEMORY"] = str(share)
    print0(f"[sft] check: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free after training; vLLM takes {share:.0%}")
    return share


def main(script_args: SFTScriptArguments, training_args: SFTConfig, model_args: ModelConfig) -> dict:
    ################
    # Checks and output dir (everything that can be wrong fails here, before any model is loaded)
    ################
    output_dir, checkpoint = prepare_output_dir(script_args, training_args, STAGE)
    configure_device(training_args)
    check_model_path(model_args.model_name_or_path, chat_template=True)
    if not training_args.assistant_only_loss:
        print0("[sft] warning: assistant_only_loss is off: system, user and tool tokens will be trained on")
    splits = [script_args.dataset_train_split, script_args.dataset_test_split]
    dataset = load_splits(script_args.dataset_path, splits, ["messages", "tools"])
    harness_tasks = plan_harness_eval(script_args, training_args, dataset[script_args.dataset_train_split])
    dataset = dataset.select_columns(["messages", "tools"])  # metadata columns stay in the saved dataset
    check_tasks = []
    if script_args.check_tasks:
        from env.tasks import TaskError, load_task_set

        try:
            check_tasks = load_task_set(script_args.check_tasks)[: script_args.check_limit]
        except TaskError as e:
            raise ConfigError(f"check_tasks {script_args.check_tasks}: {e}") from None
    tokenizer = load_tokenizer(model_args.model_name_or_path)

    ################
    # Truncation report (never silent)
    ################
    lengths = {split: truncation_report(dataset[split], tokenizer, training_args.max_length, split) for split in splits}
    for split, report in lengths.items():
        print0(f"[sft] {split}: {report['truncated']}/{report['examples']} conversations longer than max_length="
               f"{report['max_length']} are truncated ({report['assistant_tokens_lost_fraction']:.1%} of assistant "
               f"tokens lost, {report['no_assistant_tokens_left']} left with none); longest {report['max_tokens']}")
    if lengths[script_args.dataset_train_split]["assistant_tokens_kept"] == 0:
        raise ConfigError(f"max_length={training_args.max_length} cuts every training conversation before its first "
                          f"assistant token: nothing would be trained (longest conversation: "
                          f"{lengths[splits[0]]['max_tokens']} tokens)")

    ################
    # Model, W&B, trainer
    ################
    model = load_model(model_args, training_args)
    if training_args.max_length and training_args.max_length > model.config.max_position_embeddings:
        print0(f"[sft] warning: max_length={training_args.max_length} exceeds the model's max_position_embeddings="
               f"{model.config.max_position_embeddings}: later positions are extrapolated by RoPE")
    facts, wandb_run = start_stage_run(STAGE, script_args, training_args, model_args, output_dir, lengths,
                                       script_args.dataset_path)
    trainer = sft_trainer_class(script_args.labelled_only_head, training_args)(  # nanocomposer/sft_loss.py
        model=model,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,  # explicit: AutoTokenizer may re-type a custom tokenizer (pitfall 3)
        peft_config=peft_config(model_args),
    )
    harness = None
    if harness_tasks:  # after the trainer: it plays the trainer's (possibly PEFT-wrapped) live model
        harness = HarnessEvalCallback.from_script_args(trainer, harness_tasks, script_args, output_dir / "harness_eval")
        trainer.add_callback(harness)

    ################
    # Train, evaluate, save
    ################
    started = time.perf_counter()
    train_result = trainer.train(resume_from_checkpoint=checkpoint)
    train_seconds = time.perf_counter() - started
    # Reuse the scheduled evaluation of the last step when there is one, else evaluate now.
    final_eval = next((log for log in trainer.state.log_history
                       if "eval_loss" in log and log["step"] == trainer.state.global_step), None)
    final_eval = final_eval or (trainer.evaluate() if trainer.eval_dataset is not None else {})
    # The step-0 evaluation (`eval_on_start`); kept in log_history across a resume.
    initial_eval = next((log for log in trainer.state.log_history if "eval_loss" in log and log["step"] == 0), {})
    save_final_model(trainer.model, tokenizer, output_dir, source=model_args.model_name_or_path,
                     revision=model_args.model_revision)
    steps_run = trainer.state.global_step - (int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0)
    metrics = {
        "global_step": trainer.state.global_step,
        "train_loss": train_result.training_loss,
        "initial_eval_loss": initial_eval.get("eval_loss"),
        "final_eval_loss": final_eval.get("eval_loss"),
        "final_eval_token_accuracy": final_eval.get("eval_mean_token_accuracy"),
        "train_steps_per_second": steps_run / train_seconds if train_seconds else 0.0,
        "train_seconds": train_seconds,
        **(harness.final if harness else {}),  # the harness eval of the final step (nanocomposer/harness_eval.py)
    }
    # Trainer.end() is new in transformers 5.2x; 5.17 (the GPU stack) ends the trackers through accelerate
    trainer.end() if hasattr(trainer, "end") else trainer.accelerator.end_training()

    ################
    # Harness check
    ################
    check = {}
    if check_tasks:
        # The check's policy (vLLM on a GPU) loads the saved model itself: release the trainer's copy, optimizer
        # and allocator reserve first, and size the engine to what is then free.
        del trainer, model, harness
        release_accelerator_memory()
        check, records = harness_check(output_dir, check_tasks, script_args)
        (output_dir / "check.json").write_text(json.dumps({"summary": check, "tasks": records}, indent=1,
                                                          ensure_ascii=False))
        print0(f"[sft] check on {check['tasks']} tasks: tool-call validity {check['tool_call_validity']:.1%}, "
               f"solve rate {check['solve_rate']:.1%}, mean turns {check['mean_turns']:.2f}, "
               f"exits {check['exit_statuses']}")

    write_model_card(
        output_dir,
        f"nanocomposer SFT: {script_args.run}",
        f"Tool-call SFT of `{model_args.model_name_or_path}` on `{script_args.dataset_path}` "
        f"(assistant-only loss: {training_args.assistant_only_loss}, max_length {training_args.max_length}"
        f"{', LoRA merged' if model_args.use_peft else ''}). Git commit `{facts['git_commit']}`.",
        {"Result": metrics, **({"Harness check": check} if check else {}),
         **{f"Data: {split}": report for split, report in lengths.items()}},
    )
    summary = {**{f"final/{k}": v for k, v in metrics.items() if v is not None},
               **{f"check/{k}": v for k, v in check.items() if isinstance(v, int | float)},
               **{f"data/{split}_truncated": r["truncated"] for split, r in lengths.items()}}
    finish_wandb(wandb_run, summary)
    if check and check["valid_calls"] == 0 and not script_args.check_must_pass:
        print0(f"[sft] warning: harness check: the trained model emitted no valid tool call in {check['tasks']} tasks "
               "(check_must_pass false: reported only)")
    elif check and check["valid_calls"] == 0:
        fail(f"harness check: the trained model emitted no valid tool call in {check['tasks']} tasks "
             f"(exits {check['exit_statuses']}{'; first policy error: ' + check['first_error'] if check['first_error'] else ''}"
             f"); see {output_dir / 'check.json'}")
    print0(f"[sft] loss {metrics['train_loss']:.4f}, eval loss {metrics['final_eval_loss']}; "
           f"{metrics['train_steps_per_second']:.2f} steps/s; saved to {output_dir}")
    return {**metrics, **{f"check_{k}": v for k, v in check.items()}}


def make_parser() -> RecipeParser:
    return RecipeParser((SFTScriptArguments, SFTConfig, ModelConfig))


if __name__ == "__main__":
    run_main(main, make_parser())
