"""How a run of episodes stops, and how it spreads over several processes (env/runner.py's `processes=N`).

`StopSignals` turns SIGINT/SIGTERM into one KeyboardInterrupt for a run, in one process or in each worker.
`run_in_processes` starts N spawned workers, each running the runner (passed in as `runner_class`, so this
module does not import env.runner) on jobs taken one at a time from a shared queue, and brings their records
back to the parent, which alone writes the results file.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from env.episode import EpisodeConfig, ExitStatus, Trajectory, error_text


class StopSignals:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread while the run lasts, once.

    Later ones are ignored while the run stops: raised inside the stop, one would cut it short and leave
    workspaces mounted. They come unasked: a worker process whose parent is killed gets its death signal
    once for each of the parent's threads, as each exits and the worker is reparented to the next one; and
    an impatient second Ctrl-C is common. SIGKILL still ends a stop that hangs (the next run sweeps what it
    leaves, `sweep_leftovers`)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.previous, self.stopping = {}, False
        if threading.current_thread() is threading.main_thread():
            # an ignored signal stays ignored (a worker ignores Ctrl-C: its parent decides; so does a job in
            # the background)
            self.previous = {sig: signal.signal(sig, self._raise) for sig in self.SIGNALS
                             if signal.getsignal(sig) is not signal.SIG_IGN}
        return self

    def _raise(self, signum, frame):
        if not self.stopping:
            self.stopping = True
            raise KeyboardInterrupt(f"signal {signum}")

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class ProcessFailed(RuntimeError):
    """A worker process of a `processes > 1` run failed or died; the finished records are on disk."""


class JobFeed:
    """The jobs a worker process plays: indexes into the run's job list, taken one at a time from a queue
    shared by all workers, so a process that finishes its episodes early takes more (no static split)."""

    def __init__(self, jobs: list, queue):
        self.jobs, self.queue, self.next, self.exhausted = jobs, queue, None, False

    def __bool__(self) -> bool:
        if self.next is None and not self.exhausted:
            index = self.queue.get(timeout=600)  # every index is queued before the workers start
            self.exhausted = index is None
            self.next = None if index is None else self.jobs[index]
        return self.next is not None

    def popleft(self):
        job, self.next = self.next, None
        return job


def die_with_parent() -> None:
    """SIGTERM this process when the process that started it dies (even by SIGKILL), so a worker never
    outlives its run: SIGTERM stops its episodes cleanly (sandboxes closed, workspaces removed)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not glibc: a killed run's workers finish their live episodes and exit
        pass


def _worker_main(number: int, parent: int, jobs: list, runner_class: type, make_policy, config: EpisodeConfig,
                 runner_args: dict, job_queue, results) -> None:
    """One worker process: build the policy, play jobs from the queue, send each record to the parent."""
    die_with_parent()
    runner = None
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides
        runner = runner_class(JobFeed(jobs, job_queue), make_policy, config, **runner_args)
        with StopSignals():
            if os.getppid() != parent:  # the parent died before the death signal was set (we were reparented)
                raise KeyboardInterrupt
            runner.run(lambda record, traj: results.put(("record", number, record)))
    except KeyboardInterrupt:
        results.put(("stopped", number, None))
    except BaseException as e:  # noqa: BLE001  (reported to the parent, which names the process)
        results.put(("error", number, error_text(e)))
    else:
        results.put(("done", number, None))
    finally:
        close = getattr(getattr(runner, "shared", None), "close", None)
        if callable(close):
            close()


def run_in_processes(jobs: list, runner_class: type, make_policy, config: EpisodeConfig, processes: int,
                     runner_args: dict, on_record: Callable[[dict, Trajectory | None], None]) -> None:
    """Play `jobs` in `processes` worker processes, each a `runner_class` (env.runner.Runner) with its own policy (so CPU generation
    runs on several cores at once); records come back to this process, which calls `on_record` for each
    (with the trajectory rebuilt from the record). SIGINT/SIGTERM here stops every worker cleanly and raises
    KeyboardInterrupt; a worker that fails or dies raises ProcessFailed once the others are done."""
    import multiprocessing
    import queue

    context = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools mid-flight
    job_queue, results = context.Queue(), context.Queue()
    for index in range(len(jobs)):
        job_queue.put(index)
    for _ in range(processes):
        job_queue.put(None)
    workers = [context.Process(target=_worker_main, name=f"episodes-{n}", daemon=True,
                               args=(n, os.getpid(), jobs, runner_class, make_policy, config, runner_args,
                                     job_queue, results))
               for n in range(processes)]
    ended: dict[int, str] = {}  # worker number -> how it ended
    deliver = True  # records still go to on_record (not after on_record itself failed)

    def handle(kind: str, number: int, payload) -> None:
        if kind == "record":
            if not deliver:
                return
            status = payload.get("exit_status")
            failed = status in (ExitStatus.INVALID_TASK.value, ExitStatus.HARNESS_ERROR.value)
            on_record(payload, None if failed else Trajectory.from_record(payload))
        else:
            ended[number] = kind if kind != "error" else f"failed: {payload}"

    def pump(timeout: float) -> None:
        """Handle what the workers sent; a worker found dead without saying so has died."""
        try:
            handle(*results.get(timeout=timeout))
            while True:
                handle(*results.get_nowait())
        except queue.Empty:
            pass
        for n, worker in enumerate(workers):
            if n not in ended and not worker.is_alive():
                try:  # what it sent before exiting is in the pipe (its queue is flushed at exit)
                    while n not in ended:
                        handle(*results.get(timeout=1.0))
                except queue.Empty:
                    ended[n] = f"died (exit code {worker.exitcode})"

    with StopSignals():  # the stop below runs inside it too: a second Ctrl-C does not cut it short
        try:
            for worker in workers:
                worker.start()
            while len(ended) < processes:
                pump(0.5)
        except BaseException as e:  # Ctrl-C, SIGTERM, or this process failing: stop every worker cleanly
            deliver = isinstance(e, KeyboardInterrupt)  # episodes finished while stopping are kept
            for worker in workers:
                if worker.is_alive():
                    worker.terminate()  # SIGTERM: the worker abandons its episodes and says "stopped"
            deadline = time.monotonic() + 150
            while len(ended) < processes and time.monotonic() < deadline:
                pump(0.5)
            for worker in workers:
                if worker.pid is not None:
                    worker.join(timeout=5)
                    if worker.is_alive():
                        worker.kill()
            raise
    for worker in workers:
        worker.join(timeout=30)
    failures = {n: how for n, how in sorted(ended.items()) if how != "done"}
    if failures:
        raise ProcessFailed("; ".join(f"worker process {n} {how}" for n, how in failures.items()))
