"""eval.py: the CLI (first form kept), samples and seeds, --config, --compare outputs, task sets, bad inputs."""

import json
from pathlib import Path

import pytest
from conftest import make_calc_task, save_micro_checkpoint

import eval as eval_py
from env.episode import EpisodeConfig
from env.task_sets import TaskSet, resolve_task_set
from env.tasks import TaskError, load_task, write_task

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

FIRST_FORM_SUMMARY = {"n", "solved", "solve_rate", "mean_turns", "tool_calls", "parallel_call_rate",
                      "malformed_calls", "exit_statuses", "wall_s"}
FIRST_FORM_TASK = {"id", "solved", "exit_status", "turns", "tool_calls", "malformed_calls", "wall_s", "messages"}
MICRO = ["--max-turns", "2", "--max-new-tokens", "32", "--quiet"]


@pytest.fixture(scope="session")
def micro_checkpoint(tmp_path_factory) -> Path:
    """An untrained micro model (vocab ~512, hidden 64, 2 layers, context 4096) saved like a pipeline stage."""
    return save_micro_checkpoint(tmp_path_factory.mktemp("runs") / "micro" / "sft", 4096)


def run(*argv) -> int:
    return eval_py.main([str(a) for a in argv])


def test_micro_model_end_to_end(micro_checkpoint, two_tasks, tmp_path):
    out = tmp_path / "results.json"
    assert run("--tasks", two_tasks, "--policy", micro_checkpoint, "--output", out, *MICRO) == 0
    results = json.loads(out.read_text())
    s = results["summary"]
    assert FIRST_FORM_SUMMARY <= s.keys() and s["n"] == 2 and s["solved"] == 0  # an untrained model solves nothing
    assert {"solve_rate_ci95", "pass@1", "tool_call_validity", "turn_share", "mean_completion_tokens"} <= s.keys()
    assert s["mean_completion_tokens"] > 0 and s["label"] == "micro/sft"
    assert s["config"]["sampling"]["max_new_tokens"] == 32 and s["config"]["episode"]["max_turns"] == 2
    assert set(s["task_sets"]) == {str(two_tasks)} and s["task_sets"][str(two_tasks)]["kind"] == "harness"
    for task in results["tasks"]:
        assert FIRST_FORM_TASK <= task.keys() and task["n_turns"] == len(task["turns"]) <= 2
        assert task["exit_status"] in {"max_turns", "no_tool_call", "repeated_malformed", "max_tokens"}


def test_sampling_depends_on_seed_and_task_not_on_episode_order(micro_checkpoint, two_tasks):
    tasks = [load_task(two_tasks / "calc-a"), load_task(two_tasks / "calc-b")]
    config = EpisodeConfig(max_turns=1)
    sampling = {"max_new_tokens": 16, "temperature": 1.0, "seed": 5}
    both, _ = eval_py.evaluate(tasks, str(micro_checkpoint), config, progress=False, sampling=sampling, samples=2)
    alone, _ = eval_py.evaluate(tasks[1:], str(micro_checkpoint), config, progress=False, sampling=sampling, samples=2)
    texts = [t.turns[0]["text"] for t in both]
    assert texts[2:] == [t.turns[0]["text"] for t in alone]  # calc-b samples the same after calc-a or alone
    assert texts[2] != texts[3]  # different seeds, different samples


def test_samples_give_pass_at_k_and_records_carry_seeds(two_tasks, tmp_path):
    out = tmp_path / "r.json"
    assert run("--tasks", two_tasks, "--policy", "oracle", "--samples", "3", "--seed", "7", "--output", out,
               "--quiet", "--workers", "2") == 0
    results = json.loads(out.read_text())
    assert results["summary"]["n"] == 6 and results["summary"]["n_tasks"] == 2
    assert {"pass@1", "pass@2", "pass@3"} <= results["summary"].keys()
    assert [(r["id"], r["sample"], r["seed"]) for r in results["tasks"]] == \
        [(i, s, 7 + s) for i in ("calc-a", "calc-b") for s in range(3)]


def test_compare_output_shape(micro_checkpoint, two_tasks, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out_dir = tmp_path / "cmp"
    assert run("--tasks", two_tasks, "--compare", "noop", "gold", micro_checkpoint, "--out-dir", out_dir,
               "--bootstrap", "200", "--wandb", "--run", "unit", *MICRO) == 0
    for name in ("compare.json", "compare.md", "solve_rate.png", "tool_mix.png", "noop/results.json",
                 "gold/results.json", "micro__sft/results.json"):
        assert (out_dir / name).is_file(), name
    assert (out_dir / "solve_rate.png").read_bytes()[:4] == b"\x89PNG"
    comparison = json.loads((out_dir / "compare.json").read_text())
    assert comparison["baseline"] == "noop" and list(comparison["policies"]) == ["noop", "gold", "micro/sft"]
    scope = str(two_tasks)
    assert set(comparison["policies"]["gold"]["metrics"]) == {"all", scope}
    gold = comparison["differences"]["gold"]["all"]
    assert gold["diff"] == 1.0 and gold["ci95"] == [1.0, 1.0] and gold["n_tasks"] == 2
    assert gold["method"] == "paired bootstrap over tasks" and gold["resamples"] == 200
    assert comparison["differences"]["micro/sft"]["all"]["diff"] == 0.0
    markdown = (out_dir / "compare.md").read_text()
    assert "| task set | noop | gold | micro/sft |" in markdown and "Δ +100.0%" in markdown
    assert gold["malformed_per_episode"] == {"diff": 0.0, "ci95": [0.0, 0.0]}  # neither makes a malformed call
    assert "| malformed calls | 0 | 0<br>Δ +0.00 per episode [+0.00, +0.00] |" in markdown
    runs = list((out_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 4  # one per policy and the comparison


def test_config_yaml_with_flags_overriding(two_tasks, tmp_path):
    config = tmp_path / "eval.yaml"
    config.write_text(f"tasks: {two_tasks}\npolicy: noop\noutput: {tmp_path / 'from_yaml.json'}\n"
                      "max_turns: 3\nquiet: true\n")
    assert run("--config", config) == 0
    summary = json.loads((tmp_path / "from_yaml.json").read_text())["summary"]
    assert summary["policy"] == "noop" and summary["config"]["episode"]["max_turns"] == 3
    assert run("--config", config, "--policy", "gold", "--output", tmp_path / "flag.json") == 0
    assert json.loads((tmp_path / "flag.json").read_text())["summary"]["solved"] == 2
    assert run("--config", config, "--compare", "noop", "gold", "--out-dir", tmp_path / "c") == 0
    config.write_text("tasks: x\npolicy: noop\nmax_turn: 3\n")
    with pytest.raises(SystemExit):
        eval_py.parse_args(["--config", str(config)])


def test_bad_config_key_is_named(tmp_path, capsys):
    config = tmp_path / "eval.yaml"
    config.write_text("policy: noop\nmax_turn: 3\n")
    with pytest.raises(SystemExit):
        eval_py.parse_args(["--config", str(config)])
    assert "unknown config key 'max_turn' (did you mean 'max_turns'?)" in capsys.readouterr().err


@pytest.mark.parametrize("make, says", [
    (lambda d: d / "runs" / "nope" / "sft", "a checkpoint directory or a hub id"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "no config.json"),
    (lambda d: ((d / "noweights").mkdir(), (d / "noweights" / "config.json").write_text('{"model_type": "llama"}'))
     and d / "noweights", "no weights"),
])
def test_malformed_checkpoint_fails_clearly(make, says, two_tasks, tmp_path, capsys):
    path = make(tmp_path)
    out = tmp_path / "r.json"
    assert run("--tasks", two_tasks, "--policy", path, "--output", out, "--quiet") == 2
    err = capsys.readouterr().err
    assert says in err and str(path.name) in err and not out.exists()


def test_argument_errors(two_tasks, tmp_path, capsys):
    with pytest.raises(SystemExit):
        eval_py.parse_args(["--tasks", "samples", "--policy", "noop", "--compare", "gold", "--output", "x"])
    with pytest.raises(SystemExit):
        eval_py.parse_args(["--tasks", "samples", "--compare", "gold", "noop"])  # no --out-dir
    assert run("--tasks", two_tasks, "--compare", "gold", "gold", "--out-dir", tmp_path) == 2
    assert "share a label" in capsys.readouterr().err
    assert run("--tasks", "no-such-set", "--policy", "noop", "--output", tmp_path / "r.json") == 2
    assert "unknown task set 'no-such-set'" in capsys.readouterr().err


# --------------------------------------------------------------------------- task sets


@pytest.fixture
def factory_root(tmp_path) -> Path:
    root = tmp_path / "factory"
    for split, family, tier in [("test", "fix_bug", "micro"), ("test", "fix_lint", "micro"),
                                ("test", "fix_bug", "repo"), ("val", "fix_bug", "repo")]:
        write_task(root / split / f"{split}-{family}-{tier}", id=f"{split}-{family}-{tier}", instruction="x",
                   test_command="true", repo={"a.py": ""}, family=family, tier=tier, split=split)
    return root


def test_factory_task_sets_filter_by_family_and_tier(factory_root, monkeypatch):
    def ids(spec):
        return [t.id for t in resolve_task_set(spec, tasks_root_dir=factory_root).tasks]

    assert ids("factory:test") == ["test-fix_bug-micro", "test-fix_bug-repo", "test-fix_lint-micro"]
    assert ids("factory:test/fix_bug") == ["test-fix_bug-micro", "test-fix_bug-repo"]
    assert ids("factory:test/fix_bug/repo") == ids("factory:test/repo/fix_bug") == ["test-fix_bug-repo"]
    monkeypatch.setenv("NANOCOMPOSER_TASKS", str(factory_root))
    assert [t.id for t in resolve_task_set("factory:val").tasks] == ["val-fix_bug-repo"]
    with pytest.raises(TaskError, match=r"no split 'train' .*\(splits: val, test\)"):
        resolve_task_set("factory:train")
    with pytest.raises(TaskError, match=r"'locate' is neither a family \(fix_bug, fix_lint\) nor a tier"):
        resolve_task_set("factory:test/locate")
    with pytest.raises(TaskError, match=r"unknown task set 'tests/nothing'.*samples, factory:\{val,test\}"):
        resolve_task_set("tests/nothing")


def test_samples_and_directories_resolve(two_tasks, tmp_path):
    samples = resolve_task_set("samples")
    assert samples.kind == "harness" and len(samples.tasks) == 5
    assert [t.id for t in resolve_task_set(str(two_tasks)).tasks] == ["calc-a", "calc-b"]
    with pytest.raises(TaskError, match=r"no task factory output in .* \(run `make data`"):
        resolve_task_set("factory:test", tasks_root_dir=tmp_path)


def test_run_benchmark_reports_each_task_set(two_tasks, tmp_path):
    other = tmp_path / "other"
    make_calc_task(other, "calc-c")
    sets = [resolve_task_set(str(two_tasks)), TaskSet("ext", resolve_task_set(str(other)).tasks, "external",
                                                      "external: X", str(other))]
    results = eval_py.run_benchmark(sets, "gold", EpisodeConfig(), progress=False)
    s = results["summary"]
    assert s["n"] == 3 and s["task_sets"]["ext"]["n"] == 1 and s["task_sets"]["ext"]["label"] == "external: X"
    assert [r["task_set"] for r in results["tasks"]] == [str(two_tasks)] * 2 + ["ext"]


def test_limit_spreads_over_the_set_so_every_family_is_in(tmp_path):
    """Ids start with the family, so the first N tasks of a mixed set would be one family."""
    for task_id in ("copy-1", "copy-2", "locate-1", "locate-2"):
        write_task(tmp_path / task_id, id=task_id, instruction="x", test_command="true", repo={"a.py": ""},
                   family=task_id.split("-")[0])
    results = eval_py.run_benchmark([resolve_task_set(str(tmp_path))], "noop", EpisodeConfig(max_turns=1),
                                    progress=False, limit=2)
    assert [r["id"] for r in results["tasks"]] == ["copy-1", "locate-1"]


# --------------------------------------------------------------------------- recipes, bad input, resume

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("preset", ["tiny", "gpu"])
def test_eval_recipes_parse_into_a_budget(preset, monkeypatch):
    monkeypatch.chdir(ROOT)
    args, budget = eval_py.parse_args(["--config", f"recipes/{preset}/eval.yaml", "--policy", "noop",
                                       "--output", "r.json", "--max-turns", "3"])
    assert args.tasks and args.workers >= 1 and budget.max_turns == 3  # the flag beats the recipe
    assert budget.temperature == 0.0 and budget.max_new_tokens >= 128


@pytest.mark.parametrize("flags, says", [
    (["--limit", "-1"], "--limit must be >= 1, got -1"),
    (["--max-turns", "-1"], "max_turns=-1: must be an integer >= 1"),
    (["--max-wall-s", "-1"], "max_wall_s=-1.0: must be a number of seconds > 0"),
    (["--max-output-chars", "1"], "max_output_chars=1: must be an integer >= 200"),
    (["--top-p", "0"], "top_p=0.0: must be in (0, 1]"),
    (["--workers", "0"], "--workers must be >= 1, got 0"),
    (["--samples", "0"], "--samples must be >= 1, got 0"),
    (["--max-turns", "2.5"], "invalid int value: '2.5'"),
    (["--output", "{tmp}"], "is a directory, not a file"),
    (["--output", "{tmp}/no/such/r.json"], "does not exist"),
])
def test_bad_arguments_fail_before_any_work_with_one_line(flags, says, two_tasks, tmp_path, capsys):
    flags = [f.format(tmp=tmp_path) for f in flags]
    argv = ["--tasks", str(two_tasks), "--policy", "gold", "--output", str(tmp_path / "r.json"), *flags]
    with pytest.raises(SystemExit) as exit_info:
        eval_py.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and says in err and err.startswith("eval.py: error: ")
    assert err.count("\n") == 1 and not list(tmp_path.glob("*.json*"))


def test_a_broken_task_in_the_set_is_one_failed_record(two_tasks, tmp_path):
    (two_tasks / "calc-0-broken").mkdir()
    (two_tasks / "calc-0-broken" / "task.json").write_text('{"id": "broken"}')
    out = tmp_path / "r.json"
    assert run("--tasks", two_tasks, "--policy", "gold", "--output", out, "--quiet") == 0
    records = json.loads(out.read_text())["tasks"]
    assert [(r["id"], r["exit_status"], r["solved"]) for r in records] == [
        ("calc-0-broken", "invalid_task", False), ("calc-a", "submitted", True), ("calc-b", "submitted", True)]
    assert "task.json" in records[0]["error"] and records[0]["task_set"] == str(two_tasks)


def test_resume_continues_from_the_episodes_file(two_tasks, tmp_path):
    out = tmp_path / "r.json"
    argv = ["--tasks", two_tasks, "--policy", "oracle", "--samples", "2", "--output", out, "--quiet"]
    assert run(*argv) == 0
    whole = json.loads(out.read_text())
    episodes = tmp_path / "r.episodes.jsonl"
    lines = episodes.read_text().splitlines(keepends=True)
    assert [json.loads(line) for line in lines] == whole["tasks"]
    episodes.write_text(lines[2] + lines[1][:40])  # a killed run: two episodes lost, one half-written
    out.unlink()
    assert run(*argv, "--resume") == 0
    resumed = json.loads(out.read_text())
    assert [r["episode_key"] for r in resumed["tasks"]] == [r["episode_key"] for r in whole["tasks"]]
    assert resumed["tasks"][2] == whole["tasks"][2]  # kept, not replayed
    assert resumed["summary"]["solved"] == whole["summary"]["solved"] == 4
    assert run(*argv, "--resume", "--max-turns", "3") == 2  # other settings would mix into the same file


def test_an_eval_record_is_a_replay_file(two_tasks, tmp_path):
    out = tmp_path / "r.json"
    assert run("--tasks", two_tasks / "calc-a", "--policy", "oracle", "--seed", "3", "--output", out, "--quiet") == 0
    record = json.loads(out.read_text())["tasks"][0]
    (tmp_path / "episode.json").write_text(json.dumps(record))
    replay = tmp_path / "replay.json"
    assert run("--tasks", two_tasks / "calc-a", "--policy", f"replay:{tmp_path / 'episode.json'}", "--output", replay,
               "--quiet") == 0
    replayed = json.loads(replay.read_text())["tasks"][0]
    assert [t["text"] for t in replayed["turns"]] == [t["text"] for t in record["turns"]]
    assert (replayed["solved"], replayed["exit_status"], replayed["n_turns"]) == (True, "submitted", record["n_turns"])


def test_shared_policy_warnings_name_the_script_that_runs(monkeypatch, capsys):
    """nanocomposer.policies serves eval.py, train_sft.py's check, agent.py and the real-time gate: its
    warnings carry the running script's name, or the module's when there is none."""
    from nanocomposer.policies import episode_concurrency

    monkeypatch.setattr("sys.argv", ["/repo/train_sft.py", "--check_workers", "4"])
    assert episode_concurrency(4, object(), "runs/x/sft") == 1  # cannot batch: one episode at a time
    assert capsys.readouterr().err.startswith("train_sft.py: warning: 4 workers with 'runs/x/sft'")
    monkeypatch.setattr("sys.argv", ["-c"])
    episode_concurrency(2, object(), "runs/x/sft")
    assert capsys.readouterr().err.startswith("nanocomposer.policies: warning: 2 workers")
