"""Training speed of the from-scratch model's candidate shapes, and of the LM-head paths on an SFT-shaped row.

    python -m bench.model_speed sizes --sizes 192x4x3 256x4x4 384x6x6      # parameters and training tokens/s
    python -m bench.model_speed sizes --sizes 256x4x4 --smeared-keys 0 1 0 1  # plain vs smeared keys, alternating
    python -m bench.model_speed head --seq 2048 --steps 2                 # the LM-head paths of one packed SFT row

`sizes`: fp32 forward+backward+AdamW steps on random token ids, 8 x 256 tokens, the fastest of `--steps` after a
warm-up (on a shared machine the mean mostly measures the neighbours). `head`: forward+backward seconds and loss
of one packed row through the full head, TRL's fused head (as SFTTrainer runs it, and with its compact path
forced on) and `nanocomposer.model.labelled_only_loss`; the losses must agree. The figures these gave, and the
choices they decided, are in `nanocomposer/model.py`'s docstring.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nanocomposer.model import DEFAULT_SIZES, count_parameters, ffn_width, labelled_only_loss
from nanocomposer.smeared_llama import SmearedKeyLlamaConfig, SmearedKeyLlamaForCausalLM


def measure_head_paths(
    vocab: int = DEFAULT_SIZES["vocab_size"], *, hidden: int = DEFAULT_SIZES["hidden"],
    layers: int = DEFAULT_SIZES["layers"], heads: int = DEFAULT_SIZES["heads"], seq: int = 4096,
    labelled: float = 0.2, steps: int = 3,
) -> dict[str, dict[str, float]]:
    """Forward+backward seconds (best of `steps`) and loss of one SFT-shaped packed row (`seq` tokens, a
    `labelled` share of them in assistant-like spans of 40 tokens) through three LM-head paths:

    - `full`: `model(input_ids, labels=labels).loss` (plain Trainer: logits at every position);
    - `trl_fused`: TRL's fused head as SFTTrainer runs it (`fused_lm_head=True`; on CPU it tiles every
      position, it only drops unlabelled ones on CUDA/XPU with Triton);
    - `trl_fused_compact`: the same with TRL's compact path forced on (`trl.trainer.utils._use_triton`
      patched to True: the fused head then projects only labelled positions; its kernel still picks
      the torch tiles on CPU by its own check);
    - `labelled_only`: `labelled_only_loss`.
    """
    import copy
    from unittest import mock

    from trl.trainer.utils import add_fused_lm_head

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn_width(hidden),
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=max(seq, 1024), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    fused = copy.deepcopy(model)
    add_fused_lm_head(fused, outputs=("log_probs", "entropy", "is_top1"))  # what SFTTrainer asks for
    ids = torch.randint(0, vocab, (1, seq))
    span = 40
    starts = torch.randperm(seq // span)[: max(1, round(labelled * seq / span))] * span
    mask = torch.zeros(1, seq, dtype=torch.bool)
    for start in starts.tolist():
        mask[0, start:start + span] = True
    labels = ids.masked_fill(~mask, -100)
    paths = {
        "full": lambda: model(input_ids=ids, labels=labels).loss,
        "trl_fused": lambda: fused(input_ids=ids, labels=labels, fused_lm_head=True).loss,
        "trl_fused_compact": lambda: _with_compact_fused_head(
            mock, lambda: fused(input_ids=ids, labels=labels, fused_lm_head=True).loss),
        "labelled_only": lambda: labelled_only_loss(model, ids, labels),
    }
    results = {}
    for name, loss_of in paths.items():
        times = []
        for _ in range(steps + 1):  # the first is a warm-up
            started = time.perf_counter()
            loss = loss_of()
            loss.backward()
            times.append(time.perf_counter() - started)
            model.zero_grad(set_to_none=True)
            fused.zero_grad(set_to_none=True)
        results[name] = {"seconds": min(times[1:]), "loss": loss.item()}
    return results


def _with_compact_fused_head(mock, loss_of):
    with mock.patch("trl.trainer.utils._use_triton", lambda device: True):
        return loss_of()


def measure_throughput(
    tokenizer_vocab: int,
    *,
    hidden: int,
    layers: int,
    heads: int,
    batch: int = 8,
    seq: int = 256,
    steps: int = 5,
    smeared_keys: bool = False,
) -> tuple[int, float]:
    """(parameters, tokens/s) of fp32 forward+backward+AdamW steps on random token ids (plain or smeared keys).

    Reports the fastest of `steps` timed steps (after one warm-up): on a shared machine the mean mostly
    measures the neighbours, the best step is the closest to the machine's own speed.
    """
    config_class, model_class = (SmearedKeyLlamaConfig, SmearedKeyLlamaForCausalLM) if smeared_keys else (
        LlamaConfig, LlamaForCausalLM)
    config = config_class(
        vocab_size=tokenizer_vocab,
        hidden_size=hidden,
        intermediate_size=ffn_width(hidden),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max(seq, 1024),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = model_class(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, tokenizer_vocab, (batch, seq))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    fastest = math.inf
    for _ in range(steps):
        started = time.perf_counter()
        step()
        fastest = min(fastest, time.perf_counter() - started)
    return count_parameters(model), batch * seq / fastest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.model_speed", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sizes = commands.add_parser("sizes", help="parameters and training tokens/s for candidate sizes")
    sizes.add_argument("--vocab-size", type=int, default=DEFAULT_SIZES["vocab_size"])
    sizes.add_argument("--sizes", nargs="+", default=["192x4x3", "256x4x4", "384x6x6"],
                       help="HIDDENxLAYERSxHEADS candidates")
    sizes.add_argument("--steps", type=int, default=5)
    sizes.add_argument("--smeared-keys", type=int, nargs="+", choices=(0, 1), default=[0],
                       help="0: plain Llama keys, 1: smeared keys; both (0 1) measures them side by side")
    head = commands.add_parser("head", help="forward+backward time of the LM-head paths on an SFT-shaped row")
    head.add_argument("--seq", type=int, default=4096)
    head.add_argument("--labelled", type=float, default=0.2, help="share of labelled (assistant) positions")
    head.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    if args.command == "head":
        if not 0 < args.labelled <= 1 or args.seq < 80 or args.steps < 1:
            parser.error("head: --labelled must be in (0, 1], --seq at least 80, --steps at least 1")
        results = measure_head_paths(seq=args.seq, labelled=args.labelled, steps=args.steps)
        print(f"torch threads: {torch.get_num_threads()}; 1 x {args.seq} tokens, {args.labelled:.0%} labelled, "
              f"tiny model, fp32 forward+backward, best of {args.steps}")
        for name, r in results.items():
            print(f"{name:>17}: {r['seconds']:6.3f} s  loss {r['loss']:.6f}  "
                  f"({results['full']['seconds'] / r['seconds']:.2f}x full)")
        return 0

    candidates = []
    for size in args.sizes:
        try:
            candidates.append(tuple(int(part) for part in size.split("x")))
        except ValueError:
            parser.error(f"--sizes: {size!r} is not HIDDENxLAYERSxHEADS")
        if len(candidates[-1]) != 3:
            parser.error(f"--sizes: {size!r} is not HIDDENxLAYERSxHEADS")
    print(f"torch threads: {torch.get_num_threads()}; batch 8x256, fp32, forward+backward+AdamW, best step")
    for hidden, layers, heads in candidates:
        for smeared in args.smeared_keys:
            params, tokens_per_s = measure_throughput(
                args.vocab_size, hidden=hidden, layers=layers, heads=heads, steps=args.steps, smeared_keys=bool(smeared)
            )
            print(f"hidden {hidden:4d} layers {layers:2d} heads {heads:2d} {'smeared' if smeared else 'plain':>7} "
                  f"keys: {params / 1e6:5.1f} M params, {tokens_per_s:7,.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
