"""Every recipe under recipes/ parses with its stage's parser (`train_<stage>.make_parser()`).

Stages are discovered from the recipe file names (`recipes/<preset>/<stage>.yaml`); a recipe whose
stage script is missing fails.
"""

import importlib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(ROOT.glob("recipes/*/*.yaml"))


def stage_parser(stage: str):
    assert (ROOT / f"train_{stage}.py").is_file(), f"a recipe for stage {stage!r} but no train_{stage}.py"
    return importlib.import_module(f"train_{stage}").make_parser()


def test_every_stage_has_a_tiny_and_a_gpu_recipe():
    names = {(p.parent.name, p.stem) for p in RECIPES}
    assert {(preset, stage) for preset in ("tiny", "gpu") for stage in ("cpt", "sft", "rl")} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_parses(recipe, monkeypatch):
    monkeypatch.chdir(ROOT)
    parser = stage_parser(recipe.stem.split("_")[0])  # rl_long.yaml, rl_2gpu.yaml: variants of stage rl
    args = ["--config", str(recipe.relative_to(ROOT))]
    if not torch.cuda.is_available() and "bf16: true" in recipe.read_text():
        args += ["--use_cpu", "true"]  # TrainingArguments refuses bf16 without a GPU unless told it is on CPU
    parsed = parser.parse_args_and_config(args)
    script_args, training_args, model_args = parsed[:3]
    assert model_args.model_name_or_path, "a recipe names its starting model"
    assert script_args.run, "outputs go under runs/<run>/"
    if recipe.parent.name == "tiny":
        assert training_args.use_cpu and not training_args.bf16 and not training_args.activation_checkpointing
