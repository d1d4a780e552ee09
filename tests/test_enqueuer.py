"""The way in (:mod:`scrapy_dist.worker.enqueuer`) on a real Redis: which requests reach
the crawl's queue, which are dropped before any round trip, which are kept in memory,
and how the workers of a run crawl a plain spider's start requests once between them."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, signals
from scrapy.dupefilters import RFPDupeFilter as LocalDupeFilter
from scrapy.utils.misc import build_from_crawler

from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.frontier.choice import frontier_for
from scrapy_dist.serializers import RequestCodec, RequestPolicy, load_serializer
from scrapy_dist.testing.queues import queued_count
from scrapy_dist.worker.enqueuer import START_CLAIMED, Enqueuer

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter

URL = "https://example.com/"


class Worker:
    """One worker's enqueuer with its real parts, recording what it hands elsewhere."""

    def __init__(
        self,
        crawler: Crawler,
        *,
        start_once: bool = True,
        keep_local: bool = True,
        dupefilter: BaseDupeFilter | None = None,
        parent: str = "",
    ) -> None:
        assert crawler.stats is not None
        assert crawler.spider is not None
        self.stats = crawler.stats
        self.frontier = frontier_for(crawler)
        self.frontier.join_epoch()
        if dupefilter is None:
            dupefilter = build_from_crawler(RFPDupeFilter, crawler)
            dupefilter.open()
        #: Requests kept in memory.
        self.kept: list[Request] = []
        #: Start requests another worker of the run claimed.
        self.elsewhere = 0
        #: Requests ``request_dropped`` was sent for.
        self.dropped: list[Request] = []
        crawler.signals.connect(self._on_dropped, signal=signals.request_dropped)
        self.enqueuer = Enqueuer(
            self.frontier,
            dupefilter,
            shared_df=dupefilter if isinstance(dupefilter, RFPDupeFilter) else None,
            dead=DeadLetters(
                self.frontier.client, self.frontier.keys.dead, self.frontier.worker_id
            ),
            stats=crawler.stats,
            codec=RequestCodec(load_serializer("json"), crawler.spider, RequestPolicy()),
            spider=crawler.spider,
            start_once=start_once,
            parent_of=lambda request: parent,
            claimed_elsewhere=self._claimed_elsewhere,
            signals=crawler.signals,
            keep_local=self.kept.append if keep_local else None,
        )

    def _on_dropped(self, request: Request) -> None:
        self.dropped.append(request)

    def _claimed_elsewhere(self) -> None:
        self.elsewhere += 1

    def enqueue(self, request: Request) -> bool:
        return self.enqueuer.enqueue(request)

    def flush(self) -> None:
        self.frontier.flush()

    def queued(self) -> int:
        return queued_count(self.frontier.client, self.frontier.queue.key)

    def stat(self, name: str) -> Any:
        return self.stats.get_value(name)


@pytest.fixture
def worker(make_crawler: Callable[..., Crawler]) -> Callable[..., Worker]:
    """Make a worker of the test's crawl (all share one crawl); ``settings`` are the
    crawler's, the rest :class:`Worker`'s."""

    def make(settings: dict[str, Any] | None = None, **options: Any) -> Worker:
        return Worker(make_crawler(settings), **options)

    return make


def start_request(url: str = URL) -> Request:
    """A start request as Scrapy issues it for a plain spider."""
    return Request(url, dont_filter=True, meta={"is_start_request": True})


def unserializable(url: str = URL) -> Request:
    return Request(url, meta={"thing": object()})


def test_a_new_request_is_queued_with_the_next_flush(worker: Callable[..., Worker]) -> None:
    w = worker()
    assert w.enqueue(Request(URL))
    assert w.queued() == 0  # batched: nothing sent yet
    assert w.frontier.pending_writes == 1
    w.flush()
    assert w.queued() == 1
    assert w.stat("scheduler/enqueued/redis") == 1
    assert w.stat("scheduler/enqueued") == 1


def test_a_duplicate_redis_finds_in_a_batch_is_counted_and_reported_dropped(
    worker: Callable[..., Worker],
) -> None:
    w = worker()
    first, second = Request(URL), Request(URL)
    assert w.enqueue(first)
    assert w.enqueue(second)  # Scrapy is told it was stored: Redis answers later
    w.flush()
    assert w.queued() == 1
    assert w.stat("scheduler/enqueued") == 1
    assert w.stat("dupefilter/filtered") == 1
    assert w.dropped == [second]


def test_sending_each_write_at_once_answers_with_redis_verdict(
    worker: Callable[..., Worker],
) -> None:
    other, w = worker(), worker({"SCHEDULER_FLUSH_INTERVAL": 0})
    other.enqueue(Request(URL))
    other.flush()
    assert w.enqueue(Request(URL + "new"))
    assert w.queued() == 2
    duplicate = Request(URL)  # not in this worker's seen-cache: Redis decides
    assert not w.enqueue(duplicate)
    assert w.queued() == 2
    assert w.stat("dupefilter/filtered") == 1
    assert w.dropped == []  # the engine sends request_dropped for a refused request


def test_a_known_duplicate_is_dropped_before_any_round_trip(
    worker: Callable[..., Worker],
) -> None:
    w = worker()
    w.enqueue(Request(URL))
    w.flush()  # now in this worker's seen-cache
    trips = w.stat("scheduler/redis/round_trips")
    assert not w.enqueue(unserializable())  # not even serialized
    assert w.stat("scheduler/redis/round_trips") == trips
    assert w.frontier.pending_writes == 0
    assert w.stat("scheduler/unserializable") is None
    assert w.stat("dupefilter/filtered") == 1


def test_a_dont_filter_request_is_queued_again_and_not_recorded(
    worker: Callable[..., Worker],
) -> None:
    w = worker()
    w.enqueue(Request(URL, dont_filter=True))
    w.enqueue(Request(URL, dont_filter=True))
    w.flush()
    assert w.queued() == 2
    assert w.enqueue(Request(URL))  # its fingerprint was never recorded
    w.flush()
    assert w.queued() == 3


def test_nothing_is_sent_for_a_crawl_that_is_gone(worker: Callable[..., Worker]) -> None:
    w = worker()
    w.frontier.lost = "vanished"
    assert not w.enqueue(Request(URL))
    assert w.frontier.pending_writes == 0
    assert w.stat("scheduler/crawl_lost/dropped_requests") == 1


def test_an_unserializable_request_is_kept_in_memory_once(
    worker: Callable[..., Worker], caplog: pytest.LogCaptureFixture
) -> None:
    w = worker()
    first = unserializable()
    with caplog.at_level(logging.WARNING):
        assert w.enqueue(first)
        assert not w.enqueue(unserializable())  # its fingerprint is recorded in Redis
        assert w.enqueue(unserializable(URL + "other"))
    assert w.kept[0] is first
    assert len(w.kept) == 2
    assert w.frontier.pending_writes == 0
    assert w.stat("scheduler/unserializable") == 2
    assert w.stat("scheduler/enqueued/memory") == 2
    assert w.stat("scheduler/enqueued") == 2
    assert caplog.text.count("Unable to serialize request") == 1
    assert not w.enqueue(Request(URL))  # Redis has its fingerprint: a duplicate
    w.flush()
    assert w.queued() == 0


def test_without_memory_an_unserializable_request_is_dead_lettered(
    worker: Callable[..., Worker], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    w = worker(keep_local=False)
    with caplog.at_level(logging.ERROR):
        assert not w.enqueue(unserializable())
        assert not w.enqueue(unserializable(URL + "other"))
    records = [json.loads(r) for r in client.lrange(w.frontier.keys.dead, 0, -1)]
    assert [r["url"] for r in records] == [URL, URL + "other"]
    assert all(r["reason"].startswith("unserializable: ") for r in records)
    assert w.stat("scheduler/unserializable") == 2
    assert caplog.text.count("Unable to serialize request") == 1


def test_a_local_dupefilter_is_asked_only_about_requests_that_can_be_stored(
    worker: Callable[..., Worker], make_crawler: Callable[..., Crawler]
) -> None:
    asked: list[str] = []

    class Recording(LocalDupeFilter):
        def request_seen(self, request: Request) -> bool:
            asked.append(request.url)
            return super().request_seen(request)

    local = build_from_crawler(Recording, make_crawler())
    w = worker(dupefilter=local, keep_local=False)
    assert not w.enqueue(unserializable(URL + "bad"))  # dead-lettered, never asked
    assert w.enqueue(Request(URL))
    assert not w.enqueue(Request(URL))
    w.flush()
    assert w.queued() == 1
    assert asked == [URL, URL]


def test_redis_refuses_a_request_whose_parent_this_worker_no_longer_holds(
    worker: Callable[..., Worker],
) -> None:
    w = worker(parent="0000000000000042")  # a lease this worker does not hold
    assert w.enqueue(Request(URL))
    w.flush()
    assert w.queued() == 0
    assert w.stat("scheduler/enqueued") is None
    assert w.stat("scheduler/leases/children_refused") == 1


# -- a plain spider's start requests, once per run (SCHEDULER_START_ONCE) ---------------


def test_the_first_worker_to_claim_a_start_request_queues_it(
    worker: Callable[..., Worker],
) -> None:
    first, second = worker(), worker()
    mine = start_request()
    assert first.enqueue(mine)
    assert mine.meta[START_CLAIMED]
    assert not second.enqueue(start_request())
    assert (first.elsewhere, second.elsewhere) == (0, 1)
    assert second.stat("dupefilter/filtered") == 1
    first.flush()
    assert first.queued() == 1
    assert first.enqueue(Request(URL))  # a start request is not recorded as seen
    first.flush()
    assert first.queued() == 2


def test_a_spider_that_starts_one_url_twice_crawls_it_twice(
    worker: Callable[..., Worker],
) -> None:
    first, second = worker(), worker()
    assert first.enqueue(start_request())
    assert first.enqueue(start_request())
    assert not second.enqueue(start_request())
    assert not second.enqueue(start_request())
    assert second.enqueue(start_request())  # a third: this worker claims it
    first.flush()
    second.flush()
    assert first.queued() == 3


def test_a_copy_of_a_claimed_start_request_is_scheduled_as_any_request(
    worker: Callable[..., Worker],
) -> None:
    first, second = worker(), worker()
    claimed = start_request()
    assert first.enqueue(claimed)
    retry = claimed.replace()  # a retry or redirect carries the mark (and is dont_filter)
    assert second.enqueue(retry)
    assert second.elsewhere == 0
    first.flush()
    second.flush()
    assert first.queued() == 2


def test_a_start_request_that_may_be_filtered_is_filtered_as_any_request(
    worker: Callable[..., Worker],
) -> None:
    first, second = worker(), worker()
    mine = Request(URL, meta={"is_start_request": True})  # not dont_filter
    assert first.enqueue(mine)
    assert START_CLAIMED not in mine.meta
    first.flush()
    theirs = Request(URL, meta={"is_start_request": True})
    assert second.enqueue(theirs)  # batched: Redis answers at the flush
    second.flush()
    assert second.elsewhere == 0
    assert second.dropped == [theirs]  # the dupefilter's duplicate, not a claim
    assert first.queued() == 1


def test_without_start_once_each_worker_queues_its_start_requests(
    worker: Callable[..., Worker],
) -> None:
    first, second = worker(start_once=False), worker(start_once=False)
    assert first.enqueue(start_request())
    assert second.enqueue(start_request())
    first.flush()
    second.flush()
    assert first.queued() == 2
