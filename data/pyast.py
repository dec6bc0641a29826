"""`ast.parse` that is safe to call from the task builder's threads.

CPython 3.11 keeps the AST constructor's recursion counter in interpreter-wide state. Two threads
that turn source into `ast` objects at once can interleave on it, and one of them then fails with
`SystemError: AST constructor recursion depth mismatch` (CPython gh-106905). `data/build_tasks.py`
builds families on a thread pool, so every parse in `data/` goes through this lock; parsing is
a few milliseconds of a build unit that spends seconds grading, so the lock costs nothing visible.
"""

from __future__ import annotations

import ast
import threading

_PARSE_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """`ast.parse(source)`, one thread at a time."""
    with _PARSE_LOCK:
        return ast.parse(source)
