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
calls as explicit negatives (Composer's fix for the reward hack of dropping malformed calls from the loss).

`parse_turn` never raises, whatever the text: JSON nested deeper than `MAX_DEPTH`, integers
outside +-(2**63 - 1) (Python refuses to even print ints of 4,300+ digits), NaN / Infinity
(not JSON) and duplicate keys are malformed calls too, and so is every block past the
`MAX_CALLS_PER_TURN`th (all of them together, as one). Every string it returns (prose, raw
blocks, errors, argument values and keys) is UTF-8 encodable: lone surrogates, which a
JSON `\ud800` escape or a careless policy can produce and which crash any UTF-8 writer
later, are replaced by U+FFFD (`utf8_clean`).

The same protocol as a chat template, for tokenizers: `env/chat_template.jinja` (ChatML turns, this module's
`<tool_call>` blocks, a tool list header), read by `load_chat_template`. It is plain text, so the SFT data
builder (data/) checks its rows with it and the model side (nanocomposer.model) installs it on tokenizers,
neither importing the other.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TAG = re.compile(r"</?tool_call>")
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_DEPTH = 32  # tool arguments are flat; anything this deep is garbage, and deeper JSON exhausts recursion
MAX_CALLS_PER_TURN = 64  # blocks past this become one malformed call (a turn of 10,000 blocks is an attack)
MAX_INT = 2**63 - 1  # larger integers are never meaningful tool arguments
_PREVIEW_CHARS = 60
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")

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


class _BadJSON(ValueError):
    """A JSON text that decodes but holds something a tool call must not (NaN, a 5,000-digit integer, ...)."""


def utf8_clean(text: str) -> str:
    """`text` with every surrogate code point replaced by U+FFFD, so it always encodes as UTF-8."""
    return _SURROGATE.sub("\ufffd", text)


def preview(value, limit: int = _PREVIEW_CHARS) -> str:
    """A short, ASCII-safe rendering of any value for an error message (never raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    try:  # repr escapes surrogates and control characters; JSON spelling for everything else
        text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError):
        text = ascii(value) if not isinstance(value, (list, dict)) else f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > 19 or abs(int(text)) > MAX_INT:
        raise _BadJSON(f"integer {preview(text, 24)} ({len(digits)} digits) is out of range; "
                       f"integers must lie within +-{MAX_INT}")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadJSON(f"number {preview(text, 24)} is out of range")
    return value


def _parse_constant(name: str):
    raise _BadJSON(f"{name} is not valid JSON; use a number or null")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _BadJSON(f"duplicate key {preview(key)}")
        out[key] = value
    return out


def _clean_payload(value, depth: int = 0):
    """Surrogate-free copy of a decoded JSON value; _BadJSON when nested deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise _BadJSON(f"JSON nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        return utf8_clean(value)
    if isinstance(value, list):
        return [_clean_payload(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {utf8_clean(k): _clean_payload(v, depth + 1) for k, v in value.items()}
    return value


def decode_call_json(body: str):
    """The decoded JSON of one block, cleaned and bounded; ValueError with a one-line reason otherwise."""
    try:
        payload = json.loads(body, parse_int=_parse_int, parse_float=_parse_float,
                             parse_constant=_parse_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON in tool call: {e.msg} at line {e.lineno} column {e.colno}") from None
    except _BadJSON as e:
        raise ValueError(f"invalid JSON in tool call: {e}") from None
    except RecursionError:
        raise ValueError(f"invalid JSON in tool call: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as e:  # anything else the decoder refuses
        raise ValueError(f"invalid JSON in tool call: {utf8_clean(str(e))[:200]}") from None
    try:
        return _clean_payload(payload)
    except _BadJSON as e:
        raise ValueError(f"invalid JSON in tool call: {e}") from None


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


def load_chat_template() -> str:
    """The project's chat template (`env/chat_template.jinja`; its header is the spec of what it renders)."""
    return CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


def _type_error(value, spec: dict) -> str | None:
    if value is None:
        return None if spec.get("nullable") else "must not be null"
    expected = spec.get("type")
    if expected is None:
        return None
    types = _JSON_TYPES.get(expected, ())
    ok = isinstance(value, types) and not (expected in ("integer", "number") and isinstance(value, bool))
    if not ok:
        return f"must be of type {expected}, got {type(value).__name__} {preview(value, 40)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return f"is out of range (at most {MAX_INT} in size), got {preview(value, 40)}"
    if isinstance(value, str) and _SURROGATE.search(value):
        return "must be valid unicode text (it holds a lone surrogate)"
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {spec['enum']}, got {preview(value, 40)}"
    return None


def validate_call(payload, schemas: dict[str, dict], raw: str) -> ToolCall | MalformedCall:
    """Check a decoded block against the tool schemas (the `function` part of each schema)."""
    if not isinstance(payload, dict):
        return MalformedCall(raw, f"a tool call must be a JSON object, got {type(payload).__name__}")
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(raw, 'a tool call needs a "name" string')
    name = utf8_clean(name)
    extra = set(payload) - {"name", "arguments"}
    if extra:
        shown = ", ".join(preview(k, 30) for k in sorted(extra, key=str)[:5])
        return MalformedCall(raw, f'unexpected keys [{shown}]: a tool call has only "name" and "arguments"',
                             preview(name, 100))
    if name not in schemas:
        return MalformedCall(raw, f"unknown tool {preview(name)}; available tools: {', '.join(sorted(schemas))}",
                             preview(name, 100))
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
            problems.append(f"unexpected argument {preview(key, 40)} (allowed: {', '.join(properties) or 'none'})")
        elif (err := _type_error(value, properties[key])) is not None:
            problems.append(f"argument {key!r} {err}")
    if problems:
        return MalformedCall(raw, f"{name}: " + "; ".join(problems), name)
    return ToolCall(name, arguments)


def parse_turn(text: str, schemas: dict[str, dict]) -> ParsedTurn:
    """Split an assistant turn into prose and calls; never raises on any input string.

    The turn is read after `utf8_clean`, so `raw` and `content` may differ from `text` in exactly
    the surrogates it replaced."""
    if not isinstance(text, str):  # a policy bug; still a turn, not a crash
        text = text.decode("utf-8", "replace") if isinstance(text, (bytes, bytearray)) else str(text)
    text = utf8_clean(text)
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
            payload = decode_call_json(body)
        except ValueError as e:
            calls.append(MalformedCall(raw, str(e)))
            continue
        calls.append(validate_call(payload, schemas, raw))
    if len(calls) > MAX_CALLS_PER_TURN:  # each call is a thread and a message in the episode: bound them
        dropped = len(calls) - MAX_CALLS_PER_TURN
        first = calls[MAX_CALLS_PER_TURN]
        raw = first.raw if isinstance(first, MalformedCall) else format_tool_call(first.name, first.arguments)
        calls = calls[:MAX_CALLS_PER_TURN] + [MalformedCall(
            raw, f"{dropped} more tool call(s) in this turn were not run: at most {MAX_CALLS_PER_TURN} calls per turn")]
    return ParsedTurn("".join(prose).strip(), calls)
