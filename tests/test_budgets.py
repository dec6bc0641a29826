"""One episode budget per preset: every stage of a preset plays its episodes under `recipes/<preset>/budget.yaml`.

Each stage's budget is resolved the way the stage resolves it: its recipe parsed by its own parser, then the
function the stage calls to build its episodes' env.budget.Budget (the SFT check's `check_budget`, RL's
`rollout_budget`, eval's parsed Budget, the real-time loop's gate and server budgets, down to the `agent.py
serve` command it starts and the ServerConfig that command builds), and the SFT data builder's `--budget` as the
run scripts pass it. The budget is every key a budget file sets (env.budget.BUDGET_FILE_KEYS: the episode budget,
the per-turn tokens and the context); sampling (temperature, top_p, seed) is each stage's own.
"""

import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from env.budget import BUDGET_FILE, BUDGET_FILE_KEYS, Budget, load_budget_file

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.parent.name for p in ROOT.glob("recipes/*/sft.yaml"))  # every preset with training stages
CPU = ["--bf16", "false", "--use_cpu", "true"]  # the GPU recipes parse on a CPU too


def keys(budget) -> dict:
    return {key: getattr(budget, key) for key in BUDGET_FILE_KEYS}


def sft_data_budget(budget_file: Path, monkeypatch, tmp_path: Path) -> dict:
    """The budget `python -m data.build_sft --budget FILE` plays its oracle episodes under."""
    from data import build_sft

    seen = {}
    monkeypatch.setattr(build_sft, "build", lambda *args: seen.setdefault("budget", args[9]) and {"splits": {}})
    assert build_sft.main(["--tasks", str(tmp_path), "--out", str(tmp_path / "sft"), "--budget", str(budget_file)]) == 0
    return keys(seen["budget"])


def realtime_budgets(recipe: Path, monkeypatch, tmp_path: Path) -> dict:
    """The loop's gate budget (what Loop.version_eval hands gate.evaluate) and its server's (what the `agent.py
    serve` command Loop.start_server starts builds, as the episodes of its sessions see it)."""
    import agent
    import realtime_rl
    from env.episode import EpisodeConfig
    from nanocomposer.realtime import loop as loop_module
    from nanocomposer.realtime.server import serve_command

    args, training, _ = realtime_rl.make_parser().parse_args_and_config(
        ["--config", str(recipe), *CPU, "--runs_dir", str(tmp_path / "runs"), "--run", "t"])
    started, gated = {}, {}
    monkeypatch.setattr(loop_module, "AgentServer", lambda registry, db, *, log, **options: started.update(options))
    monkeypatch.setattr(loop_module, "evaluate", lambda spec, tasks, *, budget, **kw: gated.setdefault("b", budget) and {})
    loop = loop_module.Loop(args, training, SimpleNamespace(model_name_or_path="oracle"), log=lambda *a: None)
    loop.start_server()
    loop.version_eval("v0", [])
    cmd = serve_command(tmp_path / "registry", tmp_path / "db", **started)
    assert Path(cmd[1]).name == "agent.py"
    config = agent.server_config(agent.make_parser().parse_args(cmd[2:]))
    session = EpisodeConfig(**config.episode(config.session_timeout_s))  # as SessionManager._play builds it
    served = {**{k: getattr(session, k) for k in session.budgets() if k in BUDGET_FILE_KEYS},
              "max_new_tokens": config.sampling["max_new_tokens"], "max_context": config.sampling["max_context"]}
    assert config.sampling["temperature"] == training.temperature and config.sampling["seed"] == training.seed
    return {"gate": keys(gated["b"]), "agent server": served}


def stage_budgets(preset_dir: Path, monkeypatch, tmp_path: Path) -> dict[str, dict]:
    """stage -> the budget it plays its episodes under, for every stage recipe in `preset_dir`."""
    import eval as eval_py
    import train_rl
    import train_sft

    monkeypatch.chdir(ROOT)
    out = {}
    sft = train_sft.make_parser().parse_args_and_config(["--config", str(preset_dir / "sft.yaml"), *CPU])[0]
    out["sft check"] = keys(sft.check_budget())  # also the held-out solve rate logged while training (harness_eval)
    for recipe in sorted(preset_dir.glob("rl*.yaml")):
        script_args, training_args = train_rl.make_parser().parse_args_and_config(["--config", str(recipe), *CPU])[:2]
        out[f"rl ({recipe.name})"] = keys(train_rl.rollout_budget(script_args, training_args))
    # eval: its recipe (the budget file beside it), or, for a preset without one, --budget (runs/gpu_scratch.sh)
    config = (["--config", str(preset_dir / "eval.yaml")] if (preset_dir / "eval.yaml").is_file()
              else ["--tasks", "samples", "--budget", str(preset_dir / BUDGET_FILE)])
    out["eval"] = keys(eval_py.parse_args([*config, "--policy", "gold", "--output", str(tmp_path / "r.json")])[1])
    if (preset_dir / "realtime.yaml").is_file():
        out.update(realtime_budgets(preset_dir / "realtime.yaml", monkeypatch, tmp_path))
    return out


def joined(script: Path) -> str:
    return re.sub(r"\\\n", " ", script.read_text())


def sft_data_budget_files() -> dict[str, set[str]]:
    """preset -> the budget files the run scripts build its SFT data under: a script that trains SFT with
    recipes/<preset>/sft.yaml (also by `train_chain <preset>`) and builds SFT data (data.build_sft --budget, or runs/data.sh with BUDGET=)."""
    found: dict[str, set[str]] = {}
    for script in sorted(ROOT.glob("runs/*.sh")):
        text = joined(script)
        # SFT with recipes/<preset>/sft.yaml, named or through runs/stages.sh's `train_chain <preset>`
        presets = set(re.findall(r"recipes/(\w+)/sft\.yaml", text)) | set(re.findall(r"^train_chain (\w+)", text, re.MULTILINE))
        variables = dict(re.findall(r"^(\w+)=([^\s$]+)$", text, re.MULTILINE))
        given = []
        for line in text.splitlines():
            if re.search(r"-m data\.build_sft\b", line):
                given.append(re.search(r"--budget \"?([^\s\"]+)", line))
            elif re.search(r"\bbash runs/data\.sh\b", line):
                given.append(re.search(r"\bBUDGET=\"?([^\s\"]+)", line))
        if not presets or not given:
            continue
        assert all(given), f"{script.name} builds SFT data with no --budget (Budget's defaults, not its preset's)"
        files = {variables.get(m.group(1).strip("${}"), m.group(1)) for m in given}
        for preset in presets:
            found.setdefault(preset, set()).update(files)
    return found


def test_every_preset_has_one_complete_budget_file():
    for preset in PRESETS:
        values = load_budget_file(ROOT / "recipes" / preset / BUDGET_FILE)  # checked by Budget
        assert set(values) == set(BUDGET_FILE_KEYS), (preset, set(BUDGET_FILE_KEYS) - set(values))


def test_the_run_scripts_build_each_presets_sft_data_under_its_budget_file():
    found = sft_data_budget_files()
    assert set(found) == set(PRESETS), "a preset whose SFT data no run script builds under its budget"
    for preset, files in found.items():
        assert files == {f"recipes/{preset}/{BUDGET_FILE}"}, (preset, files)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_stage_of_a_preset_plays_under_its_budget_file(preset, monkeypatch, tmp_path):
    """The SFT data, the SFT check, RL rollouts, eval, the gate and the agent server (where the preset has a
    real-time recipe) see the same whole budget: the preset's budget.yaml."""
    preset_dir = ROOT / "recipes" / preset
    want = keys(Budget(**load_budget_file(preset_dir / BUDGET_FILE)))
    stages = {"sft data": sft_data_budget(ROOT / f"recipes/{preset}/{BUDGET_FILE}", monkeypatch, tmp_path),
              **stage_budgets(preset_dir, monkeypatch, tmp_path)}
    assert {"sft data", "sft check", "eval"} <= set(stages) and any(s.startswith("rl") for s in stages)
    wrong = {stage: {k: (v, want[k]) for k, v in got.items() if v != want[k]}
             for stage, got in stages.items() if got != want}
    assert not wrong, wrong  # stage -> key -> (what it sees, the budget file's)


def test_changing_the_budget_file_changes_what_every_stage_sees(monkeypatch, tmp_path):
    """A preset (the tiny one's stage recipes) with a budget file of values that are nobody's default: every stage
    sees each of them, so a stage that ignored a key, or kept a default or a copy of its own, fails here."""
    odd = {"max_turns": 5, "max_tokens": 900, "max_wall_s": 77.0, "max_malformed_turns": 2, "max_output_chars": 1234,
           "command_timeout_s": 11.0, "max_new_tokens": 64, "max_context": 3000}
    assert set(odd) == set(BUDGET_FILE_KEYS)
    tiny = keys(Budget(**load_budget_file(ROOT / "recipes" / "tiny" / BUDGET_FILE)))
    assert all(odd[k] not in (tiny[k], getattr(Budget, k)) for k in odd)  # each value differs from both
    preset = tmp_path / "odd"
    preset.mkdir()
    for recipe in ("sft.yaml", "rl.yaml", "rl_long.yaml", "eval.yaml", "realtime.yaml"):
        shutil.copy(ROOT / "recipes" / "tiny" / recipe, preset / recipe)
    (preset / BUDGET_FILE).write_text(yaml.safe_dump(odd))
    stages = {"sft data": sft_data_budget(preset / BUDGET_FILE, monkeypatch, tmp_path),
              **stage_budgets(preset, monkeypatch, tmp_path)}
    assert {"sft data", "sft check", "rl (rl.yaml)", "rl (rl_long.yaml)", "eval", "gate", "agent server"} == set(stages)
    wrong = {stage: {k: v for k, v in got.items() if v != odd[k]} for stage, got in stages.items() if got != odd}
    assert not wrong, wrong


def test_a_flag_still_overrides_the_budget_file_for_one_stage(monkeypatch):
    """runs/ablations.sh's deliberate GRPO override: --max_turns 6 for that run, the rest the preset's."""
    import train_rl

    monkeypatch.chdir(ROOT)
    want = keys(Budget(**load_budget_file(ROOT / "recipes" / "tiny" / BUDGET_FILE)))
    parsed = train_rl.make_parser().parse_args_and_config(["--config", "recipes/tiny/rl_long.yaml", *CPU,
                                                           "--max_turns", "6"])
    assert keys(train_rl.rollout_budget(*parsed[:2])) == {**want, "max_turns": 6}
    assert "--max_turns 6" in joined(ROOT / "runs" / "ablations.sh")


def test_every_stage_argument_set_carries_the_whole_budget():
    """budget_from_arguments takes every budget key from the stage's own argument (no key left to Budget's default
    behind the stage's back); a dataclass missing one is refused."""
    from dataclasses import dataclass

    from nanocomposer.config import RLScriptArguments, SFTScriptArguments, budget_argument_names
    from nanocomposer.realtime.config import RealtimeArguments

    assert budget_argument_names(RLScriptArguments(run="r"))["max_tokens"] == "max_episode_tokens"
    assert budget_argument_names(RealtimeArguments(run="r"))["max_wall_s"] == "session_timeout_s"
    assert set(budget_argument_names(SFTScriptArguments(run="r"), "check_").values()) == \
        {f"check_{k}" for k in BUDGET_FILE_KEYS}

    @dataclass
    class Partial:
        max_turns: int = 3

    with pytest.raises(TypeError, match="max_tokens"):
        budget_argument_names(Partial())


def test_a_bad_budget_value_names_the_stage_argument(capsys):
    import realtime_rl
    import train_sft

    for parser, flags, says in [
        (train_sft.make_parser(), ["--check_max_malformed_turns", "0"], "--check_max_malformed_turns 0: must be"),
        (train_sft.make_parser(), ["--check_max_context", "100", "--check_max_new_tokens", "128"],
         "--check_max_context 100: must be None (the model's limit) or an integer > check_max_new_tokens=128"),
        (realtime_rl.make_parser(), ["--session_timeout_s", "0"], "--session_timeout_s 0.0: must be a number of seconds"),
        (realtime_rl.make_parser(), ["--max_output_chars", "10"], "--max_output_chars 10: must be an integer >= 200"),
    ]:
        with pytest.raises(SystemExit):
            parser.parse_args_and_config([*flags, "--use_cpu", "true"])
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
