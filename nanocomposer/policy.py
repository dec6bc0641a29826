"""A `from_pretrained` checkpoint acting as a policy in the agent harness (`env.episode.run_episode`).

The policy renders, seeds and decodes; loading is nanocomposer/engine/checkpoints.py's and generation the
engine's (nanocomposer/engine/: `TransformersGenerator` or `VLLMGenerator`, in `self.generator`).

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
(`generator.generate`). It keeps no per-episode state: a request's seed comes from its
`episode_key` and `turn`. `act` is `act_batch` of one request built from `reset`'s state, so both paths
share one implementation and the same seeds. `open_stream()` (where the generator can stream: transformers)
gives the runner the same turns by continuous batching (`PolicyStream`): each request joins the running batch when its episode asks
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
  the same tokens whatever else shares its batch (up to floating point: nanocomposer/engine/), and the
  caller's global RNG (the RL trainer's) is untouched.
- Context: a prompt longer than `max_context - max_new_tokens` raises `ContextOverflow` (see there).
- `backend="vllm"` (GPU): the checkpoint directory is loaded by `vllm.LLM` (vLLM's own copy of the weights,
  never torch's; the HF tokenizer still renders and decodes), and each `act_batch` is one token-in/token-out
  `LLM.generate` call (nanocomposer/engine/vllm_backend.py), so the Generation contract above holds unchanged.
  vLLM needs a merged model: a PEFT adapter directory is refused with the merge to run. Engine memory:
  `NANOCOMPOSER_VLLM_GPU_MEMORY` (fraction, default 0.85). Samples are repeatable up to GPU numerics, and
  they are not the transformers backend's samples. Tested against a fake `vllm` module on CPU
  (tests/test_vllm_backend.py); it has not yet run on a GPU (runs/gpu_check.sh is the prepared check).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import time
from pathlib import Path

import torch

from env.episode import Generation, TurnRequest
from nanocomposer.engine.checkpoints import (
    ModelLoadError,
    as_id_list,
    check_tokenizer,
    load_config_and_tokenizer,
    load_model_and_tokenizer,
)
from nanocomposer.engine.sampling import SamplingConfig
from nanocomposer.engine.transformers_backend import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_PREFIX_CACHE_POSITIONS,
    TransformersGenerator,
)
from nanocomposer.engine.vllm_backend import (
    VLLM_MAX_TEMPERATURE,
    VLLMGenerator,
    require_vllm,
    resolve_vllm_gpu_memory,
    shutdown_vllm,
    start_vllm,
)
from nanocomposer.policies import GENERATION_BACKENDS
from nanocomposer.smeared_llama import MODEL_TYPE as SMEARED_MODEL_TYPE

MESSAGE_KEYS = ("role", "content", "name", "tool_calls")  # what the chat template reads


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
    `act_batch` calls are split into several batches (`TransformersGenerator.generate`).
    `prefix_cache_positions`: KV positions the transformers backend keeps so an episode's next turn is prefilled
    only past the conversation it already saw (`PrefixCache`); default DEFAULT_PREFIX_CACHE_POSITIONS for a
    model loaded here, 0 (off) for a borrowed one, whose weights may change between calls (RL's RolloutPolicy
    turns it on and clears it after each rollout).

    Tokens come from `self.generator` (`generate(prompts, seeds, sampling)`, and `stream(sampling)` where
    `can_stream()`); another generator changes how they are produced (RL's VLLMRolloutPolicy sets a
    `FunctionGenerator` over TRL's engine), and `open_stream` follows what the generator says it can do.
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
            check_tokenizer(tokenizer, f"tokenizer of {type(path_or_model).__name__}")
            self.model, loaded_tokenizer = path_or_model, tokenizer
            if device is not None:
                self.model.to(device)
            self.owns_model = False
            self.name = name or f"model:{getattr(self.model.config, '_name_or_path', '') or type(self.model).__name__}"
        if tokenizer is not None and self.owns_model:
            check_tokenizer(tokenizer, f"tokenizer given for {str(path_or_model)!r}")
        self.tokenizer = tokenizer or loaded_tokenizer
        if self.model is not None:
            self.device = next(self.model.parameters()).device
            config = self.model.config
            configured_eos = as_id_list(self.model.generation_config.eos_token_id)
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
                self.llm = start_vllm(path, self.sampling.seed, self.max_context, gpu_memory)
        else:
            if prefix_cache_positions is None:
                prefix_cache_positions = DEFAULT_PREFIX_CACHE_POSITIONS if self.owns_model else 0
            self.generator = TransformersGenerator(self.model, self.stop_ids, borrowed=not self.owns_model,
                                                   max_batch_tokens=max_batch_tokens,
                                                   prefix_cache_positions=prefix_cache_positions)

    def _running_engine(self):
        if self.llm is None:
            raise RuntimeError(f"ModelPolicy {self.name!r}: the vLLM engine is not running "
                               "(built with start_engine=False, or closed)")
        return self.llm

    def close(self) -> None:
        """Release the vLLM engine and its GPU memory (no-op for transformers), so another engine can start."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        shutdown_vllm(llm)
        del llm  # the last reference: the engine's GPU memory goes with it
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
        results: list = [self._prompt_or_error(request) for request in requests]
        ready = [i for i, prompt in enumerate(results) if not isinstance(prompt, BaseException)]
        seeds = [self.seed_of(requests[i]) for i in ready]
        with self._generating():
            outputs = self.generator.generate([results[i] for i in ready], seeds, self.sampling) if ready else []
        for i, output in zip(ready, outputs, strict=True):
            results[i] = self._turn(requests[i], results[i], output)
        return results

    def _prompt_or_error(self, request: TurnRequest) -> list[int] | BaseException:
        """`prompt_ids(request)`, or the exception that ends this request (not the batch's) after `turn_done`."""
        try:
            return self.prompt_ids(request)
        except Exception as e:  # noqa: BLE001  (this request's failure)
            self.turn_done(request, e)
            return e

    def _turn(self, request: TurnRequest, prompt_ids: list[int], output) -> Generation | BaseException:
        """What the generator gave `request` (a Completion or its error) as the request's result."""
        result = output if isinstance(output, BaseException) else self._generation(prompt_ids, *output)
        self.turn_done(request, result)
        return result

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
        """Continuous batching for env.runner and the agent server (`PolicyStream`), or None where this policy's
        generator has no running batch to join (vLLM, whose engine batches one call's requests; a model whose
        cache is not plain full attention): its turns are then served in rounds of `act_batch`."""
        return PolicyStream(self) if self.generator.can_stream() else None

    def _generation(self, prompt_ids: list[int], completion_ids: list[int], logprobs: list[float]) -> Generation:
        self.stats["turns"] += 1
        self.stats["prompt_tokens"] += len(prompt_ids)
        self.stats["completion_tokens"] += len(completion_ids)
        stopped = bool(completion_ids) and completion_ids[-1] in self.stop_ids
        body = completion_ids[:-1] if stopped else completion_ids
        text = self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return Generation(text=text, prompt_ids=prompt_ids, completion_ids=completion_ids, logprobs=logprobs,
                          truncated=not stopped)


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
        prompt_ids = self.policy._prompt_or_error(request)
        if isinstance(prompt_ids, BaseException):
            return prompt_ids
        self.pending[key] = request, prompt_ids
        self.stream.add(key, prompt_ids, self.policy.seed_of(request))
        return None

    def step(self, max_steps: int | None = None) -> list[tuple[object, Generation | BaseException]]:
        """Decode until at least one queued or running request finishes, or for `max_steps` tokens; (key,
        Generation or error) of each finished one."""
        with self.policy._generating():
            finished = self.stream.step(max_steps)
        return [(key, self.policy._turn(*self.pending.pop(key), result)) for key, result in finished]

