"""Real-time RL (realtime_rl.py, nanocomposer/realtime/): collection, rewards, groups, the gate, rollback, a
corrupt candidate, and one end-to-end cycle with real server and user processes on a micro checkpoint,
killed mid-cycle and resumed."""

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_calc_task, save_micro_checkpoint

from env.budget import Budget
from env.rewards import get_reward_funcs
from nanocomposer.agent.registry import Registry
from nanocomposer.agent.store import SessionStore
from nanocomposer.realtime.collect import collect
from nanocomposer.realtime.gate import decide, evaluate
from nanocomposer.realtime.live import live_metrics, proportion_difference, rollback_decision
from nanocomposer.realtime.loop import CandidateError, Loop
from nanocomposer.realtime.update import make_groups, session_samples

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

ROOT = Path(__file__).resolve().parents[1]
USERS = "seed: 0\nconcurrency: 2\npatience_s: [60, 60]\npoll_s: 2\nanswer_delay_s: [0, 0]\nrevert_delay_s: [0, 0]\n" \
        "keep_noise_p: 0.0\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Traffic tasks, held-out gate tasks (disjoint) and a users recipe."""
    root = tmp_path_factory.mktemp("world")
    for i in range(4):
        make_calc_task(root / "traffic", f"calc-t{i}")
    for i in range(2):
        make_calc_task(root / "gate", f"calc-g{i}")
    (root / "users.yaml").write_text(USERS)
    return root


def parse(world: Path, runs: Path, model: str, *extra: str):
    import realtime_rl

    return realtime_rl.make_parser().parse_args_and_config([
        "--config", str(ROOT / "recipes/tiny/realtime.yaml"), "--model_name_or_path", model, "--run", "t",
        "--runs_dir", str(runs), "--traffic_tasks", str(world / "traffic"), "--gate_tasks", str(world / "gate"),
        "--users_recipe", str(world / "users.yaml"), "--sessions_per_cycle", "4", "--server_workers", "2",
        "--max_turns", "12", "--max_new_tokens", "16", "--session_timeout_s", "60", "--gate_workers", "2",
        "--num_generations", "2", "--per_device_train_batch_size", "2", "--report_to", "none", *extra])


# --------------------------------------------------------------------------- collection and rewards (no processes)


def _session(store: SessionStore, version: str, status: str = "finished") -> str:
    sid = store.create(source="task_dir", instruction="x", task_dir=None)
    store.start(sid, version, "p")
    store.finish(sid, status, None, "", 0)
    return sid


def test_collect_is_on_policy_cut_at_the_cutoff_and_counts_late_feedback(tmp_path):
    store = SessionStore(tmp_path / "s.db")
    old = _session(store, "v0")
    ours, broken = _session(store, "v1"), _session(store, "v1", "failed")
    store.add_feedback(ours, "kept")
    cutoff = time.time()
    time.sleep(0.01)
    store.add_feedback(ours, "followup_dissatisfied")  # late: after the cut-off
    later = _session(store, "v1")
    data = collect(tmp_path / "s.db", current="v1", cutoff=cutoff, previous_cutoff=None, consumed=set(),
                   stale_sessions="drop")
    assert [s["id"] for s in data["sessions"]] == [ours] and data["skipped_ids"] == [old, broken]
    assert data["counts"] == {"stale_dropped": 1, "on_policy": 1, "no_episode_failed": 1, "after_cutoff": 1}
    assert data["sessions"][0]["live"]["kept"] and not data["sessions"][0]["live"]["dissatisfied"]
    kept_stale = collect(tmp_path / "s.db", current="v1", cutoff=cutoff, previous_cutoff=None, consumed=set(),
                         stale_sessions="importance_weight")
    assert {s["id"]: s["stale"] for s in kept_stale["sessions"]} == {old: True, ours: False}
    # the next cycle: nothing used twice, and the late event is counted (not used)
    nxt = collect(tmp_path / "s.db", current="v1", cutoff=time.time(), previous_cutoff=cutoff,
                  consumed={old, ours, broken}, stale_sessions="drop")
    assert [s["id"] for s in nxt["sessions"]] == [later] and nxt["late_feedback"] == {"followup_dissatisfied": 1}


def test_session_rewards_and_the_two_hack_switches():
    live = {"kept": False, "reverted": True, "dissatisfied": True}
    facts = [{"live": live, "failed_edits": 0, "ask_user_calls": 3, "max_turns": 6, "malformed_calls": 2,
              "dropped": True}]
    names = ["edit_kept", "edit_reverted", "dissatisfied", "malformed", "failed_actions"]
    fixed = {f.__name__: f(None, episode=facts)[0] for f in get_reward_funcs(names)}
    assert fixed == {"edit_kept": 0.0, "edit_reverted": -1.0, "dissatisfied": -1.0, "malformed": -2.0,
                     "failed_actions": -0.5}
    free = get_reward_funcs(["failed_actions"], ask_user_handling="free")[0]
    assert free(None, episode=facts) == [0.0]  # free questions: they cost nothing, reverted edits still do
    dropped = get_reward_funcs(names, malformed_handling="drop")
    assert all(f(None, episode=facts) == [None] for f in dropped)  # malformed calls dropped: the session leaves training
    with pytest.raises(KeyError, match="agent-server"):
        get_reward_funcs(["edit_kept"])[0](None, episode=[{"dropped": False}])


def test_a_needless_question_costs_what_a_reverted_edit_costs_unless_questions_are_free(tmp_path):
    from nanocomposer.realtime.rewards import reward_by_behaviour

    store = SessionStore(tmp_path / "s.db")
    asked = _session(store, "v1")
    store.add_feedback(asked, "question_needless")
    data = collect(tmp_path / "s.db", current="v1", cutoff=time.time(), previous_cutoff=None, consumed=set(),
                   stale_sessions="drop")
    live = data["sessions"][0]["live"]
    assert live["needless_question"] and not live["dissatisfied"]

    def facts(needless: bool, reverted: bool) -> dict:
        return {"live": {"kept": False, "reverted": reverted, "dissatisfied": False, "needless_question": needless},
                "ask_user_calls": int(needless), "edits": int(reverted), "failed_edits": 0, "max_turns": 8,
                "malformed_calls": 0, "dropped": False}

    sessions = [facts(True, False), facts(False, True)]  # a needless question; a reverted edit
    names, weights = ["edit_reverted", "failed_actions", "needless_question"], [0.5, 0.2, 0.5]
    fixed = reward_by_behaviour(get_reward_funcs(names), weights, sessions)
    assert fixed["reward_by_behaviour/asked/mean"] == pytest.approx(-0.5 - 0.2 / 8)  # no cheaper than the edit
    assert fixed["reward_by_behaviour/edited/mean"] == pytest.approx(-0.5)
    free = reward_by_behaviour(get_reward_funcs(names, ask_user_handling="free"), weights, sessions)
    assert free["reward_by_behaviour/asked/mean"] == 0.0 and free["reward_by_behaviour/edited/mean"] == -0.5
    # sessions recorded before the signal existed have no such key: no question was called needless
    assert get_reward_funcs(["needless_question"])[0](None, episode=[{"live": {"kept": True}}]) == [0.0]


def test_reward_by_behaviour_splits_sessions_that_asked_edited_or_neither():
    from nanocomposer.realtime.rewards import reward_by_behaviour

    def facts(asks: int, edits: int, failed: int, reverted: bool, malformed: int = 0) -> dict:
        return {"live": {"kept": False, "reverted": reverted, "dissatisfied": False}, "ask_user_calls": asks,
                "edits": edits, "failed_edits": failed, "max_turns": 8, "malformed_calls": malformed,
                "dropped": False}

    sessions = [facts(1, 1, 1, False), facts(1, 0, 0, False), facts(0, 1, 0, True), facts(0, 0, 0, False),
                facts(0, 2, 2, False, malformed=1)]
    names, weights = ["edit_reverted", "failed_actions"], [0.5, 1.0]
    free = reward_by_behaviour(get_reward_funcs(names, ask_user_handling="free"), weights, sessions)
    assert free["reward_by_behaviour/asked/sessions"] == 2 and free["reward_by_behaviour/edited/sessions"] == 2
    assert free["reward_by_behaviour/asked/mean"] == pytest.approx(-0.125 / 2)  # only the failed edit costs
    assert free["reward_by_behaviour/edited/mean"] == pytest.approx((-0.5 - 0.25) / 2)
    assert free["reward_by_behaviour/neither/mean"] == 0.0
    fixed = reward_by_behaviour(get_reward_funcs(names), weights, sessions)
    assert fixed["reward_by_behaviour/asked/mean"] == pytest.approx((-0.25 - 0.125) / 2)  # each question costs
    dropped = reward_by_behaviour(get_reward_funcs(names, malformed_handling="drop"), weights,
                                  [{**f, "dropped": f["malformed_calls"] > 0} for f in sessions])
    assert dropped["reward_by_behaviour/edited/sessions"] == 1  # malformed calls dropped: a dropped session has no reward
    empty = reward_by_behaviour(get_reward_funcs(names), weights, sessions[3:4])
    assert empty["reward_by_behaviour/asked/sessions"] == 0
    assert math.isnan(empty["reward_by_behaviour/asked/mean"])  # nothing to average


def test_behaviours_refuses_a_directory_that_is_not_a_loop(tmp_path):
    from bench.realtime import main

    (tmp_path / "cycles").mkdir()
    with pytest.raises(SystemExit, match="missing .*sessions.db"):
        main(["behaviours", str(tmp_path)])
    assert not (tmp_path / "sessions.db").exists()  # nothing created where a loop's database should be


def test_family_groups_then_mixed_leftovers():
    items = [{"family": f, "n": i} for i, f in enumerate("aaaaabbbc")]
    groups, left = make_groups(items, 2, "family", seed=0)
    assert [sorted(x["family"] for x in g) for g in groups[:3]] == [["a", "a"], ["a", "a"], ["b", "b"]]
    assert len(groups) == 4 and len(left) == 1  # leftovers a, b, c: one mixed group, one left out
    assert sum(len(g) for g in groups) + len(left) == len(items)


def test_a_session_that_breaks_the_token_prefix_becomes_two_samples():
    turn = {"text": "", "calls": [], "truncated": False}
    record = {"id": "t", "exit_status": "submitted", "turns": [
        {**turn, "turn": 0, "prompt_ids": [1, 2], "completion_ids": [3, 4], "logprobs": [-0.1, -0.2]},
        {**turn, "turn": 1, "prompt_ids": [1, 2, 3, 4, 5], "completion_ids": [6], "logprobs": [-0.3]},
        {**turn, "turn": 2, "prompt_ids": [1, 2, 9, 9], "completion_ids": [7], "logprobs": [-0.4]}]}
    first, second = session_samples(record, eos_id=0)
    assert first == {"prompt_ids": [1, 2], "completion_ids": [3, 4, 5, 6], "env_mask": [1, 1, 0, 1],
                     "logprobs": [-0.1, -0.2, 0.0, -0.3]}
    assert second["prompt_ids"] == [1, 2, 9, 9] and second["completion_ids"] == [7]


def test_rollback_rule_and_newcombe_interval():
    d, lo, hi = proportion_difference(8, 10, 2, 10)
    assert d == pytest.approx(-0.6) and lo < d < hi < 0
    live = lambda kept, unhappy, n: {"sessions": n, "persisting_edit_rate": {"count": kept},
                                     "dissatisfied_rate": {"count": unhappy}}
    assert rollback_decision(live(9, 1, 10), live(1, 9, 10), 0.0)["rollback"]
    assert not rollback_decision(live(5, 5, 10), live(4, 5, 10), 0.0)["rollback"]  # within noise


def test_the_dissatisfied_rate_is_over_the_sessions_that_open_a_conversation():
    """Users follow up at most once, so a follow-up session can never draw a dissatisfied follow-up: counted, it
    would halve the rate of a version that fails every request (two unhappy users, one follow-up each)."""
    live = lambda kept, dissatisfied: {"kept": kept, "reverted": False, "dissatisfied": dissatisfied}
    facts = {"edits": 1, "malformed_calls": 0, "ask_user_calls": 0}
    sessions = [{"id": "a", "followup_of": None, "wall_s": 1.0, "live": live(False, True)},
                {"id": "b", "followup_of": None, "wall_s": 3.0, "live": live(False, True)},
                {"id": "a2", "followup_of": "a", "wall_s": 1.0, "live": live(False, False)},
                {"id": "b2", "followup_of": "b", "wall_s": 1.0, "live": live(True, False)}]
    out = live_metrics(sessions, [facts] * 4)
    assert out["dissatisfied_rate"]["rate"] == 1.0 and out["dissatisfied_rate"]["n"] == 2
    assert out["persisting_edit_rate"]["rate"] == 0.25 and out["persisting_edit_rate"]["n"] == 4
    assert out["sessions"] == 4 and out["latency_s"]["mean"] == 1.5


def test_rollback_catches_a_broken_version_the_users_verdicts_cannot_tell_apart():
    """A version that writes only malformed calls, at one cycle's traffic: its users' verdicts (0 of 9 kept, 4 of 9
    dissatisfied) are within noise of its parent's (2 of 20, 9 of 20); its malformed sessions are not."""
    rates = lambda kept, unhappy, malformed, n: {
        "sessions": n, "persisting_edit_rate": {"count": kept}, "dissatisfied_rate": {"count": unhappy},
        "malformed_session_rate": {"count": malformed}}
    decision = rollback_decision(rates(2, 9, 4, 20), rates(0, 4, 9, 9), 0.0)
    assert decision["rollback"] and len(decision["reasons"]) == 1
    assert decision["reasons"][0].startswith("malformed session rate higher: +80.0%")
    assert not rollback_decision(rates(2, 9, 4, 20), rates(2, 9, 5, 20), 0.0)["rollback"]
    older = rates(2, 9, 4, 20)
    del older["malformed_session_rate"]  # a parent cycle recorded before the rate: the other two still decide
    assert not rollback_decision(older, rates(0, 4, 9, 9), 0.0)["rollback"]


# --------------------------------------------------------------------------- the gate


def test_the_gate_refuses_a_broken_candidate(world, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    micro = save_micro_checkpoint(tmp_path / "micro")
    model = AutoModelForCausalLM.from_pretrained(micro)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.save_pretrained(tmp_path / "zeroed")
    AutoTokenizer.from_pretrained(micro).save_pretrained(tmp_path / "zeroed")
    tasks = sorted((world / "gate").iterdir())
    budget = {"budget": Budget(max_turns=12, max_new_tokens=16, max_wall_s=60, temperature=0.0), "samples": 1,
              "workers": 2, "backend": "transformers"}
    oracle = evaluate("oracle", tasks, **budget)
    thresholds = {"solve_margin": 0.0, "max_malformed_increase": 0.02, "max_ask_user_increase": 0.05,
                  "max_edit_rate_drop": 0.05}
    for broken in (str(tmp_path / "zeroed"), "noop"):  # weights zeroed; a policy that never calls a tool but submit
        report = decide(oracle, evaluate(broken, tasks, **budget), **thresholds)
        assert not report["promote"], report
        assert any(r.startswith("solve rate worse") for r in report["reasons"])
        assert any(r.startswith("edit rate down") for r in report["reasons"])
    assert decide(oracle, evaluate("oracle", tasks, **budget), **thresholds)["promote"]


def test_the_monitor_warns_on_drift_from_the_start_that_each_gate_step_lets_through():
    """Malformed calls dropped, in the loop, as measured (gate opened): each step's malformed-rate rise is small, the drift from
    v0 is not. The monitor names each rate that moved beyond its threshold, and nothing else."""
    import itertools

    from nanocomposer.realtime.gate import drift_warnings

    limits = {"max_malformed_increase": 0.02, "max_ask_user_increase": 0.05, "max_edit_rate_drop": 0.05}
    rates = [0.161, 0.188, 0.194, 0.189, 0.192, 0.211]  # v0..v5
    versions = [{"malformed_rate": r, "ask_user_rate": 0.0, "edit_rate": 0.10} for r in rates]
    steps = [b["malformed_rate"] - a["malformed_rate"] for a, b in itertools.pairwise(versions)]
    assert max(steps[1:]) < 0.02  # after v1 no single step would trip a +2-point gate
    warned = [drift_warnings(versions[0], v, **limits) for v in versions[1:]]
    assert all(len(w) == 1 and w[0].startswith("malformed-call rate 16.1% -> ") for w in warned), warned
    assert "(+5.0%; threshold +2.0%)" in warned[-1][0]
    free_questions = {"malformed_rate": 0.161, "ask_user_rate": 0.08, "edit_rate": 0.02}
    assert [w.split(" ")[0] for w in drift_warnings(versions[0], free_questions, **limits)] == ["ask_user", "edit"]
    assert drift_warnings(versions[0], versions[0], **limits) == []


# --------------------------------------------------------------------------- server + users processes (scripted)


@pytest.fixture(scope="module")
def scripted_loop(world, tmp_path_factory):
    """A loop whose v0 is the oracle, with its agent server running."""
    from nanocomposer.model_io import configure_device

    args, training_args, model_args = parse(world, tmp_path_factory.mktemp("runs"), "oracle")
    configure_device(training_args)
    loop = Loop(args, training_args, model_args, log=lambda *a: None)
    loop.start_server()
    yield loop
    loop.close()


def test_a_version_that_degrades_live_metrics_is_rolled_back_within_one_cycle(scripted_loop):
    loop = scripted_loop
    loop.phase_serve()
    loop.phase_collect()  # cycle 1, served by the oracle: its live metrics are the parent's
    assert loop.state.phase == "update"
    loop.registry.add("v1", "noop")  # stands in for a candidate that passed the gate and fails real users
    loop.promote("v1")
    loop.finish_cycle(candidate="v1", decision="promoted", reasons=["test"])
    loop.run_cycle()
    assert loop.state.current == "v1" and loop.state.cycle == 2
    summary = loop.run_cycle()  # cycle 2: v1 serves, its live metrics are compared with the oracle's
    assert summary["served_by"] == "v1" and summary["rolled_back"] == "v1" and summary["restored"] == "v0"
    assert any("persisting edit rate lower" in r for r in summary["reasons"]), summary["reasons"]
    assert loop.state.current == "v0" and loop.server.current() == "v0"
    assert "rolled back v1" in (loop.dir / "report.md").read_text()
    sessions = json.loads((loop.dir / "cycles" / "2" / "collect.json").read_text())["sessions"]
    assert sessions and {s["version"] for s in sessions} == {"v1"}

    from bench.realtime import behaviour_rows, behaviours_markdown

    logged = behaviour_rows(loop.dir)  # the cycles' own numbers, and the same recomputed from the database
    collected = json.loads((loop.dir / "cycles" / "1" / "collect.json").read_text())
    assert [r["cycle"] for r in logged] == [1, 2]
    assert sum(logged[0][b]["sessions"] for b in ("asked", "edited", "neither")) == len(collected["sessions"])
    assert logged[0]["edited"]["sessions"] > 0 and logged[0]["edited"]["kept"] > 0  # the oracle edits, users keep
    recomputed = behaviour_rows(loop.dir, ["--config", str(ROOT / "recipes/tiny/realtime.yaml"), "--max_turns", "12",
                                           "--max_new_tokens", "16", "--session_timeout_s", "60"])  # as parse()
    assert recomputed[0]["edited"]["reward"] == pytest.approx(logged[0]["edited"]["reward"])
    assert "| 1 | v0 |" in behaviours_markdown(loop.dir, logged)
    from bench.realtime import main

    out = loop.dir / "behaviours.md"  # --out after the run (where the recipe flags start) is still --out
    assert main(["behaviours", str(loop.dir), "--out", str(out)]) == 0 and "| 2 | v1 |" in out.read_text()


def test_a_corrupt_candidate_is_refused_and_current_keeps_serving(scripted_loop, tmp_path, world):
    loop = scripted_loop
    before = loop.server.current()
    broken = save_micro_checkpoint(tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a save cut short
    name = f"v{loop.state.cycle}"
    os.symlink(broken, loop.registry.versions_dir / name)
    with pytest.raises(CandidateError, match=f"candidate {name}.*refused, still serving {before}"):
        loop.promote(name)
    report = loop.gate(name, sorted((world / "gate").iterdir()))
    assert not report["promote"] and report["reasons"][0].startswith("corrupt candidate")
    assert loop.server.current() == before and loop.state.current == before
    task = next((world / "traffic").iterdir())
    sid = loop.server.http.post("/sessions", json={"task_dir": str(task)}).json()["id"]
    done = loop.server.http.get(f"/sessions/{sid}/result", params={"wait_s": 60}).json()
    assert done["status"] == "finished" and done["model_version"] == before


# --------------------------------------------------------------------------- end to end, killed and resumed


def test_one_cycle_end_to_end_killed_mid_cycle_resumes_on_policy_without_double_counting(world, tmp_path):
    micro = save_micro_checkpoint(tmp_path / "micro")
    (tmp_path / "users.yaml").write_text(USERS + "max_followups: 0\n")
    cmd = [sys.executable, str(ROOT / "realtime_rl.py"), "--config", str(ROOT / "recipes/tiny/realtime.yaml"),
           "--model_name_or_path", str(micro), "--run", "e2e", "--runs_dir", str(tmp_path / "runs"),
           "--traffic_tasks", str(world / "traffic"), "--gate_tasks", str(world / "gate"), "--gate_task_limit", "1",
           "--users_recipe", str(tmp_path / "users.yaml"), "--cycles", "1", "--sessions_per_cycle", "3",
           "--server_workers", "1", "--max_turns", "2", "--max_new_tokens", "8", "--session_timeout_s", "60",
           "--gate_workers", "1", "--num_generations", "2", "--per_device_train_batch_size", "2",
           "--learning_rate", "0.01", "--report_to", "none"]
    loop_dir = tmp_path / "runs" / "e2e" / "realtime"
    db = loop_dir / "sessions.db"
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill it once a session has finished, mid-serve
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                if conn.execute("SELECT COUNT(*) FROM sessions WHERE status = 'finished'").fetchone()[0]:
                    break
        except sqlite3.OperationalError:  # no database yet, or no schema yet
            pass
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert json.loads((loop_dir / "state.json").read_text())["phase"] == "serve"
    junk = loop_dir / "registry" / "versions" / ".tmp-v1-junk"  # as a killed save would leave it
    junk.mkdir(parents=True)
    assert Registry(loop_dir / "registry").versions() == ["v0"]
    time.sleep(1)  # the first server notices its parent died
    second = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert "resuming" in second.stdout

    state = json.loads((loop_dir / "state.json").read_text())
    assert state["cycle"] == 2 and len(state["history"]) == 1 and not junk.exists()
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, parent_id, model_version, status FROM sessions").fetchall()
    assert sum(r[1] is None for r in rows) == 3  # the cycle's 3 conversations, none replayed by the restart
    with sqlite3.connect(db) as conn:  # the restart continued the conversation index (users:<seed>:<i>:<task>)
        keys = [k for (k,) in conn.execute("SELECT sample_key FROM sessions WHERE parent_id IS NULL")]
    assert sorted(k.split(":")[2] for k in keys) == ["0", "1", "2"], keys
    traffic = json.loads((loop_dir / "cycles" / "1" / "cycle.json").read_text())["traffic"]
    assert (traffic["offset"], traffic["task_limit"], traffic["set_size"]) == (0, 2, 4)  # half: the A/B's are 2, 3
    collected = json.loads((loop_dir / "cycles" / "1" / "collect.json").read_text())
    ids = [s["id"] for s in collected["sessions"]] + collected["skipped_ids"]
    assert len(ids) == len(set(ids)) and set(ids) <= {r[0] for r in rows}
    assert collected["sessions"] and all(s["version"] == "v0" and not s["stale"] for s in collected["sessions"])
    # on-policy: at the first step the trainer scores the logged tokens exactly as the server sampled them
    update = json.loads((loop_dir / "cycles" / "1" / "update.json").read_text())
    assert update["trained"] and update["logprob_checks"][0]["tokens"] > 0
    assert update["onpolicy_diff_max"] < 1e-4, update["logprob_checks"]
    assert update["onpolicy_diff_mean"] == update["logprob_checks"][0]["mean_abs_diff"] <= update["onpolicy_diff_max"]
    version = loop_dir / "registry" / "versions" / "v1"
    assert json.loads((version / "version.json").read_text())["parent"] == "v0"
    gate = json.loads((version / "gate.json").read_text())
    assert (version / "gate.md").is_file() and gate["candidate_name"] == "v1"
    assert isinstance(gate["monitor"], list)  # the monitor ran (drift from v0; whatever it found)
    cycle = json.loads((loop_dir / "cycles" / "1" / "cycle.json").read_text())
    assert cycle["served_by"] == "v0" and cycle["timing/update_s"] > 0
    assert cycle["decision"] == ("promoted" if gate["promote"] else "refused")
    current = (loop_dir / "registry" / "current").read_text().strip()
    assert current == ("v1" if gate["promote"] else "v0")
    leftover = subprocess.run(["pgrep", "-f", f"--db {db}"], check=False, capture_output=True, text=True)
    assert leftover.stdout == "", "an agent server outlived its loop"  # the killed run's too (PDEATHSIG)


@pytest.mark.parametrize("preset", ["tiny", "tiny_long", "smol", "gpu"])
def test_recipes_parse(preset):
    import realtime_rl

    args, training, _ = realtime_rl.make_parser().parse_args_and_config(
        ["--config", str(ROOT / f"recipes/{preset}/realtime.yaml"), "--bf16", "false", "--use_cpu", "true"])
    assert len(training.reward_weights) == len(args.reward_funcs) and training.top_p == 1.0
    assert training.generation_batch_size % training.num_generations == 0


def test_ab_table_pairs_conversations(tmp_path):
    from bench.realtime import ab_markdown, ab_table, conversations

    def arm(name: str, kept: list[bool]) -> dict:
        store = SessionStore(tmp_path / f"{name}.db")
        for i, k in enumerate(kept):
            sid = store.create(source="task_dir", instruction="x", client=f"user-{i}")
            store.start(sid, name, "p")
            store.finish(sid, "finished", None, "", 0)
            with sqlite3.connect(tmp_path / f"{name}.db") as conn:
                conn.execute("UPDATE sessions SET wall_s = ? WHERE id = ?", (1.0 + i, sid))
            store.add_feedback(sid, "kept" if k else "followup_dissatisfied")
            if i == 0 and name == "a":
                store.add_feedback(sid, "question_needless")
        return conversations(tmp_path / f"{name}.db")

    table = ab_table(arm("a", [True, False, False, True]), arm("b", [True, True, False, True]))
    kept = table["metrics"]["persisting_edits"]
    assert table["paired_conversations"] == 4 and kept["a"] == 0.5 and kept["b"] == 0.75
    assert kept["diff"] == pytest.approx(0.25) and kept["relative"] == pytest.approx(0.5)
    assert table["metrics"]["dissatisfied_followups"]["diff"] == pytest.approx(-0.25)
    assert table["metrics"]["needless_questions"]["a"] == 0.25 and table["metrics"]["needless_questions"]["b"] == 0.0
    assert "| persisting edits | 50.0%" in ab_markdown(table, "v0", "v5")


def test_cycles_table_shows_the_monitor_saved_or_recomputed_from_gate_reports(tmp_path):
    from bench.realtime import cycles_markdown

    live = {"sessions": 4, "latency_s": {"mean": 2.0},
            **{k: {"rate": 0.25} for k in ("persisting_edit_rate", "dissatisfied_rate", "malformed_session_rate",
                                           "ask_user_rate", "edit_rate")}}
    summary = {"malformed_rate": 0.10, "ask_user_rate": 0.0, "edit_rate": 0.3}
    gates = [{"current_name": "v0", "current": summary, "candidate": {**summary, "malformed_rate": 0.11}},
             {"current_name": "v1", "current": summary, "candidate": {**summary, "malformed_rate": 0.15}},
             {"current_name": "v2", "candidate": summary, "monitor": ["saved by the loop"]}]
    for cycle, gate in enumerate(gates, 1):
        folder = tmp_path / "realtime" / "cycles" / str(cycle)
        folder.mkdir(parents=True)
        (folder / "collect.json").write_text(json.dumps({"live": live}))
        (folder / "cycle.json").write_text(json.dumps({"cycle": cycle, "served_by": "v0", "decision": "promoted"}))
        (folder / "gate.json").write_text(json.dumps(gate))
    rows = [line.split("|")[-2].strip() for line in cycles_markdown(tmp_path).splitlines() if line[:3] in
            ("| 1", "| 2", "| 3")]
    assert rows == ["ok", "malformed-call rate 10.0% -> 15.0% since the start (+5.0%; threshold +2.0%)",
                    "saved by the loop"]
