"""Where a GRPO step's time goes in the harness: generation, environment (tools, sandbox, grading), training.

    python -m bench.rl                                               # recipes/tiny/rl.yaml, 6 steps
    python -m bench.rl --steps 8 --model runs/demo/sft
    python -m bench.rl --config recipes/tiny/rl.yaml -- --rollout_workers 1    # extra train_rl.py flags after --
    python -m bench.rl --prefix-cache on off     # the same run with and without per-episode KV prefix reuse
    python -m bench.rl --stream on off           # ... with and without continuous batching (act_batch rounds)

Runs the RL stage (`train_rl.py`, as its own process: a stage is a program, not a library) on the recipe
with W&B off, no checkpoints and outputs in a temp dir, and reads the means of the last (up to) 5 logged steps
from the model card it writes: rollout = generation (time inside the policy's stream or `act_batch` calls) + env
(the rest of the rollout: tools, sandboxes, grading, lint); training = TRL's step time minus the rollout
(old/ref log-probs, loss, backward, optimizer). Target on the tiny recipe: env < 10% of the step.

Measured side by side (one script, old then new, on the shared 2-core machine at load ~10-14: compare
ratios, not seconds). Model: the tiny preset's base, random weights (`python -m nanocomposer.model build
--out /tmp/base --corpus data/projects`), so every episode is one 128-token turn ending as no_tool_call;
tasks data/samples; 4 episodes per step (recipes/tiny/rl.yaml); means of steps 2-6:

    old (commit 22030d1, 2 rollout worker processes):  python -m bench.rl --model /tmp/base -- --tasks_dir data/samples
    new (episodes batched in the trainer process):     ... --tasks_dir data/samples --rollout_workers 0

                     old       new
    generation s     11.6      2.06     (5.6x lower; new = time inside act_batch)
    rollout s        14.1      3.17     (4.4x lower)
    env s            2.51      1.11     (workspaces, sandboxes, hidden-test grading)
    step s           28.9      10.4
    env share        8.7%      10.6%    (env time fell 2.3x, the step 2.8x)

With torch's default 2 threads for generation instead of RolloutConfig.generation_threads=1, the same new run
generated for 67 s a step: on an oversubscribed machine, threads cost far more than batching gains.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# train_rl.py run with a speed-up of the rollout policy off (a subprocess: nothing here imports the stage script)
NO_PREFIX_CACHE = "import nanocomposer.rollout as r; r.DEFAULT_PREFIX_CACHE_POSITIONS = 0; "
NO_STREAM = "import nanocomposer.policy as p; p.ModelPolicy.open_stream = lambda self: None; "
RUN_STAGE = "import runpy, sys; sys.argv = ['train_rl.py', *sys.argv[1:]]; runpy.run_path('train_rl.py', run_name='__main__')"
LAST_STEPS = "## Last steps"  # the model card section train_rl.py writes: means of the last 5 logged steps


def card_metrics(readme: Path) -> dict[str, float]:
    """The `Last steps` table of a stage's model card (README.md) as numbers."""
    metrics, inside = {}, False
    for line in readme.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            inside = line.strip() == LAST_STEPS
        elif inside and line.startswith("| ") and not line.startswith("| |"):
            key, value = (cell.strip() for cell in line.strip().strip("|").split("|", 1))
            try:
                metrics[key] = float(value.replace(",", ""))
            except ValueError:
                continue
    if not metrics:
        raise RuntimeError(f"{readme}: no '{LAST_STEPS}' table (did train_rl.py change its model card?)")
    return metrics


def run(config: str, steps: int, model: str | None, extra: list[str], prefix_cache: bool = True,
        stream: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-rl-") as tmp:
        args = ["--config", config, "--run", "bench", "--runs_dir", tmp, "--max_steps", str(steps),
                "--report_to", "none", "--save_strategy", "no", "--log_trajectories_steps", "0", "--logging_steps", "1"]
        args += ["--model_name_or_path", model] if model else []
        patches = ("" if prefix_cache else NO_PREFIX_CACHE) + ("" if stream else NO_STREAM)
        stage = ["-c", patches + RUN_STAGE] if patches else [str(REPO_ROOT / "train_rl.py")]
        proc = subprocess.run([sys.executable, *stage, *args, *extra], cwd=REPO_ROOT,
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"train_rl.py exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}")
        metrics = card_metrics(Path(tmp) / "bench" / "rl" / "README.md")
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
    parser.add_argument("--prefix-cache", nargs="+", choices=("on", "off"), default=["on"],
                        help="one run per value, side by side: the rollout's KV prefix reuse on or off")
    parser.add_argument("--stream", nargs="+", choices=("on", "off"), default=["on"],
                        help="one run per value (for each --prefix-cache value), side by side: continuous batching "
                             "of the rollout's turns, or rounds of act_batch")
    parser.add_argument("extra", nargs="*", help="train_rl.py flags (after --)")
    args = parser.parse_args(argv)
    for mode, stream in [(m, s) for m in args.prefix_cache for s in args.stream]:
        try:
            result = run(args.config, args.steps, args.model, args.extra, prefix_cache=mode == "on",
                         stream=stream == "on")
        except RuntimeError as e:
            print(f"bench.rl: error: {e}", file=sys.stderr)
            return 1
        print(json.dumps({"prefix_cache": mode, "stream": stream, **result}, indent=1))
        print(f"prefix cache {mode}, stream {stream}: step {result['step_s']:.1f} s = generation {result['generation_s']:.1f} s "
              f"({result['generation_share']:.0%}) + env {result['env_s']:.2f} s ({result['env_share']:.1%}) "
              f"+ training {result['train_s']:.1f} s ({result['train_share']:.0%}); {result['mean_turns']:.1f} "
              f"turns, {result['mean_completion_tokens']:.0f} completion tokens per episode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
