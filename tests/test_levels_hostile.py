"""The priority queue in levels (``lua/_levels.lua``) against hands and accidents, on a
real Redis: a queue key deleted alone, a level named by hand. Each test asserts that no
queued request is lost or left behind."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

import pytest
from scrapy import Request

from scrapy_dist.frontier import Frontier
from scrapy_dist.keys import level_key
from scrapy_dist.queue import PriorityQueue
from scrapy_dist.scripts import scripts_for
from scrapy_dist.testing.queues import queued_entries

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from scrapy.crawler import Crawler

pytestmark = pytest.mark.redis_server


@pytest.fixture
def frontier(make_crawler: Callable[..., Crawler]) -> Frontier:
    crawler = make_crawler({"SCHEDULER_LEASE_TIMEOUT": 0.3, "SCHEDULER_MAX_DELIVERIES": 5})
    frontier = Frontier.for_crawler(crawler)
    assert isinstance(frontier.queue, PriorityQueue)
    return frontier


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
    keys = frontier.keys
    call = scripts_for(client).join(
        workers=keys.workers,
        progress=keys.progress,
        starts=keys.starts,
        flush_keys=frontier.clear_keys,
        worker="w",
        timeout=10,
        flush=True,
        age=0,
    )
    assert call.run()[1] == 1  # flushed
    assert client.keys(f"{queue.key}*") == []


def test_an_expired_lease_taken_from_a_level_named_by_hand_goes_back(
    frontier: Frontier, client: redis.Redis
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
    again = frontier.reserve(5)  # reclaims both, then leases them again, -5 first
    assert [(lease.data, lease.deliveries) for lease in again] == [(b"bad", 2), (b"good", 2)]
    assert queued_entries(client, queue.key) == []
