"""bench.sft_speed on the micro base: the recipe's trainer (LoRA, dtype auto, labelled-only head on CPU, as
recipes/smol/sft.yaml sets it) and a plain SFTTrainer step on the same packed row, reported as a ratio."""

import json

import pytest

from bench import sft_speed
from nanocomposer.dtypes import native_bf16
from tests import test_train_sft

micro = test_train_sft.micro  # the micro base model and SFT data (a module-scoped fixture)


def test_the_recipe_and_plain_sfttrainer_are_timed_on_the_same_row(micro, tmp_path):
    out = tmp_path / "sft_speed.json"
    status = sft_speed.main(["--config", "recipes/smol/sft.yaml", "--model", str(micro / "base"),
                             "--dataset", str(micro / "sft"), "--rows", "6", "--steps", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    assert status == 0
    assert report["trainer"] == "LabelledOnlyHeadSFTTrainer" and report["use_peft"] and report["lora_r"] == 32
    assert report["dtype"] == ("bfloat16" if native_bf16("cpu") else "float32") and report["tokens"] > report["labelled"] > 0
    assert len(report["recipe_s"]) == len(report["plain_s"]) == 1
    assert report["speedup_median"] == pytest.approx(report["plain_s"][0] / report["recipe_s"][0], abs=0.01)
