"""Shared fixtures: a real redis-server for the session, per-test key isolation, crawlers.

Contract tests run against a ``redis-server`` the session starts itself on a free port
(``scrapy_dist.testing.RedisServer``), or against ``--redis-url`` /
``SCRAPY_DIST_TEST_REDIS_URL`` when given. A Redis the tests did not start is only used
when named explicitly, and even then each test touches only keys under its own prefix,
which it deletes with ``SCAN`` (never ``KEYS`` or ``FLUSHDB``).

Without a server binary, a test that needs one (the ``redis_server`` marker, or a
fixture below that starts a server) is skipped, except under ``CI`` (set by
``.ci/run``), where it fails.
"""

from __future__ import annotations

import functools
import itertools
import os
import secrets
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
import redis
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_dist.testing.redis_cluster import ClusterServers
from scrapy_dist.testing.redis_sentinel import SentinelServers
from scrapy_dist.testing.redis_server import RedisServer
from scrapy_dist.testing.server_kinds import (
    KIND_VARIABLE,
    KINDS,
    RedisServerNotFound,
    ServerKind,
    server_kind,
)

if not hasattr(__import__("scrapy.crawler").crawler, "AsyncCrawlerProcess"):
    # Scrapy 2.13's get_crawler() asks which reactor is installed and raises when none
    # is (later versions do not ask): install the one Scrapy's settings name.
    from scrapy.utils.reactor import install_reactor

    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from scrapy.crawler import Crawler

    from scrapy_dist.testing.site import TestSite

_names = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--redis-url",
        default=os.environ.get("SCRAPY_DIST_TEST_REDIS_URL"),
        help="use this Redis instead of starting a throwaway redis-server",
    )
    _add_server_options(parser)


@functools.cache
def _missing_server() -> str | None:
    """Why the session's kind of server (``--redis-kind``) cannot be started, or None."""
    try:
        server_kind(os.environ.get(KIND_VARIABLE) or "redis")
    except RedisServerNotFound as e:
        return str(e)
    return None


def require_redis_server() -> None:
    """Skip the running test when the session's kind of server is not installed; fail
    it under ``CI`` (:func:`server_missing`)."""
    missing = _missing_server()
    if missing is not None:
        server_missing(missing)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``redis_server`` need the binary (checked before their fixtures)."""
    if item.get_closest_marker("redis_server") is not None:
        require_redis_server()


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of the session's Redis: the one given, or a throwaway server of ``--redis-kind``."""
    given = request.config.getoption("--redis-url")
    if given:
        yield given
        return
    require_redis_server()
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone, with an append-only file (it may be killed
    and restarted), in ``tmp_path / "redis"``."""
    require_redis_server()
    with RedisServer(directory=tmp_path / "redis", appendonly=True) as running:
        yield running


@pytest.fixture(scope="module")
def module_server() -> Iterator[RedisServer]:
    """A redis-server shared by the tests of one module (each flushes what it needs)."""
    require_redis_server()
    with RedisServer() as running:
        yield running


@pytest.fixture
def fresh_site(site: TestSite) -> TestSite:
    """The module's ``site`` fixture (a :class:`TestSite` of its size) with its hit
    counters reset."""
    site.reset_hits()
    return site


@pytest.fixture
def name() -> str:
    """A spider name unique to this test: every key of its crawl starts with it."""
    return f"t{next(_names)}x{secrets.token_hex(3)}"


@pytest.fixture
def client(redis_url: str, name: str) -> Iterator[redis.Redis]:
    """A client of the session's Redis; deletes the test's keys afterwards (``SCAN``)."""
    conn = redis.Redis.from_url(redis_url)
    yield conn
    for key in conn.scan_iter(match=f"{name}*", count=1000):
        conn.delete(key)
    conn.close()


class _TestSpider(Spider):
    name = "unused"

    def parse(self, response: Any) -> Any:
        return None

    def parse_other(self, response: Any) -> Any:
        return None


@pytest.fixture
def make_crawler(redis_url: str, name: str, client: redis.Redis) -> Callable[..., Crawler]:
    """Build a crawler with a spider named ``name`` against the session's Redis.

    Call as ``make_crawler({"SETTING": value}, spidercls=...)``; the spider instance is
    created and attached, as Scrapy does before opening the scheduler, and a Redis
    spider is set up from the final settings, as at ``spider_opened``.
    """

    def make(
        settings: dict[str, Any] | None = None, spidercls: type[Spider] = _TestSpider
    ) -> Crawler:
        crawler = get_crawler(
            type(spidercls.__name__, (spidercls,), {"name": name}),
            {
                "REDIS_URL": redis_url,
                "SCHEDULER": "scrapy_dist.scheduler.Scheduler",
                "DUPEFILTER_CLASS": "scrapy_dist.dupefilter.RFPDupeFilter",
                **(settings or {}),
            },
        )
        crawler.spider = crawler.spidercls.from_crawler(crawler)
        if hasattr(crawler.spider, "open_redis"):
            crawler.spider.open_redis()
        return crawler

    return make


# Other servers (issue 14): the kind of server the session runs, a Cluster, a Sentinel set.


def _add_server_options(parser: pytest.Parser) -> None:
    parser.addoption(
        "--redis-kind",
        choices=KINDS,
        default=os.environ.get(KIND_VARIABLE) or "redis",
        help=(
            "kind of server every throwaway server of the session runs: redis-server, "
            f"valkey-server, or redis-server with the RedisBloom module (env {KIND_VARIABLE})"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    # RedisServer() reads the kind from the environment, so the servers that tests and
    # their worker processes start themselves follow the option too.
    os.environ[KIND_VARIABLE] = config.getoption("--redis-kind")


def server_missing(reason: str) -> NoReturn:
    """Skip the test for want of a server binary or module; fail instead under ``CI``."""
    if os.environ.get("CI"):
        pytest.fail(f"CI needs this server: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_kind(request: pytest.FixtureRequest) -> str:
    """The kind of server the session runs (``--redis-kind``): redis, valkey or redisbloom."""
    kind: str = request.config.getoption("--redis-kind")
    return kind


@pytest.fixture(scope="session")
def kind_of() -> Callable[[str], ServerKind]:
    """Resolve a server kind by name; skip the test when it is not installed (fail on CI)."""

    def resolve(kind: str) -> ServerKind:
        try:
            return server_kind(kind)
        except RedisServerNotFound as e:
            server_missing(str(e))

    return resolve


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterServers]:
    """A local Redis Cluster of the session's kind: 3 masters, each with one replica.

    Shared by the session: a test that fails nodes over or kills them leaves it healthy
    (:meth:`ClusterServers.wait_ok`) and deletes its keys.
    """
    try:
        cluster = ClusterServers()
    except RedisServerNotFound as e:
        server_missing(str(e))
    with cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelServers]:
    """A local Sentinel set of the session's kind: a master, a replica, 3 Sentinels.

    Shared by the session: a test that fails the master over leaves the set agreed
    (:meth:`SentinelServers.wait_agreed`) and deletes its keys.
    """
    try:
        sentinels = SentinelServers()
    except RedisServerNotFound as e:
        server_missing(str(e))
    with sentinels:
        yield sentinels


@pytest.fixture(scope="session")
def redisbloom_loaded(redis_url: str) -> bool:
    """Whether the session's Redis has the RedisBloom module (``bf``) loaded."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as conn:
        return "bf" in {module["name"] for module in conn.module_list()}


@pytest.fixture
def without_redisbloom(redisbloom_loaded: bool) -> None:
    """Skip a test that assumes the session's Redis has no RedisBloom module."""
    if redisbloom_loaded:
        pytest.skip("assumes a Redis without the RedisBloom module; the session's has it")
