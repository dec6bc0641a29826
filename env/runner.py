"""Play tasks with a policy: the one way every stage plays many episodes (eval, SFT data, checks, RL).

    records = run_tasks(tasks, lambda: OraclePolicy(), EpisodeConfig(), samples=2, seed=0, concurrency=4,
                        results_path="runs/x/episodes.jsonl", resume=True)

Many episodes are live at once. Their tool calls and grading run in worker threads (sandboxed commands are
subprocesses, so threads overlap them with each other and with generation). Generation depends on the policy:

- a policy with `act_batch(requests) -> list[Generation | BaseException]` (a model) is built once and shared,
  and the turns of every live episode go through one `TurnScheduler` (env/scheduler.py, also the agent
  server's) on the calling thread: where the policy's `open_stream()` returns a stream (continuous batching),
  each turn joins the running batch as soon as its episode asks and goes back to its episode as soon as it is
  finished, so no turn waits for the longest one of its batch and its tools run while the others decode;
  otherwise every waiting turn goes to a single `act_batch` call (once no episode still runs tools, or the
  oldest turn has waited `batch_wait_s`), so a GPU generates for all of them together;
- any other policy (scripted: gold, noop, oracle, replay) keeps per-episode state from `reset(task)`, so each
  live episode gets its own instance from the zero-argument factory (instances are reused after an episode
  ends) and the whole episode runs in its worker thread.

With `processes=N` the episodes are played by N spawned worker processes, each running the above with its
own policy instance from the (then picklable) factory and taking jobs from one shared queue; this process
only writes results. On a CPU that is how generation uses several cores: one model per process, one
thread each, the processes' batches decoding side by side.

Seeds: sample s of a task is seeded with `seed + s` (`seed_policy(policy, seed)` for per-episode policies,
and the episode key `f"{task.id}#{seed + s}"`, from which batched policies derive their sampling seeds).

Results: one record per episode (`Trajectory.to_record` plus task_set/sample/seed/... fields), appended to
`results_path` (a results file, env/results.py) as each episode finishes, so a SIGKILL loses at most the
partial last line; `resume=True` cuts that off and skips the (task set, task id, sample) triples already
there. When the run completes, the file is rewritten in the deterministic order the records are returned in:
task-major, sample-minor, whatever the completion order.

Failures stay with their episode: a task directory that does not load (`invalid_task`), a policy whose
`reset` raises (`policy_error`) or a harness exception in one episode (`harness_error`) each give one failed
record with the reason in `error`, and the rest of the set runs. SIGINT or SIGTERM stops the run cleanly:
finished records are on disk, live episodes' sandboxes are closed and their workspaces removed, and
`Interrupted` is raised for the caller to report (eval.py exits 130).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import env.sandbox_cgroups
import env.workspace
from env.episode import Episode, EpisodeConfig, ExitStatus, Generation, Trajectory, TurnRequest, error_text
from env.processes import JobFeed, ProcessFailed, StopSignals, run_in_processes
from env.results import (
    ResultsFileError,
    append_record,
    check_run_facts,
    read_results,
    record_key,
    rewrite_results,
    write_run_facts,
)
from env.scheduler import TurnScheduler
from env.tasks import Task, load_task


class Interrupted(Exception):
    """The run was stopped by SIGINT/SIGTERM; finished records are in the results file."""

    def __init__(self, finished: int, total: int, results_path: str | None):
        self.finished, self.total, self.results_path = finished, total, results_path
        where = f" in {results_path}" if results_path else ""
        super().__init__(f"interrupted: {finished}/{total} episodes finished{where}")


class _Cancelled(Exception):
    pass


@dataclass
class TaskRef:
    """A task (loaded, or a directory loaded when its episode starts) and the fields its records carry."""

    task: Task | str | Path
    fields: dict = field(default_factory=dict)  # e.g. task_set, family, tier

    @property
    def id(self) -> str:
        return self.task.id if isinstance(self.task, Task) else Path(self.task).name


@dataclass
class _Job:
    index: int  # position in the deterministic output order
    ref: TaskRef
    sample: int
    seed: int

    @property
    def key(self) -> tuple:
        return (self.ref.fields.get("task_set"), self.ref.id, self.sample)


@dataclass
class _Slot:
    """A live episode: its job, episode, policy instance, and what it waits for."""

    job: _Job
    policy: object
    episode: Episode | None = None
    future: Future | None = None  # the worker-thread phase in flight
    request: TurnRequest | None = None  # waiting for a generation (batched policies)
    waiting_since: float = 0.0


# --------------------------------------------------------------------------- leftovers


def sweep_leftovers() -> None:
    """Remove sandboxes, cgroups and workspaces that a killed run left behind (the harness's own sweepers)."""
    env.sandbox_cgroups.sweep_stale()
    env.workspace.sweep_stale_workspaces()


def default_seed_policy(policy, seed: int) -> None:
    """Seed a per-episode policy that has a `seed` attribute (the oracle's scripted variety)."""
    if hasattr(policy, "seed"):
        policy.seed = seed


# --------------------------------------------------------------------------- the runner


class Runner:
    """One run of `run_tasks` (see there and the module docstring)."""

    def __init__(self, jobs: list[_Job], make_policy: Callable[[], object], config: EpisodeConfig, *,
                 concurrency: int, seed_policy: Callable[[object, int], None], token_ids: bool,
                 batch_wait_s: float):
        self.jobs, self.make_policy, self.config = jobs, make_policy, config
        self.concurrency, self.seed_policy, self.token_ids = concurrency, seed_policy, token_ids
        self.batch_wait_s = batch_wait_s
        first = make_policy()
        self.shared = first if callable(getattr(first, "act_batch", None)) else None
        self.turns = TurnScheduler(self.shared) if self.shared is not None else None
        self.scheduled: dict[int, _Slot] = {}  # id(slot) -> slot, for the slots whose request is in `turns`
        self.free_policies = [] if self.shared is not None else [first]
        self.cancel = threading.Event()

    # -- worker-thread phases
    def _load(self, job: _Job) -> Task:
        task = job.ref.task
        return task if isinstance(task, Task) else load_task(task)

    def _new_episode(self, slot: _Slot, task: Task) -> Episode:
        name = getattr(slot.policy, "name", type(slot.policy).__name__)
        slot.episode = Episode(task, self.config, name, f"{task.id}#{slot.job.seed}")
        return slot.episode.start()

    def _check_cancel(self) -> None:
        if self.cancel.is_set():
            raise _Cancelled

    def _play(self, slot: _Slot) -> Trajectory:
        """A whole episode with a per-episode policy (worker thread)."""
        task = self._load(slot.job)
        episode = self._new_episode(slot, task)
        self.seed_policy(slot.policy, slot.job.seed)
        if episode.reset_policy(slot.policy):
            while (request := episode.request()) is not None:
                self._check_cancel()
                try:
                    generation = slot.policy.act(request.messages, request.tools)
                except Exception as e:  # noqa: BLE001  (a broken policy ends its episode, not the run)
                    generation = e
                self._check_cancel()
                episode.step(generation)
        self._check_cancel()
        return episode.finish()

    def _begin(self, slot: _Slot) -> TurnRequest | Trajectory:
        """Start an episode of the shared batched policy (worker thread): its first request."""
        self._new_episode(slot, self._load(slot.job))
        return self._next(slot)

    def _advance(self, slot: _Slot, generation: Generation | BaseException) -> TurnRequest | Trajectory:
        self._check_cancel()
        slot.episode.step(generation)
        return self._next(slot)

    def _next(self, slot: _Slot) -> TurnRequest | Trajectory:
        self._check_cancel()
        request = slot.episode.request()
        return request if request is not None else slot.episode.finish()

    # -- records
    def _record(self, job: _Job, traj: Trajectory) -> dict:
        return traj.to_record(token_ids=self.token_ids, **job.ref.fields, sample=job.sample, seed=job.seed)

    def failed_record(self, slot: _Slot, e: BaseException) -> dict:
        """One failed record for an episode whose harness (or task directory) failed."""
        from env.tasks import TaskError

        status = ExitStatus.INVALID_TASK if slot.episode is None and isinstance(e, (TaskError, OSError)) \
            else ExitStatus.HARNESS_ERROR
        if slot.episode is not None:
            slot.episode.close()
            traj = slot.episode.traj
        else:
            name = getattr(slot.policy, "name", type(slot.policy).__name__)
            traj = Trajectory(slot.job.ref.id, name, [], [], [], status.value,
                              episode_key=f"{slot.job.ref.id}#{slot.job.seed}")
        traj.exit_status, traj.error, traj.solved = status.value, error_text(e), False
        return self._record(slot.job, traj)

    # -- the driver (calling thread)
    def run(self, on_record: Callable[[dict, Trajectory | None], None]) -> None:
        todo = self.jobs if isinstance(self.jobs, JobFeed) else deque(self.jobs)
        live: list[_Slot] = []
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="episode") as pool:
            try:
                while todo or live:
                    self._collect(live, on_record)  # first: a finished episode's slot is refilled right away
                    while len(live) < self.concurrency and todo:  # (a job feed takes a job when asked)
                        live.append(self._launch(pool, todo.popleft()))
                    if self.turns is not None and self._generate(pool, live):
                        continue
                    busy = [s.future for s in live if s.future is not None]
                    if busy:
                        timeout = None
                        if any(s.request is not None for s in live):
                            oldest = min(s.waiting_since for s in live if s.request is not None)
                            timeout = max(0.0, oldest + self.batch_wait_s - time.perf_counter())
                        wait(busy, timeout=timeout, return_when=FIRST_COMPLETED)
            except BaseException:
                self._abandon(live)
                raise

    def _launch(self, pool: ThreadPoolExecutor, job: _Job) -> _Slot:
        if self.shared is not None:
            slot = _Slot(job, self.shared)
            slot.future = pool.submit(self._begin, slot)
        else:
            slot = _Slot(job, self.free_policies.pop() if self.free_policies else self.make_policy())
            slot.future = pool.submit(self._play, slot)
        return slot

    def _collect(self, live: list[_Slot], on_record) -> None:
        """Take the results of finished worker phases: a request to batch, or a finished episode."""
        for slot in [s for s in live if s.future is not None and s.future.done()]:
            future, slot.future = slot.future, None
            try:
                result = future.result()
            except Exception as e:  # noqa: BLE001  (a harness failure ends its episode, not the run)
                record, traj = self.failed_record(slot, e), None
            else:
                if isinstance(result, TurnRequest):
                    slot.request, slot.waiting_since = result, time.perf_counter()
                    continue
                record, traj = self._record(slot.job, result), result
            live.remove(slot)
            if self.shared is None:
                self.free_policies.append(slot.policy)
            on_record(record, traj)

    def _generate(self, pool: ThreadPoolExecutor, live: list[_Slot]) -> bool:
        """Every newly waiting request into the scheduler; then one step if it holds any: a stream's at once, a
        round (one act_batch call of every waiting request) once no episode is still running tools or the
        oldest request has waited batch_wait_s. Each finished turn goes back to its episode. Returns whether
        it stepped."""
        for slot in live:
            if slot.request is not None and id(slot) not in self.scheduled:
                self.scheduled[id(slot)] = slot
                self.turns.add(id(slot), slot.request)
        if not len(self.turns):
            return False
        if not self.turns.streaming and any(s.future is not None for s in live):
            oldest = min(s.waiting_since for s in self.scheduled.values())
            if time.perf_counter() - oldest < self.batch_wait_s:
                return False
        for key, generation in self.turns.step():
            slot = self.scheduled.pop(key)
            slot.request = None
            slot.future = pool.submit(self._advance, slot, generation)
        return True

    def _abandon(self, live: list[_Slot]) -> None:
        """Stop: worker threads give up at their next check; kill running commands, then remove workspaces."""
        self.cancel.set()
        for slot in live:
            if slot.episode is not None and slot.episode.sandbox is not None:
                slot.episode.sandbox.close()  # kills what runs, so worker threads return soon
        for slot in live:
            if slot.future is not None:
                wait([slot.future], timeout=120)
            if slot.episode is not None:
                slot.episode.close()


def _loaded(ref: TaskRef) -> TaskRef:
    """`ref` with its task loaded when it is a directory that loads (records then carry the task's own id);
    one that does not stays a path and becomes an invalid_task record when its episode starts."""
    from env.tasks import TaskError

    if isinstance(ref.task, Task):
        return ref
    try:
        return TaskRef(load_task(ref.task), ref.fields)
    except (TaskError, OSError):
        return ref


def run_tasks(tasks: Sequence[Task | str | Path | TaskRef], make_policy: Callable[[], object],
              config: EpisodeConfig | None = None, *, samples: int = 1, seed: int = 0, concurrency: int = 1,
              results_path: str | Path | None = None, resume: bool = False, progress: bool = True,
              on_result: Callable[[dict, Trajectory | None], None] | None = None,
              seed_policy: Callable[[object, int], None] = default_seed_policy, token_ids: bool = False,
              batch_wait_s: float = 0.05, desc: str = "episodes", run_facts: dict | None = None,
              processes: int = 1) -> list[dict]:
    """Play every task `samples` times; the records, task-major and sample-minor (module docstring).

    `on_result(record, trajectory)` is called on this thread as each episode finishes (trajectory None for a
    failed record). `run_facts` (JSON: e.g. the policy spec and its sampling settings) join the episode budgets
    and the seed in `<results_path>.run.json`; resuming with other facts is refused, so a results file never
    mixes episodes played under different settings. Raises `Interrupted` on SIGINT/SIGTERM, `ResultsFileError`
    for a results file that cannot be resumed; every other failure becomes a failed record.

    `processes > 1` plays the episodes in that many worker processes (spawned; each builds its own policy
    with `make_policy`, which must then be picklable, e.g. a module-level function or a functools.partial, and
    holds up to `concurrency / processes` live episodes, rounded up), taking jobs from one queue; this process
    writes the results file and calls `on_result` (with the trajectory rebuilt from the record). On a CPU this
    runs generation on several cores. A worker that fails or dies raises `ProcessFailed` once the others
    are done; what finished is on disk, and `resume=True` plays the rest.
    """
    from tqdm import tqdm

    if samples < 1 or concurrency < 1 or processes < 1:
        raise ValueError(f"run_tasks: samples={samples}, concurrency={concurrency} and processes={processes} "
                         "must be >= 1")
    config = config or EpisodeConfig()
    if processes > 1:
        import pickle

        try:
            pickle.dumps((make_policy, seed_policy))
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise ValueError(f"run_tasks: processes={processes} needs a picklable make_policy and seed_policy (a "
                             f"module-level function or a functools.partial of one): {e}") from None
    refs = [_loaded(t if isinstance(t, TaskRef) else TaskRef(t)) for t in tasks]
    jobs = [_Job(i * samples + s, ref, s, seed + s) for i, ref in enumerate(refs) for s in range(samples)]
    path = Path(results_path) if results_path is not None else None
    wanted = {job.key for job in jobs}
    facts = json.loads(json.dumps({"episode": config.budgets(), "seed": seed, **(run_facts or {})}))
    done: dict[tuple, dict] = {}
    if path is not None and resume:
        check_run_facts(path, facts)
        done = {record_key(r): r for r in read_results(path, repair=True) if record_key(r) in wanted}
    todo = [job for job in jobs if job.key not in done]
    sweep_leftovers()
    processes = min(processes, max(1, len(todo)))
    runner_args = {"concurrency": min(-(-concurrency // processes), max(1, len(todo))), "seed_policy": seed_policy,
                   "token_ids": token_ids, "batch_wait_s": batch_wait_s}
    runner = Runner(todo, make_policy, config, **runner_args) if processes == 1 else None
    resumed_policies = {r.get("policy") for r in done.values()}

    def check_policy(name: str | None) -> None:
        others = resumed_policies - {name}
        if name is not None and others:
            raise ResultsFileError(f"results file {str(path)!r} holds episodes of policy {min(map(str, others))!r}, "
                                   f"not {name!r}: resume with the same policy, or start a new file")

    if runner is not None:  # (worker processes build their own policies: their first record is checked)
        check_policy(getattr(runner.shared or runner.free_policies[0], "name", None))
    if path is not None:
        if not resume:
            path.write_text("")  # a fresh run (only now: a policy that fails to build has not cost the old file)
        write_run_facts(path, facts)
    bar = tqdm(total=len(jobs), initial=len(done), desc=desc, unit="episode", disable=not progress)
    out = open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115 (closed below)

    def finished(record: dict, traj: Trajectory | None) -> None:
        if runner is None and resumed_policies:
            check_policy(record.get("policy"))
        done[record_key(record)] = record  # the record's id is its job's: tasks are loaded (or unloadable) above
        if out is not None:
            append_record(out, record)
        bar.update()
        if on_result is not None:
            on_result(record, traj)

    try:
        if runner is None:
            run_in_processes(todo, Runner, make_policy, config, processes, runner_args, finished)
        else:
            with StopSignals():
                runner.run(finished)
    except KeyboardInterrupt:
        raise Interrupted(len(done), len(jobs), str(path) if path else None) from None
    except ProcessFailed as e:
        where = f" are in {str(path)!r}: resume to play the rest" if path else ""
        raise ProcessFailed(f"{e}; {len(done)}/{len(jobs)} episodes finished{where}") from None
    finally:
        bar.close()
        if out is not None:
            out.close()
    records = [done[job.key] for job in jobs]
    if path is not None:
        rewrite_results(path, records)
    return records
