"""ModelPolicy: a from_pretrained checkpoint acting in the harness.

Two micro checkpoints (vocab ~512, hidden 64, 2 layers) are built once per module:
- `random`: straight from `build_model`; it writes garbage, which the harness must survive.
- `taught`: same architecture with an untied output head fitted so that, greedily, it answers any
  prompt with one `submit` call and `<|im_end|>`. The JSON line of that call is one added token, so
  the turn is 4 distinct tokens and fitting the head alone (a second, instead of minutes of training the whole
  model on a 1,000-token prompt) is enough. It exercises the paths an untrained model never reaches: stopping at
  EOS, decoding tool tags, and an episode that ends with `submitted`.
"""

import json
import math
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
from tokenizers import AddedToken

from env.episode import EpisodeConfig, ExitStatus, initial_messages, load_prompts, run_episode
from env.protocol import format_assistant_turn
from env.tools import CodeTools, tool_schemas
from nanocomposer.engine.checkpoints import ModelLoadError, is_model_dir, load_model_and_tokenizer
from nanocomposer.model import IM_END, build_model, build_tokenizer
from nanocomposer.policy import ContextOverflow, ModelPolicy, SamplingConfig

CONTEXT = 4096  # a first prompt (system, tools, task) is ~1,000 tokens with a 512-token vocabulary
STDLIB_FILES = ("json/encoder.py", "json/decoder.py", "textwrap.py", "shlex.py")
SUBMIT_TURN = format_assistant_turn(None, [("submit", {"summary": "done"})])
GARBAGE_STATUSES = {"no_tool_call", "max_turns", "repeated_malformed"}


def _teach_head(model, tokenizer, target_ids: list[int]) -> None:
    """Untie and fit the output head so greedy decoding after "\\n" yields `target_ids` (distinct ids)."""
    assert len(set(target_ids)) == len(target_ids), "the head alone can only learn a chain of distinct tokens"
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    inputs = tokenizer.encode("\n") + target_ids[:-1]  # the generation prompt ends with "assistant\n"
    with torch.no_grad():
        features = model.model(input_ids=torch.tensor([inputs])).last_hidden_state[0]
    head = model.lm_head.weight.detach().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([head], lr=0.05)
    labels = torch.tensor(target_ids)
    for _ in range(500):
        loss = torch.nn.functional.cross_entropy(features @ head.T, labels)
        if loss.item() < 1e-3:
            break
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 1e-3, f"head fit did not converge (loss {loss.item():.4f})"
    with torch.no_grad():
        model.lm_head.weight.copy_(head)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """A 140 k-parameter model gains nothing from threads, and on a busy 2-core box two threads ran 10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tokenizer = build_tokenizer([(stdlib / f).read_text(encoding="utf-8") for f in STDLIB_FILES], 512)
    tokenizer.model_max_length = CONTEXT
    call_body = SUBMIT_TURN.removeprefix("<tool_call>").removesuffix("</tool_call>")  # "\n{json}\n"
    tokenizer.add_tokens([AddedToken(call_body, normalized=False, special=False)])
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for name in ("random", "taught"):
        model = build_model(tokenizer, hidden=64, layers=2, heads=2, context=CONTEXT, seed=0)
        if name == "taught":
            _teach_head(model, tokenizer, tokenizer.encode(SUBMIT_TURN) + [tokenizer.eos_token_id])
        out[name] = root / name
        model.save_pretrained(out[name])
        tokenizer.save_pretrained(out[name])
    return out


@pytest.fixture(scope="module")
def random_policy(checkpoints):
    return ModelPolicy(checkpoints["random"], sampling=SamplingConfig(max_new_tokens=8))


def _conversation(task) -> tuple[list[dict], list[dict]]:
    return initial_messages(task, task.repo_dir, load_prompts()), tool_schemas(CodeTools(task.repo_dir, task))


def _forward_logprobs(model, prompt_ids, completion_ids, temperature: float = 1.0) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1)


# --------------------------------------------------------------------------- act


def test_act_returns_a_consistent_generation(random_policy, calc_task):
    messages, tools = _conversation(calc_task)
    random_policy.reset(calc_task)
    gen = random_policy.act(messages, tools)
    assert gen.prompt_ids == random_policy.render(messages, tools)
    header = random_policy.tokenizer.encode("<|im_start|>assistant\n")
    assert gen.prompt_ids[-len(header):] == header
    assert 1 <= len(gen.completion_ids) <= 8 and len(gen.logprobs) == len(gen.completion_ids)
    assert all(math.isfinite(lp) and lp <= 0 for lp in gen.logprobs)
    stopped = gen.completion_ids[-1] in random_policy.stop_ids
    assert gen.truncated == (not stopped)
    if gen.truncated:
        assert len(gen.completion_ids) == 8
    decoded = random_policy.tokenizer.decode(gen.completion_ids, skip_special_tokens=False)
    stop_text = random_policy.tokenizer.decode(gen.completion_ids[-1:]) if stopped else ""
    assert decoded == gen.text + stop_text


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("saved_knobs", [False, True])
def test_logprobs_are_those_of_the_sampling_distribution(checkpoints, calc_task, tmp_path, temperature, saved_knobs):
    path = checkpoints["random"]
    if saved_knobs:  # a training stage saved decoding settings: SamplingConfig must still decide alone
        path = Path(shutil.copytree(path, tmp_path / "knobs"))
        config = json.loads((path / "generation_config.json").read_text())
        config.update(top_k=3, repetition_penalty=3.0, no_repeat_ngram_size=1, suppress_tokens=[5, 6, 7])
        (path / "generation_config.json").write_text(json.dumps(config))
    policy = ModelPolicy(path, sampling=SamplingConfig(max_new_tokens=6, temperature=temperature))
    messages, tools = _conversation(calc_task)
    policy.reset(calc_task)
    gen = policy.act(messages, tools)
    expected = _forward_logprobs(policy.model, gen.prompt_ids, gen.completion_ids, temperature or 1.0)
    assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4), (gen.logprobs, expected.tolist())


def test_greedy_is_deterministic(checkpoints, random_policy, calc_task):
    messages, tools = _conversation(calc_task)
    random_policy.reset(calc_task)
    first = random_policy.act(messages, tools)
    again = random_policy.act(messages, tools)
    other = ModelPolicy(checkpoints["random"], sampling=SamplingConfig(max_new_tokens=8))
    other.reset(calc_task)
    fresh = other.act(messages, tools)
    assert first.completion_ids == again.completion_ids == fresh.completion_ids
    assert first.text == again.text == fresh.text


def test_sampling_is_seeded_per_episode_and_leaves_the_global_rng_alone(checkpoints, calc_task):
    messages, tools = _conversation(calc_task)

    def sample(seed: int, episodes: int = 1) -> list[int]:
        policy = ModelPolicy(checkpoints["random"], sampling=SamplingConfig(max_new_tokens=8, temperature=1.0, seed=seed))
        for _ in range(episodes):
            policy.reset(calc_task)
        return policy.act(messages, tools).completion_ids

    rng_before = torch.random.get_rng_state()
    first = sample(0)
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert sample(0) == first  # reproducible
    assert sample(0, episodes=2) != first  # a second rollout of the same task draws differently
    assert sample(1) != first


def test_extra_message_keys_are_not_rendered(random_policy, calc_task):
    messages, tools = _conversation(calc_task)
    noisy = [{**m, "parsed_calls": [object()], "turn": 3} for m in messages]
    assert random_policy.render(noisy, tools) == random_policy.render(messages, tools)


def test_taught_checkpoint_stops_at_eos_and_keeps_its_tool_tags(checkpoints, calc_task):
    policy = ModelPolicy(checkpoints["taught"], sampling=SamplingConfig(max_new_tokens=16))
    messages, tools = _conversation(calc_task)
    policy.reset(calc_task)
    gen = policy.act(messages, tools)
    assert gen.text == SUBMIT_TURN
    assert not gen.truncated and gen.completion_ids[-1] == policy.tokenizer.eos_token_id
    assert policy.tokenizer.decode(gen.completion_ids, skip_special_tokens=False) == gen.text + IM_END
    assert len(gen.logprobs) == len(gen.completion_ids) == 4
    # What the harness appends re-renders to exactly the tokens the model produced (RL relies on it).
    following = messages + [{"role": "assistant", "content": gen.text},
                            {"role": "tool", "name": "submit", "content": "ok"}]
    assert policy.render(following, tools)[: len(gen.prompt_ids) + 4] == gen.prompt_ids + gen.completion_ids


# --------------------------------------------------------------------------- episodes


def test_random_model_episode_ends_with_a_named_status(random_policy, calc_task):
    traj = run_episode(calc_task, random_policy, EpisodeConfig(max_turns=3))
    assert traj.exit_status in GARBAGE_STATUSES, (traj.exit_status, traj.error)
    assert not traj.error and not traj.solved
    assert traj.turns and all(len(t["completion_ids"]) == len(t["logprobs"]) == t["completion_tokens"]
                              for t in traj.turns)


def test_taught_model_episode_submits(checkpoints, calc_task):
    traj = run_episode(calc_task, ModelPolicy(checkpoints["taught"]), EpisodeConfig(max_turns=3))
    assert traj.exit_status == "submitted", (traj.exit_status, traj.error)
    assert traj.submission == "done" and traj.completion_tokens == 4 and traj.malformed_calls == 0


def test_context_overflow_is_named_and_ends_the_episode(checkpoints, random_policy, calc_task):
    messages, tools = _conversation(calc_task)
    prompt_tokens = len(random_policy.render(messages, tools))
    model, tokenizer = random_policy.model, random_policy.tokenizer

    def policy(max_context: int) -> ModelPolicy:
        return ModelPolicy(model, tokenizer, SamplingConfig(max_new_tokens=64, max_context=max_context))

    assert len(policy(prompt_tokens + 64).act(messages, tools).completion_ids) <= 64  # exactly fits
    with pytest.raises(ContextOverflow, match=rf"prompt of {prompt_tokens} tokens \+ max_new_tokens 64 exceeds "
                                              rf"the context of {prompt_tokens + 63}"):
        policy(prompt_tokens + 63).act(messages, tools)
    assert ContextOverflow.exit_status == "max_context"
    traj = run_episode(calc_task, policy(prompt_tokens + 63), EpisodeConfig(max_turns=3))
    # policy_error until the episode loop names this case (the status ContextOverflow.exit_status proposes)
    expected = getattr(ExitStatus, "MAX_CONTEXT", ExitStatus.POLICY_ERROR).value
    assert traj.exit_status == expected and traj.error.startswith("ContextOverflow: prompt of")
    assert traj.turns == []


def test_default_context_is_the_models_position_limit(random_policy):
    assert random_policy.max_context == CONTEXT


# --------------------------------------------------------------------------- loading


def test_is_model_dir(checkpoints, tmp_path):
    assert is_model_dir(checkpoints["random"]) and is_model_dir(str(checkpoints["random"]))
    assert not is_model_dir(tmp_path) and not is_model_dir(tmp_path / "nope") and not is_model_dir("gold")


def _break(kind: str, good: Path, dest: Path) -> Path:
    if kind == "missing":
        return dest / "nope"
    if kind == "a file":
        (dest / "model.bin").write_bytes(b"x")
        return dest / "model.bin"
    if kind == "empty dir":
        return dest
    path = dest / "ckpt"
    shutil.copytree(good, path)
    weights = path / "model.safetensors"
    if kind == "config garbage":
        (path / "config.json").write_text("{not json")
    elif kind == "config without model_type":
        (path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    elif kind == "no weights":
        weights.unlink()
    elif kind == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif kind == "missing tensor":
        from safetensors.torch import load_file, save_file

        tensors = load_file(weights)
        del tensors["model.norm.weight"]
        save_file(tensors, weights, metadata={"format": "pt"})
    elif kind == "no tokenizer":
        (path / "tokenizer.json").unlink()
        (path / "tokenizer_config.json").unlink()
    elif kind == "no chat template":
        (path / "chat_template.jinja").unlink()
    elif kind == "adapter without base":
        shutil.rmtree(path)
        path.mkdir()
        (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(dest / "gone")}))
        (path / "adapter_model.safetensors").write_bytes(b"")
    else:
        raise AssertionError(kind)
    return path


@pytest.mark.parametrize("kind, says", [
    ("missing", "no such file or directory"),
    ("a file", "not a directory"),
    ("empty dir", "no config.json"),
    ("config garbage", "config.json is not valid JSON"),
    ("config without model_type", "no 'model_type'"),
    ("no weights", "no weights"),
    ("truncated weights", "weights failed to load: SafetensorError"),
    ("missing tensor", "incomplete weights: missing ['model.norm.weight']"),
    ("no tokenizer", "no tokenizer"),
    ("no chat template", "no chat_template"),
    ("adapter without base", "is not a local checkpoint directory"),
])
def test_broken_checkpoints_raise_model_load_error_naming_the_path(checkpoints, tmp_path, kind, says):
    path = _break(kind, checkpoints["random"], tmp_path)
    with pytest.raises(ModelLoadError) as info:
        ModelPolicy(path)
    assert str(path) in str(info.value) and says in str(info.value), str(info.value)


def test_threads_loading_at_once_all_get_complete_models(checkpoints):
    # The agent server's workers load a promoted version at the same moment; unserialised, transformers gave
    # every one of them an untied (missing) lm_head.
    from concurrent.futures import ThreadPoolExecutor

    def load(_):
        try:
            model, _tok = load_model_and_tokenizer(checkpoints["random"], "cpu")
            return model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        except ModelLoadError as e:
            return str(e)

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(load, range(8))) == [True] * 8


def test_a_run_directory_hints_at_the_stages_inside_it(checkpoints, tmp_path):
    shutil.copytree(checkpoints["random"], tmp_path / "sft")
    with pytest.raises(ModelLoadError, match=r"no config.json.*model directories inside it: sft"):
        load_model_and_tokenizer(tmp_path)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # inside peft
def test_peft_adapter_directory_loads_base_plus_adapter(checkpoints, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(checkpoints["random"])
    base_logits_model = AutoModelForCausalLM.from_pretrained(checkpoints["random"]).eval()
    # init_lora_weights=False: random A and B, so the adapter changes the outputs (default B is zero).
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "config.json").exists() and is_model_dir(tmp_path / "adapter")

    policy = ModelPolicy(tmp_path / "adapter", sampling=SamplingConfig(max_new_tokens=4))
    ids = torch.tensor([policy.tokenizer.encode("def add(a, b):\n    return a + b\n")])
    with torch.no_grad():
        loaded, expected, plain = (m.eval()(input_ids=ids).logits for m in (policy.model, lora, base_logits_model))
    assert torch.allclose(loaded, expected, atol=1e-4)
    assert not torch.allclose(loaded, plain, atol=1e-3)
    assert policy.tokenizer.chat_template  # taken from the base model's directory


# --------------------------------------------------------------------------- live model, seams, config


def test_live_model_is_used_in_place_and_its_mode_restored(checkpoints, calc_task):
    model, tokenizer = load_model_and_tokenizer(checkpoints["random"])
    with pytest.raises(ValueError, match="pass the tokenizer"):
        ModelPolicy(model)
    model.train()
    policy = ModelPolicy(model, tokenizer, SamplingConfig(max_new_tokens=4), name="rl-policy")
    policy.reset(calc_task)
    gen = policy.act(*_conversation(calc_task))
    assert policy.model is model and model.training and policy.name == "rl-policy"
    assert len(gen.completion_ids) == len(gen.logprobs) >= 1


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend 'sglang' is not implemented"):
        ModelPolicy("unused", backend="sglang")


@pytest.mark.parametrize("kwargs, says", [
    ({"max_new_tokens": 0}, "max_new_tokens=0"),
    ({"temperature": -1.0}, "temperature=-1.0"),
    ({"top_p": 0.0}, "top_p=0.0"),
    ({"max_context": 100, "max_new_tokens": 100}, "max_context=100"),
])
def test_sampling_config_rejects_bad_values(kwargs, says):
    with pytest.raises(ValueError, match=says):
        SamplingConfig(**kwargs)


def test_uncached_hub_id_fails_clearly_offline(monkeypatch):
    from env.policies import is_checkpoint_spec
    from nanocomposer.engine.checkpoints import ModelLoadError, load_model_and_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert is_checkpoint_spec("Qwen/Qwen2.5-Coder-1.5B-Instruct") and not is_checkpoint_spec("gpt-9")
    with pytest.raises(ModelLoadError, match="'nanocomposer-test/not-a-model': not a local directory"):
        load_model_and_tokenizer("nanocomposer-test/not-a-model")
