"""Fuzz the harness with hostile assistant turns: the parser, the tools, whole episodes.

    python -m bench.fuzz [--n 5000] [--seed 0] [--tool-turns N] [--episodes 200] [--json out.json]

Every generated string is what a policy might write: prose and `<tool_call>` blocks with deep
nesting, huge integers, NaN, NUL bytes, lone surrogates, odd unicode, unclosed / nested / stray
tags, wrong types for every argument of every tool, huge strings, and mutations of valid calls.
Each goes through `parse_turn`; the valid calls of the first `--tool-turns` strings run through
`call_tool` on a real (sandboxed) `CodeTools` over a small workspace that holds a symlink loop, a
symlink to a host file, a FIFO, a socket, a binary file and a non-UTF-8 file name; `--episodes`
short episodes replay the strings through `run_episode`.

It prints, per place (parser, tools, episodes), how many inputs raised (the harness must never raise
on model output), how many produced text that is not UTF-8 encodable (it would crash a JSON writer
later), and throughput. Exit status 1 when any count is not zero.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

from env.protocol import MalformedCall, ToolCall, parse_turn
from env.tools import CodeTools, call_tool, tool_schemas

OPEN, CLOSE = "<tool_call>", "</tool_call>"
INTERNAL_ERROR = "Error: internal error"  # what call_tool says when a tool failed in a way nobody foresaw

# JSON *text* fragments: several hostile values (10**5000, NaN, raw lone surrogates, nesting deeper than
# the recursion limit) cannot be produced by json.dumps, so values are written as text.
_NUMBERS = ["0", "-1", "1", "3", "120", "121", "-5", "2", "1.5", "30.0", "-0.0", "1e400", "-1e400", "NaN",
            "Infinity", "-Infinity", "1" + "0" * 400, "9" * 4301, "-" + "9" * 5000, "9223372036854775808",
            "1e-400", "0x10", "01", "true", "false", "null"]
_STRINGS = ['""', '"x"', '"\\u0000"', '"a\\u0000b"', '"\\ud800"', '"\\udfff tail"', '"\\ud83d\\ude00"',
            '"\\udc80\\ud800"', '"ü🙂\u202e\u0301\ufeff"', '"\\n\\t\\r"', '"' + "a" * 200_000 + '"',
            '"' + "\\n" * 20_000 + '"', '"' + "é" * 5000 + '"']
_PATHS = ['"../../etc/passwd"', '"/etc/passwd"', '"loop"', '"loop/x"', '"pingpong"', '"fifo"', '"sock"',
          '"passwd_link"', '"rootlink/etc/passwd"', '"."', '""', '"a/b/../../.."', '"~"', '"' + "x" * 300 + '"',
          '"calc/"', '"calc/ops.py"', '"calc/ops.py::test"', '"tests/test_ops.py"', '"bin.dat"',
          '"tests/test_ops.py::test_add"', '"calc/ops.py\\u0000"', '"\\ud800.py"', '"dir/../calc/ops.py"',
          '"calc//ops.py"', '"./calc/ops.py"', '"nope.py"', '"::"', '"' + "a/" * 2000 + '"']
_PATTERNS = ['"("', '"["', '"\\\\"', '"(a+)+$"', '"-e"', '"--files"', '"a{99999}"', '"def"', '"\\\\x00"',
             '"a\\u0000"', '"\\ud800"', '".*"', '"(?P<x"', '"\\\\p{Greek}"']
_COMMANDS = ['"echo hi"', '"true"', '"exit 3"', '"ls -la"', '"printf \'\\\\xff\\\\xfe\\\\x00x\'"',
             '"head -c 3000 /dev/urandom"', '"yes | head -c 100000"', '"echo a\\u0000b"', '"\\ud800"',
             '"mkfifo fifo2 2>&1; ls"', '"ln -sfn loop2 loop2; ln -sfn / rootlink2; ls"', '"kill -9 $$"',
             '"python3 -c \\"import socket,os; socket.socket(socket.AF_UNIX).bind(\'sock%d\' % os.getpid())\\""',
             '"touch $\'\\\\xff\\\\xfe.py\'"', '"cat /etc/shadow"', '""', '"' + "x" * 200_000 + '"',
             '"echo \\ud83d\\ude00"', '"ulimit -a | head -3"']


def deep(rng: random.Random) -> str:
    depth = rng.choice([50, 500, 999, 1000, 3000, 100_000])
    if rng.random() < 0.5:
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def nasty_value(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.3:
        return rng.choice(_NUMBERS)
    if pick < 0.55:
        return rng.choice(_STRINGS)
    if pick < 0.65:
        return deep(rng)
    if pick < 0.75:
        return rng.choice(["[]", "{}", '[1, "a"]', '{"a": null}', '["x"]'])
    if pick < 0.8:  # a raw lone surrogate or NUL inside a JSON string (not escaped)
        return '"' + rng.choice(["\ud800", "\udfff", "\x00", "\ud83d", "a\udc80b"]) + '"'
    return rng.choice(_PATHS + _PATTERNS + _COMMANDS)


def plausible_value(rng: random.Random, tool: str, arg: str, spec: dict) -> str:
    if tool == "run" and arg == "command":
        return rng.choice(_COMMANDS)
    if tool == "grep" and arg == "pattern":
        return rng.choice(_PATTERNS)
    if arg in ("path", "target"):
        return rng.choice(_PATHS)
    if spec.get("type") == "integer":
        return rng.choice(["1", "2", "5", "20", "0", "-3", "121", "1" + "0" * 400, "2"])
    if arg in ("old_str", "new_str"):
        return rng.choice(['""', '"a - b"', '"a + b"', '"(a, b)"', '"X = 1\\n"', '"\\ud800"', '"\\u0000"'])
    return rng.choice(_STRINGS[:10] + ['"where is add"', '"done"'])


def tool_block_body(rng: random.Random, schemas: dict[str, dict]) -> str:
    """The JSON text of one call to a real tool, each argument plausible or hostile."""
    name = rng.choice(sorted(schemas))
    props = schemas[name]["parameters"]["properties"]
    required = set(schemas[name]["parameters"].get("required", []))
    parts = []
    for arg, spec in props.items():
        if arg not in required and rng.random() < 0.5:
            continue
        if arg in required and rng.random() < 0.03:
            continue  # a missing required argument
        value = nasty_value(rng) if rng.random() < 0.35 else plausible_value(rng, name, arg, spec)
        parts.append(f'"{arg}": {value}')
    if rng.random() < 0.05:
        key = rng.choice(["mode", "", "path", "x" * 100, "\ud800"])
        parts.append(f'"{key}": {nasty_value(rng)}')
    arguments = "{" + ", ".join(parts) + "}"
    if rng.random() < 0.03:
        arguments = nasty_value(rng)
    name_text = json.dumps(name) if rng.random() > 0.03 else nasty_value(rng)
    return f'{{"name": {name_text}, "arguments": {arguments}}}'


def mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(text) + 1)
        op = rng.random()
        if op < 0.4:
            text = text[:i] + rng.choice(['"', "{", "}", "[", "]", ",", ":", "\\", "\x00", "\ud800", "<", ">",
                                          "\n", "é", OPEN, CLOSE]) + text[i:]
        elif op < 0.7:
            text = text[:i] + text[i + rng.randint(1, 5):]
        else:
            text = text[:i]
    return text


def prose(rng: random.Random) -> str:
    return rng.choice(["", "Let me look.", "ü🙂 \u202eevil", "a\x00b", "lone \ud800 surrogate", "<tool_cal",
                       "</tool_call", "<tool_call >", "<TOOL_CALL>", "\ufeff", "x" * 5000, "\n\n", "🙂" * 100])


def block(rng: random.Random, schemas: dict[str, dict]) -> str:
    body = tool_block_body(rng, schemas)
    kind = rng.random()
    if kind < 0.15:
        body = mutate(rng, body)
    elif kind < 0.2:
        return OPEN + "\n" + body  # unclosed
    elif kind < 0.25:
        return f"{OPEN}{OPEN}\n{body}\n{CLOSE}{CLOSE}"  # nested
    elif kind < 0.28:
        return CLOSE + body
    elif kind < 0.32:
        body = rng.choice([deep(rng), nasty_value(rng), "", "null", "[]", "\x00", "\ud800"])
    return f"{OPEN}\n{body}\n{CLOSE}"


def fuzz_turn(rng: random.Random, schemas: dict[str, dict]) -> str:
    pieces = [prose(rng)]
    for _ in range(rng.choice([0, 1, 1, 1, 2, 2, 3, 4])):
        pieces.append(block(rng, schemas))
        if rng.random() < 0.3:
            pieces.append(prose(rng))
    text = "\n".join(pieces)
    if rng.random() < 0.1:
        text = mutate(rng, text)
    return text


def fuzz_turns(n: int, seed: int, schemas: dict[str, dict]) -> list[str]:
    rng = random.Random(seed)
    return [fuzz_turn(rng, schemas) for _ in range(n)]


def function_schemas() -> dict[str, dict]:
    return {s["function"]["name"]: s["function"] for s in tool_schemas(CodeTools)}


# ------------------------------------------------------------------ the workspace the tools act on
FUZZ_REPO = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/test_ops.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
}


def make_hostile_workspace(dest: Path) -> Path:
    """A small repo plus what an agent (or a bad task) can plant: loops, host links, a FIFO, a socket."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel, text in FUZZ_REPO.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    (dest / "bin.dat").write_bytes(bytes(range(256)) * 4)
    os.symlink("loop", dest / "loop")
    os.symlink("pong", dest / "pingpong")
    os.symlink("pingpong", dest / "pong")
    os.symlink("/etc/passwd", dest / "passwd_link")
    os.symlink("/", dest / "rootlink")
    os.mkfifo(dest / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(dest / "sock"))
    sock.close()
    (dest / os.fsdecode(b"bad\xffname.py")).write_text("x = 1\n")
    return dest


def encodable(value) -> bool:
    """True when `value` (a string or a JSON-like structure) can be written as UTF-8 JSON."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return True
    except (UnicodeEncodeError, ValueError, RecursionError, TypeError):
        return False


def parsed_parts(parsed) -> list:
    out = [parsed.content]
    for call in parsed.calls:
        if isinstance(call, MalformedCall):
            out += [call.raw, call.error, call.name]
        else:
            out += [call.name, call.arguments]
    return out


def fuzz_parser(turns: list[str], schemas: dict, failures: Counter, examples: dict) -> list:
    parsed_turns = []
    for text in turns:
        try:
            parsed = parse_turn(text, schemas)
        except Exception as e:  # noqa: BLE001  (counting is the point)
            _note(failures, examples, "parser: exception", text, e)
            parsed_turns.append(None)
            continue
        if not all(encodable(p) for p in parsed_parts(parsed)):
            _note(failures, examples, "parser: unencodable output", text, None)
        parsed_turns.append(parsed)
    return parsed_turns


def fuzz_tools(parsed_turns: list, tools: CodeTools, failures: Counter, examples: dict) -> int:
    calls = 0
    for parsed in parsed_turns:
        for call in (parsed.calls if parsed else []):
            if not isinstance(call, ToolCall):
                continue
            calls += 1
            try:
                result = call_tool(tools, call.name, call.arguments)
            except Exception as e:  # noqa: BLE001
                _note(failures, examples, f"tools: exception in {call.name}", call.arguments, e)
                continue
            if not isinstance(result, str) or not encodable(result):
                _note(failures, examples, f"tools: unencodable result of {call.name}", call.arguments, None)
            elif result.startswith(INTERNAL_ERROR):
                _note(failures, examples, f"tools: internal error in {call.name}", call.arguments, result)
        if not isinstance(tools.submission, str) or not encodable(tools.submission):
            _note(failures, examples, "tools: unencodable submission", tools.submission, None)
            tools.submission = ""
    return calls


class FuzzReplay:
    """Replays a fixed list of assistant turns (then writes nothing)."""

    name = "fuzz-replay"

    def __init__(self, turns: list[str]):
        self.turns = list(turns)

    def reset(self, task) -> None:
        self.queue = list(self.turns)

    def act(self, messages, tools) -> str:
        return self.queue.pop(0) if self.queue else ""


def make_fuzz_task(dest: Path):
    from env.tasks import load_task, write_task

    write_task(dest, id="fuzz", instruction="Fix add.", test_command="test -f calc/ops.py && cat .submission.txt",
               repo=FUZZ_REPO, timeout_s=10, user_answer="No idea.")
    return load_task(dest)


def harness_parts(traj) -> list:
    """What the parser and the tools put in a trajectory (the raw assistant text is the policy's)."""
    parts = [traj.submission, traj.error]
    for turn in traj.turns:
        parts += [[c.get("raw"), c.get("error"), c.get("arguments")] for c in turn["calls"]]
    parts += [m["content"] for m in traj.messages if m["role"] == "tool"]
    return parts


def fuzz_episodes(turns: list[str], task, episodes: int, turns_per_episode: int, failures: Counter,
                  examples: dict) -> int:
    from env.episode import EpisodeConfig, Trajectory, run_episode

    config = EpisodeConfig(max_turns=turns_per_episode, max_wall_s=60, command_timeout_s=5)
    done = 0
    for i in range(episodes):
        chunk = [turns[(i * turns_per_episode + j) % len(turns)] for j in range(turns_per_episode)]
        try:
            traj = run_episode(task, FuzzReplay(chunk), config)
        except Exception as e:  # noqa: BLE001
            _note(failures, examples, "episodes: exception", chunk, e)
            continue
        done += 1
        if not isinstance(traj, Trajectory):
            _note(failures, examples, "episodes: no Trajectory", chunk, None)
        elif not all(encodable(p) for p in harness_parts(traj)):
            _note(failures, examples, "episodes: unencodable harness output", chunk, None)
        elif not encodable(traj.to_record(token_ids=True)):
            _note(failures, examples, "episodes: trajectory not writable (policy text)", chunk, None)
    return done


def _note(failures: Counter, examples: dict, place: str, data, exc) -> None:
    if isinstance(exc, BaseException):
        place = f"{place} {type(exc).__name__}"
    failures[place] += 1
    if place not in examples:
        shown = ascii(data)[:300]
        err = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:300] if isinstance(
            exc, BaseException) else ascii(exc)[:300]
        examples[place] = {"input": shown, "error": err}


def run_fuzz(n: int, seed: int, tool_turns: int, episodes: int, turns_per_episode: int = 3) -> dict:
    schemas = function_schemas()
    turns = fuzz_turns(n, seed, schemas)
    failures: Counter = Counter()
    examples: dict = {}
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        t0 = time.perf_counter()
        parsed = fuzz_parser(turns, schemas, failures, examples)
        parser_s = time.perf_counter() - t0
        ws = make_hostile_workspace(scratch / "ws")
        tools = CodeTools(ws, None, command_timeout_s=2, max_output_chars=2000, ask_user=lambda q: f"You asked: {q}")
        t0 = time.perf_counter()
        try:
            calls = fuzz_tools(parsed[:tool_turns], tools, failures, examples)
        finally:
            tools.sandbox.close()
        tools_s = time.perf_counter() - t0
        task = make_fuzz_task(scratch / "task")
        t0 = time.perf_counter()
        ran = fuzz_episodes(turns, task, episodes, turns_per_episode, failures, examples)
        episodes_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    by_place = {p: sum(v for k, v in failures.items() if k.startswith(p)) for p in ("parser", "tools", "episodes")}
    return {
        "n": n, "seed": seed,
        "parser": {"strings": n, "s": round(parser_s, 2), "per_s": round(n / max(parser_s, 1e-9)),
                   "valid_calls": sum(len(p.valid_calls) for p in parsed if p),
                   "malformed_calls": sum(len(p.malformed_calls) for p in parsed if p)},
        "tools": {"turns": min(tool_turns, n), "calls": calls, "s": round(tools_s, 2),
                  "per_s": round(calls / max(tools_s, 1e-9), 1)},
        "episodes": {"episodes": episodes, "returned": ran, "s": round(episodes_s, 2),
                     "per_s": round(episodes / max(episodes_s, 1e-9), 2)},
        "failures_by_place": by_place,
        "failures": dict(sorted(failures.items())),
        "examples": examples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000, help="fuzzed assistant strings")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool-turns", type=int, default=None, help="strings whose valid calls run (default: all)")
    parser.add_argument("--episodes", type=int, default=200, help="episodes replaying the strings (3 turns each)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if args.n < 1 or args.episodes < 0:
        parser.error("--n must be >= 1 and --episodes >= 0")
    # call_tool logs each internal error with its traceback; here they are counted and one example is shown
    logging.getLogger("env.tools").setLevel(logging.CRITICAL)
    report = run_fuzz(args.n, args.seed, args.n if args.tool_turns is None else args.tool_turns, args.episodes)
    p, t, e = report["parser"], report["tools"], report["episodes"]
    print(f"parser:   {p['strings']} strings in {p['s']} s ({p['per_s']}/s); "
          f"{p['valid_calls']} valid and {p['malformed_calls']} malformed calls")
    print(f"tools:    {t['calls']} calls from {t['turns']} strings in {t['s']} s ({t['per_s']}/s)")
    print(f"episodes: {e['returned']} of {e['episodes']} returned a Trajectory in {e['s']} s ({e['per_s']}/s)")
    print(f"failures by place: {report['failures_by_place']}")
    for place, count in report["failures"].items():
        print(f"  {count:6d}  {place}: e.g. {report['examples'][place]['error']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=True))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
