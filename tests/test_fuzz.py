"""Fuzzing the harness with hostile assistant turns: no input may raise out of `parse_turn`, `call_tool`
or `run_episode`, and everything they return must be writable as UTF-8 JSON.

The generators live in bench/fuzz.py (`python -m bench.fuzz` runs the same at scale and prints counts)."""

import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fuzz import (
    INTERNAL_ERROR,
    FuzzReplay,
    encodable,
    function_schemas,
    fuzz_turns,
    harness_parts,
    make_fuzz_task,
    make_hostile_workspace,
    parsed_parts,
)
from env.episode import EpisodeConfig, Trajectory, run_episode
from env.protocol import ToolCall, parse_turn
from env.tools import CodeTools, call_tool

SCHEMAS = function_schemas()


@pytest.fixture(scope="module")
def turns() -> list[str]:
    return fuzz_turns(5000, seed=0, schemas=SCHEMAS)


@pytest.fixture
def tools(tmp_path):
    ws = make_hostile_workspace(tmp_path / "ws")
    tools = CodeTools(ws, None, command_timeout_s=2, max_output_chars=2000, ask_user=lambda q: f"You asked: {q}")
    yield tools
    tools.sandbox.close()


def test_parser_survives_5000_fuzzed_turns(turns):
    start = time.perf_counter()
    kinds = {"valid": 0, "malformed": 0}
    for text in turns:
        parsed = parse_turn(text, SCHEMAS)
        assert all(encodable(part) for part in parsed_parts(parsed)), ascii(text)[:300]
        kinds["valid"] += len(parsed.valid_calls)
        kinds["malformed"] += len(parsed.malformed_calls)
        for call in parsed.malformed_calls:
            assert call.error and "\n" not in call.error.strip()  # one clear line for the model
    assert kinds["valid"] > 1000 and kinds["malformed"] > 1000  # the generator exercises both paths
    assert time.perf_counter() - start < 60


_FRAGMENTS = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', ":", ",", '"name"', '"arguments"', '"run"',
              '"command"', '"submit"', '"summary"', '"timeout_s"', "1e400", "NaN", "-Infinity", "9" * 4400, "null",
              "true", "\\ud800", "\ud800", "\x00", "\\u0000", "[" * 1200, "]" * 1200, "é", "🙂", "\n", " ", "\\"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=5)), max_size=40).map("".join))
def test_parser_never_raises_on_fragment_soup(text):
    parsed = parse_turn(text, SCHEMAS)
    assert all(encodable(part) for part in parsed_parts(parsed))


@pytest.mark.parametrize("body, expected", [
    ('{"name": "run", "arguments": {"command": ' + "[" * 1000 + "]" * 1000 + "}}", "nested"),
    ('{"name": "run", "arguments": {"command": ' + "[" * 40 + "]" * 40 + "}}", "nested more than 32"),
    ('{"name": "run", "arguments": {"command": "ls", "timeout_s": ' + "9" * 4301 + "}}", "out of range"),
    ('{"name": "run", "arguments": {"command": "ls", "timeout_s": ' + "1" + "0" * 400 + "}}", "out of range"),
    ('{"name": "run", "arguments": {"command": "ls", "timeout_s": 9223372036854775808}}', "out of range"),
    ('{"name": "run", "arguments": {"command": "ls", "timeout_s": 1e400}}', "out of range"),
    ('{"name": "run", "arguments": {"command": "ls", "timeout_s": NaN}}', "NaN is not valid JSON"),
    ('{"name": "run", "arguments": {"command": "ls", "timeout_s": -Infinity}}', "-Infinity is not valid JSON"),
    ('{"name": "run", "arguments": {"command": "ls", "timeout_s": 30.0}}', "must be of type integer, got float"),
    ('{"name": "run", "arguments": {"command": "ls", "timeout_s": true}}', "must be of type integer, got bool"),
    ('{"name": "run", "name": "submit", "arguments": {}}', "duplicate key 'name'"),
])
def test_hostile_json_is_a_named_malformed_call(body, expected):
    parsed = parse_turn(f"<tool_call>\n{body}\n</tool_call>", SCHEMAS)
    assert len(parsed.malformed_calls) == 1 and expected in parsed.malformed_calls[0].error


def test_lone_surrogates_become_replacement_characters():
    text = 'prose \ud800 <tool_call>\n{"name": "submit", "arguments": {"summary": "a\\ud800b \udfff"}}\n</tool_call>'
    parsed = parse_turn(text, SCHEMAS)
    assert parsed.content == "prose \ufffd"
    assert parsed.calls == [ToolCall("submit", {"summary": "a\ufffdb \ufffd"})]
    assert encodable(parsed_parts(parsed))


# Values no parser can produce, for callers that pass arguments to call_tool directly.
_DIRECT_VALUES = [None, True, False, 0, -1, 10**400, 10**5000, -(10**5000), 1.5, math.nan, math.inf, -math.inf,
                  "", "\x00", "a\x00b", "\ud800", "x" * 300_000, [], {}, [1], {"a": 1}, b"bytes", object()]


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_argument_of_every_tool_with_every_wrong_value(tools, name):
    props = SCHEMAS[name]["parameters"]["properties"]
    good = {"path": "calc/ops.py", "start_line": 1, "end_line": 2, "old_str": "zzz", "new_str": "y", "pattern": "add",
            "query": "add", "k": 2, "command": "true", "timeout_s": 2, "target": "tests/test_ops.py",
            "question": "?", "summary": "done"}
    for arg in props:
        for value in _DIRECT_VALUES:
            arguments = {a: good[a] for a in SCHEMAS[name]["parameters"].get("required", [])} | {arg: value}
            result = call_tool(tools, name, arguments)
            assert isinstance(result, str) and encodable(result), (name, arg, ascii(value)[:60])
            assert not result.startswith(INTERNAL_ERROR), result
    for arguments in ({"nonsense": 1}, {}, "not a dict", None):
        result = call_tool(tools, name, arguments)
        assert encodable(result) and not result.startswith(INTERNAL_ERROR)
        if arguments != {} or SCHEMAS[name]["parameters"].get("required"):
            assert result.startswith("Error: "), (name, arguments, result)
    assert call_tool(tools, "no_such_tool", {}).startswith("Error: unknown tool")


def test_call_tool_survives_fuzzed_calls_on_a_hostile_workspace(tools):
    """Valid calls from fuzzed turns (a few hundred, real sandboxed commands), over a workspace with a symlink
    loop, links to host files, a FIFO, a socket, binary data and a non-UTF-8 file name."""
    ran = 0
    for text in fuzz_turns(400, seed=1, schemas=SCHEMAS):
        for call in parse_turn(text, SCHEMAS).valid_calls:
            result = call_tool(tools, call.name, call.arguments)
            ran += 1
            assert isinstance(result, str) and encodable(result), (call.name, ascii(call.arguments)[:200])
            assert not result.startswith(INTERNAL_ERROR), result
            assert "root:x:0:0" not in result or call.name == "run"  # file tools never read host files
        assert encodable(tools.submission)
    assert ran > 150


class _Raises:
    def __call__(self, question):
        raise EOFError("the terminal closed")


def test_tools_turn_hostile_inputs_into_errors(tools):
    cases = [
        ("run", {"command": "echo a\x00b"}, "NUL byte"),
        ("grep", {"pattern": "a\x00"}, "NUL byte"),
        ("read_file", {"path": "loop"}, "cannot be resolved"),
        ("read_file", {"path": "pingpong"}, "cannot be resolved"),
        ("edit_file", {"path": "loop/x", "old_str": "", "new_str": "x"}, "cannot be resolved"),
        ("read_file", {"path": "fifo"}, "not a regular file"),
        ("grep", {"pattern": "x", "path": "fifo"}, "neither a directory nor a regular file"),
        ("grep", {"pattern": "x", "path": "sock"}, "neither a directory nor a regular file"),
        ("read_file", {"path": "passwd_link"}, "outside the workspace"),
        ("run", {"command": "true", "timeout_s": 10**400}, "out of range"),
        ("run", {"command": "x" * 200_000}, "characters long"),
    ]
    for name, arguments, expected in cases:
        start = time.monotonic()
        result = call_tool(tools, name, arguments)
        assert result.startswith("Error: ") and expected in result, (name, result)
        assert time.monotonic() - start < 1.5, (name, "must not wait on a FIFO")
    tools.answer_question = _Raises()
    assert "could not answer" in call_tool(tools, "ask_user", {"question": "?"})
    assert call_tool(tools, "submit", {"summary": "ok"}) == "Submitted."
    tools.submit("bad \ud800 text")  # called directly, past the parser
    assert tools.submission == "bad \ufffd text"


@pytest.mark.slow  # `make test-fast` leaves it out
def test_episodes_replaying_fuzzed_turns_return_trajectories(tmp_path, turns):
    task = make_fuzz_task(tmp_path / "task")
    config = EpisodeConfig(max_turns=3, max_wall_s=60, command_timeout_s=2)
    statuses = set()
    for i in range(200):
        chunk = turns[3 * i: 3 * i + 3]
        traj = run_episode(task, FuzzReplay(chunk), config)
        assert isinstance(traj, Trajectory), ascii(chunk)[:300]
        assert all(encodable(part) for part in harness_parts(traj)), ascii(chunk)[:300]
        statuses.add(traj.exit_status)
        json.dumps(traj.grade)
    assert {"submitted", "repeated_malformed"} & statuses
