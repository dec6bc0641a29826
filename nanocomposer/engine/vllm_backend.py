"""The vLLM backend (GPU): every request of a batch in ONE `LLM.generate` call (a list of `TokensPrompt`s and a
list of per-request `SamplingParams`, each with its own seed), so the engine schedules them together; outputs
come back in request order. The engine batches one call's requests, so nothing joins a running call: callers
serve it in rounds (`can_stream()` is False; env/scheduler.py). Every decoding knob is set explicitly and the
engine runs with `logprobs_mode="processed_logprobs"` (`start_vllm`), so each result carries the log-probs of
the distribution sampled from, as the transformers backend's do.

Per-request failures: if a call raises (vLLM rejects the whole call when one prompt is invalid; a batch may
run out of memory), each of its requests is retried alone, so the exception lands on the request that caused
it and the others are served. A result without a log-prob for every token is that request's error.

vllm is a GPU-only install: this module imports it only inside the functions that need it, and
tests/test_vllm_backend.py runs this path against a fake `vllm` module on CPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from nanocomposer.engine.checkpoints import ModelLoadError
from nanocomposer.engine.sampling import Completion, Result, SamplingConfig, run_isolated

VLLM_GPU_MEMORY_ENV = "NANOCOMPOSER_VLLM_GPU_MEMORY"  # fraction of the GPU's memory the vLLM engine may take
DEFAULT_VLLM_GPU_MEMORY = 0.85
VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams rejects temperatures above this


class BackendUnavailable(RuntimeError):
    """The generation backend asked for cannot run here (vllm not installed, or failing to import)."""


def require_vllm():
    """The `vllm` module, or `BackendUnavailable` with a one-line reason (it is a GPU-only install here)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise BackendUnavailable("the vllm backend needs the vllm package, which is not installed (it runs on an "
                                 "NVIDIA GPU: pip install vllm there); use --backend transformers or auto")
    try:
        import vllm
    except Exception as e:  # a broken install (CUDA/torch mismatch) fails here, not deep inside generation
        raise BackendUnavailable(f"vllm is installed but failed to import: {type(e).__name__}: {e}") from e
    return vllm


def resolve_vllm_gpu_memory(value: float | None = None) -> float:
    """The engine's gpu_memory_utilization: `value`, else $NANOCOMPOSER_VLLM_GPU_MEMORY, else 0.85; in (0, 1]."""
    where = "ModelPolicy(vllm_gpu_memory=...)"
    if value is None:
        raw = os.environ.get(VLLM_GPU_MEMORY_ENV)
        if raw is None or not raw.strip():
            return DEFAULT_VLLM_GPU_MEMORY
        where = f"${VLLM_GPU_MEMORY_ENV}={raw!r}"
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{where}: not a number (a fraction of GPU memory, e.g. 0.85)") from None
    if not 0 < value <= 1:
        raise ValueError(f"{where}: must be a fraction of GPU memory in (0, 1], got {value}")
    return value


def start_vllm(path: Path, seed: int, max_context: int, gpu_memory: float):
    """The engine, with the settings the Completion contract depends on (see the module docstring)."""
    from vllm import LLM

    # dtype auto serves an fp32 checkpoint (what every LoRA stage saves, model_io.save_final_model) in half
    # precision (vLLM's documented rule: fp16 for fp32 models), which rounds part of a small LoRA update away again
    # (fp16 keeps 8x finer steps than bf16). float32 would be exact at twice the memory; not yet run on a GPU here.
    try:
        return LLM(model=str(path), tokenizer=str(path), dtype="auto", seed=seed, max_model_len=max_context,
                   enable_prefix_caching=True, gpu_memory_utilization=gpu_memory,
                   # the log-probs of the distribution sampled from (after temperature and top-p), which
                   # TRL's importance-sampling correction expects; vLLM's default is the raw model's
                   logprobs_mode="processed_logprobs")
    except Exception as e:  # no GPU, out of memory, an architecture vLLM lacks: name the checkpoint
        raise ModelLoadError(f"checkpoint {str(path)!r}: the vLLM engine failed to start: "
                             f"{type(e).__name__}: {e}") from e


def shutdown_vllm(llm) -> None:
    """Stop an engine so its GPU memory can be freed (the caller then drops its last reference). vLLM frees the
    GPU when its engine-core process exits: `LLM.shutdown()` where the installed vLLM has it, else the engine
    core's own `shutdown()`."""
    shutdown = getattr(llm, "shutdown", None)
    if not callable(shutdown):
        shutdown = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "shutdown", None)
    if callable(shutdown):
        shutdown()


class VLLMGenerator:
    """Batched generation with a `vllm.LLM` engine: one `LLM.generate` call per batch (module docstring).

    `engine` returns the running engine (or raises): ModelPolicy starts and closes it.
    """

    def __init__(self, engine: Callable[[], object], stop_ids: Sequence[int]):
        self.engine, self.stop_ids = engine, list(stop_ids)

    def can_stream(self) -> bool:
        return False  # the engine batches one call's requests: served in rounds

    def params(self, sampling: SamplingConfig, seed: int):
        from vllm import SamplingParams

        s = sampling
        return SamplingParams(
            max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=0, min_p=0.0,
            repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, seed=int(seed), logprobs=0,
            stop_token_ids=list(self.stop_ids),
            detokenize=False)  # the policy decodes with the HF tokenizer, special tokens kept

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int],
                 sampling: SamplingConfig) -> list[Result]:
        from vllm.inputs import TokensPrompt

        if len(prompts) != len(seeds):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
        if not prompts:
            return []
        llm = self.engine()
        requests = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        params = [self.params(sampling, seed) for seed in seeds]

        def run(indices: list[int]) -> list[Result]:
            outputs = llm.generate([requests[i] for i in indices], sampling_params=[params[i] for i in indices],
                                   use_tqdm=False)
            if len(outputs) != len(indices):
                raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(indices)} requests")
            return [_completion(output, requests[i]["prompt_token_ids"]) for output, i in zip(outputs, indices)]

        return run_isolated(run, list(range(len(prompts))))


def _completion(output, prompt_ids: list[int]) -> Result:
    """A vLLM `RequestOutput` as a Completion, or the error that makes it unusable.

    `RequestOutput.outputs[0]` is a `CompletionOutput` whose `token_ids` include the stop token that ended
    the request and whose `logprobs` (with `logprobs=0`) is one `{token_id: Logprob}` dict per position
    holding the sampled token (vllm/outputs.py, vllm/logprobs.py).
    """
    returned_prompt = getattr(output, "prompt_token_ids", None)
    if returned_prompt is not None and list(returned_prompt) != prompt_ids:
        return RuntimeError("vLLM returned an output for a different prompt (outputs out of request order)")
    completion = output.outputs[0]
    ids = [int(t) for t in completion.token_ids]
    steps = completion.logprobs
    if steps is None or len(steps) != len(ids) or any(t not in step for t, step in zip(ids, steps)):
        return RuntimeError(f"vLLM returned {len(ids)} tokens but not the log-prob of every sampled one "
                            f"({'none' if steps is None else len(steps)} positions)")
    return Completion(ids, [float(step[t].logprob) for t, step in zip(ids, steps)])
