"""A LoRA update that is small next to the weights survives the stages' save and the loader's adapter merge.

Merged into bf16 weights, any part of a delta under half a bf16 step rounds away; `save_final_model` merges a
half-precision run's adapter into its source checkpoint read in fp32, and saves fp32, so the saved model is the
trained policy, and chained updates (stage after stage, real-time cycle after cycle) all stay.
"""

import pytest
import torch
from safetensors.torch import load_file

from nanocomposer.config import ConfigError
from nanocomposer.engine.checkpoints import load_model_and_tokenizer
from nanocomposer.model_io import load_tokenizer, save_final_model
from tests.conftest import save_micro_checkpoint

TINY_B = 1e-5  # lora_B entries: a delta of ~1e-4 of a weight, far under bf16's spacing (~4e-3 of a weight)


def lora_on(model, b: float = TINY_B):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.fill_(b)
    return peft_model


def expected_merge(source_weights: dict, peft_model) -> dict:
    """The source's fp32 weights plus each adapted module's delta, computed in float64."""
    out = {k: v.double() for k, v in source_weights.items()}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            a, b = (module.lora_A["default"].weight.detach().double(), module.lora_B["default"].weight.detach().double())
            key = name.replace("base_model.model.", "", 1) + ".weight"
            out[key] = out[key] + b @ a * module.scaling["default"]
    return out


def relative_error(saved: dict, expected: dict, source: dict) -> float:
    """|saved - expected| / |expected - source| over the adapted weights: 0 when the whole delta is kept."""
    keys = [k for k in expected if not torch.equal(expected[k], source[k].double())]
    assert keys, "no weight was adapted"
    err = sum(float((saved[k].double() - expected[k]).pow(2).sum()) for k in keys) ** 0.5
    delta = sum(float((expected[k] - source[k].double()).pow(2).sum()) for k in keys) ** 0.5
    return err / delta


@pytest.fixture
def source(tmp_path):
    return save_micro_checkpoint(tmp_path / "source")  # fp32, like the pretrained base


def test_a_small_update_trained_on_a_bf16_copy_is_saved_whole_in_fp32(tmp_path, source):
    from transformers import AutoModelForCausalLM

    source_weights = load_file(source / "model.safetensors")
    peft_model = lora_on(AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16))
    expected = expected_merge(source_weights, peft_model)
    save_final_model(peft_model, load_tokenizer(str(source)), tmp_path / "out", source=str(source))
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.float32}
    assert relative_error(saved, expected, source_weights) < 1e-2
    # What the old save did (merge into the bf16 copy) loses nearly all of it: the test can tell them apart.
    naive = {k: v.float() for k, v in lora_on(AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16))
             .merge_and_unload().state_dict().items()}
    assert relative_error(naive, expected, source_weights) > 0.5
    model, _ = load_model_and_tokenizer(tmp_path / "out", device="cpu")
    assert next(model.parameters()).dtype == torch.float32  # served as saved: the update stays at inference


def test_chained_updates_accumulate_across_saves(tmp_path, source):
    """Two cycles, each training a bf16 copy of the last saved model: the second keeps the first's update."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(str(source))
    first = lora_on(AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16))
    save_final_model(first, tokenizer, tmp_path / "v1", source=str(source))
    second = lora_on(AutoModelForCausalLM.from_pretrained(tmp_path / "v1", dtype=torch.bfloat16))
    save_final_model(second, tokenizer, tmp_path / "v2", source=str(tmp_path / "v1"))
    source_weights = load_file(source / "model.safetensors")
    expected = expected_merge(expected_merge(source_weights, first), second)
    assert relative_error(load_file(tmp_path / "v2" / "model.safetensors"), expected, source_weights) < 1e-2


def test_an_fp32_run_merges_in_place(tmp_path, source):
    from transformers import AutoModelForCausalLM

    source_weights = load_file(source / "model.safetensors")
    peft_model = lora_on(AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32))
    expected = expected_merge(source_weights, peft_model)
    # the source is not read again in fp32 (the model already is): a missing one does not matter
    save_final_model(peft_model, load_tokenizer(str(source)), tmp_path / "out", source=str(tmp_path / "gone"))
    assert relative_error(load_file(tmp_path / "out" / "model.safetensors"), expected, source_weights) < 1e-2


def test_a_source_that_no_longer_loads_is_a_clear_error(tmp_path, source):
    from transformers import AutoModelForCausalLM

    peft_model = lora_on(AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16))
    (source / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(ConfigError, match=r"read again in fp32: model_name_or_path .*source: the weights do not load.*saved unmerged in .*adapter"):
        save_final_model(peft_model, load_tokenizer(str(source)), tmp_path / "out", source=str(source))
    assert not (tmp_path / "out" / "model.safetensors").exists()  # no model that is not the trained one
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()  # and the update is not lost


def test_the_loader_merges_an_adapter_on_a_bf16_base_in_fp32(tmp_path, source):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source).to(torch.bfloat16)
    model.save_pretrained(source)  # a bf16 base, as SFT saved before the fp32 merge
    load_tokenizer(str(source)).save_pretrained(source)
    base_weights = load_file(source / "model.safetensors")
    peft_model = lora_on(AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16))
    peft_model.save_pretrained(tmp_path / "adapter")
    expected = expected_merge(base_weights, peft_model)
    merged, _ = load_model_and_tokenizer(tmp_path / "adapter", device="cpu")
    assert next(merged.parameters()).dtype == torch.float32
    assert relative_error(merged.state_dict(), expected, base_weights) < 1e-2
