# The two commands (README): `make demo` runs the engine on the embedded default,
# `make test` runs the whole suite (lint, types, layering, tests on SQLite + PostgreSQL).
# Each installs what it needs into .venv from pyproject.toml pinned by constraints.txt.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit bench bench-quick clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cpctl demo

lint: $(STAMP)
	$(BIN)/ruff check controlplane drivers migrations tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP) lint
	scripts/ensure-postgres
	scripts/ensure-registry
	scripts/ensure-chromium
	scripts/ensure-kustomize
	$(BIN)/pytest -q

unit: $(STAMP)
	$(BIN)/pytest -q tests/engine tests/machines tests/golden

bench: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.engine_throughput

bench-quick: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.engine_throughput --machines 300 --recovery 100

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .hypothesis
