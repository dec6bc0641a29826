"""Batched generation vs one request at a time, on the same agent prompts and the same checkpoint.

    python -m bench.generation --checkpoint runs/demo/sft --batch 1,4,8,16
    python -m bench.generation --build-random /tmp/rand5m             # a random model of the demo's shape
    python -m bench.generation --checkpoint /tmp/rand5m --batch 1,8,16 --json out.json
    python -m bench.generation --checkpoint CKPT --backend vllm --batch 1,16,64 --check-backends 4   # GPU

Prompts are real harness prompts: the oracle policy plays the sample tasks (data/samples), and every turn's
conversation so far (system prompt, tool schemas, task, earlier calls and tool results) is rendered with
the checkpoint's chat template, exactly what ModelPolicy sends the model. Generation is greedy with
`--max-new-tokens` per turn (the demo's eval uses 128).

For each batch size b the prompts are generated in consecutive groups of b, each group one backend call
(`ModelPolicy.generator.generate`; transformers: one padded batch, vLLM: one `LLM.generate`); b = 1 is the
one-at-a-time baseline. Reported per b: completion tokens/s, turns/s, speedup over b = 1, and whether every
prompt got exactly the tokens it got alone (greedy). vLLM's prefix cache is reset before each pass, so a
later pass does not reuse an earlier pass's prompts.

`--check-backends K` (vLLM only) also loads the checkpoint with transformers on the same device and
compares greedy tokens of the first K prompts with vLLM's; the first difference is reported with the
transformers top-2 logit gap at that position (a near-tie either kernel may break its own way).
`--hf-generate` also times transformers' own `model.generate` on the same checkpoint, prompts and groups
(left-padded batch, greedy, the policy's stop ids as `eos_token_id`, KV cache on), each group one call, and
reports our tokens/s over its at every batch size: the issue's "decode vs HF generate" ratio, side by side.
`--build-random DIR` writes a randomly initialised checkpoint of `nanocomposer.model.DEFAULT_SIZES`
(5.3M parameters) whose tokenizer is trained on this Python's standard library: for speed only (it writes
nonsense and never stops early, so every turn runs to --max-new-tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import time
from pathlib import Path

from nanocomposer.policies import GENERATION_BACKENDS

REPO_ROOT = Path(__file__).resolve().parent.parent
MICRO_SIZES = {"vocab_size": 512, "hidden": 64, "layers": 2, "heads": 2, "context": 4096, "seed": 0}
# A top-2 logit gap below this where the backends' greedy tokens first differ is a tie, not a disagreement:
# bf16 rounds logits of magnitude 8-16 to steps of 1/16.
NEAR_TIE_GAP = 0.1
STDLIB_TEXT_CHARS = 3_000_000  # tokenizer training text for --build-random (the sorted stdlib, first ~3 MB)


def build_random_checkpoint(dest: Path, sizes: dict | None = None) -> Path:
    """A random-weight checkpoint of `sizes` (default: the demo's), tokenizer trained on stdlib sources."""
    import torch

    from nanocomposer.model import DEFAULT_SIZES, build_model, build_tokenizer

    cfg = {**DEFAULT_SIZES, **(sizes or {})}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= STDLIB_TEXT_CHARS:
            break
    tokenizer = build_tokenizer(texts, cfg["vocab_size"])
    tokenizer.model_max_length = cfg["context"]
    with torch.random.fork_rng():
        # plain Llama keys (vLLM has no smeared-key model); the embedding scaled x10 so that the logits are
        # sharp and greedy argmaxes rarely tie (a random model's are nearly flat), as tests/test_gpu.py does
        model = build_model(tokenizer, hidden=cfg["hidden"], layers=cfg["layers"], heads=cfg["heads"],
                            context=cfg["context"], seed=cfg["seed"], smeared_keys=False)
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(10.0)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def converted_checkpoint(path: Path, dtype: str, dest: Path) -> Path:
    """A copy of checkpoint `path` with its weights in `dtype`: vLLM (dtype auto) and transformers then both
    run it in that dtype (vLLM downcasts an fp32 checkpoint to bf16, transformers loads it as saved)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(path).save_pretrained(dest)
    return dest


def harness_conversations(tasks: str, limit: int) -> list[tuple[list[dict], list[dict]]]:
    """(messages so far, tool schemas) before every assistant turn of oracle episodes on `tasks`."""
    from data.oracle import OraclePolicy
    from env.episode import EpisodeConfig, run_episode
    from env.task_sets import resolve_task_set

    conversations = []
    for task in resolve_task_set(tasks).tasks:
        trajectory = run_episode(task, OraclePolicy(seed=0), EpisodeConfig(max_turns=8))
        for i, message in enumerate(trajectory.messages):
            if message["role"] == "assistant":
                conversations.append((trajectory.messages[:i], trajectory.tools))
        if len(conversations) >= limit:
            break
    return conversations


def agent_prompts(policy, tasks: str, count: int) -> tuple[list[list[int]], int]:
    """(`count` rendered prompts that fit the context with max_new_tokens, how many were too long)."""
    room = policy.max_context - policy.sampling.max_new_tokens
    prompts, too_long = [], 0
    for messages, tools in harness_conversations(tasks, 4 * count):
        ids = policy.render(messages, tools)
        if len(ids) > room:
            too_long += 1
            continue
        prompts.append(ids)
    if not prompts:
        raise SystemExit(f"bench.generation: no harness prompt of {tasks!r} fits the context ({room} tokens)")
    while len(prompts) < count:  # fewer conversations than asked: reuse them (greedy: same work again)
        prompts += prompts[: count - len(prompts)]
    return prompts[:count], too_long


def run_pass(generator, prompts: list[list[int]], batch: int, sampling) -> tuple[float, list]:
    """(wall seconds, results) of generating every prompt in consecutive groups of `batch`, one call each."""
    from nanocomposer.engine.vllm_backend import VLLMGenerator

    if isinstance(generator, VLLMGenerator):  # start each pass with an empty prefix cache
        llm = generator.engine()
        if callable(getattr(llm, "reset_prefix_cache", None)):
            llm.reset_prefix_cache()
    results = []
    t0 = time.perf_counter()
    for start in range(0, len(prompts), batch):
        group = prompts[start:start + batch]
        results += generator.generate(group, [0] * len(group), sampling)
    return time.perf_counter() - t0, results


def measure(policy, prompts: list[list[int]], batches: list[int], max_batch_tokens: int | None) -> list[dict]:
    from nanocomposer.engine.transformers_backend import TransformersGenerator

    generator = policy.generator
    if isinstance(generator, TransformersGenerator):  # one group = one padded batch unless capped
        width = max(batches) * (max(map(len, prompts)) + policy.sampling.max_new_tokens)
        generator = TransformersGenerator(policy.model, policy.stop_ids, max_batch_tokens=max_batch_tokens or width)
    sampling = policy.sampling
    run_pass(generator, prompts[:1], 1, sampling)  # warm-up (first-call allocations, kernels)
    rows, alone = [], None
    for batch in sorted({1, *batches}):
        wall, results = run_pass(generator, prompts, batch, sampling)
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise SystemExit(f"bench.generation: batch {batch}: {len(failed)} requests failed, first: "
                             f"{type(failed[0]).__name__}: {failed[0]}")
        tokens = sum(len(r.ids) for r in results)
        if batch == 1:
            alone = results
        identical = sum(r.ids == a.ids for r, a in zip(results, alone, strict=True))
        rows.append({"batch": batch, "turns": len(results), "completion_tokens": tokens, "wall_s": round(wall, 3),
                     "tokens_per_s": round(tokens / wall, 2), "turns_per_s": round(len(results) / wall, 3),
                     "identical_to_alone": identical, "results": results})
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = round(row["tokens_per_s"] / base, 2)
    return rows


def hf_generate_pass(policy, prompts: list[list[int]], batch: int) -> tuple[float, int]:
    """(wall seconds, completion tokens) of transformers' `generate` over `prompts` in groups of `batch`.

    A completion counts its tokens up to and including its first stop id, as our generator counts them."""
    import torch

    model, stops = policy.model, set(policy.stop_ids)
    pad = policy.tokenizer.pad_token_id if policy.tokenizer.pad_token_id is not None else 0
    tokens, t0 = 0, time.perf_counter()
    for start in range(0, len(prompts), batch):
        group = prompts[start:start + batch]
        width = max(map(len, group))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=model.device)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, use_cache=True,
                                 max_new_tokens=policy.sampling.max_new_tokens, eos_token_id=sorted(stops),
                                 pad_token_id=pad)
        for row in out[:, width:].tolist():
            stop_at = next((i for i, t in enumerate(row) if t in stops), None)
            tokens += len(row) if stop_at is None else stop_at + 1
    return time.perf_counter() - t0, tokens


def prefill_seconds(policy, prompts: list[list[int]], max_batch_tokens: int | None) -> float:
    """Wall seconds of a one-at-a-time pass that generates a single token per prompt: the prefill's share."""
    import dataclasses

    from nanocomposer.engine.transformers_backend import TransformersGenerator

    sampling = dataclasses.replace(policy.sampling, max_new_tokens=1)
    generator = policy.generator
    if isinstance(generator, TransformersGenerator):
        generator = TransformersGenerator(policy.model, policy.stop_ids, max_batch_tokens=max_batch_tokens or 10**9)
    return run_pass(generator, prompts, 1, sampling)[0]


def check_backends(policy, prompts: list[list[int]], vllm_results: list, device: str) -> dict:
    """Greedy tokens of transformers vs vLLM on the same prompts (the first difference explained)."""
    import torch

    from nanocomposer.engine.checkpoints import load_model_and_tokenizer
    from nanocomposer.engine.transformers_backend import TransformersGenerator

    model, _ = load_model_and_tokenizer(policy.name, device)
    generator = TransformersGenerator(model, policy.stop_ids)
    hf_results = generator.generate(prompts, [0] * len(prompts), policy.sampling)
    report = {"prompts": len(prompts), "identical": 0, "differences": []}
    for k, (prompt, hf, vl) in enumerate(zip(prompts, hf_results, vllm_results, strict=True)):
        if hf.ids == vl.ids:
            report["identical"] += 1
            continue
        at = next((i for i, (a, b) in enumerate(zip(hf.ids, vl.ids)) if a != b), min(len(hf.ids), len(vl.ids)))
        with torch.no_grad():
            ids = torch.tensor([prompt + hf.ids[:at]], device=model.device)
            top2 = model(input_ids=ids).logits[0, -1].float().topk(2).values.tolist()
        report["differences"].append({"prompt": k, "first_difference_at": at, "transformers": hf.ids[at:at + 5],
                                      "vllm": vl.ids[at:at + 5], "transformers_top2_gap": top2[0] - top2[1],
                                      "near_tie": top2[0] - top2[1] < NEAR_TIE_GAP,
                                      "logprob_diff_before": max((abs(a - b) for a, b in zip(
                                          hf.logprobs[:at], vl.logprobs[:at])), default=0.0)})
    return report


def real_disagreements(identity: dict | None) -> list[dict]:
    """The backend differences of a `check_backends` report that are not right after a near-tie."""
    return [d for d in (identity or {}).get("differences", []) if not d.get("near_tie")]


def table(rows: list[dict]) -> str:
    lines = ["| batch | turns | tokens | wall s | tokens/s | turns/s | vs one-at-a-time | same tokens as alone |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['turns']} | {r['completion_tokens']} | {r['wall_s']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['turns_per_s']:.2f} | {r['speedup']:.2f}x | "
                     f"{r['identical_to_alone']}/{r['turns']} |")
    return "\n".join(lines)


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch {text!r}: expected comma-separated integers, e.g. 1,4,8,16")
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"--batch {text!r}: batch sizes must be >= 1")
    return batches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.generation", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a merged from_pretrained checkpoint directory")
    parser.add_argument("--build-random", type=Path, metavar="DIR",
                        help="write a random checkpoint of the demo's shape to DIR (then benchmark it)")
    parser.add_argument("--micro", action="store_true", help="with --build-random: the test suite's micro size")
    parser.add_argument("--backend", choices=GENERATION_BACKENDS, default="transformers")
    parser.add_argument("--batch", type=parse_batches, default=[1, 4, 8, 16], help="batch sizes, e.g. 1,4,8,16")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per pass (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--tasks", default="samples", help="task set whose oracle episodes give the prompts")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--max-batch-tokens", type=int, default=None,
                        help="transformers: cap on padded tokens per batch (default: whole groups fit)")
    parser.add_argument("--device", default=None, help="transformers device (default: cuda if available)")
    parser.add_argument("--check-backends", type=int, default=0, metavar="K",
                        help="vllm: compare greedy tokens with transformers on the first K prompts")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="benchmark a copy of the checkpoint converted to this dtype (written beside --json)")
    parser.add_argument("--hf-generate", action="store_true",
                        help="transformers backend: also time model.generate at each batch size (the baseline)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.max_new_tokens < 1:
        parser.error("--prompts and --max-new-tokens must be >= 1")
    if args.hf_generate and args.backend != "transformers":
        parser.error("--hf-generate times transformers' generate: use it with --backend transformers")
    if args.check_backends and args.backend != "vllm":
        parser.error("--check-backends compares vLLM with transformers: use it with --backend vllm")

    import torch

    from nanocomposer.policy import ModelPolicy, SamplingConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.build_random:
        t0 = time.perf_counter()
        build_random_checkpoint(args.build_random, MICRO_SIZES if args.micro else None)
        print(f"built a random checkpoint in {args.build_random} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        args.checkpoint = args.checkpoint or args.build_random
    if args.checkpoint is None:
        parser.error("give --checkpoint DIR (or --build-random DIR)")
    if args.dtype:
        where = (args.json.parent if args.json else Path(".")) / f"checkpoint-{args.dtype}"
        args.checkpoint = converted_checkpoint(args.checkpoint, args.dtype, where)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens)
    kwargs = {"backend": "vllm"} if args.backend == "vllm" else {"device": args.device}
    policy = ModelPolicy(args.checkpoint, sampling=sampling, **kwargs)
    try:
        prompts, too_long = agent_prompts(policy, args.tasks, args.prompts)
        lengths = sorted(map(len, prompts))
        params = sum(p.numel() for p in policy.model.parameters()) if policy.model is not None else None
        rows = measure(policy, prompts, args.batch, args.max_batch_tokens)
        prefill_s = prefill_seconds(policy, prompts, args.max_batch_tokens)
        if args.hf_generate:
            for row in rows:
                wall, tokens = hf_generate_pass(policy, prompts, row["batch"])
                row["hf_generate_tokens_per_s"] = round(tokens / wall, 2)
                row["vs_hf_generate"] = round(row["tokens_per_s"] / row["hf_generate_tokens_per_s"], 2)
        report = {"checkpoint": str(args.checkpoint), "backend": args.backend, "parameters": params,
                  "device": str(policy.device) if policy.device is not None else "vllm",
                  "torch_threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens,
                  "prompts": len(prompts), "prompt_tokens": {"min": lengths[0], "median": lengths[len(lengths) // 2],
                                                             "max": lengths[-1]},
                  "prompts_over_context_skipped": too_long, "prefill_pass_s": round(prefill_s, 3),
                  "rows": [{k: v for k, v in r.items() if k != "results"} for r in rows]}
        if args.check_backends:
            k = min(args.check_backends, len(prompts))
            report["backend_identity"] = check_backends(policy, prompts[:k], rows[0]["results"][:k],
                                                        args.device or "cuda")
    finally:
        policy.close()
    size = f", {params / 1e6:.1f}M parameters" if params else ""
    print(f"{args.backend} on {report['device']}, {report['torch_threads']} torch threads{size}; {len(prompts)} "
          f"harness prompts of {lengths[0]}-{lengths[-1]} tokens (median {lengths[len(lengths) // 2]}), greedy, "
          f"max_new_tokens {args.max_new_tokens}")
    print(table(rows))
    print(f"prefill alone (one token per prompt, one at a time): {prefill_s:.2f} s of the one-at-a-time "
          f"pass's {rows[0]['wall_s']:.2f} s")
    for r in rows[1:]:
        decode = (rows[0]["wall_s"] - prefill_s) / max(r["wall_s"] - prefill_s, 1e-9)
        note = f"; decoding alone (wall minus that prefill) {decode:.2f}x" if args.backend == "transformers" else ""
        print(f"batch {r['batch']}: {r['speedup']:.2f}x the tokens/s of one at a time{note}")
    for r in rows if args.hf_generate else ():
        print(f"batch {r['batch']}: {r['tokens_per_s']:.1f} tokens/s vs transformers generate "
              f"{r['hf_generate_tokens_per_s']:.1f}: {r['vs_hf_generate']:.2f}x")
    identity = report.get("backend_identity")
    if identity:
        print(f"vLLM vs transformers greedy tokens: {identity['identical']}/{identity['prompts']} identical")
        for d in identity["differences"]:
            print(f"  prompt {d['prompt']}: first difference at token {d['first_difference_at']} "
                  f"(transformers top-2 logit gap there {d['transformers_top2_gap']:.2e})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    status = 0
    mismatched = [r["batch"] for r in rows if r["identical_to_alone"] != r["turns"]]
    if mismatched:  # transformers promises it (up to near-ties); vLLM does not promise batch invariance
        print(f"bench.generation: batches {mismatched} changed some greedy tokens (see 'same tokens as alone')",
              file=sys.stderr)
        status = 1 if args.backend == "transformers" else status
    real = real_disagreements(identity)
    if real:  # a divergence right after a near-tie is a tie either kernel may break its own way
        print(f"bench.generation: vLLM and transformers disagree on greedy tokens of {len(real)} prompts, "
              f"not at a near-tie (top-2 gap >= {NEAR_TIE_GAP})", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
