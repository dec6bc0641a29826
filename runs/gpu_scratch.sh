#!/usr/bin/env bash
# The no-hub GPU pipeline: our own tokenizer and a from-scratch 91 M-parameter Llama
# (`nanocomposer.model --preset gpu_scratch`), every stage on one GPU, nothing downloaded.
# Every stage reads the previous stage's output, as in runs/tiny.sh; the task sets and held-out sets are
# the CPU preset's (the task factory with runs/data.sh's SIZE=small flags); only the code mix is larger.
#   RUN=s1 bash runs/gpu_scratch.sh                   # defaults: sized for minutes per stage on an H200
#                                                     # (an estimate: this preset has not yet run on a GPU)
#   CPT_STEPS=100 SFT_STEPS=40 RL_STEPS=2 EVAL_LIMIT=4 bash runs/gpu_scratch.sh   # a smoke run
# Knobs (environment):
#   RUN, RUNS            pipeline run name; outputs in $RUNS/$RUN/            gpu-scratch-<date-time>, runs
#   STAGES               which stages run (comma-separated)                   data,cpt,sft,rl,eval
#   PY                   python                                               .venv/bin/python, else python3
#   DATA                 tasks and SFT trajectories                           artifacts/data (shared with tiny)
#   CORPUS, CORPUS_CHARS the code mix for CPT                                 artifacts/data/corpus-gpu, 30 M chars
#   BASE, BASE_FLAGS     the random-init model and its `model build` flags    artifacts/base-gpu_scratch, --preset gpu_scratch
#   WORKERS              processes for the data builders                      nproc (at most 16)
#   CPT_STEPS SFT_STEPS RL_STEPS                                              600, 300, 8 (the recipes' max_steps)
#   SFT_CHECK_TASKS      tasks of SFT's post-training harness check           $DATA/tasks/val (empty: no check)
#   EVAL_LIMIT           tasks per held-out set in stage 4                    all (561 with the small factory and its ladder)
#   EVAL_BACKEND         eval.py --backend                                    auto (vLLM where installed)
#   TASK_FLAGS SFT_DATA_FLAGS CORPUS_FLAGS   extra data-builder flags (last one wins)
#   TRAIN_FLAGS          extra flags for all three training stages (e.g. --report_to none)
#   CPT_FLAGS SFT_FLAGS RL_FLAGS  extra flags for one stage
#   EVAL_FLAGS           eval.py's extra flags                                --wandb (set it empty for none)
# Generation in RL and the SFT check uses transformers in the trainer process (rollout_workers 0); with
# vLLM installed, RL_FLAGS="--generation_backend vllm --use_vllm true --vllm_mode colocate" generates there.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
RUN=${RUN:-gpu-scratch-$(date +%Y%m%d-%H%M%S)}
RUNS=${RUNS:-runs}
OUT_DIR="$RUNS/$RUN"
STAGES=",${STAGES:-data,cpt,sft,rl,eval},"
DATA=${DATA:-artifacts/data}
CORPUS=${CORPUS:-artifacts/data/corpus-gpu}
CORPUS_CHARS=${CORPUS_CHARS:-30000000}
BASE=${BASE:-artifacts/base-gpu_scratch}
BASE_FLAGS=${BASE_FLAGS:---preset gpu_scratch}
WORKERS=${WORKERS:-$(n=$(nproc); echo $((n > 16 ? 16 : n)))}
CPT_STEPS=${CPT_STEPS:-600}
SFT_STEPS=${SFT_STEPS:-300}
RL_STEPS=${RL_STEPS:-8}
EVAL_BACKEND=${EVAL_BACKEND:-auto}
SFT_CHECK_TASKS=${SFT_CHECK_TASKS-$DATA/tasks/val}
for name in ${STAGES//,/ }; do
  case "$name" in data|cpt|sft|rl|eval) ;; *) echo "runs/gpu_scratch.sh: unknown stage '$name' in STAGES (known: data,cpt,sft,rl,eval)" >&2; exit 2 ;; esac
done
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
stage() { echo; echo "== $* ($(date +%H:%M:%S))"; }
wanted() { [[ "$STAGES" == *",$1,"* ]]; }
t0=$(date +%s)

if wanted data; then
  stage "data: code mix ($CORPUS_CHARS chars) -> $CORPUS"
  $PY -m data.build_corpus --out "$CORPUS" --max-chars "$CORPUS_CHARS" --seed 0 --overwrite ${CORPUS_FLAGS:-}

  # runs/data.sh's SIZE=small task factory, its ladder included: the same train/val/test tasks as the CPU preset.
  stage "data: task factory -> $DATA/tasks"
  $PY -m data.build_tasks --out "$DATA/tasks" --per-project 2 --held-out-per-project 12 --ladder 20 \
    --ladder-held-out 30 --seed 0 --workers "$WORKERS" --overwrite ${TASK_FLAGS:-}

  stage "data: oracle trajectories -> $DATA/sft"
  $PY -m data.build_sft --tasks "$DATA/tasks" --out "$DATA/sft" --variants 2 --val-tasks 24 --seed 0 \
    --workers "$WORKERS" --budget recipes/gpu_scratch/budget.yaml --overwrite ${SFT_DATA_FLAGS:-}

  stage "base: tokenizer trained on the code mix + a from-scratch Llama ($BASE_FLAGS) -> $BASE"
  TOKENIZERS_PARALLELISM=true $PY -m nanocomposer.model build --out "$BASE" --corpus "$CORPUS" $BASE_FLAGS \
    | { grep -E '^\| (parameters|hidden|vocab)' || true; }
fi

if wanted cpt; then
  stage "1. pretraining from scratch on the code mix, $CPT_STEPS steps -> $OUT_DIR/cpt"
  $PY train_cpt.py --config recipes/gpu_scratch/cpt.yaml --run "$RUN" --runs_dir "$RUNS" \
    --model_name_or_path "$BASE" --dataset_path "$CORPUS" --max_steps "$CPT_STEPS" ${TRAIN_FLAGS:-} ${CPT_FLAGS:-}
fi

if wanted sft; then
  stage "2. tool-call SFT, $SFT_STEPS steps -> $OUT_DIR/sft"
  $PY train_sft.py --config recipes/gpu_scratch/sft.yaml --run "$RUN" --runs_dir "$RUNS" \
    --model_name_or_path "$OUT_DIR/cpt" --dataset_path "$DATA/sft/dataset" \
    ${SFT_CHECK_TASKS:+--check_tasks "$SFT_CHECK_TASKS"} --max_steps "$SFT_STEPS" ${TRAIN_FLAGS:-} ${SFT_FLAGS:-}
fi

if wanted rl; then
  stage "3. GRPO in the harness, $RL_STEPS steps -> $OUT_DIR/rl"
  $PY train_rl.py --config recipes/gpu_scratch/rl.yaml --run "$RUN" --runs_dir "$RUNS" \
    --model_name_or_path "$OUT_DIR/sft" --tasks_dir "$DATA/tasks/train" --max_steps "$RL_STEPS" \
    ${TRAIN_FLAGS:-} ${RL_FLAGS:-}
fi

if wanted eval; then
  # --workers: live episodes in this one process (threads), their turns generated as one batch; the budgets
  # are the preset's (recipes/gpu_scratch/budget.yaml, which RL and the SFT check read too).
  stage "4. eval: base vs CPT vs SFT vs RL on the held-out tasks (val and test projects, never trained on)"
  $PY eval.py --compare "$BASE" "$OUT_DIR/cpt" "$OUT_DIR/sft" "$OUT_DIR/rl" \
    --tasks factory:test factory:val --tasks-root "$DATA/tasks" ${EVAL_LIMIT:+--limit "$EVAL_LIMIT"} \
    --workers "${EVAL_WORKERS:-64}" --backend "$EVAL_BACKEND" --budget recipes/gpu_scratch/budget.yaml \
    --out-dir "$OUT_DIR/eval" --run "$RUN" ${EVAL_FLAGS---wandb}
  echo; echo "== report: $OUT_DIR/eval/compare.md"
  cat "$OUT_DIR/eval/compare.md"
fi
echo; echo "== stages ${STAGES:1:-1} done in $(( $(date +%s) - t0 )) s"
