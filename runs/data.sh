#!/usr/bin/env bash
# Build all data offline: the code mix (CPT), the task factory (RL/eval), expert trajectories (SFT).
#   bash runs/data.sh                 # full sizes
#   SIZE=small bash runs/data.sh      # what `make demo` uses
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-artifacts/data}
SIZE=${SIZE:-full}
if [ "$SIZE" = small ]; then
  CORPUS_CHARS=4000000; PER_PROJECT=2; STDLIB=""; VARIANTS=2
else
  CORPUS_CHARS=30000000; PER_PROJECT=6; STDLIB="--stdlib"; VARIANTS=3
fi
export NANOCOMPOSER_PROGRESS=${NANOCOMPOSER_PROGRESS:-1}

echo "== code mix ($CORPUS_CHARS chars) -> $OUT/corpus"
$PY -m data.build_corpus --out "$OUT/corpus" --max-chars "$CORPUS_CHARS" --seed 0 --overwrite

echo "== task factory ($PER_PROJECT per project and family) -> $OUT/tasks"
$PY -m data.build_tasks --out "$OUT/tasks" --per-project "$PER_PROJECT" $STDLIB --seed 0 --workers 2 --overwrite

echo "== expert trajectories (oracle, $VARIANTS variants per task) -> $OUT/sft"
$PY -m data.build_sft --tasks "$OUT/tasks" --out "$OUT/sft" --variants "$VARIANTS" --seed 0 --workers 2 --overwrite
