"""The scheduler timer's flush goes through the I/O thread (``SCHEDULER_BACKGROUND_FLUSH``,
:mod:`scrapy_dist.frontier.background`): the reactor is not blocked for the round trip, the reply
is applied on the reactor thread, and the delivery rules hold with a flush in flight
(issue 15).

The reactor is simulated: what the I/O thread hands to it (``callFromThread``) is queued
in the ``landing`` fixture and run by :func:`arrive`. Redis is slowed with ``CLIENT
PAUSE ... WRITE`` on a server of the test's own.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.utils.misc import build_from_crawler

from scrapy_dist.frontier import core as frontier_module
from scrapy_dist.frontier import trip as trip_module
from scrapy_dist.frontier.background import IOThread
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.spiders import RedisSpider
from scrapy_dist.testing.engine import one_shard
from scrapy_dist.testing.leases import holdings, leased_count
from scrapy_dist.worker import engine as _engine

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from scrapy import Spider
    from scrapy.crawler import Crawler

    from scrapy_dist.testing import RedisServer

pytestmark = pytest.mark.redis_server

URL = "https://example.com/"
#: How long Redis is kept from answering writes (seconds).
PAUSE_MS = 800


@pytest.fixture
def landing(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], None]]:
    """A running reactor, simulated: flushes may go to the I/O thread, and the calls it
    hands to the reactor thread wait here until :func:`arrive` runs them."""
    calls: list[Callable[[], None]] = []
    monkeypatch.setattr(frontier_module, "reactor_running", lambda: True)
    monkeypatch.setattr(trip_module, "call_from_thread", calls.append)
    return calls


def arrive(calls: list[Callable[[], None]], timeout: float = 10.0) -> None:
    """Wait for the I/O thread to hand over a reply, then run what it handed over."""
    deadline = time.monotonic() + timeout
    while not calls:
        assert time.monotonic() < deadline, "no reply landed"
        time.sleep(0.01)
    while calls:
        calls.pop(0)()


@pytest.fixture
def worker(
    make_crawler: Callable[..., Crawler], server: RedisServer
) -> Iterator[Callable[..., tuple[Scheduler, set[Request]]]]:
    """Open a scheduler on the test's own server whose engine holds the returned set,
    flushing in the background unless ``settings`` say otherwise (the default); the
    test drives its timer by hand (``scheduler.heartbeat.tick()``)."""
    opened: list[Scheduler] = []

    def make(
        settings: dict[str, Any] | None = None, spidercls: type[Spider] | None = None
    ) -> tuple[Scheduler, set[Request]]:
        crawler = make_crawler(
            {
                "REDIS_URL": server.url,
                "SCHEDULER_PERSIST": True,
                "SCHEDULER_PREFETCH": 4,
                "CONCURRENT_REQUESTS": 8,
                "SCHEDULER_BACKGROUND_FLUSH": True,
                **(settings or {}),
            },
            **({} if spidercls is None else {"spidercls": spidercls}),
        )
        scheduler = build_from_crawler(Scheduler, crawler)
        holding: set[Request] = set()
        scheduler.deliveries.in_flight = lambda: holding
        assert crawler.spider is not None
        scheduler.open(crawler.spider)
        scheduler.control.watcher._next_read = float("inf")  # no control read due
        opened.append(scheduler)
        return scheduler, holding

    yield make
    for scheduler in opened:
        if not scheduler.heartbeat.stopped:
            scheduler.close("finished")


def _started(scheduler: Scheduler, holding: set[Request], requests: int = 30) -> Request:
    """Queue ``requests`` requests and take one into the engine (synchronously: the
    buffer then holds ``prefetch - 1``)."""
    for i in range(requests):
        scheduler.enqueue_request(Request(f"{URL}{i}"))
    first = scheduler.next_request()
    assert first is not None
    holding.add(first)
    return first


def _emptied(scheduler: Scheduler) -> None:
    """Take what is buffered into the engine, and let it leave at once (its leases
    settle with the next flush): the buffer is empty, the engine holds what it held."""
    while scheduler.deliveries.buffer:
        assert scheduler.next_request() is not None


@pytest.fixture
def wakes(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[object]]:
    """Call once the scheduler is open (its start checks the real engine): from then on
    the engine wake-ups the scheduler asks for are recorded in the list returned."""

    def watch() -> list[object]:
        calls: list[object] = []
        engine = object()
        monkeypatch.setattr(_engine, "engine_of", lambda crawler: engine)
        monkeypatch.setattr(_engine, "wake", calls.append)
        return calls

    return watch


def _pause(client: redis.Redis, ms: int = PAUSE_MS) -> None:
    """Keep Redis from running writes (scripts included) for ``ms`` milliseconds."""
    client.execute_command("CLIENT", "PAUSE", ms, "WRITE")  # type: ignore[no-untyped-call]


def _queued(scheduler: Scheduler) -> int:
    return len(scheduler.queue)


def _leased(scheduler: Scheduler, client: redis.Redis) -> int:
    return leased_count(client, scheduler.frontier.keys.crawl)


@pytest.mark.parametrize("background", [True, False])
def test_the_timer_flush_does_not_block_on_a_slow_redis(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
    server: RedisServer,
    background: bool,
) -> None:
    scheduler, holding = worker({"SCHEDULER_BACKGROUND_FLUSH": background})
    _started(scheduler, holding)
    scheduler.enqueue_request(Request(f"{URL}child"))  # a write the next tick sends
    with server.client() as slow:
        _pause(slow)
        start = time.monotonic()
        scheduler.heartbeat.tick()
        ticked = time.monotonic() - start
        if not background:  # the tick waited for Redis, on the reactor thread
            assert ticked >= PAUSE_MS / 1000 / 2
            assert not landing
            assert scheduler.stats.get_value("scheduler/redis/background_flushes") is None
            assert len(scheduler.deliveries.buffer) == 8
            return
        assert ticked < PAUSE_MS / 1000 / 4, ticked
        assert scheduler.frontier.flying
        # meanwhile the engine goes on with what is buffered, on local state only
        start = time.monotonic()
        second = scheduler.next_request()
        assert second is not None
        holding.add(second)
        assert time.monotonic() - start < PAUSE_MS / 1000 / 4
        assert scheduler.frontier.pending_writes == 1  # the child, in flight
        before = scheduler.stats.get_value("scheduler/redis/round_trips")
        scheduler.heartbeat.tick()  # a tick with a flush in flight sends nothing more
        assert scheduler.stats.get_value("scheduler/redis/round_trips") == before
        arrive(landing)
        assert not scheduler.frontier.flying
        assert scheduler.frontier.pending_writes == 0
        # the top-up the flush carried: 2 x prefetch - 3 buffered at the tick
        assert len(scheduler.deliveries.buffer) == 2 + 5
        assert scheduler.stats.get_value("scheduler/redis/background_flushes") == 1
        assert _queued(scheduler) == 30 + 1 - 4 - 5


def test_a_parent_settled_during_a_flush_waits_for_its_children(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
    server: RedisServer,
) -> None:
    scheduler, holding = worker()
    _started(scheduler, holding)
    outbox = one_shard(scheduler.frontier).outbox
    for i in range(3):
        scheduler.enqueue_request(Request(f"{URL}child{i}"))
    with server.client() as slow:
        _pause(slow)
        scheduler.heartbeat.tick()  # the children go, in flight
        assert scheduler.frontier.flying
        holding.clear()  # their parent leaves the engine while they are in flight
        scheduler.heartbeat.tick()  # its acknowledgement waits behind them
        assert outbox.ready == []
        assert scheduler.frontier.pending_settlements == 1
        # a synchronous flush (here: the heartbeat's, or a starved engine's reserve)
        # first lands the flush in flight, then sends the acknowledgement
        assert scheduler.frontier.flush() == []
        assert not scheduler.frontier.flying
        assert scheduler.frontier.pending_writes == 0
        assert scheduler.stats.get_value("scheduler/leases/acked") == 1
        assert _queued(scheduler) == 30 + 3 - 4 - 5
    arrive(landing)  # the reply's own landing, after it was applied: nothing more
    assert scheduler.stats.get_value("scheduler/leases/acked") == 1


def test_an_outage_during_a_flush_in_flight_loses_nothing(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
    server: RedisServer,
    client: redis.Redis,
) -> None:
    scheduler, holding = worker()
    _started(scheduler, holding)
    for i in range(3):
        scheduler.enqueue_request(Request(f"{URL}child{i}"))
    with server.client() as slow:
        _pause(slow, 5000)
        scheduler.heartbeat.tick()  # children and a top-up in flight
        assert scheduler.frontier.flying
    server.kill()  # the server goes before running any of it
    arrive(landing)
    frontier = one_shard(scheduler.frontier)
    assert not frontier.flying
    assert not frontier.reachable
    assert frontier.outbox.pending_items == 3  # back in the outbox
    assert len(scheduler.deliveries.buffer) == 3  # the top-up brought nothing
    holding.clear()  # the parent finishes during the outage
    # within the backoff: nothing sent, its ack waits behind the children
    scheduler.heartbeat.tick()
    assert frontier.outbox.ready == []
    server.restart()
    time.sleep(0.6)  # the first backoff pause
    frontier.flush()  # the children, confirmed ...
    assert frontier.reachable
    assert frontier.pending_settlements == 1
    frontier.flush()  # ... before their parent's acknowledgement goes
    assert frontier.pending_writes == 0
    assert scheduler.stats.get_value("scheduler/leases/acked") == 1
    # nothing lost: the 3 buffered still leased, the parent acknowledged, the children queued
    with server.client() as check:
        held = holdings(check, frontier.keys.crawl)
    buffered = {lease.id for lease, _ in scheduler.deliveries.buffer}
    assert {w: set(leases) for w, leases in held.items()} == {frontier.worker_id: buffered}
    assert _queued(scheduler) == 30 + 3 - 4


def test_close_waits_for_the_flush_in_flight_and_hands_its_top_up_back(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
    server: RedisServer,
) -> None:
    scheduler, holding = worker()
    _started(scheduler, holding)
    scheduler.enqueue_request(Request(f"{URL}child"))
    with server.client() as slow:
        _pause(slow)
        scheduler.heartbeat.tick()  # the child and a top-up of 5 in flight
        assert scheduler.frontier.reserving == 5
        held = 3 + 1 + 5  # buffered, in the engine, and the top-up's: counted as held
        assert scheduler.deliveries.room() == scheduler.deliveries.max_held - held
        holding.clear()
        scheduler.close("finished")
        assert not scheduler.frontier.flying
        assert _leased(scheduler, slow) == 0  # the top-up was handed back, the rest too
        assert _queued(scheduler) == 30 + 1 - 1
        assert scheduler.stats.get_value("scheduler/leases/acked") == 1
        arrive(landing)  # the reply's landing, after close: nothing more happens
        assert _leased(scheduler, slow) == 0
        assert _queued(scheduler) == 30


def test_a_starved_engine_does_not_wait_for_the_top_up_in_flight(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
    server: RedisServer,
    wakes: Callable[[], list[object]],
) -> None:
    scheduler, holding = worker()
    woken = wakes()
    _started(scheduler, holding)
    _emptied(scheduler)
    with server.client() as slow:
        _pause(slow)
        scheduler.heartbeat.tick()  # their acknowledgements and a top-up in flight
        assert scheduler.frontier.reserving > 0
        start = time.monotonic()
        assert scheduler.next_request() is None  # not waited for on the reactor thread
        assert time.monotonic() - start < PAUSE_MS / 1000 / 4
        assert scheduler.frontier.flying
        assert scheduler.stats.get_value("scheduler/redis/flush_waited") is None
        assert scheduler.stats.get_value("scheduler/refill/in_flight") == 1
        assert not woken
        arrive(landing)
    assert woken  # the landing top-up wakes the engine, which then finds it buffered
    assert len(scheduler.deliveries.buffer) == 2 * 4
    assert scheduler.next_request() is not None


def test_a_busy_engine_with_an_empty_buffer_reserves_from_the_io_thread(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
    server: RedisServer,
    wakes: Callable[[], list[object]],
) -> None:
    scheduler, holding = worker()
    woken = wakes()
    _started(scheduler, holding)  # the engine goes on holding one
    _emptied(scheduler)
    with server.client() as slow:
        _pause(slow)
        start = time.monotonic()
        assert scheduler.next_request() is None
        assert time.monotonic() - start < PAUSE_MS / 1000 / 4
        assert scheduler.frontier.reserving == 2 * 4  # with the acknowledgements
        arrive(landing)
    assert woken
    assert len(scheduler.deliveries.buffer) == 2 * 4
    assert scheduler.stats.get_value("scheduler/leases/acked") == 3
    # an engine that holds nothing has nothing to do meanwhile: it reserves now
    holding.clear()
    _emptied(scheduler)
    assert scheduler.next_request() is not None
    assert not scheduler.frontier.flying


def test_a_busy_engine_on_an_empty_queue_does_not_ask_redis_in_a_loop(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
    wakes: Callable[[], list[object]],
) -> None:
    """The queue empty, a download in progress: each top-up landing empty woke the
    engine, whose next_request started another at once (a 3-page site of 2-second
    pages: 14,278 reserves in 6.8 s, 27 with the flush on the reactor thread). A reserve
    that found the queue empty a moment ago waits for the timer's flush instead."""
    scheduler, holding = worker()
    woken = wakes()
    _started(scheduler, holding, requests=1)  # the engine downloads the only request
    assert scheduler.next_request() is None  # its acknowledgement-free top-up goes
    assert scheduler.frontier.flying
    arrive(landing)  # empty: the engine is woken and asks again
    assert woken
    for _ in range(50):
        assert scheduler.next_request() is None
        assert not scheduler.frontier.flying  # no top-up per wake-up
    assert scheduler.stats.get_value("scheduler/redis/background_flushes") == 1
    # the timer's next flush tops up; work pushed meanwhile is found and the engine woken
    scheduler.enqueue_request(Request(f"{URL}later"))
    woken.clear()
    scheduler.heartbeat.tick()
    arrive(landing)
    assert woken
    later = scheduler.next_request()
    assert later is not None
    assert later.url == f"{URL}later"


def test_pending_requests_are_answered_without_waiting_for_the_flush_in_flight(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
    server: RedisServer,
    wakes: Callable[[], list[object]],
) -> None:
    scheduler, holding = worker()
    woken = wakes()
    _started(scheduler, holding)
    scheduler.enqueue_request(Request(f"{URL}child"))
    with server.client() as slow:
        _pause(slow)
        scheduler.frontier.flush_later()  # the child, no top-up
        scheduler.deliveries.buffer.clear()  # (as if taken and finished)
        scheduler._empty_since = time.monotonic()  # the engine was told there was nothing
        start = time.monotonic()
        assert scheduler.has_pending_requests()
        assert time.monotonic() - start < PAUSE_MS / 1000 / 4
        assert scheduler.frontier.flying
        assert scheduler.stats.get_value("scheduler/redis/flush_waited") is None
        arrive(landing)
    assert woken  # the landing wakes the engine, which asks again
    assert scheduler.frontier.pending_writes == 0


def test_a_seed_poll_does_not_wait_for_the_flush_in_flight(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
    server: RedisServer,
) -> None:
    scheduler, holding = worker(spidercls=RedisSpider)
    spider = scheduler.spider
    assert isinstance(spider, RedisSpider)
    _started(scheduler, holding)
    scheduler.enqueue_request(Request(f"{URL}child"))
    with server.client() as slow:
        slow.lpush(spider.redis_key, f"{URL}seed")
        _pause(slow)
        scheduler.frontier.flush_later()
        next_poll = spider._next_poll
        start = time.monotonic()
        assert spider._poll_seeds() == 0  # skipped: looked at again after it lands
        assert time.monotonic() - start < PAUSE_MS / 1000 / 4
        assert scheduler.frontier.flying
        assert scheduler.stats.get_value("scheduler/redis/flush_waited") is None
        assert spider._next_poll == next_poll
        arrive(landing)
        assert slow.llen(spider.redis_key) == 1


def test_a_sharded_crawl_flushes_on_the_reactor_thread(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    landing: list[Callable[[], None]],
) -> None:
    scheduler, holding = worker({"SCHEDULER_SHARDS": 2})
    _started(scheduler, holding)
    scheduler.enqueue_request(Request(f"{URL}child"))
    assert not scheduler.frontier.can_flush_later()
    scheduler.heartbeat.tick()
    assert not scheduler.frontier.flying
    assert not landing
    assert scheduler.frontier.pending_writes == 0


def test_the_io_thread_runs_calls_in_order_and_hands_over_errors() -> None:
    io = IOThread("test-io")
    order: list[int] = []
    futures = [io.submit(functools.partial(order.append, i)) for i in range(5)]

    def fail() -> None:
        raise ValueError("boom")

    failed = io.submit(fail)
    for future in futures:
        future.result(5)
    assert order == [0, 1, 2, 3, 4]
    assert isinstance(failed.exception(5), ValueError)
    thread = io._thread
    assert thread is not None
    io.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert io.submit(lambda: 7).result(5) == 7  # a new thread, on demand
    io.stop()
