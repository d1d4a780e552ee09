"""The scheduler's timer keeps the buffer filled and carries the control read, so the
engine seldom waits for Redis: fewer round trips, none of them standalone when a flush
is going anyway (issue 15)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

import pytest
from scrapy import Request
from scrapy.utils.misc import build_from_crawler

from scrapy_dist.control import pause, resume
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.worker import engine as _engine
from scrapy_dist.worker.batch import BatchSize

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from scrapy.crawler import Crawler

URL = "https://example.com/"


@pytest.fixture
def worker(
    make_crawler: Callable[..., Crawler],
) -> Iterator[Callable[..., tuple[Scheduler, set[Request]]]]:
    """Open a scheduler with batched flushes whose engine holds the returned set; the
    test drives its timer by hand (``scheduler.heartbeat.tick()``)."""
    opened: list[Scheduler] = []

    def make(settings: dict[str, Any] | None = None) -> tuple[Scheduler, set[Request]]:
        crawler = make_crawler({"SCHEDULER_PERSIST": True, **(settings or {})})
        scheduler = build_from_crawler(Scheduler, crawler)
        holding: set[Request] = set()
        scheduler.deliveries.in_flight = lambda: holding
        assert crawler.spider is not None
        scheduler.open(crawler.spider)
        opened.append(scheduler)
        return scheduler, holding

    yield make
    for scheduler in opened:
        if scheduler.heartbeat.ticker is not None and scheduler.heartbeat.ticker.running:
            scheduler.close("finished")


def _round_trips(scheduler: Scheduler) -> int:
    return int(scheduler.stats.get_value("scheduler/redis/round_trips") or 0)


def test_the_timer_tops_up_a_low_buffer_with_its_flush(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
) -> None:
    scheduler, holding = worker({"SCHEDULER_PREFETCH": 4, "CONCURRENT_REQUESTS": 8})
    for i in range(30):
        scheduler.enqueue_request(Request(f"{URL}{i}"))
    first = scheduler.next_request()  # sends them, leases 4
    assert first is not None
    holding.add(first)
    assert len(scheduler.deliveries.buffer) == 3
    scheduler.enqueue_request(Request(f"{URL}child"))  # a write the next tick sends
    before = _round_trips(scheduler)
    scheduler.heartbeat.tick()
    # one round trip sent the child and filled the buffer up to 2 x prefetch
    assert _round_trips(scheduler) == before + 1
    assert len(scheduler.deliveries.buffer) == 8
    assert scheduler.stats.get_value("scheduler/refill/timer") == 1
    # a full buffer is not topped up: the next tick is a plain flush
    scheduler.enqueue_request(Request(f"{URL}child2"))
    scheduler.heartbeat.tick()
    assert len(scheduler.deliveries.buffer) == 8
    assert scheduler.stats.get_value("scheduler/refill/timer") == 1


def test_no_top_up_without_writes_to_carry_it(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
) -> None:
    scheduler, holding = worker({"SCHEDULER_PREFETCH": 4})
    for i in range(10):
        scheduler.enqueue_request(Request(f"{URL}{i}"))
    first = scheduler.next_request()
    assert first is not None
    holding.add(first)
    scheduler.control.watcher._next_read = float("inf")  # no control read due either
    before = _round_trips(scheduler)
    scheduler.heartbeat.tick()  # nothing to send: the timer makes no round trip of its own
    assert _round_trips(scheduler) == before
    assert len(scheduler.deliveries.buffer) == 3


def test_no_top_up_while_paused(
    worker: Callable[..., tuple[Scheduler, set[Request]]], client: redis.Redis
) -> None:
    scheduler, holding = worker({"SCHEDULER_PREFETCH": 4})
    for i in range(10):
        scheduler.enqueue_request(Request(f"{URL}{i}"))
    first = scheduler.next_request()
    assert first is not None
    holding.add(first)
    pause(client, scheduler.frontier.keys)
    scheduler.control.watcher._next_read = 0.0  # read it now
    assert scheduler.next_request() is None  # paused: the buffer was handed back
    assert not scheduler.deliveries.buffer
    scheduler.enqueue_request(Request(f"{URL}child"))
    scheduler.heartbeat.tick()
    assert not scheduler.deliveries.buffer
    assert scheduler.stats.get_value("scheduler/refill/timer") is None
    resume(client, scheduler.frontier.keys)


def test_a_top_up_wakes_an_engine_told_there_was_nothing(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, _ = worker({"SCHEDULER_PREFETCH": 4})
    other, _ = worker({"SCHEDULER_PREFETCH": 4})
    woken: list[object] = []
    engine = object()
    monkeypatch.setattr(_engine, "engine_of", lambda crawler: engine)
    monkeypatch.setattr(_engine, "wake", woken.append)
    assert scheduler.next_request() is None  # nothing queued: the engine stops asking
    for i in range(5):
        other.enqueue_request(Request(f"{URL}{i}"))
    other.frontier.flush()  # another worker's requests arrive
    scheduler.enqueue_request(Request(f"{URL}mine"))  # and this worker has a write
    scheduler.heartbeat.tick()
    assert len(scheduler.deliveries.buffer) == 6
    assert woken == [engine]  # without it, the engine would wait for its heartbeat


def test_the_control_read_rides_the_timers_flush(
    worker: Callable[..., tuple[Scheduler, set[Request]]], client: redis.Redis
) -> None:
    scheduler, holding = worker({"SCHEDULER_PREFETCH": 4})
    for i in range(10):
        scheduler.enqueue_request(Request(f"{URL}{i}"))
    first = scheduler.next_request()
    assert first is not None
    holding.add(first)
    pause(client, scheduler.frontier.keys, reason="test")
    scheduler.control.watcher._next_read = 0.0  # a read is due
    scheduler.enqueue_request(Request(f"{URL}child"))
    before = _round_trips(scheduler)
    scheduler.heartbeat.tick()
    # the flush carried the read: no round trip of its own, and the pause is applied
    assert _round_trips(scheduler) == before + 1
    assert scheduler.stats.get_value("control/reads/carried") == 1
    assert scheduler.control.applied == "paused"
    assert not scheduler.deliveries.buffer  # handed back
    # the engine's next look does not read it again on its own
    assert scheduler.next_request() is None
    assert _round_trips(scheduler) == before + 1
    resume(client, scheduler.frontier.keys)


def test_a_due_read_not_carried_in_time_is_read_alone(
    worker: Callable[..., tuple[Scheduler, set[Request]]], client: redis.Redis
) -> None:
    scheduler, _ = worker()
    watcher = scheduler.control.watcher
    pause(client, scheduler.frontier.keys)
    watcher._next_read = 0.0  # overdue by far more than the slack: read by the poll
    assert scheduler.next_request() is None
    assert watcher.state.state == "paused"
    assert scheduler.stats.get_value("control/reads/carried") is None
    resume(client, scheduler.frontier.keys)


def test_a_reserve_counts_the_acknowledgements_its_flush_sends_as_room(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
) -> None:
    # max_held = CONCURRENT_REQUESTS + 2 x SCHEDULER_PREFETCH_MAX = 6
    scheduler, holding = worker(
        {"SCHEDULER_PREFETCH": 2, "SCHEDULER_PREFETCH_MAX": 2, "CONCURRENT_REQUESTS": 2}
    )
    scheduler.refill._later = lambda: False  # type: ignore[method-assign]  # reserve now
    for i in range(20):
        scheduler.enqueue_request(Request(f"{URL}{i}"))
    while len(holding) < 6:
        request = scheduler.next_request()
        assert request is not None
        holding.add(request)
    assert scheduler.next_request() is None  # holding max_held: no room
    holding.clear()  # the engine finished all six
    before = _round_trips(scheduler)
    assert scheduler.next_request() is not None
    # the six acknowledgements and the reserve went together: one round trip
    assert _round_trips(scheduler) == before + 1
    assert scheduler.stats.get_value("scheduler/leases/acked") == 6


def test_an_empty_buffer_waits_for_the_timer_while_the_engine_is_busy(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, holding = worker({"SCHEDULER_PREFETCH": 2})
    woken: list[object] = []
    engine = object()
    monkeypatch.setattr(_engine, "engine_of", lambda crawler: engine)
    monkeypatch.setattr(_engine, "wake", woken.append)
    for i in range(20):
        scheduler.enqueue_request(Request(f"{URL}{i}"))
    first = scheduler.next_request()  # the engine holds nothing: a reserve now
    assert first is not None
    holding.add(first)
    second = scheduler.next_request()
    assert second is not None
    holding.add(second)
    scheduler.heartbeat.tick()  # the timer ticks (nothing to send: no round trip)
    # the engine holds prefetch requests and the buffer is empty: no round trip now
    before = _round_trips(scheduler)
    assert scheduler.next_request() is None
    assert _round_trips(scheduler) == before
    assert scheduler.stats.get_value("scheduler/refill/deferred") == 1
    holding.clear()  # the engine finished both: their acknowledgements wait
    scheduler.heartbeat.tick()  # the timer leases with its flush and wakes the engine
    assert _round_trips(scheduler) == before + 1
    assert len(scheduler.deliveries.buffer) == 4
    assert woken == [engine]
    assert scheduler.next_request() is not None


def test_an_idle_engine_never_waits_for_the_timer(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
) -> None:
    scheduler, holding = worker({"SCHEDULER_PREFETCH": 4})
    for i in range(20):
        scheduler.enqueue_request(Request(f"{URL}{i}"))
    for _ in range(4):
        request = scheduler.next_request()
        assert request is not None
        holding.add(request)
    holding.pop()  # the engine holds fewer than prefetch: an empty buffer is refilled now
    assert scheduler.next_request() is not None
    assert scheduler.stats.get_value("scheduler/refill/deferred") is None


def test_a_prefetch_of_one_leases_when_asked_never_ahead(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
) -> None:
    """With SCHEDULER_PREFETCH 1 (CONCURRENT_REQUESTS under 4 by default) the worker
    leases one request when Scrapy asks and never tops up ahead, so requests come in
    Scrapy's own order: a request queued while the engine was busy is the next one
    taken (Scrapy's test_engine_loop::test_lazy gave [1, 3, 2, 4])."""
    scheduler, holding = worker({"SCHEDULER_PREFETCH": 1})
    scheduler.enqueue_request(Request(f"{URL}1"))
    first = scheduler.next_request()
    assert first is not None
    holding.add(first)
    for i in (2, 3):
        scheduler.enqueue_request(Request(f"{URL}{i}"))
    scheduler.heartbeat.tick()  # sends them; leases nothing ahead
    assert not scheduler.deliveries.buffer
    assert scheduler.stats.get_value("scheduler/refill/timer") is None
    nxt = scheduler.next_request()  # asked while the engine still holds one: leased now
    assert nxt is not None
    assert scheduler.stats.get_value("scheduler/refill/deferred") is None


def test_a_worker_whose_engine_takes_requests_fast_leases_larger_batches(
    worker: Callable[..., tuple[Scheduler, set[Request]]],
) -> None:
    scheduler, holding = worker({"SCHEDULER_PREFETCH": 2, "CONCURRENT_REQUESTS": 4})
    assert scheduler.deliveries.batch.ceiling == 8
    now = [100.0]
    scheduler.deliveries.batch = BatchSize(2, 8, clock=lambda: now[0])
    scheduler.refill._later = lambda: False  # type: ignore[method-assign]  # reserve now
    for i in range(60):
        scheduler.enqueue_request(Request(f"{URL}{i}"))

    def take() -> None:
        request = scheduler.next_request()
        assert request is not None
        holding.clear()  # (the engine finished the one before)
        holding.add(request)

    take()
    assert len(scheduler.deliveries.buffer) == 1  # a batch of 2, one taken
    for _ in range(19):
        take()
    now[0] += 1.0  # 20 requests in a second: 10 in half a second, cut to 8
    while scheduler.deliveries.buffer:
        take()
    take()
    assert len(scheduler.deliveries.buffer) == 7  # a batch of 8, one taken


def test_an_alarm_wakes_the_engine_when_the_slot_a_reserve_named_is_ready() -> None:
    """A queue per slot's reserve that got less says when its first waiting slot is
    ready: an alarm wakes the engine then (once per reply), not the timer's next tick."""
    from types import SimpleNamespace

    from scrapy_dist.worker.refill import Refill

    frontier = SimpleNamespace(slot_ready_at=None)
    woken: list[int] = []
    alarms: list[tuple[float, Any]] = []
    refill = Refill(
        cast("Any", frontier),
        cast("Any", None),
        cast("Any", None),
        cast("Any", None),
        cast("Any", None),
        wake=lambda: woken.append(1),
        call_later=lambda delay, func: alarms.append((delay, func)),
    )
    refill.top_up()  # (the timer: no scheduler open, nothing named)
    assert alarms == []
    frontier.slot_ready_at = time.monotonic() + 0.2
    refill.top_up()
    ((delay, alarm),) = alarms
    assert 0.1 < delay <= 0.2
    assert woken == []
    frontier.slot_ready_at -= 0.3  # (as if the time came)
    refill.top_up()  # a new reply's time: armed again, and due now
    assert woken == [1]
    alarm()
    refill.top_up()
    assert woken == [1]  # once per reply
