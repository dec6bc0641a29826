#!/usr/bin/env bash
# On a lent GPU: batched vLLM generation against one request at a time on the same checkpoint and the same
# harness prompts (tokens/s, turns/s), and greedy token identity of the vLLM and transformers backends.
#
#   OUT=/path bash runs/gpu_check.sh [CHECKPOINT]   # a merged checkpoint; none: a random model of the demo's shape
#   OUT=/path bash runs/gpu_check.sh --dry-run [CHECKPOINT]   # CPU: the transformers half, micro model (CI)
#
# Needs CUDA and vllm (a clear error otherwise). Results under $OUT (default runs/gpu_check):
# generation_vllm.json (bench.generation's measurements and the backend identity report) and gpu_check.log.
# Budget: under 8 minutes (engine start ~1-2 min, oracle episodes for the prompts, three passes, identity).
# Env: PY (python), DTYPE (the dtype of the copy both backends run; default bfloat16),
# BATCHES (default 1,8,32), PROMPTS (default 64), MAX_NEW_TOKENS (default 128), IDENTITY_PROMPTS (default 8).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-runs/gpu_check}
DRY_RUN=0
CHECKPOINT=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $arg (expected --dry-run or a checkpoint directory)" >&2; exit 2 ;;
    *) [ -z "$CHECKPOINT" ] || { echo "gpu_check.sh: one checkpoint at most (got $CHECKPOINT and $arg)" >&2; exit 2; }
       CHECKPOINT=$arg ;;
  esac
done
if [ -n "$CHECKPOINT" ] && [ ! -f "$CHECKPOINT/config.json" ]; then
  echo "gpu_check.sh: checkpoint $CHECKPOINT: no config.json (give a merged from_pretrained directory)" >&2
  exit 2
fi
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=disabled
stamp() { echo "== $* ($(date +%H:%M:%S))" | tee -a "$LOG"; }

if [ "$DRY_RUN" = 1 ]; then
  # The plumbing of the GPU run, on CPU: prompts from oracle episodes, batched vs alone, JSON out.
  stamp "dry run: transformers backend on CPU"
  if [ -z "$CHECKPOINT" ]; then
    CHECKPOINT="$OUT/micro"
    [ -f "$CHECKPOINT/config.json" ] || BUILD=(--build-random "$CHECKPOINT" --micro)
  fi
  "$PY" -m bench.generation --checkpoint "$CHECKPOINT" ${BUILD[@]+"${BUILD[@]}"} --backend transformers \
    --batch 1,2 --prompts 2 --max-new-tokens 4 --threads 1 --device cpu \
    --json "$OUT/generation_transformers.json" 2>&1 | tee -a "$LOG"
  stamp "dry run done: $OUT/generation_transformers.json"
  exit 0
fi

stamp "checks: CUDA and vllm"
set +e
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib.util
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA device here (torch.cuda.is_available() is False); "
             "on a CPU machine run: bash runs/gpu_check.sh --dry-run")
if importlib.util.find_spec("vllm") is None:
    sys.exit("gpu_check.sh: vllm is not installed (pip install -r requirements-gpu.txt on the GPU machine)")
import vllm

print(f"torch {torch.__version__}, vllm {vllm.__version__}, {torch.cuda.get_device_name(0)}")
EOF
check=${PIPESTATUS[0]}
set -e
[ "$check" = 0 ] || exit 3

BUILD=()
if [ -z "$CHECKPOINT" ]; then
  CHECKPOINT="$OUT/rand5m"
  [ -f "$CHECKPOINT/config.json" ] || BUILD=(--build-random "$CHECKPOINT")
  stamp "no checkpoint given: a random-weight model of the demo's shape ($CHECKPOINT); speed only"
fi
# Both backends in one dtype: vLLM serves an fp32 checkpoint in bf16 while transformers loads it as saved, so
# the check runs a bf16 copy by default (DTYPE=float32 keeps fp32 on both only where vLLM accepts it).
DTYPE_ARGS=(--dtype "${DTYPE:-bfloat16}")
# vLLM takes half the GPU; the transformers copy for the identity check needs little.
export NANOCOMPOSER_VLLM_GPU_MEMORY=${NANOCOMPOSER_VLLM_GPU_MEMORY:-0.5}
stamp "vLLM: batched vs one at a time; greedy identity with transformers"
set +e
timeout 420 "$PY" -m bench.generation --checkpoint "$CHECKPOINT" ${BUILD[@]+"${BUILD[@]}"} \
  ${DTYPE_ARGS[@]+"${DTYPE_ARGS[@]}"} --backend vllm --device cuda --batch "${BATCHES:-1,8,32}" \
  --prompts "${PROMPTS:-64}" --max-new-tokens "${MAX_NEW_TOKENS:-128}" \
  --check-backends "${IDENTITY_PROMPTS:-8}" --json "$OUT/generation_vllm.json" 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
set -e
case "$status" in
  0) stamp "done: $OUT/generation_vllm.json" ;;
  124) stamp "FAILED: the vLLM run took over 420 s" ;;
  *) stamp "FAILED (exit $status): see $LOG" ;;
esac
exit "$status"
