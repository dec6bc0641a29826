#!/usr/bin/env bash
# One prepared check for a lent GPU machine (one H200, no network), at most 8 minutes of wall time:
#   1. install the carried wheels (.whl/, from scripts/fetch_device_wheels.sh) into /tmp/site
#   2. the tests marked `gpu` (tests/test_gpu.py), on the GPU while the CPU builds the data
#   3. the no-hub preset (runs/gpu_scratch.sh) with small budgets: data, base model, CPT, SFT, GRPO, eval
#   4. $OUT/device_check.json (bench/device.py writes it; `python -m bench.device FILE` prints the README
#      rows) and $OUT/log.txt, plus $OUT/compare.md and $OUT/gpu_tests.xml: 4 files, no folders.
#
#   bash runs/device_check.sh             # on the lent machine, through the device tool's `run`
#   bash runs/device_check.sh --dry-run   # the same steps on this CPU at toy size, fp32, no wheels (CI:
#                                         # tests/test_device_check.py)
# Knobs (environment): OUT (where results go; the device tool sets it; default $WORK/out), WORK (data, models,
# runs; default /tmp/nanocomposer-device-check; its runs/, data/ and base/ are removed first), BUDGET_S (wall-time cap, default 460 s: the
# steps end by BUDGET_S - 30, the JSON is written within the last 30-40 s), NANOCOMPOSER_COMMIT (the commit to
# record where the copy has no .git),
# CPT_STEPS SFT_STEPS RL_STEPS EVAL_LIMIT CORPUS_CHARS (the pipeline's budgets; defaults below per mode).
# Every step has a time limit inside the budget; a failed or timed-out step is recorded in the JSON and the
# stages after it that need its output are skipped, so the JSON and the log always come back.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

MODE=gpu
case "${1:-}" in
  --dry-run) MODE=dry-run ;;
  "") ;;
  *) echo "usage: bash runs/device_check.sh [--dry-run]" >&2; exit 2 ;;
esac
START=$(date +%s)
# The wall-time cap of the whole check. On the lent machine each step also has its own limit (below); in a
# dry run only the cap applies: a shared CPU runs the toy steps at whatever speed its load allows.
if [ "$MODE" = gpu ]; then BUDGET_S=${BUDGET_S:-460}; else BUDGET_S=${BUDGET_S:-900}; fi
RESERVE_S=30  # kept back for writing the JSON
# Each step's limit on the lent machine, in seconds. They add up to the budget less the reserve (tested:
# tests/test_device_check.py), so no step can starve the ones after it:
#   wheels 40 + imports 30 + data 140 (the GPU tests beside it) + cpt 60 + sft 60 + rl 45 + eval 55 = 430 = 460 - 30
# Estimates for the 91 M model (docs/gpu.md): wheels+imports ~35 s; data ~90-130 s on 16 workers (no ladder);
# CPT 150 steps x 32k tokens ~30-45 s with start-up; SFT 30 steps + a 2-task check ~40 s; GRPO 1 step x 4
# episodes ~35 s; eval 4 policies x 4 episodes, all of a policy's episodes in one batch, 4 turns x 64 tokens ~45 s.
declare -A LIMIT=([wheels]=40 [imports]=30 [data]=140 [gpu_tests]=140 [cpt]=60 [sft]=60 [rl]=45 [eval]=55)
WORK=${WORK:-/tmp/nanocomposer-device-check}
OUT=${OUT:-$WORK/out}
RUN=device-check
rm -rf "$WORK/runs" "$WORK/data" "$WORK/base" "$WORK/steps.tsv"
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/log.txt"
STEPS="$WORK/steps.tsv"
: > "$STEPS"

# The pipeline's budgets and where everything goes (runs/gpu_scratch.sh reads these).
export RUN RUNS="$WORK/runs" DATA="$WORK/data" CORPUS="$WORK/data/corpus" BASE="$WORK/base"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1 EVAL_FLAGS=""
if [ "$MODE" = gpu ]; then
  export PY=python3 PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}  # where install_wheels puts them
  export CORPUS_CHARS=${CORPUS_CHARS:-6000000} CPT_STEPS=${CPT_STEPS:-150} SFT_STEPS=${SFT_STEPS:-30}
  export RL_STEPS=${RL_STEPS:-1} EVAL_LIMIT=${EVAL_LIMIT:-2}
  export TRAIN_FLAGS="--report_to none"
  export TASK_FLAGS="--ladder 0 --ladder-held-out 0"  # a timing check: the factory without its ladder
  export RL_FLAGS="--per_device_train_batch_size 4"  # one task x 4 episodes per step
  # A 30-step 91 M model may never make a valid call: the check is timed and reported, not a gate here.
  export SFT_EXTRA="--check_limit 2 --check_workers 2 --check_must_pass false"
  export EVAL_FLAGS="--max-turns 4 --max-new-tokens 64"
else  # toy sizes: a micro model, a 3-project task factory, a handful of steps, fp32 on the CPU
  if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
  export PY NANOCOMPOSER_TEST_DEVICE=cpu WORKERS=2
  export CORPUS_CHARS=${CORPUS_CHARS:-100000} CPT_STEPS=${CPT_STEPS:-2} SFT_STEPS=${SFT_STEPS:-2}
  export RL_STEPS=${RL_STEPS:-1} EVAL_LIMIT=${EVAL_LIMIT:-1}
  export CORPUS_FLAGS="--sources stdlib"
  export TASK_FLAGS="--only micro_clamp,micro_fizzbuzz,micro_rle --per-project 1 --held-out-per-project 1 --families fix_bug --ladder 0 --ladder-held-out 0"
  export SFT_DATA_FLAGS="--variants 1 --val-tasks 1"
  export BASE_FLAGS="--preset tiny --vocab-size 512 --hidden 64 --layers 2 --heads 2"
  export TRAIN_FLAGS="--report_to none --bf16 false --use_cpu true --optim adamw_torch --dataloader_pin_memory false"
  export CPT_FLAGS="--block_size 128 --per_device_train_batch_size 2 --per_device_eval_batch_size 2 --max_eval_blocks 2"
  export RL_FLAGS="--num_generations 2 --per_device_train_batch_size 2 --max_turns 2 --max_new_tokens 16"
  export SFT_EXTRA="--check_limit 1 --check_max_turns 2 --check_max_new_tokens 16 --check_must_pass false --max_length 2048 --per_device_train_batch_size 1"
  export EVAL_FLAGS="--max-turns 2 --max-new-tokens 16"
fi
# Timing, not scheduled evaluations: CPT evaluates once after training; SFT saves its last step's
# trainer_state.json (the token count TRL logs is read from it).
export CPT_FLAGS="${CPT_FLAGS:-} --eval_strategy no --eval_on_start false --save_strategy no --logging_steps 10"
export SFT_FLAGS="--eval_strategy no --eval_on_start false --save_strategy steps --save_steps $SFT_STEPS \
--logging_steps 1 $SFT_EXTRA"
export RL_FLAGS="$RL_FLAGS --save_strategy no"

left_s() { echo $(( BUDGET_S - RESERVE_S - ($(date +%s) - START) )); }

# run_step NAME LIMIT_S CMD...: run CMD under min(LIMIT_S, what is left of the budget); record its exit
# status and wall seconds in steps.tsv (124: timed out; "skipped": no time left).
run_step() {
  local name=$1 limit=$2 left t0 rc
  shift 2
  left=$(left_s)
  [ "$MODE" = gpu ] || limit=$left
  (( limit > left )) && limit=$left
  if (( limit < 5 )); then
    echo "== $name: skipped, no time left in the ${BUDGET_S}s budget"
    printf '%s\tskipped\t0\n' "$name" >> "$STEPS"
    return 1
  fi
  echo; echo "== $name (limit ${limit}s; $(( $(date +%s) - START ))s into the check)"
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  printf '%s\t%s\t%.1f\n' "$name" "$rc" "$(echo "$(date +%s.%N) - $t0" | awk '{ print $1 - $3 }')" >> "$STEPS"
  (( rc == 124 )) && echo "== $name: timed out after ${limit}s"
  return $rc
}

skip() {  # skip NAME WHY
  echo "== $1: skipped ($2)"
  printf '%s\tskipped\t0\n' "$1" >> "$STEPS"
}

install_wheels() {
  [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1 || {
    echo "no wheels in .whl/: run scripts/fetch_device_wheels.sh here and name .whl in the run's carry"; return 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || return 1
  # ruff is a program the sandboxed lint tool and fix_lint grading call by name, and sandboxed commands get a
  # fixed PATH (the interpreter's bin, /usr/local/bin, /usr/bin, /bin), not PYTHONPATH.
  local bin
  for bin in /usr/local/bin "$(python3 -c 'import sys; print(sys.prefix)')/bin"; do
    ln -sf /tmp/site/bin/ruff "$bin/ruff" 2> /dev/null && { echo "ruff -> $bin/ruff"; return 0; }
  done
  echo "could not put ruff on the sandbox's PATH"; return 1
}

versions() {
  $PY - <<'EOF'
import importlib.metadata as md, platform, torch
names = ("torch", "transformers", "trl", "datasets", "peft", "accelerate", "tokenizers", "pyarrow", "fsspec",
         "huggingface-hub", "bm25s", "datasketch", "ruff")
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "missing"
print("python", platform.python_version(), "|", ", ".join(f"{n} {version(n)}" for n in names))
print("cuda:", torch.cuda.is_available() and torch.cuda.get_device_name(0), "| torch cuda", torch.version.cuda)
import datasets, trl, bm25s, datasketch  # noqa: F401,E401  (the carried packages import together)
EOF
}

main() {
  echo "== device check, mode $MODE, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "   budget ${BUDGET_S}s; work dir $WORK; results in $OUT"
  if [ "$MODE" = gpu ]; then
    run_step wheels "${LIMIT[wheels]}" bash -c "$(declare -f install_wheels); install_wheels" || { skip pipeline "wheels"; return; }
    # Fails fast when a carried package does not fit the machine's (datasets needs pyarrow >= 24, ...).
    run_step imports "${LIMIT[imports]}" bash -c "$(declare -f versions); PY=$PY versions" || { skip pipeline "imports"; return; }
  fi

  # The GPU tests need the GPU, the data builders the CPU: they run side by side.
  run_step gpu_tests "${LIMIT[gpu_tests]}" "$PY" -m pytest -q -m gpu tests/test_gpu.py -rs -p no:cacheprovider \
    --junitxml="$OUT/gpu_tests.xml" > "$WORK/gpu_tests.log" 2>&1 &
  local tests_pid=$!
  STAGES=data run_step data "${LIMIT[data]}" bash runs/gpu_scratch.sh
  local data_rc=$?
  wait $tests_pid
  echo; echo "== gpu tests (ran beside the data build)"; cat "$WORK/gpu_tests.log"

  # Each stage needs the model the one before saved; a stage that failed after saving it (SFT's harness check
  # exits 1 when the model never made a valid call) does not stop the next one.
  (( data_rc == 0 )) || { skip cpt "the data step failed"; return; }
  local stage previous=base
  for stage in cpt sft rl eval; do
    if [ ! -f "$([ $previous = base ] && echo "$BASE" || echo "$RUNS/$RUN/$previous")/config.json" ]; then
      skip "$stage" "no $previous model"; previous=$stage; continue
    fi
    STAGES=$stage run_step "$stage" "${LIMIT[$stage]}" bash runs/gpu_scratch.sh
    previous=$stage
  done
}

main 2>&1 | tee "$LOG"
echo; echo "== writing $OUT/device_check.json" | tee -a "$LOG"
cp "$WORK/runs/$RUN/eval/compare.md" "$OUT/compare.md" 2> /dev/null
timeout 40 "${PY:-python3}" -m bench.device "$OUT/device_check.json" --collect --mode "$MODE" --runs "$WORK/runs" \
  --run "$RUN" --base "$BASE" --steps "$STEPS" --junit "$OUT/gpu_tests.xml" --started "$START" 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
if (( status == 0 )) && grep -q '"ok": true' "$OUT/device_check.json"; then verdict=ok; else verdict=FAILED; status=1; fi
echo "== device check $verdict in $(( $(date +%s) - START ))s; steps and tests: $OUT/device_check.json" | tee -a "$LOG"
exit "$status"
