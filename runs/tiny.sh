#!/usr/bin/env bash
# The whole pipeline on a CPU with the embedded tiny model: what `make demo` runs.
# Every stage reads the previous stage's output from runs/$RUN/ and artifacts/.
#   bash runs/tiny.sh              # RUN=tiny-<date-time>
#   RUN=abl1 bash runs/tiny.sh     # another run; compare them in W&B (group = RUN)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-tiny-$(date +%Y%m%d-%H%M%S)}
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
stage() { echo; echo "== $* ($(date +%H:%M:%S))"; }
t0=$(date +%s)

stage "data: code mix, task factory, oracle trajectories (small sizes)"
SIZE=small bash runs/data.sh

stage "base: tokenizer trained on the code mix + a small Llama, random init"
$PY -m nanocomposer.model build --out artifacts/base --corpus artifacts/data/corpus

stage "1. continued pretraining -> runs/$RUN/cpt"
$PY train_cpt.py --config recipes/tiny/cpt.yaml --run "$RUN"

stage "2. tool-call SFT -> runs/$RUN/sft"
$PY train_sft.py --config recipes/tiny/sft.yaml --run "$RUN" --model_name_or_path "runs/$RUN/cpt" \
  --check_tasks artifacts/data/tasks/val

stage "3. GRPO in the harness -> runs/$RUN/rl"
$PY train_rl.py --config recipes/tiny/rl.yaml --run "$RUN" --model_name_or_path "runs/$RUN/sft"

stage "4. eval: base vs CPT vs SFT vs RL on the held-out tasks (val and test projects, never trained on)"
$PY eval.py --compare artifacts/base "runs/$RUN/cpt" "runs/$RUN/sft" "runs/$RUN/rl" \
  --tasks factory:test factory:val --workers 2 --max-turns 8 --max-new-tokens 128 \
  --out-dir "runs/$RUN/eval" --run "$RUN" --wandb

echo; echo "== done in $(( ($(date +%s) - t0) / 60 )) min; report: runs/$RUN/eval/compare.md"
cat "runs/$RUN/eval/compare.md"
