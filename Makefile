# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY_BASE ?= python3.11
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

export WANDB_MODE ?= offline
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-all data bench lint clean

$(STAMP): requirements.txt
	@bash scripts/install_system.sh
	@test -x $(PY) || $(PY_BASE) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	bash runs/tiny.sh

data: $(STAMP)
	bash runs/data.sh

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) -m bench.harness

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs/*/ .pytest_cache
