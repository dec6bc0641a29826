"""bench.merge_precision: a LoRA delta far below a bf16 weight's spacing rounds away when merged into bf16 and
survives in fp32; a large one survives both. The weight report on synthetic tensors and on a saved micro adapter."""

import pytest
import torch

from bench import merge_precision
from tests.conftest import save_micro_checkpoint


def adapter_for(weight: torch.Tensor, magnitude: float, rank: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(rank, weight.shape[1], generator=g)
    b = torch.randn(weight.shape[0], rank, generator=g)
    delta_norm = float((b @ a).norm())
    b *= magnitude * float(weight.float().norm()) / delta_norm  # |B @ A| / |W| = magnitude at scale 1
    return {"base_model.model.layer.lora_A.weight": a, "base_model.model.layer.lora_B.weight": b}


@pytest.fixture
def weight():
    return {"layer.weight": (1.0 + torch.rand(64, 32, generator=torch.Generator().manual_seed(1))).bfloat16()}


def test_a_tiny_delta_rounds_away_in_bf16_and_survives_in_fp32(weight):
    adapter = adapter_for(weight["layer.weight"], 1e-4)
    bf16 = merge_precision.weight_report(weight, adapter, scale=1.0)
    assert bf16["dtype"] == "bfloat16" and abs(bf16["delta_over_weight"] - 1e-4) < 1e-6
    assert bf16["rounding_error_over_delta"] > 0.99 and bf16["weights_changed"] < 0.01
    fp32 = merge_precision.weight_report(weight, adapter, scale=1.0, dtype=torch.float32)
    assert fp32["rounding_error_over_delta"] < 1e-3 and fp32["weights_changed"] > 0.99


def test_a_large_delta_survives_a_bf16_merge(weight):
    report = merge_precision.weight_report(weight, adapter_for(weight["layer.weight"], 0.1), scale=1.0)
    assert report["rounding_error_over_delta"] < 0.05 and report["weights_changed"] > 0.95


def test_an_adapter_for_another_model_is_a_clear_error(weight):
    adapter = {"base_model.model.other.lora_A.weight": torch.zeros(1, 32),
               "base_model.model.other.lora_B.weight": torch.zeros(64, 1)}
    with pytest.raises(SystemExit, match="adapts 'other.weight', which the model does not have"):
        merge_precision.weight_report(weight, adapter, scale=1.0)
    with pytest.raises(SystemExit, match="no matching lora_B weight"):
        merge_precision.weight_report(weight, {"base_model.model.layer.lora_A.weight": torch.zeros(1, 32)}, scale=1.0)
    with pytest.raises(SystemExit, match="no lora_A/lora_B weights"):
        merge_precision.weight_report(weight, {}, scale=1.0)


def test_main_on_a_saved_micro_adapter(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = save_micro_checkpoint(tmp_path / "micro")
    model = AutoModelForCausalLM.from_pretrained(base).to(torch.bfloat16)
    model.save_pretrained(base)  # a bf16 checkpoint, as the stages save on a CPU with bf16 arithmetic
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.fill_(1e-6)  # a delta far under bf16's spacing
    peft_model.save_pretrained(tmp_path / "adapter")
    report = merge_precision.main(["--model", str(base), "--adapter", str(tmp_path / "adapter"),
                                   "--json", str(tmp_path / "r.json")])
    assert report["weights"]["dtype"] == "bfloat16" and report["weights"]["modules"] == 2  # q_proj of 2 layers
    assert report["weights"]["rounding_error_over_delta"] > 0.9
    fp32 = merge_precision.main(["--model", str(base), "--adapter", str(tmp_path / "adapter"), "--dtype", "float32"])
    assert fp32["weights"]["rounding_error_over_delta"] < 0.01  # fp32 keeps 24 bits: 1e-5 of a weight survives
    assert (tmp_path / "r.json").is_file()
    with pytest.raises(SystemExit, match="adapter_model.safetensors: not found"):
        merge_precision.main(["--model", str(base), "--adapter", str(tmp_path)])
    (tmp_path / "adapter" / "adapter_config.json").write_text("{broken")
    with pytest.raises(SystemExit, match="adapter_config.json: not a LoRA adapter config"):
        merge_precision.main(["--model", str(base), "--adapter", str(tmp_path / "adapter")])
