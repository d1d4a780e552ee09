"""Attacks on the leases kept in one holding per worker (``lua/_leases.lua``): a
worker's leases in the hash ``<crawl>:holders:<worker>``, one deadline per worker in
the zset ``<crawl>:holders``. Each test drives the scripts on a real Redis and checks
that no entry is lost or held twice, that delivery counts match what
``SCHEDULER_MAX_DELIVERIES`` expects, that the crawl is not reported finished while
something is held, and that no holding is left behind."""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis

from scrapy_dist.keys import RedisKeys, level_key
from scrapy_dist.scripts import DONE, FROM_QUEUE, FROM_SEEDS, HAND_BACK, Scripts
from scrapy_dist.testing.leases import holdings, leased_count
from scrapy_dist.testing.queues import queued_count, queued_entries

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy_dist.testing.redis_server import RedisServer


class Crawl:
    """The keys of one crawl, and the lease scripts called on them by any worker."""

    def __init__(self, client: redis.Redis, name: str, *, max_deliveries: int = 3) -> None:
        self.client = client
        self.scripts = Scripts(client)
        self.keys = RedisKeys.build(name)
        self.queue = self.keys.requests
        self.seeds = self.keys.start_urls
        self.filter = self.keys.dupefilter
        self.max_deliveries = max_deliveries

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
            seeds_put_back="lpush",
            count=count,
            duration=duration,
            worker=worker,
            max_deliveries=self.max_deliveries,
            reclaim_limit=reclaim_limit,
            epoch="",
        ).run()
        return [(reply[i].decode(), reply[i + 1], reply[i + 2]) for i in range(0, len(reply), 3)]

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
            seeds_put_back="lpush",
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
                queue_put_back="level",
                seeds_put_back="lpush",
                epoch="",
                known=list(known),
            ).run()
        )

    def progress(self, *, clear: bool = False, grace: float = 0.0) -> list[Any]:
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
            epoch="",
        )
        return [v.decode() if isinstance(v, bytes) else v for v in call.run()]

    # -- reading the state ----------------------------------------------------------------

    def expire(self, worker: str) -> None:
        """Worker ``worker`` is paused past its deadline (its leases expired)."""
        assert self.client.zscore(self.keys.holders, worker) is not None
        self.client.zadd(self.keys.holders, {worker: 1.0})

    def held(self, worker: str) -> set[str]:
        return {i.decode() for i in self.client.hkeys(self.keys.holding(worker))}

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


def test_a_worker_never_reclaims_its_own_expired_holding(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(3)
    ids = _ids(crawl.reserve("w", 2))
    crawl.expire("w")
    [(third, times, _)] = crawl.reserve("w", 5)  # renews the two, takes the third
    assert times == 1
    assert crawl.held("w") == {*ids, third}
    deadline = client.zscore(crawl.keys.holders, "w")
    assert deadline is not None
    assert deadline > time.time()
    assert crawl.reserve("x", 0) == []
    assert crawl.held("w") == {*ids, third}


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
    assert client.sismember(crawl.filter, b"fp%08d" % 500) == 0  # its token not recorded


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
        [(x, delivered, _)] = crawl.reserve(f"w{times}", 1)
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


def test_cli_reset_deletes_every_holding(
    crawl: Crawl,
    client: redis.Redis,
    redis_url: str,
    name: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from scrapy_dist.cli import main

    _hold(crawl)
    client.set(crawl.keys.holding("w:ü"), b"junk")  # set aside by the next reserve
    client.zadd(crawl.keys.holders, {"w:ü": 1.0})
    crawl.reserve("w1", 0)
    assert client.exists(crawl.keys.holding("w:ü") + ":wrongtype") == 1
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    assert main(["reset", name, "--yes", "--redis-url", redis_url]) == 0, capsys.readouterr()
    assert _holding_keys(client, crawl) == []
    assert list(client.scan_iter(match=f"{name}*")) == []


def test_delete_keys_takes_every_holding(
    make_crawler: Any, client: redis.Redis, name: str
) -> None:
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


def test_a_broken_holders_zset_is_a_clear_refusal_that_loses_nothing(
    crawl: Crawl, client: redis.Redis
) -> None:
    crawl.enqueue(2)
    client.set(crawl.keys.holders, b"junk")
    for call in (
        lambda: crawl.reserve("w", 2),
        crawl.progress,
        lambda: leased_count(client, crawl.keys.crawl),
    ):
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            call()
    assert len(crawl.queued_ids()) == 2
    client.delete(crawl.keys.holders)
    assert len(crawl.reserve("w", 2)) == 2


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
