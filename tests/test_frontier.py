"""Leases on a real Redis: reclaim, renewal, delivery limits, settlement, completion."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.utils.misc import build_from_crawler
from twisted.python.failure import Failure

from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.frontier.wire import DEAD_NOW, DONE, HAND_BACK
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.testing.engine import HeldRequests
from scrapy_dist.testing.leases import deadline, holdings, leased_count
from scrapy_dist.testing.queues import queued_count
from scrapy_dist.worker.membership import CloseWait

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from scrapy.crawler import Crawler

    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.frontier.progress import Progress

URL = "https://example.com/"


def _progress(progress: Progress | None) -> Progress:
    """A progress report; None would mean Redis did not answer."""
    assert progress is not None
    return progress


FAST = {
    "SCHEDULER_LEASE_TIMEOUT": 0.6,
    "SCHEDULER_HEARTBEAT_INTERVAL": 0.15,
    "SCHEDULER_WORKER_TIMEOUT": 1,
    "SCHEDULER_MAX_DELIVERIES": 2,
    "SCHEDULER_FLUSH_INTERVAL": 0,
    "SCHEDULER_PREFETCH": 1,
}
#: These tests take requests in the order they queued them (scrapy_dist follows
#: Scrapy's SCHEDULER_MEMORY_QUEUE: last in, first out by default).
FIFO_TIES = {"SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue"}


#: A worker, as its tests drive it.
Worker = HeldRequests


@pytest.fixture
def worker(make_crawler: Callable[..., Crawler]) -> Iterator[Callable[..., Worker]]:
    made: list[Worker] = []

    def make(settings: dict[str, Any] | None = None, started: float | None = None) -> Worker:
        made.append(Worker(make_crawler({**FAST, **FIFO_TIES, **(settings or {})}), started))
        return made[-1]

    yield make
    for w in made:
        w.close()


def dead_letters(client: redis.Redis, frontier: CrawlFrontier) -> list[dict[str, Any]]:
    return [json.loads(d) for d in client.lrange(frontier.keys.dead, 0, -1)]


def test_taking_a_request_leases_it(worker: Callable[..., Worker], client: redis.Redis) -> None:
    w = worker()
    w.scheduler.enqueue_request(Request(URL + "a"))
    request = w.take()
    assert request is not None
    keys, me = w.frontier.keys, w.frontier.worker_id
    assert queued_count(client, w.scheduler.queue.key) == 0
    assert client.hlen(keys.holding(me)) == 1  # held, with a deadline, until Scrapy is done
    assert deadline(client, keys.crawl, me) is not None
    w.scheduler.deliveries.settle()
    assert client.hlen(keys.holding(me)) == 1  # still in the engine
    w.finish(request)
    assert client.exists(keys.holding(me)) == 0
    assert leased_count(client, keys.crawl) == 0
    assert client.hget(keys.progress, "done") == b"1"


def test_a_dead_workers_requests_come_back(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    killed, survivor = worker(), worker()
    for c in "abc":
        killed.scheduler.enqueue_request(Request(URL + c))
    taken = [killed.take(), killed.take()]
    assert all(taken)
    assert killed.scheduler.heartbeat.ticker is not None
    killed.scheduler.heartbeat.ticker.stop()  # the worker dies: no renewal, no settlement
    assert survivor.take() is not None  # "c", the one left in the queue
    assert survivor.take() is None  # the dead worker's two are still leased
    time.sleep(0.7)
    back = [survivor.take(), survivor.take()]
    assert sorted(r.url for r in back if r) == [URL + "a", URL + "b"]


def test_renewal_keeps_a_slow_request(worker: Callable[..., Worker]) -> None:
    # a 2 s lease renewed every 0.3 s: a loaded machine may stall a tick by over 1 s
    # before the lease runs out (with the module's 0.6 s lease, by 0.3 s)
    slow, other = worker({"SCHEDULER_LEASE_TIMEOUT": 2}), worker()
    slow.scheduler.enqueue_request(Request(URL + "slow"))
    assert slow.take() is not None
    for _ in range(14):  # 4.2 s, twice the lease timeout, renewed on each tick
        time.sleep(0.3)
        slow.scheduler.heartbeat.tick()
    assert other.take() is None


def test_poison_page_goes_to_dead_letters_after_max_deliveries(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    first = worker()
    first.scheduler.enqueue_request(Request(URL + "poison"))
    second = worker()
    for w in (first, second):  # MAX_DELIVERIES = 2: taken twice by workers that die
        assert w.take() is not None
        w.close()
        w.holding.clear()
        w.scheduler.deliveries.out.clear()
        time.sleep(0.7)
    last = worker()
    assert last.take() is None  # the reserve reclaimed it to the dead-letter list
    [record] = dead_letters(client, last.frontier)
    assert record["kind"] == "request"
    assert "lease expired" in record["reason"]
    assert record["deliveries"] == 2
    assert record["worker"] == second.frontier.worker_id  # its last holder
    assert leased_count(client, last.frontier.keys.crawl) == 0
    assert json.loads(record["data"])["url"] == URL + "poison"


def test_a_callback_error_is_done_by_default_as_on_scrapys_scheduler(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    """Scrapy's scheduler crawls a request whose callback raised once: so does ours
    unless SCHEDULER_CALLBACK_ERRORS asks otherwise (it retried the page by default,
    scraping its items again each time)."""
    from scrapy.http import HtmlResponse

    w = worker()
    w.scheduler.enqueue_request(Request(URL + "raises"))
    request = w.take()
    assert request is not None
    try:
        raise ValueError("parse failed")
    except ValueError:
        failure = Failure()
    assert w.scheduler.spider is not None
    w.scheduler.record_failure(
        failure, HtmlResponse(request.url, request=request), w.scheduler.spider
    )
    w.finish(request)
    w.frontier.flush()
    assert w.take() is None
    assert dead_letters(client, w.frontier) == []
    assert leased_count(client, w.frontier.keys.crawl) == 0
    assert w.scheduler.stats.get_value("scheduler/failed_callbacks") == 1
    assert w.scheduler.stats.get_value("scheduler/leases/retried") is None


def test_callback_errors_retry_then_dead_letter_with_the_reason(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    from scrapy.http import HtmlResponse

    w = worker({"SCHEDULER_CALLBACK_ERRORS": "retry"})
    w.scheduler.enqueue_request(Request(URL + "raises"))
    for attempt in range(2):
        request = w.take()
        assert request is not None, attempt
        try:
            raise ValueError("parse failed")
        except ValueError:
            failure = Failure()
        assert w.scheduler.spider is not None
        response = HtmlResponse(request.url, request=request)
        w.scheduler.record_failure(failure, response, w.scheduler.spider)
        w.finish(request)
    assert w.take() is None
    [record] = dead_letters(client, w.frontier)
    assert record["reason"].startswith("ValueError: parse failed")
    assert "SCHEDULER_MAX_DELIVERIES" in record["reason"]
    assert w.scheduler.stats.get_value("scheduler/leases/retried") == 1
    assert w.scheduler.stats.get_value("scheduler/leases/dead") == 1


@pytest.mark.parametrize("flush_interval", [0, 5])
def test_with_callback_errors_dead_a_callback_error_is_dead_lettered_once_after_its_children(
    worker: Callable[..., Worker], client: redis.Redis, flush_interval: float
) -> None:
    from scrapy.http import HtmlResponse

    w = worker({"SCHEDULER_CALLBACK_ERRORS": "dead", "SCHEDULER_FLUSH_INTERVAL": flush_interval})
    w.scheduler.enqueue_request(Request(URL + "raises"))
    w.frontier.flush()
    request = w.take()
    assert request is not None
    w.returns(request, Request(URL + "child"))  # yielded before the callback raised
    try:
        raise ValueError("parse failed")
    except ValueError:
        failure = Failure()
    assert w.scheduler.spider is not None
    response = HtmlResponse(request.url, request=request)
    w.scheduler.record_failure(failure, response, w.scheduler.spider)
    w.finish(request)
    w.frontier.flush()  # the child's enqueue, then (confirmed) its parent's settlement
    w.frontier.flush()
    [record] = dead_letters(client, w.frontier)
    assert json.loads(record["data"])["url"] == URL + "raises"
    assert record["reason"].startswith("ValueError: parse failed (")
    assert "SCHEDULER_CALLBACK_ERRORS" in record["reason"]
    assert record["deliveries"] == 1
    child = w.take()  # the child is queued; the parent never comes back
    assert child is not None
    assert child.url == URL + "child"
    w.finish(child)
    w.frontier.flush()
    assert w.take() is None
    assert leased_count(client, w.frontier.keys.crawl) == 0
    stats = w.scheduler.stats
    assert stats.get_value("scheduler/leases/dead") == 1
    assert stats.get_value("scheduler/leases/retried") is None
    assert stats.get_value("scheduler/failed_callbacks/dead") == 1
    assert client.hget(w.frontier.keys.progress, "dead") == b"1"


@pytest.mark.parametrize("callback_errors", ["retry", "dead"])
def test_a_callback_error_whose_message_is_not_utf8_is_settled_with_it_escaped(
    worker: Callable[..., Worker], client: redis.Redis, callback_errors: str
) -> None:
    """redis-py encodes strings as strict UTF-8: a reason with a lone surrogate failed
    the flush carrying its settlement, and every flush after it (the worker stalled)."""
    from scrapy.http import HtmlResponse

    w = worker({"SCHEDULER_CALLBACK_ERRORS": callback_errors, "SCHEDULER_MAX_DELIVERIES": 1})
    w.scheduler.enqueue_request(Request(URL + "raises"))
    request = w.take()
    assert request is not None
    try:
        raise OSError(b"no such file: caf\xe9".decode("utf-8", "surrogateescape"))
    except OSError:
        failure = Failure()
    assert w.scheduler.spider is not None
    response = HtmlResponse(request.url, request=request)
    w.scheduler.record_failure(failure, response, w.scheduler.spider)
    w.finish(request)
    w.scheduler.enqueue_request(Request(URL + "next"))  # the flushes go on
    nxt = w.take()
    assert nxt is not None
    assert nxt.url == URL + "next"
    [record] = dead_letters(client, w.frontier)
    assert record["reason"].startswith("OSError: no such file: caf\\udce9 (")


@pytest.mark.parametrize("name", ["!Boom", "#Boom"])
def test_a_callback_error_named_like_another_outcome_is_retried_then_dead_lettered_whole(
    worker: Callable[..., Worker], client: redis.Redis, name: str
) -> None:
    """An exception class whose name starts with a mark of another settlement outcome
    (a class made with type()): under "retry", "!" made its reason the
    dead-letter record itself (the request lost, a line that is no JSON in the dead
    list) and "#" dead-lettered it at once. It is retried, then dead-lettered whole."""
    from scrapy.http import HtmlResponse

    w = worker({"SCHEDULER_CALLBACK_ERRORS": "retry"})
    w.scheduler.enqueue_request(Request(URL + "raises"))
    w.frontier.flush()
    error: type[Exception] = type(name, (Exception,), {})
    for attempt in range(2):  # SCHEDULER_MAX_DELIVERIES (the fixture's)
        request = w.take()
        assert request is not None, attempt
        assert request.url == URL + "raises"
        try:
            raise error("x")
        except error:
            failure = Failure()
        assert w.scheduler.spider is not None
        response = HtmlResponse(request.url, request=request)
        w.scheduler.record_failure(failure, response, w.scheduler.spider)
        w.finish(request)
        w.frontier.flush()
    assert w.take() is None
    [record] = dead_letters(client, w.frontier)
    assert json.loads(record["data"])["url"] == URL + "raises"
    assert record["reason"].startswith(f"Error {name}: x (failed on 2 deliveries")
    assert w.scheduler.stats.get_value("scheduler/leases/retried") == 1


def test_close_hands_back_unstarted_requests_without_counting_a_delivery(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    a = worker({"SCHEDULER_PREFETCH": 5, "SCHEDULER_PERSIST": True})
    for i in range(3):
        a.scheduler.enqueue_request(Request(f"{URL}{i}"))
    assert a.take() is not None
    a.scheduler.close("shutdown")  # one is still in the engine: handed back too
    keys = a.frontier.keys
    assert leased_count(client, keys.crawl) == 0
    assert queued_count(client, a.scheduler.queue.key) == 3
    assert client.hlen(keys.deliveries) == 0  # handed back: no delivery counted


def test_a_lease_taken_over_is_not_settled_by_its_old_holder(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    slow, fast = worker(), worker()
    slow.scheduler.enqueue_request(Request(URL + "x"))
    request = slow.take()
    assert request is not None
    time.sleep(0.7)
    assert fast.take() is not None  # reclaimed and leased to fast
    slow.finish(request)  # too late: the lease is fast's now
    keys = slow.frontier.keys
    assert client.exists(keys.holding(slow.frontier.worker_id)) == 0
    assert client.hlen(keys.holding(fast.frontier.worker_id)) == 1
    assert leased_count(client, keys.crawl) == 1
    assert slow.scheduler.stats.get_value("scheduler/leases/lease_lost") == 1


def test_seeds_are_leased_until_settled(worker: Callable[..., Worker], client: redis.Redis) -> None:
    w = worker()
    f = w.frontier
    client.rpush(f.seeds.key, b"https://e.com/1", b"https://e.com/2")
    leases = f.reserve(10, seeds=True)
    assert [lease.data for lease in leases] == [b"https://e.com/1", b"https://e.com/2"]
    assert client.llen(f.seeds.key) == 0
    assert set(holdings(client, f.keys.crawl)[f.worker_id]) == {lease.id for lease in leases}
    assert leased_count(client, f.keys.crawl) == 2
    f.settle([(leases[0].id, DONE), (leases[1].id, HAND_BACK)])
    assert client.lrange(f.seeds.key, 0, -1) == [b"https://e.com/2"]
    assert leased_count(client, f.keys.crawl) == 0


def test_progress_to_finished(worker: Callable[..., Worker], client: redis.Redis) -> None:
    w = worker()
    f = w.frontier
    assert _progress(f.progress(grace=0.3, clear=False)).state == "waiting"  # never started
    w.scheduler.enqueue_request(Request(URL))
    assert _progress(f.progress(grace=0.3, clear=False)).state == "busy"
    request = w.take()
    assert request is not None
    progress = _progress(f.progress(grace=0.3, clear=False))
    assert (progress.state, progress.leased) == ("busy", 1)
    w.finish(request)
    assert _progress(f.progress(grace=0.3, clear=True)).state == "idle"
    time.sleep(0.35)
    assert _progress(f.progress(grace=0.3, clear=True)).state == "finished"
    assert isinstance(w.scheduler.df, RFPDupeFilter)
    assert client.exists(*w.scheduler.df.backend.keys()) == 0  # cleared exactly once
    assert f.totals() == {"done": 1}
    w.scheduler.enqueue_request(Request(URL))  # new work: the crawl is busy again
    assert _progress(f.progress(grace=0.3, clear=False)).state == "busy"


@pytest.mark.parametrize("value", [b"junk", b"nan", b"inf", b"1.5"])
def test_totals_read_a_counter_written_by_hand_as_0_with_one_warning(
    worker: Callable[..., Worker],
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    value: bytes,
) -> None:
    """``int(float(value))`` failed the close of a finished crawl (ValueError,
    OverflowError), or read "1.5" as 1 where the scripts read 0."""
    f = worker().frontier
    client.hset(f.keys.progress, mapping={"done": value, "dead": 2})
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.frontier.progress"):
        assert f.totals() == {"done": 0, "dead": 2}
        assert f.totals() == {"done": 0, "dead": 2}
    [warning] = [r.getMessage() for r in caplog.records if "Progress counter" in r.getMessage()]
    assert f.keys.progress in warning


def test_totals_read_a_progress_key_of_another_type_as_no_counters(
    worker: Callable[..., Worker], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The WRONGTYPE was taken for a server refusing (a backoff, with a log line that
    Redis is refusing): at a crawl's close, right before its last writes."""
    f = worker().frontier
    client.set(f.keys.progress, b"junk")
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.frontier.progress"):
        assert f.totals() == {}
    assert f.reachable
    assert any("is not a hash" in r.getMessage() for r in caplog.records)


def test_leases_granted_in_a_lost_reply_are_handed_back(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    w = worker()
    for c in "abc":
        w.scheduler.enqueue_request(Request(URL + c))
    kept = w.take()  # one lease the worker knows about
    assert kept is not None
    f = w.one_shard
    # Redis runs a reserve whose reply never reaches the worker (it timed out)
    lost = f.leases.reserve_call(2, f.epoch)
    client.evalsha(lost.script.sha, len(lost.keys), *lost.keys, *lost.args)
    holding = f.keys.holding(f.worker_id)
    assert client.hlen(holding) == 3
    f.leases.reply_lost = True
    f.flush(reserve=0)  # the next call first hands back what the worker does not know
    f.settle([])
    assert client.hlen(holding) == 1
    assert leased_count(client, f.keys.crawl) == 1
    assert queued_count(client, w.scheduler.queue.key) == 2
    assert w.scheduler.stats.get_value("scheduler/leases/released_unknown") == 2
    assert client.hlen(f.keys.deliveries) == 0  # handed back: that delivery not counted
    assert [lease.deliveries for lease in f.reserve(2)] == [1, 1]


def test_an_ack_never_outlives_a_refused_enqueue_of_its_children(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    w = worker({"SCHEDULER_FLUSH_INTERVAL": 0.1})  # batched
    w.frontier.eager = False
    w.scheduler.enqueue_request(Request(URL + "parent"))
    parent = w.take()
    assert parent is not None
    w.scheduler.enqueue_request(Request(URL + "child"))
    w.finish(parent)  # its ack waits behind the child
    client.delete(w.scheduler.queue.key)
    client.set(w.scheduler.queue.key, b"not a queue")  # the enqueue will be refused
    w.frontier.flush()
    assert w.scheduler.stats.get_value("scheduler/redis/refused/WRONGTYPE") == 1
    holding = w.frontier.keys.holding(w.frontier.worker_id)
    assert client.hlen(holding) == 1  # the ack was not sent with it
    assert w.frontier.pending_writes == 2  # a refusal is an outage: both wait
    client.delete(w.scheduler.queue.key)  # the operator fixes the key
    w.one_shard.outbox._retry_at = 0.0  # (skip the backoff pause)
    w.frontier.flush()  # the child is confirmed, and its parent's ack goes next
    w.frontier.flush()
    assert w.frontier.pending_writes == 0
    assert client.hlen(holding) == 0
    assert w.take() is not None  # the child


def test_a_permanent_refusal_dead_letters_the_children_and_fails_the_parent(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    w = worker({"SCHEDULER_FLUSH_INTERVAL": 0.1, "SCHEDULER_WRONGTYPE_TIMEOUT": 0})
    w.frontier.eager = False
    w.scheduler.enqueue_request(Request(URL + "parent"))
    parent = w.take()
    assert parent is not None
    w.returns(parent, Request(URL + "child"))
    w.finish(parent)
    client.delete(w.scheduler.queue.key)
    client.set(w.scheduler.queue.key, b"not a queue")
    w.frontier.flush()  # refused for good: the child is dead-lettered
    client.delete(w.scheduler.queue.key)
    w.frontier.flush()  # the parent is settled as failed (returned for another try)
    [record] = dead_letters(client, w.frontier)
    assert "Redis refused to enqueue it: WRONGTYPE" in record["reason"]
    assert json.loads(record["data"])["url"] == URL + "child"
    assert w.frontier.totals() == {"retried": 1}
    assert w.frontier.pending_writes == 0


def test_a_seed_keeps_its_id_across_deliveries_until_the_limit(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    """A seed carries no id, so its lease id comes from its content: the delivery count
    survives expired leases and reaches SCHEDULER_MAX_DELIVERIES (2 here)."""
    f, g, h = worker().frontier, worker().frontier, worker().frontier
    client.rpush(f.seeds.key, b"https://e.com/slow")
    [first] = f.reserve(1, seeds=True)
    assert first.deliveries == 1
    assert client.hlen(f.keys.deliveries) == 0  # no count written on a first delivery
    time.sleep(0.7)  # the lease expires (its worker died)
    [second] = g.reserve(1, seeds=True)
    assert (second.id, second.deliveries) == (first.id, 2)
    assert client.hget(f.keys.deliveries, first.id) == b"2"
    time.sleep(0.7)
    assert h.reserve(1, seeds=True) == []  # delivered twice: dead-lettered, not read again
    [record] = dead_letters(client, f)
    assert (record["kind"], record["deliveries"]) == ("seed", 2)
    assert record["data"] == "https://e.com/slow"
    assert client.hlen(f.keys.deliveries) == 0


def test_copies_of_a_seed_leased_together_get_their_own_leases(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    f = worker().frontier
    client.rpush(f.seeds.key, b"https://e.com/twice", b"https://e.com/twice")
    leases = f.reserve(2, seeds=True)
    assert len({lease.id for lease in leases}) == 2
    f.settle([(lease.id, HAND_BACK) for lease in leases])
    assert client.llen(f.seeds.key) == 2  # neither copy lost
    assert leased_count(client, f.keys.crawl) == 0


def test_a_rejected_seed_is_settled_with_its_dead_letter_exactly_once(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    f = worker().frontier
    client.rpush(f.seeds.key, b"ftp://x")
    [lease] = f.reserve(1, seeds=True)
    record = json.dumps({"kind": "seed", "reason": "bad scheme", "data": "ftp://x"})
    f.settle([(lease.id, DEAD_NOW + record)])
    f.settle([(lease.id, DEAD_NOW + record)])  # a second settlement finds it gone
    assert [d["data"] for d in dead_letters(client, f)] == ["ftp://x"]
    assert leased_count(client, f.keys.crawl) == client.hlen(f.keys.deliveries) == 0
    assert f.totals() == {"dead": 1}
    time.sleep(0.7)
    assert f.reserve(1, seeds=True) == []  # never comes back


def test_a_new_run_of_a_finished_persisted_crawl_starts_fresh(
    worker: Callable[..., Worker], make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    persist = {**FAST, **FIFO_TIES, "SCHEDULER_PERSIST": True}
    first = worker(persist)
    f = first.frontier
    started_before = time.monotonic()
    first.scheduler.enqueue_request(Request(URL))
    request = first.take()
    assert request is not None
    first.finish(request)
    assert _progress(f.progress(grace=0.3, clear=False)).state == "idle"
    time.sleep(0.35)
    assert _progress(f.progress(grace=0.3, clear=False)).state == "finished"
    first.scheduler.close("finished")

    # a worker launched before the crawl finished, joining late, belongs to that run
    crawler = make_crawler(persist)
    late = build_from_crawler(Scheduler, crawler)
    late.registry.started = started_before
    assert crawler.spider is not None
    late.open(crawler.spider)
    assert _progress(late.frontier.progress(grace=0, clear=False)).state == "finished"
    late.close("finished")

    # a worker started after it finished starts a new run, judged on its own work
    crawler = make_crawler(persist)
    second = build_from_crawler(Scheduler, crawler)
    second.registry.started = time.monotonic()
    second.deliveries.in_flight = tuple
    assert crawler.spider is not None
    second.open(crawler.spider)
    g = second.frontier
    assert _progress(g.progress(grace=0, clear=False)).state == "waiting"
    assert g.totals() == {"done": 1}  # the persisted counters stay
    second.enqueue_request(Request(URL + "2"))
    assert second.next_request() is not None
    second.deliveries.settle()
    second.frontier.flush()
    assert _progress(g.progress(grace=0, clear=False)).state == "finished"
    second.close("finished")


def test_a_permanent_refusal_fails_only_the_parents_of_the_refused_requests(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    w = worker({"SCHEDULER_FLUSH_INTERVAL": 0.1, "SCHEDULER_WRONGTYPE_TIMEOUT": 0})
    w.frontier.eager = False
    for name in ("parent", "other", "late"):
        w.scheduler.enqueue_request(Request(URL + name))
    w.frontier.flush()
    parent, other, late = w.take(), w.take(), w.take()
    assert parent is not None
    assert other is not None
    assert late is not None
    w.returns(parent, Request(URL + "child"))
    w.returns(late, Request(URL + "late-child"))
    w.finish(parent)
    w.finish(other)  # no children: queued behind the refused batch, settled as done
    client.delete(w.scheduler.queue.key)
    client.set(w.scheduler.queue.key, b"not a queue")
    w.frontier.flush()  # refused for good: both children are dead-lettered
    client.delete(w.scheduler.queue.key)
    w.finish(late)  # settled after the refusal: failed too, its child was refused
    w.frontier.flush()
    w.frontier.flush()
    assert len(dead_letters(client, w.frontier)) == 2
    assert w.frontier.totals() == {"retried": 2, "done": 1}
    assert w.frontier.pending_writes == 0


def test_children_of_a_lease_taken_over_are_refused(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    w, other = worker({"SCHEDULER_FLUSH_INTERVAL": 0.1}), worker()
    w.frontier.eager = False
    w.scheduler.enqueue_request(Request(URL + "parent"))
    w.frontier.flush()
    parent = w.take()
    assert parent is not None
    w.returns(parent, Request(URL + "held"))  # sent while the lease is this worker's
    w.frontier.flush()
    # this worker is paused past its lease: the other worker takes the page over
    keys = w.frontier.keys
    client.zadd(keys.holders, {w.frontier.worker_id: 0})
    taken = other.take()
    assert taken is not None
    assert taken.url == URL + "parent"
    assert client.exists(keys.holding(w.frontier.worker_id)) == 0
    others = keys.holding(other.frontier.worker_id)
    lease_of_other = client.hkeys(others)
    assert len(lease_of_other) == 1
    # it resumes: the children of the page it held are refused by Redis, and dropped
    w.returns(parent, Request(URL + "child/1"), Request(URL + "child/2"))
    w.frontier.flush()
    w.returns(parent, Request(URL + "child/3"))  # known taken over: not even sent
    w.finish(parent)  # not settled: the other worker holds it
    w.frontier.flush()
    stats = w.scheduler.stats
    assert stats.get_value("scheduler/leases/children_refused") == 3
    assert stats.get_value("scheduler/leases/taken_over") == 1
    assert w.frontier.pending_writes == 0
    queued = [other.take(), other.take()]
    assert [r.url for r in queued if r is not None] == [URL + "held"]
    # the refused children are not recorded as seen: the new holder queues them
    other.returns(taken, Request(URL + "child/1"))
    other.frontier.flush()
    assert other.take() is not None
    # the late settlement did not remove the other worker's lease
    assert set(lease_of_other) <= set(client.hkeys(others))
    assert w.frontier.totals() == {}


def test_a_replacement_that_joins_a_finished_crawl_leaves_no_key(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    started = time.monotonic()
    w = worker()
    w.scheduler.enqueue_request(Request(URL))
    request = w.take()
    assert request is not None
    w.finish(request)
    time.sleep(0.05)
    assert _progress(w.frontier.progress(grace=0, clear=True)).state == "finished"
    epoch = w.frontier.keys.epoch
    assert client.exists(epoch) == 0
    # a replacement started during that run joins after its keys were deleted: it
    # belongs to the finished run, and the epoch it re-created goes again
    late = worker(started=started)
    assert client.exists(epoch) == 1
    assert _progress(late.frontier.progress(grace=0, clear=True)).state == "finished"
    assert client.exists(epoch) == 0
    late.scheduler.close("finished")
    assert client.exists(epoch) == 0


def test_a_late_settlement_or_renewal_leaves_the_new_holders_lease_alone(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    w, other = worker(), worker()
    w.scheduler.enqueue_request(Request(URL + "page"))
    [lease] = w.frontier.reserve(1)
    keys, mine, its = w.frontier.keys, w.frontier.worker_id, other.frontier.worker_id
    client.zadd(keys.holders, {mine: 0})  # w is paused past its lease
    [taken] = other.frontier.reserve(1)  # the other worker takes the page over
    assert taken.id == lease.id
    held = holdings(client, keys.crawl)
    assert held[its].keys() == {lease.id}
    assert mine not in held
    until = deadline(client, keys.crawl, its)
    assert w.frontier.renew([lease.id]) == [lease.id]  # not revived, not extended
    assert deadline(client, keys.crawl, mine) is None
    assert client.exists(keys.holding(mine)) == 0
    assert deadline(client, keys.crawl, its) == until
    w.frontier.settle([(lease.id, DONE)])  # it resumes and settles what it held
    w.frontier.flush()
    assert w.scheduler.stats.get_value("scheduler/leases/lease_lost") == 1
    assert holdings(client, keys.crawl) == held  # still the other's
    assert deadline(client, keys.crawl, its) == until
    assert other.frontier.renew([lease.id]) == []
    assert w.frontier.totals() == {}


def test_a_worker_closing_after_a_takeover_hands_back_only_what_it_holds(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    w, other = worker(), worker()
    w.scheduler.enqueue_request(Request(URL + "page"))
    page = w.take()  # in w's engine
    assert page is not None
    keys = w.frontier.keys
    client.zadd(keys.holders, {w.frontier.worker_id: 0})
    assert other.take() is not None  # taken over while w was paused
    w.scheduler.deliveries.renew()  # w resumes: its renewal finds the lease taken back
    w.scheduler.close("shutdown")  # still in its engine: neither handed back nor settled
    stats = w.scheduler.stats
    assert stats.get_value("scheduler/leases/handed_back") is None
    assert stats.get_value("scheduler/leases/lease_lost") is None
    assert client.exists(keys.holding(w.frontier.worker_id)) == 0
    assert client.hlen(keys.holding(other.frontier.worker_id)) == 1  # the other worker's
    assert leased_count(client, keys.crawl) == 1


def test_a_worker_about_to_close_waits_for_the_leases_others_hold(
    worker: Callable[..., Worker], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """What a worker about to close for idleness waits for (:class:`CloseWait`): a plain
    spider, every other worker's leases; a Redis spider, a live holder's until it beats
    again, a killed one's until they expire and come back. Never its own.

    Slower than :data:`FAST`: the test sleeps between beats, and a stall of the test
    process longer than a heartbeat interval (seen at FAST's 0.15 s on a loaded machine)
    made the live worker look silent, or let the killed one's leases expire before
    they were looked at."""
    timing = {
        "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
        "SCHEDULER_LEASE_TIMEOUT": 4,
        "SCHEDULER_WORKER_TIMEOUT": 3,
    }
    killed, live, survivor = worker(timing), worker(timing), worker(timing)
    for c in "abcd":
        killed.scheduler.enqueue_request(Request(URL + c))
    assert killed.take() is not None
    assert killed.take() is not None
    assert live.take() is not None  # "c"
    assert survivor.take() is not None  # "d": the survivor's own lease is never counted
    assert killed.scheduler.heartbeat.ticker is not None
    killed.scheduler.heartbeat.ticker.stop()  # killed: no heartbeat, no renewal

    def beat() -> None:  # what the live worker's timer does (no reactor runs here)
        live.scheduler.registry.heartbeat()
        live.scheduler.deliveries.renew()

    interval = timing["SCHEDULER_HEARTBEAT_INTERVAL"]
    plain = survivor.scheduler._close_wait  # the test spider is a plain one
    assert plain is not None
    assert plain.live_too
    plain.every = 0  # (looks in Redis at each call)
    redis_spider = CloseWait(survivor.frontier, interval, live_too=False, every=0)
    assert plain.holds(None)
    # both heard from: each waited for until it beats again (a worker killed a moment
    # ago looks the same)
    assert redis_spider.holds(None)
    with caplog.at_level(logging.INFO, logger="scrapy_dist.worker.membership"):
        for _ in range(3):
            time.sleep(interval)
            beat()
            assert redis_spider.holds(None)  # the killed one never beats again
    told = [r.getMessage() for r in caplog.records if "not heard from" in r.getMessage()]
    assert len(told) == 1, told  # said once while it stays the same
    assert "2 lease(s) held by 1 worker(s)" in told[0]
    assert killed.frontier.worker_id in told[0]
    # a plain spider's line names the silent holder too, and when its leases expire
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scrapy_dist.worker.membership"):
        assert CloseWait(survivor.frontier, interval, live_too=True, every=0).holds(None)
    told = [r.getMessage() for r in caplog.records if "not heard from" in r.getMessage()]
    assert len(told) == 1, caplog.text
    assert (
        f"2 other worker(s) ({min(killed.frontier.worker_id, live.frontier.worker_id)}" in told[0]
    )
    assert (
        f"1 of them not heard from for {2 * interval:g}s ({killed.frontier.worker_id})" in told[0]
    )
    assert "expire, in " in told[0]
    found = survivor.frontier.held_elsewhere()
    assert found is not None
    held = found.held[killed.frontier.worker_id]
    assert held.leases == 2
    assert 0 < held.until - found.now <= timing["SCHEDULER_LEASE_TIMEOUT"]
    assert found.held[live.frontier.worker_id].leases == 1
    time.sleep(timing["SCHEDULER_LEASE_TIMEOUT"] - 2 * interval)
    beat()
    back = [survivor.take(), survivor.take()]  # the reserve takes them back
    assert sorted(r.url for r in back if r) == [URL + "a", URL + "b"]
    while survivor.take() is not None:  # its own "d" too (no timer renewed it here)
        pass
    # a new closing attempt (the last look was long ago): the live worker is waited for
    # until it beats again, then no longer; the plain spider waits for its lease
    assert redis_spider.holds(None)
    beat()
    assert not redis_spider.holds(None)
    assert plain.holds(None)


def test_held_elsewhere_skips_what_was_written_by_hand(
    worker: Callable[..., Worker], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Keys of another type and heartbeats that are not numbers fail nothing: a holding
    that is not a hash holds none (a reserve sets it aside when it expires), a holders
    zset that is not a zset names none, a heartbeat that is not a finite number is none
    (a silent worker's), a member that is not UTF-8 is read, and a deadline past the
    lease timeout keeps nobody waiting."""
    w = worker()
    keys = w.frontier.keys
    # (deadlines within the lease timeout: a killed worker's)
    client.zadd(keys.holders, {"ghost": time.time() + 0.5, "nan": time.time() + 0.5})
    client.set(keys.holding("ghost"), "not a hash")
    client.hset(keys.holding("nan"), "0000000000000001", "x")
    client.hset(keys.workers, mapping={"nan": "nan", "inf": "inf"})
    found = w.frontier.held_elsewhere()
    assert found is not None
    assert list(found.held) == ["nan"]
    assert found.held["nan"].leases == 1
    assert "nan" not in found.beats
    assert "inf" not in found.beats
    assert CloseWait(w.frontier, 0.15, live_too=False).holds(None)  # silent: waited for
    # a member that is not UTF-8 is named by its bytes
    client.zadd(keys.holders, {b"\xff\xfe": time.time() + 0.5})
    client.hset(keys.holding("").encode() + b"\xff\xfe", "0000000000000002", "x")
    found = w.frontier.held_elsewhere()
    assert found is not None
    assert found.held["\ufffd\ufffd"].leases == 1
    # a silent holder's deadline past this worker's lease timeout: not waited for, warned
    for member in (b"nan", b"\xff\xfe"):
        client.zadd(keys.holders, {member: time.time() + 1e6})
    far = CloseWait(w.frontier, 0.15, live_too=False, every=60)
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.worker.membership"):
        assert not far.holds(None)
        assert not far.holds(None)
    warned = [r.getMessage() for r in caplog.records if "written by hand" in r.getMessage()]
    assert len(warned) == 2, warned  # once per holder
    assert all(re.search(r"they expire in (999999|1000000)s", m) for m in warned), warned
    client.zadd(keys.holders, {"nan": time.time() + 0.5})
    assert not far.holds(None)  # within `every` of the last look: its answer, no look
    far.every = 0
    assert far.holds(None)
    # a deadline far past this worker's lease timeout, within a day: another worker's
    # longer timeout, waited for
    client.zadd(keys.holders, {"nan": time.time() + 3600})
    assert far.holds(None)
    # a heartbeat ahead of the server's clock was written by hand: no sign of life, so
    # a far deadline is not waited for (it kept a Redis spider open for ever, with
    # nothing said at INFO), nor an infinite one, and the wait reads as words
    client.hset(keys.workers, mapping={"nan": time.time() + 1e9})
    client.zadd(keys.holders, {"nan": float("inf")})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.worker.membership"):
        for live_too in (False, True):
            assert not CloseWait(w.frontier, 0.15, live_too=live_too).holds(None)
    warned = [r.getMessage() for r in caplog.records if "held by nan" in r.getMessage()]
    assert len(warned) == 2, warned
    assert all("they never expire (a deadline written by hand?)" in m for m in warned), warned
    client.zadd(keys.holders, {"nan": time.time() + 1e300})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="scrapy_dist.worker.membership"):
        assert not CloseWait(w.frontier, 0.15, live_too=True).holds(None)
    assert "they expire in 1e+300s" in caplog.text, caplog.text
    client.delete(keys.holders)
    client.set(keys.holders, "not a zset")
    found = w.frontier.held_elsewhere()
    assert found is not None
    assert found.held == {}
    client.delete(keys.holders, keys.workers)
    client.set(keys.workers, "not a hash")
    found = w.frontier.held_elsewhere()
    assert found is not None
    assert found.beats == {}


def test_a_worker_about_to_close_waits_for_what_is_queued_and_a_start_claimed_elsewhere(
    worker: Callable[..., Worker],
) -> None:
    """A request queued (its next reserve takes it) keeps a worker about to close open;
    so does, for two heartbeat intervals, a start request another worker claimed: that
    worker queues it with its next flush, the queue looking empty meanwhile."""
    w = worker()
    wait = CloseWait(w.frontier, FAST["SCHEDULER_HEARTBEAT_INTERVAL"], live_too=True, every=0)
    assert not wait.holds(None)
    w.scheduler.enqueue_request(Request(URL + "queued"))
    found = w.frontier.held_elsewhere()
    assert found is not None
    assert found.queued == 1
    assert found.held == {}
    assert wait.holds(None)
    assert w.take() is not None
    assert not wait.holds(None)
    wait.expect()
    assert wait.holds(None)
    time.sleep(2 * FAST["SCHEDULER_HEARTBEAT_INTERVAL"])
    assert not wait.holds(None)
