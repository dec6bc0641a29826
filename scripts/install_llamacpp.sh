#!/usr/bin/env bash
# llama.cpp's OpenAI-compatible server (llama-cpp-python[server], built from source: PyPI has no wheel) for
# bench/openai_server.py and tests/test_openai_llamacpp.py, which skip without it. Not a `make install` step: on
# 2 cores the build takes ~15-25 minutes. Installs into $PYTHON's environment (default: the project's .venv).
#     bash scripts/install_llamacpp.sh                 # or PYTHON=/path/to/venv/bin/python bash scripts/...
set -euo pipefail
PYTHON="${PYTHON:-.venv/bin/python}"
VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
# One compile job at a low priority: the machine is shared; no tests or examples of llama.cpp are built.
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-1}"
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
nice -n 19 "$PYTHON" -m pip install "llama-cpp-python[server]==$VERSION"
"$PYTHON" -c "import llama_cpp.server.app; print('llama-cpp-python', __import__('llama_cpp').__version__, 'ok')"
