"""Prefix reuse across an episode's turns: the KV states of recent sequences, matched by tokens.

An episode's next prompt is the previous prompt + completion + the tool results + the next header (the chat
template is prefix-preserving), so its prefill can start from the cached states of its longest shared token
prefix and run only over the new suffix: each turn's prefill costs its new tokens, not the whole conversation
again. Matched by tokens, not by episode, so a prompt that departs from the cached one (a re-rendered turn,
another episode of the same task) reuses exactly the shared part. The states are only valid for the weights
that made them: a caller whose model trains clears the cache after each update.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch


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
