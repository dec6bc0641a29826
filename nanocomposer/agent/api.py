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
    POST /sessions/{id}/feedback      {"kind": applied|kept|reverted|followup_dissatisfied|rating|abandoned,
                                      "value": number (rating: 1-5), "text"} -> 201 {"id"}
    GET  /health; GET /admin/versions; POST /admin/promote {"version"}

With a token every request needs `Authorization: Bearer <token>` (401 otherwise).
"""

from __future__ import annotations

import hmac
import time

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from nanocomposer.agent.manager import BadRequest, QueueFull, SessionManager
from nanocomposer.agent.registry import RegistryError
from nanocomposer.agent.store import FEEDBACK_KINDS, TERMINAL

MAX_WAIT_S = 60.0
_HIDDEN_TURN_FIELDS = ("prompt_ids", "completion_ids", "logprobs")


class NewSession(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instruction: str | None = None
    repo: str | None = None
    task_dir: str | None = None
    test_command: str | None = None
    timeout_s: float | None = None
    client: str | None = Field(default=None, max_length=200)
    sample_key: str | None = Field(default=None, min_length=1, max_length=200)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1)
    client: str | None = None


class Feedback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str
    value: float | None = None
    text: str | None = None


class Promote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str


def _error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def create_app(manager: SessionManager, token: str | None = None) -> FastAPI:
    store = manager.store

    app = FastAPI(title="nanocomposer agent server")

    @app.middleware("http")
    async def authorize(request: Request, call_next):
        # a middleware, not a dependency: it runs before the body is read, so nothing answers without the token
        given = request.headers.get("authorization", "")
        if token is not None and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return JSONResponse({"error": "missing or wrong bearer token (send 'Authorization: Bearer <token>')"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(422, f"invalid request: {where}: {first.get('msg', 'invalid')}",
                      detail=[{k: e.get(k) for k in ("loc", "msg", "type")} for e in errors])

    def session_or_404(session_id: str) -> dict:
        s = store.session(session_id)
        if s is None:
            raise HTTPException(404, f"no session {session_id!r}")
        return s

    def view(s: dict, after_turn: int = 0, tokens: bool = False) -> dict:
        turns = store.turns(s["id"], after_turn)
        if not tokens:
            turns = [{k: v for k, v in t.items() if k not in _HIDDEN_TURN_FIELDS} for t in turns]
        messages = store.user_messages(s["id"])
        question = messages[-1]["text"] if s["status"] == "waiting" and messages and \
            messages[-1]["kind"] == "question" else None
        hidden = ("messages", "tools", "grade")
        return {**{k: v for k, v in s.items() if k not in hidden}, "tests_passed": (s["grade"] or {}).get("solved"),
                "question": question, "turn_count": store.count_turns(s["id"]), "turns": turns,
                "feedback": store.feedback(s["id"])}

    @app.get("/health")
    def health() -> dict:
        return {**manager.health(), "sessions": store.counts()}

    @app.post("/sessions", status_code=201)
    def create_session(body: NewSession):
        try:
            session_id = manager.submit(**body.model_dump())
        except BadRequest as e:
            return _error(400, str(e))
        except QueueFull as e:
            return JSONResponse({"error": str(e)}, status_code=429, headers={"Retry-After": "1"})
        return {"id": session_id, "status": "queued"}

    @app.get("/sessions")
    def list_sessions(status: str | None = None, limit: int = Query(default=100, ge=1, le=10000)) -> dict:
        return {"sessions": store.sessions(status, limit)}

    @app.get("/sessions/{session_id}")
    def get_session(session_id: str, after_turn: int = Query(default=0, ge=0),
                    wait_s: float = Query(default=0.0, ge=0.0), tokens: bool = False) -> dict:
        deadline = time.monotonic() + min(wait_s, MAX_WAIT_S)
        while True:
            seen = manager.change_count(session_id)
            s = session_or_404(session_id)
            remaining = deadline - time.monotonic()
            ready = s["status"] in TERMINAL or s["status"] == "waiting" or store.count_turns(session_id) > after_turn
            if ready or remaining <= 0:
                return view(s, after_turn, tokens)
            manager.wait_for_change(session_id, seen, remaining)

    @app.get("/sessions/{session_id}/result")
    def get_result(session_id: str, wait_s: float = Query(default=0.0, ge=0.0), tokens: bool = False):
        deadline = time.monotonic() + min(wait_s, MAX_WAIT_S)
        while True:
            seen = manager.change_count(session_id)
            s = session_or_404(session_id)
            remaining = deadline - time.monotonic()
            if s["status"] == "timed_out":
                return _error(408, s["status_reason"] or "the session exceeded its time limit",
                              session=view(s, 0, tokens))
            if s["status"] in TERMINAL:
                return view(s, 0, tokens)
            if remaining <= 0:
                return JSONResponse({"id": session_id, "status": s["status"],
                                     "error": f"not finished after {min(wait_s, MAX_WAIT_S):g} s; ask again"},
                                    status_code=202)
            manager.wait_for_change(session_id, seen, remaining)

    @app.post("/sessions/{session_id}/messages")
    def post_message(session_id: str, body: Message):
        s = session_or_404(session_id)
        if manager.answer(session_id, body.text):
            return {"delivered": "answer", "id": session_id}
        if s["status"] in TERMINAL:
            try:
                child = manager.followup(session_id, body.text, body.client)
            except QueueFull as e:
                return JSONResponse({"error": str(e)}, status_code=429, headers={"Retry-After": "1"})
            except BadRequest as e:
                return _error(409, f"cannot follow up on session {session_id}: {e}")
            return JSONResponse({"delivered": "followup", "id": child, "parent_id": session_id}, status_code=202)
        return _error(409, f"session {session_id} is {s['status']} and not waiting for an answer; "
                           "send follow-ups once it has ended")

    @app.post("/sessions/{session_id}/feedback", status_code=201)
    def post_feedback(session_id: str, body: Feedback):
        session_or_404(session_id)
        if body.kind not in FEEDBACK_KINDS:
            return _error(422, f"unknown feedback kind {body.kind!r} (kinds: {', '.join(FEEDBACK_KINDS)})")
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

    return app
