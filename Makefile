# The two commands (README): `make demo` runs the engine on the embedded default,
# `make test` runs the whole suite (lint, types, layering, tests on SQLite + PostgreSQL).
# Each installs what it needs into .venv from pyproject.toml pinned by constraints.txt.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The suite runs in worker processes (pytest-xdist), a test file per worker at a time
# (module worlds start once), the files with slow tests first (tests/conftest.py): most
# of its time waits on subprocesses, servers and timers, so more workers than cores pays
# (docs/testing.md has the budget per folder).
TEST_WORKERS ?= 4

.PHONY: demo test lint unit bench bench-smoke bench-quick bench-scale bench-growth bench-recovery bench-replay \
	bench-history bench-kube-api bench-criu bench-sealing bench-cli bench-migration-locks bench-all soak clean

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
	scripts/ensure-zsh
	scripts/ensure-skopeo
	scripts/ensure-prometheus
	eval "$$(scripts/ensure-envtest)" && eval "$$(scripts/ensure-criu)" && \
		eval "$$(scripts/ensure-realnode)" && \
		$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		-m "not bench_smoke" --durations=25 $(PYTEST_ARGS)

# The benchmarks' long smoke runs (bench_smoke marker: docs/testing.md), not in make test:
# their product paths run in tests/criu; this checks the benchmark harness itself.
bench-smoke: $(STAMP)
	scripts/ensure-postgres
	scripts/ensure-registry
	eval "$$(scripts/ensure-criu)" && $(BIN)/pytest -q -m bench_smoke tests/bench

unit: $(STAMP)
	$(BIN)/pytest -q tests/engine tests/machines tests/golden

bench: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.engine_throughput

bench-quick: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.engine_throughput --machines 300 --recovery 100

# One target per scenario of docs/performance.md; each prints a table and one JSON line
# and writes bench/results/<scenario>.json. `bench` stays the engine benchmark.
bench-scale: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.scale --migrations 10000 --nodes 100

bench-growth: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.growth --sizes 100,1000,10000

bench-recovery: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.recovery --migrations 500

bench-replay: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.replay --events 1000000

# The simulator and a real kube-apiserver (envtest; that half skips, saying so, without it)
# in one run: API requests per migration, each verb's latency, migrations/s vs a raw write loop.
bench-kube-api: $(STAMP)
	scripts/ensure-postgres
	eval "$$(scripts/ensure-envtest)" && $(BIN)/python -m bench.kube_api --migrations 200 --nodes 3

# Bytes per migration and database size at 10,000 and 100,000 migrations (a year of
# history), kept whole and pruned to 30 days (docs/performance.md, "History at scale").
bench-history: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.history_growth --sizes 10000,100000 --days 365 --keep-days 30

# Each schema revision's write-blocking locks on events and machines while upgrading a
# 1,000,000-event history one revision at a time (docs/install.md, "Lock times per revision").
bench-migration-locks: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m bench.migration_locks --events 1000000

# cpctl's start-up as whole processes: --help, every verb's --help, list on SQLite.
bench-cli: $(STAMP)
	$(BIN)/python -m bench.cli_startup --runs 9

bench-all: bench bench-scale bench-growth bench-recovery bench-replay bench-history

# A real container migrated with CRIU at 1, 64, 512 and 2048 MiB of touched memory (4 MiB/s
# dirtied): the product's downtime in each way it migrates (through the registry, streamed,
# lazy) over CRIU alone's, beside the agent's path and podman by hand, median [min-max] of
# 3 runs. About 25-30 min on 2 cores; --sizes 1,64 --runs 3 takes about 5.
bench-criu: $(STAMP)
	scripts/ensure-registry
	eval "$$(scripts/ensure-criu)" && $(BIN)/python -m bench.criu_migration --sizes 1,64,512,2048 --runs 3
bench-sealing: $(STAMP)
	scripts/ensure-registry
	eval "$$(scripts/ensure-criu)" && $(BIN)/python -m bench.sealing_cost --sizes 1,64,512 --runs 3
bench-realnode: $(STAMP)
	eval "$$(scripts/ensure-envtest)" && eval "$$(scripts/ensure-criu)" && eval "$$(scripts/ensure-realnode)" && $(BIN)/python -m bench.realnode_downtime --sizes 1,64,512 --runs 3

# Reliability soak (never in CI): 5,000 migrations, 3 workers SIGKILLed at random, the
# API/registry/node fault mix, one PostgreSQL restart (a throwaway server of its own) and a
# rolling upgrade from the previous release at 40% (--upgrade-from none: without it);
# docs/reliability.md. SOAK_ARGS adds options, e.g. SOAK_ARGS="--seed 7".
soak: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m tests.reliability.campaign --profile soak --migrations 5000 --workers 3 \
		--workloads 48 $(SOAK_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .hypothesis
