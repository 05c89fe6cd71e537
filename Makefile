# The README's whole set-up: `make run` starts the broker, `make test` runs the test suite.
.PHONY: setup run test lint bench

VENV := .venv
PY := $(VENV)/bin/python

setup:
	@bash scripts/setup.sh

run: setup
	$(VENV)/bin/tabletopic serve $(ARGS)

test: setup
	@bash scripts/test.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: setup
	$(PY) bench/produce.py && $(PY) bench/convert.py && $(PY) bench/e2e.py && $(PY) bench/idle.py && $(PY) bench/registry.py && $(PY) bench/avro.py && $(PY) bench/s3_catchup.py && $(PY) bench/attach_catchup.py && $(PY) bench/transactions.py && $(PY) bench/compaction.py && $(PY) bench/security.py
