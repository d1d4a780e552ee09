"""robots.txt fetched once per crawl: one worker's download serves the others
(``scrapy_dist/robots.py``, issue 36)."""

from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from scrapy_dist.robots import (
    FLAG,
    MAX_BODY,
    SharedRobotsTxt,
    decode_record,
    encode_record,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

ROBOTS = "https://example.com/robots.txt"
BODY = b"User-agent: *\nDisallow: /private\nCrawl-delay: 2\n"


def _robots_request(url: str = ROBOTS) -> Request:
    """A robots.txt request as Scrapy's RobotsTxtMiddleware makes it."""
    return Request(url, priority=1000, meta={"dont_obey_robotstxt": True})


def _middleware(client: redis.Redis, name: str, ttl: float = 60.0) -> SharedRobotsTxt:
    return SharedRobotsTxt(client, f"{name}:robots", ttl, MemoryStatsCollector(get_crawler()))


def test_records_round_trip_and_garbage_reads_as_none() -> None:
    record = encode_record(1_700_000_000.5, 200, BODY)
    assert decode_record(record) == (1_700_000_000.0, 200, BODY)
    bomb = b"1|1|200|" + zlib.compress(b"\0" * (MAX_BODY + 1))  # small, inflates too far
    for garbage in (b"", b"junk", b"2|1|200|x", b"1|x|200|x", b"1|1|200|notzlib", b"1|1|99|", bomb):
        assert decode_record(garbage) is None


def test_one_workers_robots_txt_answers_the_others(client: redis.Redis, name: str) -> None:
    first, second = _middleware(client, name), _middleware(client, name)
    request = _robots_request()
    assert first.process_request(request) is None  # nobody fetched it yet: fetch
    fetched = Response(ROBOTS, status=200, body=BODY, request=request)
    assert first.process_response(request, fetched) is fetched
    answer = second.process_request(_robots_request())
    assert answer is not None
    assert (answer.status, answer.body, answer.url) == (200, BODY, ROBOTS)
    assert FLAG in answer.flags
    assert second.process_response(_robots_request(), answer) is answer  # not stored again
    assert first.stats.get_value("robotstxt/shared/stored") == 1
    assert second.stats.get_value("robotstxt/shared/hits") == 1
    assert 0 < client.ttl(f"{name}:robots") <= 60
    # another site, another scheme, or a page of the site: not answered
    assert second.process_request(_robots_request("http://example.com/robots.txt")) is None
    assert second.process_request(Request("https://example.com/robots.txt")) is None
    assert second.process_request(Request("https://example.com/page")) is None


def test_a_404_is_shared_errors_and_long_bodies_are_not(client: redis.Redis, name: str) -> None:
    mw = _middleware(client, name)
    for status, body, kept in ((404, b"not found", True), (503, b"busy", False)):
        url = f"https://s{status}.example/robots.txt"
        request = _robots_request(url)
        mw.process_response(request, Response(url, status=status, body=body, request=request))
        assert (client.hget(f"{name}:robots", f"https://s{status}.example") is not None) is kept
    url = "https://long.example/robots.txt"
    request = _robots_request(url)
    mw.process_response(request, Response(url, body=b"#" * (MAX_BODY + 1), request=request))
    assert client.hget(f"{name}:robots", "https://long.example") is None


def test_a_stale_or_garbled_copy_is_fetched_again(client: redis.Redis, name: str) -> None:
    mw = _middleware(client, name, ttl=60)
    client.hset(f"{name}:robots", "https://example.com", encode_record(time.time() - 61, 200, BODY))
    assert mw.process_request(_robots_request()) is None
    client.hset(f"{name}:robots", "https://example.com", b"\xff" * 20)
    assert mw.process_request(_robots_request()) is None
    assert mw.stats.get_value("robotstxt/shared/garbage") == 1
    client.delete(f"{name}:robots")
    client.set(f"{name}:robots", "not a hash")
    assert mw.process_request(_robots_request()) is None  # WRONGTYPE: fetched, counted
    assert mw.stats.get_value("robotstxt/shared/errors") == 1


def test_redis_away_never_fails_a_robots_request(caplog: pytest.LogCaptureFixture) -> None:
    from scrapy_dist.testing.redis_server import free_port

    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    mw = _middleware(client, "away")
    request = _robots_request()
    assert mw.process_request(request) is None
    response = Response(ROBOTS, body=BODY, request=request)
    assert mw.process_response(request, response) is response
    assert mw.stats.get_value("robotstxt/shared/errors") == 2
    assert sum("Cannot share robots.txt" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("settings", "built"),
    [
        ({"ROBOTSTXT_OBEY": True}, True),
        ({"ROBOTSTXT_OBEY": False}, False),
        ({"ROBOTSTXT_OBEY": True, "ROBOTSTXT_SHARED_TTL": 0}, False),
    ],
    ids=["obey", "not-obeyed", "ttl-0"],
)
def test_it_is_on_with_robotstxt_obey(
    make_crawler: Callable[..., Crawler], settings: dict[str, Any], built: bool
) -> None:
    crawler = make_crawler(settings)
    if built:
        assert isinstance(SharedRobotsTxt.from_crawler(crawler), SharedRobotsTxt)
    else:
        with pytest.raises(NotConfigured):
            SharedRobotsTxt.from_crawler(crawler)
