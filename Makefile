# Both entry points create (or reuse) the project's virtual environment by themselves.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.nopeinterp-installed
REPORT ?= reports/main

.PHONY: main test lint bench checkpoints tl4 test-tl4

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# the local CPU wheel first: a bare "torch" requirement could pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	# TransformerLens 3.9 here (from_hf converts to its HookedTransformer); pyproject allows 4.x
	# too, which `make tl4` installs in its own environment
	$(PY) -m pip install -q 'transformer-lens>=3.9,<4'
	$(PY) -m pip install -q -e '.[test,dev]'
	touch $(STAMP)

# A second environment with TransformerLens 4 (HookedTransformer removed), reused when present.
TL4_VENV  ?= .venv-tl4
TL4_STAMP := $(TL4_VENV)/.nopeinterp-installed

$(TL4_STAMP): pyproject.toml
	test -x $(TL4_VENV)/bin/python || python3 -m venv $(TL4_VENV)
	$(TL4_VENV)/bin/python -m pip install -q torch==2.13.0
	$(TL4_VENV)/bin/python -m pip install -q -e '.[test]' 'transformer-lens>=4,<5'
	touch $(TL4_STAMP)

tl4: $(TL4_STAMP)  ## build (or reuse) the TransformerLens 4 environment

# The model and analysis test modules, run again under TL 4 (their tests marked tl4).
TL4_TESTS := tests/test_tl_versions.py tests/test_random_init_control.py tests/test_hf_analyses.py \
	tests/test_models.py tests/test_model_layers.py tests/test_fused_attention.py \
	tests/test_t5_arch.py tests/test_new_pes.py tests/test_checkpoint.py tests/test_analyses.py

test-tl4: $(TL4_STAMP)  ## the tests marked tl4 (our models, imported models, analyses) under TransformerLens 4
	HF_HUB_OFFLINE=1 $(TL4_VENV)/bin/python -m pytest -m tl4 $(TL4_TESTS)

main: $(STAMP)  ## the main job, on the shipped checkpoints
	$(PY) -m nopeinterp.cli report --checkpoints checkpoints --out $(REPORT)

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(STAMP)  ## one torch thread: how training runs here (two single-threaded jobs), and less noisy
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench --threads 1

checkpoints: $(STAMP)  ## retrain every reference checkpoint (slow: see checkpoints/README.md)
	$(PY) analyses/train_reference.py
