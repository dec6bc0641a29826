"""`--policy openai:<model>@<base_url>` against a small in-process OpenAI-compatible server (tests/fake_openai.py):
both modes on the wire, faults (server down, 500, 429, slow, 400, malformed tool calls) as counted failures
with their reasons, and the policy everywhere one is accepted (eval --compare, run_policy, agent.py run).
The same policy against llama.cpp's real server: tests/test_openai_llamacpp.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_calc_task
from fake_openai import FakeOpenAI, Reply, answer, tool_call, turn_number

from env.episode import EpisodeConfig, Trajectory
from env.protocol import format_tool_call
from env.results import read_results
from env.runner import run_tasks
from nanocomposer.openai_policy import OpenAIPolicy, label, parse_spec
from nanocomposer.policies import build_policy, is_remote, policy_label, run_policy

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

ROOT = Path(__file__).resolve().parents[1]
FIX = {"path": "calc/ops.py", "old_str": "return a - b", "new_str": "return a + b"}
FAST = "retries=2&backoff_s=0.01&timeout_s=5"


def solver(mode: str):
    """A scripted model: edit, then submit (text mode: Hermes blocks in the content; tools mode: tool_calls)."""
    def reply(body, n):
        call = ("edit_file", FIX) if turn_number(body) == 0 else ("submit", {"summary": "fixed add"})
        if mode == "text":
            return {"content": "I will do it.\n" + format_tool_call(*call)}
        return {"content": None, "tool_calls": [tool_call(*call)]}
    return reply


def play(spec: str, tasks, **kwargs) -> list[dict]:
    return run_tasks(tasks, lambda: build_policy(spec, {"max_new_tokens": 64, "temperature": 0.0}),
                     EpisodeConfig(max_turns=4), progress=False, **kwargs)


def test_spec_parsing_and_one_line_errors():
    parsed = parse_spec("openai:qwen2.5-coder@http://127.0.0.1:8000/v1")
    assert parsed["model"] == "qwen2.5-coder" and parsed["base_url"] == "http://127.0.0.1:8000/v1"
    assert parsed["mode"] == "text" and parsed["concurrency"] == 4
    parsed = parse_spec("openai:org/m@x@https://host:9/v1/?mode=tools&concurrency=2&timeout_s=3")
    assert (parsed["model"], parsed["mode"], parsed["concurrency"], parsed["timeout_s"]) == ("org/m@x", "tools", 2, 3.0)
    assert label("openai:m@http://h:1/v1?mode=tools") == "openai:m@h:1" == policy_label("openai:m@http://h:1/v1")
    assert is_remote("openai:m@http://h:1/v1") and not is_remote("oracle")
    for bad, words in [("openai:m", "expected openai:<model>@<base_url>"), ("openai:@http://h/v1", "expected"),
                       ("openai:m@http://h/v1?mode=json", "mode='json'"), ("openai:m@http://h/v1?color=1", "unknown option"),
                       ("openai:m@http://h/v1?concurrency=0", "concurrency=0"),
                       ("openai:m@http://h/v1?timeout_s=x", "is not a float")]:
        with pytest.raises(ValueError, match=words) as e:
            build_policy(bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("mode", ["text", "tools"])
def test_episodes_solve_through_the_endpoint(tmp_path, mode, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    tasks = [make_calc_task(tmp_path, f"calc-{i}") for i in range(3)]
    with FakeOpenAI(solver(mode)) as fake:
        records = play(f"openai:fake-model@{fake.url}?mode={mode}&concurrency=2", tasks, concurrency=3)
    assert [r["exit_status"] for r in records] == ["submitted"] * 3 and all(r["solved"] for r in records)
    assert all(r["completion_tokens"] == 14 and r["malformed_calls"] == 0 for r in records)  # usage: 7 a turn
    turn = records[0]["turns"][0]
    assert turn["meta"]["foreign_tokens"] == f"openai:fake-model@{fake.url.split('/')[2]}"
    assert turn["meta"]["usage"] == {"prompt_tokens": 11, "completion_tokens": 7}
    first = next(b for b in fake.bodies if turn_number(b) == 0)
    second = next(b for b in fake.bodies if turn_number(b) == 1)
    assert first["model"] == "fake-model" and first["max_tokens"] == 64 and first["temperature"] == 0.0
    if mode == "text":  # the tool list in the system message, results as <tool_response> user turns
        assert "tools" not in first and "<tools>" in first["messages"][0]["content"]
        assert '"name": "edit_file"' in first["messages"][0]["content"]
        assert second["messages"][-1]["role"] == "user"
        assert second["messages"][-1]["content"].startswith("<tool_response>\n")
    else:  # our schemas in `tools`, the call as tool_calls, its result as a tool message answering its id
        assert {t["function"]["name"] for t in first["tools"]} >= {"edit_file", "submit", "read_file"}
        assistant, result = second["messages"][-2:]
        assert assistant["tool_calls"][0]["function"] == {"name": "edit_file", "arguments": json.dumps(FIX)}
        assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                          "content": result["content"]}


def test_malformed_tool_calls_the_server_passes_through_are_counted(tmp_path):
    def reply(body, n):
        if turn_number(body) == 0:  # bad JSON, an unknown tool, a mistyped argument, and one good read
            return {"tool_calls": [tool_call("edit_file", '{"path": "calc/ops.py", ', 0),
                                   tool_call("rm_rf", {"path": "/"}, 1), tool_call("read_file", {"path": 3}, 2),
                                   tool_call("read_file", {"path": "calc/ops.py"}, 3)]}
        return {"tool_calls": [tool_call("submit", {"summary": "gave up"})]}
    with FakeOpenAI(reply) as fake:
        (record,) = play(f"openai:m@{fake.url}?mode=tools", [make_calc_task(tmp_path)])
    calls = record["turns"][0]["calls"]
    assert record["malformed_calls"] == 3 and [c["malformed"] for c in calls] == [True, True, True, False]
    assert "invalid JSON" in calls[0]["error"] and "unknown tool 'rm_rf'" in calls[1]["error"]
    assert "must be of type string" in calls[2]["error"] and record["exit_status"] == "submitted"


def kind_task(tmp_path, kind: str):
    """A calc task whose instruction names the fault the fake server plays for it."""
    from conftest import CALC_REPO

    from env.patch_apply import make_patch
    from env.tasks import load_task, write_task

    fixed = dict(CALC_REPO, **{"calc/ops.py": CALC_REPO["calc/ops.py"].replace("a - b", "a + b")})
    return load_task(write_task(tmp_path / kind, id=f"calc-{kind}", instruction=f"[{kind}] add(2, 3) returns -1.",
                                test_command="python -m pytest -q -p no:cacheprovider tests", repo=CALC_REPO,
                                hidden={"tests/test_ops.py": CALC_REPO["tests/test_ops.py"]},
                                gold_patch=make_patch(CALC_REPO, fixed), family="fix_bug", tier="micro"))


def test_faults_are_counted_failures_with_reasons_and_finished_episodes_stay(tmp_path):
    kinds = ("ok", "500", "429", "slow", "400")
    tasks = [kind_task(tmp_path, k) for k in kinds]
    counts = dict.fromkeys(kinds, 0)

    def reply(body, n):
        kind = body["messages"][1]["content"].split("]")[0].lstrip("[")
        counts[kind] += 1
        if kind == "500":
            return Reply(500, {"error": {"message": "engine died"}})
        if kind == "429" and counts[kind] <= 2:  # rate limited twice, then served
            return Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0"})
        if kind == "slow":
            return Reply(body=answer({"content": "late"}), delay_s=2.0)
        if kind == "400":
            return Reply(400, {"error": {"message": "context length exceeded"}})
        return solver("text")(body, n)

    results = tmp_path / "episodes.jsonl"
    with FakeOpenAI(reply) as fake:
        records = play(f"openai:m@{fake.url}?retries=2&backoff_s=0.01&timeout_s=0.5", tasks, concurrency=5,
                       results_path=results)
    status = {r["id"].removeprefix("calc-"): (r["exit_status"], r["error"]) for r in records}
    assert status["ok"] == ("submitted", "") and records[0]["solved"]
    assert status["500"][0] == "policy_error" and "EndpointError" in status["500"][1]
    assert "HTTP 500" in status["500"][1] and "engine died" in status["500"][1] and "after 3 tries" in status["500"][1]
    assert status["429"][0] == "submitted"  # the 429s were retried
    assert status["slow"][0] == "policy_error" and "no answer within 0.5 s" in status["slow"][1]
    assert status["400"][0] == "policy_error" and "HTTP 400" in status["400"][1] and "tries" not in status["400"][1]
    assert counts["500"] == 3 and counts["400"] == 1 and counts["429"] == 4  # 2 refused, then its 2 turns
    assert len(read_results(results)) == 5  # every episode has its record, the failed ones too


def test_server_down_is_a_policy_error_not_a_crash(tmp_path):
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (record,) = play(f"openai:m@http://127.0.0.1:{port}/v1?{FAST}", [make_calc_task(tmp_path)])
    assert record["exit_status"] == "policy_error" and "EndpointError" in record["error"]
    assert "ConnectError" in record["error"] and "after 3 tries" in record["error"]


def test_rl_refuses_foreign_tokens_and_sft_export_takes_them(tmp_path):
    from data.build_sft import sft_messages
    from nanocomposer.rollout_tokens import RolloutError, episode_sample

    with FakeOpenAI(solver("tools")) as fake:
        (record,) = play(f"openai:m@{fake.url}?mode=tools", [make_calc_task(tmp_path)], token_ids=True)
    with pytest.raises(RolloutError, match="its tokens are not ours") as e:
        episode_sample(Trajectory.from_record(record), eos_id=0)
    assert "\n" not in str(e.value)
    messages = sft_messages(record)
    assert [m["role"] for m in messages][:3] == ["system", "user", "assistant"]
    assert messages[2]["content"] == format_tool_call("edit_file", FIX)


def test_run_policy_and_eval_compare_beside_a_scripted_policy(tmp_path):
    tasks = [make_calc_task(tmp_path / "tasks", f"calc-{i}") for i in range(2)]
    with FakeOpenAI(solver("text")) as fake:
        spec = f"openai:m@{fake.url}"
        records, _, workers = run_policy(spec, tasks, EpisodeConfig(max_turns=4), {"max_new_tokens": 32},
                                         workers=2, progress=False)  # what the SFT check calls
        assert workers == 2 and all(r["solved"] for r in records)
        import eval as eval_stage
        out = tmp_path / "compare"
        code = eval_stage.main(["--tasks", str(tmp_path / "tasks"), "--compare", "noop", spec, "--out-dir", str(out),
                                "--quiet", "--workers", "2", "--bootstrap", "10"])
    assert code == 0
    results = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/results.json")}
    assert set(results) == {"noop", f"openai_m_{fake.url.split('/')[2].replace(':', '_')}"}, set(results)
    table = (out / "compare.md").read_text()
    assert "noop" in table and "openai:m@" in table


def test_agent_run_with_an_endpoint(tmp_path):
    repo = make_calc_task(tmp_path).repo_dir
    with FakeOpenAI(solver("tools")) as fake:
        done = subprocess.run([sys.executable, str(ROOT / "agent.py"), "run", "--repo", str(repo), "--yes",
                               "--model", f"openai:m@{fake.url}?mode=tools", "--test-command",
                               "python -m pytest -q -p no:cacheprovider tests", "fix add"],
                              check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "exit status submitted; tests: pass" in " ".join(done.stdout.split())
    assert "return a + b" in (repo / "calc" / "ops.py").read_text()


def test_policy_stream_returns_each_answer_when_it_is_in():
    from env.episode import TurnRequest

    def reply(body, n):
        slow = "slow" in body["messages"][-1]["content"]
        return Reply(body=answer({"content": "done"}), delay_s=1.0 if slow else 0.0)
    with FakeOpenAI(reply) as fake:
        policy = OpenAIPolicy(f"openai:m@{fake.url}?concurrency=2")
        stream = policy.open_stream()
        stream.add("slow", TurnRequest([{"role": "user", "content": "slow"}], [], "a#0", 0))
        stream.add("fast", TurnRequest([{"role": "user", "content": "fast"}], [], "b#0", 0))
        got = []
        while len(stream):
            got += [key for key, _ in stream.step()]
        policy.close()
    assert got == ["fast", "slow"]


def test_the_registry_holds_an_endpoint_version(tmp_path):
    from nanocomposer.agent.registry import Registry

    registry = Registry(tmp_path / "registry")
    spec = "openai:m@http://127.0.0.1:9/v1?mode=tools"
    name = registry.ensure(spec)  # what `agent.py serve --model openai:...` does
    assert name == "openai-m-127.0.0.1-9" and registry.current() == name and registry.spec(name) == spec


def test_agent_server_sessions_played_by_an_endpoint(tmp_path):
    """`agent.py serve --model openai:...`: the workers share the endpoint policy (SharedPolicy over its stream)."""
    import time

    from nanocomposer.agent.manager import ServerConfig, SessionManager
    from nanocomposer.agent.registry import Registry
    from nanocomposer.agent.store import TERMINAL, SessionStore

    task = make_calc_task(tmp_path)
    with FakeOpenAI(solver("tools")) as fake:
        registry = Registry(tmp_path / "registry")
        registry.ensure(f"openai:m@{fake.url}?mode=tools", "endpoint")
        store = SessionStore(tmp_path / "sessions.db")
        manager = SessionManager(store, registry, ServerConfig(workers=2, max_turns=4))
        manager.start()
        try:
            ids = [manager.submit(task_dir=str(task.root)) for _ in range(2)]
            deadline = time.monotonic() + 120
            while any(store.session(i)["status"] not in TERMINAL for i in ids) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            manager.stop()
    for i in ids:
        s = store.session(i)
        assert (s["status"], s["exit_status"], s["solved"], s["model_version"]) == ("finished", "submitted", 1, "endpoint")
        assert [t["completion_tokens"] for t in store.turns(i)] == [7, 7]
