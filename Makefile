# Both entry points create (or reuse) the project's virtual environment by themselves.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.nopeinterp-installed
REPORT ?= reports/main

.PHONY: main test lint bench checkpoints

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# the local CPU wheel first: a bare "torch" requirement could pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,dev]'
	touch $(STAMP)

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
