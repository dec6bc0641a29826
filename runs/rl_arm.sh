#!/usr/bin/env bash
# One more RL arm from a finished SFT run of runs/smol_long.sh: screen train tasks at the edge of the SFT model,
# GRPO from it with a given seed, then SFT vs RL on the same held-out ladder tasks (SFT's episodes reused, so
# the comparison is paired). Claim 1 asks for two RL seeds per SFT run; this is how the second and later run.
#   SFT_RUN=sl3 RUN=sl3-rl-s1 SEED=1 bash runs/rl_arm.sh
# Env: SFT_RUN (the smol_long run whose runs/$SFT_RUN/sft and eval are used; required), RUN (this arm; default
# $SFT_RUN-rl-s$SEED), SEED (GRPO's seed: sampling and data order; default 1), RL_STEPS (default 24),
# EDGE_TASKS (train tasks screened; default 48), GREEDY_FILTER (1: keep only edge tasks the greedy SFT model
# never solves, as runs/smol_long.sh does; 0: every task whose sampled pass rate is strictly between 0 and 1),
# EVAL_LIMIT (default 300), EVAL_WORKERS (default 16), RL_ARGS (more train_rl.py flags, for an ablation arm:
# RL_ARGS="--malformed_handling drop" trains with malformed calls dropped from the loss).
# The screen's episodes are kept in runs/$SFT_RUN/edge (one screen per SFT model; a wider screen resumes it),
# the chosen tasks in runs/$RUN/edge/tasks.
# A cut-off arm continues: rerun the same command with --resume added to RL_ARGS (GRPO resumes from its newest
# complete checkpoint, saved every 2 steps by recipes/smol/rl.yaml; the eval resumes by episode).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
: "${SFT_RUN:?set SFT_RUN, the runs/smol_long.sh run to start from}"
SEED=${SEED:-1} RUN=${RUN:-$SFT_RUN-rl-s${SEED:-1}} RL_STEPS=${RL_STEPS:-24} EDGE_TASKS=${EDGE_TASKS:-48}
GREEDY_FILTER=${GREEDY_FILTER:-1} EVAL_LIMIT=${EVAL_LIMIT:-300} EVAL_WORKERS=${EVAL_WORKERS:-16}
LADDER=artifacts/smol_ladder SFT="runs/$SFT_RUN/sft"
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false NANOCOMPOSER_PROGRESS=${NANOCOMPOSER_PROGRESS:-1}
sft_eval="runs/$SFT_RUN/eval/${SFT_RUN//\//__}__sft/results.json"
for need in "$SFT" "$sft_eval"; do
  [ -e "$need" ] || { echo "rl_arm.sh: $need is missing: run runs/smol_long.sh with RUN=$SFT_RUN first" >&2; exit 2; }
done
source runs/stages.sh

stage edge "3a. the SFT model on $EDGE_TASKS train tasks (screen in runs/$SFT_RUN/edge, greedy filter $GREEDY_FILTER)"
status=0
EVAL_CONFIG=recipes/smol/eval.yaml GREEDY_FILTER=$GREEDY_FILTER PY=$PY bash runs/edge_screen.sh "$SFT" \
  "$LADDER/tasks/train" "$EDGE_TASKS" "runs/$SFT_RUN/edge" "runs/$RUN/edge/tasks" || status=$?
[ "$status" = 3 ] && echo "no train task at the edge of $SFT: screen more (EDGE_TASKS=$EDGE_TASKS)" >&2
[ "$status" = 0 ] || exit "$status"

stage rl "3b. GRPO from $SFT, seed $SEED ($RL_STEPS steps) -> runs/$RUN/rl"
# shellcheck disable=SC2086  # RL_ARGS is a list of flags
$PY train_rl.py --config recipes/smol/rl.yaml --run "$RUN" --model_name_or_path "$SFT" \
  --tasks_dir "runs/$RUN/edge/tasks" --max_steps "$RL_STEPS" --seed "$SEED" ${RL_ARGS:-}

stage eval "4. eval: SFT vs RL on $EVAL_LIMIT held-out ladder tasks (test split; SFT's episodes reused)"
# eval.py --compare looks for each policy's results at <out-dir>/<slug of its path's last two parts>/results.json
sft_slug="$(basename "$SFT_RUN")__sft"
mkdir -p "runs/$RUN/eval/$sft_slug"
cp -n "$(dirname "$sft_eval")"/results.* "runs/$RUN/eval/$sft_slug/"
$PY eval.py --config recipes/smol/eval.yaml --tasks "$LADDER/tasks/test" --compare "$SFT" "runs/$RUN/rl" \
  --limit "$EVAL_LIMIT" --workers "$EVAL_WORKERS" --out-dir "runs/$RUN/eval" --run "$RUN" --wandb --resume
cat "runs/$RUN/eval/compare.md"
stages_done
