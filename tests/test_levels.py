"""The priority queue in levels (``lua/_levels.lua``), on a real Redis: one list per
priority level and an index of the levels that hold entries; what the lease scripts,
the counts and the clean-ups do with it; a previous version's queue (one zset) moved
into levels; what a previous version meets; level keys of the wrong type."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis
from scrapy import Request

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters import SetBackend
from scrapy_dist.frontier.choice import frontier_for
from scrapy_dist.frontier.wire import HAND_BACK
from scrapy_dist.keys import (
    LEVELS_MARKER,
    RedisKeys,
    crawl_slot,
    expect_type,
    key_type,
    level_key,
    levels_key,
    slot_of,
)
from scrapy_dist.queue import PriorityQueue
from scrapy_dist.scripts import scripts_for
from scrapy_dist.settings import start_requests_first
from scrapy_dist.testing.engine import one_shard
from scrapy_dist.testing.queues import join_flushing, queued_entries

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

    from scrapy_dist.frontier.core import Frontier

pytestmark = pytest.mark.redis_server


@pytest.fixture
def queue(client: redis.Redis, name: str) -> PriorityQueue:
    return PriorityQueue(client, f"{name}:requests", f"{name}:seq")


def push(queue: PriorityQueue, *payloads: bytes, priority: int = 0) -> None:
    score = queue.score(Request("https://e.com/", priority=priority))
    assert queue.push([(p, score, b"") for p in payloads]) == [True] * len(payloads)


def index(queue: PriorityQueue) -> list[tuple[bytes, float]]:
    return cast(
        "list[tuple[bytes, float]]", queue.client.zrange(queue.levels_key, 0, -1, withscores=True)
    )


def old_zset(client: redis.Redis, key: str, entries: list[tuple[int, bytes, int]]) -> None:
    """A priority queue as the previous version wrote it: one zset of
    ``<16-digit id><payload>`` -> -priority."""
    client.zadd(key, {b"%016d" % i + payload: -priority for i, payload, priority in entries})


# -- the layout -------------------------------------------------------------------------


def test_one_list_per_level_and_an_index_of_the_levels_that_hold_entries(
    queue: PriorityQueue, client: redis.Redis
) -> None:
    push(queue, b"mid1", b"mid2")
    push(queue, b"high", priority=10)
    push(queue, b"low", priority=-5)
    assert client.get(queue.key) == LEVELS_MARKER.encode()
    assert index(queue) == [(b"-10", -10.0), (b"0", 0.0), (b"5", 5.0)]
    assert queue.levels() == [
        (level_key(queue.key, "-10"), 1),
        (level_key(queue.key, "0"), 2),
        (level_key(queue.key, "5"), 1),
    ]
    assert len(queue) == 4
    # a level emptied leaves the index in the same call, and its list is gone
    assert queue.pop_payloads(1) == [b"high"]
    assert index(queue) == [(b"0", 0.0), (b"5", 5.0)]
    assert client.exists(level_key(queue.key, "-10")) == 0
    # one call takes across levels, highest first, first in first out in each
    assert queue.pop_payloads(10) == [b"mid1", b"mid2", b"low"]
    assert client.exists(queue.levels_key) == 0
    assert len(queue) == 0
    assert client.get(queue.key) == LEVELS_MARKER.encode()  # the marker stays


def test_a_level_emptied_exactly_leaves_the_index(queue: PriorityQueue) -> None:
    push(queue, b"a", b"b", priority=3)
    push(queue, b"c")
    assert queue.pop_payloads(2) == [b"a", b"b"]  # the whole level, no more
    assert index(queue) == [(b"0", 0.0)]


def test_level_names_are_exact_for_integer_priorities(queue: PriorityQueue) -> None:
    big = 2**53 - 1
    push(queue, b"big", priority=big)
    push(queue, b"next", priority=big - 1)
    push(queue, b"zero", priority=0)
    assert [name for name, _ in index(queue)] == [
        str(-big).encode(),
        str(-(big - 1)).encode(),
        b"0",
    ]
    assert queue.pop_payloads(3) == [b"big", b"next", b"zero"]


def test_clear_deletes_every_level(queue: PriorityQueue, client: redis.Redis) -> None:
    push(queue, b"a", priority=1)
    push(queue, b"b", priority=2)
    queue.clear()
    assert len(queue) == 0
    assert client.keys(f"{queue.key}*") == []


def test_level_keys_carry_the_crawls_hash_tag() -> None:
    keys = RedisKeys.build("books", hash_tag=True)
    slot = crawl_slot(keys)
    assert {slot_of(levels_key(keys.requests)), slot_of(level_key(keys.requests, "-3"))} == {slot}
    assert keys.request_levels == levels_key(keys.requests) == "{books}:requests:levels"
    assert keys.unleased not in (keys.request_levels, level_key(keys.requests, "unleased"))


# -- leases -----------------------------------------------------------------------------


#: These tests read levels head first: first in, first out among equal priorities
#: (scrapy_dist follows Scrapy's SCHEDULER_MEMORY_QUEUE, last in first out by default).
FIFO_TIES = {"SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue"}


@pytest.fixture
def frontier(make_crawler: Callable[..., Crawler]) -> Frontier:
    crawler = make_crawler(
        {"SCHEDULER_LEASE_TIMEOUT": 0.3, "SCHEDULER_MAX_DELIVERIES": 5, **FIFO_TIES}
    )
    frontier = frontier_for(crawler)
    assert isinstance(frontier.queue, PriorityQueue)
    return one_shard(frontier)


@pytest.fixture
def other(make_crawler: Callable[..., Crawler], frontier: Frontier) -> Frontier:
    """A second worker of ``frontier``'s crawl (a worker never reclaims its own leases)."""
    crawler = make_crawler(
        {"SCHEDULER_LEASE_TIMEOUT": 0.3, "SCHEDULER_MAX_DELIVERIES": 5, **FIFO_TIES}
    )
    other = frontier_for(crawler)
    assert other.worker_id != frontier.worker_id
    return one_shard(other)


def lease(frontier: Frontier, count: int) -> list[tuple[str, bytes]]:
    """Lease up to ``count`` requests: (lease id, payload) pairs."""
    return [(lease.id, lease.data) for lease in frontier.reserve(count)]


def test_a_reserve_takes_a_batch_across_levels(frontier: Frontier) -> None:
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"mid1", b"mid2")
    push(queue, b"high1", b"high2", priority=10)
    push(queue, b"low1", b"low2", priority=-5)
    assert [data for _, data in lease(frontier, 5)] == [
        b"high1",
        b"high2",
        b"mid1",
        b"mid2",
        b"low1",
    ]
    assert index(queue) == [(b"5", 5.0)]
    assert len(queue) == 1


def test_a_failed_lease_goes_back_to_the_head_of_its_level(frontier: Frontier) -> None:
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"a", b"b", b"c", b"d")
    push(queue, b"top", priority=5)
    (top, _), (a, _), (b, _) = lease(frontier, 3)
    frontier.settle([(a, "boom"), (top, ""), (b, "boom")])
    frontier.flush()
    # both back at the head of level 0, oldest first: not behind c and d
    assert [data for _, data in lease(frontier, 4)] == [b"a", b"b", b"c", b"d"]


def test_an_expired_lease_goes_back_to_its_own_level_at_its_head(
    frontier: Frontier, other: Frontier
) -> None:
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"hi1", b"hi2", priority=7)
    push(queue, b"lo")
    assert [data for _, data in lease(frontier, 1)] == [b"hi1"]
    time.sleep(0.4)  # its lease expires; the other worker's next reserve reclaims it first
    assert [data for _, data in lease(other, 3)] == [b"hi1", b"hi2", b"lo"]


def test_hand_back_and_release_go_to_the_head_of_the_level(frontier: Frontier) -> None:
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"a", b"b", b"c", priority=2)
    leased = lease(frontier, 2)
    frontier.settle([(leased[0][0], "~")])  # HAND_BACK
    frontier.flush()
    assert [e[16:] for e in queued_entries(queue.client, queue.key)] == [b"a", b"c"]
    # a lease the worker does not know (its reply was lost) is released: back at the head
    released = scripts_for(queue.client).release(
        holding=frontier.keys.holding(frontier.worker_id),
        deliveries=frontier.keys.deliveries,
        queue=queue.key,
        seeds=frontier.keys.start_urls,
        epoch_key=frontier.keys.epoch,
        dead=frontier.keys.dead,
        progress=frontier.keys.progress,
        queue_put_back=queue.put_back,
        seeds_put_back="lpush",
        epoch="",
        worker=frontier.worker_id,
        known=[],
    )
    assert released.run() == 1
    assert [e[16:] for e in queued_entries(queue.client, queue.key)] == [b"b", b"a", b"c"]


# -- counts and clean-ups ---------------------------------------------------------------


def test_progress_and_census_count_every_level(frontier: Frontier) -> None:
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"a", priority=1)
    push(queue, b"b", b"c", priority=2)
    progress = frontier.progress(grace=0, clear=False)
    assert progress is not None
    assert (progress.state, progress.queued) == ("busy", 3)
    census = scripts_for(queue.client).census(
        queue=queue.key,
        holders=frontier.keys.holders,
        previous=frontier.keys.leases,
        progress=frontier.keys.progress,
        epoch_key=frontier.keys.epoch,
        queue_kind=queue.kind,
        epoch="",
    )
    assert census.run() == [3, 0, 0, 0, 0]
    lease(frontier, 1)  # a lease held counts as leased, not queued
    assert census.run() == [2, 1, 0, 0, 0]


def test_a_finished_crawl_that_does_not_persist_deletes_its_levels(
    frontier: Frontier, client: redis.Redis
) -> None:
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"a", priority=1)
    lease_id, _ = lease(frontier, 1)[0]
    client.zadd(queue.levels_key, {"9": -9})  # a stale level in the index (no list)
    frontier.settle([(lease_id, "")])
    frontier.flush()
    progress = frontier.progress(grace=0, clear=True)
    assert progress is not None
    assert progress.state == "finished"
    assert client.exists(queue.key, queue.levels_key) == 0


def test_a_flush_at_start_deletes_every_level(frontier: Frontier, client: redis.Redis) -> None:
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"a", priority=1)
    push(queue, b"b", priority=2)
    assert join_flushing(client, frontier)
    assert client.keys(f"{queue.key}*") == []
    push(queue, b"c")  # the queue works again
    assert len(queue) == 1
    frontier.delete_keys()  # scrapy-redis's flush(): the levels go too
    assert client.keys(f"{queue.key}*") == []


# -- a previous version's queue ---------------------------------------------------------


def test_a_previous_versions_queue_is_moved_into_levels_in_order(
    queue: PriorityQueue, client: redis.Redis
) -> None:
    entries = [(i, b"p%d" % i, i % 3) for i in range(1, 11)]  # priorities 1, 2, 0, 1, ...
    old_zset(client, queue.key, entries)
    before = cast("list[bytes]", client.zrange(queue.key, 0, -1))  # the order it pops in
    assert len(queue) == 10  # counted while still a zset
    queue.MIGRATE_BATCH = 3
    # a worker killed after one batch: every entry is in the zset or in its level
    moved, left = scripts_for(client).migrate(queue=queue.key, count=3).run()
    assert (moved, left) == (3, 7)
    assert len(queue) == 10
    assert sorted(queued_entries(client, queue.key)) == sorted(before)
    # two workers open at once: each call moves different entries
    other = PriorityQueue(client, queue.key, queue.seq_key)
    moved, left = scripts_for(client).migrate(queue=queue.key, count=3).run()
    assert (moved, left) == (3, 4)
    assert queue.open() + other.open() == 4
    assert client.get(queue.key) == LEVELS_MARKER.encode()
    assert queued_entries(client, queue.key) == before
    assert queue.pop_payloads(10) == [
        payload for _, payload in sorted(((-p, i), payload) for i, payload, p in entries)
    ]


def test_a_reserve_moves_a_previous_versions_queue_written_after_open(
    frontier: Frontier, client: redis.Redis
) -> None:
    """A previous version's worker recreated its zset (the crawl's keys were deleted
    meanwhile): a reserve that finds the levels short moves what it takes, no stall."""
    old_zset(client, frontier.queue.key, [(1, b"a", 0), (2, b"b", 3), (3, b"c", 0)])
    assert [data for _, data in lease(frontier, 2)] == [b"b", b"a"]
    assert client.zcard(frontier.queue.key) == 1
    assert [data for _, data in lease(frontier, 5)] == [b"c"]
    assert client.get(frontier.queue.key) == LEVELS_MARKER.encode()


def test_a_previous_versions_queue_is_refused_by_enqueue_until_moved(
    queue: PriorityQueue, client: redis.Redis, name: str
) -> None:
    old_zset(client, queue.key, [(1, b"old", 0)])
    backend = SetBackend(client, f"{name}:dupefilter")
    with pytest.raises(redis.ResponseError, match="previous version of scrapy_dist"):
        queue.push([(b"new", 0.0, b"fp")], backend)
    assert len(backend) == 0  # nothing recorded
    assert client.zcard(queue.key) == 1
    assert queue.open() == 1
    assert queue.push([(b"new", 0.0, b"fp")], backend) == [True]
    assert queue.pop_payloads(2) == [b"old", b"new"]


def test_progress_never_finishes_a_crawl_whose_old_queue_is_not_moved(
    frontier: Frontier, client: redis.Redis
) -> None:
    old_zset(client, frontier.queue.key, [(1, b"old", 0), (2, b"older", 3)])
    client.hset(frontier.keys.progress, "done", 5)
    progress = frontier.progress(grace=0, clear=True)
    assert progress is not None
    assert (progress.state, progress.queued) == ("busy", 2)
    assert client.zcard(frontier.queue.key) == 2


def test_a_previous_version_fails_loudly_on_the_new_layout(
    queue: PriorityQueue, client: redis.Redis
) -> None:
    """What the previous version runs on its queue key, on the new layout: its open-time
    check (``expect_type(key, TYPE, "zset")``), its reserve (``ZPOPMIN`` in a script), its
    put-back (``ZADD``), its counts (``ZCARD``) and its enqueue's check (``TYPE`` must be
    ``zset`` or ``none``) all fail; none reads the levels, whose keys it never names."""
    push(queue, b"a", priority=1)
    actual = key_type(client, queue.key)
    assert actual == "string"
    with pytest.raises(ConfigurationError):
        expect_type(queue.key, actual, "zset", lambda t: f"holds a {t}")
    for command in (("ZPOPMIN", queue.key, 5), ("ZCARD", queue.key), ("ZADD", queue.key, 0, "x")):
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            client.execute_command(*command)  # type: ignore[no-untyped-call]
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            client.eval(
                "return redis.call(unpack(ARGV))",
                1,
                queue.key,
                *command[:1],
                queue.key,
                *command[2:],
            )
    assert len(queue) == 1  # untouched


def test_an_unknown_string_at_the_key_is_refused(queue: PriorityQueue, client: redis.Redis) -> None:
    client.set(queue.key, "something else")
    with pytest.raises(ConfigurationError, match="not the marker"):
        queue.open()
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queue.push([(b"a", 0.0, b"")])
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        len(queue)


# -- level keys of the wrong type -------------------------------------------------------


def dead_records(client: redis.Redis, frontier: Frontier) -> list[dict[str, Any]]:
    return [json.loads(r) for r in client.lrange(frontier.keys.dead, 0, -1)]


def test_a_level_of_the_wrong_type_is_set_aside_and_the_others_go_on(
    frontier: Frontier, client: redis.Redis
) -> None:
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"top", priority=5)
    push(queue, b"a", b"b")
    broken = level_key(queue.key, "-5")
    client.delete(broken)
    client.hset(broken, "by", "hand")
    assert [data for _, data in lease(frontier, 5)] == [b"a", b"b"]
    assert client.hgetall(broken + ":wrongtype") == {b"by": b"hand"}  # kept, aside
    assert index(queue) == []
    (record,) = dead_records(client, frontier)
    assert broken in record["reason"]
    assert "held a hash" in record["reason"]
    assert client.hget(frontier.keys.progress, "dead") == b"1"
    push(queue, b"again", priority=5)  # the level works again
    assert [data for _, data in lease(frontier, 5)] == [b"again"]


def test_an_entry_put_back_to_a_level_of_the_wrong_type_is_kept(
    frontier: Frontier, client: redis.Redis
) -> None:
    queue = cast("PriorityQueue", frontier.queue)
    push(queue, b"a", priority=1)
    ((lease_id, _),) = lease(frontier, 1)
    broken = level_key(queue.key, "-1")
    client.set(broken, "by hand")
    frontier.settle([(lease_id, "boom")])
    frontier.flush()
    assert [e[16:] for e in queued_entries(client, queue.key)] == [b"a"]
    assert client.get(broken + ":wrongtype") == b"by hand"
    (record,) = dead_records(client, frontier)
    assert broken in record["reason"]


def test_an_enqueue_to_a_level_of_the_wrong_type_pushes_nothing(
    queue: PriorityQueue, client: redis.Redis, name: str
) -> None:
    backend = SetBackend(client, f"{name}:dupefilter")
    client.set(level_key(queue.key, "-5"), "by hand")
    for items in ([(b"x", -5.0, b"fp1")], [(b"y", 0.0, b"fp2"), (b"x", -5.0, b"fp1")]):
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            queue.push(items, backend)
    assert len(backend) == 0
    assert client.exists(level_key(queue.key, "0")) == 0
    assert client.get(level_key(queue.key, "-5")) == b"by hand"


def test_last_in_first_out_levels_and_first_in_first_out_start_levels(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """Scrapy's default order among equal priorities (its LifoMemoryQueue), with start
    requests in levels of their own half a point lower, first in first out; an entry
    put back to a last-in-first-out level comes out last among its equals."""
    crawler = make_crawler({"SCHEDULER_LEASE_TIMEOUT": 0.3, "SCHEDULER_MAX_DELIVERIES": 5})
    frontier = frontier_for(crawler)
    queue = cast("PriorityQueue", frontier.queue)
    assert queue.take == "levels:lf"
    starts = [Request(f"https://e.com/s{i}", meta={"is_start_request": True}) for i in (1, 2)]
    others = [Request(f"https://e.com/o{i}") for i in (1, 2, 3)]
    for request in starts + others:
        queue.push([(request.url.encode(), queue.score(request), b"")])
    if start_requests_first():  # Scrapy 2.13 serves start requests first
        assert queue.score(starts[0]) == -0.5
        return
    assert queue.score(starts[0]) == 0.5
    leases = frontier.reserve(4)
    assert [lease.data[len(b"https://e.com/") :] for lease in leases] == [
        b"o3",
        b"o2",
        b"o1",
        b"s1",
    ]
    frontier.settle([(leases[0].id, HAND_BACK)])  # o3 goes back: last among its equals
    queue.push([(b"https://e.com/o4", 0.0, b"")])
    assert [lease.data for lease in frontier.reserve(3)] == [
        b"https://e.com/o4",
        b"https://e.com/o3",
        b"https://e.com/s2",
    ]
