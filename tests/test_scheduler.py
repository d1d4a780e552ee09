"""The scheduler against a real Redis: dedupe, persistence, flush, workers, failures."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any, cast

import pytest
from scrapy import Request
from scrapy.exceptions import CloseSpider
from scrapy.utils.misc import build_from_crawler

from scrapy_dist.assembly import assemble
from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.exceptions import ConfigurationError, RedisUnavailable
from scrapy_dist.scheduler import FailedScheduler, Scheduler
from scrapy_dist.settings import start_requests_first
from scrapy_dist.testing.engine import HeldRequests
from scrapy_dist.testing.leases import holdings, leased_count
from scrapy_dist.testing.queues import queued_count
from scrapy_dist.testing.redis_server import free_port
from scrapy_dist.worker.startup import start_failure

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from scrapy.crawler import Crawler
    from scrapy.http.request import CallbackT as Callback

    from scrapy_dist.frontier.progress import Progress

URL = "https://example.com/"
FIFO = "scrapy.squeues.FifoMemoryQueue"
LIFO = "scrapy.squeues.LifoMemoryQueue"


def _progress(progress: Progress | None) -> Progress:
    """A progress report; None would mean Redis did not answer."""
    assert progress is not None
    return progress


def _set_key(scheduler: Scheduler) -> str:
    """The key of the crawl's dupefilter set (the default backend)."""
    assert isinstance(scheduler.df, RFPDupeFilter)
    [key] = scheduler.df.backend.keys()
    return key


@pytest.fixture
def open_scheduler(
    make_crawler: Callable[..., Crawler],
) -> Iterator[Callable[..., Scheduler]]:
    """Open schedulers (each a worker of the same crawl); close any left open."""
    opened: list[Scheduler] = []

    def make(settings: dict[str, Any] | None = None) -> Scheduler:
        # send each write at once, so return values reflect Redis's answers
        crawler = make_crawler({"SCHEDULER_FLUSH_INTERVAL": 0, **(settings or {})})
        scheduler = build_from_crawler(Scheduler, crawler)
        assert crawler.spider is not None
        scheduler.open(crawler.spider)
        opened.append(scheduler)
        return scheduler

    yield make
    for scheduler in opened:
        assert scheduler.heartbeat.ticker is not None
        if scheduler.heartbeat.ticker.running:
            scheduler.close("finished")


def drain(scheduler: Scheduler) -> list[Request]:
    out = []
    while (request := scheduler.next_request()) is not None:
        out.append(request)
    return out


def test_enqueue_dedupe_and_dequeue(open_scheduler: Callable[..., Scheduler]) -> None:
    scheduler = open_scheduler()
    assert scheduler.enqueue_request(Request(URL + "a"))
    assert not scheduler.enqueue_request(Request(URL + "a"))
    assert scheduler.enqueue_request(Request(URL + "a", dont_filter=True))
    assert scheduler.enqueue_request(Request(URL + "b"))
    assert scheduler.has_pending_requests()
    assert len(scheduler) == 3
    assert sorted(r.url for r in drain(scheduler)) == [URL + "a", URL + "a", URL + "b"]
    assert not scheduler.has_pending_requests()
    stats = scheduler.stats.get_stats()
    assert stats["scheduler/enqueued/redis"] == 3
    assert stats["scheduler/dequeued/redis"] == 3
    assert stats["dupefilter/filtered"] == 1


def test_request_dropped_is_sent_for_a_duplicate_redis_finds_in_a_batch(
    open_scheduler: Callable[..., Scheduler],
) -> None:
    """With batched writes ``enqueue_request`` tells Scrapy a request was stored before
    Redis has looked at it; a duplicate Redis then finds gets ``request_dropped``, as
    Scrapy's engine sends for a request its scheduler refuses (extensions count drops
    with it), and only once: the engine sends it for a refusal known at once."""
    from scrapy import signals

    batched = {"SCHEDULER_FLUSH_INTERVAL": 5}
    first, second = open_scheduler(batched), open_scheduler(batched)
    dropped: list[str] = []

    def on_dropped(request: Request) -> None:
        dropped.append(request.url)

    assert second.crawler is not None
    second.crawler.signals.connect(on_dropped, signal=signals.request_dropped)
    assert first.enqueue_request(Request(URL + "a"))
    first.frontier.flush()
    assert second.enqueue_request(Request(URL + "a"))  # a duplicate only Redis knows of
    assert second.enqueue_request(Request(URL + "b"))
    second.frontier.flush()
    assert dropped == [URL + "a"]
    assert not second.enqueue_request(Request(URL + "a"))  # known now: Scrapy sends it
    assert dropped == [URL + "a"]


def test_a_request_flushed_after_the_queue_was_found_empty_is_pending(
    open_scheduler: Callable[..., Scheduler],
) -> None:
    """A reserve that found the queue empty lets has_pending_requests skip Redis for a
    moment; a request sent since by another call (a spider_idle handler's, flushed by
    the idle worker's look at the crawl) must end that, or the engine is told nothing
    is pending and fires spider_idle again and again while it travels."""
    scheduler = open_scheduler({"SCHEDULER_FLUSH_INTERVAL": 5})
    assert scheduler.next_request() is None  # found empty
    assert scheduler.enqueue_request(Request(URL + "idle"))
    scheduler.frontier.flush()  # sent by a call that reserves nothing
    assert scheduler.has_pending_requests()


def test_an_idle_worker_that_took_the_queued_work_looks_again_before_staying_open(
    open_scheduler: Callable[..., Scheduler],
) -> None:
    """A plain spider's worker stays open while requests are queued, an answer it keeps
    for half a heartbeat interval; once it has taken them itself that answer is stale
    (spider_idle fired 8 times for one request a spider_idle handler scheduled, where
    Scrapy fires it twice)."""
    from scrapy.exceptions import DontCloseSpider

    scheduler = open_scheduler()
    assert scheduler.enqueue_request(Request(URL + "idle"))
    with pytest.raises(DontCloseSpider):
        scheduler.close_if_failed()  # requests are queued
    assert [r.url for r in drain(scheduler)] == [URL + "idle"]
    scheduler.close_if_failed()  # nothing queued or held elsewhere: it may close


def test_workers_share_one_frontier(open_scheduler: Callable[..., Scheduler]) -> None:
    a, b = open_scheduler(), open_scheduler()
    assert a.enqueue_request(Request(URL + "x"))
    assert not b.enqueue_request(Request(URL + "x"))  # a's fingerprint is shared
    assert [r.url for r in drain(b)] == [URL + "x"]  # and so is the queue
    assert drain(a) == []


@pytest.mark.parametrize(
    ("settings", "order"),
    [
        ({}, ["h", "m3", "m2", "m1", "l"]),  # Scrapy's default: LifoMemoryQueue
        (
            {"SCHEDULER_MEMORY_QUEUE": FIFO},
            ["h", "m1", "m2", "m3", "l"],
        ),
    ],
)
def test_priority_order_and_ties_as_scrapys_memory_queue(
    open_scheduler: Callable[..., Scheduler], settings: dict[str, Any], order: list[str]
) -> None:
    """Equal priorities come out in the order of SCHEDULER_MEMORY_QUEUE, as on Scrapy's
    scheduler (they came out first in, first out whatever it said)."""
    scheduler = open_scheduler(settings)
    for path, priority in [("l", -1), ("m1", 0), ("h", 5), ("m2", 0), ("m3", 0)]:
        scheduler.enqueue_request(Request(URL + path, priority=priority))
    assert [r.url[len(URL) :] for r in drain(scheduler)] == order


@pytest.mark.parametrize(
    ("start_queue", "after", "before"),
    [
        # starts apart, first in first out: after the others (Scrapy >= 2.14), or before
        (None, ["s1", "c2", "c1", "s2", "s3", "late"], ["s1", "s2", "s3", "c2", "c1", "late"]),
        # SCHEDULER_START_MEMORY_QUEUE = None: requests as any
        ("", ["s2", "c2", "c1", "s3", "s1", "late"], ["s2", "c2", "c1", "s3", "s1", "late"]),
        (LIFO, ["s2", "c2", "c1", "s3", "s1", "late"], ["s2", "s3", "s1", "c2", "c1", "late"]),
    ],
)
def test_start_requests_come_in_their_own_order_beside_the_others_of_their_priority(
    open_scheduler: Callable[..., Scheduler],
    start_queue: str | None,
    after: list[str],
    before: list[str],
) -> None:
    """Scrapy's scheduler keeps start requests in queues of their own
    (SCHEDULER_START_MEMORY_QUEUE, first in first out), taken after the other requests
    of their priority (Scrapy 2.13: before them); set to None, they are requests as
    any."""
    order = before if start_requests_first() else after
    settings: dict[str, Any] = {"SCHEDULER_PREFETCH": 1}  # (one at a time, as Scrapy takes)
    if start_queue is not None:
        settings["SCHEDULER_START_MEMORY_QUEUE"] = start_queue or None
    scheduler = open_scheduler(settings)
    for path in ("s1", "s2"):
        scheduler.enqueue_request(Request(URL + path, meta={"is_start_request": True}))
    first = scheduler.next_request()
    assert first is not None
    taken = [first.url[len(URL) :]]
    scheduler.enqueue_request(Request(URL + "s3", meta={"is_start_request": True}))
    for path in ("c1", "c2"):
        scheduler.enqueue_request(Request(URL + path))
    scheduler.enqueue_request(Request(URL + "late", priority=-1, meta={"is_start_request": True}))
    taken += [r.url[len(URL) :] for r in drain(scheduler)]
    assert taken == order


@pytest.mark.parametrize(
    ("queue_class", "expected"),
    [("scrapy_dist.queue.FifoQueue", "abc"), ("scrapy_dist.queue.LifoQueue", "cba")],
)
def test_list_queues(
    open_scheduler: Callable[..., Scheduler], queue_class: str, expected: str
) -> None:
    scheduler = open_scheduler({"SCHEDULER_QUEUE_CLASS": queue_class})
    for c in "abc":
        scheduler.enqueue_request(Request(URL + c))
    assert "".join(r.url[-1] for r in drain(scheduler)) == expected


def test_unserializable_request_is_kept_in_memory_counted_and_seen(
    open_scheduler: Callable[..., Scheduler], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """As Scrapy's scheduler keeps what its disk queue cannot take in memory: logged
    once, counted, its fingerprint recorded (a link back to it is filtered)."""
    scheduler = open_scheduler()
    bad = Request(URL + "bad", callback=cast("Callback", lambda response: None))
    with caplog.at_level(logging.WARNING):
        assert scheduler.enqueue_request(bad)
        assert scheduler.enqueue_request(Request(URL + "bad2", meta={"o": object()}))
    assert caplog.text.count("Unable to serialize request") == 1  # logged once, as Scrapy
    assert scheduler.stats.get_value("scheduler/unserializable") == 2
    assert scheduler.stats.get_value("scheduler/enqueued/memory") == 2
    assert not client.exists(scheduler.dead.key)
    assert not scheduler.enqueue_request(Request(URL + "bad"))  # seen
    assert client.scard(_set_key(scheduler)) == 2
    assert [r.url for r in drain(scheduler)] == [URL + "bad2", URL + "bad"]  # LIFO


def test_undecodable_entry_goes_to_dead_letters(
    open_scheduler: Callable[..., Scheduler], client: redis.Redis
) -> None:
    scheduler = open_scheduler({"SCHEDULER_QUEUE_CLASS": "scrapy_dist.queue.FifoQueue"})
    scheduler.queue.push([(b"{corrupt", 0.0, b"")])
    scheduler.enqueue_request(Request(URL + "ok"))
    assert [r.url for r in drain(scheduler)] == [URL + "ok"]
    assert scheduler.stats.get_value("scheduler/undecodable") == 1
    assert client.llen(scheduler.dead.key) == 1
    # dead-lettered in the step that settles its lease: counted as dead, not done
    assert leased_count(client, scheduler.frontier.keys.crawl) == 0
    assert scheduler.frontier.totals().get("dead") == 1


def test_persist_false_deletes_keys_only_when_the_crawl_is_finished(
    open_scheduler: Callable[..., Scheduler], client: redis.Redis
) -> None:
    a, b = open_scheduler(), open_scheduler()
    a.enqueue_request(Request(URL + "1"))
    a.enqueue_request(Request(URL + "2"))
    a.close("finished")  # b still has work: nothing may be deleted under it
    assert client.exists(a.queue.key, _set_key(a)) == 2
    assert sorted(r.url for r in drain(b)) == [URL + "1", URL + "2"]
    b.enqueue_request(Request(URL + "3"))
    assert [r.url for r in drain(b)] == [URL + "3"]
    b.close("finished")  # nothing queued, leased or waiting: the crawl is finished
    keys = a.frontier.keys
    held = (keys.holding(a.frontier.worker_id), keys.holding(b.frontier.worker_id))
    assert client.exists(a.queue.key, _set_key(a), keys.seq, keys.holders, *held) == 0
    assert client.exists(a.registry.key) == 0
    # the last worker of a finished crawl leaves nothing, as scrapy-redis's (its
    # progress record stayed a day, for workers of the run that were gone anyway)
    assert sorted(client.scan_iter(match=f"{keys.crawl}*")) == []


def test_a_finished_crawl_whose_killed_worker_is_still_registered_expires_what_it_keeps(
    open_scheduler: Callable[..., Scheduler], client: redis.Redis
) -> None:
    """A worker killed near the end is still registered as live when the last one
    leaves: the progress record stays for it, and the registry (the killed worker's
    entry stayed for good) expires with the record, as the holders zset does."""
    survivor, killed = open_scheduler(), open_scheduler()
    survivor.enqueue_request(Request(URL + "1"))
    assert [r.url for r in drain(survivor)] == [URL + "1"]
    killed.heartbeat.stop()  # killed: it never leaves
    survivor.close("finished")
    keys = survivor.frontier.keys
    left = [k.decode() for k in client.scan_iter(match=f"{keys.crawl}*")]
    assert left, "the progress record stays for the killed worker"
    assert all(0 < client.ttl(k) <= 86400 for k in left), {k: client.ttl(k) for k in left}


def test_persist_true_keeps_everything(
    open_scheduler: Callable[..., Scheduler], client: redis.Redis
) -> None:
    a = open_scheduler({"SCHEDULER_PERSIST": True})
    a.enqueue_request(Request(URL + "1"))
    drain(a)
    a.close("finished")
    assert client.exists(_set_key(a)) == 1


def test_an_unfinished_crawl_is_never_deleted(
    open_scheduler: Callable[..., Scheduler], client: redis.Redis
) -> None:
    """Even the last worker leaving (the other one's heartbeat is stale) keeps the work."""
    a = open_scheduler()
    a.enqueue_request(Request(URL + "1"))
    client.hset(a.registry.key, "ghost:1:dead", "1000.0")  # heartbeat from long ago
    a.close("shutdown")
    assert client.exists(a.queue.key, _set_key(a)) == 2
    assert client.hlen(a.registry.key) == 0  # the stale worker was pruned


def test_flush_on_start(
    open_scheduler: Callable[..., Scheduler], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    first = open_scheduler({"SCHEDULER_PERSIST": True})
    first.enqueue_request(Request(URL + "old"))
    first.close("finished")
    second = open_scheduler({"SCHEDULER_PERSIST": True, "SCHEDULER_FLUSH_ON_START": True})
    assert len(second) == 0
    assert second.enqueue_request(Request(URL + "old"))  # the dupefilter was flushed too
    # a third worker joining with FLUSH_ON_START must not wipe the running crawl
    with caplog.at_level(logging.WARNING):
        third = open_scheduler({"SCHEDULER_PERSIST": True, "SCHEDULER_FLUSH_ON_START": True})
    assert len(third) == 1
    assert "other worker(s) of this crawl are running" in caplog.text


def test_prefetched_requests_are_returned_at_close(
    open_scheduler: Callable[..., Scheduler],
) -> None:
    a = open_scheduler({"SCHEDULER_PREFETCH": 10, "SCHEDULER_PERSIST": True})
    for i in range(5):
        a.enqueue_request(Request(f"{URL}{i}", priority=i))
    first = a.next_request()
    assert first is not None
    assert first.url == URL + "4"
    assert len(a.queue) == 0  # the other four sit in a's buffer
    a.close("shutdown")
    b = open_scheduler()
    assert [r.url for r in drain(b)] == [f"{URL}{i}" for i in (3, 2, 1, 0)]


def test_idle_before_close(open_scheduler: Callable[..., Scheduler]) -> None:
    scheduler = open_scheduler({"SCHEDULER_IDLE_BEFORE_CLOSE": 30})
    scheduler.enqueue_request(Request(URL))
    drain(scheduler)
    assert scheduler.has_pending_requests()  # keeps the spider open for new work a while
    assert scheduler.next_request() is None  # but never blocks


def test_non_redis_dupefilter_warns(
    open_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        scheduler = open_scheduler({"DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter"})
    assert "not Redis-backed" in caplog.text
    assert scheduler.enqueue_request(Request(URL))
    assert not scheduler.enqueue_request(Request(URL))  # still filters locally


def test_unreachable_redis_at_open(
    make_crawler: Callable[..., Crawler], caplog: pytest.LogCaptureFixture
) -> None:
    crawler = make_crawler({"REDIS_URL": f"redis://:pw@127.0.0.1:{free_port()}/0"})
    scheduler = build_from_crawler(Scheduler, crawler)
    with caplog.at_level(logging.WARNING):
        assert crawler.spider is not None
        scheduler.open(crawler.spider)  # a failed start, reported, not raised
        assert not scheduler.has_pending_requests()
        with pytest.raises(CloseSpider) as info:
            scheduler.close_if_failed()
        scheduler.close("redis_unavailable")  # touches Redis no more
    assert info.value.reason == "redis_unavailable"
    [record] = caplog.records  # one line, nothing else
    assert record.levelno == logging.ERROR
    assert re.search(r"127\.0\.0\.1.*REDIS_URL", record.getMessage())
    assert "pw" not in record.getMessage()
    # without a crawler to report to, the scheduler raises
    scheduler = Scheduler(
        frontier=scheduler.frontier,
        dupefilter=scheduler.df,
        serializer=scheduler.serializer,
        registry=scheduler.registry,
        dead=scheduler.dead,
        stats=scheduler.stats,
        in_flight=tuple,
    )
    assert crawler.spider is not None
    with pytest.raises(RedisUnavailable, match=r"127\.0\.0\.1") as raised:
        scheduler.open(crawler.spider)
    assert "pw" not in str(raised.value)


def test_wrong_password_at_open(
    make_crawler: Callable[..., Crawler],
    client: redis.Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = client.connection_pool.connection_kwargs["port"]
    client.acl_setuser(name, enabled=True, passwords=["+right"], commands=["+@all"], keys=["*"])
    try:
        crawler = make_crawler({"REDIS_URL": f"redis://{name}:secret@127.0.0.1:{port}/0"})
        scheduler = build_from_crawler(Scheduler, crawler)
        with caplog.at_level(logging.WARNING):
            assert crawler.spider is not None
            scheduler.open(crawler.spider)
    finally:
        client.acl_deluser(name)
    [record] = caplog.records
    assert "refused the credentials" in record.getMessage()
    assert "REDIS_URL" in record.getMessage()
    assert "secret" not in record.getMessage()
    assert start_failure(crawler).reason == "redis_unavailable"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "settings",
    [
        {"SCHEDULER_QUEUE_CLASS": "scrapy_dist.filters.SetBackend"},
        {"SCHEDULER_PREFETCH": -1},
        {"SCHEDULER_FLUSH_INTERVAL": -1},
        {"SCHEDULER_IDLE_BEFORE_CLOSE": -1},
        {"SCHEDULER_WORKER_TIMEOUT": 1, "SCHEDULER_HEARTBEAT_INTERVAL": 5},
    ],
)
def test_misconfiguration(
    make_crawler: Callable[..., Crawler], settings: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Invalid scheduler settings are a start-up failure (one ERROR line, exit 1), not an
    exception that leaves Scrapy's engine half-opened (a cascade of tracebacks)."""
    crawler = make_crawler(settings)
    with caplog.at_level(logging.ERROR):
        scheduler = build_from_crawler(Scheduler, crawler)
    assert isinstance(scheduler, FailedScheduler)
    assert start_failure(crawler).reason == "configuration_error"
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage().startswith("Cannot start: ")
    assert not scheduler.has_pending_requests()
    assert scheduler.next_request() is None
    with pytest.raises(ConfigurationError):  # built directly, it still raises
        Scheduler._build(make_crawler(settings))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"prefetch": 0}, "SCHEDULER_PREFETCH must be at least 1"),
        ({"idle_before_close": -1.0}, "SCHEDULER_IDLE_BEFORE_CLOSE cannot be negative"),
        ({"heartbeat_interval": 60.0}, "SCHEDULER_WORKER_TIMEOUT"),
    ],
)
def test_constructor_refuses_contradictory_options(
    make_crawler: Callable[..., Crawler], options: dict[str, Any], message: str
) -> None:
    # a Scheduler built by its constructor (not from a crawler's checked settings) checks
    # its own options, with the error naming the setting
    built = build_from_crawler(Scheduler, make_crawler())
    with pytest.raises(ConfigurationError, match=message):
        Scheduler(
            frontier=built.frontier,
            dupefilter=built.df,
            serializer=built.serializer,
            registry=built.registry,
            dead=built.dead,
            stats=built.stats,
            in_flight=tuple,
            **options,
        )


def test_queue_key_of_the_wrong_type(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    crawler = make_crawler()
    client.rpush(assemble(crawler).keys.requests, b"left by a FIFO crawl")
    scheduler = build_from_crawler(Scheduler, crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    failure = start_failure(crawler)
    assert failure is not None
    assert failure.reason == "configuration_error"
    assert "holds a list" in failure.message
    assert client.hlen(assemble(crawler).keys.workers) == 0  # never joined


def test_children_travel_in_one_round_trip_and_their_parents_ack_follows(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    crawler = make_crawler({"SCHEDULER_PREFETCH": 4})  # the default, batched flushing
    scheduler = build_from_crawler(Scheduler, crawler)
    holding: set[Request] = set()
    scheduler.deliveries.in_flight = lambda: holding
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    stats = scheduler.stats
    assert scheduler.enqueue_request(Request(URL))
    assert queued_count(client, scheduler.queue.key) == 0  # waits for the next flush
    parent = scheduler.next_request()  # sends it, and leases it back: one round trip
    assert parent is not None
    holding.add(parent)
    before = stats.get_value("scheduler/redis/round_trips")
    for i in range(10):
        scheduler.enqueue_request(Request(f"{URL}child/{i}"))
    assert scheduler.enqueue_request(Request(f"{URL}child/0"))  # Redis will filter it
    holding.discard(parent)  # the engine is done with the parent
    child = scheduler.next_request()  # the children and the next leases: one round trip
    assert child is not None
    assert stats.get_value("scheduler/redis/round_trips") == before + 1
    assert stats.get_value("dupefilter/filtered") == 1
    # the parent's ack goes only once Redis has confirmed its children: next flush
    assert stats.get_value("scheduler/leases/acked") is None
    assert scheduler.frontier.flush() == []
    assert stats.get_value("scheduler/leases/acked") == 1
    assert queued_count(client, scheduler.queue.key) == 10 - 4  # four leased to this worker
    held = holdings(client, scheduler.frontier.keys.crawl)
    assert {w: len(leases) for w, leases in held.items()} == {scheduler.frontier.worker_id: 4}
    scheduler.close("finished")


def test_a_worker_holding_nothing_forgets_its_seen_cache(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """A finished crawl may delete its dupefilter: a worker that stays must not keep
    filtering a new run's pages from its own cache."""
    crawler = make_crawler({"SCHEDULER_FLUSH_INTERVAL": 0})
    scheduler = build_from_crawler(Scheduler, crawler)
    holding: set[Request] = set()
    scheduler.deliveries.in_flight = lambda: holding
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    assert scheduler.enqueue_request(Request(URL))
    request = scheduler.next_request()
    assert request is not None
    holding.add(request)
    assert not scheduler.enqueue_request(Request(URL))  # known locally, no round trip
    holding.clear()
    assert scheduler.next_request() is None  # holds nothing now
    assert _progress(scheduler.frontier.progress(grace=0, clear=True)).state == "finished"
    assert scheduler.enqueue_request(Request(URL))  # a new run crawls it again
    scheduler.close("finished")


def _open(crawler: Crawler, holding: set[Request]) -> Scheduler:
    """A scheduler opened for ``crawler`` whose engine holds ``holding``."""
    return HeldRequests(crawler, holding=holding).scheduler


def test_a_seen_cache_outlives_a_moment_holding_nothing_when_a_reserve_brings_leases(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """A worker that holds nothing for a moment and then leases more under the same
    epoch keeps its seen-cache: the crawl cannot have finished meanwhile (Redis would
    have refused the reserve), so known duplicates are still filtered locally."""
    settings = {"SCHEDULER_FLUSH_INTERVAL": 0, "SCHEDULER_PREFETCH": 1}
    crawler = make_crawler(settings)
    holding: set[Request] = set()
    scheduler = _open(crawler, holding)
    stats = crawler.stats
    assert stats is not None
    assert scheduler.enqueue_request(Request(URL))
    parent = scheduler.next_request()
    assert parent is not None
    holding.add(parent)
    assert scheduler.enqueue_request(Request(f"{URL}child"))
    assert not scheduler.enqueue_request(Request(URL))  # known locally
    assert stats.get_value("dupefilter/local/hits") == 1
    holding.clear()  # the engine is done with the parent: this worker holds nothing...
    child = scheduler.next_request()  # ...until this reserve (same epoch) leases the child
    assert child is not None
    holding.add(child)
    assert not scheduler.enqueue_request(Request(URL))
    assert stats.get_value("dupefilter/local/hits") == 2  # still known locally
    scheduler.close("finished")


def test_a_seen_cache_goes_when_the_crawl_finished_and_a_new_run_leases(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """A worker that finished the crawl and then leases a request of the next run (a
    new epoch) forgets its seen-cache before using it: the old dupefilter is gone."""
    settings = {"SCHEDULER_FLUSH_INTERVAL": 0, "SCHEDULER_PREFETCH": 1}
    crawler = make_crawler(settings)
    holding: set[Request] = set()
    scheduler = _open(crawler, holding)
    assert scheduler.enqueue_request(Request(URL))
    request = scheduler.next_request()
    assert request is not None
    holding.add(request)
    assert not scheduler.enqueue_request(Request(URL))  # known locally
    holding.clear()
    assert scheduler.next_request() is None  # holds nothing now
    assert _progress(scheduler.frontier.progress(grace=0, clear=True)).state == "finished"
    other_holding: set[Request] = set()
    other = _open(make_crawler(settings), other_holding)  # starts the next run
    assert other.enqueue_request(Request(f"{URL}next"))
    leased = scheduler.next_request()  # joins the new epoch, leases the next run's request
    assert leased is not None
    holding.add(leased)
    assert scheduler.enqueue_request(Request(URL))  # the new run crawls it again
    assert len(scheduler.queue) == 1
    other.close("finished")
    scheduler.close("finished")


def _warning(record: logging.LogRecord) -> bool:
    """A warning other than the one about the parent-links middleware (these tests'
    crawlers have no spider middleware)."""
    return record.levelno == logging.WARNING and "ParentLinks" not in record.getMessage()


def test_open_names_the_keys_and_hints_at_a_misspelled_seeds_key(
    open_scheduler: Callable[..., Scheduler],
    client: redis.Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client.rpush(f"{name}s:start_urls", "https://e.com/")  # the spider is "<name>"
    client.rpush(f"{name}:job7:start_urls", "https://e.com/")  # a job suffix apart
    client.rpush(f"{name}zzzzzzzzzzzz:start_urls", "https://e.com/")  # another crawl
    with caplog.at_level(logging.INFO):
        open_scheduler()
    joined = next(r.getMessage() for r in caplog.records if "joined crawl" in r.getMessage())
    assert f"seeds key {name}:start_urls (list)" in joined
    assert f"queue {name}:requests" in joined
    [hint] = [r.getMessage() for r in caplog.records if _warning(r)]
    assert f"{name}s:start_urls" in hint
    assert f"{name}:job7:start_urls" in hint
    assert "zzzz" not in hint


def test_no_hint_when_the_seeds_key_has_seeds(
    open_scheduler: Callable[..., Scheduler],
    client: redis.Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client.rpush(f"{name}:start_urls", "https://e.com/")
    client.rpush(f"{name}s:start_urls", "https://e.com/")
    with caplog.at_level(logging.WARNING):
        open_scheduler()
    assert not [r for r in caplog.records if _warning(r)]


# -- start requests of a plain spider (SCHEDULER_START_ONCE) -------------------------------


def _start(url: str = URL) -> Request:
    return Request(url, dont_filter=True, meta={"is_start_request": True})


def test_start_request_once_whoever_sends_it_first(
    open_scheduler: Callable[..., Scheduler],
) -> None:
    """The crawl's first worker to join may send its start request after one that
    joined later: the request is queued once between them (the first to record it
    in Redis queues it)."""
    first, second = open_scheduler(), open_scheduler()  # first joined alone
    assert second.enqueue_request(_start())
    assert not first.enqueue_request(_start())
    assert [r.url for r in drain(first)] == [URL]
    assert drain(second) == []


def test_start_request_once_per_run(
    open_scheduler: Callable[..., Scheduler], client: redis.Redis
) -> None:
    """A worker that joins when no other runs (a resumed or re-run persisted crawl)
    crawls its start request again, once between the workers of that run."""
    settings = {"SCHEDULER_PERSIST": True}
    first = open_scheduler(settings)
    assert first.enqueue_request(_start())
    assert [r.url for r in drain(first)] == [URL]
    first.close("finished")
    again, other = open_scheduler(settings), open_scheduler(settings)
    assert again.enqueue_request(_start())
    assert not other.enqueue_request(_start())
    assert [r.url for r in drain(again)] == [URL]


def test_a_retry_or_redirect_of_a_start_request_is_scheduled_as_any_request(
    open_scheduler: Callable[..., Scheduler],
) -> None:
    """RetryMiddleware and RedirectMiddleware copy a start request's meta, with its
    ``is_start_request``: the copies were taken for start requests another worker had
    claimed and dropped (a start URL answering 503 was fetched once, never retried, its
    errback never called). Only the start request itself is claimed."""
    first, second = open_scheduler(), open_scheduler()
    start = _start()
    assert first.enqueue_request(start)
    [taken] = drain(first)
    retry = taken.copy()  # what RetryMiddleware schedules (meta copied)
    retry.meta["retry_times"] = 1
    assert first.enqueue_request(retry)
    redirect = taken.replace(url=URL + "moved")  # and RedirectMiddleware
    assert second.enqueue_request(redirect)
    assert sorted(r.url for r in drain(first)) == [URL, URL + "moved"]


def test_a_start_request_given_twice_is_crawled_twice(
    open_scheduler: Callable[..., Scheduler],
) -> None:
    """Scrapy's scheduler crawls two ``dont_filter`` start requests of one URL twice;
    so do the workers of a crawl between them (the n-th of one fingerprint is claimed
    as such), once each."""
    first, second = open_scheduler(), open_scheduler()
    assert first.enqueue_request(_start())
    assert first.enqueue_request(_start())
    assert not second.enqueue_request(_start())
    assert not second.enqueue_request(_start())
    assert second.enqueue_request(_start())  # a third: second's own
    assert [r.url for r in drain(first)] == [URL] * 3


def test_a_worker_does_not_start_beside_a_previous_version_worker_holding_leases(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """Leases in the previous layout while a worker of the crawl runs: that worker is of
    the previous version (it knows nothing of holdings), so this one refuses to start,
    naming it; once nothing runs, it starts and takes those leases back as they expire."""
    crawler = make_crawler()
    keys = assemble(crawler).keys
    client.zadd(keys.leases, {"0000000000000001": 9e9})  # an old worker's lease
    client.hset(keys.leased, "0000000000000001", b"q|0|old:1:aa|0000000000000001{}")
    now = client.time()[0]
    client.hset(keys.workers, "old:1:aa", now)  # its heartbeat, just now
    scheduler = build_from_crawler(Scheduler, crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    failure = start_failure(crawler)
    assert failure is not None
    assert failure.reason == "configuration_error"
    assert "1 lease(s) a previous version of scrapy_dist granted" in failure.message
    assert "old:1:aa" in failure.message
    assert client.hkeys(keys.workers) == [b"old:1:aa"]  # never joined
    client.hset(keys.workers, "old:1:aa", now - 3600)  # it stopped long ago
    again = make_crawler()
    scheduler = build_from_crawler(Scheduler, again)
    assert again.spider is not None
    scheduler.open(again.spider)
    assert start_failure(again) is None
    assert leased_count(client, keys.crawl) == 1  # counted until it expires
    # a second worker of this version, started while the first runs and the old lease
    # is still held: the first is in the holders zset, so it is not taken for an old one
    third = make_crawler()
    other = build_from_crawler(Scheduler, third)
    assert third.spider is not None
    other.open(third.spider)
    assert start_failure(third) is None
    other.close("finished")
    scheduler.close("finished")
