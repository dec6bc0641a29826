"""data/select_edge_tasks.py: the tasks whose pass rate over k episodes lies strictly between the bounds, read
from the runner's own results files (a real run and eval.py's layout) and from synthetic records made with
Trajectory.to_record; the output is a task set train_rl loads; bad input is refused with one line."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import make_calc_task

from data.select_edge_tasks import MANIFEST, NO_EDGE_EXIT, SelectionError, main, select
from env.episode import Trajectory
from env.policies import GoldPolicy, NoopPolicy
from env.runner import run_tasks
from env.tasks import load_task_set

TASK_IDS = ("calc-failed", "calc-mixed", "calc-solved")


class CoinPolicy:
    """Scripted skill per task: always solves calc-solved, never calc-failed, and calc-mixed on even seeds."""

    name = "coin"

    def __init__(self):
        self.seed, self.inner = 0, None

    def reset(self, task):
        solves = task.id == "calc-solved" or (task.id == "calc-mixed" and self.seed % 2 == 0)
        self.inner = GoldPolicy() if solves else NoopPolicy()
        self.inner.reset(task)

    def act(self, messages, tools):
        return self.inner.act(messages, tools)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("edge") / "tasks"
    for task_id in TASK_IDS:
        make_calc_task(root, task_id)
    return root


@pytest.fixture(scope="module")
def played(task_dir) -> Path:
    """The runner's results file of CoinPolicy on the three tasks, 2 samples each (6 real episodes)."""
    path = task_dir.parent / "run" / "results.episodes.jsonl"
    path.parent.mkdir()
    run_tasks(load_task_set(task_dir), CoinPolicy, samples=2, concurrency=2, results_path=path, progress=False,
              run_facts={"policy": "coin", "backend": None, "sampling": None})
    return path


def record(task_id: str, seed: int, solved: bool, status: str = "submitted", policy: str = "coin") -> dict:
    traj = Trajectory(task_id, policy, [], [], [], status, solved, episode_key=f"{task_id}#{seed}")
    return traj.to_record(task_set="tasks", family="fix_bug", tier="micro", sample=seed, seed=seed)


def write_results(path: Path, records: list[dict], facts: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    if facts is not None:
        path.with_name(path.name + ".run.json").write_text(json.dumps(facts))
    return path


FACTS = {"policy": "runs/x/sft", "backend": "transformers", "seed": 0,
         "sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 128, "max_context": None},
         "episode": {"max_turns": 8}}


def outcomes(spec: dict[str, str], seed0: int = 0) -> list[dict]:
    """Records from {task id: "1010" (solved or not per sample)}."""
    return [record(task_id, seed0 + s, c == "1") for task_id, bits in spec.items() for s, c in enumerate(bits)]


def refusal(capsys, *argv, status: int = 2) -> str:
    """One line on stderr and the exit status: 2 for bad input, NO_EDGE_EXIT for sound results with no edge."""
    assert main([*map(str, argv)]) == status
    err = capsys.readouterr().err.strip()
    prefix = "select_edge_tasks: error: " if status == 2 else "select_edge_tasks: no task at the edge: "
    assert err.count("\n") == 0 and err.startswith(prefix)
    return err


# --------------------------------------------------------------------------- selection from a real run


def test_selects_the_mixed_task_from_a_real_run_and_train_rl_can_load_it(played, task_dir, tmp_path, capsys):
    out = tmp_path / "edge"
    assert main(["--results", str(played), "--tasks", str(task_dir), "--out", str(out)]) == 0
    assert "kept 1 of 3 tasks" in capsys.readouterr().out
    loaded = load_task_set(out)
    assert [t.id for t in loaded] == ["calc-mixed"] and not loaded.invalid
    copied = out / "calc-mixed"
    assert not copied.is_symlink() and loaded[0].root == copied.resolve()
    assert (copied / "gold.patch").read_bytes() == (task_dir / "calc-mixed" / "gold.patch").read_bytes()
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["counts"] | {"failed_records": None} == {
        "tasks_in_source": 3, "tasks_seen": 3, "not_evaluated": 0, "in_range": 1, "kept": 1, "solved_by_reference": 0,
        "all_solved": 1, "all_failed": 1, "outside_range": 0, "too_few_outcomes": 0, "records": 6,
        "failed_records": None}
    assert manifest["counts"]["failed_records"] == {}
    assert manifest["samples_per_task"] == {"2": 3}
    assert manifest["pass_rate_histogram"] == {"0/2": 1, "1/2": 1, "2/2": 1}
    assert manifest["results_files"][0]["sha256"] == hashlib.sha256(played.read_bytes()).hexdigest()
    assert manifest["run_facts"]["policy"] == "coin" and manifest["policy"] == "coin"
    assert manifest["kept_tasks"] == [{"id": "calc-mixed", "path": "calc-mixed", "solved": 1, "samples": 2,
                                       "pass_rate": 0.5}]
    from nanocomposer.rollout import task_prompt_dataset  # what train_rl does with --tasks_dir

    dataset, _ = task_prompt_dataset(str(out))
    assert dataset["task_id"] == ["calc-mixed"]


def test_reads_eval_out_dir_layout_and_refuses_two_policies_there(played, task_dir, tmp_path, capsys):
    compare = tmp_path / "compare"
    for label in ("coin",):  # eval.py --out-dir: <label>/results.episodes.jsonl (+ .run.json)
        (compare / label).mkdir(parents=True)
        for name in (played.name, played.name + ".run.json"):
            shutil.copy(played.with_name(name), compare / label / name)
    manifest = select(compare, str(task_dir), tmp_path / "edge")
    assert manifest["counts"]["kept"] == 1 and len(manifest["results_files"]) == 1
    write_results(compare / "gold" / "results.episodes.jsonl",
                  [record(t, s, True, policy="gold") for t in TASK_IDS for s in (10, 11)])
    err = refusal(capsys, "--results", compare, "--tasks", task_dir, "--out", tmp_path / "edge2")
    assert "mixes policies" in err and "'coin'" in err and "'gold'" in err


def test_eval_results_json_with_everything_solved_is_an_empty_selection(task_dir, tmp_path, capsys):
    import eval as eval_script

    output = tmp_path / "gold.json"
    assert eval_script.main(["--tasks", str(task_dir), "--policy", "gold", "--samples", "2", "--limit", "1",
                             "--workers", "2", "--quiet", "--output", str(output)]) == 0
    for results in (output, tmp_path / "gold.episodes.jsonl", tmp_path):
        err = refusal(capsys, "--results", results, "--tasks", task_dir, "--out", tmp_path / "edge",
                      status=NO_EDGE_EXIT)
        assert "1 all solved" in err and "{'2/2': 1}" in err
    assert not (tmp_path / "edge").exists()


# --------------------------------------------------------------------------- synthetic records


def test_failed_records_are_counted_not_outcomes_and_bounds_are_strict(task_dir, tmp_path):
    records = outcomes({"calc-mixed": "1100", "calc-solved": "1110", "calc-failed": "10"})
    records += [record("calc-failed", 7, False, "harness_error"), record("calc-failed", 8, False, "policy_error")]
    path = write_results(tmp_path / "r.episodes.jsonl", records, FACTS)
    manifest = select(path, str(task_dir), tmp_path / "a")
    assert [t["id"] for t in manifest["kept_tasks"]] == ["calc-failed", "calc-mixed", "calc-solved"]
    assert manifest["counts"]["failed_records"] == {"harness_error": 1, "policy_error": 1}
    assert manifest["pass_rate_histogram"] == {"1/2": 1, "2/4": 1, "3/4": 1}
    assert manifest["samples_per_task"] == {"2": 1, "4": 2}
    manifest = select(path, str(task_dir), tmp_path / "b", min_pass=0.5, max_pass=1.0)  # 0.5 itself is out
    assert [t["id"] for t in manifest["kept_tasks"]] == ["calc-solved"]
    assert manifest["counts"]["outside_range"] == 2
    only_failures = outcomes({"calc-mixed": "10"}) + [record("calc-solved", 0, True),
                                                     record("calc-solved", 1, False, "harness_error")]
    manifest = select(write_results(tmp_path / "f.episodes.jsonl", only_failures), str(task_dir), tmp_path / "c")
    assert manifest["counts"]["too_few_outcomes"] == 1 and manifest["counts"]["not_evaluated"] == 1


def test_pools_runs_with_other_seeds_but_not_other_settings_or_repeated_episodes(task_dir, tmp_path, capsys):
    runs = tmp_path / "runs"
    write_results(runs / "s0" / "results.episodes.jsonl", outcomes({"calc-mixed": "1"}), FACTS)
    write_results(runs / "s1" / "results.episodes.jsonl", outcomes({"calc-mixed": "0"}, seed0=1), {**FACTS, "seed": 1})
    manifest = select(runs, str(task_dir), tmp_path / "edge")
    assert manifest["pass_rate_histogram"] == {"1/2": 1} and len(manifest["results_files"]) == 2
    hot = {**FACTS, "seed": 1, "sampling": {**FACTS["sampling"], "temperature": 0.7}}
    write_results(runs / "s1" / "results.episodes.jsonl", outcomes({"calc-mixed": "0"}, seed0=1), hot)
    err = refusal(capsys, "--results", runs, "--tasks", task_dir, "--out", tmp_path / "edge2")
    assert "mixes settings" in err and "sampling.temperature=1.0" in err and "sampling.temperature=0.7" in err
    write_results(runs / "s1" / "results.episodes.jsonl", outcomes({"calc-mixed": "0"}), FACTS)
    err = refusal(capsys, "--results", runs, "--tasks", task_dir, "--out", tmp_path / "edge2")
    assert "the same episode twice" in err and "s0/results.episodes.jsonl:1" in err


@pytest.mark.parametrize("lines, expected", [
    (["{}", "not json"], "r.episodes.jsonl:1: episode record has no 'id'"),
    ([json.dumps(record("calc-mixed", 0, True)), "{broken"], "r.episodes.jsonl:2: not a JSON line"),
    ([json.dumps({**record("calc-mixed", 0, True), "solved": "yes"})], "jsonl:1: episode record has no 'solved'"),
])
def test_malformed_lines_are_named_by_file_and_line(task_dir, tmp_path, capsys, lines, expected):
    path = tmp_path / "r.episodes.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert expected in refusal(capsys, "--results", path, "--tasks", task_dir, "--out", tmp_path / "edge")


def test_refusals_name_what_and_where(task_dir, tmp_path, capsys):
    def refused(records, *extra, out=tmp_path / "edge", status=2):
        path = write_results(tmp_path / "r.episodes.jsonl", records, FACTS)
        return refusal(capsys, "--results", path, "--tasks", task_dir, "--out", out, *extra, status=status)

    err = refused(outcomes({"calc-mixed": "10", "other-task": "10"}))
    assert "task id(s) that --tasks" in err and "'other-task'" in err and "another task set" in err
    err = refused(outcomes({"calc-mixed": "10"}) + [record("calc-solved", 0, True, policy="gold")])
    assert "mixes policies" in err
    err = refused(outcomes({"calc-mixed": "10", "calc-solved": "1"}))
    assert "fewer than 2 samples" in err and "'calc-solved' with 1" in err and "--samples" in err
    err = refused(outcomes({"calc-mixed": "00", "calc-solved": "11"}), status=NO_EDGE_EXIT)
    assert "no task has 0.0 < pass rate < 1.0" in err and "{'0/2': 1, '2/2': 1}" in err
    err = refused(outcomes({"calc-mixed": "10"}), out=task_dir / "edge")
    assert "overlap" in err
    assert not (task_dir / "edge").exists()


def test_an_existing_out_needs_overwrite_and_only_this_tools_output_is_replaced(task_dir, tmp_path, capsys):
    path = write_results(tmp_path / "r.episodes.jsonl", outcomes({"calc-mixed": "10", "calc-solved": "01"}), FACTS)
    out = tmp_path / "edge"
    select(path, str(task_dir), out)
    err = refusal(capsys, "--results", path, "--tasks", task_dir, "--out", out)
    assert "exists; pass --overwrite" in err
    write_results(path, outcomes({"calc-mixed": "10", "calc-solved": "11"}), FACTS)
    assert main(["--results", str(path), "--tasks", str(task_dir), "--out", str(out), "--overwrite"]) == 0
    assert [t.id for t in load_task_set(out)] == ["calc-mixed"]  # the old calc-solved copy is gone
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dirs left
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    err = refusal(capsys, "--results", path, "--tasks", task_dir, "--out", other, "--overwrite")
    assert "not an output of this tool" in err and (other / "notes.txt").read_text() == "keep me"


def test_greedy_samples_are_named_in_an_empty_selection(task_dir, tmp_path, capsys):
    greedy = {**FACTS, "sampling": {**FACTS["sampling"], "temperature": 0.0}}
    path = write_results(tmp_path / "r.episodes.jsonl", outcomes({"calc-mixed": "00"}), greedy)
    assert "temperature 0" in refusal(capsys, "--results", path, "--tasks", task_dir, "--out", tmp_path / "e",
                                      status=NO_EDGE_EXIT)


def test_bounds_are_checked_before_any_work(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--results", "x", "--tasks", "y", "--out", "z", "--min-pass", "0.6", "--max-pass", "0.5"])
    assert e.value.code == 2 and "--min-pass < --max-pass" in capsys.readouterr().err


def test_select_raises_for_a_missing_results_file(task_dir, tmp_path):
    with pytest.raises(SelectionError, match="no such file or directory"):
        select(tmp_path / "missing.jsonl", str(task_dir), tmp_path / "edge")


def test_unsolved_by_drops_the_tasks_the_same_policys_greedy_run_solves(task_dir, tmp_path, capsys):
    sampled = write_results(tmp_path / "s.episodes.jsonl",
                            outcomes({"calc-mixed": "10", "calc-solved": "01", "calc-failed": "00"}), FACTS)
    greedy_facts = {**FACTS, "sampling": {**FACTS["sampling"], "temperature": 0.0}}
    greedy = write_results(tmp_path / "g" / "greedy.episodes.jsonl",
                           [record("calc-mixed", 0, True), record("calc-solved", 0, False),
                            record("calc-failed", 0, True)], greedy_facts)
    out = tmp_path / "edge"
    assert main(["--results", str(sampled), "--tasks", str(task_dir), "--out", str(out),
                 "--unsolved-by", str(greedy)]) == 0
    assert "solved by --unsolved-by 1 of 2" in capsys.readouterr().out
    assert [t.id for t in load_task_set(out)] == ["calc-solved"]  # in range, and greedy failed it
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["counts"]["in_range"] == 2 and manifest["counts"]["kept"] == 1
    assert manifest["unsolved_by"] == {"path": str(greedy), "solved_in_range": ["calc-mixed"]}
    assert "never solved by the --unsolved-by results" in manifest["rule"]
    # refusals: another policy, a task in range it never played, everything in range solved
    other = write_results(tmp_path / "o.episodes.jsonl", [record("calc-mixed", 0, False, policy="gold"),
                                                          record("calc-solved", 0, False, policy="gold")])
    err = refusal(capsys, "--results", sampled, "--tasks", task_dir, "--out", tmp_path / "e1", "--unsolved-by", other)
    assert "of policy 'gold'" in err and "'coin'" in err
    partial = write_results(tmp_path / "p.episodes.jsonl", [record("calc-mixed", 0, False)])
    err = refusal(capsys, "--results", sampled, "--tasks", task_dir, "--out", tmp_path / "e2", "--unsolved-by",
                  partial)
    assert "no outcome for 1 of the 2 tasks in range" in err and "'calc-solved'" in err
    solves_all = write_results(tmp_path / "a.episodes.jsonl", [record("calc-mixed", 0, True),
                                                               record("calc-solved", 0, True)])
    err = refusal(capsys, "--results", sampled, "--tasks", task_dir, "--out", tmp_path / "e3", "--unsolved-by",
                  solves_all, status=NO_EDGE_EXIT)
    assert "all 2 tasks" in err and "nothing left to select" in err
    assert not any((tmp_path / name).exists() for name in ("e1", "e2", "e3"))
