"""The agent's tools. `CodeTools`' public methods ARE the tools: their signatures and
Google-style docstrings are the JSON schemas the model sees (built with transformers'
`get_json_schema`, as TRL builds them), so there is one source of truth.

File tools (read_file, edit_file, grep, search) act in this process on paths resolved
strictly inside the workspace (`env.workspace.resolve_in`). Everything that executes
code the agent controls (run, lint, run_tests) goes through `env.sandbox.Sandbox`.

Adding a tool: add a public method here with a typed signature and a docstring. That is
the whole change: the schema, the parser's validation and the dispatch follow from it.
"""

from __future__ import annotations

import copy
import functools
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from env.sandbox import Sandbox
from env.tasks import Task
from env.workspace import PathError, resolve_in

NO_INFORMATION = "No further information is available. Proceed with your best judgement."
_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "node_modules"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_CAMEL = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


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


def iter_files(root: Path):
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not p.is_symlink() and not (set(rel.parts) & _SKIP_DIRS):
            yield p


class CodeTools:
    """Tools over one episode's workspace. Construct one per episode."""

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
        self._index = None  # (signature of the tree, retriever, chunks)

    # ----------------------------------------------------------------- tools
    def read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        """Read a file; lines are shown with their numbers.

        Args:
            path: File path relative to the repository root.
            start_line: First line to show (1-based). Default: the first line.
            end_line: Last line to show (inclusive). Default: the last line.
        """
        file = self._file(path)
        lines = file.read_text(errors="replace").splitlines()
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
        target = resolve_in(self.workspace, path)
        if old_str == "":
            if target.exists():
                raise ToolError(f"{path} already exists; to change it, pass the text to replace as old_str")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(new_str)
            return f"Created {path} ({len(new_str.splitlines())} lines)."
        file = self._file(path)
        text = file.read_text(errors="replace")
        count = text.count(old_str)
        if count == 0:
            raise ToolError(f"old_str was not found in {path}; read the file and copy the text exactly")
        if count > 1:
            raise ToolError(f"old_str occurs {count} times in {path}; include more lines to make it unique")
        line = text[: text.index(old_str)].count("\n") + 1
        file.write_text(text.replace(old_str, new_str, 1))
        return f"Edited {path} at line {line}: replaced {len(old_str.splitlines())} line(s) " \
               f"with {len(new_str.splitlines())}."

    def grep(self, pattern: str, path: str = ".") -> str:
        """Search file contents for a regular expression; prints matching lines as path:line:text.

        Args:
            pattern: A regular expression (ripgrep syntax).
            path: File or directory to search, relative to the repository root.
        """
        target = resolve_in(self.workspace, path, must_exist=True)
        rel = target.relative_to(self.workspace).as_posix() or "."
        if shutil.which("rg"):
            proc = subprocess.run(
                ["rg", "--line-number", "--no-heading", "--color", "never", "--sort", "path",
                 "--max-columns", "200", "--", pattern, *([] if rel == "." else [rel])],
                cwd=self.workspace, capture_output=True, text=True, timeout=self.command_timeout_s, check=False,
            )
            if proc.returncode == 2:
                raise ToolError(f"grep failed: {proc.stderr.strip()}")
            out = proc.stdout
        else:  # pure-Python fallback with the same output shape
            try:
                regex = re.compile(pattern)
            except re.error as e:
                raise ToolError(f"invalid regular expression: {e}") from None
            files = [target] if target.is_file() else list(iter_files(target))
            hits = []
            for f in files:
                for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                    if regex.search(line):
                        hits.append(f"{f.relative_to(self.workspace).as_posix()}:{n}:{line[:200]}")
            out = "\n".join(hits)
        return out.strip() or f"No matches for {pattern!r} in {rel}."

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
            return f"No results for {query!r}."
        docs, scores = retriever.retrieve([tokens], k=min(k, len(chunks)), show_progress=False)
        results = []
        for doc, score in zip(docs[0], scores[0]):
            if score <= 0:
                continue
            path, start, end, text = chunks[int(doc)]
            preview = "\n".join(text.splitlines()[:8])
            results.append(f"{path}:{start}-{end} (score {score:.2f})\n{preview}")
        return "\n\n".join(results) or f"No results for {query!r}."

    def run(self, command: str, timeout_s: int = 30) -> str:
        """Run a shell command in the repository root (sandboxed, no network).

        Args:
            command: The bash command line to run.
            timeout_s: Seconds before the command is killed (at most 120).
        """
        if not 1 <= timeout_s <= 120:
            raise ToolError(f"timeout_s must be between 1 and 120, got {timeout_s}")
        return self._exec(command, timeout_s)

    def lint(self, path: str = ".") -> str:
        """Run the linter (ruff) on a file or directory and list the problems it finds.

        Args:
            path: File or directory to lint, relative to the repository root.
        """
        target = resolve_in(self.workspace, path, must_exist=True)
        rel = target.relative_to(self.workspace).as_posix() or "."
        return self._exec(f"ruff check --no-cache --output-format concise {shlex.quote(rel)}",
                          self.command_timeout_s)

    def run_tests(self, target: str | None = None) -> str:
        """Run the repository's tests, or only those in one test file.

        Args:
            target: A test file (or file::test_name) to run instead of the whole suite.
        """
        if target:
            resolve_in(self.workspace, target.split("::", 1)[0], must_exist=True)
            command = f"python -m pytest -q -p no:cacheprovider {shlex.quote(target)}"
        else:
            command = self.task.meta.get("visible_test_command", self.task.test_command) if self.task else ""
            if not command:
                return "This task has no visible tests to run."
        timeout = self.task.timeout_s if self.task else self.command_timeout_s
        return self._exec(command, timeout)

    def ask_user(self, question: str) -> str:
        """Ask the user a clarifying question.

        Args:
            question: The question to ask.
        """
        if self.answer_question is not None:
            return str(self.answer_question(question)) or NO_INFORMATION
        answer = self.task.meta.get("user_answer") if self.task else None
        return answer or NO_INFORMATION

    def submit(self, summary: str) -> str:
        """Finish the task: say what you changed (or give the answer the task asks for).

        Args:
            summary: A short summary of the change, or the requested answer.
        """
        self.submitted = True
        self.submission = summary
        return "Submitted."

    # ------------------------------------------------------------- plumbing
    def _file(self, path: str) -> Path:
        file = resolve_in(self.workspace, path, must_exist=True)
        if not file.is_file():
            raise ToolError(f"{path} is not a file")
        return file

    def _exec(self, command: str, timeout_s: float) -> str:
        res = self.sandbox.run(command, timeout_s=timeout_s)
        self.command_s += res.wall_s
        status = f"timed out after {timeout_s}s" if res.timed_out else f"exit code {res.returncode}"
        return f"{res.output.rstrip()}\n[{status}]".lstrip()

    def _search_index(self):
        files = list(iter_files(self.workspace))
        signature = tuple((f, f.stat().st_mtime_ns, f.stat().st_size) for f in files)
        if self._index is None or self._index[0] != signature:
            import bm25s

            chunks = []
            for f in files:
                try:
                    lines = f.read_text().splitlines()
                except UnicodeDecodeError:
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
    from transformers.utils import get_json_schema  # the same builder TRL uses for `tools=`

    out = []
    for name in tool_names(cls):
        schema = get_json_schema(getattr(cls, name))
        schema["function"].pop("return", None)
        schema["function"]["parameters"]["properties"].pop("self", None)
        out.append(schema)
    return out


def call_tool(tools: CodeTools, name: str, arguments: dict) -> str:
    """Run one validated call; errors the agent caused come back as the result text."""
    try:
        result = getattr(tools, name)(**arguments)
    except (ToolError, PathError) as e:
        result = f"Error: {e}"
    except subprocess.TimeoutExpired:
        result = f"Error: {name} timed out"
    except (OSError, UnicodeError) as e:
        result = f"Error: {type(e).__name__}: {e}"
    return truncate(result, tools.max_output_chars)
