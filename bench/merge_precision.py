"""How much of a LoRA update survives being merged into a bf16 model: what eval and the real-time server run.

    python -m bench.merge_precision --model runs/sl3/sft --adapter runs/sl3-rl-s1/rl/checkpoint-16
    python -m bench.merge_precision --model runs/sl3/sft --adapter runs/sl3-rl-s1/rl/checkpoint-16 \
        --dataset artifacts/smol_ladder/sft/dataset --merged runs/sl3-rl-s1/rl

Every stage that trains LoRA saves its model merged (nanocomposer/model_io.py). Training ran the base plus an
unmerged adapter; the merge adds the adapter's delta B @ A * alpha / r to each weight and rounds the sum to the
dtype it is merged in. The stages used to merge in the base's compute dtype (bf16 with `dtype: auto` on a bf16
CPU or GPU); they now merge into the source checkpoint read in fp32 and save fp32, because of what this
measures. A bf16 weight has 8 bits of mantissa, so any part of the delta under half the spacing between bf16
numbers near that weight (about 0.2-0.4% of it) rounds away, deterministically, not as noise.

Weights (always): for the adapter's modules, |delta| / |W| (relative L2), the error the rounding leaves,
|merged - W - delta| / |delta|, and the share of weights the merge changes at all. No forward pass.

Outputs (`--dataset`, a saved SFT dataset with messages and tools): teacher-forced logprobs of the assistant
tokens of its `--split` rows under three models computed in fp32, so that only the weights differ: the base
(`--model`), the trained policy (base + unmerged adapter) and the merged model (`--merged`, as saved, or the
merge done here). It prints the mean |logprob difference| of each pair and each model's mean logprob.

Measured on SmolLM2-135M GRPO adapters (2026-12-06, docs/log.md): 16 steps at lr 5e-5, |delta|/|W| 3.1e-4,
rounding error 0.92 of the delta, 8.0% of weights changed; the merged model's mean logprob on the 24 validation
trajectories equals the SFT model's (-0.0554; the policy's -0.0560).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

import torch


def _adapter_pairs(adapter: dict[str, torch.Tensor]):
    """(base weight name, lora_A, lora_B) for every adapted module of a PEFT state dict."""
    for key, a in adapter.items():
        if ".lora_A." in key:
            b = adapter.get(key.replace(".lora_A.", ".lora_B."))
            if b is None:
                raise SystemExit(f"the adapter has {key!r} but no matching lora_B weight")
            yield key.replace("base_model.model.", "", 1).replace(".lora_A.weight", ".weight"), a, b


def weight_report(base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], scale: float,
                  dtype: torch.dtype | None = None) -> dict:
    """The merge's rounding on the adapted weights, in `dtype` (default: the base's own)."""
    delta_sq = error_sq = weight_sq = 0.0
    changed = total = modules = 0
    for name, a, b in _adapter_pairs(adapter):
        if name not in base:
            raise SystemExit(f"the adapter adapts {name!r}, which the model does not have")
        w = base[name]
        target = dtype or w.dtype
        w_exact = w.to(target).double()
        delta = (b.double() @ a.double()) * scale
        merged = (w_exact + delta).to(target)
        kept = merged.double() - w_exact
        delta_sq += float(delta.pow(2).sum())
        error_sq += float((kept - delta).pow(2).sum())
        weight_sq += float(w_exact.pow(2).sum())
        changed += int((merged != w.to(target)).sum())
        total += w.numel()
        modules += 1
    if not modules:
        raise SystemExit("the adapter has no lora_A/lora_B weights")
    return {"dtype": str(dtype or next(iter(base.values())).dtype).replace("torch.", ""), "modules": modules,
            "weights": total, "delta_over_weight": (delta_sq / weight_sq) ** 0.5,
            "rounding_error_over_delta": (error_sq / delta_sq) ** 0.5 if delta_sq else 0.0,
            "weights_changed": changed / total}


def _assistant_sequences(dataset_path: str, split: str, tokenizer, max_length: int, limit: int | None):
    from datasets import load_from_disk

    rows = load_from_disk(dataset_path)[split]
    seqs = []
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            break
        messages = row["messages"] if isinstance(row["messages"], list) else ast.literal_eval(row["messages"])
        tools = json.loads(row["tools"]) if isinstance(row.get("tools"), str) else row.get("tools")
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        ids = torch.tensor(out["input_ids"][:max_length])
        mask = torch.tensor(out["assistant_masks"][:max_length]).bool()
        if mask[1:].any():
            seqs.append((ids, mask))
    if not seqs:
        raise SystemExit(f"{dataset_path} [{split}]: no row with assistant tokens (the chat template needs "
                         "{% generation %} markers)")
    return seqs


@torch.no_grad()
def _logprobs(model, seqs) -> torch.Tensor:
    out = []
    for ids, mask in seqs:
        logits = model(ids[None]).logits[0, :-1].float()
        out.append(torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0][mask[1:]])
    return torch.cat(out)


def logprob_report(model_dir: str, adapter_dir: str, merged_dir: str | None, dataset: str, split: str,
                   max_length: int, limit: int | None) -> dict:
    from peft import PeftModel

    from nanocomposer.engine.checkpoints import ModelLoadError, load_model_and_tokenizer

    def load(path):
        """The project's loader (the checkpoint's own dtype, as the stages load it) and its errors."""
        try:
            return load_model_and_tokenizer(path, "cpu")
        except ModelLoadError as e:
            raise SystemExit(f"merge_precision: {e}") from None

    base, tokenizer = load(model_dir)
    seqs = _assistant_sequences(dataset, split, tokenizer, max_length, limit)
    # every model computed in fp32 (an exact upcast), so that only the weights differ
    lp = {"base": _logprobs(base.float().eval(), seqs)}
    lp["policy"] = _logprobs(PeftModel.from_pretrained(load(model_dir)[0].float(), adapter_dir).eval(), seqs)
    if merged_dir:
        merged = load(merged_dir)[0]
    else:  # merged in the dtype the base loads in (what the stages did before they merged in fp32)
        merged = PeftModel.from_pretrained(load(model_dir)[0], adapter_dir).merge_and_unload()
    lp["merged"] = _logprobs(merged.float().eval(), seqs)
    diff = lambda x, y: float((lp[x] - lp[y]).abs().mean())
    return {"tokens": int(lp["base"].numel()), "sequences": len(seqs),
            "mean_logprob": {k: float(v.mean()) for k, v in lp.items()},
            "mean_abs_diff": {"policy-base": diff("policy", "base"), "merged-base": diff("merged", "base"),
                              "merged-policy": diff("merged", "policy")}}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the model the adapter was trained on (a checkpoint directory)")
    p.add_argument("--adapter", required=True, help="a PEFT adapter directory (a trainer checkpoint)")
    p.add_argument("--dtype", choices=["model", "bfloat16", "float16", "float32"], default="model",
                   help="merge into this dtype (model: the checkpoint's own)")
    p.add_argument("--dataset", help="a saved SFT dataset: also compare teacher-forced logprobs (fp32)")
    p.add_argument("--split", default="validation")
    p.add_argument("--limit", type=int, default=None, help="at most this many dataset rows")
    p.add_argument("--max_length", type=int, default=2048)
    p.add_argument("--merged", help="the merged model as saved (default: merge here, in the dtype --model loads in)")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    from safetensors.torch import load_file

    model_file, adapter_file = Path(args.model) / "model.safetensors", Path(args.adapter) / "adapter_model.safetensors"
    for f in (model_file, adapter_file, Path(args.adapter) / "adapter_config.json"):
        if not f.is_file():
            raise SystemExit(f"{f}: not found")
    try:
        config = json.loads((Path(args.adapter) / "adapter_config.json").read_text())
        if config.get("rank_pattern") or config.get("alpha_pattern"):
            raise ValueError("per-module rank_pattern/alpha_pattern is not supported")
        scale = config["lora_alpha"] / (config["r"] ** 0.5 if config.get("use_rslora") else config["r"])
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{Path(args.adapter) / 'adapter_config.json'}: not a LoRA adapter config this bench reads "
                         f"({type(e).__name__}: {e})") from None
    dtype = None if args.dtype == "model" else getattr(torch, args.dtype)
    report = {"model": args.model, "adapter": args.adapter,
              "weights": weight_report(load_file(model_file), load_file(adapter_file), scale, dtype)}
    w = report["weights"]
    print(f"{args.adapter} merged into {args.model} ({w['dtype']}, {w['modules']} modules, {w['weights']:,} weights): "
          f"|delta|/|W| {w['delta_over_weight']:.2e}; rounding error {w['rounding_error_over_delta']:.3f} of the delta; "
          f"{w['weights_changed']:.1%} of the weights changed")
    if args.dataset:
        r = report["logprobs"] = logprob_report(args.model, args.adapter, args.merged, args.dataset, args.split,
                                                args.max_length, args.limit)
        print(f"{r['tokens']} assistant tokens of {r['sequences']} rows, fp32: mean |diff| policy-base "
              f"{r['mean_abs_diff']['policy-base']:.4f}, merged-base {r['mean_abs_diff']['merged-base']:.4f}, "
              f"merged-policy {r['mean_abs_diff']['merged-policy']:.4f}; mean logprob "
              + ", ".join(f"{k} {v:.4f}" for k, v in r["mean_logprob"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
