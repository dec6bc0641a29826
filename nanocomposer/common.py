"""What every stage script shares at its edges: `run_main` (a stage's `__main__`), `fail`, `first_line`, `print0`.

Every input check runs before any training step and raises `ConfigError` naming the bad input; `run_main`
prints it as one line and exits with status 2 (no traceback from deep inside transformers). `fail` (status 1)
is for a stage that ran and failed. The rest of the stages' shared code has one module per job:
run_dir.py (output dirs, resume), inputs.py (input checks), model_io.py (loading and saving models),
packing.py (CPT's document packing), run_record.py (config, W&B, model card).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NoReturn

from nanocomposer.config import ConfigError, RecipeParser


def fail(message: str) -> NoReturn:
    """Stop a stage that ran and failed (not bad input: that is ConfigError): exit status 1, `error: message`."""
    raise SystemExit(f"error: {message}")


def run_main(main: Callable[..., Any], parser: RecipeParser) -> None:
    """A stage's `__main__`: parse recipe and flags, run `main`, and report bad input found on the way
    (a ConfigError) exactly like a bad flag: `<script>: error: <message>` on one line, exit status 2.
    Anything else keeps its traceback: that is a bug, not bad input."""
    arguments = parser.parse_args_and_config()
    try:
        main(*arguments)
    except ConfigError as e:
        parser.error(str(e))


def first_line(error: BaseException) -> str:
    """`Type: first line of the message`, for errors from libraries whose messages span lines."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def print0(*args: Any) -> None:
    """Print once per job (rank 0) when launched with torchrun/accelerate, always otherwise."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, flush=True)
