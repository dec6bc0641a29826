"""The agent server's orchestration: a bounded queue, N worker threads, ask_user round trips, long-poll waits.

Each worker takes the next queued session, reads the registry's current version (so a promotion takes effect
at the next session, with no restart), stages the session's repository or task directory and runs one harness
episode on its own workspace and sandbox. Turns are written to the store as they finish; the end (status,
trajectory, diff) is one transaction. A session whose episode asks the user waits (`waiting`) until
`answer()` delivers a reply or its answer timeout passes (then the scripted "no information" answer), and
continues on the same worker.

A checkpoint version is loaded once for the whole server, as a `SharedPolicy`: every worker's turns go to one
generation thread that decodes them together (continuous batching, as the eval runner does), so N concurrent
sessions cost one model in memory and batched decode steps rather than N models generating alone. A promoted
version's policy is built at its first session; the previous one is closed when its last session ends.
Scripted policies (noop, oracle, replay) are per worker, as they keep per-episode state.

Sampling is reproducible per session: a checkpoint policy samples each turn with a seed derived from the
server's sampling seed (`ServerConfig.sampling["seed"]`, `agent.py serve --seed`), the session's sample key and
the turn (nanocomposer/policy.py), whichever worker runs it and whatever it ran before. The sample key is the
client's `sample_key` (a simulated user sends one per conversation, so a replayed population replays its
samples), else the session id (every session its own draw); a follow-up's is its parent's plus
`/followup<n>`. Same seed, same key, same model and conversation: the same tokens (up to floating point:
batched and GPU numerics).

Requests are checked here as well as in the API (a direct caller gets the same refusals): numbers finite and
positive, strings within their limits, paths free of NUL and readable. A session submitted for a local user
other than the server's (`owner_uid`, known from the connection's peer credentials: api.py) must name a
repository or task directory that user could read itself (`peer_can_read`, every entry), checked at submit
and again just before staging, so the server never copies for one user what only another may read.

Over 500 lines because: SessionManager (~340 lines) holds the queue, the workers, the ask_user round trips
and the long-poll waits under one condition variable; split, that lock's invariants would span modules.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import pwd
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from env.budget import Budget
from env.episode import EpisodeConfig, ExitStatus
from env.tasks import TaskError, load_task
from env.tools import NO_INFORMATION
from env.workspace import DEFAULT_STAGE_MAX_FILES
from nanocomposer.agent.episodes import run_session, stage_repo, stage_task_dir
from nanocomposer.agent.registry import Registry
from nanocomposer.agent.store import TERMINAL, SessionStore
from nanocomposer.policies import build_policy, is_scripted, seed_policy
from nanocomposer.shared_policy import SharedPolicy

# How long a stop waits for running sessions to end their episodes and remove their workspaces; whatever is
# left after it (a long test command) the next server's sweeps remove. Under the 30 s that the real-time loop
# and the tests give a SIGTERMed server before SIGKILL.
STOP_WAIT_S = 20.0


class QueueFull(Exception):
    pass


class BadRequest(ValueError):
    pass


class TooLarge(BadRequest):
    """A request over a documented size limit (HTTP 413)."""


class Forbidden(BadRequest):
    """The requesting local user may not have this done for them (HTTP 403)."""


MAX_INSTRUCTION_CHARS = 64 * 1024  # a client's instruction; a follow-up's combined instruction: MAX_CONVERSATION
MAX_CONVERSATION_CHARS = 4 * MAX_INSTRUCTION_CHARS
MAX_TEST_COMMAND_CHARS = 8 * 1024
MAX_PATH_CHARS = 4096
MAX_READ_CHECK_ENTRIES = DEFAULT_STAGE_MAX_FILES + 1  # more cannot be staged anyway: refused, not walked further


def peer_groups(uid: int, gid: int | None = None) -> list[int]:
    """The groups a local user has: its primary group (the connection's when known) and /etc/group's."""
    groups = set() if gid is None else {gid}
    try:
        entry = pwd.getpwuid(uid)
        groups |= {entry.pw_gid, *os.getgrouplist(entry.pw_name, entry.pw_gid)}
    except (KeyError, OSError):
        pass
    return sorted(groups)


def _allowed(st: os.stat_result, uid: int, gids: list[int], want: int) -> bool:
    """Permission bits `want` (4 read, 2 write, 1 search/execute) for uid/gids, as the kernel decides (no ACLs)."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        bits = st.st_mode >> 6
    elif st.st_gid in gids:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & want == want


def peer_can_read(path: str | Path, uid: int, gids: list[int]) -> str | None:
    """None when local user `uid` (groups `gids`) could read all of `path` itself: every directory above it
    searchable, and every entry under it readable (directories also searchable). A symlink's target is checked
    the same way (staging copies links as links, but a task's repo/ may be one; and a check that followed
    nothing would trust whatever a link reaches). Otherwise the reason, naming the first entry it could not
    read."""
    if uid == 0:
        return None
    try:
        real = Path(os.path.realpath(path))
        seen, visited = 0, set()
        stack = [real]
        while stack:
            current = stack.pop()
            if current in visited:
                continue
            visited.add(current)
            if current == real or current.parent not in visited:  # a new root: its ancestors too
                for parent in reversed(current.parents):
                    if not _allowed(os.stat(parent), uid, gids, 1):
                        return f"uid {uid} cannot search {str(parent)!r}"
            st = os.lstat(current)
            seen += 1
            if seen > MAX_READ_CHECK_ENTRIES:
                return f"{str(real)!r} has more than {MAX_READ_CHECK_ENTRIES} entries"
            if stat.S_ISLNK(st.st_mode):
                target = Path(os.path.realpath(current))
                if target.exists():
                    stack.append(target)
                continue
            if stat.S_ISDIR(st.st_mode):
                if not _allowed(st, uid, gids, 5):
                    return f"uid {uid} cannot read the directory {str(current)!r}"
                with os.scandir(current) as entries:
                    stack.extend(Path(e.path) for e in entries)
            elif not _allowed(st, uid, gids, 4):
                return f"uid {uid} cannot read {str(current)!r}"
    except OSError as e:
        return f"cannot check {str(path)!r}: {e.strerror or e}"
    return None


def _check_text(name: str, value: str | None, limit: int, *, path: bool = False) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    if len(value) > limit:
        raise TooLarge(f"{name} is {len(value)} characters; at most {limit} are accepted")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise BadRequest(f"{name} contains a lone surrogate (not valid Unicode)")
    if (path or name == "test_command") and "\x00" in value:
        raise BadRequest(f"{name} contains a NUL character")


@dataclass
class ServerConfig:
    """The server's settings; its sessions' episode budget is env.budget.Budget's fields (`from_budget`), with the
    wall clock as session_timeout_s (a request may ask for less)."""

    workers: int = 4
    max_queue: int = 64  # sessions waiting for a worker; one more is refused (HTTP 429)
    session_timeout_s: float = Budget.max_wall_s  # the episode's wall-clock budget; longer requests are capped to it
    answer_timeout_s: float = 120.0  # how long a session waits for an ask_user answer
    max_turns: int = Budget.max_turns
    max_tokens: int | None = Budget.max_tokens
    max_malformed_turns: int = Budget.max_malformed_turns
    max_output_chars: int = Budget.max_output_chars
    command_timeout_s: float = Budget.command_timeout_s
    sampling: dict = field(default_factory=dict)  # env.budget.Budget.sampling() keys (max_new_tokens, seed, ...)
    backend: str = "auto"

    @classmethod
    def from_budget(cls, budget: Budget, **settings) -> ServerConfig:
        """Sessions played under all of `budget` (its episode budget and its sampling); `settings`: the rest."""
        episode = budget.episode()
        return cls(session_timeout_s=episode.pop("max_wall_s"), **episode, sampling=budget.sampling(), **settings)

    def episode(self, max_wall_s: float) -> dict:
        """Keyword arguments of env.episode.EpisodeConfig for a session allowed `max_wall_s`."""
        return {"max_turns": self.max_turns, "max_tokens": self.max_tokens, "max_wall_s": max_wall_s,
                "max_malformed_turns": self.max_malformed_turns, "max_output_chars": self.max_output_chars,
                "command_timeout_s": self.command_timeout_s}


class SessionManager:
    def __init__(self, store: SessionStore, registry: Registry, config: ServerConfig | None = None):
        self.store, self.registry, self.config = store, registry, config or ServerConfig()
        self._cond = threading.Condition()  # guards everything below
        self._queue: collections.deque[str] = collections.deque()
        self._changes: collections.Counter[str] = collections.Counter()  # bumped on every change of a session
        self._answers: dict[str, str | None] = {}  # sessions waiting on ask_user -> the answer, once given
        self._running: set[str] = set()
        self._stopping = False
        self._draining = False  # the HTTP server is shutting down: long-polls answer now
        self._threads: list[threading.Thread] = []
        self.resumed: list[str] = []
        self._load_lock = threading.Lock()  # one checkpoint load at a time (two workers asking for a new version)
        self._shared: dict[str, list] = {}  # version -> [SharedPolicy, sessions using it]; guarded by _cond
        # long-polls waiting in the event loop: session -> {(loop, asyncio.Event)}, set from any thread
        self._async_waiters: dict[str, set] = collections.defaultdict(set)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.resumed = self.store.recover()  # a dead server's running sessions -> interrupted; queued resume
        with self._cond:
            self._queue.extend(self.resumed)
        for i in range(self.config.workers):
            thread = threading.Thread(target=self._worker, name=f"agent-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Graceful stop: queued sessions stay queued (the next server runs them); running ones are interrupted:
        marked so, then their episodes end at their next turn (a waiting one gets no answer) and remove their
        workspaces, which the workers are given STOP_WAIT_S to do."""
        with self._cond:
            self._stopping = True
            running = list(self._running)
            self._cond.notify_all()
            self._wake_all()
        for session_id in running:
            self.store.finish(session_id, "interrupted", None, None, None,
                              reason="the server shut down while this session was running")
        with self._cond:
            shared, self._shared = [policy for policy, _ in self._shared.values()], {}
        for policy in shared:
            policy.close()  # a turn being generated fails, so its episode ends now
        deadline = time.monotonic() + STOP_WAIT_S
        for thread in self._threads:
            if thread is not threading.current_thread():  # a stop called from a worker (tests do)
                thread.join(max(0.0, deadline - time.monotonic()))

    def health(self) -> dict:
        with self._cond:
            queued, running, waiting = len(self._queue), len(self._running), len(self._answers)
        try:
            version, problem = self.registry.current(), None
        except ValueError as e:  # RegistryError: an unreadable `current`; sessions fail until it is fixed
            version, problem = None, str(e)
        return {"ok": problem is None, "workers": sum(t.is_alive() for t in self._threads), "queued": queued,
                "running": running, "waiting_for_user": waiting, "model_version": version,
                **({"problem": problem} if problem else {})}

    # ------------------------------------------------------------- requests
    def submit(self, *, instruction: str | None = None, repo: str | None = None, task_dir: str | None = None,
               test_command: str | None = None, timeout_s: float | None = None, client: str | None = None,
               parent_id: str | None = None, sample_key: str | None = None, owner_uid: int | None = None,
               owner_gids: list[int] | None = None, followup_text: str | None = None) -> str:
        """Queue a session; BadRequest for unusable input (TooLarge past a size limit, Forbidden when
        `owner_uid` could not read the repository itself), QueueFull when the queue is at its limit."""
        if (repo is None) == (task_dir is None):
            raise BadRequest("give exactly one of 'repo' (a repository directory) or 'task_dir' (a task directory)")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not math.isfinite(timeout_s) or timeout_s <= 0):
            raise BadRequest(f"timeout_s must be a positive finite number of seconds, got {timeout_s!r}")
        if sample_key is not None and (not isinstance(sample_key, str) or not sample_key.strip()):
            raise BadRequest("sample_key must be a non-empty string (or left out: the session id is used)")
        _check_text("instruction", instruction,
                    MAX_CONVERSATION_CHARS if followup_text is not None else MAX_INSTRUCTION_CHARS)
        _check_text("test_command", test_command, MAX_TEST_COMMAND_CHARS)
        _check_text("repo", repo, MAX_PATH_CHARS, path=True)
        _check_text("task_dir", task_dir, MAX_PATH_CHARS, path=True)
        _check_text("client", client, 200)
        _check_text("sample_key", sample_key, 1000)
        timeout_s = min(timeout_s or self.config.session_timeout_s, self.config.session_timeout_s)
        task_id = None
        if owner_uid is not None:
            owner_gids = peer_groups(owner_uid) if owner_gids is None else owner_gids
            problem = peer_can_read(repo if repo is not None else task_dir, owner_uid, owner_gids)
            if problem is not None:
                raise Forbidden(f"refused: this server acts for uid {os.getuid()} and will not read for uid "
                                f"{owner_uid} what it could not read itself ({problem})")
        if repo is not None:
            try:
                is_dir = Path(repo).is_dir()
                resolved = str(Path(repo).resolve())
            except (OSError, RuntimeError, ValueError):
                is_dir = False
            if not is_dir:
                raise BadRequest(f"repo {repo!r} is not a directory on the server's machine")
            if not (instruction or "").strip():
                raise BadRequest("a repo session needs a non-empty 'instruction'")
            repo = resolved
        else:
            try:
                task = load_task(task_dir)
            except TaskError as e:
                raise BadRequest(str(e)) from None
            except Exception as e:  # noqa: BLE001  (the client's directory, whatever is wrong in it, is its error)
                raise BadRequest(f"task_dir {task_dir!r}: cannot load it ({type(e).__name__}: {e})") from None
            task_dir, task_id, instruction = str(task.root), task.id, instruction or task.instruction
            test_command = test_command or task.test_command
        with self._cond:
            if len(self._queue) >= self.config.max_queue:
                raise QueueFull(f"the queue is full ({len(self._queue)} sessions waiting for "
                                f"{self.config.workers} workers); retry later")
            session_id = self.store.create(source="repo" if repo else "task_dir", instruction=instruction, repo=repo,
                                           task_dir=task_dir, task_id=task_id, test_command=test_command,
                                           timeout_s=timeout_s, client=client, parent_id=parent_id,
                                           sample_key=sample_key, owner_uid=owner_uid, owner_gids=owner_gids,
                                           followup_text=followup_text)
            self._queue.append(session_id)
            self._cond.notify_all()
        return session_id

    def answer(self, session_id: str, text: str) -> bool:
        """Deliver an ask_user answer; False when the session is not waiting for one."""
        with self._cond:
            if session_id not in self._answers or self._answers[session_id] is not None:
                return False
            self._answers[session_id] = text
            self._cond.notify_all()
            return True

    def followup(self, session_id: str, text: str, client: str | None = None, owner_uid: int | None = None,
                 owner_gids: list[int] | None = None) -> str:
        """A new session on the same repository or task: the instruction plus what the user says now. Its sample
        key, `<parent key>/followup<n>`, is allocated with the message in one transaction (store.create), so
        concurrent follow-ups of one session get distinct keys."""
        parent = self.store.session(session_id)
        if parent is None:
            raise BadRequest(f"no session {session_id!r}")
        _check_text("text", text, MAX_INSTRUCTION_CHARS)
        instruction = f"{parent['instruction']}\n\nFollow-up from the user on the previous attempt: {text}"
        if len(instruction) > MAX_CONVERSATION_CHARS:
            raise TooLarge(f"the conversation would be {len(instruction)} characters; at most "
                           f"{MAX_CONVERSATION_CHARS} are accepted: start a new session")
        return self.submit(instruction=instruction, repo=parent["repo"], task_dir=parent["task_dir"],
                           test_command=parent["test_command"] if parent["source"] == "repo" else None,
                           timeout_s=parent["timeout_s"], client=client or parent["client"], parent_id=session_id,
                           owner_uid=owner_uid if owner_uid is not None else parent.get("owner_uid"),
                           owner_gids=owner_gids if owner_uid is not None else parent.get("owner_gids"),
                           followup_text=text)

    def change_count(self, session_id: str) -> int:
        with self._cond:
            return self._changes[session_id]

    def wait_for_change(self, session_id: str, seen: int, timeout_s: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._changes[session_id] != seen or self._stopping, timeout=timeout_s)

    async def wait_for_change_async(self, session_id: str, seen: int, timeout_s: float) -> None:
        """`wait_for_change` for the event loop: holds no thread while it waits (a long-poll is a task, not a
        worker), woken by the session's next change (or a stop), or returning after timeout_s."""
        if timeout_s <= 0:
            return
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._cond:
            if self._changes[session_id] != seen or self._stopping or self._draining:
                return
            self._async_waiters[session_id].add(waiter)
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            with self._cond:
                waiters = self._async_waiters.get(session_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._async_waiters[session_id]

    @property
    def draining(self) -> bool:
        return self._draining or self._stopping

    def drain(self) -> None:
        """The HTTP server is stopping: every long-poll answers with what it has now (so the shutdown does not
        wait up to MAX_WAIT_S for them); later ones do not wait."""
        with self._cond:
            self._draining = True
            self._wake_all()

    def _wake(self, session_id: str) -> None:  # with self._cond held
        for loop, event in self._async_waiters.get(session_id, ()):
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed: its waiter went with it
                pass

    def _wake_all(self) -> None:  # with self._cond held
        for session_id in list(self._async_waiters):
            self._wake(session_id)

    def _bump(self, session_id: str) -> None:
        with self._cond:
            self._changes[session_id] += 1
            self._cond.notify_all()
            self._wake(session_id)

    # --------------------------------------------------------------- workers
    def _worker(self) -> None:
        policies: dict[str, object] = {}  # version -> policy (only the latest is kept)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                if self._stopping:
                    return
                session_id = self._queue.popleft()
                self._running.add(session_id)
            try:
                self._run(session_id, policies)
            except Exception as e:  # noqa: BLE001  (a broken session fails alone; the worker lives on)
                if not self._stopping:
                    self.store.finish(session_id, "failed", None, None, None, reason=f"{type(e).__name__}: {e}")
            finally:
                with self._cond:
                    self._running.discard(session_id)
                self._bump(session_id)

    def _policy(self, policies: dict, version: str):
        """(policy for a session of `version`, the shared one's version or None): scripted specs per worker,
        checkpoints shared by every worker (`_release` when the session ends)."""
        spec = self.registry.spec(version)
        if is_scripted(spec):
            if version not in policies:
                policies.clear()
                policies[version] = self._build(spec)
            return policies[version], None
        with self._load_lock:
            with self._cond:
                entry = self._shared.get(version)
                if entry is not None:
                    entry[1] += 1
                    return entry[0], version
            shared = SharedPolicy(self._build(spec))  # a failed load raises here: this session fails alone
            with self._cond:
                if self._stopping:
                    shared.close()
                    raise RuntimeError("the server is shutting down")
                self._shared[version] = [shared, 1]
                # an earlier version nobody runs any more (its last session ended before this promotion)
                idle = [v for v, (_, users) in self._shared.items() if users == 0 and v != version]
                unused = [self._shared.pop(v)[0] for v in idle]
        for policy in unused:
            policy.close()
        return shared, version

    def _build(self, spec: str):
        policy = build_policy(spec, self.config.sampling, self.config.backend)
        seed_policy(policy, int(self.config.sampling.get("seed") or 0))  # build_policy leaves the seed out
        return policy

    def _release(self, version: str) -> None:
        """A session of shared `version` ended: close its policy if no session uses it and it is not current."""
        try:
            current = self.registry.current()
        except Exception:  # noqa: BLE001  (an unreadable registry: the next session reloads what it needs)
            current = None
        with self._cond:
            entry = self._shared.get(version)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0 or version == current:
                return
            del self._shared[version]
        entry[0].close()

    def _run(self, session_id: str, policies: dict) -> None:
        s = self.store.session(session_id)
        if s is None or s["status"] in TERMINAL:
            return
        version = self.registry.current()
        if version is None:
            raise RuntimeError(f"registry {str(self.registry.root)!r} has no current version")
        policy, shared = self._policy(policies, version)
        try:
            self._play(session_id, s, version, policy)
        finally:
            if shared is not None:
                self._release(shared)

    def _play(self, session_id: str, s: dict, version: str, policy) -> None:
        if s.get("owner_uid") is not None:  # checked at submit; again now, just before the copy
            source = s["repo"] if s["source"] == "repo" else s["task_dir"]
            problem = peer_can_read(source, s["owner_uid"], s.get("owner_gids") or peer_groups(s["owner_uid"]))
            if problem is not None:
                raise PermissionError(f"refused for uid {s['owner_uid']}: {problem}")
        if s["source"] == "repo":
            task = stage_repo(Path(s["repo"]), s["instruction"], s["test_command"])
        else:
            task = stage_task_dir(load_task(s["task_dir"]), s["instruction"])
        self.store.start(session_id, version, getattr(policy, "name", type(policy).__name__))
        self._bump(session_id)
        deadline = time.monotonic() + s["timeout_s"]
        config = EpisodeConfig(**self.config.episode(s["timeout_s"]),
                               ask_user=lambda question: self._ask(session_id, question, deadline))

        def on_turn(record: dict, results: list[str]) -> None:
            self.store.add_turn(session_id, record, results)
            self._bump(session_id)

        result = run_session(task, policy, config, on_turn=on_turn, episode_key=s["sample_key"] or session_id,
                             stopped=lambda: self._stopping)
        try:
            timed_out = result.trajectory.exit_status == ExitStatus.TIMEOUT.value
            reason = f"the session exceeded its time limit of {s['timeout_s']:g} s" if timed_out else None
            if not self._stopping:
                self.store.finish(session_id, "timed_out" if timed_out else "finished", result.trajectory,
                                  result.diff, len(result.changes), reason)
        finally:
            result.cleanup()

    def _ask(self, session_id: str, question: str, deadline: float) -> str:
        """Block this session's worker until the user answers or the answer timeout (or session time) passes."""
        self.store.add_message(session_id, "question", question)
        self.store.set_status(session_id, "waiting", reason=None)
        with self._cond:
            self._answers[session_id] = None
            self._changes[session_id] += 1
            self._cond.notify_all()
            self._wake(session_id)
            limit = max(0.0, min(self.config.answer_timeout_s, deadline - time.monotonic()))
            self._cond.wait_for(lambda: self._answers[session_id] is not None or self._stopping, timeout=limit)
            answer = self._answers.pop(session_id)
        kind = "answer" if answer is not None else "answer_timeout"
        answer = answer if answer is not None else NO_INFORMATION
        self.store.add_message(session_id, kind, answer)
        self.store.set_status(session_id, "running")
        self._bump(session_id)
        return answer
