"""bench.grpo_runs: GRPO runs side by side from their trainer logs, paired by step."""

import json

import pytest

from bench.grpo_runs import compare, main, markdown


def fake_run(root, name, solve, malformed, tasks, checkpoints=(2,)):
    """A train_rl.py output with one log entry per step (solve and malformed-episode rates) and sampled
    trajectories naming each step's task (counted from 0, as train_rl.py writes them)."""
    out = root / name / "rl"
    history = [{"step": i + 1, "behaviour/solve_rate": s, "behaviour/malformed_episode_rate": m, "loss": 0.1}
               for i, (s, m) in enumerate(zip(solve, malformed, strict=True))]
    history.append({"step": len(solve), "train_runtime": 1.0})  # the summary entry carries no behaviour
    for c in checkpoints:  # an older checkpoint holds a shorter log: the newest must be read
        (out / f"checkpoint-{c}").mkdir(parents=True)
        (out / f"checkpoint-{c}" / "trainer_state.json").write_text(json.dumps({"log_history": history[:c]}))
    last = out / f"checkpoint-{len(solve)}"
    last.mkdir(parents=True, exist_ok=True)
    (last / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    (out / "trajectories").mkdir()
    for step, task in enumerate(tasks):
        (out / "trajectories" / f"step-{step:06d}.jsonl").write_text(
            json.dumps({"step": step, "task_id": task, "solved": False}) + "\n" + "not json\n")
    return root / name


def test_windows_all_fail_steps_and_the_paired_difference(tmp_path):
    base = fake_run(tmp_path, "base", [0.5, 0.0, 0.5, 0.25], [0.0, 0.25, 0.0, 0.25], ["a", "b", "c", "d"])
    drop = fake_run(tmp_path, "drop", [0.5, 0.0, 0.0, 0.25], [0.5, 0.75, 0.5, 0.75], ["a", "b", "x", "d"])
    result = compare([base, drop / "rl"], ["behaviour/malformed_episode_rate", "behaviour/solve_rate"], window=2)
    assert result["windows"] == [(1, 2), (3, 4)]
    assert result["steps"] == [4, 4]
    assert result["all_fail_steps"] == [[2], [2, 3]]
    assert result["task_match"] == [[3, 4]]  # step 3 trained on another task: not a fair pair there
    malformed = result["metrics"]["behaviour/malformed_episode_rate"]
    assert malformed[0]["windows"] == [0.125, 0.125] and malformed[1]["windows"] == [0.625, 0.625]
    vs = malformed[1]["vs_first"]
    assert vs["diff"] == pytest.approx(0.5) and vs["ci95"][0] == pytest.approx(0.5) and vs["steps"] == 4
    later = compare([base, drop], ["behaviour/solve_rate"], window=2, from_step=3)
    assert later["metrics"]["behaviour/solve_rate"][1]["vs_first"]["diff"] == pytest.approx(-0.25)
    assert later["metrics"]["behaviour/solve_rate"][1]["vs_first"]["steps"] == 2
    text = markdown(result)
    assert "+0.500 [+0.500, +0.500] (4 steps)" in text and "3 of 4" in text and "1 (2)" in text


def test_a_cut_off_run_is_read_to_its_last_checkpoint_and_a_missing_one_is_named(tmp_path, capsys):
    base = fake_run(tmp_path, "base", [0.5] * 4, [0.0] * 4, ["a"] * 4)
    short = fake_run(tmp_path, "short", [0.25, 0.25], [0.5, 0.5], ["a", "a"], checkpoints=())
    result = compare([base, short], ["behaviour/solve_rate"], window=2)
    assert result["steps"] == [4, 2]
    assert result["metrics"]["behaviour/solve_rate"][1]["windows"] == [0.25, None]
    assert result["metrics"]["behaviour/solve_rate"][1]["vs_first"]["steps"] == 2
    out = tmp_path / "report" / "grpo.md"
    assert main([str(base), str(short), "--metric", "behaviour/solve_rate", "--out", str(out)]) == 0
    assert out.read_text().startswith("# GRPO runs") and json.loads(out.with_suffix(".json").read_text())["steps"] == [4, 2]
    assert main([str(base), str(tmp_path / "nowhere")]) == 2
    assert "no checkpoint-* with a readable trainer_state.json" in capsys.readouterr().err


def test_a_checkpoint_whose_save_was_cut_short_is_skipped(tmp_path, capsys):
    run = fake_run(tmp_path, "killed", [0.5, 0.25, 0.0, 0.5], [0.0] * 4, ["a"] * 4, checkpoints=(2,))
    (run / "rl" / "checkpoint-6").mkdir()  # killed before trainer_state.json (written last)
    (run / "rl" / "checkpoint-5").mkdir()
    (run / "rl" / "checkpoint-5" / "trainer_state.json").write_text('{"log_history": [{"step": 1, "beha')
    assert compare([run], ["behaviour/solve_rate"])["steps"] == [4]  # checkpoint-4, not the older checkpoint-2
    assert "skipped checkpoint-6" in capsys.readouterr().err
    for name in ("checkpoint-4", "checkpoint-2"):
        (run / "rl" / name / "trainer_state.json").unlink()
    with pytest.raises(ValueError, match="checkpoint-6 .*checkpoint-5"):
        compare([run], ["behaviour/solve_rate"])
