# `make demo` and `make test` do all setup: they create .venv when missing and install into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test test-fast test-slow bench bench-quick clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: install
	$(BIN)/energon-nemotron demo

# The default run (not slow), then the slow tests.
test: install
	$(BIN)/python -m pytest -q
	$(BIN)/python -m pytest -q -m slow

test-fast: install
	$(BIN)/python -m pytest -q -x

test-slow: install
	$(BIN)/python -m pytest -q -m slow

bench: install
	$(BIN)/python benchmarks/run_all.py

bench-quick: install
	$(BIN)/python benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
