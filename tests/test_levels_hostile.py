"""The priority queue in levels (``lua/_levels.lua``) against hands and accidents, on a
real Redis: a queue key deleted alone, a level named by hand. Each test asserts that no
queued request is lost or left behind."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, cast

import pytest
from scrapy import Request

from scrapy_dist.frontier.choice import frontier_for
from scrapy_dist.keys import level_key
from scrapy_dist.queue import PriorityQueue
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.testing.engine import one_shard
from scrapy_dist.testing.queues import join_flushing, queued_entries
from scrapy_dist.worker.startup import start_failure

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from scrapy.crawler import Crawler

    from scrapy_dist.frontier.core import Frontier

pytestmark = pytest.mark.redis_server


@pytest.fixture
def frontier(make_crawler: Callable[..., Crawler]) -> Frontier:
    crawler = make_crawler(
        {
            "SCHEDULER_LEASE_TIMEOUT": 0.3,
            "SCHEDULER_MAX_DELIVERIES": 5,
            # read head first: first in, first out among equals
            "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
        }
    )
    frontier = frontier_for(crawler)
    assert isinstance(frontier.queue, PriorityQueue)
    return one_shard(frontier)


@pytest.fixture
def other(make_crawler: Callable[..., Crawler], frontier: Frontier) -> Frontier:
    """A second worker of ``frontier``'s crawl (a worker never reclaims its own leases)."""
    crawler = make_crawler(
        {
            "SCHEDULER_LEASE_TIMEOUT": 0.3,
            "SCHEDULER_MAX_DELIVERIES": 5,
            # read head first: first in, first out among equals
            "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
        }
    )
    other = frontier_for(crawler)
    assert other.worker_id != frontier.worker_id
    return one_shard(other)


def push(queue: PriorityQueue, *payloads: bytes, priority: int = 0) -> None:
    score = queue.score(Request("https://e.com/", priority=priority))
    assert queue.push([(p, score, b"") for p in payloads]) == [True] * len(payloads)


def test_a_flush_at_start_deletes_the_levels_of_a_queue_key_deleted_alone(
    frontier: Frontier, client: redis.Redis
) -> None:
    """``DEL <crawl>:requests`` (scrapy-redis's habit, or an eviction) leaves the levels,
    which are still crawled; a flush must delete them too, or the next run crawls them
    with ids that its fresh sequence gives again to new entries."""
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"a", priority=1)
    push(queue, b"b", priority=2)
    client.delete(queue.key)
    assert join_flushing(client, frontier)
    assert client.keys(f"{queue.key}*") == []


def test_an_expired_lease_taken_from_a_level_named_by_hand_goes_back(
    frontier: Frontier, other: Frontier, client: redis.Redis
) -> None:
    """A level whose name is not a number (``ZADD <crawl>:requests:levels -5 abc`` by
    hand) is read by its index score; its leases, and those reclaimed with them, come
    back when they expire instead of failing the reclaim after it took them out."""
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"good", priority=1)
    client.lpush(level_key(queue.key, "abc"), b"%016dbad" % 99)
    client.zadd(queue.levels_key, {"abc": -5})
    assert sorted(lease.data for lease in frontier.reserve(5)) == [b"bad", b"good"]
    time.sleep(0.4)
    again = other.reserve(5)  # reclaims both, then leases them again, -5 first
    assert [(lease.data, lease.deliveries) for lease in again] == [(b"bad", 2), (b"good", 2)]
    assert queued_entries(client, queue.key) == []


def test_a_previous_versions_queue_is_not_moved_while_its_workers_run(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    """A previous version's worker that runs on after the move loses the leases it hands
    back or reclaims (its scripts delete a lease, then fail on the marker): a worker that
    finds a previous version's queue and a live worker does not start, moves nothing,
    and starts once that worker's heartbeat is older than SCHEDULER_WORKER_TIMEOUT."""
    key = f"{name}:requests"
    client.zadd(key, {b"%016d" % 1 + b'{"url": "https://e.com/a"}': 0})
    now, _ = client.time()
    client.hset(f"{name}:workers", "old-worker", now)  # alive: beat just now
    settings = {"SCHEDULER_WORKER_TIMEOUT": 5, "SCHEDULER_HEARTBEAT_INTERVAL": 1}
    crawler = make_crawler(settings)
    scheduler = Scheduler.from_crawler(crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    failure = start_failure(crawler)
    assert failure is not None
    assert re.search(r"previous version.*1 worker\(s\).*old-worker", failure.message)
    assert client.type(key) == b"zset"  # nothing moved
    assert client.zcard(key) == 1
    client.hset(f"{name}:workers", "old-worker", now - 6)  # gone (killed, timed out)
    crawler = make_crawler(settings)
    scheduler = Scheduler.from_crawler(crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    try:
        assert start_failure(crawler) is None
        assert client.type(key) == b"string"  # the marker: moved
        assert len(scheduler.frontier.queue) == 1
    finally:
        scheduler.close("finished")


def test_a_count_given_as_a_float_leases_from_every_level_and_loses_nothing(
    frontier: Frontier, client: redis.Redis
) -> None:
    """The reserve gives its pops COUNT as text when it is a whole number's: a COUNT
    Redis would refuse as text (``5.0``, from a float) is given as a number, as before, so
    that no pop fails after the levels before it were read (a pop retried after such a
    refusal took the level's entries and lost them)."""
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"a1", b"a2", b"a3", priority=3)
    push(queue, b"b1", b"b2", b"b3", priority=1)
    leases = frontier.reserve(cast("int", 5.0))
    assert [lease.data for lease in leases] == [b"a1", b"a2", b"a3", b"b1", b"b2"]
    assert [entry[16:] for entry in queued_entries(client, queue.key)] == [b"b3"]
    assert client.llen(frontier.keys.dead) == 0
    assert client.keys("*wrongtype*") == []
