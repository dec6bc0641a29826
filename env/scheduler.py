"""The turns of many episodes through one batched policy: the one scheduler of env.runner and the agent server.

    turns = TurnScheduler(policy)             # a policy with act_batch (and maybe open_stream)
    turns.add(key, request)                   # a TurnRequest, whenever its episode asks
    for key, result in turns.step(): ...      # a Generation, or the exception that request met

The policy declares what it can do: `open_stream()` returns a stream (continuous batching: `add(key, request)`
returns None or the request's error, `step(max_steps=None)` returns finished `(key, result)` pairs, `len()`
counts what it holds) or None. With a stream each request joins the running batch at the next step and comes
back the step its sequence stops, so no turn waits for the longest one of its batch. Without one (vLLM, whose
engine batches one call's requests; a policy whose own batches are all it has) the scheduler serves rounds:
`step()` is one `act_batch` call of every request added since the last. When to step is the caller's choice
(the runner waits a little to fill a round, the agent server steps whenever anything waits).

Failures stay with their requests: a request the stream refuses comes back from the next `step()` as its
error, before anything decodes; a stream whose step raises fails the turns it held and is opened afresh; a
round that raises (or answers the wrong number of requests) fails every request of that round. Only what is
not an `Exception` (SystemExit, KeyboardInterrupt) reaches the caller.
"""

from __future__ import annotations

from env.episode import Generation, TurnRequest

Finished = list[tuple[object, Generation | BaseException]]


class TurnScheduler:
    def __init__(self, policy):
        self.policy = policy
        self.stream = self._open_stream()
        self.held: set = set()  # keys inside the stream
        self.waiting: dict[object, TurnRequest] = {}  # rounds: requests for the next act_batch call
        self.refused: Finished = []  # requests the stream would not take, answered by the next step()

    @property
    def streaming(self) -> bool:
        return self.stream is not None

    def __len__(self) -> int:
        return len(self.refused) + (len(self.stream) if self.stream is not None else len(self.waiting))

    def _open_stream(self):
        """The policy's stream, or None (rounds) where it has none or cannot open one."""
        open_stream = getattr(self.policy, "open_stream", None)
        try:
            return open_stream() if callable(open_stream) else None
        except Exception:  # noqa: BLE001  (rounds of act_batch still serve every request)
            return None

    def add(self, key, request: TurnRequest) -> None:
        """Queue `request` under `key` (unique among the requests not yet answered)."""
        if self.stream is None:
            self.waiting[key] = request
            return
        error = self.stream.add(key, request)
        if error is None:
            self.held.add(key)
        else:
            self.refused.append((key, error))

    def step(self, max_steps: int | None = None) -> Finished:
        """The requests answered now: the refused ones if any; else a stream decodes until at least one of its
        requests is finished (or for `max_steps` tokens), a round generates every waiting request."""
        if self.refused:
            finished, self.refused = self.refused, []
            return finished
        if self.stream is not None:
            return self._stream_step(max_steps) if len(self.stream) else []
        return self._round()

    def _stream_step(self, max_steps: int | None) -> Finished:
        try:
            finished = self.stream.step() if max_steps is None else self.stream.step(max_steps)
        except Exception as e:  # noqa: BLE001  (a broken stream fails the turns it held, not its caller)
            failed, self.held = [(key, e) for key in self.held], set()
            self.stream = self._open_stream()
            return failed
        for key, _ in finished:
            self.held.discard(key)
        return finished

    def _round(self) -> Finished:
        if not self.waiting:
            return []
        keys, requests = list(self.waiting), list(self.waiting.values())
        self.waiting = {}
        try:
            results = list(self.policy.act_batch(requests))
            if len(results) != len(requests):
                raise RuntimeError(f"act_batch returned {len(results)} results for {len(requests)} requests")
        except Exception as e:  # noqa: BLE001  (the whole round failed: each request gets the reason)
            results = [e] * len(requests)
        return list(zip(keys, results, strict=True))
