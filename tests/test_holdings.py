"""Attacks on the leases kept in one holding per worker (``lua/_leases.lua``): a
worker's leases in the hash ``<crawl>:holders:<worker>``, one deadline per worker in
the zset ``<crawl>:holders``. Each test drives the scripts on a real Redis and checks
that no entry is lost or held twice, that delivery counts match what
``SCHEDULER_MAX_DELIVERIES`` expects, that the crawl is not reported finished while
something is held, and that no holding is left behind."""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis

from scrapy_dist.frontier.epoch import FINISHED, log_gone, stored_number
from scrapy_dist.frontier.wire import (
    DEAD_BECAUSE,
    DEAD_NOW,
    DONE,
    FROM_QUEUE,
    FROM_SEEDS,
    HAND_BACK,
)
from scrapy_dist.keys import RedisKeys, crawl_slot, level_key, slot_of
from scrapy_dist.scripts import Scripts
from scrapy_dist.testing.leases import holdings, leased_count
from scrapy_dist.testing.queues import queued_entries
from scrapy_dist.testing.refusals import OOM_REFUSED

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from scrapy_dist.testing import ClusterServers
    from scrapy_dist.testing.redis_server import RedisServer


class Crawl:
    """The keys of one crawl, and the lease scripts called on them by any worker."""

    def __init__(
        self, client: redis.Redis, name: str, *, max_deliveries: int = 3, hash_tag: bool = False
    ) -> None:
        self.client = client
        self.scripts = Scripts(client)
        self.keys = RedisKeys.build(name, hash_tag=hash_tag)
        self.queue = self.keys.requests
        self.seeds = self.keys.start_urls
        self.filter = self.keys.dupefilter
        self.max_deliveries = max_deliveries
        self.seeds_put_back = "lpush"

    def enqueue(
        self, n: int, *, start: int = 0, score: float = 0.0, worker: str = "", parent: str = ""
    ) -> list[int]:
        entries = [(b"fp%08d" % i, score, b"payload %d" % i) for i in range(start, start + n)]
        call = self.scripts.enqueue(
            queue=self.queue,
            seq=self.keys.seq,
            epoch_key=self.keys.epoch,
            queue_kind="levels",
            filter_kind="set",
            filter_keys=[self.filter],
            filter_args=[0],
            entries=entries,
            holding=self.keys.holding(worker) if worker else "",
            parents=[parent] * n,
        )
        return list(call.run())

    def reserve(
        self,
        worker: str,
        count: int,
        *,
        origin: str = FROM_QUEUE,
        take: str = "levels",
        duration: float = 60.0,
        reclaim_limit: int = 100,
    ) -> list[tuple[str, int, bytes]]:
        k = self.keys
        reply = self.scripts.reserve(
            holders=k.holders,
            holding=k.holding(worker),
            deliveries=k.deliveries,
            dead=k.dead,
            queue=self.queue,
            seeds=self.seeds,
            seq=k.seq,
            progress=k.progress,
            epoch_key=k.epoch,
            previous=(k.leases, k.leased),
            origin=origin,
            take=take,
            queue_put_back="level",
            seeds_put_back=self.seeds_put_back,
            count=count,
            duration=duration,
            worker=worker,
            max_deliveries=self.max_deliveries,
            reclaim_limit=reclaim_limit,
            epoch="",
        ).run()
        # (a trailing count of expired leases put back, when there are some: dropped)
        n = len(reply) - len(reply) % 3
        return [(reply[i].decode(), reply[i + 1], reply[i + 2]) for i in range(0, n, 3)]

    def settle(self, worker: str, outcomes: Iterable[tuple[str, str]]) -> list[int]:
        k = self.keys
        call = self.scripts.settle(
            holding=k.holding(worker),
            deliveries=k.deliveries,
            dead=k.dead,
            queue=self.queue,
            seeds=self.seeds,
            progress=k.progress,
            epoch_key=k.epoch,
            worker=worker,
            queue_put_back="level",
            seeds_put_back=self.seeds_put_back,
            max_deliveries=self.max_deliveries,
            epoch="",
            outcomes=list(outcomes),
        )
        return list(call.run())

    def renew(self, worker: str, ids: Iterable[str], duration: float = 60.0) -> list[str]:
        k = self.keys
        call = self.scripts.renew(
            holders=k.holders,
            holding=k.holding(worker),
            epoch_key=k.epoch,
            worker=worker,
            duration=duration,
            epoch="",
            lease_ids=list(ids),
        )
        return [i.decode() for i in call.run()]

    def release(self, worker: str, known: Iterable[str] = ()) -> int:
        k = self.keys
        return int(
            self.scripts.release(
                holding=k.holding(worker),
                deliveries=k.deliveries,
                queue=self.queue,
                seeds=self.seeds,
                epoch_key=k.epoch,
                dead=k.dead,
                progress=k.progress,
                queue_put_back="level",
                seeds_put_back=self.seeds_put_back,
                epoch="",
                worker=worker,
                known=list(known),
            ).run()
        )

    def progress(self, *, clear: bool = False, grace: float = 0.0, epoch: str = "") -> list[Any]:
        k = self.keys
        call = self.scripts.progress(
            queue=self.queue,
            seeds=self.seeds,
            holders=k.holders,
            previous=k.leases,
            progress=k.progress,
            epoch_key=k.epoch,
            clear_keys=[*k.frontier(), self.filter],
            queue_kind="levels",
            seeds_kind="list",
            grace=grace,
            clear=clear,
            keep_for=0,
            epoch=epoch,
        )
        return [v.decode() if isinstance(v, bytes) else v for v in call.run()]

    def census(self) -> list[int]:
        """``lua/census.lua``'s figures of this crawl: queued, leased, done, dead, retried."""
        k = self.keys
        call = self.scripts.census(
            queue=self.queue,
            holders=k.holders,
            previous=k.leases,
            progress=k.progress,
            epoch_key=k.epoch,
            queue_kind="levels",
            epoch="",
        )
        return list(call.run())

    # -- reading the state ----------------------------------------------------------------

    def expire(self, worker: str) -> None:
        """Worker ``worker`` is paused past its deadline (its leases expired)."""
        assert self.client.zscore(self.keys.holders, worker) is not None
        self.client.zadd(self.keys.holders, {worker: 1.0})

    def held(self, worker: str) -> set[str]:
        keys = cast("list[bytes]", self.client.hkeys(self.keys.holding(worker)))
        return {i.decode() for i in keys}

    def queued_ids(self) -> list[str]:
        return [e[:16].decode() for e in queued_entries(self.client, self.queue)]

    def deliveries(self) -> dict[str, int]:
        raw = cast("dict[bytes, bytes]", self.client.hgetall(self.keys.deliveries))
        return {k.decode(): int(v) for k, v in raw.items()}

    def dead(self) -> list[dict[str, Any]]:
        return [json.loads(d) for d in self.client.lrange(self.keys.dead, 0, -1)]

    def where(self) -> dict[str, list[str]]:
        """Lease or entry id -> every place it is: "queue", "dead", a worker's id."""
        places: dict[str, list[str]] = {}
        for entry_id in self.queued_ids():
            places.setdefault(entry_id, []).append("queue")
        for worker, held in holdings(self.client, self.keys.crawl).items():
            for lease in held:
                places.setdefault(lease, []).append(worker)
        for record in self.dead():
            places.setdefault(record["data"], []).append("dead")
        return places


@pytest.fixture
def crawl(client: redis.Redis, name: str) -> Crawl:
    return Crawl(client, name)


def _ids(leases: Iterable[tuple[str, int, bytes]]) -> list[str]:
    return [lease_id for lease_id, _, _ in leases]


# -- 1. a paused worker, part of its holding reclaimed ------------------------------------


def test_a_paused_worker_loses_only_what_was_reclaimed_and_nothing_is_held_twice(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(250)
    ids = _ids(crawl.reserve("paused", 250))
    assert len(ids) == 250
    crawl.expire("paused")

    assert crawl.reserve("other", 0) == []  # reclaims 100 (the limit), leases nothing
    assert len(crawl.held("paused")) == 150
    assert len(crawl.queued_ids()) == 100
    assert crawl.deliveries() == dict.fromkeys(crawl.queued_ids(), 1)
    places = crawl.where()
    assert set(places) == set(ids)
    assert all(len(p) == 1 for p in places.values())
    assert leased_count(client, crawl.keys.crawl) == 150
    assert crawl.progress()[0] == "busy"

    # the paused worker resumes: its renewal revives the 150 and names the 100 it lost
    lost = crawl.renew("paused", ids)
    assert sorted(lost) == sorted(crawl.queued_ids())
    deadline = client.zscore(crawl.keys.holders, "paused")
    assert deadline is not None
    assert deadline > time.time()
    assert crawl.reserve("other", 0) == []  # nothing more reclaimed
    assert len(crawl.held("paused")) == 150

    # the other worker takes the 100 back (second delivery), the paused one settles all
    again = crawl.reserve("other", 250)
    assert sorted(_ids(again)) == sorted(lost)
    assert {times for _, times, _ in again} == {2}
    assert crawl.settle("paused", [(i, DONE) for i in ids]) == [150, 0, 0, 0, 100]
    assert crawl.settle("other", [(i, DONE) for i in lost]) == [100, 0, 0, 0, 0]
    assert client.hget(crawl.keys.progress, "done") == b"250"
    assert crawl.deliveries() == {}
    assert leased_count(client, crawl.keys.crawl) == 0
    assert client.exists(crawl.keys.holding("paused"), crawl.keys.holding("other")) == 0


def test_a_dead_workers_holding_is_reclaimed_in_steps_then_gone(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(250)
    ids = _ids(crawl.reserve("dead", 250))
    crawl.expire("dead")
    for left in (150, 50):
        crawl.reserve("a", 0)
        assert len(crawl.held("dead")) == left
        assert client.zscore(crawl.keys.holders, "dead") == 1.0  # still expired
    crawl.reserve("b", 0)  # the last 50: the holding and the holder go
    assert client.exists(crawl.keys.holding("dead")) == 0
    assert client.zscore(crawl.keys.holders, "dead") is None
    assert sorted(crawl.queued_ids()) == sorted(ids)
    # and a settlement by the dead worker, were it to come back, finds nothing
    assert crawl.settle("dead", [(i, DONE) for i in ids[:5]]) == [0, 0, 0, 0, 5]
    assert sorted(crawl.queued_ids()) == sorted(ids)


def test_the_reclaim_budget_spans_several_expired_holders(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(180)
    for worker in ("w1", "w2", "w3"):
        crawl.reserve(worker, 60)
    for worker in ("w1", "w2", "w3"):
        crawl.expire(worker)
    crawl.reserve("a", 0, reclaim_limit=100)
    held = [len(crawl.held(w)) for w in ("w1", "w2", "w3")]
    assert sum(held) == 80
    assert len(crawl.queued_ids()) == 100
    crawl.reserve("a", 0, reclaim_limit=100)
    assert len(crawl.queued_ids()) == 180
    assert holdings(client, crawl.keys.crawl) == {}
    assert all(len(p) == 1 for p in crawl.where().values())


def test_a_worker_reclaims_its_own_expired_holding(crawl: Crawl, client: redis.Redis) -> None:
    # it let them lapse (paused past its lease): its next reserve returns them to the
    # queue first, and then takes the queue's head, as any worker's would
    crawl.enqueue(3)
    ids = _ids(crawl.reserve("w", 2))
    crawl.expire("w")
    again = {lease_id: times for lease_id, times, _ in crawl.reserve("w", 5)}
    assert len(again) == 3
    assert {again[i] for i in ids} == {2}  # a second delivery each
    assert sorted(again.values()) == [1, 2, 2]
    assert crawl.held("w") == set(again)
    deadline = client.zscore(crawl.keys.holders, "w")
    assert deadline is not None
    assert deadline > time.time()


def test_a_reserve_that_grants_nothing_does_not_keep_a_forgotten_lease_alive(
    crawl: Crawl, client: redis.Redis
) -> None:
    # the only worker of a crawl holds a lease it no longer knows of (a leak) and polls
    # for work: the lease expires and its own reserve takes it back, rather than the
    # crawl waiting on it for as long as the worker lives
    crawl.enqueue(1)
    [leaked] = _ids(crawl.reserve("w", 1, duration=0.05))
    assert crawl.reserve("w", 1, duration=0.05) == []  # nothing granted: not renewed
    time.sleep(0.1)
    [(again, times, _)] = crawl.reserve("w", 1, duration=0.05)
    assert (again, times) == (leaked, 2)


def test_children_of_a_reclaimed_lease_are_refused_those_of_a_kept_one_queued(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(101)
    ids = _ids(crawl.reserve("paused", 101))
    crawl.expire("paused")
    crawl.reserve("other", 0)  # 100 of the 101 reclaimed
    [kept] = crawl.held("paused")
    taken = next(i for i in ids if i != kept)
    assert crawl.enqueue(1, start=500, worker="paused", parent=taken) == [-1]
    assert crawl.enqueue(1, start=501, worker="paused", parent=kept) == [1]
    assert client.sismember(crawl.filter, "fp00000500") == 0  # its token not recorded


# -- 2. delivery counts -------------------------------------------------------------------


def test_deliveries_count_failures_and_expiries_not_hand_backs_or_releases(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(1)
    [(x, times, _)] = crawl.reserve("a", 1)
    assert times == 1
    assert crawl.deliveries() == {}  # absent: a first delivery
    assert crawl.settle("a", [(x, "ValueError: boom")]) == [0, 1, 0, 0, 0]
    assert crawl.deliveries() == {x: 1}

    [(again, times, _)] = crawl.reserve("b", 1)
    assert (again, times) == (x, 2)
    assert crawl.deliveries() == {x: 2}
    crawl.expire("b")
    crawl.reserve("c", 0)  # b's lease expired: back to the queue, its count kept
    assert crawl.queued_ids() == [x]
    assert crawl.deliveries() == {x: 2}

    [(_, times, _)] = crawl.reserve("c", 1)
    assert times == 3
    assert crawl.settle("c", [(x, HAND_BACK)]) == [0, 0, 0, 1, 0]
    assert crawl.deliveries() == {x: 2}  # the hand back does not count

    [(_, times, _)] = crawl.reserve("d", 1)  # a reply that never reached d
    assert times == 3
    assert crawl.release("d") == 1
    assert crawl.deliveries() == {x: 2}  # neither does a release

    [(_, times, _)] = crawl.reserve("e", 1)
    assert times == 3
    assert crawl.settle("e", [(x, "ValueError: boom")]) == [0, 0, 1, 0, 0]
    [record] = crawl.dead()
    assert record["deliveries"] == 3
    assert "SCHEDULER_MAX_DELIVERIES" in record["reason"]
    assert crawl.deliveries() == {}
    assert crawl.queued_ids() == []
    assert leased_count(client, crawl.keys.crawl) == 0


def test_an_entry_whose_lease_expires_at_the_limit_is_dead_lettered_once(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(1)
    for times in (1, 2, 3):
        [(_, delivered, _)] = crawl.reserve(f"w{times}", 1)
        assert delivered == times
        crawl.expire(f"w{times}")
    assert crawl.reserve("last", 1) == []  # the third expiry: dead, not queued
    [record] = crawl.dead()
    assert record["deliveries"] == 3
    assert record["worker"] == "w3"
    assert "lease expired on 3 deliveries" in record["reason"]
    assert crawl.deliveries() == {}
    assert client.hget(crawl.keys.progress, "dead") == b"1"
    assert leased_count(client, crawl.keys.crawl) == 0


def test_copies_of_a_seed_held_by_two_workers_count_their_own_deliveries(
    crawl: Crawl, client: redis.Redis
) -> None:
    """Two copies of one seed (pushed twice) leased by two workers at once: as when one
    worker leases both, the second gets an id of its own (whose count is not kept), so
    one copy's deliveries never add to the other's: neither is dead-lettered before it
    was delivered SCHEDULER_MAX_DELIVERIES times, and no count is left behind."""
    seed = b"https://example.com/twice"
    client.rpush(crawl.seeds, seed, seed)
    for n in range(1, crawl.max_deliveries + 1):
        [(a_id, a_times, _)] = crawl.reserve("a", 1, origin=FROM_SEEDS, take="lpop")
        [(b_id, b_times, _)] = crawl.reserve("b", 1, origin=FROM_SEEDS, take="lpop")
        assert a_id != b_id
        assert a_times == n
        assert b_times <= n
        if n < crawl.max_deliveries:
            assert crawl.settle("a", [(a_id, "ValueError: boom")]) == [0, 1, 0, 0, 0]
            assert crawl.settle("b", [(b_id, "ValueError: boom")]) == [0, 1, 0, 0, 0]
    assert crawl.dead() == []
    crawl.settle("a", [(a_id, DONE)])
    crawl.settle("b", [(b_id, DONE)])
    assert client.hget(crawl.keys.progress, "done") == b"2"
    assert crawl.deliveries() == {}


# -- 3. the previous version's leases -----------------------------------------------------


def _previous_lease(
    crawl: Crawl, lease_id: str, record: str, deadline: float, times: int = 1
) -> None:
    """A lease as the previous version wrote it (zset, record hash, every delivery
    counted, the worker's index)."""
    k = crawl.keys
    crawl.client.zadd(k.leases, {lease_id: deadline})
    crawl.client.hset(k.leased, lease_id, record)
    crawl.client.hset(k.deliveries, lease_id, times)
    crawl.client.sadd(k.held("old:1:ab"), lease_id)


def test_the_previous_versions_leases_are_counted_then_reclaimed_to_their_level(
    crawl: Crawl, client: redis.Redis
) -> None:
    later = time.time() + 2.0
    _previous_lease(crawl, "0000000000000001", "q|-5|old:1:ab|0000000000000001first", 1.0)
    _previous_lease(crawl, "0000000000000002", "q|0|old:1:ab|0000000000000002second", later)
    seed_id = FROM_SEEDS + hashlib.sha1(b"https://example.com/a|b").hexdigest()[:15]
    _previous_lease(crawl, seed_id, "s|0|old:1:ab|https://example.com/a|b", 1.0, times=2)
    client.incrby(crawl.keys.seq, 2)
    client.hset(crawl.keys.progress, "done", 1)  # the crawl has settled something

    assert leased_count(client, crawl.keys.crawl) == 3
    assert crawl.progress()[0] == "busy"
    assert crawl.reserve("new", 0) == []  # the two expired ones go back
    assert client.lrange(level_key(crawl.queue, "-5"), 0, -1) == [b"0000000000000001first"]
    assert client.lrange(crawl.seeds, 0, -1) == [b"https://example.com/a|b"]
    assert crawl.deliveries() == {"0000000000000001": 1, "0000000000000002": 1, seed_id: 2}
    assert leased_count(client, crawl.keys.crawl) == 1  # the unexpired one still counts
    state, queued, seeds, leased, _ = crawl.progress(grace=0)
    assert (state, queued, seeds, leased) == ("busy", 1, 1, 1)

    [(first, times, entry)] = crawl.reserve("new", 1)
    assert (first, times, entry) == ("0000000000000001", 2, b"0000000000000001first")
    [(seed_lease, times, raw)] = crawl.reserve("new", 1, origin=FROM_SEEDS, take="lpop")
    assert (times, raw) == (3, b"https://example.com/a|b")  # crawl.max_deliveries: 3
    crawl.settle("new", [(first, DONE), (seed_lease, DONE)])
    assert crawl.progress()[0] == "busy"  # the unexpired lease of the previous version

    while time.time() < later + 0.05:
        time.sleep(0.05)
    [(second, times, _)] = crawl.reserve("new", 1)
    assert (second, times) == ("0000000000000002", 2)
    crawl.settle("new", [(second, DONE)])
    assert client.exists(crawl.keys.leases, crawl.keys.leased) == 0
    assert leased_count(client, crawl.keys.crawl) == 0
    assert crawl.progress()[0] == "finished"


def test_a_previous_versions_lease_expired_at_the_limit_is_dead_lettered(
    crawl: Crawl, client: redis.Redis
) -> None:
    _previous_lease(crawl, "0000000000000009", "q|0|old:1:ab|0000000000000009page", 1.0, 3)
    assert crawl.reserve("new", 5) == []
    [record] = crawl.dead()
    assert (record["deliveries"], record["worker"], record["data"]) == (3, "old:1:ab", "page")
    assert crawl.deliveries() == {}
    assert client.hget(crawl.keys.progress, "dead") == b"1"


# -- 4. no holding is left behind ---------------------------------------------------------


def _holding_keys(client: redis.Redis, crawl: Crawl) -> list[str]:
    pattern = crawl.keys.holders.replace("[", "\\[") + "*"
    return sorted(k.decode() for k in client.scan_iter(match=pattern, count=1000))


def _hold(crawl: Crawl) -> None:
    """Three workers hold leases; one of them has settled everything it held."""
    crawl.enqueue(6)
    for worker in ("w1", "w2", "idle"):
        crawl.reserve(worker, 2)
    crawl.settle("idle", [(i, DONE) for i in crawl.held("idle")])
    assert _holding_keys(crawl.client, crawl) == [
        crawl.keys.holders,
        crawl.keys.holding("w1"),
        crawl.keys.holding("w2"),
    ]


def test_a_flush_at_start_takes_every_holding(crawl: Crawl, client: redis.Redis) -> None:
    _hold(crawl)
    k = crawl.keys
    flushed = crawl.scripts.join(
        workers=k.workers,
        progress=k.progress,
        starts=k.starts,
        flush_keys=[*k.frontier(), crawl.filter],
        worker="w9",
        timeout=60,
        flush=True,
        age=0,
    ).run()
    assert flushed[1] == 1
    assert _holding_keys(client, crawl) == []


def test_completion_takes_the_holders_of_workers_that_hold_nothing(
    crawl: Crawl, client: redis.Redis
) -> None:
    _hold(crawl)
    for worker in ("w1", "w2"):
        crawl.settle(worker, [(i, DONE) for i in crawl.held(worker)])
    assert crawl.progress(clear=True)[0] == "finished"
    assert _holding_keys(client, crawl) == []


@pytest.fixture
def outside_any_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI runs in an empty directory, no Scrapy project's settings."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)


@pytest.mark.usefixtures("outside_any_project")
def test_cli_reset_deletes_every_holding(
    crawl: Crawl, client: redis.Redis, redis_url: str, name: str
) -> None:
    from scrapy_dist.cli import main

    _hold(crawl)
    client.set(crawl.keys.holding("w:ü"), b"junk")  # set aside by the next reserve
    client.zadd(crawl.keys.holders, {"w:ü": 1.0})
    crawl.reserve("w1", 0)
    assert client.exists(crawl.keys.holding("w:ü") + ":wrongtype") == 1
    assert main(["reset", name, "--yes", "--redis-url", redis_url]) == 0
    assert _holding_keys(client, crawl) == []
    assert list(client.scan_iter(match=f"{name}*")) == []


def test_delete_keys_takes_every_holding(make_crawler: Any, client: redis.Redis, name: str) -> None:
    from scrapy_dist.testing.engine import HeldRequests

    held = HeldRequests(make_crawler({"SCHEDULER_FLUSH_INTERVAL": 0}))
    try:
        frontier = held.frontier
        crawl = Crawl(client, name)
        crawl.queue = frontier.queue.key
        _hold(crawl)
        frontier.delete_keys()
        assert _holding_keys(client, crawl) == []
    finally:
        held.close()


# -- 5. Redis refusals --------------------------------------------------------------------


def test_a_broken_holding_of_an_expired_worker_does_not_stop_other_workers(
    crawl: Crawl, client: redis.Redis
) -> None:
    """A holding that is not a hash (written by hand) of a worker whose deadline
    passed: every reserve reclaims from it. It is renamed out of the way with a
    dead-letter record naming it, and the reserve goes on."""
    crawl.enqueue(3)
    crawl.reserve("w1", 1)
    broken = crawl.keys.holding("broken")
    client.set(broken, b"junk")
    client.zadd(crawl.keys.holders, {"broken": 1.0})
    leases = crawl.reserve("a", 5)
    assert len(leases) == 2
    assert client.get(broken + ":wrongtype") == b"junk"
    assert client.exists(broken) == 0
    assert client.zscore(crawl.keys.holders, "broken") is None
    [record] = crawl.dead()
    assert broken in record["reason"]
    assert "wrongtype" in record["reason"]
    assert leased_count(client, crawl.keys.crawl) == 3
    assert crawl.progress()[0] == "busy"


def test_a_workers_own_broken_holding_is_set_aside_before_it_takes_anything(
    crawl: Crawl, client: redis.Redis
) -> None:
    """A worker whose own holding is not a hash: its renewal does not keep the broken
    key alive, and its reserve renames it out of the way before it takes entries (they
    were taken, then could not be recorded: lost)."""
    crawl.enqueue(3)
    broken = crawl.keys.holding("w")
    client.set(broken, b"junk")
    client.zadd(crawl.keys.holders, {"w": time.time() + 5})
    assert crawl.renew("w", ["0000000000000001"]) == ["0000000000000001"]
    score = client.zscore(crawl.keys.holders, "w")
    assert score is not None
    assert score < time.time() + 30  # not renewed: it holds nothing
    taken = crawl.reserve("w", 2)
    assert len(taken) == 2
    assert crawl.held("w") == set(_ids(taken))
    assert client.get(broken + ":wrongtype") == b"junk"
    [record] = crawl.dead()
    assert broken in record["reason"]
    assert len(crawl.queued_ids()) == 1
    assert len(crawl.reserve("other", 1)) == 1


def test_a_live_workers_broken_holding_does_not_lose_the_seeds_another_takes(
    crawl: Crawl, client: redis.Redis
) -> None:
    """Leasing a seed reads every holding (is a copy of it leased?): one that is not a
    hash, of a worker whose deadline has not passed, is not set aside yet; the seeds
    taken must still be leased, not popped and dropped."""
    client.rpush(crawl.seeds, b"https://example.com/1", b"https://example.com/2")
    client.set(crawl.keys.holding("broken"), b"junk")
    client.zadd(crawl.keys.holders, {"broken": time.time() + 60})
    leases = crawl.reserve("a", 2, origin=FROM_SEEDS, take="lpop")
    assert sorted(entry for _, _, entry in leases) == [
        b"https://example.com/1",
        b"https://example.com/2",
    ]
    assert len(crawl.held("a")) == 2


def test_a_broken_holders_zset_is_set_aside_and_rebuilt_from_the_holdings(
    crawl: Crawl, client: redis.Redis
) -> None:
    """The holders zset overwritten by hand: every reserve, renewal and count failed on
    it for good (the crawl stalled, its workers warning four times a second). The next
    reserve renames it out of the way with a dead-letter record naming it and rebuilds
    the index from the holdings there, each one lease away (keys set aside, and those of
    a job named ``holders``, left out): a gone worker's leases are reclaimed when that
    passes, nothing is lost. A renewal meanwhile does not fail on it."""
    gone, odd, new = "host:1:aaaaaa", "w*?[x]\\:2:bbbbbb", "host:3:cccccc"
    crawl.enqueue(5)
    gone_ids = _ids(crawl.reserve(gone, 2))
    live = _ids(crawl.reserve(odd, 1))  # (glob characters in its host name)
    client.set(crawl.keys.holding("host:9:eeeeee") + ":wrongtype", b"set aside before")
    job = RedisKeys.build(crawl.keys.crawl, job="holders")  # a job named "holders"
    client.hset(job.progress, "done", 1)
    client.hset(job.holding("host:4:dddddd"), "0000000000000009", "q|0|x")
    client.delete(crawl.keys.holders)
    client.set(crawl.keys.holders, b"junk")
    assert crawl.renew(odd, live) == []
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        crawl.progress()
    taken = _ids(crawl.reserve(new, 5, duration=30))
    assert len(taken) == 2
    assert client.get(crawl.keys.holders + ":wrongtype") == b"junk"
    [record] = crawl.dead()
    assert crawl.keys.holders + ":wrongtype" in record["reason"]
    assert "rebuilt from the 2 holding(s) found" in record["reason"]
    deadlines = dict(
        cast("list[tuple[bytes, float]]", client.zrange(crawl.keys.holders, 0, -1, withscores=True))
    )
    assert set(deadlines) == {gone.encode(), odd.encode(), new.encode()}
    assert all(time.time() < d < time.time() + 31 for d in deadlines.values()), deadlines
    assert leased_count(client, crawl.keys.crawl) == 5
    assert crawl.progress()[0] == "busy"
    crawl.expire(gone)
    back = _ids(crawl.reserve("host:5:ffffff", 5))
    assert sorted(back) == sorted(gone_ids)
    assert crawl.held(odd) == set(live)
    assert crawl.queued_ids() == []
    assert client.hget(job.holding("host:4:dddddd"), "0000000000000009") == b"q|0|x"


def test_every_worker_id_is_one_a_holders_rebuild_finds(client: redis.Redis) -> None:
    """WORKER_ID_PATTERN (what lua/_leases.lua rebuild_holders takes for a worker)
    matches the ids workers give themselves, and not a job's key names."""
    from scrapy_dist.frontier.registry import new_worker_id
    from scrapy_dist.frontier.wire import WORKER_ID_PATTERN

    find = "return string.find(ARGV[1], ARGV[2]) and 1 or 0"
    assert client.eval(find, 0, new_worker_id(), WORKER_ID_PATTERN) == 1
    for name in ("requests", "progress", "holders:host:1:aaaaaa", "host:1:aaaaaa:wrongtype"):
        assert client.eval(find, 0, name, WORKER_ID_PATTERN) == 0, name


def test_an_expired_holder_whose_holding_was_evicted_is_dropped(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(2)
    crawl.reserve("gone", 1)
    crawl.expire("gone")
    client.delete(crawl.keys.holding("gone"))  # evicted
    assert leased_count(client, crawl.keys.crawl) == 0
    assert len(crawl.reserve("a", 5)) == 1
    assert client.zscore(crawl.keys.holders, "gone") is None
    assert len(crawl.reserve("b", 5)) == 0


MALFORMED_RECORDS = [b"junk", b"q|not a number|x", b"q|nan|x", b"z|0|x", b"q|0", b""]


@pytest.mark.parametrize("record", MALFORMED_RECORDS)
def test_a_malformed_record_in_an_expired_holding_is_dead_lettered_not_a_stall(
    crawl: Crawl, client: redis.Redis, record: bytes
) -> None:
    """A lease record a reserve did not write (edited by hand) in the holding of a
    worker whose deadline passed: every reserve reclaims from it, so failing on it
    would stop every worker for good. It is dead-lettered whole, counted as dead, and
    the rest of the holding goes back to the queue."""
    crawl.enqueue(4)
    ids = _ids(crawl.reserve("gone", 3))
    client.hset(crawl.keys.holding("gone"), ids[0], record)
    crawl.expire("gone")
    leases = crawl.reserve("a", 10)
    assert len(leases) == 3  # the 2 reclaimed, and the one never leased
    assert set(ids[1:]) < set(_ids(leases))
    [dead] = crawl.dead()
    assert dead["data"] == record.decode()
    assert "malformed lease record" in dead["reason"]
    assert ids[0] in dead["reason"]
    assert client.hget(crawl.keys.progress, "dead") == b"1"
    assert client.exists(crawl.keys.holding("gone")) == 0
    assert crawl.deliveries() == {i: 2 for i in ids[1:]}


def test_a_malformed_record_of_a_previous_versions_lease_is_dead_lettered(
    crawl: Crawl, client: redis.Redis
) -> None:
    k = crawl.keys
    client.zadd(k.leases, {"0000000000000007": 1.0, "0000000000000008": 1.0})
    client.hset(k.leased, "0000000000000007", b"q|0|w")  # no entry field
    client.hset(k.leased, "0000000000000008", b"q|0|w|0000000000000008{}")
    crawl.reserve("a", 0)
    [dead] = crawl.dead()
    assert dead["data"] == "q|0|w"
    assert "0000000000000007" in dead["reason"]
    assert crawl.queued_ids() == ["0000000000000008"]
    assert client.exists(k.leases, k.leased) == 0


@pytest.mark.parametrize("outcome", ["ValueError: x", HAND_BACK])
def test_settling_a_malformed_record_dead_letters_it_and_settles_the_rest(
    crawl: Crawl, client: redis.Redis, outcome: str
) -> None:
    crawl.enqueue(3)
    ids = _ids(crawl.reserve("w", 3))
    client.hset(crawl.keys.holding("w"), ids[0], b"junk")
    assert crawl.settle("w", [(i, outcome) for i in ids]) == (
        [0, 2, 1, 0, 0] if outcome != HAND_BACK else [0, 0, 1, 2, 0]
    )
    [dead] = crawl.dead()
    assert dead["data"] == "junk"
    assert sorted(crawl.queued_ids()) == sorted(ids[1:])
    assert crawl.held("w") == set()


def test_a_malformed_record_settled_as_done_is_just_done(crawl: Crawl) -> None:
    crawl.enqueue(1)
    [lease] = _ids(crawl.reserve("w", 1))
    crawl.client.hset(crawl.keys.holding("w"), lease, b"junk")
    assert crawl.settle("w", [(lease, DONE)]) == [1, 0, 0, 0, 0]
    assert crawl.dead() == []


def test_a_release_dead_letters_a_malformed_record_and_a_broken_level(
    crawl: Crawl, client: redis.Redis
) -> None:
    """release.lua hands back what the worker does not know it holds: a record it
    cannot parse is dead-lettered, and a level that is not a list (written by hand) is
    set aside with a dead-letter record naming it, as reserve and settle do; nothing
    is renamed or dropped silently."""
    crawl.enqueue(3)
    ids = _ids(crawl.reserve("w", 3))
    client.hset(crawl.keys.holding("w"), ids[0], b"junk")
    level = level_key(crawl.queue, "0")
    client.delete(level)
    client.set(level, b"not a list")
    assert crawl.release("w") == 2
    reasons = sorted(record["reason"] for record in crawl.dead())
    assert len(reasons) == 2
    assert any("malformed lease record" in r for r in reasons)
    assert any(level in r and "wrongtype" in r for r in reasons)
    assert client.hget(crawl.keys.progress, "dead") == b"2"
    assert client.get(level + ":wrongtype") == b"not a list"
    assert sorted(crawl.queued_ids()) == sorted(ids[1:])


def _oom(call: Any) -> bool:
    """Run ``call``; True if Redis refused it for want of memory."""
    try:
        call()
    except redis.exceptions.ResponseError as e:
        if not re.search(OOM_REFUSED, str(e)):
            raise
        return True
    return False


def test_out_of_memory_refusals_lose_nothing(server: RedisServer, name: str) -> None:
    """With maxmemory reached (noeviction), a script either runs whole or is refused
    before its first write: every entry stays in exactly one place."""
    client = server.client()
    crawl = Crawl(client, name)
    crawl.enqueue(40)
    ids = _ids(crawl.reserve("a", 10))
    crawl.reserve("b", 10)
    crawl.expire("b")
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        refused = {
            "enqueue": _oom(lambda: crawl.enqueue(5, start=100)),
            "reserve": _oom(lambda: crawl.reserve("a", 5)),  # b's reclaimed, 5 taken
            "reserve nothing": _oom(lambda: crawl.reserve("c", 0)),
            "renew": _oom(lambda: crawl.renew("a", ids)),
            "settle failed": _oom(lambda: crawl.settle("a", [(ids[0], "ValueError: x")])),
            "settle done": _oom(lambda: crawl.settle("a", [(ids[1], DONE)])),
            "hand back": _oom(lambda: crawl.settle("a", [(ids[2], HAND_BACK)])),
            "release": _oom(lambda: crawl.release("a", ids[3:])),
            "progress": _oom(crawl.progress),
        }
    finally:
        client.config_set("maxmemory", 0)
    assert refused["enqueue"]  # nothing written yet when it would grow the queue
    assert not refused["settle done"]  # a deletion first: it runs
    places = crawl.where()
    done = int(client.hget(crawl.keys.progress, "done") or 0)
    assert len(places) + done == 40
    assert all(len(p) == 1 for p in places.values()), places
    assert client.scard(crawl.filter) == 40  # the refused enqueue recorded no token
    client.close()


# -- 6. worker ids with odd characters ----------------------------------------------------

ODD_IDS = ["host:1:ab", "a|b|c", "with space", "ünï©ødé 🕷", "{tag}", "w*?[x]\\", ""]


@pytest.mark.parametrize("odd", ODD_IDS)
def test_a_worker_id_with_odd_characters_holds_renews_and_is_reclaimed(
    crawl: Crawl, client: redis.Redis, odd: str
) -> None:
    crawl.enqueue(4)
    ids = _ids(crawl.reserve(odd, 3))
    assert holdings(client, crawl.keys.crawl) == {
        odd: {i: client.hget(crawl.keys.holding(odd), i) for i in ids}
    }
    assert crawl.renew(odd, ids) == []
    crawl.settle(odd, [(ids[0], DONE)])
    crawl.expire(odd)
    assert len(crawl.reserve("other", 1, reclaim_limit=1)) == 1  # one of the two back
    [left] = crawl.held(odd)
    assert crawl.settle(odd, [(i, "ValueError: x") for i in ids[1:]]) == [0, 1, 0, 0, 1]
    assert crawl.held(odd) == set()
    assert left in crawl.queued_ids()
    client.zadd(crawl.keys.holders, {odd: 1.0})
    crawl.reserve(odd, 1)  # the worker takes one more, then expires at the limit
    crawl.settle("other", [(i, DONE) for i in crawl.held("other")])
    for _ in range(3):
        crawl.expire(odd)
        crawl.reserve("other", 0)
        crawl.reserve(odd, 5)
    crawl.expire(odd)
    crawl.reserve("other", 0)
    assert {record["worker"] for record in crawl.dead()} <= {odd}
    assert leased_count(client, crawl.keys.crawl) == 0
    assert client.exists(crawl.keys.holding(odd)) == 0
    assert all(len(p) == 1 for p in crawl.where().values())


def test_delete_keys_leaves_no_holding_of_a_worker_that_reserves_meanwhile(
    make_crawler: Any, client: redis.Redis, redis_url: str, name: str
) -> None:
    """delete_keys reads the holders, then unlinks their holdings and the zset: a
    worker whose reserve lands in between must not leave a holding that no holders
    zset names (it has no expiry: it would stay for good)."""
    import threading

    from scrapy_dist.testing.engine import HeldRequests

    held = HeldRequests(make_crawler({"SCHEDULER_FLUSH_INTERVAL": 0}))
    other = redis.Redis.from_url(redis_url)
    racer = Crawl(other, name)
    racer.queue = held.frontier.queue.key
    stop = threading.Event()

    def reserve_in_a_loop() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            racer.enqueue(1, start=n)
            racer.reserve(f"w{n}", 1)
            time.sleep(0.001)  # a busy crawl, not one reserve after another

    thread = threading.Thread(target=reserve_in_a_loop)
    thread.start()
    try:
        for _ in range(100):
            held.frontier.delete_keys()
    finally:
        stop.set()
        thread.join()
        held.close()
    held.frontier.delete_keys()  # nothing reserves now: every holding must go
    crawl = Crawl(client, name)
    assert _holding_keys(client, crawl) == []
    other.close()


def test_odd_worker_ids_leave_no_holding_after_delete_keys_or_completion(
    make_crawler: Any, client: redis.Redis, name: str
) -> None:
    from scrapy_dist.testing.engine import HeldRequests

    held = HeldRequests(make_crawler({"SCHEDULER_FLUSH_INTERVAL": 0}))
    try:
        crawl = Crawl(client, name)
        crawl.queue = held.frontier.queue.key
        crawl.enqueue(len(ODD_IDS))
        for odd in ODD_IDS:
            crawl.reserve(odd, 1)
        assert leased_count(client, crawl.keys.crawl) == len(ODD_IDS)
        held.frontier.delete_keys()
        assert _holding_keys(client, crawl) == []

        crawl.enqueue(len(ODD_IDS), start=100)
        for odd in ODD_IDS:
            [(lease, _, _)] = crawl.reserve(odd, 1)
            assert crawl.progress()[0] == "busy"
            crawl.settle(odd, [(lease, DONE)])
        assert crawl.progress(clear=True)[0] == "finished"
        assert _holding_keys(client, crawl) == []
    finally:
        held.close()


# -- 7. Redis Cluster: a holding is in its crawl's slot ------------------------------------


def test_every_holding_is_in_the_crawls_slot() -> None:
    keys = RedisKeys.build("books", hash_tag=True)
    slot = crawl_slot(keys)
    assert {slot_of(keys.holding(odd)) for odd in ODD_IDS} == {slot}
    job = RedisKeys.build("books", job="{run}", hash_tag=True)  # a tag of its own
    assert {slot_of(job.holding(odd)) for odd in ODD_IDS} == {crawl_slot(job)}


@pytest.mark.redis_server
def test_holdings_are_reclaimed_counted_and_cleared_on_a_cluster(
    redis_cluster: ClusterServers, name: str
) -> None:
    """The scripts read other workers' holdings (not in their KEYS): on a cluster they
    must be in the slot of the keys the call names."""
    from scrapy.settings import Settings

    from scrapy_dist.connection import client_from_config, crawl_client
    from scrapy_dist.settings import connection_config

    redis_cluster.wait_ok()
    config = connection_config(Settings({"REDIS_STARTUP_NODES": redis_cluster.startup_nodes}))
    client = client_from_config(config)
    keys = RedisKeys.build(name, hash_tag=True)
    node = crawl_client(client, keys)
    crawl = Crawl(node, name, hash_tag=True)
    try:
        crawl.enqueue(2 * len(ODD_IDS))
        for odd in ODD_IDS:
            crawl.reserve(odd, 2)
        for odd in ODD_IDS:
            crawl.expire(odd)
        assert leased_count(node, crawl.keys.crawl) == 2 * len(ODD_IDS)
        assert crawl.reserve("other", 0, reclaim_limit=len(ODD_IDS)) == []
        leases = crawl.reserve("other", 100)
        assert len(leases) == 2 * len(ODD_IDS)
        crawl.settle("other", [(i, DONE) for i in _ids(leases)])
        assert crawl.progress(clear=True)[0] == "finished"
        assert node.exists(crawl.keys.holders, *map(crawl.keys.holding, ODD_IDS)) == 0
        # a holders key overwritten by hand is rebuilt from the holdings in the slot
        workers = [f"{odd}:1:abcdef" for odd in ODD_IDS if ":" not in odd]
        crawl.enqueue(len(workers), start=100)
        for worker in workers:
            crawl.reserve(worker, 1)
        node.delete(crawl.keys.holders)
        node.set(crawl.keys.holders, b"junk")
        assert crawl.reserve("other", 1) == []
        assert leased_count(node, crawl.keys.crawl) == len(workers)
        assert set(node.zrange(crawl.keys.holders, 0, -1)) == {w.encode() for w in workers}
    finally:
        for key in node.scan_iter(match=f"*{name}*"):
            node.unlink(key)
        client.close()


# -- a worker that gets back the page it was found to have lost ----------------------------


def test_a_page_taken_over_after_it_finished_is_settled_when_its_worker_gets_it_again(
    make_crawler: Any, client: redis.Redis, name: str
) -> None:
    """The worker finished a page; its ack waits behind the page's children (batched
    writes). Paused past its deadline, the page is reclaimed: the children are
    refused, the ack dropped. The page's entry comes back, and to this worker (same
    lease id): it must be settled when it finishes this time, else the worker keeps it
    leased, renewing it with the rest, and the crawl never finishes."""
    from scrapy import Request

    from scrapy_dist.testing.engine import HeldRequests

    w = HeldRequests(
        make_crawler(
            {"SCHEDULER_FLUSH_INTERVAL": 0.1, "SCHEDULER_PREFETCH": 1, "SCHEDULER_PERSIST": True}
        )
    )
    try:
        w.frontier.eager = False
        crawl = Crawl(client, name)
        crawl.queue = w.frontier.queue.key
        w.scheduler.enqueue_request(Request("https://example.com/parent"))
        w.frontier.flush()
        parent = w.take()
        assert parent is not None
        w.returns(parent, Request("https://example.com/child"))
        w.finish(parent)  # its ack waits behind the child
        crawl.expire(w.frontier.worker_id)
        crawl.reserve("other", 0)  # the parent goes back to the queue
        w.frontier.flush()  # the child is refused: the parent was taken over
        assert w.scheduler.stats.get_value("scheduler/leases/taken_over") == 1
        again = w.take()
        assert again is not None
        assert again.url == "https://example.com/parent"
        w.finish(again)
        w.frontier.flush()
        assert leased_count(client, crawl.keys.crawl) == 0
        assert client.hget(crawl.keys.progress, "done") == b"1"
    finally:
        w.close()


def test_children_of_a_page_given_back_to_its_worker_are_not_dropped(
    make_crawler: Any, client: redis.Redis, name: str
) -> None:
    """A page in the engine is taken back (its renewal finds it lost: its request is
    marked taken over) and its entry comes back to the same worker at once (reclaimed
    entries go back at the head of the queue). The children of the new delivery must
    be queued: its ack settles the page, so nobody would queue them. The new delivery
    waits (held, renewed) until the earlier one has left the engine."""
    from scrapy import Request

    from scrapy_dist.testing.engine import HeldRequests

    w = HeldRequests(
        make_crawler(
            {"SCHEDULER_FLUSH_INTERVAL": 0, "SCHEDULER_PREFETCH": 1, "SCHEDULER_PERSIST": True}
        )
    )
    try:
        crawl = Crawl(client, name)
        crawl.queue = w.frontier.queue.key
        w.scheduler.enqueue_request(Request("https://example.com/parent"))
        first = w.take()
        assert first is not None
        crawl.expire(w.frontier.worker_id)
        crawl.reserve("other", 0)  # the page goes back to the queue
        w.scheduler.deliveries.renew()  # lost: the request in the engine is marked
        assert w.take() is None  # granted again, deferred behind the earlier delivery
        deliveries = w.scheduler.deliveries
        [lease_id] = deliveries.deferred
        assert lease_id in deliveries.held()  # renewed meanwhile
        w.returns(first, Request("https://example.com/dropped"))  # taken over: dropped
        w.finish(first)  # not settled (another delivery holds the lease)
        again = w.take()
        assert again is not None
        assert again.url == first.url
        assert not deliveries.deferred
        w.returns(again, Request("https://example.com/child"))
        w.finish(again)
        w.frontier.flush()
        assert client.hget(crawl.keys.progress, "done") == b"1"
        assert len(crawl.queued_ids()) == 1  # the child
    finally:
        w.close()


# -- 8. a script that fails after it wrote keeps what it wrote (Redis rolls nothing back)


@pytest.mark.parametrize("count", [b"junk", b"nan", b"-inf", b"1.5"])
def test_a_delivery_count_that_is_not_a_count_does_not_lose_what_a_reserve_took(
    crawl: Crawl, client: redis.Redis, count: bytes
) -> None:
    """A delivery count written by hand: a reserve that took its entry failed on it
    after popping the whole batch, and the pops stayed (every entry of the batch lost).
    It is read as any other script reads it (one delivery), and the batch is leased."""
    crawl.enqueue(3)
    ids = sorted(crawl.queued_ids())
    client.hset(crawl.keys.deliveries, ids[1], count)
    leases = crawl.reserve("w", 3)
    assert {lease_id: times for lease_id, times, _ in leases} == {
        ids[0]: 1,
        ids[1]: 2,
        ids[2]: 1,
    }
    assert crawl.held("w") == set(ids)
    assert crawl.deliveries() == {ids[1]: 2}


def _break_deliveries(crawl: Crawl) -> None:
    crawl.client.delete(crawl.keys.deliveries)
    crawl.client.set(crawl.keys.deliveries, b"junk")


def _deliveries_set_aside(crawl: Crawl, records: int = 1) -> None:
    aside = crawl.keys.deliveries + ":wrongtype"
    assert crawl.client.get(aside) == b"junk"
    reasons = [r["reason"] for r in crawl.dead() if crawl.keys.deliveries in r["reason"]]
    assert len(reasons) == 1
    assert aside in reasons[0]
    assert crawl.client.hget(crawl.keys.progress, "dead") == str(records).encode()


def test_a_deliveries_key_that_is_not_a_hash_does_not_drain_the_queue(
    crawl: Crawl, client: redis.Redis
) -> None:
    """A deliveries key of another type (written by hand): a reserve reclaiming an
    expired holding unlinked it, then failed reading the counts (the holding lost);
    one that took entries popped them, then failed (every reserve lost its batch, so
    the workers emptied the queue into nothing). It is renamed out of the way with a
    dead-letter record naming it, and the reserve goes on."""
    crawl.enqueue(5)
    gone = _ids(crawl.reserve("gone", 2))
    crawl.expire("gone")
    _break_deliveries(crawl)
    leases = crawl.reserve("a", 10)
    assert len(leases) == 5
    assert set(gone) < set(_ids(leases))
    assert client.exists(crawl.keys.holding("gone")) == 0
    _deliveries_set_aside(crawl)
    assert crawl.deliveries() == {i: 2 for i in gone}


def test_a_release_with_a_deliveries_key_that_is_not_a_hash_loses_nothing(
    crawl: Crawl, client: redis.Redis
) -> None:
    """release.lua took the leases out of the holding, then failed reading their
    counts: all of them lost."""
    crawl.enqueue(3)
    ids = _ids(crawl.reserve("w", 3))
    _break_deliveries(crawl)
    assert crawl.release("w") == 3
    assert sorted(crawl.queued_ids()) == sorted(ids)
    assert crawl.held("w") == set()
    _deliveries_set_aside(crawl)


def test_a_settle_with_a_deliveries_key_that_is_not_a_hash_buries_once(
    crawl: Crawl, client: redis.Redis
) -> None:
    """settle.lua dead-lettered a lease settled as dead now, then failed reading the
    count of the next one: the record stayed, the lease too, and the worker's next
    try dead-lettered it again."""
    crawl.enqueue(2)
    ids = _ids(crawl.reserve("w", 2))
    _break_deliveries(crawl)
    record = json.dumps({"kind": "seed", "data": "x", "reason": "bad"})
    outcomes = [(ids[0], DEAD_NOW + record), (ids[1], "ValueError: x")]
    assert crawl.settle("w", outcomes) == [0, 1, 2, 0, 0]
    assert crawl.settle("w", outcomes) == [0, 0, 0, 0, 2]
    assert [r["reason"] for r in crawl.dead()].count("bad") == 1
    assert crawl.queued_ids() == [ids[1]]
    _deliveries_set_aside(crawl, records=2)


def test_dead_because_buries_the_held_entry_once_with_its_reason_and_count(
    crawl: Crawl, client: redis.Redis
) -> None:
    """A callback that raised under SCHEDULER_CALLBACK_ERRORS = "dead": its held entry
    goes to the dead-letter list with the reason and its delivery count (2: its first
    holder was killed), acknowledged: never back in the queue, its count gone, and a
    second settlement of it (a repeated flush) finds nothing to settle."""
    crawl.enqueue(2)
    crawl.reserve("gone", 2)
    crawl.expire("gone")
    ids = _ids(crawl.reserve("w", 2))
    assert crawl.deliveries() == {i: 2 for i in ids}
    outcomes = [(ids[0], DEAD_BECAUSE + "ValueError: broken"), (ids[1], DONE)]
    assert crawl.settle("w", outcomes) == [1, 0, 1, 0, 0]
    [record] = crawl.dead()
    assert record["kind"] == "request"
    assert record["reason"] == "ValueError: broken"
    assert record["data"] == "payload 0"  # the payload, without the entry id
    assert record["deliveries"] == 2
    assert record["worker"] == "w"
    assert crawl.queued_ids() == []
    assert crawl.held("w") == set()
    assert crawl.deliveries() == {}
    assert crawl.settle("w", outcomes) == [0, 0, 0, 0, 2]
    assert len(crawl.dead()) == 1
    assert client.hget(crawl.keys.progress, "dead") == b"1"


def test_dead_because_into_a_dead_key_of_another_type_sets_it_aside(
    crawl: Crawl, client: redis.Redis
) -> None:
    """The dead-letter key written by hand as a string: the record goes into a fresh
    list after one naming the key set aside, the lease settled, nothing lost."""
    crawl.enqueue(1)
    [lease_id] = _ids(crawl.reserve("w", 1))
    client.set(crawl.keys.dead, b"oops")
    assert crawl.settle("w", [(lease_id, DEAD_BECAUSE + "KeyError: 'x'")]) == [0, 0, 2, 0, 0]
    aside, record = crawl.dead()
    assert crawl.keys.dead + ":wrongtype" in aside["reason"]
    assert record["reason"] == "KeyError: 'x'"
    assert client.get(crawl.keys.dead + ":wrongtype") == b"oops"
    assert crawl.held("w") == set()


@pytest.mark.parametrize("score", [b" 5", b"5 ", b"1e999", b"-1e999", b"1e-400"])
def test_a_record_whose_score_the_seeds_zset_refuses_is_dead_lettered_not_the_holding(
    crawl: Crawl, client: redis.Redis, score: bytes
) -> None:
    """A lease record edited by hand whose score reads as a number in Lua but not in
    ZADD: a reserve reclaiming its expired holding unlinked it, then failed putting
    the seed back (every seed of the holding lost). The record is dead-lettered whole,
    the rest goes back."""
    crawl.seeds_put_back = "zadd"
    urls = [b"https://example.com/%d" % i for i in range(3)]
    client.zadd(crawl.seeds, {url: i for i, url in enumerate(urls)})
    ids = _ids(crawl.reserve("gone", 3, origin=FROM_SEEDS, take="zpopmin"))
    client.hset(crawl.keys.holding("gone"), ids[0], b"s|" + score + b"|https://example.com/x")
    crawl.expire("gone")
    crawl.reserve("a", 0)
    [dead] = crawl.dead()
    assert "malformed lease record" in dead["reason"]
    assert client.zcard(crawl.seeds) == 2
    assert client.exists(crawl.keys.holding("gone")) == 0


def _seeds_added_as_a_set(crawl: Crawl) -> None:
    """The operator adds a seed with SADD to a list crawl whose seeds were all taken."""
    assert crawl.client.exists(crawl.seeds) == 0
    crawl.client.sadd(crawl.seeds, b"https://example.com/added")


def _seeds_set_aside(crawl: Crawl) -> None:
    aside = crawl.seeds + ":wrongtype"
    assert crawl.client.smembers(aside) == {b"https://example.com/added"}
    [reason] = [r["reason"] for r in crawl.dead() if crawl.seeds in r["reason"]]
    assert aside in reason


def test_seeds_of_another_type_do_not_lose_the_seeds_a_reserve_reclaims(
    crawl: Crawl, client: redis.Redis
) -> None:
    """A seeds key of another type than the crawl's (a set for a list crawl): a reserve
    reclaiming an expired holding unlinked it, then failed putting its seeds back
    (every one lost). The key is renamed out of the way first, with a dead-letter
    record naming it, and the seeds go back."""
    urls = [b"https://example.com/1", b"https://example.com/2"]
    client.rpush(crawl.seeds, *urls)
    crawl.reserve("gone", 2, origin=FROM_SEEDS, take="lpop")
    crawl.expire("gone")
    _seeds_added_as_a_set(crawl)
    crawl.reserve("a", 0)
    assert sorted(client.lrange(crawl.seeds, 0, -1)) == urls
    assert client.exists(crawl.keys.holding("gone")) == 0
    _seeds_set_aside(crawl)


def test_seeds_of_another_type_do_not_lose_the_seeds_a_release_hands_back(
    crawl: Crawl, client: redis.Redis
) -> None:
    urls = [b"https://example.com/1", b"https://example.com/2"]
    client.rpush(crawl.seeds, *urls)
    crawl.reserve("w", 2, origin=FROM_SEEDS, take="lpop")
    _seeds_added_as_a_set(crawl)
    assert crawl.release("w") == 2
    assert sorted(client.lrange(crawl.seeds, 0, -1)) == urls
    _seeds_set_aside(crawl)


def test_seeds_of_another_type_do_not_stop_a_settle_for_good(
    crawl: Crawl, client: redis.Redis
) -> None:
    client.rpush(crawl.seeds, b"https://example.com/1")
    [lease] = _ids(crawl.reserve("w", 1, origin=FROM_SEEDS, take="lpop"))
    _seeds_added_as_a_set(crawl)
    assert crawl.settle("w", [(lease, "ValueError: x")]) == [0, 1, 1, 0, 0]
    assert client.lrange(crawl.seeds, 0, -1) == [b"https://example.com/1"]
    _seeds_set_aside(crawl)


def _break_dead(crawl: Crawl) -> None:
    """The operator writes the dead-letter key as a hash."""
    crawl.client.hset(crawl.keys.dead, "note", b"by hand")


def _dead_set_aside(crawl: Crawl) -> list[dict[str, Any]]:
    """The hash written by hand is renamed out of the way, and the first record of the
    fresh list names it; returns the records after it."""
    aside = crawl.keys.dead + ":wrongtype"
    assert crawl.client.hgetall(aside) == {b"note": b"by hand"}
    first, *rest = crawl.dead()
    assert crawl.keys.dead in first["reason"]
    assert aside in first["reason"]
    return rest


def test_a_dead_letter_key_of_another_type_does_not_lose_a_reserves_batch(
    crawl: Crawl, client: redis.Redis
) -> None:
    """A dead-letter key of another type (written by hand): a reserve that popped a
    batch with an entry it dead-letters (pushed by hand without an id) failed on the
    RPUSH, after the pops (the whole batch lost). The key is renamed out of the way,
    the record naming it goes into the fresh list, and the batch is leased."""
    crawl.enqueue(2)
    ids = crawl.queued_ids()
    client.lpush(level_key(crawl.queue, "0"), b"no id")
    _break_dead(crawl)
    leases = crawl.reserve("w", 3)
    assert sorted(_ids(leases)) == sorted(ids)
    [malformed] = _dead_set_aside(crawl)
    assert malformed["data"] == "no id"
    assert client.hget(crawl.keys.progress, "dead") == b"2"


def test_a_dead_letter_key_of_another_type_does_not_lose_a_reclaimed_holding(
    crawl: Crawl, client: redis.Redis
) -> None:
    """A reserve reclaiming an expired holding with a malformed record unlinked the
    holding, then failed dead-lettering the record: every lease in it lost."""
    crawl.enqueue(3)
    ids = _ids(crawl.reserve("gone", 3))
    client.hset(crawl.keys.holding("gone"), ids[0], b"junk")
    crawl.expire("gone")
    _break_dead(crawl)
    crawl.reserve("a", 0)
    assert sorted(crawl.queued_ids()) == sorted(ids[1:])
    [malformed] = _dead_set_aside(crawl)
    assert malformed["data"] == "junk"
    assert client.exists(crawl.keys.holding("gone")) == 0


def test_a_dead_letter_key_of_another_type_does_not_lose_what_a_release_hands_back(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(3)
    ids = _ids(crawl.reserve("w", 3))
    client.hset(crawl.keys.holding("w"), ids[0], b"junk")
    _break_dead(crawl)
    assert crawl.release("w") == 2
    assert sorted(crawl.queued_ids()) == sorted(ids[1:])
    [malformed] = _dead_set_aside(crawl)
    assert malformed["data"] == "junk"
    assert client.hget(crawl.keys.progress, "dead") == b"2"


def test_a_dead_letter_key_of_another_type_does_not_stop_a_settle_for_good(
    crawl: Crawl, client: redis.Redis
) -> None:
    """settle.lua failed on the RPUSH of a lease past the delivery limit on every try:
    the worker's settles stopped for good."""
    crawl.max_deliveries = 1
    crawl.enqueue(2)
    ids = _ids(crawl.reserve("w", 2))
    _break_dead(crawl)
    assert crawl.settle("w", [(ids[0], "ValueError: x"), (ids[1], DONE)]) == [1, 0, 2, 0, 0]
    [failed] = _dead_set_aside(crawl)
    assert failed["data"] == "payload 0"
    assert crawl.held("w") == set()


def _settle_all(crawl: Crawl, n: int) -> None:
    crawl.enqueue(n)
    assert crawl.settle("w", [(i, DONE) for i in _ids(crawl.reserve("w", n))])[0] == n


@pytest.mark.parametrize("field", ["done", "dead", "run_base", "others_base"])
def test_a_progress_counter_that_is_not_a_number_does_not_hang_the_crawl(
    crawl: Crawl, client: redis.Redis, field: str
) -> None:
    """A counter or base of the progress hash written by hand: progress.lua did
    arithmetic on nil on every call, so the crawl was never reported finished. It
    reads as 0, reset, its text kept in "<field>:wrongtype"; the crawl is not finished
    while anything is queued, and is once it is empty."""
    _settle_all(crawl, 2)
    crawl.enqueue(1, start=2)
    client.hset(crawl.keys.progress, field, b"junk")
    assert crawl.progress(grace=0)[0] == "busy"
    _ids(crawl.reserve("w", 1))
    assert crawl.progress(grace=0)[0] == "busy"
    client.delete(crawl.keys.holding("w"))
    client.zrem(crawl.keys.holders, "w")
    client.hset(crawl.keys.progress, field, b"junk")
    assert crawl.progress(grace=0)[0] == "finished"
    assert client.hget(crawl.keys.progress, field + ":wrongtype") == b"junk"


def test_a_shard_counter_that_is_not_a_number_is_counted_as_0(
    crawl: Crawl, client: redis.Redis
) -> None:
    _settle_all(crawl, 2)
    client.hset(crawl.keys.progress, "dead", b"1.5x")
    k = crawl.keys
    assert crawl.census() == [0, 0, 2, 0, 0]
    assert client.hget(k.progress, "dead:wrongtype") == b"1.5x"


def test_a_settle_counts_past_a_done_counter_that_is_not_an_integer(
    crawl: Crawl, client: redis.Redis
) -> None:
    """settle.lua's HINCRBY failed after it had settled the leases: the call failed,
    so the worker's next try found them not its own (the counts lost, the crawl
    reported waiting). The counter restarts from the call's count, its text in a
    dead-letter record, and this run still counts what it settled."""
    _settle_all(crawl, 2)
    client.hset(crawl.keys.progress, mapping={"done": b"junk", "run_base": b"5"})
    crawl.enqueue(2, start=2)
    ids = _ids(crawl.reserve("w", 2))
    assert crawl.settle("w", [(ids[0], DONE), (ids[1], "ValueError: x")]) == [1, 1, 1, 0, 0]
    [record] = crawl.dead()
    assert record["data"] == "junk"
    assert "done" in record["reason"]
    progress = client.hgetall(crawl.keys.progress)
    assert progress[b"done"] == b"1"
    assert progress[b"dead"] == b"1"
    assert int(progress[b"run_base"]) < 2
    assert crawl.held("w") == set()


def test_a_reserve_does_not_lose_its_batch_on_a_dead_counter_that_is_not_an_integer(
    crawl: Crawl, client: redis.Redis
) -> None:
    """reserve.lua counted an entry it dead-lettered (pushed without an id) with an
    HINCRBY after the pops: on a counter written by hand it failed, the batch lost."""
    crawl.enqueue(2)
    ids = crawl.queued_ids()
    client.lpush(level_key(crawl.queue, "0"), b"no id")
    client.hset(crawl.keys.progress, "dead", b"junk")
    assert sorted(_ids(crawl.reserve("w", 3))) == sorted(ids)
    malformed, counter = crawl.dead()
    assert malformed["data"] == "no id"
    assert counter["data"] == "junk"
    assert client.hget(crawl.keys.progress, "dead") == b"2"


def _garble(client: redis.Redis, key: str, value: bytes | None) -> None:
    """``key`` written by hand: the string ``value``, or a list when None."""
    client.delete(key)
    if value is None:
        client.rpush(key, b"junk")
    else:
        client.set(key, value)


@pytest.mark.parametrize("value", [b"junk", b"1.5", b"-5", b"99999999999999999", None])
def test_a_sequence_counter_written_by_hand_is_restarted_above_every_id(
    crawl: Crawl, client: redis.Redis, value: bytes | None
) -> None:
    """enqueue.lua numbers entries with INCRBY on the sequence counter. One written by
    hand failed every enqueue (not an integer, another type: every batch the workers
    found dead-lettered as refused), or gave ids that are not ENTRY_ID_LEN digits (a
    negative one: every entry dead-lettered as malformed; 17 digits: its last digit read
    as part of the payload). It is renamed out of the way and restarts at the server's
    time in microseconds, above every id it gave."""
    crawl.enqueue(2)
    before = crawl.queued_ids()
    _garble(client, crawl.keys.seq, value)
    now_us = int(time.time() * 1_000_000)
    assert crawl.enqueue(3, start=2) == [1, 1, 1]
    ids = crawl.queued_ids()
    assert len(set(ids)) == 5
    assert all(len(i) == 16 and i.isdigit() for i in ids)
    assert all(int(i) > now_us - 10_000_000 for i in set(ids) - set(before))
    if value is not None:
        assert client.get(crawl.keys.seq + ":wrongtype") == value
    else:
        assert client.lrange(crawl.keys.seq + ":wrongtype", 0, -1) == [b"junk"]
    leases = crawl.reserve("w", 10)
    assert sorted(entry[16:] for _, _, entry in leases) == [b"payload %d" % i for i in range(5)]
    assert crawl.dead() == []
    assert crawl.enqueue(1, start=5) == [1]  # the restarted counter counts on
    assert int(crawl.queued_ids()[0]) == max(int(i) for i in ids) + 1


@pytest.mark.parametrize("where", ["queued", "leased"])
def test_a_sequence_counter_deleted_mid_crawl_gives_no_id_again(
    crawl: Crawl, client: redis.Redis, where: str
) -> None:
    """A sequence counter deleted by hand (or evicted: allkeys-* policies) restarted at
    1, giving the ids of entries still queued or leased again: one worker leasing two
    entries of one id kept one in its holding (HSET), and the other request was lost.
    A fresh counter starts at the server's time in microseconds, above every id given,
    a crawl's first enqueue too."""
    assert crawl.enqueue(2) == [1, 1]
    first = int(crawl.queued_ids()[0])
    assert crawl.queued_ids() == [f"{first:016d}", f"{first + 1:016d}"]
    assert abs(first / 1e6 - float(client.time()[0])) < 60  # the server's clock
    if where == "leased":
        parent = _ids(crawl.reserve("w", 1))[0]
        crawl.enqueue(1, start=2, worker="w", parent=parent)  # a child of a leased page
    client.delete(crawl.keys.seq)
    crawl.enqueue(3, start=5, worker="w")
    leases = crawl.reserve("w", 10)
    taken = sorted(entry[16:] for _, _, entry in leases)
    expected = {"queued": [0, 1, 5, 6, 7], "leased": [1, 2, 5, 6, 7]}[where]
    assert taken == [b"payload %d" % i for i in expected]
    assert len(crawl.held("w")) == len(expected) + (where == "leased")
    assert crawl.dead() == []


def test_a_sequence_counter_deleted_while_only_another_worker_holds_leases_gives_no_id_again(
    crawl: Crawl, client: redis.Redis
) -> None:
    """The queue empty, its entries leased by worker a, the counter deleted: worker b
    (holding nothing) enqueued with ids from 1, the ids of a's leases, and a leasing them
    overwrote its own leases (HSET): requests lost. Any fresh counter starts at the
    server's clock, whoever holds what."""
    assert crawl.enqueue(2) == [1, 1]
    held = _ids(crawl.reserve("a", 2))
    assert crawl.queued_ids() == []
    client.delete(crawl.keys.seq)
    assert crawl.enqueue(2, start=2) == [1, 1]  # by b: no holding, no parent
    assert not set(crawl.queued_ids()) & set(held)
    crawl.reserve("a", 2)
    assert len(crawl.held("a")) == 4
    assert crawl.dead() == []


def test_a_seed_copy_does_not_lose_the_seeds_taken_on_a_sequence_counter_written_by_hand(
    crawl: Crawl, client: redis.Redis
) -> None:
    """reserve.lua numbers a second copy of a leased seed with INCR on the sequence
    counter, after it popped the seeds: one written by hand failed the call, and the
    popped seeds were lost. The counter is set aside and restarted, with a dead-letter
    record naming it, and both copies are leased."""
    seed = b"https://example.com/twice"
    client.rpush(crawl.seeds, seed, seed, b"https://e.com/other")
    _garble(client, crawl.keys.seq, b"junk")
    leases = crawl.reserve("w", 3, origin=FROM_SEEDS, take="lpop")
    assert sorted(data for _, _, data in leases) == sorted([seed, seed, b"https://e.com/other"])
    assert len(set(_ids(leases))) == 3
    [record] = crawl.dead()
    assert crawl.keys.seq + ":wrongtype" in record["reason"]
    assert client.get(crawl.keys.seq + ":wrongtype") == b"junk"
    assert client.llen(crawl.seeds) == 0
    assert crawl.held("w") == set(_ids(leases))


def test_a_sequence_counter_written_by_hand_is_not_set_aside_under_out_of_memory(
    server: RedisServer, name: str
) -> None:
    """With maxmemory reached, an enqueue on a garbled counter is refused before its
    first write (the outbox keeps the batch), the counter left as it was."""
    client = server.client()
    crawl = Crawl(client, name)
    client.set(crawl.keys.seq, b"junk")
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.exceptions.ResponseError, match=OOM_REFUSED):
            crawl.enqueue(2)
    finally:
        client.config_set("maxmemory", 0)
    assert client.get(crawl.keys.seq) == b"junk"
    assert client.exists(crawl.keys.seq + ":wrongtype") == 0
    assert crawl.enqueue(2) == [1, 1]


def _break_progress(crawl: Crawl, how: str = "string") -> None:
    """The operator writes the progress hash as another type (a string, or a list)."""
    crawl.client.delete(crawl.keys.progress)
    if how == "string":
        crawl.client.set(crawl.keys.progress, b"junk")
    else:
        crawl.client.rpush(crawl.keys.progress, b"junk")


def _progress_set_aside(crawl: Crawl, suffix: str = ":wrongtype") -> str:
    """The key written by hand was renamed to ``<progress><suffix>``, and a fresh hash
    counts this run as having settled one (run_base -1); returns the new name."""
    aside = crawl.keys.progress + suffix
    assert crawl.client.type(aside) in (b"string", b"list")
    assert crawl.client.hget(crawl.keys.progress, "run_base") == b"-1"
    return aside


@pytest.mark.parametrize("how", ["string", "list"])
def test_a_reserve_does_not_lose_its_batch_on_a_progress_key_of_another_type(
    crawl: Crawl, client: redis.Redis, how: str
) -> None:
    """A progress key of another type (written by hand): reserve.lua counted an entry
    it dead-lettered (pushed without an id) with an HINCRBY after the pops, which
    failed with WRONGTYPE: the batch lost. The key is renamed out of the way, a record
    naming it pushed and counted, and the batch leased."""
    crawl.enqueue(2)
    ids = crawl.queued_ids()
    client.lpush(level_key(crawl.queue, "0"), b"no id")
    _break_progress(crawl, how)
    assert sorted(_ids(crawl.reserve("w", 3))) == sorted(ids)
    aside = _progress_set_aside(crawl)
    malformed, named = crawl.dead()
    assert malformed["data"] == "no id"
    assert aside in named["reason"]
    assert client.hget(crawl.keys.progress, "dead") == b"2"


def test_a_settle_counts_past_a_progress_key_of_another_type(
    crawl: Crawl, client: redis.Redis
) -> None:
    """settle.lua's HINCRBY failed with WRONGTYPE after it had settled the leases: the
    worker's next try found them not its own (the counts lost). Both ways of settling
    (the all-done fast path, and the one that reads records) count into a fresh hash;
    the emptied crawl then finishes after its grace, not waits."""
    crawl.enqueue(4)
    ids = _ids(crawl.reserve("w", 4))
    _break_progress(crawl)
    assert crawl.settle("w", [(ids[0], DONE), (ids[1], DONE)]) == [2, 0, 1, 0, 0]
    aside = _progress_set_aside(crawl)
    [named] = crawl.dead()
    assert aside in named["reason"]
    _break_progress(crawl, "list")  # again: the first name is taken
    assert crawl.settle("w", [(ids[2], DONE), (ids[3], "ValueError: x")]) == [1, 1, 1, 0, 0]
    _progress_set_aside(crawl, ":wrongtype:2")
    assert client.hgetall(crawl.keys.progress) == {
        b"run_base": b"-1",
        b"done": b"1",
        b"retried": b"1",
        b"dead": b"1",
    }
    assert crawl.progress(grace=0)[0] == "busy"  # the retried entry is queued again
    [last] = _ids(crawl.reserve("w", 1))
    assert crawl.settle("w", [(last, DONE)]) == [1, 0, 0, 0, 0]
    assert crawl.progress(grace=0)[0] == "finished"


def test_a_release_with_a_progress_key_of_another_type_loses_nothing(
    crawl: Crawl, client: redis.Redis
) -> None:
    """release.lua handed the leases back and dead-lettered a malformed record, then
    failed counting it: the call failed after its writes."""
    crawl.enqueue(3)
    ids = _ids(crawl.reserve("w", 3))
    client.hset(crawl.keys.holding("w"), ids[0], b"junk")
    _break_progress(crawl)
    assert crawl.release("w") == 2
    assert sorted(crawl.queued_ids()) == sorted(ids[1:])
    aside = _progress_set_aside(crawl)
    malformed, named = crawl.dead()
    assert malformed["data"] == "junk"
    assert aside in named["reason"]
    assert client.hget(crawl.keys.progress, "dead") == b"2"


def test_a_progress_key_of_another_type_does_not_hang_the_crawl(
    crawl: Crawl, client: redis.Redis
) -> None:
    """progress.lua failed with WRONGTYPE on every call (HDEL, HMGET), so the crawl was
    never reported finished. The key is set aside; the crawl is not finished while
    anything is queued or leased, and once emptied finishes after its grace (the
    crawl had counters, so something was settled), not waits for ever."""
    _settle_all(crawl, 2)
    crawl.enqueue(1, start=2)
    _break_progress(crawl)
    assert crawl.progress(grace=0)[0] == "busy"
    _progress_set_aside(crawl)
    [lease] = _ids(crawl.reserve("w", 1))
    _break_progress(crawl, "list")
    assert crawl.progress(grace=0)[0] == "busy"
    _progress_set_aside(crawl, ":wrongtype:2")
    client.delete(crawl.keys.holding("w"))  # dropped by hand: nothing settled since
    client.zrem(crawl.keys.holders, "w")
    assert lease not in crawl.where()
    assert crawl.progress(grace=60)[0] == "idle"
    _break_progress(crawl)
    assert crawl.progress(grace=0)[0] == "finished"
    _progress_set_aside(crawl, ":wrongtype:3")


def test_a_shard_progress_key_of_another_type_is_counted_as_0(
    crawl: Crawl, client: redis.Redis
) -> None:
    _settle_all(crawl, 2)
    _break_progress(crawl)
    assert crawl.census() == [0, 0, 0, 0, 0]
    _progress_set_aside(crawl)


def test_a_progress_key_of_another_type_is_set_aside_under_out_of_memory(
    server: RedisServer, name: str
) -> None:
    """With maxmemory reached (noeviction), a settle that deleted its leases goes on
    (Redis lets a script that wrote finish): the key is renamed, the counts kept. A
    progress check renames it too (RENAME is not refused), and reports the crawl busy
    as it is."""
    client = server.client()
    crawl = Crawl(client, name)
    crawl.enqueue(4)
    ids = _ids(crawl.reserve("w", 3))
    client.config_set("maxmemory-policy", "noeviction")
    for step in range(2):
        _break_progress(crawl)
        client.config_set("maxmemory", 1)
        try:
            if step == 0:
                assert crawl.settle("w", [(i, DONE) for i in ids]) == [3, 0, 1, 0, 0]
            else:
                assert crawl.progress(grace=0)[0] == "busy"
        finally:
            client.config_set("maxmemory", 0)
        _progress_set_aside(crawl, [":wrongtype", ":wrongtype:2"][step])
        if step == 0:
            assert client.hget(crawl.keys.progress, "done") == b"3"
    assert len(crawl.queued_ids()) == 1
    assert crawl.held("w") == set()
    client.close()


def _join(crawl: Crawl, worker: str = "w9", *, flush: bool = True) -> list[int]:
    """Worker ``worker`` opens (lua/join.lua), flushing the frontier if it is alone."""
    k = crawl.keys
    call = crawl.scripts.join(
        workers=k.workers,
        progress=k.progress,
        starts=k.starts,
        flush_keys=[*k.frontier(), crawl.filter],
        worker=worker,
        timeout=60,
        flush=flush,
        age=0,
    )
    return list(call.run())


def test_a_new_run_starts_past_a_progress_counter_that_is_not_a_number(
    crawl: Crawl, client: redis.Redis
) -> None:
    """join.lua added tonumber(done) + tonumber(dead) for a new run: nil arithmetic on
    a counter written by hand, after the flush had deleted the frontier (the worker
    failed to open; the next one flushed nothing, the run never started). It reads as
    0, reset, its text kept in "done:wrongtype"."""
    crawl.enqueue(1)
    client.hset(crawl.keys.progress, mapping={"done": b"junk", "dead": 2, "finished_at": 1.0})
    assert _join(crawl) == [0, 1, 1]
    progress = client.hgetall(crawl.keys.progress)
    assert progress[b"run_base"] == b"2"
    assert progress[b"done"] == b"0"
    assert progress[b"done:wrongtype"] == b"junk"
    assert b"finished_at" not in progress
    assert crawl.queued_ids() == []


def test_a_new_runs_base_is_written_as_a_whole_number(crawl: Crawl, client: redis.Redis) -> None:
    """tostring() wrote a base of 10^15 or more as "1e+15", which progress.lua then
    read rounded (and HINCRBY-style readers not at all)."""
    client.hset(crawl.keys.progress, mapping={"done": 10**15, "dead": 1, "finished_at": 1.0})
    assert _join(crawl, flush=False) == [0, 0, 1]
    assert client.hget(crawl.keys.progress, "run_base") == b"1000000000000001"


@pytest.mark.parametrize("text", [b"2026-11-23 18:00", b"nan", b"inf", b""])
def test_a_completion_time_that_is_not_a_number_starts_the_next_run(
    crawl: Crawl, client: redis.Redis, text: bytes
) -> None:
    """join.lua read a finished_at written by hand as no completion, so no new run
    started, and progress.lua then read the crawl as finished for ever: the next
    workers closed at once (tests/test_faults.py has the crawl). It is a finish at an
    unknown time: a new run starts, its text kept in "finished_at:wrongtype"."""
    client.hset(crawl.keys.progress, mapping={"done": 3, "finished_at": text})
    assert _join(crawl, flush=False) == [0, 0, 1]
    progress = client.hgetall(crawl.keys.progress)
    assert b"finished_at" not in progress
    assert progress[b"finished_at:wrongtype"] == text
    assert progress[b"run_base"] == b"3"
    assert crawl.progress(grace=0)[0] == "waiting"


def test_a_completion_time_written_by_hand_beside_a_live_worker_does_not_restart_the_run(
    crawl: Crawl, client: redis.Redis
) -> None:
    """With another worker alive, a finish at an unknown time may be a run still going:
    the joining worker joins it (no new run: its start requests are not queued again,
    its counts stay); the text is kept aside all the same."""
    _join(crawl, "w8")
    client.hset(crawl.keys.progress, mapping={"done": 40, "run_base": 10, "finished_at": b"junk"})
    client.sadd(crawl.keys.starts, b"fp")
    assert _join(crawl, flush=False) == [1, 0, 0]
    progress = client.hgetall(crawl.keys.progress)
    assert progress[b"run_base"] == b"10"
    assert b"finished_at" not in progress
    assert progress[b"finished_at:wrongtype"] == b"junk"
    assert client.smembers(crawl.keys.starts) == {b"fp"}


# what the scripts read as a number of the progress hash, as scrapy_dist.frontier.epoch reads it
STORED_NUMBERS = [
    (b"1795000000.25", 1795000000.25),
    (b" 5 ", 5.0),
    (b"1e5", 1e5),
    (b".5", 0.5),
    (b"5.", 5.0),
    (b"-3", -3.0),
    (b"0x10", None),
    (b"0x1p3", None),
    (b"1_000", None),
    (b"nan", None),
    (b"inf", None),
    (b"-inf", None),
    (b"1e999", None),
    (b"", None),
    (b".", None),
    (b"2026-11-23", None),
]


@pytest.mark.parametrize(("text", "number"), STORED_NUMBERS)
def test_a_gone_crawl_is_finished_for_the_scripts_and_workers_alike(
    crawl: Crawl, client: redis.Redis, text: bytes, number: float | None
) -> None:
    """progress.lua, its epoch gone, answered "finished" for any finished_at tonumber()
    takes (nan, inf, 0x10), the worker's why_gone for any float() takes (1_000): a
    worker closed quietly as finished, or another's frontier was called lost. Both now
    read one grammar (lua/_leases.lua decimal_of, scrapy_dist.frontier.epoch.stored_number)."""
    assert stored_number(text) == number
    client.hset(crawl.keys.progress, "finished_at", text)
    if number is None:  # joined a run whose epoch is gone
        with pytest.raises(redis.ResponseError, match=r"^EPOCH none expected E1"):
            crawl.progress(epoch="E1")
    else:
        assert crawl.progress(epoch="E1")[0] == "finished"


@pytest.mark.parametrize("text", [b"inf", b"nan", b"-inf", b"junk"])
def test_an_idle_time_written_by_hand_restarts_the_grace(
    crawl: Crawl, client: redis.Redis, text: bytes
) -> None:
    """progress.lua compared now - tonumber(idle_since) with the grace: "nan" and
    "-inf" finished the crawl at once, skipping the grace, and "inf" kept it idle for
    ever (never finished). It starts the grace again."""
    _settle_all(crawl, 1)
    client.hset(crawl.keys.progress, "idle_since", text)
    assert crawl.progress(grace=60)[0] == "idle"
    assert stored_number(client.hget(crawl.keys.progress, "idle_since")) is not None
    assert crawl.progress(grace=0)[0] == "finished"


@pytest.mark.parametrize("text", [b"yesterday", b"-inf"])
def test_a_completion_time_written_mid_run_does_not_finish_the_crawl(
    crawl: Crawl, client: redis.Redis, text: bytes
) -> None:
    """progress.lua read any finished_at as finished once nothing was queued, skipping
    the grace. One that is not a number is moved aside and the crawl judged without it:
    idle within the grace, finished after it."""
    _settle_all(crawl, 1)
    client.hset(crawl.keys.progress, "finished_at", text)
    assert crawl.progress(grace=60)[0] == "idle"
    assert client.hget(crawl.keys.progress, "finished_at:wrongtype") == text
    assert crawl.progress(grace=0)[0] == "finished"
    assert float(client.hget(crawl.keys.progress, "finished_at") or b"")


@pytest.mark.parametrize("beat", [b"junk", b"nan", b"inf", b""])
def test_a_heartbeat_that_is_not_a_number_counts_as_a_gone_worker(
    crawl: Crawl, client: redis.Redis, beat: bytes
) -> None:
    """join.lua compared tonumber(heartbeat) with the timeout: nil for a heartbeat
    written by hand (the worker failed to open), NaN or inf alive for ever (a flush at
    start never ran). It counts as a gone worker's: pruned."""
    crawl.enqueue(1)
    client.hset(crawl.keys.workers, mapping={"other": beat})
    assert _join(crawl) == [0, 1, 0]
    assert client.hkeys(crawl.keys.workers) == [b"w9"]
    assert crawl.queued_ids() == []


def test_a_worker_registry_of_another_type_is_set_aside_not_flushed_past(
    crawl: Crawl, client: redis.Redis
) -> None:
    """A worker registry written by hand as a string: every worker failed to open on
    the HGETALL. It is renamed out of the way ("<workers>:wrongtype", the next free
    name when taken); who is alive is unknown, so a flush at start does not run."""
    crawl.enqueue(1)
    client.set(crawl.keys.workers + ":wrongtype", b"taken")
    client.set(crawl.keys.workers, b"junk")
    assert _join(crawl) == [0, 0, 0]
    assert client.get(crawl.keys.workers + ":wrongtype:2") == b"junk"
    assert client.hkeys(crawl.keys.workers) == [b"w9"]
    assert len(crawl.queued_ids()) == 1
    assert _join(crawl, "w8") == [1, 0, 0]  # then as usual


def test_a_worker_registry_of_another_type_is_set_aside_by_the_next_heartbeat(
    crawl: Crawl, client: redis.Redis
) -> None:
    """heartbeat.lua and leave.lua failed on a registry written by hand (an error at
    every heartbeat), so until another worker joined, `status` refused the crawl
    (tests/test_faults.py has the crawl). The next heartbeat sets it aside and
    registers its worker again; a joining worker then sees it alive."""
    _join(crawl, "w8")
    client.delete(crawl.keys.workers)
    client.rpush(crawl.keys.workers, b"junk")
    crawl.scripts.heartbeat(workers=crawl.keys.workers, worker="w8").run()
    assert client.lrange(crawl.keys.workers + ":wrongtype", 0, -1) == [b"junk"]
    assert client.hkeys(crawl.keys.workers) == [b"w8"]
    assert _join(crawl, flush=True) == [1, 0, 0]  # w8 is alive: nothing flushed
    client.delete(crawl.keys.workers)
    client.set(crawl.keys.workers, b"junk")
    left = crawl.scripts.leave(workers=crawl.keys.workers, worker="w8", timeout=60).run()
    assert left == [0, 0]  # (live workers left, gone workers pruned)
    assert client.get(crawl.keys.workers + ":wrongtype:2") == b"junk"


def test_a_progress_key_of_another_type_does_not_fail_a_join_after_its_flush(
    crawl: Crawl, client: redis.Redis
) -> None:
    """join.lua read the progress hash after the flush: WRONGTYPE, the frontier deleted
    and the worker not registered. It is set aside before anything is written; with no
    other worker alive its worker starts a new run (see the test below)."""
    crawl.enqueue(1)
    _break_progress(crawl)
    assert _join(crawl) == [0, 1, 1]
    assert client.type(crawl.keys.progress + ":wrongtype") == b"string"
    assert client.hkeys(crawl.keys.workers) == [b"w9"]
    assert crawl.progress(grace=0)[0] == "waiting"


def test_a_worker_alone_past_a_progress_key_of_another_type_starts_a_new_run(
    crawl: Crawl, client: redis.Redis
) -> None:
    """A crawl that had finished, its progress hash then written by hand as a string
    (its completion mark gone with it): the fresh hash counted the next run as having
    settled one (run_base -1), so that run, empty until its seeds came, was marked
    finished within its grace and its workers closed, having crawled nothing. A worker
    alone starts a new run (nothing settled in it); with another worker alive the run
    goes on, counted as having settled one, as the scripts that count set it aside."""
    _settle_all(crawl, 2)
    assert crawl.progress(grace=0)[0] == "finished"
    _break_progress(crawl)
    assert _join(crawl, flush=False) == [0, 0, 1]
    assert client.hget(crawl.keys.progress, "run_base") == b"0"
    assert crawl.progress(grace=0)[0] == "waiting"
    assert client.get(crawl.keys.progress + ":wrongtype") == b"junk"
    _break_progress(crawl, "list")  # again, with w9 alive
    assert _join(crawl, "w1", flush=False) == [1, 0, 0]
    _progress_set_aside(crawl, ":wrongtype:2")
    assert crawl.progress(grace=0)[0] == "finished"


@pytest.mark.parametrize("beat", [b"junk", b"nan"])
def test_a_worker_leaves_past_a_heartbeat_that_is_not_a_number(
    crawl: Crawl, client: redis.Redis, beat: bytes
) -> None:
    """leave.lua failed on the nil compare after it had unregistered its worker (or
    counted a NaN heartbeat alive): pruned as in join.lua."""
    _join(crawl, "w1", flush=False)
    client.hset(crawl.keys.workers, "other", beat)
    call = crawl.scripts.leave(workers=crawl.keys.workers, worker="w1", timeout=60)
    assert call.run() == [0, 1]  # none live; the one with that heartbeat pruned as gone
    assert client.exists(crawl.keys.workers) == 0


def test_a_reserve_that_leases_work_takes_the_completion_mark_and_its_expiry_away(
    client: redis.Redis, name: str
) -> None:
    """A crawl marked finished (its progress hash given the post-completion expiry of
    SCHEDULER_PERSIST = False) that a worker leases work from again is busy: the mark,
    the idle clock and the expiry go, or a second run longer than the expiry lost its
    counters partway through. A reserve that leases nothing leaves them."""
    crawl = Crawl(client, name)
    progress = crawl.keys.progress
    client.hset(progress, mapping={"done": 5, "idle_since": 1.0, "finished_at": 2.0})
    client.expire(progress, 3600)
    assert crawl.reserve("w1", 5) == []
    assert client.hget(progress, "finished_at") == b"2.0"
    assert client.ttl(progress) > 0

    crawl.enqueue(2)
    assert len(crawl.reserve("w1", 5)) == 2
    assert client.hmget(progress, ["idle_since", "finished_at"]) == [None, None]
    assert client.ttl(progress) == -1
    assert client.hget(progress, "done") == b"5"


def test_a_crawl_finished_by_another_worker_is_no_fault_unless_writes_were_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every worker but the one that finishes a crawl finds it finished as it closes:
    with nothing of its own left to write, that is the normal end (INFO, no word of
    a fault); with writes dropped, a WARNING says how many."""
    args = {"crawl": "pages", "key": "pages:epoch", "epoch": "7", "found": None}
    with caplog.at_level("INFO", logger="scrapy_dist.frontier.epoch"):
        log_gone(FINISHED, {**args, "n": 0})
        log_gone(FINISHED, {**args, "n": 3})
    normal, dropped = caplog.records
    assert (normal.levelname, normal.getMessage()) == (
        "INFO",
        "Crawl pages was finished by another worker",
    )
    assert dropped.levelname == "WARNING"
    assert "finished without this worker" in dropped.getMessage()
    assert "dropped 3 pending write(s)" in dropped.getMessage()
