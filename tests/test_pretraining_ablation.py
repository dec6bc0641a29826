"""The control flow of runs/pretraining_ablation.sh, runs/tiny_long.sh (with runs/edge_screen.sh), runs/smol.sh
and runs/tiny.sh, with a fake interpreter that records each command and writes the outputs a real stage would (no model is trained):
which stages run, which are skipped once saved, that an arm without edge tasks gets no RL while the others go
on, that a screen that fails for another reason stops the script, and the stage times a preset writes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Writes what each command would: a stage's model, eval results, a selected task set (for runs named in
# $NO_EDGE, exit 3 as data.select_edge_tasks does when no task is at the edge; in $BROKEN, exit 2 as for bad input).
FAKE_PY = r"""#!/usr/bin/env bash
echo "$*" >> "$LOG"
arg() { local want=$1; shift; while [ $# -gt 0 ]; do [ "$1" = "$want" ] && { echo "$2"; return; }; shift; done; }
case "$1" in
  train_cpt.py|train_sft.py|train_rl.py)
    stage=${1#train_}; stage=${stage%.py}
    mkdir -p "runs/$(arg --run "$@")/$stage"; touch "runs/$(arg --run "$@")/$stage/model.safetensors" ;;
  eval.py)
    if [ -n "$(arg --out-dir "$@")" ]; then mkdir -p "$(arg --out-dir "$@")"; echo table > "$(arg --out-dir "$@")/compare.md"
    else out=$(arg --output "$@"); echo '{}' > "$out"; : > "${out%.json}.episodes.jsonl"; fi ;;
  -m)
    out=$(arg --out "$@")
    run=$(basename "$(dirname "$(dirname "$out")")")
    case " $NO_EDGE " in *" $run "*) echo "no task at the edge" >&2; exit 3 ;; esac
    case " ${BROKEN:-} " in *" $run "*) echo "error: bad results" >&2; exit 2 ;; esac
    mkdir -p "$out"; echo '{}' > "$out/manifest.json" ;;
esac
"""


def run_ablation(root: Path, status: int = 0, script: str = "runs/pretraining_ablation.sh",
                 **env: str) -> tuple[str, list[str]]:
    log = root / "log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PY": str(root / "fake_py"), "LOG": str(log), **env}
    done = subprocess.run(["bash", script], check=False, cwd=root, capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == status, done.stderr
    return done.stdout, log.read_text().splitlines() if log.exists() else []


def fake_checkout(root: Path) -> None:
    (root / "runs").mkdir()
    for script in ("pretraining_ablation.sh", "edge_screen.sh", "tiny_long.sh", "stages.sh", "rl_arm.sh", "smol.sh",
                   "tiny.sh", "data.sh"):
        shutil.copy(ROOT / "runs" / script, root / "runs")
    (root / "fake_py").write_text(FAKE_PY)
    (root / "fake_py").chmod(0o755)


def test_rl_follows_each_arm_with_edge_tasks_and_reruns_skip_what_is_saved(tmp_path):
    fake_checkout(tmp_path)
    # the three-arm SFT comparison already holds the copy arm's SFT episodes, which the RL comparison reuses
    (tmp_path / "runs/ab/pretraining/ab-copy__sft").mkdir(parents=True)
    (tmp_path / "runs/ab/pretraining/ab-copy__sft/results.episodes.jsonl").write_text("sft\n")

    out, calls = run_ablation(tmp_path, RUN="ab", RL="1", NO_EDGE="ab-none", EDGE_TASKS="7")
    stages = [c.split()[0] if not c.startswith("-m") else c.split()[1] for c in calls]
    assert stages.count("train_cpt.py") == 2 and stages.count("train_sft.py") == 3  # none has no CPT
    rl = [c for c in calls if c.startswith("train_rl.py")]
    assert len(rl) == 2 and not any("ab-none" in c for c in rl)
    assert "no train task at the edge of runs/ab-none/sft" in out
    screens = [c for c in calls if c.startswith("eval.py") and "--policy runs/ab-copy/sft" in c]
    assert len(screens) == 2 and all("--limit 7" in c for c in screens)
    assert "--samples 4 --temperature 1" in screens[1]
    select = next(c for c in calls if "data.select_edge_tasks" in c and "ab-copy" in c)
    assert "--unsolved-by runs/ab-copy/edge/greedy.json" in select
    compares = [c for c in calls if "--compare" in c]
    assert len(compares) == 3  # the three SFT models, then SFT vs RL for code and copy (none has no RL)
    assert "runs/ab-none/sft runs/ab-code/sft runs/ab-copy/sft" in compares[0]
    assert "--compare runs/ab-copy/sft runs/ab-copy/rl" in compares[2]
    assert (tmp_path / "runs/ab-copy/eval-rl/ab-copy__sft/results.episodes.jsonl").read_text() == "sft\n"

    _, again = run_ablation(tmp_path, RUN="ab", RL="1", NO_EDGE="ab-none", EDGE_TASKS="7")
    assert not [c for c in again if c.startswith("train_")]  # every model is saved
    # none's screen is played again (its episodes resume), the arms with RL are not screened again
    assert not [c for c in again if "--policy runs/ab-copy/sft" in c or "--policy runs/ab-code/sft" in c]

    _, without_rl = run_ablation(tmp_path, RUN="ab")
    assert [c for c in without_rl if "--compare" in c] == [compares[0]]


def test_a_screen_that_fails_for_another_reason_stops_the_script(tmp_path):
    fake_checkout(tmp_path)
    out, calls = run_ablation(tmp_path, status=2, RUN="ab", RL="1", ARMS="none copy", BROKEN="ab-none")
    assert "no RL for this arm" not in out
    assert not [c for c in calls if c.startswith("train_rl.py") or "--compare" in c]  # copy never ran


def stage_times(root: Path, run: str) -> list[str]:
    rows = (root / "runs" / run / "stage_times.tsv").read_text().splitlines()
    assert rows[0] == "stage\tseconds" and all(r.split("\t")[1].isdigit() for r in rows[1:])
    return [r.split("\t")[0] for r in rows[1:]]


def test_tiny_long_runs_every_stage_in_order_and_writes_its_stage_times(tmp_path):
    fake_checkout(tmp_path)
    out, calls = run_ablation(tmp_path, script="runs/tiny_long.sh", RUN="long")
    stages = [c.split()[1] if c.startswith("-m") else c.split()[0] for c in calls]
    assert stages == ["data.build_corpus", "data.build_copy_corpus", "data.build_tasks", "data.build_sft",
                      "nanocomposer.model", "train_cpt.py", "train_sft.py", "eval.py", "eval.py",
                      "data.select_edge_tasks", "train_rl.py", "eval.py"]
    assert "--tasks_dir runs/long/edge/tasks" in calls[10]
    assert "--compare runs/long/sft runs/long/rl" in calls[11]
    assert stage_times(tmp_path, "long") == ["corpora", "tasks", "oracle", "base", "cpt", "sft", "edge", "rl",
                                             "eval"]
    assert "== done in 0 min" in out and "table" in out  # the comparison is printed

    _, calls = run_ablation(tmp_path, script="runs/tiny_long.sh", RUN="long2", SKIP_DATA="1")
    assert not [c for c in calls if c.startswith("-m data.build") or "nanocomposer.model" in c]
    assert stage_times(tmp_path, "long2") == ["cpt", "sft", "edge", "rl", "eval"]


def test_tiny_long_keeps_the_stage_times_of_a_run_that_fails(tmp_path):
    fake_checkout(tmp_path)
    _, calls = run_ablation(tmp_path, status=2, script="runs/tiny_long.sh", RUN="long", BROKEN="long")
    assert not [c for c in calls if c.startswith("train_rl.py") or "--compare" in c]
    assert stage_times(tmp_path, "long") == ["corpora", "tasks", "oracle", "base", "cpt", "sft", "edge"]


def test_smol_and_tiny_train_cpt_sft_rl_with_their_recipes_and_write_their_stage_times(tmp_path):
    fake_checkout(tmp_path)
    for preset, data_stages in (("smol", ["base", "data"]), ("tiny", ["data", "base"])):
        out, calls = run_ablation(tmp_path, script=f"runs/{preset}.sh", RUN=preset, WORKERS="2")
        assert [c for c in calls if c.startswith("train_")] == [
            f"train_cpt.py --config recipes/{preset}/cpt.yaml --run {preset}",
            (f"train_sft.py --config recipes/{preset}/sft.yaml --run {preset} --model_name_or_path runs/{preset}/cpt "
             "--check_tasks artifacts/data/tasks/val"),
            f"train_rl.py --config recipes/{preset}/rl.yaml --run {preset} --model_name_or_path runs/{preset}/sft"]
        assert f"--compare runs/{preset}/sft runs/{preset}/rl" in calls[-1] and "table" in out
        assert stage_times(tmp_path, preset) == [*data_stages, "cpt", "sft", "rl", "eval"]


def test_rl_arm_screens_once_per_sft_model_trains_with_its_seed_and_reuses_sft_episodes(tmp_path):
    fake_checkout(tmp_path)
    _, calls = run_ablation(tmp_path, status=2, script="runs/rl_arm.sh", SFT_RUN="s")
    assert calls == []  # no SFT run: refused before anything plays
    (tmp_path / "runs/s/sft").mkdir(parents=True)
    (tmp_path / "runs/s/eval/s__sft").mkdir(parents=True)
    (tmp_path / "runs/s/eval/s__sft/results.json").write_text("{}")
    (tmp_path / "runs/s/eval/s__sft/results.episodes.jsonl").write_text("sft\n")

    out, calls = run_ablation(tmp_path, script="runs/rl_arm.sh", SFT_RUN="s", SEED="2", GREEDY_FILTER="0",
                              EDGE_TASKS="9", NO_EDGE="")
    screens = [c for c in calls if c.startswith("eval.py") and "--policy runs/s/sft" in c]
    assert len(screens) == 1 and "--samples 4 --temperature 1" in screens[0]  # no greedy pass without the filter
    assert "--limit 9" in screens[0] and "--output runs/s/edge/results.json" in screens[0]
    select = next(c for c in calls if "data.select_edge_tasks" in c)
    assert "--unsolved-by" not in select and "--out runs/s-rl-s2/edge/tasks" in select
    rl = next(c for c in calls if c.startswith("train_rl.py"))
    assert "--seed 2" in rl and "--tasks_dir runs/s-rl-s2/edge/tasks" in rl and "--model_name_or_path runs/s/sft" in rl
    assert "--compare runs/s/sft runs/s-rl-s2/rl" in calls[-1]
    assert (tmp_path / "runs/s-rl-s2/eval/s__sft/results.episodes.jsonl").read_text() == "sft\n"
    assert stage_times(tmp_path, "s-rl-s2") == ["edge", "rl", "eval"] and "table" in out

    _, calls = run_ablation(tmp_path, script="runs/rl_arm.sh", SFT_RUN="s", RUN="arm", NO_EDGE="",
                            RL_ARGS="--malformed_handling drop")
    select = next(c for c in calls if "data.select_edge_tasks" in c)
    assert "--unsolved-by runs/s/edge/greedy.json" in select  # the filter is on by default
    assert next(c for c in calls if c.startswith("train_rl.py")).endswith("--seed 1 --malformed_handling drop")
