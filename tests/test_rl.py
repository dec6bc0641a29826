"""RL in the harness (nanocomposer/rollout.py, train_rl.py) with a micro model (vocab ~512, hidden 64, 2 layers).

The identity test replays the gold trajectory of a task through the RL policy and through eval's ModelPolicy:
both show the model the same tokens every turn, and the RL sample is the tokenization of the final
conversation. The last test runs real GRPOTrainer steps through train_rl.main (episodes batched in-process).
"""

import json
import math
import os
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from env.episode import EpisodeConfig, Trajectory, run_episode
from env.policies import GoldPolicy
from env.tasks import TaskError
from nanocomposer.engine.sampling import Completion, FunctionGenerator
from nanocomposer.model import build_model, build_tokenizer
from nanocomposer.policy import MESSAGE_KEYS, ModelPolicy, SamplingConfig
from nanocomposer.rollout import (
    AgentRollout,
    EpisodeResult,
    RolloutConfig,
    advantage_shares,
    make_rollout_policy,
    play_episodes,
    prompt_key,
    resolve_training_tasks,
    task_prompt_dataset,
)
from nanocomposer.rollout_tokens import RolloutError, RolloutPolicy, episode_sample
from tests.conftest import ROOT, harness_leftovers, make_calc_task

STDLIB_FILES = ("json/encoder.py", "json/decoder.py", "textwrap.py", "shlex.py")


pytestmark = [pytest.mark.usefixtures("one_torch_thread"),  # a 140 k-parameter model gains nothing from threads
              pytest.mark.slow]


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tokenizer = build_tokenizer([(stdlib / f).read_text(encoding="utf-8") for f in STDLIB_FILES], 512)
    tokenizer.model_max_length = 4096
    model = build_model(tokenizer, hidden=64, layers=2, heads=2, context=4096, seed=0)
    path = tmp_path_factory.mktemp("micro")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model, tokenizer


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    calc = make_calc_task(root, "calc-add")
    other = make_calc_task(root, "calc-add-2")
    other_spec = json.loads((other.root / "task.json").read_text())
    other_spec["instruction"] = "add(2, 3) is wrong: fix calc/ops.py."
    (other.root / "task.json").write_text(json.dumps(other_spec))
    return root, calc


def scripted(cls, texts):
    """`cls` (a ModelPolicy) whose model 'samples' the canonical tokens of `texts`, one per turn."""

    class Scripted(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.generator = FunctionGenerator(lambda prompts, seeds: [self.script() for _ in prompts])

        def script(self) -> Completion:
            ids = self.tokenizer.encode(texts[self.turn - 1], add_special_tokens=False) + [self.tokenizer.eos_token_id]
            return Completion(ids, [-0.5] * len(ids))

    return Scripted


def render_ids(tokenizer, trajectory: Trajectory) -> list[int]:
    """Token ids of the final conversation up to its last assistant turn, rendered by the chat template."""
    last = max(i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant")
    messages = [{k: m[k] for k in MESSAGE_KEYS if k in m} for m in trajectory.messages[: last + 1]]
    text = tokenizer.apply_chat_template(messages, tools=trajectory.tools, tokenize=False)
    return tokenizer.encode(text.removesuffix("\n"), add_special_tokens=False)  # the template's "\n" after <|im_end|>


@pytest.fixture(scope="module")
def replayed(micro, tasks):
    """The gold turns of the calc task replayed through the RL policy (the model 'samples' their tokens)."""
    _, model, tokenizer = micro
    texts = [t["text"] for t in run_episode(tasks[1], GoldPolicy(), EpisodeConfig()).turns]
    policy = scripted(RolloutPolicy, texts)(model, tokenizer, SamplingConfig(max_new_tokens=512))
    return run_episode(tasks[1], policy, EpisodeConfig()), texts


# --------------------------------------------------------------------------- one loop, one token sequence


def test_rl_and_eval_paths_show_the_model_identical_tokens(micro, tasks, replayed):
    _, model, tokenizer = micro
    rl, texts = replayed
    assert len(texts) >= 3 and rl.exit_status == "submitted" and rl.solved
    # Eval's policy renders each turn's conversation from scratch; the RL policy extends its token sequence.
    # (Tool output such as pytest timings differs from run to run, so both read the same conversation.)
    eval_policy = ModelPolicy(model, tokenizer, SamplingConfig(max_new_tokens=512))
    assistant_at = [i for i, m in enumerate(rl.messages) if m["role"] == "assistant"]
    for turn, at in zip(rl.turns, assistant_at, strict=True):
        assert turn["prompt_ids"] == eval_policy.render(rl.messages[:at], rl.tools)
    sample = episode_sample(rl, tokenizer.eos_token_id)
    assert sample["prompt_ids"] + sample["completion_ids"] == render_ids(tokenizer, rl)
    assert sample["prompt_ids"] == rl.turns[0]["prompt_ids"]
    # And a whole eval episode of the same turns (its own tool outputs) gives the same first prompt and turns.
    ev = run_episode(tasks[1], scripted(ModelPolicy, texts)(model, tokenizer, SamplingConfig(max_new_tokens=512)),
                     EpisodeConfig())
    assert ev.turns[0]["prompt_ids"] == rl.turns[0]["prompt_ids"]
    assert [t["completion_ids"] for t in ev.turns] == [t["completion_ids"] for t in rl.turns]


def test_mask_covers_exactly_the_models_own_tokens(micro, replayed):
    _, _, tokenizer = micro
    rl, _ = replayed
    sample = episode_sample(rl, tokenizer.eos_token_id)
    completion, mask = sample["completion_ids"], sample["env_mask"]
    assert len(mask) == len(completion) == len(sample["logprobs"])
    trained = [t for t, m in zip(completion, mask) if m]
    assert trained == [i for turn in rl.turns for i in turn["completion_ids"]]  # every model token, in order
    assert [lp for lp, m in zip(sample["logprobs"], mask) if m] == [-0.5] * len(trained)
    response = tokenizer.convert_tokens_to_ids("<tool_response>")
    assert response not in trained and response in [t for t, m in zip(completion, mask) if not m]
    # Each run of trained tokens is one assistant turn ending with its stop token.
    runs, current = [], []
    for token, m in zip(completion, mask):
        if m:
            current.append(token)
        elif current:
            runs, current = [*runs, current], []
    runs += [current] if current else []
    assert [tokenizer.decode(r, skip_special_tokens=False) for r in runs] == \
        [t["text"] + "<|im_end|>" for t in rl.turns]


def test_prefix_preserving_template_holds_across_turns(replayed):
    rl, _ = replayed
    final = rl.turns[-1]["prompt_ids"] + rl.turns[-1]["completion_ids"]
    for turn in rl.turns:
        assert final[: len(turn["prompt_ids"])] == turn["prompt_ids"]
        end = len(turn["prompt_ids"]) + len(turn["completion_ids"])
        assert final[len(turn["prompt_ids"]): end] == turn["completion_ids"]


def test_a_turn_that_breaks_the_prefix_is_an_error_not_a_silent_sample(micro, replayed):
    _, _, tokenizer = micro
    rl, _ = replayed
    broken = Trajectory(**{**rl.__dict__, "turns": [dict(t) for t in rl.turns]})
    broken.turns[1]["prompt_ids"] = broken.turns[1]["prompt_ids"][:5] + [7] + broken.turns[1]["prompt_ids"][6:]
    with pytest.raises(RolloutError, match="does not extend"):
        episode_sample(broken, tokenizer.eos_token_id)


# --------------------------------------------------------------------------- sampled episodes, truncation


def sampled_rollout(micro, tasks, **config):
    _, model, tokenizer = micro
    root, calc = tasks
    _, index = task_prompt_dataset(root)
    rollout = AgentRollout(index, tokenizer, RolloutConfig(
        episode=EpisodeConfig(max_turns=2), sampling=SamplingConfig(max_new_tokens=12, temperature=1.0),
        log_trajectories_steps=0, **config), None)
    results, gen_s = rollout.play(model, [str(calc.root)] * 2, seed=0)
    assert gen_s > 0
    prompts = [results[0].trajectory.messages[:2]] * 2
    return rollout.build(prompts, results), results


def test_truncated_episodes_are_marked_and_masked_or_penalised_by_config(micro, tasks):
    masked, results = sampled_rollout(micro, tasks, truncated_episodes="mask")
    for facts, mask, ids, logprobs in zip(masked["episode"], masked["env_mask"], masked["completion_ids"],
                                          masked["logprobs"]):
        assert facts["truncated"]  # a random model never stops within 12 tokens
        assert len(mask) == len(ids) == len(logprobs) and not any(mask)
        assert all(math.isfinite(lp) and lp <= 0 for lp in logprobs)
    kept, _ = sampled_rollout(micro, tasks, truncated_episodes="penalty")
    for facts, mask, result in zip(kept["episode"], kept["env_mask"], results):
        assert facts["truncated"] and sum(mask) == result.trajectory.completion_tokens


def test_same_seeds_give_the_same_episode(micro, tasks):
    first, _ = sampled_rollout(micro, tasks)
    second, _ = sampled_rollout(micro, tasks)
    assert first["completion_ids"] == second["completion_ids"]
    assert first["completion_ids"][0] != first["completion_ids"][1]  # the group's episodes differ


def test_malformed_drop_switch_masks_the_episode(micro, replayed):
    _, _, tokenizer = micro
    rl, _ = replayed
    bad = Trajectory(**{**rl.__dict__, "turns": [dict(t) for t in rl.turns]})
    bad.turns[0]["calls"] = [{"name": None, "arguments": None, "malformed": True, "error": "bad", "raw": "x"}]
    prompts = [rl.messages[:2]] * 2
    results = [EpisodeResult(t, t.to_record(token_ids=True), None, 0) for t in (rl, bad)]
    config = RolloutConfig(malformed_handling="drop")
    out = AgentRollout({}, tokenizer, config, None).build(prompts, results)
    assert [e["dropped"] for e in out["episode"]] == [False, True]
    assert any(out["env_mask"][0]) and not any(out["env_mask"][1])


def test_prompts_index_their_tasks_and_duplicates_fail(tasks, tmp_path):
    root, _ = tasks
    dataset, index = task_prompt_dataset(root)
    assert len(dataset) == 2 and set(dataset.column_names) == {"prompt", "task_dir", "task_id"}
    assert {index[prompt_key(row["prompt"])] for row in dataset} == set(dataset["task_dir"])
    make_calc_task(tmp_path, "a")
    make_calc_task(tmp_path, "b")
    with pytest.raises(RolloutError, match="identical prompts"):
        task_prompt_dataset(tmp_path)


def test_training_tasks_from_task_set_names_and_mixes(tmp_path, monkeypatch):
    root = tmp_path / "factory"
    for task_id, family in (("calc-a", "fix_bug"), ("calc-b", "locate"), ("calc-c", "fix_bug")):
        task = make_calc_task(root / "train", task_id)
        meta = json.loads((task.root / "task.json").read_text())
        (task.root / "task.json").write_text(json.dumps({**meta, "instruction": f"{task_id}: fix add",
                                                         "family": family}))
    (root / "manifest.json").write_text("{}")
    monkeypatch.setenv("NANOCOMPOSER_TASKS", str(root))
    tasks, source = resolve_training_tasks("factory:train/locate, factory:train")  # a mix; calc-b once
    assert [t.id for t in tasks] == ["calc-b", "calc-a", "calc-c"] and source == root
    assert [t.id for t in resolve_training_tasks("factory:train/fix_bug", limit=1)[0]] == ["calc-a"]
    dataset, _ = task_prompt_dataset("factory:train/locate")
    assert dataset["task_id"] == ["calc-b"]
    with pytest.raises(TaskError, match="nosuch"):
        resolve_training_tasks("factory:train/nosuch")
    with pytest.raises(TaskError, match="unknown task set"):
        resolve_training_tasks(str(tmp_path / "missing"))


def test_advantage_shares_name_the_component_that_separates_completions():
    rewards = torch.tensor([[1.0, -0.1], [0.0, -0.1], [1.0, -0.2], [1.0, -0.2]])  # 2 groups of 2
    shares = advantage_shares(rewards, torch.tensor([1.0, 1.0]), 2, ["outcome", "turns"])
    assert shares["advantage_share/outcome"] == pytest.approx(1.0)
    assert shares["zero_std_groups/outcome"] == 0.5 and shares["zero_std_groups/turns"] == 1.0


def test_only_a_shaping_term_that_outweighs_the_threshold_is_named():
    from train_rl import dominant_shaping_term

    names = ["outcome", "turns", "parallel"]

    def share(*values):
        return {f"advantage_share/{n}": v for n, v in zip(names, values, strict=True)}

    assert dominant_shaping_term(share(0.95, 0.03, 0.02), names, 0.8) is None  # the task reward leading is the goal
    assert dominant_shaping_term(share(0.05, 0.85, 0.10), names, 0.8) == "turns"
    assert dominant_shaping_term(share(0.10, 0.45, 0.45), names, 0.4) == "turns"  # the largest of those above
    assert dominant_shaping_term(share(0.0, 0.0, 0.0), names, 0.8) is None  # no signal at all (zero-std batch)


# --------------------------------------------------------------------------- workers, GRPO steps


def test_batched_rollout_equals_one_episode_at_a_time_and_uses_the_live_weights(micro, tasks):
    _, model, tokenizer = micro
    root, calc = tasks
    other = str(root / "calc-add-2")
    task_dirs = [str(calc.root), str(calc.root), other, other]
    config = RolloutConfig(episode=EpisodeConfig(max_turns=2), sampling=SamplingConfig(max_new_tokens=8,
                                                                                       temperature=1.0))
    live = {k: v.clone() for k, v in model.state_dict().items()}
    policy = make_rollout_policy(model, tokenizer, config)
    assert policy.open_stream() is not None  # the transformers backend streams rollouts
    try:
        rounds = []
        for _ in range(2):  # the second round runs after the weights changed
            batched = play_episodes(policy, task_dirs, config, seed=5)  # all four episodes at once, streamed
            alone = play_episodes(policy, task_dirs, replace(config, workers=1), seed=5)
            policy.open_stream = lambda: None  # the same episodes through act_batch rounds
            try:
                rounds_of_act_batch = play_episodes(policy, task_dirs, config, seed=5)
            finally:
                del policy.open_stream
            ids = [[t["completion_ids"] for t in r.trajectory.turns] for r in batched]
            assert ids == [[t["completion_ids"] for t in r.trajectory.turns] for r in alone]
            assert ids == [[t["completion_ids"] for t in r.trajectory.turns] for r in rounds_of_act_batch]
            assert [r.trajectory.task_id for r in batched] == ["calc-add", "calc-add", "calc-add-2", "calc-add-2"]
            assert ids[0] != ids[1]  # the group's episodes differ
            for r in batched:  # each episode is one token sequence (the turns extend each other)
                episode_sample(r.trajectory, tokenizer.eos_token_id)
            assert not policy._sequences  # no per-episode state outlives a rollout
            rounds.append(ids)
            with torch.no_grad():
                model.lm_head.weight.mul_(3.0)  # sharper distribution: different samples
        assert rounds[0] != rounds[1]  # the rollout generated with the changed weights: no stale copy
    finally:
        model.load_state_dict(live)


def test_rollout_reuses_each_episodes_prefix_within_a_rollout_and_never_across_weight_updates(micro, tasks):
    _, model, tokenizer = micro
    root, calc = tasks
    task_dirs = [str(calc.root), str(calc.root), str(root / "calc-add-2")]
    config = RolloutConfig(episode=EpisodeConfig(max_turns=3), sampling=SamplingConfig(max_new_tokens=8,
                                                                                       temperature=1.0))
    live = {k: v.clone() for k, v in model.state_dict().items()}
    cached = make_rollout_policy(model, tokenizer, config)
    uncached = RolloutPolicy(model, tokenizer, config.sampling, name="uncached", prefix_cache_positions=0)
    cache = cached.generator.prefix_cache
    try:
        for _ in range(2):  # the second round runs after the weights changed: reused states would be stale
            reused_before = cache.stats["reused_positions"]
            with_cache = play_episodes(cached, task_dirs, config, seed=7)
            assert cache.stats["reused_positions"] > reused_before  # later turns prefilled only the new tokens
            assert len(cache) == 0  # cleared when the rollout ended: the next one may run with new weights
            without = play_episodes(uncached, task_dirs, config, seed=7)
            assert ([[t["completion_ids"] for t in r.trajectory.turns] for r in with_cache]
                    == [[t["completion_ids"] for t in r.trajectory.turns] for r in without])
            with torch.no_grad():
                for layer in model.model.layers:  # new keys and values: every cached state is stale
                    layer.self_attn.k_proj.weight.mul_(-3.0)
                    layer.self_attn.v_proj.weight.mul_(-3.0)
    finally:
        model.load_state_dict(live)


def test_grpo_steps_through_train_rl(micro, tasks, tmp_path):
    import train_rl

    path, _, _ = micro
    root, _ = tasks
    args = ["--model_name_or_path", str(path), "--tasks_dir", str(root), "--run", "t", "--runs_dir", str(tmp_path),
            "--max_turns", "2", "--max_new_tokens", "12", "--num_generations", "2",
            "--per_device_train_batch_size", "2", "--max_steps", "2", "--learning_rate", "0.01",
            "--reward_funcs", "outcome", "malformed", "turns", "latency", "truncated",
            "--reward_weights", "1.0", "0.2", "0.05", "0.5", "0.1", "--truncated_episodes", "penalty",
            "--rollout_workers", "2", "--log_trajectories_steps", "1", "--logging_steps", "1",
            "--use_cpu", "true", "--bf16", "false", "--activation_checkpointing", "false", "--report_to", "none",
            "--save_strategy", "no"]
    metrics = train_rl.main(*train_rl.make_parser().parse_args_and_config(args))
    out = tmp_path / "t" / "rl"
    assert metrics["global_step"] == 2
    for key in ("rewards/outcome/mean", "rewards/latency/std", "behaviour/malformed_call_rate", "exit/no_tool_call",
                "timing/env_s", "timing/env_share", "advantage_share/latency", "rollout/truncated_rate"):
        assert key in metrics, key
    assert sorted(p.name for p in (out / "trajectories").iterdir()) == ["step-000000.jsonl", "step-000001.jsonl"]
    assert (out / "README.md").is_file() and (out / "config.yaml").is_file()
    before, after = load_file(path / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before), "two GRPO steps changed no weight"


def test_a_killed_rl_run_leaves_nothing_the_next_run_does_not_sweep(micro, tasks, tmp_path):
    # SIGKILL in the middle of a rollout (a crash, an OOM kill): sandboxed commands die with the trainer
    # (bwrap --die-with-parent); its workspaces and cgroups carry its pid, and the next harness process
    # to start removes them (env.sandbox_cgroups.sweep_stale, env.workspace.sweep_stale_workspaces).
    from env.sandbox_cgroups import pids_cgroup_parent

    path, _, _ = micro
    root, _ = tasks
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    args = ["--model_name_or_path", str(path), "--tasks_dir", str(root), "--run", "k", "--runs_dir", str(tmp_path),
            "--max_turns", "2", "--max_new_tokens", "12", "--num_generations", "2",
            "--per_device_train_batch_size", "2", "--max_steps", "500", "--learning_rate", "0.01",
            "--use_cpu", "true", "--bf16", "false", "--activation_checkpointing", "false", "--report_to", "none",
            "--save_strategy", "no"]
    proc = subprocess.Popen([sys.executable, "train_rl.py", *args], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not any(p.name.startswith("ws-") for p in tmp.rglob("ws-*")):  # an episode is live
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(1.0)  # the kernel tears the sandboxes' pid namespaces down
    assert not [p for p in harness_leftovers(tmp) if p.isdigit()], "a sandboxed process outlived the trainer"
    cgroups = pids_cgroup_parent()
    sweep = "import env.sandbox_cgroups, env.workspace; env.sandbox_cgroups.sweep_stale(); env.workspace.sweep_stale_workspaces()"
    subprocess.run([sys.executable, "-c", sweep], cwd=ROOT, env=env, check=True, timeout=60)
    assert harness_leftovers(tmp) == []
    if cgroups is not None:
        assert not list(cgroups.glob(f"sandbox-{proc.pid}-*")), "the killed run's cgroups were not swept"


def test_drop_silences_only_trls_all_rewards_none_warning(caplog):
    """Under malformed_handling=drop, TRL's per-batch prompt dump for the dropped rows is filtered out; other
    warnings of the same logger still reach the handlers."""
    import logging

    from trl.trainer import grpo_trainer

    from nanocomposer.config import TRL_ALL_NONE_WARNING, recipe_reward_funcs

    name = grpo_trainer.logger.logger.name  # TRL's own logger, so a rename in TRL fails here
    recipe_reward_funcs(["outcome", "malformed"], None, malformed_handling="drop", ask_user_handling="penalize")
    recipe_reward_funcs(["outcome"], None, malformed_handling="drop", ask_user_handling="penalize")
    assert len(logging.getLogger(name).filters) == 1
    with caplog.at_level(logging.WARNING, logger=name):
        logging.getLogger(name).warning(f"{TRL_ALL_NONE_WARNING} for the following kwargs:\n{{'prompt': 'x'}}")
        logging.getLogger(name).warning("num_generations does not divide the batch")
    assert [r.getMessage() for r in caplog.records] == ["num_generations does not divide the batch"]
