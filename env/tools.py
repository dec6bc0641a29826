"""The agent's tools. `CodeTools`' public methods ARE the tools: their signatures and
Google-style docstrings are the JSON schemas the model sees (built by `function_schema` in the shape of
transformers' `get_json_schema`, as TRL builds them), so there is one source of truth.

File tools (read_file, edit_file, grep, search) act in this process on paths resolved
strictly inside the workspace (`env.workspace.resolve_in`). Everything that executes
code the agent controls (run, lint, run_tests) goes through `env.sandbox.Sandbox`.

Adding a tool: add a public method here with a typed signature and a docstring. That is
the whole change: the schema, the parser's validation and the dispatch follow from it.

`call_tool` never raises on what a model wrote: it validates the arguments against the
schemas itself (so direct callers get the parser's checks too), tool failures the agent
caused (bad paths, symlink loops, FIFOs, NUL bytes, a spent time budget) come back as
"Error: ..." text, and anything unforeseen as "Error: internal error ..." (logged). Every
result is UTF-8 encodable (`protocol.utf8_clean`), whatever bytes the commands printed or
the file names held.

Over 500 lines because: the tools are the public methods of one class (CodeTools, ~320 lines) whose
docstrings are the schemas the model sees, kept beside the schema builder and the argument checks that
read them; splitting the class would separate a tool from its schema.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path

from env.patch_paths import open_regular
from env.protocol import MalformedCall, preview, utf8_clean, validate_call
from env.sandbox import Sandbox, SandboxClosed
from env.tasks import Task, walk_tree
from env.workspace import PathError, resolve_in

log = logging.getLogger(__name__)

# pytest's summary line ("1 passed in 0.01s", "=== 2 failed, 1 passed in 61.2s (0:01:01) ===") and unittest's
# "Ran 3 tests in 0.004s": the only part of a test run's output that changes from run to run of the same code
_PYTEST_DURATION = re.compile(r"^(.*\b(?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|deselected|"
                              r"no tests ran)\b.*?) in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?( =+)?$", re.MULTILINE)
_UNITTEST_DURATION = re.compile(r"^(Ran \d+ tests?) in \d+(?:\.\d+)?s$", re.MULTILINE)


def without_durations(output: str) -> str:
    """A test run's output without the runner's wall-clock duration.

    The duration is noise to the agent, and it made greedy episodes irreproducible: two evals of one checkpoint
    differed in 4 of 40 episodes, each time first at a test run that took 0.01s once and 0.00s the other time,
    which changed what the model generated next. Without it, the same code gives the same text.
    """
    return _UNITTEST_DURATION.sub(r"\1", _PYTEST_DURATION.sub(r"\1\2", output))


NO_INFORMATION = "No further information is available. Proceed with your best judgement."
_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "node_modules"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_CAMEL = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
MAX_READ_BYTES = 16 * 1024 * 1024  # read_file / edit_file refuse larger files (the harness holds them in memory)
MAX_INDEXED_BYTES = 1024 * 1024  # search skips larger files (generated data, not code)
MAX_PATH_CHARS, MAX_PATH_DEPTH = 4096, 256  # Linux PATH_MAX; far deeper than any real repository
MAX_COMMAND_CHARS = 100_000  # one exec argument may hold at most 128 KiB (Linux MAX_ARG_STRLEN)


class ToolError(Exception):
    """An error the agent caused; its message becomes the tool result."""


def truncate(text: str, limit: int) -> str:
    """Keep the head and the tail, and say how much was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-(limit // 3):]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters truncated ...]\n{tail}"


def code_tokens(text: str) -> list[str]:
    """Identifier-aware tokens for BM25: `parse_url` -> parse_url, parse, url."""
    out = []
    for word in _WORD.findall(text):
        low = word.lower()
        out.append(low)
        parts = [p.lower() for piece in word.split("_") for p in _CAMEL.findall(piece)]
        if len(parts) > 1:
            out.extend(parts)
    return out


def iter_files(root: Path) -> list[Path]:
    """Regular files below `root`, sorted by path; symlinks, FIFOs, sockets, devices and caches are skipped,
    and symlinked directories are never entered (so loops and links to host directories are harmless)."""
    root = Path(root)
    found = []
    for dirpath, dirnames, filenames in walk_tree(root):  # no symlinks followed, no recursion
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for name in filenames:
            path = Path(dirpath) / name
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    found.append(path)
            except OSError:  # vanished meanwhile (a concurrent command), or a name the OS refuses
                continue
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def _lines(text: str) -> list[str]:
    """Lines as edit_file, grep and `wc -l` count them: split at "\n" only (not at "\r", form feeds or U+2028,
    which str.splitlines also splits at); a CRLF line is shown without its "\r"."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _encode(text: str, name: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ToolError(f"{name} is not valid text (character {e.start} is a lone surrogate)") from None


def _editable_text(path: str, data: bytes) -> str:
    """The file's text, decoded exactly (no newline translation), or ToolError for a file edit_file must not
    rewrite: binary (a NUL byte) or not UTF-8. Decoding and re-encoding valid UTF-8 gives the same bytes."""
    if b"\0" in data:
        raise ToolError(f"{path} is a binary file (it contains NUL bytes); edit_file edits UTF-8 text only and left "
                        "it unchanged (change it with run)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ToolError(f"{path} is not UTF-8 text (byte {e.start} is not valid UTF-8); edit_file left it unchanged "
                        "(change it with run)") from None


def _locate(path: str, text: str, old_str: str, new_str: str) -> tuple[int, int, str]:
    """Where old_str occurs in `text` (exactly once) and what replaces it: (start, end, replacement).

    Exact text first. In a file with CRLF line endings an old_str written with "\n" only also matches where
    each of its "\n" stands for "\r\n" (or "\n") in the file. The replacement is new_str as given, except that
    its line endings follow the file's: "\r\n" in a file whose every line ends so, and where old_str only
    matched through CRLF, in the matched text; so only the replaced bytes change, in the file's own style."""
    count = text.count(old_str)
    crlf_file = "\r\n" in text and "\n" not in text.replace("\r\n", "")
    if count == 1:
        start = text.index(old_str)
        return start, start + len(old_str), _with_endings(new_str, crlf_file)
    if count == 0 and "\r\n" in text and "\n" in old_str and "\r" not in old_str:
        pattern = re.compile("\r?\n".join(re.escape(part) for part in old_str.split("\n")))
        matches = list(pattern.finditer(text))
        if len(matches) == 1:
            found = matches[0].group()
            crlf = found.count("\r\n") * 2 >= found.count("\n")
            return matches[0].start(), matches[0].end(), _with_endings(new_str, crlf)
        count = len(matches)
    if count == 0:
        raise ToolError(f"old_str was not found in {path}; read the file and copy the text exactly")
    raise ToolError(f"old_str occurs {count} times in {path}; include more lines to make it unique")


def _with_endings(text: str, crlf: bool) -> str:
    return text.replace("\r\n", "\n").replace("\n", "\r\n") if crlf else text


def _write_new(target: Path, data: bytes) -> None:
    """Create `target` (it must not exist; never through a symlink) holding exactly `data`."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
    except BaseException:
        os.close(fd)
        target.unlink(missing_ok=True)
        raise
    os.close(fd)


def _replace_contents(file: Path, data: bytes) -> None:
    """`file` now holds exactly `data`, its permission bits kept: written to a new file beside it, then renamed
    over it, so a failed write (a full disk) leaves the old contents whole."""
    if not os.access(file, os.W_OK):
        raise ToolError(f"{file.name} is not writable (permission bits {stat.S_IMODE(file.lstat().st_mode):o})")
    mode = stat.S_IMODE(file.lstat().st_mode)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".edit-", dir=file.parent)
    except PermissionError:  # a read-only directory (only non-root callers get here): write in place
        with open(file, "r+b") as f:
            f.write(data)
            f.truncate()
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CodeTools:
    """Tools over one episode's workspace. Construct one per episode.

    Attributes a caller may set after construction:
        deadline: a `time.monotonic()` instant, or None (the default) for no deadline. Every command
            (run, run_tests, lint, and grep's ripgrep) gets at most the time left until it as its timeout,
            and once it has passed those tools answer with an error instead of running anything. The
            episode sets it from its wall-clock budget, so one long command cannot overrun the budget.
    """

    def __init__(self, workspace: Path, task: Task | None = None, *, sandbox: Sandbox | None = None,
                 max_output_chars: int = 4000, command_timeout_s: float = 30.0, chunk_lines: int = 30,
                 ask_user: Callable[[str], str] | None = None):
        self.workspace = Path(workspace)
        self.task = task
        # Who answers `ask_user`: a person (agent.py), a simulated user, or None for the task's scripted answer.
        self.answer_question = ask_user
        self.sandbox = sandbox or Sandbox(self.workspace)
        self.max_output_chars = max_output_chars
        self.command_timeout_s = command_timeout_s
        self.chunk_lines = chunk_lines
        self.submitted = False
        self.submission = ""
        self.command_s = 0.0  # time spent inside sandboxed commands (the rest is harness overhead)
        self.deadline: float | None = None  # see the class docstring
        self._index = None  # (signature of the tree, retriever, chunks)

    # ----------------------------------------------------------------- tools
    def read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        """Read a file; lines are shown with their numbers.

        Args:
            path: File path relative to the repository root.
            start_line: First line to show (1-based). Default: the first line.
            end_line: Last line to show (inclusive). Default: the last line.
        """
        data = self._read_bytes(path)
        if b"\0" in data:
            return f"({path} is a binary file of {len(data)} bytes; read_file shows text only: inspect it with run, " \
                   f"e.g. xxd {shlex.quote(path)} | head)"
        lines = _lines(data.decode("utf-8", errors="replace"))
        start = max(1, start_line or 1)
        end = min(len(lines), end_line or len(lines))
        if lines and start > len(lines):
            raise ToolError(f"start_line {start} is past the end of {path} ({len(lines)} lines)")
        if start > end and lines:
            raise ToolError(f"start_line {start} is after end_line {end}")
        shown = "\n".join(f"{n:>4}| {lines[n - 1]}" for n in range(start, end + 1))
        return shown if lines else f"({path} is empty)"

    def edit_file(self, path: str, old_str: str, new_str: str) -> str:
        """Replace the exact text old_str (it must occur once) with new_str; an empty old_str creates the file.

        Args:
            path: File path relative to the repository root.
            old_str: The exact text to replace (with its indentation), or "" to create a file.
            new_str: The replacement text.
        """
        new_bytes = _encode(new_str, "new_str")
        target = self._resolve(path)
        if old_str == "":
            if target.exists() or target.is_symlink():
                raise ToolError(f"{path} already exists; to change it, pass the text to replace as old_str")
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_new(target, new_bytes)
            return f"Created {path} ({len(new_str.splitlines())} lines)."
        _encode(old_str, "old_str")
        file = self._file(path)
        data = self._read_bytes(path, file)
        text = _editable_text(path, data)
        start, end, replacement = _locate(path, text, old_str, new_str)
        line = text[:start].count("\n") + 1
        _replace_contents(file, (text[:start] + replacement + text[end:]).encode("utf-8"))
        return f"Edited {path} at line {line}: replaced {len(old_str.splitlines())} line(s) " \
               f"with {len(new_str.splitlines())}."

    def grep(self, pattern: str, path: str = ".") -> str:
        """Search file contents for a regular expression; prints matching lines as path:line:text.

        Args:
            pattern: A regular expression (ripgrep syntax).
            path: File or directory to search, relative to the repository root.
        """
        if "\0" in pattern:
            raise ToolError("pattern contains a NUL byte")
        if len(pattern) > MAX_COMMAND_CHARS:
            raise ToolError(f"pattern is {len(pattern)} characters long; at most {MAX_COMMAND_CHARS}")
        target = self._resolve(path, must_exist=True)
        if not (target.is_dir() or self._is_regular(target)):
            raise ToolError(f"{path} is neither a directory nor a regular file")
        rel = target.relative_to(self._root).as_posix() or "."
        if shutil.which("rg"):
            timeout = self._time_left(self.command_timeout_s)
            proc = subprocess.run(
                ["rg", "--line-number", "--no-heading", "--color", "never", "--sort", "path",
                 "--max-columns", "200", "--", pattern, *([] if rel == "." else [rel])],
                cwd=self._root, capture_output=True, text=True, encoding="utf-8", errors="replace",
                timeout=timeout, check=False, stdin=subprocess.DEVNULL,
            )
            if proc.returncode == 2:
                raise ToolError(f"grep failed: {proc.stderr.strip()}")
            out = proc.stdout
        else:  # pure-Python fallback with the same output shape
            try:
                regex = re.compile(pattern)
            except re.error as e:
                raise ToolError(f"invalid regular expression: {e}") from None
            files = [target] if self._is_regular(target) else iter_files(target)
            hits = []
            for f in files:
                for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                    if regex.search(line):
                        hits.append(f"{f.relative_to(self._root).as_posix()}:{n}:{line[:200]}")
            out = "\n".join(hits)
        return out.strip() or f"No matches for {preview(pattern, 200)} in {rel}."

    def search(self, query: str, k: int = 5) -> str:
        """Ranked codebase search: the code chunks most relevant to a natural-language or code query.

        Args:
            query: What to look for, e.g. "where are discounts applied".
            k: How many results to show (1-20).
        """
        if not 1 <= k <= 20:
            raise ToolError(f"k must be between 1 and 20, got {k}")
        retriever, chunks = self._search_index()
        if retriever is None:
            return "The repository has no text files to search."
        vocab = retriever.vocab_dict
        tokens = [t for t in code_tokens(query) if t in vocab]
        if not tokens:
            return f"No results for {preview(query, 200)}."
        docs, scores = retriever.retrieve([tokens], k=min(k, len(chunks)), show_progress=False)
        results = []
        for doc, score in zip(docs[0], scores[0]):
            if score <= 0:
                continue
            path, start, end, text = chunks[int(doc)]
            head = "\n".join(text.splitlines()[:8])
            results.append(f"{path}:{start}-{end} (score {score:.2f})\n{head}")
        return "\n\n".join(results) or f"No results for {preview(query, 200)}."

    def run(self, command: str, timeout_s: int = 30) -> str:
        """Run a shell command in the repository root (sandboxed, no network).

        Args:
            command: The bash command line to run.
            timeout_s: Seconds before the command is killed (at most 120).
        """
        if not 1 <= timeout_s <= 120:
            raise ToolError(f"timeout_s must be between 1 and 120, got {preview(timeout_s)}")
        if "\0" in command:
            raise ToolError("command contains a NUL byte; bash cannot run it")
        if len(command) > MAX_COMMAND_CHARS:
            raise ToolError(f"command is {len(command)} characters long; at most {MAX_COMMAND_CHARS} "
                            "(write long scripts to a file with edit_file and run that)")
        return self._exec(command, timeout_s)

    def lint(self, path: str = ".") -> str:
        """Run the linter (ruff) on a file or directory and list the problems it finds.

        Args:
            path: File or directory to lint, relative to the repository root.
        """
        target = self._resolve(path, must_exist=True)
        rel = target.relative_to(self._root).as_posix() or "."
        return self._exec(f"ruff check --no-cache --output-format concise {shlex.quote(rel)}",
                          self.command_timeout_s)

    def run_tests(self, target: str | None = None) -> str:
        """Run the repository's tests, or only those in one test file.

        Args:
            target: A test file (or file::test_name) to run instead of the whole suite.
        """
        if target:
            self._resolve(target.split("::", 1)[0], must_exist=True)
            # "./" keeps a target that starts with "-" from reading as a pytest option
            command = f"python -m pytest -q -p no:cacheprovider {shlex.quote(target if target[0] != '-' else './' + target)}"
        else:
            command = self.task.meta.get("visible_test_command", self.task.test_command) if self.task else ""
            if self.task and "visible_test_command" not in self.task.meta and self.task.gold_answer is not None:
                # an answer-graded task's test_command is its hidden checker: running it in the workspace
                # only fails with "can't open file <absolute workspace path>", noise that differs every run
                command = ""
            if not command:
                return "This task has no visible tests to run: it is graded on the answer you submit."
        timeout = self.task.timeout_s if self.task else self.command_timeout_s
        return without_durations(self._exec(command, timeout))

    def ask_user(self, question: str) -> str:
        """Ask the user a clarifying question.

        Args:
            question: The question to ask.
        """
        if self.answer_question is not None:
            try:
                answer = self.answer_question(question)
            except Exception as e:  # noqa: BLE001  (a failing user hook costs the agent its answer, not the run)
                raise ToolError(f"the user could not answer ({type(e).__name__}: {e})") from None
            return (answer if isinstance(answer, str) else str(answer or "")) or NO_INFORMATION
        answer = self.task.meta.get("user_answer") if self.task else None
        return answer or NO_INFORMATION

    def submit(self, summary: str) -> str:
        """Finish the task: say what you changed (or give the answer the task asks for).

        Args:
            summary: A short summary of the change, or the requested answer.
        """
        self.submitted = True
        self.submission = utf8_clean(summary)
        return "Submitted."

    # ------------------------------------------------------------- plumbing
    @functools.cached_property
    def _root(self) -> Path:
        """The workspace as resolve_in returns paths in it (symlinks in its own location resolved)."""
        return self.workspace.resolve()

    def _resolve(self, path: str, must_exist: bool = False) -> Path:
        """resolve_in, with a symlink loop or an over-long name as an error the agent sees."""
        if isinstance(path, str) and (len(path) > MAX_PATH_CHARS or path.count("/") > MAX_PATH_DEPTH):
            # the OS refuses such paths anyway, and pathlib's recursive mkdir would exhaust the stack first
            raise ToolError(f"path {preview(path)} is too long ({len(path)} characters, "
                            f"{path.count('/') + 1} components); at most {MAX_PATH_CHARS} and {MAX_PATH_DEPTH}")
        try:
            return resolve_in(self.workspace, path, must_exist=must_exist)
        except RuntimeError as e:  # pathlib's "Symlink loop from ..." (Python < 3.13)
            raise ToolError(f"path {preview(path)} cannot be resolved: {e}") from None
        except OSError as e:
            raise ToolError(f"path {preview(path)} cannot be resolved: {e.strerror or e}") from None

    @staticmethod
    def _is_regular(path: Path) -> bool:
        try:
            return stat.S_ISREG(path.stat().st_mode)
        except OSError:
            return False

    def _file(self, path: str) -> Path:
        file = self._resolve(path, must_exist=True)
        if not self._is_regular(file):
            raise ToolError(f"{path} is not a regular file")
        size = file.stat().st_size
        if size > MAX_READ_BYTES:
            raise ToolError(f"{path} is {size} bytes; files over {MAX_READ_BYTES} bytes are not read "
                            "(inspect it with run, e.g. head or grep)")
        return file

    def _read_bytes(self, path: str, file: Path | None = None) -> bytes:
        """The bytes of the regular file `path` (at most MAX_READ_BYTES), read without following a final
        symlink and without blocking on a FIFO (checked on the open descriptor, not only by name)."""
        file = file or self._file(path)
        with open_regular(file, path, ToolError, lambda e: f": {e.strerror or e}") as f:
            data = f.read(MAX_READ_BYTES + 1)
        if len(data) > MAX_READ_BYTES:
            raise ToolError(f"{path} is over {MAX_READ_BYTES} bytes; files that large are not read "
                            "(inspect it with run, e.g. head or grep)")
        return data

    def _time_left(self, timeout_s: float) -> float:
        """`timeout_s` capped to the time left before `deadline`; ToolError once it has passed."""
        if self.deadline is None:
            return timeout_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ToolError("the episode's time budget is spent: no more commands can run; submit now")
        return min(timeout_s, left)

    def _exec(self, command: str, timeout_s: float) -> str:
        timeout = self._time_left(timeout_s)
        res = self.sandbox.run(command, timeout_s=timeout)
        self.command_s += res.wall_s
        if res.timed_out:
            status = f"timed out after {timeout:g}s" if timeout == timeout_s else \
                f"timed out after {timeout:.1f}s: the episode's time budget ran out"
        else:
            status = f"exit code {res.returncode}"
        return f"{res.output.rstrip()}\n[{status}]".lstrip()

    def _search_index(self):
        files = []
        for f in iter_files(self.workspace):
            try:
                st = f.lstat()
            except OSError:  # removed since the listing
                continue
            if st.st_size <= MAX_INDEXED_BYTES:
                files.append((f, st.st_mtime_ns, st.st_size))
        signature = tuple(files)
        if self._index is None or self._index[0] != signature:
            import bm25s

            chunks = []
            for f, _, _ in files:
                try:
                    lines = f.read_text(encoding="utf-8").splitlines()
                except (UnicodeDecodeError, OSError):  # binary, or gone since the listing
                    continue
                rel = f.relative_to(self.workspace).as_posix()
                for start in range(0, max(len(lines), 1), self.chunk_lines):
                    body = "\n".join(lines[start:start + self.chunk_lines])
                    chunks.append((rel, start + 1, min(start + self.chunk_lines, len(lines)), body))
            corpus = [code_tokens(f"{rel} {body}") for rel, _, _, body in chunks]
            retriever = None
            if any(corpus):
                retriever = bm25s.BM25()
                retriever.index(corpus, show_progress=False)
            self._index = (signature, retriever, chunks)
        return self._index[1], self._index[2]


def tool_names(cls: type = CodeTools) -> list[str]:
    """Public methods of a tools class (and its bases), in definition order."""
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__[:-1]):
        names.update({n: None for n, v in vars(klass).items() if callable(v) and not n.startswith("_")})
    return list(names)


def tool_schemas(tools: CodeTools | type[CodeTools]) -> list[dict]:
    """OpenAI/TRL-style schemas of the tools, from their signatures and docstrings."""
    return copy.deepcopy(_schemas_of(tools if isinstance(tools, type) else type(tools)))


@functools.cache
def _schemas_of(cls: type) -> list[dict]:
    return [function_schema(getattr(cls, name)) for name in tool_names(cls)]


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def function_schema(fn) -> dict:
    """The JSON schema of a typed function with a Google-style docstring, in the exact shape transformers'
    `get_json_schema` (what TRL uses for `tools=`) gives, so prompts match what TRL would render; built here
    because the harness does not import transformers (tests/test_tools.py checks the two agree)."""
    doc = inspect.getdoc(fn) or ""
    summary, _, args_block = doc.partition("\nArgs:\n")
    described: dict[str, str] = {}
    current = None
    for line in args_block.splitlines():
        name, sep, text = line.strip().partition(":")
        if sep and line.startswith(" ") and not line.startswith("  " * 3) and name.isidentifier():
            current, described[name] = name, text.strip()
        elif current and line.strip():  # a continuation line of the argument above
            described[current] += " " + line.strip()
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for param in list(inspect.signature(fn).parameters.values()):
        if param.name == "self":
            continue
        kind, nullable = hints[param.name], False
        if typing.get_origin(kind) in (types.UnionType, typing.Union):
            options = [a for a in typing.get_args(kind) if a is not type(None)]
            kind, nullable = options[0], len(options) < len(typing.get_args(kind))
        prop = {"type": _JSON_TYPES[kind]} | ({"nullable": True} if nullable else {})
        if param.name in described:
            prop["description"] = described[param.name]
        properties[param.name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties} | ({"required": required} if required else {})
    description = " ".join(summary.split("\n\n")[0].split())
    return {"type": "function", "function": {"name": fn.__name__, "description": description,
                                             "parameters": parameters}}


def _check_call(tools: CodeTools, name, arguments) -> str | None:
    """The parser's verdict on a call that may not have come through it (None: valid)."""
    schemas = {s["function"]["name"]: s["function"] for s in _schemas_of(type(tools))}
    checked = validate_call({"name": name, "arguments": arguments}, schemas, "")
    return checked.error if isinstance(checked, MalformedCall) else None


def call_tool(tools: CodeTools, name: str, arguments: dict) -> str:
    """Run one call; never raises: errors come back as the result text ("Error: ..."), always UTF-8 encodable.

    The call is validated against the tool schemas first (the episode passes only calls `parse_turn`
    validated, but other callers need not)."""
    try:
        if (problem := _check_call(tools, name, arguments)) is not None:
            result = f"Error: {problem}"
        else:
            result = getattr(tools, name)(**arguments)
    except (ToolError, PathError) as e:
        result = f"Error: {e}"
    except subprocess.TimeoutExpired:
        result = f"Error: {name} timed out"
    except (OSError, UnicodeError) as e:
        result = f"Error: {type(e).__name__}: {e}"
    except SandboxClosed:  # the run is stopping and closed this episode's sandbox under the call
        result = f"Error: {name} was stopped: the sandbox is closed"
    except Exception as e:  # a harness bug must cost one call, not the run; it is logged
        log.exception("tool %r failed unexpectedly on %s", name, preview(arguments, 300))
        result = f"Error: internal error in {preview(name)}: {type(e).__name__}: {e}"
    if not isinstance(result, str):
        result = str(result)
    return utf8_clean(truncate(result, tools.max_output_chars))
