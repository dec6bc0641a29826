"""Where a GRPO step's time goes in the harness: generation, environment (tools, sandbox, grading), training.

    python -m bench.rl                                               # recipes/tiny/rl.yaml, 6 steps
    python -m bench.rl --steps 8 --model runs/demo/sft
    python -m bench.rl --config recipes/tiny/rl.yaml -- --rollout_workers 0    # extra train_rl.py flags after --

Runs train_rl.main on the recipe (W&B off, no checkpoints, outputs in a temp dir) and averages the last
steps (the first pays for spawning the rollout workers): rollout = generation + env (the episodes' wall time,
split by their own gen/env shares, since episodes overlap in the worker pool); training = TRL's step time
minus the rollout (old/ref log-probs, loss, backward, optimizer). Target on the tiny recipe: env < 10%.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def run(config: str, steps: int, model: str | None, extra: list[str]) -> dict:
    import train_rl

    with tempfile.TemporaryDirectory(prefix="bench-rl-") as tmp:
        args = ["--config", config, "--run", "bench", "--runs_dir", tmp, "--max_steps", str(steps),
                "--report_to", "none", "--save_strategy", "no", "--log_trajectories_steps", "0", "--logging_steps", "1"]
        args += ["--model_name_or_path", model] if model else []
        metrics = train_rl.main(*train_rl.make_parser().parse_args_and_config(args + extra))
    step = metrics["step_time"]
    generation, env = metrics["timing/generation_s"], metrics["timing/env_s"]
    train = step - metrics["timing/rollout_s"]
    return {
        "steps_averaged": min(5, steps),
        "step_s": step,
        "generation_s": generation,
        "env_s": env,
        "train_s": train,
        "generation_share": generation / step,
        "env_share": env / step,
        "train_share": train / step,
        "mean_turns": metrics.get("behaviour/mean_turns"),
        "mean_completion_tokens": metrics.get("behaviour/mean_completion_tokens"),
        "exit_no_tool_call": metrics.get("exit/no_tool_call"),
        "exit_submitted": metrics.get("exit/submitted"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO_ROOT / "recipes/tiny/rl.yaml"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model", default=None, help="override the recipe's model_name_or_path")
    parser.add_argument("extra", nargs="*", help="train_rl.py flags (after --)")
    args = parser.parse_args(argv)
    result = run(args.config, args.steps, args.model, args.extra)
    print(json.dumps(result, indent=1))
    print(f"step {result['step_s']:.1f} s = generation {result['generation_s']:.1f} s ({result['generation_share']:.0%}) "
          f"+ env {result['env_s']:.2f} s ({result['env_share']:.1%}) + training {result['train_s']:.1f} s "
          f"({result['train_share']:.0%}); {result['mean_turns']:.1f} turns, "
          f"{result['mean_completion_tokens']:.0f} completion tokens per episode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
