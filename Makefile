# durable-outbox: `make dev` runs the whole stack, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
QUICK ?=

.DEFAULT_GOAL := help
.PHONY: help install dev test lint bench chaos clean

help:
	@echo "make dev      create .venv, install, start Temporal + fake provider + worker + API"
	@echo "make test     create .venv, install, run the whole test suite"
	@echo "make lint     ruff format --check, ruff check, mypy --strict"
	@echo "make bench    benchmarks (QUICK=1 for the short run); writes .bench/latest.json"
	@echo "make chaos    large-scale fault injection; fails on any loss, duplicate or rate breach"
	@echo "make clean    remove .venv, .data and .bench"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the dependency pins change.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

dev: install
	$(BIN)/python -m devstack.dev

# pytest exits 5 when it collected nothing: that is a failure here, never a pass.
test: install
	@$(BIN)/pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "FAIL: no tests were collected"; exit 1; fi; \
	exit $$status

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy common workflows activities api readmodel devstack worker.py cli.py

clean:
	rm -rf $(VENV) .data .bench

bench: install
	QUICK=$(QUICK) $(BIN)/python -m bench.run
