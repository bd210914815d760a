# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Each first makes sure the project-local virtual environment (.venv/) holds the
# pinned working set; a stamp file makes that a no-op the second time.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
DEMO_ARGS ?=

.PHONY: install demo demo-stream test lint format bench clean

install: $(STAMP)

# Rebuilt only when a pin changes. torchrec goes in with --no-deps so it cannot
# replace the CPU fbgemm build with the CUDA one (requirements/README.md).
$(STAMP): requirements/lock.txt requirements/no-deps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -r requirements/lock.txt
	$(PIP) install --quiet --no-deps -r requirements/no-deps.txt
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m pipelines.demo $(DEMO_ARGS)

# Streaming: generator at a steady rate -> streaming job (+ Feast pushes) ->
# trainer daemon, with a broker pause; reports throughput and freshness.
demo-stream: $(STAMP)
	$(PY) -m pipelines.demo_stream $(DEMO_ARGS)

test: lint
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy features

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: $(STAMP)
	$(PY) -m benchmarks.bench_generator

clean:
	rm -rf $(VENV) build *.egg-info demo-output
