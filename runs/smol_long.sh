#!/usr/bin/env bash
# The headline pipeline on the pretrained base (SmolLM2-135M-Instruct) on a CPU: the task ladder, SFT for
# longer than the demo, GRPO at the edge of competence, SFT vs RL on 300 held-out ladder tasks (test split,
# 50 per rung). Not yet timed end to end; the stage estimates below are from the demo's measured rates
# (SFT 14 s a step, eval 9.6 s an episode at 16 workers, 2 unloaded cores; docs/log.md 2026-12-03).
#   bash runs/smol_long.sh                        # RUN=smol-long-<date-time>
#   RUN=sl1 SKIP_DATA=1 bash runs/smol_long.sh    # reuse artifacts/smol_ladder and the code mix
# Env: SFT_STEPS (default 120, ~28 min), RL_STEPS (default 8, ~16 min), EVAL_LIMIT (held-out ladder tasks
# per model, spread over the rungs; default 300, ~48 min a model), EDGE_TASKS (train tasks screened before
# RL; default 48), EVAL_WORKERS (episodes at once in eval; default 16, the recipe's), HUMANEVAL_LIMIT (HumanEval
# problems for base, SFT and RL through the harness; default all 164; 0 skips the stage), CPT (1: continued
# pretraining on the code mix before SFT, the recipe; 0: SFT straight from the pretrained base, the no-CPT arm of
# the pretraining comparison: RUN=sl-nocpt CPT=0 SKIP_DATA=1 bash runs/smol_long.sh).
# SFT_SEED (SFT's seed: LoRA init and data order; default the recipe's) makes a second SFT run of the recipe,
# which claim 1's replication needs: RUN=sl4 SFT_SEED=1 SKIP_DATA=1 bash runs/smol_long.sh.
# The SFT model is evaluated right after SFT, so its figure is on disk before RL starts; the last stage compares
# SFT and RL with --resume, which reuses those episodes and plays only RL's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-smol-long-$(date +%Y%m%d-%H%M%S)}
SFT_STEPS=${SFT_STEPS:-120} RL_STEPS=${RL_STEPS:-8} EVAL_LIMIT=${EVAL_LIMIT:-300} EDGE_TASKS=${EDGE_TASKS:-48}
EVAL_WORKERS=${EVAL_WORKERS:-16} HUMANEVAL_LIMIT=${HUMANEVAL_LIMIT:-164} CPT=${CPT:-1}
[[ "$CPT" =~ ^[01]$ ]] || { echo "smol_long.sh: CPT=$CPT: expected 1 (continued pretraining, the recipe) or 0 (none)" >&2; exit 2; }
LADDER=artifacts/smol_ladder
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false NANOCOMPOSER_PROGRESS=${NANOCOMPOSER_PROGRESS:-1}
source runs/stages.sh

stage base "base: SmolLM2-135M-Instruct converted from the installed GGUF -> artifacts/base (once)"
$PY -m nanocomposer.model build --out artifacts/base

if [ -z "${SKIP_DATA:-}" ]; then
  stage corpus "data: the code mix (CPT)"
  $PY -m data.build_corpus --out artifacts/data/corpus --max-chars 4000000 --seed 0 --overwrite
  stage tasks "data: the task ladder (100 per rung in train, 50 per rung in val and test), each task graded as given (must fail) and with its gold solution (must pass)"
  $PY -m data.build_tasks --out "$LADDER/tasks" --ladder 100 --ladder-held-out 50 --ladder-only --seed 0 \
    --workers 2 --overwrite
  stage oracle "data: oracle trajectories of the train tasks under the smol budgets (the SFT data)"
  $PY -m data.build_sft --tasks "$LADDER/tasks" --out "$LADDER/sft" --variants 1 --val-tasks 24 --seed 0 \
    --workers 2 --budget recipes/smol/budget.yaml --verify-template artifacts/base --overwrite
fi

case "$CPT" in
  1) stage cpt "1. continued pretraining on the code mix -> runs/$RUN/cpt"
     $PY train_cpt.py --config recipes/smol/cpt.yaml --run "$RUN"
     SFT_FROM="runs/$RUN/cpt" ;;
  0) echo "CPT=0: no continued pretraining; SFT starts from the pretrained base"; SFT_FROM=artifacts/base ;;
esac

stage sft "2. SFT on the ladder ($SFT_STEPS steps) from $SFT_FROM -> runs/$RUN/sft"
$PY train_sft.py --config recipes/smol/sft.yaml --run "$RUN" --model_name_or_path "$SFT_FROM" \
  --dataset_path "$LADDER/sft/dataset" --max_steps "$SFT_STEPS" --check_tasks "$LADDER/tasks/val" \
  ${SFT_SEED:+--seed "$SFT_SEED"}

stage eval_sft "2b. eval: the SFT model on $EVAL_LIMIT held-out ladder tasks (test split)"
# Written where the comparison below looks for it (eval.py --compare: <out-dir>/<slug of run/sft>/results.json).
mkdir -p "runs/$RUN/eval/${RUN//\//__}__sft"
$PY eval.py --config recipes/smol/eval.yaml --tasks "$LADDER/tasks/test" --policy "runs/$RUN/sft" \
  --limit "$EVAL_LIMIT" --workers "$EVAL_WORKERS" --output "runs/$RUN/eval/${RUN//\//__}__sft/results.json" --resume

stage edge "3a. the SFT model on $EDGE_TASKS train tasks, greedy and 4 samples at temperature 1"
status=0
EVAL_CONFIG=recipes/smol/eval.yaml PY=$PY bash runs/edge_screen.sh "runs/$RUN/sft" "$LADDER/tasks/train" \
  "$EDGE_TASKS" "runs/$RUN/edge" || status=$?
if [ "$status" = 3 ]; then
  echo "no train task at the edge of runs/$RUN/sft: GRPO has no signal; screen more (EDGE_TASKS=$EDGE_TASKS)" >&2
fi
[ "$status" = 0 ] || exit "$status"

stage rl "3b. GRPO on the tasks at the edge of competence ($RL_STEPS steps) -> runs/$RUN/rl"
$PY train_rl.py --config recipes/smol/rl.yaml --run "$RUN" --model_name_or_path "runs/$RUN/sft" \
  --tasks_dir "runs/$RUN/edge/tasks" --max_steps "$RL_STEPS"

stage eval "4. eval: SFT vs RL on $EVAL_LIMIT held-out ladder tasks (test split; SFT's episodes reused)"
$PY eval.py --config recipes/smol/eval.yaml --tasks "$LADDER/tasks/test" --compare "runs/$RUN/sft" "runs/$RUN/rl" \
  --limit "$EVAL_LIMIT" --workers "$EVAL_WORKERS" --out-dir "runs/$RUN/eval" --run "$RUN" --wandb --resume
cat "runs/$RUN/eval/compare.md"

if [ "$HUMANEVAL_LIMIT" != 0 ]; then
  stage humaneval "5. HumanEval through the harness ($HUMANEVAL_LIMIT of 164 problems): base vs SFT vs RL"
  $PY eval.py --config recipes/smol/eval.yaml --tasks "humaneval:$HUMANEVAL_LIMIT" \
    --compare artifacts/base "runs/$RUN/sft" "runs/$RUN/rl" --workers "$EVAL_WORKERS" \
    --out-dir "runs/$RUN/humaneval" --run "$RUN" --resume
  cat "runs/$RUN/humaneval/compare.md"
fi
stages_done; echo "reports: runs/$RUN/eval/compare.md, runs/$RUN/humaneval/compare.md"
