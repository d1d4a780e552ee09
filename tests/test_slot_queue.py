"""The queue per download slot (``SlotQueue``, ``lua/_levels.lua``'s slots section), on a
real Redis: one levels queue per slot, the ready and waiting indexes, a slot's delay
held by the frontier for every worker, put-backs to their slot, the counts and the
clean-ups, and keys written by hand."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis
from scrapy import Request

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.choice import frontier_for
from scrapy_dist.frontier.wire import SLOT_WAIT_MAX
from scrapy_dist.keys import (
    LEVELS_MARKER,
    SLOTS_MARKER,
    SLOTS_READY_SUFFIX,
    SLOTS_REST_SUFFIX,
    SLOTS_WAIT_SUFFIX,
    slot_id,
)
from scrapy_dist.queue import PriorityQueue
from scrapy_dist.slot_queue import SlotQueue
from scrapy_dist.slots import Limits
from scrapy_dist.testing.engine import one_shard
from scrapy_dist.testing.queues import queued_entries

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

    from scrapy_dist.frontier.core import Frontier

pytestmark = pytest.mark.redis_server

SLOT_QUEUE = "scrapy_dist.slot_queue.SlotQueue"
#: Requests of equal priority first in, first out (as the levels tests).
FIFO_TIES = {"SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue"}


def settings(**extra: object) -> dict[str, object]:
    return {
        "SCHEDULER_QUEUE_CLASS": SLOT_QUEUE,
        "SCHEDULER_LEASE_TIMEOUT": 0.3,
        "SCHEDULER_MAX_DELIVERIES": 5,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        **FIFO_TIES,
        **extra,
    }


@pytest.fixture
def build(make_crawler: Callable[..., Crawler]) -> Callable[..., Frontier]:
    def make(**extra: object) -> Frontier:
        frontier = one_shard(frontier_for(make_crawler(settings(**extra))))
        assert isinstance(frontier.queue, SlotQueue)
        frontier.queue.open()
        return frontier

    return make


def push(frontier: Frontier, *urls: str, priority: int = 0, slot: str | None = None) -> None:
    queue = frontier.queue
    items = []
    for url in urls:
        meta = {} if slot is None else {"download_slot": slot}
        request = Request(url, priority=priority, meta=meta)
        items.append((url.encode(), queue.score(request), b""))
    assert queue.push(items) == [True] * len(urls)


def lease(frontier: Frontier, count: int) -> list[tuple[str, str]]:
    """Lease up to ``count`` requests: (lease id, url) pairs."""
    return [(lease.id, lease.data.decode()) for lease in frontier.reserve(count)]


def urls(frontier: Frontier, count: int) -> list[str]:
    return [url for _, url in lease(frontier, count)]


def members(client: redis.Redis, key: str) -> list[str]:
    return [m.decode() for m in cast("list[bytes]", client.zrange(key, 0, -1))]


# -- the layout -------------------------------------------------------------------------


def test_one_levels_queue_per_slot_and_an_index_of_ready_slots(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build()
    queue = cast("SlotQueue", frontier.queue)
    push(frontier, "https://a.com/1", "https://a.com/2")
    push(frontier, "https://b.com/1", priority=5)
    push(frontier, "https://c.com/1", slot="my|slot")
    assert client.get(queue.key) == SLOTS_MARKER.encode()
    # highest priority first: b's best level is -5
    assert members(client, queue.key + SLOTS_READY_SUFFIX) == ["b.com", "a.com", "my%7Cslot"]
    assert queue.sizes() == {"a.com": 2, "b.com": 1, "my%7Cslot": 1}
    assert len(queue) == 4
    assert queue.slot_levels_key(slot_id("my|slot")) == f"{queue.key}:slot:my%7Cslot:levels"


def test_highest_priority_first_across_slots_then_in_order_within_one(
    build: Callable[..., Frontier],
) -> None:
    frontier = build()
    push(frontier, "https://a.com/1", "https://a.com/2", "https://a.com/3")
    push(frontier, "https://b.com/top", priority=3)
    # no delay: a slot alone is taken whole, several take turns
    assert urls(frontier, 10) == [
        "https://b.com/top",
        "https://a.com/1",
        "https://a.com/2",
        "https://a.com/3",
    ]
    assert len(frontier.queue) == 0


def test_a_slot_without_delay_gives_at_most_its_concurrency_per_round(
    build: Callable[..., Frontier],
) -> None:
    frontier = build(CONCURRENT_REQUESTS_PER_DOMAIN=2)
    push(frontier, *(f"https://a.com/{i}" for i in range(4)))
    push(frontier, *(f"https://b.com/{i}" for i in range(4)))
    taken = urls(frontier, 4)
    assert sorted(taken) == sorted(
        ["https://a.com/0", "https://a.com/1", "https://b.com/0", "https://b.com/1"]
    )


# -- delays -----------------------------------------------------------------------------


def test_a_slot_with_a_delay_gives_one_request_per_delay_to_any_worker(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    one, two = (build(DOWNLOAD_DELAY=0.5, SCHEDULER_LEASE_TIMEOUT=30) for _ in range(2))
    push(one, *(f"https://slow.com/{i}" for i in range(3)))
    push(one, "https://other.com/1")
    assert sorted(urls(one, 10)) == ["https://other.com/1", "https://slow.com/0"]
    wait = one.queue.key + SLOTS_WAIT_SUFFIX
    assert members(client, wait) == ["slow.com"]
    # the other worker finds nothing of the slot until its delay passed
    assert urls(two, 10) == []
    time.sleep(0.55)
    assert urls(two, 10) == ["https://slow.com/1"]
    assert urls(one, 10) == []
    time.sleep(0.55)
    assert urls(one, 10) == ["https://slow.com/2"]
    # emptied, the slot rests until its delay ends: a request queued meanwhile waits
    assert members(client, one.queue.key + SLOTS_REST_SUFFIX) == ["slow.com"]
    push(one, "https://slow.com/late")
    assert urls(two, 10) == []
    assert members(client, wait) == ["slow.com"]
    time.sleep(0.55)
    assert urls(two, 10) == ["https://slow.com/late"]


def test_download_slots_delays_go_to_redis_and_hold_over_the_default(
    build: Callable[..., Frontier],
) -> None:
    frontier = build(DOWNLOAD_DELAY=0, DOWNLOAD_SLOTS={"slow.com": {"delay": 30}})
    push(frontier, "https://slow.com/1", "https://slow.com/2", "https://fast.com/1")
    push(frontier, "https://fast.com/2")
    assert sorted(urls(frontier, 10)) == [
        "https://fast.com/1",
        "https://fast.com/2",
        "https://slow.com/1",
    ]
    assert urls(frontier, 10) == []


def test_a_jitter_lengthens_the_wait_never_shortens_it(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build(DOWNLOAD_DELAY=10, RANDOMIZE_DOWNLOAD_DELAY=True)
    for i in range(20):
        push(frontier, f"https://h{i}.com/1", f"https://h{i}.com/2")
    before = time.time()
    assert len(urls(frontier, 100)) == 20
    scores = cast(
        "list[tuple[bytes, float]]",
        client.zrange(frontier.queue.key + SLOTS_WAIT_SUFFIX, 0, -1, withscores=True),
    )
    waits = [score - before for _, score in scores]
    assert len(waits) == 20
    assert all(9.9 <= w <= 15.5 for w in waits), waits
    assert len({round(w, 3) for w in waits}) > 10  # drawn, not one value


# -- put-backs --------------------------------------------------------------------------


def test_a_failed_lease_goes_back_to_the_head_of_its_slot(build: Callable[..., Frontier]) -> None:
    frontier = build()
    push(frontier, "https://a.com/1", "https://a.com/2", "https://a.com/3")
    (first, _), (second, _) = lease(frontier, 2)
    frontier.settle([(second, "boom"), (first, "boom")])
    frontier.flush()
    assert cast("SlotQueue", frontier.queue).sizes() == {"a.com": 3}
    assert urls(frontier, 3) == ["https://a.com/1", "https://a.com/2", "https://a.com/3"]


def test_a_hand_back_of_a_delayed_slot_keeps_its_wait(
    build: Callable[..., Frontier],
) -> None:
    frontier = build(DOWNLOAD_DELAY=0.4, SCHEDULER_LEASE_TIMEOUT=30)
    push(frontier, "https://slow.com/1", "https://slow.com/2")
    ((held, _),) = lease(frontier, 5)
    frontier.settle([(held, "~")])  # HAND_BACK
    frontier.flush()
    assert urls(frontier, 5) == []
    time.sleep(0.45)
    assert urls(frontier, 5) == ["https://slow.com/1"]


def test_an_expired_lease_goes_back_to_its_slot(build: Callable[..., Frontier]) -> None:
    frontier, other = build(), build()
    push(frontier, "https://a.com/1", priority=2)
    push(frontier, "https://b.com/1")
    assert urls(frontier, 1) == ["https://a.com/1"]
    time.sleep(0.4)  # expired: the other worker's next reserve puts it back first
    assert urls(other, 5) == ["https://a.com/1", "https://b.com/1"]


def test_pop_gives_what_a_worker_could_lease_now(build: Callable[..., Frontier]) -> None:
    frontier = build(DOWNLOAD_DELAY=5)
    push(frontier, "https://a.com/1", "https://a.com/2")
    push(frontier, "https://b.com/1", priority=1)
    assert frontier.queue.pop_payloads(5) == [b"https://b.com/1", b"https://a.com/1"]
    assert frontier.queue.pop_payloads(5) == []
    assert len(frontier.queue) == 1


# -- counts and clean-ups ---------------------------------------------------------------


def test_progress_counts_every_slot_and_a_finish_deletes_them(
    build: Callable[..., Frontier], client: redis.Redis, name: str
) -> None:
    frontier = build(DOWNLOAD_DELAY=0.2, SCHEDULER_LEASE_TIMEOUT=30)
    push(frontier, "https://a.com/1", "https://b.com/1", "https://b.com/2")
    progress = frontier.progress(grace=0, clear=False)
    assert progress is not None
    assert (progress.state, progress.queued) == ("busy", 3)
    for _ in range(3):
        time.sleep(0.25)
        frontier.settle([(lease_id, "") for lease_id, _ in lease(frontier, 5)])
        frontier.flush()
    # empty: the rested slots do not keep the crawl busy once their delay ended
    time.sleep(0.25)
    frontier.reserve(1)
    progress = frontier.progress(grace=0, clear=True)
    assert progress is not None
    assert progress.queued == 0
    left = [k.decode() for k in client.scan_iter(match=f"{frontier.queue.key}*")]
    assert left == []


def test_the_indexes_keep_a_queue_from_reading_as_empty_whatever_the_count(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build()
    push(frontier, "https://a.com/1")
    client.set(frontier.queue.key + ":queued", "junk")
    assert len(frontier.queue) == 1
    client.set(frontier.queue.key + ":queued", -5)
    assert len(frontier.queue) == 1
    assert urls(frontier, 5) == ["https://a.com/1"]
    assert len(frontier.queue) == 0


# -- keys written by hand ---------------------------------------------------------------


def test_another_queue_at_the_key_is_refused_with_the_way_out(
    build: Callable[..., Frontier], client: redis.Redis, name: str
) -> None:
    client.rpush(f"{name}:requests", b"0" * 16 + b"{}")  # a FIFO queue's
    with pytest.raises(ConfigurationError, match="SCHEDULER_QUEUE_CLASS"):
        build()
    client.delete(f"{name}:requests")
    client.set(f"{name}:requests", "something else")
    with pytest.raises(ConfigurationError, match="another SCHEDULER_QUEUE_CLASS"):
        build()
    # an empty priority queue (its marker alone) just becomes a queue per slot
    client.set(f"{name}:requests", LEVELS_MARKER)
    build()
    assert client.get(f"{name}:requests") == SLOTS_MARKER.encode()


def test_an_index_of_the_wrong_type_refuses_an_enqueue_and_is_set_aside_on_a_put_back(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build()
    push(frontier, "https://a.com/1")
    ((held, _),) = lease(frontier, 1)
    ready = frontier.queue.key + SLOTS_READY_SUFFIX
    client.unlink(ready)
    client.rpush(ready, "junk")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        push(frontier, "https://a.com/2")
    frontier.settle([(held, "boom")])
    frontier.flush()
    assert client.type(ready + ":wrongtype") == b"list"
    assert b"renamed to" in cast("bytes", client.lindex(frontier.keys.dead, 0))
    assert urls(frontier, 5) == ["https://a.com/1"]


def test_slot_names_are_escaped_for_lease_records() -> None:
    assert slot_id("a|b%c") == "a%7Cb%25c"
    assert slot_id("example.com") == "example.com"


# -- robots.txt Crawl-delay -------------------------------------------------------------


def test_a_longer_crawl_delay_becomes_the_slots_delay_for_every_worker(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    from scrapy_dist.worker.crawl_delays import CrawlDelays

    frontier = build(DOWNLOAD_DELAY=0, SCHEDULER_LEASE_TIMEOUT=30)
    queue = cast("SlotQueue", frontier.queue)
    read = {"slow.com": 30.0, "short.com": 0.0}
    delays = CrawlDelays(
        lambda request: read.get(request.url.split("/")[2]),
        queue.limits,
        queue.key + ":delays",
    )
    for url in ("https://slow.com/robots", "https://short.com/x", "https://unread.com/x"):
        delays.reached(Request(url))
    ride = delays.rider()
    assert ride is not None
    # a flush that got no reply: the write goes again with the next
    ride.on_reply(redis.ConnectionError("gone"))
    ride = delays.rider()
    assert ride is not None
    ride.on_reply(cast("Any", client).execute_command(*ride.command.args))
    assert delays.rider() is None
    assert client.hgetall(queue.key + ":delays") == {b"slow.com": b"30.0"}
    push(frontier, "https://slow.com/1", "https://slow.com/2", "https://short.com/1")
    assert sorted(urls(frontier, 10)) == ["https://short.com/1", "https://slow.com/1"]
    # the site read later is noted then
    read["unread.com"] = 5.0
    delays.reached(Request("https://unread.com/y"))
    ride = delays.rider()
    assert ride is not None
    assert ride.command.args[4:] == ("unread.com", "5.0", "h")


def test_a_crawl_delay_is_written_for_the_host_and_for_the_slot_scrapy_named(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    """With ``CONCURRENT_REQUESTS_PER_IP`` Scrapy's downloader names a request's slot by
    its host's address (``meta["download_slot"]``, kept by a retry); the queue names a
    new request's slot by its host. The site's delay is written under both, once."""
    from scrapy_dist.worker.crawl_delays import CrawlDelays

    frontier = build(DOWNLOAD_DELAY=0, SCHEDULER_LEASE_TIMEOUT=30)
    queue = cast("SlotQueue", frontier.queue)
    delays = CrawlDelays(lambda request: 30.0, queue.limits, queue.key + ":delays")
    delays.reached(Request("https://slow.com/1", meta={"download_slot": "10.0.0.1"}))
    delays.reached(Request("https://slow.com/2", meta={"download_slot": "10.0.0.1"}))
    ride = delays.rider()
    assert ride is not None
    assert ride.command.args[4:] == ("10.0.0.1", "30.0", "s", "slow.com", "30.0", "h")
    ride.on_reply(cast("Any", client).execute_command(*ride.command.args))
    assert delays.rider() is None
    push(frontier, "https://slow.com/1", "https://slow.com/2")
    push(frontier, "https://slow.com/3", "https://slow.com/4", slot="10.0.0.1")
    assert sorted(urls(frontier, 10)) == ["https://slow.com/1", "https://slow.com/3"]


def test_an_address_hosts_own_crawl_delay_is_written_after_another_host_resolved_to_it(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    """With ``CONCURRENT_REQUESTS_PER_IP``, ``http://localhost/`` is downloaded in the slot
    ``127.0.0.1``, the name the queue gives ``http://127.0.0.1/``'s requests. Meeting
    localhost first (no ``Crawl-delay``) does not make ``127.0.0.1``'s own one unread.
    (Before, its name was taken as known from localhost's robots.txt: never written,
    and one worker crawled 40 pages of a site asking for 1 s in 0.5 s.)"""
    from scrapy_dist.worker.crawl_delays import CrawlDelays

    frontier = build(DOWNLOAD_DELAY=0, SCHEDULER_LEASE_TIMEOUT=30)
    queue = cast("SlotQueue", frontier.queue)
    read = {"localhost": 0.0, "127.0.0.1": 30.0, "other.com": 10.0}
    delays = CrawlDelays(
        lambda request: read[request.url.split("/")[2]], queue.limits, queue.key + ":delays"
    )
    delays.reached(Request("http://localhost/1", meta={"download_slot": "127.0.0.1"}))
    assert delays.rider() is None  # no Crawl-delay
    delays.reached(Request("http://127.0.0.1/1", meta={"download_slot": "127.0.0.1"}))
    ride = delays.rider()
    assert ride is not None
    assert ride.command.args[4:] == ("127.0.0.1", "30.0", "h")
    ride.on_reply(cast("Any", client).execute_command(*ride.command.args))
    push(frontier, "http://127.0.0.1/2", "http://127.0.0.1/3")
    assert urls(frontier, 10) == ["http://127.0.0.1/2"]
    # another host on that address asking for less leaves the longer delay
    delays.reached(Request("http://other.com/1", meta={"download_slot": "127.0.0.1"}))
    ride = delays.rider()
    assert ride is not None
    assert ride.command.args[4:] == ("other.com", "10.0", "h")


def test_a_worker_that_met_another_host_of_the_address_leaves_the_address_hosts_delay(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    """Two workers: one read ``http://127.0.0.1/``'s ``Crawl-delay`` (the queue's slot
    ``127.0.0.1``), the other met only ``http://localhost/``, resolved to that address,
    with a shorter one. The second's write of the address does not replace the site's
    delay, in either order. (Before, the last write won: 2 workers, the site's pages
    went 0.13 s apart for about a second, until the second worker fetched one.)"""
    from scrapy_dist.worker.crawl_delays import CrawlDelays

    frontier = build(DOWNLOAD_DELAY=0, SCHEDULER_LEASE_TIMEOUT=30)
    queue = cast("SlotQueue", frontier.queue)
    key = queue.key + ":delays"
    read = {"localhost": 0.1, "127.0.0.1": 1.0}

    def worker() -> CrawlDelays:
        return CrawlDelays(
            lambda request: read[request.url.split("/")[2]], Limits(queue.limits.default), key
        )

    def write(delays: CrawlDelays) -> None:
        ride = delays.rider()
        assert ride is not None
        ride.on_reply(cast("Any", client).execute_command(*ride.command.args))

    site, other = worker(), worker()
    site.reached(Request("http://127.0.0.1/1", meta={"download_slot": "127.0.0.1"}))
    other.reached(Request("http://localhost/1", meta={"download_slot": "127.0.0.1"}))
    write(site)
    write(other)
    assert client.hgetall(key) == {b"127.0.0.1": b"1.0", b"localhost": b"0.1"}
    client.delete(key)
    write_first, site = worker(), worker()
    write_first.reached(Request("http://localhost/1", meta={"download_slot": "127.0.0.1"}))
    write(write_first)  # the address, where nothing is written yet: retries are spaced
    assert client.hgetall(key) == {b"127.0.0.1": b"0.1", b"localhost": b"0.1"}
    site.reached(Request("http://127.0.0.1/1", meta={"download_slot": "127.0.0.1"}))
    write(site)
    assert client.hget(key, "127.0.0.1") == b"1.0"


def test_a_reserve_that_got_less_says_when_the_first_waiting_slot_is_ready(
    build: Callable[..., Frontier],
) -> None:
    frontier = build(DOWNLOAD_DELAY=0.5, SCHEDULER_LEASE_TIMEOUT=30)
    push(frontier, "https://slow.com/1", "https://slow.com/2")
    before = time.monotonic()
    assert urls(frontier, 5) == ["https://slow.com/1"]
    ready_at = frontier.slot_ready_at
    assert ready_at is not None
    assert 0.4 <= ready_at - before <= 0.6
    assert urls(frontier, 5) == []
    assert frontier.slot_ready_at is not None
    time.sleep(max(0.0, frontier.slot_ready_at - time.monotonic()) + 0.01)
    assert urls(frontier, 5) == ["https://slow.com/2"]
    # a reserve that got all it asked says nothing
    push(frontier, "https://fast.com/1")
    time.sleep(0.5)
    assert urls(frontier, 1) == ["https://fast.com/1"]
    assert frontier.slot_ready_at is None


def test_a_paused_slot_waits_in_redis_until_its_pause_ends(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build(SCHEDULER_LEASE_TIMEOUT=30)
    push(frontier, "https://busy.com/1", "https://other.com/1")
    push(frontier, "https://odd.com/1", slot="odd|slot")
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    client.zadd(frontier.keys.slot_pauses, {"busy.com": now_ms + 400, "odd|slot": now_ms + 400})
    assert urls(frontier, 5) == ["https://other.com/1"]
    assert members(client, frontier.queue.key + SLOTS_WAIT_SUFFIX) == ["busy.com", "odd%7Cslot"]
    time.sleep(0.45)
    assert sorted(urls(frontier, 5)) == ["https://busy.com/1", "https://odd.com/1"]


# -- moving a priority queue into slots -------------------------------------------------


def _priority_queue_with(client: redis.Redis, key: str, seq: str) -> list[bytes]:
    """A PriorityQueue at ``key`` holding requests of two hosts at two priorities (JSON
    payloads, as workers write them); their payloads in the order pushed."""
    queue = PriorityQueue(client, key, seq)
    pushed = []
    for i, (host, priority) in enumerate(
        [("a.com", 0), ("b.com", 0), ("a.com", 5), ("a.com", 0), ("b.com", 5)]
    ):
        payload = json.dumps({"url": f"https://{host}/{i}", "priority": priority}).encode()
        pushed.append(payload)
        queue.push([(payload, queue.score(Request(f"https://{host}/", priority=priority)), b"")])
    odd = json.dumps({"url": "https://c.com/x", "meta": {"download_slot": "my|slot"}}).encode()
    queue.push([(odd, 0.0, b"")])
    pushed.append(odd)
    queue.push([(b"\x80 not a request", 0.0, b"")])
    pushed.append(b"\x80 not a request")
    return pushed


def test_a_priority_queue_is_moved_into_slots_when_the_crawl_opens_with_slotqueue(
    build: Callable[..., Frontier], client: redis.Redis, name: str
) -> None:
    key = f"{name}:requests"
    pushed = _priority_queue_with(client, key, f"{name}:seq")
    ids_before = set(queued_entries(client, key))
    frontier = build(SCHEDULER_LEASE_TIMEOUT=30)  # (opens the queue: moves it)
    queue = cast("SlotQueue", frontier.queue)
    assert client.get(key) == SLOTS_MARKER.encode()
    assert client.exists(f"{key}:levels") == 0
    assert queue.sizes() == {"a.com": 3, "b.com": 2, "my%7Cslot": 1, "": 1}
    taken = [lease.data for lease in frontier.reserve(20)]
    assert sorted(taken) == sorted(pushed)
    # priority first across slots, first in first out within a slot's level
    assert taken[:2] in ([pushed[2], pushed[4]], [pushed[4], pushed[2]])
    assert taken.index(pushed[0]) < taken.index(pushed[3])
    assert len(queue) == 0
    del ids_before


def test_the_move_is_refused_while_workers_of_the_crawl_run(
    build: Callable[..., Frontier], client: redis.Redis, name: str
) -> None:
    _priority_queue_with(client, f"{name}:requests", f"{name}:seq")
    queue = SlotQueue(client, f"{name}:requests", f"{name}:seq")
    with pytest.raises(ConfigurationError, match="registered as running may still use"):
        queue.open(lambda: ["host:1:abcdef"])
    assert client.get(f"{name}:requests") == LEVELS_MARKER.encode()


def test_a_move_given_entries_that_are_no_longer_the_oldest_moves_nothing(
    client: redis.Redis, name: str
) -> None:
    key = f"{name}:requests"
    _priority_queue_with(client, key, f"{name}:seq")
    oldest = cast("list[bytes]", client.lrange(f"{key}:level:0", -1, -1))
    from scrapy_dist.scripts import scripts_for

    scripts = scripts_for(client)
    stale = scripts.to_slots(queue=key, level="0", entries=[(b"0" * 16 + b"x", "0@a.com")])
    assert stale.run()[0] == -1
    moved = scripts.to_slots(queue=key, level="0", entries=[(oldest[0], "0@a.com")])
    assert moved.run()[0] == 1
    # a second mover with the same batch finds it gone: nothing moved twice
    assert scripts.to_slots(queue=key, level="0", entries=[(oldest[0], "0@a.com")]).run()[0] == -1
    queue = SlotQueue(client, key, f"{name}:seq")
    assert queue.sizes() == {"a.com": 1}
    assert queue.open() == 6  # the rest, then the marker
    assert len(queue) == 7


# -- what an attack found (each failed before its fix) ----------------------------------


def test_download_slots_delays_survive_a_flush(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    from scrapy_dist.testing.queues import join_flushing

    slow = {"DOWNLOAD_SLOTS": {"slow.com": {"delay": 30}}, "SCHEDULER_LEASE_TIMEOUT": 30}
    frontier = build(**slow)
    push(frontier, "https://slow.com/old")
    assert join_flushing(client, frontier)  # SCHEDULER_FLUSH_ON_START's flush
    push(frontier, *(f"https://slow.com/{i}" for i in range(3)))
    assert len(lease(frontier, 10)) == 1
    # they travel with every reserve: nothing in Redis to lose
    assert client.exists(frontier.queue.key + ":delays") == 0


def test_known_crawl_delays_are_written_again_after_a_flush(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    from scrapy_dist.worker.crawl_delays import REWRITE_EVERY, CrawlDelays

    frontier = build()
    queue = cast("SlotQueue", frontier.queue)
    now = [0.0]
    delays = CrawlDelays(
        lambda request: 1e9, queue.limits, queue.key + ":delays", clock=lambda: now[0]
    )
    delays.reached(Request("https://slow.com/x"))
    ride = delays.rider()
    assert ride is not None
    assert ride.command.args[4:] == ("slow.com", "300", "h")  # cut to SLOT_DELAY_MAX
    ride.on_reply(cast("Any", client).execute_command(*ride.command.args))
    client.delete(queue.key + ":delays")  # (a finish, a flush)
    assert delays.rider() is None
    now[0] += REWRITE_EVERY
    ride = delays.rider()
    assert ride is not None
    ride.on_reply(cast("Any", client).execute_command(*ride.command.args))
    assert client.hgetall(queue.key + ":delays") == {b"slow.com": b"300"}


def test_delays_and_pauses_written_by_hand_as_infinite_do_not_stop_the_crawl(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build(SCHEDULER_LEASE_TIMEOUT=30)
    queue = frontier.queue
    client.hset(queue.key + ":delays", mapping={"a.com": "inf", "b.com": "1e9", "c.com": "nan"})
    client.zadd(frontier.keys.slot_pauses, {"d.com": float("inf")})
    push(frontier, *(f"https://{h}.com/{i}" for h in "abcd" for i in range(2)))
    first = urls(frontier, 10)
    # b: a delay cut to SLOT_DELAY_MAX (one request); a and c: junk, no delay; d: no pause
    expected = ["https://a.com/0", "https://a.com/1", "https://b.com/0", "https://c.com/0"]
    expected += ["https://c.com/1", "https://d.com/0", "https://d.com/1"]
    assert sorted(first) == expected
    ready_at = frontier.slot_ready_at
    assert ready_at is not None
    assert ready_at - time.monotonic() <= 301
    # the junk is deleted and said, once each, in a dead-letter record naming it
    assert client.hgetall(queue.key + ":delays") == {b"b.com": b"1e9"}
    reasons = sorted(d["reason"] for d in map(json.loads, client.lrange(frontier.keys.dead, 0, -1)))
    assert len(reasons) == 2, reasons
    assert reasons[0].startswith(f'{queue.key}:delays held "inf" for slot a.com, not a delay')
    assert reasons[1].startswith(f'{queue.key}:delays held "nan" for slot c.com, not a delay')


def test_a_wait_or_rest_further_ahead_than_a_reserve_sets_ends_at_the_next_reserve(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    """A slot's wait or rest at a time no reserve writes (by hand, garbage: 1e15) kept
    the slot's requests in Redis forever and the crawl never finished; a pause longer
    than SLOT_WAIT_MAX waits that long, then is looked at again."""
    frontier = build()
    queue = frontier.queue
    push(frontier, "https://a.com/1", "https://b.com/1")
    client.zrem(queue.key + ":ready", "a.com", "b.com")
    client.zadd(queue.key + ":wait", {"a.com": 1e15, "b.com": float("inf")})
    client.zadd(queue.key + ":resting", {"c.com": 1e15})
    assert sorted(urls(frontier, 5)) == ["https://a.com/1", "https://b.com/1"]
    assert client.zcard(queue.key + ":resting") == 0
    push(frontier, "https://c.com/1")  # not held by the rest that was removed
    assert urls(frontier, 5) == ["https://c.com/1"]
    # a pause of two hours: the slot waits an hour at most, then the pause holds again
    now = time.time()
    client.zadd(frontier.keys.slot_pauses, {"d.com": (now + 7200) * 1000})
    push(frontier, "https://d.com/1")
    assert urls(frontier, 5) == []
    until = client.zscore(queue.key + ":wait", "d.com")
    assert until is not None
    assert now + SLOT_WAIT_MAX - 5 <= until <= now + SLOT_WAIT_MAX + 5


def test_a_pauses_key_of_another_type_is_no_pause(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build()
    client.set(frontier.keys.slot_pauses, "junk")
    push(frontier, "https://a.com/1")
    assert urls(frontier, 5) == ["https://a.com/1"]


def test_long_download_slots_names_are_bounded_as_requests_name_them(
    build: Callable[..., Frontier],
) -> None:
    long = "x" * 300
    frontier = build(DOWNLOAD_SLOTS={long: {"delay": 30}}, SCHEDULER_LEASE_TIMEOUT=30)
    push(frontier, *(f"https://a.com/{i}" for i in range(3)), slot=long)
    assert len(lease(frontier, 10)) == 1


def test_a_move_past_a_level_indexed_but_gone_ends(client: redis.Redis, name: str) -> None:
    key = f"{name}:requests"
    client.set(key, LEVELS_MARKER)
    client.lpush(f"{key}:level:0", b"0" * 15 + b"1" + b'{"url": "https://a.com/1"}')
    client.zadd(f"{key}:levels", {"-7": -7, "0": 0})  # -7's list deleted by hand
    queue = SlotQueue(client, key, f"{name}:seq")
    assert queue.open() == 1
    assert client.get(key) == SLOTS_MARKER.encode()
    assert queue.sizes() == {"a.com": 1}


def test_an_enqueue_of_several_slots_with_a_level_of_another_type_pushes_nothing(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build()
    queue = cast("SlotQueue", frontier.queue)
    client.set(queue.key + ":slot:b.com:level:0", "junk")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        push(frontier, "https://a.com/1", "https://b.com/1")
    assert client.exists(queue.key + ":slot:a.com:level:0") == 0
    assert len(queue) == 0


def test_a_ready_index_of_another_type_is_set_aside_before_anything_is_taken(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build(DOWNLOAD_DELAY=0.2, SCHEDULER_LEASE_TIMEOUT=30)
    queue = frontier.queue
    push(frontier, "https://a.com/1", "https://a.com/2", "https://b.com/1")
    assert sorted(urls(frontier, 5)) == ["https://a.com/1", "https://b.com/1"]
    time.sleep(0.25)
    client.delete(queue.key + SLOTS_READY_SUFFIX)
    client.rpush(queue.key + SLOTS_READY_SUFFIX, "junk")
    assert urls(frontier, 5) == ["https://a.com/2"]
    assert client.type(queue.key + SLOTS_READY_SUFFIX + ":wrongtype") == b"list"
    assert b"renamed to" in cast("bytes", client.lindex(frontier.keys.dead, 0))


def test_a_put_back_refused_by_an_index_pushes_nothing_twice(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build(SCHEDULER_LEASE_TIMEOUT=30)
    queue = frontier.queue
    push(frontier, "https://a.com/1", "https://a.com/2")
    ((held, _),) = lease(frontier, 1)
    index = queue.key + ":slot:a.com:levels"
    client.delete(index)
    client.set(index, "junk")
    for _ in range(3):
        with pytest.raises(redis.ResponseError):
            frontier.leases.settle_call([(held, "boom")], frontier.epoch).run()
    assert client.lrange(queue.key + ":slot:a.com:level:0", 0, -1) == [
        cast("bytes", client.lindex(queue.key + ":slot:a.com:level:0", 0))
    ]


# -- random operations against a model ---------------------------------------------------

ODD_SLOTS = ["a.com", "b.com", "x|y", "p%q", "at@sign", "c:o:l", "{tag}", "ünï.de", "", "sp ace"]


def _check_layout(client: redis.Redis, queue: SlotQueue, outstanding: dict[str, str]) -> int:
    """The queue per slot's invariants: each slot that holds entries is ready xor
    waiting, a ready slot's score is its best level's, no level of the index is empty,
    each entry is in its own slot; returns the entries queued."""
    ready = dict(
        cast(
            "list[tuple[bytes, float]]", client.zrange(queue.key + ":ready", 0, -1, withscores=True)
        )
    )
    waiting = set(cast("list[bytes]", client.zrange(queue.key + ":wait", 0, -1)))
    total = 0
    for slot in queue.indexed_slots():
        levels = queue.slot_levels_key(slot)
        names = cast("list[tuple[bytes, float]]", client.zrange(levels, 0, -1, withscores=True))
        member = slot.encode()
        entries = []
        for name, _ in names:
            level = cast(
                "list[bytes]",
                client.lrange(f"{levels[: -len(':levels')]}:level:{name.decode()}", 0, -1),
            )
            assert level, (slot, name)
            entries += level
        if entries:
            assert (member in ready) != (member in waiting), slot
            if member in ready:
                assert ready[member] == names[0][1], slot
        else:
            assert member not in ready, slot
        for entry in entries:
            assert slot_id(outstanding[entry[16:].decode()]) == slot
        total += len(entries)
    assert len(queue) == total
    return total


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_enqueues_reserves_and_settlements_keep_every_request_once(
    build: Callable[..., Frontier], client: redis.Redis, seed: int
) -> None:
    import random

    rng = random.Random(seed)
    settings = {
        "DOWNLOAD_DELAY": rng.choice([0, 0.01]),
        "DOWNLOAD_SLOTS": {s: {"delay": rng.choice([0, 0.02])} for s in rng.sample(ODD_SLOTS, 3)},
        "CONCURRENT_REQUESTS_PER_DOMAIN": rng.choice([1, 2, 8]),
        "SCHEDULER_LEASE_TIMEOUT": 30,
        "SCHEDULER_MAX_DELIVERIES": 1000,
    }
    workers = [build(**settings), build(**settings)]
    queue = cast("SlotQueue", workers[0].queue)
    outstanding: dict[str, str] = {}  # url -> slot, until settled done
    held: list[dict[str, str]] = [{}, {}]
    count = 0
    for _ in range(250):
        op, w = rng.random(), rng.randrange(2)
        if op < 0.4:
            batch = []
            for _ in range(rng.randint(1, 12)):
                count += 1
                url, slot = f"https://h/{count}", rng.choice(ODD_SLOTS)
                request = Request(
                    url, priority=rng.choice([0, 0, 1, 5, -3]), meta={"download_slot": slot}
                )
                batch.append((url.encode(), queue.score(request), b""))
                outstanding[url] = slot
            assert queue.push(batch) == [True] * len(batch)
        elif op < 0.7:
            for lease_id, url in lease(workers[w], rng.choice([1, 2, 5, 20])):
                held[w][lease_id] = url
        elif held[w]:
            chosen = rng.sample(sorted(held[w]), rng.randint(1, len(held[w])))
            outcomes = []
            for lease_id in chosen:
                url = held[w].pop(lease_id)
                outcome = rng.choice(["", "", "boom", "~"])
                outcomes.append((lease_id, outcome))
                if outcome == "":
                    del outstanding[url]
            workers[w].settle(outcomes)
            workers[w].flush()
        queued = _check_layout(client, queue, outstanding)
        assert queued + len(held[0]) + len(held[1]) == len(outstanding)
    # then everything drains: each request once
    deadline = time.monotonic() + 10
    while outstanding and time.monotonic() < deadline:
        for w in (0, 1):
            for url in held[w].values():
                outstanding.pop(url)
            workers[w].settle([(lease_id, "") for lease_id in held[w]])
            workers[w].flush()
            held[w] = dict(lease(workers[w], 50))
        time.sleep(0.01)
    assert not outstanding
    assert _check_layout(client, queue, {}) == 0


def test_clear_deletes_every_key_even_beside_an_index_of_another_type(
    build: Callable[..., Frontier], client: redis.Redis
) -> None:
    frontier = build(DOWNLOAD_DELAY=5, SCHEDULER_LEASE_TIMEOUT=30)
    queue = cast("SlotQueue", frontier.queue)
    push(frontier, "https://a.com/1", "https://a.com/2", "https://b.com/1")
    lease(frontier, 1)  # (a.com or b.com now waits)
    client.set(queue.key + ":resting", "junk")
    queue.clear()
    assert [k for k in client.scan_iter(match=f"{queue.key}*")] == []


def test_leases_taken_from_the_priority_queue_go_back_to_their_slot_after_the_move(
    make_crawler: Callable[..., Crawler],
    build: Callable[..., Frontier],
    client: redis.Redis,
    name: str,
) -> None:
    """A worker of the priority queue killed while it held leases; the crawl opened with
    SlotQueue later: once those leases expire, their requests go back to their own slot
    (and wait for its delay), not to the slot ``""``."""
    old = one_shard(frontier_for(make_crawler({"SCHEDULER_LEASE_TIMEOUT": 0.3, **FIFO_TIES})))
    old.queue.open()
    queue = old.queue
    for i in range(3):
        payload = json.dumps({"url": f"https://slow.com/{i}"}).encode()
        queue.push([(payload, queue.score(Request(f"https://slow.com/{i}")), b"")])
    assert len(old.reserve(2)) == 2  # (then killed: never settled)
    frontier = build(DOWNLOAD_DELAY=5)  # (moves the queue; the leases get their slot)
    time.sleep(0.35)
    assert len(frontier.reserve(10)) == 1  # the expired two came back to slow.com: spaced
    slots = cast("SlotQueue", frontier.queue).sizes()
    assert slots == {"slow.com": 2}, slots
