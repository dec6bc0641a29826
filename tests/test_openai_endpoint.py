"""The official `openai` client against `agent.py serve`'s /v1 routes: a multi-turn tool-calling conversation
on a micro checkpoint, stored as one session's turns (token ids, logprobs) and exported by `agent.py sessions
--export`; streaming; auth; the official types read a tool-call answer; a scripted version is refused."""

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from conftest import save_micro_checkpoint
from test_agent_server import Server

from env.protocol import format_tool_call
from nanocomposer.agent.openai_api import _chunks, answer_message, conversation_key

ROOT = Path(__file__).resolve().parents[1]
READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v1")
    srv = Server(tmp, "--model", str(save_micro_checkpoint(tmp / "micro")), "--version", "micro-v1", "--workers", "1",
                 "--max-new-tokens", "12", "--temperature", "1.0", "--backend", "transformers")
    srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=120)
    yield srv
    srv.stop()


def test_models_lists_the_current_version(server):
    assert [m.id for m in server.client.models.list().data] == ["micro-v1"]


def test_a_tool_calling_conversation_is_one_stored_session(server, tmp_path):
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "What is in a.py?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "x = 1\n"},
                {"role": "user", "content": "And now?"}]
    first = server.client.chat.completions.create(model="anything", messages=messages, tools=[READ])
    assert first.model == "micro-v1" and first.object == "chat.completion"
    assert first.usage.completion_tokens > 0 and first.usage.prompt_tokens > 20
    session_id = first.id.split("-")[1]
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    second = server.client.chat.completions.create(model="micro-v1", messages=messages, tools=[READ])
    assert second.id == f"chatcmpl-{session_id}-1"  # the next turn of the same conversation
    s = server.http.get(f"/sessions/{session_id}", params={"tokens": 1}).json()
    assert s["source"] == "openai" and s["status"] == "finished" and s["model_version"] == "micro-v1"
    assert [t["turn"] for t in s["turns"]] == [0, 1]
    for turn, answer in zip(s["turns"], (first, second), strict=True):
        assert len(turn["completion_ids"]) == len(turn["logprobs"]) == answer.usage.completion_tokens
        assert len(turn["prompt_ids"]) == answer.usage.prompt_tokens
    assert s["turns"][1]["prompt_ids"][:len(s["turns"][0]["prompt_ids"])] == s["turns"][0]["prompt_ids"]
    out = tmp_path / "sessions.jsonl"
    done = subprocess.run([sys.executable, str(ROOT / "agent.py"), "sessions", "--db", str(server.db), "--export",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (record,) = [r for r in map(json.loads, out.read_text().splitlines()) if r["session_id"] == session_id]
    assert record["n_turns"] == 2 and record["turns"][1]["completion_ids"] == s["turns"][1]["completion_ids"]
    assert record["messages"][2]["tool_calls"][0]["function"]["name"] == "read_file"
    from nanocomposer.realtime.update import session_samples  # what real-time RL trains on

    samples = session_samples(record, eos_id=0)
    assert samples and sum(sum(x["env_mask"]) for x in samples) == sum(len(t["completion_ids"]) for t in s["turns"])


def test_streaming_gives_the_same_answer_in_chunks(server):
    chunks = list(server.client.chat.completions.create(
        model="micro-v1", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens > 0 and isinstance(text, str)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_wrong_key_and_bad_requests_are_refused_with_a_reason(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.BadRequestError, match="one choice per request"):
        server.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=2)
    with pytest.raises(openai.BadRequestError, match="only text content parts"):
        server.client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}])


def test_a_scripted_version_is_refused(tmp_path):
    srv = Server(tmp_path, "--model", "oracle")
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0)
        with pytest.raises(openai.ConflictError, match="needs a checkpoint version"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        srv.stop()


def test_official_types_read_a_tool_call_answer():
    """The answer of a turn that calls a tool (and writes one malformed block) as the openai SDK parses it."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    text = "Reading.\n" + format_tool_call("read_file", {"path": "a.py"}) + "\n<tool_call>\n{bad}\n</tool_call>"
    message, records = answer_message(text, [READ], "call_x_0")
    assert [r["malformed"] for r in records] == [False, True]
    parsed = ChatCompletion.model_validate({"id": "chatcmpl-s-0", "object": "chat.completion", "created": 0,
                                            "model": "v", "choices": [{"index": 0, "message": message,
                                                                       "finish_reason": "tool_calls"}]})
    call = parsed.choices[0].message.tool_calls[0]
    assert call.function.name == "read_file" and json.loads(call.function.arguments) == {"path": "a.py"}
    assert parsed.choices[0].message.content == "Reading.\n<tool_call>\n{bad}\n</tool_call>"
    stream = [ChatCompletionChunk.model_validate(json.loads(c[6:])) for c in
              _chunks({"id": "x", "created": 0, "model": "v"}, message, "tool_calls", None) if c != "data: [DONE]\n\n"]
    assert stream[1].choices[0].delta.tool_calls[0].function.name == "read_file"
    # a client that respaces the arguments and renames the id still continues the same conversation
    same = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "other", "type": "function", "function": {"name": "read_file", "arguments": '{ "path":"a.py" }'}}]}]
    assert conversation_key(same) == conversation_key([{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]}])
