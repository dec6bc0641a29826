"""A small OpenAI-compatible chat server, in-process (FastAPI + uvicorn on a loopback port), for fault tests.

    with FakeOpenAI(reply) as fake:          # reply(body, n) -> Reply | dict (a 200 answer's message)
        spec = f"openai:fake@{fake.url}"
        ...
    fake.bodies                               # every request body received, in order

A `Reply` sets the status, the body, a delay before answering and headers (a 429's Retry-After).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse


@dataclass
class Reply:
    status: int = 200
    body: dict | str | None = None
    delay_s: float = 0.0
    headers: dict = field(default_factory=dict)


def answer(message: dict, finish_reason: str = "stop", completion_tokens: int = 7) -> dict:
    return {"id": "chatcmpl-fake", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 11, "completion_tokens": completion_tokens, "total_tokens": 11 + completion_tokens}}


def tool_call(name: str, arguments, i: int = 0) -> dict:
    return {"id": f"fake_{i}", "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}


def turn_number(body: dict) -> int:
    """How many assistant turns the request's conversation already holds."""
    return sum(m.get("role") == "assistant" for m in body["messages"])


class FakeOpenAI:
    def __init__(self, reply):
        self.reply, self.bodies, self.lock = reply, [], threading.Lock()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            with self.lock:
                self.bodies.append(body)
                n = len(self.bodies)
            out = self.reply(body, n)
            out = out if isinstance(out, Reply) else Reply(body=answer(out))
            if out.delay_s:
                await asyncio.sleep(out.delay_s)
            if isinstance(out.body, str):
                return PlainTextResponse(out.body, status_code=out.status, headers=out.headers)
            return JSONResponse(out.body if out.body is not None else {"error": {"message": "fake error"}},
                                status_code=out.status, headers=out.headers)

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
