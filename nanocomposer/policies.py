"""One way to turn a policy spec into a policy: scripted names, `replay:FILE`, checkpoint directories, hub ids,
and prefixed kinds (KINDS: `openai:<model>@<base_url>`, an OpenAI-compatible endpoint, nanocomposer/openai_policy.py).

    policy = build_policy("oracle")
    policy = build_policy("runs/tiny/sft", {"max_new_tokens": 128}, backend="auto")
    policy = build_policy("openai:qwen2.5-coder@http://127.0.0.1:8000/v1?mode=tools", {"max_new_tokens": 512})

Used by eval.py, the agent (agent.py) and every stage that plays episodes, so a spec means the same
policy everywhere; `run_policy` plays a spec on tasks through the one runner (env.runner.run_tasks).
Scripted policies need no torch; checkpoints load through `nanocomposer.policy`.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from data.oracle import OraclePolicy
from env.policies import POLICIES, get_policy, is_checkpoint_spec

SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "max_context")
GENERATION_BACKENDS = ("transformers", "vllm")  # what generates a checkpoint's tokens (ModelPolicy, rollouts)
POLICY_BACKENDS = ("auto", *GENERATION_BACKENDS)  # what --backend accepts; resolve_backend picks for auto
# Policy kinds named by a prefix, `<prefix><rest>` -> the module serving them, which has `build(spec, sampling)`
# (a batched policy: act_batch, optionally open_stream) and `label(spec)`. They need no torch and load nothing.
KINDS = {
    "openai:": "nanocomposer.openai_policy",  # an OpenAI-compatible endpoint: openai:<model>@<base_url>
}


def warn(message: str) -> None:
    """A warning on stderr, prefixed with the running script's name (eval.py, train_sft.py's check, agent.py,
    realtime_rl.py's gate, a bench script all come through this module), or the module's own name when there
    is no script (python -c, an embedding program)."""
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    print(f"{script or __name__}: warning: {message}", file=sys.stderr)


# The scripted policies by name: the harness's (env/policies.py: gold, noop) and the oracle, a data generator
# (data/oracle.py; env/ may not import data/, so the two meet here, where every stage gets its policies).
SCRIPTED = {**POLICIES, "oracle": OraclePolicy}


def is_scripted(spec: str) -> bool:
    return spec in SCRIPTED or spec.startswith("replay:")


def scripted_policy(spec: str, **kwargs):
    """A scripted policy from its name (SCRIPTED) or `replay:FILE`; ValueError naming the choices otherwise."""
    if spec in SCRIPTED:
        return SCRIPTED[spec](**kwargs)
    return get_policy(spec, **kwargs)


def kind_module(spec: str):
    """The module serving `spec`'s prefixed kind (KINDS), or None."""
    import importlib

    for prefix, module in KINDS.items():
        if isinstance(spec, str) and spec.startswith(prefix):
            return importlib.import_module(module)
    return None


def is_remote(spec: str) -> bool:
    """A prefixed kind (KINDS): played by a service, with no checkpoint here and no torch."""
    return isinstance(spec, str) and any(spec.startswith(prefix) for prefix in KINDS)


def needs_torch(spec: str) -> bool:
    return not (is_scripted(spec) or is_remote(spec))


def resolve_backend(backend: str) -> str:
    """The generation backend for checkpoint policies: `transformers` or `vllm`.

    `auto`: vllm when torch sees a GPU and vllm imports (a broken vllm install warns and falls back);
    `vllm` is returned as asked, and ModelPolicy fails with a one-line `BackendUnavailable` if it cannot run.
    """
    if backend not in POLICY_BACKENDS:
        raise ValueError(f"--backend {backend!r}: expected one of {', '.join(POLICY_BACKENDS)}")
    if backend != "auto":
        return backend
    import importlib.util

    import torch

    if not (torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None):
        return "transformers"
    from nanocomposer.engine.vllm_backend import BackendUnavailable, require_vllm

    try:
        require_vllm()
    except BackendUnavailable as e:
        warn(f"backend auto: {e}; generating with transformers")
        return "transformers"
    return "vllm"


# One torch thread for CPU generation: the episodes' sandboxed tools need the other core (measured on 2
# cores: batched eval ~6x slower with torch's default 2 threads); ignored on a GPU.
GENERATION_CPU_THREADS = 1


def build_policy(spec: str, sampling: dict | None = None, backend: str = "auto", start_engine: bool = True):
    """A policy from its spec; a checkpoint path that is missing or broken fails naming the path.

    `start_engine=False` (vllm only) checks everything but starts no engine: `main` validates every policy
    before running any, and a process can hold only one vLLM engine at a time.
    """
    if is_scripted(spec):
        return scripted_policy(spec)
    if (kind := kind_module(spec)) is not None:
        return kind.build(spec, sampling)
    if not is_checkpoint_spec(spec):
        raise ValueError(f"policy {spec!r}: not a scripted policy ({', '.join(SCRIPTED)}, replay:FILE), "
                         f"a checkpoint directory or a hub id (or {' / '.join(k + '...' for k in KINDS)})")
    from nanocomposer.policy import ModelPolicy, SamplingConfig  # lazy: scripted evals need no torch

    return ModelPolicy(spec, sampling=SamplingConfig(**{k: v for k, v in (sampling or {}).items()
                                                         if k in SAMPLING_KEYS and v is not None}),
                       backend=resolve_backend(backend), start_engine=start_engine,
                       cpu_threads=GENERATION_CPU_THREADS)


def episode_concurrency(workers: int, policy, spec: str) -> int:
    """How many episodes may be live at once with `policy`: `workers`, or 1 for a checkpoint policy that
    cannot batch (one instance holds per-episode state, and a second would load the model, or start a vLLM
    engine, again); warned about on stderr."""
    if workers > 1 and not is_scripted(spec) and not callable(getattr(policy, "act_batch", None)):
        warn(f"{workers} workers with {spec!r}, which cannot batch generation: running episodes in 1 process, "
             "one at a time")
        return 1
    return workers


def run_policy(spec: str, tasks: list, config, sampling: dict | None = None, *, samples: int = 1,
               workers: int = 1, backend: str = "auto", results_path=None, resume: bool = False,
               progress: bool = True, token_ids: bool = False, processes: int = 1) -> tuple[list[dict], float, int]:
    """(records, wall seconds, concurrency used): `spec` played on `tasks` (Tasks, directories or
    env.runner.TaskRef) `samples` times each, through env.runner.run_tasks (seeds seed..seed+samples-1).

    Scripted specs get a fresh instance per live episode; a checkpoint is loaded once and shared (batched
    when it has `act_batch`), and closed afterwards (a vLLM engine holds the GPU until then). `processes > 1`
    plays the episodes in that many worker processes, each with its own instance (a checkpoint loaded once per
    process, `workers` split between them): on a CPU, generation then runs on that many cores. A vLLM engine
    wants the whole GPU, so with the vllm backend the episodes stay in this process (warned about).
    """
    import functools
    import time

    from env.runner import run_tasks

    sampling = dict(sampling or {})
    seed = int(sampling.pop("seed", 0) or 0)
    scripted = is_scripted(spec)
    if needs_torch(spec) and processes > 1 and resolve_backend(backend) == "vllm":
        warn(f"{processes} processes with the vllm backend: one engine serves every episode, in 1 process")
        processes = 1
    policy = None
    if scripted:
        make_policy = functools.partial(build_policy, spec)
        workers = max(1, workers)
    elif processes > 1:  # each worker process loads the checkpoint (eval.py has checked that it loads)
        make_policy = functools.partial(build_policy, spec, sampling, backend)
    else:
        policy = build_policy(spec, sampling, backend)
        workers = episode_concurrency(workers, policy, spec)
        make_policy = functools.partial(_same, policy)
    t0 = time.perf_counter()
    try:
        records = run_tasks(tasks, make_policy, config, samples=samples, seed=seed, concurrency=workers,
                            results_path=results_path, resume=resume, progress=progress, seed_policy=seed_policy,
                            token_ids=token_ids, desc=f"eval {policy_label(spec)}", processes=processes,
                            run_facts={"policy": spec, "backend": None if scripted else backend,
                                       "sampling": None if scripted else sampling})
    finally:
        if policy is not None and hasattr(policy, "close"):
            policy.close()
    return records, time.perf_counter() - t0, workers


def _same(policy):
    return policy


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
    if (kind := kind_module(spec)) is not None:
        return kind.label(spec)
    parts = Path(spec).resolve().parts
    return "/".join(parts[-2:])
