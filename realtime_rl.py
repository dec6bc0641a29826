"""Stage 4: real-time RL. The served checkpoint learns from its users' sessions, cycle after cycle.

    python realtime_rl.py --config recipes/tiny/realtime.yaml --model_name_or_path runs/demo/sft --run rt
    python realtime_rl.py --config recipes/tiny/realtime.yaml --run rt          # after a kill: resumes the cycle
    python realtime_rl.py --config recipes/tiny/realtime.yaml --run rt-malformed-dropped --malformed_handling drop
    python realtime_rl.py --config recipes/tiny/realtime.yaml --run rt-free-questions --ask_user_handling free

One cycle (nanocomposer/realtime/): the registry's `current` version serves simulated users through
`agent.py serve` (real processes, HTTP); the cycle's finished sessions served by that version are collected
from the server's SQLite with the feedback that arrived by the cut-off; each session's reward is the recipe's
weighted env/rewards.py components (edit kept, edit reverted, dissatisfied follow-up, latency, malformed calls,
ask_user), each logged on its own; TRL's GRPOTrainer takes one pass over the logged token ids and sampling
logprobs (on-policy: the version that generated them is the one updated, checked at every step); the
candidate plays the held-out gate tasks against current, and is promoted through `POST /admin/promote` only
if the gate passes. A promoted version whose next cycle's live metrics fall below its parent's (persisting
edits, dissatisfied follow-ups, malformed sessions; nanocomposer/realtime/live.py) is rolled back.

Output: runs/<run>/realtime/ (layout in nanocomposer/realtime/loop.py): state.json, the registry with one
version per cycle and its gate report, sessions.db, cycles/<k>/, report.md; W&B (offline) job `realtime` of
group <run>, one step per cycle.
"""

from __future__ import annotations

import math

from trl import GRPOConfig, ModelConfig

from env.task_sets import resolve_task_set
from env.tasks import TaskError
from nanocomposer.common import print0, run_main
from nanocomposer.config import ConfigError, RecipeParser, recipe_reward_funcs
from nanocomposer.inputs import check_model_path
from nanocomposer.model_io import configure_device
from nanocomposer.realtime.config import RealtimeArguments
from nanocomposer.realtime.traffic import training_draw
from nanocomposer.run_record import finish_wandb, init_wandb

STAGE = "realtime"


def check_arguments(args: RealtimeArguments, training_args: GRPOConfig) -> None:
    """Everything about the recipe that can be wrong, checked before any process starts."""
    recipe_reward_funcs(args.reward_funcs, training_args.reward_weights, malformed_handling=args.malformed_handling,
                        ask_user_handling=args.ask_user_handling)
    if training_args.top_p != 1.0:
        raise ConfigError(f"top_p {training_args.top_p}: the agent server samples with top_p 1.0, and the trainer "
                          "must score tokens under the distribution they were drawn from; set top_p: 1.0")
    if args.baseline == "batch" and training_args.num_generations != training_args.generation_batch_size:
        raise ConfigError(f"baseline: batch compares the sessions of one step: num_generations "
                          f"({training_args.num_generations}) must equal the step's batch "
                          f"({training_args.generation_batch_size} = per_device_train_batch_size x "
                          "gradient_accumulation_steps)")
    try:
        traffic = {t.root for t in resolve_task_set(args.traffic_tasks).tasks}
        gate = {t.root for t in resolve_task_set(args.gate_tasks).tasks}
    except TaskError as e:
        raise ConfigError(f"traffic_tasks / gate_tasks: {e}") from None
    try:
        training_draw(len(traffic), args.traffic_task_limit)
    except ValueError as e:
        raise ConfigError(f"{e} (traffic_tasks {args.traffic_tasks!r})") from None
    if traffic & gate:
        raise ConfigError(f"gate_tasks {args.gate_tasks!r} share {len(traffic & gate)} tasks with traffic_tasks "
                          f"{args.traffic_tasks!r}: the gate must be held out from what the users ask for")


def main(args: RealtimeArguments, training_args: GRPOConfig, model_args: ModelConfig) -> list[dict]:
    from nanocomposer.realtime.loop import Loop

    configure_device(training_args)
    check_arguments(args, training_args)
    if not Loop.state_file(args).is_file():  # a resumed loop has its v0 already
        check_model_path(model_args.model_name_or_path, chat_template=True)
    loop = Loop(args, training_args, model_args, log=print0)
    loop.wandb = init_wandb(training_args, run=args.run, stage=STAGE, output_dir=loop.dir,
                            config={"realtime": vars(args), "grpo": training_args.to_dict()}, manifest_path=None)
    training_args.report_to = []  # the inner trainers log through the loop (one W&B step per cycle)
    history = loop.run()
    last = history[-1] if history else {}
    finish_wandb(loop.wandb, {f"final/{k}": v for k, v in last.items()
                              if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))})
    print0(f"[realtime] {len(history)} cycles; current {loop.state.current}; report {loop.dir / 'report.md'}")
    return history


def make_parser() -> RecipeParser:
    return RecipeParser((RealtimeArguments, GRPOConfig, ModelConfig))


if __name__ == "__main__":
    run_main(main, make_parser())
