# Two entry points for a newcomer: `make run` (the main job) and `make test` (everything CI checks).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-cluster lint typecheck unit bench clean

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

# --durations: CI's log ends with the 30 slowest tests (where the time goes); every test also
# has a time limit (pyproject.toml), so a hang ends the run with every thread's stack.
# The suite mostly waits on servers and processes, so it runs on TEST_PROCESSES pytest processes
# (pytest-xdist; whole files to each, so a file's module-wide worker pools start once). Tests
# marked `exclusive` stop a server the others share: they run alone afterwards, and run even
# when the first part failed.
TEST_PROCESSES ?= 2
test: lint typecheck
	status=0; \
	$(BIN)/pytest -q --durations=30 -n $(TEST_PROCESSES) --dist loadfile \
		-m "not cluster and not exclusive" tests || status=$$?; \
	$(BIN)/pytest -q --durations=5 -m "exclusive and not cluster" tests || status=$$?; \
	exit $$status

# The cluster suite: clustered RabbitMQ, Redis behind Sentinels, ZooKeeper and etcd ensembles and
# MariaDB (.ci/cluster.sh starts them on 127.0.0.1, apart from the shared servers), then stopped
# and wiped whatever the tests did. A few minutes; doc/deployment.rst has what they measure.
test-cluster: $(STAMP)
	bash .ci/cluster.sh start
	status=0; $(BIN)/pytest -q --durations=10 -m cluster tests || status=$$?; \
	bash .ci/cluster.sh wipe; exit $$status

# Every benchmark script, each writing its JSON to benchmarks/results/<script>.json (progress on
# stderr); the folder is in .gitignore. A script that fails leaves no result file, the
# others still run, and make fails at the end.
BENCHMARKS := engines persistence kombu_ceiling wbe events_cost dashboard tracing_cost remote_path \
	setup_cost
RESULTS := benchmarks/results

bench: $(STAMP)
	mkdir -p $(RESULTS)
	failed=""; for name in $(BENCHMARKS); do \
		echo "== benchmarks/$$name.py -> $(RESULTS)/$$name.json" >&2; \
		if $(BIN)/python benchmarks/$$name.py > $(RESULTS)/$$name.json.part; then \
			mv $(RESULTS)/$$name.json.part $(RESULTS)/$$name.json; \
		else rm -f $(RESULTS)/$$name.json.part; failed="$$failed $$name"; fi; \
	done; \
	if [ -n "$$failed" ]; then echo "benchmarks failed:$$failed" >&2; exit 1; fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
