"""Shared fixtures: a real redis-server for the session, per-test key isolation, crawlers.

Contract tests run against a ``redis-server`` the session starts itself on a free port
(``scrapy_dist.testing.RedisServer``), or against ``--redis-url`` /
``SCRAPY_DIST_TEST_REDIS_URL`` when given. A Redis the tests did not start is only used
when named explicitly, and even then each test touches only keys under its own prefix,
which it deletes with ``SCAN`` (never ``KEYS`` or ``FLUSHDB``).

Without a ``redis-server`` binary, a test that needs one (the ``redis_server`` marker,
or a fixture below that starts a server) is skipped, except under ``CI`` (set by
``.ci/run``), where it fails.
"""

from __future__ import annotations

import functools
import itertools
import os
import secrets
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_dist.testing.redis_server import RedisServer, RedisServerNotFound, find_redis_server

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


@functools.cache
def _missing_redis_server() -> str | None:
    """Why no ``redis-server`` binary can be found, or None when one can."""
    try:
        find_redis_server()
    except RedisServerNotFound as e:
        return str(e)
    return None


def require_redis_server() -> None:
    """Skip the running test when no ``redis-server`` binary is found; fail it under CI."""
    missing = _missing_redis_server()
    if missing is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI needs a redis-server: {missing}")
    pytest.skip(missing)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``redis_server`` need the binary (checked before their fixtures)."""
    if item.get_closest_marker("redis_server") is not None:
        require_redis_server()


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of the session's Redis: the one given, or a throwaway redis-server."""
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
def make_crawler(
    redis_url: str, name: str, client: redis.Redis
) -> Callable[..., Crawler]:
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
