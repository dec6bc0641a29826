"""The loop's traffic: the server's sampling seed, disjoint training / A/B task ranges, resumed conversation
indices. No model and no processes: the server and the users are stood in for where the loop calls them."""

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_calc_task

from env.task_sets import resolve_task_set
from env.tasks import write_task
from env.users import draw_tasks
from nanocomposer.agent.store import SessionStore
from nanocomposer.config import ArgumentError
from nanocomposer.realtime import loop as loop_module
from nanocomposer.realtime.config import RealtimeArguments
from nanocomposer.realtime.loop import Loop
from nanocomposer.realtime.server import serve_command
from nanocomposer.realtime.traffic import ab_draw, split_point, training_draw


@pytest.fixture(scope="module")
def traffic_set(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("traffic")
    for i in range(6):
        make_calc_task(root, f"calc-{i}")
    return root


class FakeServer:
    """What phase_serve asks of the agent server."""

    url = "http://fake"
    token = "fake-token"

    def __init__(self, **options):
        self.options = options

    def current(self):
        return "v0"

    def wait_idle(self, timeout_s):
        return True

    def stop(self):
        pass


def make_loop(tmp_path: Path, traffic_set: Path, monkeypatch, **overrides) -> Loop:
    monkeypatch.setattr(loop_module, "AgentServer", lambda registry, db, *, log, **options: FakeServer(**options))
    args = RealtimeArguments(run="t", runs_dir=str(tmp_path / "runs"), traffic_tasks=str(traffic_set),
                             sessions_per_cycle=5, **{"gate_tasks": str(tmp_path), **overrides})
    training_args = SimpleNamespace(seed=7, temperature=1.0, top_p=1.0)
    return Loop(args, training_args, SimpleNamespace(model_name_or_path="oracle"), log=lambda *a: None)


def test_the_serve_command_carries_the_loops_seed(tmp_path, traffic_set, monkeypatch):
    loop = make_loop(tmp_path, traffic_set, monkeypatch)
    options = loop.start_server().options
    assert options["budget"].seed == 7
    cmd = serve_command(tmp_path / "registry", tmp_path / "db", **options)
    assert cmd[cmd.index("--seed") + 1] == "7" and cmd[cmd.index("--temperature") + 1] == "1.0"


def test_the_gate_plays_every_family_of_its_set(tmp_path, traffic_set, monkeypatch):
    gate_set = tmp_path / "gate"
    for family, n in (("alpha", 4), ("beta", 4), ("gamma", 2)):  # ids sort by family, as the factory's do
        for i in range(n):
            write_task(gate_set / f"{family}-{i}", id=f"{family}-{i}", instruction="x", test_command="true",
                       repo={"a.py": "x = 1\n"}, family=family)
    loop = make_loop(tmp_path, traffic_set, monkeypatch, gate_tasks=str(gate_set), gate_task_limit=6)
    picked = Counter(t.meta["family"] for t in loop.gate_tasks())
    assert picked == {"alpha": 2, "beta": 2, "gamma": 2}
    everything = make_loop(tmp_path, traffic_set, monkeypatch, gate_tasks=str(gate_set), gate_task_limit=None)
    assert len(everything.gate_tasks()) == 10


def test_a_versions_gate_records_are_reused_only_for_the_same_tasks(tmp_path, traffic_set, monkeypatch):
    loop = make_loop(tmp_path, traffic_set, monkeypatch)
    played = []
    monkeypatch.setattr(loop_module, "evaluate", lambda spec, tasks, **kw: played.append(len(tasks)) or
                        {"tasks": [t.id for t in tasks]})
    loop.registry = SimpleNamespace(spec=lambda name: name)
    tasks = resolve_task_set(str(traffic_set)).tasks
    first = loop.version_eval("v1", tasks[:2])
    assert loop.version_eval("v1", list(reversed(tasks[:2]))) == first and played == [2]  # same tasks: cached
    assert loop.version_eval("v1", tasks[:3]) == {"tasks": [t.id for t in tasks[:3]], "weights": "v1"}
    assert played == [2, 3]


def test_a_versions_gate_records_are_replayed_when_its_weights_changed(tmp_path, traffic_set, monkeypatch):
    """The gate's records are keyed by version name; a name reused for other weights (a loop restarted in the
    same directory, records copied from another loop) must not pass the old records off as the new model's."""
    loop = make_loop(tmp_path, traffic_set, monkeypatch)
    played, logged = [], []
    monkeypatch.setattr(loop_module, "evaluate", lambda spec, tasks, **kw: played.append(spec) or {"n": len(played)})
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"first weights")
    (checkpoint / "config.json").write_text("{}")
    loop.registry = SimpleNamespace(spec=lambda name: str(checkpoint))
    loop.log = logged.append
    tasks = resolve_task_set(str(traffic_set)).tasks[:2]
    first = loop.version_eval("v1", tasks)
    (checkpoint / "config.json").write_text('{"other": 1}')  # not weights: still the same model
    assert loop.version_eval("v1", tasks) == first and len(played) == 1
    (checkpoint / "model.safetensors").write_bytes(b"other weights")
    second = loop.version_eval("v1", tasks)
    assert second["n"] == 2 and second["weights"] != first["weights"] and len(played) == 2
    assert "recorded for other weights" in logged[-1]
    assert loop.version_eval("v1", tasks) == second and len(played) == 2  # the new records are reused


def test_training_and_ab_task_ranges_are_disjoint_and_cover_the_set(traffic_set):
    tasks = resolve_task_set(str(traffic_set)).tasks
    for limit, k in [(None, 3), (1, 1), (5, 5)]:
        train, ab = training_draw(6, limit), ab_draw(6, limit)
        assert (train["offset"], train["task_limit"], ab["offset"], ab["task_limit"]) == (0, k, k, 6 - k)
        for seed in range(3):  # whatever a cycle's (or the A/B's) seed, the two draws never meet
            trained = {t.id for t in draw_tasks(tasks, seed, train["offset"], train["task_limit"])}
            measured = {t.id for t in draw_tasks(tasks, seed + 100, ab["offset"], ab["task_limit"])}
            assert not trained & measured and len(trained | measured) == 6
    for limit, name in [(6, "traffic_task_limit"), (0, "--traffic-task-limit")]:
        with pytest.raises(ValueError, match=f"^{name} {limit}: the traffic set has 6 tasks"):
            split_point(6, limit, name)
    with pytest.raises(ValueError, match="^traffic_task_limit None: the traffic set has 1 tasks"):
        training_draw(1, None)  # nothing would be left for the A/B
    with pytest.raises(ArgumentError, match="traffic_task_limit 0"):
        RealtimeArguments(run="t", traffic_task_limit=0)


def test_the_cycle_and_the_ab_record_their_ranges(tmp_path, traffic_set, monkeypatch):
    from bench.realtime import ab_markdown, ab_table, ab_traffic

    loop = make_loop(tmp_path, traffic_set, monkeypatch, traffic_task_limit=4)
    calls = []
    monkeypatch.setattr(loop_module, "run_users", lambda *a, **kw: calls.append((a, kw)) or {"conversations": 5})
    loop.phase_serve()
    (args, kw), = calls
    assert args[0] == "http://fake" and args[1:] == (str(traffic_set), 5)
    assert (kw["offset"], kw["task_limit"], kw["start"], kw["seed"]) == (0, 4, 0, 7001)
    recorded = json.loads((loop.cycle_dir() / "traffic.json").read_text())
    assert recorded == {"task_set": str(traffic_set), "offset": 0, "task_limit": 4, "set_size": 6, "seed": 7001}
    loop.finish_cycle(decision="test", reasons=[])
    assert json.loads((loop.cycle_dir() / "cycle.json").read_text())["traffic"] == recorded

    draw = ab_traffic(str(traffic_set), 4)
    assert draw == {"task_set": str(traffic_set), "offset": 4, "task_limit": 2, "set_size": 6}
    assert "Tasks [4, 6) of" in ab_markdown(ab_table({}, {}), "v0", "v1", draw)
    with pytest.raises(ValueError, match="^--traffic-task-limit 6: .* 6 tasks"):
        ab_traffic(str(traffic_set), 6)


def test_a_resumed_serve_phase_continues_the_conversation_index(tmp_path, traffic_set, monkeypatch):
    loop = make_loop(tmp_path, traffic_set, monkeypatch)
    loop.state.advance(loop.state_path, "serve", cycle_start=0.0)
    store = SessionStore(loop.db)
    seed = loop.users_seed()
    # conversations 0 and 2 of this cycle's users started before the kill (1 never got a session), plus a
    # follow-up and a session of another cycle's users: neither is a conversation of this cycle
    first = store.create(source="task_dir", instruction="x", client="user-0", sample_key=f"users:{seed}:0:calc-0")
    store.create(source="task_dir", instruction="x", client="user-2", sample_key=f"users:{seed}:2:calc-3")
    store.create(source="task_dir", instruction="x", parent_id=first, sample_key=f"users:{seed}:4:calc-1")
    store.create(source="task_dir", instruction="x", client="user-3", sample_key=f"users:{seed + 1}:3:calc-2")
    store.close()
    calls = []
    monkeypatch.setattr(loop_module, "run_users", lambda *a, **kw: calls.append((a, kw)) or {"conversations": 2})
    loop.phase_serve()
    (args, kw), = calls
    assert kw["start"] == 3 and args[2] == 2  # conversations 3 and 4: none replayed, the cycle's 5 in all
    assert kw["report"].name == "users-3.json" and kw["seed"] == seed
    assert loop.state.phase == "collect"


def test_a_rerun_of_the_ab_reuses_a_finished_arm_and_sets_an_unfinished_one_aside(tmp_path, traffic_set, monkeypatch):
    import bench.realtime as bench_realtime

    played = []

    def fake_play(spec, out, args, draw):  # writes what play_arm writes when an arm finishes
        played.append(spec)
        out.mkdir(parents=True, exist_ok=True)
        arm = {"spec": spec, "settings": bench_realtime.arm_settings(spec, args, draw), "users": {},
               "conversations": {"c0": {"persisting_edits": float(spec == "vB"), "dissatisfied_followups": 0.0,
                                       "needless_questions": 0.0, "latency_s": 1.0}}}
        (out / "arm.json").write_text(json.dumps(arm))
        return arm

    monkeypatch.setattr(bench_realtime, "play_arm", fake_play)
    out = tmp_path / "ab"
    argv = ["ab", "--a", "vA", "--b", "vB", "--tasks", str(traffic_set), "--sessions", "3", "--budget", "none",
            "--out", str(out)]
    (out / "B").mkdir(parents=True)
    (out / "B" / "sessions.db").write_text("cut off")  # an arm B that was killed before it finished
    assert bench_realtime.main(argv) == 0 and played == ["vA", "vB"]
    aside, = tmp_path.glob("ab/B.unfinished-*")
    assert (aside / "sessions.db").read_text() == "cut off"  # kept, not mixed into the new arm
    assert json.loads((out / "ab.json").read_text())["metrics"]["persisting_edits"]["diff"] == 1.0

    (out / "B" / "arm.json").unlink()  # B cut off again: only B plays
    assert bench_realtime.main(argv) == 0 and played == ["vA", "vB", "vB"]
    assert bench_realtime.main(argv[:6] + ["4"] + argv[7:]) == 2  # other settings: refused, nothing played
    assert played == ["vA", "vB", "vB"]


def test_an_ab_arm_cut_off_continues_from_its_last_finished_part(tmp_path, traffic_set, monkeypatch):
    import bench.realtime as bench_realtime
    from nanocomposer.realtime import server as server_module

    played, cut = [], {"at": 2}

    class PartServer:
        url, token = "http://fake", "fake-token"

        def __init__(self, registry, db, **options):
            self.db = db

        def wait_idle(self, timeout_s):
            return True

        def stop(self):
            pass

    def fake_users(url, tasks, sessions, *, start, report, **kw):
        played.append((start, sessions))
        db = report.parent / "sessions.db"  # stands in for the part's database: one line per conversation
        db.write_text("".join(f"user-{i}\n" for i in range(start, start + sessions)))
        if start == cut["at"]:
            raise RuntimeError("killed")  # the session ends in the middle of this part
        return {"conversations": sessions, "accepted": sessions, "wall_s": 1.0, "stopped": False,
                "feedback_by_kind": {"kept": 1}, "seed": 7, "latencies": [], "accepted_ids": []}

    def fake_conversations(db):
        return {c: {"persisting_edits": 1.0, "dissatisfied_followups": 0.0, "needless_questions": 0.0,
                    "latency_s": 2.0} for c in db.read_text().split()}

    monkeypatch.setattr(server_module, "AgentServer", PartServer)
    monkeypatch.setattr(server_module, "run_users", fake_users)
    monkeypatch.setattr(bench_realtime, "conversations", fake_conversations)
    out = tmp_path / "ab"
    argv = ["ab", "--a", "oracle", "--b", "oracle", "--tasks", str(traffic_set), "--sessions",
            "5", "--part-size", "2", "--budget", "none", "--out", str(out)]
    with pytest.raises(RuntimeError, match="killed"):
        bench_realtime.main(argv)
    assert played == [(0, 2), (2, 2)]
    assert (out / "A" / "parts" / "000000" / "part.json").exists()
    assert not (out / "A" / "arm.json").exists() and not (out / "A" / "parts" / "000002" / "part.json").exists()

    cut["at"] = None
    assert bench_realtime.main(argv) == 0
    assert played[2:] == [(2, 2), (4, 1), (0, 2), (2, 2), (4, 1)]  # A continues at 2 (0 not replayed); B whole
    aside, = (out / "A" / "parts").glob("000002.unfinished-*")
    assert (aside / "sessions.db").read_text() == "user-2\nuser-3\n"  # the cut part kept, not mixed in
    arm = json.loads((out / "A" / "arm.json").read_text())
    assert sorted(arm["conversations"]) == [f"user-{i}" for i in range(5)]
    assert (arm["users"]["conversations"], arm["users"]["parts"], arm["users"]["feedback_by_kind"]) == (5, 3, {"kept": 3})
    assert json.loads((out / "ab.json").read_text())["paired_conversations"] == 5

    assert bench_realtime.main(argv) == 0 and len(played) == 7  # both arms finished: reused, nothing played
    (out / "B" / "arm.json").unlink()
    (out / "B" / "parts" / "000002" / "part.json").unlink()  # B cut off in its second part
    assert bench_realtime.main(argv) == 0 and played[7:] == [(2, 2), (4, 1)]
    (out / "B" / "arm.json").unlink()
    assert bench_realtime.main(argv[:8] + ["6"] + argv[9:]) == 2  # other settings: its parts are not reused
    assert len(played) == 9
