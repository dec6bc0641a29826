#!/usr/bin/env bash
# Build all data offline: the code mix (CPT), the task factory (RL/eval), expert trajectories (SFT).
#   bash runs/data.sh                 # full sizes
#   SIZE=small bash runs/data.sh      # what `make demo` uses
# Env: OUT (default artifacts/data), WORKERS (builders' parallel episodes/processes; default the cores, at
# most 16), BUDGET (a preset's budget.yaml the oracle episodes are played under; default Budget's),
# SFT_VERIFY (a tokenizer dir or hub id whose chat template must render every SFT row to harness-valid calls),
# TASK_FLAGS / SFT_DATA_FLAGS (extra builder flags; last one wins).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-artifacts/data}
SIZE=${SIZE:-full}
# Held-out splits (val/test projects) get HELD_OUT tasks per project and family, so the eval has
# >= 100 held-out tasks without growing the training data. A curriculum can weight families in the
# train split with `data.build_tasks --per-family locate=8` (measured: no gain at the tiny scale, README).
# The task ladder (data/families/ladder.py, tier `ladder`): LADDER tasks per rung in train, LADDER_HELD_OUT
# per rung in val and in test (6 rungs: 2 x 6 x 30 = 360 held-out ladder tasks; eval `factory:test/ladder`).
if [ "$SIZE" = small ]; then
  CORPUS_CHARS=4000000; PER_PROJECT=2; HELD_OUT=12; STDLIB=""; VARIANTS=2; LADDER=20; LADDER_HELD_OUT=30
else
  CORPUS_CHARS=30000000; PER_PROJECT=6; HELD_OUT=12; STDLIB="--stdlib"; VARIANTS=3; LADDER=60; LADDER_HELD_OUT=30
fi
WORKERS=${WORKERS:-$(n=$(nproc); echo $((n > 16 ? 16 : n)))}
export NANOCOMPOSER_PROGRESS=${NANOCOMPOSER_PROGRESS:-1}

echo "== code mix ($CORPUS_CHARS chars) -> $OUT/corpus"
$PY -m data.build_corpus --out "$OUT/corpus" --max-chars "$CORPUS_CHARS" --seed 0 --overwrite

echo "== task factory ($PER_PROJECT per project and family, $HELD_OUT in held-out projects;" \
  "ladder $LADDER per rung in train, $LADDER_HELD_OUT in val and test) -> $OUT/tasks"
$PY -m data.build_tasks --out "$OUT/tasks" --per-project "$PER_PROJECT" --held-out-per-project "$HELD_OUT" \
  --ladder "$LADDER" --ladder-held-out "$LADDER_HELD_OUT" $STDLIB --seed 0 --workers "$WORKERS" --overwrite \
  ${TASK_FLAGS:-}

echo "== expert trajectories (oracle, $VARIANTS variants per task) -> $OUT/sft"
$PY -m data.build_sft --tasks "$OUT/tasks" --out "$OUT/sft" --variants "$VARIANTS" --val-tasks 24 --seed 0 \
  --workers "$WORKERS" --overwrite ${BUDGET:+--budget "$BUDGET"} ${SFT_VERIFY:+--verify-template "$SFT_VERIFY"} \
  ${SFT_DATA_FLAGS:-}
