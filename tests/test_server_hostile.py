"""The agent server against hostile clients, other local users and faults (docs/agent-server.md).

In process (FastAPI TestClient): a seeded fuzz of every route and field (lone surrogates, huge integers,
NaN/Infinity/1e999, wrong types, nested junk, oversized and malformed bodies, bad methods, junk query strings)
answers no 500 and never raises; the limits, previews, peer-uid rules and the atomic follow-up key. As real
processes (uvicorn over loopback TCP and a unix socket, httpx and a uid-65534 client): tokens, Host/Origin,
413 without a dropped connection, long-polls that hold no thread, a database that is whole after a stop, a
corrupt database refused in one line.
"""

import asyncio
import json
import math
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from env.task_sets import SAMPLES_DIR
from nanocomposer.agent.api import MAX_BODY_BYTES, create_app
from nanocomposer.agent.manager import ServerConfig, SessionManager
from nanocomposer.agent.registry import Registry
from nanocomposer.agent.store import SessionStore

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

ROOT = Path(__file__).resolve().parents[1]
TASK = SAMPLES_DIR / "fix_bug_leap_century"
TOKEN, ADMIN = "client-token", "admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by uid 65534 (the venv's interpreter lives under /root)


def strict_json(raw: bytes):
    """Parse as a strict client would: valid UTF-8, no NaN/Infinity."""
    def no_constant(name):
        raise ValueError(f"non-finite number {name} in a response")
    return json.loads(raw.decode("utf-8"), parse_constant=no_constant)


def world_dir(prefix: str) -> Path:
    """A directory under /tmp that uid 65534 can reach (pytest's tmp_path is 0700 root)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    return d


class Peer:
    """Sets the connection's peer uid in the scope, as serve.py's protocol does from SO_PEERCRED."""

    def __init__(self, app, uid):
        self.app, self.uid = app, uid

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope = {**scope, "state": {**scope.get("state", {}), "peer_uid": self.uid, "peer_gid": self.uid}}
        return await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    registry = Registry(tmp / "registry")
    registry.add("noop", "noop")
    registry.add("noop2", "noop")
    registry.promote("noop")
    store = SessionStore(tmp / "sessions.db", check=True)
    # no workers: sessions stay queued (nothing runs, the fuzz stays cheap); `done` is ended by hand
    manager = SessionManager(store, registry, ServerConfig(workers=0, max_queue=1000))
    manager.start()
    app = create_app(manager, TOKEN, ADMIN)
    client = TestClient(app, headers=AUTH)
    done = client.post("/sessions", json={"task_dir": str(TASK)}).json()["id"]
    store.finish(done, "finished", None, "", 0)
    assert client.get(f"/sessions/{done}/result").status_code == 200
    yield {"client": client, "app": app, "manager": manager, "store": store, "done": done, "tmp": tmp}
    manager.stop()
    store.close()


# ----------------------------------------------------------------------------------------------- the fuzz
NAN, INF, NINF, E999 = "@@NaN@@", "@@Inf@@", "@@-Inf@@", "@@1e999@@"


def junk(rng: random.Random, depth: int = 0):
    choices = [
        lambda: "\ud800", lambda: "ok\udfffok", lambda: "x" * rng.choice((1, 200, 70_000)), lambda: "",
        lambda: "\x00", lambda: "../../etc/shadow", lambda: "/root", lambda: str(TASK), lambda: "rating",
        lambda: 2 ** 63, lambda: -(2 ** 63), lambda: 10 ** 100, lambda: 0, lambda: -1, lambda: 3,
        lambda: NAN, lambda: INF, lambda: NINF, lambda: E999, lambda: 1e308, lambda: 5e-324,
        lambda: True, lambda: None, lambda: "kept", lambda: "\u202e\U0001f600",
    ]
    if depth < 3:
        choices += [lambda: [junk(rng, depth + 1) for _ in range(rng.randint(0, 3))],
                    lambda: {str(junk(rng, depth + 1))[:20]: junk(rng, depth + 1) for _ in range(rng.randint(0, 3))}]
    return rng.choice(choices)()


def encode(body) -> bytes:
    text = json.dumps(body)  # ensure_ascii: a lone surrogate goes over the wire as \ud800, as a hostile client sends
    return (text.replace(f'"{NAN}"', "NaN").replace(f'"{INF}"', "Infinity").replace(f'"{NINF}"', "-Infinity")
            .replace(f'"{E999}"', "1e999")).encode()


FIELDS = {
    "/sessions": ("instruction", "repo", "task_dir", "test_command", "timeout_s", "client", "sample_key"),
    "messages": ("text", "client"),
    "feedback": ("kind", "value", "text"),
    "/admin/promote": ("version",),
}
QUERY_JUNK = ["0", "-1", "1e999", "inf", "nan", "NaN", "9223372036854775808", "99999999999999999999999", "abc",
              "%ED%A0%80", "", "0.01", "true", "[]", "\x00"]


def fuzz_request(rng: random.Random, sid: str) -> tuple[str, str, dict]:
    sid = rng.choice([sid, sid, "no-such-session", "%ED%A0%80", "x" * 300, "..%2F..%2Fadmin"])
    kind = rng.randrange(10)
    if kind < 4:
        path = rng.choice(["/sessions", f"/sessions/{sid}/messages", f"/sessions/{sid}/feedback", "/admin/promote"])
        fields = FIELDS["/sessions" if path == "/sessions" else "/admin/promote" if path.startswith("/admin")
                        else path.rsplit("/", 1)[1]]
        body = {f: junk(rng) for f in fields if rng.random() < 0.6}
        if rng.random() < 0.2:
            body[str(junk(rng))[:30]] = junk(rng)  # an unknown (maybe invalid Unicode) key
        if rng.random() < 0.1:
            body = junk(rng)  # not even an object
        return "POST", path, {"content": encode(body), "headers": {"content-type": "application/json"}}
    if kind == 4:  # malformed bodies
        content = rng.choice([b"{not json", b"\xff\xfe\x00", b"[" * 50_000 + b"]" * 50_000, b'{"text": "\\ud800"',
                              b"", b"null", b'{"instruction": "' + b"a" * (MAX_BODY_BYTES + 10) + b'"}',
                              b'{"repo": 1e999999, "instruction": NaN}'])
        path = rng.choice(["/sessions", f"/sessions/{sid}/messages", f"/sessions/{sid}/feedback", "/admin/promote"])
        ctype = rng.choice(["application/json", "text/plain", "application/x-www-form-urlencoded", ""])
        return "POST", path, {"content": content, "headers": {"content-type": ctype} if ctype else {}}
    if kind == 5:  # bad methods
        return (rng.choice(["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
                rng.choice(["/sessions", f"/sessions/{sid}", "/health", "/admin/promote", "/nope"]),
                {"content": b"{}"})
    path = rng.choice([f"/sessions/{sid}", f"/sessions/{sid}/result", "/sessions", "/health", "/admin/versions"])
    params = {}
    for name in ("after_turn", "wait_s", "tokens", "status", "limit"):
        if rng.random() < 0.5:
            params[name] = rng.choice(QUERY_JUNK)
    if params.get("wait_s") not in (None, "0", "0.01", "-1", "1e999", "inf", "nan", "NaN", "abc", "", "true", "[]",
                                    "%ED%A0%80", "\x00"):
        params["wait_s"] = "0"  # keep the fuzz fast: no real long-polls here
    return "GET", path, {"params": params}


def test_seeded_fuzz_of_every_route_answers_no_500_and_valid_json(served):
    client, store = served["client"], served["store"]
    rng = random.Random(20261203)
    statuses: dict[int, int] = {}
    for i in range(500):
        method, path, kwargs = fuzz_request(rng, served["done"])
        r = client.request(method, path, **kwargs)  # a server exception would raise here (a dropped connection)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (i, method, path, kwargs.get("params"), r.text[:300])
        if method != "HEAD" and r.content:
            body = strict_json(r.content)
            assert r.status_code < 400 or body.get("error"), (i, path, body)
    assert statuses.get(422, 0) > 50 and statuses.get(413, 0) > 3 and statuses.get(405, 0) > 3, statuses
    # what was stored reads back as strict JSON: the list, every session, every export record
    assert client.get("/health").status_code == 200
    listed = strict_json(client.get("/sessions", params={"limit": 10000}).content)["sessions"]
    for s in listed:
        strict_json(client.get(f"/sessions/{s['id']}").content)
        json.dumps(store.export_record(s["id"]), allow_nan=False)
    rows = store._query("SELECT value FROM feedback WHERE value IS NOT NULL")
    assert all(math.isfinite(r["value"]) for r in rows)


@pytest.mark.parametrize("body", [
    {"task_dir": str(TASK), "instruction": "\ud800"},
    {"task_dir": str(TASK), "test_command": "true \udc00"},
    {"task_dir": str(TASK), "client": "\udfff"},
    {"task_dir": str(TASK), "timeout_s": NAN},
    {"task_dir": str(TASK), "timeout_s": INF},
    {"task_dir": str(TASK), "timeout_s": E999},
    {"task_dir": str(TASK), "timeout_s": -1},
    {"task_dir": str(TASK), "timeout_s": "soon"},
    {"task_dir": [str(TASK)]},
    {"repo": "a\x00b", "instruction": "x"},
    {"repo": "/" + "a" * 5000, "instruction": "x"},
])
def test_bad_fields_are_422_with_the_field_named_and_nothing_created(served, body):
    client, store = served["client"], served["store"]
    before = len(store.sessions())
    r = client.post("/sessions", content=encode(body), headers={"content-type": "application/json"})
    assert r.status_code in (413, 422), r.text
    field = next(k for k in body if k != "task_dir" or len(body) == 1)
    assert field in r.json()["error"], r.text
    assert len(store.sessions()) == before


def test_messages_feedback_and_queries_refuse_non_finite_surrogates_and_huge_ints(served):
    client, done = served["client"], served["done"]
    for body in ({"kind": "kept", "value": INF}, {"kind": "kept", "value": NAN}, {"kind": "kept", "value": E999},
                 {"kind": "kept", "text": "\ud83d"}, {"kind": "\ud800"}, {"kind": "rating", "value": 2 ** 64}):
        r = client.post(f"/sessions/{done}/feedback", content=encode(body), headers={"content-type": "application/json"})
        assert r.status_code == 422, (body, r.text)
    r = client.post(f"/sessions/{done}/messages", content=encode({"text": "again \udfff"}),
                    headers={"content-type": "application/json"})
    assert r.status_code == 422 and "text" in r.json()["error"]
    for params in ({"after_turn": 2 ** 63}, {"after_turn": 10 ** 30}, {"after_turn": -1}, {"wait_s": "nan"},
                   {"wait_s": "inf"}, {"wait_s": "1e999"}, {"limit": 2 ** 63}):
        path = f"/sessions/{done}" if "limit" not in params else "/sessions"
        assert client.get(path, params=params).status_code == 422, params
    assert client.get(f"/sessions/{done}", params={"after_turn": 2 ** 31 - 1}).json()["turns"] == []
    # the one way left to get a non-finite number in: a direct caller of the store
    with pytest.raises(ValueError):
        served["store"].add_feedback(done, "kept", float("inf"))


def test_a_non_finite_value_already_in_an_old_database_reads_back_as_null(served, tmp_path):
    store, done = served["store"], served["done"]
    db = sqlite3.connect(store.path)
    db.execute("INSERT INTO feedback (session_id, kind, value, created_at) VALUES (?, 'kept', ?, ?)",
               (done, float("inf"), time.time()))
    db.execute("UPDATE sessions SET wall_s = ? WHERE id = ?", (float("-inf"), done))
    db.commit()
    db.close()
    r = served["client"].get(f"/sessions/{done}/result")
    assert r.status_code == 200 and strict_json(r.content)["wall_s"] is None
    assert None in [f["value"] for f in r.json()["feedback"]]
    json.dumps(store.export_record(done), allow_nan=False)


def test_oversized_instruction_and_body_are_413_and_lists_carry_previews(served):
    client, store = served["client"], served["store"]
    r = client.post("/sessions", json={"task_dir": str(TASK), "instruction": "y" * (64 * 1024 + 1)})
    assert r.status_code == 413 and "instruction" in r.json()["error"]
    r = client.post("/sessions", content=b'{"instruction": "' + b"z" * (2 * MAX_BODY_BYTES) + b'"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and str(MAX_BODY_BYTES) in r.json()["error"]
    sid = client.post("/sessions", json={"task_dir": str(TASK), "instruction": "w" * 60_000}).json()["id"]
    listed = {s["id"]: s for s in client.get("/sessions").json()["sessions"]}[sid]
    assert listed["instruction"] == "w" * 200 and listed["instruction_chars"] == 60_000
    assert client.get(f"/sessions/{sid}").json()["instruction"] == "w" * 60_000
    # a follow-up cannot grow a conversation past its limit
    store.finish(sid, "finished", None, "", 0)
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE sessions SET instruction = ? WHERE id = ?", ("v" * 250_000, sid))
    r = client.post(f"/sessions/{sid}/messages", json={"text": "u" * 20_000})
    assert r.status_code == 413 and "conversation" in r.json()["error"]


def test_concurrent_followups_get_distinct_sample_keys(served):
    manager, store, done = served["manager"], served["store"], served["done"]
    earlier = sum(m["kind"] == "followup" for m in store.user_messages(done))  # the fuzz's
    with ThreadPoolExecutor(8) as pool:
        children = list(pool.map(lambda i: manager.followup(done, f"try again {i}"), range(16)))
    keys = [store.session(c)["sample_key"] for c in children]
    base = store.session(done)["sample_key"]
    assert len(set(keys)) == 16 and set(keys) == {f"{base}/followup{n}" for n in range(earlier + 1, earlier + 17)}
    followups = [m for m in store.user_messages(done) if m["kind"] == "followup"]
    assert len(followups) == earlier + 16


def test_admin_routes_need_the_admin_token_or_the_servers_own_uid(served):
    app = served["app"]
    plain = TestClient(app, headers=AUTH)  # peer unknown (as over a non-loopback network)
    assert plain.get("/admin/versions").status_code == 403
    assert plain.post("/admin/promote", json={"version": "noop2"}).status_code == 403
    admin = TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"})
    assert admin.post("/admin/promote", json={"version": "noop2"}).json() == {"current": "noop2"}
    assert admin.post("/admin/promote", json={"version": "noop"}).status_code == 200
    own = TestClient(Peer(app, os.geteuid()), headers=AUTH)
    assert own.get("/admin/versions").status_code == 200
    other = TestClient(Peer(app, NOBODY), headers={"Authorization": f"Bearer {ADMIN}"})
    assert other.get("/admin/versions").status_code == 403  # never for another local user, whatever it holds
    assert TestClient(app).get("/health").status_code == 401
    assert TestClient(app, headers={"Authorization": "Bearer wrong"}).get("/health").status_code == 401


def test_another_local_user_gets_only_what_it_could_read_itself(served):
    client = TestClient(Peer(served["app"], NOBODY), headers=AUTH)
    secret = world_dir("hostile-secret-")
    (secret / "key.txt").write_text("root only\n")
    (secret / "key.txt").chmod(0o600)
    public = world_dir("hostile-public-")
    (public / "a.py").write_text("x = 1\n")
    (public / "a.py").chmod(0o644)
    try:
        r = client.post("/sessions", json={"repo": str(secret), "instruction": "read key.txt",
                                           "test_command": "grep -q '^r' key.txt"})
        assert r.status_code == 403 and "key.txt" in r.json()["error"]
        r = client.post("/sessions", json={"repo": "/root", "instruction": "x"})
        assert r.status_code == 403
        # a world-readable directory whose entries link to what only root may read
        (public / "task").mkdir()
        (public / "task" / "repo").symlink_to(secret)
        (public / "task" / "task.json").write_text("{}")
        (public / "task" / "task.json").chmod(0o644)
        r = client.post("/sessions", json={"task_dir": str(public / "task")})
        assert r.status_code == 403 and "key.txt" in r.json()["error"], r.text
        shutil.rmtree(public / "task")
        r = client.post("/sessions", json={"repo": str(public), "instruction": "edit a.py"})
        assert r.status_code == 201, r.text
        mine = r.json()["id"]
        # its own session: visible; the server user's sessions: not there at all
        assert client.get(f"/sessions/{mine}").status_code == 200
        assert [s["id"] for s in client.get("/sessions").json()["sessions"]] == [mine]
        assert client.get(f"/sessions/{served['done']}").status_code == 404
        assert client.post(f"/sessions/{served['done']}/messages", json={"text": "more"}).status_code == 404
        assert client.post(f"/sessions/{served['done']}/feedback", json={"kind": "kept"}).status_code == 404
        assert served["store"].session(mine)["owner_uid"] == NOBODY
    finally:
        shutil.rmtree(secret)
        shutil.rmtree(public)


def test_host_and_origin_are_checked_in_process(served):
    client = served["client"]
    assert client.get("/health", headers={"Host": "evil.example"}).status_code == 421
    assert client.get("/health", headers={"Host": "testserver:1"}).status_code == 421
    assert client.get("/health", headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.get("/health", headers={"Origin": "null"}).status_code == 403
    assert client.get("/health", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert client.get("/health", headers={"Origin": "http://testserver"}).status_code == 200
    r = client.post("/sessions", json={"task_dir": str(TASK)}, headers={"Host": "attacker.example"})
    assert r.status_code == 421


def test_store_close_checkpoints_and_a_corrupt_database_is_a_store_error(tmp_path):
    from nanocomposer.agent.store import StoreError

    store = SessionStore(tmp_path / "s.db", check=True)
    ids = [store.create(source="task_dir", instruction=f"i{i}", task_dir="/x") for i in range(20)]
    assert (tmp_path / "s.db").stat().st_mode & 0o777 == 0o600
    store.close()
    wal = tmp_path / "s.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    copy = tmp_path / "copy.db"
    shutil.copyfile(tmp_path / "s.db", copy)  # the file alone is the whole database
    with sqlite3.connect(copy) as db:
        assert {r[0] for r in db.execute("SELECT id FROM sessions")} == set(ids)
    (tmp_path / "junk.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="junk.db"):
        SessionStore(tmp_path / "junk.db", check=True)


# ------------------------------------------------------------------------------- real processes
CLIENT = r"""
import http.client, json, socket, sys
mode, where, method, path, token, body = sys.argv[1:7]
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(where)
try:
    conn = Unix("localhost") if mode == "unix" else http.client.HTTPConnection(where, timeout=30)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    conn.request(method, path, body=body.encode() if body else None, headers=headers)
    r = conn.getresponse()
    print(json.dumps({"status": r.status, "body": r.read().decode()}))
except Exception as e:
    print(json.dumps({"status": None, "error": type(e).__name__ + ": " + str(e)}))
"""


def as_nobody(mode: str, where: str, method: str, path: str, token: str = "", body: dict | None = None) -> dict:
    proc = subprocess.run([SYSTEM_PYTHON, "-c", CLIENT, mode, where, method, path, token,
                           json.dumps(body) if body is not None else ""], user=NOBODY, group=NOBODY,
                          extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def ask_then_submit(path: Path) -> Path:
    turns = [{"name": "ask_user", "arguments": {"question": "Which century rule?"}},
             {"name": "submit", "arguments": {"summary": "done"}}]
    path.write_text(json.dumps([f"<tool_call>\n{json.dumps(t)}\n</tool_call>" for t in turns]))
    return path


def start(tmp: Path, *args: str) -> tuple[subprocess.Popen, str, Path]:
    cmd = [sys.executable, str(ROOT / "agent.py"), "serve", "--db", str(tmp / "sessions.db"),
           "--registry", str(tmp / "registry"), "--answer-timeout-s", "120", *args]
    env = {k: v for k, v in os.environ.items() if k != "NANOCOMPOSER_TOKEN"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert "agent server on " in line, line + proc.stderr.read()
    token_file = Path(line.split("token file ")[1].split(",")[0])
    return proc, line.split()[3], token_file


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def tcp_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tcp")
    proc, url, token_file = start(tmp, "--port", "0", "--workers", "1",
                                  "--model", f"replay:{ask_then_submit(tmp / 'ask.json')}")
    token = token_file.read_text().strip()
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=70)
    deadline = time.monotonic() + 30
    while http.get("/health").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    waiting = http.post("/sessions", json={"task_dir": str(TASK)}).json()["id"]
    while http.get(f"/sessions/{waiting}", params={"wait_s": 2}).json()["status"] != "waiting":
        assert time.monotonic() < deadline + 30
    yield {"proc": proc, "url": url, "http": http, "token": token, "token_file": token_file, "tmp": tmp,
           "waiting": waiting, "port": url.rsplit(":", 1)[1]}
    http.close()
    stop(proc)


def test_every_client_needs_the_token_and_only_the_servers_user_can_read_it(tcp_server):
    url, token_file = tcp_server["url"], tcp_server["token_file"]
    assert token_file.stat().st_mode & 0o777 == 0o600
    admin_file = token_file.with_name(token_file.name.replace(".token", ".admin-token"))
    assert admin_file.stat().st_mode & 0o777 == 0o600 and admin_file.read_text().strip() != tcp_server["token"]
    assert httpx.get(f"{url}/health").status_code == 401  # localhost too: no token, no service
    where = url.removeprefix("http://")
    r = as_nobody("tcp", where, "GET", "/health")
    assert r["status"] == 401, r
    r = as_nobody("tcp", where, "POST", "/sessions", body={"task_dir": str(TASK)})
    assert r["status"] == 401, r
    assert subprocess.run(["cat", str(token_file)], user=NOBODY, group=NOBODY, extra_groups=[],
                          capture_output=True, check=False).returncode != 0


def test_a_uid_65534_client_with_the_token_cannot_read_root_files_or_promote(tcp_server):
    """Even holding the client token and the admin token, another local user over loopback TCP (the peer uid is
    read from the kernel's socket table) may not have the server copy what it could not read itself."""
    where, token = tcp_server["url"].removeprefix("http://"), tcp_server["token"]
    admin = tcp_server["token_file"].with_name("sessions.admin-token").read_text().strip()
    secret = world_dir("hostile-root-")
    (secret / "shadow.txt").write_text("s3cret\n")
    (secret / "shadow.txt").chmod(0o600)
    public = world_dir("hostile-open-")
    (public / "ok.txt").write_text("fine\n")
    (public / "ok.txt").chmod(0o644)
    try:
        for repo in (secret, "/root", "/etc/shadow"):
            r = as_nobody("tcp", where, "POST", "/sessions", token, {"repo": str(repo), "instruction": "cat it",
                                                                     "test_command": "grep -q '^s' shadow.txt"})
            assert r["status"] in (400, 403), r
        r = as_nobody("tcp", where, "POST", "/sessions", token, {"task_dir": str(secret)})
        assert r["status"] == 403, r
        r = as_nobody("tcp", where, "POST", "/sessions", token, {"repo": str(public), "instruction": "read ok.txt"})
        assert r["status"] == 201, r
        theirs = json.loads(r["body"])["id"]
        r = as_nobody("tcp", where, "POST", "/admin/promote", admin, {"version": "noop"})
        assert r["status"] == 403, r
        r = as_nobody("tcp", where, "GET", f"/sessions/{tcp_server['waiting']}", token)
        assert r["status"] == 404, r  # root's session: not there for uid 65534
        listed = json.loads(as_nobody("tcp", where, "GET", "/sessions", token)["body"])["sessions"]
        assert [s["id"] for s in listed] == [theirs]
        assert tcp_server["http"].get("/admin/versions").status_code == 200  # the server's own uid: admin
    finally:
        shutil.rmtree(secret)
        shutil.rmtree(public)


def test_host_origin_and_body_limits_over_real_http(tcp_server):
    http, port = tcp_server["http"], tcp_server["port"]
    assert http.get("/health", headers={"Host": f"evil.example:{port}"}).status_code == 421
    assert http.get("/health", headers={"Host": f"localhost:{port}"}).status_code == 200
    assert http.get("/health", headers={"Host": f"127.0.0.1:{int(port) + 1}"}).status_code == 421
    r = http.post("/sessions", json={"task_dir": str(TASK)},
                  headers={"Origin": "http://rebind.example", "Host": f"127.0.0.1:{port}"})
    assert r.status_code == 403
    before = http.get("/health").json()["sessions"]
    # 30 MB in one Content-Length body: 413, read and answered, the connection not dropped
    r = http.post("/sessions", content=b'{"instruction": "' + b"a" * 30_000_000 + b'", "task_dir": "x"}',
                  headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]

    def chunks():
        yield b'{"task_dir": "' + str(TASK).encode() + b'", "instruction": "'
        for _ in range(40):
            yield b"b" * 65536
        yield b'"}'

    r = http.post("/sessions", content=chunks(), headers={"content-type": "application/json"})  # chunked
    assert r.status_code == 413
    assert http.get("/health").json()["sessions"] == before
    assert http.get("/health").status_code == 200  # the same client, still served


def test_long_polls_hold_no_thread_and_end_at_their_deadline(tcp_server):
    """60 idle long-polls (more than the server's thread pool has threads) and /health still answers at once;
    every wait ends at its deadline (before: ~40 of them stalled /health 9-13 s, some ran to twice wait_s)."""
    url, token, waiting = tcp_server["url"], tcp_server["token"], tcp_server["waiting"]
    n, wait_s = 60, 3.0

    async def main():
        limits = httpx.Limits(max_connections=n + 5)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30,
                                     limits=limits) as client:
            async def poll():
                t0 = time.monotonic()
                r = await client.get(f"/sessions/{waiting}/result", params={"wait_s": wait_s})
                return r.status_code, time.monotonic() - t0

            async def health():
                await asyncio.sleep(1.0)  # every long-poll is in
                times = []
                for _ in range(5):
                    t0 = time.monotonic()
                    assert (await client.get("/health")).status_code == 200
                    times.append(time.monotonic() - t0)
                return times

            return await asyncio.gather(health(), *[poll() for _ in range(n)])

    health, *polls = asyncio.run(main())
    assert [code for code, _ in polls] == [202] * n
    durations = [d for _, d in polls]
    assert max(health) < 1.0, health  # the waiting clients do not stall the server
    assert min(durations) >= wait_s - 0.05 and max(durations) < 1.5 * wait_s, (min(durations), max(durations))


def test_a_unix_socket_server_uses_the_peers_uid(tmp_path):
    sock_dir = world_dir("hostile-sock-")
    path = sock_dir / "agent.sock"
    proc, where, token_file = start(tmp_path, "--unix", str(path), "--workers", "1", "--model", "noop")
    secret = world_dir("hostile-unix-secret-")
    (secret / "key").write_text("k\n")
    (secret / "key").chmod(0o600)
    public = world_dir("hostile-unix-open-")
    (public / "f.txt").write_text("f\n")
    (public / "f.txt").chmod(0o644)
    try:
        assert where == f"unix:{path}" and path.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        http = httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://localhost",
                            headers={"Authorization": f"Bearer {token}"}, timeout=30)
        deadline = time.monotonic() + 30
        while True:
            try:
                if http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert http.get("/health", headers={"Host": "evil.example"}).status_code == 421
        assert http.get("/admin/versions").status_code == 200  # the server's uid: admin without the admin token
        r = as_nobody("unix", str(path), "GET", "/health", token)
        assert r["status"] is None and "Permission" in r["error"], r  # 0600: another user cannot connect
        path.chmod(0o666)  # even when the socket is opened up, the peer's uid decides
        r = as_nobody("unix", str(path), "POST", "/sessions", token, {"repo": str(secret), "instruction": "x"})
        assert r["status"] == 403, r
        r = as_nobody("unix", str(path), "POST", "/sessions", token, {"repo": str(public), "instruction": "x"})
        assert r["status"] == 201, r
        r = as_nobody("unix", str(path), "GET", "/admin/versions", token)
        assert r["status"] == 403, r
        http.close()
    finally:
        stop(proc)
        for d in (sock_dir, secret, public):
            shutil.rmtree(d, ignore_errors=True)
    assert not path.exists()


def test_a_stopped_server_leaves_a_whole_database_and_a_corrupt_one_is_refused(tmp_path):
    proc, url, token_file = start(tmp_path, "--port", "0", "--workers", "1", "--model", "noop")
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token_file.read_text().strip()}"},
                        timeout=30)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        ids = [http.post("/sessions", json={"task_dir": str(TASK)}).json()["id"] for _ in range(3)]
        for sid in ids:
            assert http.get(f"/sessions/{sid}/result", params={"wait_s": 30}).status_code == 200
        http.post(f"/sessions/{ids[0]}/feedback", json={"kind": "kept"})
    finally:
        http.close()
        stop(proc)
    db = tmp_path / "sessions.db"
    wal = tmp_path / "sessions.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copyfile(db, alone / "sessions.db")  # what a backup by copying after the stop gets
    with sqlite3.connect(alone / "sessions.db") as conn:
        assert {r[0] for r in conn.execute("SELECT id FROM sessions WHERE status = 'finished'")} == set(ids)
        assert conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 1
    # damage a page in the middle of the file: the next start is one line naming it, exit 2, no traceback
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) > 3 * page
    data[page:2 * page] = b"\xa5" * page
    db.write_bytes(bytes(data))
    (tmp_path / "notadb.db").write_bytes(b"garbage " * 1000)
    for target in (db, tmp_path / "notadb.db"):
        cmd = [sys.executable, "agent.py", "serve", "--port", "0", "--model", "noop", "--db", str(target),
               "--registry", str(tmp_path / "registry")]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(target) in lines[0] and "Traceback" not in r.stderr, r.stderr
        assert r.stdout == ""


def test_seeded_fuzz_over_real_http_drops_no_connection(tcp_server):
    """The same fuzz through uvicorn and h11 (every answer read back over the socket), then malformed HTTP."""
    http = tcp_server["http"]
    target = http.post("/sessions", json={"task_dir": str(TASK), "client": "fuzz"}).json()["id"]  # stays queued
    rng = random.Random(7)
    for i in range(150):
        method, path, kwargs = fuzz_request(rng, target)
        if "/messages" in path and tcp_server["waiting"] in path:
            continue
        try:
            r = http.request(method, path, **kwargs)
        except httpx.TransportError as e:  # a dropped connection
            pytest.fail(f"request {i} {method} {path}: {type(e).__name__}: {e}")
        assert r.status_code < 500, (i, method, path, r.text[:300])
        if method != "HEAD" and r.content:
            strict_json(r.content)
    host, port = "127.0.0.1", int(tcp_server["port"])
    raw = [b"GARBAGE\r\n\r\n",
           b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"h" * 100_000 + b"\r\n\r\n",
           b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n{}",
           b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
           b"GET /health HTTP/1.0\r\n\r\n"]
    for request in raw:
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(request)
            answer = sock.recv(200)
        assert answer.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), (request[:60], answer)
    assert http.get("/health").status_code == 200


def test_followups_through_the_api_in_parallel_get_distinct_keys(tcp_server):
    http = tcp_server["http"]
    # the waiting session's answer ends it; then parallel follow-ups over HTTP
    sid = tcp_server["waiting"]
    assert http.post(f"/sessions/{sid}/messages", json={"text": "the Gregorian one"}).status_code == 200
    assert http.get(f"/sessions/{sid}/result", params={"wait_s": 30}).status_code == 200
    barrier = threading.Barrier(6)

    def followup(i):
        barrier.wait()
        return http.post(f"/sessions/{sid}/messages", json={"text": f"again {i}"})

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(followup, range(6)))
    assert all(r.status_code == 202 for r in responses), [r.text for r in responses]
    keys = {http.get(f"/sessions/{r.json()['id']}").json()["sample_key"] for r in responses}
    assert len(keys) == 6


def test_a_stop_answers_pending_long_polls_at_once(tcp_server):
    """Runs last on the module's server: a SIGTERM does not wait out a 50 s long-poll."""
    http, proc = tcp_server["http"], tcp_server["proc"]
    queued = http.post("/sessions", json={"task_dir": str(TASK)}).json()["id"]
    answers: list[int] = []

    def long_poll():
        with httpx.Client(base_url=tcp_server["url"], headers=http.headers, timeout=70) as c:
            answers.append(c.get(f"/sessions/{queued}/result", params={"wait_s": 50}).status_code)

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=40) == 0
    poller.join(10)
    assert answers == [202] and time.monotonic() - t0 < 25, (answers, time.monotonic() - t0)


def test_the_store_never_fails_a_write_on_invalid_unicode_or_non_finite_numbers(tmp_path):
    """What a direct caller (a worker recording a replayed turn, a tool result) hands the store is made storable:
    lone surrogates become U+FFFD, non-finite floats NULL; everything reads back as strict JSON."""
    store = SessionStore(tmp_path / "s.db")
    sid = store.create(source="task_dir", instruction="fix \ud800 it", task_dir="/x", timeout_s=float("nan"))
    store.add_turn(sid, {"turn": 0, "text": "bad \udfff", "gen_s": float("inf"), "logprobs": [float("-inf"), 0.5],
                         "calls": [{"name": "x\ud800", "arguments": {"a": float("nan")}, "wall_s": float("inf")}]},
                   ["result \udc80"])
    store.add_message(sid, "answer", "\ud83d")
    s = store.session(sid)
    assert s["instruction"] == "fix \ufffd it" and s["timeout_s"] is None
    turn = store.turns(sid)[0]
    assert turn["text"] == "bad \ufffd" and turn["logprobs"] == [None, 0.5] and turn["gen_s"] == 0.0
    assert turn["calls"][0]["arguments"] == {"a": None} and turn["calls"][0]["result"] == "result \ufffd"
    json.dumps(store.export_record(sid), allow_nan=False)
    store.close()


def test_faults_are_answered_with_a_reason_not_500(tmp_path):
    """An unreadable registry pointer and a database that went away: 409 / 503 naming the problem."""
    registry = Registry(tmp_path / "registry")
    registry.add("noop", "noop")
    registry.promote("noop")
    store = SessionStore(tmp_path / "s.db")
    manager = SessionManager(store, registry, ServerConfig(workers=0))
    client = TestClient(create_app(manager, TOKEN, ADMIN), headers={"Authorization": f"Bearer {ADMIN}"})
    registry.current_file.unlink()
    registry.current_file.mkdir()  # `current` unreadable
    health = client.get("/health").json()
    assert health["ok"] is False and "current" in health["problem"]
    r = client.get("/admin/versions")
    assert r.status_code == 409 and "current" in r.json()["error"]
    store.close()  # the database is gone from under the API
    r = client.post("/sessions", json={"task_dir": str(TASK)})
    assert r.status_code == 503 and "database" in r.json()["error"]
