"""runs/device_check.sh --dry-run (the GPU check's steps on the CPU at toy size) and bench/device.py.

The dry run builds a 3-project task factory, a micro model, trains each stage for a step or two, evaluates
on 2 held-out tasks, and writes device_check.json; every field the GPU run reports must be there and hold a
number. bench/device.py's parsing is checked against what the stages' own writers produce.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.device import PEAK_BF16_TFLOPS, cpt_metrics, model_card, rl_metrics, table_rows
from nanocomposer.run_record import write_model_card

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

ROOT = Path(__file__).resolve().parents[1]
STAGE_STEPS = ("gpu_tests", "data", "cpt", "sft", "rl", "eval")  # + wheels and imports on the GPU machine
POLICIES = ("base", "cpt", "sft", "rl")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("device-check")
    env = {**os.environ, "OUT": str(root / "out"), "WORK": str(root / "work"), "PY": sys.executable}
    env.pop("NANOCOMPOSER_TEST_DEVICE", None)
    proc = subprocess.run(["bash", "runs/device_check.sh", "--dry-run"], check=False, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1200)
    return root / "out", proc


@pytest.mark.slow
def test_dry_run_writes_every_field(dry_run):
    out, proc = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((out / "device_check.json").read_text())
    assert report["mode"] == "dry-run" and report["ok"] is True
    assert report["date"] and report["git_commit"] and report["wall_s"] > 0
    machine = report["machine"]
    assert machine["device"] and machine["python"] and machine["packages"]["torch"] and machine["cpu_cores"]
    for step in STAGE_STEPS:
        assert report["steps"][step]["rc"] == 0, (step, report["steps"])
        assert report["steps"][step]["wall_s"] > 0
    tests = report["tests"]
    assert tests["passed"] >= 5 and tests["failed"] == tests["errors"] == 0, tests  # run on the CPU, not skipped
    model = report["model"]
    assert model["parameters"] > 0 and model["layers"] == 2 and model["hidden"] == 64 and model["block_size"] == 128
    cpt = report["cpt"]
    assert cpt["steps"] == 2 and cpt["tokens_per_s"] > 0 and cpt["final_eval_loss"] > 0
    assert cpt["attention_flops_counted_in_mfu"] is False and cpt["peak_bf16_tflops"] == PEAK_BF16_TFLOPS
    assert 0 < cpt["mfu"] < cpt["mfu_with_attention"] < 1
    sft = report["sft"]
    assert sft["steps"] == 2 and sft["tokens"] > 0 and sft["tokens_per_s"] > 0
    rl = report["rl"]
    assert rl["steps"] == 1 and rl["seconds_per_step"] > 0 and rl["episodes_per_step"] == 2 and rl["episodes_per_s"] > 0
    generation = report["generation"]
    assert generation["episodes"] == 4 * 2 and generation["episodes_per_s"] > 0
    assert generation["completion_tokens_per_s"] > 0 and set(generation["per_policy"]) == set(POLICIES)
    for policy in POLICIES:
        rates = report["solve_rates"][policy]
        assert rates["n"] == 2 and 0 <= rates["solve_rate"] <= 1 and len(rates["ci95"]) == 2, (policy, rates)


@pytest.mark.slow
def test_dry_run_returns_few_flat_files_and_prints_the_readme_rows(dry_run):
    out, proc = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:]
    entries = list(out.iterdir())
    assert len(entries) <= 8 and all(p.is_file() for p in entries), entries  # the device tool's limits
    assert {"device_check.json", "log.txt", "compare.md", "gpu_tests.xml"} <= {p.name for p in entries}
    log = (out / "log.txt").read_text()
    assert "== cpt" in log and "== eval" in log and "passed" in log
    printed = subprocess.run([sys.executable, "-m", "bench.device", str(out / "device_check.json")],
                             check=False, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    header, rule, row = printed.stdout.strip().splitlines()
    assert header.count("|") == rule.count("|") == row.count("|")
    assert "(dry run)" in row and " 0 failed" in row


def test_model_card_numbers_read_back(tmp_path):
    """What nanocomposer.run_record.write_model_card writes (1,234 and 4-significant-digit floats) parses back."""
    write_model_card(tmp_path, "t", "intro", {"Result": {"global_step": 1234, "train_tokens_per_second": 123456.7,
                                                         "train_loss": 0.123456, "initial_eval_loss": None},
                                              "Last steps": {"behaviour/solve_rate": 0.25}})
    card = model_card(tmp_path)
    assert card["Result"] == {"global_step": 1234, "train_tokens_per_second": 1.235e5, "train_loss": 0.1235,
                              "initial_eval_loss": None}
    assert card["Last steps"] == {"behaviour/solve_rate": 0.25}
    assert model_card(tmp_path / "missing") == {}


def test_rl_episodes_per_step_count_the_generation_batch_not_one_micro_batch(tmp_path):
    """A step of 1 task x 4 episodes scored in micro-batches of 1 plays 4 episodes, not 1."""
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "config.yaml").write_text(
        "training:\n  per_device_train_batch_size: 1\n  gradient_accumulation_steps: 4\n  generation_batch_size: 4\n")
    assert rl_metrics(tmp_path)["episodes_per_step"] == 4


def test_mfu_counts_six_n_and_reports_attention_separately(tmp_path):
    stage = tmp_path / "run" / "cpt"
    stage.mkdir(parents=True)
    write_model_card(stage, "cpt", "", {"Result": {"global_step": 300, "train_tokens_per_second": 200_000.0,
                                                   "train_seconds": 50.0, "final_eval_loss": 3.5}})
    model = {"parameters": 91_245_312, "layers": 12, "hidden": 768, "block_size": 1024}
    cpt = cpt_metrics(tmp_path / "run", model)
    assert cpt["mfu"] == pytest.approx(200_000 * 6 * 91_245_312 / 790e12)
    assert cpt["mfu_with_attention"] == pytest.approx(200_000 * (6 * 91_245_312 + 6 * 12 * 768 * 1024) / 790e12)
    assert cpt["attention_flops_counted_in_mfu"] is False


def test_table_rows_name_a_missing_stage_with_a_dash():
    report = {"mode": "gpu", "date": "2026-12-01T10:00:00Z", "git_commit": "abc1234", "ok": False,
              "machine": {"device": "NVIDIA H200", "packages": {"torch": "2.11.0"}},
              "model": {"parameters": 91_245_312, "block_size": 1024},
              "cpt": {"tokens_per_s": 250_000.0, "mfu": 0.173, "mfu_with_attention": 0.2},
              "sft": {"tokens_per_s": None}, "generation": {"episodes_per_s": None, "completion_tokens_per_s": None},
              "solve_rates": {"base": None, "cpt": None, "sft": None, "rl": None},
              "tests": {"passed": 6, "failed": 0, "errors": 0, "skipped": 0}}
    header, rule, row = table_rows(report)
    assert "NVIDIA H200, torch 2.11.0" in row and "91.2 M params, block 1024" in row
    assert "250,000 (17.3% / 20.0%)" in row and "- / - / - / -" in row and "FAILED" in row
    assert header.count("|") == rule.count("|") == row.count("|")


def test_step_limits_fit_the_budget_and_eval_batches_each_policy():
    """On the lent machine the steps' limits add up to at most the budget less the reserve (the GPU tests run
    beside the data step, so they count once, as the longer of the two); every episode of a policy's eval goes
    to the model in one batch; a weak model's SFT check is reported, not a failed step; the dry run plays it."""
    import re

    script = (ROOT / "runs" / "device_check.sh").read_text()
    limits = dict(re.findall(r"\[(\w+)\]=(\d+)", re.search(r"declare -A LIMIT=\((.*)\)", script).group(1)))
    limits = {k: int(v) for k, v in limits.items()}
    budget = int(re.search(r"BUDGET_S=\$\{BUDGET_S:-(\d+)\}; else", script).group(1))
    reserve = int(re.search(r"RESERVE_S=(\d+)", script).group(1))
    serial = sum(v for k, v in limits.items() if k not in ("data", "gpu_tests")) + max(limits["data"],
                                                                                       limits["gpu_tests"])
    assert serial <= budget - reserve, (serial, budget, reserve)
    gpu_mode = script.split("else  # toy sizes")[0]
    eval_limit = int(re.search(r"EVAL_LIMIT=\$\{EVAL_LIMIT:-(\d+)\}", gpu_mode).group(1))
    scratch = (ROOT / "runs" / "gpu_scratch.sh").read_text()
    eval_workers = int(re.search(r"--workers \"\$\{EVAL_WORKERS:-(\d+)\}\"", scratch).group(1))
    assert eval_workers >= 2 * eval_limit  # factory:test + factory:val, EVAL_LIMIT tasks each
    assert "--check_must_pass false" in gpu_mode and "--check_must_pass false" in script.split("else  # toy sizes")[1]
    assert 'SFT_CHECK_TASKS=""' not in script


def test_unknown_argument_is_a_clear_error():
    proc = subprocess.run(["bash", "runs/device_check.sh", "--bogus"], check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "usage" in proc.stderr
