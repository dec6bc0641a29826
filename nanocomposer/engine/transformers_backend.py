"""The transformers backend: one decode loop, a continuous batch (`DecodeStream`), behind `add` / `step`.

    generator = TransformersGenerator(model, stop_ids)
    stream = generator.stream(sampling)
    stream.add(key, prompt_ids, seed)              # any time, also while others decode
    for key, result in stream.step(): ...          # Completion or the exception, as sequences finish
    results = generator.generate(prompts, seeds, sampling)   # a static batch: add all, step until empty

Why a hand-written loop rather than `model.generate`:
- `generate` draws a whole batch from one RNG, so a row's sample would depend on its batch-mates; here each
  row has its own `torch.Generator` seeded with the request's seed.
- Only `SamplingConfig` decides the decoding (temperature, top-p; nothing else): no generation_config knob
  a training stage saved (top_k, repetition_penalty, suppress_tokens) can apply, even on a borrowed model.
- `generate` decodes a batch until its longest row stops, so every turn of a round waits for the longest one
  (on the ladder eval, turns of 8 episodes at once need about 2x the decode steps their tokens do). A stream
  admits a sequence between any two decode steps and hands it back the step it stops, so a finished turn
  goes back to its episode (whose tools then run beside the decoding) and the next turn joins the batch.

Prefill runs prompt by prompt, each unpadded (exactly the forward it gets alone: no padding waste, and on CPU
batching a prefill gains nothing: it is compute-bound), from its longest cached prefix (`PrefixCache`); a
prompt queued several times (GRPO's G samples of a turn, eval's --samples) is prefilled once. Its states are
copied right-aligned into the stream's preallocated cache (nanocomposer/engine/kv_cache.py). Decoding runs all
rows together, one forward per new token, the attention mask excluding the padding and each row's position
continuing from its own prompt length. A row that stops leaves the batch (its states go to the prefix cache).
Models whose cache is not plain full attention (sliding-window or hybrid layers) cannot take rows one by one:
their stream is a static batch (`padded`), prefilled in one left-padded forward (position ids counted from
the mask) into the model's own cache, and new sequences join only once the batch is empty.

What holds numerically (fp32, CPU, measured on the test checkpoints): prefill logits are bitwise those of the
prompt alone; decoding logits in a batch differ from the same prompt decoded alone by ~1e-7 (matrix products
of other shapes round differently; padding gets exactly zero attention weight), so greedy tokens are
identical unless two logits are within ~1e-6 of each other (tests/test_batched_generation.py,
tests/test_decode_stream.py). Bitwise-equal logits across batch shapes are not promised (nor by vLLM).

A borrowed model (RL's live training model) is used in place: no_grad (not inference_mode, whose tensors may
not enter autograd later), eval mode for each step and its train/eval mode restored after, and inside
`torch.random.fork_rng` so the trainer's global RNG stream is untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nanocomposer.engine.kv_cache import cache_kwarg, plain_full_attention
from nanocomposer.engine.prefix_cache import PrefixCache
from nanocomposer.engine.sampling import Result, SamplingConfig
from nanocomposer.engine.stream import DecodeStream

DEFAULT_MAX_BATCH_TOKENS = 32768  # KV-cache positions per static batch (rows x (longest prompt + new tokens))
# KV-cache positions the prefix cache keeps (all entries together): 512 MB for the demo's 5.3M model in fp32
# (8 KB a position), room for 16 live episodes of 4,096 positions.
DEFAULT_PREFIX_CACHE_POSITIONS = 65536


def length_batches(lengths: Sequence[int], max_new_tokens: int, max_batch_tokens: int,
                   max_batch_size: int) -> list[list[int]]:
    """Indices of the prompts grouped into batches: longest first, each batch within the cache-position budget.

    A batch's cost is rows x (its longest prompt + max_new_tokens); a prompt over the budget alone is a batch
    of one (it runs, as it would unbatched).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        current = batches[-1] if batches else None
        if (current and len(current) < max_batch_size
                and (len(current) + 1) * (lengths[current[0]] + max_new_tokens) <= max_batch_tokens):
            current.append(i)
        else:
            batches.append([i])
    return batches


class TransformersGenerator:
    """Decoding with a transformers causal LM (module docstring): `stream()` for continuous batching,
    `generate()` for a static batch.

    `borrowed`: the model belongs to someone else (RL's trainer): plain no_grad instead of inference_mode.
    `padded_prefill`: prefill in one left-padded forward (a static batch), as models whose cache is not plain
    full attention always do.
    `max_batch_tokens`, `max_batch_size`: `generate` splits its prompts (longest first) into static batches of
    at most that many cache positions (rows x (longest prompt + max_new_tokens)) and rows, which bounds the
    cache's memory (8 KB per position for the demo's 5.3M model, fp32: 256 MB at the default).
    `prefix_cache_positions`: > 0 keeps the KV states of each finished row in a `PrefixCache` of that many
    positions (row-by-row prefill only). Off by default: a caller whose model trains (RL) must leave it off or
    `clear_prefix_cache()` after each update.
    """

    def __init__(self, model, stop_ids: Sequence[int], *, borrowed: bool = False,
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, max_batch_size: int = 64,
                 padded_prefill: bool = False, prefix_cache_positions: int = 0):
        if not stop_ids:
            raise ValueError("TransformersGenerator: no stop ids (generation would never stop)")
        if max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError(f"TransformersGenerator: max_batch_tokens={max_batch_tokens} and "
                             f"max_batch_size={max_batch_size} must be >= 1")
        self.model, self.borrowed = model, borrowed
        self.stop_ids = list(stop_ids)
        self.max_batch_tokens, self.max_batch_size = max_batch_tokens, max_batch_size
        self.padded_prefill = padded_prefill
        self.prefix_cache = PrefixCache(prefix_cache_positions)
        # what the decode steps of this generator's streams read (bench/decode_traffic.py): per step the rows
        # decoded, the cache positions attention read (rows x window) and those holding the rows' own tokens
        self.decode_stats = {"steps": 0, "row_steps": 0, "attended_positions": 0, "context_positions": 0}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix (after the weights changed)."""
        self.prefix_cache.clear()

    def can_stream(self) -> bool:
        """Whether sequences can join a running batch: plain full-attention cache layers, row-by-row prefill."""
        return not self.padded_prefill and plain_full_attention(self.model)

    def stream(self, sampling: SamplingConfig) -> DecodeStream:
        """A continuous batch over this generator's model."""
        if not self.can_stream():
            raise ValueError("TransformersGenerator.stream: the model's cache is not plain full attention (or "
                             "padded prefill is on); use TransformersGenerator.generate")
        return DecodeStream(self, sampling)

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int],
                 sampling: SamplingConfig) -> list[Result]:
        """One Completion (or the exception it met) per prompt, in order: static batches within the budget."""
        if len(prompts) != len(seeds):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("generate: an empty prompt (a causal LM needs at least one token to condition on)")
        results: list[Result | None] = [None] * len(prompts)
        for batch in length_batches([len(p) for p in prompts], sampling.max_new_tokens, self.max_batch_tokens,
                                    self.max_batch_size):
            done = self.decode_batch([prompts[i] for i in batch], [seeds[i] for i in batch], sampling)
            for i, result in zip(batch, done, strict=True):
                results[i] = result
        return results

    def decode_batch(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int],
                     sampling: SamplingConfig) -> list[Result]:
        """One static batch: every prompt added to a fresh stream, stepped until all finished. A request that
        failed beside others is retried alone (a failing decode step fails every row it decoded, an out-of-
        memory batch fails them all), so an exception is the result of the request that caused it."""
        stream = DecodeStream(self, sampling, headroom=sampling.max_new_tokens)  # the cache: rows x (prompt + new)
        for i, (prompt, seed) in enumerate(zip(prompts, seeds, strict=True)):
            stream.add(i, prompt, seed)
        finished: dict[int, Result] = {}
        while len(stream):
            finished.update(stream.step())
        results = [finished[i] for i in range(len(prompts))]
        if len(prompts) > 1:
            results = [self.decode_batch([p], [s], sampling)[0] if isinstance(r, Exception) else r
                       for p, s, r in zip(prompts, seeds, results, strict=True)]
        return results

    def prefill_one(self, prompt: Sequence[int]):
        """(a DynamicCache holding `prompt`'s KV states, its last token's logits): the prompt alone, unpadded,
        from its longest cached prefix on."""
        from transformers import DynamicCache

        row_cache = DynamicCache(config=self.model.config)
        reused = self._reuse_prefix(prompt, row_cache)
        out = self.model(input_ids=torch.tensor([list(prompt[reused:])], dtype=torch.long, device=self.device),
                         **cache_kwarg(self.model, row_cache), use_cache=True, logits_to_keep=1)
        return row_cache, out.logits[0, -1]

    def _reuse_prefix(self, prompt: Sequence[int], row_cache) -> int:
        """Fill `row_cache` with the cached states of `prompt`'s longest cached prefix (at most all but its last
        token: the forward must produce the last token's logits); how many positions that is."""
        if not self.prefix_cache.max_positions:
            return 0
        states, common = self.prefix_cache.longest(prompt)
        reused = min(common, len(prompt) - 1)
        if reused > 0:
            for layer, (keys, values) in enumerate(states):
                row_cache.update(keys[:, :, :reused], values[:, :, :reused], layer)
        self.prefix_cache.stats["reused_positions"] += reused
        self.prefix_cache.stats["prefilled_positions"] += len(prompt) - reused
        return reused
