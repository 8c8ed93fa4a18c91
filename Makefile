# Both entry points create .venv if it is missing and install from the project's own files.
# torch is pinned for tests and the demo (a looser requirement may pull a multi-GB CUDA build);
# override with e.g. `make test TORCH=torch==2.14.1`.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.traintel-installed
CODE := src tests examples benchmarks

.PHONY: demo test lint typecheck pytest bench venv clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/train_mlp.py

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_phase_overhead.py

clean:
	rm -rf $(VENV) traintel-runs .pytest_cache .mypy_cache .ruff_cache
