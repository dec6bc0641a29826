"""Stage 3: GRPO in the agent harness. Every rollout is a whole episode of the harness's loop (env/episode.py).

    python train_rl.py --config recipes/smol/rl.yaml --run demo                  # starts from runs/demo/sft
    python train_rl.py --config recipes/tiny/rl.yaml --run demo                  # the tiny preset
    python train_rl.py --config recipes/tiny/rl.yaml --run demo --resume         # continue the last checkpoint
    python train_rl.py --config recipes/tiny/rl_long.yaml --run abl --malformed_handling drop   # malformed-dropped ablation
    python train_rl.py --config recipes/gpu/rl.yaml --run r1                     # Qwen2.5-Coder + LoRA, vLLM colocate

Data: the task directories under `tasks_dir` (a task-factory split). Each becomes one prompt row (its
initial messages); TRL's `rollout_func` (nanocomposer/rollout.py) plays `num_generations` episodes of it in
fresh sandboxes through the runner eval.py uses (env.runner.run_tasks, the trainer's live model generating
every waiting turn in one batch), and returns one token sequence per episode with the
tool results masked out of the loss (`env_mask`).

Rewards: the components named in `reward_funcs` (env/rewards.py's registry) with the recipe's
`reward_weights`; TRL logs each component's mean and std per step. Monitors (behaviour rates, exit
statuses, timing and the env's share of step time, each component's share of the advantage) go to W&B
every step; a few full trajectories every `log_trajectories_steps` rollouts go to
<output_dir>/trajectories/ and a W&B table.

Output: runs/<run>/rl/ with the model and tokenizer (LoRA merged), config.yaml, README.md, checkpoints.
"""

from __future__ import annotations

import math
import os
import time

from trl import GRPOConfig, GRPOTrainer, ModelConfig

from env.budget import Budget
from env.episode import EpisodeConfig
from env.tasks import TaskError
from nanocomposer.common import print0, run_main
from nanocomposer.config import (
    ArgumentError,
    ConfigError,
    RecipeParser,
    RLScriptArguments,
    budget_from_arguments,
    recipe_reward_funcs,
)
from nanocomposer.inputs import check_model_path
from nanocomposer.model_io import configure_device, load_model, load_tokenizer, peft_config, save_final_model
from nanocomposer.policy import SamplingConfig
from nanocomposer.rollout import (
    AgentRollout,
    RolloutConfig,
    advantage_shares,
    resolve_training_tasks,
    task_prompt_dataset,
)
from nanocomposer.rollout_tokens import RolloutError
from nanocomposer.run_dir import prepare_output_dir
from nanocomposer.run_record import finish_wandb, start_stage_run, write_model_card

STAGE = "rl"


class AgentGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that also logs each reward component's share of the advantage, warning when one dominates.

    TRL logs every component's mean and std and the share of zero-std groups of the weighted sum; what it
    does not show is which component drives the advantages (a shaping term quietly outweighing the outcome
    is how reward hacks start). Hooks `_calculate_rewards` (TRL 1.16), which sees all components. The first
    reward of the recipe is the task's own, so the warning names only a shaping term (`dominant_shaping_term`).
    """

    def __init__(self, *args, dominance_threshold: float = 0.8, **kwargs):
        super().__init__(*args, **kwargs)
        self.dominance_threshold = dominance_threshold
        self._last_dominance_warning = -math.inf

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        shares = advantage_shares(rewards.detach().float().cpu(), self.reward_weights.float().cpu(), num_generations,
                                  list(self.reward_func_names))
        for key, value in shares.items():
            self._metrics[mode][key].append(value)
        step = self.state.global_step
        top = dominant_shaping_term(shares, list(self.reward_func_names), self.dominance_threshold)
        self._metrics[mode]["advantage_share/max"].append(max(shares[f"advantage_share/{n}"]
                                                              for n in self.reward_func_names))
        if top is not None and step - self._last_dominance_warning >= 10:
            self._last_dominance_warning = step
            task = self.reward_func_names[0]
            print0(f"[rl] warning: step {step}: shaping term {top!r} makes {shares[f'advantage_share/{top}']:.0%} of "
                   f"the advantage signal (threshold {self.dominance_threshold:.0%}; the task reward {task!r} "
                   f"{shares[f'advantage_share/{task}']:.0%}); check its weight")
        return rewards


def dominant_shaping_term(shares: dict[str, float], names: list[str], threshold: float) -> str | None:
    """The shaping term (any reward after the first, the task's own) whose advantage share exceeds `threshold`.

    The first reward of the recipe (`outcome` in every RL recipe) is what the run is for: it making most of
    the advantage is the goal (with rewards unscaled it usually does), so only a later component is named.
    """
    shaping = [n for n in names[1:] if shares[f"advantage_share/{n}"] > threshold]
    return max(shaping, key=lambda n: shares[f"advantage_share/{n}"]) if shaping else None


def check_arguments(script_args: RLScriptArguments, training_args: GRPOConfig) -> list:
    """Everything about the recipe that can be wrong, checked before any model is loaded; the reward funcs."""
    reward_funcs = recipe_reward_funcs(script_args.reward_funcs, training_args.reward_weights,
                                       malformed_handling=script_args.malformed_handling,
                                       ask_user_handling=script_args.ask_user_handling)
    if script_args.truncated_episodes == "penalty" and "truncated" not in script_args.reward_funcs:
        raise ConfigError("truncated_episodes: penalty needs the `truncated` reward in reward_funcs "
                          "(with a weight)")
    if training_args.mask_truncated_completions:
        print0("[rl] note: mask_truncated_completions only sees the last token of an episode; truncation is "
               f"handled per episode by truncated_episodes={script_args.truncated_episodes!r}")
    if script_args.generation_backend == "vllm" and not training_args.use_vllm:
        raise ConfigError("generation_backend: vllm needs use_vllm: true (and vllm_mode: colocate or server)")
    return reward_funcs


def rollout_budget(script_args: RLScriptArguments, training_args: GRPOConfig) -> Budget:
    """The episode budgets from the recipe (the preset's budget.yaml) and the trainer's sampling, as the
    env.budget.Budget eval.py takes."""
    try:
        return budget_from_arguments(script_args, temperature=training_args.temperature, top_p=training_args.top_p,
                                     seed=training_args.seed)
    except ArgumentError as e:
        raise ConfigError(str(e)) from None


def rollout_config(script_args: RLScriptArguments, training_args: GRPOConfig) -> RolloutConfig:
    """The rollout's settings: the recipe's Budget (the same EpisodeConfig and sampling fields eval.py sets)."""
    budget = rollout_budget(script_args, training_args)
    return RolloutConfig(episode=EpisodeConfig.from_budget(budget), sampling=SamplingConfig(**budget.sampling()),
                         workers=script_args.rollout_workers,
                         backend=script_args.generation_backend, measure_lint="lint" in script_args.reward_funcs,
                         malformed_handling=script_args.malformed_handling,
                         truncated_episodes=script_args.truncated_episodes,
                         log_trajectories_steps=script_args.log_trajectories_steps,
                         log_trajectories_count=script_args.log_trajectories_count)


def window_means(log_history: list[dict], prefixes: tuple[str, ...], last: int = 5) -> dict:
    """Mean of each logged metric with one of `prefixes` over the last `last` logs that have it."""
    keys = sorted({k for log in log_history for k in log if k.startswith(prefixes)})
    out = {}
    for key in keys:
        values = [log[key] for log in log_history if log.get(key) is not None][-last:]
        if values:
            out[key] = sum(values) / len(values)
    return out


def main(script_args: RLScriptArguments, training_args: GRPOConfig, model_args: ModelConfig) -> dict:
    ################
    # Checks and output dir (everything that can be wrong fails here, before any model is loaded)
    ################
    output_dir, checkpoint = prepare_output_dir(script_args, training_args, STAGE)
    configure_device(training_args)
    check_model_path(model_args.model_name_or_path, chat_template=True)
    reward_funcs = check_arguments(script_args, training_args)
    config = rollout_config(script_args, training_args)
    try:
        tasks, tasks_source = resolve_training_tasks(script_args.tasks_dir, script_args.task_limit)
        dataset, task_index = task_prompt_dataset(tasks)
    except (TaskError, RolloutError) as e:
        raise ConfigError(f"tasks_dir {script_args.tasks_dir}: {e}") from None
    # vLLM generates one turn per call: its completion budget is the per-turn budget.
    training_args.max_completion_length = script_args.max_new_tokens
    tokenizer = load_tokenizer(model_args.model_name_or_path)

    ################
    # Model, rollout, W&B, trainer
    ################
    model = load_model(model_args, training_args)
    rollout = AgentRollout(task_index, tokenizer, config, output_dir)
    facts, wandb_run = start_stage_run(STAGE, script_args, training_args, model_args, output_dir,
                                       {"tasks": len(dataset)}, tasks_source)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16
    trainer = AgentGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,  # explicit: AutoTokenizer may re-type a custom tokenizer (pitfall 3)
        peft_config=peft_config(model_args),
        rollout_func=rollout,
        dominance_threshold=script_args.dominance_threshold,
    )
    print0(f"[rl] {len(dataset)} tasks from {script_args.tasks_dir}; {training_args.num_generations} episodes per "
           f"task, {training_args.generation_batch_size} per step in micro-batches of "
           f"{training_args.per_device_train_batch_size}; rewards "
           f"{dict(zip(script_args.reward_funcs, trainer.reward_weights.tolist()))}; "
           f"episodes at once {script_args.rollout_workers or 'all'} ({script_args.generation_backend}, batched in "
           "this process)")

    ################
    # Train, save
    ################
    started = time.perf_counter()
    try:
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
    finally:
        rollout.close()
    train_seconds = time.perf_counter() - started
    save_final_model(trainer.model, tokenizer, output_dir, source=model_args.model_name_or_path,
                     revision=model_args.model_revision)
    history = trainer.state.log_history
    steps_run = trainer.state.global_step - (int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0)
    metrics = {"global_step": trainer.state.global_step, "train_loss": train_result.training_loss,
               "train_seconds": train_seconds, "seconds_per_step": train_seconds / steps_run if steps_run else 0.0}
    first = {f"first/{k}": v for k, v in window_means(history[:5], ("reward", "rewards/", "behaviour/")).items()}
    last = window_means(history, ("reward", "rewards/", "behaviour/", "timing/", "step_time", "exit/",
                                  "advantage_share/", "rollout/"))
    # Trainer.end() is new in transformers 5.2x; 5.17 (the GPU stack) ends the trackers through accelerate
    trainer.end() if hasattr(trainer, "end") else trainer.accelerator.end_training()

    write_model_card(
        output_dir,
        f"nanocomposer RL: {script_args.run}",
        f"GRPO ({training_args.loss_type}, beta {training_args.beta}, {training_args.num_generations} episodes per "
        f"task) of `{model_args.model_name_or_path}` on `{script_args.tasks_dir}` in the agent harness "
        f"(max {script_args.max_turns} turns x {script_args.max_new_tokens} tokens; malformed "
        f"{script_args.malformed_handling}, ask_user {script_args.ask_user_handling}, truncated episodes "
        f"{script_args.truncated_episodes}{', LoRA merged' if model_args.use_peft else ''}). "
        f"Git commit `{facts['git_commit']}`. Metrics: mean of the last 5 logged steps.",
        {"Result": metrics, "Last steps": last, "First steps": first},
    )
    finish_wandb(wandb_run, {**{f"final/{k}": v for k, v in metrics.items()}, **{f"final/{k}": v for k, v in last.items()}})
    print0(f"[rl] {metrics['global_step']} steps in {train_seconds:.0f} s ({metrics['seconds_per_step']:.1f} s/step); "
           f"reward {last.get('reward', float('nan')):.3f}, solve rate {last.get('behaviour/solve_rate', 0.0):.1%}, "
           f"env share {last.get('timing/env_share', float('nan')):.1%}; saved to {output_dir}")
    return {**metrics, **last}


def make_parser() -> RecipeParser:
    return RecipeParser((RLScriptArguments, GRPOConfig, ModelConfig))


if __name__ == "__main__":
    run_main(main, make_parser())
