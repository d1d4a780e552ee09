"""RedisSpider seeds from Redis, dead letters, seed modes and idle handling."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import pytest
import scrapy
from scrapy import Request
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.utils.misc import build_from_crawler

from scrapy_dist.scheduler import Scheduler
from scrapy_dist.spiders import RedisCrawlSpider, RedisSpider
from scrapy_dist.testing.leases import leased_count
from scrapy_dist.worker.startup import start_failure

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from scrapy.crawler import Crawler


class Spider(RedisSpider):
    name = "unused"
    redis_key: str  # one key in these tests

    def parse(self, response: Any) -> Any:
        return None

    def parse_item(self, response: Any) -> Any:
        return None


@pytest.fixture
def spider(make_crawler: Callable[..., Crawler]) -> Callable[..., Spider]:
    def make(settings: dict[str, Any] | None = None, cls: type[Spider] = Spider) -> Spider:
        made = make_crawler(settings, spidercls=cls).spider
        assert isinstance(made, cls)
        return made

    return make


def test_default_key_and_batch_size(spider: Callable[..., Spider], name: str) -> None:
    s = spider({"CONCURRENT_REQUESTS": 7})
    assert s.redis_key == f"{name}:start_urls"
    assert s.redis_batch_size == 7
    assert spider({"REDIS_START_URLS_BATCH_SIZE": 3}).redis_batch_size == 3


def test_every_seed_format_and_bad_seeds_go_to_dead_letters(
    spider: Callable[..., Spider], client: redis.Redis
) -> None:
    s = spider()
    good = [
        "https://e.com/plain",
        json.dumps({"url": "https://e.com/post", "method": "POST", "formdata": {"p": "1"}}),
        json.dumps({"url": "https://e.com/json", "json": {"a": 1}, "callback": "parse_item"}),
        json.dumps({"url": "https://e.com/h", "headers": {"X": "y"}, "body": "b"}),
    ]
    bad = ["no scheme.com", "{oops", json.dumps({"url": "https://e.com/", "callback": "zzz"})]
    client.rpush(s.redis_key, *good[:2], *bad, *good[2:], b"\xff\xfe")
    requests = s.next_requests()
    assert [r.url for r in requests] == [
        "https://e.com/plain",
        "https://e.com/post",
        "https://e.com/json",
        "https://e.com/h",
    ]
    assert requests[2].callback == s.parse_item
    dead = [json.loads(d) for d in client.lrange(f"{s.name}:dead", 0, -1)]
    assert [d["data"] for d in dead] == [*bad, {"$b": "\xff\xfe"}]
    assert all(d["kind"] == "seed" and d["reason"] and d["key"] == s.redis_key for d in dead)
    assert "zzz" in dead[2]["reason"]
    stats = s.crawler.stats.get_stats()
    assert stats["seeds/fetched"] == 8
    assert stats["seeds/invalid"] == 4
    assert client.llen(s.redis_key) == 0
    assert leased_count(client, s.name) == 0  # bad seeds settled with their records


def test_batches(spider: Callable[..., Spider], client: redis.Redis) -> None:
    s = spider({"REDIS_START_URLS_BATCH_SIZE": 2})
    client.rpush(s.redis_key, *[f"https://e.com/{i}" for i in range(5)])
    assert [len(s.next_requests()) for _ in range(4)] == [2, 2, 1, 0]


def test_set_and_zset_modes(spider: Callable[..., Spider], client: redis.Redis) -> None:
    s = spider({"REDIS_START_URLS_AS_SET": True})
    client.sadd(s.redis_key, "https://e.com/a", "https://e.com/b")
    assert sorted(r.url for r in s.next_requests()) == ["https://e.com/a", "https://e.com/b"]
    client.delete(s.redis_key)
    z = spider({"REDIS_START_URLS_AS_ZSET": True, "REDIS_START_URLS_BATCH_SIZE": 1})
    client.zadd(z.redis_key, {"https://e.com/low": 1, "https://e.com/high": 9})
    assert [r.url for r in z.next_requests()] == ["https://e.com/high"]
    # both set: the set wins, with a warning, as in scrapy-redis (this used to stop)
    both = spider({"REDIS_START_URLS_AS_SET": True, "REDIS_START_URLS_AS_ZSET": True})
    assert both.seeds.kind == "set"


def test_user_override_errors_are_dead_lettered(
    spider: Callable[..., Spider], client: redis.Redis
) -> None:
    class Custom(Spider):
        def make_request_from_data(self, data: bytes) -> Request | None:
            if data == b"skip":
                return None
            if data == b"boom":
                raise RuntimeError("cannot parse")
            return Request(data.decode())

    s = spider(cls=Custom)
    client.rpush(s.redis_key, b"https://e.com/1", b"boom", b"skip", b"https://e.com/2")
    assert [r.url for r in s.next_requests()] == ["https://e.com/1", "https://e.com/2"]
    [dead] = [json.loads(d) for d in client.lrange(f"{s.name}:dead", 0, -1)]
    assert dead["reason"] == "RuntimeError: cannot parse"
    assert s.crawler.stats.get_value("seeds/skipped") == 1


def test_start_yields_waiting_seeds(spider: Callable[..., Spider], client: redis.Redis) -> None:
    s = spider()
    client.rpush(s.redis_key, "https://e.com/1", "https://e.com/2")

    async def collect() -> list[Any]:
        return [r async for r in s.start()]

    assert [r.url for r in asyncio.run(collect())] == ["https://e.com/1", "https://e.com/2"]


def test_start_refuses_a_seeds_key_of_the_wrong_type(
    spider: Callable[..., Spider], client: redis.Redis
) -> None:
    s = spider()
    client.sadd(s.redis_key, "https://e.com/")
    build_from_crawler(Scheduler, s.crawler).open(s)  # checks the seeds key too
    failure = start_failure(s.crawler)
    assert failure is not None
    assert "holds a set" in failure.message
    assert "REDIS_START_URLS_AS_SET" in failure.message

    async def collect() -> list[Any]:
        return [r async for r in s.start()]

    assert asyncio.run(collect()) == []  # nothing read from the key
    with pytest.raises(CloseSpider) as info:
        s._on_idle()
    assert info.value.reason == "configuration_error"
    assert client.scard(s.redis_key) == 1


def test_spider_arguments_are_coerced(make_crawler: Callable[..., Crawler], name: str) -> None:
    """``scrapy crawl -a`` passes strings."""

    class Args(Spider):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(
                **{
                    "max_idle_time": "4",
                    "redis_batch_size": "3",
                    "redis_key": "%(name)s:mine",
                    **kwargs,
                }
            )

    s = make_crawler(spidercls=Args).spider
    assert isinstance(s, Args)
    assert (s.max_idle_time, s.redis_batch_size) == (4.0, 3)
    assert s.redis_key == f"{name}:mine"
    assert s.frontier.seeds.key == s.redis_key  # the frontier reads the spider's key
    assert start_failure(s.crawler) is None
    with pytest.raises(DontCloseSpider):
        s._on_idle()  # a number, not a string compared with one


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("max_idle_time", "soon"),
        ("max_idle_time", "-1"),
        ("redis_batch_size", "0"),
        ("redis_batch_size", "2.5"),
        ("redis_batch_size", "1000000000"),
        ("redis_encoding", "klingon"),
        ("redis_key", " "),
    ],
)
def test_bad_spider_arguments_fail_the_start(
    make_crawler: Callable[..., Crawler], argument: str, value: str
) -> None:
    class Args(Spider):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**{argument: value, **kwargs})

    crawler = make_crawler(spidercls=Args)
    failure = start_failure(crawler)
    assert failure is not None
    assert failure.reason == "configuration_error"
    assert f"{argument}={value!r}" in failure.message


@pytest.mark.parametrize(
    ("attribute", "value"),
    [("redis_key", ""), ("redis_key", []), ("redis_batch_size", "x"), ("max_idle_time", "x")],
)
def test_setup_redis_called_directly_raises_value_error_as_scrapy_redis_does(
    make_crawler: Callable[..., Crawler], attribute: str, value: Any
) -> None:
    """scrapy-redis's contract (its own tests call setup_redis() and expect ValueError);
    from_crawler still reports the same as a one-line start-up failure."""
    crawler = make_crawler()
    spider = RedisSpider(name="direct")
    spider.crawler = crawler
    setattr(spider, attribute, value)
    with pytest.raises(ValueError, match=attribute):
        spider.setup_redis()


def test_a_seeds_url_requested_again_is_crawled_as_on_scrapy_redis(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """A seed is ``dont_filter``, and Scrapy records no ``dont_filter`` request as seen:
    its page yielding ``Request(response.url, callback=...)`` (a public scrapy-redis
    project does so for a one-page listing) is crawled. Seeds' fingerprints were
    recorded, and that request was filtered: 24 of the project's 144 items lost."""
    crawler = make_crawler({"SCHEDULER_FLUSH_INTERVAL": 0}, spidercls=Spider)
    spider = crawler.spider
    assert isinstance(spider, Spider)
    scheduler = build_from_crawler(Scheduler, crawler)
    scheduler.open(spider)
    try:
        client.lpush(spider.redis_key, "https://e.com/list")
        [seed] = spider.next_requests()
        assert seed.dont_filter
        assert scheduler.enqueue_request(seed)
        again = Request("https://e.com/list", callback=spider.parse_item)
        assert scheduler.enqueue_request(again)  # not a duplicate of the seed
        assert not scheduler.enqueue_request(again.copy())  # but of itself
    finally:
        scheduler.close("finished")


def test_idle_close_after_max_idle_time(spider: Callable[..., Spider]) -> None:
    s = spider({"MAX_IDLE_TIME_BEFORE_CLOSE": 0.3})
    with pytest.raises(DontCloseSpider):
        s._on_idle()  # idleness starts now, not at import or spider creation
    time.sleep(0.35)
    s._on_idle()  # past the limit: no DontCloseSpider, the spider may close


def test_activity_resets_idleness(spider: Callable[..., Spider]) -> None:
    s = spider({"MAX_IDLE_TIME_BEFORE_CLOSE": 0.2})
    with pytest.raises(DontCloseSpider):
        s._on_idle()
    time.sleep(0.25)
    s._on_activity()
    with pytest.raises(DontCloseSpider):
        s._on_idle()


def test_zero_waits_forever(spider: Callable[..., Spider]) -> None:
    s = spider({"MAX_IDLE_TIME_BEFORE_CLOSE": 0})
    s._idle_since = time.monotonic() - 10_000
    with pytest.raises(DontCloseSpider):
        s._on_idle()


def test_crawl_spider(make_crawler: Callable[..., Crawler], client: redis.Redis) -> None:
    class Crawl(RedisCrawlSpider):
        name = "unused"
        redis_key: str

    s = make_crawler(spidercls=Crawl).spider
    assert isinstance(s, Crawl)
    client.rpush(s.redis_key, "https://e.com/")
    assert [r.url for r in s.next_requests()] == ["https://e.com/"]


def test_a_redis_spider_refuses_an_engine_without_its_slot(
    spider: Callable[..., Spider],
) -> None:
    """The spider wakes the engine through its private slot: under a scheduler that
    does not check the engine, the spider's own open does, and refuses to start."""

    class RenamedEngine:
        def __init__(self) -> None:
            self.slot_v3 = object()

    s = spider({"SCHEDULER": "scrapy.core.scheduler.Scheduler"})
    s.crawler.engine = RenamedEngine()  # type: ignore[assignment]
    s._on_opened(s)
    failure = start_failure(s.crawler)
    assert failure is not None
    assert failure.reason == "configuration_error"
    assert f"Scrapy {scrapy.__version__} has no engine._slot" in failure.message
    assert s._idle_ticker is None  # never wakes the engine
    with pytest.raises(CloseSpider) as info:
        s.spider_idle()
    assert info.value.reason == "configuration_error"
