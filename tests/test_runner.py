"""env/runner.py: the same records as sequential episodes, batched == unbatched, in one process or several,
failed records, resume, and eval.py surviving SIGKILL (resume) and SIGINT (exit 130) without leftovers."""

import functools
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, harness_leftovers, make_calc_task, save_micro_checkpoint

from data.oracle import OraclePolicy
from env.episode import EpisodeConfig, Generation, run_episode
from env.policies import GoldPolicy, NoopPolicy, get_policy
from env.protocol import format_assistant_turn
from env.results import ResultsFileError, read_results
from env.runner import ProcessFailed, TaskRef, default_seed_policy, run_tasks
from env.task_sets import resolve_task_set
from env.tasks import Task

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

TIMING = {"wall_s", "gen_s", "env_s", "grade_s", "command_s"}


def normalize(value):
    """A record without its timings (wall-clock fields, durations printed in tool output) and object addresses."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, str):
        return re.sub(r" at 0x[0-9a-f]+", " at 0x?", re.sub(r"\d+(\.\d+)?s\b", "Xs", value))
    return value


def turn(*calls):
    return format_assistant_turn(None, list(calls))


# --------------------------------------------------------------------------- same records as run_episode


@pytest.mark.parametrize("policy, samples", [(OraclePolicy, 2), (GoldPolicy, 1), (NoopPolicy, 1)])
def test_runner_gives_the_records_of_sequential_episodes(policy, samples):
    tasks = resolve_task_set("samples").tasks
    records = run_tasks(tasks, policy, samples=samples, seed=3, concurrency=4, progress=False)
    expected = []
    for task in tasks:
        for s in range(samples):
            p = policy()
            default_seed_policy(p, 3 + s)
            traj = run_episode(task, p, episode_key=f"{task.id}#{3 + s}")
            expected.append(traj.to_record(sample=s, seed=3 + s))
    assert normalize(records) == normalize(expected)
    assert [(r["id"], r["sample"]) for r in records] == [(t.id, s) for t in tasks for s in range(samples)]
    if policy is not NoopPolicy:
        assert all(r["solved"] for r in records)


# --------------------------------------------------------------------------- batched generation


class FakeBatched:
    """A batched policy whose text depends only on (episode key, turn); it records its batch sizes."""

    name = "fake-batched"

    def __init__(self):
        self.batches = []

    def act_batch(self, requests):
        self.batches.append(len(requests))
        return [self.one(r.episode_key, r.turn) for r in requests]

    def one(self, key: str, turn_index: int):
        h = int(hashlib.sha256(f"{key}:{turn_index}".encode()).hexdigest(), 16)
        if key.startswith("calc-c#") and turn_index == 1:
            return ContextFull("prompt of 99 tokens")  # one request of a batch fails, the others do not
        fix = ("edit_file", {"path": "calc/ops.py", "old_str": "return a - b", "new_str": "return a + b"})
        texts = [
            turn(("run", {"command": f"sleep 0.{h % 4}; echo {h % 97}"}), ("grep", {"pattern": "def add"})),
            turn(fix) if h % 3 else turn(("read_file", {"path": "calc/ops.py"})),
            turn(("run_tests", {})),
            turn(("submit", {"summary": f"done {h % 5}"})),
        ]
        text = texts[min(turn_index, 3)]
        return Generation(text, completion_ids=list(range(5 + h % 7)), truncated=False)


class ContextFull(RuntimeError):
    exit_status = "max_context"


def test_batched_and_unbatched_runs_give_identical_trajectories(tmp_path):
    tasks = [make_calc_task(tmp_path, f"calc-{c}") for c in "abcd"]
    runs = {}
    for concurrency in (1, 8):
        policy = FakeBatched()
        runs[concurrency] = run_tasks(tasks, lambda policy=policy: policy, samples=2, seed=1,
                                      concurrency=concurrency, progress=False)
        runs[concurrency, "batches"] = policy.batches
    assert normalize(runs[1]) == normalize(runs[8])
    assert set(runs[1, "batches"]) == {1} and max(runs[8, "batches"]) > 1
    by_task = {(r["id"], r["sample"]): r for r in runs[8]}
    assert by_task["calc-c", 0]["exit_status"] == "max_context" and "ContextFull" in by_task["calc-c", 0]["error"]
    assert {r["exit_status"] for r in runs[8]} - {"max_context"} == {"submitted"}
    assert any(r["solved"] for r in runs[8]) and all(r["completion_tokens"] for r in runs[8])
    assert [r["episode_key"] for r in runs[8]] == [f"calc-{c}#{1 + s}" for c in "abcd" for s in range(2)]


def test_a_failing_act_batch_ends_each_episode_with_the_reason(tmp_path):
    class Broken:
        name = "broken"

        def act_batch(self, requests):
            raise RuntimeError("CUDA out of memory")

    policy = Broken()
    records = run_tasks([make_calc_task(tmp_path, "calc-a")], lambda: policy, progress=False)
    assert records[0]["exit_status"] == "policy_error" and records[0]["error"] == "RuntimeError: CUDA out of memory"


# --------------------------------------------------------------------------- worker processes


class GoldUnlessTold(GoldPolicy):
    """The gold policy, whose process exits at once (as if OOM-killed) on the task $TEST_DIE_ON_TASK names."""

    def reset(self, task):
        if os.environ.get("TEST_DIE_ON_TASK") == task.id:
            os._exit(3)
        return super().reset(task)


def test_worker_processes_give_the_records_of_one_process():
    tasks = resolve_task_set("samples").tasks
    oracle = OraclePolicy  # picklable: each worker process makes its own
    one = run_tasks(tasks, oracle, samples=2, seed=3, concurrency=4, progress=False)
    played = []
    two = run_tasks(tasks, oracle, samples=2, seed=3, concurrency=4, progress=False, processes=2,
                    on_result=lambda record, traj: played.append((record["id"], traj.solved)))
    assert normalize(two) == normalize(one) and all(r["solved"] for r in two)
    assert sorted(played) == sorted((r["id"], True) for r in one)  # on_result gets the rebuilt trajectory


def test_checkpoint_policies_in_worker_processes_generate_as_in_one(tmp_path):
    from nanocomposer.policies import build_policy

    checkpoint = save_micro_checkpoint(tmp_path / "micro")
    tasks = resolve_task_set("samples").tasks
    model = functools.partial(build_policy, str(checkpoint), {"max_new_tokens": 8, "temperature": 0.0}, "transformers")
    config = EpisodeConfig(max_turns=2)
    one = run_tasks(tasks, model, config, concurrency=1, progress=False)
    two = run_tasks(tasks, model, config, concurrency=2, progress=False, processes=2)  # 1 episode per process
    assert normalize(two) == normalize(one)
    assert all(r["completion_tokens"] for r in two)


def test_a_worker_that_dies_or_fails_is_named_and_its_finished_work_kept(tmp_path, monkeypatch):
    tasks = [make_calc_task(tmp_path, f"calc-{c}") for c in "abcd"]
    path = tmp_path / "episodes.jsonl"
    monkeypatch.setenv("TEST_DIE_ON_TASK", "calc-b")
    with pytest.raises(ProcessFailed, match=r"worker process \d died \(exit code 3\); 3/4 episodes finished "
                                            r"are in .*episodes.jsonl': resume to play the rest"):
        run_tasks(tasks, GoldUnlessTold, concurrency=2, results_path=path, progress=False, processes=2)
    assert sorted(r["id"] for r in read_results(path)) == ["calc-a", "calc-c", "calc-d"]
    monkeypatch.delenv("TEST_DIE_ON_TASK")
    played = []
    resumed = run_tasks(tasks, GoldUnlessTold, concurrency=2, results_path=path, resume=True, progress=False,
                        processes=2, on_result=lambda record, traj: played.append(record["id"]))
    assert played == ["calc-b"] and all(r["solved"] for r in resumed)
    assert [r["id"] for r in read_results(path)] == ["calc-a", "calc-b", "calc-c", "calc-d"]
    with pytest.raises(ResultsFileError, match="holds episodes of policy 'gold', not 'noop'"):
        run_tasks(tasks + [make_calc_task(tmp_path / c, f"calc-{c}") for c in "ef"], functools.partial(get_policy, "noop"),
                  results_path=path, resume=True, progress=False, processes=2)
    with pytest.raises(ValueError, match="processes=2 needs a picklable make_policy"):
        run_tasks(tasks, lambda: GoldPolicy(), progress=False, processes=2)
    with pytest.raises(ProcessFailed, match="worker process 0 failed: ValueError: unknown policy 'nope'"):
        run_tasks(tasks, functools.partial(get_policy, "nope"), progress=False, processes=2)
    assert harness_leftovers(tmp_path) == []


# --------------------------------------------------------------------------- bad tasks


def test_bad_tasks_give_one_failed_record_each_and_the_rest_run(tmp_path):
    good = make_calc_task(tmp_path / "a", "good")
    no_patch = make_calc_task(tmp_path / "b", "no-patch")
    (no_patch.root / "gold.patch").unlink()
    broken = tmp_path / "c" / "broken"
    broken.mkdir(parents=True)
    (broken / "task.json").write_text(json.dumps({"id": "broken", "test_command": "true"}))
    ghost = Task("ghost", "x", "true", tmp_path / "nowhere")  # its repo does not exist: the harness fails
    tasks = [good, TaskRef(broken, {"task_set": "mine"}), no_patch, ghost, good]
    records = run_tasks(tasks, GoldPolicy, concurrency=3, progress=False)
    assert [(r["id"], r["exit_status"]) for r in records] == [
        ("good", "submitted"), ("broken", "invalid_task"), ("no-patch", "policy_error"), ("ghost", "harness_error"),
        ("good", "submitted")]
    assert records[0]["solved"] and records[4]["solved"] and not any(r["solved"] for r in records[1:4])
    assert "lacks required key 'instruction'" in records[1]["error"] and records[1]["task_set"] == "mine"
    assert "needs a gold.patch" in records[2]["error"] and "FileNotFoundError" in records[3]["error"]


def test_a_harness_exception_in_one_episode_is_a_harness_error(tmp_path):
    tasks = [make_calc_task(tmp_path, f"calc-{c}") for c in "ab"]

    def on_turn(record):
        if any(c["name"] == "lint" for c in record["calls"]):
            raise OSError("disk full")

    config = EpisodeConfig(on_turn=on_turn)
    records = run_tasks(tasks, OraclePolicy, config, samples=3, concurrency=2, progress=False)
    failed = [r for r in records if r["exit_status"] == "harness_error"]
    assert failed and all(r["error"] == "OSError: disk full" for r in failed)
    assert all(r["solved"] for r in records if r["exit_status"] != "harness_error")


# --------------------------------------------------------------------------- results file and resume


def test_results_file_resume_and_partial_lines(tmp_path):
    tasks = [make_calc_task(tmp_path, f"calc-{c}") for c in "ab"]
    path = tmp_path / "episodes.jsonl"
    full = run_tasks(tasks, OraclePolicy, samples=2, concurrency=2, results_path=path, progress=False)
    assert read_results(path) == full
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[3] + lines[0] + lines[2][: len(lines[2]) // 2])  # killed while writing a line
    played = []
    resumed = run_tasks(tasks, OraclePolicy, samples=2, concurrency=2, results_path=path, resume=True,
                        progress=False, on_result=lambda record, traj: played.append((record["id"], record["sample"])))
    assert sorted(played) == [("calc-a", 1), ("calc-b", 0)]
    assert normalize(resumed) == normalize(full) and read_results(path) == resumed
    with pytest.raises(ResultsFileError, match="holds episodes of policy 'oracle', not 'noop'"):
        run_tasks(tasks, NoopPolicy, results_path=path, resume=True, progress=False)
    with pytest.raises(ResultsFileError, match="played with episode.max_turns=20, this run has episode.max_turns=3"):
        run_tasks(tasks, OraclePolicy, EpisodeConfig(max_turns=3), results_path=path, resume=True, progress=False)
    with pytest.raises(ResultsFileError, match="played with seed=0, this run has seed=5"):
        run_tasks(tasks, OraclePolicy, seed=5, results_path=path, resume=True, progress=False)
    assert read_results(path) == resumed  # refused before anything was written
    path.write_text("{not json\n" + lines[0])
    with pytest.raises(ResultsFileError, match="line 1"):
        run_tasks(tasks, OraclePolicy, results_path=path, resume=True, progress=False)


# --------------------------------------------------------------------------- eval.py: SIGKILL, SIGINT


# eval.py as at a terminal, whatever the suite inherited: a suite started in the background ignores SIGINT,
# and a signal mask blocked by an earlier library call is inherited across exec; either would keep the
# SIGINT below from ever reaching eval.py
AT_A_TERMINAL = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); sys.argv = sys.argv[1:]; "
                 "runpy.run_path('eval.py', run_name='__main__')")


def _eval(tmp: Path, output: Path, *extra: str, samples: int = 2) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", AT_A_TERMINAL, "eval.py", "--tasks", "samples", "--policy",
                             "oracle", "--samples", str(samples), "--workers", "2", "--quiet", "--output",
                             str(output), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for_records(path: Path, count: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_text().count("\n") >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {count} records (eval exited {proc.poll()})")


def _final(output: Path) -> dict:
    results = json.loads(output.read_text())
    summary = {k: v for k, v in results["summary"].items() if k not in ("wall_s", "episode_wall_s", "task_sets")}
    return normalize({"summary": summary, "tasks": results["tasks"]})


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pids: list[int], timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while any(map(_alive, pids)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("processes, kill", [("1", "group"), ("2", "parent")],
                         ids=["one-process", "two-processes-parent-only"])
def test_eval_killed_midway_resumes_to_the_same_results(tmp_path, processes, kill):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    whole = tmp_path / "whole.json"
    proc = _eval(tmp, whole, "--processes", processes)
    assert proc.wait(timeout=600) == 0, proc.stderr.read()

    killed = tmp_path / "killed.json"
    proc = _eval(tmp, killed, "--processes", processes)
    _wait_for_records(killed.with_name("killed.episodes.jsonl"), 3, proc)
    if kill == "group":
        os.killpg(proc.pid, signal.SIGKILL)  # the whole process group, as a crash or an OOM kill would
        proc.wait()
    else:  # only eval.py: its worker processes must notice, stop their episodes and exit on their own
        workers = _children(proc.pid)
        assert workers
        proc.kill()
        proc.wait()
        assert _gone(workers), "worker processes outlived eval.py"
        assert harness_leftovers(tmp) == [], "worker processes left workspaces behind"
    assert not killed.exists()
    proc = _eval(tmp, killed, "--resume", "--processes", processes)
    assert proc.wait(timeout=600) == 0, proc.stderr.read()
    assert _final(killed) == _final(whole)
    assert read_results(killed.with_name("killed.episodes.jsonl")) == json.loads(killed.read_text())["tasks"]
    assert harness_leftovers(tmp) == []


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signals_after_the_first_do_not_cut_the_stop_short(sig):
    # a worker whose parent is killed gets its death signal once per thread of the parent, and a user presses
    # Ctrl-C twice; a second KeyboardInterrupt raised inside the stop would skip the cleanup (workspaces left
    # mounted)
    script = ("import os, signal, time\n"
              "from env.processes import StopSignals\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              f"sig = signal.{sig}\n"
              "try:\n"
              "    with StopSignals():\n"
              "        try:\n"
              "            os.kill(os.getpid(), sig); time.sleep(30)\n"
              "        except KeyboardInterrupt:\n"
              "            os.kill(os.getpid(), sig); os.kill(os.getpid(), sig); time.sleep(0.5)\n"
              "            print('cleaned up', flush=True)\n"
              "            raise\n"
              "except KeyboardInterrupt as e:\n"
              "    print('stopped by', e)\n"
              "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a worker process: its parent decides\n"
              "with StopSignals():\n"
              "    os.kill(os.getpid(), signal.SIGINT); time.sleep(0.5)\n"
              "print('ignored stays ignored')\n")
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    number = getattr(signal, sig).value
    assert done.stdout.splitlines() == ["cleaned up", f"stopped by signal {number}", "ignored stays ignored"]


@pytest.mark.parametrize("presses", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
@pytest.mark.parametrize("processes", ["1", "2"])
def test_eval_sigint_exits_130_with_a_resume_line_and_keeps_records(tmp_path, processes, presses):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    output = tmp_path / "r.json"
    episodes = output.with_name("r.episodes.jsonl")
    # 30 episodes: the signal must land while episodes are left, even on a loaded machine
    proc = _eval(tmp, output, "--processes", processes, samples=6)
    _wait_for_records(episodes, 2, proc)
    proc.send_signal(signal.SIGINT)
    if presses == 2:  # an impatient second Ctrl-C: ignored while the first one's stop runs
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    if presses == 1:
        assert proc.returncode == 130 and len(lines) == 1, err
    else:  # when it lands after the stop, while eval.py exits, Python ends by SIGINT (a shell shows 130 too)
        assert proc.returncode in (130, -signal.SIGINT), err
    assert lines[0].startswith("eval.py: interrupted: ") and lines[0].endswith("--resume"), err
    kept = read_results(episodes)
    assert len(kept) >= 2 and episodes.read_text().endswith("\n") and not output.exists()
    assert harness_leftovers(tmp) == []


def test_a_finished_episodes_slot_is_refilled_while_others_run(tmp_path):
    """calc-a stays live until calc-c has started; calc-c can only start in the slot calc-b frees."""
    c_started = threading.Event()
    seen = {}

    class Gate:
        name = "gate"

        def reset(self, task):
            self.task_id = task.id
            if task.id == "calc-c":
                c_started.set()

        def act(self, messages, tools):
            if self.task_id == "calc-a":
                seen["c started while a was live"] = c_started.wait(timeout=30)
            return turn(("submit", {"summary": "x"}))

    tasks = [make_calc_task(tmp_path, f"calc-{c}") for c in "abc"]
    records = run_tasks(tasks, Gate, concurrency=2, progress=False)
    assert seen == {"c started while a was live": True}
    assert [r["exit_status"] for r in records] == ["submitted"] * 3
