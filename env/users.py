"""Simulated users: a seeded population of developers that uses the agent server over plain HTTP.

    python -m env.users --server http://127.0.0.1:8765 --tasks samples --sessions 20 \\
        --recipe recipes/tiny/users.yaml [--seed S] [--offset N] [--task-limit M] [--start K] [--token T] \\
        [--report users.json]

Each conversation takes a task from a set training never saw (held-out factory splits, the samples) and
a user with parameters drawn from the recipe. Which tasks (`draw_tasks`): the set, its families interleaved
(`interleaved_by_family`), cut to the range [offset, offset + task_limit), shuffled by the seed; conversation
i takes the i-th task of that order (cycling). Runs over non-overlapping ranges never ask for the same task,
so fresh traffic for an A/B comparison is `--offset` past what training traffic drew from (`--task-limit`).
The seed (the recipe's, or `--seed`) also draws every user's patience, answers, follow-ups, feedback noise and
timing, so the same seed, offset and limit replay the same sessions, each sent with a `sample_key` naming its
conversation (the server derives its sampling seeds from it, so a server with the same `--seed` samples the
same tokens). The user sends the task's instruction (POST /sessions with the task directory), follows the
session's turns (long-poll), answers `ask_user` questions (from the hidden spec with probability
`answer_helpful_p`, else "just do it"; a question on a request that left nothing out also gets the feedback
`question_needless`, once a session: `question_needed`), and gives up on a session slower than its patience
(feedback `abandoned`). When the session ends the user judges it with information the agent never saw:
the session's diff applied (`patch -p1` names, by env/patches.py, the one diff parser: a path outside the copy
is refused, never written) to a fresh copy of the task repo, graded by `env.grading.grade` with
the hidden tests. A passing result is applied and kept, a failing one applied and later reverted (each flipped
with probability `keep_noise_p`); a wrong or slow result brings a dissatisfied follow-up with probability
`followup_p`; every session gets a 1-5 rating. Every feedback event is a real POST, counted, so a test can
check that the server stored exactly what was sent.

SIGTERM or Ctrl-C stops the users (`Simulation.stop`): no conversation starts after it, the ones in flight stop
watching within a long-poll (`poll_s`) and send no more feedback, and the report of what was played is still
written, with `stopped: true` and the conversations whose feedback the stop cut short counted
(`stats.cut_at_stop`).

This module is a pure HTTP client of the server (no import of its internals, no torch); it uses env/ only
for what the simulated developer knows: the task set and the grader.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import httpx
import yaml

from env.grading import grade
from env.patch_apply import apply_patch
from env.patch_paths import PatchError
from env.task_sets import resolve_task_set
from env.tasks import Task, TaskError, family_of
from env.workspace import make_workspace, remove_workspace

TERMINAL = ("finished", "timed_out", "failed", "interrupted")


@dataclass
class Population:
    """Every parameter of the simulated population; a recipe YAML sets any of them (unknown keys are errors)."""

    seed: int = 0
    concurrency: int = 4  # conversations in flight at once
    patience_s: tuple[float, float] = (30.0, 120.0)  # each user's patience: uniform in this range
    give_up_factor: float = 2.0  # a session still running after factor x patience is abandoned
    poll_s: float = 10.0  # long-poll wait per status request
    answer_helpful_p: float = 0.6  # ask_user answered from the hidden spec; otherwise "just do it"
    answer_delay_s: tuple[float, float] = (0.0, 0.2)  # time to type an answer
    keep_noise_p: float = 0.05  # a passing result reverted anyway, or a failing one kept
    revert_delay_s: tuple[float, float] = (0.0, 0.2)  # between applying and reverting
    followup_p: float = 0.7  # a dissatisfied follow-up when the result is wrong or slow
    max_followups: int = 1  # per conversation
    rating_noise_sd: float = 0.5
    session_timeout_s: float | None = None  # asked of the server per session (None: the server's limit)
    retry_429_s: float = 0.5  # wait after a "queue full" answer before retrying
    max_retries: int = 120
    just_do_it: list[str] = field(default_factory=lambda: ["Just do it.", "Use your judgement.", "Whatever works."])
    followup_texts: list[str] = field(default_factory=lambda: [
        "That did not fix it; the tests still fail.", "This is wrong, please look again.",
        "Too slow, and the result is not right."])


def load_population(path: str | Path) -> Population:
    where = f"users recipe {str(path)!r}"
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{where}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of parameter: value")  # noqa: TRY004
    known = {f.name: f for f in fields(Population)}
    defaults = Population()
    values = {}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"{where}: unknown parameter {key!r} (parameters: {', '.join(known)})")
        default = getattr(defaults, key)
        if isinstance(default, tuple):
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)
                    and value[0] <= value[1]):
                raise ValueError(f"{where}: {key} must be [low, high] numbers, got {value!r}")
            value = (float(value[0]), float(value[1]))
        elif isinstance(default, list):
            if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
                raise ValueError(f"{where}: {key} must be a non-empty list of strings")
        elif key.endswith("_p") and not (isinstance(value, (int, float)) and 0 <= value <= 1):
            raise ValueError(f"{where}: {key} must be a probability in [0, 1], got {value!r}")
        elif isinstance(default, int) and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{where}: {key} must be an integer, got {value!r}")
        elif value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ValueError(f"{where}: {key} must be a number, got {value!r}")
        values[key] = value
    pop = Population(**values)
    if pop.concurrency < 1 or pop.poll_s <= 0:
        raise ValueError(f"{where}: concurrency must be >= 1 and poll_s > 0")
    return pop


def hidden_spec(task: Task) -> str:
    """What the developer knows and the agent does not: the task's scripted answer, else its hidden tests."""
    if task.meta.get("user_answer"):
        return str(task.meta["user_answer"])
    names = []
    if task.hidden_dir is not None:
        for f in sorted(task.hidden_dir.rglob("*.py")):
            names += [f"{f.relative_to(task.hidden_dir).as_posix()}::{n}"
                      for n in re.findall(r"^\s*def (test_\w+)", f.read_text(errors="replace"), re.MULTILINE)]
    if not names:
        return task.instruction
    return "It is right when these tests pass: " + ", ".join(names[:8])


def question_needed(task: Task) -> bool:
    """Whether the request leaves out something only the user knows: a task with a scripted `user_answer` (as
    ladder_ask's). Asking is right there; on any other task the instruction is the whole request, and a
    question is one the user did not need to be asked."""
    return bool(task.meta.get("user_answer"))


def judge(task: Task, diff: str, submission: str) -> bool:
    """The developer's verdict: the diff applied to a fresh copy of the repo passes the hidden tests. A diff
    env/patches.py refuses (malformed, naming a path outside the copy) or that does not apply fails; binary
    sections have no text to apply and are left out, as `patch -p1` leaves them."""
    workspace = make_workspace(task.repo_dir, prefix="user-")
    try:
        if diff.strip():
            try:
                apply_patch(workspace, diff, skip_binary=True)
            except PatchError:
                return False
        return grade(task, workspace, submission).solved
    finally:
        remove_workspace(workspace)


def interleaved_by_family(tasks: list[Task]) -> list[Task]:
    """The set's fixed order: families (sorted) taken in turn, each family's tasks by id. Every prefix then holds
    the families in proportion, so two ranges of it ask for the same kinds of task; a plain sort by id would
    give one range all of the families that sort first (factory ids start with the family name). Tasks with no
    family form one family of their own."""
    families: dict[str, list[Task]] = {}
    for task in sorted(tasks, key=lambda t: t.id):
        families.setdefault(family_of(task), []).append(task)
    queues = [families[name] for name in sorted(families)]
    # Family f's i-th task goes at fraction (i + 0.5) / len(f) of the order: a small family is spread over the
    # whole set rather than used up in its first rounds.
    return [task for _, _, task in sorted((((i + 0.5) / len(queue), f, task) for f, queue in enumerate(queues)
                                          for i, task in enumerate(queue)), key=lambda x: x[:2])]


def draw_tasks(tasks: list[Task], seed: int, offset: int = 0, limit: int | None = None) -> list[Task]:
    """The tasks of a run in the order its conversations take them (module docstring): the set in its fixed
    order (`interleaved_by_family`), cut to [offset, offset + limit) (limit None: to the end), shuffled by
    `seed`. ValueError naming the flag for a range that does not fit the set."""
    ordered = interleaved_by_family(tasks)
    if offset < 0 or offset >= len(ordered):
        raise ValueError(f"--offset {offset}: must be in [0, {len(ordered)}) (the task set has {len(ordered)} tasks)")
    if limit is not None and not 1 <= limit <= len(ordered) - offset:
        raise ValueError(f"--task-limit {limit}: must be in [1, {len(ordered) - offset}] (the task set has "
                         f"{len(ordered)} tasks, {len(ordered) - offset} from --offset {offset})")
    drawn = ordered[offset:None if limit is None else offset + limit]
    random.Random(f"users-tasks:{seed}").shuffle(drawn)
    return drawn


class Simulation:
    """Conversation i (0-based) plays `tasks[i % len(tasks)]` with a user drawn from (pop.seed, i)."""

    def __init__(self, server: str, tasks: list[Task], pop: Population, token: str | None = None,
                 transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=pop.poll_s + 60,
                                 limits=httpx.Limits(max_connections=4 * pop.concurrency + 8), transport=transport)
        self.tasks, self.pop = tasks, pop
        self.lock = threading.Lock()
        self.stats: Counter = Counter()
        self.accepted: list[str] = []
        self.feedback_sent: list[tuple[str, str]] = []
        self.latencies: list[dict] = []
        self.stopping = threading.Event()  # set by stop(): the users leave (module docstring)
        self.started: list[int] = []  # conversations that submitted their task before the stop

    def stop(self) -> None:
        """Safe from a signal handler: it only sets an event the users' threads look at."""
        self.stopping.set()

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.stats[key] += n

    def sample_key(self, index: int) -> str:
        """What the server derives conversation `index`'s sampling seeds from: the same in every replay of this
        population (seed) on these tasks, different for every other conversation. Follow-ups get the server's
        `<key>/followup<n>`."""
        return f"users:{self.pop.seed}:{index}:{self.tasks[index % len(self.tasks)].id}"

    # ------------------------------------------------------------------ http
    def _post(self, path: str, body: dict) -> httpx.Response:
        for _ in range(self.pop.max_retries):
            r = self.http.post(path, json=body)
            if r.status_code != 429:
                return r
            self.count("rejected_429")
            time.sleep(self.pop.retry_429_s)
        return r

    def feedback(self, session_id: str, kind: str, value: float | None = None, text: str | None = None) -> None:
        r = self.http.post(f"/sessions/{session_id}/feedback", json={"kind": kind, "value": value, "text": text})
        if r.status_code == 201:
            with self.lock:
                self.feedback_sent.append((session_id, kind))
        else:
            self.count(f"feedback_error_{r.status_code}")

    # -------------------------------------------------------------- a user
    def conversation(self, index: int) -> None:
        if self.stopping.is_set():
            return
        with self.lock:
            self.started.append(index)
        rng = random.Random(f"{self.pop.seed}:{index}")
        task = self.tasks[index % len(self.tasks)]
        patience = rng.uniform(*self.pop.patience_s)
        body = {"task_dir": str(task.root), "client": f"user-{index}", "timeout_s": self.pop.session_timeout_s,
                "sample_key": self.sample_key(index)}
        r = self._post("/sessions", body)
        for depth in range(self.pop.max_followups + 1):
            if r.status_code not in (201, 202):
                self.count(f"submit_error_{r.status_code}")
                return
            session_id = r.json()["id"]
            with self.lock:
                self.accepted.append(session_id)
            unhappy = self.follow(session_id, task, patience, rng)
            if not unhappy or depth == self.pop.max_followups or rng.random() >= self.pop.followup_p:
                return
            if self.stopping.is_set():
                self.count("cut_at_stop")  # its dissatisfied follow-up is not sent
                return
            self.feedback(session_id, "followup_dissatisfied", text="wrong or slow")
            r = self._post(f"/sessions/{session_id}/messages",
                           {"text": rng.choice(self.pop.followup_texts), "client": f"user-{index}"})
            self.count("followups")

    def follow(self, session_id: str, task: Task, patience: float, rng: random.Random) -> bool:
        """Watch one session to its end and react; True when the user is unhappy with its result.

        A user who gives up says so (feedback `abandoned`) and walks away: no follow-up on a session still running.
        """
        t0, after, flagged = time.monotonic(), 0, False
        while True:
            r = self.http.get(f"/sessions/{session_id}", params={"after_turn": after, "wait_s": self.pop.poll_s})
            if r.status_code != 200:
                self.count(f"poll_error_{r.status_code}")
                return True
            s = r.json()
            after = s["turn_count"]
            if s["status"] in TERMINAL:
                break
            if self.stopping.is_set():  # the session runs on in the server; its feedback is never sent
                self.count("cut_at_stop")
                return False
            if s["status"] == "waiting" and s["question"]:
                time.sleep(rng.uniform(*self.pop.answer_delay_s))
                helpful = rng.random() < self.pop.answer_helpful_p
                text = hidden_spec(task) if helpful else rng.choice(self.pop.just_do_it)
                if self.http.post(f"/sessions/{session_id}/messages", json={"text": text}).status_code == 200:
                    self.count("answers_helpful" if helpful else "answers_just_do_it")
                if not flagged and not question_needed(task):
                    self.feedback(session_id, "question_needless")
                    flagged = True
            if time.monotonic() - t0 > patience * self.pop.give_up_factor:
                self.feedback(session_id, "abandoned", value=round(time.monotonic() - t0, 3))
                self.count("gave_up")
                return False
        latency = time.monotonic() - t0
        slow = latency > patience
        passed = s["status"] in ("finished", "timed_out") and judge(task, s["diff"] or "", s["submission"] or "")
        with self.lock:
            self.stats[f"status_{s['status']}"] += 1
            self.stats["passed" if passed else "not_passed"] += 1
            self.latencies.append({"id": session_id, "client_s": latency, "wall_s": s["wall_s"],
                                   "queue_s": (s["started_at"] or s["created_at"]) - s["created_at"]})
        if s["diff"]:
            self.feedback(session_id, "applied")
            keep = passed != (rng.random() < self.pop.keep_noise_p)
            if not keep and self.stopping.wait(rng.uniform(*self.pop.revert_delay_s)):
                self.count("cut_at_stop")  # stopped before the revert came: it and the rating are not made up
                return False  # and the user who left sends no follow-up
            self.feedback(session_id, "kept" if keep else "reverted")
        score = (5 if passed else 2) - (1 if slow else 0) + rng.gauss(0, self.pop.rating_noise_sd)
        self.feedback(session_id, "rating", value=float(min(5, max(1, round(score)))))
        return not passed or slow

    # --------------------------------------------------------------- a run
    def run(self, sessions: int, drain_s: float = 600.0, start: int = 0) -> dict:
        """Conversations start .. start + sessions - 1: a run cut short continues with `start` = the conversations
        it played, and gets the users, tasks and sample keys the whole run would have had."""
        t0 = time.monotonic()
        played = range(start, start + sessions)
        with ThreadPoolExecutor(self.pop.concurrency) as pool:
            for f in [pool.submit(self.conversation, i) for i in played]:
                f.result()
        stopped = self.stopping.is_set()
        unfinished = [] if stopped else self.drain(drain_s)
        wall = time.monotonic() - t0
        return {"conversations": sessions, "stopped": stopped, "conversations_started": len(self.started),
                "accepted": len(self.accepted), "accepted_ids": self.accepted,
                "feedback_sent": len(self.feedback_sent), "feedback_by_kind": dict(Counter(k for _, k in
                                                                                        self.feedback_sent)),
                "unfinished_after_drain": unfinished, "wall_s": round(wall, 3),
                "sessions_per_s": round(len(self.accepted) / wall, 3) if wall else None,
                "stats": dict(self.stats), "latencies": self.latencies, "population": asdict(self.pop),
                "seed": self.pop.seed, "first_conversation": start,
                "conversation_tasks": [self.tasks[i % len(self.tasks)].id for i in sorted(self.started)]}

    def drain(self, timeout_s: float) -> list[str]:
        """Wait until every accepted session (abandoned ones too) has ended; the ids that did not."""
        deadline, left = time.monotonic() + timeout_s, []
        for session_id in self.accepted:
            while True:
                r = self.http.get(f"/sessions/{session_id}/result", params={"wait_s": min(self.pop.poll_s, 30)})
                if r.status_code in (200, 408) or time.monotonic() > deadline:
                    break
            if r.status_code not in (200, 408):
                left.append(session_id)
        return left


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True, help="the agent server's URL")
    p.add_argument("--tasks", required=True, help="task set: samples | factory:<split>[/...] | a directory")
    p.add_argument("--sessions", type=int, required=True, help="conversations to play (follow-ups come on top)")
    p.add_argument("--recipe", required=True, help="the population's parameters (YAML)")
    p.add_argument("--seed", type=int, default=None,
                   help="the population's RNG: which tasks, users, answers, follow-ups, feedback timing "
                        "(default: the recipe's seed)")
    p.add_argument("--offset", type=int, default=0,
                   help="skip the first N tasks of the set (ordered by task id): runs over disjoint ranges ask "
                        "for disjoint tasks (default: 0)")
    p.add_argument("--task-limit", type=int, default=None,
                   help="draw only from the M tasks after --offset (default: all of them)")
    p.add_argument("--start", type=int, default=0,
                   help="the first conversation's number: a run cut short after N conversations continues with "
                        "--start N (the same users, tasks and sample keys as uncut) (default: 0)")
    p.add_argument("--token", default=os.environ.get("NANOCOMPOSER_TOKEN"),
                   help="bearer token of the server (default $NANOCOMPOSER_TOKEN: an environment variable, unlike "
                        "an argument, is not shown to other users by ps)")
    p.add_argument("--report", default=None, help="write the run's report (JSON) here")
    args = p.parse_args(argv)
    try:
        if args.sessions < 1:
            raise ValueError(f"--sessions {args.sessions}: must be at least 1")
        for flag, value in (("--seed", args.seed), ("--start", args.start)):
            if value is not None and value < 0:
                raise ValueError(f"{flag} {value}: must be >= 0")
        pop = load_population(args.recipe)
        pop = replace(pop, seed=pop.seed if args.seed is None else args.seed)
        task_set = resolve_task_set(args.tasks)
        tasks = draw_tasks(task_set.tasks, pop.seed, args.offset, args.task_limit)
    except (ValueError, TaskError) as e:
        print(f"env.users: error: {e}", file=sys.stderr)
        return 2
    sim, stopped_by = Simulation(args.server, tasks, pop, args.token), []
    for sig in (signal.SIGTERM, signal.SIGINT):  # a stop still writes the report of what was played
        signal.signal(sig, lambda signum, _: stopped_by.append(signum) or sim.stop())
    try:
        report = sim.run(args.sessions, start=args.start)
    except httpx.HTTPError as e:
        print(f"env.users: error: server {args.server}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    report["traffic"] = {"task_set": args.tasks, "seed": pop.seed, "offset": args.offset,
                         "task_limit": args.task_limit, "set_size": len(task_set.tasks),
                         "tasks": [t.id for t in tasks]}
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    hidden = ("accepted_ids", "latencies", "population", "conversation_tasks")
    summary = {k: v for k, v in report.items() if k not in hidden}
    print(json.dumps({**summary, "traffic": {k: v for k, v in report["traffic"].items() if k != "tasks"}}))
    return 128 + stopped_by[0] if stopped_by else 0  # the shell's status for a process its signal ended


if __name__ == "__main__":
    sys.exit(main())
