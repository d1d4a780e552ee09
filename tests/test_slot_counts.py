"""Requests counted per download slot for the whole crawl, and the per-slot page limit
(issue 36), through ``lua/slot_counts.lua``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, signals
from scrapy.http import Response
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_dist.cli.status import _slot_lines
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.keys import RedisKeys
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.status import read_slot_counts
from scrapy_dist.testing.riders import carry
from scrapy_dist.worker.slot_counts import SlotCounts

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from scrapy.crawler import Crawler


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def _counts(name: str = "counts", limit: int = 0, epoch: str = "") -> tuple[SlotCounts, Clock]:
    clock = Clock()
    frontier: Any = SimpleNamespace(keys=RedisKeys.build(name), epoch=epoch)
    stats = MemoryStatsCollector(get_crawler())
    host = lambda r: r.url.split("/")[2]  # noqa: E731
    return SlotCounts(frontier, host, stats, limit=limit, clock=clock), clock


def _crawl(counts: SlotCounts, url: str, status: int | None) -> None:
    """One request through the downloader: sent, then answered with ``status`` (``None``:
    failed), then gone."""
    request = Request(url)
    counts.reached(request)
    if status is not None:
        counts.downloaded(Response(url, status=status, request=request), request)
    counts.left(request)


def test_every_worker_s_counts_add_up_in_redis(client: redis.Redis, name: str) -> None:
    first, _ = _counts(name)
    second, _ = _counts(name)
    for status in (200, 200, 404, 503, None):
        _crawl(first, "https://a.example/x", status)
    _crawl(second, "https://a.example/y", 200)
    _crawl(second, "https://b.example/", None)
    carry(first.rider, client)
    carry(second.rider, client)
    assert first.rider() is None  # written about once a second, not at every flush
    counted, busiest = read_slot_counts(client, RedisKeys.build(name))
    assert counted == 2
    assert busiest == [
        {"slot": "a.example", "sent": 6, "pages": 5, "4xx": 1, "5xx": 1, "failed": 1, "started": 0},
        {"slot": "b.example", "sent": 1, "pages": 0, "4xx": 0, "5xx": 0, "failed": 1, "started": 0},
    ]


def test_a_failed_write_keeps_its_counts_for_the_next(client: redis.Redis, name: str) -> None:
    counts, clock = _counts(name)
    _crawl(counts, "https://a.example/", 200)
    read = counts.rider()
    assert read is not None
    read.on_reply(ConnectionError("Redis went away"))
    _crawl(counts, "https://a.example/", 200)
    clock.now += 1.0
    carry(counts.rider, client)
    assert client.zscore(RedisKeys.build(name).slot_sent, "a.example") == 2
    assert counts.stats.get_value("scheduler/slots/count_errors") == 1


def test_a_write_whose_flush_brought_no_reply_is_sent_again(client: redis.Redis, name: str) -> None:
    counts, clock = _counts(name, limit=10)
    for _ in range(3):
        _crawl(counts, "https://a.example/", 200)
        assert not counts.over(Request("https://a.example/"))
    assert counts.rider() is not None  # its flush failed as a whole: no reply at all
    _crawl(counts, "https://a.example/", 200)
    clock.now += 1.0
    carry(counts.rider, client)
    keys = RedisKeys.build(name)
    assert client.zscore(keys.slot_sent, "a.example") == 4
    assert client.hget(keys.slot_counts, "started:a.example") == b"3"
    assert counts.started == {"a.example": 3}


def test_the_counts_of_a_finished_run_do_not_bring_its_keys_back(
    client: redis.Redis, name: str
) -> None:
    keys = RedisKeys.build(name)
    client.set(keys.epoch, "run-1")
    counts, clock = _counts(name, limit=5, epoch="run-1")
    assert not counts.over(Request("https://a.example/"))
    carry(counts.rider, client)
    assert client.exists(keys.slot_counts)
    client.delete(keys.epoch, keys.slot_sent, keys.slot_counts)  # the run finished
    assert not counts.over(Request("https://a.example/"))
    _crawl(counts, "https://a.example/", 200)
    clock.now += 1.0
    carry(counts.rider, client)
    assert not client.exists(keys.slot_sent, keys.slot_counts)
    assert counts.stats.get_value("scheduler/slots/count_writes_fenced") == 1
    assert counts.started == {}


def test_writes_and_reads_are_cut_to_a_thousand_slots_a_flush(
    client: redis.Redis, name: str
) -> None:
    counts, clock = _counts(name)
    for i in range(1500):
        _crawl(counts, f"https://h{i}.example/", 200)
    carry(counts.rider, client)
    assert client.zcard(RedisKeys.build(name).slot_sent) == 1000
    clock.now += 1.0
    carry(counts.rider, client)
    assert client.zcard(RedisKeys.build(name).slot_sent) == 1500


def test_garbage_in_the_count_keys_is_set_aside_or_restarted(
    client: redis.Redis, name: str
) -> None:
    keys = RedisKeys.build(name)
    client.set(keys.slot_sent, "not a zset")
    client.hset(keys.slot_counts, mapping={"pages:a.example": "many"})
    client.zadd(keys.slot_sent + "x", {"unrelated": 1})
    counts, _ = _counts(name)
    _crawl(counts, "https://a.example/", 200)
    carry(counts.rider, client)
    assert client.get(f"{keys.slot_sent}:wrongtype") == b"not a zset"
    assert client.zscore(keys.slot_sent, "a.example") == 1
    assert client.hget(keys.slot_counts, "pages:a.example") == b"1"  # restarted
    client.delete(keys.slot_counts)
    client.set(keys.slot_counts, "not a hash")
    assert read_slot_counts(client, keys)[1][0]["pages"] == 0  # read as none
    client.delete(keys.slot_sent)
    client.set(keys.slot_sent, "x")
    assert read_slot_counts(client, keys) == (0, [])


def test_the_limit_adds_the_crawl_s_starts_to_this_worker_s(client: redis.Redis, name: str) -> None:
    other, _ = _counts(name, limit=5)
    for i in range(3):
        assert not other.over(Request(f"https://a.example/{i}"))  # started: counted
    carry(other.rider, client)
    counts, clock = _counts(name, limit=5)
    request = Request("https://a.example/next")
    assert not counts.over(request)  # 1 here, 3 of the other's not read yet
    carry(counts.rider, client)  # the crawl started 4 (3 of the other's, 1 of this worker's)
    assert counts.started == {"a.example": 4}
    assert not counts.over(request)  # 5: counted here at once
    assert counts.over(request)
    assert not counts.over(Request("https://b.example/"))
    clock.now += 0.25
    carry(counts.rider, client)
    assert counts.started == {"a.example": 5, "b.example": 1}
    fields = client.hgetall(RedisKeys.build(name).slot_counts)
    assert fields[b"started:a.example"] == b"5"


def test_a_count_that_is_not_an_integer_reads_as_none(client: redis.Redis, name: str) -> None:
    client.hset(RedisKeys.build(name).slot_counts, "started:a.example", "1.5")
    counts, _ = _counts(name, limit=5)
    assert not counts.over(Request("https://a.example/"))
    read = counts.rider()
    assert read is not None
    # (the write restarts it first: HINCRBY fails on "1.5", HSET writes this call's 1)
    read.on_reply(client.execute_command(*read.command.args))  # type: ignore[no-untyped-call]
    assert counts.started == {"a.example": 1}


def test_no_limit_reads_nothing(client: redis.Redis, name: str) -> None:
    counts, _ = _counts(name)
    _crawl(counts, "https://a.example/", 200)
    assert not counts.over(Request("https://a.example/"))
    read = counts.rider()
    assert read is not None
    # one slot: sent 1, pages 1, 4xx, 5xx, failed and started 0; no slot read after it
    assert read.command.args[-8:] == ("a.example", 1, 1, 0, 0, 0, 0, "started")
    assert counts.started == {}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"SCHEDULER_SLOT_PAGE_LIMIT": -1}, "SCHEDULER_SLOT_PAGE_LIMIT cannot be negative"),
        (
            {"SCHEDULER_SLOT_PAGE_LIMIT": 5, "SCHEDULER_SLOT_COUNTS": False},
            "SCHEDULER_SLOT_PAGE_LIMIT needs SCHEDULER_SLOT_COUNTS",
        ),
    ],
    ids=["negative", "without-counts"],
)
def test_a_limit_out_of_range_is_refused(
    make_crawler: Callable[..., Crawler], settings: dict[str, Any], message: str
) -> None:
    from scrapy_dist.assembly import assemble

    with pytest.raises(ConfigurationError, match=message):
        _ = assemble(make_crawler(settings)).config.scheduler


def test_a_scheduler_drops_the_requests_of_a_slot_at_its_limit(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    crawler = make_crawler({"SCHEDULER_SLOT_PAGE_LIMIT": 2, "SCHEDULER_PERSIST": True})
    scheduler = build_from_crawler(Scheduler, crawler)
    assert scheduler.slot_counts is not None
    holding: set[Request] = set()
    scheduler.deliveries.in_flight = lambda: holding
    assert crawler.spider is not None
    dropped: list[Request] = []

    def on_dropped(request: Request, spider: object) -> None:
        dropped.append(request)

    crawler.signals.connect(on_dropped, signal=signals.request_dropped)
    scheduler.open(crawler.spider)
    try:
        for url in ("https://a.example/1", "https://b.example/1", "https://a.example/2"):
            scheduler.enqueue_request(Request(url))
        # the crawl started two of a.example, which this worker met: read with the next
        # flush
        client.hset(scheduler.frontier.keys.slot_counts, "started:a.example", 2)
        scheduler.slot_counts.started["a.example"] = 0
        request = scheduler.next_request()
        assert request is not None
        assert request.url == "https://b.example/1"
        holding.add(request)  # (in the engine)
        assert scheduler.next_request() is None
        assert sorted(r.url for r in dropped) == ["https://a.example/1", "https://a.example/2"]
        assert scheduler.stats.get_value("scheduler/slot_limit/dropped") == 2
        scheduler.frontier.flush()
        # the dropped requests' leases were acknowledged: only b.example's is held
        assert scheduler.deliveries.held() == [scheduler.deliveries.out[request]]
        assert scheduler.frontier.pending_settlements == 0
        assert client.hlen(scheduler.frontier.keys.holding(scheduler.frontier.worker_id)) == 1
    finally:
        scheduler.close("finished")


def test_status_shows_the_busiest_slots(client: redis.Redis, name: str) -> None:
    counts, _ = _counts(name)
    for code in (200, 500):
        _crawl(counts, "https://a.example/", code)
    carry(counts.rider, client)
    slots, busiest = read_slot_counts(client, RedisKeys.build(name))
    status: Any = SimpleNamespace(slots_counted=slots, busiest_slots=busiest)
    assert _slot_lines(status) == [
        "  download slots: 1 counted; most requests sent:",
        "    a.example: 2 sent, 2 pages (0 4xx, 1 5xx), 0 failed",
    ]


def test_a_slot_known_to_be_over_its_limit_is_not_queued(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    crawler = make_crawler({"SCHEDULER_SLOT_PAGE_LIMIT": 1, "SCHEDULER_PERSIST": True})
    scheduler = build_from_crawler(Scheduler, crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    try:
        assert scheduler.slot_counts is not None
        assert scheduler.enqueue_request(Request("https://a.example/1"))
        scheduler.slot_counts.started["a.example"] = 1  # (as a read would find it)
        assert not scheduler.enqueue_request(Request("https://a.example/2"))
        assert scheduler.enqueue_request(Request("https://b.example/1"))
        assert scheduler.stats.get_value("scheduler/slot_limit/dropped") == 1
    finally:
        scheduler.close("finished")


def test_one_call_drops_at_most_so_many_then_the_engine_asks_again(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    from scrapy_dist.scheduler import DROPS_PER_CALL

    crawler = make_crawler(
        {
            "SCHEDULER_SLOT_PAGE_LIMIT": 1,
            "SCHEDULER_PERSIST": True,
            "SCHEDULER_QUEUE_CLASS": "scrapy_dist.queue.FifoQueue",
        }
    )
    scheduler = build_from_crawler(Scheduler, crawler)
    holding: set[Request] = set()
    scheduler.deliveries.in_flight = lambda: holding
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    try:
        assert scheduler.slot_counts is not None
        for i in range(DROPS_PER_CALL + 5):
            scheduler.enqueue_request(Request(f"https://a.example/{i}"))
        scheduler.enqueue_request(Request("https://b.example/"))
        client.hset(scheduler.frontier.keys.slot_counts, "started:a.example", 1)
        scheduler.slot_counts.started["a.example"] = 1
        assert scheduler.next_request() is None  # DROPS_PER_CALL dropped, then asked again
        assert scheduler.stats.get_value("scheduler/slot_limit/dropped") == DROPS_PER_CALL
        request = scheduler.next_request()
        assert request is not None
        assert request.url == "https://b.example/"
        assert scheduler.stats.get_value("scheduler/slot_limit/dropped") == DROPS_PER_CALL + 5
    finally:
        scheduler.close("finished")


def test_a_limit_that_fails_is_dropped_not_the_request(
    make_crawler: Callable[..., Crawler], caplog: pytest.LogCaptureFixture
) -> None:
    crawler = make_crawler({"SCHEDULER_SLOT_PAGE_LIMIT": 3, "SCHEDULER_PERSIST": True})
    scheduler = build_from_crawler(Scheduler, crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    try:
        counts = scheduler.slot_counts
        assert counts is not None

        def broken(request: Request) -> str:
            raise RuntimeError("no slot")

        counts.slot_key = broken
        scheduler.enqueue_request(Request("https://a.example/"))
        request = scheduler.next_request()
        assert request is not None
        assert counts.limit == 0
        assert "The download slot page limit failed" in caplog.text
    finally:
        scheduler.close("finished")


def test_a_closing_worker_writes_its_last_counts(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    crawler = make_crawler({"SCHEDULER_PERSIST": True})
    scheduler = build_from_crawler(Scheduler, crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    counts = scheduler.slot_counts
    assert counts is not None
    _crawl(counts, "https://a.example/", 200)
    counts._next_write = counts.clock() + 60  # (not due for a while)
    scheduler.close("finished")
    assert client.zscore(scheduler.frontier.keys.slot_sent, "a.example") == 1


def test_a_count_written_by_hand_as_inf_reads_as_none(client: redis.Redis, name: str) -> None:
    keys = RedisKeys.build(name)
    client.zadd(keys.slot_sent, {"a.example": float("inf")})
    client.hset(keys.slot_counts, mapping={"pages:a.example": "inf", "4xx:a.example": "1.5"})
    assert read_slot_counts(client, keys) == (
        1,
        [
            {
                "slot": "a.example",
                "sent": 0,
                "pages": 0,
                "4xx": 0,
                "5xx": 0,
                "failed": 0,
                "started": 0,
            }
        ],
    )
