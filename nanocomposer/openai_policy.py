"""A policy that calls an OpenAI-compatible chat endpoint: vLLM's `vllm serve`, SGLang, llama.cpp's server, Ollama.

    --policy openai:<model>@<base_url>                  e.g. openai:qwen2.5-coder@http://127.0.0.1:8000/v1
    --policy openai:<model>@<base_url>?mode=tools&concurrency=8&timeout_s=60&retries=4&backoff_s=0.5

The key is $OPENAI_API_KEY (sent as `Authorization: Bearer`; never a flag, never recorded); unset, no header
is sent (local servers need none). Options ride in the URL's query, so the one spec string means the same
policy in eval.py (--policy, --compare), the SFT check's `run_policy` and `agent.py run --model`:

- `mode=text` (default): the tool list goes into the system message in Hermes form (Qwen2.5's wording, full
  JSON schemas) and tool results go back as user turns of `<tool_response>` blocks, so any chat server works;
  the returned text is the turn, read by env.protocol.parse_turn like our own models' text.
- `mode=tools`: our tool schemas go in the request's `tools`, earlier calls as `tool_calls` with ids and tool
  results as `tool` messages; the response's `tool_calls` are written back as Hermes blocks (arguments kept as
  the server sent them), so parse_turn judges them exactly as it judges ours: bad JSON arguments, an unknown
  tool or a mistyped argument that the server passes through is a counted malformed call.
- `concurrency` (default 4): requests in flight at once across every episode of a run (a runner's episodes
  share this policy: `act_batch`, or `open_stream` so each turn goes back to its episode as soon as it is done).
- `timeout_s` (default 120) per request; `retries` (default 4) more tries after a 429, a 5xx, a timeout or a
  refused connection, waiting backoff_s * 2^try (default 0.5 s, at most 30 s; a server's Retry-After is
  honoured up to 30 s). Any other 4xx is not retried. A request that still fails is the turn's exception:
  its episode ends `policy_error` with the reason (EndpointError), the run goes on and finished episodes stay.

Sampling: the run's temperature, top_p and max_new_tokens are sent (`max_tokens`), with a `seed` derived from
(the run's seed, the episode key, the turn) as our checkpoints derive theirs (servers that honour it repeat).
Token counts come from the response's `usage`. The tokens are not ours (another tokenizer, no ids, no
logprobs): every turn's meta says so (`foreign_tokens`: the endpoint), RL refuses such trajectories with one
line (nanocomposer.rollout_tokens), and SFT export may use them (data/build_sft.py reads only text and calls).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx

from env.episode import FOREIGN_TOKENS, Generation, TurnRequest
from env.protocol import CLOSE, OPEN, decode_call_json, format_tool_call

PREFIX = "openai:"
MODES = ("text", "tools")
OPTIONS = {"mode": str, "concurrency": int, "timeout_s": float, "retries": int, "backoff_s": float}
DEFAULTS = {"mode": "text", "concurrency": 4, "timeout_s": 120.0, "retries": 4, "backoff_s": 0.5}
MAX_WAIT_S = 30.0  # the longest single backoff or Retry-After honoured
RETRIED = frozenset({408, 409, 429}) | frozenset(range(500, 600))
KEY_ENV = "OPENAI_API_KEY"
# Qwen2.5's tool prompt (its chat template's wording), so a Qwen model served elsewhere reads what it was trained on.
TOOLS_HEADER = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")


class EndpointError(RuntimeError):
    """The endpoint did not give a usable answer (after the retries); the message says what it answered."""


def parse_spec(spec: str) -> dict:
    """{"model", "base_url", **options} of `openai:<model>@<base_url>[?options]`; ValueError, one line, otherwise."""
    if not spec.startswith(PREFIX):
        raise ValueError(f"policy {spec!r}: not an openai:<model>@<base_url> spec")
    rest = spec[len(PREFIX):]
    at = max(rest.rfind("@http://"), rest.rfind("@https://"))
    if at <= 0:
        raise ValueError(f"policy {spec!r}: expected openai:<model>@<base_url>, e.g. "
                         "openai:qwen2.5-coder@http://127.0.0.1:8000/v1")
    model, url = rest[:at], urlsplit(rest[at + 1:])
    if not url.hostname or any(c.isspace() for c in rest):
        raise ValueError(f"policy {spec!r}: {rest[at + 1:]!r} is not a base URL (http://host:port/v1)")
    options = dict(DEFAULTS)
    for key, value in parse_qsl(url.query, keep_blank_values=True):
        if key not in OPTIONS:
            raise ValueError(f"policy {spec!r}: unknown option {key!r} (options: {', '.join(OPTIONS)})")
        try:
            options[key] = OPTIONS[key](value)
        except ValueError:
            raise ValueError(f"policy {spec!r}: option {key}={value!r} is not a {OPTIONS[key].__name__}") from None
    if options["mode"] not in MODES:
        raise ValueError(f"policy {spec!r}: mode={options['mode']!r}; expected one of {', '.join(MODES)}")
    for key, low in (("concurrency", 1), ("retries", 0)):
        if options[key] < low:
            raise ValueError(f"policy {spec!r}: {key}={options[key]} must be >= {low}")
    for key in ("timeout_s", "backoff_s"):
        if not 0 <= options[key] < float("inf") or (key == "timeout_s" and options[key] == 0):
            raise ValueError(f"policy {spec!r}: {key}={options[key]} must be a positive number of seconds")
    base_url = urlunsplit((url.scheme, url.netloc, url.path.rstrip("/"), "", ""))
    return {"model": model, "base_url": base_url, **options}


def label(spec: str) -> str:
    """How tables name the policy: `openai:<model>@<host:port>`."""
    parsed = parse_spec(spec)
    return f"openai:{parsed['model']}@{urlsplit(parsed['base_url']).netloc}"


def build(spec: str, sampling: dict | None = None, **_) -> OpenAIPolicy:
    return OpenAIPolicy(spec, sampling)


# ------------------------------------------------------------------------------------------------ messages
def _tool_prompt(tools: list[dict]) -> str:
    return TOOLS_HEADER + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_FOOTER


def text_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation for a text-mode request: tools in the system message, tool results as user turns."""
    out: list[dict] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tools"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tools": True})
        else:
            out.append({"role": role, "content": content})
    if tools:
        if out and out[0]["role"] == "system":
            out[0]["content"] += _tool_prompt(tools)
        else:
            out.insert(0, {"role": "system", "content": _tool_prompt(tools).lstrip("\n")})
    return [{k: v for k, v in m.items() if k != "_tools"} for m in out]


def tools_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation for a tools-mode request: each assistant turn's Hermes blocks as `tool_calls` (ids
    call_<turn>_<i>), each tool result as a `tool` message answering the next id. A malformed call goes back
    under its name (or "invalid") with arguments "{}": its tool message holds the error the harness answered."""
    from env.protocol import MalformedCall, parse_turn

    schemas = {t["function"]["name"]: t["function"] for t in tools}
    out: list[dict] = []
    pending: list[str] = []
    turn = 0
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant":
            parsed = parse_turn(content, schemas)
            calls = []
            for i, call in enumerate(parsed.calls):
                name = (call.name or "invalid") if isinstance(call, MalformedCall) else call.name
                arguments = "{}" if isinstance(call, MalformedCall) else json.dumps(call.arguments, ensure_ascii=False)
                calls.append({"id": f"call_{turn}_{i}", "type": "function",
                              "function": {"name": name, "arguments": arguments}})
            out.append({"role": "assistant", "content": parsed.content or None, **({"tool_calls": calls} if calls else {})})
            pending = [c["id"] for c in calls]
            turn += 1
        elif role == "tool":
            call_id = pending.pop(0) if pending else f"call_{turn}_orphan"
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            out.append({"role": role, "content": content})
    return out


def _escape_tags(text: str) -> str:
    """JSON text with its tool-call tags escaped (`<` as \\u003c: only inside strings in valid JSON), so an argument
    that quotes a tag cannot end the block early."""
    return text.replace("<", "\\u003c") if OPEN[1:] in text or CLOSE[2:] in text else text


def call_block(call: dict) -> str:
    """One response `tool_calls` entry as the Hermes block our own models write; its arguments as the server sent
    them, so parse_turn finds exactly what is wrong with a bad one."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return f"{OPEN}\n{json.dumps(call, ensure_ascii=False)[:2000]}\n{CLOSE}"
    name, arguments = function.get("name"), function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = decode_call_json(arguments) if arguments.strip() else {}
        except ValueError:  # not JSON: kept verbatim, and parse_turn reports it
            raw = arguments
        else:
            raw = None
    else:
        raw = None
    if raw is None:
        dumped = json.dumps(arguments, ensure_ascii=False)
        if isinstance(name, str) and isinstance(arguments, dict) and _escape_tags(dumped) == dumped:
            return format_tool_call(name, arguments)  # the canonical text: what SFT export expects
        raw = dumped
    head = f'"name": {json.dumps(name, ensure_ascii=False)}, ' if name is not None else ""
    return f"{OPEN}\n{{{head}\"arguments\": {_escape_tags(raw)}}}\n{CLOSE}"


def turn_text(message: dict, mode: str) -> str:
    """The assistant turn's text from a response message: its content, then (tools mode) a block per call."""
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    content = content if isinstance(content, str) else ""
    if mode == "text":
        return content
    calls = message.get("tool_calls") or []
    blocks = "\n".join(call_block(c) for c in calls) if isinstance(calls, list) else ""
    return f"{content.strip()}\n{blocks}" if content.strip() and blocks else content.strip() or blocks


# -------------------------------------------------------------------------------------------------- policy
def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "little") & (2**31 - 1)


class OpenAIPolicy:
    """An OpenAI-compatible endpoint as a batched policy (no per-episode state; module docstring)."""

    def __init__(self, spec: str, sampling: dict | None = None, *, transport: httpx.BaseTransport | None = None):
        self.spec, self.options = spec, parse_spec(spec)
        self.name = spec
        self.mode, self.model = self.options["mode"], self.options["model"]
        sampling = dict(sampling or {})
        self.temperature = float(sampling.get("temperature") if sampling.get("temperature") is not None else 0.0)
        self.top_p = sampling.get("top_p")
        self.max_tokens = sampling.get("max_new_tokens")
        self.seed = int(sampling.get("seed") or 0)
        key = os.environ.get(KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=self.options["base_url"], headers=headers, transport=transport,
                                 timeout=httpx.Timeout(self.options["timeout_s"], connect=min(10.0, self.options["timeout_s"])))
        self.pool = ThreadPoolExecutor(self.options["concurrency"], thread_name_prefix="openai")
        self.stats = {"requests": 0, "retries": 0, "failures": 0, "prompt_tokens": 0, "completion_tokens": 0}
        self._lock = threading.Lock()
        self.episode, self.task_id, self.turn = -1, "", 0

    # the Policy protocol (a lone episode: `act`); the runner and the agent server use act_batch / open_stream
    def reset(self, task) -> None:
        self.episode += 1
        self.task_id, self.turn = getattr(task, "id", str(task)), 0

    def act(self, messages: list[dict], tools: list[dict]) -> Generation:
        request = TurnRequest(messages, tools, f"{self.task_id}#{self.episode}", self.turn)
        self.turn += 1
        return self.complete(request)

    def act_batch(self, requests: list[TurnRequest]) -> list[Generation | BaseException]:
        futures = [self.pool.submit(self._safe, r) for r in requests]
        return [f.result() for f in futures]

    def open_stream(self) -> _Stream:
        return _Stream(self)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.http.close()

    # one request
    def _safe(self, request: TurnRequest) -> Generation | BaseException:
        try:
            return self.complete(request)
        except Exception as e:  # noqa: BLE001  (the turn's failure, returned to its episode)
            return e

    def body(self, request: TurnRequest) -> dict:
        body = {"model": self.model, "temperature": self.temperature,
                "seed": _seed(self.seed, request.episode_key, request.turn)}
        if self.top_p is not None and self.top_p < 1:
            body["top_p"] = self.top_p
        if self.max_tokens:
            body["max_tokens"] = int(self.max_tokens)
        if self.mode == "tools":
            body["messages"] = tools_messages(request.messages, request.tools)
            if request.tools:
                body["tools"] = request.tools
        else:
            body["messages"] = text_messages(request.messages, request.tools)
        return body

    def complete(self, request: TurnRequest) -> Generation:
        data = self._post(self.body(request))
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
            raise EndpointError(f"{self._where()}: the answer has no choices[0].message ({str(data)[:200]})")
        choice, usage = choices[0], data.get("usage") if isinstance(data.get("usage"), dict) else {}
        completion = usage.get("completion_tokens")
        completion = completion if isinstance(completion, int) and not isinstance(completion, bool) else None
        with self._lock:
            self.stats["prompt_tokens"] += usage.get("prompt_tokens") or 0
            self.stats["completion_tokens"] += completion or 0
        meta = {FOREIGN_TOKENS: label(self.spec), "mode": self.mode, "model": data.get("model"),
                "finish_reason": choice.get("finish_reason"),
                "usage": {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens") if k in usage}}
        return Generation(turn_text(choice["message"], self.mode), truncated=choice.get("finish_reason") == "length",
                          completion_tokens=completion, meta=meta)

    def _where(self) -> str:
        return f"{label(self.spec)} ({self.options['base_url']}/chat/completions)"

    def _post(self, body: dict) -> dict:
        tries = self.options["retries"] + 1
        last = ""
        for attempt in range(tries):
            if attempt:
                with self._lock:
                    self.stats["retries"] += 1
            with self._lock:
                self.stats["requests"] += 1
            wait_s = self.options["backoff_s"] * 2 ** attempt * (1 + random.random() / 4)
            try:
                response = self.http.post("/chat/completions", json=body)
            except httpx.TimeoutException:
                last = f"no answer within {self.options['timeout_s']:g} s"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {str(e)[:200] or 'connection failed'}"
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError:
                        self._failed()
                        raise EndpointError(f"{self._where()}: HTTP 200 with a body that is not JSON: "
                                            f"{response.text[:200]!r}") from None
                last = f"HTTP {response.status_code}: {' '.join(response.text.split())[:300]}"
                if response.status_code not in RETRIED:
                    self._failed()
                    raise EndpointError(f"{self._where()}: {last}")
                after = response.headers.get("retry-after", "")
                if after.replace(".", "", 1).isdigit():
                    wait_s = max(wait_s, float(after))
            if attempt + 1 < tries:
                time.sleep(min(wait_s, MAX_WAIT_S))
        self._failed()
        raise EndpointError(f"{self._where()}: {last} (after {tries} tries)")

    def _failed(self) -> None:
        with self._lock:
            self.stats["failures"] += 1


class _Stream:
    """The runner's continuous-batching interface (env.runner): each request is sent when its episode asks and
    returned as soon as its answer is in, while up to `concurrency` others are in flight."""

    def __init__(self, policy: OpenAIPolicy, poll_s: float = 0.05):
        self.policy, self.poll_s = policy, poll_s
        self.running: dict[Future, object] = {}

    def __len__(self) -> int:
        return len(self.running)

    def add(self, key, request: TurnRequest) -> None:
        self.running[self.policy.pool.submit(self.policy._safe, request)] = key

    def step(self, max_steps: int | None = None) -> list[tuple[object, Generation | BaseException]]:
        """The answers that are in, waiting at most poll_s for one (so the runner can collect finished tools)."""
        done, _ = wait(list(self.running), timeout=self.poll_s, return_when=FIRST_COMPLETED)
        return [(self.running.pop(f), f.result()) for f in done]
