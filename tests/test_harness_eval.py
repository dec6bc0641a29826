"""The harness eval during SFT (nanocomposer/harness_eval.py): task choice over families, the numbers are the
runner's (env.runner.run_tasks + env.metrics), the live model plays in eval mode without gradients and is left
in train mode, train_sft.py logs and returns the numbers, and bad settings fail before training."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments
from transformers.integrations.integration_utils import rewrite_logs

import train_sft
from data.families import ladder_copy
from env.budget import Budget
from env.episode import EpisodeConfig
from env.metrics import summarize, wilson_interval
from env.policies import GoldPolicy
from env.protocol import CLOSE, OPEN, format_assistant_turn
from env.runner import TaskRef, run_tasks
from env.tasks import Task, load_task_set
from nanocomposer.config import ConfigError
from nanocomposer.harness_eval import (
    HarnessEvalCallback,
    harness_metrics,
    load_eval_tasks,
    spread_over_families,
)
from tests.conftest import make_calc_task
from tests.test_train_sft import micro, sft_args  # noqa: F401  (micro: the module-scoped micro model fixture)

BUDGET = Budget(max_turns=3, max_new_tokens=24)


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory) -> Path:
    """Two ladder_copy tasks (held-out split) and one calc task (family fix_bug)."""
    root = tmp_path_factory.mktemp("harness_tasks")
    for spec in ladder_copy.generate("val", 0, 2):
        spec.write(root / spec.id)
    make_calc_task(root, "calc-add")
    return root


class LadderOnlyPolicy:
    """Solves answer-graded (ladder) tasks with the gold answer; elsewhere writes one malformed call, then
    submits without a fix: per-family solve rates 1 and 0, and some malformed calls."""

    name = "ladder-only"

    def reset(self, task: Task) -> None:
        self.gold = GoldPolicy() if task.gold_answer is not None else None
        if self.gold is not None:
            self.gold.reset(task)
        self.turns = [f"{OPEN}{{not json{CLOSE}", format_assistant_turn(None, [("submit", {"summary": "done"})])]

    def act(self, messages, tools) -> str:
        return self.gold.act(messages, tools) if self.gold is not None else self.turns.pop(0)


def micro_trainer(micro_dir: Path, out: Path) -> Trainer:
    model = AutoModelForCausalLM.from_pretrained(micro_dir / "base")
    tokenizer = AutoTokenizer.from_pretrained(micro_dir / "base")
    args = TrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, eval_strategy="steps",
                             eval_steps=1, disable_tqdm=True)
    # an eval dataset only because eval_strategy needs one: the callback's schedule follows evaluations
    return Trainer(model=model, args=args, processing_class=tokenizer, eval_dataset=[{"input_ids": [1, 2]}])


def family_task(family: str, i: int) -> Task:
    return Task(f"{family}-{i}", "x", "true", Path("/nonexistent"), meta={"family": family})


def test_spread_over_families_is_even_and_spaced():
    tasks = [family_task("a", i) for i in range(10)] + [family_task("b", i) for i in range(2)] + \
        [family_task("c", i) for i in range(5)]
    chosen = spread_over_families(tasks, 9)
    counts = {f: sum(t.meta["family"] == f for t in chosen) for f in "abc"}
    assert counts == {"a": 4, "b": 2, "c": 3}  # b has only 2: its third share goes to the others
    assert [t.id for t in chosen if t.meta["family"] == "a"] == ["a-0", "a-2", "a-5", "a-7"]  # spread, not the start
    assert [t.id for t in chosen] == [t.id for t in tasks if t in chosen]  # the set's order
    assert spread_over_families(tasks, None) == tasks and spread_over_families(tasks, 99) == tasks


def test_numbers_are_the_runners(micro, tasks_dir, tmp_path):  # noqa: F811
    trainer = micro_trainer(micro, tmp_path / "out")
    tasks = list(load_task_set(tasks_dir))
    callback = HarnessEvalCallback(trainer, tasks, BUDGET, workers=2, make_policy=LadderOnlyPolicy,
                                   records_dir=tmp_path / "records")
    callback.on_evaluate(trainer.args, trainer.state, trainer.control)
    logged = trainer.state.log_history[-1]
    refs = [TaskRef(t, {"family": t.meta["family"]}) for t in tasks]
    records = run_tasks(refs, LadderOnlyPolicy, EpisodeConfig.from_budget(BUDGET), progress=False)
    summary = summarize(records)
    assert summary["solved"] == 2 and summary["n"] == 3
    # by hand: 2 ladder episodes of one valid submit; the calc one: a malformed turn, then a valid submit
    expected = {"solve_rate": 2 / 3, "tool_call_validity": 3 / 4, "malformed_rate": 1 / 4, "mean_turns": 4 / 3,
                "solve_rate/ladder_copy": 1.0, "solve_rate/fix_bug": 0.0, "tasks": 3}
    for key, value in expected.items():
        assert logged[f"eval_harness_{key}"] == pytest.approx(value), key
        assert callback.final[f"harness_{key}"] == pytest.approx(value), key
    shown = rewrite_logs(logged)  # what transformers' W&B callback sends
    assert shown["eval/harness_solve_rate"] == logged["eval_harness_solve_rate"]
    assert "eval/harness_solve_rate/ladder_copy" in shown and "eval/harness_tool_call_validity" in shown
    assert (logged["eval_harness_solve_rate_ci95_low"], logged["eval_harness_solve_rate_ci95_high"]) == \
        pytest.approx(wilson_interval(2, 3), abs=1e-4)
    ours = {k: v for k, v in harness_metrics(records, 0.0).items() if not k.endswith("wall_s")}
    assert ours == {k: v for k, v in callback.final.items() if not k.endswith("wall_s")}
    assert logged["step"] == 0 and len((tmp_path / "records" / "step-0.jsonl").read_text().splitlines()) == 3
    callback.on_evaluate(trainer.args, trainer.state, trainer.control)  # the same step again: not played twice
    assert len(callback.history) == 1 and sum("eval_harness_solve_rate" in h for h in trainer.state.log_history) == 1


def test_live_model_plays_in_eval_mode_without_grad_and_is_left_training(micro, tasks_dir, tmp_path):  # noqa: F811
    torch.set_num_threads(1)
    trainer = micro_trainer(micro, tmp_path / "out")
    trainer.model.train()
    seen = []
    trainer.model.register_forward_pre_hook(lambda module, args: seen.append((module.training,
                                                                             torch.is_grad_enabled())))
    callback = HarnessEvalCallback(trainer, list(load_task_set(tasks_dir)), BUDGET, every_steps=2, workers=3)
    trainer.state.global_step = 1
    callback.on_step_end(trainer.args, trainer.state, trainer.control)  # not a multiple of 2: nothing
    assert not seen and not callback.history
    trainer.state.global_step = 2
    callback.on_step_end(trainer.args, trainer.state, trainer.control)
    assert seen and set(seen) == {(False, False)}  # every forward: eval mode, no grad
    assert trainer.model.training  # restored
    logged = trainer.state.log_history[-1]
    keys = ["solve_rate", "solve_rate_ci95_low", "solve_rate_ci95_high", "tool_call_validity", "malformed_rate",
            "solve_rate/ladder_copy", "solve_rate/fix_bug"]
    for key in keys:
        assert 0.0 <= logged[f"eval_harness_{key}"] <= 1.0, key
    assert logged["step"] == 2 and logged["eval_harness_tasks"] == 3


def test_sft_logs_harness_eval_and_returns_the_final_numbers(micro, tasks_dir, tmp_path):  # noqa: F811
    metrics = train_sft.main(*sft_args(micro, tmp_path, "--max_steps", "2", "--harness_eval_tasks", str(tasks_dir),
                                       "--harness_eval_limit", "2", "--harness_eval_on_start", "true",
                                       "--check_max_turns", "2", "--check_max_new_tokens", "16"))
    records = tmp_path / "t" / "sft" / "harness_eval"
    # step 0 (on_start and the recipe's eval_on_start: played once), then the final step
    assert sorted(p.name for p in records.glob("*.jsonl")) == ["step-0.jsonl", "step-2.jsonl"]
    played = [json.loads(line) for line in (records / "step-2.jsonl").read_text().splitlines()]
    assert {r["family"] for r in played} == {"ladder_copy", "fix_bug"}  # limit 2: one of each family
    assert metrics["harness_tasks"] == 2
    assert metrics["harness_solve_rate"] == summarize(played)["solve_rate"]
    for key in ("harness_solve_rate", "harness_tool_call_validity", "harness_malformed_rate",
                "harness_solve_rate/ladder_copy", "harness_solve_rate/fix_bug"):
        assert 0.0 <= metrics[key] <= 1.0, key


@pytest.mark.parametrize(("extra", "message"), [
    (["--harness_eval_tasks", "/nonexistent/tasks"], "harness_eval_tasks '/nonexistent/tasks': unknown task set"),
    (["--harness_eval_tasks", "factory:nosuchsplit"], "harness_eval_tasks 'factory:nosuchsplit'"),
    (["--harness_eval_tasks", "TASKS", "--eval_strategy", "no"], "nothing schedules it"),
    (["--harness_eval_tasks", "OVERLAP"], "are in the training data"),
])
def test_bad_harness_eval_settings_fail_before_training(micro, tasks_dir, tmp_path, extra, message):  # noqa: F811
    overlap = tmp_path / "overlap"
    make_calc_task(overlap, "task-0")  # the micro SFT data trains on task-0..task-5
    extra = [{"TASKS": str(tasks_dir), "OVERLAP": str(overlap)}.get(x, x) for x in extra]
    with pytest.raises(ConfigError, match=message):
        train_sft.main(*sft_args(micro, tmp_path, *extra))
    assert not (tmp_path / "t" / "sft").exists()  # nothing trained, nothing written


@pytest.mark.parametrize(("extra", "message"), [
    (["--harness_eval_limit", "0"], "harness_eval_limit 0: must be an integer >= 1"),
    (["--harness_eval_steps", "5"], "harness_eval_steps 5: schedules a harness eval, but harness_eval_tasks"),
    (["--harness_eval_tasks", "x", "--harness_eval_workers", "0"], "harness_eval_workers 0"),
])
def test_bad_harness_eval_flags_are_named(micro, tmp_path, capsys, extra, message):  # noqa: F811
    with pytest.raises(SystemExit):
        sft_args(micro, tmp_path, *extra)
    assert message in capsys.readouterr().err


def test_a_task_set_name_resolves_and_is_spread():
    """A task-set name (env/task_sets.py) works like a directory; the limit takes one task per family first."""
    tasks = load_eval_tasks("samples", 3)
    assert len(tasks) == 3 and len({t.meta.get("family") for t in tasks}) == 3
