"""Policies: what writes the assistant turns of an episode.

A policy has `name`, `reset(task)` and `act(messages, tools) -> Generation | str` (raw
assistant text in the harness's tool-call format). Scripted policies live here; model
policies (a `from_pretrained` directory) live in `nanocomposer/` and register the same way.

    gold          applies the task's gold.patch through edit_file, runs the tests, submits
    noop          submits at once (the floor every task must fail)
    replay:FILE   replays raw assistant turns from FILE (a JSON list of strings, or a saved trajectory)
    oracle        a scripted expert: tests, search/grep, parallel reads, edits, lint, re-run, submit,
                  with seeded variety. It writes the SFT data.
"""

from __future__ import annotations

import difflib
import json
import random
import re
import shutil
import tempfile
from pathlib import Path

from env.protocol import format_assistant_turn
from env.tasks import Task, TaskError, apply_patch

_DEF = re.compile(r"^\s*(?:async\s+def|def|class)\s+([A-Za-z_]\w*)")


# ------------------------------------------------------------ patch -> edit calls
def _edit_pairs(old: str, new: str) -> list[tuple[str, str]]:
    """(old_str, new_str) replacements turning `old` into `new`, each old_str unique when applied in order."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    ranges = []  # [lo, hi) in a, with the replacement lines
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        ctx = 0 if i2 > i1 else 1
        while True:
            lo, hi = max(0, i1 - ctx), min(len(a), i2 + ctx)
            block = "".join(a[lo:hi])
            if (block and old.count(block) == 1) or (lo == 0 and hi == len(a)):
                break
            ctx += 1
        ranges.append([lo, hi, i1, i2, b[j1:j2]])
    merged: list[list] = []
    for r in ranges:  # hunks whose context overlaps become one edit
        if merged and r[0] < merged[-1][1]:
            m = merged[-1]
            m[4] = m[4] + a[m[3]:r[2]] + r[4]
            m[1], m[3] = max(m[1], r[1]), r[3]
        else:
            merged.append(r)
    pairs = [("".join(a[lo:hi]), "".join(a[lo:i1]) + "".join(repl) + "".join(a[i2:hi]))
             for lo, hi, i1, i2, repl in merged]
    text = old  # verify by applying in order; fall back to one whole-file replacement
    for o, n in pairs:
        if not o or text.count(o) != 1:
            return [(old, new)]
        text = text.replace(o, n, 1)
    return pairs if text == new else [(old, new)]


def patch_edits(task: Task) -> list[dict]:
    """The gold patch as edit_file / run calls: [{"name": ..., "arguments": ..., "symbol": ...}]."""
    patch = task.gold_patch
    if not patch:
        return []
    scratch = Path(tempfile.mkdtemp(prefix="gold-"))
    try:
        shutil.copytree(task.repo_dir, scratch / "repo")
        apply_patch(scratch / "repo", patch)
        touched = sorted({m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", patch, re.MULTILINE)} |
                         {m.group(1) for m in re.finditer(r"^--- a/(\S+)", patch, re.MULTILINE)})
        calls = []
        for rel in touched:
            before, after = task.repo_dir / rel, scratch / "repo" / rel
            if not after.exists():
                calls.append({"name": "run", "arguments": {"command": f"rm {rel}"}, "path": rel, "symbol": None})
            elif not before.exists():
                calls.append({"name": "edit_file", "arguments": {"path": rel, "old_str": "", "new_str": after.read_text()},
                              "path": rel, "symbol": None})
            else:
                old = before.read_text()
                for old_str, new_str in _edit_pairs(old, after.read_text()):
                    line = old[: old.index(old_str)].count("\n") + 1 if old_str else 1
                    calls.append({"name": "edit_file", "arguments": {"path": rel, "old_str": old_str, "new_str": new_str},
                                  "path": rel, "line": line, "symbol": _enclosing_symbol(old, line)})
        return calls
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _enclosing_symbol(text: str, line: int) -> str | None:
    lines = text.splitlines()
    for i in range(min(line, len(lines)) - 1, -1, -1):
        if m := _DEF.match(lines[i]):
            return m.group(1)
    return None


def _call(name: str, **arguments) -> tuple[str, dict]:
    return name, arguments


# ------------------------------------------------------------------- policies
class NoopPolicy:
    name = "noop"

    def reset(self, task: Task) -> None:
        pass

    def act(self, messages, tools) -> str:
        return format_assistant_turn(None, [_call("submit", summary="No changes.")])


class GoldPolicy:
    """Applies the gold patch with edit_file calls (all in one parallel turn), tests, submits."""

    name = "gold"

    def reset(self, task: Task) -> None:
        self.task = task
        edits = [(c["name"], c["arguments"]) for c in patch_edits(task)]
        if task.gold_answer is not None:
            self.turns = [[_call("submit", summary=task.gold_answer)]]
        elif not edits:
            raise TaskError(f"task {task.id!r}: gold policy needs a gold.patch or a gold_answer")
        else:
            self.turns = [edits, [_call("run_tests")], [_call("submit", summary="Applied the reference fix.")]]

    def act(self, messages, tools) -> str:
        return format_assistant_turn(None, self.turns.pop(0)) if self.turns else ""


class ReplayPolicy:
    """Replays recorded raw assistant turns; after the last one it writes nothing (no_tool_call)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"replay:{self.path.name}"
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"replay file {str(self.path)!r}: {e}") from None
        if isinstance(data, dict) and "turns" in data:  # a saved trajectory
            data = [t["text"] for t in data["turns"]]
        if not isinstance(data, list) or not all(isinstance(t, str) for t in data):
            raise ValueError(f"replay file {str(self.path)!r}: expected a JSON list of strings or a trajectory")
        self.recorded = data

    def reset(self, task: Task) -> None:
        self.queue = list(self.recorded)

    def act(self, messages, tools) -> str:
        return self.queue.pop(0) if self.queue else ""


class OraclePolicy:
    """A scripted expert that knows the fix and works the way a good engineer would.

    It explores (tests, search, grep), reads the files it will change (in parallel), edits,
    checks (tests, sometimes lint), and submits; the seeded rng varies the order, the
    grouping of independent calls, and now and then a failed edit it then recovers from,
    so the SFT data shows recovery and not only clean runs.
    """

    name = "oracle"

    def __init__(self, seed: int = 0, recovery_rate: float = 0.15):
        self.seed = seed
        self.recovery_rate = recovery_rate

    def reset(self, task: Task) -> None:
        rng = random.Random(f"{self.seed}:{task.id}")
        self.task = task
        self.turns = self._plan_locate(task, rng) if task.gold_answer is not None else self._plan_fix(task, rng)

    def act(self, messages, tools) -> str:
        if not self.turns:
            return ""
        return format_assistant_turn(None, self.turns.pop(0))

    # -- plans
    def _plan_locate(self, task: Task, rng: random.Random) -> list:
        symbol = task.meta.get("symbol") or _first_identifier(task.instruction)
        explore = [_call("search", query=symbol), _call("grep", pattern=rf"(def|class) {symbol}\b")]
        rng.shuffle(explore)
        plan = [explore if rng.random() < 0.7 else explore[:1]]
        if rng.random() < 0.5:
            plan.append([_call("read_file", path=task.gold_answer.split(":")[0])])
        plan.append([_call("submit", summary=task.gold_answer)])
        return plan

    def _plan_fix(self, task: Task, rng: random.Random) -> list:
        edits = patch_edits(task)
        if not edits:
            raise TaskError(f"task {task.id!r}: the oracle needs a gold.patch or a gold_answer")
        family = task.meta.get("family", "")
        paths = list(dict.fromkeys(e["path"] for e in edits))
        symbols = list(dict.fromkeys(e["symbol"] for e in edits if e.get("symbol")))
        plan: list = []
        first = [_call("lint")] if family == "fix_lint" else []
        first.append(_call("run_tests"))
        find = []
        if symbols:
            find.append(_call("grep", pattern=rf"\b{symbols[0]}\b"))
        if rng.random() < 0.6:
            find.append(_call("search", query=_query(task, symbols)))
        if find and rng.random() < 0.5:
            plan.append(first + find)  # independent: one parallel turn
        else:
            plan.append(first)
            if find:
                plan.append(find)
        reads = []
        for e in edits:
            if e["path"] in [r[1]["path"] for r in reads] or e["name"] != "edit_file" or not e["arguments"]["old_str"]:
                continue
            if rng.random() < 0.5 and e.get("line"):
                lo = max(1, e["line"] - rng.randint(3, 10))
                reads.append(_call("read_file", path=e["path"], start_line=lo, end_line=e["line"] + rng.randint(8, 20)))
            else:
                reads.append(_call("read_file", path=e["path"]))
        if reads:
            plan.append(reads)
        edit_calls = [(e["name"], e["arguments"]) for e in edits]
        if rng.random() < self.recovery_rate and edit_calls[0][0] == "edit_file" and edit_calls[0][1]["old_str"]:
            name, args = edit_calls[0]
            near_miss = _near_miss(args["old_str"], (task.repo_dir / args["path"]).read_text())
            if near_miss is not None:
                plan.append([(name, {**args, "old_str": near_miss})])  # fails: the text is not in the file
                plan.append([(name, args)])
                edit_calls = edit_calls[1:]
        if edit_calls:
            if rng.random() < 0.8:
                plan.append(edit_calls)
            else:
                plan.extend([[c] for c in edit_calls])
        check = [_call("run_tests")]
        if family == "fix_lint" or rng.random() < 0.4:
            check.insert(rng.randint(0, 1), _call("lint", path=paths[0] if rng.random() < 0.5 else "."))
        plan.append(check)
        plan.append([_call("submit", summary=_summary(task, paths, symbols))])
        return plan


def _first_identifier(text: str) -> str:
    m = re.search(r"`([A-Za-z_][\w.]*)`", text) or re.search(r"\b([a-z]+_[a-z_]+|[A-Z][a-z]+[A-Z]\w*)\b", text)
    return m.group(1).split(".")[-1] if m else text.split()[0]


def _query(task: Task, symbols: list[str]) -> str:
    words = re.findall(r"[A-Za-z_]{3,}", task.instruction)
    return " ".join(dict.fromkeys(symbols[:1] + words[:6])) or task.instruction[:60]


def _near_miss(old_str: str, file_text: str) -> str | None:
    """What a hurried engineer types instead of `old_str`: close, but not in the file (so the edit fails)."""
    candidates = [
        "\n".join(line.strip() for line in old_str.splitlines()),  # indentation lost
        old_str.replace("    ", "  ", 1),  # two-space indent
        old_str.rstrip("\n") + " \n",  # a trailing space
    ]
    for candidate in candidates:
        if candidate and candidate != old_str and candidate not in file_text:
            return candidate
    return None


def _summary(task: Task, paths: list[str], symbols: list[str]) -> str:
    where = f"{symbols[0]} in {paths[0]}" if symbols else ", ".join(paths)
    return f"Fixed {where}; the tests pass."


# ------------------------------------------------------------------- registry
POLICIES = {"gold": GoldPolicy, "noop": NoopPolicy, "oracle": OraclePolicy}


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_checkpoint_spec(spec: str) -> bool:
    """A local checkpoint path, or a Hugging Face hub id (`org/name`, resolved through the HF cache)."""
    return Path(spec).exists() or bool(_HUB_ID.fullmatch(spec))


def get_policy(spec: str, **kwargs):
    """A policy from its name: a registry name, `replay:FILE`, or a model directory."""
    if spec in POLICIES:
        return POLICIES[spec](**kwargs)
    if spec.startswith("replay:"):
        return ReplayPolicy(spec.split(":", 1)[1])
    if is_checkpoint_spec(spec):  # a checkpoint dir or hub id; a broken one raises ModelLoadError
        from nanocomposer.policy import ModelPolicy, SamplingConfig  # lazy: env/ stays torch-free

        return ModelPolicy(spec, sampling=SamplingConfig(**kwargs))
    raise ValueError(f"unknown policy {spec!r}: use one of {', '.join(POLICIES)}, replay:FILE, "
                     "or a checkpoint directory")
