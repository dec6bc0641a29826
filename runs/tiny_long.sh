#!/usr/bin/env bash
# The headline pipeline on a CPU: the task ladder, a base that can copy, SFT at scale, GRPO at the edge of
# competence, SFT vs RL on 360 held-out ladder tasks (six rungs). Target under 2.5 h on 2 cores; one timed run
# from a clean clone took 2 h 48 min (README, Results; stage times in runs/$RUN/stage_times.tsv).
#   bash runs/tiny_long.sh                 # RUN=long-<date-time>
#   RUN=long1 SKIP_DATA=1 bash runs/tiny_long.sh   # reuse artifacts/ladder and the copy corpus
# Recipes: recipes/tiny_long/{cpt,sft,rl,eval}.yaml, and one budget file, recipes/tiny_long/budget.yaml, that the
# SFT data, the SFT check, the edge screen, GRPO and eval all read. Every stage reads the previous one's output
# from runs/$RUN/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-long-$(date +%Y%m%d-%H%M%S)}
EDGE_TASKS=${EDGE_TASKS:-180}   # train tasks screened before RL (spread over the rungs): greedy, then pass@4
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false NANOCOMPOSER_PROGRESS=${NANOCOMPOSER_PROGRESS:-1}
source runs/stages.sh

if [ -z "${SKIP_DATA:-}" ]; then
  stage corpora "data: the code mix and the copy-rich corpus"
  $PY -m data.build_corpus --out artifacts/data/corpus --max-chars 4000000 --seed 0 --overwrite
  $PY -m data.build_copy_corpus --out artifacts/data/copy_corpus_dense --documents 30000 --validation-documents 500 \
    --dense-fraction 0.6 --seed 0 --overwrite
  stage tasks "data: the task ladder (300 per rung in train, 60 per rung in val and test); each task graded as given (must fail) and with its gold solution (must pass)"
  $PY -m data.build_tasks --out artifacts/ladder/tasks --ladder 300 --ladder-held-out 60 --ladder-only --seed 0 \
    --workers 2 --overwrite
  stage oracle "data: oracle trajectories of the train tasks (the SFT data)"
  $PY -m data.build_sft --tasks artifacts/ladder/tasks --out artifacts/ladder/sft --variants 1 --val-tasks 40 \
    --seed 0 --concurrency 4 --budget recipes/tiny_long/budget.yaml --overwrite
  stage base "base: tokenizer trained on the code mix + a small Llama, random init"
  $PY -m nanocomposer.model build --out artifacts/base --corpus artifacts/data/corpus
fi

stage cpt "1. continued pretraining with the copy-rich mix -> runs/$RUN/cpt (eval/copy_accuracy logged)"
$PY train_cpt.py --config recipes/tiny_long/cpt.yaml --run "$RUN"

stage sft "2. SFT on the ladder, held-out solve rate logged while training -> runs/$RUN/sft"
$PY train_sft.py --config recipes/tiny_long/sft.yaml --run "$RUN" --model_name_or_path "runs/$RUN/cpt"

stage edge "3a. the SFT model on $EDGE_TASKS train tasks, greedy and 4 samples at temperature 1 (the RL budgets)"
# the edge: solved by some samples, never by the greedy policy (a gain there shows as new greedy solves)
status=0
PY=$PY bash runs/edge_screen.sh "runs/$RUN/sft" artifacts/ladder/tasks/train "$EDGE_TASKS" "runs/$RUN/edge" || status=$?
if [ "$status" = 3 ]; then
  echo "no train task at the edge of runs/$RUN/sft (above): GRPO has no signal to train on; screen more tasks" \
    "(EDGE_TASKS=$EDGE_TASKS) or train SFT longer" >&2
fi
[ "$status" = 0 ] || exit "$status"

stage rl "3b. GRPO on the tasks at the edge of competence -> runs/$RUN/rl"
$PY train_rl.py --config recipes/tiny_long/rl.yaml --run "$RUN" --model_name_or_path "runs/$RUN/sft" \
  --tasks_dir "runs/$RUN/edge/tasks"

stage eval "4. eval: SFT vs RL on the 360 held-out ladder tasks (test split, 60 per rung)"
$PY eval.py --config recipes/tiny_long/eval.yaml --compare "runs/$RUN/sft" "runs/$RUN/rl" \
  --out-dir "runs/$RUN/eval" --run "$RUN" --wandb
stages_done; echo "report: runs/$RUN/eval/compare.md"
cat "runs/$RUN/eval/compare.md"
