#!/usr/bin/env bash
# The whole pipeline on a CPU with the tiny model trained from random weights (5.3 M parameters): the fast
# path, and the "no pretraining" arm of ablations. `make demo` runs runs/smol.sh, on the pretrained base.
# Every stage reads the previous stage's output from runs/$RUN/ and artifacts/, and its episode budgets from
# recipes/tiny/budget.yaml (the SFT data, the SFT check, GRPO and eval).
#   bash runs/tiny.sh              # RUN=tiny-<date-time>
#   RUN=abl1 bash runs/tiny.sh     # another run; compare them in W&B (group = RUN)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-tiny-$(date +%Y%m%d-%H%M%S)}
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
source runs/stages.sh

stage data "data: code mix, task factory, oracle trajectories (small sizes, the preset's budgets)"
SIZE=small BUDGET=recipes/tiny/budget.yaml bash runs/data.sh

stage base "base: tokenizer trained on the code mix + a small Llama, random init"
$PY -m nanocomposer.model build --out artifacts/base --corpus artifacts/data/corpus

train_chain tiny  # stages cpt, sft, rl (runs/stages.sh)

stage eval "4. eval: SFT vs RL on the held-out test split (projects and ladder seeds never trained on or checked during training)"
# Only checkpoints that can call tools are played: the base and CPT rows are their held-out code loss and
# in-context copy accuracy (the model card runs/$RUN/cpt/README.md and W&B), not 500 episodes of no_tool_call.
$PY eval.py --config recipes/tiny/eval.yaml --compare "runs/$RUN/sft" "runs/$RUN/rl" --workers 8 \
  --out-dir "runs/$RUN/eval" --run "$RUN" --wandb

stages_done; echo "report: runs/$RUN/eval/compare.md"
cat "runs/$RUN/eval/compare.md"
