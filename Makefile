# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Each first makes sure the project-local virtual environment (.venv/) holds the
# pinned working set; a stamp file makes that a no-op the second time.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
DEMO_ARGS ?=

# Beam's local runner (Prism, a Go program) and Apache Kafka's jars live in
# .tools/ (git-ignored). Prism's version is the Beam SDK's in lock.txt.
TOOLS := .tools
BEAM_VERSION := $(shell sed -n 's/^apache-beam==//p' requirements/lock.txt)
PRISM := $(TOOLS)/bin/prism
KAFKA_STAMP := $(TOOLS)/kafka/.installed
FLINK_STAMP := $(TOOLS)/flink/.installed

.PHONY: install tools prism kafka flink services services-stop demo demo-stream test lint format bench \
	gpu-wheels clean

install: $(STAMP) tools

tools: prism kafka flink
prism: $(PRISM)
kafka: $(KAFKA_STAMP)
flink: $(FLINK_STAMP)

# Built from the Go module proxy (GitHub, where Beam would download it from,
# is out of reach); pipelines.beam.runner points Beam at it.
$(PRISM): requirements/lock.txt
	mkdir -p $(TOOLS)/bin
	GOBIN=$(abspath $(TOOLS)/bin) GOFLAGS=-buildvcs=false \
		go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$(BEAM_VERSION)
	touch $@

# $(call maven_jars,NAME): the jars of requirements/NAME/pom.xml and their
# runtime dependencies, from Maven Central, into .tools/NAME/libs.
define maven_jars
	rm -rf $(TOOLS)/$(1)/libs
	mvn --quiet --batch-mode -Dstyle.color=never -f requirements/$(1)/pom.xml \
		dependency:copy-dependencies -DincludeScope=runtime \
		-DoutputDirectory=$(abspath $(TOOLS)/$(1)/libs)
	touch $@
endef

# The embedded broker's jars (launchers.kafka_broker).
$(KAFKA_STAMP): requirements/kafka/pom.xml
	$(call maven_jars,kafka)

# Beam's Flink job server and an embedded Flink (launchers.flink_job_server).
$(FLINK_STAMP): requirements/flink/pom.xml
	$(call maven_jars,flink)

# PostgreSQL and Redis on loopback for Feast's production-like configuration;
# installed from Debian's packages where missing, left alone where running.
services:
	scripts/services.sh start

services-stop:
	scripts/services.sh stop

# Rebuilt only when a pin changes. torchrec goes in with --no-deps so it cannot
# replace the CPU fbgemm build with the CUDA one (requirements/README.md).
$(STAMP): requirements/lock.txt requirements/no-deps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -r requirements/lock.txt
	$(PIP) install --quiet --no-deps -r requirements/no-deps.txt
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: install
	$(PY) -m demos.end_to_end $(DEMO_ARGS)

# Streaming: generator at a steady rate -> streaming job (+ Feast pushes) ->
# trainer daemon on Prism, with a broker kill and restart; one screen of
# throughput, freshness, NE and counts, and a PNG of freshness and NE.
demo-stream: install
	$(PY) -m demos.streaming $(DEMO_ARGS)

test: lint tools services
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

# Wheels for the lent GPU machine (benchmarks/h200_round.sh): it has torch 2.11
# with CUDA and Python 3.12 but no torchrec and no downloads. torchrec 1.6.1 and
# fbgemm's CPU build 1.6.0 are the pair for torch 2.11 (the CUDA fbgemm wheel is
# too big to ship); the rest are torchrec's pure-Python dependencies.
GPU_WHEELS := torchrec==1.6.1 fbgemm-gpu-cpu==1.6.0 tensordict==0.15.3 pyvers \
	orjson importlib_metadata iopath kafka-python==3.0.12
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
	manylinux2014_x86_64 manylinux1_x86_64

gpu-wheels: $(STAMP)
	$(PIP) download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(addprefix --platform ,$(GPU_PLATFORMS)) -d .whl $(GPU_WHEELS)

clean:
	rm -rf $(VENV) $(TOOLS) build *.egg-info demo-output .whl
