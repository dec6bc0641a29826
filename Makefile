# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY_BASE ?= python3.11
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

export WANDB_MODE ?= offline
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-all test-sandbox-user data bench lint clean

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
	@$(MAKE) --no-print-directory test-sandbox-user

# The sandbox promises different things to root and to a normal user (env/sandbox.py docstring), so
# its tests also run as an unprivileged user, made here if missing. When the venv's interpreter is
# out of that user's reach (a Python under /root), the system Python of the same version runs them
# with the venv's site-packages on PYTHONPATH. Nothing is written into the checkout.
SANDBOX_TEST_USER ?= nanotest
SANDBOX_TESTS     := tests/test_sandbox.py tests/test_sandbox_attacks.py
test-sandbox-user: $(STAMP)
	@set -eu; \
	if [ "$$(id -u)" != 0 ]; then echo "test-sandbox-user: not root, so the main suite already ran them as a normal user"; exit 0; fi; \
	id -u $(SANDBOX_TEST_USER) >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin $(SANDBOX_TEST_USER); \
	as_user="runuser -u $(SANDBOX_TEST_USER) --"; \
	for f in $(SANDBOX_TESTS) env/sandbox.py; do $$as_user test -r "$$f" || { echo "test-sandbox-user: $(SANDBOX_TEST_USER) cannot read $(CURDIR)/$$f" >&2; exit 1; }; done; \
	py="$(PY)"; pythonpath=""; \
	if ! $$as_user "$(PY)" -c pass 2>/dev/null; then \
	  version=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  py=$$(command -v "/usr/bin/python$$version" || true); \
	  pythonpath=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  [ -n "$$py" ] || { echo "test-sandbox-user: $(SANDBOX_TEST_USER) cannot run $(PY) and there is no /usr/bin/python$$version" >&2; exit 1; }; \
	  $$as_user test -r "$$pythonpath/pytest/__init__.py" || { echo "test-sandbox-user: $(SANDBOX_TEST_USER) cannot read $$pythonpath" >&2; exit 1; }; \
	fi; \
	tmp=$$(mktemp -d); chown $(SANDBOX_TEST_USER) "$$tmp"; trap 'rm -rf "$$tmp"' EXIT; \
	echo "running $(SANDBOX_TESTS) as $(SANDBOX_TEST_USER) with $$py"; \
	$$as_user env HOME="$$tmp" TMPDIR="$$tmp" PYTHONPATH="$$pythonpath" PYTHONDONTWRITEBYTECODE=1 \
	  PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$$py" -m pytest -q -p no:cacheprovider -rs --basetemp="$$tmp/pytest" $(SANDBOX_TESTS)

bench: $(STAMP)
	$(PY) -m bench.harness

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs/*/ .pytest_cache
