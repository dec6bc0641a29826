"""Script arguments of the training stages and the recipe parser they share.

Each stage parses `(ScriptArguments, TrainingArguments-or-TRL-config, trl.ModelConfig)` with
`RecipeParser`, a `trl.TrlParser` that reads `--config recipes/<preset>/<stage>.yaml` and lets CLI flags
override the file. Unlike TrlParser, it names the file and the key when a recipe holds a key that no
dataclass knows (TrlParser only says "Unknown arguments from config file" after everything else has
parsed), and it prints a one-line error instead of the usage of ~300 flags.
"""

from __future__ import annotations

import difflib
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from trl import TrlParser

from env.episode import EpisodeConfig


def default_run_name() -> str:
    """A pipeline run name from the local date and time, e.g. `20260314-1502`."""
    return time.strftime("%Y%m%d-%H%M%S")


@dataclass
class StageArguments:
    """What every stage needs besides the trainer's and the model's arguments."""

    run: str = field(
        default_factory=default_run_name,
        metadata={"help": "Pipeline run name: outputs go to <runs_dir>/<run>/<stage>/ and W&B groups by it. "
                          "Default: the current date-time. Pass the same name to every stage of one pipeline."},
    )
    runs_dir: str = field(default="runs", metadata={"help": "Root directory of pipeline runs."})
    dataset_path: str | None = field(
        default=None,
        metadata={"help": "A datasets.DatasetDict saved with save_to_disk (manifest.json beside it, if any)."},
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str = field(default="validation", metadata={"help": "Held-out split to evaluate on."})
    resume: bool = field(
        default=False,
        metadata={"help": "Continue from the last checkpoint in the stage's output dir (same --run)."},
    )


@dataclass
class CPTScriptArguments(StageArguments):
    """Continued pretraining on the packed code corpus."""

    block_size: int = field(
        default=256, metadata={"help": "Tokens per packed training sequence (documents are cut across blocks)."}
    )
    document_separator: str | None = field(
        default=None,
        metadata={"help": "Token appended to every document. Default: <|endoftext|> when the tokenizer has it "
                          "(our base model, Qwen2.5), else its EOS token."},
    )
    max_eval_blocks: int | None = field(
        default=None,
        metadata={"help": "Evaluate on at most this many validation blocks (the first ones), to bound eval time."},
    )


@dataclass
class SFTScriptArguments(StageArguments):
    """Tool-call SFT on harness trajectories, then a short check in the harness."""

    check_tasks: str | None = field(
        default=None,
        metadata={"help": "Task directory for the post-training harness check (e.g. the val tasks); "
                          "unset: no check."},
    )
    check_limit: int | None = field(default=None, metadata={"help": "Check on at most this many tasks."})
    check_max_turns: int = field(default=8, metadata={"help": "Turn budget per check episode."})
    check_workers: int = field(default=1, metadata={"help": "Check episodes run in parallel processes."})


class RecipeParser(TrlParser):
    """`TrlParser` that rejects unknown recipe keys by name and file, with a suggestion."""

    def parse_args_and_config(self, args: Iterable[str] | None = None, **kwargs):
        args = list(args) if args is not None else sys.argv[1:]
        if "--config" in args:
            index = args.index("--config")
            if index + 1 >= len(args):
                self.error("--config needs a YAML file")
            self.check_recipe(args[index + 1])
        try:
            return super().parse_args_and_config(args, **kwargs)
        except ValueError as e:  # unknown CLI flags, and the dataclasses' own checks (e.g. bf16 without a GPU)
            self.error(str(e))

    def check_recipe(self, path: str) -> None:
        """Exit with a clear message if `path` is missing, not a mapping, or holds an unknown key."""
        if not Path(path).is_file():
            self.error(f"--config {path}: no such file")
        try:
            recipe = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            self.error(f"{path}: not valid YAML: {e}")
        if not isinstance(recipe, dict):
            self.error(f"{path}: a recipe must be a YAML mapping of argument names to values")
        known = {action.dest for action in self._actions} | {"env"}  # `env:` sets environment variables
        for key in recipe:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.error(f"{path}: unknown config key {key!r}{hint}")

    def error(self, message: str):
        # argparse's default prints the full usage first, which here is hundreds of flags long.
        self.exit(2, f"{self.prog}: error: {message}\n")


@dataclass
class RLScriptArguments(StageArguments):
    """GRPO in the harness: episodes of env.episode.run_episode on task-factory tasks (train_rl.py)."""

    tasks_dir: str = field(
        default="artifacts/data/tasks/train",
        metadata={"help": "Tasks to train on: a task directory (searched recursively) or task-set names "
                          "(env/task_sets.py), comma-separated for a mix, e.g. factory:train/locate,factory:train/micro."},
    )
    task_limit: int | None = field(default=None, metadata={"help": "Use only the first N tasks (sorted by id)."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["outcome", "malformed", "turns", "parallel", "length", "latency", "lint",
                                 "failed_actions"],
        metadata={"help": "Reward components from env/rewards.py's REWARDS; weights go in `reward_weights`."},
    )
    malformed_handling: str = field(
        default="penalize",
        metadata={"help": "penalize: each malformed call is an explicit negative (the fix). drop: episodes with a "
                          "malformed call leave the loss (Composer's hack 1, for the ablation).",
                  "choices": ["penalize", "drop"]},
    )
    ask_user_handling: str = field(
        default="penalize",
        metadata={"help": "penalize: `failed_actions` counts ask_user calls like failed edits (the fix). free: "
                          "questions cost nothing (Composer's hack 2, for the ablation).",
                  "choices": ["penalize", "free"]},
    )
    truncated_episodes: str = field(
        default="mask",
        metadata={"help": "Episodes cut by a token limit: mask (no loss on them) or penalty (trained, with the "
                          "`truncated` reward, which must then be in reward_funcs).",
                  "choices": ["mask", "penalty"]},
    )
    max_turns: int = field(default=6, metadata={"help": "Turn budget per episode."})
    max_new_tokens: int = field(default=128, metadata={"help": "Generated tokens per turn."})
    max_episode_tokens: int | None = field(
        default=None, metadata={"help": "Completion-token budget per episode (None: max_turns * max_new_tokens)."})
    max_context: int | None = field(
        default=None, metadata={"help": "Context window for episodes (None: the model's max_position_embeddings)."})
    max_wall_s: float = field(default=120.0, metadata={"help": "Wall-clock budget per episode (seconds)."})
    max_output_chars: int = field(default=EpisodeConfig.max_output_chars, metadata={"help": "Per tool result (head and tail kept)."})
    command_timeout_s: float = field(default=30.0, metadata={"help": "Per sandboxed command."})
    rollout_workers: int = field(
        default=2, metadata={"help": "Episode processes, each with a copy of the policy; 0: in the trainer process."})
    generation_backend: str = field(
        default="transformers",
        metadata={"help": "transformers (rollouts in worker processes or in-process) or vllm (TRL's engine: set "
                          "use_vllm and vllm_mode too).", "choices": ["transformers", "vllm"]},
    )
    dominance_threshold: float = field(
        default=0.8, metadata={"help": "Warn when one reward component makes more than this share of the advantage."})
    log_trajectories_steps: int = field(
        default=10, metadata={"help": "Write (and log to W&B) a few full trajectories every N rollouts; 0: never."})
    log_trajectories_count: int = field(default=2, metadata={"help": "Trajectories per table."})
