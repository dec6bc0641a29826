"""The embedded base model: tokenizer round trip, chat template (exact text, prefix preservation,
assistant masks), TRL compatibility, and a micro model that saves, loads and generates."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanocomposer.model import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    TOOL_TOKENS,
    apply_chat_template_to,
    build_tokenizer,
    iter_corpus_texts,
    load_chat_template,
    main,
)

MICRO = {"vocab_size": 2048, "hidden": 64, "layers": 2, "heads": 2, "context": 256, "seed": 0}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def stdlib_files(limit: int = 400) -> list[Path]:
    """Real code: stdlib modules and packages, without tests, installed packages or huge files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "site-packages", "idlelib", "lib2to3"}
    files = [
        p
        for p in sorted(root.rglob("*.py"))
        if not skip & set(p.relative_to(root).parts) and p.stat().st_size < 100_000
    ]
    return files[:limit]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A micro base model built through the CLI from a DatasetDict of stdlib files (~4 s)."""
    tmp = tmp_path_factory.mktemp("base")
    files = stdlib_files()
    assert len(files) > 200, "the test needs a few hundred stdlib files"
    texts = [p.read_text(encoding="utf-8") for p in files]  # non-test stdlib sources are UTF-8
    held_out = texts[::5][:40]  # 40 real files the tokenizer never trains on
    train = [t for i, t in enumerate(texts) if i % 5]
    corpus = tmp / "corpus"
    DatasetDict(
        {"train": Dataset.from_dict({"text": train}), "validation": Dataset.from_dict({"text": held_out})}
    ).save_to_disk(str(corpus))
    out = tmp / "base"
    assert (
        main(
            ["build", "--out", str(out), "--corpus", str(corpus)]
            + [f"--{k.replace('_', '-')}={v}" for k, v in MICRO.items()]
        )
        == 0
    )
    return {"out": out, "held_out": held_out, "train": train}


@pytest.fixture(scope="module")
def tokenizer(built):
    return AutoTokenizer.from_pretrained(built["out"])


def render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


# --------------------------------------------------------------------------- tokenizer


def test_saved_tokenizer_matches_trained_tokenizer_and_round_trips(built, tokenizer):
    assert (
        type(tokenizer).__name__ == "TokenizersBackend"
    )  # not a model-specific class with its own pre-tokenizer
    trained = build_tokenizer(built["train"], MICRO["vocab_size"]).backend_tokenizer  # deterministic retrain
    for text in built["held_out"]:
        ids = tokenizer.encode(text)
        assert ids == trained.encode(text).ids
        assert tokenizer.decode(ids) == text
    assert len(tokenizer) == MICRO["vocab_size"]
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == ENDOFTEXT and tokenizer.bos_token is None
    assert tokenizer.model_max_length == MICRO["context"]
    assert tokenizer.chat_template == load_chat_template()


def name_tokens(tokenizer, text: str, name: str) -> list[int]:
    """The ids of the tokens that cover the last occurrence of `name` in `text`."""
    start = text.rindex(name)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [i for i, (a, b) in zip(encoding["input_ids"], encoding["offset_mapping"], strict=True)
            if a < start + len(name) and b > start]


@pytest.mark.slow  # `make test-fast` leaves it out
def test_bare_words_give_a_name_the_same_tokens_wherever_it_occurs(built):
    # Copying a name from the context needs its first token to be the one it had there: the GPT-4 split glues
    # the character before a word to it, so ` dounaim` (prose) and `"dounaim` (a JSON argument) start differently.
    name = "dounaim_kel"
    contexts = [f"the token is {name}", f'{{"answer": "{name}"}}', f"x = f({name})", f"self.{name}", f"\n{name}"]
    for bare_words in (False, True):
        tokenizer = build_tokenizer(built["train"], MICRO["vocab_size"], bare_words=bare_words)
        tokens = {tuple(name_tokens(tokenizer, text, name)) for text in contexts}
        assert (len(tokens) == 1) == bare_words, tokens
        for text in contexts:
            assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.slow  # `make test-fast` leaves it out
def test_bench_tokenizer_counts_answers_written_with_the_tokens_the_instruction_shows(built, tmp_path):
    from bench.tokenizer import answer_agreement
    from env.tasks import Task

    tasks = [Task("copy", "Submit this token exactly as written: dounaim-468-naifen", "true", tmp_path,
                  meta={"gold_answer": "dounaim-468-naifen"}),
             Task("elsewhere", "Fix the bug.", "true", tmp_path, meta={"gold_answer": "kel"}),  # not counted
             Task("none", "Fix the bug.", "true", tmp_path)]
    for bare_words, expected in ((False, (0, 1)), (True, (1, 1))):
        assert answer_agreement(build_tokenizer(built["train"], MICRO["vocab_size"], bare_words=bare_words),
                                tasks) == expected


def test_tool_tokens_are_single_tokens_that_survive_skip_special_tokens(tokenizer):
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    ids = tokenizer.encode(text + IM_END)
    for token in TOOL_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        assert tokenizer.encode(token) == [token_id]
        assert tokenizer.decode([token_id], skip_special_tokens=True) == token
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(ids) == text + IM_END
    for token in (ENDOFTEXT, IM_START, IM_END):
        assert tokenizer.decode(tokenizer.encode(token), skip_special_tokens=True) == ""


def test_corpus_may_be_a_directory_of_python_files(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("not python")
    (tmp_path / "latin1.py").write_bytes(b"# caf\xe9\n")
    assert list(iter_corpus_texts(tmp_path)) == ["y = 2\n", "x = 1\n"]


def test_bad_corpus_and_sizes_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        list(iter_corpus_texts(tmp_path / "missing"))
    DatasetDict({"validation": Dataset.from_dict({"text": ["x"]})}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match="no 'train' split"):
        list(iter_corpus_texts(tmp_path / "ds"))
    DatasetDict({"train": Dataset.from_dict({"content": ["x"]})}).save_to_disk(str(tmp_path / "ds2"))
    with pytest.raises(ValueError, match="no 'text' column"):
        list(iter_corpus_texts(tmp_path / "ds2"))
    with pytest.raises(ValueError, match="must exceed"):
        build_tokenizer(["x = 1"], 200)
    with pytest.raises(ValueError, match="no training texts"):
        build_tokenizer([], 1024)


# --------------------------------------------------------------------------- chat template: exact text


def test_template_renders_the_documented_format(tokenizer):
    messages = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix ä.py"},
        {
            "role": "assistant",
            "content": "Reading both.",
            "tool_calls": [
                {"type": "function", "function": {"name": "read_file", "arguments": {"path": "ä.py"}}},
                {"type": "function", "function": {"name": "read_file", "arguments": '{"path": "b.py"}'}},
            ],
        },
        {"role": "tool", "name": "read_file", "content": "x = 1"},
        {"role": "tool", "name": "read_file", "content": "y = 2"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "submit", "arguments": {}}}],
        },
        {"role": "tool", "name": "submit", "content": "ok"},
        {"role": "assistant", "content": "Done."},
    ]
    expected = (
        "<|im_start|>system\nYou fix bugs.<|im_end|>\n"
        "<|im_start|>user\nFix ä.py<|im_end|>\n"
        "<|im_start|>assistant\nReading both.\n"
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "ä.py"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "b.py"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nx = 1\n</tool_response>\n<tool_response>\ny = 2\n</tool_response>"
        "<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nDone.<|im_end|>\n"
    )
    assert render(tokenizer, messages) == expected
    assert render(tokenizer, messages[:2], add_generation_prompt=True) == (
        "<|im_start|>system\nYou fix bugs.<|im_end|>\n<|im_start|>user\nFix ä.py<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_extend_the_system_message_or_a_default_one(tokenizer):
    tools_section = (
        "\n\n# Tools\nread_file(path)\n"
        'Call: <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call><|im_end|>\n'
    )
    user = {"role": "user", "content": "hi"}
    assert render(tokenizer, [{"role": "system", "content": "S."}, user], tools=TOOLS) == (
        "<|im_start|>system\nS." + tools_section + "<|im_start|>user\nhi<|im_end|>\n"
    )
    assert render(tokenizer, [user], tools=TOOLS) == (
        "<|im_start|>system\nYou are a helpful coding assistant."
        + tools_section
        + "<|im_start|>user\nhi<|im_end|>\n"
    )
    assert render(tokenizer, [user]) == "<|im_start|>user\nhi<|im_end|>\n"  # no tools, no default system


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"role": "critic", "content": "x"}, "unknown role critic"),
        ({"role": "user", "content": [{"type": "text", "text": "x"}]}, "content must be a string"),
        (
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
            "tool_calls\\[0\\]",
        ),
    ],
)
def test_template_rejects_malformed_messages(tokenizer, message, error):
    with pytest.raises(Exception, match=error):
        render(tokenizer, [{"role": "user", "content": "hi"}, message])


# --------------------------------------------------------------------------- chat template: properties

texts = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=24),
    st.sampled_from(["", "\n", " ", "<tool_call>", "{}", "a\n\nb", "é"]),
)
json_values = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), texts)
arguments = st.dictionaries(texts, st.one_of(json_values, st.lists(json_values, max_size=3)), max_size=3)


@st.composite
def tool_calls(draw):
    args = draw(arguments)
    if draw(st.booleans()):  # the harness's SFT export stores canonical JSON strings
        args = json.dumps(args, ensure_ascii=False)
    return {
        "type": "function",
        "function": {"name": draw(st.sampled_from(["read_file", "run", "x"])), "arguments": args},
    }


@st.composite
def conversations(draw):
    messages = [{"role": "system", "content": draw(texts)}] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(texts)})
        for _ in range(draw(st.integers(0, 3))):
            calls = draw(st.lists(tool_calls(), max_size=3))
            content = draw(st.one_of(st.none(), texts)) if calls else draw(texts)
            messages.append(
                {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            )
            messages += [
                {"role": "tool", "name": c["function"]["name"], "content": draw(texts)} for c in calls
            ]
            if not calls:
                break
    return messages


def signature(tool: dict) -> str:
    """One tool as the template lists it: `name(arg, optional?)`."""
    fn = tool["function"]
    params, required = fn["parameters"]["properties"], fn["parameters"].get("required", [])
    args = ", ".join(f"{k}{'' if k in required else '?'}" for k in params)
    return f"{fn['name']}({args})"


def reference_render(messages, tools=None, add_generation_prompt=False) -> str:
    """docs/harness.md's rendering (tool-call protocol), written in Python."""
    out, i = [], 0
    if tools:
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
        i = 1 if system is not None else 0
        out.append(
            "<|im_start|>system\n"
            + (system if system is not None else "You are a helpful coding assistant.")
            + "\n\n# Tools"
            + "".join("\n" + signature(t) for t in tools)
            + '\nCall: <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call><|im_end|>\n'
        )
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            run = []
            while i < len(messages) and messages[i]["role"] == "tool":
                run.append(f"<tool_response>\n{messages[i]['content']}\n</tool_response>")
                i += 1
            out.append("<|im_start|>user\n" + "\n".join(run) + "<|im_end|>\n")
            continue
        content = m["content"] or ""
        if m["role"] == "assistant" and m.get("tool_calls"):
            blocks = []
            for call in m["tool_calls"]:
                args = call["function"]["arguments"]
                args = json.loads(args) if isinstance(args, str) else args
                payload = json.dumps(
                    {"name": call["function"]["name"], "arguments": args}, ensure_ascii=False
                )
                blocks.append(f"<tool_call>\n{payload}\n</tool_call>")
            content = (content + "\n" if content else "") + "\n".join(blocks)
        out.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
        i += 1
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations(), with_tools=st.booleans())
def test_template_matches_reference_and_is_prefix_preserving(tokenizer, messages, with_tools):
    tools = TOOLS if with_tools else None
    full = render(tokenizer, messages, tools=tools)
    assert full == reference_render(messages, tools)
    assert (
        render(tokenizer, messages, tools=tools, add_generation_prompt=True)
        == full + "<|im_start|>assistant\n"
    )
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render(tokenizer, messages[:k], tools=tools, add_generation_prompt=True)
        upto = render(tokenizer, messages[: k + 1], tools=tools)
        assert upto.startswith(prompt) and full.startswith(upto)
        end = k + 1
        while end < len(messages) and messages[end]["role"] == "tool":
            end += 1
        if end > k + 1:  # the tool results plus the next generation prompt extend the assistant turn
            assert render(tokenizer, messages[:end], tools=tools, add_generation_prompt=True).startswith(upto)


def test_assistant_mask_covers_exactly_the_assistant_bodies(tokenizer):
    call = {"type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    messages = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix a.py"},
        {"role": "assistant", "content": "Reading.", "tool_calls": [call]},
        {"role": "tool", "name": "read_file", "content": "def f():\n    return 1\n"},
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
        {"role": "tool", "name": "read_file", "content": "x"},
        {"role": "tool", "name": "read_file", "content": "y"},
        {"role": "assistant", "content": "Fixed it."},
    ]
    out = tokenizer.apply_chat_template(
        messages, tools=TOOLS, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask)
    spans, current = [], []
    for token_id, masked in zip(ids, mask, strict=True):
        if masked:
            current.append(token_id)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    block = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    assert [tokenizer.decode(span) for span in spans] == [
        "Reading.\n" + block + IM_END,
        block + "\n" + block + IM_END,
        "Fixed it." + IM_END,
    ]
    response_id = tokenizer.convert_tokens_to_ids("<tool_response>")
    assert response_id in ids
    assert not any(m for token_id, m in zip(ids, mask, strict=True) if token_id == response_id)


# --------------------------------------------------------------------------- TRL compatibility


def test_trl_accepts_the_template_as_is(tokenizer):
    from trl.chat_template_utils import (
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        is_chat_template_stop_token_trained,
        supports_tool_calling,
    )

    assert supports_tool_calling(tokenizer)
    assert is_chat_template_prefix_preserving(tokenizer)
    assert is_chat_template_stop_token_trained(tokenizer)
    assert get_training_chat_template(tokenizer) is None  # TRL would not swap in a patched template


def test_response_template_parses_generated_turns(tokenizer):
    prompt = render(tokenizer, [{"role": "user", "content": "hi"}], tools=TOOLS, add_generation_prompt=True)
    completion = (
        'Look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call><|im_end|>'
    )
    parsed = tokenizer.parse_response(tokenizer.encode(completion), prefix=tokenizer.encode(prompt))
    assert parsed["tool_calls"] == [
        {"type": "function", "function": {"name": "read_file", "arguments": {"path": "a.py"}}}
    ]
    assert parsed["content"].strip() == "Look."
    assert tokenizer.parse_response("Just text.<|im_end|>", prefix=prompt)["content"] == "Just text."


def test_sft_trainer_trains_assistant_only_with_our_template(built, tokenizer, tmp_path):
    from trl import SFTConfig, SFTTrainer

    call = {"type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    rows = [
        {
            "messages": [
                {"role": "user", "content": "Fix a.py"},
                {"role": "assistant", "content": "Reading.", "tool_calls": [call]},
                {"role": "tool", "name": "read_file", "content": "x = 1"},
                {"role": "assistant", "content": "Done."},
            ],
            "tools": json.dumps(TOOLS),
        },
        {
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
            "tools": json.dumps(TOOLS),
        },
    ]
    model = AutoModelForCausalLM.from_pretrained(built["out"])
    config = SFTConfig(
        output_dir=str(tmp_path),
        assistant_only_loss=True,
        max_steps=1,
        per_device_train_batch_size=2,
        bf16=False,
        use_cpu=True,
        report_to="none",
        max_length=512,
        logging_steps=1,
        save_strategy="no",
    )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    assert trainer.chat_template is None  # used our template, not a TRL replacement
    row = trainer.train_dataset[1]
    trained = [label for label in row["labels"] if label != -100]  # TRL turns assistant_masks into labels
    assert tokenizer.decode(trained) == "Hello." + IM_END
    assert torch.isfinite(torch.tensor(trainer.train().training_loss))


# --------------------------------------------------------------------------- model


def test_micro_model_loads_generates_and_matches_its_card(built, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(built["out"])
    assert type(model).__name__ == "SmearedKeyLlamaForCausalLM"  # the default base (nanocomposer.smeared_llama)
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 2, 2)
    assert config.vocab_size == len(tokenizer) and config.max_position_embeddings == MICRO["context"]
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    generated = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1]
    assert generated[0, : prompt["input_ids"].shape[1]].tolist() == prompt["input_ids"][0].tolist()

    card = (built["out"] / "README.md").read_text()
    parameters = sum(p.numel() for p in model.parameters())
    assert f"| parameters | {parameters:,} |" in card
    assert f"{len(built['train']):,} documents" in card
    assert "| architecture | SmearedKeyLlamaForCausalLM," in card and "--smeared-keys 1" in card


def test_same_seed_same_weights_different_seed_different_weights(built, tokenizer):
    from nanocomposer.model import build_model

    sizes = {k: MICRO[k] for k in ("hidden", "layers", "heads", "context")}
    saved = AutoModelForCausalLM.from_pretrained(built["out"]).state_dict()
    same = build_model(tokenizer, **sizes, seed=0).state_dict()
    other = build_model(tokenizer, **sizes, seed=1).state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(saved[name], same[name])
    assert not torch.equal(saved[name], other[name])


def test_apply_chat_template_to_requires_the_template_tokens():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab={"a": 0}, merges=[])))
    with pytest.raises(ValueError, match="lacks the template's tokens"):
        apply_chat_template_to(bare)


def test_template_renders_tool_calls_exactly_as_the_harness_protocol(tokenizer):
    from env.protocol import format_assistant_turn

    cases = [
        ("Reading.", [("read_file", {"path": "ä.py"})]),
        ("", [("read_file", {"path": "a.py"}), ("run", {"command": "pytest -q", "timeout": 30})]),
        (None, [("submit", {})]),
        ("No calls needed.", []),
    ]
    for content, calls in cases:
        tool_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
        message = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if calls else {})}
        rendered = render(tokenizer, [message])
        assert rendered == f"<|im_start|>assistant\n{format_assistant_turn(content, calls)}<|im_end|>\n"
