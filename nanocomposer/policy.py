"""A `from_pretrained` checkpoint acting as a policy in the agent harness (`env.episode.run_episode`).

    policy = ModelPolicy("runs/tiny/sft")                      # a saved model directory
    policy = ModelPolicy("runs/tiny/sft-lora")                 # a PEFT adapter directory (base + adapter)
    policy = ModelPolicy(model, tokenizer, SamplingConfig(temperature=1.0, seed=3))   # RL: the live model
    policy = ModelPolicy("runs/gpu/sft", backend="vllm")       # GPU: generation by a vLLM engine
    trajectory = run_episode(task, policy, EpisodeConfig())

Each `act` renders the conversation with the tokenizer's chat template (tools included), generates
one assistant turn, and returns a `Generation` carrying exactly what RL needs: the prompt ids, the
completion ids (with the stop token when one was generated) and the log-probability of every
completion token under the distribution it was drawn from.

`act_batch(requests)` serves many episodes at once (env.runner sends every live episode's pending turn):
one `TurnRequest` per episode in, one `Generation` (or the exception that request met, e.g.
`ContextOverflow`) per request out, in order, generated together by one batched backend call
(nanocomposer/generation.py). It keeps no per-episode state: a request's seed comes from its
`episode_key` and `turn`. `act` is `act_batch` of one request built from `reset`'s state, so both paths
share one implementation and the same seeds. `open_stream()` (transformers backend) gives the runner the same
turns by continuous batching (`PolicyStream`): each request joins the running batch when its episode asks
and its Generation returns the step its sequence stops, rendered, seeded and built as `act_batch` does.

Choices, and why:
- Text is decoded from the completion ids minus the final stop token, with special tokens KEPT.
  The harness stores that text as the assistant message's `content`, and the chat template renders
  it verbatim followed by `<|im_end|>`, so the next prompt shows the model what it wrote. The tool
  tags are added-but-not-special tokens in our tokenizer, so they survive either way; checkpoints
  whose tokenizer marks them special (Qwen2.5 does) keep them too because nothing is skipped.
- Logprobs are TRL's and vLLM's `processed_logprobs`: log-softmax of the scores after temperature and
  top-p (the distribution the token was sampled from; greedy: the raw model distribution). TRL's
  importance-sampling correction expects exactly these.
- Decoding is set by `SamplingConfig` alone: the transformers backend is our own decode loop (temperature
  and top-p, nothing else), so no `top_k`, `repetition_penalty` or `suppress_tokens` saved by some training
  stage in a generation_config can change eval silently; a loaded checkpoint's generation_config is also
  reduced to its stop/pad ids. The vLLM backend passes every knob explicitly.
- Sampling is reproducible: each turn draws from its own seed, `_stable_seed(seed, episode_key, turn)`,
  where `act` uses the episode key f"{task id}#{episode number of this policy object}" (so G rollouts of
  one task through one policy differ); a batched request draws from its own `torch.Generator`, so it samples
  the same tokens whatever else shares its batch (up to floating point: generation.py), and the caller's
  global RNG (the RL trainer's) is untouched.
- Context: a prompt longer than `max_context - max_new_tokens` raises `ContextOverflow` (see there).
- `backend="vllm"` (GPU): the checkpoint directory is loaded by `vllm.LLM` (vLLM's own copy of the weights,
  never torch's; the HF tokenizer still renders and decodes), and each `act_batch` is one token-in/token-out
  `LLM.generate` call holding every request, each with its own seed, with
  `logprobs_mode="processed_logprobs"`, so the Generation contract above holds unchanged. vLLM needs a
  merged model: a PEFT adapter directory is refused with the merge to run. Engine memory:
  `NANOCOMPOSER_VLLM_GPU_MEMORY` (fraction, default 0.85). The per-turn seed makes samples repeatable up to
  GPU numerics (vLLM does not promise bitwise-equal logits across batch shapes or prefix-cache hits), and
  they are not the transformers backend's samples. This path is tested against a fake `vllm` module on CPU
  (tests/test_vllm_backend.py); it has not yet run on a GPU (runs/gpu_check.sh is the prepared check).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import threading
import time
from pathlib import Path

import torch

from env.episode import Generation, TurnRequest
from nanocomposer.dtypes import native_bf16
from nanocomposer.generation import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_PREFIX_CACHE_POSITIONS,
    Completion,
    SamplingConfig,
    TransformersGenerator,
    VLLMGenerator,
)
from nanocomposer.policies import GENERATION_BACKENDS
from nanocomposer.smeared_llama import MODEL_TYPE as SMEARED_MODEL_TYPE

MESSAGE_KEYS = ("role", "content", "name", "tool_calls")  # what the chat template reads
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
VLLM_GPU_MEMORY_ENV = "NANOCOMPOSER_VLLM_GPU_MEMORY"  # fraction of the GPU's memory the vLLM engine may take
DEFAULT_VLLM_GPU_MEMORY = 0.85
VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams rejects temperatures above this
# transformers' from_pretrained is not thread-safe: two threads loading at once (the agent server's workers after a
# promotion) both came back without the tied lm_head, in every try. One load at a time per process.
_LOAD_LOCK = threading.Lock()


class ModelLoadError(RuntimeError):
    """A checkpoint that cannot be used; the message names the path and what is wrong with it."""


class BackendUnavailable(RuntimeError):
    """The generation backend asked for cannot run here (vllm not installed, or failing to import)."""


class ContextOverflow(RuntimeError):
    """The conversation no longer fits: prompt tokens + max_new_tokens > max_context.

    Raised instead of returning an empty, truncated `Generation` because that would record a fake
    assistant turn (zero completion tokens for RL to train on, and an eval exit status of
    `no_tool_call` that blames the model for something the harness budget did). Raising ends the
    episode at a clean turn boundary: every recorded turn is a real generation, the workspace is
    graded as it stands, and the exit reason is named. `exit_status` is the name the episode loop
    should record (today it records `policy_error` with this message).
    """

    exit_status = "max_context"

    def __init__(self, prompt_tokens: int, max_new_tokens: int, max_context: int):
        self.prompt_tokens, self.max_new_tokens, self.max_context = prompt_tokens, max_new_tokens, max_context
        super().__init__(f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} exceeds the "
                         f"context of {max_context} tokens")


# --------------------------------------------------------------------------- loading


def is_model_dir(path) -> bool:
    """Whether `path` is a directory that claims to be a checkpoint (config.json or adapter_config.json).

    Cheap (no loading): for routing a policy spec. Whether it actually loads is `load_model_and_tokenizer`'s
    business, which says what is wrong when it does not.
    """
    try:
        p = Path(path)
        return p.is_dir() and ((p / "config.json").is_file() or (p / "adapter_config.json").is_file())
    except (TypeError, OSError):
        return False


def _read_json(file: Path, where: str) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{where}: {file.name} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{where}: {file.name} must hold a JSON object, got {type(data).__name__}")
    return data


def _check_model_dir(path: Path) -> None:
    """The files a full-model checkpoint needs, checked before transformers gives a vaguer error."""
    where = f"checkpoint {str(path)!r}"
    if not (path / "config.json").is_file():
        stages = sorted(p.name for p in path.iterdir() if is_model_dir(p))
        hint = f" (model directories inside it: {', '.join(stages[:8])})" if stages else ""
        raise ModelLoadError(f"{where}: no config.json, so not a from_pretrained directory{hint}")
    config = _read_json(path / "config.json", where)
    if not isinstance(config.get("model_type"), str):
        raise ModelLoadError(f"{where}: config.json has no 'model_type' (keys: {sorted(config)[:10]})")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ModelLoadError(f"{where}: config.json but no weights (expected one of {', '.join(WEIGHT_FILES)})")


def _check_tokenizer_dir(path: Path, where: str) -> None:
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(f"{where}: no tokenizer (expected {' or '.join(TOKENIZER_FILES)} in {str(path)!r})")


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_weights(path: Path, where: str, device: str):
    from transformers import AutoModelForCausalLM

    try:
        # The checkpoint's own dtype, except a bf16/fp16 one on a CPU without bf16 arithmetic, where emulated
        # half precision decodes many times slower than fp32 (nanocomposer.dtypes): upcast, which loses nothing.
        dtype = "auto" if str(device).startswith("cuda") or native_bf16(device) else torch.float32
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype=dtype)
    except Exception as e:  # corrupt safetensors, unknown architecture, shape errors: all name the path
        raise ModelLoadError(f"{where}: weights failed to load: {type(e).__name__}: {e}") from e
    # transformers initialises missing weights at random and only logs it: an eval of that is garbage.
    missing, mismatched = sorted(info.get("missing_keys", ())), list(info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise ModelLoadError(f"{where}: incomplete weights: missing {missing[:5]}{' ...' if len(missing) > 5 else ''}"
                             f"{f', shape mismatches {mismatched[:3]}' if mismatched else ''}")
    return model.to(device)


def _adapter_base(path: Path, where: str) -> Path:
    """The base model directory of a PEFT adapter directory, checked."""
    config = _read_json(path / "adapter_config.json", where)
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ModelLoadError(f"{where}: adapter_config.json has no 'base_model_name_or_path'")
    if not any((path / f).is_file() for f in ADAPTER_WEIGHT_FILES):
        raise ModelLoadError(f"{where}: adapter_config.json but no adapter weights "
                             f"(expected {' or '.join(ADAPTER_WEIGHT_FILES)})")
    # Relative bases are tried against the adapter directory first, then the working directory.
    base_path = path / base if not Path(base).is_absolute() and (path / base).exists() else Path(base)
    if not is_model_dir(base_path):
        raise ModelLoadError(f"{where}: its base model {base!r} is not a local checkpoint directory")
    _check_model_dir(base_path)
    return base_path


def _load_adapter(path: Path, base_path: Path, where: str, device: str):
    """Base model + PEFT adapter, merged: this is an inference copy (RL passes the live model instead).

    Equivalent to peft's AutoPeftModelForCausalLM, but the base goes through `_load_weights`, so a
    broken base is reported (and missing tensors caught) like any other checkpoint.
    """
    try:
        from peft import PeftModel
    except ImportError as e:
        raise ModelLoadError(f"{where}: is a PEFT adapter but peft is not installed") from e
    base_model = _load_weights(base_path, f"base model {str(base_path)!r} of adapter {str(path)!r}", device)
    try:
        model = PeftModel.from_pretrained(base_model, path)
    except Exception as e:
        raise ModelLoadError(f"{where}: adapter failed to load onto {str(base_path)!r}: {type(e).__name__}: {e}") from e
    return model.merge_and_unload()


def resolve_checkpoint(spec) -> Path:
    """A local path as is; a hub id (`Qwen/Qwen2.5-Coder-1.5B-Instruct`) -> its snapshot directory.

    The snapshot comes from the HF cache (or the hub where reachable and HF_HUB_OFFLINE is unset),
    so a hub model then goes through exactly the same checks as a local checkpoint.
    """
    from env.policies import is_checkpoint_spec

    path = Path(spec)
    if path.exists() or not is_checkpoint_spec(str(spec)):
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(spec)))
    except Exception as e:
        raise ModelLoadError(f"checkpoint {str(spec)!r}: not a local directory, and not loadable as a hub id "
                             f"({type(e).__name__}: {e})") from e


def _locate_checkpoint(path) -> tuple[Path, str, Path | None, Path]:
    """(checkpoint dir, how errors name it, base model dir of an adapter or None, tokenizer dir), all checked
    short of loading weights; the shared first half of both loaders below."""
    path = resolve_checkpoint(path)
    where = f"checkpoint {str(path)!r}"
    if not path.exists():
        raise ModelLoadError(f"{where}: no such file or directory")
    if not path.is_dir():
        raise ModelLoadError(f"{where}: not a directory (a from_pretrained checkpoint is a directory)")
    if (path / "adapter_config.json").is_file():
        base_path = _adapter_base(path, where)
        tokenizer_dir = path if any((path / f).is_file() for f in TOKENIZER_FILES) else base_path
    else:
        _check_model_dir(path)
        base_path, tokenizer_dir = None, path
    _check_tokenizer_dir(tokenizer_dir, where)  # before the (slower) weights
    return path, where, base_path, tokenizer_dir


def _load_tokenizer(tokenizer_dir: Path, where: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except Exception as e:
        raise ModelLoadError(f"{where}: tokenizer in {str(tokenizer_dir)!r} failed to load: {type(e).__name__}: {e}") from e
    _check_tokenizer(tokenizer, where)
    return tokenizer


def load_model_and_tokenizer(path, device: str | None = None):
    """(model in eval mode on `device`, tokenizer) from a saved model directory or a PEFT adapter directory.

    Raises `ModelLoadError` naming the path for: a missing path, a directory without config.json
    (or adapter_config.json), config.json that is not JSON or has no model_type, no weight files,
    weights that fail to load (truncated/corrupt safetensors) or leave parameters uninitialised, no
    tokenizer, or a tokenizer without a chat template or EOS token. An adapter's tokenizer is taken
    from the adapter directory when it has one, else from the base model's.
    """
    path, where, base_path, tokenizer_dir = _locate_checkpoint(path)
    device = device or _default_device()
    with _LOAD_LOCK:
        if base_path is not None:
            model = _load_adapter(path, base_path, where, device)
        else:
            model = _load_weights(path, where, device)
        tokenizer = _load_tokenizer(tokenizer_dir, where)
    _keep_only_stop_ids(model)
    return model.eval(), tokenizer


def load_config_and_tokenizer(path) -> tuple[Path, object, list[int], object]:
    """(checkpoint dir, model config, the eos ids its generation config stops on, tokenizer), no weights loaded.

    For the vLLM backend, which loads the weights itself: the same checks as `load_model_and_tokenizer`
    except the weights' contents (vLLM reports those). A PEFT adapter directory is refused: vLLM serves a
    merged model, and merging here would mean loading the base with torch, the cost this path avoids.
    """
    from transformers import AutoConfig, GenerationConfig

    path, where, base_path, tokenizer_dir = _locate_checkpoint(path)
    if base_path is not None:
        raise ModelLoadError(
            f"{where}: is a PEFT adapter directory (base {str(base_path)!r}); the vllm backend needs a merged "
            f"model. Merge it once: peft.AutoPeftModelForCausalLM.from_pretrained({str(path)!r})"
            ".merge_and_unload().save_pretrained(OUT), save the tokenizer into OUT, and evaluate OUT; or use "
            "--backend transformers, which merges in memory")
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:
        raise ModelLoadError(f"{where}: config.json failed to load: {type(e).__name__}: {e}") from e
    # What transformers' generate would stop on: generation_config.json, else the model config (as from_pretrained).
    if (path / "generation_config.json").is_file():
        try:
            generation_config = GenerationConfig.from_pretrained(path)
        except Exception as e:
            raise ModelLoadError(f"{where}: generation_config.json failed to load: {type(e).__name__}: {e}") from e
    else:
        generation_config = GenerationConfig.from_model_config(config)
    return path, config, _as_id_list(generation_config.eos_token_id), _load_tokenizer(tokenizer_dir, where)


def _as_id_list(ids) -> list[int]:
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)


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


def _keep_only_stop_ids(model) -> None:
    """Drop every decoding knob a training stage may have saved; keep the token ids generation needs."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=saved.eos_token_id, pad_token_id=saved.pad_token_id,
                                               bos_token_id=saved.bos_token_id)


def _check_tokenizer(tokenizer, where: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"{where}: the tokenizer has no chat_template (needed to render tool-calling turns)")
    if tokenizer.eos_token_id is None:
        raise ModelLoadError(f"{where}: the tokenizer has no eos_token (generation would never stop)")


# --------------------------------------------------------------------------- policy


END_OF_TURN = "<|im_end|>"  # the chat template's end of turn (ChatML: ours, Qwen's)


def stop_token_ids(tokenizer, configured_eos: list[int] = ()) -> list[int]:
    """What a turn stops on: the tokenizer's EOS, the template's end of turn `<|im_end|>` where the vocabulary
    has it, and the generation config's EOS ids. A base or CPT checkpoint of a Hub model has `<|endoftext|>`
    as its only EOS; without `<|im_end|>` its turns would run to the token limit and invent further turns."""
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN) if END_OF_TURN in tokenizer.get_vocab() else None
    return list(dict.fromkeys(i for i in [tokenizer.eos_token_id, end_of_turn, *configured_eos] if i is not None))


def ensure_tool_template(tokenizer, where: str):
    """`tokenizer`, with the project's chat template (env/chat_template.jinja) when its own ignores
    `tools` (nanocomposer.model.template_renders_tools; one printed line): the harness must show the model
    its tool list. A tokenizer without ChatML's tokens cannot use that template: ModelLoadError, one line."""
    from env.protocol import load_chat_template
    from nanocomposer.model import IM_START, template_renders_tools

    if template_renders_tools(tokenizer):
        return tokenizer
    vocab = tokenizer.get_vocab()
    if IM_START not in vocab or END_OF_TURN not in vocab:
        raise ModelLoadError(f"{where}: its chat template does not show the model the tool list, and its tokenizer "
                             f"has no {IM_START}/{END_OF_TURN} for the project's template to fall back on")
    print(f"[policy] {where}: its chat template ignores `tools`; using the project's (env/chat_template.jinja)",
          flush=True)
    tokenizer.chat_template = load_chat_template()
    return tokenizer


def _stable_seed(*parts) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class ModelPolicy:
    """A causal LM writing the assistant turns of an episode (the harness's `Policy` protocol).

    `path_or_model` is a checkpoint directory (full model or PEFT adapter, loaded here, in eval mode) or
    an already-loaded model, in which case `tokenizer` is required and the model is used where it is
    (not moved, not copied: RL generates with the weights it is training; its train/eval mode is
    restored after each turn).

    `backend="vllm"` takes a checkpoint directory only (vLLM loads its own copy of the weights): `self.model`
    is None and `self.llm` is the `vllm.LLM` engine, started here unless `start_engine=False`, which runs every
    check (vllm importable, checkpoint, tokenizer, context, temperature) without taking the GPU; eval.py uses it
    to validate all policies before running any, since one process can hold only one engine. `close()` releases
    the engine. `vllm_gpu_memory` overrides $NANOCOMPOSER_VLLM_GPU_MEMORY (see `resolve_vllm_gpu_memory`).
    `max_batch_tokens` bounds one transformers batch (rows x (longest prompt + max_new_tokens)); larger
    `act_batch` calls are split into several batches (nanocomposer/generation.py).
    `prefix_cache_positions`: KV positions the transformers backend keeps so an episode's next turn is prefilled
    only past the conversation it already saw (`PrefixCache`); default DEFAULT_PREFIX_CACHE_POSITIONS for a
    model loaded here, 0 (off) for a borrowed one, whose weights may change between calls (RL's RolloutPolicy
    turns it on and clears it after each rollout).

    Subclasses change how tokens are produced by overriding `_generate_batch(prompts, seeds)` (all requests of
    an `act_batch`) or `_generate(prompt_ids, seed)` (one sequence; then `act_batch` calls it per request).
    """

    def __init__(self, path_or_model, tokenizer=None, sampling: SamplingConfig | None = None,
                 device: str | None = None, *, backend: str = "transformers", name: str | None = None,
                 start_engine: bool = True, vllm_gpu_memory: float | None = None,
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, cpu_threads: int | None = None,
                 prefix_cache_positions: int | None = None):
        if backend not in GENERATION_BACKENDS:
            raise ValueError(f"ModelPolicy backend {backend!r} is not implemented "
                             f"(available: {', '.join(GENERATION_BACKENDS)})")
        self.backend = backend
        self.sampling = sampling or SamplingConfig()
        self.llm = None
        configured_eos: list[int] = []
        if backend == "vllm":
            if not isinstance(path_or_model, (str, Path)):
                raise ValueError(f"ModelPolicy(backend='vllm'): give a checkpoint directory, not a "
                                 f"{type(path_or_model).__name__}: vLLM loads its own copy of the weights")
            if self.sampling.temperature > VLLM_MAX_TEMPERATURE:
                raise ValueError(f"ModelPolicy(backend='vllm'): temperature {self.sampling.temperature} is above "
                                 f"vLLM's limit of {VLLM_MAX_TEMPERATURE}")
            gpu_memory = resolve_vllm_gpu_memory(vllm_gpu_memory)
            require_vllm()
            path, config, configured_eos, loaded_tokenizer = load_config_and_tokenizer(path_or_model)
            if getattr(config, "model_type", None) == SMEARED_MODEL_TYPE:
                raise ModelLoadError(f"checkpoint {str(path)!r}: vLLM has no {SMEARED_MODEL_TYPE} architecture "
                                     "(smeared keys, nanocomposer.smeared_llama); use backend='transformers'")
            self.model, self.device, self.owns_model = None, None, True
            self.name = name or str(path_or_model)
        elif isinstance(path_or_model, (str, Path)):
            self.model, loaded_tokenizer = load_model_and_tokenizer(path_or_model, device)
            self.owns_model = True
            self.name = name or str(path_or_model)
        else:
            if tokenizer is None:
                raise ValueError("ModelPolicy(model): pass the tokenizer too when giving an already-loaded model")
            _check_tokenizer(tokenizer, f"tokenizer of {type(path_or_model).__name__}")
            self.model, loaded_tokenizer = path_or_model, tokenizer
            if device is not None:
                self.model.to(device)
            self.owns_model = False
            self.name = name or f"model:{getattr(self.model.config, '_name_or_path', '') or type(self.model).__name__}"
        if tokenizer is not None and self.owns_model:
            _check_tokenizer(tokenizer, f"tokenizer given for {str(path_or_model)!r}")
        self.tokenizer = tokenizer or loaded_tokenizer
        if self.model is not None:
            self.device = next(self.model.parameters()).device
            config = self.model.config
            configured_eos = _as_id_list(self.model.generation_config.eos_token_id)
        self.max_context = self.sampling.max_context or getattr(config, "max_position_embeddings", None)
        if not self.max_context:
            raise ValueError(f"ModelPolicy: {type(config).__name__} has no max_position_embeddings; "
                             "set SamplingConfig.max_context")
        if self.max_context <= self.sampling.max_new_tokens:
            raise ValueError(f"ModelPolicy: max_context {self.max_context} leaves no room for a prompt with "
                             f"max_new_tokens={self.sampling.max_new_tokens}")
        self.tokenizer = ensure_tool_template(self.tokenizer, self.name)
        self.stop_ids = stop_token_ids(self.tokenizer, configured_eos)
        self.episode = -1
        self.task_id = ""
        self.turn = 0
        self.stats = {"turns": 0, "prompt_tokens": 0, "completion_tokens": 0, "gen_s": 0.0}
        # torch's CPU threads while generating (restored after): on a 2-core machine the runner's sandboxed
        # tools run beside generation, and 2 torch threads fighting them measured ~6x slower than 1.
        self.cpu_threads = cpu_threads
        if backend == "vllm":
            self.generator = VLLMGenerator(self._running_engine, self.stop_ids)
            if start_engine:
                self.llm = self._start_vllm(path, gpu_memory)
        else:
            if prefix_cache_positions is None:
                prefix_cache_positions = DEFAULT_PREFIX_CACHE_POSITIONS if self.owns_model else 0
            self.generator = TransformersGenerator(self.model, self.stop_ids, borrowed=not self.owns_model,
                                                   max_batch_tokens=max_batch_tokens,
                                                   prefix_cache_positions=prefix_cache_positions)

    def _start_vllm(self, path: Path, gpu_memory: float):
        """The engine, with the settings the Generation contract depends on (see the module docstring)."""
        from vllm import LLM

        try:
            return LLM(model=str(path), tokenizer=str(path), dtype="auto", seed=self.sampling.seed,
                       max_model_len=self.max_context, enable_prefix_caching=True,
                       gpu_memory_utilization=gpu_memory,
                       # the log-probs of the distribution sampled from (after temperature and top-p), which
                       # TRL's importance-sampling correction expects; vLLM's default is the raw model's
                       logprobs_mode="processed_logprobs")
        except Exception as e:  # no GPU, out of memory, an architecture vLLM lacks: name the checkpoint
            raise ModelLoadError(f"checkpoint {str(path)!r}: the vLLM engine failed to start: "
                                 f"{type(e).__name__}: {e}") from e

    def _running_engine(self):
        if self.llm is None:
            raise RuntimeError(f"ModelPolicy {self.name!r}: the vLLM engine is not running "
                               "(built with start_engine=False, or closed)")
        return self.llm

    def close(self) -> None:
        """Release the vLLM engine and its GPU memory (no-op for transformers), so another engine can start.

        vLLM frees the GPU when its engine-core process exits: `LLM.shutdown()` where the installed vLLM has
        it, else the engine core's own `shutdown()`; then the last reference is dropped.
        """
        llm, self.llm = self.llm, None
        if llm is None:
            return
        shutdown = getattr(llm, "shutdown", None)
        if not callable(shutdown):
            shutdown = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm, shutdown
        gc.collect()

    def reset(self, task) -> None:
        self.episode += 1
        self.task_id = getattr(task, "id", str(task))
        self.turn = 0

    def render(self, messages: list[dict], tools: list[dict]) -> list[int]:
        """Prompt token ids: the conversation so far plus the assistant header."""
        clean = [{k: m[k] for k in MESSAGE_KEYS if k in m} for m in messages]
        ids = self.tokenizer.apply_chat_template(clean, tools=tools or None, add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
        return list(ids)

    def act(self, messages: list[dict], tools: list[dict]) -> Generation:
        """The next turn of the episode `reset` started: `act_batch` of that one request (raising its error)."""
        request = TurnRequest(messages, tools, f"{self.task_id}#{self.episode}", self.turn)
        self.turn += 1
        (result,) = self.act_batch([request])
        if isinstance(result, BaseException):
            raise result
        return result

    def prompt_ids(self, request: TurnRequest) -> list[int]:
        """`request` rendered, checked to leave room for max_new_tokens in the context (ContextOverflow)."""
        return self.fits_context(self.render(request.messages, request.tools))

    def fits_context(self, prompt_ids: list[int]) -> list[int]:
        if len(prompt_ids) + self.sampling.max_new_tokens > self.max_context:
            raise ContextOverflow(len(prompt_ids), self.sampling.max_new_tokens, self.max_context)
        return prompt_ids

    def turn_done(self, request: TurnRequest, result: Generation | BaseException) -> None:
        """Called once per request with what it got, by `act_batch` and by the stream (a subclass that keeps
        per-episode state, RL's RolloutPolicy, updates it here)."""

    def seed_of(self, request: TurnRequest) -> int:
        return _stable_seed(self.sampling.seed, request.episode_key, request.turn)

    def act_batch(self, requests: list[TurnRequest]) -> list[Generation | BaseException]:
        """One Generation per request, in order, generated together; a request that cannot be served (its
        prompt overflows the context, its conversation does not render, its generation failed) gets the
        exception instead, and the others are still served."""
        results: list[Generation | BaseException | None] = [None] * len(requests)
        prompts: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            try:
                prompts[i] = self.prompt_ids(request)
            except Exception as e:  # noqa: BLE001  (this request's failure, not the batch's)
                results[i] = e
        order = list(prompts)
        seeds = [self.seed_of(requests[i]) for i in order]
        with self._generating():
            outputs = self._generate_batch([prompts[i] for i in order], seeds) if order else []
        for i, output in zip(order, outputs, strict=True):
            results[i] = output if isinstance(output, BaseException) else self._generation(prompts[i], *output)
        for request, result in zip(requests, results, strict=True):
            self.turn_done(request, result)
        return results

    @contextlib.contextmanager
    def _generating(self):
        """Generation time into stats, with torch's CPU threads set to `cpu_threads` meanwhile."""
        t0 = time.perf_counter()
        threads = torch.get_num_threads()
        if self.cpu_threads and self.device is not None and self.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            self.stats["gen_s"] += time.perf_counter() - t0

    def open_stream(self) -> PolicyStream | None:
        """Continuous batching for env.runner (`PolicyStream`), or None where this policy cannot stream: vLLM
        (its engine batches one call's requests), a subclass that batches or generates its own way (RL's
        VLLMRolloutPolicy), a model whose cache is not plain full attention."""
        if (self.backend != "transformers" or type(self).act_batch is not ModelPolicy.act_batch
                or type(self)._generate_batch is not ModelPolicy._generate_batch
                or type(self)._generate is not ModelPolicy._generate or not self.generator.can_stream()):
            return None
        return PolicyStream(self)

    def _generation(self, prompt_ids: list[int], completion_ids: list[int], logprobs: list[float]) -> Generation:
        self.stats["turns"] += 1
        self.stats["prompt_tokens"] += len(prompt_ids)
        self.stats["completion_tokens"] += len(completion_ids)
        stopped = bool(completion_ids) and completion_ids[-1] in self.stop_ids
        body = completion_ids[:-1] if stopped else completion_ids
        text = self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return Generation(text=text, prompt_ids=prompt_ids, completion_ids=completion_ids, logprobs=logprobs,
                          truncated=not stopped)

    def _generate_batch(self, prompts: list[list[int]], seeds: list[int]) -> list[Completion | BaseException]:
        """(completion ids, logprobs) or the error, per prompt: one batched backend call, unless a subclass
        generates one sequence at a time (it overrides `_generate`)."""
        if type(self)._generate is not ModelPolicy._generate:
            results: list[Completion | BaseException] = []
            for prompt_ids, seed in zip(prompts, seeds, strict=True):
                try:
                    results.append(Completion(*self._generate(prompt_ids, seed)))
                except Exception as e:  # noqa: BLE001  (this request's failure)
                    results.append(e)
            return results
        return self.generator.generate(prompts, seeds, self.sampling)

    def _generate(self, prompt_ids: list[int], seed: int) -> tuple[list[int], list[float]]:
        """One sequence through the batched backend (the seam a one-at-a-time subclass overrides)."""
        (result,) = self.generator.generate([prompt_ids], [seed], self.sampling)
        if isinstance(result, BaseException):
            raise result
        return result


class PolicyStream:
    """A ModelPolicy's turns through a `DecodeStream` (continuous batching), for env.runner: a request joins the
    running batch when its episode asks, and its Generation comes back as soon as its sequence stops, while
    the other sequences decode on. Each turn is rendered, seeded and turned into a Generation exactly as
    `act_batch` does, so a request gets what `act_batch` would give it (up to the floating-point differences
    of other batch shapes)."""

    def __init__(self, policy: ModelPolicy):
        self.policy = policy
        self.stream = policy.generator.stream(policy.sampling)
        self.pending: dict[object, tuple[TurnRequest, list[int]]] = {}

    def __len__(self) -> int:
        return len(self.stream)

    def add(self, key, request: TurnRequest) -> BaseException | None:
        """Queue `request` under `key`; the exception instead when it cannot be served (it does not render, or
        overflows the context)."""
        try:
            prompt_ids = self.policy.prompt_ids(request)
        except Exception as e:  # noqa: BLE001  (this request's failure)
            self.policy.turn_done(request, e)
            return e
        self.pending[key] = request, prompt_ids
        self.stream.add(key, prompt_ids, self.policy.seed_of(request))
        return None

    def step(self, max_steps: int | None = None) -> list[tuple[object, Generation | BaseException]]:
        """Decode until at least one queued or running request finishes, or for `max_steps` tokens; (key,
        Generation or error) of each finished one."""
        with self.policy._generating():
            finished = self.stream.step(max_steps)
        out = []
        for key, result in finished:
            request, prompt_ids = self.pending.pop(key)
            if not isinstance(result, BaseException):
                result = self.policy._generation(prompt_ids, *result)
            self.policy.turn_done(request, result)
            out.append((key, result))
        return out

