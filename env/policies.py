"""Policies: what writes the assistant turns of an episode.

A policy has `name`, `reset(task)` and `act(messages, tools) -> Generation | str` (raw
assistant text in the harness's tool-call format). The harness's scripted policies live here; the oracle
(the scripted expert that writes the SFT data) is a data generator and lives in data/oracle.py; model
policies (a `from_pretrained` directory) live in `nanocomposer/`. nanocomposer/policies.py (SCRIPTED,
build_policy) is the one factory that turns every name, the oracle's included, into a policy.

    gold          applies the task's gold.patch through edit_file, runs the tests, submits
    noop          submits at once (the floor every task must fail)
    replay:FILE   replays raw assistant turns from FILE (a JSON list of strings, or an episode record)

`patch_edits` (the gold patch as edit_file calls), `tool_call` and `DEFINITION` are what the oracle builds on.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from pathlib import Path

from env import patch_apply, patch_paths
from env.protocol import format_assistant_turn
from env.tasks import Task, TaskError, check_gold_patch

DEFINITION = re.compile(r"^\s*(?:async\s+def|def|class)\s+([A-Za-z_]\w*)")  # group 1: the name defined


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
    """The gold patch as edit_file / run calls: [{"name": ..., "arguments": ..., "symbol": ...}], by path.

    The patch is read by env/patches.py, the parser task validation used, and worked out against repo/ in
    memory: which files it touches comes from that parse alone (a hunk line that looks like a header is a hunk
    line), and every file is read through `resolve_inside` (env/patch_paths.py) at this moment, so a symlink planted in repo/ after
    loading cannot make a host file's text an argument either."""
    patch = task.gold_patch
    if not patch:
        return []
    where = f"task {task.id!r}"
    parsed = check_gold_patch(patch, task.repo_dir, where)
    try:
        changes = patch_apply.plan_patch(task.repo_dir, parsed)
    except patch_paths.PatchError as e:
        raise TaskError(f"{where}: gold.patch does not apply to repo/: {e}") from None
    calls = []
    for change in changes:
        rel = change.path
        if change.after is None:
            calls.append({"name": "run", "arguments": {"command": f"rm {shlex.quote(rel)}"}, "path": rel,
                          "symbol": None})
        elif change.before is None:
            calls.append({"name": "edit_file", "arguments": {"path": rel, "old_str": "",
                                                            "new_str": _gold_text(change.after, where, rel)},
                          "path": rel, "symbol": None})
        else:
            old = _gold_text(change.before, where, rel)
            for old_str, new_str in _edit_pairs(old, _gold_text(change.after, where, rel)):
                line = old[: old.index(old_str)].count("\n") + 1 if old_str else 1
                calls.append({"name": "edit_file", "arguments": {"path": rel, "old_str": old_str, "new_str": new_str},
                              "path": rel, "line": line, "symbol": _enclosing_symbol(old, line)})
    return calls


def _gold_text(entry: patch_apply.Entry, where: str, rel: str) -> str:
    """A file's text before or after the gold patch, as edit_file sees it (UTF-8, universal newlines)."""
    if entry.kind != "file":
        raise TaskError(f"{where}: gold.patch makes {rel!r} a {entry.kind}; edit_file calls cannot")
    try:
        text = entry.data.decode("utf-8")
    except UnicodeDecodeError:
        raise TaskError(f"{where}: gold.patch touches {rel!r}, which is not UTF-8 text") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _enclosing_symbol(text: str, line: int) -> str | None:
    lines = text.splitlines()
    for i in range(min(line, len(lines)) - 1, -1, -1):
        if m := DEFINITION.match(lines[i]):
            return m.group(1)
    return None


def tool_call(name: str, **arguments) -> tuple[str, dict]:
    """One (name, arguments) call, as format_assistant_turn takes them."""
    return name, arguments


# ------------------------------------------------------------------- policies
class NoopPolicy:
    name = "noop"

    def reset(self, task: Task) -> None:
        pass

    def act(self, messages, tools) -> str:
        return format_assistant_turn(None, [tool_call("submit", summary="No changes.")])


class GoldPolicy:
    """Applies the gold patch with edit_file calls (all in one parallel turn), tests, submits."""

    name = "gold"

    def reset(self, task: Task) -> None:
        self.task = task
        edits = [(c["name"], c["arguments"]) for c in patch_edits(task)]
        if task.gold_answer is not None:
            self.turns = [[tool_call("submit", summary=task.gold_answer)]]
        elif not edits:
            raise TaskError(f"task {task.id!r}: gold policy needs a gold.patch or a gold_answer")
        else:
            self.turns = [edits, [tool_call("run_tests")], [tool_call("submit", summary="Applied the reference fix.")]]

    def act(self, messages, tools) -> str:
        return format_assistant_turn(None, self.turns.pop(0)) if self.turns else ""


class ReplayPolicy:
    """Replays recorded raw assistant turns; after the last one it writes nothing (no_tool_call).

    The file is a JSON list of turn texts, one episode record (`Trajectory.to_record`), or what eval.py writes
    (a results.json with a `tasks` list, or its episodes JSONL): then each task replays its own episode
    (the first record of that task id), and a task the file has no episode of fails at `reset`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"replay:{self.path.name}"
        where = f"replay file {str(self.path)!r}"
        try:
            text = self.path.read_text(encoding="utf-8")
            if self.path.suffix == ".jsonl":
                data = {"tasks": [json.loads(line) for line in text.splitlines() if line.strip()]}
            else:
                data = json.loads(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{where}: {e}") from None
        self.recorded: list[str] | None = None
        self.by_task: dict[str, list[str]] = {}
        if isinstance(data, dict) and isinstance(data.get("tasks"), list):
            for record in data["tasks"]:
                texts = _turn_texts(record)
                if texts is None:
                    raise ValueError(f"{where}: a record of its tasks list has no turns with texts")
                self.by_task.setdefault(str(record.get("id")), texts)
        else:
            self.recorded = _turn_texts(data)
            if self.recorded is None:
                raise ValueError(f"{where}: expected a JSON list of strings, an episode record or eval results")

    def reset(self, task: Task) -> None:
        if self.recorded is not None:
            self.queue = list(self.recorded)
        elif task.id in self.by_task:
            self.queue = list(self.by_task[task.id])
        else:
            raise TaskError(f"replay file {str(self.path)!r}: no episode of task {task.id!r}")

    def act(self, messages, tools) -> str:
        return self.queue.pop(0) if self.queue else ""


def _turn_texts(data) -> list[str] | None:
    """The assistant turn texts of a list of strings or an episode record; None otherwise."""
    if isinstance(data, dict) and isinstance(data.get("turns"), list):
        data = [t.get("text") if isinstance(t, dict) else None for t in data["turns"]]
    if isinstance(data, list) and all(isinstance(t, str) for t in data):
        return data
    return None


# ------------------------------------------------------------------- registry
POLICIES = {"gold": GoldPolicy, "noop": NoopPolicy}  # the oracle is data's: data/oracle.py


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_checkpoint_spec(spec: str) -> bool:
    """A local checkpoint path, or a Hugging Face hub id (`org/name`, resolved through the HF cache)."""
    return Path(spec).exists() or bool(_HUB_ID.fullmatch(spec))


def get_policy(spec: str, **kwargs):
    """A harness policy from its name: a registry name or `replay:FILE` (the oracle, checkpoints and hub ids:
    `nanocomposer.policies.build_policy`, which also takes these names; the harness imports no model code
    and no data generator)."""
    if spec in POLICIES:
        return POLICIES[spec](**kwargs)
    if spec.startswith("replay:"):
        return ReplayPolicy(spec.split(":", 1)[1])
    hint = " (a checkpoint: use nanocomposer.policies.build_policy)" if is_checkpoint_spec(spec) else \
        " (the oracle: data.oracle.OraclePolicy, or nanocomposer.policies.build_policy)" if spec == "oracle" else ""
    raise ValueError(f"unknown policy {spec!r}: use one of {', '.join(POLICIES)} or replay:FILE{hint}")
