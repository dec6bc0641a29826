#!/usr/bin/env bash
# Tasks at the edge of a policy's competence, for GRPO: play N train tasks greedily once, then 4 samples each
# at temperature 1 (the RL budgets: the preset's budget.yaml, which its eval and RL recipes both read), and keep
# the tasks that sampling solves sometimes and the greedy policy never (data/select_edge_tasks.py --unsolved-by):
# a gain there must show as a new greedy solve. Both evals resume, so a cut screen goes on where it stopped.
#   bash runs/edge_screen.sh runs/long/sft artifacts/ladder/tasks/train 180 runs/long/edge
#   -> runs/long/edge/{greedy,results}.json, their episodes, and runs/long/edge/tasks (+ manifest.json)
#   GREEDY_FILTER=0 bash runs/edge_screen.sh runs/long/sft TASKS 48 runs/long/edge runs/arm/edge/tasks
# A fifth argument puts the chosen tasks elsewhere (several RL arms share one screen of one SFT model).
# GREEDY_FILTER=0 (default 1) skips the greedy pass and keeps every task that sampling solves sometimes: when
# greedy already solves most tasks in range (a strong SFT model), the filter leaves GRPO almost nothing.
# Exit status 3: the screen ran but no task is at the edge (nothing written to OUT/tasks); any other failure
# is the failing command's own status. Env: EVAL_CONFIG, the eval recipe of the RL recipe's preset
# (runs/smol_long.sh: recipes/smol/eval.yaml; both read recipes/smol/budget.yaml); default
# recipes/tiny_long/eval.yaml (recipes/tiny_long/budget.yaml, the budgets of recipes/tiny_long/rl.yaml). No budget
# is set here: the screen plays under the preset's file, as RL trains.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ $# -ne 4 ] && [ $# -ne 5 ]; then echo "usage: $0 POLICY TASKS N OUT [TASKS_OUT]" >&2; exit 2; fi
policy=$1 tasks=$2 limit=$3 out=$4 tasks_out=${5:-$4/tasks}
mkdir -p "$out"  # eval.py refuses an --output whose directory does not exist (a typo guard)
screen=(eval.py --config "${EVAL_CONFIG:-recipes/tiny_long/eval.yaml}" --policy "$policy" --tasks "$tasks"
        --limit "$limit" --resume --quiet)
unsolved_by=()
if [ "${GREEDY_FILTER:-1}" != 0 ]; then
  $PY "${screen[@]}" --output "$out/greedy.json"
  unsolved_by=(--unsolved-by "$out/greedy.json")
fi
$PY "${screen[@]}" --samples 4 --temperature 1 --output "$out/results.json"
mkdir -p "$(dirname "$tasks_out")"
exec $PY -m data.select_edge_tasks --results "$out/results.episodes.jsonl" --tasks "$tasks" \
  "${unsolved_by[@]}" --out "$tasks_out" --overwrite
