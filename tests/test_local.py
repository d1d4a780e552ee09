"""Requests that cannot be stored in Redis: kept in the worker's memory, as Scrapy keeps
what its disk queue cannot take, and the leases of their pages held until they are done."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.squeues import FifoMemoryQueue

from scrapy_dist.testing.engine import HeldRequests
from scrapy_dist.testing.leases import leased_count
from scrapy_dist.testing.queues import queued_count
from scrapy_dist.worker.local import LocalRequests

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from scrapy.crawler import Crawler

URL = "https://example.com/"

FAST = {
    "SCHEDULER_LEASE_TIMEOUT": 0.6,
    "SCHEDULER_HEARTBEAT_INTERVAL": 0.15,
    "SCHEDULER_WORKER_TIMEOUT": 1,
    "SCHEDULER_FLUSH_INTERVAL": 0,
    "SCHEDULER_PREFETCH": 1,
}


@pytest.fixture
def worker(make_crawler: Callable[..., Crawler]) -> Iterator[Callable[..., HeldRequests]]:
    made: list[HeldRequests] = []

    def make(settings: dict[str, Any] | None = None) -> HeldRequests:
        made.append(HeldRequests(make_crawler({**FAST, **(settings or {})})))
        return made[-1]

    yield make
    for w in made:
        w.close()


def unstorable(url: str, **kwargs: Any) -> Request:
    """A request Redis cannot carry: a Request in its meta."""
    return Request(url, meta={"from": Request(URL + "origin")}, **kwargs)


def test_local_requests_follow_priority_then_the_memory_queue_order() -> None:
    lifo, fifo = LocalRequests(), LocalRequests(FifoMemoryQueue)
    for queue in (lifo, fifo):
        for name, priority in (("a", 0), ("b", 0), ("c", 5)):
            queue.push(Request(URL + name, priority=priority))
    assert [r.url[-1] for r in iter(lifo.pop, None)] == ["c", "b", "a"]
    assert [r.url[-1] for r in iter(fifo.pop, None)] == ["c", "a", "b"]
    assert len(lifo) == len(fifo) == 0


def test_a_request_redis_cannot_carry_is_crawled_from_memory(
    worker: Callable[..., HeldRequests], client: redis.Redis
) -> None:
    """It was dead-lettered and never crawled (a scrapy-redis project carrying its item
    through three requests gave 0 of 67 items); now it is kept and crawled by its
    worker, before the requests it leased, counted as Scrapy counts it."""
    w = worker()
    assert w.scheduler.enqueue_request(Request(URL + "queued"))
    assert w.scheduler.enqueue_request(unstorable(URL + "kept"))
    assert not w.scheduler.enqueue_request(unstorable(URL + "kept"))  # a duplicate
    assert w.scheduler.has_pending_requests()
    assert len(w.scheduler) == 2
    first = w.take()
    assert first is not None
    assert first.url == URL + "kept"
    assert isinstance(first.meta["from"], Request)
    second = w.take()
    assert second is not None
    assert second.url == URL + "queued"
    stats = w.scheduler.stats.get_stats()
    assert stats["scheduler/unserializable"] == 1
    assert stats["scheduler/enqueued/memory"] == 1
    assert stats["scheduler/dequeued/memory"] == 1
    assert stats["scheduler/enqueued"] == 2
    assert not client.exists(w.frontier.keys.dead)


def test_the_page_of_a_request_kept_in_memory_stays_leased_until_it_is_done(
    worker: Callable[..., HeldRequests], client: redis.Redis
) -> None:
    """A worker killed while a request kept in memory waits loses nothing: the lease
    of the page it came from is acknowledged only once it has left the engine."""
    w = worker()
    w.scheduler.enqueue_request(Request(URL + "page"))
    page = w.take()
    assert page is not None
    w.returns(page, unstorable(URL + "child"))
    w.finish(page)
    w.frontier.flush()
    crawl = w.frontier.keys.crawl
    assert leased_count(client, crawl) == 1  # held for its child
    child = w.take()
    assert child is not None
    assert child.url == URL + "child"
    w.returns(child, unstorable(URL + "grandchild"))
    w.finish(child)
    assert leased_count(client, crawl) == 1  # and for its grandchild
    grandchild = w.take()
    assert grandchild is not None
    w.finish(grandchild)
    w.frontier.flush()
    assert leased_count(client, crawl) == 0
    assert not w.scheduler.has_pending_requests()


def test_a_killed_workers_page_comes_back_and_makes_its_kept_request_again(
    worker: Callable[..., HeldRequests], client: redis.Redis
) -> None:
    killed, survivor = worker(), worker()
    killed.scheduler.enqueue_request(Request(URL + "page"))
    page = killed.take()
    assert page is not None
    killed.returns(page, unstorable(URL + "child"))
    killed.finish(page)
    killed.frontier.flush()
    killed.close()  # killed: no more renewals, its memory gone
    deadline = time.monotonic() + 10
    again = None
    while again is None and time.monotonic() < deadline:
        time.sleep(0.2)
        again = survivor.take()
    assert again is not None
    assert again.url == URL + "page"


def test_without_the_parent_links_every_page_in_the_engine_holds_the_request(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """With the two scrapy-redis lines only (no ParentLinks middleware), the page a
    request came from is not known: every page in the engine then holds it."""
    w = HeldRequests(make_crawler({**FAST, "SCHEDULER_PREFETCH": 2}))
    try:
        w.scheduler.links = None
        for name in ("a", "b"):
            w.scheduler.enqueue_request(Request(URL + name))
        a, b = w.take(), w.take()
        assert a is not None
        assert b is not None
        w.scheduler.enqueue_request(unstorable(URL + "child"))  # a's, as far as we know
        w.finish(a)
        w.finish(b)
        w.frontier.flush()
        assert leased_count(client, w.frontier.keys.crawl) == 2
        child = w.take()
        assert child is not None
        w.finish(child)
        w.frontier.flush()
        assert leased_count(client, w.frontier.keys.crawl) == 0
    finally:
        w.close()


def test_closing_hands_back_the_pages_of_requests_left_in_memory(
    worker: Callable[..., HeldRequests], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    w = worker({"SCHEDULER_PERSIST": True})
    w.scheduler.enqueue_request(Request(URL + "page"))
    page = w.take()
    assert page is not None
    w.returns(page, unstorable(URL + "child"))
    w.finish(page)
    w.close()
    w.scheduler.close("shutdown")
    assert leased_count(client, w.frontier.keys.crawl) == 0
    assert queued_count(client, w.scheduler.queue.key) == 1  # the page, to crawl again
    assert "1 request(s) kept in memory" in caplog.text
