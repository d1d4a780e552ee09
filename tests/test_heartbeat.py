"""The scheduler's timer (:mod:`scrapy_dist.worker.heartbeat`): what one tick does and in
which order, when it heartbeats and renews, and that no error ends it.

Its clock is the test's (:class:`Clock`), so nothing here depends on how fast the
machine runs. Most tests drive it with recording stand-ins for its parts; the last ones
drive a real worker's timer on a real Redis.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis
from scrapy import Request
from scrapy.utils.test import get_crawler

from scrapy_dist.testing.engine import HeldRequests
from scrapy_dist.testing.leases import deadline, leased_count
from scrapy_dist.worker import heartbeat as heartbeat_module
from scrapy_dist.worker.heartbeat import Heartbeat

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.frontier.core import Frontier
    from scrapy_dist.frontier.registry import WorkerRegistry
    from scrapy_dist.worker.control import WorkerControl
    from scrapy_dist.worker.deliveries import Deliveries

URL = "https://example.com/"


class Clock:
    """Stands for the ``time`` module the timer reads: it moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(heartbeat_module, "time", clock)
    return clock


class Parts:
    """Stand-ins for the timer's parts, recording each call in :attr:`calls`."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lease_timeout = 60.0
        self.lost: str | None = None
        self.renewed_at = 0.0
        #: What the next call of each name raises.
        self.fail: dict[str, Exception] = {}
        #: What ``flush_later`` answers.
        self.later = False
        #: Run by ``control.tick``.
        self.on_control: Callable[[], None] = lambda: None
        #: The deliveries' buffer (counted in the heartbeat's figures).
        self.buffer: list[object] = []
        #: The figures each heartbeat carried.
        self.figures: list[tuple[int, int, int]] = []

    def _note(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail.pop(name)

    # the frontier
    def flush(self) -> None:
        self._note("flush")

    def call(self, func: Callable[[], Any]) -> Any:
        return func()

    # the registry
    def heartbeat(self, figures: tuple[int, int, int] = (0, 0, 0)) -> None:
        self.figures.append(figures)
        self._note("heartbeat")

    # the deliveries
    def settle(self) -> None:
        self._note("settle")

    def renew(self, spider: object = None) -> None:
        self._note("renew")

    # the control
    def tick(self) -> None:
        self._note("control")
        self.on_control()

    def refill(self) -> None:
        self._note("refill")

    def flush_later(self) -> bool:
        self._note("flush_later")
        return self.later

    def on_lost(self) -> None:
        self._note("on_lost")


@pytest.fixture
def parts() -> Parts:
    return Parts()


@pytest.fixture
def stats() -> StatsCollector:
    stats = get_crawler().stats
    assert stats is not None
    return stats


@pytest.fixture
def make(parts: Parts, stats: StatsCollector, clock: Clock) -> Iterator[Callable[..., Heartbeat]]:
    made: list[Heartbeat] = []

    def build(*, heartbeat_interval: float = 5.0, later: bool = True) -> Heartbeat:
        made.append(
            Heartbeat(
                cast("Frontier", parts),
                cast("WorkerRegistry", parts),
                cast("Deliveries", parts),
                stats,
                heartbeat_interval=heartbeat_interval,
                flush_interval=0.1,
                on_lost=parts.on_lost,
                control=cast("WorkerControl", parts),
                refill=parts.refill,
                flush_later=parts.flush_later if later else None,
            )
        )
        return made[-1]

    yield build
    for heartbeat in made:
        heartbeat.stop()  # (the reactor never ran its ticker: this cancels the call)


def test_a_tick_settles_then_tops_up_and_flushes_on_this_thread(
    make: Callable[..., Heartbeat], parts: Parts
) -> None:
    heartbeat = make(later=False)
    heartbeat.start(None)
    heartbeat.tick()
    assert parts.calls == ["settle", "refill", "flush", "control"]


def test_a_tick_whose_flush_goes_to_the_io_thread_sends_nothing_itself(
    make: Callable[..., Heartbeat], parts: Parts
) -> None:
    heartbeat = make()
    heartbeat.start(None)
    parts.later = True
    heartbeat.tick()
    assert parts.calls == ["settle", "flush_later", "control"]


def test_a_tick_that_cannot_flush_later_flushes_on_this_thread(
    make: Callable[..., Heartbeat], parts: Parts
) -> None:
    heartbeat = make()
    heartbeat.start(None)
    parts.later = False
    heartbeat.tick()
    assert parts.calls == ["settle", "flush_later", "refill", "flush", "control"]


def test_it_heartbeats_and_renews_once_per_heartbeat_interval(
    make: Callable[..., Heartbeat], parts: Parts, clock: Clock
) -> None:
    heartbeat = make(heartbeat_interval=5.0, later=False)
    heartbeat.start(None)
    beats = []
    for _ in range(12):  # one tick a second, the first one second after start
        clock.now += 1.0
        parts.calls.clear()
        heartbeat.tick()
        assert parts.calls[-1] in ("control", "renew")
        if parts.calls[-2:] == ["heartbeat", "renew"]:
            beats.append(clock.now - 1000.0)
    assert beats == [5.0, 10.0]


def test_a_lost_crawl_is_reported_instead_of_flushing_and_heartbeating(
    make: Callable[..., Heartbeat], parts: Parts, clock: Clock
) -> None:
    heartbeat = make(heartbeat_interval=5.0)
    heartbeat.start(None)
    parts.lost = "finished"
    clock.now += 10.0
    heartbeat.tick()
    assert parts.calls == ["settle", "on_lost"]


def test_a_timer_paused_past_a_lease_checks_its_leases_before_settling(
    make: Callable[..., Heartbeat], parts: Parts, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    heartbeat = make(heartbeat_interval=1000.0, later=False)
    heartbeat.start(None)
    clock.now += 59.0  # within the lease
    heartbeat.tick()
    assert "renew" not in parts.calls
    parts.calls.clear()
    clock.now += 61.0  # longer than the lease: the process was paused
    with caplog.at_level(logging.WARNING):
        heartbeat.tick()
    assert parts.calls == ["renew", "settle", "refill", "flush", "control"]
    assert "did not run for 61.0s" in caplog.text


def test_no_error_ends_the_timer_and_each_is_counted_and_logged_once_in_a_row(
    make: Callable[..., Heartbeat],
    parts: Parts,
    stats: StatsCollector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    heartbeat = make(later=False)
    heartbeat.start(None)
    with caplog.at_level(logging.ERROR):
        for _ in range(2):
            parts.fail["flush"] = redis.ConnectionError("Redis went away")
            heartbeat.tick()  # not raised
        heartbeat.tick()  # fine again
        parts.fail["flush"] = redis.ConnectionError("Redis went away")
        heartbeat.tick()
    assert stats.get_value("scheduler/timer/errors") == 3
    logged = [r for r in caplog.records if "Redis went away" in r.getMessage()]
    assert len(logged) == 2  # once per run of the same error
    assert not any(r.exc_info for r in logged)  # a Redis error needs no traceback


def test_an_unexpected_error_is_logged_with_its_traceback(
    make: Callable[..., Heartbeat], parts: Parts, caplog: pytest.LogCaptureFixture
) -> None:
    heartbeat = make(later=False)
    heartbeat.start(None)
    parts.fail["settle"] = KeyError("bug")
    with caplog.at_level(logging.ERROR):
        heartbeat.tick()
    (record,) = caplog.records
    assert record.exc_info
    assert "KeyError" in record.getMessage()


def test_a_tick_during_which_the_scheduler_stopped_neither_heartbeats_nor_renews(
    make: Callable[..., Heartbeat], parts: Parts, clock: Clock
) -> None:
    heartbeat = make(heartbeat_interval=5.0, later=False)
    heartbeat.start(None)
    parts.on_control = heartbeat.stop  # a drain closes the scheduler from the tick
    clock.now += 10.0  # a heartbeat is due
    heartbeat.tick()
    assert parts.calls == ["settle", "refill", "flush", "control"]


def test_start_runs_the_ticker_and_counts_the_leases_as_renewed_now(
    make: Callable[..., Heartbeat], parts: Parts, clock: Clock
) -> None:
    heartbeat = make()
    assert heartbeat.ticker is None
    heartbeat.stop()  # not started: nothing to stop
    heartbeat = make()
    heartbeat.start(None)
    assert heartbeat.ticker is not None
    assert heartbeat.ticker.running
    assert parts.renewed_at == clock.now
    heartbeat.stop()
    assert not heartbeat.ticker.running
    assert heartbeat.stopped


def test_ticking_means_started_and_ticked_within_two_flush_intervals(
    make: Callable[..., Heartbeat], clock: Clock
) -> None:
    heartbeat = make()
    assert not heartbeat.ticking()  # not started
    heartbeat.start(None)
    assert not heartbeat.ticking()  # no tick yet
    heartbeat.tick()
    assert heartbeat.ticking()
    clock.now += 0.19
    assert heartbeat.ticking()
    clock.now += 0.02  # two flush intervals without a tick: the reactor is too busy
    assert not heartbeat.ticking()
    heartbeat.tick()
    assert heartbeat.ticking()
    heartbeat.stop()
    assert not heartbeat.ticking()


# -- a real worker's timer on a real Redis --------------------------------------------


@pytest.fixture
def worker(make_crawler: Callable[..., Crawler], clock: Clock) -> Iterator[HeldRequests]:
    crawler = make_crawler(
        {
            "SCHEDULER_BACKGROUND_FLUSH": False,  # flushes on this thread: answered at once
            "SCHEDULER_PREFETCH": 1,
            "SCHEDULER_LEASE_TIMEOUT": 60,
        }
    )
    held = HeldRequests(crawler)
    yield held
    held.close()


def test_a_tick_sends_what_is_pending_and_the_settlement_of_what_finished(
    worker: HeldRequests, client: redis.Redis, name: str
) -> None:
    scheduler = worker.scheduler
    scheduler.enqueue_request(Request(URL))
    assert scheduler.frontier.pending_writes == 1
    scheduler.heartbeat.tick()
    assert scheduler.frontier.pending_writes == 0
    request = worker.take()
    assert request is not None
    assert leased_count(client, name) == 1
    worker.holding.discard(request)  # the engine is done with it
    scheduler.heartbeat.tick()
    assert leased_count(client, name) == 0
    assert scheduler.stats.get_value("scheduler/leases/acked") == 1


def test_a_tick_heartbeats_in_the_registry_and_renews_the_leases(
    worker: HeldRequests, client: redis.Redis, name: str, clock: Clock
) -> None:
    scheduler = worker.scheduler
    me = scheduler.frontier.worker_id
    scheduler.enqueue_request(Request(URL))
    assert worker.take() is not None
    client.zadd(scheduler.frontier.keys.holders, {me: 1})  # about to expire
    client.hdel(scheduler.frontier.keys.workers, me)
    clock.now += 4.0  # before the heartbeat interval: no heartbeat
    scheduler.heartbeat.tick()
    assert not client.hexists(scheduler.frontier.keys.workers, me)
    assert deadline(client, name, me) == 1
    clock.now += 1.0
    scheduler.heartbeat.tick()
    assert client.hexists(scheduler.frontier.keys.workers, me)
    seconds, _ = client.time()
    renewed = deadline(client, name, me)
    assert renewed is not None
    assert renewed > seconds + 50
