"""What `agent.py run` shows at the terminal (rich): each turn as it finishes, the diff, the questions.

Everything shown comes from the model, the repository or the tools' output, so all of it goes through
`printable` first: control characters (ESC, CR, backspace, BEL, C1 controls, DEL), bidirectional overrides and
lone surrogates are shown as escapes (ESC as \\x1b, U+202E as \\u202e), never sent to the terminal, so nothing can
move the cursor, rewrite a line already shown, recolour or hide text (rich's own markup is never parsed from
it either: Text objects only).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable

from rich.console import Console
from rich.text import Text

from env.tools import NO_INFORMATION

SHORT = 110  # characters of a tool call or result shown per line

# C0 controls but tab and newline, DEL, C1 controls, bidi embeddings/overrides/isolates and marks, line and
# paragraph separators, lone surrogates (a non-UTF-8 file name)
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, newlines: bool = True) -> str:
    """`text` safe for a terminal: unsafe characters (see the module docstring) as \\xNN / \\uNNNN escapes; tabs
    kept, and newlines too unless `newlines` is False (then \\n)."""
    text = _UNSAFE.sub(_escape, str(text))
    return text if newlines else text.replace("\n", "\\n")


def _short(text: str, limit: int = SHORT) -> str:
    line = " ".join(printable(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _arguments(args: dict | None) -> str:
    if not args:
        return ""
    return ", ".join(f"{_short(k, 40)}={_short(json.dumps(v, ensure_ascii=False), 40)}" for k, v in args.items())


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
            c.print(Text("  > ", style="cyan") + Text(f"{_short(call['name'], 60)}({_arguments(call['arguments'])})"),
                    soft_wrap=True)
            c.print(Text(f"    {_short(result)}", style="red" if call.get("error") else "dim"), soft_wrap=True)


def print_diff(console: Console, diff: str) -> None:
    """The diff line by line (split at newlines only; no wrapping, no markup), each line `printable` (a CRLF
    line shows its \\r as \\x0d), coloured per line when the terminal has colour."""
    styles = {"+": "green", "-": "red", "@": "cyan", "d": "bold"}
    for line in printable(diff.removesuffix("\n")).split("\n") if diff else []:
        style = None if line.startswith(("+++", "---")) else styles.get(line[:1])
        console.print(Text(line, style=style or ""), soft_wrap=True, highlight=False)


def terminal_answerer(console: Console, interactive: bool) -> Callable[[str], str]:
    """ask_user: the person at the terminal, or the scripted "no information" answer when nobody can type."""

    def answer(question: str) -> str:
        console.print(Text("? the agent asks: ", style="bold magenta") + Text(printable(question)), soft_wrap=True)
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
    console.print(Text(printable(prompt, newlines=False)), end="", soft_wrap=True)
    console.file.flush()
    line = sys.stdin.readline()
    if not line:
        console.print()
    return line.strip().lower() in ("y", "yes")
