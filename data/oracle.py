"""The oracle: a scripted expert that writes the SFT data (`python -m data.build_sft` plays it on the train tasks).

It reacts to what it has seen: tests, search/grep, parallel reads, edits, lint, re-run, submit, with seeded
variety. Every argument it writes comes from the instruction, the file list or an earlier tool result
(data/grounding.py checks that), except its marked near-miss edits; the task's gold patch (or answer) only
decides which visible fact is the right one. It is a data generator, so it lives in data/, beside the checker;
the harness's scripted policies (gold, noop, replay:FILE) are in env/policies.py, whose patch_edits it builds
on. By name ("oracle"), stages get it from nanocomposer/policies.py (SCRIPTED), the one spec -> policy factory.
"""

from __future__ import annotations

import builtins
import keyword
import random
import re

from env import patch_paths
from env.episode import Generation
from env.policies import DEFINITION, patch_edits, tool_call
from env.protocol import format_assistant_turn
from env.tasks import Task, TaskError


def _repo_text(task: Task, rel: str) -> str:
    """A file of the task's repo/, read through `resolve_inside` now (never a symlink out of it)."""
    try:
        return patch_paths.read_text_inside(task.repo_dir, rel)
    except patch_paths.PatchError as e:
        raise TaskError(f"task {task.id!r}: repo/ {e}") from None


class _Seen:
    """What the conversation so far has shown the agent: the instruction, the file list, tool results.

    The oracle decides every turn from this alone (plus its knowledge of which visible fact is the
    right one), so each argument it writes is something a model in its place could have copied.
    `issued` are the oracle's own earlier turns, paired in order with the tool messages that answered them.
    """

    def __init__(self, messages: list[dict], issued: list[list[tuple[str, dict]]]):
        user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        self.instruction, _, listing = user.rpartition("\nFiles:\n") if "\nFiles:\n" in user else (user, "", "")
        self.files = [line.strip() for line in listing.splitlines() if line.strip()]
        self.results: list[tuple[str, dict, str]] = []  # (tool, arguments, result)
        self.lines: dict[str, dict[int, str]] = {}  # path -> line number -> text shown since its last edit
        self.cited: dict[str, set[int]] = {}  # path -> line numbers any result cited for it
        pending: list[tuple[str, dict]] = []
        turn = -1
        for msg in messages:
            if msg.get("role") == "assistant":
                turn += 1
                pending = list(issued[turn]) if turn < len(issued) else []
            elif msg.get("role") == "tool":
                name, args = pending.pop(0) if pending else (msg.get("name") or "", {})
                self._add(name, args, msg.get("content") or "")
        self.text = "\n".join([self.instruction, *(r for _, _, r in self.results)])

    def _add(self, name: str, args: dict, result: str) -> None:
        self.results.append((name, args, result))
        for m in _PATH_LINE.finditer(result):
            self.cited.setdefault(m.group(1), set()).update(int(n) for n in m.groups()[1:] if n)
        for m in _TRACEBACK_LINE.finditer(result):  # File "/tmp/ws/pkg/a.py", line 12: cited for pkg/a.py
            for path in self.files:
                if m.group(1) == path or m.group(1).endswith("/" + path):
                    self.cited.setdefault(path, set()).add(int(m.group(2)))
        if name == "read_file" and not result.startswith("Error"):
            shown = self.lines.setdefault(args["path"], {})
            for m in filter(None, map(_NUMBERED.match, result.splitlines())):
                shown[int(m.group(1))] = m.group(2)
                self.cited.setdefault(args["path"], set()).add(int(m.group(1)))
        if name == "edit_file" and result.startswith("Edited"):
            self.lines.pop(args["path"], None)  # its line numbers and text are stale now

    def mentions(self, word: str) -> bool:
        """`word` (as a whole word) in the instruction or a tool result; the file list does not count."""
        return bool(word) and re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", self.text) is not None

    def knows_path(self, path: str) -> bool:
        return path in self.files or path in self.text

    def shows(self, path: str, old_str: str) -> bool:
        """Has a read_file of `path` shown `old_str` verbatim (within consecutive lines)?"""
        shown = self.lines.get(path, {})
        wanted = old_str.removesuffix("\n")
        for start in sorted(n for n in shown if n - 1 not in shown):
            run, n = [], start
            while n in shown:
                run.append(shown[n])
                n += 1
            if wanted in "\n".join(run):
                return True
        return False

    def last(self, name: str) -> str | None:
        return next((r for n, _, r in reversed(self.results) if n == name), None)

    def tests_passed_since_edit(self) -> bool:
        for name, _, result in reversed(self.results):
            if name == "edit_file" and result.startswith("Edited"):
                return False
            if name == "run_tests":
                code = _EXIT_CODE.search(result)
                return bool(code) and code.group(1) == "0" and not _NO_TESTS.search(result)
        return False


class OraclePolicy:
    """A scripted expert that knows the fix and works only from what it has seen, as a good engineer would.

    It is reactive: each turn it reads the conversation (`_Seen`) and picks the next step. It runs
    the tests (and the linter), asks the user first when the task leaves the change to them (its
    `user_answer`), greps for a name once the instruction or a result has shown it,
    reads the file a result or the file list pointed to (a line range only around a line number a
    result cited, paging on when a long file was truncated), edits with `old_str` copied from what a
    read showed, re-checks, and submits; it claims the tests pass only after a run showed it, and
    submits an answer only once it appears in the context. The gold patch (or answer) only decides
    *which* of the visible facts is the right one. The seeded rng varies the order, the grouping of
    independent calls, and now and then a near-miss edit it then recovers from; those turns are
    deliberate mistakes and their indices are recorded in `marked_turns` (for data/grounding.py).
    """

    name = "oracle"

    def __init__(self, seed: int = 0, recovery_rate: float = 0.15, max_output_chars: int = 2000):
        self.seed = seed
        self.recovery_rate = recovery_rate
        self.page_chars = max_output_chars * 4 // 5  # a range read sized to come back untruncated

    def reset(self, task: Task) -> None:
        self.rng = random.Random(f"{self.seed}:{task.id}")
        self.task = task
        self.issued: list[list[tuple[str, dict]]] = []
        self.marked_turns: set[int] = set()
        self.queue: list[list[tuple[str, dict]]] = []
        self.grepped: set[str] = set()
        self.searched = False
        self.listed = False
        self.checked = False
        if task.gold_answer is not None:
            self.edits: list[dict] = []
            self.answer_file, self.symbol = _answer_target(task)
        else:
            self.edits = [e for e in patch_edits(task)]
            if not self.edits:
                raise TaskError(f"task {task.id!r}: the oracle needs a gold.patch or a gold_answer")
            for e in self.edits:
                e["done"], e["near_miss_tried"] = False, False
                if e["name"] == "edit_file" and e["arguments"]["old_str"]:
                    e["end"] = e["line"] + e["arguments"]["old_str"].count("\n") - 1
                    e["source"] = _repo_text(task, e["path"]).splitlines()

    def act(self, messages, tools) -> Generation:
        seen = _Seen(messages, self.issued)
        turn = self._next_answer(seen) if self.task.gold_answer is not None else self._next_fix(seen)
        mistake = len(self.issued) in self.marked_turns
        self.issued.append(turn)
        return Generation(format_assistant_turn(None, turn) if turn else "",
                          meta={"deliberate_mistake": True} if mistake else None)

    # -- answer tasks (locate, copy): find the answer in the context, then submit it
    def _next_answer(self, seen: _Seen) -> list:
        answer = self.task.gold_answer
        if seen.mentions(answer):
            if self.answer_file and not seen.lines.get(self.answer_file) and self.rng.random() < 0.3 and \
                    (read := self._read_around(seen, self.answer_file, _answer_line(answer))) is not None:
                return [read]  # a look at the definition before answering
            return [tool_call("submit", summary=self._answer_text(answer))]
        calls = []
        if self.symbol and seen.mentions(self.symbol) and self.symbol not in self.grepped:
            self.grepped.add(self.symbol)
            calls.append(tool_call("grep", pattern=_definition_pattern(self.symbol)))
        named = self.symbol if self.symbol and seen.mentions(self.symbol) else None
        if not self.searched and (not calls or self.rng.random() < 0.4) and (query := _query(seen.instruction, named)):
            self.searched = True
            calls.append(tool_call("search", query=query))
        if not calls and self.answer_file and seen.knows_path(self.answer_file):
            calls.append(self._read_around(seen, self.answer_file, _answer_line(answer)) or
                         tool_call("read_file", path=self.answer_file))
        if not calls:  # nothing left to look at: give the best answer the context supports
            return [tool_call("submit", summary="I could not find it.")]
        self.rng.shuffle(calls)
        return calls

    def _answer_text(self, answer: str) -> str:
        if self.task.meta.get("family") != "locate" or self.rng.random() < 0.5:
            return answer
        template = self.rng.choice(("It is defined in {}.", "{}", "The definition is in {}."))
        return template.format(answer)

    # -- fix tasks: tests and exploration, reads of what the edits need, edits, checks, submit
    def _next_fix(self, seen: _Seen) -> list:
        if not self.issued:
            return self._first_turn(seen)
        if self.queue:
            return self.queue.pop(0)
        self._note_edit_results(seen)
        pending = [e for e in self.edits if not e["done"]]
        if pending:
            return self._toward_edits(seen, pending)
        if not self.checked:
            self.checked = True
            check = [tool_call("run_tests")]
            if self.task.meta.get("family") == "fix_lint" or self.rng.random() < 0.4:
                paths = [e["path"] for e in self.edits]
                check.insert(self.rng.randint(0, 1), tool_call("lint", path=paths[0] if self.rng.random() < 0.5 else "."))
            return check
        return [tool_call("submit", summary=self._fix_summary(seen))]

    def _first_turn(self, seen: _Seen) -> list:
        first = [tool_call("lint")] if self.task.meta.get("family") == "fix_lint" else []
        first.append(tool_call("run_tests"))
        if self.task.meta.get("user_answer"):
            # the task leaves what to change to the user (ladder_ask): ask before deciding anything
            first.insert(0, tool_call("ask_user", question=self._question(seen)))
        find = []
        if (symbol := self._grep_target(seen)) is not None:
            self.grepped.add(symbol)
            find.append(tool_call("grep", pattern=rf"\b{symbol}\b"))
        if self.rng.random() < 0.6 and (query := _query(seen.instruction, symbol)):
            self.searched = True
            find.append(tool_call("search", query=query))
        if find and self.rng.random() < 0.5:
            return first + find  # independent: one parallel turn
        if find:
            self.queue.append(find)
        return first

    def _question(self, seen: _Seen) -> str:
        symbol = self.task.meta.get("symbol")
        if symbol and seen.mentions(symbol):
            return self.rng.choice(("What value should {} be set to?", "What is the new value of {}?",
                                    "Which number do you want for {}?")).format(symbol)
        return "What exactly should the change be?"

    def _grep_target(self, seen: _Seen) -> str | None:
        """A name worth grepping for: the symbol the fix is in, or a name on its lines, once the context shows it."""
        names = [e.get("symbol") for e in self.edits] + [self.task.meta.get("symbol")]
        for e in self.edits:
            names += _IDENT.findall(e["arguments"].get("old_str", ""))
        for name in dict.fromkeys(n for n in names if n):
            name = name.split(".")[-1]
            if (len(name) >= 3 and not keyword.iskeyword(name) and name not in _BUILTIN_NAMES
                    and name not in self.grepped and seen.mentions(name)):
                return name
        return None

    def _note_edit_results(self, seen: _Seen) -> None:
        """Mark the edits the last turn made; a failed one stays pending (read again, then retry)."""
        last_turn = self.issued[-1] if self.issued else []
        results = seen.results[-len(last_turn):] if last_turn else []
        for (name, args, result) in results:
            if name != "edit_file" or not result.startswith("Edited"):
                continue
            for e in self.edits:
                if not e["done"] and e["arguments"] == args:
                    e["done"] = True

    def _toward_edits(self, seen: _Seen, pending: list[dict]) -> list:
        if (symbol := self._grep_target(seen)) is not None and self.rng.random() < 0.5 and \
                not all(seen.lines.get(e["path"]) for e in pending):
            self.grepped.add(symbol)
            return [tool_call("grep", pattern=rf"\b{symbol}\b")]
        if unknown := [e["path"] for e in pending if not seen.knows_path(e["path"])]:
            return self._find_file(seen, unknown[0])
        reads, read_paths = [], set()
        for e in pending:
            if e["name"] != "edit_file" or not e["arguments"]["old_str"] or e["path"] in read_paths:
                continue
            if not seen.shows(e["path"], e["arguments"]["old_str"]):
                read_paths.add(e["path"])
                reads.append(self._read_for(seen, e))
        if reads:
            return reads
        # every old_str is on screen: edit. All edits of one file go in one turn (an edit makes its line
        # numbers stale); files one turn each now and then.
        by_path = list(dict.fromkeys(e["path"] for e in pending))
        batch = pending if self.rng.random() < 0.8 else [e for e in pending if e["path"] == by_path[0]]
        first = batch[0]
        if (first["name"] == "edit_file" and first["arguments"]["old_str"] and not first["near_miss_tried"]
                and self.rng.random() < self.recovery_rate):
            first["near_miss_tried"] = True
            near_miss = _near_miss(first["arguments"]["old_str"], "\n".join(first["source"]) + "\n")
            if near_miss is not None:
                self.marked_turns.add(len(self.issued))  # a deliberate mistake: recovery data, not grounded
                return [("edit_file", {**first["arguments"], "old_str": near_miss})]
        return [(e["name"], e["arguments"]) for e in batch]

    def _find_file(self, seen: _Seen, path: str) -> list:
        """The file list was cut short and nothing has named `path` yet: look for it before reading it."""
        if not self.searched and (query := _query(seen.instruction, None)):
            self.searched = True
            return [tool_call("search", query=query)]
        if not self.listed:
            self.listed = True
            return [tool_call("run", command="find . -name '*.py' | sort")]
        return [tool_call("read_file", path=path)]  # `find` listed every file unless its output was cut short

    def _read_for(self, seen: _Seen, edit: dict) -> tuple[str, dict]:
        """The read that shows (more of) `edit`'s old_str: a whole file, or a range anchored on a cited line."""
        path, source = edit["path"], edit["source"]
        lo, hi = edit["line"], edit["end"]
        shown = seen.lines.get(path, {})
        cited = seen.cited.get(path, set()) | set(shown)
        whole_fits = sum(len(line) + 7 for line in source) <= self.page_chars
        if not shown and (whole_fits or not cited):
            near = [c for c in cited if lo - 25 <= c <= hi + 25]
            if near and self.rng.random() < 0.5:
                return self._read_around(seen, path, min(near, key=lambda c: abs(c - lo))) or \
                    tool_call("read_file", path=path)
            return tool_call("read_file", path=path)
        if not cited:
            return tool_call("read_file", path=path)
        first_unseen = next((n for n in range(lo, hi + 1) if shown.get(n) != source[n - 1]), lo)
        below = [c for c in cited if c < first_unseen] or [c for c in cited if c <= first_unseen]
        if below:
            start = max(below)
            return tool_call("read_file", path=path, start_line=start, end_line=self._page_end(source, start))
        end = min(c for c in cited if c >= first_unseen)
        return tool_call("read_file", path=path, start_line=self._page_start(source, end), end_line=end)

    def _read_around(self, seen: _Seen, path: str, anchor: int | None):
        """read_file of a window around a line `anchor` that a result cited, or None when none was cited.

        The window follows from the anchor alone (a few lines before it, a page after it); when the text
        the oracle needs lies beyond it, the next turn pages on from what this read showed.
        """
        if not anchor or anchor not in seen.cited.get(path, set()):
            return None
        start = max(1, anchor - self.rng.randint(2, 6))
        source = _repo_text(self.task, path).splitlines()
        end = min(self._page_end(source, start), anchor + self.rng.randint(15, 40))
        return tool_call("read_file", path=path, start_line=start, end_line=max(end, anchor))

    def _page_end(self, source: list[str], start: int) -> int:
        end, used = start, 0
        while end <= len(source) and end - start < MAX_PAGE_LINES and used + len(source[end - 1]) + 7 <= self.page_chars:
            used += len(source[end - 1]) + 7
            end += 1
        return max(start, end - 1)

    def _page_start(self, source: list[str], end: int) -> int:
        start, used = end, 0
        while start >= 1 and end - start < MAX_PAGE_LINES and used + len(source[start - 1]) + 7 <= self.page_chars:
            used += len(source[start - 1]) + 7
            start -= 1
        return min(end, start + 1)

    def _fix_summary(self, seen: _Seen) -> str:
        paths = [p for p in dict.fromkeys(e["path"] for e in self.edits) if seen.mentions(p)]
        symbols = [s for s in dict.fromkeys(e.get("symbol") for e in self.edits) if s and seen.mentions(s)]
        where = f"{symbols[0]} in {paths[0]}" if symbols and paths else ", ".join(paths) or "the code"
        return f"Fixed {where}; the tests pass." if seen.tests_passed_since_edit() else f"Changed {where}."


MAX_PAGE_LINES = 60
_NUMBERED = re.compile(r"^\s*(\d+)\| ?(.*)$")
_PATH_LINE = re.compile(r"([\w./-]+\.\w+):(\d+)(?:-(\d+))?")
_TRACEBACK_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_EXIT_CODE = re.compile(r"\[exit code (\d+)\]\s*$")
_NO_TESTS = re.compile(r"no tests ran|collected 0 items", re.IGNORECASE)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BUILTIN_NAMES = frozenset(dir(builtins)) | {"self", "cls"}
_STOPWORDS = frozenset((  # instruction words that make a search query vaguer, not better
    "the", "and", "for", "with", "that", "this", "from", "into", "what", "where", "which", "when",
    "does", "should", "there", "their", "your", "about", "them", "then", "than", "have", "has",
    "been", "were", "will", "would", "could", "please", "fix", "bug", "code", "test", "tests",
    "file", "files", "answer", "reply", "path", "line", "function", "method", "class", "constant",
    "defined", "define", "find", "change"))


def _answer_target(task: Task) -> tuple[str | None, str | None]:
    """For an answer task: the file the answer names (if any) and the name to grep for."""
    answer = task.gold_answer
    match = re.match(r"([\w./-]+\.py)(?::(\d+))?", answer.strip())
    path = match.group(1) if match else None
    symbol = task.meta.get("symbol")
    lines = None
    if symbol is None and match and match.group(2):
        try:  # the answer names the file: read through resolve_inside (an answer of '../../x.py' reads nothing)
            lines = patch_paths.read_text_inside(task.repo_dir, path).splitlines()
        except patch_paths.PatchError:
            lines = None
    if lines is not None:
        line = int(match.group(2))
        if 1 <= line <= len(lines) and (m := DEFINITION.match(lines[line - 1])):
            symbol = m.group(1)
    return path, symbol.split(".")[-1] if symbol else None


def _answer_line(answer: str) -> int | None:
    match = re.search(r"\.py:(\d+)", answer)
    return int(match.group(1)) if match else None


def _definition_pattern(symbol: str) -> str:
    if symbol.isupper():
        return rf"^\s*{symbol}\b"
    return rf"(def|class) {symbol}\b"


def _query(instruction: str, symbol: str | None) -> str:
    words = [w for w in re.findall(r"[A-Za-z_]{3,}", instruction) if w.lower() not in _STOPWORDS]
    return " ".join(dict.fromkeys(([symbol] if symbol else []) + words[:6]))


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
