"""The frontier's scripts run one variadic command per call, not one per lease or per
request (``lua/_batch.lua``), with the same results as one command at a time: a batch
larger than a chunk, an entry or a token repeated inside one call, seeds leased twice,
the leases of a previous version's layout reclaimed."""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_dist.frontier.wire import DONE, FROM_QUEUE, FROM_SEEDS
from scrapy_dist.scripts import ScriptCall, Scripts
from scrapy_dist.testing.leases import deadline, leased_count
from scrapy_dist.testing.queues import queued_count, queued_entries

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import redis

#: More than one chunk of lua/_batch.lua (1,000 arguments), and more arguments than
#: Lua's C stack takes in one unpack (8,000) for the two-per-lease commands.
HUGE = 4500


class Crawl:
    """The keys of one crawl, and the frontier's scripts called on them by a worker
    (``"w"`` unless told)."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.scripts = Scripts(client)
        keys = ("queue", "seq", "epoch", "holders", "deliveries", "dead", "seeds", "progress")
        # "leases", "leased": the previous version's leases (only reclaimed and counted)
        self.key = {k: f"{name}:{k}" for k in (*keys, "filter", "leases", "leased")}
        #: the expired leases the last reserve put back (its reply's trailing count)
        self.returned = 0

    def holding(self, worker: str = "w") -> str:
        """The holding hash of worker ``worker`` (``RedisKeys.holding``)."""
        return f"{self.key['holders']}:{worker}"

    def enqueue(
        self,
        entries: Iterable[tuple[bytes, float, bytes]],
        *,
        kind: str = "levels",
        parents: list[str] | None = None,
        worker: str = "w",
    ) -> list[int]:
        k = self.key
        call = self.scripts.enqueue(
            queue=k["queue"],
            seq=k["seq"],
            epoch_key=k["epoch"],
            queue_kind=kind,
            filter_kind="set",
            filter_keys=[k["filter"]],
            filter_args=[0],
            entries=list(entries),
            holding=self.holding(worker),
            parents=parents or [],
        )
        return list(call.run())

    def reserve(
        self,
        count: int,
        *,
        origin: str = FROM_QUEUE,
        take: str = "levels",
        duration: float = 60.0,
        max_deliveries: int = 3,
        worker: str = "w",
    ) -> list[Any]:
        k = self.key
        reply = self.scripts.reserve(
            holders=k["holders"],
            holding=self.holding(worker),
            deliveries=k["deliveries"],
            dead=k["dead"],
            queue=k["queue"],
            seeds=k["seeds"],
            seq=k["seq"],
            progress=k["progress"],
            epoch_key=k["epoch"],
            previous=(k["leases"], k["leased"]),
            origin=origin,
            take=take,
            queue_put_back="level",
            seeds_put_back="lpush",
            count=count,
            duration=duration,
            worker=worker,
            max_deliveries=max_deliveries,
            reclaim_limit=100,
            epoch="",
        ).run()
        # the expired leases the call put back, when some: one trailing integer
        end = len(reply) - len(reply) % 3
        self.returned = reply[end] if end < len(reply) else 0
        return [reply[i : i + 3] for i in range(0, end, 3)]

    def settle(self, outcomes: Iterable[tuple[str, str]], *, put_back: str = "level") -> list[int]:
        k = self.key
        call = self.scripts.settle(
            holding=self.holding(),
            deliveries=k["deliveries"],
            dead=k["dead"],
            queue=k["queue"],
            seeds=k["seeds"],
            progress=k["progress"],
            epoch_key=k["epoch"],
            worker="w",
            queue_put_back=put_back,
            seeds_put_back="lpush",
            max_deliveries=3,
            epoch="",
            outcomes=list(outcomes),
        )
        return list(call.run())

    def renew(self, ids: Iterable[str]) -> list[bytes]:
        k = self.key
        call: ScriptCall = self.scripts.renew(
            holders=k["holders"],
            holding=self.holding(),
            epoch_key=k["epoch"],
            worker="w",
            duration=120.0,
            epoch="",
            lease_ids=list(ids),
        )
        return list(call.run())

    def release(self, known: Iterable[str]) -> int:
        k = self.key
        return int(
            self.scripts.release(
                holding=self.holding(),
                deliveries=k["deliveries"],
                queue=k["queue"],
                seeds=k["seeds"],
                epoch_key=k["epoch"],
                dead=k["dead"],
                progress=k["progress"],
                queue_put_back="level",
                seeds_put_back="lpush",
                epoch="",
                worker="w",
                known=list(known),
            ).run()
        )

    def leased(self) -> int:
        """The leases held in the crawl (``lua/leased.lua``)."""
        return leased_count(self.client, self.name)


@pytest.fixture
def crawl(client: redis.Redis, name: str) -> Crawl:
    return Crawl(client, name)


def _entries(n: int, start: int = 0) -> list[tuple[bytes, float, bytes]]:
    return [(b"fp%08d" % i, float(i), b"payload %d" % i) for i in range(start, start + n)]


def _calls(client: redis.Redis, run: Callable[[], object]) -> dict[str, int]:
    """The commands ``run`` made the server execute, by name (scripts' own included)."""

    def counts() -> dict[str, int]:
        stats = client.info("commandstats")
        return {name[len("cmdstat_") :]: int(v["calls"]) for name, v in stats.items()}

    before = counts()
    run()
    after = counts()
    return {c: n - before.get(c, 0) for c, n in after.items() if n != before.get(c, 0)}


def test_a_batch_larger_than_lua_can_unpack_is_enqueued_leased_renewed_and_settled(
    crawl: Crawl, client: redis.Redis
) -> None:
    assert crawl.enqueue(_entries(HUGE)) == [1] * HUGE
    assert queued_count(client, crawl.key["queue"]) == HUGE
    assert client.scard(crawl.key["filter"]) == HUGE
    assert crawl.enqueue(_entries(HUGE)) == [0] * HUGE  # every token recorded

    before = time.time()
    leases = crawl.reserve(HUGE)
    assert len(leases) == HUGE
    assert [payload[16:] for _, _, payload in leases] == [b"payload %d" % i for i in range(HUGE)]
    assert {times for _, times, _ in leases} == {1}
    ids = [lease_id.decode() for lease_id, _, _ in leases]
    assert client.hlen(crawl.holding()) == HUGE
    assert crawl.leased() == HUGE
    assert client.exists(crawl.key["deliveries"]) == 0  # first deliveries: no count
    assert client.zrange(crawl.key["holders"], 0, -1) == [b"w"]  # one deadline for all
    assert (deadline(client, crawl.name, "w") or 0) >= before + 59

    assert crawl.renew(ids) == []
    assert crawl.release(ids) == 0
    assert crawl.settle((i, DONE) for i in ids) == [HUGE, 0, 0, 0, 0]
    assert client.exists(crawl.holding(), crawl.key["deliveries"]) == 0
    assert crawl.leased() == 0


def test_release_hands_back_a_batch_larger_than_a_chunk(crawl: Crawl, client: redis.Redis) -> None:
    crawl.enqueue(_entries(HUGE))
    leases = crawl.reserve(HUGE)
    kept = leases[0][0].decode()
    assert crawl.release([kept]) == HUGE - 1
    assert queued_count(client, crawl.key["queue"]) == HUGE - 1
    assert client.hkeys(crawl.holding()) == [kept.encode()]
    # handed back: not counted as a delivery (no count: the next is a first delivery)
    assert client.exists(crawl.key["deliveries"]) == 0
    again = crawl.reserve(HUGE)
    assert len(again) == HUGE - 1
    assert {times for _, times, _ in again} == {1}


def test_each_script_runs_one_command_per_key_not_one_per_lease_or_request(
    crawl: Crawl, client: redis.Redis
) -> None:
    # one priority (a page's links share their depth): one LPUSH of the entries, one
    # ZADD of their level into the index
    one_level = [(fp, 0.0, payload) for fp, _, payload in _entries(50)]
    calls = _calls(client, lambda: crawl.enqueue(one_level))
    assert calls.get("sismember", 0) == 0
    assert (calls["smismember"], calls["lpush"], calls["zadd"], calls["sadd"]) == (1, 1, 1, 1)
    assert calls.get("type", 0) == 0
    # five priorities: one LPUSH per level (each checked first), still one ZADD
    five = [(fp, float(i % 5), payload) for i, (fp, _, payload) in enumerate(_entries(50, 50))]
    calls = _calls(client, lambda: crawl.enqueue(five))
    assert (calls["lpush"], calls["type"], calls["zadd"]) == (5, 5, 1)

    leases: list[Any] = []
    calls = _calls(client, lambda: leases.extend(crawl.reserve(50)))
    assert len(leases) == 50
    assert (calls["zrange"], calls["rpop"]) == (1, 1)  # the top level holds the 50
    assert calls.get("hincrby", 0) == 0
    # first deliveries: no count read or written; one HSET of the holding, one ZADD of
    # the worker's deadline
    assert calls.get("hmget", 0) == 0
    assert (calls["hset"], calls["zadd"]) == (1, 1)

    ids = [lease_id.decode() for lease_id, _, _ in leases]
    calls = _calls(client, lambda: crawl.renew(ids))
    assert (calls["hmget"], calls["zadd"]) == (1, 1)
    calls = _calls(client, lambda: crawl.settle((i, DONE) for i in ids))
    assert calls.get("hget", 0) == 0
    # all done, no count kept: one HDEL of the holding, no record read, no clock
    assert calls.get("hmget", 0) == 0
    assert calls.get("time", 0) == 0
    assert (calls["hdel"], calls["hincrby"]) == (1, 1)
    assert calls.get("zrem", 0) == 0
    # one failure among them: the records are read (one HMGET) to put it back
    more = [lease_id.decode() for lease_id, _, _ in crawl.reserve(3)]
    calls = _calls(
        client, lambda: crawl.settle([(more[0], "ValueError: x")] + [(i, DONE) for i in more[1:]])
    )
    # (and the count it now keeps makes the done ones' counts cleared: a second HDEL)
    assert (calls["hmget"], calls["hdel"]) == (1, 2)


def test_an_entry_queued_twice_and_leased_in_one_call_counts_two_deliveries(
    crawl: Crawl, client: redis.Redis
) -> None:
    entry = b"0000000000000007payload"
    client.rpush(crawl.key["queue"], entry, entry)
    leases = crawl.reserve(2, take="lpop")
    assert leases == [[b"0000000000000007", 1, entry], [b"0000000000000007", 2, entry]]
    assert client.hget(crawl.key["deliveries"], "0000000000000007") == b"2"
    assert client.hlen(crawl.holding()) == 1
    # settled twice in one call: the second finds the lease settled, no longer ours
    assert crawl.settle([("0000000000000007", DONE)] * 2) == [1, 0, 0, 0, 1]
    assert client.hexists(crawl.key["deliveries"], "0000000000000007") == 0


def test_a_seed_twice_in_one_reserve_gets_a_copy_id(crawl: Crawl, client: redis.Redis) -> None:
    client.rpush(crawl.key["seeds"], b"https://example.com/", b"https://example.com/")
    leases = crawl.reserve(2, origin=FROM_SEEDS, take="lpop")
    first, second = (lease_id.decode() for lease_id, _, _ in leases)
    assert first.startswith(FROM_SEEDS)
    assert ":" not in first
    assert second.startswith(first + ":")
    assert [times for _, times, _ in leases] == [1, 1]
    assert client.hlen(crawl.holding()) == 2


def test_tokens_repeated_in_a_batch_and_refused_parents_decide_as_one_by_one(
    crawl: Crawl, client: redis.Redis
) -> None:
    client.sadd(crawl.key["filter"], b"old")
    client.hset(crawl.holding("w"), "p1", "q|0|x")  # ours
    client.hset(crawl.holding("other"), "p2", "q|0|x")  # not ours
    client.zadd(crawl.key["holders"], {"w": time.time() + 60, "other": time.time() + 60})
    entries = [
        (b"a", 0.0, b"1"),  # new
        (b"a", 0.0, b"2"),  # repeated: seen
        (b"b", 0.0, b"3"),  # parent not ours: refused, its token not recorded
        (b"b", 0.0, b"4"),  # the same token with a parent we hold: new
        (b"old", 0.0, b"5"),  # seen before the call
        (b"", 0.0, b"6"),  # dont_filter
        (b"", 0.0, b"7"),  # dont_filter again
    ]
    parents = ["", "p1", "p2", "p1", "", "p2", ""]
    assert crawl.enqueue(entries, kind="list", parents=parents) == [1, 0, -1, 1, 0, -1, 1]
    queued = client.lrange(crawl.key["queue"], 0, -1)
    assert [e[16:] for e in queued] == [b"7", b"4", b"1"]  # LPUSH: the last one first
    assert client.smembers(crawl.key["filter"]) == {b"old", b"a", b"b"}


@pytest.mark.parametrize(("max_deliveries", "queued", "dead"), [(2, 60, 0), (1, 0, 60)])
def test_expired_leases_are_reclaimed_in_one_command_per_key(
    crawl: Crawl, client: redis.Redis, max_deliveries: int, queued: int, dead: int
) -> None:
    crawl.enqueue(_entries(60))
    assert len(crawl.reserve(60, duration=0.01)) == 60
    time.sleep(0.05)
    # another worker reclaims the whole holding (its own worker would too)
    calls = _calls(client, lambda: crawl.reserve(0, max_deliveries=max_deliveries, worker="w2"))
    assert calls.get("hget", 0) == 0
    assert calls.get("hmget", 0) == 0  # first deliveries: no count to read
    assert (calls["hgetall"], calls["unlink"], calls["zrem"]) == (1, 1, 1)
    # the returned keep their count (one HSET), the dead have none to clear
    assert (calls.get("hset", 0), calls.get("hdel", 0)) == (0 if dead else 1, 0)
    assert queued_count(client, crawl.key["queue"]) == queued
    assert client.llen(crawl.key["dead"]) == dead
    assert client.exists(crawl.holding(), crawl.key["holders"]) == 0
    assert crawl.leased() == 0
    assert client.hlen(crawl.key["deliveries"]) == queued  # kept while the entry is queued
    if dead:
        assert client.hget(crawl.key["progress"], "dead") == str(dead).encode()
        record = json.loads(client.lindex(crawl.key["dead"], 0) or b"")
        assert record["deliveries"] == 1
        assert record["data"] == "payload 0"
        assert "last held by w)" in record["reason"]
    else:  # delivered again: the second delivery of each, its count read and written once
        leases: list[Any] = []

        def again() -> None:
            leases.extend(crawl.reserve(60, duration=0.01, worker="w2"))

        calls = _calls(client, again)
        assert {times for _, times, _ in leases} == {2}
        assert (calls["hmget"], calls["hset"]) == (1, 2)  # deliveries, holding
        time.sleep(0.05)
        # expired again, at the limit: every count read with one HMGET, cleared with one HDEL
        calls = _calls(client, lambda: crawl.reserve(0, max_deliveries=2, worker="w3"))
        assert (calls["hmget"], calls["hdel"], calls.get("hset", 0)) == (1, 1, 0)
        assert client.llen(crawl.key["dead"]) == 60
        assert client.exists(crawl.key["deliveries"], crawl.holding("w2")) == 0


def test_a_previous_versions_expired_leases_are_counted_then_reclaimed(
    crawl: Crawl, client: redis.Redis
) -> None:
    """Leases written by the previous version (a leases zset and a leased hash, a count
    at every delivery) are counted as held until they expire, then reclaimed by any
    worker's reserve to where they came from, their delivery counts kept."""
    k = crawl.key
    seed = b"https://example.com/"
    seed_id = FROM_SEEDS + hashlib.sha1(seed).hexdigest()[:15]
    crawl.enqueue([(b"new", 0.0, b"new")])
    assert len(crawl.reserve(1)) == 1  # a lease of this version, in w's holding
    now = time.time()
    client.zadd(k["leases"], {"0000000000000001": now - 1, seed_id: now - 1})
    client.zadd(k["leases"], {"0000000000000002": now + 60})  # not expired yet
    client.hset(
        k["leased"],
        mapping={
            "0000000000000001": b"q|-3|old|0000000000000001first",
            seed_id: b"s|0|old|" + seed,
            "0000000000000002": b"q|0|old|0000000000000002second",
        },
    )
    client.hset(k["deliveries"], mapping={"0000000000000001": 1, seed_id: 2, "0000000000000002": 1})
    assert crawl.leased() == 4

    assert crawl.reserve(0, worker="w2") == []  # reclaims the two expired only
    assert crawl.returned == 2  # the reply's trailing count
    assert crawl.leased() == 2
    assert client.zrange(k["leases"], 0, -1) == [b"0000000000000002"]
    assert client.hkeys(k["leased"]) == [b"0000000000000002"]
    assert queued_entries(client, k["queue"]) == [b"0000000000000001first"]
    assert client.lrange(k["seeds"], 0, -1) == [seed]
    # delivered again: their counts go on from the previous version's
    [(lease_id, times, entry)] = crawl.reserve(5, worker="w2")
    assert (lease_id, times, entry) == (b"0000000000000001", 2, b"0000000000000001first")
    [(lease_id, times, entry)] = crawl.reserve(5, origin=FROM_SEEDS, take="lpop", worker="w2")
    assert (lease_id, times, entry) == (seed_id.encode(), 3, seed)
