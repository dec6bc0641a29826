"""The update: TRL's GRPOTrainer on the logged sessions, one pass, nothing generated.

    samples = session_samples(record, eos_id)         # the tokens the server sampled, from the database
    groups, unused = make_groups(items, G, "family")
    metrics = train_candidate(...)                     # GRPO steps; the candidate saved, then renamed in place

Data. Each session's turns carry the exact prompt ids, sampled completion ids and sampling logprobs the
server logged. The server's policy renders every turn afresh (it is not RL's token-in/token-out policy), so a
turn whose prompt does not extend the previous turn's tokens (the model sampled a non-canonical split of
some text) starts a new sample: a session becomes one or more segments, each one TRL sample (prompt ids,
completion ids with the environment's tokens masked out by `env_mask`, sampling logprobs), each carrying
the session's reward. Nothing is re-tokenized, so the trainer scores exactly the tokens that were sampled.

Baseline. Live traffic has one sample per prompt: no two sessions share a task and a seed, so GRPO's group
of G answers to one prompt does not exist. A group here is G sessions compared with each other: of one task
family (`baseline: family`, default: families differ in difficulty and so in reward scale, and a family's
mean is a baseline that does not credit a session for having drawn an easy task), or a whole step's batch
(`baseline: batch`, num_generations = the step's batch size). TRL's group mean is then that baseline, and its
advantage normalisation, clipping and loss are used unchanged. Sessions left over (fewer than G in the last
mixed group, or groups that do not fill a step) are not trained on and are counted (`unused_samples`).

Machinery. `rollout_func` returns the logged samples instead of generating (the dataset's rows name the
groups); reward functions get the sessions' facts as the `episode` extra, exactly like train_rl.py.
`LiveGRPOTrainer` checks on-policy-ness where TRL scores the batch at the start of each step: the trainer's
log-probabilities of the model tokens of on-policy sessions against the sampling logprobs from the database
(max and mean absolute difference, logged). At the cycle's first step the weights are the serving version's,
so the two must agree to numerical precision: that is the proof that the data is on-policy. A cycle of
several steps trains its later batches after its own earlier steps (a lag of at most one cycle, as in
Composer's loop), so the sampling logprobs are always the PPO ratio's denominator (old_per_token_logps):
the drift is importance-weighted and clipped rather than ignored (TRL's default would take the current
weights as the old policy). The same holds for stale sessions of an older version kept by
`stale_sessions: importance_weight`.

Each cycle builds a fresh trainer from the current version's weights, so the optimizer's moments restart
every cycle (a cycle is one short pass; carrying Adam state across versions would tie a version to a run).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from trl import GRPOTrainer

from env.episode import Trajectory
from nanocomposer.rollout_tokens import RolloutError, episode_sample, refuse_foreign

GROUP_PREFIX = "realtime group "


def session_samples(record: dict, eos_id: int, mask_episode: bool = False) -> list[dict]:
    """The TRL samples of one session: one per run of turns whose prompts extend each other (docstring)."""
    traj = Trajectory.from_record(record)
    refuse_foreign(traj, f"session {record.get('session_id')}")
    segments: list[list[dict]] = []
    sequence: list[int] = []
    for turn in traj.turns:
        if turn["prompt_ids"] is None or turn["completion_ids"] is None or turn["logprobs"] is None:
            raise RolloutError(f"session {record.get('session_id')}: turn {turn['turn']} has no token ids "
                               f"(policy {traj.policy!r} is not a model policy): nothing to train on")
        if not segments or turn["prompt_ids"][:len(sequence)] != sequence:
            segments.append([])
        segments[-1].append(turn)
        sequence = list(turn["prompt_ids"]) + list(turn["completion_ids"])
    return [episode_sample(dataclasses.replace(traj, turns=turns), eos_id, mask_episode) for turns in segments]


def make_groups(items: list[dict], size: int, baseline: str, seed: int) -> tuple[list[list[dict]], list[dict]]:
    """(groups of `size` items, the items left out). `family`: groups within a family first, then the
    families' leftovers together; `batch`: groups in a seeded random order."""
    rng = random.Random(seed)
    if baseline == "batch":
        order = list(items)
        rng.shuffle(order)
        cut = len(order) - len(order) % size
        return [order[i:i + size] for i in range(0, cut, size)], order[cut:]
    by_family: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_family[item["family"]].append(item)
    groups, rest = [], []
    for family in sorted(by_family):
        members = by_family[family]
        rng.shuffle(members)
        cut = len(members) - len(members) % size
        groups += [members[i:i + size] for i in range(0, cut, size)]
        rest += members[cut:]
    cut = len(rest) - len(rest) % size
    groups += [rest[i:i + size] for i in range(0, cut, size)]
    return groups, rest[cut:]


class LiveRollout:
    """TRL `rollout_func` returning the logged samples of the groups its prompts name (docstring)."""

    def __init__(self, groups: list[list[dict]]):
        self.groups = groups

    def __call__(self, prompts: list[list[dict]], trainer) -> dict:
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "episode": []}
        seen: Counter = Counter()
        for prompt in prompts:
            content = prompt[-1]["content"]
            if not content.startswith(GROUP_PREFIX):
                raise RolloutError(f"rollout_func got a prompt that names no group of this cycle: {content[:80]!r}")
            group = int(content[len(GROUP_PREFIX):])
            item = self.groups[group][seen[group]]  # GRPO repeats each prompt G times: the k-th is member k
            seen[group] += 1
            for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask"):
                out[key].append(item["sample"][key])
            out["episode"].append(item["facts"])
        return out


class LiveGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that checks on-policy-ness at every step and importance-weights by the sampling logprobs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logprob_checks: list[dict] = []

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        sampling = output.get("sampling_per_token_logps")
        if sampling is None:
            raise RolloutError("the logged samples carry no sampling logprobs: the on-policy check cannot run")
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        with torch.no_grad():
            # in micro-batches, as TRL scores them: the whole step at once would hold every session's activations
            scored, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attention, output["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size)
        mask = output["completion_mask"] * output.get("tool_mask", torch.ones_like(output["completion_mask"]))
        fresh = torch.tensor([not x["episode"].get("stale", False) for x in inputs], device=mask.device)
        diff = (scored - sampling).abs()[mask.bool() & fresh.unsqueeze(1)]
        check = {"step": self.state.global_step, "tokens": int(diff.numel()),
                 "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
                 "mean_abs_diff": float(diff.mean()) if diff.numel() else 0.0}
        self.logprob_checks.append(check)
        self._metrics["train"]["realtime/logprob_diff_max"].append(check["max_abs_diff"])
        self._metrics["train"]["realtime/logprob_diff_mean"].append(check["mean_abs_diff"])
        output["old_per_token_logps"] = torch.where(torch.isnan(sampling), scored, sampling)
        return output


def train_candidate(items: list[dict], *, model_path: str, out_dir: Path, training_args, model_args,
                    reward_funcs: list, baseline: str, meta: dict) -> dict:
    """GRPO over `items` ({"sample", "facts", "family"}) from `model_path`; the model saved as `out_dir`.

    The model is written to a temporary directory beside `out_dir` and renamed to it only once complete, so
    a killed update leaves no half version in the registry. Returns the update's metrics.
    """
    from datasets import Dataset

    from nanocomposer.model_io import load_model, load_tokenizer, peft_config, save_final_model

    size = training_args.num_generations
    per_step = training_args.generation_batch_size
    groups, left = make_groups(items, size, baseline, training_args.seed)
    steps = len(groups) * size // per_step
    used = groups[:steps * per_step // size]
    unused = len(left) + (len(groups) - len(used)) * size
    metrics = {"samples": len(items), "groups": len(used), "unused_samples": unused, "steps": steps,
               "families": dict(Counter(i["family"] for g in used for i in g))}
    if steps == 0:
        return {**metrics, "trained": False,
                "reason": f"{len(items)} samples make {len(groups)} groups of {size}, fewer than one step "
                          f"({per_step} samples)"}
    args = copy.deepcopy(training_args)
    work = out_dir.parent / f".work-{out_dir.name}"
    shutil.rmtree(work, ignore_errors=True)
    args.output_dir, args.max_steps, args.save_strategy, args.report_to = str(work), steps, "no", []
    model_args = copy.deepcopy(model_args)
    model_args.model_name_or_path = model_path
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_args, args)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{GROUP_PREFIX}{i}"}]}
                                 for i in range(len(used))])
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    trainer = LiveGRPOTrainer(model=model, reward_funcs=reward_funcs, args=args, train_dataset=dataset,
                              processing_class=tokenizer, peft_config=peft_config(model_args),
                              rollout_func=LiveRollout(used))
    started = time.perf_counter()
    result = trainer.train()
    metrics.update(trained=True, train_seconds=time.perf_counter() - started, train_loss=result.training_loss,
                   global_step=trainer.state.global_step, logprob_checks=trainer.logprob_checks,
                   onpolicy_diff_max=trainer.logprob_checks[0]["max_abs_diff"],
                   onpolicy_diff_mean=trainer.logprob_checks[0]["mean_abs_diff"],
                   drift_diff_max=max([c["max_abs_diff"] for c in trainer.logprob_checks[1:]], default=0.0),
                   log_history=trainer.state.log_history)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out_dir.name}-", dir=out_dir.parent))
    save_final_model(trainer.model, tokenizer, tmp, source=model_args.model_name_or_path,
                     revision=model_args.model_revision)
    (tmp / "version.json").write_text(json.dumps({**meta, "steps": steps, "samples": len(items)}, indent=1) + "\n")
    os.replace(tmp, out_dir)  # complete: the registry sees it now
    shutil.rmtree(work, ignore_errors=True)
    return metrics
