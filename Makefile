VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install test lint demo screenshots bench reliability clean

# Re-installs whenever pyproject.toml changes (new dependency, new entry point).
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

$(VENV)/.installed-bench: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $@

# Starts a throwaway PostgreSQL and RabbitMQ unless OUTBOX_TEST_PG_URL / OUTBOX_TEST_AMQP_URL
# are set; e.g. make test PYTEST_ARGS="-k sqlite -x"
test: install
	VENV=$(VENV) bash scripts/test.sh $(PYTEST_ARGS)

# Side by side with pgqueuer, the SQL floor and raw aio-pika on a durable PostgreSQL and a
# RabbitMQ it starts itself (~15 min); writes docs/BENCHMARKS.md and benchmarks/results/.
# e.g. make bench BENCH_ARGS="--smoke" or BENCH_ARGS="--large"
BENCH_ARGS ?=
bench: $(VENV)/.installed-bench
	VENV=$(VENV) bash scripts/bench.sh $(BENCH_ARGS)

# The fault suite at soak sizes (longer runs, more kills), then docs/RELIABILITY.md from its
# records; `make test` runs the same scenarios at CI sizes.
reliability: install
	VENV=$(VENV) bash scripts/test.sh tests/reliability --soak
	$(BIN)/python -m tests.reliability.report

# ruff, then mypy --strict on engine and outbox_tui (the packages in pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

demo: install
	$(BIN)/outbox-tui --demo

screenshots: install
	$(BIN)/python scripts/screenshots.py

# Keeps $(VENV) (delete it by hand for a from-scratch install); drops the stamp so the next
# target re-installs.
clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache snapshot_report.html
	rm -f $(VENV)/.installed $(VENV)/.installed-bench
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
