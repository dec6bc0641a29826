"""The one budget object: what an episode may spend and how its turns are sampled.

Every stage that plays episodes (eval.py, the SFT harness check, RL rollouts, the SFT data builder, the
agent) embeds `Budget`, so each knob has exactly one default, here, and one validation, here:

    budget = Budget(max_turns=8, max_new_tokens=128)
    config = EpisodeConfig(**budget.episode())          # env.episode: the loop's budgets
    sampling = budget.sampling()                          # nanocomposer.policy.SamplingConfig(**...)

Episode budgets: max_turns, max_tokens (completion tokens per episode, known only for model policies;
None: no cap), max_wall_s (wall clock per episode: checked before each generation and capping every
sandboxed command), max_malformed_turns (consecutive turns with malformed calls and no valid one),
max_output_chars (per tool result, head and tail kept), command_timeout_s (per sandboxed command).
Sampling: max_new_tokens (per turn), temperature (0 = greedy), top_p, seed (first sampling seed; sample s
of a task uses seed + s), max_context (None: the model's position limit).

Bad values fail in `__post_init__` with one line naming the key, before any work is done.

A preset's budgets live in one file, `recipes/<preset>/budget.yaml` (a mapping of the keys above), that
every stage of the preset reads: the SFT data builder (`data.build_sft --budget`), the SFT check, RL and
eval (`nanocomposer.config.RecipeParser` loads the budget.yaml beside a stage's `--config`, or `--budget
FILE`). `load_budget_file` reads and checks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

EPISODE_KEYS = ("max_turns", "max_tokens", "max_wall_s", "max_malformed_turns", "max_output_chars",
                "command_timeout_s")
SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "seed", "max_context")
MIN_OUTPUT_CHARS = 200  # below this a tool result cannot even hold a short traceback; a typo, not a choice


class BudgetError(ValueError):
    """A budget value that cannot be used; the message names the key and the value. `key`, `value` and
    `problem` (None for a file-level error) let a caller name its own flag or argument instead."""

    def __init__(self, message: str, key: str | None = None, value=None, problem: str | None = None):
        super().__init__(message)
        self.key, self.value, self.problem = key, value, problem


def _check(where: str, key: str, value, ok: bool, must: str) -> None:
    if not ok:
        raise BudgetError(f"{where}: {key}={value!r}: {must}", key, value, must)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_episode_budget(obj, where: str) -> None:
    """Validate the episode-budget attributes of `obj` (a Budget or an env.episode.EpisodeConfig)."""
    v = {k: getattr(obj, k) for k in EPISODE_KEYS}
    _check(where, "max_turns", v["max_turns"], _is_int(v["max_turns"]) and v["max_turns"] >= 1, "must be an integer >= 1")
    _check(where, "max_tokens", v["max_tokens"], v["max_tokens"] is None or (_is_int(v["max_tokens"])
                                                                             and v["max_tokens"] >= 1),
           "must be an integer >= 1 or None (no cap)")
    _check(where, "max_wall_s", v["max_wall_s"], _is_number(v["max_wall_s"]) and v["max_wall_s"] > 0,
           "must be a number of seconds > 0")
    _check(where, "max_malformed_turns", v["max_malformed_turns"],
           _is_int(v["max_malformed_turns"]) and v["max_malformed_turns"] >= 1, "must be an integer >= 1")
    _check(where, "max_output_chars", v["max_output_chars"],
           _is_int(v["max_output_chars"]) and v["max_output_chars"] >= MIN_OUTPUT_CHARS,
           f"must be an integer >= {MIN_OUTPUT_CHARS}")
    _check(where, "command_timeout_s", v["command_timeout_s"],
           _is_number(v["command_timeout_s"]) and v["command_timeout_s"] > 0, "must be a number of seconds > 0")


def check_sampling(obj, where: str) -> None:
    """Validate the sampling attributes of `obj` (a Budget or a nanocomposer.engine.sampling.SamplingConfig)."""
    v = {k: getattr(obj, k) for k in SAMPLING_KEYS}
    _check(where, "max_new_tokens", v["max_new_tokens"], _is_int(v["max_new_tokens"]) and v["max_new_tokens"] >= 1,
           "must be an integer >= 1")
    _check(where, "temperature", v["temperature"], _is_number(v["temperature"]) and v["temperature"] >= 0,
           "must be >= 0 (0 = greedy)")
    _check(where, "top_p", v["top_p"], _is_number(v["top_p"]) and 0 < v["top_p"] <= 1, "must be in (0, 1]")
    _check(where, "seed", v["seed"], _is_int(v["seed"]) and v["seed"] >= 0, "must be an integer >= 0")
    _check(where, "max_context", v["max_context"], v["max_context"] is None or (
        _is_int(v["max_context"]) and v["max_context"] > v["max_new_tokens"]),
           f"must be None (the model's limit) or an integer > max_new_tokens={v['max_new_tokens']}")


@dataclass
class Budget:
    """Episode budgets and sampling settings; the single source of their defaults (module docstring)."""

    max_turns: int = 20
    max_tokens: int | None = None
    max_wall_s: float = 600.0
    max_malformed_turns: int = 3
    max_output_chars: int = 2000  # fits a small context; the same for SFT data, RL and eval
    command_timeout_s: float = 30.0
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_context: int | None = None

    def __post_init__(self):
        check_episode_budget(self, "budget")
        check_sampling(self, "budget")

    def episode(self) -> dict:
        """Keyword arguments of env.episode.EpisodeConfig."""
        return {k: getattr(self, k) for k in EPISODE_KEYS}

    def sampling(self) -> dict:
        """Keyword arguments of nanocomposer.policy.SamplingConfig."""
        return {k: getattr(self, k) for k in SAMPLING_KEYS}


BUDGET_FILE = "budget.yaml"  # the name of a preset's budget file, beside its stage recipes
# What a budget file sets: what an episode may spend. Not temperature/top_p/seed: RL samples, eval is greedy.
BUDGET_FILE_KEYS = (*EPISODE_KEYS, "max_new_tokens", "max_context")


def load_budget_file(path: str | Path) -> dict:
    """The budget settings of a preset's budget file (module docstring), checked: a YAML mapping of Budget's
    keys whose values Budget accepts; BudgetError naming the file and the key otherwise."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise BudgetError(f"budget file {path}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise BudgetError(f"budget file {path}: not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BudgetError(f"budget file {path}: must be a mapping of budget keys to values")
    unknown = [k for k in data if k not in BUDGET_FILE_KEYS]
    if unknown:
        why = (" (sampling settings belong to each stage's recipe: RL samples, eval is greedy)"
               if unknown[0] in SAMPLING_KEYS else "")
        raise BudgetError(f"budget file {path}: unknown key {unknown[0]!r}{why} (known: {', '.join(BUDGET_FILE_KEYS)})")
    try:
        Budget(**data)
    except BudgetError as e:
        raise BudgetError(f"budget file {path}: {e}", e.key, e.value, e.problem) from None
    return dict(data)
