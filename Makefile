# The commands the README documents. `make check` is the test command CI runs.
PYTHON ?= python3

.PHONY: install check lint types imports test bench

install:
	$(PYTHON) -m pip install -e '.[dev]'

check: lint types imports test

lint:
	ruff format --check .
	ruff check .

types:
	mypy

imports:
	lint-imports

test:
	$(PYTHON) -m tests.suite -q -ra --durations=15

bench:
	$(PYTHON) -m bench
