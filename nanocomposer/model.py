"""The embedded default base model: a byte-level BPE tokenizer, a ChatML/Hermes chat template and a
randomly initialised Llama, saved with `save_pretrained` so every later stage loads it exactly like a
Hub checkpoint (`AutoTokenizer.from_pretrained(path)`, `AutoModelForCausalLM.from_pretrained(path)`).

No model can be downloaded on the reference machine, so the recipe's "open base model" is built here
and then trained by continued pretraining (CPT) on the code corpus.

Choices, and why:
- Architecture: Llama. A custom tokenizer saved beside a Qwen2 config is re-loaded by `AutoTokenizer`
  as `Qwen2Tokenizer`, which swaps in its own pre-tokenizer; with a Llama config and
  `tokenizer_class = TokenizersBackend` the trained `tokenizer.json` is used as is. The tiny preset uses
  smeared keys (`nanocomposer.smeared_llama`, `--smeared-keys 1`): a plain Llama of this size had not
  learned to copy a name from its context after 7.7 M CPT tokens (docs/copying.md), and the smeared key
  gives attention the previous token for free, which is half of the copying circuit. Its training cost is
  within this machine's noise: `python -m bench.model_speed sizes --sizes 256x4x4 --smeared-keys 0 1 0 1`
  gave 3,533 / 3,541 and 4,039 / 3,744 tokens/s (plain / smeared, alternating, 2 threads); its decoding
  cost (the mix is recomputed over the cached keys at every step) is not measured.
- Tokenizer: byte-level BPE (never an unknown token) behind the GPT-4 split regex, which keeps runs of
  indentation together and splits numbers into groups of at most three digits. Trained on the corpus'
  `train` split only, so validation loss is not flattered by the vocabulary.
- Special tokens: `<|endoftext|>` separates CPT documents and pads; `<|im_start|>`/`<|im_end|>` frame
  chat turns and `<|im_end|>` is the EOS (TRL slices tool suffixes at the last EOS; generation stops
  there). No BOS is prepended, as in Qwen2.5: a string and its chat rendering tokenize the same way
  whether or not a caller asks for special tokens. `<tool_call>`, `</tool_call>`, `<tool_response>`,
  `</tool_response>` are *added but not special*: they are always one token each (the tokenizer
  matches added tokens before BPE) yet survive `decode(..., skip_special_tokens=True)`, which TRL's
  `parse_response` fallback and our harness both use before parsing the model's text.
- Size (defaults: vocab 8192, hidden 256, 4 layers, 4 heads of 64, SwiGLU 704, tied embeddings,
  context 4096): the tiny pipeline has to run CPT (~10 min) then SFT (~4 min) on 2 CPU cores.
  `python -m bench.model_speed sizes` (fp32 forward+backward+AdamW on 8x256 tokens, best of 10 steps),
  measured while other jobs held the 2-core machine at load ~8-10, so only the ratios are meaningful:
      hidden 192, 4 layers:  3.3 M params, 760 tokens/s
      hidden 256, 4 layers:  5.3 M params, 670 tokens/s   <- default (3,780 tokens/s at lower load)
      hidden 256, 6 layers:  6.9 M params, 465 tokens/s
      hidden 384, 6 layers: 13.8 M params, 217 tokens/s
  At vocab 8192 the LM head is a large share of the compute, so going narrower buys little speed
  (+13%) for a much weaker transformer, while more layers (-30%) or width (-68%) cut the tokens a
  10-minute CPT sees. A 6.8 M-param Llama ran CPT at ~1,500 tokens/s in plain Trainer
  (~0.9 M tokens in 10 min; loss 9.1 -> 4.1) and then learned well-formed tool calls in 60 SFT steps.
  Tying input and output embeddings saves 2.1 M parameters (28% of the untied model).
  The context (4096) only sets RoPE's position limit; it costs no parameters or compute.
- Presets (`build --preset NAME`; size flags given beside it override single values): `tiny` is the
  default above; `gpu_scratch` (vocab 8192, hidden 768, 12 layers, 12 heads of 64, SwiGLU 2048, tied
  embeddings, context 4096) has 91,245,312 parameters at the full vocabulary (6.3 M of them the shared
  embedding/LM head), GPT-2-small's shape with Llama's blocks, for the no-hub GPU pipeline
  (`runs/gpu_scratch.sh`, bf16 mixed precision), sized so that each stage takes minutes on one H200 by
  estimate (6 N FLOPs per token: ~20 M CPT tokens is ~1e16 FLOPs); it has not yet run on a GPU.
- Labelled-only LM head (`labelled_only_loss`): the head and the loss only where a label is. transformers'
  `logits_to_keep` cannot do it (last-k or one index list for all rows), and TRL's fused head used by
  SFTTrainer drops unlabelled positions only on CUDA/XPU with Triton; on CPU it tiles every position.
  `python -m bench.model_speed head --seq 2048 --steps 2` (tiny model, one packed SFT row, 20%
  labelled, fp32 forward+backward, 1 thread at load ~12): full head 17.9 s, TRL fused 23.2 s, labelled-
  only 11.8 s (1.5x the full head, 2.0x TRL's CPU path), same loss; in a second run at load ~8, TRL's
  fused head with its compact path forced on took 6.7 s, labelled-only 7.4 s, the full head 12.1 s.
  For CPT it buys nothing (every position but document starts is labelled); for SFT the cheapest
  change is to force TRL's compact path (it keeps SFTTrainer's entropy and token-accuracy metrics).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from env.protocol import load_chat_template
from nanocomposer.smeared_llama import SmearedKeyLlamaConfig, SmearedKeyLlamaForCausalLM

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
# Added, not special: see the module docstring.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# GPT-4 (cl100k) pre-tokenization split, as used by Qwen2 and Llama 3 byte-level tokenizers: a word takes
# the one character before it (" foo", "(foo", ".foo").
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Bare words (`bare_words=1`): the same split, but a run of letters never takes the character before it, and a
# run of spaces is its own piece. A name then starts with the same token wherever it occurs (after a space or
# a quote), so copying it needs no mapping between two tokens. Not the default: measured on the ladder, it
# did not help the tiny model copy and cost 20% more tokens of code (docs/copying.md).
BARE_WORDS_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+"
)

DEFAULT_SIZES = {"vocab_size": 8192, "hidden": 256, "layers": 4, "heads": 4, "context": 4096, "seed": 0,
                 "smeared_keys": 1, "bare_words": 0}
# `python -m nanocomposer.model build --preset NAME`: the pretrained default, converted from its PyPI package
# (nanocomposer/base_model.py), or a from-scratch size set (see the module docstring).
PRETRAINED_PRESET = "smollm2"
PRESETS = {
    "tiny": DEFAULT_SIZES,  # 5.3 M parameters: the CPU pipeline (runs/tiny.sh)
    # 91.2 M: runs/gpu_scratch.sh. Plain Llama keys: vLLM (the GPU generation backend) has no smeared-key model.
    "gpu_scratch": {**DEFAULT_SIZES, "hidden": 768, "layers": 12, "heads": 12, "smeared_keys": 0},
}

# How `tokenizer.parse_response` (transformers >= 5.13) reads a generated assistant turn back into
# `{"role", "content", "tool_calls"}`. TRL's GRPOTrainer needs it for `tools=` and only knows the
# templates of Hub models (`trl.chat_template_utils.add_response_schema`); our turns have the shape of
# Qwen2.5/Qwen3 turns, so this mirrors TRL's `qwen3_template` without the reasoning field. It is saved
# in tokenizer_config.json.
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": f"{IM_START}assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


# --------------------------------------------------------------------------- corpus


def iter_corpus_texts(corpus: str | Path, split: str = "train") -> Iterator[str]:
    """Texts of one split of the corpus.

    `corpus` is either a `datasets.DatasetDict` saved with `save_to_disk` (splits `train`/`validation`,
    a `text` column; what `data/build_corpus.py` writes) or a directory of `.py` files, walked in sorted
    order (a stand-in for tests and for use before the corpus exists; it has no splits).
    """
    corpus = Path(corpus)
    if (corpus / "dataset_dict.json").is_file():
        from datasets import load_from_disk

        dataset_dict = load_from_disk(str(corpus))
        if split not in dataset_dict:
            raise ValueError(f"corpus {corpus}: no {split!r} split (has {sorted(dataset_dict)})")
        dataset = dataset_dict[split]
        if "text" not in dataset.column_names:
            raise ValueError(f"corpus {corpus}[{split!r}]: no 'text' column (has {dataset.column_names})")
        for batch in dataset.select_columns(["text"]).iter(batch_size=1000):
            yield from batch["text"]
    elif corpus.is_dir():
        for path in sorted(corpus.rglob("*.py")):
            try:
                yield path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # a few stdlib test files are deliberately not UTF-8
    else:
        raise FileNotFoundError(
            f"corpus {corpus}: expected a saved DatasetDict (with dataset_dict.json) or a directory of .py files"
        )


# --------------------------------------------------------------------------- tokenizer


def build_tokenizer(texts: Iterable[str], vocab_size: int,
                    bare_words: bool = bool(DEFAULT_SIZES["bare_words"])) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` and wrap it for transformers, chat template included.

    `vocab_size` counts everything: 3 special tokens, 4 tool tokens and the BPE vocabulary (which can
    come out smaller when the texts are too few to support that many merges). `bare_words`: split with
    BARE_WORDS_SPLIT_PATTERN instead of the GPT-4 pattern.
    """
    floor = 256 + len(SPECIAL_TOKENS) + len(TOOL_TOKENS)
    if vocab_size <= floor:
        raise ValueError(
            f"vocab_size={vocab_size}: must exceed {floor} (256 bytes + special and tool tokens)"
        )

    n_texts = 0

    def counted(texts: Iterable[str]) -> Iterator[str]:
        nonlocal n_texts
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"build_tokenizer: text #{n_texts} is {type(text).__name__}, expected str")
            n_texts += 1
            yield text

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(BARE_WORDS_SPLIT_PATTERN if bare_words else SPLIT_PATTERN),
                                 behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(counted(texts), trainer=trainer)
    if n_texts == 0:
        raise ValueError("build_tokenizer: no training texts")
    bpe.add_tokens([AddedToken(token, special=False, normalized=False) for token in TOOL_TOKENS])

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=DEFAULT_SIZES["context"],
    )
    return apply_chat_template_to(tokenizer)


def apply_chat_template_to(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """Install our chat template and its response parser on `tokenizer` (in place; also returned)."""
    missing = [t for t in (*SPECIAL_TOKENS, *TOOL_TOKENS) if tokenizer.convert_tokens_to_ids(t) is None]
    if missing:
        raise ValueError(f"apply_chat_template_to: tokenizer lacks the template's tokens {missing}")
    tokenizer.chat_template = load_chat_template()
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


# --------------------------------------------------------------------------- model


def ffn_width(hidden: int) -> int:
    """Llama's SwiGLU width: 8/3 of the hidden size, rounded up to a multiple of 64."""
    return 64 * math.ceil(8 * hidden / 3 / 64)


def build_model(
    tokenizer: PreTrainedTokenizerFast, *, hidden: int, layers: int, heads: int, context: int, seed: int,
    smeared_keys: bool = bool(DEFAULT_SIZES["smeared_keys"]),
) -> LlamaForCausalLM:
    """A randomly initialised Llama sized to `tokenizer`, with token ids and generation stops set.

    `smeared_keys`: the smeared-key variant (`nanocomposer.smeared_llama`), which learns to copy from its
    context within a few hundred steps where the plain Llama plateaus (docs/copying.md).
    """
    if hidden % heads:
        raise ValueError(f"build_model: hidden={hidden} is not divisible by heads={heads}")
    if (hidden // heads) % 2:
        raise ValueError(f"build_model: head size {hidden // heads} must be even for rotary embeddings")
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    endoftext_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config_class, model_class = (SmearedKeyLlamaConfig, SmearedKeyLlamaForCausalLM) if smeared_keys else (
        LlamaConfig, LlamaForCausalLM)
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=ffn_width(hidden),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=context,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        # Only used when generating from nothing: start as if at a document boundary.
        bos_token_id=endoftext_id,
        eos_token_id=eos_id,
        pad_token_id=endoftext_id,
    )
    torch.manual_seed(seed)
    model = model_class(config)
    # Stop at the end of a chat turn or, for the CPT'd base model sampled on raw code, of a document.
    model.generation_config.eos_token_id = [eos_id, endoftext_id]
    model.generation_config.pad_token_id = endoftext_id
    model.generation_config.bos_token_id = endoftext_id
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def build_base(out_dir: str | Path, corpus: str | Path, **sizes: int) -> Path:
    """Train the tokenizer on `corpus`'s train split, build the model and save both to `out_dir`.

    `sizes` overrides DEFAULT_SIZES (vocab_size, hidden, layers, heads, context, seed, smeared_keys,
    bare_words).
    """
    unknown = set(sizes) - set(DEFAULT_SIZES)
    if unknown:
        raise TypeError(
            f"build_base: unknown size arguments {sorted(unknown)} (known: {sorted(DEFAULT_SIZES)})"
        )
    cfg = {**DEFAULT_SIZES, **sizes}
    out_dir = Path(out_dir)

    stats = {"documents": 0, "characters": 0}

    def tracked(texts: Iterable[str]) -> Iterator[str]:
        for text in texts:
            stats["documents"] += 1
            stats["characters"] += len(text)
            yield text

    started = time.perf_counter()
    tokenizer = build_tokenizer(tracked(iter_corpus_texts(corpus, "train")), cfg["vocab_size"],
                                bare_words=bool(cfg["bare_words"]))
    tokenizer_seconds = time.perf_counter() - started
    tokenizer.model_max_length = cfg["context"]
    model = build_model(
        tokenizer,
        hidden=cfg["hidden"],
        layers=cfg["layers"],
        heads=cfg["heads"],
        context=cfg["context"],
        seed=cfg["seed"],
        smeared_keys=bool(cfg["smeared_keys"]),
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    card = {
        **cfg,
        "vocab_size": len(tokenizer),
        "vocab_size_requested": cfg["vocab_size"],
        "intermediate": model.config.intermediate_size,
        "architecture": type(model).__name__,
        "parameters": count_parameters(model),
        "corpus": str(corpus),
        "corpus_kind": "DatasetDict, train split"
        if (Path(corpus) / "dataset_dict.json").is_file()
        else "directory of .py files",
        "tokenizer_train_documents": stats["documents"],
        "tokenizer_train_characters": stats["characters"],
        "tokenizer_seconds": round(tokenizer_seconds, 1),
    }
    (out_dir / "README.md").write_text(model_card(card), encoding="utf-8")
    return out_dir


def model_card(card: dict) -> str:
    return f"""# nanocomposer base model (random init)

A byte-level BPE tokenizer trained on the code corpus and a randomly initialised Llama. It knows
nothing yet; continued pretraining comes next. Rebuild (deterministic for the same corpus):

    python -m nanocomposer.model build --out OUT --corpus {card["corpus"]} --vocab-size {card["vocab_size_requested"]} \\
        --hidden {card["hidden"]} --layers {card["layers"]} --heads {card["heads"]} --context {card["context"]} --seed {card["seed"]} --smeared-keys {card["smeared_keys"]} \\
        --bare-words {card["bare_words"]}

| | |
|---|---|
| architecture | {card["architecture"]}, tied input/output embeddings |
| parameters | {card["parameters"]:,} |
| hidden / layers / heads | {card["hidden"]} / {card["layers"]} / {card["heads"]} (head size {card["hidden"] // card["heads"]}) |
| SwiGLU width | {card["intermediate"]} |
| context (max positions, RoPE) | {card["context"]} |
| vocabulary | {card["vocab_size"]} (requested {card["vocab_size_requested"]}) |
| init seed | {card["seed"]} |

## Tokenizer

Byte-level BPE behind the GPT-4 split regex, trained with `tokenizers` on `{card["corpus"]}`
({card["corpus_kind"]}): {card["tokenizer_train_documents"]:,} documents, {card["tokenizer_train_characters"]:,}
characters ({card["tokenizer_seconds"]} s). Special: `<|endoftext|>` (document separator, pad),
`<|im_start|>`, `<|im_end|>` (EOS). Added, not special (kept by `skip_special_tokens=True`):
`<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`. No BOS is prepended.

## Chat template

ChatML turns with Hermes tool calls (`env/chat_template.jinja`, spec in
`docs/architecture.md`); assistant bodies are wrapped in `{{% generation %}}` for assistant-only loss;
`response_template` is set for `tokenizer.parse_response`.

```
{json.dumps(card, indent=2)}
```
"""


# --------------------------------------------------------------------------- labelled-only LM head


def labelled_only_loss(model, input_ids: torch.Tensor, labels: torch.Tensor,
                       num_items_in_batch: torch.Tensor | int | None = None, **inputs) -> torch.Tensor:
    """The causal-LM loss of `model(input_ids, labels=labels, **inputs).loss`, with the LM head applied only
    at the positions whose next-token label is not -100.

    transformers' LlamaForCausalLM projects every position (`logits_to_keep` keeps the last k positions, or
    one index list shared by all rows, so it cannot select a per-row label mask) and its loss then ignores
    the unlabelled ones. For SFT with assistant-only loss most positions are unlabelled, and at vocab 8192
    and hidden 256 the head is a large share of the compute. Same reduction as transformers' ForCausalLMLoss
    (fp32 cross-entropy, sum / `num_items_in_batch` when given, else mean). Only for models whose logits are
    `lm_head(last_hidden_state)` with no scaling or soft-capping (Llama, Qwen2), which is checked.
    """
    text_config = model.config.get_text_config()
    for scaling in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier"):
        if getattr(text_config, scaling, None) not in (None, 1.0):
            raise ValueError(f"labelled_only_loss: {type(model).__name__} sets {scaling}; its logits are "
                             "not lm_head(hidden)")
    hidden = model.get_decoder()(input_ids=input_ids, **inputs).last_hidden_state
    next_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    keep = next_labels != -100
    logits = model.get_output_embeddings()(hidden[keep]).float()
    loss = torch.nn.functional.cross_entropy(logits, next_labels[keep], reduction="sum")
    return loss / (num_items_in_batch if num_items_in_batch is not None else keep.sum())


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanocomposer.model", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="train the tokenizer and save a randomly initialised model")
    build.add_argument("--out", required=True, type=Path, help="output directory (e.g. artifacts/base)")
    build.add_argument(
        "--corpus",
        type=Path,
        help="from-scratch presets: saved DatasetDict with a text column, or a directory of .py",
    )
    build.add_argument("--preset", choices=[PRETRAINED_PRESET, *sorted(PRESETS)], default=None,
                       help=f"{PRETRAINED_PRESET} (the default without --corpus): convert the packaged "
                            "SmolLM2-135M-Instruct (nanocomposer/base_model.py); tiny (the default with --corpus), "
                            "gpu_scratch: a tokenizer trained on --corpus and a randomly initialised Llama, sized "
                            "by the flags below")
    build.add_argument("--force", action="store_true", help=f"{PRETRAINED_PRESET}: convert again even if done")
    for name, tiny_value in DEFAULT_SIZES.items():
        build.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                           help=f"default: the preset's (tiny: {tiny_value})")

    args = parser.parse_args(argv)

    given = {name: getattr(args, name) for name in DEFAULT_SIZES if getattr(args, name) is not None}
    args.preset = args.preset or ("tiny" if args.corpus else PRETRAINED_PRESET)
    if args.preset == PRETRAINED_PRESET:
        from nanocomposer.base_model import BaseModelError, convert

        if given or args.corpus:
            parser.error(f"build --preset {PRETRAINED_PRESET}: size flags and --corpus are for from-scratch presets")
        try:
            out = convert(args.out, force=args.force)
        except BaseModelError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"base model: {out} ({json.loads((out / 'base_model.json').read_text())['parameters']:,} parameters)")
        return 0
    if args.corpus is None:
        parser.error(f"build --preset {args.preset}: --corpus is required (the tokenizer is trained on it)")
    out = build_base(args.out, args.corpus, **{**PRESETS[args.preset], **given})
    print((out / "README.md").read_text(encoding="utf-8"))
    return 0


# --------------------------------------------------------------------------- tool lists in a checkpoint's template

PROBE_TOOL_NAME = "nanocomposer_probe_tool"


def template_renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template shows the model a `tools=` list: a dummy tool's name must appear
    in the rendering of a one-message conversation. False for a template that ignores `tools` (the harness
    would silently send no tool list), or none at all."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    tool = {"type": "function", "function": {"name": PROBE_TOOL_NAME, "description": "probe",
                                             "parameters": {"type": "object", "properties": {}, "required": []}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[tool], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # noqa: BLE001  (a template that raises on tools, however, cannot show them)
        return False
    return PROBE_TOOL_NAME in text


if __name__ == "__main__":
    sys.exit(main())
