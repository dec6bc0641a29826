#!/usr/bin/env bash
# The single-GPU recipe with a real open model, as one chain: each stage starts from the previous stage's
# output, like runs/tiny.sh, and on the same task sets and held-out sets (the task factory of
# `SIZE=small runs/data.sh`); only the model and the code mix for CPT are larger.
#   Qwen2.5-Coder-1.5B (base) -> 1. CPT on the code mix (full weights) -> 2. tool-call SFT (LoRA, merged)
#   -> 3. GRPO in the harness (LoRA, merged; vLLM colocated) -> 4. eval of all four on the held-out tasks
# Needs: the model in the HF cache or a reachable hub (HF_HUB_OFFLINE unset), `pip install vllm`, and one
# 80 GB GPU (full-weight CPT of 1.5 B parameters: fp32 weights + AdamW ~25 GB, plus activations).
#   RUN=r1 bash runs/gpu.sh
#   MODEL=Qwen/Qwen2.5-Coder-0.5B RUN=r05 bash runs/gpu.sh      # a smaller GPU
# The no-hub variant (our tokenizer, a from-scratch 91 M Llama, minutes on one H200): runs/gpu_scratch.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-gpu-$(date +%Y%m%d-%H%M%S)}
MODEL=${MODEL:-Qwen/Qwen2.5-Coder-1.5B}
CORPUS=${CORPUS:-artifacts/data/corpus-gpu}
CORPUS_CHARS=${CORPUS_CHARS:-30000000}
export WANDB_MODE=${WANDB_MODE:-offline} TOKENIZERS_PARALLELISM=false
stage() { echo; echo "== $* ($(date +%H:%M:%S))"; }
t0=$(date +%s)

stage "data: the CPU preset's tasks and oracle trajectories (runs/data.sh SIZE=small)"
SIZE=small bash runs/data.sh

stage "data: a $CORPUS_CHARS-character code mix for CPT -> $CORPUS"
$PY -m data.build_corpus --out "$CORPUS" --max-chars "$CORPUS_CHARS" --seed 0 --overwrite

# Stage 1 trains the *base* coder model on the code mix and reports held-out code loss before and after.
stage "1. continued pretraining of $MODEL -> runs/$RUN/cpt"
$PY train_cpt.py --config recipes/gpu/cpt.yaml --run "$RUN" --model_name_or_path "$MODEL" --dataset_path "$CORPUS"

# Stage 2 teaches the CPT model the harness's chat turns, tools and habits (parallel reads, tests before
# submit); the recipe makes <|im_end|> its end of turn, which the base model's tokenizer does not.
stage "2. tool-call SFT of the CPT model with LoRA -> runs/$RUN/sft"
$PY train_sft.py --config recipes/gpu/sft.yaml --run "$RUN" --model_name_or_path "runs/$RUN/cpt" \
  --check_tasks artifacts/data/tasks/val

stage "3. GRPO in the harness from the SFT model, vLLM colocated -> runs/$RUN/rl"
$PY train_rl.py --config recipes/gpu/rl.yaml --run "$RUN" --model_name_or_path "runs/$RUN/sft"

# The held-out sets of runs/tiny.sh, with the episode budgets RL trained under (recipes/gpu/rl.yaml), plus
# HumanEval (external, never trained on). --workers 1: one process holds the GPU (vLLM's engine, or
# transformers: eval.py's worker pool forks, and a forked child cannot use CUDA).
stage "4. eval: base vs CPT vs SFT vs RL on the held-out tasks (val and test projects) and HumanEval"
$PY eval.py --compare "$MODEL" "runs/$RUN/cpt" "runs/$RUN/sft" "runs/$RUN/rl" \
  --tasks factory:test factory:val humaneval --workers 1 --max-turns 20 --max-new-tokens 512 \
  --out-dir "runs/$RUN/eval" --run "$RUN" --wandb

echo; echo "== done in $(( ($(date +%s) - t0) / 60 )) min; report: runs/$RUN/eval/compare.md"
cat "runs/$RUN/eval/compare.md"
