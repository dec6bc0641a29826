"""Batched transformers generation (nanocomposer/engine/) and ModelPolicy.act_batch, on a micro checkpoint.

The central property: a prompt generates the same tokens (greedy, or sampled from its own seed) and the same
log-probs whether it runs alone or in a left-padded batch with prompts of very different lengths, and whether
its batch-mates stop early or not. The reference for "alone" is transformers' own `model.generate`.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, save_micro_checkpoint
from transformers import TemperatureLogitsWarper, TopPLogitsWarper

from env.episode import Episode, EpisodeConfig, TurnRequest, initial_messages, load_prompts
from env.tools import CodeTools, tool_schemas
from nanocomposer.engine.sampling import Completion, SamplingConfig, run_isolated
from nanocomposer.engine.transformers_backend import TransformersGenerator, length_batches
from nanocomposer.policy import ContextOverflow, ModelPolicy, _stable_seed

LENGTHS = (3, 40, 700, 1500)  # very different prompt lengths in one batch


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # a 140 k-parameter model gains nothing from threads


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> ModelPolicy:
    path = save_micro_checkpoint(tmp_path_factory.mktemp("micro") / "sft")
    return ModelPolicy(path, sampling=SamplingConfig(max_new_tokens=12))


@pytest.fixture(scope="module")
def prompts(policy) -> list[list[int]]:
    vocab = policy.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in LENGTHS]


def _generator(policy, **kwargs) -> TransformersGenerator:
    return TransformersGenerator(policy.model, policy.stop_ids, **kwargs)


def _count_batches(generator: TransformersGenerator) -> list[list[int]]:
    """Record the prompt lengths of every batch the generator decodes (a failed batch is retried row by row,
    which would hide a bug behind correct results: tests assert the batches they expect)."""
    calls: list[list[int]] = []
    real_decode = generator.decode_batch
    generator.decode_batch = lambda p, s, c: calls.append([len(x) for x in p]) or real_decode(p, s, c)
    return calls


def _hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy decoding of one unpadded prompt, never stopping early."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def _forward_logprobs(model, prompt, completion, warpers=()) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    for warp in warpers:
        logits = torch.stack([warp(None, row[None])[0] for row in logits])
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


# --------------------------------------------------------------------------- batched == alone


@pytest.mark.parametrize("padded", [False, True], ids=["row-prefill", "padded-prefill"])
def test_batched_greedy_gives_the_tokens_of_each_prompt_alone(policy, prompts, padded):
    generator = _generator(policy, borrowed=True, padded_prefill=padded)
    sampling = SamplingConfig(max_new_tokens=12)
    never_stop = TransformersGenerator(policy.model, [policy.model.config.vocab_size + 1],  # an id never sampled
                                       padded_prefill=padded)
    batches = _count_batches(never_stop)
    batched = never_stop.generate(prompts, [0] * len(prompts), sampling)
    assert batches == [sorted(LENGTHS, reverse=True)]
    for prompt, result in zip(prompts, batched, strict=True):
        assert result.ids == _hf_greedy(policy.model, prompt, 12)
        (alone,) = never_stop.generate([prompt], [0], sampling)
        assert alone.ids == result.ids and alone.logprobs == pytest.approx(result.logprobs, abs=1e-5)
        if not padded:  # the prefill is the very forward the prompt gets alone: its logits are bitwise equal
            assert alone.logprobs[0] == result.logprobs[0]
        assert torch.allclose(torch.tensor(result.logprobs), _forward_logprobs(policy.model, prompt, result.ids),
                              atol=1e-4)
    assert generator.generate(prompts, [0] * 4, sampling) == generator.generate(prompts[::-1], [0] * 4, sampling)[::-1]


@pytest.mark.parametrize("padded", [False, True], ids=["row-prefill", "padded-prefill"])
def test_rows_that_stop_leave_the_batch_without_changing_the_others(policy, prompts, padded):
    sampling = SamplingConfig(max_new_tokens=12)
    free = [_hf_greedy(policy.model, p, 12) for p in prompts]
    # a token one row writes (first at step k > 0) and no other row ever writes: a stop id for that row only
    row, k = max(((r, k) for r, ids in enumerate(free) for k in range(1, len(ids))
                  if ids[k] not in ids[:k] and all(ids[k] not in other for o, other in enumerate(free) if o != r)),
                 key=lambda rk: rk[1])
    generator = TransformersGenerator(policy.model, [policy.tokenizer.eos_token_id, free[row][k]],
                                      padded_prefill=padded)
    batches = _count_batches(generator)
    results = generator.generate(prompts, [0] * len(prompts), sampling)
    assert len(batches) == 1  # one batch, not retried row by row
    for r, (ids, result) in enumerate(zip(free, results, strict=True)):
        expected = ids[: k + 1] if r == row else ids
        assert result.ids == expected and len(result.logprobs) == len(expected)
    assert len(results[row].ids) == k + 1 < 12  # it stopped while the others went on to max_new_tokens


@pytest.mark.parametrize("temperature, top_p, padded", [(1.0, 1.0, False), (0.7, 0.9, False), (0.7, 0.9, True)])
def test_each_row_samples_from_its_own_seed(policy, prompts, temperature, top_p, padded):
    sampling = SamplingConfig(max_new_tokens=12, temperature=temperature, top_p=top_p)
    generator = _generator(policy, padded_prefill=padded)
    seeds = [11, 22, 33, 44]
    rng_before = torch.random.get_rng_state()
    batched = generator.generate(prompts, seeds, sampling)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the caller's RNG is untouched
    for prompt, seed, result in zip(prompts, seeds, batched, strict=True):
        (alone,) = generator.generate([prompt], [seed], sampling)
        assert alone.ids == result.ids  # whatever shares the batch
        warpers = [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
        expected = _forward_logprobs(policy.model, prompt, result.ids, warpers)
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4), (result.logprobs, expected)
    (other_seed,) = generator.generate([prompts[2]], [99], sampling)
    assert other_seed.ids != batched[2].ids


@pytest.mark.parametrize("padded", [False, True], ids=["row-prefill", "padded-prefill"])
def test_each_row_sees_the_positions_it_would_see_alone(policy, prompts, padded):
    """With RoPE a constant shift of every position barely changes the logits, so the positions are checked
    where the model receives them: the real tokens of a row are numbered 0.. as if it ran alone."""
    seen = []

    def record(module, args, kwargs):
        position_ids, mask = kwargs.get("position_ids"), kwargs.get("attention_mask")
        seen.append((kwargs["input_ids"].shape, None if position_ids is None else position_ids.clone(),
                     None if mask is None else mask.clone()))

    hook = policy.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        generator = _generator(policy, padded_prefill=padded)
        batches = _count_batches(generator)
        generator.generate(prompts, [0] * 4, SamplingConfig(max_new_tokens=3))
    finally:
        hook.remove()
    assert len(batches) == 1
    lengths = sorted(LENGTHS, reverse=True)
    if padded:
        (_, positions, mask), *steps = seen
        for row, n in enumerate(lengths):
            assert positions[row, -n:].tolist() == list(range(n)) and mask[row].sum() == n
    else:  # each prompt alone, unpadded, unmasked: transformers numbers its tokens 0..n-1
        prefills, steps = seen[:4], seen[4:]
        assert [(shape, positions, mask) for shape, positions, mask in prefills] == \
            [((1, n), None, None) for n in lengths]
    assert len(steps) == 2
    for k, (_, _, mask) in enumerate(steps):  # the prompt and the tokens generated so far, padding excluded
        assert [int(m.sum()) for m in mask] == [n + k + 1 for n in lengths]
    assert [[positions[row, 0].item() for _, positions, _ in steps] for row in range(4)] == \
        [[n, n + 1] for n in lengths]


def test_a_repeated_prompt_is_prefilled_once_and_each_copy_samples_from_its_seed(policy, prompts):
    generator = _generator(policy)
    prefills = []
    hook = policy.model.register_forward_pre_hook(
        lambda module, args, kwargs: prefills.append(kwargs["input_ids"].shape[1]) if kwargs.get("cache") is not None
        and kwargs["cache"].get_seq_length() == 0 else None, with_kwargs=True)
    group = [prompts[1], prompts[2], prompts[1], prompts[1]]  # G = 3 samples of one prompt, and another
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0)
    try:
        results = generator.generate(group, [5, 6, 7, 8], sampling)
    finally:
        hook.remove()
    assert sorted(prefills) == sorted([len(prompts[1]), len(prompts[2])])
    for prompt, seed, result in zip(group, [5, 6, 7, 8], results, strict=True):
        assert generator.generate([prompt], [seed], sampling)[0].ids == result.ids
    assert len({tuple(results[i].ids) for i in (0, 2, 3)}) > 1  # different seeds, different samples


def test_small_token_budget_splits_into_batches_with_the_same_results(policy, prompts):
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    seeds = [1, 2, 3, 4]
    one_batch = _generator(policy).generate(prompts, seeds, sampling)
    generator = _generator(policy, max_batch_tokens=800)
    calls = _count_batches(generator)
    split = generator.generate(prompts, seeds, sampling)
    assert [r.ids for r in split] == [r.ids for r in one_batch]
    for r, o in zip(split, one_batch, strict=True):
        assert r.logprobs == pytest.approx(o.logprobs, abs=1e-5)
    assert calls == [[1500], [700], [40, 3]]  # longest first; over-budget prompts run alone


def test_length_batches_cover_every_prompt_once_within_the_budget():
    lengths = [5, 900, 30, 30, 400, 2000, 7, 64]
    batches = length_batches(lengths, max_new_tokens=16, max_batch_tokens=1000, max_batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches[0] == [5]  # 2016 tokens: over budget, alone
    for batch in batches:
        assert len(batch) <= 3 and lengths[batch[0]] == max(lengths[i] for i in batch)
        assert len(batch) == 1 or len(batch) * (lengths[batch[0]] + 16) <= 1000
    assert length_batches([], 16, 1000, 3) == []


def test_a_failing_request_fails_alone(policy, prompts):
    vocab = policy.model.config.vocab_size
    bad = prompts[1][:-1] + [vocab + 5]  # an id outside the embedding table
    results = _generator(policy).generate([prompts[0], bad, prompts[2]], [0, 0, 0], SamplingConfig(max_new_tokens=4))
    assert isinstance(results[1], IndexError)
    assert isinstance(results[0], Completion) and isinstance(results[2], Completion)

    def run(indices):
        if 2 in indices:
            raise MemoryError("batch too big") if len(indices) > 1 else ValueError("request 2")
        return [Completion([i], [0.0]) for i in indices]

    out = run_isolated(run, [1, 2, 3])
    assert out[0] == Completion([1], [0.0]) and isinstance(out[1], ValueError) and out[2] == Completion([3], [0.0])


def test_borrowed_training_model_is_restored_and_builds_no_graph(policy, prompts):
    model = policy.model
    model.train()
    try:
        results = _generator(policy, borrowed=True).generate(prompts[:2], [1, 2], SamplingConfig(max_new_tokens=4,
                                                                                                  temperature=1.0))
        assert model.training and all(p.grad is None for p in model.parameters())
        assert all(len(r.ids) == len(r.logprobs) == 4 for r in results)
    finally:
        model.eval()


def test_bad_arguments_are_named(policy):
    generator = _generator(policy)
    with pytest.raises(ValueError, match="2 prompts but 1 seeds"):
        generator.generate([[5], [6]], [0], SamplingConfig())
    with pytest.raises(ValueError, match="an empty prompt"):
        generator.generate([[5], []], [0, 0], SamplingConfig())
    with pytest.raises(ValueError, match="no stop ids"):
        TransformersGenerator(policy.model, [])
    assert generator.generate([], [], SamplingConfig()) == []


# --------------------------------------------------------------------------- ModelPolicy.act_batch


def _requests(task, n: int) -> list[TurnRequest]:
    messages = initial_messages(task, task.repo_dir, load_prompts())
    tools = tool_schemas(CodeTools(task.repo_dir, task))
    return [TurnRequest(messages + [{"role": "user", "content": "and " * 40 * k}], tools, f"{task.id}#{k}", k)
            for k in range(n)]


def test_act_batch_equals_one_request_at_a_time_and_act(policy, calc_task):
    sampled = ModelPolicy(policy.model, policy.tokenizer, SamplingConfig(max_new_tokens=8, temperature=1.0, seed=4))
    requests = _requests(calc_task, 4)
    together = sampled.act_batch(requests)
    for request, gen in zip(requests, together, strict=True):
        (alone,) = sampled.act_batch([request])
        assert (alone.prompt_ids, alone.completion_ids, alone.text, alone.truncated) == \
            (gen.prompt_ids, gen.completion_ids, gen.text, gen.truncated)
        assert alone.logprobs == pytest.approx(gen.logprobs, abs=1e-5)
        assert gen.prompt_ids == sampled.render(request.messages, request.tools)
        assert all(math.isfinite(lp) and lp <= 0 for lp in gen.logprobs)
    assert len({tuple(g.completion_ids) for g in together}) > 1
    # act: the request of the episode `reset` started, with the same seed derivation
    sampled.reset(calc_task)
    first = sampled.act(requests[0].messages, requests[0].tools)
    (same,) = sampled.act_batch([TurnRequest(requests[0].messages, requests[0].tools, f"{calc_task.id}#0", 0)])
    assert first.completion_ids == same.completion_ids
    assert _stable_seed(4, f"{calc_task.id}#0", 0) != _stable_seed(4, f"{calc_task.id}#0", 1)
    assert sampled.act_batch([]) == []


def test_act_batch_isolates_requests_that_cannot_be_served(policy, calc_task):
    requests = _requests(calc_task, 3)
    sizes = [len(policy.render(r.messages, r.tools)) for r in requests]
    tight = ModelPolicy(policy.model, policy.tokenizer, SamplingConfig(max_new_tokens=8, max_context=sizes[1] + 8))
    broken = TurnRequest([{"role": "narrator", "content": "?"}], requests[0].tools, "broken#0", 0)  # unrenderable
    ok, fits, overflow, unrenderable = tight.act_batch([requests[0], requests[1], requests[2], broken])
    assert len(ok.completion_ids) >= 1 and len(fits.completion_ids) >= 1
    assert isinstance(overflow, ContextOverflow) and overflow.exit_status == "max_context"
    assert f"prompt of {sizes[2]} tokens" in str(overflow)
    assert isinstance(unrenderable, Exception) and "unknown role narrator" in str(unrenderable)
    with pytest.raises(ContextOverflow):
        tight.reset(calc_task)
        tight.act(requests[2].messages, requests[2].tools)


def test_episodes_driven_through_act_batch(policy, calc_task):
    """Several live episodes of one task stepped together through one shared policy (what env.runner does)."""
    episodes = [Episode(calc_task, EpisodeConfig(max_turns=2), "micro", f"{calc_task.id}#{k}").start()
                for k in range(3)]
    try:
        while pending := [(e, r) for e in episodes if (r := e.request()) is not None]:
            for (episode, _), result in zip(pending, policy.act_batch([r for _, r in pending]), strict=True):
                episode.step(result)
        trajectories = [e.finish() for e in episodes]
    finally:
        for e in episodes:
            e.close()
    assert all(t.turns and not t.error for t in trajectories), [t.error for t in trajectories]
    assert all(len(turn["completion_ids"]) == len(turn["logprobs"]) for t in trajectories for turn in t.turns)


# --------------------------------------------------------------------------- runs/gpu_check.sh


def _gpu_check(tmp_path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": sys.executable}
    return subprocess.run(["bash", str(ROOT / "runs" / "gpu_check.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.mark.slow  # `make test-fast` leaves it out
def test_gpu_check_dry_run_runs_the_transformers_half_on_cpu(tmp_path):
    checkpoint = save_micro_checkpoint(tmp_path / "micro")
    done = _gpu_check(tmp_path, "--dry-run", str(checkpoint))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "generation_transformers.json").read_text())
    assert report["backend"] == "transformers" and report["prompts"] == 2
    assert [row["batch"] for row in report["rows"]] == [1, 2]
    assert all(row["identical_to_alone"] == row["turns"] == 2 and row["tokens_per_s"] > 0 for row in report["rows"])
    assert "| batch | turns |" in (tmp_path / "out" / "gpu_check.log").read_text()


def test_gpu_check_fails_clearly_without_cuda_or_with_bad_arguments(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    checkpoint = save_micro_checkpoint(tmp_path / "micro")
    done = _gpu_check(tmp_path, str(checkpoint))
    assert done.returncode == 3 and "no CUDA device here" in done.stdout + done.stderr
    assert not (tmp_path / "out" / "generation_vllm.json").exists()
    bad = _gpu_check(tmp_path, "--fast")
    assert bad.returncode == 2 and "unknown option --fast" in bad.stderr
    missing = _gpu_check(tmp_path, str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no config.json" in missing.stderr


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # inside peft
def test_a_borrowed_peft_model_generates_like_its_merged_weights(policy, prompts):
    """RL with LoRA and in-process rollouts hands over a PeftModel in train mode."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(policy.model.config._name_or_path)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.train()
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    results = TransformersGenerator(lora, policy.stop_ids, borrowed=True).generate(prompts, [1, 2, 3, 4], sampling)
    assert lora.training and all(p.grad is None for p in lora.parameters())
    merged = lora.merge_and_unload().eval()
    expected = TransformersGenerator(merged, policy.stop_ids).generate(prompts, [1, 2, 3, 4], sampling)
    assert [r.ids for r in results] == [e.ids for e in expected]
    assert all(r.logprobs == pytest.approx(e.logprobs, abs=1e-4) for r, e in zip(results, expected, strict=True))


# --------------------------------------------------------------------------- prefix reuse across turns


def _turns(generator, first: list[list[int]], suffixes: list[list[list[int]]], sampling) -> list[list]:
    """Multi-turn conversations: each next prompt is the previous prompt, its completion and a new suffix (the
    tool results and the next header, as an episode's next turn). The completions of every turn, per row."""
    prompts, out = [list(p) for p in first], []
    for turn_suffixes in [*suffixes, None]:
        results = generator.generate(prompts, [0] * len(prompts), sampling)
        out.append(results)
        if turn_suffixes is None:
            return out
        prompts = [p + r.ids + s for p, r, s in zip(prompts, results, turn_suffixes, strict=True)]


def test_prefix_reuse_gives_the_tokens_of_a_full_prefill(policy, prompts):
    """Three turns of four conversations: with the prefix cache each later turn prefills only its suffix, and
    every turn generates what a full prefill of the same prompt generates."""
    sampling = SamplingConfig(max_new_tokens=12)
    never_stop = [policy.model.config.vocab_size + 1]
    g = torch.Generator().manual_seed(1)
    suffixes = [[torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 60, 1, 200)] for _ in range(2)]
    reuse = TransformersGenerator(policy.model, never_stop, prefix_cache_positions=20_000)
    full = TransformersGenerator(policy.model, never_stop)
    with_reuse = _turns(reuse, prompts, suffixes, sampling)
    without = _turns(full, prompts, suffixes, sampling)
    for turn_with, turn_without in zip(with_reuse, without, strict=True):
        for a, b in zip(turn_with, turn_without, strict=True):
            assert a.ids == b.ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    stats = reuse.prefix_cache.stats
    # turn 1 prefills everything; turns 2 and 3 reuse each prompt + completion but the last (never fed) token
    first_prompts = sum(LENGTHS)
    reused = sum(len(p) + 11 for p in prompts) + sum(len(p) + 12 + len(s) + 11 for p, s in zip(prompts, suffixes[0]))
    assert stats["reused_positions"] == reused
    assert stats["prefilled_positions"] == first_prompts + 2 * 4 + sum(map(len, suffixes[0] + suffixes[1]))
    assert len(reuse.prefix_cache) == 4  # one entry per conversation: each turn replaced the one it extends
    assert full.prefix_cache.stats["lookups"] == 0 and len(full.prefix_cache) == 0


def test_a_prompt_that_departs_from_the_cached_one_reuses_only_the_shared_prefix(policy, prompts):
    sampling = SamplingConfig(max_new_tokens=12)
    reuse = TransformersGenerator(policy.model, policy.stop_ids, prefix_cache_positions=20_000)
    full = TransformersGenerator(policy.model, policy.stop_ids)
    base = prompts[3]  # 1,500 tokens
    (first,) = reuse.generate([base], [0], sampling)
    departs = base[:900] + [(base[900] + 1) % 500 + 3] + base[901:1200]  # differs at position 900
    shorter = base[:700]  # a prefix of the cached sequence: all but its last token reused
    unrelated = [(t + 7) % 500 + 3 for t in base[:300]]  # differs from the first token
    for prompt, expected_reuse in ((departs, 900), (shorter, 699), (unrelated, 0)):
        before = reuse.prefix_cache.stats["reused_positions"]
        (a,) = reuse.generate([prompt], [0], sampling)
        (b,) = full.generate([prompt], [0], sampling)
        assert a.ids == b.ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert reuse.prefix_cache.stats["reused_positions"] - before == expected_reuse
    assert first.ids  # the first call generated (and stored) normally
    reuse.clear_prefix_cache()
    assert len(reuse.prefix_cache) == 0 and reuse.prefix_cache.positions == 0


def test_prefix_cache_stays_within_its_positions_least_recently_used_first_out():
    from nanocomposer.engine.prefix_cache import PrefixCache

    def states(n: int):
        return [(torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4))]

    cache = PrefixCache(max_positions=100)
    cache.store(list(range(40)), states(40))  # a
    cache.store(list(range(100, 140)), states(40))  # b
    assert cache.positions == 80 and len(cache) == 2
    assert cache.longest(list(range(30)) + [999])[1] == 30  # a is now the most recently used
    cache.store(list(range(200, 240)), states(40))  # c: over 100, so the least recently used (b) goes
    assert cache.positions == 80 and cache.longest(list(range(100, 140)))[0] is None
    cache.store(list(range(70)), states(70))  # extends a: replaces it; then c must go to fit (40 + 70 > 100)
    assert cache.positions == 70 and len(cache) == 1
    assert cache.longest(list(range(200, 240)))[0] is None
    found, common = cache.longest(list(range(80)))
    assert common == 70 and found[0][0].shape[-2] == 70
    cache.store(list(range(101)), states(101))  # larger than the whole budget: not kept, nothing evicted
    assert cache.positions == 70 and len(cache) == 1
    assert PrefixCache(0).longest([1, 2])[0] is None
    with pytest.raises(ValueError, match="max_positions=-1"):
        PrefixCache(-1)


def test_conversations_with_prefix_reuse_equal_conversations_without(policy, calc_task):
    """Multi-turn conversations rendered with the checkpoint's chat template through act_batch, prefix cache on
    (what a checkpoint ModelPolicy loads with) and off: the same prompts and completions every turn, and the
    template keeps each turn's prompt a prefix of the next, so later turns reuse the earlier states."""
    sampling = SamplingConfig(max_new_tokens=12)
    on = ModelPolicy(policy.name, sampling=sampling)
    off = ModelPolicy(policy.name, sampling=sampling, prefix_cache_positions=0)
    assert on.generator.prefix_cache.max_positions > 0 and off.generator.prefix_cache.max_positions == 0
    assert ModelPolicy(on.model, on.tokenizer).generator.prefix_cache.max_positions == 0  # borrowed: off

    def play(model_policy) -> list[list]:
        requests, turns = _requests(calc_task, 3), []
        for turn in range(3):
            generations = model_policy.act_batch(requests)
            turns.append([(g.prompt_ids, g.completion_ids) for g in generations])
            requests = [TurnRequest(r.messages + [{"role": "assistant", "content": g.text},
                                                  {"role": "tool", "content": f"result {turn} " * (5 + 20 * k)}],
                                    r.tools, r.episode_key, turn + 1)
                        for k, (r, g) in enumerate(zip(requests, generations, strict=True))]
        return turns

    assert play(on) == play(off)
    stats = on.generator.prefix_cache.stats
    assert stats["reused_positions"] > 2 * stats["prefilled_positions"] / 3  # most of turns 2 and 3 reused
