"""The episode loop: policy <-> tools, one loop for everything.

SFT trajectory generation, RL rollouts, eval and the self-hosted agent all play episodes through this
module (`run_episode` for one episode, `env.runner.run_tasks` for many at once), so the model sees the same
system prompt, tool schemas, parsing, tool-result formatting, truncation and budgets everywhere (the
original recipe trains the model in the same harness its users use).

    task -> fresh workspace -> [policy.act(messages, tools) -> parse -> run calls
    (parallel calls concurrently) -> tool messages]* -> exit status -> grade -> Trajectory

The loop is an object that can be stepped (`Episode`), so a driver can hold many episodes at once and
send all their pending turns to the model in one batch (`TurnRequest`, `act_batch`):

    episode = Episode(task, config, policy_name="oracle", episode_key="calc#0").start()
    while (request := episode.request()) is not None:       # None: the episode is over
        episode.step(policy.act(request.messages, request.tools))   # or the exception it raised
    trajectory = episode.finish()                             # grade, clean up

`run_episode` is exactly that driver for one episode. Exit statuses are named (mini-swe-agent style) and
become eval fields and W&B metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Protocol

import jinja2
import yaml

from env.budget import Budget, check_episode_budget
from env.grading import grade
from env.metrics import is_parallel_turn
from env.protocol import MalformedCall, ParsedTurn, ToolCall, parse_turn, utf8_clean
from env.sandbox import Limits, Sandbox
from env.tasks import Task
from env.tools import CodeTools, call_tool, iter_files, tool_schemas
from env.workspace import make_workspace, remove_workspace

PROMPTS_FILE = Path(__file__).with_name("prompts.yaml")
WRITING_TOOLS = {"edit_file"}  # calls that change files run sequentially within a turn
TOKEN_FIELDS = ("prompt_ids", "completion_ids", "logprobs")  # per turn; large, kept in records only on request


class ExitStatus(str, Enum):
    SUBMITTED = "submitted"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    TIMEOUT = "timeout"
    REPEATED_MALFORMED = "repeated_malformed"
    NO_TOOL_CALL = "no_tool_call"
    MAX_CONTEXT = "max_context"  # the conversation outgrew the model's context window
    POLICY_ERROR = "policy_error"  # the policy raised (e.g. a broken checkpoint or gold.patch); the message is kept
    INVALID_TASK = "invalid_task"  # the task directory could not be loaded (runner records only)
    HARNESS_ERROR = "harness_error"  # the harness itself failed on this episode (runner records only)


@dataclass
class Generation:
    """One assistant turn. Model policies fill the token fields (RL needs them exactly)."""

    text: str
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    truncated: bool = False  # generation stopped at its max_new_tokens, not at EOS
    # What the policy says about its own turn, kept in the turn record (e.g. the oracle marks a deliberate
    # near-miss edit as {"deliberate_mistake": True}, so the groundedness check and SFT filters know it).
    meta: dict | None = None
    # The count of completion tokens where there are no ids to count: a policy served by another process's
    # tokenizer (nanocomposer/openai_policy.py, from the response's `usage`); None with ids (they are counted).
    completion_tokens: int | None = None


# A turn's meta key naming where its tokens came from when they are not ours (an OpenAI-compatible endpoint):
# such a turn has no ids or logprobs of our model, so RL refuses it (`foreign_token_source`); SFT may use its text.
FOREIGN_TOKENS = "foreign_tokens"


def foreign_token_source(turns: list[dict]) -> tuple[int, str] | None:
    """(turn number, source) of the first turn whose tokens are not ours, or None."""
    for turn in turns:
        source = (turn.get("meta") or {}).get(FOREIGN_TOKENS)
        if source:
            return turn.get("turn", 0), str(source)
    return None


@dataclass
class TurnRequest:
    """The next generation an episode needs: what a batched policy's `act_batch` receives, one per episode."""

    messages: list[dict]
    tools: list[dict]
    episode_key: str  # unique per episode, e.g. f"{task.id}#{sample_seed}": sampling seeds derive from it
    turn: int  # 0-based turn index within the episode


class Policy(Protocol):
    """What writes the assistant turns. A policy may also implement
    `act_batch(requests: list[TurnRequest]) -> list[Generation | BaseException]` (one entry per request, in
    order; an exception object for a request that failed): such a policy keeps no per-episode state and is
    shared by every live episode of a runner."""

    name: str

    def reset(self, task: Task) -> None: ...

    def act(self, messages: list[dict], tools: list[dict]) -> Generation | str: ...


@dataclass
class EpisodeConfig:
    """The loop's budgets (defaults: env.budget.Budget, the one source of them) and hooks."""

    max_turns: int = Budget.max_turns
    max_tokens: int | None = Budget.max_tokens  # total completion tokens (known only for model policies)
    max_wall_s: float = Budget.max_wall_s
    max_malformed_turns: int = Budget.max_malformed_turns  # consecutive turns with malformed calls, no valid one
    max_output_chars: int = Budget.max_output_chars  # per tool result, head+tail kept with a note
    command_timeout_s: float = Budget.command_timeout_s
    sandbox_backend: str = "auto"
    prompts_file: str = str(PROMPTS_FILE)
    keep_workspace: bool = False
    # Self-summarisation hook (the original recipe has the agent compact its own long context): called before
    # each policy turn; returns the (possibly compacted) message list. Off by default.
    compactor: Callable[[list[dict]], list[dict]] | None = field(default=None, repr=False)
    # Who answers `ask_user` (a person at agent.py's terminal, a simulated user); None: the task's scripted answer.
    ask_user: Callable[[str], str] | None = field(default=None, repr=False)
    # Called with each turn's record as soon as its tool calls ran (live display, session logging).
    on_turn: Callable[[dict], None] | None = field(default=None, repr=False)

    def __post_init__(self):
        check_episode_budget(self, "EpisodeConfig")

    @classmethod
    def from_budget(cls, budget: Budget, **settings) -> EpisodeConfig:
        return cls(**budget.episode(), **settings)

    def budgets(self) -> dict:
        """The plain settings (no hooks), as results files record them."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.repr}


@dataclass
class Trajectory:
    task_id: str
    policy: str
    messages: list[dict]
    tools: list[dict]
    turns: list[dict]
    exit_status: str
    solved: bool = False
    submission: str = ""
    grade: dict = field(default_factory=dict)
    error: str = ""
    wall_s: float = 0.0
    gen_s: float = 0.0  # waiting for generations (with batching: including the wait for the batch)
    env_s: float = 0.0
    grade_s: float = 0.0
    command_s: float = 0.0  # inside sandboxed commands (tools and grading); the rest is harness overhead
    workspace: str = ""
    episode_key: str = ""

    @property
    def tool_calls(self) -> int:
        return sum(len(t["calls"]) for t in self.turns)

    @property
    def malformed_calls(self) -> int:
        return sum(c["malformed"] for t in self.turns for c in t["calls"])

    @property
    def parallel_turns(self) -> int:
        return sum(is_parallel_turn(t["calls"]) for t in self.turns)

    @property
    def completion_tokens(self) -> int | None:
        counts = [t["completion_tokens"] for t in self.turns]
        return None if not counts or None in counts else sum(counts)

    def to_record(self, token_ids: bool = False, **extra) -> dict:
        """The one episode record: what eval writes (one JSONL line), `replay:FILE` replays, SFT export and
        RL samples are made from, and env.metrics summarises.

        `turns` is the list of turn dicts (each with the assistant `text` and its `calls`), `n_turns` their
        count; `extra` (task_set, sample, seed, family, tier, ...) comes right after the identity. Per-turn
        token ids and logprobs are kept only with `token_ids=True` (RL): they are large.
        """
        turns = [t if token_ids else {k: v for k, v in t.items() if k not in TOKEN_FIELDS} for t in self.turns]
        return {"id": self.task_id, "policy": self.policy, "episode_key": self.episode_key, **extra,
                "solved": self.solved, "exit_status": self.exit_status, "error": self.error,
                "n_turns": len(self.turns), "tool_calls": self.tool_calls, "malformed_calls": self.malformed_calls,
                "parallel_turns": self.parallel_turns, "completion_tokens": self.completion_tokens,
                "wall_s": round(self.wall_s, 3), "gen_s": round(self.gen_s, 3), "env_s": round(self.env_s, 3),
                "grade_s": round(self.grade_s, 3), "command_s": round(self.command_s, 3),
                "submission": self.submission, "grade": self.grade, "turns": turns, "messages": self.messages,
                "tools": self.tools}

    @classmethod
    def from_record(cls, record: dict) -> Trajectory:
        """A Trajectory back from `to_record`'s dict (token fields are None where the record dropped them)."""
        turns = [{**{k: None for k in TOKEN_FIELDS}, **t} for t in record.get("turns") or []]
        return cls(record["id"], record.get("policy", ""), record.get("messages") or [], record.get("tools") or [],
                   turns, record["exit_status"], bool(record.get("solved")), record.get("submission", ""),
                   record.get("grade") or {}, record.get("error", ""), float(record.get("wall_s") or 0.0),
                   float(record.get("gen_s") or 0.0), float(record.get("env_s") or 0.0),
                   float(record.get("grade_s") or 0.0), float(record.get("command_s") or 0.0), "",
                   record.get("episode_key", ""))


def load_prompts(path: str | Path = PROMPTS_FILE) -> dict:
    spec = yaml.safe_load(Path(path).read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False)
    return {k: env.from_string(v) if k.endswith("_template") else v for k, v in spec.items()}


def initial_messages(task: Task, workspace: Path, prompts: dict) -> list[dict]:
    files = [p.relative_to(workspace).as_posix() for p in iter_files(workspace)]
    limit = prompts.get("max_listed_files", 40)
    if len(files) > limit:
        files = files[:limit] + [f"... and {len(files) - limit} more"]
    return [
        {"role": "system", "content": prompts["system_template"].render()},
        {"role": "user", "content": prompts["instance_template"].render(instruction=task.instruction, files=files)},
    ]


def _execute(tools: CodeTools, parsed: ParsedTurn, prompts: dict) -> list[tuple[dict, str]]:
    """Run the turn's calls (valid ones concurrently); results in the order the calls were written."""
    def one(call: ToolCall | MalformedCall) -> tuple[dict, str]:
        t0 = time.perf_counter()
        if isinstance(call, MalformedCall):
            result = prompts["format_error_template"].render(error=call.error)
            record = {"name": call.name, "arguments": None, "malformed": True, "error": call.error, "raw": call.raw}
        else:
            result = call_tool(tools, call.name, call.arguments)
            record = {"name": call.name, "arguments": call.arguments, "malformed": False,
                      "error": result[7:200] if result.startswith("Error: ") else None}
        record["wall_s"] = round(time.perf_counter() - t0, 4)
        return record, result

    if len(parsed.calls) == 1:
        return [one(parsed.calls[0])]
    # Edits run one after another in the order written (two edits of one file must not race,
    # and later edits may rely on earlier ones); every other call runs concurrently with them.
    edits = [i for i, c in enumerate(parsed.calls) if isinstance(c, ToolCall) and c.name in WRITING_TOOLS]
    others = [i for i in range(len(parsed.calls)) if i not in edits]
    with ThreadPoolExecutor(max_workers=len(others) + 1) as pool:
        concurrent = {i: pool.submit(one, parsed.calls[i]) for i in others}
        sequential = pool.submit(lambda: {i: one(parsed.calls[i]) for i in edits})
        results = {i: f.result() for i, f in concurrent.items()} | sequential.result()
    return [results[i] for i in range(len(parsed.calls))]


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class Episode:
    """One episode as a resumable object: `start`, then `request`/`step` until `request` is None, then `finish`.

    Not thread-safe by itself: a driver runs one method of an episode at a time (any thread). `close` (also
    run by `finish`) closes the sandbox and removes the workspace; it is idempotent and safe on a half-started
    episode, so every exit path can call it.
    """

    def __init__(self, task: Task, config: EpisodeConfig | None = None, policy_name: str = "policy",
                 episode_key: str | None = None):
        self.task = task
        self.config = config or EpisodeConfig()
        self.key = episode_key if episode_key is not None else task.id
        self.traj = Trajectory(task.id, policy_name, [], [], [], ExitStatus.MAX_TURNS.value, episode_key=self.key)
        self.status: ExitStatus | None = None  # set when the episode is over
        self.turn_index = 0
        self.malformed_streak = 0
        self.tokens = 0
        self.workspace: Path | None = None
        self.sandbox: Sandbox | None = None
        self.tools: CodeTools | None = None
        self._pending: TurnRequest | None = None
        self._t_request = 0.0
        self.t_start: float | None = None
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Episode:
        """Fresh workspace, sandbox, tools and the first two messages. Raises on harness failures
        (after cleaning up what it made)."""
        config = self.config
        self.prompts = load_prompts(config.prompts_file)
        self.t_start = time.perf_counter()
        # The wall budget also caps every sandboxed command (CodeTools.deadline, a time.monotonic() instant),
        # so one long command cannot carry an episode far past max_wall_s.
        deadline = time.monotonic() + config.max_wall_s
        try:
            self.workspace = make_workspace(self.task.repo_dir)
            self.traj.workspace = str(self.workspace)
            self.sandbox = Sandbox(self.workspace, backend=config.sandbox_backend, limits=Limits(),
                                   max_output_chars=config.max_output_chars)
            self.tools = CodeTools(self.workspace, self.task, sandbox=self.sandbox,
                                   max_output_chars=config.max_output_chars,
                                   command_timeout_s=config.command_timeout_s, ask_user=config.ask_user)
            self.tools.deadline = deadline
            schemas = tool_schemas(self.tools)
            self.by_name = {s["function"]["name"]: s["function"] for s in schemas}
            self.traj.tools = schemas
            self.traj.messages = initial_messages(self.task, self.workspace, self.prompts)
        except BaseException:
            self.close()
            raise
        return self

    def reset_policy(self, policy) -> bool:
        """`policy.reset(task)`; if it raises (a missing or hostile gold.patch, a broken checkpoint), the
        episode ends as policy_error with the reason. Returns whether the episode can go on."""
        try:
            policy.reset(self.task)
        except Exception as e:  # noqa: BLE001  (one bad task ends its episode, not the run)
            self.end(ExitStatus.POLICY_ERROR, error_text(e))
            return False
        return True

    def end(self, status: ExitStatus, error: str = "") -> None:
        """Stop the episode here with `status` (no more turns); `finish` still grades it."""
        if self.status is None:
            self.status = status
            if error:
                self.traj.error = error
            self._pending = None

    @property
    def done(self) -> bool:
        return self.status is not None

    # ------------------------------------------------------------------ turns
    def request(self) -> TurnRequest | None:
        """The next generation this episode needs, or None when it is over (budgets are checked here)."""
        if self.status is not None:
            return None
        if self._pending is not None:
            return self._pending
        if self.turn_index >= self.config.max_turns:
            self.end(ExitStatus.MAX_TURNS)
            return None
        if time.perf_counter() - self.t_start > self.config.max_wall_s:
            self.end(ExitStatus.TIMEOUT)
            return None
        messages = self.traj.messages
        if self.config.compactor is not None:
            messages[:] = self.config.compactor(messages)
        self._pending = TurnRequest(messages, self.traj.tools, self.key, self.turn_index)
        self._t_request = time.perf_counter()
        return self._pending

    def step(self, generation: Generation | str | BaseException) -> None:
        """Take the policy's answer to the pending request: parse it, run its calls, check the budgets.

        An exception (what the policy raised, or what `act_batch` returned for this request) ends the
        episode: `policy_error`, or the status its `exit_status` attribute names (ContextOverflow:
        max_context; matched by attribute so env/ needs no torch import).
        """
        if self._pending is None:
            raise RuntimeError(f"episode {self.key}: step() without a pending request()")
        self._pending = None
        traj, config = self.traj, self.config
        gen_s = time.perf_counter() - self._t_request
        traj.gen_s += gen_s
        if isinstance(generation, BaseException):
            self.end(ExitStatus(getattr(generation, "exit_status", ExitStatus.POLICY_ERROR.value)),
                     error_text(generation))
            return
        gen = Generation(generation) if isinstance(generation, str) else generation
        gen.text = utf8_clean(gen.text)  # a lone surrogate from a scripted policy would break every JSON writer
        parsed = parse_turn(gen.text, self.by_name)
        traj.messages.append({"role": "assistant", "content": gen.text})
        t0 = time.perf_counter()
        executed = _execute(self.tools, parsed, self.prompts) if parsed.calls else []
        env_s = time.perf_counter() - t0
        traj.env_s += env_s
        for record, result in executed:
            traj.messages.append({"role": "tool", "name": record["name"] or "invalid", "content": result})
        n_tokens = len(gen.completion_ids) if gen.completion_ids is not None else gen.completion_tokens
        traj.turns.append({"turn": self.turn_index, "text": gen.text, "calls": [r for r, _ in executed],
                           "gen_s": round(gen_s, 4), "env_s": round(env_s, 4),
                           "completion_tokens": n_tokens, "truncated": gen.truncated,
                           "prompt_ids": gen.prompt_ids, "completion_ids": gen.completion_ids,
                           "logprobs": gen.logprobs} | ({"meta": gen.meta} if gen.meta else {}))
        self.turn_index += 1
        if config.on_turn is not None:
            config.on_turn(traj.turns[-1])
        if self.tools.submitted:
            self.end(ExitStatus.SUBMITTED)
            return
        if not parsed.calls:
            self.end(ExitStatus.NO_TOOL_CALL)
            return
        self.malformed_streak = self.malformed_streak + 1 if not parsed.valid_calls else 0
        if self.malformed_streak >= config.max_malformed_turns:
            self.end(ExitStatus.REPEATED_MALFORMED)
            return
        self.tokens += n_tokens or 0
        if config.max_tokens is not None and self.tokens >= config.max_tokens:
            self.end(ExitStatus.MAX_TOKENS)

    # ------------------------------------------------------------------ the end
    def finish(self) -> Trajectory:
        """Grade the workspace as it stands, clean up (always), and return the trajectory."""
        traj = self.traj
        try:
            if self.tools is None:
                raise RuntimeError(f"episode {self.key}: finish() before start()")
            self.end(ExitStatus.MAX_TURNS)  # a driver that stops early; no-op when the episode ended itself
            traj.exit_status = self.status.value
            traj.submission = self.tools.submission
            t0 = time.perf_counter()
            result = grade(self.task, self.workspace, self.tools.submission)
            traj.grade_s = time.perf_counter() - t0
            traj.command_s = self.tools.command_s + result.command_s
            traj.solved = result.solved
            traj.grade = {"solved": result.solved, "returncode": result.returncode, "timed_out": result.timed_out,
                          "passed": result.passed, "failed": result.failed, "pass_fraction": result.pass_fraction,
                          "output": result.output[-2000:]}
        finally:
            self.close()
        return traj

    def close(self) -> None:
        """Close the sandbox (killing what still runs) and remove the workspace unless kept. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.sandbox is not None:
                self.sandbox.close()
        finally:
            if self.workspace is not None and not self.config.keep_workspace:
                remove_workspace(self.workspace)
            if self.t_start is not None:
                self.traj.wall_s = time.perf_counter() - self.t_start


def run_episode(task: Task, policy: Policy, config: EpisodeConfig | None = None,
                episode_key: str | None = None) -> Trajectory:
    """Play one episode of `task` with `policy` (the `Episode` driver for one episode).

    A policy that raises, in `reset` or in `act`, ends the episode as policy_error (or the exit its exception
    names) with the reason in `error`; harness failures propagate, after the workspace is cleaned up.
    """
    episode = Episode(task, config, getattr(policy, "name", type(policy).__name__), episode_key).start()
    try:
        if episode.reset_policy(policy):
            while (request := episode.request()) is not None:
                try:
                    generation = policy.act(request.messages, request.tools)
                except Exception as e:  # noqa: BLE001  (a broken policy ends its episode, not the run)
                    generation = e
                episode.step(generation)
    except BaseException:
        episode.close()
        raise
    return episode.finish()
