"""agent.py serve as a real process: simulated users, nothing lost, faults, auth, queue limits, timeouts."""

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import harness_leftovers

from env.task_sets import SAMPLES_DIR
from env.tasks import load_task_set
from env.users import Population, Simulation, interleaved_by_family

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

ROOT = Path(__file__).resolve().parents[1]
TASK = SAMPLES_DIR / "fix_bug_leap_century"


class Server:
    """`agent.py serve --port 0` in a subprocess; the port is read from its first line of output."""

    def __init__(self, tmp: Path, *args: str, host: str = "127.0.0.1", token: str | None = None,
                 env: dict | None = None):
        self.db, self.host, self.token = tmp / "sessions.db", host, token
        cmd = [sys.executable, str(ROOT / "agent.py"), "serve", "--host", host, "--port", "0", "--db", str(self.db),
               "--registry", str(tmp / "registry"), *args, *(["--token", token] if token else [])]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        line = self.proc.stdout.readline()
        assert "agent server on http://" in line, line + self.proc.stderr.read()
        self.url = line.split()[3]
        # every client needs the token: the given one, else the one the server generated (0600, printed path)
        token_file = Path(line.split("token file ")[1].split(",")[0])
        self.token = token_file.read_text().strip()
        assert token is None or self.token == token
        # a generated token is safe to pass as `--token X` on a command line: never starts with "-"
        assert token is not None or re.fullmatch(r"[0-9a-f]{64}", self.token), self.token
        assert token_file.stat().st_mode & 0o777 == 0o600
        headers = {"Authorization": f"Bearer {self.token}"}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=70)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.http.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError("server never became healthy")

    def db_rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        with sqlite3.connect(self.db) as conn:
            return conn.execute(sql, args).fetchall()

    def wait_status(self, session_id: str, statuses: tuple[str, ...], timeout_s: float = 30) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            s = self.http.get(f"/sessions/{session_id}", params={"wait_s": 1}).json()
            if s["status"] in statuses:
                return s
        raise AssertionError(f"session {session_id} never reached {statuses}: {s['status']}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def oracle_server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("oracle"), "--model", "oracle", "--workers", "4")
    yield server
    server.stop()


def test_simulated_users_nothing_lost(oracle_server, tmp_path):
    tasks = load_task_set(SAMPLES_DIR)
    pop = Population(seed=1, concurrency=4, patience_s=(60, 60), poll_s=5)
    report = Simulation(oracle_server.url, tasks, pop, token=oracle_server.token).run(12, drain_s=120)
    assert report["accepted"] == 12 and not report["unfinished_after_drain"], report
    ids = set(report["accepted_ids"])
    stored = dict(oracle_server.db_rows("SELECT id, status FROM sessions"))
    assert ids <= set(stored) and all(stored[i] == "finished" for i in ids)
    in_db = oracle_server.db_rows(f"SELECT COUNT(*) FROM feedback WHERE session_id IN ({','.join('?' * len(ids))})",
                                  tuple(ids))[0][0]
    assert in_db == report["feedback_sent"] > 0
    assert report["stats"].get("passed") == 12  # the oracle solves every sample; the user's hidden grade agrees
    # every turn, with its tool calls and their results, is stored; the model version that served is recorded
    rows = oracle_server.db_rows("SELECT model_version, exit_status, diff FROM sessions WHERE id = ?",
                                 (report["accepted_ids"][0],))
    assert rows[0][0] == "oracle" and rows[0][1] == "submitted"
    assert oracle_server.db_rows("SELECT COUNT(*) FROM tool_calls WHERE result IS NULL")[0][0] == 0
    # export: one trajectory record per session with the session's fields and feedback
    out = tmp_path / "sessions.jsonl"
    proc = subprocess.run([sys.executable, "agent.py", "sessions", "--db", str(oracle_server.db), "--export", str(out)],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    records = {r["session_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert ids <= set(records)
    record = records[report["accepted_ids"][0]]
    assert record["exit_status"] == "submitted" and record["n_turns"] == len(record["turns"]) > 0
    assert record["model_version"] == "oracle" and record["messages"][0]["role"] == "system"
    assert {f["kind"] for f in record["feedback"]} >= {"rating"}


def test_bad_requests_get_4xx_with_a_reason(oracle_server):
    http = oracle_server.http
    cases = [
        (http.post("/sessions", content=b"{not json", headers={"content-type": "application/json"}), 422),
        (http.post("/sessions", json={"task_dir": str(TASK), "bogus": 1}), 422),
        (http.post("/sessions", json={"repo": "/nonexistent/repo", "instruction": "x"}), 400),
        (http.post("/sessions", json={"repo": str(TASK / "repo"), "task_dir": str(TASK)}), 400),
        (http.post("/sessions", json={"task_dir": str(ROOT)}), 400),
        (http.get("/sessions/no-such-session"), 404),
        (http.post("/sessions/no-such-session/feedback", json={"kind": "kept"}), 404),
        (http.post("/sessions/no-such-session/messages", json={"text": "hi"}), 404),
        (http.post("/admin/promote", json={"version": "no-such-version"}), 404),
    ]
    for response, status in cases:
        assert response.status_code == status, response.text
        assert response.json()["error"], response.text


def test_timeout_promotion_and_feedback_validation(oracle_server, tmp_path):
    http = oracle_server.http
    slow = http.post("/sessions", json={"task_dir": str(TASK), "timeout_s": 0.001}).json()["id"]
    r = http.get(f"/sessions/{slow}/result", params={"wait_s": 30})
    assert r.status_code == 408 and "time limit" in r.json()["error"]
    assert http.post(f"/sessions/{slow}/feedback", json={"kind": "bogus"}).status_code == 422
    assert http.post(f"/sessions/{slow}/feedback", json={"kind": "rating", "value": 9}).status_code == 422
    # a new version, promoted without a restart, serves the next session
    from nanocomposer.agent.registry import Registry

    Registry(oracle_server.db.parent / "registry").add("noop-v2", "noop")
    assert http.post("/admin/promote", json={"version": "noop-v2"}).json() == {"current": "noop-v2"}
    assert http.get("/admin/versions").json()["versions"] == ["noop-v2", "oracle"]
    sid = http.post("/sessions", json={"task_dir": str(TASK)}).json()["id"]
    s = http.get(f"/sessions/{sid}/result", params={"wait_s": 30}).json()
    assert s["model_version"] == "noop-v2" and s["policy"] == "noop" and s["diff"] == ""
    http.post("/admin/promote", json={"version": "oracle"})


def ask_then_submit(tmp_path: Path) -> Path:
    turns = [{"name": "ask_user", "arguments": {"question": "Which century rule?"}},
             {"name": "submit", "arguments": {"summary": "done"}}]
    path = tmp_path / "ask.json"
    path.write_text(json.dumps([f"<tool_call>\n{json.dumps(t)}\n</tool_call>" for t in turns]))
    return path


def test_ask_user_queue_full_kill_and_restart(tmp_path):
    replay = ask_then_submit(tmp_path)
    doomed = tmp_path / "doomed"
    shutil.copytree(TASK, doomed)
    args = ["--model", f"replay:{replay}", "--workers", "1", "--max-queue", "3"]
    server = Server(tmp_path, *args, "--answer-timeout-s", "60")
    http = server.http
    a = http.post("/sessions", json={"task_dir": str(TASK)}).json()["id"]
    s = server.wait_status(a, ("waiting",))
    assert s["question"] == "Which century rule?"
    assert http.post(f"/sessions/{a}/feedback", json={"kind": "rating", "value": 3}).status_code == 201
    queued = [http.post("/sessions", json={"task_dir": str(t)}).json()["id"] for t in (TASK, TASK, doomed)]
    full = http.post("/sessions", json={"task_dir": str(TASK)})
    assert full.status_code == 429 and "queue is full" in full.json()["error"]
    # the answer becomes the tool result; the session finishes on the same worker
    assert http.post(f"/sessions/{a}/messages", json={"text": "Every 400 years."}).json()["delivered"] == "answer"
    done = http.get(f"/sessions/{a}/result", params={"wait_s": 30}).json()
    assert done["status"] == "finished" and done["turns"][0]["calls"][0]["result"] == "Every 400 years."
    b = queued[0]
    server.wait_status(b, ("waiting",))
    assert http.post(f"/sessions/{queued[1]}/messages", json={"text": "x"}).status_code == 409  # queued, no question
    server.stop(signal.SIGKILL)  # b is waiting on its worker, two sessions queued
    shutil.rmtree(doomed)

    server = Server(tmp_path, *args, "--answer-timeout-s", "0.5")
    http = server.http
    after = {sid: server.wait_status(sid, ("finished", "failed", "interrupted")) for sid in [a, *queued]}
    assert after[b]["status"] == "interrupted" and "stopped" in after[b]["status_reason"]
    assert after[queued[1]]["status"] == "finished"  # resumed; its question timed out to the scripted answer
    assert after[queued[1]]["turns"][0]["calls"][0]["result"].startswith("No further information")
    assert after[queued[2]]["status"] == "failed" and "doomed" in after[queued[2]]["status_reason"]
    assert server.db_rows("SELECT COUNT(*) FROM sessions")[0][0] == 4  # every accepted session, none dropped
    assert server.db_rows("SELECT COUNT(*) FROM feedback")[0][0] == 1
    # a message to an ended session starts a follow-up session
    r = http.post(f"/sessions/{a}/messages", json={"text": "Not right, try again."})
    assert r.status_code == 202 and r.json()["parent_id"] == a
    child = server.wait_status(r.json()["id"], ("finished",))
    assert child["parent_id"] == a and "Not right, try again." in child["instruction"]
    server.stop()


def test_sigterm_stops_the_server_gracefully_even_when_repeated(tmp_path):
    """A SIGTERM reaches SessionManager.stop (uvicorn raises it again after its own shutdown, which the
    default handler would turn into an exit before the stop), and a second one does not cut the stop short.
    The running session's episode ends and removes its staged copy and workspace before the server exits."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    server = Server(tmp_path, "--model", f"replay:{ask_then_submit(tmp_path)}", "--workers", "1",
                    "--answer-timeout-s", "120", env={**os.environ, "TMPDIR": str(tmp)})
    waiting = server.http.post("/sessions", json={"task_dir": str(TASK)}).json()["id"]
    server.wait_status(waiting, ("waiting",))
    queued = server.http.post("/sessions", json={"task_dir": str(TASK)}).json()["id"]
    server.proc.send_signal(signal.SIGTERM)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    assert "agent server stopped" in server.proc.stderr.read()
    statuses = dict(server.db_rows("SELECT id, status FROM sessions"))
    assert statuses == {waiting: "interrupted", queued: "queued"}  # the next server runs the queued one
    reason = server.db_rows("SELECT status_reason FROM sessions WHERE id = ?", (waiting,))[0][0]
    assert "shut down" in reason
    assert harness_leftovers(tmp) == [] and list(tmp.glob("agent-session-*")) == []
    server.http.close()


@pytest.mark.parametrize("host", ["127.0.0.2"])
def test_token_required_beyond_localhost(tmp_path, host):
    cmd = [sys.executable, "agent.py", "serve", "--host", host, "--port", "0", "--model", "noop",
           "--db", str(tmp_path / "s.db"), "--registry", str(tmp_path / "registry")]
    env = {k: v for k, v in os.environ.items() if k != "NANOCOMPOSER_TOKEN"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 2 and "without a token" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    server = Server(tmp_path, "--model", "noop", host=host, token="s3cret")
    try:
        assert server.http.get("/health").status_code == 200
        bare = httpx.Client(base_url=server.url, timeout=10)
        assert bare.get("/health").status_code == 401
        assert bare.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
        r = bare.post("/sessions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 401 and "token" in r.json()["error"]  # refused before the body is read
        assert server.db_rows("SELECT COUNT(*) FROM sessions")[0][0] == 0
    finally:
        server.stop()


@pytest.mark.slow  # builds and loads a micro model (~10 s on a quiet machine)
def test_checkpoint_sessions_store_token_ids_and_logprobs(tmp_path):
    """In process, with an untrained micro checkpoint: what on-policy RL needs is stored for every turn."""
    from conftest import save_micro_checkpoint

    from nanocomposer.agent.manager import ServerConfig, SessionManager
    from nanocomposer.agent.registry import Registry
    from nanocomposer.agent.store import TERMINAL, SessionStore

    registry = Registry(tmp_path / "registry")
    registry.add("micro-v1", str(save_micro_checkpoint(tmp_path / "micro")))
    registry.promote("micro-v1")
    store = SessionStore(tmp_path / "sessions.db")
    manager = SessionManager(store, registry, ServerConfig(workers=1, max_turns=2, backend="transformers",
                                                           sampling={"max_new_tokens": 12}))
    manager.start()
    try:
        sid = manager.submit(task_dir=str(TASK))
        deadline = time.monotonic() + 120
        while store.session(sid)["status"] not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        manager.stop()
    s = store.session(sid)
    assert s["status"] == "finished" and s["model_version"] == "micro-v1", s["status_reason"]
    turns = store.turns(sid)
    assert turns and all(len(t["completion_ids"]) == len(t["logprobs"]) == t["completion_tokens"] > 0 for t in turns)
    assert all(t["prompt_ids"] for t in turns)
    record = store.export_record(sid)
    assert record["turns"][0]["completion_ids"] == turns[0]["completion_ids"]
    assert record["completion_tokens"] == sum(t["completion_tokens"] for t in turns)


def test_promote_refuses_a_checkpoint_that_would_not_load(tmp_path: Path):
    # A candidate half-written by a killed trainer must never become `current`: the server would fail
    # every session it serves. The registry refuses it and keeps the version it had.
    from conftest import save_micro_checkpoint

    from nanocomposer.agent.registry import Registry, RegistryError

    registry = Registry(tmp_path / "registry")
    registry.add("good", str(save_micro_checkpoint(tmp_path / "good")))
    registry.promote("good")
    broken = save_micro_checkpoint(tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    registry.add("broken", str(broken))
    with pytest.raises(RegistryError, match="'broken' cannot be promoted: .*model.safetensors"):
        registry.promote("broken")
    assert registry.current() == "good"


def users_run(url: str, recipe: Path, report: Path, *flags: str, token: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "env.users", "--server", url, "--tasks", "samples", "--sessions", "4",
                           "--recipe", str(recipe), "--report", str(report), "--token", token, *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(report.read_text())


def test_users_seed_and_offset_replay_the_same_sessions_and_disjoint_ranges(tmp_path):
    """The same --seed/--offset replays the same sessions (tasks, sample keys, follow-ups, feedback); a disjoint
    --offset range asks for none of the same tasks."""
    recipe = tmp_path / "users.yaml"
    recipe.write_text("concurrency: 2\npatience_s: [60, 60]\npoll_s: 2\nanswer_delay_s: [0, 0]\n"
                      "revert_delay_s: [0, 0]\nfollowup_p: 0.5\nmax_followups: 1\n")
    server = Server(tmp_path, "--model", "noop", "--workers", "2")  # noop: nothing passes, follow-ups are drawn

    def sessions(report: dict) -> list[tuple]:
        ids = report["accepted_ids"]
        rows = server.db_rows(f"SELECT id, sample_key, task_id, instruction, client, parent_id FROM sessions "
                              f"WHERE id IN ({','.join('?' * len(ids))})", tuple(ids))
        key_of = {r[0]: r[1] for r in rows}
        feedback = server.db_rows(f"SELECT session_id, kind, value FROM feedback WHERE session_id IN "
                                  f"({','.join('?' * len(ids))}) ORDER BY id", tuple(ids))
        return sorted((key, task, instruction, client, key_of.get(parent),
                       sorted((k, v) for sid, k, v in feedback if sid == session_id))
                      for session_id, key, task, instruction, client, parent in rows)

    try:
        first = users_run(server.url, recipe, tmp_path / "a.json", "--seed", "5", "--offset", "1", "--task-limit", "2",
                          token=server.token)
        again = users_run(server.url, recipe, tmp_path / "b.json", "--seed", "5", "--offset", "1", "--task-limit", "2",
                          token=server.token)
        fresh = users_run(server.url, recipe, tmp_path / "c.json", "--seed", "5", "--offset", "3", token=server.token)
    finally:
        server.stop()
    ids = [t.id for t in interleaved_by_family(load_task_set(SAMPLES_DIR))]  # the 5 sample tasks, in draw order
    assert first["traffic"] == {"task_set": "samples", "seed": 5, "offset": 1, "task_limit": 2, "set_size": 5,
                                "tasks": first["traffic"]["tasks"]}
    assert sorted(first["traffic"]["tasks"]) == sorted(ids[1:3]) and set(first["conversation_tasks"]) == set(ids[1:3])
    replay = sessions(first)
    assert replay == sessions(again) and first["conversation_tasks"] == again["conversation_tasks"]
    assert len(replay) > 4 and first["stats"].get("followups", 0) >= 1  # some users followed up, the same ones
    followups = [s for s in replay if s[4] is not None]
    assert all(key == f"{parent}/followup1" for key, _, _, _, parent, _ in followups)
    assert {s[0] for s in replay if s[4] is None} == {f"users:5:{i}:{t}" for i, t in
                                                      enumerate(first["conversation_tasks"])}
    assert not set(fresh["conversation_tasks"]) & set(first["conversation_tasks"])
    assert sorted(fresh["traffic"]["tasks"]) == sorted(ids[3:])


def test_a_killed_servers_staged_sessions_are_swept_at_the_next_start(tmp_path):
    tmp = tmp_path / "tmp"  # the servers' temp directory, where sessions are staged
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    server = Server(tmp_path, "--model", f"replay:{ask_then_submit(tmp_path)}", "--workers", "1", env=env)
    sid = server.http.post("/sessions", json={"task_dir": str(TASK)}).json()["id"]
    server.wait_status(sid, ("waiting",))
    staged = sorted(tmp.glob("agent-session-*"))
    assert [p.name.split("-")[2] for p in staged] == [str(server.proc.pid)]  # named after its owner
    server.stop(signal.SIGKILL)
    assert all(p.is_dir() for p in staged)  # a killed server cannot clean up
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp / f"agent-session-{gone.pid}-abcd1234"
    live = tmp / f"agent-session-{os.getpid()}-abcd1234"  # another live server's session
    unnamed = tmp / "agent-session-abcd1234"  # made before sessions were named after their owner: whose?
    for d in (dead, live, unnamed):
        (d / "repo").mkdir(parents=True)
    server = Server(tmp_path, "--model", "noop", "--workers", "1", env=env)
    try:
        assert not dead.exists() and not any(p.exists() for p in staged)
        assert live.is_dir() and unnamed.is_dir()
        # a session on the new server also clears the killed one's episode workspace (env.workspace's sweep)
        sid = server.http.post("/sessions", json={"task_dir": str(TASK)}).json()["id"]
        assert server.wait_status(sid, ("finished",))["status"] == "finished"
    finally:
        server.stop()
    assert sorted(tmp.glob("agent-session-*")) == sorted([live, unnamed])  # its own sessions cleaned up too


@pytest.mark.slow  # builds and loads a micro model three times (~15 s on a quiet machine)
def test_the_same_seed_and_sample_key_sample_the_same_tokens(tmp_path):
    """In process: a session's turns sample from (server --seed, its sample key, turn), not from which sessions
    the worker's policy served before; --top-p reaches the sampler."""
    from conftest import save_micro_checkpoint

    from nanocomposer.agent.manager import ServerConfig, SessionManager
    from nanocomposer.agent.registry import Registry
    from nanocomposer.agent.store import TERMINAL, SessionStore

    registry = Registry(tmp_path / "registry")
    registry.add("micro", str(save_micro_checkpoint(tmp_path / "micro")))
    registry.promote("micro")

    def serve(name: str, sampling: dict, keys: list[str | None]) -> tuple[SessionStore, list[str], list[list[int]]]:
        store = SessionStore(tmp_path / f"{name}.db")
        config = ServerConfig(workers=1, max_turns=1, backend="transformers",
                              sampling={"max_new_tokens": 16, "temperature": 1.0, **sampling})
        manager = SessionManager(store, registry, config)
        manager.start()
        try:
            ids = [manager.submit(task_dir=str(TASK), sample_key=key) for key in keys]
            deadline = time.monotonic() + 300
            while any(store.session(i)["status"] not in TERMINAL for i in ids) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            manager.stop()
        assert all(store.session(i)["status"] == "finished" for i in ids), [store.session(i) for i in ids]
        return store, ids, [store.turns(i)[0]["completion_ids"] for i in ids]

    store, ids, tokens = serve("seed7", {"seed": 7}, ["k1", "k2", "k1", None])
    assert tokens[0] == tokens[2]  # the same key, after two other sessions on the same policy object
    assert tokens[0] != tokens[1] and tokens[3] != tokens[0]
    assert store.session(ids[3])["sample_key"] == ids[3] and store.export_record(ids[0])["episode_key"] == "k1"
    assert serve("seed8", {"seed": 8}, ["k1"])[2][0] != tokens[0]  # another server seed: another sample
    _, _, greedy = serve("greedy", {"seed": 7, "temperature": 0.0}, ["k1", "k2"])
    _, _, nucleus = serve("top_p", {"seed": 7, "top_p": 1e-6}, ["k1", "k2"])  # only the top token is left
    assert nucleus == greedy and greedy[0] != tokens[0]


def test_a_stop_racing_a_finishing_worker_keeps_the_finished_session(tmp_path):
    """The worker records `finished`, then leaves its running set: a stop in between (a client that saw
    `finished` and shut the server down) must not turn the finished session into `interrupted`."""
    from nanocomposer.agent.manager import ServerConfig, SessionManager
    from nanocomposer.agent.registry import Registry
    from nanocomposer.agent.store import SessionStore

    class StopAfterFinish(SessionStore):
        def finish(self, session_id, status, *args, **kwargs):
            ended = super().finish(session_id, status, *args, **kwargs)
            if status == "finished":
                manager.stop()  # the window: recorded finished, still in the worker's running set
            return ended

    registry = Registry(tmp_path / "registry")
    registry.add("oracle", "oracle")
    registry.promote("oracle")
    store = StopAfterFinish(tmp_path / "sessions.db")
    manager = SessionManager(store, registry, ServerConfig(workers=1))
    manager.start()
    session_id = manager.submit(task_dir=str(TASK))
    deadline = time.monotonic() + 120
    while store.session(session_id)["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.05)
    manager.stop()
    s = store.session(session_id)
    assert (s["status"], s["status_reason"], s["solved"]) == ("finished", None, 1)
    assert not store.finish(session_id, "failed", None, None, None, reason="late")  # an end is final
    store.set_status(session_id, "running")
    store.start(session_id, "v9", "other")
    assert (store.session(session_id)["status"], store.session(session_id)["model_version"]) == ("finished", "oracle")
