"""RL rollouts through the harness: TRL's `rollout_func` plays its episodes with `env.runner.run_tasks`, the
runner eval uses.

    dataset, index = task_prompt_dataset("artifacts/data/tasks/train")        # rows {prompt, task_dir, task_id}
    rollout = AgentRollout(index, tokenizer, RolloutConfig(...), output_dir)
    trainer = GRPOTrainer(model, reward_funcs, args, train_dataset=dataset, rollout_func=rollout, ...)

One loop for everything. TRL hands `rollout_func` the prompts of a step (each repeated num_generations
times); each prompt is looked up to its task directory, and all the step's episodes are played by one
`run_tasks` call, each in a fresh sandbox: the system prompt, tool schemas, parsing, tool-result formatting,
output truncation and budgets are eval.py's, because they are the episode loop's (env/episode.py).
`environment_factory` would have put TRL's tool loop in charge of parsing and turn-taking (a malformed call
is plain text there), so there would be two loops.

In-process and batched: the episodes' tools and grading run in the runner's threads (sandboxed commands are
subprocesses), and every turn that waits for the model is generated on the trainer's thread with the
trainer's live model: with transformers, it joins the running batch of the policy's stream (continuous
batching: it returns to its episode the step it stops, while the others decode on); with vLLM
(`backend = "vllm"`, weights synced by TRL before the rollout), it goes with all the others waiting then to
one `act_batch` call of TRL's engine. There are no worker processes and no weight copies: rollouts use the weights being trained
(policy lag 0), and a killed trainer leaves no workers behind (its sandboxes are swept by the next run).

One sequence per episode, token-in and token-out: `nanocomposer/rollout_tokens.py` (`RolloutPolicy`,
`episode_sample`).

Truncation is never silent: an episode cut by a token limit (a turn that hit max_new_tokens, or the
max_tokens / max_context exits) is marked `truncated` and, by config, masked from the loss
(`truncated_episodes: mask`, what TRL's mask_truncated_completions does for single turns; TRL's own flag
only sees whether the last token is EOS) or kept with the `truncated` reward as a penalty.

Timing (logged every step): `timing/generation_s` is the time spent generating (the stream's steps or
`act_batch`, on the trainer's thread, so wall time), `timing/env_s` the rest of the rollout (tools, grading, sandboxes, lint), and
`timing/env_share` the env's share of a whole cycle (rollout + training).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from env.episode import (
    EpisodeConfig,
    ExitStatus,
    Trajectory,
    initial_messages,
    load_prompts,
)
from env.metrics import summarize
from env.rewards import episode_facts
from env.runner import TaskRef
from env.tasks import Task, TaskError, load_task
from env.workspace import make_workspace, remove_workspace
from nanocomposer.engine.transformers_backend import DEFAULT_PREFIX_CACHE_POSITIONS
from nanocomposer.policies import GENERATION_BACKENDS
from nanocomposer.policy import SamplingConfig
from nanocomposer.rollout_tokens import (
    RolloutError,
    RolloutPolicy,
    VLLMRolloutPolicy,
    episode_sample,
    noncanonical_turns,
)

TRUNCATED_EPISODES = ("mask", "penalty")


# --------------------------------------------------------------------------- dataset


def prompt_key(messages: list[dict]) -> str:
    """What identifies a prompt: its roles and contents (TRL may add keys or copy the dicts)."""
    return json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)


def resolve_training_tasks(spec: str | Path, limit: int | None = None) -> tuple[list[Task], Path]:
    """(tasks, the directory whose manifest describes them) for a task directory or task-set names.

    `spec` is anything `env.task_sets.resolve_task_set` takes (a directory, `factory:train`,
    `factory:train/locate`, ...), or several joined by commas: a curriculum mix such as
    `factory:train/locate,factory:train/micro`. A task named by two parts of a mix is used once.
    """
    from env.task_sets import resolve_task_set

    tasks, seen, sources = [], set(), []
    for part in filter(None, (p.strip() for p in str(spec).split(","))):
        task_set = resolve_task_set(part)
        if task_set.kind != "harness":  # external benchmarks are reported, never trained on
            raise TaskError(f"task set {part!r} is an external benchmark ({task_set.label}): never train on it")
        sources.append(Path(task_set.source))
        for task in sorted(task_set.tasks, key=lambda t: t.id):
            if task.root not in seen:
                seen.add(task.root)
                tasks.append(task)
    if not sources:
        raise TaskError("no task set given")
    # a source's own manifest (e.g. a selected edge set), else the factory root (holding manifest.json) when
    # every part comes from one build, else the first source
    roots = {s if (s / "manifest.json").is_file() or not (s.parent / "manifest.json").is_file() else s.parent
             for s in sources}
    return tasks[:limit], roots.pop() if len(roots) == 1 else sources[0]


def task_prompt_dataset(tasks: str | Path | list[Task], limit: int | None = None, prompts_file: str | None = None):
    """(datasets.Dataset of {prompt, task_dir, task_id}, {prompt_key: task_dir}) for a task set.

    `tasks`: loaded tasks, or a task directory or task-set names (`resolve_training_tasks`). `prompt` is the
    episode's initial messages (`env.episode.initial_messages`, what run_episode shows the model first);
    TRL only passes prompts to `rollout_func`, so the index maps each prompt back to its task. Two tasks
    with the same prompt would be indistinguishable to the model and to the index: an error.
    """
    from datasets import Dataset

    tasks = tasks[:limit] if isinstance(tasks, list) else resolve_training_tasks(tasks, limit)[0]
    prompts = load_prompts(prompts_file) if prompts_file else load_prompts()
    rows, index = [], {}
    for task in tasks:
        messages = initial_messages(task, task.repo_dir, prompts)
        key = prompt_key(messages)
        if key in index:
            raise RolloutError(f"tasks {index[key]} and {task.root} have identical prompts: the policy cannot tell "
                               "them apart; remove one from the task set")
        index[key] = str(task.root)
        rows.append({"prompt": messages, "task_dir": str(task.root), "task_id": task.id})
    return Dataset.from_list(rows), index


# --------------------------------------------------------------------------- episodes


@dataclass
class RolloutConfig:
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    workers: int = 0  # episodes live at once (env.runner concurrency); 0 = all episodes of the rollout
    backend: str = "transformers"
    measure_lint: bool = False  # ruff before/after each episode (the `lint` reward)
    malformed_handling: str = "penalize"  # "drop": episodes with a malformed call leave the loss (malformed calls dropped)
    truncated_episodes: str = "mask"  # or "penalty" (the `truncated` reward)
    log_trajectories_steps: int = 10  # write/log a few full trajectories every this many rollouts (0: never)
    log_trajectories_count: int = 2
    # Torch threads while generating on a CPU. A small model's batched decode gains nothing from more, and a
    # busy machine loses a lot: batch 4 x 128 tokens of the tiny model took 18.7 s with 1 thread and 347 s
    # with 2 on 2 cores at load ~14 (python -m bench.generation --threads 1|2). Training keeps torch's own.
    generation_threads: int | None = 1
    # How long the first waiting turn may wait for other episodes still running tools before generating
    # without them (env.runner's batch_wait_s). A generation round of the whole group costs far more than a
    # second's wait, and every episode it leaves out costs a round of its own.
    batch_wait_s: float = 1.0

    def __post_init__(self):
        if self.backend not in GENERATION_BACKENDS:
            raise ValueError(f"RolloutConfig.backend={self.backend!r}: expected one of {GENERATION_BACKENDS}")
        if self.truncated_episodes not in TRUNCATED_EPISODES:
            raise ValueError(f"RolloutConfig.truncated_episodes={self.truncated_episodes!r}: expected one of "
                             f"{TRUNCATED_EPISODES}")
        if self.workers < 0:
            raise ValueError(f"RolloutConfig.workers={self.workers}: must be >= 0 (0: all episodes at once)")


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    record: dict  # Trajectory.to_record (with token ids): what the facts and monitors read
    lint_new_errors: int | None
    noncanonical_turns: int


def ruff_errors(directory: Path) -> int:
    """How many problems `ruff check` reports in `directory` (its own config, if it ships one)."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    proc = subprocess.run([ruff, "check", "--no-cache", "--exit-zero", "--output-format", "json", "."],
                          cwd=directory, capture_output=True, text=True, timeout=60, check=False)
    try:
        return len(json.loads(proc.stdout or "[]"))
    except json.JSONDecodeError:
        raise RolloutError(f"ruff in {directory} printed no JSON: {(proc.stdout + proc.stderr)[:300]}") from None


_BASELINE_LINT: dict[str, int] = {}


def baseline_lint(task: Task) -> int:
    """Ruff problems of the task's starting repo, counted in a workspace copy (same path layout as the agent's)."""
    if str(task.root) not in _BASELINE_LINT:
        workspace = make_workspace(task.repo_dir)
        try:
            _BASELINE_LINT[str(task.root)] = ruff_errors(workspace)
        finally:
            remove_workspace(workspace)
    return _BASELINE_LINT[str(task.root)]


def make_rollout_policy(model, tokenizer, config: RolloutConfig, trainer=None) -> RolloutPolicy:
    """The policy every episode of every rollout shares: the trainer's live model (transformers), or the
    trainer's vLLM engine, whose weights TRL syncs before the rollout."""
    if config.backend == "vllm":
        return VLLMRolloutPolicy(model, tokenizer, config.sampling, trainer)
    return RolloutPolicy(model, tokenizer, config.sampling, name="rollout", cpu_threads=config.generation_threads,
                         prefix_cache_positions=DEFAULT_PREFIX_CACHE_POSITIONS)


def play_episodes(policy: RolloutPolicy, task_dirs: list[str], config: RolloutConfig, seed: int,
                  tasks: dict[str, Task] | None = None) -> list[EpisodeResult]:
    """One episode per entry of `task_dirs` (a task repeated G times: G episodes), all through one
    `env.runner.run_tasks` call: tools and grading in its threads, every waiting turn in one `act_batch`.

    The k-th occurrence of a task is its sample k (seed `seed + k`, episode key f"{task id}#{seed + k}"). The
    runner plays every task as often as the most repeated one (GRPO repeats each prompt num_generations
    times, so normally nothing is extra); extra episodes are played and not returned. `tasks` caches loaded
    tasks by directory. A harness failure (a sandbox that would not start) is a RolloutError: such an
    episode is no sample of the policy.
    """
    from env.results import record_key
    from env.runner import run_tasks

    tasks = {} if tasks is None else tasks
    for task_dir in task_dirs:
        if task_dir not in tasks:
            tasks[task_dir] = load_task(task_dir)
    occurrence: Counter = Counter()
    wanted = []  # (task dir, sample) per entry of task_dirs
    for task_dir in task_dirs:
        wanted.append((task_dir, occurrence[task_dir]))
        occurrence[task_dir] += 1
    distinct = list(occurrence)
    samples = max(occurrence.values())
    episode_config = replace(config.episode, keep_workspace=config.measure_lint or config.episode.keep_workspace)
    lint: dict[tuple, int] = {}

    def measure(record: dict, trajectory: Trajectory | None) -> None:
        if config.measure_lint and trajectory is not None and trajectory.workspace:
            try:  # on the runner's calling thread: ruff takes ~20 ms, the batch waits that long
                lint[record_key(record)] = ruff_errors(Path(trajectory.workspace)) - baseline_lint(
                    tasks[record["task_set"]])
            finally:
                if not config.episode.keep_workspace:
                    remove_workspace(Path(trajectory.workspace))

    # The directory stands for the task set in the records: two sets may hold tasks with the same id.
    refs = [TaskRef(tasks[d], {"task_set": d}) for d in distinct]
    concurrency = config.workers or len(distinct) * samples
    try:
        records = run_tasks(refs, lambda: policy, episode_config, samples=samples, seed=seed,
                            concurrency=concurrency, progress=False, on_result=measure, token_ids=True,
                            batch_wait_s=config.batch_wait_s, desc="rollout")
    finally:
        policy.forget()
    by_key = {(r["task_set"], r["sample"]): r for r in records}
    results = []
    for task_dir, sample in wanted:
        record = by_key[(task_dir, sample)]
        if record["exit_status"] in (ExitStatus.HARNESS_ERROR.value, ExitStatus.INVALID_TASK.value):
            raise RolloutError(f"task {task_dir}: episode {record['episode_key']} failed in the harness, not the "
                               f"policy: {record['error']}")
        trajectory = Trajectory.from_record(record)
        results.append(EpisodeResult(trajectory, record, lint.get(record_key(record)),
                                     noncanonical_turns(trajectory, policy.tokenizer)))
    return results


# --------------------------------------------------------------------------- monitors


def behaviour_metrics(records: list[dict], facts: list[dict]) -> dict[str, float]:
    """Per-step behaviour rates: every behaviour is monitored, not only the reward (a reward hack shows there first).

    The rates eval reports are env.metrics.summarize's, on the same records (one definition each: solve,
    malformed-call, parallel-call, parallel-read, ask_user and tool-call-validity rates, mean turns and
    tokens, exit statuses); the rest are RL's own, from the episode facts.
    """
    n = len(facts)
    summary = summarize(records)
    submits = [e for e in facts if e["submitted"]]
    metrics = {
        "behaviour/solve_rate": summary["solve_rate"],
        "behaviour/malformed_call_rate": summary["malformed_rate"],
        "behaviour/malformed_episode_rate": sum(e["malformed_calls"] > 0 for e in facts) / n,
        "behaviour/tool_call_validity": summary["tool_call_validity"],
        "behaviour/ask_user_rate": summary["ask_user_rate"],
        "behaviour/ask_user_calls": sum(e["ask_user_calls"] for e in facts) / n,
        "behaviour/edit_rate": sum(e["edits"] > 0 for e in facts) / n,
        "behaviour/edits": sum(e["edits"] for e in facts) / n,
        "behaviour/failed_edits": sum(e["failed_edits"] for e in facts) / n,
        "behaviour/test_files_touched_rate": sum(e["test_files_touched"] > 0 for e in facts) / n,
        "behaviour/parallel_call_rate": summary["parallel_call_rate"],
        "behaviour/parallel_read_rate": summary["parallel_read_rate"],
        "behaviour/submit_without_test_rate": (sum(e["submit_without_test_run"] for e in submits) / len(submits)
                                               if submits else 0.0),
        "behaviour/mean_turns": summary["mean_turns"],
        # (facts: an episode that ended before its first turn counts 0 tokens, where summarize gives no mean)
        "behaviour/mean_completion_tokens": sum(e["completion_tokens"] for e in facts) / n,
        "behaviour/mean_calls": summary["tool_calls"] / n,
        "rollout/truncated_rate": sum(e["truncated"] for e in facts) / n,
        "rollout/dropped_rate": sum(e["dropped"] for e in facts) / n,
    }
    statuses = summary["exit_statuses"]
    metrics.update({f"exit/{s.value}": statuses.get(s.value, 0) / n for s in ExitStatus})
    return metrics


def advantage_shares(rewards: torch.Tensor, weights: torch.Tensor, num_generations: int,
                     names: list[str]) -> dict[str, float]:
    """Each component's share of the advantage signal, and its share of zero-std groups.

    rewards: (completions, components) as TRL computes them (NaN where a component returned None). The share
    of component k is sum |w_k r_k - group mean| over all completions, divided by the same summed over all
    components: how much of what separates completions within a group comes from k.
    """
    grouped = (rewards * weights).view(-1, num_generations, len(names))
    centered = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).abs().nan_to_num(0.0)
    spread = centered.sum(dim=(0, 1))
    total = spread.sum().item()
    out = {}
    for k, name in enumerate(names):
        out[f"advantage_share/{name}"] = spread[k].item() / total if total > 0 else 0.0
        values = rewards[:, k].view(-1, num_generations)
        zero_std = [bool(torch.isnan(g).all()) or torch.nan_to_num(g - torch.nanmean(g)).abs().max().item() < 1e-8
                    for g in values]
        out[f"zero_std_groups/{name}"] = sum(zero_std) / len(zero_std)
    return out


# --------------------------------------------------------------------------- rollout_func


class AgentRollout:
    """TRL `rollout_func`: `(prompts, trainer) -> {prompt_ids, completion_ids, logprobs, env_mask, episode, ...}`."""

    def __init__(self, task_index: dict[str, str], tokenizer, config: RolloutConfig, output_dir: str | Path | None):
        self.index, self.tokenizer, self.config = task_index, tokenizer, config
        self.output_dir = Path(output_dir) if output_dir else None
        self.policy: RolloutPolicy | None = None
        self.tasks: dict[str, Task] = {}  # loaded once per run
        self.calls = 0
        self.timing = {"previous_start": None, "previous_env_wall": 0.0}
        self.last_metrics: dict[str, float] = {}

    def play(self, model, task_dirs: list[str], seed: int, trainer=None) -> tuple[list[EpisodeResult], float]:
        """(one episode per task dir, the seconds spent generating) with the live `model`."""
        if self.policy is None:
            self.policy = make_rollout_policy(model, self.tokenizer, self.config, trainer)
        gen_before = self.policy.stats["gen_s"]
        results = play_episodes(self.policy, task_dirs, self.config, seed, self.tasks)
        return results, self.policy.stats["gen_s"] - gen_before

    def __call__(self, prompts: list[list[dict]], trainer) -> dict:
        started = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        task_dirs = []
        for prompt in prompts:
            key = prompt_key(prompt)
            if key not in self.index:
                raise RolloutError(f"rollout_func got a prompt that is not in the task index: {key[:200]}...")
            task_dirs.append(self.index[key])
        step = trainer.state.global_step
        results, gen_s = self.play(model, task_dirs, seed=step * 100_000 + self.calls * 1_000, trainer=trainer)
        rollout_wall = time.perf_counter() - started
        out = self.build(prompts, results)
        self.log(trainer, results, out["episode"], started, rollout_wall, gen_s)
        self.calls += 1
        return out

    def build(self, prompts: list[list[dict]], results: list[EpisodeResult]) -> dict:
        """The TRL sample and the reward extras of each episode."""
        episode_cfg, sampling = self.config.episode, self.config.sampling
        budget = episode_cfg.max_tokens or episode_cfg.max_turns * sampling.max_new_tokens
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "episode": []}
        for prompt, result in zip(prompts, results, strict=True):
            traj = result.trajectory
            if prompt_key(traj.messages[:len(prompt)]) != prompt_key(prompt):
                raise RolloutError(f"task {traj.task_id}: the episode's first messages differ from the dataset prompt "
                                   "(the task changed since the dataset was built?)")
            facts = episode_facts(result.record, max_turns=episode_cfg.max_turns, token_budget=budget,
                                  max_wall_s=episode_cfg.max_wall_s, lint_new_errors=result.lint_new_errors)
            facts["dropped"] = self.config.malformed_handling == "drop" and facts["malformed_calls"] > 0
            facts["noncanonical_turns"] = result.noncanonical_turns
            mask = facts["dropped"] or (facts["truncated"] and self.config.truncated_episodes == "mask")
            sample = episode_sample(traj, self.tokenizer.eos_token_id, mask_episode=mask)
            for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask"):
                out[key].append(sample[key])
            out["episode"].append(facts)
        return out

    def log(self, trainer, results: list[EpisodeResult], facts: list[dict], started: float, rollout_wall: float,
            gen_s: float) -> None:
        # Generation runs on this thread, one act_batch at a time, so its time is wall time; the rest of the
        # rollout is the environment: tools and grading (in the runner's threads, overlapping each other),
        # sandbox and workspace setup, lint, and the runner itself.
        env_wall = max(0.0, rollout_wall - gen_s)
        metrics = behaviour_metrics([r.record for r in results], facts)
        turns = sum(len(r.trajectory.turns) for r in results)
        metrics.update({
            "rollout/noncanonical_turn_rate": sum(r.noncanonical_turns for r in results) / turns if turns else 0.0,
            "rollout/policy_lag_steps": 0.0,  # episodes generate with the trainer's live weights (module docstring)
            "timing/rollout_s": rollout_wall,
            "timing/generation_s": gen_s,
            "timing/env_s": env_wall,
        })
        previous = self.timing["previous_start"]
        if previous is not None:  # one full cycle: the previous rollout plus the training on it
            cycle = started - previous
            metrics["timing/cycle_s"] = cycle
            metrics["timing/env_share"] = self.timing["previous_env_wall"] / cycle if cycle > 0 else 0.0
        self.timing.update(previous_start=started, previous_env_wall=env_wall)
        for key, value in metrics.items():
            trainer._log_metric(key, value)  # the channel TRL gives reward functions as `log_metric`
        self.last_metrics = metrics
        every = self.config.log_trajectories_steps
        if every and self.calls % every == 0:
            self.log_trajectories(trainer.state.global_step, results, facts)

    def log_trajectories(self, step: int, results: list[EpisodeResult], facts: list[dict]) -> None:
        """A few full trajectories as JSONL (and a W&B table): our own table."""
        rows = []
        for result, fact in list(zip(results, facts))[: self.config.log_trajectories_count]:
            sample = episode_sample(result.trajectory, self.tokenizer.eos_token_id)
            text = self.tokenizer.decode(sample["prompt_ids"] + sample["completion_ids"], skip_special_tokens=False)
            rows.append({"step": step, **{k: fact[k] for k in ("task_id", "exit_status", "solved", "turns",
                                                                "malformed_calls", "completion_tokens")},
                         "transcript": text})
        if self.output_dir is not None:
            folder = self.output_dir / "trajectories"
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"step-{step:06d}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        if "wandb" in sys.modules and getattr(sys.modules["wandb"], "run", None) is not None and rows:
            import wandb

            table = wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])
            wandb.log({"trajectories": table}, commit=False)

    def close(self) -> None:
        """Nothing runs between rollouts (no worker processes; each rollout's sandboxes are closed by the
        runner): drop the per-episode token state."""
        if self.policy is not None:
            self.policy.forget()
