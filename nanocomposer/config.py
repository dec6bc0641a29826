"""Script arguments of the training stages and the recipe parser they share.

Each stage parses `(ScriptArguments, TrainingArguments-or-TRL-config, trl.ModelConfig)` with
`RecipeParser`, a `trl.TrlParser` that reads `--config recipes/<preset>/<stage>.yaml` and lets CLI flags
override the file. Unlike TrlParser, it checks the recipe and the values before any dataclass is built,
and stops with one line naming the flag, or the file and the key, and what is wrong (exit status 2, as
argparse does for a bad flag), instead of the usage of ~300 flags or a traceback from deep inside a trainer:
- an unknown recipe key (TrlParser only says "Unknown arguments from config file" after everything else
  has parsed), with the closest known key;
- a recipe value of the wrong type: TrlParser sets YAML values as argparse defaults, and argparse only
  converts defaults that are strings, so `max_steps: 1.5` or `reward_funcs: outcome` would reach the
  trainer as they are. Here every value goes through its flag's type, exactly like the same value on the
  command line, and `choices` are enforced;
- a value out of range (`VALUE_RULES`: a negative learning rate, a zero batch size, ...; the budget arguments,
  `max_turns: -1` and the like, by env.budget.Budget itself through `budget_from_arguments`).

Budgets: when `recipes/<preset>/budget.yaml` (env/budget.py) sits beside the `--config` recipe, or
`--budget FILE` names one, its keys set the stage's budget arguments (`max_turns`, RL's `max_episode_tokens`
for `max_tokens`, the real-time loop's `session_timeout_s` for `max_wall_s`, the SFT check's `check_max_turns`,
...): one file per preset read by every stage. A stage recipe beside a budget file sets no budget argument at
all (one source); flags still override the file. `--budget none` reads no budget file. Every stage builds its
episodes' `Budget` with `budget_from_arguments`, so each stage carries the whole budget under one validator.

Bad input found later, before any work (a model directory without a tokenizer, a missing dataset), is a
`ConfigError`; `nanocomposer.common.run_main` reports it the same way.

Over 500 lines because: the stages' argument dataclasses (CPT, SFT, RL: their documented fields are ~180
lines) and RecipeParser, which checks every recipe value through those same fields' flags, are one job:
the stages' arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import math
import sys
import time
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from trl import TrlParser

from env.budget import BUDGET_FILE, BUDGET_FILE_KEYS, Budget, BudgetError, load_budget_file
from nanocomposer.policies import GENERATION_BACKENDS


class ConfigError(SystemExit):
    """Bad input (a path, a checkpoint, a value), found before any work starts.

    A stage's `__main__` (`nanocomposer.common.run_main`) prints it as `<script>: error: <message>` on one
    line and exits with status 2. It is a SystemExit so that a stage called as a function (the tests) still
    stops without a traceback; `str(error)` is the message.
    """


class ArgumentError(ValueError):
    """A value its argument cannot take. The dataclasses raise it without knowing where the value came
    from; `RecipeParser` names the flag, or the recipe file and key."""

    def __init__(self, key: str, value: Any, problem: str):
        self.key, self.value, self.problem = key, value, problem
        super().__init__(f"{key} {value!r}: {problem}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _at_least(low: int, why: str = "") -> tuple[Callable[[Any], bool], str]:
    return (lambda v: _is_number(v) and v >= low), f"must be at least {low}{why}"


POSITIVE = (lambda v: _is_number(v) and v > 0), "must be > 0"
NON_NEGATIVE = (lambda v: _is_number(v) and v >= 0), "must be >= 0"
FRACTION = (lambda v: _is_number(v) and 0 < v <= 1), "must be in (0, 1]"
BELOW_ONE = (lambda v: _is_number(v) and 0 <= v < 1), "must be in [0, 1)"
NOT_EMPTY = (lambda v: isinstance(v, str) and v.strip() != ""), "must not be empty"

# What every stage refuses, by argument name, whichever dataclass holds it (the stages' own, transformers'
# TrainingArguments and TRL's SFTConfig/GRPOConfig/ModelConfig). None always passes: it means "unset".
VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    # StageArguments and the stages' own arguments
    "run": NOT_EMPTY,
    "runs_dir": NOT_EMPTY,
    "block_size": _at_least(2, " (the first token of a block has no label)"),
    "max_eval_blocks": _at_least(1),
    "check_limit": _at_least(1),
    "check_workers": _at_least(1),
    "task_limit": _at_least(1),
    # (the budget arguments, max_turns, check_max_turns, max_episode_tokens, ..., are checked by env.budget.Budget
    # itself: `budget_from_arguments` in each stage's __post_init__)
    "rollout_workers": _at_least(0, " (0: all of the step's episodes at once)"),
    "dominance_threshold": FRACTION,
    "log_trajectories_steps": _at_least(0, " (0: never)"),
    "log_trajectories_count": _at_least(0),
    # Trainer (transformers.TrainingArguments and TRL's configs)
    "learning_rate": POSITIVE,
    "per_device_train_batch_size": _at_least(1),
    "per_device_eval_batch_size": _at_least(1),
    "gradient_accumulation_steps": _at_least(1),
    "max_steps": ((lambda v: isinstance(v, int) and not isinstance(v, bool) and (v == -1 or v >= 1)),
                  "must be at least 1, or -1 to train for num_train_epochs"),
    "num_train_epochs": POSITIVE,
    "warmup_steps": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE,
    "adam_beta1": BELOW_ONE,
    "adam_beta2": BELOW_ONE,
    "adam_epsilon": POSITIVE,
    "logging_steps": POSITIVE,
    "save_steps": POSITIVE,
    "eval_steps": POSITIVE,
    "dataloader_num_workers": _at_least(0),
    "seed": _at_least(0, " (numpy's generator takes 0 to 2**32 - 1)"),
    "data_seed": _at_least(0, " (numpy's generator takes 0 to 2**32 - 1)"),
    "max_length": _at_least(1),  # SFTConfig
    "num_generations": _at_least(2, " (GRPO compares the episodes of one task)"),  # GRPOConfig
    "temperature": POSITIVE,
    "top_p": FRACTION,
    "beta": NON_NEGATIVE,
    # trl.ModelConfig (LoRA)
    "lora_r": _at_least(1),
    "lora_alpha": POSITIVE,
    "lora_dropout": BELOW_ONE,
}


def check_value(key: str, value: Any) -> None:
    """Raise ArgumentError if `value` breaks the rule for argument `key` (if it has one)."""
    rule = VALUE_RULES.get(key)
    if rule is not None and value is not None and not rule[0](value):
        raise ArgumentError(key, value, rule[1])


def check_values(arguments: Any) -> None:
    """Every field of the dataclass instance `arguments` against VALUE_RULES."""
    for f in dataclasses.fields(arguments):
        check_value(f.name, getattr(arguments, f.name, None))


def recipe_reward_funcs(names: list[str], weights: list[float] | None, *, malformed_handling: str,
                        ask_user_handling: str) -> list:
    """The reward functions a recipe names (env/rewards.py), with the hack switches applied and one weight per
    function; ConfigError naming the key otherwise. Shared by the stages that train on rewards."""
    from env.rewards import get_reward_funcs

    try:
        funcs = get_reward_funcs(names, malformed_handling=malformed_handling, ask_user_handling=ask_user_handling)
    except ValueError as e:
        raise ConfigError(f"reward_funcs: {e}") from None
    if weights is not None and len(weights) != len(funcs):
        raise ConfigError(f"reward_weights has {len(weights)} values for {len(funcs)} reward_funcs "
                          f"{names}: give one weight per component")
    if malformed_handling == "drop":
        quiet_dropped_episode_warning()
    return funcs


# TRL's GRPOTrainer warns, with the whole prompt and completion, for every batch holding a row where all reward
# functions returned None. Under malformed_handling="drop" that row is the malformed-calls-dropped ablation doing what it is
# meant to (the episode leaves the loss), so the warning is noise: 84 prompt dumps in a 100-step run. The
# share of dropped episodes is logged instead (rollout/dropped_rate; the real-time loop counts them).
TRL_ALL_NONE_WARNING = "All reward functions returned None"


class _DroppedEpisodeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TRL_ALL_NONE_WARNING)


def quiet_dropped_episode_warning(logger_name: str = "trl.trainer.grpo_trainer") -> None:
    """Silence TRL's all-rewards-None warning on `logger_name` (idempotent); other warnings pass."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _DroppedEpisodeFilter) for f in logger.filters):
        logger.addFilter(_DroppedEpisodeFilter())


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
        metadata={"help": "Continue from the newest complete checkpoint in the stage's output dir (same --run); "
                          "incomplete ones (a save cut short) are moved aside to incomplete-checkpoint-N."},
    )

    def __post_init__(self):
        check_values(self)


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
    # The check's episode budget (and the harness eval's): env.budget.Budget's fields with a check_ prefix, set
    # by the preset's budget.yaml like RL's and eval's (`check_budget`).
    check_max_turns: int = field(default=Budget.max_turns, metadata={"help": "Turn budget per check episode."})
    check_max_tokens: int | None = field(default=Budget.max_tokens, metadata={
        "help": "Completion-token budget per check episode (None: no cap)."})
    check_max_new_tokens: int = field(default=Budget.max_new_tokens,
                                      metadata={"help": "Generated tokens per turn in the check (greedy)."})
    check_max_context: int | None = field(default=Budget.max_context,
                                          metadata={"help": "Context window of the check (None: the model's)."})
    check_max_malformed_turns: int = field(default=Budget.max_malformed_turns, metadata={
        "help": "Consecutive turns with malformed calls (and no valid one) that end a check episode."})
    check_max_output_chars: int = field(default=Budget.max_output_chars,
                                        metadata={"help": "Per tool result in the check (head and tail kept)."})
    check_max_wall_s: float = field(default=Budget.max_wall_s, metadata={"help": "Wall clock per check episode."})
    check_command_timeout_s: float = field(default=Budget.command_timeout_s,
                                           metadata={"help": "Per sandboxed command in the check."})
    check_workers: int = field(default=1, metadata={"help": "Check episodes played at once (threads; generation "
                                                            "batched)."})
    check_must_pass: bool = field(
        default=True,
        metadata={"help": "Exit 1 when the trained model makes no valid tool call in the check. false: report it "
                          "only (dry runs, and timing checks of a weak model)."})
    harness_eval_tasks: str | None = field(
        default=None,
        metadata={"help": "Held-out tasks the live model plays DURING training (nanocomposer/harness_eval.py), "
                          "logged as eval/harness_* in W&B: a task directory or a task-set name "
                          "(env/task_sets.py, e.g. factory:val/ladder). Greedy, with the check's turn and token "
                          "budgets. Unset: none."},
    )
    harness_eval_limit: int | None = field(
        default=60,
        metadata={"help": "Play at most this many of harness_eval_tasks, spread evenly over their families "
                          "(null: all)."},
    )
    harness_eval_steps: int | None = field(
        default=None,
        metadata={"help": "Play them every this many optimizer steps. Unset: at every evaluation (eval_steps)."},
    )
    harness_eval_on_start: bool = field(
        default=False, metadata={"help": "Also play them before the first training step (step 0)."}
    )
    harness_eval_workers: int = field(
        default=8,
        metadata={"help": "Harness-eval episodes played at once (threads; their turns are generated as one batch)."},
    )
    labelled_only_head: bool | None = field(
        default=None,
        metadata={"help": "Compute the LM head and the loss only at labelled positions (nanocomposer/sft_loss.py): "
                          "same loss and metrics, less compute on assistant-only packed rows. Unset: on when "
                          "training on CPU (on GPU TRL's fused head already skips them)."},
    )

    def __post_init__(self):
        super().__post_init__()
        self.check_budget()  # the check's budget, checked by Budget (ArgumentError naming the check_* argument)
        for key in ("harness_eval_limit", "harness_eval_steps", "harness_eval_workers"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ArgumentError(key, value, "must be an integer >= 1")
        if self.harness_eval_tasks is not None and not self.harness_eval_tasks.strip():
            raise ArgumentError("harness_eval_tasks", self.harness_eval_tasks,
                                "must not be empty (leave it unset for no harness eval)")
        if not self.harness_eval_tasks and (self.harness_eval_steps is not None or self.harness_eval_on_start):
            key = "harness_eval_steps" if self.harness_eval_steps is not None else "harness_eval_on_start"
            raise ArgumentError(key, getattr(self, key), "schedules a harness eval, but harness_eval_tasks is not set")

    def check_budget(self) -> Budget:
        """The check's env.budget.Budget: its check_* budgets (the preset's budget.yaml, which RL and eval read
        too), greedy, seed 0."""
        return budget_from_arguments(self, prefix="check_")


# The stage arguments a budget-file key sets, by name: the key itself (eval, RL, real-time RL), the SFT check's
# copy of it (check_<key>), and the names kept where a stage's flag predates the budget file (renaming them would
# break the command lines that use them): RL's per-episode token cap and the real-time loop's session wall clock.
BUDGET_ALIASES = {"max_tokens": ("max_tokens", "max_episode_tokens"), "max_wall_s": ("max_wall_s", "session_timeout_s")}


def budget_destinations(key: str) -> tuple[str, ...]:
    return (*BUDGET_ALIASES.get(key, (key,)), f"check_{key}")


def budget_argument_names(arguments: Any, prefix: str = "") -> dict[str, str]:
    """Budget-file key -> the name of the argument of `arguments` (a stage's dataclass) that holds it: `prefix` +
    key (the SFT check's check_*), else the key or its alias (BUDGET_ALIASES). Every key must have exactly one: a
    stage carries the whole episode budget, so no key silently falls back to Budget's default."""
    names = {f.name for f in dataclasses.fields(arguments)}
    out = {}
    for key in BUDGET_FILE_KEYS:
        candidates = [f"{prefix}{key}"] if prefix else list(BUDGET_ALIASES.get(key, (key,)))
        found = [name for name in candidates if name in names]
        if len(found) != 1:
            raise TypeError(f"{type(arguments).__name__} needs exactly one argument for the budget key {key!r} "
                            f"(one of {', '.join(candidates)}); it has {found or 'none'}")
        out[key] = found[0]
    return out


def budget_from_arguments(arguments: Any, *, prefix: str = "", **sampling: Any) -> Budget:
    """The env.budget.Budget a stage's arguments describe, validated by Budget (the one validator of budgets):
    each budget-file key from its argument (`budget_argument_names`), the sampling settings (temperature, top_p,
    seed) from `sampling`, else Budget's (greedy, seed 0). A bad value is an ArgumentError naming the stage's
    argument (RecipeParser then names its flag or recipe key)."""
    names = budget_argument_names(arguments, prefix)
    try:
        return Budget(**{key: getattr(arguments, name) for key, name in names.items()}, **sampling)
    except BudgetError as e:
        if e.key is None:
            raise
        problem = e.problem  # a cross-field rule names the other key: by the stage's name for it too
        for key, name in names.items():
            problem = problem.replace(f"{key}=", f"{name}=") if key != name else problem
        raise ArgumentError(names.get(e.key, e.key), e.value, problem) from None


def pop_budget_flag(args: list[str]) -> tuple[list[str], str | None]:
    """(args without `--budget FILE` / `--budget=FILE`, FILE or None)."""
    rest, value = [], None
    it = iter(args)
    for arg in it:
        if arg == "--budget":
            value = next(it, "")
        elif arg.startswith("--budget="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return rest, value


class RecipeParser(TrlParser):
    """`TrlParser` that checks the recipe's keys and types and every value's range (see the module docstring)."""

    def parse_args_and_config(self, args: Iterable[str] | None = None, **kwargs):
        args, budget_flag = pop_budget_flag(list(args) if args is not None else sys.argv[1:])
        self.cli_args, self.recipe_path, self.recipe, self.budget_path, self.budget_defaults = args, None, {}, None, {}
        if "--config" in args:
            if args.count("--config") > 1:
                self.error("--config given more than once (one recipe; override its keys with flags)")
            index = args.index("--config")
            if index + 1 >= len(args):
                self.error("--config needs a YAML file")
            self.check_recipe(args[index + 1])
        self.load_budget(budget_flag)
        if self.budget_defaults and self.recipe_path is None:  # no recipe: TrlParser sets no defaults itself
            self.set_defaults_with_config(**self.budget_defaults)
        try:
            return super().parse_args_and_config(args, **kwargs)
        except ArgumentError as e:  # a stage dataclass's own check (a cross-field one, e.g. max_context)
            self.error(f"{self.source(e.key)} {e.value!r}: {e.problem}")
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
        if not isinstance(recipe.get("env", {}), dict):
            self.error(f"{path}: env must be a mapping of environment variable names to values")
        self.recipe_path, self.recipe = path, recipe

    def load_budget(self, flag: str | None) -> None:
        """The budget file's values as defaults of this stage's budget arguments (module docstring)."""
        if flag is not None and flag.strip() in ("", "none"):
            if flag.strip() == "":
                self.error("--budget needs a file (or `none` for no budget file)")
            return
        path = Path(flag) if flag else None
        if path is None and self.recipe_path is not None:
            beside = Path(self.recipe_path).with_name(BUDGET_FILE)
            path = beside if beside.is_file() else None
        if path is None:
            return
        try:
            values = load_budget_file(path)
        except BudgetError as e:
            self.error(str(e))
        dests = {action.dest for action in self._actions}
        mapped = {dest: value for key, value in values.items() for dest in budget_destinations(key) if dest in dests}
        budget_dests = {dest for key in BUDGET_FILE_KEYS for dest in budget_destinations(key) if dest in dests}
        both = sorted(budget_dests & set(self.recipe))
        if both:
            what = (f"is set in the budget file {path} too" if both[0] in mapped
                    else f"is a budget setting, and the budget file {path} is read")
            self.error(f"{self.recipe_path}: {both[0]} {what}: set the preset's budgets there only (every stage of "
                       "the preset reads it)")
        self.budget_path, self.budget_defaults = str(path), mapped

    def set_defaults_with_config(self, **kwargs) -> list[str]:
        # TrlParser's hook for the recipe's values: give them the types the same flags get on the command line.
        kwargs = {**getattr(self, "budget_defaults", {}), **kwargs}
        return super().set_defaults_with_config(**{key: self.typed(key, value) for key, value in kwargs.items()})

    def parse_known_args(self, args=None, namespace=None):
        # Every parse goes through here once argparse has applied recipe defaults and flags, before any
        # dataclass (and its __post_init__, which may fail less clearly) is built.
        namespace, remaining = super().parse_known_args(args, namespace)
        for key, value in vars(namespace).items():
            try:
                check_value(key, value)
            except ArgumentError as e:
                self.error(f"{self.source(key)} {value!r}: {e.problem}")
        return namespace, remaining

    def typed(self, key: str, value: Any) -> Any:
        """The recipe's `value` for `key` as its flag's type would parse it, or exit naming file and key."""
        action = next((a for a in self._actions if a.dest == key and (a.type is not None or a.choices)), None)
        if action is None:  # `env`, and flags without a value (store_true)
            return value
        annotation, default = self.declared_fields().get(key, (None, None))
        accepts = _annotation_types(annotation)
        if value is None:
            if accepts is None or type(None) in accepts or default is None:
                return None
            self.recipe_error(key, value, f"must be {_type_name(action)}, not null")
        if isinstance(value, dict):
            if accepts is None or dict in accepts:
                return value
            self.recipe_error(key, value, f"must be {_type_name(action)}, not a mapping")
        if action.nargs in ("+", "*"):  # a list flag: one value is a list of one, as on the command line
            return [self.convert(key, action, item, value) for item in (value if isinstance(value, list) else [value])]
        if isinstance(value, list):
            if accepts is None or list in accepts:
                return value
            self.recipe_error(key, value, f"must be {_type_name(action)}, not a list")
        return self.convert(key, action, value, value)

    def convert(self, key: str, action: argparse.Action, value: Any, whole: Any) -> Any:
        """One value (`whole`: the recipe's value it is part of, for the message) through the flag's type."""
        converter, kind = action.type, _kind(action)
        if kind is None:  # a type we do not know how to check: as is
            return value
        if isinstance(value, bool) and kind != "bool":
            self.recipe_error(key, whole, f"must be {_type_name(action)}, not a boolean (YAML reads yes/no/on/off "
                                          "as booleans: quote the value)")
        if isinstance(value, dict | list):
            self.recipe_error(key, whole, f"must be {_type_name(action)}, not a {_yaml_kind(value)}")
        try:
            converted = converter(value if isinstance(value, str | bool) else str(value))
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            self.recipe_error(key, whole, f"must be {_type_name(action)}")
        if action.choices and converted not in action.choices:
            self.recipe_error(key, whole, f"must be {_type_name(action)}")
        return converted

    def declared_fields(self) -> dict[str, tuple[Any, Any]]:
        """(declared type, default) of every dataclass field; HfArgumentParser rewrites `Field.type` (it
        drops `str` and `None` from unions), not the annotations."""
        if getattr(self, "_declared", None) is not None:
            return self._declared
        declared: dict[str, tuple[Any, Any]] = {}
        for dataclass_type in self.dataclass_types:
            try:
                hints = typing.get_type_hints(dataclass_type)
            except (NameError, TypeError):  # unresolvable annotations: those fields are not type-checked
                continue
            for f in dataclasses.fields(dataclass_type):
                declared[f.name] = (hints.get(f.name), f.default)
        self._declared = declared
        return declared

    def source(self, key: str) -> str:
        """Where the value of `key` came from: its flag (which beats the recipe), else the recipe file."""
        flags = {f"--{key}", f"--{key.replace('_', '-')}"}
        if any(arg.split("=", 1)[0] in flags for arg in getattr(self, "cli_args", ())):
            return f"--{key}"
        if key in getattr(self, "recipe", {}):
            return f"{self.recipe_path}: {key}"
        if key in getattr(self, "budget_defaults", {}):
            return f"{self.budget_path}: {key}"
        return key

    def recipe_error(self, key: str, value: Any, problem: str):
        self.error(f"{self.recipe_path}: {key} {value!r}: {problem}")

    def error(self, message: str):
        # argparse's default prints the full usage first, which here is hundreds of flags long; and some
        # messages (transformers' own checks) span lines: the error is one line.
        one_line = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
        self.exit(2, f"{self.prog}: error: {one_line}\n")


TYPE_NAMES = {"int": ("an integer", "integers"), "float": ("a number", "numbers"), "str": ("a string", "strings"),
              "bool": ("a boolean (true or false)", "booleans (true or false)")}


def _kind(action: argparse.Action) -> str | None:
    """What a flag's values are: int, float, str, bool, choice, or None (a type not checked here)."""
    if action.choices:
        return "choice"
    if action.type in (int, float, str):
        return action.type.__name__
    # HfArgumentParser's `string_to_bool`, of which TRL's parser carries its own copy
    return "bool" if getattr(action.type, "__name__", "") == "string_to_bool" else None


def _type_name(action: argparse.Action) -> str:
    if action.choices:
        return "one of " + ", ".join(str(c) for c in action.choices)
    one, many = TYPE_NAMES.get(_kind(action), ("a value", "values"))
    return f"a list of {many}" if action.nargs in ("+", "*") else one


def _yaml_kind(value: Any) -> str:
    return {bool: "boolean", dict: "mapping", list: "list"}.get(type(value), type(value).__name__)


def _annotation_types(annotation: Any) -> set | None:
    """The plain types a field's annotation allows (`list[str] | None` -> {list, NoneType}); None: unknown."""
    if annotation is None or annotation is Any:
        return None
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        allowed: set = set()
        for arg in typing.get_args(annotation):
            inner = _annotation_types(arg)
            if inner is None:
                return None
            allowed |= inner
        return allowed
    return {origin or annotation}


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
                          "malformed call leave the loss (Composer's malformed-calls-dropped hack, for the ablation).",
                  "choices": ["penalize", "drop"]},
    )
    ask_user_handling: str = field(
        default="penalize",
        metadata={"help": "penalize: `failed_actions` counts ask_user calls like failed edits (the fix). free: "
                          "questions cost nothing (Composer's free-questions hack, for the ablation).",
                  "choices": ["penalize", "free"]},
    )
    truncated_episodes: str = field(
        default="mask",
        metadata={"help": "Episodes cut by a token limit: mask (no loss on them) or penalty (trained, with the "
                          "`truncated` reward, which must then be in reward_funcs).",
                  "choices": ["mask", "penalty"]},
    )
    # Episode budgets: env.budget.Budget's fields and defaults (max_tokens is max_episode_tokens here), set by the
    # preset's budget.yaml as eval's and the SFT check's are (`rollout_budget` in train_rl.py).
    max_turns: int = field(default=Budget.max_turns, metadata={"help": "Turn budget per episode."})
    max_new_tokens: int = field(default=Budget.max_new_tokens, metadata={"help": "Generated tokens per turn."})
    max_episode_tokens: int | None = field(
        default=Budget.max_tokens,
        metadata={"help": "Completion-token budget per episode (None: no cap; the `length` reward then normalises "
                          "by max_turns * max_new_tokens)."})
    max_context: int | None = field(
        default=Budget.max_context,
        metadata={"help": "Context window for episodes (None: the model's max_position_embeddings)."})
    max_wall_s: float = field(default=Budget.max_wall_s, metadata={"help": "Wall-clock budget per episode (seconds)."})
    max_malformed_turns: int = field(default=Budget.max_malformed_turns, metadata={
        "help": "Consecutive turns with malformed calls (and no valid one) that end an episode."})
    max_output_chars: int = field(default=Budget.max_output_chars,
                                  metadata={"help": "Per tool result (head and tail kept)."})
    command_timeout_s: float = field(default=Budget.command_timeout_s, metadata={"help": "Per sandboxed command."})
    rollout_workers: int = field(
        default=0, metadata={"help": "Episodes played at once in the trainer process (tools in threads, generation "
                                     "batched); 0: all of the step's episodes."})
    generation_backend: str = field(
        default="transformers",
        metadata={"help": "transformers (the trainer's live model, batched) or vllm (TRL's engine: set use_vllm and "
                          "vllm_mode too).", "choices": list(GENERATION_BACKENDS)},
    )
    dominance_threshold: float = field(
        default=0.8, metadata={"help": "Warn when one shaping reward (any after the first in reward_funcs) makes "
                                       "more than this share of the advantage."})
    log_trajectories_steps: int = field(
        default=10, metadata={"help": "Write (and log to W&B) a few full trajectories every N rollouts; 0: never."})
    log_trajectories_count: int = field(default=2, metadata={"help": "Trajectories per table."})

    def __post_init__(self):
        super().__post_init__()
        budget_from_arguments(self)  # checked by Budget (sampling: the trainer's, checked by the trainer's rules)
