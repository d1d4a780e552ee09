"""The start horizon: a worker hands its engine only what the downloader can start soon,
and hands the rest back to the queue for other workers (issue 36: one worker hoarded a
delayed host's requests while another idled)."""

from __future__ import annotations

import inspect
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.core.downloader import Downloader, Slot
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.worker import engine as _engine
from scrapy_dist.worker.engine import SlotState
from scrapy_dist.worker.horizon import StartHorizon

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy.crawler import Crawler

SLOW, FAST = "https://slow.example/", "https://fast.example/"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Slots:
    """What a fake downloader knows: host -> (delay, wait); unknown hosts have no slot."""

    def __init__(self) -> None:
        self.known: dict[str, tuple[float, float]] = {}

    def __call__(self, request: Request) -> SlotState:
        host = request.url.split("/")[2]
        if host not in self.known:
            return SlotState(host, False, 0.0, 0.0)
        delay, wait = self.known[host]
        return SlotState(host, True, delay, wait)


def _horizon(slots: Slots, clock: Clock, default_delay: float = 0.0) -> StartHorizon:
    return StartHorizon(1.0, slots, lambda key: default_delay, clock=clock)


def test_a_slot_without_delay_is_never_held_back() -> None:
    slots, clock = Slots(), Clock()
    horizon = _horizon(slots, clock)
    requests = [Request(f"{FAST}{i}") for i in range(5)]
    assert horizon.pick(requests) == (0, 0)
    for request in requests:
        horizon.given(request)
    assert horizon.pick(requests) == (0, 0)  # no delay: on its way or not, it starts now
    assert not horizon.waiting()


def test_requests_a_delayed_slot_would_hold_go_back_and_the_worker_waits() -> None:
    slots, clock = Slots(), Clock()
    slots.known["slow.example"] = (5.0, 4.0)  # sent a second ago, 5 s delay
    horizon = _horizon(slots, clock)
    requests = [Request(f"{SLOW}{i}") for i in range(3)]
    assert horizon.pick(requests) == (None, 3)
    assert horizon.until == pytest.approx(clock.now + 3.0)  # within the horizon then
    assert horizon.waiting()
    clock.now += 3.0
    assert not horizon.waiting()


def test_other_slots_go_first_and_only_the_requests_before_them_go_back() -> None:
    slots, clock = Slots(), Clock()
    slots.known["slow.example"] = (5.0, 5.0)
    horizon = _horizon(slots, clock)
    requests = [Request(f"{SLOW}1"), Request(f"{SLOW}2"), Request(f"{FAST}1"), Request(f"{SLOW}3")]
    assert horizon.pick(requests) == (2, 2)
    assert not horizon.waiting()


def test_requests_on_their_way_to_the_downloader_count_in_their_slot() -> None:
    slots, clock = Slots(), Clock()
    slots.known["slow.example"] = (0.5, 0.0)  # ready now: one request per half second
    horizon = _horizon(slots, clock)
    first, second, third = (Request(f"{SLOW}{i}") for i in range(3))
    assert horizon.start_in(first) == 0.0
    horizon.given(first)
    assert horizon.start_in(second) == 0.5
    horizon.given(second)
    assert horizon.start_in(third) == 1.0  # still within the horizon
    horizon.given(third)
    assert horizon.pick([Request(f"{SLOW}4")]) == (None, 1)  # 1.5 s away
    horizon.reached(first)  # the downloader's own slot counts it now (its wait, here 0)
    horizon.reached(first)  # twice (reached, then left the engine): counted once
    assert horizon.start_in(Request(f"{SLOW}4")) == 1.0


def test_a_slot_the_downloader_has_not_made_yet_takes_the_settings_delay() -> None:
    slots, clock = Slots(), Clock()
    horizon = _horizon(slots, clock, default_delay=3.0)
    first, second = Request(f"{SLOW}1"), Request(f"{SLOW}2")
    assert horizon.pick([first, second]) == (0, 0)
    horizon.given(first)  # not in the downloader yet (e.g. waiting for robots.txt)
    assert horizon.start_in(second) == 3.0


def test_the_horizon_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        StartHorizon(0, Slots(), lambda key: 0.0)


# -- what Scrapy's downloader knows --------------------------------------------------


def _slot(delay: float) -> Slot:
    params = inspect.signature(Slot.__init__).parameters
    extra: dict[str, Any] = {}
    if "randomize_delay" in params and params["randomize_delay"].default is inspect._empty:
        extra["randomize_delay"] = False  # Scrapy 2.13
    return Slot(concurrency=8, delay=delay, **extra)


class _Engine:
    def __init__(self, crawler: Crawler) -> None:
        self.downloader = Downloader(crawler)


@pytest.mark.parametrize("clock", [time.time, time.monotonic], ids=["wall", "monotonic"])
def test_slot_state_reads_the_delay_the_last_send_and_the_queue(clock: Callable[[], float]) -> None:
    crawler = get_crawler()
    crawler.engine = _Engine(crawler)  # type: ignore[assignment]
    downloader = crawler.engine.downloader
    request = Request(f"{SLOW}1")
    key = downloader.get_slot_key(request)
    assert _engine.slot_state(crawler, request) == SlotState(key, False, 0.0, 0.0)
    slot = downloader.slots[key] = _slot(5.0)
    assert _engine.slot_state(crawler, request).wait == 0.0  # never sent
    slot.lastseen = clock() - 1.0  # Scrapy 2.13 stamps time.time(), later ones monotonic
    assert _engine.slot_state(crawler, request).wait == pytest.approx(4.0, abs=0.1)
    slot.queue.append((Request(f"{SLOW}0"), None))  # type: ignore[arg-type]
    state = _engine.slot_state(crawler, request)
    assert (state.exists, state.delay) == (True, 5.0)
    assert state.wait == pytest.approx(9.0, abs=0.1)
    downloader.slots[key] = _slot(0.0)
    assert _engine.slot_state(crawler, request).wait == 0.0
    downloader.close()


@pytest.mark.parametrize("slot", [None, 7, ("a", "b")], ids=["none", "int", "tuple"])
def test_a_slot_named_by_any_object_in_meta_is_read_as_text(slot: object) -> None:
    """Scrapy 2.13 takes ``meta["download_slot"]`` as it is, even ``None`` (its own
    test_downloaderslotssettings does): the horizon and the pauses got a non-text key,
    and a pause lookup raised in next_request, which hung the crawl."""
    crawler = get_crawler()
    crawler.engine = _Engine(crawler)  # type: ignore[assignment]
    downloader = crawler.engine.downloader
    request = Request(f"{SLOW}1", meta={"download_slot": slot})
    raw = downloader.get_slot_key(request)
    downloader.slots[raw] = _slot(2.0)
    state = _engine.slot_state(crawler, request)
    assert isinstance(state.key, str)
    assert state.delay == 2.0
    from scrapy_dist.slots import bound_slot

    assert bound_slot(state.key) == state.key
    downloader.close()


def test_a_downloader_without_slots_refuses_to_start() -> None:
    class NoSlots:
        downloader = object()

    with pytest.raises(ConfigurationError, match="SCHEDULER_START_HORIZON = 0"):
        _engine.check_downloader(NoSlots())
    crawler = get_crawler()
    _engine.check_downloader(_Engine(crawler))  # this Scrapy has them


# -- the scheduler, against a real Redis --------------------------------------------------


@pytest.fixture
def worker(
    make_crawler: Callable[..., Crawler],
) -> Iterator[Callable[..., tuple[Scheduler, Slots, Clock]]]:
    """An open scheduler whose horizon reads a fake downloader and clock."""
    opened: list[Scheduler] = []

    def make(
        settings: dict[str, Any] | None = None, *, others: bool = True
    ) -> tuple[Scheduler, Slots, Clock]:
        crawler = make_crawler(
            {
                "SCHEDULER_PERSIST": True,
                # first in, first out: the test reads the order requests come back in
                "SCHEDULER_QUEUE_CLASS": "scrapy_dist.queue.FifoQueue",
                **(settings or {}),
            }
        )
        scheduler = build_from_crawler(Scheduler, crawler)
        scheduler.deliveries.in_flight = set
        assert scheduler.horizon is not None
        slots, clock = Slots(), Clock()
        scheduler.horizon.slot_of = slots
        scheduler.horizon.clock = clock
        assert crawler.spider is not None
        scheduler.open(crawler.spider)
        if others:  # another worker registered: requests that cannot start soon go back
            scheduler.frontier.client.hset(scheduler.frontier.keys.workers, "other", time.time())
        opened.append(scheduler)
        return scheduler, slots, clock

    yield make
    for scheduler in opened:
        if scheduler.heartbeat.ticker is not None and scheduler.heartbeat.ticker.running:
            scheduler.close("finished")


def test_a_worker_hands_back_what_its_downloader_would_hold_and_leases_it_when_ready(
    worker: Callable[..., tuple[Scheduler, Slots, Clock]],
) -> None:
    scheduler, slots, clock = worker({"SCHEDULER_PREFETCH": 4, "CONCURRENT_REQUESTS": 8})
    for i in range(4):
        scheduler.enqueue_request(Request(f"{SLOW}{i}"))
    first = scheduler.next_request()  # the slot is new: it starts now
    assert first is not None
    assert first.url == f"{SLOW}0"
    slots.known["slow.example"] = (5.0, 5.0)  # just sent: the next one in 5 s
    woken: list[bool] = []
    scheduler._wake = lambda: woken.append(True)  # type: ignore[method-assign]
    scheduler.refill._wake = scheduler._wake
    assert scheduler.next_request() is None
    assert scheduler.stats.get_value("scheduler/horizon/handed_back") == 3
    scheduler.frontier.flush()
    assert len(scheduler.queue) == 3  # back in Redis, for any worker
    assert not scheduler.deliveries.buffer
    reserves = scheduler.stats.get_value("scheduler/redis/round_trips/reserve")
    assert scheduler.next_request() is None  # waiting: no reserve
    assert scheduler.stats.get_value("scheduler/redis/round_trips/reserve") == reserves
    scheduler.heartbeat.tick()
    assert not woken
    clock.now += 4.0  # the slot's next send is within the horizon
    slots.known["slow.example"] = (5.0, 1.0)
    scheduler.heartbeat.tick()
    assert woken  # the engine asks again
    second = scheduler.next_request()
    assert second is not None
    assert second.url == f"{SLOW}1"


def test_requests_of_a_ready_slot_pass_a_held_slot(
    worker: Callable[..., tuple[Scheduler, Slots, Clock]],
) -> None:
    scheduler, slots, _ = worker({"SCHEDULER_PREFETCH": 4, "CONCURRENT_REQUESTS": 8})
    slots.known["slow.example"] = (5.0, 5.0)
    for url in (f"{SLOW}1", f"{SLOW}2", f"{FAST}1", f"{SLOW}3"):
        scheduler.enqueue_request(Request(url))
    request = scheduler.next_request()
    assert request is not None
    assert request.url == f"{FAST}1"
    assert scheduler.stats.get_value("scheduler/horizon/handed_back") == 2
    assert not scheduler.horizon.waiting()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("settings", "built"),
    [
        ({}, True),
        ({"SCHEDULER_START_HORIZON": 0}, False),
        ({"SCHEDULER_POLITENESS": True}, False),
    ],
    ids=["default", "off", "politeness"],
)
def test_the_horizon_is_built_unless_off_or_under_politeness(
    make_crawler: Callable[..., Crawler], settings: dict[str, Any], built: bool
) -> None:
    scheduler = build_from_crawler(Scheduler, make_crawler(settings))
    assert (scheduler.horizon is not None) is built


@pytest.mark.parametrize("value", [-1, "nan", "inf"])
def test_a_horizon_that_is_not_a_finite_positive_number_is_refused(
    make_crawler: Callable[..., Crawler], value: object
) -> None:
    from scrapy_dist.assembly import assemble

    with pytest.raises(ConfigurationError, match="SCHEDULER_START_HORIZON must be a finite"):
        _ = assemble(make_crawler({"SCHEDULER_START_HORIZON": value})).config.scheduler


def test_a_worker_alone_keeps_what_cannot_start_soon_and_finds_what_can(
    worker: Callable[..., tuple[Scheduler, Slots, Clock]],
) -> None:
    """Alone, a worker hands nothing back (nobody would take it): it keeps a delayed
    slot's requests buffered and leases more to find other slots' requests behind them;
    once another worker registers, the held ones go back."""
    scheduler, slots, clock = worker(
        {"SCHEDULER_PREFETCH": 2, "CONCURRENT_REQUESTS": 4}, others=False
    )
    assert scheduler.horizon is not None
    slots.known["slow.example"] = (5.0, 5.0)
    for url in (f"{SLOW}1", f"{SLOW}2", f"{SLOW}3", f"{FAST}1"):
        scheduler.enqueue_request(Request(url))
    scheduler.frontier.flush()  # (its pipeline carries the registry read: alone)
    assert scheduler.horizon.alone()
    request = scheduler.next_request()
    assert request is not None
    assert request.url == f"{FAST}1"  # leased in more batches, behind the slow ones
    assert not scheduler.stats.get_value("scheduler/horizon/handed_back")
    assert [r.url for _, r in scheduler.deliveries.buffer] == [f"{SLOW}1", f"{SLOW}2", f"{SLOW}3"]
    assert scheduler.next_request() is None  # nothing more can start soon
    client = scheduler.frontier.client
    client.hset(scheduler.frontier.keys.workers, "other", time.time())
    clock.now += 1.0  # the next read is due
    scheduler.frontier.flush()
    assert not scheduler.horizon.alone()
    assert not scheduler.horizon.waiting()  # the timer wakes the engine now
    assert scheduler.next_request() is None
    assert scheduler.stats.get_value("scheduler/horizon/handed_back") == 3


def test_a_horizon_that_fails_is_dropped_not_a_hang(
    worker: Callable[..., tuple[Scheduler, Slots, Clock]], caplog: pytest.LogCaptureFixture
) -> None:
    """An exception in the horizon (a downloader it cannot read) must not leave the
    engine's request unanswered: the worker goes on without it, with one ERROR."""
    scheduler, _, _ = worker({"SCHEDULER_PREFETCH": 2, "CONCURRENT_REQUESTS": 4})
    assert scheduler.horizon is not None

    def broken(request: Request) -> SlotState:
        raise TypeError("a slot it cannot read")

    scheduler.horizon.slot_of = broken
    scheduler.enqueue_request(Request(f"{SLOW}1"))
    request = scheduler.next_request()
    assert request is not None
    assert request.url == f"{SLOW}1"
    assert scheduler.horizon is None
    assert scheduler.stats.get_value("scheduler/horizon/errors") == 1
    assert sum("The start horizon failed" in r.message for r in caplog.records) == 1


def test_the_registry_read_decides_alone_and_an_error_counts_as_others() -> None:
    """HLEN of the registry: 1 is this worker alone; more, or an error (unknown), is
    others there, so what cannot start soon goes back (the safe side: no hoarding)."""
    clock = Clock()
    horizon = StartHorizon(1.0, Slots(), lambda key: 0.0, clock=clock)
    assert not horizon.alone()  # until a read says so
    read = horizon.rider("crawl:workers")
    assert read is not None
    assert read.command.args == ("HLEN", "crawl:workers")
    assert horizon.rider("crawl:workers") is None  # about once a second
    read.on_reply(1)
    assert horizon.alone()
    horizon.until = clock.now + 5  # waiting for a slot, alone
    clock.now += 1.0
    read = horizon.rider("crawl:workers")
    assert read is not None
    read.on_reply(ConnectionError("Redis went away"))
    assert not horizon.alone()
    assert not horizon.waiting()  # another worker may take them: the engine is woken
