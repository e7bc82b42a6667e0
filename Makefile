# `make demo` and `make test` do all setup: they create .venv when missing and install into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Reference code the tests compare against, never imported by the library: the transformers
# processors in their own environment (they need torchvision, which cannot sit beside the CPU torch
# of .venv), and the wheels of Megatron-Bridge and of the megatron-core it needs unpacked into a
# cache (code only, nothing installed; the tests import them in subprocesses).
REF_VENV ?= .venv-ref
REF_STAMP := $(REF_VENV)/.installed-stamp
REF_CACHE ?= .cache/references
BRIDGE_STAMP := $(REF_CACHE)/megatron_bridge-0.6.2/.fetched
MCORE_STAMP := $(REF_CACHE)/megatron_core-0.19.2/.fetched
FETCH_WHEEL := PYTHON=$(BIN)/python bash tests/references/fetch_wheel.sh $(REF_CACHE)

.PHONY: install references demo test test-fast test-slow bench bench-quick clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

references: $(REF_STAMP) $(BRIDGE_STAMP) $(MCORE_STAMP)

$(REF_STAMP):
	@test -x $(REF_VENV)/bin/python || $(PYTHON) -m venv $(REF_VENV)
	$(REF_VENV)/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 pillow av numpy
	@touch $(REF_STAMP)

$(BRIDGE_STAMP): | $(STAMP)
	$(FETCH_WHEEL) megatron-bridge 0.6.2 megatron_bridge-0.6.2-py3-none-any.whl \
	    bcb7274ab9327167c345aa24b96b95790ce5090df1945d883bdc41065d5649e2 \
	    megatron/bridge/models/nemotron_vl/nemotron_vl_utils.py

$(MCORE_STAMP): | $(STAMP)
	$(FETCH_WHEEL) megatron-core 0.19.2 megatron_core-0.19.2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl \
	    8e3e486f13f559450415b9b9dc0ff3331a0bb83dd154553f7f350a75ff9c42b5 \
	    megatron/core/models/multimodal/llava_model.py

demo: install
	$(BIN)/energon-nemotron demo

# The default run (not slow), then the slow tests.
test: install references
	$(BIN)/python -m pytest -q
	$(BIN)/python -m pytest -q -m slow

test-fast: install references
	$(BIN)/python -m pytest -q -x

test-slow: install references
	$(BIN)/python -m pytest -q -m slow

bench: install references
	$(BIN)/python benchmarks/run_all.py

bench-quick: install references
	$(BIN)/python benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) $(REF_VENV) .cache build dist *.egg-info .pytest_cache
