"""Is an expert trajectory fair? Every argument must come from what the agent could see at that turn.

SFT data teaches a model to imitate the expert's calls. If the expert emits a name, a line range
or a piece of code that was nowhere in its context (it read them from the gold patch), the model
learns to produce such things from memory, which it cannot do on a new task. This checker replays
a trajectory and, for each call, asks whether its arguments are derivable from the context before
that turn: the user message (instruction + file list) and earlier tool results. Earlier assistant
turns do not count: a name the expert wrote before is only as grounded as its first use.

Rules, per tool:
    grep       every identifier in the pattern (regex escapes and Python keywords aside) appears as a word
    search     every word of the query appears (case-insensitively) in the context
    read_file  the path appears; a line range must contain a line number earlier results cited for
               that path (grep/lint hits `path:N`, tracebacks, search `path:A-B`, read_file numbers)
    edit_file  the path appears; old_str is text within consecutive lines that read_file results showed
               for that path since its last successful edit (new_str is the expert's own work and is not
               checked); "" creates a file
    lint/run_tests/grep path, run   paths in them appear in the context
    submit     every code-like token (with `_`, `.`, `/` or a digit) appears in the instruction or a tool
               result (the file list does not count: it names every file, so it proves no answer); a
               claim that the tests pass needs a test run after the last edit whose output shows them passing

Calls in turns the policy marked as deliberate mistakes (`marked_turns`, e.g. a near-miss edit that
shows recovery) are reported but not counted. Besides groundedness the report counts wasted calls:
greps that match nothing and test runs that ran no tests.
"""

from __future__ import annotations

import keyword
import re
from collections import Counter
from dataclasses import dataclass, field

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REGEX_ESCAPE = re.compile(r"\\[A-Za-z]")
_PATH_LINE = re.compile(r"([\w./-]+\.\w+):(\d+)(?:-(\d+))?")
_TRACEBACK_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_NUMBERED = re.compile(r"^\s*(\d+)\| ?(.*)$")
_CODE_TOKEN = re.compile(r"[\w./:-]*[_./\d][\w./:-]*")
_PASS_CLAIM = re.compile(r"tests? (?:now )?pass|passing|all green", re.IGNORECASE)
_NO_TESTS = re.compile(r"no tests ran|collected 0 items|NO TESTS RAN", re.IGNORECASE)
_EXIT = re.compile(r"\[exit code (\d+)\]\s*$")
_TEST_TOOLS = {"run_tests"}
MAX_RANGE_LINES = 80  # a "range" wider than this is a whole-file read in disguise


@dataclass
class CallCheck:
    turn: int
    name: str
    grounded: bool
    marked: bool
    reason: str = ""  # why it is not grounded


@dataclass
class GroundingReport:
    calls: list[CallCheck] = field(default_factory=list)
    wasted: Counter = field(default_factory=Counter)

    @property
    def counted(self) -> list[CallCheck]:
        return [c for c in self.calls if not c.marked]

    @property
    def grounded_rate(self) -> float:
        counted = self.counted
        return sum(c.grounded for c in counted) / len(counted) if counted else 1.0

    @property
    def ungrounded(self) -> list[CallCheck]:
        return [c for c in self.counted if not c.grounded]

    def merge(self, other: GroundingReport) -> GroundingReport:
        return GroundingReport(self.calls + other.calls, self.wasted + other.wasted)

    def summary(self) -> dict:
        by_tool: dict[str, list[int]] = {}
        for c in self.counted:
            by_tool.setdefault(c.name, [0, 0])
            by_tool[c.name][0] += c.grounded
            by_tool[c.name][1] += 1
        return {"calls": len(self.counted), "grounded": sum(c.grounded for c in self.counted),
                "grounded_rate": round(self.grounded_rate, 4), "marked": len(self.calls) - len(self.counted),
                "by_tool": {k: f"{g}/{n}" for k, (g, n) in sorted(by_tool.items())}, "wasted": dict(self.wasted)}


class _Context:
    """What the agent has seen so far, indexed the ways the rules need."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.prose: list[str] = []  # the instruction and tool results: what an answer may be copied from
        self.lines_by_path: dict[str, set[int]] = {}
        self.shown: dict[str, dict[int, str]] = {}  # path -> line -> text read_file showed since its last edit
        self.last_edit = -1  # index into `events` of the last successful edit
        self.events: list[tuple[str, str]] = []  # (tool name, result) in order

    @property
    def blob(self) -> str:
        return "\n".join(self.text)

    @property
    def prose_blob(self) -> str:
        return "\n".join(self.prose)

    def add_user(self, content: str) -> None:
        instruction, _files = content.rsplit("\nFiles:\n", 1) if "\nFiles:\n" in content else (content, "")
        self.add_text(content)
        self.prose.append(instruction)

    def add_text(self, text: str) -> None:
        self.text.append(text)
        for m in _PATH_LINE.finditer(text):
            lo, hi = int(m.group(2)), int(m.group(3) or m.group(2))
            self.lines_by_path.setdefault(m.group(1), set()).update({lo, hi})
        for m in _TRACEBACK_LINE.finditer(text):
            self.lines_by_path.setdefault(m.group(1), set()).add(int(m.group(2)))

    def add_result(self, name: str, arguments: dict | None, result: str) -> None:
        self.add_text(result)
        self.prose.append(result)
        self.events.append((name, result))
        arguments = arguments or {}
        path = arguments.get("path", "")
        if name == "read_file" and not result.startswith("Error"):
            shown = [m for m in map(_NUMBERED.match, result.splitlines()) if m]
            self.lines_by_path.setdefault(path, set()).update(int(m.group(1)) for m in shown)
            self.shown.setdefault(path, {}).update((int(m.group(1)), m.group(2)) for m in shown)
        if name == "edit_file" and result.startswith("Edited"):
            self.last_edit = len(self.events) - 1
            self.shown.pop(path, None)  # line numbers and text of that file are stale now

    def runs(self, path: str) -> list[str]:
        """The text of each run of consecutive line numbers shown for `path`."""
        shown, out = self.shown.get(path, {}), []
        for start in sorted(n for n in shown if n - 1 not in shown):
            run, n = [], start
            while n in shown:
                run.append(shown[n])
                n += 1
            out.append("\n".join(run))
        return out


def _mentions(blob: str, text: str) -> bool:
    return bool(text) and text in blob


def _word_in(blob: str, word: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", blob) is not None


def _path_known(ctx: _Context, path: str | None) -> bool:
    path = (path or ".").strip().removeprefix("./")
    return path in ("", ".") or _mentions(ctx.blob, path)


def _check_grep(ctx: _Context, args: dict) -> str:
    pattern = _REGEX_ESCAPE.sub(" ", args.get("pattern", ""))
    unseen = [w for w in _IDENT.findall(pattern) if not keyword.iskeyword(w) and not _word_in(ctx.blob, w)]
    if unseen:
        return f"pattern names {unseen} not in the context"
    return "" if _path_known(ctx, args.get("path")) else f"path {args.get('path')!r} not in the context"


def _check_search(ctx: _Context, args: dict) -> str:
    low = ctx.blob.lower()
    unseen = [w for w in _IDENT.findall(args.get("query", "")) if w.lower() not in low]
    return f"query words {unseen} not in the context" if unseen else ""


def _check_read(ctx: _Context, args: dict) -> str:
    path = args.get("path", "")
    if not _path_known(ctx, path):
        return f"path {path!r} not in the context"
    start, end = args.get("start_line"), args.get("end_line")
    if start is None and end is None:
        return ""
    lo, hi = start or 1, end or (start or 1) + MAX_RANGE_LINES
    if hi - lo + 1 > MAX_RANGE_LINES:
        return f"range {lo}-{hi} is wider than {MAX_RANGE_LINES} lines"
    cited = {n for p, ns in ctx.lines_by_path.items() if p == path or path.endswith("/" + p) or p.endswith(path)
             for n in ns}
    if not any(lo <= n <= hi for n in cited):
        return f"range {lo}-{hi} contains no line number the context cites for {path}"
    return ""


def _check_edit(ctx: _Context, args: dict) -> str:
    path, old = args.get("path", ""), args.get("old_str", "")
    if not _path_known(ctx, path):
        return f"path {path!r} not in the context"
    if old == "":
        return ""
    wanted = old.removesuffix("\n")
    if any(wanted in run for run in ctx.runs(path)):
        return ""
    return "old_str is not text an earlier read_file of that path showed (since its last edit)"


def _tests_passed_since_edit(ctx: _Context) -> bool:
    for name, result in ctx.events[ctx.last_edit + 1:][::-1]:
        if name in _TEST_TOOLS:
            exit_code = _EXIT.search(result)
            return bool(exit_code) and exit_code.group(1) == "0" and not _NO_TESTS.search(result)
    return False


def _check_submit(ctx: _Context, args: dict) -> str:
    summary = args.get("summary", "")
    tokens = [t.strip(".:-") for t in _CODE_TOKEN.findall(summary)]
    unseen = [t for t in tokens if re.search(r"[_./\d]", t) and not _mentions(ctx.prose_blob, t)]
    if unseen:
        return f"summary names {unseen} not in the context"
    if _PASS_CLAIM.search(summary) and not _tests_passed_since_edit(ctx):
        return "claims the tests pass without a passing test run after the last edit"
    return ""


def _check_paths_in(ctx: _Context, args: dict) -> str:
    for key in ("path", "target"):
        if args.get(key) and not _path_known(ctx, str(args[key]).split("::", 1)[0]):
            return f"{key} {args[key]!r} not in the context"
    return ""


def _check_run(ctx: _Context, args: dict) -> str:
    unseen = [t for t in re.findall(r"[\w-]+(?:/[\w.-]+)+|[\w-]+\.py\b", args.get("command", ""))
              if not _mentions(ctx.blob, t)]
    return f"command names {unseen} not in the context" if unseen else ""


_RULES = {"grep": _check_grep, "search": _check_search, "read_file": _check_read, "edit_file": _check_edit,
          "submit": _check_submit, "lint": _check_paths_in, "run_tests": _check_paths_in, "run": _check_run}


def grounding_report(messages: list[dict], turns: list[dict], marked_turns=()) -> GroundingReport:
    """Check every call of a trajectory (its `messages` and `turns`, as env.episode.Trajectory holds them).

    `marked_turns`: indices of turns the policy marked as deliberate mistakes (not counted).
    """
    ctx, report, marked = _Context(), GroundingReport(), set(marked_turns)
    turn_index, pending = -1, []
    for msg in messages:
        role = msg.get("role")
        if role == "user":
            ctx.add_user(msg.get("content") or "")
        elif role == "assistant":
            turn_index += 1
            calls = [c for c in turns[turn_index]["calls"]] if turn_index < len(turns) else []
            for call in calls:
                if call.get("malformed"):
                    report.calls.append(CallCheck(turn_index, call.get("name") or "?", False,
                                                  turn_index in marked, "malformed call"))
                    continue
                rule = _RULES.get(call["name"])
                reason = rule(ctx, call["arguments"] or {}) if rule else ""
                report.calls.append(CallCheck(turn_index, call["name"], not reason, turn_index in marked, reason))
            pending = list(calls)
        elif role == "tool":
            call = pending.pop(0) if pending else {"name": msg.get("name"), "arguments": {}}
            result = msg.get("content") or ""
            ctx.add_result(call.get("name") or "", call.get("arguments"), result)
            if call.get("name") == "grep" and result.startswith("No matches"):
                report.wasted["grep without matches"] += 1
            if call.get("name") in _TEST_TOOLS and _NO_TESTS.search(result):
                report.wasted["test run that ran no tests"] += 1
    return report


def trajectory_report(traj, marked_turns=()) -> GroundingReport:
    """`grounding_report` for an env.episode.Trajectory (or its dict / record form). Turns whose record
    carries `meta.deliberate_mistake` (the oracle's near-miss edits) count as marked, with `marked_turns`."""
    data = traj if isinstance(traj, dict) else {"messages": traj.messages, "turns": traj.turns}
    marked = set(marked_turns) | {i for i, turn in enumerate(data["turns"])
                                   if (turn.get("meta") or {}).get("deliberate_mistake")}
    return grounding_report(data["messages"], data["turns"], marked)


def measure(tasks_dir: str, seeds: int = 1, workers: int = 2) -> dict[str, dict]:
    """Run the oracle (`seeds` variants per task) on a task set; per-family solve counts and grounding."""
    from concurrent.futures import ThreadPoolExecutor

    from data.oracle import OraclePolicy
    from env.episode import run_episode
    from env.tasks import load_task_set

    def one(job):
        task, seed = job
        policy = OraclePolicy(seed=seed)
        traj = run_episode(task, policy)
        return task.meta.get("family", "?"), traj.solved, trajectory_report(traj, policy.marked_turns)

    reports: dict[str, GroundingReport] = {}
    solved: Counter = Counter()
    episodes: Counter = Counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        jobs = [(t, s) for t in load_task_set(tasks_dir) for s in range(seeds)]
        for family, ok, report in pool.map(one, jobs):
            reports[family] = reports.get(family, GroundingReport()).merge(report)
            solved[family] += ok
            episodes[family] += 1
    return {f: {"solved": f"{solved[f]}/{episodes[f]}", **reports[f].summary()} for f in sorted(reports)}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(description="The oracle's grounded rate per family on a task set.")
    parser.add_argument("--tasks", required=True, help="a task set directory (e.g. artifacts/data/tasks/train)")
    parser.add_argument("--seeds", type=int, default=1, help="oracle variants per task")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    for family, row in measure(args.tasks, args.seeds, args.workers).items():
        print(family, json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
