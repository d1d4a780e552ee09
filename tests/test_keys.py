from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_dist.addon import with_defaults
from scrapy_dist.assembly import assemble
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.keys import RedisKeys, keys_from_settings


def settings(**values: object) -> Settings:
    s = Settings(values)
    s.freeze()
    return with_defaults(s)  # type: ignore[return-value]


def test_defaults_match_scrapy_redis() -> None:
    keys = keys_from_settings(settings(), "books")
    assert keys.requests == "books:requests"
    assert keys.dupefilter == "books:dupefilter"
    assert keys.start_urls == "books:start_urls"
    assert keys.dead == "books:dead"
    assert keys.workers == "books:workers"


def test_scrapy_redis_templates_are_honoured() -> None:
    keys = keys_from_settings(
        settings(
            SCHEDULER_QUEUE_KEY="q:%(spider)s",
            SCHEDULER_DUPEFILTER_KEY="df:%(spider)s",
            REDIS_START_URLS_KEY="seeds:%(name)s",
        ),
        "books",
    )
    assert (keys.requests, keys.dupefilter, keys.start_urls) == (
        "q:books",
        "df:books",
        "seeds:books",
    )


def test_bad_template_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="SCHEDULER_QUEUE_KEY"):
        keys_from_settings(settings(SCHEDULER_QUEUE_KEY="%(nope)s:requests"), "books")


def test_job_timestamp_isolates_every_crawl_key() -> None:
    day1 = datetime(2026, 11, 22, 23, 59, tzinfo=timezone.utc)
    day2 = datetime(2026, 11, 23, 0, 1, tzinfo=timezone.utc)
    s = settings(SCHEDULER_JOB_TIMESTAMP="%Y%m%d")
    k1, k2 = keys_from_settings(s, "books", day1), keys_from_settings(s, "books", day2)
    assert k1.requests == "books:20261122:requests"
    assert k2.requests == "books:20261123:requests"
    for a, b in zip(
        (k1.requests, k1.dupefilter, k1.start_urls, k1.dead, k1.workers, k1.seq),
        (k2.requests, k2.dupefilter, k2.start_urls, k2.dead, k2.workers, k2.seq),
        strict=True,
    ):
        assert a != b
        assert a.startswith("books:20261122:")


def test_job_id() -> None:
    keys = keys_from_settings(settings(SCHEDULER_JOB_ID="run7"), "books")
    assert keys.crawl == "books:run7"
    assert all(key.startswith("books:run7:") for key in keys.frontier())


def test_keys_fixed_once_per_crawler(make_crawler) -> None:  # type: ignore[no-untyped-def]
    crawler = make_crawler({"SCHEDULER_JOB_TIMESTAMP": "%H%M%S%f"})
    assert assemble(crawler).keys is assemble(crawler).keys


def test_spider_redis_key_template() -> None:
    keys = RedisKeys.build("books", job="j1")
    assert keys.start_urls_key("%(name)s:seeds") == "books:j1:seeds"
    assert keys.start_urls_key("literal") == "literal"


def test_the_job_stamp_comes_from_the_redis_servers_clock(  # type: ignore[no-untyped-def]
    make_crawler, client
) -> None:
    """One ``TIME`` call, when the crawler's keys are first built; none after."""
    crawler = make_crawler({"SCHEDULER_JOB_TIMESTAMP": "%Y%m%d%H%M"})

    def time_calls() -> int:
        return int(client.info("commandstats").get("cmdstat_time", {}).get("calls", 0))

    before = time_calls()
    keys = assemble(crawler).keys  # make_crawler built the spider, but nothing used keys yet
    seconds, _ = client.time()
    assert time_calls() == before + 2  # the keys' call and the test's own
    stamp = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y%m%d%H%M")
    assert keys.crawl.split(":")[-1] in {stamp, str(int(stamp) - 1)}
    assert assemble(crawler).keys is keys
    assert time_calls() == before + 2


def test_keys_are_named_after_the_spider_instance(make_crawler) -> None:  # type: ignore[no-untyped-def]
    from scrapy_dist.spiders import RedisSpider

    class Renamed(RedisSpider):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.name = f"{self.name}-renamed"

    crawler = make_crawler(spidercls=Renamed)
    keys = assemble(crawler).keys
    assert keys.crawl == crawler.spider.name
    assert crawler.spider.name.endswith("-renamed")
    assert crawler.spider.redis_key == keys.start_urls == f"{crawler.spider.name}:start_urls"
