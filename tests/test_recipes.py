"""Every training recipe under recipes/ parses with its stage's parser (`train_<stage>.make_parser()`), and
each of its values parses exactly as the same value given as a flag.

A training recipe is `recipes/<preset>/<stage>[_variant].yaml` with a `train_<stage>.py` beside the recipes;
the other tools' recipes (eval.yaml, users.yaml, realtime.yaml, ...) are tested with those tools.
"""

import importlib
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(ROOT.glob("recipes/*/*.yaml"))
STAGES = ("cpt", "sft", "rl")
STAGE_RECIPES = [p for p in RECIPES if p.stem.split("_")[0] in STAGES]


def stage_parser(stage: str):
    assert (ROOT / f"train_{stage}.py").is_file(), f"a recipe for stage {stage!r} but no train_{stage}.py"
    return importlib.import_module(f"train_{stage}").make_parser()


def recipe_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def cpu_flags(recipe: Path) -> list[str]:
    # TrainingArguments refuses bf16 without a GPU unless told it is on CPU
    return ["--use_cpu", "true"] if not torch.cuda.is_available() and "bf16: true" in recipe.read_text() else []


def test_every_stage_has_a_script_and_a_tiny_and_a_gpu_recipe():
    assert all((ROOT / f"train_{stage}.py").is_file() for stage in STAGES)
    names = {(p.parent.name, p.stem) for p in STAGE_RECIPES}
    assert {(preset, stage) for preset in ("tiny", "gpu") for stage in STAGES} <= names


@pytest.mark.parametrize("recipe", STAGE_RECIPES, ids=recipe_id)
def test_recipe_parses(recipe, monkeypatch, tmp_path):
    from nanocomposer.run_dir import prepare_output_dir

    monkeypatch.chdir(ROOT)
    stage = recipe.stem.split("_")[0]  # rl_long.yaml, rl_2gpu.yaml: variants of stage rl
    parsed = stage_parser(stage).parse_args_and_config(["--config", str(recipe.relative_to(ROOT)), *cpu_flags(recipe),
                                                        "--runs_dir", str(tmp_path), "--run", "probe"])
    script_args, training_args, model_args = parsed[:3]
    assert model_args.model_name_or_path, "a recipe names its starting model"
    # Outputs go under <runs_dir>/<run>/<stage>/, the run the pipeline names: a recipe that set `output_dir` (or a
    # run name of its own) would send every pipeline run's stage to one place.
    assert not {"run", "output_dir"} & set(yaml.safe_load(recipe.read_text())), "a recipe names no run or output dir"
    assert prepare_output_dir(script_args, training_args, stage) == (tmp_path / "probe" / stage, None)
    if recipe.parent.name == "tiny":
        assert training_args.use_cpu and not training_args.bf16 and not training_args.activation_checkpointing


@pytest.mark.parametrize("recipe", ["recipes/smol/rl.yaml", "recipes/smol/realtime.yaml"])
def test_the_smol_rl_recipes_score_one_episode_at_a_time_with_checkpointing_on_the_cpu(recipe, monkeypatch):
    """A smol RL step holds episodes of up to 4,096 tokens: batched, or without recomputed activations, it did
    not fit the 23 GiB machine (bench/grpo_memory.py). The CPU device setup must keep what the recipe says."""
    from nanocomposer.model_io import configure_device

    monkeypatch.chdir(ROOT)
    parser = importlib.import_module("realtime_rl" if "realtime" in recipe else "train_rl").make_parser()
    training_args = parser.parse_args_and_config(["--config", recipe])[1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    configure_device(training_args)
    assert training_args.activation_checkpointing and training_args.use_cpu
    assert training_args.per_device_train_batch_size == 1
    assert training_args.generation_batch_size % training_args.num_generations == 0


def as_flags(recipe: dict) -> list[str]:
    """The recipe's keys as command-line flags (null and mappings have no flag form: left out)."""
    flags = []
    for key, value in recipe.items():
        if key == "env" or value is None or isinstance(value, dict):
            continue
        values = value if isinstance(value, list) else [value]
        flags += [f"--{key}", *(json.dumps(v) if isinstance(v, bool) else str(v) for v in values)]
    return flags


@pytest.mark.parametrize("recipe", STAGE_RECIPES, ids=recipe_id)
def test_recipe_values_parse_like_flags(recipe, monkeypatch):
    """TrlParser hands YAML values to argparse as defaults, which argparse does not convert unless they are
    strings; RecipeParser types them as their flags would be, so a recipe and a command line agree."""
    monkeypatch.chdir(ROOT)
    stage = recipe.stem.split("_")[0]
    values = yaml.safe_load(recipe.read_text())
    from_recipe = stage_parser(stage).parse_args_and_config(["--config", str(recipe), *cpu_flags(recipe)])
    from_flags = stage_parser(stage).parse_args_and_config([*as_flags(values), *cpu_flags(recipe)])
    for key in values:
        if key == "env" or values[key] is None or isinstance(values[key], dict):
            continue
        got = [getattr(args, key) for args in from_recipe if hasattr(args, key)]
        want = [getattr(args, key) for args in from_flags if hasattr(args, key)]
        assert got == want, f"{recipe_id(recipe)}: {key}: recipe gives {got!r}, the flag gives {want!r}"
        assert [type(v) for v in got] == [type(v) for v in want], key


def test_a_recipe_value_of_the_wrong_type_names_file_key_and_type(tmp_path, capsys):
    import train_rl

    recipe = tmp_path / "rl.yaml"
    for text, problem in [("max_steps: 1.5\n", "max_steps 1.5: must be an integer"),
                          ("learning_rate: [1.0e-5]\n", "learning_rate [1e-05]: must be a number, not a list"),
                          ("malformed_handling: dorp\n", "malformed_handling 'dorp': must be one of penalize, drop"),
                          ("vllm_mode: on\n", "vllm_mode True: must be a string, not a boolean"),
                          ("use_peft: maybe\n", "use_peft 'maybe': must be a boolean"),
                          ("reward_weights: [1.0, heavy]\n", "reward_weights [1.0, 'heavy']: must be a list of numbers"),
                          ("max_turns: -1\n", "max_turns -1: must be an integer >= 1"),  # env.budget.Budget's check
                          ("learning_rate: null\n", "learning_rate None: must be a number, not null")]:
        recipe.write_text(text)
        with pytest.raises(SystemExit) as exit_info:
            train_rl.make_parser().parse_args_and_config(["--config", str(recipe), "--use_cpu", "true"])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1, err
        assert f"error: {recipe}: {problem}" in err, err


def test_recipe_strings_and_scalars_are_typed(tmp_path):
    import train_rl

    recipe = tmp_path / "rl.yaml"
    recipe.write_text("learning_rate: 3e-6\nmax_steps: '7'\nreward_funcs: outcome\nreward_weights: [1]\n"
                      "use_peft: 'yes'\n")
    script_args, training_args, model_args = train_rl.make_parser().parse_args_and_config(
        ["--config", str(recipe), "--use_cpu", "true"])
    assert training_args.learning_rate == 3e-6 and training_args.max_steps == 7  # YAML reads 3e-6 as a string
    assert script_args.reward_funcs == ["outcome"] and training_args.reward_weights == [1.0]
    assert model_args.use_peft is True


SCRIPTS = ("train_cpt", "train_sft", "train_rl", "eval", "realtime_rl", "agent")
# The commands users copy: the pipeline scripts, the READMEs (the top one and those of data/, bench/, tests/), docs/
# and the recipes' own comments.
COMMAND_FILES = [*sorted(ROOT.glob("runs/*.sh")), ROOT / "README.md", *sorted(ROOT.glob("*/README.md")),
                 *sorted(ROOT.glob("docs/*.md")), *RECIPES]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_prints_its_help(script):
    # argparse expands % in help strings: one "95% interval" once made `realtime_rl.py --help` a traceback
    help_text = importlib.import_module(script).make_parser().format_help()
    assert "--" in help_text and "Traceback" not in help_text



def parser_flags(script: str) -> set[str]:
    """Every option string the script accepts, its subcommands' included; `--config` and `--budget` are the recipe
    parser's (read before the dataclass flags)."""
    parser = importlib.import_module(script).make_parser()
    flags, parsers = {"--config", "--budget"}, [parser]
    while parsers:
        p = parsers.pop()
        flags |= set(p._option_string_actions)
        parsers += [sub for action in p._actions if isinstance(getattr(action, "choices", None), dict)
                    for sub in action.choices.values()]
    return flags


def test_every_documented_command_uses_flags_its_script_accepts():
    """A renamed or removed flag breaks the commands that reproduce the README's figures: find them here."""
    flags = {script: parser_flags(script) for script in SCRIPTS}
    unknown, commands = [], 0
    for path in COMMAND_FILES:
        text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))  # join continued lines
        for m in re.finditer(r"(?:\$PY|python)\s+(\w+)\.py\b([^`|;&\n]*)", text):
            if m.group(1) in flags:
                commands += 1
                unknown += [f"{path.relative_to(ROOT)}: {m.group(1)}.py {flag}"
                            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", m.group(2))
                            if flag not in flags[m.group(1)]]
    assert commands > 50 and not unknown, unknown


def test_every_referenced_script_recipe_and_module_exists():
    missing = [f"{path.relative_to(ROOT)}: {ref}" for path in [*COMMAND_FILES, *ROOT.glob("*.py")]
               for ref in re.findall(r"(?<![\w/.])((?:runs/\w+\.sh|recipes/[\w/-]+\.yaml|"
                                     r"(?:bench|data|env|nanocomposer|tests)/[\w/-]+\.py))", path.read_text())
               if not (ROOT / ref).exists()]
    assert not missing, missing
