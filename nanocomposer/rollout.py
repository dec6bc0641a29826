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

One sequence per episode. The sample TRL trains on is `prompt_ids` = the rendered first prompt (system +
tools + task + assistant header) and `completion_ids` = every later token: the model's own ids of each
turn, exactly as sampled, interleaved with the environment's tokens (the template's text between turns:
end of turn, tool responses, next assistant header). `env_mask` is 1 on the model's tokens and 0 on the
environment's (TRL's tool mask: tool results are never trained on); `logprobs` are the sampling
log-probabilities (0.0 on environment tokens, which the mask excludes).

Token-in, token-out (`RolloutPolicy`): each turn's prompt is the episode's previous prompt + the sampled ids
+ the environment's tokens, not a fresh tokenization of the re-rendered conversation. The template is
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
    Generation,
    Trajectory,
    TurnRequest,
    foreign_token_source,
    initial_messages,
    load_prompts,
)
from env.metrics import summarize
from env.rewards import episode_facts
from env.runner import TaskRef
from env.tasks import Task, TaskError, load_task
from env.workspace import make_workspace, remove_workspace
from nanocomposer.engine.sampling import Completion, FunctionGenerator
from nanocomposer.engine.transformers_backend import DEFAULT_PREFIX_CACHE_POSITIONS, TransformersGenerator
from nanocomposer.policies import GENERATION_BACKENDS
from nanocomposer.policy import END_OF_TURN, ModelPolicy, SamplingConfig

TRUNCATED_EPISODES = ("mask", "penalty")


class RolloutError(RuntimeError):
    """A rollout that cannot become a training sample; the message names the task and the problem."""


def refuse_foreign(trajectory: Trajectory, where: str) -> None:
    """RolloutError, one line, when the trajectory's tokens are not this model's (an OpenAI-compatible endpoint
    played it: another tokenizer, no ids or logprobs of ours). SFT export may still use its text."""
    from nanocomposer.policies import is_remote

    found = foreign_token_source(trajectory.turns)
    if found is None and is_remote(trajectory.policy):
        found = (0, trajectory.policy)
    if found is not None:
        raise RolloutError(f"{where}: its tokens are not ours (turn {found[0]} came from {found[1]}); RL trains "
                           "only on its own model's token ids and logprobs (SFT export may use this trajectory)")


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


# --------------------------------------------------------------------------- policy


@dataclass
class _Sequence:
    """Where one episode's token sequence stands after its last turn (RolloutPolicy)."""

    text: str  # the rendering the last prompt was made from
    prompt_ids: list[int]
    completion_ids: list[int]
    turn_text: str  # what the harness stored as the assistant message of that turn


class RolloutPolicy(ModelPolicy):
    """ModelPolicy that extends each episode's token sequence turn by turn instead of re-tokenizing (module
    docstring), for every live episode of a runner at once (its stream, or `act_batch`): `prompt_ids` builds a
    turn's prompt from the episode's state, `turn_done` records what the turn sampled.

    Each prompt after an episode's first is: its previous prompt ids + the ids sampled for its previous turn +
    the tokens of the text the chat template adds after it (end of turn, tool responses, next assistant
    header). That text is the difference of two renderings, which the prefix-preserving template makes a
    suffix; a conversation that is not extended as a suffix (e.g. a compactor rewrote it) gets a RolloutError
    for that episode. The state is kept per `episode_key` (a request of turn 0 starts it afresh); `forget()`
    drops it once a rollout's episodes are over.

    The transformers backend keeps each episode's KV states between its turns (`PrefixCache`), so a turn
    prefills only the tokens the environment added. The weights are fixed within a rollout and change after
    it (the optimizer step), so `forget()` clears that cache too: no rollout reuses states of older weights.

    `cpu_threads` (ModelPolicy's): torch's CPU threads while generating (restored after; None: leave them).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sequences: dict[str, _Sequence] = {}
        self._rendered: dict[str, str] = {}  # episode key -> the rendering behind the prompt being generated

    def _generation(self, prompt_ids: list[int], completion_ids: list[int], logprobs: list[float]) -> Generation:
        """A turn that stopped on a stop id other than the template's end of turn (`<|endoftext|>`) leaves that
        id out of its completion: the template closes the turn with its own `<|im_end|>` (an environment
        token), so the next prompt is what eval's re-rendering gives, not `...<|endoftext|><|im_end|>`."""
        generation = super()._generation(prompt_ids, completion_ids, logprobs)
        end = self.tokenizer.convert_tokens_to_ids(END_OF_TURN) if END_OF_TURN in self.tokenizer.get_vocab() else None
        if not generation.truncated and end is not None and completion_ids[-1] != end:
            generation.completion_ids, generation.logprobs = list(completion_ids[:-1]), list(logprobs[:-1])
        return generation

    def forget(self) -> None:
        self._sequences.clear()
        self._rendered.clear()
        if isinstance(self.generator, TransformersGenerator):
            self.generator.clear_prefix_cache()

    def render_text(self, messages: list[dict], tools: list[dict]) -> str:
        from nanocomposer.policy import MESSAGE_KEYS

        clean = [{k: m[k] for k in MESSAGE_KEYS if k in m} for m in messages]
        return self.tokenizer.apply_chat_template(clean, tools=tools or None, add_generation_prompt=True,
                                                  tokenize=False)

    def turn_done(self, request: TurnRequest, result: Generation | BaseException) -> None:
        key = request.episode_key
        text = self._rendered.pop(key, None)
        if isinstance(result, Generation) and text is not None:
            self._sequences[key] = _Sequence(text, result.prompt_ids, result.completion_ids, result.text)
        else:  # the episode ends with this error: its sequence is finished
            self._sequences.pop(key, None)

    def prompt_ids(self, request: TurnRequest) -> list[int]:
        """The episode's previous prompt and sampled ids, extended by the tokens of what the environment added
        (class docstring); the first turn is tokenized whole."""
        key = request.episode_key
        text = self.render_text(request.messages, request.tools)
        last = self._sequences.pop(key, None) if request.turn > 0 else None
        if request.turn == 0:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        elif last is None:
            raise RolloutError(f"episode {key}: turn {request.turn} without the tokens of the turn before it")
        else:
            if not text.startswith(last.text + last.turn_text):
                raise RolloutError(f"episode {key}: turn {request.turn} does not extend the previous prompt as a "
                                   "suffix (was the conversation rewritten, e.g. by a compactor?)")
            env_text = text[len(last.text) + len(last.turn_text):]
            stop_text = self.tokenizer.decode(last.completion_ids[-1:], skip_special_tokens=False)
            if last.completion_ids and last.completion_ids[-1] in self.stop_ids and env_text.startswith(stop_text):
                env_text = env_text[len(stop_text):]  # the model wrote the end-of-turn token itself
            ids = last.prompt_ids + last.completion_ids + self.tokenizer.encode(env_text, add_special_tokens=False)
        self._rendered[key] = text
        return self.fits_context(ids)


class VLLMRolloutPolicy(RolloutPolicy):
    """RolloutPolicy generating with the trainer's vLLM engine (TRL's colocate or server mode): every request of
    an `act_batch` in one `vllm_generation.generate` call.

    Sampling settings are the trainer's (temperature, top_p, and max_completion_length, which train_rl sets to
    the per-turn max_new_tokens; TRL's engine takes no per-request seeds); logprobs are vLLM's processed
    logprobs of the sampled tokens.
    """

    def __init__(self, model, tokenizer, sampling: SamplingConfig, trainer):
        super().__init__(model, tokenizer, sampling)
        self.trainer = trainer
        self.generator = FunctionGenerator(self._generate_on_trainer)

    def _generate_on_trainer(self, prompts: list[list[int]], seeds: list[int]) -> list[Completion]:
        _, completions, logprobs, _ = self.trainer.vllm_generation.generate(prompts, None, 1)
        return [Completion(list(ids), [float(lp[0]) if lp and lp[0] is not None else float("nan") for lp in lps])
                for ids, lps in zip(completions, logprobs, strict=True)]


def noncanonical_turns(trajectory: Trajectory, tokenizer) -> int:
    """Turns whose sampled ids are not the tokenizer's own tokenization of the text they decode to (the stop
    token aside): where re-tokenizing would have changed the context under the model (module docstring)."""
    count = 0
    for turn in trajectory.turns:
        ids = turn["completion_ids"] or []
        stopped = not turn["truncated"] and ids and ids[-1] in tokenizer.all_special_ids  # (RolloutPolicy drops a
        body = ids[:-1] if stopped else ids  # stop id other than the end of turn: those turns end in text)
        count += tokenizer.encode(turn["text"], add_special_tokens=False) != body
    return count


# --------------------------------------------------------------------------- samples


def episode_sample(trajectory: Trajectory, eos_id: int, mask_episode: bool = False) -> dict:
    """One training sample from an episode: prompt_ids, completion_ids, env_mask, logprobs (module docstring).

    Every turn's prompt must extend the sequence built so far (RolloutPolicy guarantees it; so does any policy
    whose sampled ids are canonical). An episode without a single turn (e.g. the first prompt overflowed the
    context) becomes one masked EOS token: TRL needs a non-empty completion, and nothing is trained.
    """
    refuse_foreign(trajectory, f"task {trajectory.task_id}")
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
