"""How fast a freshly initialised model learns to copy from its context: plain Llama vs smeared keys.

Each training row is a run of random token ids followed by the same run again (runs of 4-16 tokens, packed into
rows of `--context` tokens); the score is the greedy accuracy on the second half of fresh 20-token runs, i.e.
how often the model writes the next token of a sequence it has only seen once, in its context. This is the
skill every ladder task needs (write a name you were shown) with nothing else to learn, so it isolates
whether and when the induction circuit forms.

    python -m bench.copy_formation --arch llama smeared --layers 2 --steps 1000     # docs/copying.md
"""

from __future__ import annotations

import argparse
import math
import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nanocomposer.copy_warmup import FIRST_ID, repeated_runs_accuracy, repeated_runs_row
from nanocomposer.smeared_llama import SmearedKeyLlamaConfig, SmearedKeyLlamaForCausalLM

ARCHITECTURES = {"llama": (LlamaConfig, LlamaForCausalLM), "smeared": (SmearedKeyLlamaConfig, SmearedKeyLlamaForCausalLM)}


def train(arch: str, args) -> list[tuple[int, float, float]]:
    """(step, seconds, accuracy) every `args.every` steps."""
    config_class, model_class = ARCHITECTURES[arch]
    config = config_class(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                          intermediate_size=64 * math.ceil(8 * args.hidden / 3 / 64), num_attention_heads=args.heads,
                          num_key_value_heads=args.heads, tie_word_embeddings=True, max_position_embeddings=4096)
    torch.manual_seed(args.seed)
    model = model_class(config)
    rng = random.Random(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    started, curve = time.perf_counter(), []
    for step in range(args.steps + 1):
        if step % args.every == 0:
            curve.append((step, time.perf_counter() - started, repeated_runs_accuracy(model, args.distinct)))
            print(f"{arch:>8} step {step:5d}  {curve[-1][1]:6.0f} s  second-half accuracy {curve[-1][2]:.3f}",
                  flush=True)
        if step == args.steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 50)
        ids = torch.tensor([repeated_runs_row(rng, args.context, args.distinct) for _ in range(args.batch)])
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return curve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.copy_formation", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", nargs="+", choices=sorted(ARCHITECTURES), default=["llama", "smeared"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192, help="embedding rows (the tiny base's vocabulary)")
    parser.add_argument("--distinct", type=int, default=2000, help="how many token ids the random runs draw from")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.distinct + FIRST_ID > args.vocab or min(args.steps, args.every, args.batch, args.context) < 1:
        parser.error("--distinct + 100 must fit in --vocab; --steps, --every, --batch, --context must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {arch: train(arch, args) for arch in args.arch}
    print("\nstep  " + "  ".join(f"{arch:>8}" for arch in results))
    for row in zip(*results.values(), strict=True):
        print(f"{row[0][0]:5d}  " + "  ".join(f"{accuracy:8.3f}" for _, _, accuracy in row))


if __name__ == "__main__":
    main()
