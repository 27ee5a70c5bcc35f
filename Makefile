# durable-outbox: `make dev` runs the whole stack, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make bench QUICK=1`: the short run.
QUICK ?=
# Extra pytest arguments, e.g. `make test PYTEST_ARGS='tests/devstack -x'`.
PYTEST_ARGS ?=
# Test processes running at once (`PYTEST_WORKERS=0`: one process, no xdist). Most tests wait on
# a Temporal server, not the CPU, so more processes than cores pay: docs/decisions/parallel-tests.md
PYTEST_WORKERS ?= 4

.DEFAULT_GOAL := help
.PHONY: help venv install dev test lint bench chaos clean clean-data

help:
	@echo "make dev         create .venv, install, start Temporal + fake provider + worker + API"
	@echo "make test        create .venv, install, run the whole test suite (PYTEST_ARGS=...)"
	@echo "make lint        ruff format --check, ruff check, mypy --strict, import-graph contracts"
	@echo "make bench       benchmarks (QUICK=1 for the short run); writes .bench/latest.json"
	@echo "make chaos       fault injection at scale (QUICK=1, CHAOS_ITEMS=n); writes .bench/chaos.json"
	@echo "make install     create .venv and install (again only when pyproject.toml changes)"
	@echo "make clean       remove .venv and tool caches"
	@echo "make clean-data  remove .data (the dev stack's items) and .bench"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

venv: $(BIN)/python

# Reinstall only when the dependency pins change. uv (from PyPI, into the venv) resolves and
# installs the same versions as pip in a quarter of the time, its own install included:
# docs/decisions/parallel-tests.md.
$(STAMP): pyproject.toml clients/python/pyproject.toml clients/temporal/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet 'uv>=0.13,<0.14'
	$(BIN)/uv pip install --python $(BIN)/python --quiet \
		-e 'clients/temporal[sqlalchemy,opentelemetry]' -e '.[dev]' -e clients/python
	touch $@

install: $(STAMP)

dev: install
	$(BIN)/python -m devstack.dev

# pytest exits 5 when it collected nothing: that is a failure here, never a pass. The bytecode
# cache is on for the suite even where PYTHONDONTWRITEBYTECODE is set (these machines set it):
# otherwise every test process and every process the tests start compiles the project from
# source again, and pytest rewrites every test module in each (docs/decisions/parallel-tests.md).
test: install
	@env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal -m 'not chaos' $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "FAIL: pytest collected no tests"; exit 1; fi; \
	exit $$status

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy .
	$(BIN)/lint-imports

bench: install
	QUICK=$(QUICK) $(BIN)/python -m bench.run

# Provider storm + three worker SIGKILLs, in item mode and then in bulk mode; exits non-zero on
# any loss, duplicate or early retry.
# Then 10,000 items in one ordering lane (1,000 with QUICK=1), in item mode and then in bulk mode,
# with three worker SIGKILLs each: none lost, duplicated or reordered.
# Then a bulk destination's shards changed from 2 to 4, and from 4 to 2, in a rolling restart
# (two API processes, workers SIGKILLed): each lane in order, each item once.
# Then 100,000 commands to one aggregate (10,000): none lost, refused or applied twice.
# Then an upgrade from the previous release with work in flight: everything finishes, none lost,
# doubled or reordered, no non-determinism (docs/how-to/upgrade.md#the-upgrade-test).
chaos: install
	$(BIN)/pytest -p no:xdist -m chaos tests
	QUICK=$(QUICK) CHAOS_MODE=item $(BIN)/python -m bench.chaos
	QUICK=$(QUICK) CHAOS_MODE=bulk $(BIN)/python -m bench.chaos
	QUICK=$(QUICK) LANE_MODE=item $(BIN)/python -m bench.lane_scale
	QUICK=$(QUICK) LANE_MODE=bulk $(BIN)/python -m bench.lane_scale
	QUICK=$(QUICK) $(BIN)/python -m bench.reshard
	QUICK=$(QUICK) RESHARD_FROM=4 RESHARD_TO=2 $(BIN)/python -m bench.reshard
	QUICK=$(QUICK) $(BIN)/python -m bench.aggregate_scale
	QUICK=$(QUICK) $(BIN)/python -m bench.bounded_load
	$(BIN)/python -m bench.upgrade

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-data:
	rm -rf .data .bench
