"""One way to turn a policy spec into a policy: scripted names, `replay:FILE`, checkpoint directories, hub ids.

    policy = build_policy("oracle")
    policy = build_policy("runs/tiny/sft", {"max_new_tokens": 128}, backend="auto")

Used by eval.py, the agent (agent.py) and every stage that plays episodes, so a spec means the same
policy everywhere. Scripted policies need no torch; checkpoints load through `nanocomposer.policy`.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from env.policies import POLICIES, get_policy, is_checkpoint_spec

SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "max_context")
BACKENDS = ("auto", "transformers", "vllm")


def is_scripted(spec: str) -> bool:
    return spec in POLICIES or spec.startswith("replay:")


def resolve_backend(backend: str) -> str:
    """The generation backend for checkpoint policies: `transformers` or `vllm`.

    `auto`: vllm when torch sees a GPU and vllm imports (a broken vllm install warns and falls back);
    `vllm` is returned as asked, and ModelPolicy fails with a one-line `BackendUnavailable` if it cannot run.
    """
    if backend not in BACKENDS:
        raise ValueError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    import importlib.util

    import torch

    if not (torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None):
        return "transformers"
    from nanocomposer.policy import BackendUnavailable, require_vllm

    try:
        require_vllm()
    except BackendUnavailable as e:
        print(f"eval.py: warning: --backend auto: {e}; generating with transformers", file=sys.stderr)
        return "transformers"
    return "vllm"


def build_policy(spec: str, sampling: dict | None = None, backend: str = "auto", start_engine: bool = True):
    """A policy from its spec; a checkpoint path that is missing or broken fails naming the path.

    `start_engine=False` (vllm only) checks everything but starts no engine: `main` validates every policy
    before running any, and a process can hold only one vLLM engine at a time.
    """
    if is_scripted(spec):
        return get_policy(spec)
    if not is_checkpoint_spec(spec):
        raise ValueError(f"policy {spec!r}: not a scripted policy ({', '.join(POLICIES)}, replay:FILE), "
                         f"a checkpoint directory or a hub id")
    from nanocomposer.policy import ModelPolicy, SamplingConfig  # lazy: scripted evals need no torch

    return ModelPolicy(spec, sampling=SamplingConfig(**{k: v for k, v in (sampling or {}).items()
                                                         if k in SAMPLING_KEYS and v is not None}),
                       backend=resolve_backend(backend), start_engine=start_engine)


def single_process_workers(workers: int, specs: list[str], backend: str) -> int:
    """`workers`, or 1 when a checkpoint policy generates with vLLM (warned about on stderr).

    Each worker process would start its own engine, each claiming the GPU memory fraction it is given, so
    they would not fit; one engine in one process serves the episodes one after another.
    """
    if workers > 1 and backend == "vllm" and any(not is_scripted(s) for s in specs):
        print(f"eval.py: warning: --workers {workers} with the vllm backend: running episodes in 1 process "
              "(each worker would start its own vLLM engine on the GPU)", file=sys.stderr)
        return 1
    return workers


def seed_policy(policy, seed: int) -> None:
    """Make an episode's sampling depend on (seed, task) only, not on which worker ran which tasks before.

    ModelPolicy derives each turn's seed from (sampling.seed, task id, episode counter, turn); the counter
    is reset so the same task with the same seed samples the same way in every run and every worker layout.
    """
    if hasattr(policy, "sampling") and hasattr(policy, "episode"):
        policy.sampling = dataclasses.replace(policy.sampling, seed=seed)
        policy.episode = -1
    elif hasattr(policy, "seed"):  # the oracle's scripted variety
        policy.seed = seed


def policy_label(spec: str) -> str:
    """How tables name a policy: a checkpoint by the last two parts of its path (`demo/sft`)."""
    if is_scripted(spec):
        return spec
    parts = Path(spec).resolve().parts
    return "/".join(parts[-2:])
