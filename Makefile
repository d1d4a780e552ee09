# Everything needs only python3 (>= 3.10) with venv, and root apt or a redis-server.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install redis-server test pytest lint typecheck compat demo bench bench-deps clean

## install: virtualenv with the package, test and dev tools; a redis-server binary
install: $(VENV)/.installed redis-server

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,dev]'
	touch $@

redis-server:
	@scripts/ensure-redis-server

## test: lint, type check, then the whole test suite (end-to-end crawls included)
test: lint typecheck pytest

pytest: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check scrapy_dist tests benchmarks example

typecheck: install
	$(BIN)/mypy

## compat: scrapy-redis's released test suite and example project, renamed, against scrapy_dist
compat: install
	$(BIN)/python scripts/compat.py

## demo: a distributed crawl of a local site by several workers sharing one Redis
demo: install
	$(BIN)/python example/demo.py $(DEMO_ARGS)

## bench: the benchmarks in benchmarks/ (results in benchmarks/results/; about an hour)
bench: install bench-deps
	$(BIN)/python benchmarks/bench_crawl.py --all
	$(BIN)/python benchmarks/bench_dupefilters.py

## bench-deps: nginx and wrk for the benchmark site (optional), scrapy-redis to compare
bench-deps: install
	-@scripts/ensure-bench-deps
	$(BIN)/python -m pip install -q -e '.[bench]'

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
