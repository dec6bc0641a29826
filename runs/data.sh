#!/usr/bin/env bash
# Build all data offline: the code mix (CPT), the task factory (RL/eval), expert trajectories (SFT).
#   bash runs/data.sh                 # full sizes
#   SIZE=small bash runs/data.sh      # what `make demo` uses
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-artifacts/data}
SIZE=${SIZE:-full}
# Held-out splits (val/test projects) get HELD_OUT tasks per project and family, so the eval has
# >= 100 held-out tasks; LOCATE sets the train split's locate questions (the first rung of the
# curriculum: a small model can learn to answer them before it can edit).
if [ "$SIZE" = small ]; then
  CORPUS_CHARS=4000000; PER_PROJECT=2; LOCATE=8; HELD_OUT=12; STDLIB=""; VARIANTS=2
else
  CORPUS_CHARS=30000000; PER_PROJECT=6; LOCATE=16; HELD_OUT=12; STDLIB="--stdlib"; VARIANTS=3
fi
export NANOCOMPOSER_PROGRESS=${NANOCOMPOSER_PROGRESS:-1}

echo "== code mix ($CORPUS_CHARS chars) -> $OUT/corpus"
$PY -m data.build_corpus --out "$OUT/corpus" --max-chars "$CORPUS_CHARS" --seed 0 --overwrite

echo "== task factory ($PER_PROJECT per project and family, locate $LOCATE, held-out $HELD_OUT) -> $OUT/tasks"
$PY -m data.build_tasks --out "$OUT/tasks" --per-project "$PER_PROJECT" --per-family "locate=$LOCATE" \
  --held-out-per-project "$HELD_OUT" $STDLIB --seed 0 --workers 2 --overwrite

echo "== expert trajectories (oracle, $VARIANTS variants per task) -> $OUT/sft"
$PY -m data.build_sft --tasks "$OUT/tasks" --out "$OUT/sft" --variants "$VARIANTS" --val-tasks 24 --seed 0 \
  --workers 2 --overwrite
