"""`dtype: auto` follows the hardware: bf16 only where the device has bf16 arithmetic (nanocomposer/dtypes.py)."""

from pathlib import Path

import pytest
import torch

from nanocomposer import dtypes


def cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    return str(path)


@pytest.mark.parametrize("flags, native", [
    ("fpu sse2 avx avx2 fma", False),                       # AVX2 only: bf16 is emulated
    ("avx2 avx512f avx512bw", False),                       # AVX-512 without its bf16 extension
    ("avx2 avx512f avx512_bf16", True),
    ("avx2 amx_tile amx_bf16 amx_int8", True),
])
def test_auto_is_bf16_only_on_a_cpu_with_bf16_arithmetic(tmp_path, monkeypatch, flags, native):
    read_flags = dtypes.cpu_flags.__wrapped__  # uncached, from a file of our own
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: read_flags(cpuinfo(tmp_path, flags)))
    assert dtypes.native_bf16("cpu") is native
    assert dtypes.resolve_dtype("auto", "cpu") == (torch.bfloat16 if native else torch.float32)
    # an explicit dtype is taken as given, whatever the hardware
    assert dtypes.resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    assert dtypes.resolve_dtype("float32", "cpu") == torch.float32
    assert dtypes.resolve_dtype(None, "cpu") == torch.float32


def test_a_machine_without_cpuinfo_is_treated_as_having_no_bf16(tmp_path):
    assert dtypes.cpu_flags.__wrapped__(str(tmp_path / "missing")) == frozenset()


def test_an_unknown_dtype_name_is_refused_by_name():
    with pytest.raises(ValueError, match="dtype 'bf16'"):
        dtypes.resolve_dtype("bf16")


def test_every_smol_stage_recipe_asks_for_auto():
    import yaml

    for stage in ("cpt", "sft", "rl"):
        recipe = yaml.safe_load(Path(f"recipes/smol/{stage}.yaml").read_text())
        assert recipe["dtype"] == "auto", stage
