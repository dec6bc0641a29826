"""The agent server's HTTP API (FastAPI). Every error is JSON with an "error" string naming the problem.

    POST /sessions                    {"repo": DIR, "instruction": str} or {"task_dir": DIR} (+ test_command,
                                      timeout_s, client, sample_key: what the session's sampling seeds derive
                                      from, default its id: manager.py) -> 201 {"id", "status"}; 429 when the
                                      queue is full
    GET  /sessions                    ?status=S&limit=N: a list
    GET  /sessions/{id}               status, turns (tool calls with their results), diff, pending question;
                                      ?after_turn=K only turns >= K; ?wait_s=S long-polls (at most 60 s) until a
                                      turn beyond K, a question, or the end; ?tokens=1 adds token ids and logprobs
    GET  /sessions/{id}/result        ?wait_s=S: the finished session (200), 408 if it exceeded its time,
                                      202 {"status"} if still running when the wait ends
    POST /sessions/{id}/messages      {"text"}: answers a pending ask_user question (200), or, on an ended
                                      session, starts a follow-up session (202 {"id", "parent_id"}); 409 while the
                                      session runs without a question
    POST /sessions/{id}/feedback      {"kind": applied|kept|reverted|followup_dissatisfied|rating|abandoned|
                                      question_needless, "value": number (rating: 1-5), "text"} -> 201 {"id"}
    GET  /health; GET /admin/versions; POST /admin/promote {"version"}
    GET  /v1/models; POST /v1/chat/completions   OpenAI-compatible, served by the current version (openai_api.py)

Who may do what (docs/agent-server.md): with a token (`agent.py serve` always has one) every request needs
`Authorization: Bearer <token>` (401 otherwise); /admin/* needs the admin token, or the client token from a
peer whose uid is the server's or root. A request whose Host is not the address served (or localhost, on a
loopback address or a unix socket), or that carries a cross-origin Origin, is refused (421 / 403) before
anything else: a DNS-rebinding web page cannot drive the server. When the connection's peer uid is known
(SO_PEERCRED on a unix socket; the kernel's socket table on loopback TCP: `peer_uid` in the ASGI scope's
state, set by serve.py) and it is another local user, that user may only submit repositories and task
directories it could read itself, sees only its own sessions and never reaches /admin.

Limits (413 past them): a request body of at most MAX_BODY_BYTES, counted as it streams (a Content-Length
or chunked body); instruction and message/feedback texts at most 64 KiB characters, test_command 8 KiB. Strings
with lone surrogates (invalid Unicode), non-finite numbers (NaN, Infinity, 1e999) and out-of-range integers
are 422 with the field named. List views carry instruction previews (first 200 characters, with
`instruction_chars`); the full text is at /sessions/{id}. Long-polls (`wait_s`) wait in the event loop,
holding no thread, to a monotonic deadline of at most MAX_WAIT_S.

Over 500 lines because: every route is a closure in create_app (~175 lines) over the manager and the peer
Guard it checks, beside the request models the routes validate with: the route table above is one file.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import os
import sqlite3
import time
from typing import Annotated

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from nanocomposer.agent.manager import (
    MAX_INSTRUCTION_CHARS,
    MAX_PATH_CHARS,
    MAX_TEST_COMMAND_CHARS,
    BadRequest,
    Forbidden,
    QueueFull,
    SessionManager,
    TooLarge,
)
from nanocomposer.agent.openai_api import add_openai_routes
from nanocomposer.agent.registry import RegistryError
from nanocomposer.agent.store import FEEDBACK_KINDS, TERMINAL, StoreError, finite

MAX_WAIT_S = 60.0
MAX_BODY_BYTES = 1024 * 1024  # a request body; more is 413
DRAIN_BYTES = 64 * 1024 * 1024  # an oversized body is read (and dropped) up to this, so the client gets its 413
MAX_AFTER_TURN = 2 ** 31 - 1
MAX_TEXT_CHARS = MAX_INSTRUCTION_CHARS
_HIDDEN_TURN_FIELDS = ("prompt_ids", "completion_ids", "logprobs")
_HIDDEN_SESSION_FIELDS = ("messages", "tools", "grade", "owner_gids")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


# ---------------------------------------------------------------------------------------------- responses
class SafeJSONResponse(JSONResponse):
    """Every answer is valid JSON in valid UTF-8: a non-finite number becomes null and a lone surrogate (in
    an error message quoting the client's input, or an old row) U+FFFD, instead of a 500."""

    def render(self, content) -> bytes:
        try:
            text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except ValueError:
            text = json.dumps(finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8", "replace")


def _error(status: int, message: str, headers: dict | None = None, **extra) -> SafeJSONResponse:
    return SafeJSONResponse({"error": message, **extra}, status_code=status, headers=headers)


# ------------------------------------------------------------------------------------------------ fields
def _valid_unicode(value: str) -> str:
    for i, c in enumerate(value):
        if 0xD800 <= ord(c) <= 0xDFFF:
            raise ValueError(f"contains a lone surrogate at index {i} (not valid Unicode); send UTF-8 text")
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL character")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def Text(max_length: int, min_length: int = 0):
    return Annotated[str, Field(min_length=min_length, max_length=max_length), AfterValidator(_valid_unicode)]


PathText = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS), AfterValidator(_valid_unicode),
                     AfterValidator(_no_nul)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False), AfterValidator(_finite)]


class NewSession(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)
    instruction: Text(MAX_INSTRUCTION_CHARS) | None = None
    repo: PathText | None = None
    task_dir: PathText | None = None
    test_command: Annotated[Text(MAX_TEST_COMMAND_CHARS), AfterValidator(_no_nul)] | None = None
    timeout_s: Annotated[FiniteFloat, Field(gt=0)] | None = None
    client: Text(200) | None = None
    sample_key: Text(200, min_length=1) | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: Text(MAX_TEXT_CHARS, min_length=1)
    client: Text(200) | None = None


class Feedback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Text(100)
    value: FiniteFloat | None = None
    text: Text(MAX_TEXT_CHARS) | None = None


class Promote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Text(200)


# ------------------------------------------------------------------------------------------ the guard
def _split_host(value: str) -> tuple[str, int | None] | None:
    """("name", port or None) of a Host header; None when it is not one."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/@\\ \t?#"):
        return None
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    else:
        name, sep, port = value.partition(":")
        if sep and not port:
            return None
        port = port if sep else None
    if port is not None:
        if not port.isdigit() or len(port) > 5:
            return None
        return name, int(port)
    return name, None


def _is_loopback(name: str) -> bool:
    if name in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def host_problem(scope: dict, headers: dict[bytes, bytes], allowed_hosts: frozenset[str]) -> tuple[int, str] | None:
    """(status, reason) when the request's Host or Origin is not this server's own (DNS rebinding, a web
    page on another origin); None when fine."""
    raw = headers.get(b"host")
    if raw is None:
        return 421, "a Host header is required"
    split = _split_host(raw.decode("latin-1"))
    if split is None:
        return 421, "malformed Host header"
    name, port = split
    server = scope.get("server")
    if server is None or server[1] is None:  # a unix socket: no browser reaches it; still only local names
        ok = name in LOOPBACK_NAMES or name in allowed_hosts
    else:
        served = str(server[0]).lower()
        ok = (port is None or port == server[1]) and (name == served or name in allowed_hosts
                                                      or (_is_loopback(served) and name in LOOPBACK_NAMES))
    if not ok:
        return 421, f"Host {raw.decode('latin-1')[:100]!r} is not this server's address (DNS rebinding?)"
    origin = headers.get(b"origin")
    if origin is not None:
        wanted = {f"http://{raw.decode('latin-1').strip().lower()}", f"https://{raw.decode('latin-1').strip().lower()}"}
        if origin.decode("latin-1").strip().lower() not in wanted:
            return 403, "cross-origin requests are refused (the Origin is not this server)"
    if headers.get(b"sec-fetch-site", b"").lower() in (b"cross-site", b"same-site"):
        return 403, "cross-site requests are refused"
    return None


def peer_uid(scope: dict) -> int | None:
    """The uid of the process at the other end of the connection when known (set by serve.py), else None."""
    state = scope.get("state") or {}
    uid = state.get("peer_uid")
    return uid if isinstance(uid, int) else None


def peer_gid(scope: dict) -> int | None:
    gid = (scope.get("state") or {}).get("peer_gid")
    return gid if isinstance(gid, int) else None


class Guard:
    """Pure ASGI, in front of everything: Host/Origin (421/403), the token (401), the admin routes (403), then
    the body: at most MAX_BODY_BYTES by Content-Length and by the bytes that actually arrive (413; the rest is
    read and dropped, up to DRAIN_BYTES, so the client reads its answer instead of a reset), and well-formed
    JSON (422; nesting too deep to parse included). The app then gets the buffered body."""

    def __init__(self, app, *, token: str | None, admin_token: str | None, allowed_hosts: frozenset[str],
                 server_uid: int):
        self.app, self.token, self.admin_token = app, token, admin_token
        self.allowed_hosts, self.server_uid = allowed_hosts, server_uid

    def _bearer_is(self, given: bytes, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(given, f"Bearer {token}".encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[bytes, bytes] = {}
        for key, value in scope.get("headers", ()):
            headers.setdefault(key.lower(), value)
        problem = host_problem(scope, headers, self.allowed_hosts)
        if problem is not None:
            return await self._refuse(scope, receive, send, _error(*problem))
        given = headers.get(b"authorization", b"")
        is_admin = self._bearer_is(given, self.admin_token)
        if self.token is not None and not (is_admin or self._bearer_is(given, self.token)):
            return await self._refuse(scope, receive, send, _error(
                401, "missing or wrong bearer token (send 'Authorization: Bearer <token>'; agent.py serve prints "
                     "the file that holds it)", headers={"WWW-Authenticate": "Bearer"}))
        path = scope.get("path", "")
        if path == "/admin" or path.startswith("/admin/"):
            uid = peer_uid(scope)
            own = uid is not None and uid in (self.server_uid, 0)
            foreign = uid is not None and not own
            if foreign or not (is_admin or own or self.admin_token is None):
                return await self._refuse(scope, receive, send, _error(
                    403, "the admin routes need the admin token (the admin-token file next to the database) or "
                         f"a connection from uid {self.server_uid}"))
        if scope.get("method") not in _BODY_METHODS:
            return await self.app(scope, receive, send)
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared < 0:
                return await self._refuse(scope, receive, send, _error(400, "malformed Content-Length"))
            if declared > MAX_BODY_BYTES:
                return await self._refuse(scope, receive, send, self._too_large(declared))
        chunks, size, disconnected = [], 0, False
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return await self._refuse(scope, receive, send, self._too_large(size), already=size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if disconnected:
            return None
        body = b"".join(chunks)
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if body and (content_type == b"application/json" or content_type.endswith(b"+json")):
            try:
                json.loads(body)
            except (ValueError, RecursionError) as e:
                reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:200]
                return await send_response(scope, receive, send, _error(422, f"invalid JSON body: {reason}"))
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    def _too_large(self, size: int) -> SafeJSONResponse:
        return _error(413, f"request body of {size} bytes or more is over the limit of {MAX_BODY_BYTES} bytes "
                           f"(instructions and texts: at most {MAX_TEXT_CHARS} characters)",
                      headers={"Connection": "close"})

    async def _refuse(self, scope, receive, send, response, already: int = 0):
        """Answer `response` after reading what is left of the request body (at most DRAIN_BYTES in all)."""
        if scope.get("method") in _BODY_METHODS:
            drained = already
            while drained <= DRAIN_BYTES:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        return await send_response(scope, receive, send, response)


async def send_response(scope, receive, send, response):
    await response(scope, receive, send)


# --------------------------------------------------------------------------------------------------- app
def create_app(manager: SessionManager, token: str | None = None, admin_token: str | None = None, *,
               allowed_hosts: tuple[str, ...] = (), server_uid: int | None = None):
    """The API as an ASGI app. `token`: every request needs it (None: none needed; `agent.py serve` always
    sets one); `admin_token`: what /admin/* needs besides a same-uid peer (None: the client token suffices,
    except for a foreign peer); `allowed_hosts`: Host names accepted besides the served address."""
    store = manager.store
    server_uid = os.geteuid() if server_uid is None else server_uid

    app = FastAPI(title="nanocomposer agent server", default_response_class=SafeJSONResponse)

    def foreign_uid(request: Request) -> int | None:
        """The peer's uid when it is another local user (not the server's, not root), else None."""
        uid = peer_uid(request.scope)
        return uid if uid is not None and uid not in (server_uid, 0) else None

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return _error(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        detail = [{"loc": [str(p)[:200] for p in e.get("loc", ())], "msg": str(e.get("msg", ""))[:500],
                   "type": e.get("type")} for e in errors[:20]]
        status = 413 if any(e.get("type") == "string_too_long" for e in errors) else 422
        message = str(first.get("msg", "invalid"))[:500]
        if first.get("type") == "string_unicode":  # a lone surrogate (\ud800) the JSON parser let through
            message = "not valid Unicode (a lone surrogate?); send UTF-8 text"
        return _error(status, f"invalid request: {where[:200]}: {message}", detail=detail)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest):
        status = 413 if isinstance(exc, TooLarge) else 403 if isinstance(exc, Forbidden) else 400
        return _error(status, str(exc))

    @app.exception_handler(sqlite3.Error)
    @app.exception_handler(StoreError)
    async def store_unavailable(request: Request, exc: Exception):  # a full disk, a closed or locked database
        return _error(503, f"the session database is unavailable ({' '.join(str(exc).split())[:300]}); retry later",
                      headers={"Retry-After": "5"})

    @app.exception_handler(RegistryError)
    async def registry_unusable(request: Request, exc: RegistryError):
        return _error(409, str(exc)[:1000])

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):  # logged by uvicorn; the client gets a reason
        return _error(500, f"internal error: {type(exc).__name__}")

    def session_or_404(request: Request, session_id: str) -> dict:
        s = store.session(session_id)
        foreign = foreign_uid(request)
        if s is None or (foreign is not None and s.get("owner_uid") != foreign):
            raise HTTPException(404, f"no session {session_id[:200]!r}")
        return s

    def view(s: dict, after_turn: int = 0, tokens: bool = False) -> dict:
        turns = store.turns(s["id"], after_turn)
        if not tokens:
            turns = [{k: v for k, v in t.items() if k not in _HIDDEN_TURN_FIELDS} for t in turns]
        messages = store.user_messages(s["id"])
        question = messages[-1]["text"] if s["status"] == "waiting" and messages and \
            messages[-1]["kind"] == "question" else None
        return {**{k: v for k, v in s.items() if k not in _HIDDEN_SESSION_FIELDS},
                "tests_passed": (s["grade"] or {}).get("solved"), "question": question,
                "turn_count": store.count_turns(s["id"]), "turns": turns, "feedback": store.feedback(s["id"])}

    @app.get("/health")
    async def health() -> dict:
        return {**manager.health(), "sessions": store.counts()}

    @app.post("/sessions", status_code=201)
    def create_session(request: Request, body: NewSession):
        foreign = foreign_uid(request)
        gid = peer_gid(request.scope)
        try:
            session_id = manager.submit(**body.model_dump(), owner_uid=foreign,
                                        owner_gids=None if foreign is None or gid is None else
                                        sorted({gid, *_groups(foreign)}))
        except QueueFull as e:
            return _error(429, str(e), headers={"Retry-After": "1"})
        return {"id": session_id, "status": "queued"}

    @app.get("/sessions")
    def list_sessions(request: Request, status: str | None = Query(default=None, max_length=100),
                      limit: int = Query(default=100, ge=1, le=10000)) -> dict:
        return {"sessions": store.sessions(status, limit, preview=True, owner_uid=foreign_uid(request))}

    async def poll(request: Request, session_id: str, wait_s: float, ready) -> dict:
        """Re-read the session until `ready(s)` or the deadline: the reads in the thread pool (briefly), the
        wait in the event loop (no thread held)."""
        deadline = time.monotonic() + min(wait_s, MAX_WAIT_S)
        while True:
            seen = manager.change_count(session_id)
            s = await run_in_threadpool(session_or_404, request, session_id)
            if await run_in_threadpool(ready, s):
                return s
            remaining = deadline - time.monotonic()
            if remaining <= 0 or manager.draining:
                return s
            await manager.wait_for_change_async(session_id, seen, remaining)
            await asyncio.sleep(0)

    @app.get("/sessions/{session_id}")
    async def get_session(request: Request, session_id: str,
                          after_turn: int = Query(default=0, ge=0, le=MAX_AFTER_TURN),
                          wait_s: float = Query(default=0.0, ge=0.0, allow_inf_nan=False),
                          tokens: bool = False) -> dict:
        s = await poll(request, session_id, wait_s, lambda s: s["status"] in TERMINAL or s["status"] == "waiting"
                       or store.count_turns(session_id) > after_turn)
        return await run_in_threadpool(view, s, after_turn, tokens)

    @app.get("/sessions/{session_id}/result")
    async def get_result(request: Request, session_id: str,
                         wait_s: float = Query(default=0.0, ge=0.0, allow_inf_nan=False), tokens: bool = False):
        s = await poll(request, session_id, wait_s, lambda s: s["status"] in TERMINAL)
        if s["status"] == "timed_out":
            return _error(408, s["status_reason"] or "the session exceeded its time limit",
                          session=await run_in_threadpool(view, s, 0, tokens))
        if s["status"] in TERMINAL:
            return await run_in_threadpool(view, s, 0, tokens)
        return SafeJSONResponse({"id": session_id, "status": s["status"],
                                 "error": f"not finished after {min(wait_s, MAX_WAIT_S):g} s; ask again"},
                                status_code=202)

    @app.post("/sessions/{session_id}/messages")
    def post_message(request: Request, session_id: str, body: Message):
        s = session_or_404(request, session_id)
        if manager.answer(session_id, body.text):
            return {"delivered": "answer", "id": session_id}
        if s["status"] in TERMINAL:
            foreign = foreign_uid(request)
            try:
                child = manager.followup(session_id, body.text, body.client, owner_uid=foreign)
            except QueueFull as e:
                return _error(429, str(e), headers={"Retry-After": "1"})
            except (TooLarge, Forbidden):
                raise
            except BadRequest as e:
                return _error(409, f"cannot follow up on session {session_id}: {e}")
            return SafeJSONResponse({"delivered": "followup", "id": child, "parent_id": session_id},
                                    status_code=202)
        return _error(409, f"session {session_id} is {s['status']} and not waiting for an answer; "
                           "send follow-ups once it has ended")

    @app.post("/sessions/{session_id}/feedback", status_code=201)
    def post_feedback(request: Request, session_id: str, body: Feedback):
        session_or_404(request, session_id)
        if body.kind not in FEEDBACK_KINDS:
            return _error(422, f"unknown feedback kind {body.kind[:100]!r} (kinds: {', '.join(FEEDBACK_KINDS)})")
        if body.kind == "rating" and (body.value is None or not 1 <= body.value <= 5):
            return _error(422, f"a rating needs a value from 1 to 5, got {body.value!r}")
        return {"id": store.add_feedback(session_id, body.kind, body.value, body.text)}

    @app.get("/admin/versions")
    def versions() -> dict:
        return {"current": manager.registry.current(), "versions": manager.registry.versions()}

    @app.post("/admin/promote")
    def promote(body: Promote):
        try:
            manager.registry.promote(body.version)
        except RegistryError as e:
            return _error(404, str(e))
        return {"current": manager.registry.current()}

    add_openai_routes(app, manager, foreign_uid)  # /v1/models, /v1/chat/completions (openai_api.py)

    guarded = Guard(app, token=token, admin_token=admin_token, allowed_hosts=frozenset(h.lower() for h in allowed_hosts),
                    server_uid=server_uid)
    guarded.app_inner = app  # for tests and introspection
    return guarded


def _groups(uid: int) -> list[int]:
    from nanocomposer.agent.manager import peer_groups

    return peer_groups(uid)
