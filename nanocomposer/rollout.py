"""RL rollouts through the harness: TRL's `rollout_func` runs `env.episode.run_episode`, the loop eval uses.

    dataset, index = task_prompt_dataset("artifacts/data/tasks/train")        # rows {prompt, task_dir, task_id}
    rollout = AgentRollout(index, tokenizer, RolloutConfig(...), output_dir)
    trainer = GRPOTrainer(model, reward_funcs, args, train_dataset=dataset, rollout_func=rollout, ...)

One loop for everything. TRL hands `rollout_func` the prompts of a step (each repeated num_generations
times); each prompt is looked up to its task directory and played as one whole episode of
`run_episode(task, RolloutPolicy(model, ...), EpisodeConfig(...))` in a fresh sandbox: the system prompt,
tool schemas, parsing, tool-result formatting, output truncation and budgets are eval.py's, because they
are the episode loop's. `environment_factory` would have put TRL's tool loop in charge of parsing and
turn-taking (a malformed call is plain text there, field notes), so there would be two loops.

One sequence per episode. The sample TRL trains on is `prompt_ids` = the rendered first prompt (system +
tools + task + assistant header) and `completion_ids` = every later token: the model's own ids of each
turn, exactly as sampled, interleaved with the environment's tokens (the template's text between turns:
end of turn, tool responses, next assistant header). `env_mask` is 1 on the model's tokens and 0 on the
environment's (TRL's tool mask: tool results are never trained on); `logprobs` are the sampling
log-probabilities (0.0 on environment tokens, which the mask excludes).

Token-in, token-out (`RolloutPolicy`): each turn's prompt is the previous prompt + the sampled ids + the
environment's tokens, not a fresh tokenization of the re-rendered conversation. The template is
prefix-preserving, so when the sampled ids are the tokenizer's own tokenization of the text they decode
to, both are the same ids and the RL path shows the model exactly what eval's ModelPolicy shows it
(tested by replaying a trajectory through both). When the model samples a non-canonical split of some
text (BPE allows several), re-tokenizing would change the context under the model's feet and the
training forward pass would score tokens in a context the sampler never saw; keeping the sampled ids
keeps training on-policy. How often that happens is logged (`rollout/noncanonical_turn_rate`).

Truncation is never silent: an episode cut by a token limit (a turn that hit max_new_tokens, or the
max_tokens / max_context exits) is marked `truncated` and, by config, masked from the loss
(`truncated_episodes: mask`, what TRL's mask_truncated_completions does for single turns; TRL's own flag
only sees whether the last token is EOS) or kept with the `truncated` reward as a penalty.

Parallelism: with `workers > 0` episodes run in a pool of spawned processes, each holding a copy of the
policy (one torch thread each); the trainer's weights are copied into shared memory at the start of every
rollout and each worker loads them before its next episode, so rollouts are on-policy (staleness 0).
`workers = 0` runs episodes in the trainer process with the live model; `backend = "vllm"` generates each
turn with TRL's vLLM engine (colocate or server mode; weights synced by TRL before the rollout).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from env.episode import EpisodeConfig, ExitStatus, Trajectory, initial_messages, load_prompts, run_episode
from env.rewards import episode_facts
from env.tasks import Task, TaskError, load_task
from env.workspace import make_workspace, remove_workspace
from nanocomposer.policy import ModelPolicy, SamplingConfig

BACKENDS = ("transformers", "vllm")
TRUNCATED_EPISODES = ("mask", "penalty")


class RolloutError(RuntimeError):
    """A rollout that cannot become a training sample; the message names the task and the problem."""


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
    # the factory root (holding manifest.json) when every part comes from one build, else the first source
    roots = {s.parent if (s.parent / "manifest.json").is_file() else s for s in sources}
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


# --------------------------------------------------------------------------- policy


class RolloutPolicy(ModelPolicy):
    """ModelPolicy that extends its token sequence turn by turn instead of re-tokenizing (module docstring).

    Each prompt after the first is: previous prompt ids + the ids sampled for the previous turn + the tokens
    of the text the chat template adds after it (end of turn, tool responses, next assistant header). That
    text is the difference of two renderings, which the prefix-preserving template makes a suffix; a
    conversation that is not extended as a suffix (e.g. a compactor rewrote it) raises RolloutError.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.next_episode: int | None = None  # set by the rollout: sampling seeds derive from it
        self.noncanonical_turns = 0
        self._last: tuple[str, list[int], list[int], str] | None = None  # text, prompt ids, completion ids, turn text
        self._pending_text = ""  # the rendering behind the prompt being generated from

    def reset(self, task) -> None:
        super().reset(task)
        if self.next_episode is not None:
            self.episode, self.next_episode = self.next_episode, None
        self._last = None

    def render_text(self, messages: list[dict], tools: list[dict]) -> str:
        from nanocomposer.policy import MESSAGE_KEYS

        clean = [{k: m[k] for k in MESSAGE_KEYS if k in m} for m in messages]
        return self.tokenizer.apply_chat_template(clean, tools=tools or None, add_generation_prompt=True,
                                                  tokenize=False)

    def render(self, messages: list[dict], tools: list[dict]) -> list[int]:
        text = self.render_text(messages, tools)
        if self._last is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            prev_text, prev_prompt, prev_completion, turn_text = self._last
            if not text.startswith(prev_text + turn_text):
                raise RolloutError(f"task {self.task_id}: turn {self.turn} does not extend the previous prompt as a "
                                   "suffix (was the conversation rewritten, e.g. by a compactor?)")
            env_text = text[len(prev_text) + len(turn_text):]
            stop_text = self.tokenizer.decode(prev_completion[-1:], skip_special_tokens=False)
            if prev_completion and prev_completion[-1] in self.stop_ids and env_text.startswith(stop_text):
                env_text = env_text[len(stop_text):]  # the model wrote the end-of-turn token itself
            ids = prev_prompt + prev_completion + self.tokenizer.encode(env_text, add_special_tokens=False)
        self._pending_text = text
        return ids

    def act(self, messages: list[dict], tools: list[dict]):
        gen = super().act(messages, tools)
        canonical = self.tokenizer.encode(gen.text, add_special_tokens=False)
        body = gen.completion_ids[:-1] if not gen.truncated else gen.completion_ids
        self.noncanonical_turns += canonical != body
        self._last = (self._pending_text, gen.prompt_ids, gen.completion_ids, gen.text)
        return gen


class VLLMRolloutPolicy(RolloutPolicy):
    """RolloutPolicy generating each turn with the trainer's vLLM engine (TRL's colocate or server mode).

    Sampling settings are the trainer's (temperature, top_p, and max_completion_length, which train_rl sets to
    the per-turn max_new_tokens); logprobs are vLLM's processed logprobs of the sampled tokens.
    """

    def __init__(self, model, tokenizer, sampling: SamplingConfig, trainer):
        super().__init__(model, tokenizer, sampling)
        self.trainer = trainer

    def _generate(self, prompt_ids: list[int], seed: int) -> tuple[list[int], list[float]]:
        _, completions, logprobs, _ = self.trainer.vllm_generation.generate([prompt_ids], None, 1)
        ids = list(completions[0])
        return ids, [float(lp[0]) if lp and lp[0] is not None else float("nan") for lp in logprobs[0]]


# --------------------------------------------------------------------------- samples


def episode_sample(trajectory: Trajectory, eos_id: int, mask_episode: bool = False) -> dict:
    """One training sample from an episode: prompt_ids, completion_ids, env_mask, logprobs (module docstring).

    Every turn's prompt must extend the sequence built so far (RolloutPolicy guarantees it; so does any policy
    whose sampled ids are canonical). An episode without a single turn (e.g. the first prompt overflowed the
    context) becomes one masked EOS token: TRL needs a non-empty completion, and nothing is trained.
    """
    turns = trajectory.turns
    if not turns:
        return {"prompt_ids": [eos_id], "completion_ids": [eos_id], "env_mask": [0], "logprobs": [0.0]}
    sequence = list(turns[0]["prompt_ids"])
    prompt_len = len(sequence)
    env_mask, logprobs = [], []
    for turn in turns:
        prompt, completion = turn["prompt_ids"], turn["completion_ids"]
        if prompt is None or completion is None or turn["logprobs"] is None:
            raise RolloutError(f"task {trajectory.task_id}: turn {turn['turn']} has no token ids "
                               f"(policy {trajectory.policy!r} is not a model policy)")
        if prompt[:len(sequence)] != sequence:
            raise RolloutError(f"task {trajectory.task_id}: the prompt of turn {turn['turn']} does not extend the "
                               "tokens of the turns before it; the episode cannot be one training sequence")
        env = prompt[len(sequence):]
        sequence += env + completion
        env_mask += [0] * len(env) + [1] * len(completion)
        logprobs += [0.0] * len(env) + list(turn["logprobs"])
    if mask_episode:
        env_mask = [0] * len(env_mask)
    return {"prompt_ids": sequence[:prompt_len], "completion_ids": sequence[prompt_len:], "env_mask": env_mask,
            "logprobs": logprobs}


# --------------------------------------------------------------------------- episodes


@dataclass
class RolloutConfig:
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    workers: int = 2  # episode processes; 0 = in the trainer process
    backend: str = "transformers"
    measure_lint: bool = False  # ruff before/after each episode (the `lint` reward)
    malformed_handling: str = "penalize"  # "drop": episodes with a malformed call leave the loss (hack 1)
    truncated_episodes: str = "mask"  # or "penalty" (the `truncated` reward)
    log_trajectories_steps: int = 10  # write/log a few full trajectories every this many rollouts (0: never)
    log_trajectories_count: int = 2

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"RolloutConfig.backend={self.backend!r}: expected one of {BACKENDS}")
        if self.truncated_episodes not in TRUNCATED_EPISODES:
            raise ValueError(f"RolloutConfig.truncated_episodes={self.truncated_episodes!r}: expected one of "
                             f"{TRUNCATED_EPISODES}")
        if self.workers < 0:
            raise ValueError(f"RolloutConfig.workers={self.workers}: must be >= 0")


@dataclass
class EpisodeJob:
    task_dir: str
    episode: int  # seeds the sampling of this episode
    weights_version: int = 0


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    lint_new_errors: int | None
    noncanonical_turns: int
    env_s: float  # everything in the episode that was not generation (tools, grading, sandbox, lint)


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


def play_episode(policy: RolloutPolicy, job: EpisodeJob, config: EpisodeConfig, measure_lint: bool) -> EpisodeResult:
    """One episode of `job`'s task in a fresh sandbox (plus the lint count when asked)."""
    task = load_task(job.task_dir)
    policy.next_episode = job.episode
    before = policy.noncanonical_turns
    trajectory = run_episode(task, policy, replace(config, keep_workspace=measure_lint or config.keep_workspace))
    lint_new_errors = None
    if measure_lint:
        t0 = time.perf_counter()
        try:
            lint_new_errors = ruff_errors(Path(trajectory.workspace)) - baseline_lint(task)
        finally:
            if not config.keep_workspace:
                remove_workspace(Path(trajectory.workspace))
        trajectory.wall_s += time.perf_counter() - t0
    return EpisodeResult(trajectory, lint_new_errors, policy.noncanonical_turns - before,
                         trajectory.wall_s - trajectory.gen_s)


_WORKER: dict = {}  # per worker process: model, policy, shared weights, loaded version, config


def _init_worker(model_config, generation_config, tokenizer, shared_weights: dict, sampling: SamplingConfig,
                 episode_config: EpisodeConfig, measure_lint: bool) -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # two 1-thread workers beat one 2-thread process on 2 cores (eval.py)
    model = AutoModelForCausalLM.from_config(model_config)
    model.generation_config = generation_config
    model.eval()
    _WORKER.update(model=model, policy=RolloutPolicy(model, tokenizer, sampling), shared=shared_weights,
                   version=-1, config=episode_config, measure_lint=measure_lint)


def _run_in_worker(job: EpisodeJob) -> EpisodeResult:
    if _WORKER["version"] != job.weights_version:
        with torch.no_grad():
            _WORKER["model"].load_state_dict(_WORKER["shared"])
        _WORKER["version"] = job.weights_version
    return play_episode(_WORKER["policy"], job, _WORKER["config"], _WORKER["measure_lint"])


def _ping(_: int) -> bool:
    return bool(_WORKER)


class EpisodeRunner:
    """Runs a batch of episodes with the current weights of `model`: in a process pool, or in this process."""

    def __init__(self, model, tokenizer, config: RolloutConfig, trainer=None):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.version = 0
        self.startup_s = 0.0  # spawning the pool (first rollout only): not episode time
        self.pool = None
        self.shared = None
        if config.backend == "vllm":
            self.policy = VLLMRolloutPolicy(model, tokenizer, config.sampling, trainer)
        elif config.workers == 0:
            self.policy = RolloutPolicy(model, tokenizer, config.sampling)
        else:
            if hasattr(model, "peft_config"):
                raise ValueError("rollout workers copy full weights; a PEFT model needs rollout_workers: 0 "
                                 "(in-process) or the vllm backend")
            self.policy = None

    def _start_pool(self) -> None:
        import torch.multiprocessing as mp

        # A private shared-memory copy of the weights: workers read it, this process writes it each rollout.
        self.shared = {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in self.model.state_dict().items()}
        context = mp.get_context("spawn")  # fork after torch/OpenMP threads and W&B threads is not safe
        self.pool = ProcessPoolExecutor(
            max_workers=self.config.workers, mp_context=context, initializer=_init_worker,
            initargs=(self.model.config, self.model.generation_config, self.tokenizer, self.shared,
                      self.config.sampling, self.config.episode, self.config.measure_lint))

    def sync_weights(self) -> None:
        if self.pool is None:
            return
        with torch.no_grad():
            for key, value in self.model.state_dict().items():
                self.shared[key].copy_(value.detach())
        self.version += 1

    def run(self, task_dirs: list[str], first_episode: int) -> list[EpisodeResult]:
        jobs = [EpisodeJob(d, first_episode + i) for i, d in enumerate(task_dirs)]
        if self.policy is not None:
            return [play_episode(self.policy, job, self.config.episode, self.config.measure_lint) for job in jobs]
        if self.pool is None:
            t0 = time.perf_counter()
            self._start_pool()
            list(self.pool.map(_ping, range(self.config.workers)))  # wait for the workers to come up
            self.startup_s = time.perf_counter() - t0
        self.sync_weights()
        jobs = [replace(job, weights_version=self.version) for job in jobs]
        return list(self.pool.map(_run_in_worker, jobs))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None


# --------------------------------------------------------------------------- monitors


def behaviour_metrics(facts: list[dict]) -> dict[str, float]:
    """Per-step behaviour rates (recipe section 6: every behaviour monitored, not only the reward)."""
    n = len(facts)
    calls = sum(e["calls"] for e in facts)
    calling_turns = sum(e["calling_turns"] for e in facts)
    submits = [e for e in facts if e["submitted"]]
    metrics = {
        "behaviour/solve_rate": sum(e["solved"] for e in facts) / n,
        "behaviour/malformed_call_rate": sum(e["malformed_calls"] for e in facts) / calls if calls else 0.0,
        "behaviour/malformed_episode_rate": sum(e["malformed_calls"] > 0 for e in facts) / n,
        "behaviour/ask_user_rate": sum(e["ask_user_calls"] > 0 for e in facts) / n,
        "behaviour/ask_user_calls": sum(e["ask_user_calls"] for e in facts) / n,
        "behaviour/edit_rate": sum(e["edits"] > 0 for e in facts) / n,
        "behaviour/edits": sum(e["edits"] for e in facts) / n,
        "behaviour/failed_edits": sum(e["failed_edits"] for e in facts) / n,
        "behaviour/test_files_touched_rate": sum(e["test_files_touched"] > 0 for e in facts) / n,
        "behaviour/parallel_call_rate": sum(e["parallel_turns"] for e in facts) / calling_turns if calling_turns else 0.0,
        "behaviour/submit_without_test_rate": (sum(e["submit_without_test_run"] for e in submits) / len(submits)
                                               if submits else 0.0),
        "behaviour/mean_turns": sum(e["turns"] for e in facts) / n,
        "behaviour/mean_completion_tokens": sum(e["completion_tokens"] for e in facts) / n,
        "behaviour/mean_calls": calls / n,
        "rollout/truncated_rate": sum(e["truncated"] for e in facts) / n,
        "rollout/dropped_rate": sum(e["dropped"] for e in facts) / n,
    }
    statuses = Counter(e["exit_status"] for e in facts)
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
        self.runner: EpisodeRunner | None = None
        self.calls = 0
        self.timing = {"previous_start": None, "previous_env_wall": 0.0}
        self.last_metrics: dict[str, float] = {}

    def __call__(self, prompts: list[list[dict]], trainer) -> dict:
        started = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self.runner is None:
            self.runner = EpisodeRunner(model, self.tokenizer, self.config, trainer)
        task_dirs = []
        for prompt in prompts:
            key = prompt_key(prompt)
            if key not in self.index:
                raise RolloutError(f"rollout_func got a prompt that is not in the task index: {key[:200]}...")
            task_dirs.append(self.index[key])
        step = trainer.state.global_step
        results = self.runner.run(task_dirs, first_episode=step * 100_000 + self.calls * 1_000)
        startup, self.runner.startup_s = self.runner.startup_s, 0.0
        rollout_wall = time.perf_counter() - started - startup
        out = self.build(prompts, results)
        self.log(trainer, results, out["episode"], started + startup, rollout_wall)
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
            facts = episode_facts(traj, max_turns=episode_cfg.max_turns, token_budget=budget,
                                  max_wall_s=episode_cfg.max_wall_s, lint_new_errors=result.lint_new_errors)
            facts["dropped"] = self.config.malformed_handling == "drop" and facts["malformed_calls"] > 0
            facts["noncanonical_turns"] = result.noncanonical_turns
            mask = facts["dropped"] or (facts["truncated"] and self.config.truncated_episodes == "mask")
            sample = episode_sample(traj, self.tokenizer.eos_token_id, mask_episode=mask)
            for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask"):
                out[key].append(sample[key])
            out["episode"].append(facts)
        return out

    def log(self, trainer, results: list[EpisodeResult], facts: list[dict], started: float, rollout_wall: float) -> None:
        gen_s = sum(r.trajectory.gen_s for r in results)
        env_s = sum(r.env_s for r in results)
        # Episodes overlap in the pool: split the rollout's wall time by the two parts' shares of episode time.
        env_wall = rollout_wall * env_s / (gen_s + env_s) if gen_s + env_s else 0.0
        metrics = behaviour_metrics(facts)
        turns = sum(len(r.trajectory.turns) for r in results)
        metrics.update({
            "rollout/noncanonical_turn_rate": sum(r.noncanonical_turns for r in results) / turns if turns else 0.0,
            "rollout/policy_lag_steps": 0.0,  # weights are synced before every rollout (see module docstring)
            "timing/rollout_s": rollout_wall,
            "timing/generation_s": rollout_wall - env_wall,
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
        """A few full trajectories as JSONL (and a W&B table): our own table, field notes pitfall 8."""
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
        if self.runner is not None:
            self.runner.close()
