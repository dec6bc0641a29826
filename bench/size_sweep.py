"""One table from CPT runs of different model sizes: what each size costs a step and what it learned.

For each `train_cpt.py` output directory: the model's shape (`config.json`), its parameters (total, and outside
the embedding, read from `model.safetensors`' header), seconds per optimizer step (`train_results.json`), and,
at every scheduled evaluation (`trainer_state.json`), held-out code loss and the in-context copy metrics of
`nanocomposer.copy_eval` (cued copy accuracy on held-out names, per token, whole next name) and of
`nanocomposer.copy_warmup` (fresh repeated random runs copied). `runs/size_sweep.sh` trains the sizes and
calls this:

    python -m bench.size_sweep runs/size-L4-W256/cpt runs/size-L8-W256/cpt --out runs/size_sweep.md
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from safetensors import safe_open

# the evaluation metrics read from trainer_state.json: code loss, then the copy metrics
EVAL_KEYS = ("eval_loss", "eval_copy_accuracy", "eval_copy_token_accuracy", "eval_next_name_accuracy",
             "eval_repeat_copy_accuracy")


class SweepError(ValueError):
    """A run directory this table cannot read (says which file and why)."""


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SweepError(f"{path}: missing (is this a finished train_cpt.py output directory?)") from None
    except json.JSONDecodeError as e:
        raise SweepError(f"{path}: not JSON ({e})") from None


def parameter_counts(model_dir: Path) -> tuple[int, int]:
    """(all parameters, those outside the token embedding), from the safetensors header (no weights loaded)."""
    path = model_dir / "model.safetensors"
    if not path.is_file():
        raise SweepError(f"{path}: missing")
    total = embedding = 0
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118  (safe_open is not iterable)
            n = math.prod(f.get_slice(name).get_shape())
            total += n
            embedding += n if name.endswith("embed_tokens.weight") else 0
    return total, total - embedding


def read_run(run_dir: Path) -> dict:
    config = _json(run_dir / "config.json")
    results = _json(run_dir / "train_results.json")
    state = _json(run_dir / "trainer_state.json")
    evals: dict[int, dict] = {}  # step -> metrics (the trainer logs the copy metrics as an entry of their own)
    for log in state.get("log_history", []):
        evals.setdefault(log["step"], {}).update({k: log[k] for k in EVAL_KEYS if k in log})
    evals = {step: metrics for step, metrics in evals.items() if "eval_loss" in metrics}
    if not evals:
        raise SweepError(f"{run_dir / 'trainer_state.json'}: no evaluation in the log history")
    total, body = parameter_counts(run_dir)
    try:
        steps = results["global_step"]
        return {"run": str(run_dir), "layers": config["num_hidden_layers"], "width": config["hidden_size"],
                "heads": config["num_attention_heads"], "vocab": config["vocab_size"], "params": total,
                "non_embedding": body, "steps": steps, "s_per_step": results["train_seconds"] / steps,
                "evals": evals}
    except (KeyError, TypeError, ZeroDivisionError) as e:
        raise SweepError(f"{run_dir}: config.json or train_results.json lacks {e} (not a train_cpt.py run?)") from None


def _pct(value) -> str:
    return "" if value is None else f"{100 * float(value):.1f}%"


def markdown(runs: list[dict]) -> str:
    header = ("| run | layers x width (heads), vocab | params (non-embedding) | s/step | steps | code loss | "
              "cued copy | per token | next name | repeated runs |")
    lines = [header, "|---" * 10 + "|"]
    for r in runs:
        final = r["evals"][max(r["evals"])]
        lines.append(f"| `{r['run']}` | {r['layers']} x {r['width']} ({r['heads']}), {r['vocab']:,} | "
                     f"{r['params'] / 1e6:.1f} M ({r['non_embedding'] / 1e6:.1f} M) | {r['s_per_step']:.3f} | "
                     f"{r['steps']:,} | {final['eval_loss']:.2f} | {_pct(final.get('eval_copy_accuracy'))} | "
                     f"{_pct(final.get('eval_copy_token_accuracy'))} | {_pct(final.get('eval_next_name_accuracy'))} | "
                     f"{_pct(final.get('eval_repeat_copy_accuracy'))} |")
    steps = sorted({s for r in runs for s in r["evals"]})
    lines += ["", "Cued copy accuracy on held-out names (code loss) at each evaluation:", "",
              "| run | " + " | ".join(f"step {s:,}" for s in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for r in runs:
        cells = [f"{_pct(e.get('eval_copy_accuracy'))} ({e['eval_loss']:.2f})" if (e := r["evals"].get(s)) else ""
                 for s in steps]
        lines.append(f"| `{r['run']}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="train_cpt.py output directories (runs/NAME/cpt)")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    runs, skipped = [], []
    for run_dir in args.runs:
        try:
            runs.append(read_run(run_dir))
        except SweepError as e:  # a crashed size leaves the others' table intact, and says why
            skipped.append(str(e))
    if not runs:
        parser.exit(2, "no run could be read:\n  " + "\n  ".join(skipped) + "\n")
    text = markdown(runs) + "".join(f"\nSkipped: {reason}\n" for reason in skipped)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
