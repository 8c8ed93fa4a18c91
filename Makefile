# Both entry points create .venv if it is missing and install from the project's own files.
# torch is pinned for tests and the demo (a looser requirement may pull a multi-GB CUDA build);
# override with e.g. `make test TORCH=torch==2.14.1`.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.traintel-installed
DEMO_STAMP := $(VENV)/.traintel-demo-installed
DOCS_STAMP := $(VENV)/.traintel-docs-installed
CODE := src tests examples benchmarks scripts/stress-suite
# pytest spreads the suite over the machine's cores (pytest-xdist, at most 4 workers); tests that
# must not run at the same time share an xdist_group, which one worker runs in turn
# (tests/tiers.py and the markers in pyproject.toml say which and why). PYTEST_PARALLEL= runs
# the suite in one process.
PYTEST_PARALLEL ?= -n auto --maxprocesses=4 --dist loadgroup

# The lowest OpenTelemetry release pyproject.toml allows, with the contrib packages of the same
# release: `make test-sdk-floor` runs the suite against it in a virtualenv of its own (CI runs
# both ends of the range: `make test` resolves the newest).
OTEL_FLOOR ?= 1.40.0
OTEL_FLOOR_CONTRIB ?= 0.61b0
FLOOR_VENV ?= .venv-sdk-floor
FLOOR_STAMP := $(FLOOR_VENV)/.traintel-installed
OTEL_FLOOR_PINS := $(foreach p,api sdk proto exporter-otlp exporter-otlp-proto-common \
	exporter-otlp-proto-grpc exporter-otlp-proto-http,opentelemetry-$(p)==$(OTEL_FLOOR)) \
	$(foreach p,semantic-conventions instrumentation distro exporter-prometheus,opentelemetry-$(p)==$(OTEL_FLOOR_CONTRIB))

.PHONY: demo test test-fast test-sdk-floor lint typecheck pytest bench venv clean docs

# The demo needs traintel and torch only; the tests add their extra on top (same venv).
$(DEMO_STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	touch $@

$(STAMP): $(DEMO_STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $@

venv: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python examples/train_mlp.py

test: lint typecheck pytest

# The complexity budget, counted as radon counts it (each `and` / `or` a branch, which ruff's
# mccabe does not count): no function above 20 (rank C), the package's average at most 5
# (rank A), every module included.

lint: $(STAMP)
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)
	$(BIN)/xenon --max-absolute C --max-average A src/traintel

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

# The inner loop: the tests that start no process or server, use no framework and build no docs
# (pytest --fast, tests/tiers.py), in one process; `make test` still runs everything.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q --fast

$(FLOOR_STAMP): pyproject.toml Makefile
	test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(FLOOR_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]" $(OTEL_FLOOR_PINS)
	$(FLOOR_VENV)/bin/python -c "import opentelemetry.sdk.version as v; assert v.__version__ == '$(OTEL_FLOOR)', v.__version__"
	touch $@

test-sdk-floor: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -m pytest -q $(PYTEST_PARALLEL)

# The documentation site, built strict (a broken link or anchor, a cross-reference with no target,
# a docstring that does not render fails). Needs neither torch nor a GPU; the site goes to site/.
$(DOCS_STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[docs]"
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_phase_overhead.py

clean:
	rm -rf $(VENV) $(FLOOR_VENV) traintel-runs .pytest_cache .mypy_cache .ruff_cache
