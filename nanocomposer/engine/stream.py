"""`DecodeStream`: the transformers backend's one decode loop, a continuous batch that sequences join between
decode steps and leave the step they stop (nanocomposer/engine/transformers_backend.py says why and what
holds numerically)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nanocomposer.engine.kv_cache import cache_kwarg, plan_layout, rows_layer
from nanocomposer.engine.sampling import Completion, Result, SamplingConfig, sample_tokens


@dataclass
class _StreamRow:
    key: object
    prompt: list[int]
    generator: torch.Generator
    begin: int  # buffer column of the prompt's first token
    ids: list[int]
    logprobs: list[float]


class DecodeStream:
    """Continuous batching with a TransformersGenerator: sequences join between decode steps
    and leave as soon as they stop.

    `step()` prefills the sequences added since the last call (each alone, from its longest cached prefix),
    then decodes every live row together until at least one finishes. Each row samples from its own seed and
    sees exactly its own positions, so its tokens are those it gets alone, up to the floating-point
    differences of other batch shapes. A prompt whose prefill fails comes back as its exception; a failing
    decode step fails the rows it was decoding.

    Layout: every live row's next token goes to the same buffer column `length`; a joining prompt of P tokens
    takes the P columns before it (left padding, masked). Attention sees only the columns from the earliest
    live row's prompt on, so a long-running stream does not attend over dead columns; the buffers are
    rebuilt (the used window copied) only when the column or row room runs out. A `padded` stream (a model
    whose cache cannot take rows one by one) is one static batch at a time in the model's own cache.
    """

    def __init__(self, generator, sampling: SamplingConfig, headroom: int | None = None):
        self.generator, self.sampling = generator, sampling
        self.padded = not generator.can_stream()
        self.queue: list[tuple[object, list[int], int]] = []
        self.rows: list[_StreamRow] = []  # live rows, in buffer-slot order
        self.cache = None
        self.mask: torch.Tensor | None = None  # (row slots, capacity): 1 where a row has a token
        self.logits: torch.Tensor | None = None  # (live rows, vocab): each row's next-token logits
        self.positions: torch.Tensor | None = None  # (live rows,): position id of each row's last cached token
        self.padded_length = 0  # a padded stream's next write column (a row stream's is its layers' `length`)
        # columns kept free on the left when the window must move right for a longer prompt, so that the
        # next turns (longer by their completion and tool results) seldom move it again; a static batch, which
        # nothing joins later, needs only room for its new tokens
        self.headroom = headroom or max(512, 2 * sampling.max_new_tokens)

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
                finished += self._admit_padded() if self.padded else self._admit()
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
        self.cache.layers = [rows_layer()(rows, capacity) for _ in self.cache.layers]
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
            layer.expose()

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

    def _window(self) -> tuple[int, int]:
        """(first column attention sees, the column the next token is written to)."""
        if self.padded:
            return 0, self.padded_length
        self._make_room(0, 0)
        return self.cache.layers[0].start, self._layout[2]

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
                    found = states[tuple(prompt)] = self.generator.prefill_one(prompt)
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
        for key, prompt, seed, row_cache, _ in prefilled:
            slot, begin = len(self.rows), length - len(prompt)
            if begin < 0:  # plan_layout's promise; writing anyway would slice the buffer wrongly
                raise RuntimeError(f"decode stream: a {len(prompt)}-token prompt does not fit before column "
                                   f"{length} (layout {self._layout})")
            for layer, row_layer in zip(self.cache.layers, row_cache.layers, strict=True):
                layer.put_row(slot, begin, row_layer.keys, row_layer.values)
            self.mask[slot] = 0
            self.mask[slot, begin:length] = 1
            self._join(key, prompt, seed, begin)
        self._join_tensors([logits for *_, logits in prefilled], [len(p) - 1 for _, p, *_ in prefilled])
        self._set_start()

    def _admit_padded(self) -> list[tuple[object, Result]]:
        """Every queued sequence, once the batch is empty, in one left-padded forward into the model's cache."""
        from transformers import DynamicCache

        if self.rows or not self.queue:
            return []
        queue, self.queue = self.queue, []
        model, device = self.generator.model, self.generator.device
        width = max(len(prompt) for _, prompt, _ in queue)
        mask = torch.zeros((len(queue), width + self.sampling.max_new_tokens), dtype=torch.long, device=device)
        input_ids = torch.zeros((len(queue), width), dtype=torch.long, device=device)  # padding: id 0, masked
        for r, (_, prompt, _) in enumerate(queue):
            mask[r, width - len(prompt):width] = 1
            input_ids[r, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long, device=device)
        positions = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        try:
            out = model(input_ids=input_ids, attention_mask=mask[:, :width], position_ids=positions,
                        **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1)
        except Exception as e:  # noqa: BLE001  (the batch's failure: every sequence in it gets it)
            return [(key, e) for key, _, _ in queue]
        self.cache, self.mask, self.padded_length = cache, mask, width
        for key, prompt, seed in queue:
            self._join(key, prompt, seed, width - len(prompt))
        self._join_tensors(list(out.logits[:, -1]), positions[:, -1].tolist())
        return []

    def _join(self, key, prompt: list[int], seed: int, begin: int) -> None:
        generator = torch.Generator(device=self.generator.device).manual_seed(seed)
        self.rows.append(_StreamRow(key, prompt, generator, begin, [], []))

    def _join_tensors(self, logits: list[torch.Tensor], positions: list[int]) -> None:
        """The joining rows' next-token logits and last positions after the live rows'."""
        new_logits = torch.stack(logits)
        new_positions = torch.tensor(positions, dtype=torch.long, device=self.generator.device)
        self.logits = new_logits if self.logits is None else torch.cat([self.logits, new_logits])
        self.positions = new_positions if self.positions is None else torch.cat([self.positions, new_positions])

    # -- decoding
    def _decode_step(self) -> list[tuple[object, Result]]:
        """Sample one token for every live row; finished rows leave; the others are fed their token."""
        tokens, token_logprobs = sample_tokens(self.logits, [row.generator for row in self.rows], self.sampling)
        stop = set(self.generator.stop_ids)
        done = []
        for b, (row, token, logprob) in enumerate(zip(self.rows, tokens.tolist(), token_logprobs.tolist())):
            row.ids.append(token)
            row.logprobs.append(logprob)
            if token in stop or len(row.ids) >= self.sampling.max_new_tokens:
                done.append(b)
        finished = [(self.rows[b].key, Completion(self.rows[b].ids, self.rows[b].logprobs)) for b in done]
        if done:
            tokens = self._leave(done, tokens)
        if not self.rows:
            self._reset()
            return finished
        start, length = self._window()
        live = len(self.rows)
        counts = self.generator.decode_stats
        counts["steps"] += 1
        counts["row_steps"] += live
        counts["attended_positions"] += live * (length + 1 - start)
        counts["context_positions"] += sum(length + 1 - row.begin for row in self.rows)
        self.mask[:live, length] = 1
        self.positions = self.positions + 1
        model = self.generator.model
        out = model(input_ids=tokens[:, None], attention_mask=self.mask[:live, start:length + 1],
                    position_ids=self.positions[:, None], **cache_kwarg(model, self.cache), use_cache=True)
        if self.padded:
            self.padded_length += 1
        self.logits = out.logits[:, -1]
        return finished

    def _leave(self, done: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """Remove the rows at `done` (remembering their states for prefix reuse); the live rows' tokens."""
        if self.padded:  # the model's own cache: keep the other rows, in order
            leaving = set(done)
            order = [b for b in range(len(self.rows)) if b not in leaving]
            index = torch.tensor(order, dtype=torch.long, device=tokens.device)
            self.cache.batch_select_indices(index)
            self.mask = self.mask[index]
        else:
            order = self._leave_rows(done)
            index = torch.tensor(order, dtype=torch.long, device=tokens.device)
        self.rows = [self.rows[i] for i in order]
        self.logits, self.positions = self.logits[index], self.positions[index]
        if not self.padded:
            self._set_start()
        return tokens[index]

    def _leave_rows(self, done: list[int]) -> list[int]:
        """Free the slots at `done` (the last live row takes a leaving row's slot); the old index of each
        slot's row after."""
        prefix_cache = self.generator.prefix_cache
        for b in done if prefix_cache.max_positions else ():
            row = self.rows[b]
            tokens_cached = row.prompt + row.ids[:-1]  # the last token was never fed
            states = [layer.get_row(b, row.begin) for layer in self.cache.layers]
            if states[0][0].shape[-2] == len(tokens_cached):
                prefix_cache.store(tokens_cached, states)
        order = list(range(len(self.rows)))
        for b in sorted(done, reverse=True):
            last = len(order) - 1
            if b != last:
                for layer in self.cache.layers:
                    layer.move_row(last, b)
                self.mask[b] = self.mask[last]
                order[b] = order[last]
            order.pop()
        return order
