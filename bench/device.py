"""The GPU device check's results: write device_check.json from a finished check, print its README rows.

    python -m bench.device runs/device-check/device_check.json           # the README table rows (markdown)
    python -m bench.device OUT.json --collect --mode gpu --runs WORK/runs --run device-check \\
        --base WORK/base --steps WORK/steps.tsv --junit OUT/gpu_tests.xml --started EPOCH_S
                                                                        # what runs/device_check.sh calls

Where each number comes from (nothing here re-measures; it reads what the stages wrote):
- CPT tokens/s: the CPT stage's own `train_tokens_per_second` (model card in <run>/cpt/README.md): every
  block token of every step over the whole `trainer.train()` wall time, first-step warm-up included.
- MFU: tokens/s x FLOPs per token / peak, with the peak taken as 790 TFLOP/s (dense bf16 of one H200, as
  measured on the lent machine: an 8192^3 bf16 matmul ran at ~790). FLOPs per token: `6 N` (N = distinct
  parameters, the tied embedding counted once, so the LM head's matmul is in and the embedding lookup is
  not); attention's score and value matmuls are NOT in `mfu`. `mfu_with_attention` adds them for causal
  attention over the whole block, `6 L d T` (L layers, width d, block T); packed documents attend only
  within themselves, so that slightly overstates the work done. In a dry run the peak is not the machine's:
  the MFU figures are computed the same way but mean nothing.
- SFT tokens/s: the token count TRL logs (`num_tokens`: every packed input token, assistant or not) at the
  last step, from <run>/sft/checkpoint-*/trainer_state.json, over the stage's `train_seconds`.
- RL: seconds per GRPO step and episodes per step (the model card and the resolved config).
- Generation: eval's episodes over its wall time per policy (<run>/eval/compare.json; one process,
  transformers backend unless vLLM is installed, greedy), model loading included; completion tokens/s is
  the completion tokens of those episodes over the same wall time (tool calls and grading included).
- Solve rates: each checkpoint's held-out solve rate with its Wilson 95% interval (compare.json).
- Tests: the JUnit XML pytest wrote for `-m gpu tests/test_gpu.py`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import re
import struct
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

PEAK_BF16_TFLOPS = 790.0  # one H200, dense bf16 (module docstring)
STAGES = ("cpt", "sft", "rl")
POLICIES = ("base", *STAGES)
PACKAGES = ("torch", "transformers", "trl", "datasets", "peft", "accelerate", "tokenizers", "pyarrow")
SCHEMA = 1
ROW_RE = re.compile(r"^\| (?P<key>[^|]+?) \| (?P<value>.*) \|$")


# --------------------------------------------------------------------------- reading what the stages wrote


def card_value(text: str):
    """A model-card cell back to a number where it was one (`format_value` writes 1,234 and 0.1234)."""
    if text in ("None", ""):
        return None
    try:
        return int(text.replace(",", ""))
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def model_card(stage_dir: Path) -> dict[str, dict]:
    """{section: {key: value}} from a stage's README.md (nanocomposer.run_record.write_model_card); {} if absent."""
    card = stage_dir / "README.md"
    if not card.is_file():
        return {}
    sections: dict[str, dict] = {}
    current = None
    for line in card.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), {})
        elif current is not None and (m := ROW_RE.match(line)) and m["key"].strip() not in ("", "---"):
            current[m["key"].strip()] = card_value(m["value"].strip())
    return sections


def safetensors_parameters(weights: Path) -> int | None:
    """Elements of every tensor in a .safetensors file, from its JSON header (no tensor is read)."""
    if not weights.is_file():
        return None
    with weights.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")


def model_facts(model_dir: Path, stage_config: Path) -> dict:
    facts = {"parameters": None, "hidden": None, "layers": None, "vocab_size": None, "block_size": None}
    config_file = model_dir / "config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        facts.update(hidden=config.get("hidden_size"), layers=config.get("num_hidden_layers"),
                     vocab_size=config.get("vocab_size"))
    facts["parameters"] = safetensors_parameters(model_dir / "model.safetensors")
    if stage_config.is_file():
        facts["block_size"] = (yaml.safe_load(stage_config.read_text(encoding="utf-8")).get("script") or {}).get(
            "block_size")
    return facts


def resolved_training(stage_dir: Path) -> dict:
    config = stage_dir / "config.yaml"
    if not config.is_file():
        return {}
    return yaml.safe_load(config.read_text(encoding="utf-8")).get("training") or {}


def last_logged(stage_dir: Path, key: str) -> float | None:
    """The largest value of `key` in the newest checkpoint's trainer_state.json log history."""
    checkpoints = sorted(stage_dir.glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    if not checkpoints or not (checkpoints[-1] / "trainer_state.json").is_file():
        return None
    history = json.loads((checkpoints[-1] / "trainer_state.json").read_text(encoding="utf-8")).get("log_history", [])
    values = [entry[key] for entry in history if isinstance(entry.get(key), int | float)]
    return max(values) if values else None


def ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def cpt_metrics(run_dir: Path, model: dict) -> dict:
    result = model_card(run_dir / "cpt").get("Result", {})
    tokens_per_s = result.get("train_tokens_per_second")
    n, layers, hidden, block = model["parameters"], model["layers"], model["hidden"], model["block_size"]
    flops_6n = 6 * n if n else None
    flops_attention = 6 * layers * hidden * block if layers and hidden and block else None
    peak = PEAK_BF16_TFLOPS * 1e12
    return {
        "steps": result.get("global_step"),
        "train_s": result.get("train_seconds"),
        "tokens_per_s": tokens_per_s,
        "final_eval_loss": result.get("final_eval_loss"),
        "flops_per_token_6n": flops_6n,
        "attention_flops_per_token": flops_attention,
        "peak_bf16_tflops": PEAK_BF16_TFLOPS,
        "mfu": ratio(tokens_per_s * flops_6n, peak) if tokens_per_s and flops_6n else None,
        "attention_flops_counted_in_mfu": False,
        "mfu_with_attention": (ratio(tokens_per_s * (flops_6n + flops_attention), peak)
                               if tokens_per_s and flops_6n and flops_attention else None),
    }


def sft_metrics(run_dir: Path) -> dict:
    result = model_card(run_dir / "sft").get("Result", {})
    tokens = last_logged(run_dir / "sft", "num_tokens")
    return {"steps": result.get("global_step"), "train_s": result.get("train_seconds"), "tokens": tokens,
            "tokens_per_s": ratio(tokens, result.get("train_seconds")), "train_loss": result.get("train_loss")}


def rl_metrics(run_dir: Path) -> dict:
    card = model_card(run_dir / "rl")
    result, last = card.get("Result", {}), card.get("Last steps", {})
    # a step plays the generation batch (per-device batch x accumulation steps); the per-device batch alone is
    # one micro-batch of it
    episodes = resolved_training(run_dir / "rl").get("generation_batch_size")
    return {"steps": result.get("global_step"), "train_s": result.get("train_seconds"),
            "seconds_per_step": result.get("seconds_per_step"), "episodes_per_step": episodes,
            "episodes_per_s": ratio(episodes, result.get("seconds_per_step")),
            "reward": last.get("reward"), "solve_rate": last.get("behaviour/solve_rate")}


def policy_stage(label: str) -> str:
    """compare.json labels a checkpoint by its path's last two parts: `<run>/sft` -> sft; the base -> base."""
    last = label.rsplit("/", 1)[-1]
    return last if last in STAGES else "base"


def eval_metrics(run_dir: Path) -> tuple[dict, dict]:
    """(generation speed, held-out solve rates per policy) from the eval stage's compare.json."""
    compare = run_dir / "eval" / "compare.json"
    generation = {"backend": None, "episodes": None, "wall_s": None, "episodes_per_s": None,
                  "completion_tokens_per_s": None, "per_policy": {}}
    solve = {name: None for name in POLICIES}
    if not compare.is_file():
        return generation, solve
    data = json.loads(compare.read_text(encoding="utf-8"))
    generation["backend"] = (data.get("config") or {}).get("backend")
    episodes = wall = tokens = 0.0
    for label, policy in data["policies"].items():
        m = policy["metrics"]["all"]
        stage = policy_stage(label)
        solve[stage] = {"label": label, "n": m["n"], "solved": m["solved"], "solve_rate": m["solve_rate"],
                        "ci95": m["solve_rate_ci95"], "tool_call_validity": m.get("tool_call_validity"),
                        "mean_turns": m.get("mean_turns")}
        generation["per_policy"][stage] = {"episodes": m["n"], "wall_s": m["wall_s"],
                                           "episodes_per_s": ratio(m["n"], m["wall_s"]),
                                           "mean_completion_tokens": m.get("mean_completion_tokens")}
        episodes += m["n"]
        wall += m["wall_s"] or 0.0
        tokens += m["n"] * (m.get("mean_completion_tokens") or 0.0)
    generation.update(episodes=int(episodes), wall_s=round(wall, 2), episodes_per_s=ratio(episodes, wall),
                      completion_tokens_per_s=ratio(tokens, wall))
    return generation, solve


def test_results(junit: Path) -> dict:
    results = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": [], "skip_reasons": []}
    if not junit.is_file():
        return results
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "?")
        if case.find("failure") is not None:
            results["failed"] += 1
            results["failures"].append(name)
        elif case.find("error") is not None:
            results["errors"] += 1
            results["failures"].append(name)
        elif (skipped := case.find("skipped")) is not None:
            results["skipped"] += 1
            results["skip_reasons"].append(f"{name}: {skipped.get('message', '')}")
        else:
            results["passed"] += 1
    return results


def step_results(steps: Path) -> dict:
    """{step: {"rc": int | "skipped", "wall_s": float}} from runs/device_check.sh's steps.tsv."""
    results = {}
    if steps.is_file():
        for line in steps.read_text(encoding="utf-8").splitlines():
            name, rc, wall = line.split("\t")
            results[name] = {"rc": int(rc) if rc.lstrip("-").isdigit() else rc, "wall_s": float(wall)}
    return results


def machine_facts(mode: str) -> dict:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    import torch

    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()})",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
        "cuda": torch.version.cuda if cuda else None,
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "packages": {name: version(name) for name in PACKAGES},
        "mode": mode,
    }


def git_commit() -> str:
    """$NANOCOMPOSER_COMMIT when set (the lent machine gets a copy of the working tree, maybe without .git)."""
    if os.environ.get("NANOCOMPOSER_COMMIT"):
        return os.environ["NANOCOMPOSER_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def collect(mode: str, runs: Path, run: str, base: Path, steps: Path, junit: Path, started: float) -> dict:
    run_dir = runs / run
    model_dir = run_dir / "cpt" if (run_dir / "cpt" / "config.json").is_file() else base
    model = model_facts(model_dir, run_dir / "cpt" / "config.yaml")
    generation, solve_rates = eval_metrics(run_dir)
    step = step_results(steps)
    tests = test_results(junit)
    return {
        "schema": SCHEMA,
        "mode": mode,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": git_commit(),
        "machine": machine_facts(mode),
        "wall_s": round(time.time() - started, 1),
        "ok": bool(step) and all(s["rc"] == 0 for s in step.values()) and tests["failed"] + tests["errors"] == 0,
        "steps": step,
        "tests": tests,
        "model": model,
        "cpt": cpt_metrics(run_dir, model),
        "sft": sft_metrics(run_dir),
        "rl": rl_metrics(run_dir),
        "generation": generation,
        "solve_rates": solve_rates,
    }


# --------------------------------------------------------------------------- the README rows

HEADER = ("| date | machine | commit | model | CPT tokens/s (MFU: 6N / with attention) | SFT tokens/s | "
          "eval episodes/s (completion tokens/s) | held-out solve rate: base / CPT / SFT / RL | GPU tests | check |")


def _num(x, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def table_rows(report: dict) -> list[str]:
    """The header, its rule and this check's row."""
    m, cpt, gen, tests = report["machine"], report["cpt"], report["generation"], report["tests"]
    machine = f"{m['device']}{' (dry run)' if report['mode'] != 'gpu' else ''}, torch {m['packages'].get('torch')}"
    model = report["model"]
    size = (f"{model['parameters'] / 1e6:.1f} M params, block {model['block_size']}"
            if model.get("parameters") else "-")
    mfu = f"{_pct(cpt['mfu'])} / {_pct(cpt['mfu_with_attention'])}"
    solve = report["solve_rates"]
    n = next((s["n"] for s in solve.values() if s), None)
    rates = " / ".join(_pct(s["solve_rate"]) if s else "-" for s in (solve[p] for p in POLICIES))
    failed = tests["failed"] + tests["errors"]
    test_cell = f"{tests['passed']} passed, {failed} failed, {tests['skipped']} skipped"
    row = (f"| {report['date'][:10]} | {machine} | `{report['git_commit']}` | {size} | "
           f"{_num(cpt['tokens_per_s'])} ({mfu}) | {_num(report['sft']['tokens_per_s'])} | "
           f"{_num(gen['episodes_per_s'], '.2f')} ({_num(gen['completion_tokens_per_s'])}) | "
           f"{rates} (n = {_num(n)}) | {test_cell} | {'ok' if report['ok'] else 'FAILED: see steps'} |")
    return [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|", row]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.device", description=__doc__.split("\n")[0])
    parser.add_argument("path", type=Path, help="device_check.json (read; written first with --collect)")
    parser.add_argument("--collect", action="store_true", help="write PATH from a finished check's outputs")
    parser.add_argument("--mode", choices=("gpu", "dry-run"), default="gpu")
    parser.add_argument("--runs", type=Path, help="the check's runs directory (<runs>/<run>/{cpt,sft,rl,eval})")
    parser.add_argument("--run", default="device-check")
    parser.add_argument("--base", type=Path, help="the random-init base model directory")
    parser.add_argument("--steps", type=Path, help="steps.tsv: step, exit status, wall seconds")
    parser.add_argument("--junit", type=Path, help="pytest's JUnit XML of the gpu tests")
    parser.add_argument("--started", type=float, default=None, help="epoch seconds when the check started")
    args = parser.parse_args(argv)

    if args.collect:
        missing = [f"--{name}" for name in ("runs", "base", "steps", "junit") if getattr(args, name) is None]
        if missing:
            parser.error(f"--collect needs {', '.join(missing)}")
        report = collect(args.mode, args.runs, args.run, args.base, args.steps, args.junit,
                         args.started if args.started is not None else time.time())
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    elif not args.path.is_file():
        print(f"python -m bench.device: error: {args.path}: no such file (runs/device_check.sh writes it)",
              file=sys.stderr)
        return 2
    try:
        report = json.loads(args.path.read_text(encoding="utf-8"))
        rows = table_rows(report)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        print(f"python -m bench.device: error: {args.path}: not a device_check.json ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
