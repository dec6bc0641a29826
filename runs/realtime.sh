#!/usr/bin/env bash
# Stage 4 on CPU: real-time RL from a trained SFT model, the live A/B, and the two reward hacks in their
# native setting. Needs the task factory's splits (runs/data.sh) and an SFT model (runs/tiny.sh).
#   SFT=runs/demo/sft bash runs/realtime.sh            # RUN=<sft's run>-rt
#   SFT=runs/demo/sft AB_SESSIONS=400 CYCLES=5 bash runs/realtime.sh
# Targets (issue): 5 cycles in under 30 min; >= 400 sessions per A/B arm; dropped malformed calls
# (more malformed calls) and free questions (questions instead of edits) visible across cycles, and absent with the fixes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SFT=${SFT:?set SFT to a trained SFT checkpoint directory, e.g. runs/demo/sft}
RUN=${RUN:-$(basename "$(dirname "$SFT")")-rt}
CYCLES=${CYCLES:-5}
AB_SESSIONS=${AB_SESSIONS:-400}
RECIPE=${RECIPE:-recipes/tiny/realtime.yaml}
TASKS=${TASKS:-factory:val}   # the A/B traffic: the recipe's traffic_tasks
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
stage() { echo; echo "== $* ($(date +%H:%M:%S))"; }
t0=$(date +%s)

stage "1. real-time RL, $CYCLES cycles -> runs/$RUN/realtime"
$PY realtime_rl.py --config "$RECIPE" --model_name_or_path "$SFT" --run "$RUN" --cycles "$CYCLES"
echo "loop: $(( ($(date +%s) - t0) / 60 )) min"
cat "runs/$RUN/realtime/report.md"

stage "2. live A/B: the starting version (A) vs the loop's current version (B), $AB_SESSIONS conversations per arm"
CURRENT=$(cat "runs/$RUN/realtime/registry/current")
$PY -m bench.realtime ab --a "runs/$RUN/realtime/registry/versions/v0" \
  --b "runs/$RUN/realtime/registry/versions/$CURRENT" --tasks "$TASKS" --sessions "$AB_SESSIONS" \
  --recipe recipes/tiny/users.yaml --budget "$(dirname "$RECIPE")/budget.yaml" --temperature 1.0 --backend transformers \
  --out "runs/$RUN/ab"

# The hack runs open the gate's behaviour thresholds, so a hacked version can ship as it did before monitoring
# caught it; their gate reports and live metrics still show the rates moving (step 5).
OPEN_GATE="--gate_max_malformed_increase 1 --gate_max_ask_user_increase 1 --gate_max_edit_rate_drop 1"
stage "3. malformed calls dropped from training -> runs/$RUN-malformed-dropped"
# shellcheck disable=SC2086
$PY realtime_rl.py --config "$RECIPE" --model_name_or_path "$SFT" --run "$RUN-malformed-dropped" --cycles "$CYCLES" \
  --malformed_handling drop $OPEN_GATE

stage "4. free questions: questions free, reverted edits penalised -> runs/$RUN-free-questions"
# shellcheck disable=SC2086
$PY realtime_rl.py --config "$RECIPE" --model_name_or_path "$SFT" --run "$RUN-free-questions" --cycles "$CYCLES" \
  --ask_user_handling free $OPEN_GATE

stage "5. behaviour across cycles: fixed vs malformed calls dropped vs free questions"
$PY -m bench.realtime cycles "runs/$RUN" "runs/$RUN-malformed-dropped" "runs/$RUN-free-questions" --out "runs/$RUN/cycles.md"
echo; echo "== done in $(( ($(date +%s) - t0) / 60 )) min; runs/$RUN/ab/ab.md, runs/$RUN/cycles.md"
