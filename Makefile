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

# The Megatron-Bridge stack pins transformers<=5.12.1: the suite also runs against that and the lowest
# versions the project claims for its other direct dependencies (torch stays 2.13: PyPI has no CPU
# build of older ones). `make test-compat` runs the whole default suite there; `make test` runs
# COMPAT_TESTS, the tests of the code those packages reach, to stay within its time.
COMPAT_VENV ?= .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.installed-stamp
COMPAT_PINS := transformers==5.12.1 tokenizers==0.22.1 numpy==1.26.4 pillow==10.0.1 av==18.0.0 \
    pydantic==2.5.0 pyyaml==6.0.1 tqdm==4.67.1 webdataset==1.0.2 librosa==0.11.0
COMPAT_TESTS ?= tests
# what `make test` runs in .venv-compat: tokenization, chat templates, cookers, options, media
# decoding and features, the Energon path end to end, and the Megatron-Bridge checks
COMPAT_IN_TEST := tests/test_energon_tokenization.py tests/test_cookers.py tests/test_config.py \
    tests/test_media_image.py tests/test_media_audio.py tests/test_media_video.py tests/test_video_rotation.py \
    tests/test_video_sampling.py tests/test_energon_media.py tests/test_audio_model_counts.py \
    tests/test_megatron_parity.py tests/test_assemble.py tests/test_bridge_presets.py tests/test_megatron_bridge.py \
    tests/test_openai_tools.py

.PHONY: install references test-deps demo lint docs test test-fast test-slow test-compat bench bench-quick clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,ray,docs]'
	@touch $(STAMP)

$(COMPAT_STAMP): pyproject.toml Makefile
	@test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(COMPAT_VENV)/bin/python -m pip install --quiet -e '.[dev,librosa,docs]' $(COMPAT_PINS)
	@touch $(COMPAT_STAMP)

references: $(REF_STAMP) $(BRIDGE_STAMP) $(MCORE_STAMP)

$(REF_STAMP): Makefile
	@test -x $(REF_VENV)/bin/python || $(PYTHON) -m venv $(REF_VENV)
	$(REF_VENV)/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 pillow av numpy \
	    soundfile==0.14.0 soxr==1.1.0
	@touch $(REF_STAMP)

$(BRIDGE_STAMP): | $(STAMP)
	$(FETCH_WHEEL) megatron-bridge 0.6.2 megatron_bridge-0.6.2-py3-none-any.whl \
	    bcb7274ab9327167c345aa24b96b95790ce5090df1945d883bdc41065d5649e2 \
	    megatron/bridge/models/nemotron_vl/nemotron_vl_utils.py

$(MCORE_STAMP): | $(STAMP)
	$(FETCH_WHEEL) megatron-core 0.19.2 megatron_core-0.19.2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl \
	    8e3e486f13f559450415b9b9dc0ff3331a0bb83dd154553f7f350a75ff9c42b5 \
	    megatron/core/models/multimodal/llava_model.py

# System packages the tests need (Debian's): Chromium renders the preview page headless
# (tests/test_html_preview.py); installed only when missing.
test-deps:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y --no-install-recommends chromium; }

demo: install
	$(BIN)/energon-nemotron demo

# The layers of the package (import-linter contracts in pyproject.toml; tests/test_layout.py finds
# cycles inside a layer), the size rule of its functions (ruff: <= 60 statements, <= 8 parameters) and pyflakes.
lint: install
	$(BIN)/lint-imports
	$(BIN)/ruff check energon_nemotron

# The default run (not slow), then the slow tests; two pytest processes, each taking whole files
# (the tests wait on worker processes much of the time, so two share the machine's cores well).
PYTEST_PARALLEL ?= -n 2 --dist loadfile
PYTEST_REPORT ?= --durations=15
test: install references test-deps lint
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_REPORT)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_PARALLEL) $(PYTEST_REPORT)
	$(MAKE) test-compat COMPAT_TESTS="$(COMPAT_IN_TEST)"

test-compat: install references $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -c "import transformers, tokenizers, numpy, PIL, av, pydantic; print('compat:', \
	    'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'numpy', numpy.__version__, \
	    'pillow', PIL.__version__, 'av', av.__version__, 'pydantic', pydantic.VERSION)"
	$(COMPAT_VENV)/bin/python -m pytest -q -m "not slow and not omni_reference" $(PYTEST_PARALLEL) $(COMPAT_TESTS)

test-fast: install references
	$(BIN)/python -m pytest -q -x

test-slow: install references test-deps
	$(BIN)/python -m pytest -q -m slow

bench: install references
	$(BIN)/python benchmarks/run_all.py

bench-quick: install references
	$(BIN)/python benchmarks/run_all.py --quick

# The documentation (docs/*.md through MyST) as HTML in build/docs, every warning an error;
# tests/test_docs.py runs the same build and every example of the pages.
docs: install
	$(BIN)/python -m sphinx -W --keep-going -b html docs build/docs

clean:
	rm -rf $(VENV) $(REF_VENV) $(COMPAT_VENV) .cache build dist *.egg-info .pytest_cache
