#!/usr/bin/env bash
# The single-GPU recipe with real open models (Qwen2.5-Coder). Same scripts as runs/tiny.sh;
# only the recipes change. Needs the models in the HF cache (or set HF_HUB_OFFLINE=0 where the
# hub is reachable) and `pip install vllm` for colocated generation in RL.
#   RUN=r1 bash runs/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-gpu-$(date +%Y%m%d-%H%M%S)}
export WANDB_MODE=${WANDB_MODE:-offline} TOKENIZERS_PARALLELISM=false
stage() { echo; echo "== $* ($(date +%H:%M:%S))"; }

stage "data: full sizes (code mix, task factory with stdlib modules, oracle trajectories)"
SIZE=full bash runs/data.sh

# Stage 1 trains the *base* coder model on the code mix and reports held-out code loss before and
# after; the recipe's finding (better pretraining loss -> better RL) is tested by starting SFT
# from it: --model_name_or_path runs/$RUN/cpt in stage 2.
stage "1. continued pretraining of Qwen2.5-Coder-0.5B (base) -> runs/$RUN/cpt"
$PY train_cpt.py --config recipes/gpu/cpt.yaml --run "$RUN"

# Stage 2 starts from the instruct model (LoRA, merged on save): it already follows chat turns,
# SFT teaches our harness's tools and its habits (parallel reads, tests before submit).
stage "2. tool-call SFT of Qwen2.5-Coder-1.5B-Instruct with LoRA -> runs/$RUN/sft"
$PY train_sft.py --config recipes/gpu/sft.yaml --run "$RUN" --check_tasks artifacts/data/tasks/val

stage "3. GRPO in the harness, vLLM colocated -> runs/$RUN/rl"
$PY train_rl.py --config recipes/gpu/rl.yaml --run "$RUN" --model_name_or_path "runs/$RUN/sft"

stage "4. eval: instruct vs SFT vs RL on held-out tasks and HumanEval"
$PY eval.py --compare Qwen/Qwen2.5-Coder-1.5B-Instruct "runs/$RUN/sft" "runs/$RUN/rl" \
  --tasks factory:test humaneval --workers 4 --out-dir "runs/$RUN/eval" --run "$RUN" --wandb
cat "runs/$RUN/eval/compare.md"
