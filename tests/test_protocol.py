"""Tool-call parsing: strict, never raising, every bad call named precisely."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env.protocol import (
    MalformedCall,
    ToolCall,
    format_assistant_turn,
    format_tool_call,
    parse_turn,
    preview,
    utf8_clean,
    validate_call,
)

SCHEMAS = {
    "read_file": {"parameters": {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string"}, "start_line": {"type": "integer", "nullable": True}}}},
    "submit": {"parameters": {"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}},
}


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_valid_calls_and_prose():
    text = "Reading both.\n" + block('{"name": "read_file", "arguments": {"path": "a.py"}}') + "\n" + \
        block('{"name": "read_file", "arguments": {"path": "b.py", "start_line": 3}}')
    turn = parse_turn(text, SCHEMAS)
    assert turn.content == "Reading both."
    assert turn.calls == [ToolCall("read_file", {"path": "a.py"}), ToolCall("read_file", {"path": "b.py", "start_line": 3})]


@pytest.mark.parametrize("text, expected", [
    (block("{not json"), "invalid JSON in tool call"),
    (block("[1, 2]"), "must be a JSON object, got list"),
    (block('{"arguments": {}}'), 'needs a "name" string'),
    (block('{"name": "rm_rf", "arguments": {}}'), "unknown tool 'rm_rf'; available tools: read_file, submit"),
    (block('{"name": "read_file", "arguments": {}}'), "read_file: missing required argument 'path'"),
    (block('{"name": "read_file", "arguments": {"path": "a", "mode": "w"}}'), "unexpected argument 'mode'"),
    (block('{"name": "read_file", "arguments": {"path": 3}}'), "argument 'path' must be of type string, got int"),
    (block('{"name": "read_file", "arguments": {"path": "a", "start_line": true}}'), "must be of type integer, got bool"),
    (block('{"name": "read_file", "arguments": "path=a"}'), '"arguments" must be a JSON object, got str'),
    (block('{"name": "submit", "arguments": {"summary": "x"}, "id": 1}'), "unexpected keys ['id']"),
    ('<tool_call>\n{"name": "submit", "arguments": {"summary": "x"}}', "unclosed <tool_call> tag"),
    ('done </tool_call>', "stray </tool_call>"),
])
def test_malformed_calls_are_named(text, expected):
    turn = parse_turn(text, SCHEMAS)
    assert len(turn.calls) == 1 and isinstance(turn.calls[0], MalformedCall)
    assert expected in turn.calls[0].error


def test_null_allowed_only_for_nullable():
    ok = parse_turn(block('{"name": "read_file", "arguments": {"path": "a", "start_line": null}}'), SCHEMAS)
    bad = parse_turn(block('{"name": "read_file", "arguments": {"path": null}}'), SCHEMAS)
    assert isinstance(ok.calls[0], ToolCall)
    assert "must not be null" in bad.calls[0].error


def test_unclosed_then_valid_block():
    text = "<tool_call>{\"name\": \"submit\"\n" + block('{"name": "submit", "arguments": {"summary": "s"}}')
    turn = parse_turn(text, SCHEMAS)
    assert [type(c) for c in turn.calls] == [MalformedCall, ToolCall]


def test_canonical_format_round_trips():
    calls = [("read_file", {"path": "a.py"}), ("submit", {"summary": "ünïcode \"quoted\"\nline"})]
    text = format_assistant_turn("Plan.", calls)
    assert text.startswith("Plan.\n<tool_call>\n")
    assert format_assistant_turn(None, calls[:1]) == format_tool_call("read_file", {"path": "a.py"})
    turn = parse_turn(text, SCHEMAS)
    assert [(c.name, c.arguments) for c in turn.calls] == calls and turn.content == "Plan."


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list('<>/{}[]":,\n tool_calnmerugs\\01') + ["<tool_call>", "</tool_call>"]))
       .map("".join))
def test_fuzz_never_raises_and_errors_are_specific(text):
    turn = parse_turn(text, SCHEMAS)
    for call in turn.calls:
        if isinstance(call, MalformedCall):
            assert call.error and call.raw
        else:
            assert call.name in SCHEMAS


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                    max_leaves=8))
def test_fuzz_arbitrary_json_payloads(payload):
    turn = parse_turn(block(json.dumps(payload)), SCHEMAS)
    assert len(turn.calls) == 1
    call = turn.calls[0]
    assert isinstance(call, MalformedCall) or (call.name in SCHEMAS and isinstance(call.arguments, dict))


def test_values_no_json_can_hold_are_refused_on_direct_validation():
    for value, expected in [(10**5000, "out of range"), (float("nan"), "got float NaN"), (float("inf"), "got float Infinity"),
                            ("a\ud800", "lone surrogate")]:
        key = "path" if isinstance(value, str) else "start_line"
        args = {"path": "a", key: value}
        call = validate_call({"name": "read_file", "arguments": args}, SCHEMAS, "")
        assert isinstance(call, MalformedCall) and expected in call.error
        call.error.encode("utf-8")


def test_non_finite_numbers_are_refused_for_number_arguments():
    schemas = {"sleep": {"parameters": {"type": "object", "properties": {"s": {"type": "number"}}}}}
    for value in (float("nan"), float("-inf")):
        call = validate_call({"name": "sleep", "arguments": {"s": value}}, schemas, "")
        assert isinstance(call, MalformedCall) and "must be a finite number" in call.error
    assert "out of range" in validate_call({"name": "sleep", "arguments": {"s": 1e300}}, schemas, "").error


def test_preview_and_utf8_clean_never_raise():
    assert preview(10**5000).startswith("<an integer of about 5001 digits")
    assert preview("x" * 1000, 20) == repr("x" * 1000)[:17] + "..."
    assert preview("\ud800") == "'\\ud800'"
    assert utf8_clean("a\ud800b\udfff") == "a\ufffdb\ufffd" and utf8_clean("🙂") == "🙂"


def test_unknown_tool_names_are_shown_short():
    turn = parse_turn(block(json.dumps({"name": "x" * 10_000, "arguments": {}})), SCHEMAS)
    assert len(turn.calls[0].error) < 200 and len(turn.calls[0].name) <= 100


def test_a_flood_of_blocks_is_capped():
    call = block('{"name": "submit", "arguments": {"summary": "s"}}')
    turn = parse_turn(call * 500 + "<tool_call>" * 10_000, SCHEMAS)
    assert len(turn.calls) == 65 and all(isinstance(c, ToolCall) for c in turn.calls[:64])
    assert "10436 more tool call(s) in this turn were not run: at most 64" in turn.calls[64].error
