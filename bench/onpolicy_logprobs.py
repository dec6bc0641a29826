"""How far the sampler's logprobs are from the trainer's, per dtype: what the real-time loop's on-policy check sees.

    python -m bench.onpolicy_logprobs --model runs/sl3/sft --episodes runs/sl3/edge/results.episodes.jsonl

The real-time update compares, token by token, the logprob the server sampled with (our batched decode loop,
KV cache, padded batch) with the one the trainer computes in one forward pass over the whole conversation, and
warns above `on_policy_tolerance`. Both are the same model, so the difference is arithmetic: the order of
operations differs between an incremental decode and a full forward, and in bf16 each logit carries about 8 bits
of mantissa. This bench measures that difference on real conversations, in fp32 and in bf16, so the tolerance
of a recipe can be set from a figure rather than guessed:

- prompts: the conversation before the last assistant turn of each of `--n` recorded episodes (real multi-turn
  contexts, hundreds to thousands of tokens), all in one padded batch as the server decodes them;
- sampling: `ModelPolicy.act_batch` at temperature 1 (its logprobs are the model's own distribution then);
- scoring: one forward pass over prompt + completion, logits upcast to fp32 before log-softmax, as TRL does.

It prints, per dtype, the max, the 99th percentile and the mean |sampling - scoring| over the sampled tokens.
Measured with the command above (8 conversations of 274-1,306 prompt tokens, 96 new tokens each, beside a GRPO
run; 2026-12-05, docs/log.md):

    dtype     tokens  prompt tokens       max       p99      mean
    float32      433       274-1306  1.86e-05  6.17e-06  2.80e-07
    bfloat16     433       274-1306  1.81e-01  9.31e-02  3.16e-03

So the two paths agree in fp32 (no bug between them), and in bf16 single tokens differ by up to a few tenths of a
nat; the maximum grows with the number of tokens compared.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from env.episode import TurnRequest
from nanocomposer.engine.checkpoints import ModelLoadError, load_model_and_tokenizer
from nanocomposer.engine.sampling import SamplingConfig
from nanocomposer.policy import ModelPolicy


def conversations(path: str, n: int) -> list[tuple[list[dict], list[dict], str]]:
    """(messages before the last assistant turn, tools, key) of the first `n` episodes with one."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SystemExit(f"{path}: cannot read the episodes file ({e.strerror})") from None
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            messages = record.get("messages") or []
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
            if last:
                out.append((messages[:last], record["tools"], record["episode_key"]))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SystemExit(f"{path}:{number}: not an episode record with messages, tools and episode_key "
                             f"({type(e).__name__}: {e})") from None
        if len(out) == n:
            break
    if not out:
        raise SystemExit(f"{path}: no episode with an assistant turn")
    return out


def scored_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt_ids):, None]).squeeze(-1).cpu()


def measure(model_path: str, dtype: torch.dtype, convs, max_new_tokens: int) -> dict:
    model, tokenizer = load_model_and_tokenizer(model_path, "cpu")
    model.to(dtype).eval()
    policy = ModelPolicy(model, tokenizer, SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens, seed=0))
    requests = [TurnRequest(messages=m, tools=t, episode_key=k, turn=0) for m, t, k in convs]
    started = time.perf_counter()
    generations = policy.act_batch(requests)
    diffs, prompt_tokens = [], []
    for g in generations:
        if isinstance(g, BaseException):
            raise SystemExit(f"generation failed: {g!r}")
        sampled = torch.tensor(g.logprobs, dtype=torch.float32)
        diffs.append((sampled - scored_logprobs(model, g.prompt_ids, g.completion_ids)).abs())
        prompt_tokens.append(len(g.prompt_ids))
    d = torch.cat(diffs)
    return {"dtype": str(dtype).removeprefix("torch."), "tokens": int(d.numel()),
            "prompt_tokens": [min(prompt_tokens), max(prompt_tokens)], "max": float(d.max()),
            "p99": float(d.quantile(0.99)), "mean": float(d.mean()), "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--episodes", required=True, help="an eval .episodes.jsonl (conversations to continue)")
    p.add_argument("--n", type=int, default=8, help="conversations, decoded as one batch")
    p.add_argument("--max_new_tokens", type=int, default=96)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    args = p.parse_args(argv)
    convs = conversations(args.episodes, args.n)
    print(f"{'dtype':<9} {'tokens':>6} {'prompt tokens':>14} {'max':>9} {'p99':>9} {'mean':>9} {'time':>7}")
    rows = []
    for name in args.dtypes:
        try:
            r = measure(args.model, getattr(torch, name), convs, args.max_new_tokens)
        except ModelLoadError as e:
            raise SystemExit(f"onpolicy_logprobs: {e}") from None
        rows.append(r)
        span = f"{r['prompt_tokens'][0]}-{r['prompt_tokens'][1]}"
        print(f"{r['dtype']:<9} {r['tokens']:>6} {span:>14} {r['max']:>9.2e} {r['p99']:>9.2e} {r['mean']:>9.2e} "
              f"{r['seconds']:>6.1f}s", flush=True)
    return rows


if __name__ == "__main__":
    main()
