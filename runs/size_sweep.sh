#!/usr/bin/env bash
# Model size sweep for the CPU preset: the same short CPT (the tiny_long recipe: copy warm-up, then the
# copy-rich code mix) from bases of different depth, width and vocabulary, then one table of held-out code
# loss, in-context copy accuracy and seconds per step (python -m bench.size_sweep).
#   bash runs/size_sweep.sh                        # every size below, 1,500 steps each (~80 min on 2 cores)
#   SIZES="L4-W256 L4-W256-H8" STEPS=600 bash runs/size_sweep.sh     # L<layers>-W<width>[-H<heads>][-V<vocab>]
# Needs artifacts/data/{corpus,copy_corpus_dense} (runs/data.sh). Results: runs/size-<name>/cpt, and
# runs/size_sweep.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-1500}
WARMUP=${WARMUP:-500}   # copy warm-up steps (repeated random runs): copying formed by ~500 in the full recipe
SIZES=${SIZES:-"L4-W256 L2-W256 L8-W256 L4-W384 L4-W256-V4096 L4-W256-H8"}
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

runs=()
for size in $SIZES; do
  # L<layers>-W<width>[-H<heads>][-V<vocab>]; by default heads of 64 dimensions and the tiny vocabulary
  [[ $size =~ ^L([0-9]+)-W([0-9]+)(-H([0-9]+))?(-V([0-9]+))?$ ]] || { echo "bad size $size" >&2; exit 2; }
  layers=${BASH_REMATCH[1]} width=${BASH_REMATCH[2]} heads=${BASH_REMATCH[4]:-$((BASH_REMATCH[2] / 64))}
  vocab=${BASH_REMATCH[6]:-8192}
  base="artifacts/size_sweep/$size"
  echo; echo "== $size: $layers layers, width $width, $heads heads, vocab $vocab ($(date +%H:%M:%S))"
  [ -f "$base/config.json" ] || $PY -m nanocomposer.model build --out "$base" --corpus artifacts/data/corpus \
    --layers "$layers" --hidden "$width" --heads "$heads" --vocab-size "$vocab"
  # a size that fails (out of memory, a bad shape) is reported in the table's "Skipped" lines; the others run
  $PY train_cpt.py --config recipes/tiny_long/cpt.yaml --run "size-$size" --model_name_or_path "$base" \
    --max_steps "$STEPS" --copy_warmup_steps "$WARMUP" --eval_steps 500 --save_steps "$STEPS" --save_total_limit 1 \
    || echo "== $size: train_cpt.py failed (exit $?)" >&2
  runs+=("runs/size-$size/cpt")
done
$PY -m bench.size_sweep "${runs[@]}" --out runs/size_sweep.md
cat runs/size_sweep.md
