"""The episode loop: policy <-> tools, one loop for everything.

SFT trajectory generation, RL rollouts, eval and the self-hosted agent all call
`run_episode`, so the model sees the same system prompt, tool schemas, parsing,
tool-result formatting, truncation and budgets everywhere (recipe section 2:
"train in the same harness the users use").

    task -> fresh workspace -> [policy.act(messages, tools) -> parse -> run calls
    (parallel calls concurrently) -> tool messages]* -> exit status -> grade -> Trajectory

Exit statuses are named (mini-swe-agent style) and become eval fields and W&B metrics.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Protocol

import jinja2
import yaml

from env.protocol import MalformedCall, ParsedTurn, ToolCall, parse_turn
from env.sandbox import Limits, Sandbox
from env.tasks import Task, grade
from env.tools import CodeTools, call_tool, iter_files, tool_schemas
from env.workspace import make_workspace, remove_workspace

PROMPTS_FILE = Path(__file__).with_name("prompts.yaml")
WRITING_TOOLS = {"edit_file"}  # calls that change files run sequentially within a turn


class ExitStatus(str, Enum):
    SUBMITTED = "submitted"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    TIMEOUT = "timeout"
    REPEATED_MALFORMED = "repeated_malformed"
    NO_TOOL_CALL = "no_tool_call"
    MAX_CONTEXT = "max_context"  # the conversation outgrew the model's context window
    POLICY_ERROR = "policy_error"  # the policy raised (e.g. a broken checkpoint); the message is kept


@dataclass
class Generation:
    """One assistant turn. Model policies fill the token fields (RL needs them exactly)."""

    text: str
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    truncated: bool = False  # generation stopped at its max_new_tokens, not at EOS


class Policy(Protocol):
    name: str

    def reset(self, task: Task) -> None: ...

    def act(self, messages: list[dict], tools: list[dict]) -> Generation | str: ...


@dataclass
class EpisodeConfig:
    max_turns: int = 20
    max_tokens: int | None = None  # total completion tokens (known only for model policies)
    max_wall_s: float = 600.0
    max_malformed_turns: int = 3  # consecutive turns with malformed calls and no valid one
    max_output_chars: int = 2000  # per tool result, head+tail kept with a note (fits a small context)
    command_timeout_s: float = 30.0
    sandbox_backend: str = "auto"
    prompts_file: str = str(PROMPTS_FILE)
    keep_workspace: bool = False
    # Self-summarisation hook (recipe section 4): called before each policy turn; returns the
    # (possibly compacted) message list. Off by default.
    compactor: Callable[[list[dict]], list[dict]] | None = field(default=None, repr=False)
    # Who answers `ask_user` (a person at agent.py's terminal, a simulated user); None: the task's scripted answer.
    ask_user: Callable[[str], str] | None = field(default=None, repr=False)
    # Called with each turn's record as soon as its tool calls ran (live display, session logging).
    on_turn: Callable[[dict], None] | None = field(default=None, repr=False)


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
    gen_s: float = 0.0
    env_s: float = 0.0
    grade_s: float = 0.0
    command_s: float = 0.0  # inside sandboxed commands (tools and grading); the rest is harness overhead
    workspace: str = ""

    @property
    def tool_calls(self) -> int:
        return sum(len(t["calls"]) for t in self.turns)

    @property
    def malformed_calls(self) -> int:
        return sum(c["malformed"] for t in self.turns for c in t["calls"])

    @property
    def parallel_turns(self) -> int:
        return sum(sum(not c["malformed"] for c in t["calls"]) > 1 for t in self.turns)

    @property
    def completion_tokens(self) -> int | None:
        counts = [t["completion_tokens"] for t in self.turns]
        return None if not counts or None in counts else sum(counts)

    def summary(self) -> dict:
        return {"id": self.task_id, "solved": self.solved, "exit_status": self.exit_status,
                "turns": len(self.turns), "tool_calls": self.tool_calls,
                "malformed_calls": self.malformed_calls, "parallel_turns": self.parallel_turns,
                "completion_tokens": self.completion_tokens, "wall_s": round(self.wall_s, 3)}

    def to_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary()}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False))


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


def run_episode(task: Task, policy: Policy, config: EpisodeConfig | None = None) -> Trajectory:
    config = config or EpisodeConfig()
    prompts = load_prompts(config.prompts_file)
    t_start = time.perf_counter()
    workspace = make_workspace(task.repo_dir)
    sandbox = Sandbox(workspace, backend=config.sandbox_backend, limits=Limits(),
                      max_output_chars=config.max_output_chars)
    tools = CodeTools(workspace, task, sandbox=sandbox, max_output_chars=config.max_output_chars,
                      command_timeout_s=config.command_timeout_s, ask_user=config.ask_user)
    schemas = tool_schemas(tools)
    by_name = {s["function"]["name"]: s["function"] for s in schemas}
    messages = initial_messages(task, workspace, prompts)
    traj = Trajectory(task.id, getattr(policy, "name", type(policy).__name__), messages, schemas, [],
                      ExitStatus.MAX_TURNS.value, workspace=str(workspace))
    status, malformed_streak, tokens = ExitStatus.MAX_TURNS, 0, 0
    try:
        policy.reset(task)
        for turn_index in range(config.max_turns):
            if time.perf_counter() - t_start > config.max_wall_s:
                status = ExitStatus.TIMEOUT
                break
            if config.compactor is not None:
                messages[:] = config.compactor(messages)
            t0 = time.perf_counter()
            try:
                gen = policy.act(messages, schemas)
            except Exception as e:  # noqa: BLE001  (a broken policy ends its episode, not the run)
                traj.error = f"{type(e).__name__}: {e}"
                # matched by attribute, so env/ needs no torch import (nanocomposer.policy.ContextOverflow)
                status = ExitStatus(getattr(e, "exit_status", ExitStatus.POLICY_ERROR.value))
                break
            gen = Generation(gen) if isinstance(gen, str) else gen
            gen_s = time.perf_counter() - t0
            traj.gen_s += gen_s
            parsed = parse_turn(gen.text, by_name)
            messages.append({"role": "assistant", "content": gen.text})
            t0 = time.perf_counter()
            executed = _execute(tools, parsed, prompts) if parsed.calls else []
            env_s = time.perf_counter() - t0
            traj.env_s += env_s
            for record, result in executed:
                messages.append({"role": "tool", "name": record["name"] or "invalid", "content": result})
            n_tokens = len(gen.completion_ids) if gen.completion_ids is not None else None
            traj.turns.append({"turn": turn_index, "text": gen.text, "calls": [r for r, _ in executed],
                               "gen_s": round(gen_s, 4), "env_s": round(env_s, 4),
                               "completion_tokens": n_tokens, "truncated": gen.truncated,
                               "prompt_ids": gen.prompt_ids, "completion_ids": gen.completion_ids,
                               "logprobs": gen.logprobs})
            if config.on_turn is not None:
                config.on_turn(traj.turns[-1])
            if tools.submitted:
                status = ExitStatus.SUBMITTED
                break
            if not parsed.calls:
                status = ExitStatus.NO_TOOL_CALL
                break
            malformed_streak = malformed_streak + 1 if not parsed.valid_calls else 0
            if malformed_streak >= config.max_malformed_turns:
                status = ExitStatus.REPEATED_MALFORMED
                break
            tokens += n_tokens or 0
            if config.max_tokens is not None and tokens >= config.max_tokens:
                status = ExitStatus.MAX_TOKENS
                break
        traj.exit_status = status.value
        traj.submission = tools.submission
        t0 = time.perf_counter()
        result = grade(task, workspace, tools.submission)
        traj.grade_s = time.perf_counter() - t0
        traj.command_s = tools.command_s + result.command_s
        traj.solved = result.solved
        traj.grade = {"solved": result.solved, "returncode": result.returncode, "timed_out": result.timed_out,
                      "passed": result.passed, "failed": result.failed, "pass_fraction": result.pass_fraction,
                      "output": result.output[-2000:]}
    finally:
        sandbox.close()
        if not config.keep_workspace:
            remove_workspace(workspace)
        traj.wall_s = time.perf_counter() - t_start
    return traj
