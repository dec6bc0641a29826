#!/usr/bin/env bash
# The reward-hack ablations (the two hacks Composer's recipe reports, and their fixes) from one SFT model, then one comparison table.
#   RUN=tiny-20261129-181947 bash runs/ablations.sh             # 300 steps each (recipes/tiny/rl_long.yaml)
#   RUN=tiny-20261129-181947 STEPS=60 bash runs/ablations.sh    # a shorter form
# Three GRPO runs that differ in one switch each:
#   base      malformed calls penalised, ask_user penalised like a failed action (Composer's fixes)
#   drop      malformed calls dropped: episodes with a malformed call dropped from the loss
#   ask-free  free questions: failed edits penalised, ask_user free
# then eval.py --compare SFT base drop ask-free on the held-out tasks -> runs/$RUN/ablations/compare.md
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:?set RUN to the pipeline run whose SFT model the ablations start from (runs/\$RUN/sft)}
STEPS=${STEPS:-300}
SFT="runs/$RUN/sft"
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
[ -d "$SFT" ] || { echo "no SFT model at $SFT: run runs/tiny.sh (or train_sft.py) with RUN=$RUN first" >&2; exit 2; }

for variant in "base penalize penalize" "drop drop penalize" "ask-free penalize free"; do
  set -- $variant
  echo; echo "== GRPO ablation $1: malformed_handling=$2 ask_user_handling=$3, $STEPS steps ($(date +%H:%M:%S))"
  # --max_turns 6: the ablations' GRPO budget (shorter episodes, more steps), deliberately below the preset's 8
  # (recipes/tiny/budget.yaml, which eval below plays under)
  $PY train_rl.py --config recipes/tiny/rl_long.yaml --run "$RUN-abl-$1" --model_name_or_path "$SFT" \
    --max_steps "$STEPS" --malformed_handling "$2" --ask_user_handling "$3" --max_turns 6
done

echo; echo "== eval: SFT vs the three GRPO variants on the held-out tasks ($(date +%H:%M:%S))"
$PY eval.py --compare "$SFT" "runs/$RUN-abl-base/rl" "runs/$RUN-abl-drop/rl" "runs/$RUN-abl-ask-free/rl" \
  --tasks factory:test factory:val --workers 2 --budget recipes/tiny/budget.yaml \
  --out-dir "runs/$RUN/ablations" --run "$RUN" --wandb
cat "runs/$RUN/ablations/compare.md"
