"""The KV cache of a decode stream: one preallocated buffer per attention layer that rows join and leave.

transformers' DynamicLayer concatenates the whole cache with each new token (a full copy per step: 38% of a
CPU decode step at 8 rows of 1,100 tokens); `RowsLayer` writes each step into its slot and hands attention a
view of the part the live rows use, so attention sees exactly what DynamicLayer would give it. Where rows go
(`plan_layout`) is decided by the stream (nanocomposer/engine/stream.py); this module only keeps the buffers.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import cache

import torch


@cache
def _cache_argument(model_class: type) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def cache_kwarg(model, kv_cache) -> dict:
    """{name: kv_cache} for a causal LM's forward: `cache` in transformers >= 5.2x (the CPU stack's 5.24), where
    `past_key_values` is deprecated; `past_key_values` in 5.17 (the GPU stack: vLLM 0.31 pins <5.18), which
    silently ignores an unknown `cache=` and would leave the caller's cache empty."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper
    return {_cache_argument(type(base)): kv_cache}


def plain_full_attention(model) -> bool:
    """Whether every layer of `model`'s cache is plain full attention (DynamicLayer), so rows can be filled one
    by one into `RowsLayer` buffers; sliding-window or hybrid layers cannot."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = DynamicCache(config=model.config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


@cache
def rows_layer() -> type:
    """`RowsLayer`, built on first use so that importing this module does not import transformers."""
    from transformers.cache_utils import DynamicLayer

    class RowsLayer(DynamicLayer):
        """One attention layer's KV cache for a decode stream: `rows` row slots x `capacity` columns, written in
        place. The first `live` slots are the live rows and columns [start, length) the part any of them uses,
        which is all attention sees. A row that leaves is replaced by the last live row (one row copied, not
        the whole cache); `relayout` moves the used window into new buffers when rows, capacity or room on the
        left run out."""

        def __init__(self, rows: int, capacity: int):
            super().__init__()
            self.rows, self.capacity, self.length = rows, capacity, 0
            self.live, self.start = 0, 0

        def _allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            self.device = keys.device
            self.key_buffer = keys.new_zeros((self.rows, keys.shape[1], self.capacity, keys.shape[-1]))
            self.value_buffer = values.new_zeros((self.rows, values.shape[1], self.capacity, values.shape[-1]))
            self.is_initialized = True

        def expose(self) -> None:
            if not self.is_initialized:
                return
            self.keys = self.key_buffer[:self.live, :, self.start:self.length]
            self.values = self.value_buffer[:self.live, :, self.start:self.length]

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

        def move_row(self, source: int, row: int) -> None:
            self.key_buffer[row] = self.key_buffer[source]
            self.value_buffer[row] = self.value_buffer[source]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            """What attention calls with each decode step's new states: written at column `length`."""
            end = self.length + key_states.shape[-2]
            if end > self.capacity:
                raise RuntimeError(f"decode stream KV cache full ({self.capacity} positions)")
            self.key_buffer[:self.live, :, self.length:end] = key_states
            self.value_buffer[:self.live, :, self.length:end] = value_states
            self.length = end
            self.expose()
            return self.keys, self.values

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
            self.expose()

    return RowsLayer


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
