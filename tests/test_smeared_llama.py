"""The smeared-key Llama (nanocomposer/smeared_llama.py): the same scores padded, cached, batched or alone, a
plain Llama when the smear is off, loadable by transformers' Auto classes, refused by the vLLM backend. How
fast it learns to copy is a benchmark (bench/copy_formation.py), not a test: it takes minutes."""

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, LlamaForCausalLM

from nanocomposer.engine.sampling import SamplingConfig
from nanocomposer.engine.transformers_backend import TransformersGenerator
from nanocomposer.smeared_llama import SmearedKeyLlamaConfig, SmearedKeyLlamaForCausalLM, previous_key_visible

SIZES = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "tie_word_embeddings": True, "max_position_embeddings": 512}


def smeared(seed: int = 0, **overrides) -> SmearedKeyLlamaForCausalLM:
    torch.manual_seed(seed)
    model = SmearedKeyLlamaForCausalLM(SmearedKeyLlamaConfig(**{**SIZES, **overrides})).eval()
    with torch.no_grad():  # distinct mixes per head, so a wrong head order or broadcast shows
        for layer in model.model.layers:
            layer.self_attn.key_smear_logit.copy_(torch.linspace(-1.5, 1.5, model.config.num_key_value_heads))
    return model


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, SIZES["vocab_size"], (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_left_padding_and_cached_decoding_score_like_the_row_alone(attention):
    model = smeared()
    model.config._attn_implementation = attention
    x = ids(40, 1)
    with torch.no_grad():
        alone = model(x).logits
        padded = torch.cat([torch.zeros(1, 7, dtype=torch.long), x], 1)
        mask = torch.cat([torch.zeros(1, 7, dtype=torch.long), torch.ones(1, 40, dtype=torch.long)], 1)
        assert torch.allclose(model(padded, attention_mask=mask).logits[:, 7:], alone, atol=1e-5)
        cache = DynamicCache(config=model.config)
        steps = [model(x[:, :25], cache=cache, use_cache=True).logits]
        steps += [model(x[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(25, 40)]
        assert torch.allclose(torch.cat(steps, 1), alone, atol=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_padded_grouped_query_chunks_over_a_cache_score_like_the_whole_row(attention):
    """Chunks over cached keys (a prefix-cached prefill, decoding), whichever way they are mixed, give what the
    whole padded row gives in one forward, with grouped-query heads and left padding."""
    model = smeared(num_key_value_heads=2)
    model.config._attn_implementation = attention
    x = ids(40, 2)
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), x], 1)
    mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 40, dtype=torch.long)], 1)
    with torch.no_grad():
        whole = model(padded, attention_mask=mask).logits
        cache = DynamicCache(config=model.config)
        chunks = []
        for start, stop in ((0, 12), (12, 32), (32, 33), (33, 45)):  # 20 queries over 12 keys mix the keys,
            #                                                           1 and 12 queries over more mix the scores
            chunks.append(model(padded[:, start:stop], attention_mask=mask[:, :stop], cache=cache,
                                use_cache=True).logits)
        assert torch.allclose(torch.cat(chunks, 1)[:, 5:], whole[:, 5:], atol=1e-5)


def test_packed_documents_do_not_smear_into_each_other():
    """CPT packs documents with position_ids restarting at each (block-causal attention): a document's first
    key must not mix with the previous document's last."""
    model = smeared()
    first, second = ids(20, 4), ids(15, 5)
    positions = torch.cat([torch.arange(20), torch.arange(15)])[None]
    with torch.no_grad():
        packed = model(input_ids=torch.cat([first, second], 1), position_ids=positions, use_cache=False).logits
        assert torch.allclose(packed[:, 20:], model(second).logits, atol=1e-5)


def test_the_smear_changes_scores_and_off_it_is_exactly_a_plain_llama():
    model = smeared()
    plain = LlamaForCausalLM(LlamaConfig(**SIZES)).eval()
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all("key_smear_logit" in k for k in unexpected)
    x = ids(30, 2)
    with torch.no_grad():
        assert not torch.allclose(model(x).logits, plain(x).logits, atol=1e-4)
        for layer in model.model.layers:
            layer.self_attn.key_smear_logit.fill_(100.0)  # weight 1 on each key's own value
        assert torch.allclose(model(x).logits, plain(x).logits, atol=1e-5)


def test_bf16_keeps_one_dtype_through_attention():
    model = smeared().to(torch.bfloat16)
    x = ids(12, 6)
    with torch.no_grad():
        for attention in ("sdpa", "eager"):
            model.config._attn_implementation = attention
            assert model(x).logits.dtype == torch.bfloat16
            padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
            mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 12, dtype=torch.long)], 1)
            assert torch.isfinite(model(padded, attention_mask=mask).logits).all()


def test_saved_model_loads_through_auto_classes_with_every_weight(tmp_path):
    model = smeared()
    model.save_pretrained(tmp_path)
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded) is SmearedKeyLlamaForCausalLM
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    x = ids(20, 3)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x).logits, model(x).logits)


def test_batched_greedy_generation_equals_one_at_a_time():
    model = smeared()
    prompts = [ids(n, 10 + n)[0].tolist() for n in (3, 17, 60, 9)]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=12)
    batched = TransformersGenerator(model, stop_ids=[1]).generate(prompts, [0, 1, 2, 3], sampling)
    for prompt, seed, result in zip(prompts, [0, 1, 2, 3], batched, strict=True):
        (alone,) = TransformersGenerator(model, stop_ids=[1]).generate([prompt], [seed], sampling)
        assert result.ids == alone.ids


def test_previous_key_visibility_from_masks():
    # 2 rows x 4 keys, the first row left-padded by one; boolean and additive masks say the same.
    allowed = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :].expand(2, 1, 4, 4)
    allowed = allowed & torch.ones(4, 4, dtype=torch.bool).tril()
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    for mask in (allowed, additive):
        visible = previous_key_visible(mask, 2, 4, 4, "cpu")[:, 0, :, 0]
        assert visible.tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    assert previous_key_visible(None, 1, 1, 3, "cpu")[0, 0, :, 0].tolist() == [0, 1, 1]


def test_vllm_backend_refuses_a_smeared_checkpoint(tmp_path, monkeypatch):
    from nanocomposer import policy

    monkeypatch.setattr(policy, "require_vllm", lambda: None)
    monkeypatch.setattr(policy, "load_config_and_tokenizer",
                        lambda path: (tmp_path, SmearedKeyLlamaConfig(**SIZES), [1], None))
    with pytest.raises(policy.ModelLoadError, match="vLLM has no smeared_llama"):
        policy.ModelPolicy(tmp_path, backend="vllm", start_engine=False)


def test_copy_formation_bench_runs_both_architectures(capsys):
    from bench.copy_formation import main

    main(["--steps", "2", "--every", "1", "--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "300",
          "--distinct", "50", "--threads", "1"])
    table = capsys.readouterr().out.split("step     llama   smeared")[1].split()
    assert len(table) == 9 and all(0.0 <= float(v) <= 1.0 for v in table[1::3] + table[2::3])
