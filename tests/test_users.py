"""env/users.py: the simulated developer's judgement and reactions, against a scripted fake server."""

import dataclasses
import http.server
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from env.task_sets import SAMPLES_DIR
from env.tasks import Task, load_task, load_task_set
from env.users import (
    Population,
    Simulation,
    draw_tasks,
    hidden_spec,
    interleaved_by_family,
    judge,
    load_population,
    question_needed,
)

ROOT = Path(__file__).resolve().parents[1]
TASK = load_task(SAMPLES_DIR / "fix_bug_leap_century")
WRONG = "--- a/leapyear.py\n+++ b/leapyear.py\n@@ -1 +1,2 @@\n" + \
    (TASK.repo_dir / "leapyear.py").read_text().splitlines(keepends=True)[0] + "+# looked at it\n"


class FakeServer:
    """Sessions that ask one question, then end with a given diff (or never end)."""

    def __init__(self, diff: str, finishes: bool = True):
        self.diff, self.finishes = diff, finishes
        self.sessions: dict[str, dict] = {}
        self.feedback: list[tuple[str, str, float | None]] = []
        self.messages: list[tuple[str, str]] = []

    def new(self, parent: str | None = None) -> str:
        sid = f"s{len(self.sessions) + 1}"
        self.sessions[sid] = {"id": sid, "status": "waiting", "question": "Which rule?", "turn_count": 1,
                              "diff": None, "submission": "", "wall_s": 0.1, "created_at": 0.0, "started_at": 0.0,
                              "parent_id": parent}
        return sid

    def handler(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        body = json.loads(request.content) if request.content else {}
        if request.method == "POST" and parts == ["sessions"]:
            return httpx.Response(201, json={"id": self.new(), "status": "queued"})
        s = self.sessions[parts[1]]
        if request.method == "GET":
            return httpx.Response(200, json=s)
        if parts[2] == "feedback":
            self.feedback.append((s["id"], body["kind"], body.get("value")))
            return httpx.Response(201, json={"id": len(self.feedback)})
        self.messages.append((s["id"], body["text"]))
        if s["status"] == "waiting":
            s.update(status="finished" if self.finishes else "running", question=None, diff=self.diff)
            return httpx.Response(200, json={"delivered": "answer"})
        return httpx.Response(202, json={"id": self.new(parent=s["id"]), "parent_id": s["id"]})


def simulate(server: FakeServer, **population) -> dict:
    pop = Population(**{"seed": 0, "concurrency": 1, "poll_s": 0.01, "answer_delay_s": (0, 0), "rating_noise_sd": 0,
                        "keep_noise_p": 0, "revert_delay_s": (0, 0), **population})
    return Simulation("http://fake", [TASK], pop, transport=httpx.MockTransport(server.handler)).run(1, drain_s=5)


def test_a_correct_result_is_kept_and_rated_high():
    server = FakeServer(TASK.gold_patch)
    report = simulate(server, answer_helpful_p=1.0)
    assert server.messages[0][1] == hidden_spec(TASK) and "test_" in hidden_spec(TASK)  # the hidden spec
    # the request was complete (no scripted answer): the question was needless, and the user says so once
    assert server.feedback == [("s1", "question_needless", None), ("s1", "applied", None), ("s1", "kept", None),
                               ("s1", "rating", 5.0)]
    assert report["accepted"] == 1 and report["feedback_sent"] == 4 and report["stats"]["passed"] == 1


def test_a_wrong_result_is_reverted_and_followed_up():
    server = FakeServer(WRONG)
    report = simulate(server, answer_helpful_p=0.0, followup_p=1.0, max_followups=1)
    assert server.messages[0][1] in Population().just_do_it
    kinds = [(sid, kind) for sid, kind, _ in server.feedback]
    assert kinds == [("s1", "question_needless"), ("s1", "applied"), ("s1", "reverted"), ("s1", "rating"),
                     ("s1", "followup_dissatisfied"), ("s2", "question_needless"), ("s2", "applied"),
                     ("s2", "reverted"), ("s2", "rating")]  # one follow-up at most
    assert server.sessions["s2"]["parent_id"] == "s1" and report["accepted"] == 2
    assert report["feedback_sent"] == len(server.feedback) and report["stats"]["not_passed"] == 2


def test_a_question_the_request_needed_is_not_called_needless():
    """A task whose request leaves out what only the user knows (a scripted user_answer, as ladder_ask's)."""
    underspecified = dataclasses.replace(TASK, meta={**TASK.meta, "user_answer": "Use 400."})
    assert question_needed(underspecified) and not question_needed(TASK)
    server = FakeServer(TASK.gold_patch)
    pop = Population(seed=0, concurrency=1, poll_s=0.01, answer_delay_s=(0, 0), rating_noise_sd=0, keep_noise_p=0,
                     revert_delay_s=(0, 0), answer_helpful_p=1.0)
    Simulation("http://fake", [underspecified], pop, transport=httpx.MockTransport(server.handler)).run(1, drain_s=5)
    assert server.messages[0][1] == "Use 400."  # answered from the hidden spec
    assert [k for _, k, _ in server.feedback] == ["applied", "kept", "rating"]


def test_an_empty_result_is_not_applied_and_noise_can_keep_a_wrong_one():
    server = FakeServer("")
    simulate(server, followup_p=0.0)
    assert [k for _, k, _ in server.feedback] == ["question_needless", "rating"]
    server = FakeServer(WRONG)
    simulate(server, followup_p=0.0, keep_noise_p=1.0)
    assert [k for _, k, _ in server.feedback] == ["question_needless", "applied", "kept", "rating"]


def test_a_slow_session_is_abandoned():
    server = FakeServer(TASK.gold_patch, finishes=False)
    pop = Population(poll_s=0.01, patience_s=(0.05, 0.05), give_up_factor=1.0, answer_delay_s=(0, 0))
    sim = Simulation("http://fake", [TASK], pop, transport=httpx.MockTransport(server.handler))
    sim.conversation(0)
    assert [k for _, k, _ in server.feedback] == ["question_needless", "abandoned"] and sim.stats["gave_up"] == 1


def test_judge_uses_the_hidden_tests():
    assert judge(TASK, TASK.gold_patch, "")
    assert not judge(TASK, "", "") and not judge(TASK, WRONG, "")
    assert not judge(TASK, "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n", "")  # does not apply


def test_recipe_loads_and_bad_recipes_name_the_key(tmp_path):
    pop = load_population(ROOT / "recipes/tiny/users.yaml")
    assert pop.concurrency == 4 and pop.patience_s[0] <= pop.patience_s[1]
    for text, key in [("nope: 1", "nope"), ("followup_p: 2", "followup_p"), ("patience_s: [5, 1]", "patience_s"),
                      ("concurrency: 1.5", "concurrency"), ("just_do_it: []", "just_do_it")]:
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        with pytest.raises(ValueError, match=key):
            load_population(path)


def test_users_is_a_pure_http_client():
    code = ("import sys, env.users; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'nanocomposer', 'fastapi', 'uvicorn', 'transformers')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_cli_errors_are_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "env.users", "--server", "http://127.0.0.1:9", "--tasks", "samples",
                           "--sessions", "1", "--recipe", str(tmp_path / "missing.yaml")],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("env.users: error: users recipe")


def test_the_fixed_order_spreads_every_family_over_the_set(tmp_path):
    # Ids that sort by family (as the factory's do): a split of the sorted ids would give one side only the
    # families that sort first.
    sizes = {"alpha": 6, "beta": 6, "gamma": 3, "delta": 1}
    tasks = [Task(f"{family}-{i:02d}", "do it", "true", tmp_path, meta={"family": family})
             for family, n in sizes.items() for i in range(n)]
    ordered = interleaved_by_family(tasks)
    assert sorted(t.id for t in ordered) == sorted(t.id for t in tasks)
    for k in (8, 12):  # each side of a split holds each family's share, to within one task
        for side in (ordered[:k], ordered[k:]):
            for family, n in sizes.items():
                expected = n * len(side) / len(tasks)
                assert abs(sum(t.meta["family"] == family for t in side) - expected) <= 1, (k, family)
    assert [t.id for t in interleaved_by_family(list(reversed(tasks)))] == [t.id for t in ordered]
    no_family = [Task(f"t{i}", "do it", "true", tmp_path) for i in (3, 1, 2)]
    assert [t.id for t in interleaved_by_family(no_family)] == ["t1", "t2", "t3"]


def test_draw_tasks_ranges_are_disjoint_and_the_seed_orders_them():
    tasks = load_task_set(SAMPLES_DIR)  # 5 tasks
    ids = [t.id for t in interleaved_by_family(tasks)]
    first, rest = draw_tasks(tasks, 3, offset=0, limit=2), draw_tasks(list(reversed(tasks)), 3, offset=2)
    assert {t.id for t in first} == set(ids[:2]) and {t.id for t in rest} == set(ids[2:])  # any load order
    assert [t.id for t in draw_tasks(tasks, 3, offset=2)] == [t.id for t in rest]  # same seed: same order
    orders = {tuple(t.id for t in draw_tasks(tasks, seed)) for seed in range(8)}
    assert len(orders) > 1 and all(sorted(o) == sorted(ids) for o in orders)  # the seed permutes, never drops
    for offset, limit, flag in [(5, None, "--offset 5"), (-1, None, "--offset -1"), (3, 3, "--task-limit 3"),
                                (0, 0, "--task-limit 0")]:
        with pytest.raises(ValueError, match=flag):
            draw_tasks(tasks, 0, offset, limit)


def test_conversations_send_a_sample_key_per_conversation():
    server, bodies = FakeServer(TASK.gold_patch), []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/sessions":
            bodies.append(json.loads(request.content))
        return server.handler(request)

    pop = Population(seed=4, concurrency=1, poll_s=0.01, answer_delay_s=(0, 0), revert_delay_s=(0, 0))
    other = load_task(SAMPLES_DIR / "fix_lint_caesar")
    report = Simulation("http://fake", [TASK, other], pop, transport=httpx.MockTransport(handler)).run(3, drain_s=5)
    assert [b["sample_key"] for b in bodies] == [f"users:4:0:{TASK.id}", f"users:4:1:{other.id}",
                                                 f"users:4:2:{TASK.id}"]
    assert report["seed"] == 4 and report["conversation_tasks"] == [TASK.id, other.id, TASK.id]
    cut = bodies[:]
    bodies.clear()
    resumed = Simulation("http://fake", [TASK, other], pop, transport=httpx.MockTransport(handler)).run(
        2, drain_s=5, start=1)  # a run cut short after one conversation continues where it stopped
    assert bodies == cut[1:] and resumed["conversation_tasks"] == [other.id, TASK.id]


def test_cli_rejects_a_range_the_task_set_does_not_have(tmp_path):
    for flags, named in [(["--offset", "5"], "--offset 5"), (["--offset", "4", "--task-limit", "2"], "--task-limit 2"),
                         (["--seed", "-1"], "--seed -1"), (["--sessions", "0"], "--sessions 0"),
                         (["--start", "-2"], "--start -2")]:
        argv = ["--server", "http://127.0.0.1:9", "--tasks", "samples", "--sessions", "1",
                "--recipe", str(ROOT / "recipes/tiny/users.yaml"), *flags]
        proc = subprocess.run([sys.executable, "-m", "env.users", *argv], cwd=ROOT, capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 2 and proc.stderr.startswith(f"env.users: error: {named}"), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_a_stop_ends_the_run_with_a_report_and_makes_up_no_feedback():
    # Sessions that never end: without the stop, run() would wait out every user's patience.
    server = FakeServer(TASK.gold_patch, finishes=False)
    pop = Population(concurrency=2, poll_s=0.01, patience_s=(60, 60), answer_delay_s=(0, 0), answer_helpful_p=1.0)
    sim = Simulation("http://fake", [TASK], pop, transport=httpx.MockTransport(server.handler))
    threading.Timer(0.3, sim.stop).start()
    t0 = time.monotonic()
    report = sim.run(6, drain_s=60)
    assert time.monotonic() - t0 < 10 and report["stopped"] is True
    assert report["conversations"] == 6 and report["conversations_started"] == 2  # no conversation after the stop
    assert len(report["conversation_tasks"]) == 2 and report["stats"]["cut_at_stop"] == 2
    # only what the users said before the stop (the question each was asked); no "abandoned" made up for it
    assert [k for _, k, _ in server.feedback] == ["question_needless"] * 2 and report["feedback_sent"] == 2
    assert report["unfinished_after_drain"] == []  # the stop does not wait for the server's sessions


def test_a_stop_during_the_revert_delay_sends_no_revert():
    server = FakeServer(WRONG)
    pop = Population(concurrency=1, poll_s=0.01, answer_delay_s=(0, 0), revert_delay_s=(30, 30), keep_noise_p=0,
                     followup_p=1.0)
    sim = Simulation("http://fake", [TASK], pop, transport=httpx.MockTransport(server.handler))
    threading.Timer(0.3, sim.stop).start()
    report = sim.run(1, drain_s=5)
    assert [k for _, k, _ in server.feedback] == ["question_needless", "applied"]
    assert report["stats"]["cut_at_stop"] == 1
    assert report["accepted"] == 1 and report["stopped"] is True


class _StubHandler(http.server.BaseHTTPRequestHandler):
    """A server whose one session runs forever (long-polls answer at once)."""

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/sessions":
            self._send(201, {"id": "s1", "status": "queued"})
        else:
            self.server.feedback.append(self.path)
            self._send(201, {"id": 1})

    def do_GET(self):
        self.server.polls.append(self.path)
        time.sleep(0.05)
        self._send(200, {"id": "s1", "status": "running", "question": None, "turn_count": 0})

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StubHandler)
    httpd.feedback, httpd.polls = [], []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()


def test_cli_sigterm_writes_the_report_of_what_was_played(tmp_path, stub_server):
    httpd = stub_server
    recipe = tmp_path / "users.yaml"
    recipe.write_text("concurrency: 1\npoll_s: 0.05\npatience_s: [600, 600]\n")
    report = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-m", "env.users", "--server", f"http://127.0.0.1:{httpd.server_port}",
                             "--tasks", "samples", "--sessions", "3", "--recipe", str(recipe),
                             "--report", str(report)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not httpd.polls and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)  # until the first user watches its session
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a failing test leaves no process behind
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    data = json.loads(report.read_text())
    assert data["stopped"] is True and data["conversations_started"] == 1 and data["accepted"] == 1
    assert data["stats"]["cut_at_stop"] == 1 and httpd.feedback == [] and json.loads(out)["stopped"] is True


@pytest.mark.slow  # waits out the users' timeout (about 8 s)
def test_the_realtime_loop_keeps_the_report_of_users_it_stops_at_its_timeout(tmp_path, stub_server):
    from nanocomposer.realtime.server import run_users

    recipe = tmp_path / "users.yaml"
    recipe.write_text("concurrency: 1\npoll_s: 0.05\npatience_s: [600, 600]\n")
    report_path = tmp_path / "users-0.json"
    report_path.write_text('{"stale": true}')  # an earlier attempt's: not read back as this run's
    report = run_users(f"http://127.0.0.1:{stub_server.server_port}", "samples", 3, recipe=str(recipe), seed=0,
                       offset=0, task_limit=5, start=0, report=report_path, log=tmp_path / "users.log", token="t", timeout_s=8)
    assert report["stopped"] is True and report["after_s"] == 8 and "stale" not in report
    assert report["conversations_started"] == 1 and report["accepted"] == 1 and report["stats"]["cut_at_stop"] == 1
