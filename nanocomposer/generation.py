"""Batched token-in/token-out generation: one interface, two backends (transformers, vLLM).

    generator = TransformersGenerator(model, stop_ids)             # or VLLMGenerator(llm, stop_ids)
    results = generator.generate(prompts, seeds, sampling)         # prompts: list of token-id lists
    for result in results:                                        # in the order of `prompts`
        if isinstance(result, Exception): ...                      # this request failed, the others did not
        ids, logprobs = result                                     # a Completion

Every result carries what RL needs: the completion ids (with the stop token when one was generated) and
the log-probability of each under the distribution it was drawn from ("processed" log-probs: after
temperature and top-p; greedy: the raw model distribution), which TRL's importance-sampling correction
expects. Each sequence draws from its own seed, so a request samples the same tokens whatever else is in
its batch (up to floating point, below).

Transformers backend, and why it is a hand-written decode loop rather than `model.generate`:
- `generate` draws a whole batch from one RNG, so a row's sample would depend on its batch-mates; here each
  row has its own `torch.Generator` seeded with the request's seed.
- Only `SamplingConfig` decides the decoding (temperature, top-p; nothing else): no generation_config knob
  a training stage saved (top_k, repetition_penalty, suppress_tokens) can apply, even on a borrowed model.
- Prefill runs prompt by prompt, each unpadded (exactly the forward it gets alone: no padding waste, no
  padded attention mask, and on CPU batching a prefill gains nothing: it is compute-bound); each prompt's KV
  states are copied right-aligned (left-padded) into a cache preallocated for the whole batch and
  generation. A prompt that occurs several times in a batch (GRPO's G samples of a task's first turn, eval's
  --samples) is prefilled once. Decoding then runs all rows together: one forward per new token, the attention mask excluding
  the padding and each row's position continuing from its own prompt length. The preallocated cache is
  written in place (transformers' DynamicCache copies the whole cache for every new token: 38% of a CPU
  decode step at 8 rows of 1,100 tokens). Rows that generate a stop token leave the batch (their cache rows
  are dropped), so finished rows cost nothing; the batch ends when every row stopped or reached
  max_new_tokens. Models whose cache is not plain full attention (sliding-window or hybrid layers) are
  prefilled in one left-padded forward instead, position ids counted from the mask (`cumsum(mask) - 1`).
- Prefix reuse (`prefix_cache_positions` > 0; ModelPolicy turns it on for models it loads): each row's KV
  states (its prompt and completion, all but the last token, which was never fed) are kept in a `PrefixCache`
  when the row leaves the batch. An episode's next prompt is the previous prompt + completion + the tool
  results + the next header (the chat template is prefix-preserving), so its prefill starts from the cached
  states of its longest shared token prefix and runs only over the new suffix: each turn's prefill costs its
  new tokens, not the whole conversation again. Matched by tokens, not by episode, so a prompt that departs
  from the cached one (a re-rendered turn, another episode of the same task) reuses exactly the shared part.
  Greedy tokens equal a full prefill's up to the ~1e-7 logit differences above (tests check identity over
  multi-turn conversations). The cache keeps at most `prefix_cache_positions` positions, least recently used
  out first, and a new entry replaces the ones it extends (one per live episode). The states are only valid
  for the weights that made them: off for a borrowed (training) model.
- Prompts are sorted by length and packed into batches of at most `max_batch_tokens` cache positions
  (rows x (longest prompt + max_new_tokens)), which bounds the cache's memory (8 KB per position for the
  demo's 5.3M model, fp32: 256 MB at the default).
- What holds numerically (fp32, CPU, measured on the test checkpoints): prefill logits are bitwise those of
  the prompt alone; decoding logits in a batch differ from the same prompt decoded alone by ~1e-7 (matrix
  products of other shapes round differently; padding gets exactly zero attention weight), so greedy tokens
  are identical unless two logits are within ~1e-6 of each other. tests/test_batched_generation.py checks
  token identity on prompts of 3 to 1,500 tokens in one batch. Bitwise-equal logits across batch shapes are
  not promised (nor by vLLM).
- Continuous batching (`stream(sampling)` -> `DecodeStream`): what the runner uses for a model ModelPolicy
  loads. `generate` decodes a batch until its longest row stops, so every turn of a round waits for the
  longest one (on the ladder eval, turns of 8 episodes at once need about 2x the decode steps their tokens
  do). A stream instead admits a sequence between any two decode steps and hands it back the step it stops,
  with the same per-row prefill, seeds, stop rule and prefix reuse as `generate` (class docstring).
- A borrowed model (RL's live training model) is used in place: no_grad (not inference_mode, whose tensors
  may not enter autograd later), eval mode for the call and its train/eval mode restored after, and inside
  `torch.random.fork_rng` so the trainer's global RNG stream is untouched.

vLLM backend: all requests go to the engine in ONE `LLM.generate` call (a list of `TokensPrompt`s and a list
of per-request `SamplingParams`, each with its own seed), so the engine schedules them together; outputs
come back in request order. Every decoding knob is set explicitly and the engine must run with
`logprobs_mode="processed_logprobs"` (ModelPolicy starts it that way).

Per-request failures: if a batch raises (vLLM rejects the whole call when one prompt is invalid; a batch
may run out of memory), each of its requests is retried alone, so the exception lands on the request that
caused it and the others are served. A result without a log-prob for every token is that request's error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import numpy as np
import torch

from env.budget import Budget, check_sampling

DEFAULT_MAX_BATCH_TOKENS = 32768  # KV-cache positions per transformers batch (rows x (longest prompt + new tokens))
# KV-cache positions the prefix cache keeps (all entries together): 512 MB for the demo's 5.3M model in fp32
# (8 KB a position), room for 16 live episodes of 4,096 positions.
DEFAULT_PREFIX_CACHE_POSITIONS = 65536


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


class PrefixCache:
    """The KV states of recent sequences (a prompt and its completion), so that a prompt extending one of them
    (an episode's next turn: the same conversation plus the tool results and the next assistant header) is
    prefilled only from where it departs from the longest cached match.

    Bounded by `max_positions` KV positions over all entries, least recently used first out. A stored sequence
    replaces the entries it extends (the earlier turns of the same episode), so a live episode holds one entry
    and a finished one ages out. States are per layer `(keys, values)` of shape (1, heads, positions, dim).
    """

    def __init__(self, max_positions: int):
        if max_positions < 0:
            raise ValueError(f"PrefixCache: max_positions={max_positions} must be >= 0 (0 = off)")
        self.max_positions = max_positions
        self.entries: OrderedDict[int, tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]] = OrderedDict()
        self.positions = 0
        self._next_key = 0
        self.stats = {"lookups": 0, "hits": 0, "reused_positions": 0, "prefilled_positions": 0}

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self.positions = 0

    def longest(self, prompt: Sequence[int]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]] | None, int]:
        """(states of the entry sharing the longest token prefix with `prompt`, that prefix's length); (None, 0)
        when no entry shares a first token. The entry becomes the most recently used."""
        self.stats["lookups"] += 1
        query = np.asarray(prompt, dtype=np.int64)
        best_key, best = None, 0
        for key, (tokens, _) in self.entries.items():
            n = min(len(tokens), len(query))
            differs = np.flatnonzero(tokens[:n] != query[:n])
            common = int(differs[0]) if len(differs) else n
            if common > best:
                best_key, best = key, common
        if best_key is None:
            return None, 0
        self.entries.move_to_end(best_key)
        self.stats["hits"] += 1
        return self.entries[best_key][1], best

    def store(self, tokens: Sequence[int], states: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep `states` (one (keys, values) per layer, all positions of `tokens`), dropping the entries that
        `tokens` extends, then the least recently used ones until the total fits."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if not 0 < len(tokens) <= self.max_positions:
            return
        for key, (old, _) in list(self.entries.items()):
            if len(old) <= len(tokens) and np.array_equal(old, tokens[:len(old)]):
                self._drop(key)
        while self.positions + len(tokens) > self.max_positions:
            self._drop(next(iter(self.entries)))
        self.entries[self._next_key] = (tokens, states)
        self._next_key += 1
        self.positions += len(tokens)

    def _drop(self, key: int) -> None:
        tokens, _ = self.entries.pop(key)
        self.positions -= len(tokens)


@cache
def _cache_argument(model_class: type) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def cache_kwarg(model, cache) -> dict:
    """{name: cache} for a causal LM's forward: `cache` in transformers >= 5.2x (the CPU stack's 5.24), where
    `past_key_values` is deprecated; `past_key_values` in 5.17 (the GPU stack: vLLM 0.31 pins <5.18), which
    silently ignores an unknown `cache=` and would leave the caller's cache empty."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper
    return {_cache_argument(type(base)): cache}


@cache
def _decode_batch_layer():
    """The class below, built on first use so that importing this module does not import transformers."""
    from transformers.cache_utils import DynamicLayer

    class DecodeBatchLayer(DynamicLayer):
        """One attention layer's KV cache for a decode batch: rows x capacity preallocated, written in place.

        transformers' DynamicLayer concatenates the whole cache with each new token (a full copy per step: 38% of
        a CPU decode step at 8 rows of 1,100 tokens); this writes each step into its slot and hands attention a
        view of the filled part, so attention sees exactly what DynamicLayer would give it.
        """

        def __init__(self, rows: int, capacity: int):
            super().__init__()
            self.rows, self.capacity, self.length = rows, capacity, 0

        def _allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            self.device = keys.device
            self.key_buffer = keys.new_zeros((self.rows, keys.shape[1], self.capacity, keys.shape[-1]))
            self.value_buffer = values.new_zeros((self.rows, values.shape[1], self.capacity, values.shape[-1]))
            self.is_initialized = True

        def _expose(self) -> None:
            self.keys = self.key_buffer[:, :, :self.length]
            self.values = self.value_buffer[:, :, :self.length]

        def put_row(self, row: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
            """A prompt's prefilled (1, heads, n, dim) states into `row`, positions start..start+n-1."""
            if not self.is_initialized:
                self._allocate(keys, values)
            n = keys.shape[-2]
            self.key_buffer[row, :, start:start + n] = keys[0]
            self.value_buffer[row, :, start:start + n] = values[0]

        def get_row(self, row: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
            """A copy of `row`'s states from position `start` to the filled length, shaped (1, heads, n, dim)."""
            return (self.key_buffer[row:row + 1, :, start:self.length].clone(),
                    self.value_buffer[row:row + 1, :, start:self.length].clone())

        def copy_row(self, source: int, row: int) -> None:
            self.key_buffer[row] = self.key_buffer[source]
            self.value_buffer[row] = self.value_buffer[source]

        def set_length(self, length: int) -> None:
            self.length = length
            self._expose()

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self._allocate(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.capacity:
                raise RuntimeError(f"decode batch KV cache full ({self.capacity} positions)")
            self.key_buffer[:, :, self.length:end] = key_states
            self.value_buffer[:, :, self.length:end] = value_states
            self.set_length(end)
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
            self._expose()

    return DecodeBatchLayer


class TransformersGenerator:
    """Batched decoding with a transformers causal LM (module docstring).

    `borrowed`: the model belongs to someone else (RL's trainer): plain no_grad instead of inference_mode.
    `padded_prefill`: prefill a batch in one left-padded forward instead of prompt by prompt. Models whose
    cache is not plain full attention (sliding-window or hybrid layers) always take that path, since their
    cache layers cannot be filled row by row here.
    `prefix_cache_positions`: > 0 keeps the KV states of each finished row (prompt + completion) in a
    `PrefixCache` of that many positions, and a later prompt sharing a prefix with one is prefilled only from
    where they differ (row-by-row prefill only). Off by default: the states are only valid while the weights
    do not change, so a caller whose model trains (RL) must leave it off or `clear_prefix_cache()` after each
    update.
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

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix (after the weights changed)."""
        self.prefix_cache.clear()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int],
                 sampling: SamplingConfig) -> list[Result]:
        if len(prompts) != len(seeds):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("generate: an empty prompt (a causal LM needs at least one token to condition on)")
        results: list[Result | None] = [None] * len(prompts)
        batches = length_batches([len(p) for p in prompts], sampling.max_new_tokens, self.max_batch_tokens,
                                 self.max_batch_size)
        was_training = self.model.training
        self.model.eval()
        grad_off = torch.no_grad() if self.borrowed else torch.inference_mode()
        devices = [self.device] if self.device.type == "cuda" else []

        def run(rows: list[int]) -> list[Result]:
            return self._decode([prompts[i] for i in rows], [seeds[i] for i in rows], sampling)

        try:
            with grad_off, torch.random.fork_rng(devices=devices):
                for batch in batches:
                    for i, result in zip(batch, run_isolated(run, batch), strict=True):
                        results[i] = result
        finally:
            self.model.train(was_training)
        return results

    def _prefill(self, prompts: list[Sequence[int]], capacity: int):
        """(cache, last logits per row, attention mask, position of each row's last token) for left-padded rows.

        Row by row (the default): each distinct prompt runs alone, unpadded (exactly the forward it would get
        alone), and its KV states are copied right-aligned into a preallocated batch cache (into every row that
        holds the same prompt). Padded: one forward over the left-padded batch, position ids counted from the
        mask (`cumsum(mask) - 1`).
        """
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        device, rows = self.device, len(prompts)
        width = max(len(p) for p in prompts)
        mask = torch.zeros((rows, width), dtype=torch.long, device=device)
        for r, prompt in enumerate(prompts):
            mask[r, width - len(prompt):] = 1
        config = self.model.config
        cache = DynamicCache(config=config)
        if not self.padded_prefill and cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
            cache.layers = [_decode_batch_layer()(rows, capacity) for _ in cache.layers]
            last_logits, first_row = [], {}
            for r, prompt in enumerate(prompts):
                source = first_row.setdefault(tuple(prompt), r)
                if source != r:  # the same prompt again (G samples of one turn): the same states, computed once
                    for layer in cache.layers:
                        layer.copy_row(source, r)
                    last_logits.append(last_logits[source])
                    continue
                row_cache, logits = self._prefill_one(prompt)
                for layer, row_layer in zip(cache.layers, row_cache.layers, strict=True):
                    layer.put_row(r, width - len(prompt), row_layer.keys, row_layer.values)
                last_logits.append(logits)
            for layer in cache.layers:
                layer.set_length(width)
            return cache, torch.stack(last_logits), mask, mask.sum(-1) - 1
        input_ids = torch.zeros((rows, width), dtype=torch.long, device=device)  # padding: id 0, masked out
        for r, prompt in enumerate(prompts):
            input_ids[r, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long, device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, **cache_kwarg(self.model, cache),
                         use_cache=True, logits_to_keep=1)
        return cache, out.logits[:, -1], mask, positions[:, -1]

    def _prefill_one(self, prompt: Sequence[int]):
        """(a DynamicCache holding `prompt`'s KV states, its last token's logits): the prompt alone, unpadded,
        from its longest cached prefix on."""
        from transformers import DynamicCache

        row_cache = DynamicCache(config=self.model.config)
        reused = self._reuse_prefix(prompt, row_cache)
        out = self.model(input_ids=torch.tensor([list(prompt[reused:])], dtype=torch.long, device=self.device),
                         **cache_kwarg(self.model, row_cache), use_cache=True, logits_to_keep=1)
        return row_cache, out.logits[0, -1]

    def can_stream(self) -> bool:
        """Whether `stream()` works with this model: plain full-attention cache layers, row-by-row prefill."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        layers = DynamicCache(config=self.model.config).layers
        return not self.padded_prefill and bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    def stream(self, sampling: SamplingConfig) -> DecodeStream:
        """A continuous batch over this generator's model (`DecodeStream`)."""
        return DecodeStream(self, sampling)

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

    def _remember(self, cache, row: int, start: int, tokens: list[int]) -> None:
        """Store a decode-batch row's states (positions `start`.. of its cache row: `tokens`, its prompt and every
        generated token but the last, which was never fed) in the prefix cache."""
        states = [layer.get_row(row, start) for layer in cache.layers]
        if states and states[0][0].shape[-2] != len(tokens):
            raise RuntimeError(f"prefix cache: {states[0][0].shape[-2]} cached positions for {len(tokens)} tokens")
        self.prefix_cache.store(tokens, states)

    def _decode(self, prompts: list[Sequence[int]], seeds: list[int], sampling: SamplingConfig) -> list[Completion]:
        """One batch, decoded with a KV cache until every row stopped or hit max_new_tokens."""
        device = self.device
        width = max(len(p) for p in prompts)
        cache, logits, mask, last_position = self._prefill(prompts, width + sampling.max_new_tokens)
        remember = bool(self.prefix_cache.max_positions) and all(
            isinstance(layer, _decode_batch_layer()) for layer in cache.layers)

        def keep_states(rows: list[int]) -> None:  # batch rows (indices into `alive`) about to leave the cache
            for b in rows:
                r = alive[b]
                self._remember(cache, b, width - len(prompts[r]), list(prompts[r]) + ids[r][:-1])

        generators = [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]
        stop = torch.tensor(self.stop_ids, device=device)
        ids: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        alive = list(range(len(prompts)))  # original row of each row still in the batch
        for step in range(sampling.max_new_tokens):
            scores = processed_scores(logits.float(), sampling)
            if sampling.temperature == 0:
                tokens = scores.argmax(dim=-1)
            else:
                probs = scores.softmax(dim=-1)
                tokens = torch.cat([torch.multinomial(probs[b], 1, generator=generators[row])
                                    for b, row in enumerate(alive)])
            token_logprobs = torch.log_softmax(scores, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
            for b, (token, logprob) in enumerate(zip(tokens.tolist(), token_logprobs.tolist())):
                ids[alive[b]].append(token)
                logprobs[alive[b]].append(logprob)
            if step + 1 == sampling.max_new_tokens:
                break
            going = ~torch.isin(tokens, stop)
            if not bool(going.any()):
                break
            if not bool(going.all()):  # finished rows leave the batch and its cache
                if remember:
                    keep_states((~going).nonzero().squeeze(-1).tolist())
                keep = going.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                mask, last_position, tokens = mask[keep], last_position[keep], tokens[keep]
                alive = [alive[b] for b in keep.tolist()]
            mask = torch.cat([mask, mask.new_ones((len(alive), 1))], dim=-1)
            last_position = last_position + 1
            out = self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=last_position[:, None],
                             **cache_kwarg(self.model, cache), use_cache=True)
            logits = out.logits[:, -1]
        if remember:
            keep_states(list(range(len(alive))))
        return [Completion(i, lp) for i, lp in zip(ids, logprobs)]


@cache
def _stream_layer():
    """DecodeBatchLayer for a continuous batch, built on first use (no transformers import at module load)."""

    class StreamLayer(_decode_batch_layer()):
        """A DecodeBatchLayer whose rows join and leave between decode steps.

        The buffer holds `rows` row slots and `capacity` columns; the first `live` slots are the live rows and
        columns [start, length) the part any of them uses, which is all attention sees. A row that leaves is
        replaced by the last live row (one row copied, not the whole cache); `relayout` moves the used window
        into new buffers when rows, capacity or room on the left run out.
        """

        def __init__(self, rows: int, capacity: int):
            super().__init__(rows, capacity)
            self.live, self.start = 0, 0

        def _expose(self) -> None:
            if not self.is_initialized:
                return
            self.keys = self.key_buffer[:self.live, :, self.start:self.length]
            self.values = self.value_buffer[:self.live, :, self.start:self.length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            end = self.length + key_states.shape[-2]
            if end > self.capacity:
                raise RuntimeError(f"decode stream KV cache full ({self.capacity} positions)")
            self.key_buffer[:self.live, :, self.length:end] = key_states
            self.value_buffer[:self.live, :, self.length:end] = value_states
            self.set_length(end)
            return self.keys, self.values

        def move_row(self, source: int, row: int) -> None:
            self.key_buffer[row] = self.key_buffer[source]
            self.value_buffer[row] = self.value_buffer[source]

        def relayout(self, rows: int, capacity: int, shift: int) -> None:
            """New buffers of `rows` x `capacity`; the live rows' used columns move by `shift`."""
            start, length = self.start + shift, self.length + shift
            if start < 0 or length > capacity or rows < self.live:
                raise ValueError(f"relayout: window [{start}, {length}) of {self.live} rows does not fit "
                                 f"{rows} x {capacity}")
            if self.is_initialized:
                old = self.key_buffer, self.value_buffer
                shape = (rows, old[0].shape[1], capacity, old[0].shape[-1])
                self.key_buffer, self.value_buffer = old[0].new_zeros(shape), old[1].new_zeros(shape)
                self.key_buffer[:self.live, :, start:length] = old[0][:self.live, :, self.start:self.length]
                self.value_buffer[:self.live, :, start:length] = old[1][:self.live, :, self.start:self.length]
            self.rows, self.capacity, self.start, self.length = rows, capacity, start, length
            self._expose()

    return StreamLayer


def plan_layout(begins: Sequence[int], length: int, rows: int, capacity: int, joining: int, longest: int,
                headroom: int, max_new_tokens: int) -> tuple[int, int, int]:
    """(row slots, columns, shift of the used window) for a decode stream whose live rows begin at columns
    `begins` and write their next token at column `length`, before `joining` rows whose prompts (at most
    `longest` tokens) end at `length` join: afterwards every prompt fits left of `length + shift`, every
    live row's first column stays >= 0, and column `length + shift` exists for the next decode step.

    The window moves right (with `headroom` spare columns, so the next, longer turns seldom move it again)
    only for a prompt longer than the columns before `length`; it moves left, dropping the columns no live
    row uses, only when the right edge is reached, and never so far that a joining prompt stops fitting.
    Buffers grow (rows doubling; columns with `headroom + max_new_tokens` to spare) only when they must.
    """
    if not begins:  # nothing to keep: the window starts afresh, the prompts ending at column `longest`
        shift = longest - length
    elif length < longest:  # a prompt longer than the columns on the left: move the window right
        shift = longest - length + headroom
    elif length + 1 > capacity:  # out of columns on the right: drop the unused ones on the left
        shift = max(-min(begins), longest - length)
    else:
        shift = 0
    need_rows, need_capacity = len(begins) + joining, length + shift + 1
    return (rows if need_rows <= rows else max(need_rows, 2 * rows),
            capacity if need_capacity <= capacity else need_capacity + headroom + max_new_tokens, shift)


@dataclass
class _StreamRow:
    key: object
    prompt: list[int]
    generator: torch.Generator
    begin: int  # buffer column of the prompt's first token
    ids: list[int]
    logprobs: list[float]


class DecodeStream:
    """Continuous batching with a TransformersGenerator: sequences join between decode steps and leave as soon as
    they stop, so a finished turn goes back to its episode (whose tools then run beside the decoding) instead of
    waiting for the longest row of its batch, and the next turn joins the running batch.

        stream = generator.stream(sampling)
        stream.add(key, prompt_ids, seed)           # any time
        for key, result in stream.step(): ...       # Completion or the exception, as sequences finish

    `step()` prefills the sequences added since the last call (each alone, from its longest cached prefix, as
    `generate` does), then decodes every live row together until at least one finishes. Each row samples
    from its own seed and sees exactly its own positions, so its tokens are those it gets alone or in a
    `generate` batch, up to the floating-point differences of other batch shapes (module docstring). A prompt
    whose prefill fails comes back as its exception; a failing decode step fails the rows it was decoding.

    Layout: every live row's next token goes to the same buffer column `length`; a joining prompt of P tokens
    takes the P columns before it (left padding, masked). Attention sees only the columns from the earliest
    live row's prompt on, so a long-running stream does not attend over dead columns; the buffers are
    rebuilt (the used window copied) only when the column or row room runs out.
    """

    def __init__(self, generator: TransformersGenerator, sampling: SamplingConfig):
        if not generator.can_stream():
            raise ValueError("DecodeStream: the model's cache is not plain full attention (or padded prefill is "
                             "on); use TransformersGenerator.generate")
        self.generator, self.sampling = generator, sampling
        self.queue: list[tuple[object, list[int], int]] = []
        self.rows: list[_StreamRow] = []  # live rows, in buffer-slot order
        self.cache = None
        self.mask: torch.Tensor | None = None  # (row slots, capacity): 1 where a row has a token
        self.logits: torch.Tensor | None = None  # (live rows, vocab): each row's next-token logits
        self.positions: torch.Tensor | None = None  # (live rows,): position id of each row's last cached token
        # columns kept free on the left when the window must move right for a longer prompt, so that the
        # next turns (longer by their completion and tool results) seldom move it again
        self.headroom = max(512, 2 * sampling.max_new_tokens)

    def __len__(self) -> int:
        return len(self.rows) + len(self.queue)

    def add(self, key, prompt: Sequence[int], seed: int) -> None:
        if len(prompt) == 0:
            raise ValueError("DecodeStream.add: an empty prompt (a causal LM needs a token to condition on)")
        self.queue.append((key, list(prompt), int(seed)))

    def step(self, max_steps: int | None = None) -> list[tuple[object, Result]]:
        """Admit the queued sequences, then decode until at least one finishes (or `max_steps` decode steps
        ran: a server admits the requests that arrived meanwhile sooner); the finished ones."""
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"DecodeStream.step: max_steps={max_steps} must be >= 1 (or None)")
        model = self.generator.model
        was_training = model.training
        model.eval()
        grad_off = torch.no_grad() if self.generator.borrowed else torch.inference_mode()
        devices = [self.generator.device] if self.generator.device.type == "cuda" else []
        finished: list[tuple[object, Result]] = []
        try:
            with grad_off, torch.random.fork_rng(devices=devices):
                finished += self._admit()
                steps = 0
                while self.rows and not finished and (max_steps is None or steps < max_steps):
                    steps += 1
                    try:
                        finished += self._decode_step()
                    except Exception as e:  # noqa: BLE001  (returned to the rows it was decoding)
                        finished += [(row.key, e) for row in self.rows]
                        self._reset()
        finally:
            model.train(was_training)
        return finished

    # -- layout
    def _reset(self) -> None:
        self.rows, self.cache, self.mask, self.logits, self.positions = [], None, None, None, None

    def _new_cache(self, rows: int, capacity: int) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.generator.model.config)
        self.cache.layers = [_stream_layer()(rows, capacity) for _ in self.cache.layers]
        self.mask = torch.zeros((rows, capacity), dtype=torch.long, device=self.generator.device)

    @property
    def _layout(self) -> tuple[int, int, int]:
        layer = self.cache.layers[0]
        return layer.rows, layer.capacity, layer.length

    def _relayout(self, rows: int, capacity: int, shift: int) -> None:
        for layer in self.cache.layers:
            layer.relayout(rows, capacity, shift)
        mask = self.mask.new_zeros((rows, capacity))
        live, start, length = len(self.rows), self.cache.layers[0].start, self.cache.layers[0].length
        mask[:live, start:length] = self.mask[:live, start - shift:length - shift]
        self.mask = mask
        for row in self.rows:
            row.begin += shift

    def _set_start(self) -> None:
        start = min((row.begin for row in self.rows), default=self.cache.layers[0].length)
        for layer in self.cache.layers:
            layer.live, layer.start = len(self.rows), start
            layer._expose()

    def _make_room(self, joining: int, longest: int) -> None:
        """Room for `joining` more rows whose prompts (at most `longest` tokens) end at column `length`, and
        for the next decode column (`plan_layout`)."""
        if self.cache is None:
            self._new_cache(max(joining, 1), longest + 1 + self.headroom)
        rows, capacity, length = self._layout
        plan = plan_layout([row.begin for row in self.rows], length, rows, capacity, joining, longest,
                           self.headroom, self.sampling.max_new_tokens)
        if plan != (rows, capacity, 0):
            self._relayout(*plan)

    # -- admission
    def _admit(self) -> list[tuple[object, Result]]:
        queue, self.queue = self.queue, []
        failed: list[tuple[object, Result]] = []
        prefilled: list[tuple[object, list[int], int, object, torch.Tensor]] = []
        states: dict[tuple, tuple] = {}  # a prompt queued several times (G samples) is prefilled once
        for key, prompt, seed in queue:
            try:
                found = states.get(tuple(prompt))
                if found is None:
                    found = states[tuple(prompt)] = self.generator._prefill_one(prompt)
            except Exception as e:  # noqa: BLE001  (this prompt's failure)
                failed.append((key, e))
                continue
            prefilled.append((key, prompt, seed, *found))
        if not prefilled:
            return failed
        try:
            self._place(prefilled)
        except Exception as e:  # noqa: BLE001  (a layout failure: the batch is in no known state)
            failed += [(key, e) for key, *_ in prefilled if key not in {row.key for row in self.rows}]
            failed += [(row.key, e) for row in self.rows]
            self._reset()
        return failed

    def _place(self, prefilled: list[tuple]) -> None:
        """The prefilled sequences into the batch: their states right-aligned at column `length`."""
        self._make_room(len(prefilled), max(len(p) for _, p, *_ in prefilled))
        _, _, length = self._layout
        device = self.generator.device
        new_logits, new_positions = [], []
        for key, prompt, seed, row_cache, logits in prefilled:
            slot, begin = len(self.rows), length - len(prompt)
            if begin < 0:  # plan_layout's promise; writing anyway would slice the buffer wrongly
                raise RuntimeError(f"decode stream: a {len(prompt)}-token prompt does not fit before column "
                                   f"{length} (layout {self._layout})")
            for layer, row_layer in zip(self.cache.layers, row_cache.layers, strict=True):
                layer.put_row(slot, begin, row_layer.keys, row_layer.values)
            self.mask[slot] = 0
            self.mask[slot, begin:length] = 1
            self.rows.append(_StreamRow(key, prompt, torch.Generator(device=device).manual_seed(seed), begin,
                                        [], []))
            new_logits.append(logits)
            new_positions.append(len(prompt) - 1)
        new_logits = torch.stack(new_logits)
        new_positions = torch.tensor(new_positions, dtype=torch.long, device=device)
        self.logits = new_logits if self.logits is None else torch.cat([self.logits, new_logits])
        self.positions = new_positions if self.positions is None else torch.cat([self.positions, new_positions])
        self._set_start()

    # -- decoding
    def _decode_step(self) -> list[tuple[object, Result]]:
        """Sample one token for every live row; finished rows leave; the others are fed their token."""
        sampling = self.sampling
        scores = processed_scores(self.logits.float(), sampling)
        if sampling.temperature == 0:
            tokens = scores.argmax(dim=-1)
        else:
            probs = scores.softmax(dim=-1)
            tokens = torch.cat([torch.multinomial(probs[b], 1, generator=row.generator)
                                for b, row in enumerate(self.rows)])
        token_logprobs = torch.log_softmax(scores, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        stop = set(self.generator.stop_ids)
        done = []
        for b, (row, token, logprob) in enumerate(zip(self.rows, tokens.tolist(), token_logprobs.tolist())):
            row.ids.append(token)
            row.logprobs.append(logprob)
            if token in stop or len(row.ids) >= sampling.max_new_tokens:
                done.append(b)
        finished = [(self.rows[b].key, Completion(self.rows[b].ids, self.rows[b].logprobs)) for b in done]
        if done:
            tokens = self._leave(done, tokens)
        if not self.rows:
            self._reset()
            return finished
        self._make_room(0, 0)
        _, _, length = self._layout
        live, start = len(self.rows), self.cache.layers[0].start
        counts = self.generator.decode_stats
        counts["steps"] += 1
        counts["row_steps"] += live
        counts["attended_positions"] += live * (length + 1 - start)
        counts["context_positions"] += sum(length + 1 - row.begin for row in self.rows)
        self.mask[:live, length] = 1
        self.positions = self.positions + 1
        out = self.generator.model(input_ids=tokens[:, None], attention_mask=self.mask[:live, start:length + 1],
                                   position_ids=self.positions[:, None],
                                   **cache_kwarg(self.generator.model, self.cache), use_cache=True)
        self.logits = out.logits[:, -1]
        return finished

    def _leave(self, done: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """Remove the rows at `done` (remembering their states for prefix reuse); the live rows' tokens."""
        remember = bool(self.generator.prefix_cache.max_positions)
        for b in done:
            row = self.rows[b]
            if remember:
                tokens_cached = row.prompt + row.ids[:-1]
                states = [layer.get_row(b, row.begin) for layer in self.cache.layers]
                if states[0][0].shape[-2] == len(tokens_cached):
                    self.generator.prefix_cache.store(tokens_cached, states)
        order = list(range(len(self.rows)))
        for b in sorted(done, reverse=True):  # the last live row takes the leaving row's slot
            last = len(order) - 1
            if b != last:
                for layer in self.cache.layers:
                    layer.move_row(last, b)
                self.mask[b] = self.mask[last]
                order[b] = order[last]
            order.pop()
        index = torch.tensor(order, dtype=torch.long, device=tokens.device)
        self.rows = [self.rows[i] for i in order]
        self.logits, self.positions = self.logits[index], self.positions[index]
        self._set_start()
        return tokens[index]


class VLLMGenerator:
    """Batched generation with a `vllm.LLM` engine: one `LLM.generate` call per batch (module docstring).

    `engine` returns the running engine (or raises): ModelPolicy starts and closes it.
    """

    def __init__(self, engine: Callable[[], object], stop_ids: Sequence[int]):
        self.engine, self.stop_ids = engine, list(stop_ids)

    def params(self, sampling: SamplingConfig, seed: int):
        from vllm import SamplingParams

        s = sampling
        return SamplingParams(
            max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=0, min_p=0.0,
            repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, seed=int(seed), logprobs=0,
            stop_token_ids=list(self.stop_ids),
            detokenize=False)  # the policy decodes with the HF tokenizer, special tokens kept

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int],
                 sampling: SamplingConfig) -> list[Result]:
        from vllm.inputs import TokensPrompt

        if len(prompts) != len(seeds):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
        if not prompts:
            return []
        llm = self.engine()
        requests = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        params = [self.params(sampling, seed) for seed in seeds]

        def run(indices: list[int]) -> list[Result]:
            outputs = llm.generate([requests[i] for i in indices], sampling_params=[params[i] for i in indices],
                                   use_tqdm=False)
            if len(outputs) != len(indices):
                raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(indices)} requests")
            return [_completion(output, requests[i]["prompt_token_ids"]) for output, i in zip(outputs, indices)]

        return run_isolated(run, list(range(len(prompts))))


def _completion(output, prompt_ids: list[int]) -> Result:
    """A vLLM `RequestOutput` as a Completion, or the error that makes it unusable.

    `RequestOutput.outputs[0]` is a `CompletionOutput` whose `token_ids` include the stop token that ended
    the request and whose `logprobs` (with `logprobs=0`) is one `{token_id: Logprob}` dict per position
    holding the sampled token (vllm/outputs.py, vllm/logprobs.py).
    """
    returned_prompt = getattr(output, "prompt_token_ids", None)
    if returned_prompt is not None and list(returned_prompt) != prompt_ids:
        return RuntimeError("vLLM returned an output for a different prompt (outputs out of request order)")
    completion = output.outputs[0]
    ids = [int(t) for t in completion.token_ids]
    steps = completion.logprobs
    if steps is None or len(steps) != len(ids) or any(t not in step for t, step in zip(ids, steps)):
        return RuntimeError(f"vLLM returned {len(ids)} tokens but not the log-prob of every sampled one "
                            f"({'none' if steps is None else len(steps)} positions)")
    return Completion(ids, [float(step[t].logprob) for t, step in zip(ids, steps)])
