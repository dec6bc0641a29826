#!/usr/bin/env bash
# The recipe's pretraining claim, tested: three arms that differ only in their CPT, each followed by the same
# SFT, then one comparison of the SFT models on the same held-out ladder tasks (paired intervals); with RL=1,
# each arm's SFT model is then trained by the same GRPO and compared with its SFT model.
#   none   SFT straight from the base model (artifacts/base)
#   code   CPT on the code mix alone: the tiny_long CPT with its copy-rich mix and copy warm-up turned off
#   copy   the tiny_long CPT recipe as it is (copy warm-up, then the code mix with copy-rich synthetic code)
#
#   RUN=pt bash runs/pretraining_ablation.sh                     # runs/pt-{none,code,copy}/..., runs/pt/pretraining
#   RUN=pt ARMS="none" bash runs/pretraining_ablation.sh &       # arms in separate processes (one core each:
#   RUN=pt ARMS="code copy" bash runs/pretraining_ablation.sh    #   THREADS=1); the last one to end compares
#   COPY_RUN=replay15 ...     # the copy arm is an existing run's runs/replay15/{cpt,sft}, not trained again
#   SFT_ARGS="--dataset_path artifacts/ladder6/sft/dataset ..." EVAL_TASKS=artifacts/ladder6/tasks/test ...
#   RL=1 TRAIN_TASKS=artifacts/ladder6/tasks/train EDGE_TASKS=150 RL_ARGS="..." ...
#     RL: screen EDGE_TASKS train tasks for the tasks at the edge (runs/edge_screen.sh: solved sometimes by
#     sampling, never by the greedy policy), GRPO on them (recipes/tiny_long/rl.yaml), then SFT vs RL on
#     EVAL_TASKS in runs/<arm run>/eval-rl. An arm with no such task gets no RL, and says so; a failed screen
#     stops the script.
# A stage whose model is saved is skipped and a cut one resumes from its last checkpoint (the eval resumes too).
# Recipes: recipes/tiny_long/{cpt,sft,eval}.yaml; the data and base as runs/tiny_long.sh builds them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:?set RUN: the arms go to runs/\$RUN-none, runs/\$RUN-code, runs/\$RUN-copy}
ARMS=${ARMS:-none code copy}
SFT_ARGS=${SFT_ARGS:-}
EVAL_TASKS=${EVAL_TASKS:-artifacts/ladder/tasks/test}
RL=${RL:-}
TRAIN_TASKS=${TRAIN_TASKS:-artifacts/ladder/tasks/train}
EDGE_TASKS=${EDGE_TASKS:-150}
RL_ARGS=${RL_ARGS:-}
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
train=("$PY")  # training commands; THREADS caps their torch threads (two arms at once on two cores)
if [ -n "${THREADS:-}" ]; then train=(env OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS" "$PY"); fi
stage() { echo; echo "== $* ($(date +%H:%M:%S))"; }
saved() { [ -f "$1/model.safetensors" ] || [ -f "$1/adapter_model.safetensors" ]; }
resume() { if compgen -G "$1/checkpoint-*" > /dev/null; then echo "--resume true"; fi; }  # a cut stage goes on
run_of() { if [ "$1" = copy ] && [ -n "${COPY_RUN:-}" ]; then echo "$COPY_RUN"; else echo "$RUN-$1"; fi; }

for arm in $ARMS; do
  case $arm in
    none) cpt_flags=() ;;
    code) cpt_flags=(--mix_fraction 0 --copy_warmup_steps 0 --copy_replay_fraction 0) ;;
    copy) cpt_flags=() ;;
    *) echo "unknown arm $arm (none, code, copy)" >&2; exit 2 ;;
  esac
  run=$(run_of "$arm")
  start=artifacts/base
  if [ "$arm" != none ]; then
    start=runs/$run/cpt
    if saved "$start"; then stage "$arm: CPT saved at $start, skipped"
    else
      stage "$arm: CPT -> $start"
      # shellcheck disable=SC2046  # resume prints nothing or one flag and its value
      "${train[@]}" train_cpt.py --config recipes/tiny_long/cpt.yaml --run "$run" "${cpt_flags[@]}" $(resume "$start")
    fi
  fi
  if saved "runs/$run/sft"; then stage "$arm: SFT saved at runs/$run/sft, skipped"
  else
    stage "$arm: SFT from $start -> runs/$run/sft"
    # shellcheck disable=SC2046,SC2086  # SFT_ARGS is a list of flags
    "${train[@]}" train_sft.py --config recipes/tiny_long/sft.yaml --run "$run" --model_name_or_path "$start" $SFT_ARGS \
      $(resume "runs/$run/sft")
  fi
  [ -n "$RL" ] || continue
  edge=runs/$run/edge
  if saved "runs/$run/rl"; then stage "$arm: RL saved at runs/$run/rl, skipped"; continue; fi
  if [ ! -f "$edge/tasks/manifest.json" ]; then
    stage "$arm: edge screen of runs/$run/sft on $EDGE_TASKS tasks of $TRAIN_TASKS: greedy, then 4 samples at temperature 1"
    status=0
    PY=$PY bash runs/edge_screen.sh "runs/$run/sft" "$TRAIN_TASKS" "$EDGE_TASKS" "$edge" || status=$?
    if [ "$status" = 3 ]; then stage "$arm: no train task at the edge of runs/$run/sft (above): no RL for this arm"; continue; fi
    [ "$status" = 0 ] || exit "$status"
  fi
  stage "$arm: GRPO on $edge/tasks -> runs/$run/rl"
  # shellcheck disable=SC2046,SC2086  # RL_ARGS is a list of flags
  "${train[@]}" train_rl.py --config recipes/tiny_long/rl.yaml --run "$run" --model_name_or_path "runs/$run/sft" \
    --tasks_dir "$edge/tasks" $RL_ARGS $(resume "runs/$run/rl")
done

models=()
for arm in none code copy; do models+=("runs/$(run_of "$arm")/sft"); done
for model in "${models[@]}"; do
  saved "$model" || { stage "compare: waiting for $model (run its arm), not compared yet"; exit 0; }
done
stage "compare: ${models[*]} on $EVAL_TASKS"
mkdir -p "runs/$RUN/pretraining"
$PY eval.py --config recipes/tiny_long/eval.yaml --compare "${models[@]}" --tasks "$EVAL_TASKS" \
  --out-dir "runs/$RUN/pretraining" --run "$RUN" --resume --quiet
cat "runs/$RUN/pretraining/compare.md"

[ -n "$RL" ] || exit 0
for arm in none code copy; do
  run=$(run_of "$arm")
  saved "runs/$run/rl" || continue
  stage "compare: runs/$run/sft vs runs/$run/rl on $EVAL_TASKS"
  mkdir -p "runs/$run/eval-rl"
  # the SFT model's episodes from the comparison above are reused (--resume refuses them if any setting differs)
  sft_episodes=runs/$RUN/pretraining/${run}__sft
  if [ -d "$sft_episodes" ] && [ ! -e "runs/$run/eval-rl/${run}__sft" ]; then cp -r "$sft_episodes" "runs/$run/eval-rl/"; fi
  $PY eval.py --config recipes/tiny_long/eval.yaml --compare "runs/$run/sft" "runs/$run/rl" --tasks "$EVAL_TASKS" \
    --out-dir "runs/$run/eval-rl" --run "$RUN" --resume --quiet
  cat "runs/$run/eval-rl/compare.md"
done
