"""The held-out harness solve rate DURING training: a TrainerCallback that plays a fixed task set with the live
model, so W&B shows how the agent's solve rate moves with the steps (train_sft.py).

    tasks = load_eval_tasks("factory:val/ladder", limit=60)        # spread evenly over the families
    callback = HarnessEvalCallback(trainer, tasks, budget, every_steps=None, on_start=True, workers=8)
    trainer.add_callback(callback)
    trainer.train()
    callback.final                                                  # the metrics of the last measurement

When: at every evaluation (`on_evaluate`: eval_steps, eval_on_start) by default, or every `every_steps`
optimizer steps instead; before the first step with `on_start`; and once more at the end of training when
the last measurement was not at the final step, so the stage's result holds the numbers of the model it
saves. Never twice at one step (eval_on_start with on_start, or the stage's own evaluate after training).

How: the trainer's own model and tokenizer, as they are (nothing loaded from disk, nothing copied), wrapped in
nanocomposer.policy.ModelPolicy as RL wraps its live model, and played through env.runner.run_tasks, the
runner eval.py and the post-training check use: greedy, within the budget given (train_sft passes the
check's), `workers` episodes at once whose pending turns are generated as one `act_batch`. For the whole
measurement the model is in eval mode with gradients off, and its mode is restored afterwards. ModelPolicy
renders every turn from the conversation exactly as eval.py's checkpoint policy does, so an episode plays as
eval.py would play it with a checkpoint saved at that step: the same conversation gives the same greedy turn
(up to batch-shape floating point, nanocomposer/engine/). Two runs of the same tasks can still part
ways, here as in eval.py, where a tool result differs between runs (test timings, workspace paths): measured
on 10 held-out ladder tasks with runs/demo-0557/sft, 6 episodes were identical to eval.py's and the other 4
agreed turn for turn until such a tool result.

What (the env/metrics.py definitions, through `summarize` and `summarize_by`), logged under `eval_harness_*`
keys, which transformers' W&B callback shows as `eval/harness_*` beside eval/loss:
    harness_solve_rate, harness_solve_rate_ci95_low, harness_solve_rate_ci95_high  (Wilson, on tasks)
    harness_tool_call_validity, harness_malformed_rate, harness_mean_turns, harness_tasks, harness_wall_s
    harness_solve_rate/<family>                                   (family: the task's `family`, e.g. ladder_copy)
Logging goes through `transformers.Trainer.log` (state.log_history, then every reporting callback's on_log):
the base class's method, not SFTTrainer's override, which folds the training metrics it has gathered since
the last log (token accuracy, entropy) into whatever is logged and clears them: they would leave the next
training log. Only the main process plays (the harness is single-process).

Cost (measured): 10 held-out ladder tasks, 8 turns x 128 tokens, 8 episodes at once, the demo's 5.3M model on
the 2-core CPU under load ~4: 16 s per measurement, so the default 60 tasks cost about 1.5 min each.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback

from env.budget import Budget
from env.episode import EpisodeConfig
from env.metrics import summarize, summarize_by
from env.runner import TaskRef, run_tasks
from env.tasks import Task, TaskError, family_of, spread_subset
from nanocomposer.common import print0
from nanocomposer.config import ConfigError

PREFIX = "harness_"


def spread_over_families(tasks: list[Task], limit: int | None) -> list[Task]:
    """At most `limit` of `tasks`: as many of each family as the others (a family with fewer gives its share to
    the rest), each family's share evenly spaced over it (env.tasks.spread_subset); in the order of `tasks`."""
    if limit is None or limit >= len(tasks):
        return list(tasks)
    groups: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        groups[family_of(task)].append(task)
    quota = dict.fromkeys(sorted(groups), 0)
    left = limit
    while left:  # round robin over the families that still have tasks; ends since limit < len(tasks)
        for family in quota:
            if left and quota[family] < len(groups[family]):
                quota[family] += 1
                left -= 1
    chosen = {id(task) for family, count in quota.items() for task in spread_subset(groups[family], count)}
    return [task for task in tasks if id(task) in chosen]


def load_eval_tasks(spec: str, limit: int | None, *, held_out_from: set[str] | None = None) -> list[Task]:
    """The tasks of `spec` (a task directory or a task-set name: env.task_sets.resolve_task_set), at most `limit`
    spread over the families. ConfigError, naming `harness_eval_tasks`, when the set does not resolve or when any
    chosen task id is in `held_out_from` (the training data's task ids): those would not be held out."""
    from env.task_sets import resolve_task_set

    try:
        task_set = resolve_task_set(spec)
    except TaskError as e:
        raise ConfigError(f"harness_eval_tasks {spec!r}: {e}") from None
    if task_set.invalid:
        print0(f"[harness eval] warning: {len(task_set.invalid)} task directories of {spec!r} do not load and are "
               f"left out; first: {task_set.invalid[0][1]}")
    tasks = spread_over_families(sorted(task_set.tasks, key=lambda t: t.id), limit)
    trained = sorted(t.id for t in tasks if t.id in (held_out_from or set()))
    if trained:
        raise ConfigError(f"harness_eval_tasks {spec!r}: {len(trained)} of its {len(tasks)} tasks (e.g. {trained[0]!r}) "
                          "are in the training data, so the harness eval would not be held out; use held-out tasks "
                          "such as factory:val/ladder")
    return tasks


def check_schedule(every_steps: int | None, eval_strategy) -> None:
    """ConfigError unless something schedules the measurements: every_steps, or evaluations to follow."""
    if every_steps is not None and (isinstance(every_steps, bool) or every_steps < 1):
        raise ConfigError(f"harness_eval_steps {every_steps!r}: must be an integer >= 1 (unset: at every evaluation)")
    if every_steps is None and str(getattr(eval_strategy, "value", eval_strategy)) == "no":
        raise ConfigError("harness_eval_tasks is set but nothing schedules it: eval_strategy is 'no' and "
                          "harness_eval_steps is unset; set harness_eval_steps, or an eval_strategy")


def plan_harness_eval(script_args, training_args, train_split) -> list[Task]:
    """train_sft.py's harness eval, checked before any model is loaded: its tasks ([] when
    `harness_eval_tasks` is unset), refusing tasks whose ids are in the training split's `task_id` column
    (data/build_sft.py writes it) and a schedule that never fires."""
    if not script_args.harness_eval_tasks:
        return []
    check_schedule(script_args.harness_eval_steps, training_args.eval_strategy)
    trained = set(train_split["task_id"]) if "task_id" in train_split.column_names else set()
    return load_eval_tasks(script_args.harness_eval_tasks, script_args.harness_eval_limit, held_out_from=trained)


def harness_metrics(records: list[dict], wall_s: float) -> dict[str, float]:
    """The logged numbers of one measurement (keys without the `eval_` prefix); module docstring."""
    summary = summarize(records, wall_s)
    low, high = summary["solve_rate_ci95"]
    metrics = {
        "solve_rate": summary["solve_rate"],
        "solve_rate_ci95_low": low,
        "solve_rate_ci95_high": high,
        "tool_call_validity": summary["tool_call_validity"],
        "malformed_rate": summary["malformed_rate"],
        "mean_turns": summary["mean_turns"],
        "tasks": summary["n_tasks"],
        "wall_s": summary["wall_s"],
        **{f"solve_rate/{family}": s["solve_rate"] for family, s in summarize_by(records, "family").items()},
    }
    return {PREFIX + key: value for key, value in metrics.items()}


class HarnessEvalCallback(TrainerCallback):
    """Plays `tasks` with `trainer`'s live model on a schedule and logs the harness metrics (module docstring).

    `make_policy`: a zero-argument policy factory to play with instead of the live model (env.runner.run_tasks's
    `make_policy`; tests use scripted policies). `records_dir`: where each measurement's episode records go,
    as `step-<N>.jsonl` (None: not kept). `history`: every measurement, `{"step": N, **metrics}`.
    """

    def __init__(self, trainer: Trainer, tasks: list[Task], budget: Budget, *, every_steps: int | None = None,
                 on_start: bool = False, workers: int = 8, records_dir: str | Path | None = None,
                 make_policy=None):
        if not tasks:
            raise ConfigError("harness eval: no tasks to play")
        check_schedule(every_steps, trainer.args.eval_strategy)
        self.trainer, self.budget, self.every_steps, self.on_start = trainer, budget, every_steps, on_start
        self.refs = [TaskRef(task, {"task_set": "harness_eval", "family": family_of(task)}) for task in tasks]
        self.workers = workers
        self.records_dir = Path(records_dir) if records_dir is not None else None
        self.make_policy = make_policy
        self.history: list[dict] = []
        if make_policy is None:
            self.live_policy()  # a tokenizer or budget the policy refuses fails now, before training

    @classmethod
    def from_script_args(cls, trainer: Trainer, tasks: list[Task], script_args, records_dir: str | Path | None):
        """The callback train_sft.py adds: SFTScriptArguments' harness_eval_* settings and the check's budget."""
        return cls(trainer, tasks, script_args.check_budget(), every_steps=script_args.harness_eval_steps,
                   on_start=script_args.harness_eval_on_start, workers=script_args.harness_eval_workers,
                   records_dir=records_dir)

    @property
    def final(self) -> dict:
        """The metrics of the last measurement ({} before the first)."""
        return {k: v for k, v in self.history[-1].items() if k != "step"} if self.history else {}

    def live_policy(self):
        """ModelPolicy around the trainer's model and tokenizer as they are (one CPU thread for generation, as
        eval.py uses: the episodes' sandboxed tools need the other cores)."""
        from nanocomposer.policy import ModelLoadError, ModelPolicy, SamplingConfig

        sampling = {k: v for k, v in self.budget.sampling().items() if v is not None}
        try:
            return ModelPolicy(self.trainer.model, self.trainer.processing_class, SamplingConfig(**sampling),
                               name="sft-live", cpu_threads=1)
        except (ValueError, ModelLoadError) as e:
            raise ConfigError(f"harness eval: the live model cannot play: {e}") from None

    # -- the schedule
    def on_train_begin(self, args, state, control, **kwargs):
        if self.on_start:
            self.measure(state)

    def on_step_end(self, args, state, control, **kwargs):
        if self.every_steps is not None and state.global_step % self.every_steps == 0:
            self.measure(state)

    def on_evaluate(self, args, state, control, **kwargs):
        if self.every_steps is None:
            self.measure(state)

    def on_train_end(self, args, state, control, **kwargs):
        self.measure(state)  # the saved model's numbers; nothing when the last step was measured already

    # -- one measurement
    def measure(self, state) -> None:
        step = state.global_step
        if not state.is_world_process_zero or any(h["step"] == step for h in self.history):
            return
        metrics = self.play(step)
        self.history.append({"step": step, **metrics})
        Trainer.log(self.trainer, {f"eval_{k}": v for k, v in metrics.items()})  # base class: module docstring
        families = ", ".join(f"{k.rsplit('/', 1)[1]} {v:.0%}" for k, v in metrics.items() if "/" in k)
        print0(f"[harness eval] step {step}: solve rate {metrics[PREFIX + 'solve_rate']:.1%} "
               f"[{metrics[PREFIX + 'solve_rate_ci95_low']:.1%}, {metrics[PREFIX + 'solve_rate_ci95_high']:.1%}] "
               f"on {metrics[PREFIX + 'tasks']} tasks ({families}); tool-call validity "
               f"{metrics[PREFIX + 'tool_call_validity']:.1%}; {metrics[PREFIX + 'wall_s']:.0f}s")

    def play(self, step: int) -> dict[str, float]:
        """Play the tasks once (model in eval mode, no gradients, mode restored) and return harness_metrics."""
        from nanocomposer.policies import seed_policy

        sampling = self.budget.sampling()
        model = self.trainer.model
        was_training = model.training
        results_path = None
        if self.records_dir is not None:
            self.records_dir.mkdir(parents=True, exist_ok=True)
            results_path = self.records_dir / f"step-{step}.jsonl"
        if self.make_policy is None:
            policy = self.live_policy()
            make_policy = lambda: policy  # one shared instance: it batches every live episode's turn
        else:
            make_policy = self.make_policy
        started = time.perf_counter()
        model.eval()
        try:
            with torch.no_grad():
                records = run_tasks(self.refs, make_policy, EpisodeConfig.from_budget(self.budget),
                                    seed=int(sampling["seed"]), concurrency=self.workers, results_path=results_path,
                                    progress=False, seed_policy=seed_policy, desc=f"harness eval step {step}")
        finally:
            model.train(was_training)
        return harness_metrics(records, time.perf_counter() - started)
