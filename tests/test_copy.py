"""Copy-rich synthetic corpus (data/build_copy_corpus.py), the in-context copy metric
(nanocomposer/copy_eval.py), the labelled-only LM head and the compact tool header."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch
from datasets import Dataset, load_from_disk
from transformers import LlamaConfig, LlamaForCausalLM

import train_cpt
from data.build_copy_corpus import (
    HELD_OUT_OFFSET,
    SEED_STRIDE,
    build_copy_corpus,
    document_seed,
    generate_document,
    generate_split,
    mix_corpora,
    occurrences,
)
from env.episode import load_prompts
from env.tools import CodeTools, tool_schemas
from nanocomposer.config import ConfigError
from nanocomposer.copy_eval import CopyAccuracyCallback, copy_accuracy, make_probes
from nanocomposer.model import build_tokenizer, labelled_only_loss
from tests.test_train_cpt import cpt_args, micro  # noqa: F401  (micro is a fixture)

# Tokens of the system prompt + tool list. With the tiny pipeline's tokenizer (vocab 8192, trained on the
# built code corpus) the header is 150 tokens (53 of them env/prompts.yaml's system prompt); the test's
# stand-in tokenizer, trained on the standard library alone, splits the tool names a little more: 155.
HEADER_BUDGET = 155


# --------------------------------------------------------------------------- generator


def test_generator_is_deterministic_per_seed():
    assert generate_document(7).text == generate_document(7).text
    assert generate_document(7).text != generate_document(8).text
    assert [d.text for d in generate_split("train", 5, seed=3)] == [d.text for d in generate_split("train", 5, 3)]
    assert [d.text for d in generate_split("train", 5, 3)] != [d.text for d in generate_split("train", 5, 4)]


def test_train_and_held_out_seed_ranges_are_disjoint():
    train = {document_seed("train", i, seed) for seed in range(4) for i in (0, 1, SEED_STRIDE - 1)}
    held_out = {document_seed("validation", i, seed) for seed in range(4) for i in (0, 1, SEED_STRIDE - 1)}
    assert not train & held_out
    assert max(train) < HELD_OUT_OFFSET <= min(held_out)
    assert document_seed("train", SEED_STRIDE - 1, 0) < document_seed("train", 0, 1)  # seeds do not overlap
    with pytest.raises(ValueError, match="index"):
        document_seed("train", SEED_STRIDE, 0)
    with pytest.raises(ValueError, match="split"):
        document_seed("test", 0, 0)


def test_documents_define_then_reuse_fresh_identifiers():
    for doc in generate_split("train", 50):
        reused = [n for n in set(doc.identifiers) if len(occurrences(doc.text, n)) >= 2]
        assert len(reused) >= 3, doc.text
        assert all(n.isidentifier() and not n.startswith("_") for n in doc.identifiers)
        assert "# file: " in doc.text
    # the tool-call transcripts are in the harness's format and name an identifier the document defined
    transcript = next(d for d in generate_split("train", 50) if "<tool_call>" in d.text)
    call = json.loads(transcript.text.split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    named = call["arguments"].get("pattern") or call["arguments"]["path"]
    assert named in transcript.text.split("<tool_call>")[0]


def test_build_writes_a_corpus_train_cpt_can_read(tmp_path):
    out = tmp_path / "copy"
    manifest = build_copy_corpus(out, 30, 5, seed=2)
    dataset = load_from_disk(str(out))
    assert set(dataset) == {"train", "validation"} and len(dataset["train"]) == 30
    assert dataset["train"].column_names == ["text", "source", "path", "license", "kind"]
    assert dataset["train"][0]["text"] == generate_document(document_seed("train", 0, 2)).text
    assert json.loads((out / "manifest.json").read_text())["splits"] == manifest["splits"]
    with pytest.raises(ValueError, match="not empty|exists"):
        build_copy_corpus(out, 30, 5, seed=2)
    with pytest.raises(ValueError, match="--documents"):
        build_copy_corpus(tmp_path / "none", 0, 5)


def test_mix_takes_the_share_of_characters_and_refuses_a_short_corpus():
    code = Dataset.from_dict({"text": ["x = 1\n" * 200] * 10, "other": ["a"] * 10})
    extra = Dataset.from_dict({"text": [d.text for d in generate_split("train", 200)]})
    mixed = mix_corpora(code, extra, 0.3, seed=0)
    assert mixed.column_names == ["text"]
    copy_chars = sum(len(t) for t in mixed["text"] if not t.startswith("x = 1"))
    assert 0.3 <= copy_chars / sum(map(len, mixed["text"])) < 0.35
    with pytest.raises(ValueError, match="needs"):
        mix_corpora(code, extra.select(range(2)), 0.5, seed=0)


# --------------------------------------------------------------------------- copy metric


@pytest.fixture(scope="module")
def code_tokenizer():
    """A vocab-8192 byte-level BPE trained on the standard library (like our base model's, ~5 s)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))]
    return build_tokenizer(texts, 8192)


class Oracle(torch.nn.Module):
    """A "model" that knows every probe's true continuation; `wrong_last` misses the last target token."""

    def __init__(self, probes, vocab: int, wrong_last: bool = False):
        super().__init__()
        self.vocab, self.sequences = vocab, {}
        for p in probes:
            sequence = list(p.context + p.targets)
            if wrong_last:
                sequence[-1] = (sequence[-1] + 1) % vocab
            self.sequences[tuple(p.context + p.targets[:-1])] = sequence

    def forward(self, input_ids, attention_mask):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        for r, (row, mask) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
            sequence = self.sequences[tuple(row[:sum(mask)])]
            for t in range(len(sequence) - 1):
                logits[r, t, sequence[t + 1]] = 1.0
        return type("Output", (), {"logits": logits})()


def test_copy_probes_are_held_out_second_occurrences(code_tokenizer):
    probes = make_probes(code_tokenizer, 40, max_context=256)
    assert len(probes) == 40 and len({p.identifier for p in probes}) > 30
    for p in probes:
        assert len(p.context) <= 256
        target_text = code_tokenizer.decode(p.targets)
        assert p.identifier in target_text and len(target_text) <= len(p.identifier) + 1
        assert p.identifier in code_tokenizer.decode(p.context)  # the first occurrence is in the window
    train_names = {n for d in generate_split("train", 200) for n in d.identifiers}
    assert len({p.identifier for p in probes} & train_names) <= 4  # fresh names (short ones can recur)


def test_copy_accuracy_separates_a_perfect_copier_from_a_random_model(code_tokenizer):
    probes = make_probes(code_tokenizer, 60, max_context=128)
    vocab = len(code_tokenizer)
    assert copy_accuracy(Oracle(probes, vocab), probes, batch_size=16) == {
        "copy_accuracy": 1.0, "copy_token_accuracy": 1.0, "next_name_accuracy": 1.0, "copy_probes": 60}
    near = copy_accuracy(Oracle(probes, vocab, wrong_last=True), probes)
    assert near["copy_accuracy"] == near["next_name_accuracy"] == 0.0  # exact match is strict
    assert 0.0 < near["copy_token_accuracy"] < 1.0
    torch.manual_seed(0)
    random_model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=1, num_attention_heads=2,
                                                num_key_value_heads=2, max_position_embeddings=256))
    random_model.train()
    result = copy_accuracy(random_model, probes)
    assert result["copy_accuracy"] <= 0.05 and result["copy_token_accuracy"] < 0.1
    assert random_model.training  # mode restored


def test_callback_logs_copy_accuracy_at_every_evaluation(code_tokenizer):
    probes = make_probes(code_tokenizer, 10, max_context=128)
    logged = []
    callback = CopyAccuracyCallback(probes, logged.append)
    metrics = {"eval_loss": 1.0}
    state = type("State", (), {"is_world_process_zero": True})()
    callback.on_evaluate(None, state, None, model=Oracle(probes, len(code_tokenizer)), metrics=metrics)
    assert logged == [{"eval_copy_accuracy": 1.0, "eval_copy_token_accuracy": 1.0, "eval_next_name_accuracy": 1.0}]
    assert metrics["eval_copy_accuracy"] == 1.0


def test_cpt_mixes_the_copy_corpus_and_logs_copy_accuracy(micro, tmp_path):  # noqa: F811
    build_copy_corpus(tmp_path / "copy", 300, 5)
    metrics = train_cpt.main(*cpt_args(micro, tmp_path / "runs", "--mix_dataset_path", str(tmp_path / "copy"),
                                       "--mix_fraction", "0.2", "--copy_eval_probes", "8", "--max_steps", "2"))
    assert 0.0 <= metrics["final_copy_accuracy"] <= 1.0
    with pytest.raises(ConfigError, match="needs"):  # 0.9 of the code corpus is more than 300 documents hold
        train_cpt.main(*cpt_args(micro, tmp_path / "runs2", "--mix_dataset_path", str(tmp_path / "copy"),
                                 "--mix_fraction", "0.99"))
    with pytest.raises(SystemExit):  # a fraction without a corpus: one-line argument error
        cpt_args(micro, tmp_path / "runs3", "--mix_fraction", "0.2")
    with pytest.raises(SystemExit):
        cpt_args(micro, tmp_path / "runs3", "--mix_dataset_path", str(tmp_path / "copy"), "--mix_fraction", "1")
    # 0 turns a recipe's mix off from the command line (the pretraining ablation's code-only arm): the path
    # is not read, so a missing one does not matter
    off = train_cpt.main(*cpt_args(micro, tmp_path / "runs4", "--mix_dataset_path", str(tmp_path / "missing"),
                                   "--mix_fraction", "0", "--max_steps", "1"))
    assert off["final_eval_loss"] > 0


# --------------------------------------------------------------------------- labelled-only LM head


def test_labelled_only_loss_equals_the_full_head_loss():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=128, tie_word_embeddings=True))
    ids = torch.randint(0, 300, (2, 60))
    labels = ids.clone()
    labels[0, :25] = -100  # prompt tokens
    labels[1, 10:50] = -100
    position_ids = torch.cat([torch.arange(30), torch.arange(30)]).repeat(2, 1)  # two packed documents a row
    for extra in ({}, {"position_ids": position_ids}):
        for items in (None, torch.tensor(37)):
            full = model(input_ids=ids, labels=labels, num_items_in_batch=items, **extra).loss
            full.backward()
            full_grads = [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
            ours = labelled_only_loss(model, ids, labels, num_items_in_batch=items, **extra)
            ours.backward()
            assert abs(full.item() - ours.item()) < 1e-5
            for reference, p in zip(full_grads, model.parameters()):
                assert torch.allclose(reference, p.grad, atol=1e-6)
            model.zero_grad()


# --------------------------------------------------------------------------- tool header


def test_tool_header_fits_the_budget(code_tokenizer):
    system = load_prompts()["system_template"].render()
    header = code_tokenizer.apply_chat_template([{"role": "system", "content": system}],
                                                tools=tool_schemas(CodeTools), tokenize=False)
    n_tokens = len(code_tokenizer(header, add_special_tokens=False)["input_ids"])
    assert n_tokens <= HEADER_BUDGET, (n_tokens, header)
    for schema in tool_schemas(CodeTools):  # every tool and every argument is still listed
        fn = schema["function"]
        assert fn["name"] + "(" in header and all(arg in header for arg in fn["parameters"]["properties"])


def test_head_benchmark_paths_agree_on_the_loss():
    from bench.model_speed import measure_head_paths

    results = measure_head_paths(vocab=512, hidden=32, layers=1, heads=2, seq=160, labelled=0.25, steps=1)
    assert set(results) == {"full", "trl_fused", "trl_fused_compact", "labelled_only"}
    losses = [r["loss"] for r in results.values()]
    assert max(losses) - min(losses) < 1e-5 and all(r["seconds"] > 0 for r in results.values())


def test_the_cue_is_the_shortest_prefix_with_one_right_continuation():
    from nanocomposer.copy_eval import unambiguous_cue

    # context "5 7 9 5 8": token 5 was followed by 7 and by 8, so a one-token cue 5 is ambiguous
    assert unambiguous_cue((5, 7, 9, 5, 8), (5, 7, 9)) == 2  # 5 7 -> 9: 7 was only ever followed by 9
    assert unambiguous_cue((1, 5, 7, 9), (5, 7, 9)) == 1
    assert unambiguous_cue((1, 2), (3, 4)) is None  # never seen: nothing to copy from
    assert unambiguous_cue((5, 6), (5,)) is None  # no token left after the cue


def test_dense_documents_are_train_only_and_re_export_their_imports_in_order():
    from data.build_copy_corpus import generate_dense_document, generate_split, is_dense

    train = generate_split("train", 200, dense_fraction=0.6)
    dense = [d for d in train if "__all__" in d.text]
    assert 90 <= len(dense) <= 150  # ~60% of 200, decided per document seed
    assert not any("__all__" in d.text for d in generate_split("validation", 200, dense_fraction=0.6))
    assert generate_split("train", 50) == generate_split("train", 50, dense_fraction=0.0)  # default unchanged
    doc = generate_dense_document(7)
    imported = doc.text.split("import (\n")[1].split(")")[0].split()
    exported = doc.text.split("__all__ = [\n")[1].split("]")[0].split()
    assert [n.rstrip(",") for n in imported] == [n.strip('",') for n in exported]  # one right order to copy
    assert is_dense(7, 1.0) and not is_dense(7, 0.0)
