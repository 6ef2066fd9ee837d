# gpuquota developer entry points. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Reinstall only when pyproject.toml or constraints.txt changes (or the venv is gone).
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt 2>/dev/null | sha256sum | cut -c1-16)
# What the demo needs only: the package and its runtime dependencies (no test tools, no podman), so a
# fresh clone reaches the demo's PASS in well under a minute; `make install` adds the rest.
DEMO_STAMP := $(VENV)/.demo-$(shell cat pyproject.toml constraints.txt 2>/dev/null | sha256sum | cut -c1-16)
PYTEST_ARGS ?=
# mypy needs at least one .py file per directory argument; skip empty ones.
MYPY_PATHS := services/gpuquota $(foreach d,$(wildcard tests benchmarks .ci),$(if $(shell find $(d) -name '*.py' -print -quit),$(d)))
LINT_PATHS := $(wildcard services tests benchmarks .ci)

.PHONY: help install native test lint demo images compose-up compose-down kafka-start kafka-stop kafka-status postgres-start postgres-stop clean

help:
	@echo "make install       create .venv (python3.11) and pip install -e '.[test]' with the pins of"
	@echo "                   constraints.txt (skipped when up to date);"
	@echo "                   podman, runc, busybox-static from apt when missing (deploy/local/podman.sh, root)"
	@echo "make native        compile the scheduling core with mypyc and the exit wrapper with cc"
	@echo "                   (docs/configuration.md; skipped when current)"
	@echo "make test          make images; start Kafka + PostgreSQL unless KAFKA_BOOTSTRAP_SERVERS /"
	@echo "                   DATABASE_URL are set, and podman's Docker API; run pytest (PYTEST_ARGS=...),"
	@echo "                   tear down what was started; then the core's tests again on the Python core"
	@echo "                   (GPUQUOTA_PURE_PYTHON=1)"
	@echo "make lint          ruff check, ruff format --check, mypy --strict, lint-imports, import cycles,"
	@echo "                   schema drift"
	@echo "make demo          run the end-to-end demo (.venv/bin/gpuquota demo); installs only the package"
	@echo "                   and its runtime dependencies when .venv lacks them (no test tools, no podman)"
	@echo "make images        build every image (base, gpuquota:dev, Kafka, PostgreSQL, python) from Debian's packages"
	@echo "                   with podman, cached by content hash (deploy/local/images.sh; docs/images.md)"
	@echo "make compose-up    build the images, start docker-compose.yml on podman (gateway on 127.0.0.1:8642)"
	@echo "make compose-down  stop it and remove its containers, networks and volumes"
	@echo "make kafka-start   start a local broker (deploy/local/kafka.sh); kafka-stop / kafka-status"
	@echo "make postgres-start  start a throwaway PostgreSQL (deploy/local/postgres.sh); postgres-stop"

install: $(STAMP)

$(STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	bash deploy/local/podman.sh install
	@rm -f $(VENV)/.installed-* $(VENV)/.demo-*
	@touch $@ $(DEMO_STAMP)

$(DEMO_STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e .
	@rm -f $(VENV)/.demo-*
	@touch $@

# Without a C compiler the Python core and exit wrapper run (same behaviour, slower); CI checks the
# compiled ones are used.
native: install
	$(BIN)/python -m gpuquota.entrypoints.build_native || echo "make native: failed, the Python core or exit wrapper will run" >&2

CORE_TESTS := tests/unit/core tests/property tests/unit/test_snapshots.py

test: native images
	bash deploy/local/test-stack.sh $(PYTEST_ARGS)
	GPUQUOTA_PURE_PYTHON=1 $(BIN)/pytest -q -p no:cacheprovider $(CORE_TESTS)

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy --strict $(MYPY_PATHS)
	$(BIN)/lint-imports
	$(BIN)/python .ci/import_cycles.py
	@if test -f services/gpuquota/wire/export.py; then \
		echo "$(BIN)/python -m gpuquota.wire.export --check"; \
		$(BIN)/python -m gpuquota.wire.export --check; \
	else \
		echo "schema drift check skipped: services/gpuquota/wire/export.py does not exist yet"; \
	fi

# The demo runs the Python core when `make native` has not compiled it: it takes seconds either way.
demo: $(DEMO_STAMP)
	$(BIN)/gpuquota demo

# the images the compose and testcontainers tests run (cached: seconds when nothing changed)
images:
	bash deploy/local/podman.sh install
	bash deploy/local/images.sh all
	@bash deploy/local/images.sh list

compose-up:
	bash deploy/local/compose.sh up

compose-down:
	bash deploy/local/compose.sh down

kafka-start: install
	bash deploy/local/kafka.sh start

kafka-stop:
	bash deploy/local/kafka.sh stop

kafka-status:
	bash deploy/local/kafka.sh status

postgres-start:
	bash deploy/local/postgres.sh start

postgres-stop:
	bash deploy/local/postgres.sh stop

clean: kafka-stop postgres-stop
	rm -rf .cache/test-stack .mypy_cache .ruff_cache .pytest_cache
