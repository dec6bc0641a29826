"""Continuous batching (nanocomposer/engine/stream.py DecodeStream) on a micro checkpoint.

The property that matters: a sequence gets the tokens (greedy, or sampled from its own seed) and log-probs it
gets alone, whenever it joins the running batch, whoever leaves it, and however often the stream moves its
KV window.
"""

import pytest
import torch
from conftest import save_micro_checkpoint

from nanocomposer.engine.kv_cache import plan_layout
from nanocomposer.engine.sampling import Completion, SamplingConfig
from nanocomposer.engine.transformers_backend import TransformersGenerator
from nanocomposer.policy import ModelPolicy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LENGTHS = (3, 40, 700, 1500, 9, 300, 64, 1200)


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> ModelPolicy:
    path = save_micro_checkpoint(tmp_path_factory.mktemp("micro") / "sft")
    return ModelPolicy(path, sampling=SamplingConfig(max_new_tokens=12))


@pytest.fixture(scope="module")
def prompts(policy) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, policy.model.config.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]


def _drain(stream, arrivals: list[list[tuple]]) -> tuple[dict, int]:
    """Feed the stream: before step i, add arrivals[i] (key, prompt, seed); then step until empty.
    (results by key, steps taken)."""
    results, steps = {}, 0
    while steps < len(arrivals) or len(stream):
        for key, prompt, seed in arrivals[steps] if steps < len(arrivals) else []:
            stream.add(key, prompt, seed)
        for key, result in stream.step():
            assert key not in results
            results[key] = result
        steps += 1
    return results, steps


def _stops(policy, prompts, seeds, sampling) -> list[int]:
    """Stop ids under which the odd prompts stop at their first token and the even ones run on: the first
    token each odd prompt writes alone, unless an even prompt writes it too."""
    free = TransformersGenerator(policy.model, [policy.model.config.vocab_size + 1])
    outs = free.generate(prompts, seeds, sampling)
    keep_going = {t for o in outs[::2] for t in o.ids}
    return sorted({o.ids[0] for o in outs[1::2]} - keep_going)


@pytest.mark.parametrize("temperature, top_p, headroom", [(0.0, 1.0, None), (1.0, 1.0, None), (0.7, 0.9, 1)],
                         ids=["greedy", "sampled", "sampled-window-moves"])
def test_each_sequence_gets_its_tokens_alone_whenever_it_joins(policy, prompts, temperature, top_p, headroom):
    sampling = SamplingConfig(max_new_tokens=12, temperature=temperature, top_p=top_p)
    seeds = [10 + i for i in range(len(prompts))]
    generator = TransformersGenerator(policy.model, [policy.tokenizer.eos_token_id,
                                                     *_stops(policy, prompts, seeds, sampling)])
    stream = generator.stream(sampling)
    if headroom is not None:  # no spare columns: the window is rebuilt for almost every join
        stream.headroom = headroom
    relayouts, leaves = [], []
    real_relayout, real_leave = stream._relayout, stream._leave
    stream._relayout = lambda *a: relayouts.append(a) or real_relayout(*a)
    stream._leave = lambda done, tokens: leaves.append((sorted(done), len(stream.rows))) or real_leave(done, tokens)
    # two at first, then one joining at each of the next steps, the longest last
    arrivals = [[(0, prompts[0], 10), (1, prompts[1], 11)], *[[(i, prompts[i], 10 + i)] for i in range(2, 8)]]
    results, _ = _drain(stream, arrivals)
    assert sorted(results) == list(range(8))
    for i, prompt in enumerate(prompts):
        (alone,) = generator.generate([prompt], [10 + i], sampling)
        assert isinstance(results[i], Completion)
        assert results[i].ids == alone.ids, i
        assert results[i].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    # rows left from the middle of the batch while others went on (the last row moved into their slot)
    assert any(done[0] < live - len(done) for done, live in leaves), leaves
    assert len(relayouts) >= (4 if headroom == 1 else 1)
    assert stream.cache is None and not stream.rows  # empty after the last one left


def test_conversations_through_the_stream_reuse_prefixes_like_generate(policy, prompts):
    """Three turns of four conversations whose next turns join as their previous ones finish: the tokens of a
    full prefill, and each later turn prefilled only from its cached prefix."""
    sampling = SamplingConfig(max_new_tokens=12)
    stops = [policy.tokenizer.eos_token_id, *_stops(policy, prompts[:4], [0] * 4, sampling)]
    g = torch.Generator().manual_seed(1)
    suffixes = {(c, t): torch.randint(3, 500, (n,), generator=g).tolist()
                for c, n in enumerate((5, 60, 1, 200)) for t in range(2)}
    reuse = TransformersGenerator(policy.model, stops, prefix_cache_positions=20_000)
    full = TransformersGenerator(policy.model, stops)
    stream = reuse.stream(sampling)
    prompt_of = {(c, 0): prompts[c] for c in range(4)}
    for c in range(4):
        stream.add((c, 0), prompts[c], 0)
    done = {}
    while len(stream):
        for (c, t), result in stream.step():
            done[c, t] = result
            if t < 2:
                prompt_of[c, t + 1] = prompt_of[c, t] + result.ids + suffixes[c, t]
                stream.add((c, t + 1), prompt_of[c, t + 1], 0)
    assert len(done) == 12
    for key, result in done.items():
        (expected,) = full.generate([prompt_of[key]], [0], sampling)
        assert result.ids == expected.ids, key
    stats = reuse.prefix_cache.stats
    assert stats["reused_positions"] == sum(len(prompt_of[c, t]) + len(done[c, t].ids) - 1
                                            for c in range(4) for t in range(2))


def test_a_prompt_that_fails_fails_alone(policy, prompts):
    sampling = SamplingConfig(max_new_tokens=12)
    generator = TransformersGenerator(policy.model, [policy.tokenizer.eos_token_id])
    stream = generator.stream(sampling)
    bad = [policy.model.config.vocab_size + 5]  # no embedding for this id
    results, _ = _drain(stream, [[("ok", prompts[1], 0), ("bad", bad, 0)], [("later", prompts[0], 0)]])
    assert isinstance(results["bad"], Exception)
    for key, prompt in (("ok", prompts[1]), ("later", prompts[0])):
        assert results[key].ids == generator.generate([prompt], [0], sampling)[0].ids
    with pytest.raises(ValueError, match="empty prompt"):
        stream.add("empty", [], 0)


def test_a_stream_needs_row_by_row_prefill(policy):
    generator = TransformersGenerator(policy.model, [policy.tokenizer.eos_token_id], padded_prefill=True)
    assert not generator.can_stream()
    with pytest.raises(ValueError, match="not plain full attention"):
        generator.stream(SamplingConfig())


def test_the_runner_streams_a_model_and_plays_the_episodes_act_batch_plays(policy, calc_task):
    """env.runner with a checkpoint ModelPolicy: turns go through its stream (continuous batching); the same
    episodes through act_batch give the same records."""
    from env.episode import EpisodeConfig, Generation
    from env.runner import run_tasks

    class Reading(ModelPolicy):
        """Every turn's text is a valid read_file call naming the completion's length, so the untrained model's
        episodes go on for several turns (its ids, log-probs and the turns' lengths stay the model's)."""

        def _generation(self, prompt_ids, completion_ids, logprobs):
            g = super()._generation(prompt_ids, completion_ids, logprobs)
            call = f'{{"name": "read_file", "arguments": {{"path": "f{len(completion_ids)}.py"}}}}'
            return Generation(text=f"<tool_call>\n{call}\n</tool_call>", prompt_ids=g.prompt_ids,
                              completion_ids=g.completion_ids, logprobs=g.logprobs, truncated=g.truncated)

    sampling = SamplingConfig(max_new_tokens=12)
    streaming = Reading(policy.name, sampling=sampling)
    batching = Reading(policy.name, sampling=sampling)
    batching.open_stream = lambda: None
    steps = []
    real_open = streaming.open_stream

    def counted_stream():
        stream = real_open()
        real_step = stream.step
        stream.step = lambda: steps.append(len(stream)) or real_step()
        return stream

    streaming.open_stream = counted_stream
    config = EpisodeConfig(max_turns=3)

    def play(model_policy) -> list[tuple]:
        records = run_tasks([calc_task], lambda: model_policy, config, samples=4, concurrency=4, progress=False,
                            token_ids=True)
        return [(r["exit_status"], [(t["text"], t["completion_ids"]) for t in r["turns"]]) for r in records]

    assert play(streaming) == play(batching)
    assert steps and max(steps) > 1  # requests shared the stream
    assert streaming.stats["turns"] == batching.stats["turns"] == 4 * 3


def test_the_layout_plan_keeps_every_row_and_fits_every_joining_prompt():
    """plan_layout's promises over random stream states, including a prompt that joins at the right edge when
    the window could move left (a rule that moved it left first put that prompt at a negative column: the
    eval of 80 project tasks failed 6-7 episodes in some runs)."""
    import random

    rng = random.Random(0)
    cases = [([1, 26], 45, 4, 45, 1, 45)]  # at the edge; dropping column 0 would leave 44 columns for 45 tokens
    for _ in range(20_000):
        length = rng.randint(0, 3000)
        begins = [rng.randint(0, length - 1) for _ in range(rng.randint(0, 8))] if length else []
        capacity = length + rng.choice([0, 0, 1, rng.randint(0, 500)])
        rows = max(1, len(begins)) + rng.choice([0, 0, 3])
        joining = rng.choice([0, rng.randint(1, 8)])
        cases.append((begins, length, rows, capacity, joining, rng.randint(1, 3000) if joining else 0))
    for begins, length, rows, capacity, joining, longest in cases:
        new_rows, new_capacity, shift = plan_layout(begins, length, rows, capacity, joining, longest,
                                                    headroom=rng.choice([1, 512]), max_new_tokens=12)
        case = (begins, length, rows, capacity, joining, longest, (new_rows, new_capacity, shift))
        assert length + shift >= longest, case  # every joining prompt fits left of the write column
        assert all(b + shift >= 0 for b in begins), case  # no live row loses a column
        assert length + shift + 1 <= new_capacity, case  # the next decode column exists
        assert new_rows >= len(begins) + joining and new_capacity >= capacity and new_rows >= rows, case
        if begins and longest <= length < capacity:
            assert (new_rows, new_capacity, shift) == (max(rows, new_rows), capacity, 0)  # nothing moves


def test_decode_counters_and_the_traffic_they_imply(policy, prompts):
    """Two rows that never stop (no stop id), joined together: every step reads both rows over the longer
    one's window, and the counters (bench/decode_traffic.py's input) say exactly that."""
    from bench.decode_traffic import traffic

    sampling = SamplingConfig(max_new_tokens=5)
    generator = TransformersGenerator(policy.model, [policy.model.config.vocab_size + 1])
    stream = generator.stream(sampling)
    short, long = prompts[0], prompts[2]  # 3 and 700 tokens
    stream.add("s", short, 0)
    stream.add("l", long, 1)
    results, _ = _drain(stream, [])
    assert {k: len(r.ids) for k, r in results.items()} == {"s": 5, "l": 5}
    # the first token of each comes from its prefill; the other 4 each take one decode step over both rows
    steps = 4
    context = sum(len(short) + t + len(long) + t for t in range(1, steps + 1))
    window = sum(2 * (len(long) + t) for t in range(1, steps + 1))
    assert generator.decode_stats == {"steps": steps, "row_steps": 2 * steps, "attended_positions": window,
                                      "context_positions": context}
    config = policy.model.config
    report = traffic(generator.decode_stats, config, parameters=1000, element_bytes=4)
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    assert report["kv_bytes_per_position"] == kv and report["mean_rows"] == 2.0
    assert report["mb_per_token_one_at_a_time"] == round((4000 + context / 8 * kv) / 1e6, 2)
    assert report["window_over_context"] == round(window / context, 3) > 1.9
