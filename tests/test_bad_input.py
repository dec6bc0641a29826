"""Bad input to a training stage fails before any work: exit status 2, one line on stderr naming the flag
(or the file and key) and what is wrong, no traceback, nothing written under the runs dir. And `--resume`
after a checkpoint save cut short resumes from the newest complete checkpoint and says so.

Each case runs the stage script as `python train_<stage>.py <flags>` would. Starting Python and importing
torch, transformers and TRL costs ~6 s of CPU per process, so one driver process per stage imports the
stage once and forks a child per case; the child runs the script as `__main__` (runpy) with its own
stdout/stderr files, and reports what it raised as the interpreter would (SystemExit's status or message,
or the traceback and 1). `test_plain_subprocess_matches_the_forked_run` checks one case as a plain subprocess.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, make_calc_task, save_micro_checkpoint

PYTHON = sys.executable
STDLIB = Path(sysconfig.get_paths()["stdlib"])

DRIVER = r"""
import json, os, runpy, sys
script, cases, out_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
sys.path.insert(0, os.getcwd())
__import__(script[:-3])  # the stage's imports, once


def exit_status():
    # What the interpreter does with what `python script` raises; then os._exit, because a normal exit with
    # torch loaded spends ~1.4 s of CPU tearing modules down.
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


codes = []
for i, argv in enumerate(cases):
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, suffix in ((1, "out"), (2, "err")):
            os.dup2(os.open(os.path.join(out_dir, f"{i}.{suffix}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = [script, *argv]
        status = exit_status()
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(status)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(codes))
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A good micro checkpoint, broken copies of it, tiny data for each stage, and recipes with a wrong type."""
    root = tmp_path_factory.mktemp("bad_input")
    good = save_micro_checkpoint(root / "good", context=512)
    for name in ("no_tokenizer", "truncated", "bad_json", "no_model_type", "no_weights"):
        (root / name).mkdir()
        for file in good.iterdir():
            (root / name / file.name).write_bytes(file.read_bytes())
    for file in (root / "no_tokenizer").glob("tokenizer*"):
        file.unlink()
    weights = root / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut short
    (root / "bad_json" / "config.json").write_text('{"model_type": "llama", "hidden_size": 64,')
    config = json.loads((good / "config.json").read_text())
    del config["model_type"]
    (root / "no_model_type" / "config.json").write_text(json.dumps(config))
    (root / "no_weights" / "model.safetensors").unlink()

    from datasets import Dataset, DatasetDict

    from tests.test_train_sft import trajectory

    texts = [(STDLIB / name).read_text(encoding="utf-8") for name in ("bisect.py", "heapq.py", "shlex.py")]
    DatasetDict({"train": Dataset.from_dict({"text": texts[:2]}),
                 "validation": Dataset.from_dict({"text": texts[2:]})}).save_to_disk(str(root / "corpus"))
    DatasetDict({"train": Dataset.from_list([trajectory(i) for i in range(2)]),
                 "validation": Dataset.from_list([trajectory(2)])}).save_to_disk(str(root / "sft"))
    make_calc_task(root / "tasks", "calc-a")
    for stage in ("cpt", "sft", "rl"):
        recipe = yaml.safe_load((ROOT / "recipes" / "tiny" / f"{stage}.yaml").read_text())
        (root / f"{stage}_ten_steps.yaml").write_text(yaml.safe_dump({**recipe, "max_steps": "ten"}))
    return root


def good_flags(stage: str, root: Path) -> list[str]:
    """Flags under which the stage would start training (tiny settings, everything under `root`)."""
    data = {"cpt": ["--dataset_path", str(root / "corpus"), "--block_size", "64"],
            "sft": ["--dataset_path", str(root / "sft"), "--max_length", "512"],
            "rl": ["--tasks_dir", str(root / "tasks"), "--rollout_workers", "0", "--max_turns", "1",
                   "--max_new_tokens", "8", "--num_generations", "2", "--per_device_train_batch_size", "2"]}
    return ["--config", f"recipes/tiny/{stage}.yaml", "--model_name_or_path", str(root / "good"),
            "--max_steps", "1", "--report_to", "none", *data[stage]]


# (case id, stages, extra flags ({root}: the inputs fixture), what the one stderr line must contain).
# Later flags win, so each case overrides one good flag.
COMMON = [
    ("no_tokenizer", ["--model_name_or_path", "{root}/no_tokenizer"],
     "model_name_or_path {root}/no_tokenizer: no tokenizer"),
    ("truncated_weights", ["--model_name_or_path", "{root}/truncated"],
     "model_name_or_path {root}/truncated: model.safetensors is truncated or corrupt"),
    ("config_not_json", ["--model_name_or_path", "{root}/bad_json"],
     "model_name_or_path {root}/bad_json: config.json is not valid JSON"),
    ("config_no_model_type", ["--model_name_or_path", "{root}/no_model_type"],
     "model_name_or_path {root}/no_model_type: config.json has no 'model_type'"),
    ("no_weights", ["--model_name_or_path", "{root}/no_weights"], "model_name_or_path {root}/no_weights: no weights"),
    ("model_missing", ["--model_name_or_path", "{root}/nowhere"], "model_name_or_path {root}/nowhere: no such directory"),
    ("model_is_a_runs_dir", ["--model_name_or_path", "{root}"],
     "model_name_or_path {root}: not a model directory (no config.json; model directories inside it: bad_json, good"),
    ("learning_rate_negative", ["--learning_rate", "-1"], "--learning_rate -1.0: must be > 0"),
    ("batch_size_zero", ["--per_device_train_batch_size", "0"], "--per_device_train_batch_size 0: must be at least 1"),
    ("eval_batch_size_negative", ["--per_device_eval_batch_size", "-2"], "--per_device_eval_batch_size -2: must be"),
    ("grad_accumulation_zero", ["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps 0: must be"),
    ("max_steps_negative", ["--max_steps", "-5"], "--max_steps -5: must be at least 1, or -1"),
    ("max_steps_zero", ["--max_steps", "0"], "--max_steps 0: must be at least 1, or -1"),
    ("epochs_zero", ["--max_steps", "-1", "--num_train_epochs", "0"], "--num_train_epochs 0.0: must be > 0"),
    ("seed_negative", ["--seed", "-3"], "--seed -3: must be at least 0"),
    ("recipe_wrong_type", ["--config", "{root}/{stage}_ten_steps.yaml"],
     "{root}/{stage}_ten_steps.yaml: max_steps 'ten': must be an integer"),
    ("flag_wrong_type", ["--learning_rate", "fast"], "--learning_rate"),
    ("only_incomplete_checkpoint", ["--runs_dir", "{runs}", "--run", "crashed"],
     "holds only incomplete checkpoints from an interrupted run (checkpoint-3: no trainer_state.json"),
]
OWN = {
    "cpt": [("dataset_missing", ["--dataset_path", "{root}/no_corpus"], "dataset_path {root}/no_corpus: no such directory"),
            ("block_size_zero", ["--block_size", "0"], "--block_size 0: must be at least 2")],
    "sft": [("dataset_missing", ["--dataset_path", "{root}/no_sft"], "dataset_path {root}/no_sft: no such directory"),
            ("check_tasks_missing", ["--check_tasks", "{root}/no_tasks"], "check_tasks {root}/no_tasks:"),
            ("max_length_zero", ["--max_length", "0"], "--max_length 0: must be at least 1"),
            ("check_workers_zero", ["--check_workers", "0"], "--check_workers 0: must be at least 1")],
    "rl": [("tasks_missing", ["--tasks_dir", "{root}/no_tasks"], "tasks_dir {root}/no_tasks:"),
           ("rollout_workers_negative", ["--rollout_workers", "-1"], "--rollout_workers -1: must be at least 0"),
           ("max_new_tokens_zero", ["--max_new_tokens", "0"], "--max_new_tokens 0: must be an integer >= 1"),
           ("max_turns_negative", ["--max_turns", "-1"], "--max_turns -1: must be an integer >= 1"),
           ("num_generations_one", ["--num_generations", "1"], "--num_generations 1: must be at least 2"),
           ("malformed_handling_unknown", ["--malformed_handling", "dorp"], "--malformed_handling"),
           ("max_wall_s_zero", ["--max_wall_s", "0"], "--max_wall_s 0.0: must be a number of seconds > 0")],
}
CASES = [(stage, *case) for stage in ("cpt", "sft", "rl") for case in COMMON + OWN[stage]]
GOOD = [(stage, "good", [], "") for stage in ("cpt", "sft", "rl")]  # the same flags without the bad one


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")} if path.exists() else set()


@pytest.fixture(scope="module")
def stage_runs(inputs, tmp_path_factory):
    """stage -> case id -> (exit status, stdout, stderr, files under its runs dir before, after): every case of
    a stage runs in one driver (see the module docstring), on first use."""
    results: dict[str, dict] = {}

    def run(stage: str) -> dict:
        if stage in results:
            return results[stage]
        out = tmp_path_factory.mktemp(f"{stage}_runs")
        cases, argvs, before = [], [], {}
        for case_stage, case_id, extra, expected in CASES + GOOD:
            if case_stage != stage:
                continue
            runs = out / case_id
            if case_id == "only_incomplete_checkpoint":  # a save killed right after its mkdir
                (runs / "crashed" / stage / "checkpoint-3").mkdir(parents=True)
            before[case_id] = files_under(runs)
            fill = {"root": inputs, "stage": stage, "runs": runs}
            flags = good_flags(stage, inputs) + ["--runs_dir", str(runs), "--run", "r"]
            if "--config" in extra:  # replaces the recipe (a second --config is an error)
                flags = flags[2:]
            argvs.append(flags + [arg.format(**fill) for arg in extra])
            cases.append((case_id, expected.format(**fill), runs))
        done = subprocess.run([PYTHON, "-c", DRIVER, f"train_{stage}.py", json.dumps(argvs), str(out)], cwd=ROOT,
                              check=False, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"})
        assert done.returncode == 0, done.stderr[-3000:]
        codes = json.loads(done.stdout.strip().splitlines()[-1])
        results[stage] = {case_id: (code, (out / f"{i}.out").read_text(), (out / f"{i}.err").read_text(),
                                    before[case_id], files_under(runs), expected)
                          for i, ((case_id, expected, runs), code) in enumerate(zip(cases, codes))}
        return results[stage]

    return run


@pytest.mark.slow  # one subprocess per stage runs its whole table (20 s or more each): `make test` runs it
@pytest.mark.parametrize("stage, case_id, extra, expected", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_input_fails_fast_with_one_line(stage_runs, stage, case_id, extra, expected):
    code, _, stderr, before, after, expected_text = stage_runs(stage)[case_id]
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert code == 2, (code, stderr)
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"train_{stage}.py: error: ") and expected_text in lines[0], lines[0]
    assert after == before, "a failed start must write nothing (no output dir, no model)"


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["cpt", "sft", "rl"])
def test_the_good_flags_train(stage_runs, stage):
    """The table is not vacuous: without the bad flag the same command trains its step and saves a model."""
    code, _, stderr, _, after, _ = stage_runs(stage)["good"]
    assert code == 0, stderr[-3000:]
    assert f"r/{stage}/model.safetensors" in after


@pytest.mark.slow  # `make test-fast` leaves it out
def test_plain_subprocess_matches_the_forked_run(inputs, tmp_path):
    """The real command line, without the driver: the same one line (nothing printed at import) and status 2."""
    done = subprocess.run([PYTHON, "train_rl.py", *good_flags("rl", inputs), "--runs_dir", str(tmp_path),
                           "--max_turns", "-1"], cwd=ROOT, check=False, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr) == (2, "train_rl.py: error: --max_turns -1: must be an integer >= 1\n")
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- resume after a save cut short


def cpt_flags(inputs: Path, runs: Path, *extra: str) -> list[str]:
    return ["--model_name_or_path", str(inputs / "good"), "--dataset_path", str(inputs / "corpus"),
            "--runs_dir", str(runs), "--run", "t", "--block_size", "64", "--max_eval_blocks", "2",
            "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2", "--learning_rate", "1e-3",
            "--eval_strategy", "no", "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "1",
            "--report_to", "none", "--disable_tqdm", "true", "--dataloader_pin_memory", "false", "--seed", "0",
            *extra]


def run_cpt(inputs: Path, runs: Path, *extra: str) -> dict:
    import train_cpt

    return train_cpt.main(*train_cpt.make_parser().parse_args_and_config(cpt_flags(inputs, runs, *extra)))


@pytest.fixture(scope="module")
def cpt_run(inputs, tmp_path_factory) -> Path:
    """The output dir of a 2-step CPT run that saved checkpoint-1 and checkpoint-2 (tests copy it)."""
    runs = tmp_path_factory.mktemp("cpt_run")
    run_cpt(inputs, runs, "--max_steps", "2")
    return runs / "t" / "cpt"


def test_resume_skips_incomplete_checkpoints_and_says_so(inputs, cpt_run, tmp_path, capsys, monkeypatch):
    import train_cpt

    out = tmp_path / "t" / "cpt"
    shutil.copytree(cpt_run, out)
    # What a kill -9 during the saves of steps 2 and 3 leaves: weights cut short, and a bare directory.
    weights = out / "checkpoint-2" / "model.safetensors"
    cut = weights.stat().st_size // 2
    weights.write_bytes(weights.read_bytes()[:cut])
    (out / "checkpoint-3").mkdir()
    capsys.readouterr()

    with pytest.raises(SystemExit, match=r"already holds checkpoint-1 \(and incomplete checkpoint-3, checkpoint-2\); "
                                         r"pass --resume"):
        run_cpt(inputs, tmp_path, "--max_steps", "4")
    assert sorted(p.name for p in out.glob("*checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]

    resumed_from = []
    train = train_cpt.PackedCausalLMTrainer.train

    def recording_train(self, *args, **kwargs):
        resumed_from.append(kwargs.get("resume_from_checkpoint"))
        return train(self, *args, **kwargs)

    monkeypatch.setattr(train_cpt.PackedCausalLMTrainer, "train", recording_train)
    metrics = run_cpt(inputs, tmp_path, "--max_steps", "4", "--resume", "true")
    stdout = capsys.readouterr().out
    assert resumed_from == [str(out / "checkpoint-1")] and metrics["global_step"] == 4
    assert f"--resume: resuming from {out / 'checkpoint-1'} (step 1)" in stdout
    assert "skipping incomplete checkpoint-2 (model.safetensors is truncated or corrupt" in stdout
    assert "skipping incomplete checkpoint-3 (no trainer_state.json" in stdout
    # moved aside, not deleted: the cut-short weights are still there for a post-mortem
    assert (out / "incomplete-checkpoint-2" / "model.safetensors").stat().st_size == cut
    assert (out / "incomplete-checkpoint-3").is_dir()
    assert (out / "checkpoint-4" / "trainer_state.json").is_file() and (out / "model.safetensors").is_file()


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


DAMAGES = [  # what a save cut short (or a copy cut short) can leave, and how checkpoint_problem names it
    ("no_trainer_state", lambda c: (c / "trainer_state.json").unlink(), "no trainer_state.json"),
    ("trainer_state_cut", lambda c: (c / "trainer_state.json").write_text('{"global_step": 1,'),
     "trainer_state.json is not valid JSON"),
    ("other_step", lambda c: (c / "trainer_state.json").write_text('{"global_step": 7}'),
     "does not record global_step 1"),
    ("no_weights", lambda c: (c / "model.safetensors").unlink(), "no weights"),
    ("weights_empty", lambda c: (c / "model.safetensors").write_bytes(b""), "model.safetensors is truncated"),
    ("no_optimizer", lambda c: (c / "optimizer.pt").unlink(), "no optimizer.pt"),
    ("optimizer_cut", lambda c: truncate(c / "optimizer.pt"), "optimizer.pt is truncated"),
    ("scheduler_cut", lambda c: truncate(c / "scheduler.pt"), "scheduler.pt is truncated"),
    ("rng_state_cut", lambda c: truncate(c / "rng_state.pth"), "rng_state.pth is truncated"),
]


@pytest.mark.parametrize("damage, expected", [(d[1], d[2]) for d in DAMAGES], ids=[d[0] for d in DAMAGES])
def test_checkpoint_problem_names_what_is_missing_or_cut(cpt_run, tmp_path, damage, expected):
    from nanocomposer.run_dir import checkpoint_problem

    checkpoint = shutil.copytree(cpt_run / "checkpoint-1", tmp_path / "checkpoint-1")
    assert checkpoint_problem(checkpoint) is None  # what the Trainer wrote is complete
    damage(checkpoint)
    assert expected in (checkpoint_problem(checkpoint) or "complete")
