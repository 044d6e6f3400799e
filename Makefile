# Two entry points for a newcomer: `make run` (the main job) and `make test` (everything CI checks).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck unit bench clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python examples/demo_workers.py

lint: $(STAMP)
	$(BIN)/ruff check flowengine tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy flowengine

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit tests/behaviour

test: lint typecheck
	$(BIN)/pytest -q tests

bench: $(STAMP)
	$(BIN)/python benchmarks/engines.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
