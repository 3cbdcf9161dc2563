# The two Quick start commands: `make demo` and `make test`. Each creates the environment first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-fast env r prometheus lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --constraint constraints.txt --editable '.[dev]'
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	$(BIN)/quarry demo

# Everything, the slow tier included. Tests that need R or Prometheus are skipped, in one
# line, where Rscript or prometheus is missing (`make r`, `make prometheus` install them; CI
# does so first).
test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The inner loop: every test but those marked slow.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

# R and reticulate from Debian's packages (needs root or sudo), for examples/r and its test.
r:
	bash scripts/install-r.sh

# Prometheus from Debian's packages (needs root or sudo), for the test that has a real
# Prometheus scrape a local cluster (skipped, in one line, where `prometheus` is missing).
prometheus:
	bash scripts/install-prometheus.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) .pytest_cache
