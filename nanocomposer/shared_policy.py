"""One checkpoint policy serving the turns of many threads at once, generated together.

    shared = SharedPolicy(model_policy)                  # one per loaded checkpoint
    shared.act_batch([TurnRequest(...)])                 # from any thread: blocks until its turn is written
    shared.close()                                       # stops the generation thread, closes the policy

The agent server runs each session on a worker thread (its episode, sandbox and ask_user round trips are
that thread's). With a policy per worker every session generated alone and every worker held its own copy of
the model; through a SharedPolicy the workers' turns meet in one continuous batch (`ModelPolicy.open_stream`,
scheduled by env/scheduler.py, as the runner's turns are): a turn joins the running batch within
`admit_every` decode steps of its request and comes back the step its sequence stops, while the other
sessions' turns decode on. Each turn is seeded from its request (`TurnRequest.episode_key` and `turn`)
exactly as `act_batch` does, so a session samples the same tokens whichever sessions it shares the batch
with (up to the floating-point differences of other batch shapes, as in the runner). A policy that cannot
stream (the vLLM backend, whose engine batches one call's requests) is served in rounds: every request
waiting when a round starts is one `act_batch` call.

A request that fails (it overflows the context, a decode step raises) gets its exception back in its own
thread; the others are served. `close()` answers every waiting request with an error.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future

from env.episode import Generation, TurnRequest
from env.scheduler import TurnScheduler

DEFAULT_ADMIT_EVERY = 8  # decode steps between admissions: a new turn waits at most this many tokens to join


class SharedPolicyClosed(RuntimeError):
    pass


class SharedPolicy:
    def __init__(self, policy, admit_every: int = DEFAULT_ADMIT_EVERY):
        if admit_every < 1:
            raise ValueError(f"SharedPolicy: admit_every={admit_every} must be >= 1")
        self.policy, self.admit_every = policy, admit_every
        self.name = getattr(policy, "name", type(policy).__name__)
        self._cond = threading.Condition()
        self._waiting: list[tuple[TurnRequest, Future]] = []
        self._closed = False
        self._keys = itertools.count()
        self._thread = threading.Thread(target=self._serve, name=f"shared-policy-{self.name}", daemon=True)
        self._thread.start()
        self._local = threading.local()  # `reset`/`act` state of the calling thread's episode

    # ---------------------------------------------------------------- the Policy protocol, thread-safe
    def reset(self, task) -> None:
        """Per calling thread (each worker plays one episode at a time): the episode `act` continues."""
        episodes = getattr(self._local, "episodes", 0) + 1
        self._local.episodes, self._local.turn = episodes, 0
        self._local.key = f"{getattr(task, 'id', task)}#{threading.get_ident()}#{episodes}"

    def act(self, messages: list[dict], tools: list[dict]) -> Generation:
        """The next turn of this thread's episode (`reset`); raises its error."""
        if not hasattr(self._local, "key"):
            raise RuntimeError("SharedPolicy.act before reset() in this thread")
        request = TurnRequest(messages, tools, self._local.key, self._local.turn)
        self._local.turn += 1
        (result,) = self.act_batch([request])
        if isinstance(result, BaseException):
            raise result
        return result

    def act_batch(self, requests: list[TurnRequest]) -> list[Generation | BaseException]:
        """One Generation (or the exception that request got) per request, in order; blocks this thread only."""
        futures = [Future() for _ in requests]
        with self._cond:
            if self._closed:
                raise SharedPolicyClosed(f"policy {self.name!r} is closed")
            self._waiting += zip(requests, futures, strict=True)
            self._cond.notify_all()
        return [f.result() for f in futures]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)
        if hasattr(self.policy, "close"):
            self.policy.close()

    # ---------------------------------------------------------------- the generation thread
    def _take(self, busy: bool) -> list[tuple[TurnRequest, Future]] | None:
        """The requests that arrived (waiting for one unless `busy`); None once closed."""
        with self._cond:
            if not busy:
                self._cond.wait_for(lambda: self._waiting or self._closed)
            if self._closed:
                for _, future in self._waiting:
                    future.set_result(SharedPolicyClosed(f"policy {self.name!r} closed before this turn ran"))
                self._waiting = []
                return None
            taken, self._waiting = self._waiting, []
            return taken

    def _serve(self) -> None:
        running: dict[int, Future] = {}
        why = "closed"
        try:
            self._loop(running)
        except BaseException as e:  # noqa: BLE001  (the thread must not die leaving callers blocked)
            why = f"failed ({type(e).__name__}: {e})"
        finally:
            with self._cond:  # no later request may wait on a thread that is gone
                self._closed = True
                waiting, self._waiting = self._waiting, []
            for future in [*running.values(), *(f for _, f in waiting)]:
                if not future.done():
                    future.set_result(SharedPolicyClosed(f"policy {self.name!r} {why} before this turn ended"))

    def _loop(self, running: dict[int, Future]) -> None:
        turns = TurnScheduler(self.policy)
        while (taken := self._take(busy=bool(running))) is not None:
            for request, future in taken:
                key = next(self._keys)
                running[key] = future  # answered by _serve if a step kills the thread
                turns.add(key, request)
            if running:
                for key, result in turns.step(self.admit_every):
                    running.pop(key).set_result(result)
