"""Which floating-point dtype a model computes in here: `dtype: auto` in a recipe.

bf16 halves memory and, where the hardware has bf16 arithmetic, is the fastest way to train and decode. Where it
has none, PyTorch emulates bf16 with fp32 conversions around every kernel, and that is far slower than fp32
itself: on a 2-core AMD EPYC with AVX2 only, a LoRA step of SmolLM2-135M took 56 s in bf16 against 3.1 s in
fp32 (`python -m bench.finetune_modes --seq 256`, docs/log.md 2026-12-04), while on a CPU with AVX512_BF16 and
AMX the same step is faster in bf16. So `auto` asks the device, not the checkpoint:

- a CUDA device: bf16 if it supports it (`torch.cuda.is_bf16_supported()`), else fp32;
- a CPU: bf16 if its flags include `amx_bf16` or `avx512_bf16` (Linux `/proc/cpuinfo`), else fp32.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32")


@functools.cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags the kernel reports (empty where there is no /proc/cpuinfo)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether `device` has bf16 arithmetic in hardware (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})
    return False


def resolve_dtype(name: str | torch.dtype | None, device: str | torch.device = "cpu") -> torch.dtype:
    """A recipe's `dtype` as a torch dtype: None is fp32 (transformers' own default), `auto` the device's
    fastest (bf16 where native, else fp32), any other name that dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name is None:
        return torch.float32
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype {name!r}: expected one of {', '.join(DTYPE_NAMES)}")
    if name == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    return getattr(torch, name)
