"""What a decode step reads: the memory traffic of batched decoding against one sequence at a time.

    python -m bench.decode_traffic --policy runs/demo/sft --tasks DIR --limit 80 --workers 8 --json out.json

Plays `--limit` tasks (evenly spaced over the sorted directories) greedily through the runner, as eval.py
does (continuous batching, prefix cache), then reports the decode steps its streams ran
(`TransformersGenerator.decode_stats`) and what they imply. On a CPU a small model's decoding is bound by
memory traffic, not arithmetic: every step reads all the weights once (shared by the rows of the batch) and,
for every row, the KV cache over the attention window (all rows are right-aligned at one column, so the
window starts at the longest live row's first token and a shorter row reads left padding too). Reported:

- decode steps, mean rows a step, mean context a row (its own cached tokens), window / context (the padding
  read: 1.0 would be none);
- bytes a generated token reads: batched as run (weights / rows + KV over the window), batched without the
  padding (weights / rows + KV over its own context), and one at a time (all the weights + KV over its own
  context), with KV bytes a position = 2 (keys, values) x layers x KV heads x head dim x element size;
- the ratio of one-at-a-time traffic to batched traffic: the most batching can gain per core while decoding
  is traffic-bound (the prefill and the tools are not in it);
- this machine's copy bandwidth (numpy, 256 MB), decode time and completion tokens, for scale.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def copy_bandwidth_gb_s(megabytes: int = 256, repeats: int = 10) -> float:
    """Bytes read + written per second by a large array copy (best of `repeats`)."""
    a = np.ones(megabytes * 1024 * 1024 // 4, dtype=np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best / 1e9


def traffic(decode_stats: dict, config, parameters: int, element_bytes: int) -> dict:
    """The report's derived figures from a generator's decode counters and the model's shape."""
    steps, row_steps = decode_stats["steps"], decode_stats["row_steps"]
    if not row_steps:
        raise ValueError("no decode step ran: nothing to report (were the tasks played by a checkpoint?)")
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_position = 2 * config.num_hidden_layers * kv_heads * head_dim * element_bytes
    weights = parameters * element_bytes
    window_kv = decode_stats["attended_positions"] / row_steps * kv_position
    context_kv = decode_stats["context_positions"] / row_steps * kv_position
    batched = weights * steps / row_steps + window_kv
    unpadded = weights * steps / row_steps + context_kv
    alone = weights + context_kv
    return {"decode_steps": steps, "mean_rows": round(row_steps / steps, 2),
            "mean_context_positions": round(decode_stats["context_positions"] / row_steps, 1),
            "window_over_context": round(decode_stats["attended_positions"] / decode_stats["context_positions"], 3),
            "kv_bytes_per_position": kv_position, "weight_bytes": weights,
            "mb_per_token_batched": round(batched / 1e6, 2), "mb_per_token_batched_unpadded": round(unpadded / 1e6, 2),
            "mb_per_token_one_at_a_time": round(alone / 1e6, 2),
            "one_at_a_time_over_batched": round(alone / batched, 3),
            "one_at_a_time_over_batched_unpadded": round(alone / unpadded, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", required=True, help="checkpoint directory")
    p.add_argument("--tasks", required=True, help="a directory of task directories")
    p.add_argument("--limit", type=int, default=None, help="N tasks evenly spaced over the sorted set (all if unset)")
    p.add_argument("--workers", type=int, default=8, help="episodes at once")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--json", default=None, help="also write the report here")
    args = p.parse_args(argv)

    from env.budget import Budget
    from env.episode import EpisodeConfig
    from env.runner import run_tasks
    from env.tasks import spread_subset
    from nanocomposer.policies import build_policy, seed_policy

    if not Path(args.tasks).is_dir():
        p.error(f"--tasks {args.tasks!r}: not a directory")
    dirs = sorted(d for d in Path(args.tasks).iterdir() if (d / "task.json").is_file())
    if not dirs:
        p.error(f"--tasks {args.tasks!r}: no task directories (with task.json) directly under it")
    dirs = dirs if args.limit is None else spread_subset(dirs, args.limit)
    budget = Budget(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, temperature=0.0)
    try:
        policy = build_policy(str(args.policy), budget.sampling(), "transformers")
    except (OSError, ValueError) as e:
        p.error(f"--policy {args.policy!r}: {e}")
    generator = getattr(policy, "generator", None)
    if generator is None or not hasattr(generator, "decode_stats"):
        p.error(f"--policy {args.policy!r}: not a transformers checkpoint policy")
    t0 = time.perf_counter()
    try:
        records = run_tasks(dirs, lambda: policy, EpisodeConfig(**budget.episode()), concurrency=args.workers,
                            progress=False, seed_policy=seed_policy)
    finally:
        policy.close()
    wall = time.perf_counter() - t0
    model = generator.model
    element_bytes = next(model.parameters()).element_size()
    report = {"policy": str(args.policy), "tasks": len(dirs), "workers": args.workers, "episodes": len(records),
              "wall_s": round(wall, 1), "generation_s": round(policy.stats["gen_s"], 1),
              "completion_tokens": policy.stats["completion_tokens"],
              **traffic(generator.decode_stats, model.config, sum(t.numel() for t in model.parameters()),
                        element_bytes),
              "copy_bandwidth_gb_s": round(copy_bandwidth_gb_s(), 2)}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
