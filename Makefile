VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install test lint demo screenshots clean

# Re-installs whenever pyproject.toml changes (new dependency, new entry point).
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Starts a throwaway PostgreSQL and RabbitMQ unless OUTBOX_TEST_PG_URL / OUTBOX_TEST_AMQP_URL
# are set; e.g. make test PYTEST_ARGS="-k sqlite -x"
test: install
	VENV=$(VENV) bash scripts/test.sh $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	@if [ -d engine ]; then echo "$(BIN)/mypy"; $(BIN)/mypy; \
	else echo "lint: no engine/ package yet: mypy skipped"; fi

demo: install
	$(BIN)/outbox-tui --demo

screenshots: install
	$(BIN)/python scripts/screenshots.py

# Keeps $(VENV) (delete it by hand for a from-scratch install); drops the stamp so the next
# target re-installs.
clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache snapshot_report.html
	rm -f $(VENV)/.installed
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
