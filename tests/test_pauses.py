"""Slot pauses: a Retry-After or a run of 429/503 responses pauses a download slot for
every worker of the crawl (issue 36), through ``lua/slot_pauses.lua``."""

from __future__ import annotations

import email.utils
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.http import Response
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from scrapy_dist.keys import RedisKeys
from scrapy_dist.slots import bound_slot
from scrapy_dist.testing.riders import carry
from scrapy_dist.worker.horizon import StartHorizon
from scrapy_dist.worker.pauses import SlotPauses, retry_after

if TYPE_CHECKING:
    import redis

    from scrapy_dist.worker.engine import SlotState

URL = "https://busy.example/page"


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def _pauses(
    name: str = "pauses", clock: Clock | None = None, **kwargs: Any
) -> tuple[SlotPauses, Clock]:
    clock = clock or Clock()
    settings = {"longest": 300.0, "backoff_after": 3, "backoff": 10.0, **kwargs}
    frontier: Any = SimpleNamespace(keys=RedisKeys.build(name))
    stats = MemoryStatsCollector(get_crawler())
    return (
        SlotPauses(frontier, lambda r: r.url.split("/")[2], stats, clock=clock, **settings),
        clock,
    )


def _response(status: int, retry: str | None = None) -> Response:
    headers = {"Retry-After": retry} if retry is not None else {}
    return Response(URL, status=status, headers=headers, request=Request(URL))


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after(b"120") == 120.0
    assert retry_after(" 7 ") == 7.0
    now = time.time()
    date = email.utils.formatdate(now + 60, usegmt=True)
    assert retry_after(date, now=now) == pytest.approx(60.0, abs=1.0)
    assert retry_after(email.utils.formatdate(now - 60, usegmt=True), now=now) == 0.0
    for garbage in (None, b"", b"soon", b"-5", b"1e9999", "Mon, 99 Foo 2026"):
        assert retry_after(garbage) is None


def test_a_long_or_unencodable_slot_is_named_by_its_hash() -> None:
    assert bound_slot("example.com") == "example.com"
    assert bound_slot("x" * 500).startswith("sha1:")
    assert bound_slot("\udcff").startswith("sha1:")


def test_retry_after_pauses_the_slot_at_once_cut_to_the_longest() -> None:
    pauses, clock = _pauses(longest=60.0)
    request = Request(URL)
    pauses.downloaded(_response(429, "30"), request)
    assert pauses.left("busy.example") == pytest.approx(30.0)
    pauses.downloaded(_response(503, "3600"), request)
    assert pauses.left("busy.example") == pytest.approx(60.0)
    clock.now += 61
    assert pauses.left("busy.example") == 0.0
    assert pauses.left("other.example") == 0.0


def test_a_run_of_slow_downs_backs_off_doubling_and_another_response_starts_over() -> None:
    pauses, clock = _pauses()
    request = Request(URL)
    for _ in range(2):
        pauses.downloaded(_response(503), request)
    assert pauses.left("busy.example") == 0.0  # two in a row: not a run yet
    pauses.downloaded(_response(429), request)
    assert pauses.left("busy.example") == pytest.approx(10.0)
    for _ in range(3):
        pauses.downloaded(_response(503), request)
    assert pauses.left("busy.example") == pytest.approx(20.0)  # the second run: doubled
    clock.now += 30
    pauses.downloaded(_response(200), request)  # the site answers again
    for _ in range(3):
        pauses.downloaded(_response(503), request)
    assert pauses.left("busy.example") == pytest.approx(10.0)
    pauses.downloaded(_response(404), request)
    pauses.downloaded(_response(500), request)
    assert pauses.left("busy.example") == pytest.approx(10.0)


def test_runs_pause_nothing_when_turned_off() -> None:
    pauses, _ = _pauses(backoff_after=0)
    for _ in range(10):
        pauses.downloaded(_response(503), Request(URL))
    assert pauses.left("busy.example") == 0.0


def test_a_pause_reaches_every_worker_through_redis(client: redis.Redis, name: str) -> None:
    first, _ = _pauses(name)
    second, clock = _pauses(name)
    first.downloaded(_response(429, "40"), Request(URL))
    carry(first.rider, client)
    assert second.left("busy.example") == 0.0
    carry(second.rider, client)
    assert second.left("busy.example") == pytest.approx(40.0, abs=0.5)
    assert second.rider() is None  # read about once a second, not at every flush
    clock.now += 1.0
    assert second.rider() is not None
    key = RedisKeys.build(name).slot_pauses
    assert 0 < client.pttl(key) <= 301_000  # gone a longest pause after the last write


def test_garbage_in_the_pauses_key_is_set_aside_or_cut(client: redis.Redis, name: str) -> None:
    key = RedisKeys.build(name).slot_pauses
    client.set(key, "not a zset")
    pauses, clock = _pauses(name, longest=60.0)
    carry(pauses.rider, client)
    assert client.get(f"{key}:wrongtype") == b"not a zset"
    assert pauses.until == {}
    client.zadd(key, {"far.example": 1e15, "gone.example": 1})
    clock.now += 1.0
    carry(pauses.rider, client)
    assert pauses.left("far.example") == pytest.approx(60.0, abs=0.5)  # cut to the longest
    assert pauses.left("gone.example") == 0.0
    assert client.zscore(key, "gone.example") is None


def test_a_failed_read_keeps_its_writes_for_the_next(client: redis.Redis, name: str) -> None:
    pauses, clock = _pauses(name)
    pauses.downloaded(_response(429, "20"), Request(URL))
    read = pauses.rider()
    assert read is not None
    read.on_reply(ConnectionError("Redis went away"))
    clock.now += 1.0
    carry(pauses.rider, client)
    assert client.zscore(RedisKeys.build(name).slot_pauses, "busy.example") is not None


def test_the_horizon_counts_a_pause_as_a_wait() -> None:
    pauses, clock = _pauses()

    def slot_of(request: Request) -> SlotState:
        from scrapy_dist.worker.engine import SlotState

        return SlotState(request.url.split("/")[2], True, 0.0, 0.0)

    horizon = StartHorizon(1.0, slot_of, lambda key: 0.0, paused=pauses.left, clock=clock)
    pauses.downloaded(_response(503, "5"), Request(URL))
    assert horizon.pick([Request(URL), Request(URL)]) == (None, 2)
    assert horizon.until == pytest.approx(clock.now + 5.0)  # not sent before the pause ends
    assert horizon.pick([Request(URL), Request("https://calm.example/")]) == (1, 1)


def test_a_pause_whose_flush_brought_no_reply_is_written_again(
    client: redis.Redis, name: str
) -> None:
    pauses, clock = _pauses(name)
    pauses.downloaded(_response(429, "20"), Request(URL))
    assert pauses.rider() is not None  # its flush failed as a whole: no reply at all
    clock.now += 1.0
    carry(pauses.rider, client)
    assert client.zscore(RedisKeys.build(name).slot_pauses, "busy.example") is not None


def test_with_the_queue_per_slot_a_pause_names_the_host_too(client: redis.Redis, name: str) -> None:
    """With ``CONCURRENT_REQUESTS_PER_IP`` Scrapy's downloader names the slot by the
    host's address (``meta["download_slot"]``); the queue per slot names the site's new
    requests by their host. Both are paused, so the queue holds the site's requests in
    Redis. (Before, only the address was: two workers of the queue per slot sent 2 and
    4 of one host's requests during its 3 s Retry-After; 0 and 0 after.)"""
    frontier: Any = SimpleNamespace(keys=RedisKeys.build(name))
    stats = MemoryStatsCollector(get_crawler())
    pauses = SlotPauses(
        frontier,
        lambda r: r.meta["download_slot"],
        stats,
        longest=300.0,
        backoff_after=3,
        backoff=10.0,
        host_too=True,
        clock=Clock(),
    )
    request = Request(URL, meta={"download_slot": "10.0.0.1"})
    pauses.downloaded(_response(429, "30"), request)
    assert pauses.left("10.0.0.1") == pytest.approx(30.0)
    assert pauses.left("busy.example") == pytest.approx(30.0)
    assert stats.get_value("scheduler/slots/paused") == 1  # one pause, two names
    carry(pauses.rider, client)
    stored = client.zrange(RedisKeys.build(name).slot_pauses, 0, -1)
    assert sorted(stored) == [b"10.0.0.1", b"busy.example"]
    # without the queue per slot, the slot alone
    alone, _ = _pauses(name + "-alone")
    alone.slot_key = lambda r: r.meta["download_slot"]
    alone.downloaded(_response(429, "30"), request)
    assert alone.left("10.0.0.1") == pytest.approx(30.0)
    assert alone.left("busy.example") == 0.0
