"""ModelPolicy(backend="vllm") and eval.py's vllm handling, on CPU, against a fake `vllm` module.

vLLM cannot be installed here (no GPU), so a stand-in module is put into `sys.modules`. It mirrors the real
API by name and shape, as read in vLLM's source (vllm-project/vllm, the 0.2x line TRL 1.16 supports):
- `vllm.LLM(model, **engine_kwargs)` and `LLM.generate(prompts, sampling_params=..., use_tqdm=...)` returning
  one `RequestOutput` per prompt, in the order of the prompts; `sampling_params` is one `SamplingParams` for
  all or a list of one per prompt (same length, else ValueError); every prompt is validated before any runs,
  so one invalid prompt (longer than the engine's max_model_len) fails the whole call
  (vllm/entrypoints/llm.py);
- `vllm.inputs.TokensPrompt`, a TypedDict with `prompt_token_ids` (vllm/inputs/data.py);
- `vllm.SamplingParams` with the real field names and defaults for the fields used here, and its range check
  of temperature [0, 2] (vllm/sampling_params.py);
- `RequestOutput.outputs[0]` a `CompletionOutput` whose `token_ids` include the stop token that ended the
  request and whose `logprobs` is `SampleLogprobs = list[dict[int, Logprob]]`, with `logprobs=0` holding
  just the sampled token (vllm/outputs.py, vllm/logprobs.py; TRL's trl/generation/vllm_generation.py reads
  them the same way);
- `LLM.llm_engine.engine_core.shutdown()`, the V1 engine-core client's teardown.
The fake "samples" a scripted continuation (or one computed from the prompt and its params by
`FakeVLLM.respond`), stopping the way vLLM does: at the first stop token (kept) or after max_tokens. Nothing
here has been compared with a real vLLM on a GPU (runs/gpu_check.sh does that where a GPU is lent).
"""

import dataclasses
import importlib.machinery
import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path
from typing import TypedDict

import pytest
import torch
from conftest import save_micro_checkpoint

import eval as eval_py
from env.episode import EpisodeConfig, ExitStatus, TurnRequest, initial_messages, load_prompts, run_episode
from env.protocol import format_assistant_turn
from env.tools import CodeTools, tool_schemas
from nanocomposer import policy as policy_module
from nanocomposer.engine import checkpoints, vllm_backend
from nanocomposer.engine.checkpoints import ModelLoadError
from nanocomposer.engine.vllm_backend import BackendUnavailable
from nanocomposer.policy import ModelPolicy, SamplingConfig

CONTEXT = 4096
SUBMIT_TURN = format_assistant_turn(None, [("submit", {"summary": "done"})])


# --------------------------------------------------------------------------- the fake vllm


@dataclasses.dataclass
class Logprob:  # vllm/logprobs.py
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class CompletionOutput:  # vllm/outputs.py
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class RequestOutput:  # vllm/outputs.py (the fields read by anyone)
    def __init__(self, request_id, prompt, prompt_token_ids, prompt_logprobs, outputs, finished):
        self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_token_ids
        self.prompt_logprobs, self.outputs, self.finished = prompt_logprobs, outputs, finished


class TokensPrompt(TypedDict, total=False):  # vllm/inputs/data.py
    prompt_token_ids: list[int]


@dataclasses.dataclass
class SamplingParams:  # vllm/sampling_params.py: real names and defaults of the fields this code may pass
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True

    def __post_init__(self):  # the checks of SamplingParams._verify_args that these fields can fail
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True.")


class FakeVLLM:
    """The `vllm` module's stand-in plus what the tests read back: engines built, requests, a script."""

    def __init__(self):
        self.engines: list[dict] = []  # LLM(...) keyword arguments, in order
        self.requests: list[tuple[dict, SamplingParams, dict]] = []  # (prompt, its params, generate kwargs)
        self.calls: list[int] = []  # prompts per LLM.generate call
        self.events: list[str] = []
        self.script: list[tuple[list[int], list[float]]] = []  # continuations, used in turn, the last one repeats
        self.respond = None  # or (prompt ids, params) -> (ids, logprobs): a continuation per request
        self.module = self._module()

    def _module(self) -> types.ModuleType:
        fake = self

        class EngineCore:
            def __init__(self, model):
                self.model = model

            def shutdown(self):
                fake.events.append(f"shutdown {self.model}")

        class LLM:
            def __init__(self, model, **kwargs):
                fake.engines.append({"model": model, **kwargs})
                fake.events.append(f"start {model}")
                self.max_model_len = kwargs.get("max_model_len")
                self.llm_engine = types.SimpleNamespace(engine_core=EngineCore(model))

            def generate(self, prompts, sampling_params=None, *, use_tqdm=True):
                fake.calls.append(len(prompts))
                if isinstance(sampling_params, list):
                    if len(sampling_params) != len(prompts):
                        raise ValueError("The lengths of prompts and sampling_params must be the same.")
                    per_prompt = sampling_params
                else:
                    per_prompt = [sampling_params or SamplingParams()] * len(prompts)
                for prompt in prompts:  # all validated before any runs
                    if self.max_model_len is not None and len(prompt["prompt_token_ids"]) >= self.max_model_len:
                        raise ValueError(f"The decoder prompt (length {len(prompt['prompt_token_ids'])}) is longer "
                                         f"than the maximum model length of {self.max_model_len}.")
                outputs = []
                for i, (prompt, params) in enumerate(zip(prompts, per_prompt)):
                    fake.requests.append((prompt, params, {"use_tqdm": use_tqdm}))
                    if fake.respond is not None:
                        ids, lps = fake.respond(prompt["prompt_token_ids"], params)
                    else:
                        ids, lps = fake.script.pop(0) if len(fake.script) > 1 else fake.script[0]
                    token_ids, steps, finish, stop_reason = [], [], "length", None
                    for token, lp in zip(ids, lps):
                        if len(token_ids) == params.max_tokens:
                            break
                        token_ids.append(token)
                        steps.append({token: Logprob(logprob=lp, rank=1)})
                        if token in (params.stop_token_ids or ()):
                            finish, stop_reason = "stop", token
                            break
                    completion = CompletionOutput(index=0, text="", token_ids=token_ids, cumulative_logprob=sum(
                        s[t].logprob for s, t in zip(steps, token_ids)),
                        logprobs=steps if params.logprobs is not None else None,
                        finish_reason=finish, stop_reason=stop_reason)
                    outputs.append(RequestOutput(str(i), None, prompt["prompt_token_ids"], None, [completion], True))
                return outputs

        module = types.ModuleType("vllm")
        module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # find_spec reads it from sys.modules
        module.LLM, module.SamplingParams = LLM, SamplingParams
        module.inputs = types.ModuleType("vllm.inputs")
        module.inputs.__spec__ = importlib.machinery.ModuleSpec("vllm.inputs", None)
        module.inputs.TokensPrompt = TokensPrompt
        return module


@pytest.fixture
def fake_vllm(monkeypatch) -> FakeVLLM:
    fake = FakeVLLM()
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    monkeypatch.setitem(sys.modules, "vllm.inputs", fake.module.inputs)
    monkeypatch.delenv(vllm_backend.VLLM_GPU_MEMORY_ENV, raising=False)
    return fake


@pytest.fixture
def no_vllm(monkeypatch):
    """vllm absent, even on a machine where it is installed."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "vllm" else real_find_spec(name, *a, **k))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)


@pytest.fixture
def no_torch_weights(monkeypatch):
    """The vllm path must not load a torch copy of the weights."""
    def refuse(*args, **kwargs):
        raise AssertionError("the vllm backend loaded torch weights")

    monkeypatch.setattr(checkpoints, "_load_weights", refuse)
    monkeypatch.setattr(checkpoints, "_load_adapter", refuse)


# --------------------------------------------------------------------------- a micro checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An untrained micro model saved like a pipeline stage (as in tests/test_eval.py); plain Llama keys, since
    vLLM has no smeared-key architecture (tests/test_smeared_llama.py checks the refusal)."""
    return save_micro_checkpoint(tmp_path_factory.mktemp("runs") / "micro" / "sft", CONTEXT, smeared_keys=False)


@pytest.fixture(scope="module")
def transformers_policy(checkpoint) -> ModelPolicy:
    return ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=8))


def _conversation(task) -> tuple[list[dict], list[dict]]:
    return initial_messages(task, task.repo_dir, load_prompts()), tool_schemas(CodeTools(task.repo_dir, task))


def _submit_ids(tokenizer) -> list[int]:
    ids = tokenizer.encode(SUBMIT_TURN, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == SUBMIT_TURN  # the canned turn round-trips
    return ids


# --------------------------------------------------------------------------- ModelPolicy(backend="vllm")


def test_engine_loads_the_checkpoint_directory_and_no_torch_weights(fake_vllm, no_torch_weights, checkpoint):
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=8, seed=3), backend="vllm")
    assert fake_vllm.engines == [{"model": str(checkpoint), "tokenizer": str(checkpoint), "dtype": "auto", "seed": 3,
                                  "max_model_len": CONTEXT, "enable_prefix_caching": True,
                                  "gpu_memory_utilization": 0.85, "logprobs_mode": "processed_logprobs"}]
    assert policy.model is None and policy.llm is not None and policy.max_context == CONTEXT
    assert policy.tokenizer.chat_template  # the HF tokenizer still renders


def test_stop_ids_match_the_transformers_backend(fake_vllm, checkpoint, transformers_policy, tmp_path):
    policy = ModelPolicy(checkpoint, backend="vllm", start_engine=False)
    assert policy.stop_ids == transformers_policy.stop_ids == [policy.tokenizer.eos_token_id, 0]  # + <|endoftext|>
    bare = Path(shutil.copytree(checkpoint, tmp_path / "bare"))
    (bare / "generation_config.json").unlink()  # then both read the model config
    assert (ModelPolicy(bare, backend="vllm", start_engine=False).stop_ids
            == ModelPolicy(bare, sampling=SamplingConfig(max_new_tokens=8)).stop_ids)


@pytest.mark.parametrize("temperature, top_p", [(0.7, 0.9), (0.0, 1.0)])
def test_act_is_one_token_request_returning_vllm_ids_and_logprobs(fake_vllm, no_torch_weights, checkpoint,
                                                                  transformers_policy, calc_task, temperature, top_p):
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=64, temperature=temperature, top_p=top_p,
                                                             seed=3), backend="vllm")
    eos = policy.tokenizer.eos_token_id
    completion = _submit_ids(policy.tokenizer) + [eos]
    logprobs = [-0.01 * (i + 1) for i in range(len(completion))]
    fake_vllm.script = [(completion + [7, 8], logprobs + [-1.0, -2.0])]  # vLLM stops at the stop token
    messages, tools = _conversation(calc_task)
    policy.reset(calc_task)
    gen = policy.act(messages, tools)

    assert gen.prompt_ids == transformers_policy.render(messages, tools)
    assert gen.completion_ids == completion and gen.logprobs == pytest.approx(logprobs)
    assert not gen.truncated and gen.text == SUBMIT_TURN
    (prompt, params, kwargs), = fake_vllm.requests
    assert prompt == {"prompt_token_ids": gen.prompt_ids} and kwargs == {"use_tqdm": False}
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (temperature, top_p, 0, 0.0)
    assert (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) == (1.0, 0.0, 0.0)
    assert params.max_tokens == 64 and params.logprobs == 0 and params.stop_token_ids == policy.stop_ids
    assert params.seed == policy_module._stable_seed(3, f"{calc_task.id}#0", 0) and not params.detokenize
    second = policy.act(messages, tools)  # the next turn draws from its own seed
    assert second.completion_ids == completion and fake_vllm.requests[1][1].seed != params.seed


def test_no_stop_token_means_truncated(fake_vllm, checkpoint, calc_task):
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=5, temperature=1.0), backend="vllm")
    fake_vllm.script = [([11, 12, 13, 14, 15, 16, 17], [-0.5] * 7)]
    policy.reset(calc_task)
    gen = policy.act(*_conversation(calc_task))
    assert gen.completion_ids == [11, 12, 13, 14, 15] and gen.logprobs == [-0.5] * 5 and gen.truncated
    assert gen.text == policy.tokenizer.decode([11, 12, 13, 14, 15], skip_special_tokens=False)


def test_missing_logprobs_are_an_error_not_zeros(fake_vllm, checkpoint, calc_task, monkeypatch):
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=4), backend="vllm")
    fake_vllm.script = [([11, 12], [-0.5, -0.5])]
    real_generate = type(policy.llm).generate

    def without_logprobs(self, prompts, sampling_params=None, *, use_tqdm=True):
        outputs = real_generate(self, prompts, sampling_params, use_tqdm=use_tqdm)
        outputs[0].outputs[0].logprobs = None
        return outputs

    monkeypatch.setattr(type(policy.llm), "generate", without_logprobs)
    policy.reset(calc_task)
    with pytest.raises(RuntimeError, match="not the log-prob of every sampled one"):
        policy.act(*_conversation(calc_task))


def test_greedy_episode_submits_through_the_harness(fake_vllm, checkpoint, calc_task):
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=64), backend="vllm")
    fake_vllm.script = [(_submit_ids(policy.tokenizer) + [policy.tokenizer.eos_token_id], [-0.1] * 64)]
    traj = run_episode(calc_task, policy, EpisodeConfig(max_turns=2))
    assert traj.exit_status == ExitStatus.SUBMITTED and len(traj.turns) == 1
    assert fake_vllm.requests[0][1].temperature == 0.0


def test_context_overflow_is_checked_before_vllm(fake_vllm, checkpoint, calc_task):
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=8, max_context=200), backend="vllm")
    assert fake_vllm.engines[0]["max_model_len"] == 200
    policy.reset(calc_task)
    with pytest.raises(policy_module.ContextOverflow):
        policy.act(*_conversation(calc_task))
    assert fake_vllm.requests == []


def test_gpu_memory_share_from_env_and_argument(fake_vllm, checkpoint, monkeypatch):
    monkeypatch.setenv(vllm_backend.VLLM_GPU_MEMORY_ENV, "0.5")
    ModelPolicy(checkpoint, backend="vllm")
    ModelPolicy(checkpoint, backend="vllm", vllm_gpu_memory=0.3)
    assert [e["gpu_memory_utilization"] for e in fake_vllm.engines] == [0.5, 0.3]
    for raw, says in [("lots", "not a number"), ("1.5", "in (0, 1]")]:
        monkeypatch.setenv(vllm_backend.VLLM_GPU_MEMORY_ENV, raw)
        with pytest.raises(ValueError, match=r"NANOCOMPOSER_VLLM_GPU_MEMORY.*" + says.replace("(", r"\(")):
            ModelPolicy(checkpoint, backend="vllm")


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # inside peft
def test_adapter_directory_is_refused_with_the_merge_to_run(fake_vllm, no_torch_weights, checkpoint, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(checkpoint)
    get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "adapter")
    with pytest.raises(ModelLoadError) as info:
        ModelPolicy(tmp_path / "adapter", backend="vllm")
    message = str(info.value)
    assert str(tmp_path / "adapter") in message and "merge_and_unload" in message and "--backend transformers" in message
    assert fake_vllm.engines == []


def test_bad_inputs_fail_before_any_engine(fake_vllm, checkpoint, transformers_policy, tmp_path):
    with pytest.raises(ValueError, match="give a checkpoint directory"):
        ModelPolicy(transformers_policy.model, transformers_policy.tokenizer, backend="vllm")
    with pytest.raises(ValueError, match="temperature 2.5 is above vLLM's limit"):
        ModelPolicy(checkpoint, sampling=SamplingConfig(temperature=2.5), backend="vllm")
    with pytest.raises(ModelLoadError, match="no such file or directory"):
        ModelPolicy(tmp_path / "nope", backend="vllm")
    with pytest.raises(ValueError, match="backend 'sglang' is not implemented"):
        ModelPolicy(checkpoint, backend="sglang")
    assert fake_vllm.engines == []


def test_unstarted_and_closed_engines(fake_vllm, checkpoint, calc_task):
    checked = ModelPolicy(checkpoint, backend="vllm", start_engine=False)
    assert fake_vllm.engines == [] and checked.llm is None
    checked.reset(calc_task)
    with pytest.raises(RuntimeError, match="engine is not running"):
        checked.act(*_conversation(calc_task))
    policy = ModelPolicy(checkpoint, backend="vllm")
    policy.close()
    policy.close()  # idempotent
    assert fake_vllm.events == [f"start {checkpoint}", f"shutdown {checkpoint}"] and policy.llm is None


def test_missing_vllm_is_a_one_line_error(no_vllm, checkpoint):
    with pytest.raises(BackendUnavailable, match="vllm package, which is not installed") as info:
        ModelPolicy(checkpoint, backend="vllm")
    assert "\n" not in str(info.value)


def test_broken_vllm_install_is_named(monkeypatch, checkpoint):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: object() if name == "vllm" else real_find_spec(name, *a, **k))
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(BackendUnavailable, match="vllm is installed but failed to import: ModuleNotFoundError"):
        ModelPolicy(checkpoint, backend="vllm")


# --------------------------------------------------------------------------- batches: act_batch, VLLMGenerator


def _seed_response(prompt_ids, params):
    """A continuation that names its request: the last prompt token, then the seed's residues (no stop token)."""
    ids = [prompt_ids[-1] % 400 + 7] + [params.seed % 97 + 7, params.seed % 89 + 7]
    return ids, [-(params.seed % 1000) / 1000 - 0.001 * k for k in range(len(ids))]


def _requests(calc_task, episodes: int) -> list[TurnRequest]:
    messages, tools = _conversation(calc_task)
    # different conversations (so different prompts), different episodes and turns
    return [TurnRequest(messages + [{"role": "user", "content": "more " * k}], tools, f"{calc_task.id}#{k}", k % 3)
            for k in range(episodes)]


def test_act_batch_is_one_generate_call_with_a_seed_per_request(fake_vllm, checkpoint, transformers_policy,
                                                                 calc_task):
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=8, temperature=1.0, seed=5),
                         backend="vllm")
    fake_vllm.respond = _seed_response
    requests = _requests(calc_task, 5)
    results = policy.act_batch(requests)

    assert fake_vllm.calls == [5]  # one call for the whole batch
    seeds = [policy_module._stable_seed(5, r.episode_key, r.turn) for r in requests]
    assert len(set(seeds)) == 5 and [params.seed for _, params, _ in fake_vllm.requests] == seeds
    for request, seed, gen, (prompt, params, _) in zip(requests, seeds, results, fake_vllm.requests, strict=True):
        expected_prompt = transformers_policy.render(request.messages, request.tools)
        assert prompt == {"prompt_token_ids": expected_prompt} and gen.prompt_ids == expected_prompt
        assert (gen.completion_ids, gen.logprobs) == _seed_response(expected_prompt, params)  # mapped back in order
        assert gen.truncated and params.max_tokens == 8 and params.temperature == 1.0 and params.logprobs == 0
    # act is act_batch of one request with the same seed derivation
    policy.reset(calc_task)
    policy.act(*_conversation(calc_task))
    assert fake_vllm.calls[-1] == 1 and fake_vllm.requests[-1][1].seed == policy_module._stable_seed(
        5, f"{calc_task.id}#0", 0)
    assert policy.act_batch([]) == [] and fake_vllm.calls == [5, 1]


def test_a_request_over_the_context_fails_alone(fake_vllm, checkpoint, calc_task):
    messages, tools = _conversation(calc_task)
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=8), backend="vllm")
    prompt_tokens = len(policy.render(messages, tools))
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=8, max_context=prompt_tokens + 40),
                         backend="vllm")
    fake_vllm.respond = _seed_response
    long = [*messages, {"role": "user", "content": "x " * 200}]
    requests = [TurnRequest(messages, tools, "a#0", 0), TurnRequest(long, tools, "b#0", 0),
                TurnRequest(messages, tools, "c#0", 2)]
    first, overflow, third = policy.act_batch(requests)
    assert isinstance(overflow, policy_module.ContextOverflow) and overflow.exit_status == "max_context"
    assert fake_vllm.calls == [2]  # the overflowing request never reached the engine
    assert first.prompt_ids == third.prompt_ids and first.completion_ids != third.completion_ids  # own seeds


def test_generator_isolates_a_prompt_the_engine_rejects(fake_vllm):
    from nanocomposer.engine.sampling import Completion
    from nanocomposer.engine.vllm_backend import VLLMGenerator

    llm = fake_vllm.module.LLM("m", max_model_len=50)
    fake_vllm.respond = _seed_response
    generator = VLLMGenerator(lambda: llm, stop_ids=[2])
    good, bad, other = generator.generate([[5] * 10, [6] * 60, [7] * 20], [11, 12, 13],
                                          SamplingConfig(max_new_tokens=4))
    assert isinstance(bad, ValueError) and "longer than the maximum model length of 50" in str(bad)
    assert isinstance(good, Completion) and good.ids == [5 % 400 + 7, 11 % 97 + 7, 11 % 89 + 7]
    assert isinstance(other, Completion) and other.ids[0] == 7 % 400 + 7
    assert fake_vllm.calls == [3, 1, 1, 1]  # the batch, then each request alone to find the one at fault


def test_missing_logprobs_and_misordered_outputs_fail_their_requests(fake_vllm, checkpoint, calc_task, monkeypatch):
    policy = ModelPolicy(checkpoint, sampling=SamplingConfig(max_new_tokens=4), backend="vllm")
    fake_vllm.respond = _seed_response
    real_generate = type(policy.llm).generate

    def second_without_logprobs(self, prompts, sampling_params=None, *, use_tqdm=True):
        outputs = real_generate(self, prompts, sampling_params, use_tqdm=use_tqdm)
        outputs[1].outputs[0].logprobs = None
        return outputs

    monkeypatch.setattr(type(policy.llm), "generate", second_without_logprobs)
    ok, missing, ok_too = policy.act_batch(_requests(calc_task, 3))
    assert isinstance(missing, RuntimeError) and "not the log-prob of every sampled one" in str(missing)
    assert len(ok.completion_ids) == len(ok_too.completion_ids) == 3

    def reversed_outputs(self, prompts, sampling_params=None, *, use_tqdm=True):
        return real_generate(self, prompts, sampling_params, use_tqdm=use_tqdm)[::-1]

    monkeypatch.setattr(type(policy.llm), "generate", reversed_outputs)
    results = policy.act_batch(_requests(calc_task, 3))
    assert [type(r) for r in results] == [RuntimeError, type(ok), RuntimeError]  # the middle one is its own
    assert "out of request order" in str(results[0])


# --------------------------------------------------------------------------- eval.py


def test_eval_backend_vllm_without_vllm_is_a_clear_error(no_vllm, checkpoint, two_tasks, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert eval_py.main(["--tasks", str(two_tasks), "--policy", str(checkpoint), "--output", str(out),
                         "--backend", "vllm", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eval.py: error: the vllm backend needs the vllm package, which is not installed")
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()


def test_eval_resolve_backend(monkeypatch, fake_vllm):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert eval_py.resolve_backend("auto") == "vllm"
    assert eval_py.resolve_backend("transformers") == "transformers"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert eval_py.resolve_backend("auto") == "transformers"
    with pytest.raises(ValueError, match="--backend 'tgi'"):
        eval_py.resolve_backend("tgi")


def test_eval_auto_without_vllm_is_transformers(monkeypatch, no_vllm):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert eval_py.resolve_backend("auto") == "transformers"


@pytest.mark.slow  # eval.py end to end on two checkpoints (about 20 s)
def test_eval_vllm_batches_episodes_with_one_engine_per_policy(fake_vllm, checkpoint, two_tasks, tmp_path, capsys):
    tokenizer = ModelPolicy(checkpoint, backend="vllm", start_engine=False).tokenizer
    fake_vllm.script = [(_submit_ids(tokenizer) + [tokenizer.eos_token_id], [-0.1] * 64)]
    out = tmp_path / "r.json"
    assert eval_py.main(["--tasks", str(two_tasks), "--policy", str(checkpoint), "--output", str(out),
                         "--backend", "vllm", "--workers", "2", "--max-new-tokens", "64", "--quiet"]) == 0
    assert "cannot batch" not in capsys.readouterr().err
    summary = json.loads(out.read_text())["summary"]
    assert summary["solved"] == 0 and summary["exit_statuses"] == {"submitted": 2}  # submits without fixing
    assert summary["config"]["backend"] == "vllm" and summary["config"]["workers"] == 2
    assert fake_vllm.calls == [2]  # both episodes' turns in one LLM.generate call
    assert fake_vllm.events == [f"start {checkpoint}", f"shutdown {checkpoint}"]  # validation started none

    other = Path(shutil.copytree(checkpoint, tmp_path / "runs" / "other" / "sft"))
    fake_vllm.events.clear()
    assert eval_py.main(["--tasks", str(two_tasks), "--compare", str(checkpoint), str(other), "--out-dir",
                         str(tmp_path / "cmp"), "--backend", "vllm", "--max-new-tokens", "64", "--quiet"]) == 0
    assert fake_vllm.events == [f"start {checkpoint}", f"shutdown {checkpoint}", f"start {other}",
                                f"shutdown {other}"]  # each engine released before the next starts


def test_a_backend_divergence_right_after_a_near_tie_is_a_tie():
    """runs/gpu_check.sh's identity check fails only on a divergence where transformers' top-2 logits were
    clearly apart (bench.generation.NEAR_TIE_GAP); after a near-tie either kernel may break the tie its way."""
    from bench.generation import NEAR_TIE_GAP, real_disagreements

    tie = {"prompt": 0, "transformers_top2_gap": NEAR_TIE_GAP / 10, "near_tie": True}
    clear = {"prompt": 1, "transformers_top2_gap": NEAR_TIE_GAP * 10, "near_tie": False}
    assert real_disagreements({"differences": [tie]}) == []
    assert real_disagreements({"differences": [tie, clear]}) == [clear]
    assert real_disagreements(None) == []


def test_gpu_check_runs_both_backends_in_one_dtype():
    script = (Path(__file__).resolve().parents[1] / "runs" / "gpu_check.sh").read_text()
    assert 'DTYPE_ARGS=(--dtype "${DTYPE:-bfloat16}")' in script
