"""What every backend shares: how a turn is sampled (`SamplingConfig`), what a sequence comes back as
(`Completion`, or the exception it met), and how a batch call that raises is narrowed to the request that
caused it (`run_isolated`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from env.budget import Budget, check_sampling


@dataclass
class SamplingConfig:
    """How one turn is sampled: env.budget.Budget's sampling fields (`Budget.sampling()`), with its defaults and
    its checks (env.budget.check_sampling), so a value one stage refuses every stage refuses."""

    max_new_tokens: int = Budget.max_new_tokens
    temperature: float = Budget.temperature  # 0 = greedy
    top_p: float = Budget.top_p
    seed: int = Budget.seed
    max_context: int | None = Budget.max_context  # None: the model's max_position_embeddings

    def __post_init__(self):
        check_sampling(self, "SamplingConfig")


class Completion(NamedTuple):
    ids: list[int]  # the stop token included when one ended the sequence
    logprobs: list[float]  # processed log-prob of each id


Result = Completion | Exception


def run_isolated(run: Callable[[list[int]], list[Result]], indices: list[int]) -> list[Result]:
    """`run(indices)`; if it raises, each index alone, so an exception is the result of the request behind it."""
    try:
        return run(indices)
    except Exception as e:  # noqa: BLE001  (returned to the request(s) that caused it)
        if len(indices) == 1:
            return [e]
    results = []
    for i in indices:
        try:
            results.extend(run([i]))
        except Exception as e:  # noqa: BLE001
            results.append(e)
    return results


def processed_scores(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The scores tokens are drawn from: logits / temperature, then top-p filtering (transformers' warpers,
    same order and tie handling); greedy uses the raw logits."""
    if sampling.temperature == 0:
        return logits
    scores = logits / sampling.temperature
    if sampling.top_p < 1.0:
        sorted_scores, sorted_ids = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - sampling.top_p)
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, sorted_ids, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def sample_tokens(logits: torch.Tensor, generators: Sequence[torch.Generator],
                  sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(one token per row, its processed log-prob): greedy, or drawn with the row's own generator, so a row
    samples the same tokens whatever else shares its batch."""
    scores = processed_scores(logits.float(), sampling)
    if sampling.temperature == 0:
        tokens = scores.argmax(dim=-1)
    else:
        probs = scores.softmax(dim=-1)
        tokens = torch.cat([torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(generators)])
    return tokens, torch.log_softmax(scores, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


class FunctionGenerator:
    """A generator whose batches another component decodes: `generate_batch(prompts, seeds)` returns one
    Completion (or exception) per prompt (RL's rollouts on TRL's vLLM engine; scripted models in tests). It
    has no running batch to join, so it serves rounds (`can_stream()` is False)."""

    def __init__(self, generate_batch: Callable[[list[list[int]], list[int]], list[Result]]):
        self.generate_batch = generate_batch

    def can_stream(self) -> bool:
        return False

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int],
                 sampling: SamplingConfig) -> list[Result]:
        if len(prompts) != len(seeds):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
        return list(self.generate_batch([list(p) for p in prompts], list(seeds))) if prompts else []
