# The commands the README documents. `make check` is the test command CI runs.
PYTHON ?= python3

.PHONY: install check fast-stage lint types imports fast test bench

install:
	$(PYTHON) -m pip install -e '.[dev]'

# The fast stage (CI runs it before installing anything slow), then the real-component suites.
check: fast-stage test

fast-stage: lint types imports fast

lint:
	ruff format --check .
	ruff check .

types:
	mypy

imports:
	lint-imports

fast:
	$(PYTHON) -m tests.suite fast -q -ra

test:
	$(PYTHON) -m tests.suite -q -ra --durations=15

bench:
	$(PYTHON) -m bench
