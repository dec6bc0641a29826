"""What `agent.py run` shows at the terminal (rich): each turn as it finishes, the diff, the questions."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from rich.console import Console
from rich.text import Text

from env.tools import NO_INFORMATION

SHORT = 110  # characters of a tool call or result shown per line


def _short(text: str, limit: int = SHORT) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _arguments(args: dict | None) -> str:
    if not args:
        return ""
    return ", ".join(f"{k}={_short(json.dumps(v, ensure_ascii=False), 40)}" for k, v in args.items())


class TurnPrinter:
    """on_turn for run_session: one line per tool call with the start of its result."""

    def __init__(self, console: Console):
        self.console = console

    def __call__(self, record: dict, results: list[str]) -> None:
        c = self.console
        c.print(Text(f"turn {record['turn'] + 1}", style="bold"),
                Text(f"(model {record['gen_s']:.2f} s, tools {record['env_s']:.2f} s)", style="dim"))
        if not record["calls"]:
            c.print(Text(f"  (no tool call) {_short(record['text'])}", style="yellow"), soft_wrap=True)
        for call, result in zip(record["calls"], results + [""] * len(record["calls"])):
            if call["malformed"]:
                c.print(Text(f"  x malformed call: {_short(call['error'] or '')}", style="red"), soft_wrap=True)
                continue
            c.print(Text("  > ", style="cyan") + Text(f"{call['name']}({_arguments(call['arguments'])})"),
                    soft_wrap=True)
            c.print(Text(f"    {_short(result)}", style="red" if call.get("error") else "dim"), soft_wrap=True)


def print_diff(console: Console, diff: str) -> None:
    """The diff verbatim (no wrapping, no markup), coloured per line when the terminal has colour."""
    styles = {"+": "green", "-": "red", "@": "cyan", "d": "bold"}
    for line in diff.splitlines():
        style = None if line.startswith(("+++", "---")) else styles.get(line[:1])
        console.print(Text(line, style=style or ""), soft_wrap=True, highlight=False)


def terminal_answerer(console: Console, interactive: bool) -> Callable[[str], str]:
    """ask_user: the person at the terminal, or the scripted "no information" answer when nobody can type."""

    def answer(question: str) -> str:
        console.print(Text("? the agent asks: ", style="bold magenta") + Text(question), soft_wrap=True)
        if not interactive:
            console.print(Text(f"  (no input) {NO_INFORMATION}", style="dim"), soft_wrap=True)
            return NO_INFORMATION
        try:
            reply = console.input("  your answer> ").strip()
        except EOFError:
            reply = ""
        return reply or NO_INFORMATION

    return answer


def confirm(console: Console, prompt: str) -> bool:
    """y/N from stdin (a TTY or a pipe); end of input means no."""
    console.print(Text(prompt), end="", soft_wrap=True)
    console.file.flush()
    line = sys.stdin.readline()
    if not line:
        console.print()
    return line.strip().lower() in ("y", "yes")
