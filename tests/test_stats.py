"""RedisStatsCollector: typed values, exact totals across workers, batched writes."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from scrapy_dist.keys import RedisKeys
from scrapy_dist.stats import (
    ITEMS_STAT,
    PAGES_STAT,
    RedisStatsCollector,
    SharedStats,
    decode_stats,
    decode_value,
    encode_value,
    parse_samples,
    rates,
)
from scrapy_dist.testing.redis_server import RedisServer, free_port
from scrapy_dist.testing.refusals import refuse_noreplicas, refuse_oom, refuse_readonly

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

STATS = {"STATS_CLASS": "scrapy_dist.stats.RedisStatsCollector"}

VALUES: list[Any] = [
    0,
    -7,
    2**62,
    1.5,
    3.0,
    1795427412.123456,  # a float timestamp: scrapy-redis turned these into datetimes
    1e16,
    float("inf"),
    datetime(2026, 11, 23, 19, 0, 0, 654321, tzinfo=timezone.utc),
    datetime(2026, 11, 22, 10, 30, 0, 123456, tzinfo=timezone(timedelta(hours=-5))),
    datetime(2020, 1, 1, 12, 0),  # naive
    "finished",
    "42",
    "",
    True,
    None,
    [1, "a"],
    {"k": 1.5},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_round_trip_with_their_types(value: Any) -> None:
    decoded = decode_value(encode_value(value).encode())
    assert decoded == value
    assert type(decoded) is type(value)


def collector(crawler: Crawler) -> RedisStatsCollector:
    stats = crawler.stats
    assert isinstance(stats, RedisStatsCollector)
    return stats


def test_values_round_trip_through_redis(make_crawler: Callable[..., Crawler]) -> None:
    stats = collector(make_crawler(STATS))
    for i, value in enumerate(VALUES):
        stats.set_value(f"v{i}", value)
    assert stats.flush()
    shared = stats.crawl_stats()
    for i, value in enumerate(VALUES):
        assert shared[f"v{i}"] == value
        assert type(shared[f"v{i}"]) is type(value)


def test_floats_and_timestamps_compare_without_crashing(
    make_crawler: Callable[..., Crawler],
) -> None:
    stats = collector(make_crawler(STATS))
    now = time.time()
    stats.set_value("elapsed_time_seconds", 12.25)
    stats.max_value("last_seen", now - 10)
    stats.max_value("last_seen", now)
    stats.min_value("first_seen", now)
    stats.min_value("first_seen", now - 10)
    stats.inc_value("bytes", 1.5)  # type: ignore[arg-type]  # floats add up too; Scrapy types int
    stats.inc_value("bytes", 2)
    assert stats.flush()
    shared = stats.crawl_stats()
    assert shared["elapsed_time_seconds"] == 12.25
    assert shared["last_seen"] == now
    assert shared["first_seen"] == now - 10
    assert shared["bytes"] == 3.5
    assert isinstance(shared["bytes"], float)


def test_two_workers_add_up_exactly(make_crawler: Callable[..., Crawler]) -> None:
    workers = [collector(make_crawler(STATS)) for _ in range(2)]
    rounds, per_round = 50, 100

    def work(stats: RedisStatsCollector, offset: int) -> None:
        for r in range(rounds):
            for i in range(per_round):
                stats.inc_value("pages")
                stats.inc_value("bytes", 0.5)  # type: ignore[arg-type]  # as above
                stats.max_value("max_depth", offset + r * per_round + i)
                stats.min_value("min_depth", offset + r * per_round + i)
            assert stats.flush()  # interleaves with the other worker's flushes

    threads = [threading.Thread(target=work, args=(s, i * 10**6)) for i, s in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared = workers[0].crawl_stats()
    assert shared["pages"] == 2 * rounds * per_round
    assert shared["bytes"] == rounds * per_round * 1.0
    assert shared["max_depth"] == 10**6 + rounds * per_round - 1
    assert shared["min_depth"] == 0
    for stats in workers:  # each keeps its own numbers
        assert stats.get_value("pages") == rounds * per_round


def test_changes_are_batched_until_a_flush(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    stats = collector(make_crawler({**STATS, "STATS_FLUSH_INTERVAL": 60}))
    stats.inc_value("a", 5, start=10)
    stats.inc_value("a")
    stats.set_value("b", 1)
    stats.inc_value("b", 2)
    stats.max_value("c", 3)
    stats.max_value("c", 9)
    assert not client.exists(f"{name}:stats")
    assert stats.flush()
    raw = cast("dict[bytes, bytes]", client.hgetall(f"{name}:stats"))  # bytes replies
    assert decode_stats(raw) == {"a": 16, "b": 3, "c": 9}
    assert stats.pending == 0


def test_start_and_finish_time_merge_across_workers(make_crawler: Callable[..., Crawler]) -> None:
    first, second = (collector(make_crawler(STATS)) for _ in range(2))
    t0 = datetime.now(timezone.utc)
    first.set_value("start_time", t0)
    second.set_value("start_time", t0 + timedelta(seconds=3))
    first.set_value("finish_time", t0 + timedelta(seconds=9))
    second.set_value("finish_time", t0 + timedelta(seconds=5))
    second.set_value("finish_reason", "finished")
    assert second.flush()
    assert first.flush()
    shared = first.crawl_stats()
    assert shared["start_time"] == t0
    assert shared["finish_time"] == t0 + timedelta(seconds=9)
    assert second.get_value("start_time") == t0 + timedelta(seconds=3)  # local value kept


def test_a_failed_flush_keeps_every_change(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    # Scrapy 2.13's test crawler counts log lines in its stats (log_count/WARNING, from
    # the failed flush's warning): only this test's own changes are counted here.
    stats = collector(make_crawler({**STATS, "LOG_LEVEL": "CRITICAL"}))
    working = stats.shared
    down = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    stats.shared = SharedStats(down, working.key, working.timeline)
    stats.inc_value("a", 2)
    assert not stats.flush()
    stats.inc_value("a", 3)
    stats.set_value("b", "x")
    assert stats.pending == 3  # and the failed flush, counted
    stats.shared = working
    assert stats.flush()
    raw = cast("dict[bytes, bytes]", client.hgetall(f"{name}:stats"))  # bytes replies
    assert decode_stats(raw) == {"a": 5, "b": "x", "stats/redis/unreachable": 1}


def test_close_flushes_and_logs_the_workers_own_stats(
    make_crawler: Callable[..., Crawler], caplog: pytest.LogCaptureFixture
) -> None:
    stats = collector(make_crawler({**STATS, "STATS_FLUSH_INTERVAL": 60}))
    other = collector(make_crawler(STATS))
    other.inc_value("item_scraped_count", 4)
    assert other.flush()
    stats.inc_value("item_scraped_count", 3)
    with caplog.at_level(logging.INFO):
        stats.close_spider(reason="finished")
    assert stats.crawl_stats()["item_scraped_count"] == 7
    dumped = [r.getMessage() for r in caplog.records if "Dumping Scrapy stats" in r.getMessage()]
    assert dumped
    assert "'item_scraped_count': 3" in dumped[0]


def test_increment_replaces_a_value_that_is_not_a_number(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    client.hset(f"{name}:stats", "a", "s:text")
    stats = collector(make_crawler(STATS))
    stats.inc_value("a", 2)
    assert stats.flush()
    assert stats.crawl_stats()["a"] == 2


def test_timeline_samples_give_crawl_rates(client: redis.Redis, name: str) -> None:
    keys = RedisKeys.build(name)
    shared = SharedStats(client, keys.stats, keys.timeline, window=1)
    shared.apply([("inc", "response_received_count", "10", "0")])
    time.sleep(1.1)
    shared.apply(
        [("inc", "response_received_count", "5", "0"), ("inc", "item_scraped_count", "2", "0")]
    )
    time.sleep(1.1)
    shared.apply([("inc", "response_received_count", "1", "0")])
    samples = parse_samples(cast("list[bytes]", client.zrange(keys.timeline, 0, -1)))
    # samples older than the window are trimmed, keeping the newest of them (the base)
    assert [(p, i) for _, p, i in samples] == [(15, 2), (16, 2)]
    now = samples[-1][0] + 0.5
    # one page since the base sample, over the seconds since it
    base = samples[0][0]
    assert rates(samples, 16, 2, now, window=1).pages_per_second == 1.0 / max(1.0, now - base)
    assert rates(samples, 16, 2, now + 5, window=1).pages_per_second == 0.0
    # a crawl younger than the window, one sample: everything since a flush before it (1 s)
    assert rates([(100, 3.0, 1.0)], 3.0, 1.0, 120.0, window=60).pages_per_second == 3.0 / 21


def test_a_young_crawl_is_measured_over_the_time_observed() -> None:
    # 16 s into a crawl at 2 pages/s, samples every 5 s (STATS_FLUSH_INTERVAL): 2 pages/s
    # over the 15 s since the first sample, not 32 pages over 60 s (0.5)
    samples = [(1000 + t, 2.0 * t, 1.0 * t) for t in (1, 6, 11, 16)]
    r = rates(samples, 32.0, 16.0, 1016.0, window=60)
    assert (r.window, r.pages_per_second, r.items_per_second) == (15.0, 2.0, 1.0)
    # no sample yet: nothing observed, not a rate over a minute
    assert rates([], 0.0, 0.0, 1016.0).window == 0.0


# -- Redis refusing writes: nothing lost, nothing counted twice, nothing raised -------


def _timeline_of_wrong_type(client: redis.Redis) -> Callable[[], object]:
    client.set("c:timeline", "oops")
    return lambda: client.delete("c:timeline")


def own_collector(
    make_crawler: Callable[..., Crawler], server: RedisServer, **kwargs: Any
) -> RedisStatsCollector:
    """A collector writing to ``server`` (which the test makes refuse writes)."""
    stats = collector(make_crawler({**STATS, "LOG_LEVEL": "CRITICAL"}))
    stats.shared = SharedStats(server.client(), "c:stats", "c:timeline")
    for name, value in kwargs.items():
        setattr(stats, name, value)
    return stats


@pytest.mark.redis_server
@pytest.mark.parametrize(
    ("fault", "code"),
    [
        (refuse_oom, "OOM"),
        (refuse_noreplicas, "NOREPLICAS"),
        (refuse_readonly, "READONLY"),
        (_timeline_of_wrong_type, "WRONGTYPE"),
    ],
    ids=["oom", "noreplicas", "readonly", "wrongtype"],
)
def test_a_refused_flush_keeps_its_deltas_for_the_next_one(
    make_crawler: Callable[..., Crawler],
    server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    fault: Callable[[redis.Redis], Callable[[], object]],
    code: str,
) -> None:
    stats = own_collector(make_crawler, server)
    admin = server.client()
    stats.inc_value(ITEMS_STAT, 5)
    stats.inc_value(PAGES_STAT, 7)
    assert stats.flush()
    restore = fault(admin)
    try:
        with caplog.at_level(logging.INFO, logger="scrapy_dist.stats"):
            for _ in range(3):
                stats.inc_value(ITEMS_STAT, 2)
                stats.max_value("depth", 4)
                assert not stats.flush()
    finally:
        restore()
    assert stats.flush()
    # nothing applied in part and sent again, nothing lost
    shared = decode_stats(cast("dict[str, str]", admin.hgetall("c:stats")))
    assert shared[ITEMS_STAT] == 11
    assert shared[PAGES_STAT] == 7
    assert shared["depth"] == 4
    assert shared[f"stats/redis/refused/{code}"] == 3
    # one line when the outage starts, one when it ends
    lines = [r.getMessage() for r in caplog.records]
    assert sum(f"refuses writes ({code}" in line for line in lines) == 1, lines
    assert sum("written to c:stats again" in line for line in lines) == 1, lines


@pytest.mark.redis_server
def test_close_retries_the_last_flush_until_redis_accepts(
    make_crawler: Callable[..., Crawler], server: RedisServer
) -> None:
    stats = own_collector(make_crawler, server, close_timeout=20.0)
    admin = server.client()
    stats.inc_value(ITEMS_STAT, 3)
    restore = refuse_oom(admin)
    lift = threading.Timer(1.5, restore)
    lift.start()
    try:
        stats.close_spider(reason="finished")
    finally:
        lift.join()
    shared = decode_stats(cast("dict[str, str]", admin.hgetall("c:stats")))
    assert shared[ITEMS_STAT] == 3


@pytest.mark.redis_server
def test_close_reports_what_it_could_not_write(
    make_crawler: Callable[..., Crawler], server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    stats = own_collector(make_crawler, server, close_timeout=1.0)
    stats.inc_value(ITEMS_STAT, 3)
    restore = refuse_oom(server.client())
    try:
        with caplog.at_level(logging.ERROR, logger="scrapy_dist.stats"):
            stats.close_spider(reason="finished")  # never raises
    finally:
        restore()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "within 1s" in errors[0]
    assert f'"{ITEMS_STAT}": [["inc", 3]]' in errors[0]


@pytest.mark.redis_server
def test_an_error_that_is_not_redis_keeps_the_deltas_and_never_raises(
    make_crawler: Callable[..., Crawler], server: RedisServer
) -> None:
    stats = own_collector(make_crawler, server)
    working = stats.shared

    class Broken(SharedStats):
        def apply(self, ops: Any) -> int:
            raise RuntimeError("a bug")

    stats.shared = Broken(server.client(), "c:stats", "c:timeline")
    stats.inc_value(ITEMS_STAT, 2)
    assert not stats.flush()
    stats.shared = working
    assert stats.flush()
    shared = decode_stats(cast("dict[str, str]", server.client().hgetall("c:stats")))
    assert shared[ITEMS_STAT] == 2
    assert shared["stats/redis/refused/ERR"] == 1
