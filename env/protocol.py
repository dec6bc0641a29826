"""The tool-call protocol: Hermes / Qwen2.5 `<tool_call>` blocks, parsed strictly.

An assistant turn is raw text. Each block

    <tool_call>
    {"name": "read_file", "arguments": {"path": "src/a.py"}}
    </tool_call>

is one call; several blocks in one turn are parallel calls. Nothing the model writes is
silently dropped or read as plain text: every block that is not a valid call (bad JSON,
unknown tool, missing, unexpected or mistyped arguments, an unclosed or stray tag) becomes
a `MalformedCall` whose `error` says exactly what was wrong. The episode answers it with a
tool message carrying that error and counts it, which is what lets RL treat malformed
calls as explicit negatives (Composer's fix for "hack 1", recipe section 6).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TAG = re.compile(r"</?tool_call>")

_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class MalformedCall:
    raw: str  # the text of the block (or of the stray tag) as the model wrote it
    error: str
    name: str | None = None  # the tool name, when one could be read


@dataclass
class ParsedTurn:
    content: str  # prose outside the blocks, stripped
    calls: list[ToolCall | MalformedCall]

    @property
    def valid_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if isinstance(c, ToolCall)]

    @property
    def malformed_calls(self) -> list[MalformedCall]:
        return [c for c in self.calls if isinstance(c, MalformedCall)]


def format_tool_call(name: str, arguments: dict) -> str:
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"


def format_assistant_turn(content: str | None, calls: list[tuple[str, dict]] | list[ToolCall] = ()) -> str:
    """The canonical text of an assistant turn; the chat template renders `tool_calls` identically."""
    blocks = [format_tool_call(c.name, c.arguments) if isinstance(c, ToolCall) else format_tool_call(*c)
              for c in calls]
    body = "\n".join(blocks)
    content = (content or "").strip()
    if content and body:
        return f"{content}\n{body}"
    return content or body


def _type_error(value, spec: dict) -> str | None:
    if value is None:
        return None if spec.get("nullable") else "must not be null"
    expected = spec.get("type")
    if expected is None:
        return None
    types = _JSON_TYPES.get(expected, ())
    ok = isinstance(value, types) and not (expected in ("integer", "number") and isinstance(value, bool))
    if not ok:
        return f"must be of type {expected}, got {type(value).__name__} {json.dumps(value)[:40]}"
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {spec['enum']}, got {value!r}"
    return None


def validate_call(payload, schemas: dict[str, dict], raw: str) -> ToolCall | MalformedCall:
    """Check a decoded block against the tool schemas (the `function` part of each schema)."""
    if not isinstance(payload, dict):
        return MalformedCall(raw, f"a tool call must be a JSON object, got {type(payload).__name__}")
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(raw, 'a tool call needs a "name" string')
    extra = set(payload) - {"name", "arguments"}
    if extra:
        return MalformedCall(raw, f'unexpected keys {sorted(extra)}: a tool call has only "name" and "arguments"',
                             name)
    if name not in schemas:
        return MalformedCall(raw, f"unknown tool {name!r}; available tools: {', '.join(sorted(schemas))}", name)
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        return MalformedCall(raw, f'"arguments" must be a JSON object, got {type(arguments).__name__}', name)
    params = schemas[name].get("parameters", {})
    properties = params.get("properties", {})
    problems = []
    for key in params.get("required", []):
        if key not in arguments:
            problems.append(f"missing required argument {key!r}")
    for key, value in arguments.items():
        if key not in properties:
            problems.append(f"unexpected argument {key!r} (allowed: {', '.join(properties) or 'none'})")
        elif (err := _type_error(value, properties[key])) is not None:
            problems.append(f"argument {key!r} {err}")
    if problems:
        return MalformedCall(raw, f"{name}: " + "; ".join(problems), name)
    return ToolCall(name, arguments)


def parse_turn(text: str, schemas: dict[str, dict]) -> ParsedTurn:
    """Split an assistant turn into prose and calls; never raises on any input string."""
    calls: list[ToolCall | MalformedCall] = []
    prose: list[str] = []
    pos = 0
    while True:
        m = _TAG.search(text, pos)
        if m is None:
            prose.append(text[pos:])
            break
        prose.append(text[pos:m.start()])
        if m.group() == CLOSE:
            calls.append(MalformedCall(CLOSE, f"stray {CLOSE} without an opening {OPEN}"))
            pos = m.end()
            continue
        nxt = _TAG.search(text, m.end())
        if nxt is None or nxt.group() == OPEN:
            end = nxt.start() if nxt else len(text)
            calls.append(MalformedCall(text[m.start():end], f"unclosed {OPEN} tag: close each call with {CLOSE}"))
            pos = end
            continue
        raw = text[m.start():nxt.end()]
        body = text[m.end():nxt.start()].strip()
        pos = nxt.end()
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(MalformedCall(raw, f"invalid JSON in tool call: {e.msg} at line {e.lineno} column {e.colno}"))
            continue
        calls.append(validate_call(payload, schemas, raw))
    return ParsedTurn("".join(prose).strip(), calls)
