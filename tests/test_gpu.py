"""Checks that need an accelerator (marker `gpu`), run by runs/device_check.sh on a lent GPU machine.

    pytest -m gpu tests/test_gpu.py                                     # on a CUDA machine
    NANOCOMPOSER_TEST_DEVICE=cpu pytest -m gpu tests/test_gpu.py        # the same checks on the CPU

Without CUDA (and without NANOCOMPOSER_TEST_DEVICE) every `gpu` test skips, so CI never fails on them;
`runs/device_check.sh --dry-run` runs them on the CPU so the test code itself is exercised there too.

- bf16: forward and backward of the model under bf16 autocast (the recipes' `bf16: true`) and with bf16
  weights; the loss matches fp32, every gradient is finite, a few optimizer steps lower the loss. On CUDA the
  model is the `gpu_scratch` preset (91 M parameters); on the CPU a micro model of the same architecture.
- LoRA: a trained adapter merged into the weights gives the adapted model's logits, also after save and reload.
- batching: `ModelPolicy.act_batch` (greedy) returns for each request what `act` returns for it alone
  (token ids equal, logprobs within float tolerance), prompts of different lengths sharing one batch.
- token-in/token-out: the logprobs a generation returns equal the model's own scoring of the same prompt
  and completion ids in one forward pass (fp32 and bf16), for `act` and for `act_batch`.

The policy checks use a micro checkpoint (vocab 512, hidden 64, 2 layers) whose embedding is scaled up
x10: a random-init model's logits are nearly flat, so greedy argmaxes could tie within float noise and
batched-vs-alone comparisons would flip on rounding; sharp logits make the comparison about the code.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from nanocomposer.model import PRESETS, build_model, build_tokenizer, count_parameters, ffn_width

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

DEVICE_ENV = "NANOCOMPOSER_TEST_DEVICE"
STDLIB_FILES = ("json/encoder.py", "json/decoder.py", "textwrap.py", "shlex.py")
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
USER_TEXTS = (  # different lengths, so a batch of them needs padding
    "Fix the bug.",
    "add(2, 3) returns -1 instead of 5; the tests in tests/test_ops.py show it.",
    "Which file defines `_Parser.accept`? Answer with the path.",
    ("The function `parse_duration` in durations/core.py rejects '1h30m' although the docstring promises "
     "that hours and minutes can be combined; make it accept them and keep the other tests passing."),
)


def pick_device() -> torch.device:
    forced = os.environ.get(DEVICE_ENV)
    if forced:
        return torch.device(forced)
    if not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA device ({DEVICE_ENV}=cpu runs it on the CPU)")
    return torch.device("cuda")


@pytest.fixture(scope="module")
def device() -> torch.device:
    device = pick_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 comparisons below mean fp32, not TF32
        torch.backends.cudnn.allow_tf32 = False
    return device


def llama(vocab: int, hidden: int, layers: int, heads: int, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn_width(hidden),
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def model_under_test(device: torch.device) -> LlamaForCausalLM:
    """The gpu_scratch preset on CUDA; a micro model of the same architecture on the CPU (dry run)."""
    if device.type == "cuda":
        p = PRESETS["gpu_scratch"]
        return llama(p["vocab_size"], p["hidden"], p["layers"], p["heads"]).to(device)
    return llama(512, 64, 2, 2).to(device)


# --------------------------------------------------------------------------- no accelerator needed


def test_gpu_scratch_preset_has_the_documented_size():
    """91,245,312 parameters at the full 8,192 vocabulary: the figure model.py's docstring and the README give."""
    p = PRESETS["gpu_scratch"]
    with torch.device("meta"):
        model = llama(p["vocab_size"], p["hidden"], p["layers"], p["heads"])
    assert count_parameters(model) == 91_245_312
    assert 50e6 <= count_parameters(model) <= 150e6


# --------------------------------------------------------------------------- the GPU stack and recipes (CPU)

ROOT = Path(__file__).resolve().parents[1]
PINNED = {"vllm": "0.31.0", "torch": "2.13.0", "transformers": "5.17.0", "trl": "1.16.0"}


@pytest.mark.slow
def test_gpu_requirements_resolve_from_metadata(tmp_path):
    """requirements-gpu.txt resolves as one set (pip's resolver on package metadata only, nothing installed):
    vLLM inside TRL 1.16's supported range (0.22-0.31) with the torch and transformers it pins."""
    import json
    import subprocess
    import sys

    from packaging.version import Version

    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    probe = subprocess.run([*pip, "index", "versions", "vllm"], capture_output=True, text=True, timeout=120,
                           check=False)
    if probe.returncode != 0:
        pytest.skip(f"the package index is unreachable (pip index versions vllm: {probe.stderr.strip()[-200:]})")
    report = tmp_path / "report.json"
    proc = subprocess.run([*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                           "-r", str(ROOT / "requirements-gpu.txt")], capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    for name, version in PINNED.items():
        assert Version(resolved[name]).base_version == version, (name, resolved.get(name))
    assert Version("0.22.0") <= Version(resolved["vllm"]) <= Version("0.31.0")


def test_gpu_recipes_share_one_budget_and_batch_their_episodes(monkeypatch):
    """recipes/gpu: every stage's budgets come from budget.yaml (none set in a stage recipe); RL's vLLM context
    fits the episode context; no sleep mode; the SFT check and eval batch their episodes; no key transformers
    5.17 (the GPU stack) lacks."""
    import re

    import yaml

    import eval as eval_script
    import train_rl
    import train_sft
    from env.budget import BUDGET_FILE_KEYS, Budget, load_budget_file

    monkeypatch.chdir(ROOT)
    budget = load_budget_file("recipes/gpu/budget.yaml")
    for recipe in sorted((ROOT / "recipes" / "gpu").glob("*.yaml")):
        if recipe.name == "budget.yaml":
            continue
        keys = set(yaml.safe_load(recipe.read_text()))
        assert not keys & {*BUDGET_FILE_KEYS, *(f"check_{k}" for k in BUDGET_FILE_KEYS)}, recipe.name
        assert "activation_checkpointing" not in keys, recipe.name
    cpu = ["--bf16", "false", "--use_cpu", "true"]
    rl, rl_training = train_rl.make_parser().parse_args_and_config(["--config", "recipes/gpu/rl.yaml", *cpu])[:2]
    sft = train_sft.make_parser().parse_args_and_config(["--config", "recipes/gpu/sft.yaml", *cpu])[0]
    ev, ev_budget = eval_script.parse_args(["--config", "recipes/gpu/eval.yaml", "--policy", "gold", "--output",
                                            "x.json"])
    want = Budget(**budget)
    assert {k: getattr(ev_budget, k) for k in BUDGET_FILE_KEYS} == {k: getattr(want, k) for k in BUDGET_FILE_KEYS}
    assert {k: getattr(sft.check_budget(), k) for k in BUDGET_FILE_KEYS} == \
        {k: getattr(want, k) for k in BUDGET_FILE_KEYS}
    assert (rl.max_turns, rl.max_new_tokens, rl.max_context, rl.max_output_chars, rl.max_wall_s) == \
        (want.max_turns, want.max_new_tokens, want.max_context, want.max_output_chars, want.max_wall_s)
    assert rl_training.vllm_max_model_length >= want.max_context and rl_training.vllm_enable_sleep_mode is False
    assert sft.check_workers >= 32 and ev.workers >= 32
    script = (ROOT / "runs" / "gpu.sh").read_text()
    assert "--workers 1 " not in script and re.search(r"EVAL_WORKERS:-(\d+)", script).group(1) == "64"
    assert "--budget" in (ROOT / "runs" / "gpu_scratch.sh").read_text()


def test_a_stage_recipe_that_repeats_a_budget_key_is_refused(tmp_path, capsys):
    import train_rl

    (tmp_path / "budget.yaml").write_text("max_turns: 4\nmax_new_tokens: 32\n")
    (tmp_path / "rl.yaml").write_text("model_name_or_path: m\nmax_turns: 5\n")
    with pytest.raises(SystemExit):
        train_rl.make_parser().parse_args_and_config(["--config", str(tmp_path / "rl.yaml")])
    assert "max_turns is set in the budget file" in capsys.readouterr().err
    (tmp_path / "rl.yaml").write_text("model_name_or_path: m\n")
    args = train_rl.make_parser().parse_args_and_config(["--config", str(tmp_path / "rl.yaml"), "--max_new_tokens",
                                                         "16", "--bf16", "false", "--use_cpu", "true"])[0]
    assert (args.max_turns, args.max_new_tokens) == (4, 16)  # the file's, and a flag still wins
    (tmp_path / "budget.yaml").write_text("temperature: 0.7\n")
    with pytest.raises(SystemExit):
        train_rl.make_parser().parse_args_and_config(["--config", str(tmp_path / "rl.yaml")])
    assert "unknown key 'temperature'" in capsys.readouterr().err


# --------------------------------------------------------------------------- bf16 training step


@pytest.mark.gpu
def test_bf16_forward_backward_matches_fp32_and_learns(device):
    model = model_under_test(device)
    torch.manual_seed(1)
    shape = (4, 256) if device.type == "cuda" else (2, 128)  # the CPU dry run keeps to seconds
    ids = torch.randint(0, model.config.vocab_size, shape, device=device)
    with torch.no_grad():
        fp32_loss = model(input_ids=ids, labels=ids).loss.item()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            autocast_loss = model(input_ids=ids, labels=ids).loss.item()
        bf16_copy = model_under_test(device).to(torch.bfloat16)  # same seed: the same weights, rounded
        bf16_loss = bf16_copy(input_ids=ids, labels=ids).loss.float().item()
        del bf16_copy
    assert abs(autocast_loss - fp32_loss) < 0.02 * fp32_loss, (autocast_loss, fp32_loss)
    assert abs(bf16_loss - fp32_loss) < 0.02 * fp32_loss, (bf16_loss, fp32_loss)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(4):  # the same batch: a working step must lower its loss
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), "a gradient is missing or not finite"
        assert sum(g.abs().sum().item() for g in grads) > 0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


# --------------------------------------------------------------------------- LoRA merge


@pytest.mark.gpu
def test_lora_adapter_merges_into_the_same_logits(device, tmp_path):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(2)
    base = llama(512, 64, 2, 2).to(device)
    base_q = base.model.layers[0].self_attn.q_proj.weight.detach().clone()
    peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0))
    ids = torch.randint(0, 512, (2, 64), device=device)
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):  # LoRA's B starts at zero: train it so the merge has something to merge
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peft_model.eval()
    with torch.no_grad():
        adapted = peft_model(input_ids=ids).logits
        merged = peft_model.merge_and_unload()
        merged_logits = merged(input_ids=ids).logits
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight, base_q), "the adapter did not move q_proj"
    assert not any("lora" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(merged_logits, adapted, rtol=1e-4, atol=1e-4)

    merged.save_pretrained(tmp_path / "merged")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").to(device).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, adapted, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- generation


@pytest.fixture(scope="module")
def micro_checkpoint(tmp_path_factory) -> Path:
    """A saved micro model (vocab 512, hidden 64, 2 layers) with sharp logits (module docstring)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tokenizer = build_tokenizer([(stdlib / f).read_text(encoding="utf-8") for f in STDLIB_FILES], 512)
    tokenizer.model_max_length = 2048
    model = build_model(tokenizer, hidden=64, layers=2, heads=2, context=2048, seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(10.0)
    dest = tmp_path_factory.mktemp("micro")
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def conversation(user_text: str) -> list[dict]:
    return [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": user_text}]


def make_policy(checkpoint: Path, device: torch.device, dtype: torch.dtype, temperature: float, max_new_tokens=24):
    from nanocomposer.engine.checkpoints import load_model_and_tokenizer
    from nanocomposer.policy import ModelPolicy, SamplingConfig

    model, tokenizer = load_model_and_tokenizer(checkpoint, device=str(device))
    model.to(dtype)
    return ModelPolicy(model, tokenizer, SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature,
                                                        seed=7))


def turn_requests():
    try:
        from env.episode import TurnRequest
    except ImportError:
        pytest.skip("env.episode has no TurnRequest (batched generation is not in this checkout)")
    return [TurnRequest(conversation(text), TOOLS, f"task-{i}#0", 0) for i, text in enumerate(USER_TEXTS)]


def alone(policy, request):
    """`act` on one request, as an episode would call it."""
    task_id, episode = request.episode_key.rsplit("#", 1)
    policy.task_id, policy.episode, policy.turn = task_id, int(episode), request.turn
    return policy.act(request.messages, request.tools)


@pytest.mark.gpu
def test_batched_greedy_generation_equals_unbatched(device, micro_checkpoint):
    from nanocomposer.policy import ModelPolicy

    if not hasattr(ModelPolicy, "act_batch"):
        pytest.skip("ModelPolicy.act_batch does not exist in this checkout (batched generation not added yet)")
    requests = turn_requests()
    policy = make_policy(micro_checkpoint, device, torch.float32, temperature=0.0)
    batched = policy.act_batch(requests)
    for request, together in zip(requests, batched, strict=True):
        assert not isinstance(together, BaseException), together
        single = alone(policy, request)
        assert together.prompt_ids == single.prompt_ids
        assert together.completion_ids == single.completion_ids, request.messages[-1]["content"]
        torch.testing.assert_close(torch.tensor(together.logprobs), torch.tensor(single.logprobs),
                                   rtol=0, atol=1e-3)
    lengths = {len(g.prompt_ids) for g in batched}
    assert len(lengths) == len(requests), "the prompts should differ in length, so the batch is padded"


# --------------------------------------------------------------------------- token-in/token-out


def scored_logprobs(model, prompt_ids: list[int], completion_ids: list[int], device) -> torch.Tensor:
    """log p(completion token | everything before it), from one forward pass over prompt + completion."""
    ids = torch.tensor([prompt_ids + completion_ids], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt_ids):, None]).squeeze(-1).cpu()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 2e-3), (torch.bfloat16, 0.15)], ids=["fp32", "bf16"])
def test_generation_logprobs_equal_the_models_scoring(device, micro_checkpoint, dtype, atol):
    """Sampled at temperature 1 (processed logprobs = the model's own distribution): what generation reports
    for each token is what the trainer's forward pass computes for it, so GRPO's importance ratio starts at 1."""
    from nanocomposer.policy import ModelPolicy

    policy = make_policy(micro_checkpoint, device, dtype, temperature=1.0, max_new_tokens=16)
    if hasattr(ModelPolicy, "act_batch"):  # each request alone, then all of them in one batch
        requests = turn_requests()
        generations = [alone(policy, r) for r in requests] + list(policy.act_batch(requests))
    else:  # the one-sequence path only
        policy.reset("task-0")
        generations = [policy.act(conversation(text), TOOLS) for text in USER_TEXTS]
    assert sum(len(g.completion_ids) for g in generations) > 2 * len(generations)
    for generation in generations:
        assert not isinstance(generation, BaseException), generation
        reported = torch.tensor(generation.logprobs, dtype=torch.float32)
        scored = scored_logprobs(policy.model, generation.prompt_ids, generation.completion_ids, device)
        assert reported.shape == scored.shape
        assert (reported <= 0).all()
        torch.testing.assert_close(reported, scored, rtol=0, atol=atol)
        if dtype == torch.bfloat16:  # bf16 rounding is per token; the mean error must still be small
            assert (reported - scored).abs().mean().item() < atol / 3
