"""The frontier's scripts run one variadic command per call, not one per lease or per
request (``lua/_batch.lua``), with the same results as one command at a time: a batch
larger than a chunk, an entry or a token repeated inside one call, seeds leased twice."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_dist.scripts import DONE, FROM_QUEUE, FROM_SEEDS, ScriptCall, Scripts
from scrapy_dist.testing.queues import queued_count

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import redis

#: More than one chunk of lua/_batch.lua (1,000 arguments), and more arguments than
#: Lua's C stack takes in one unpack (8,000) for the two-per-lease commands.
HUGE = 4500


class Crawl:
    """The keys of one crawl, and the frontier's scripts called on them."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.scripts = Scripts(client)
        keys = ("queue", "seq", "epoch", "leases", "leased", "deliveries", "dead", "seeds")
        self.key = {k: f"{name}:{k}" for k in (*keys, "progress", "index", "filter")}

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
            leased=k["leased"],
            worker=worker,
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
    ) -> list[Any]:
        k = self.key
        reply = self.scripts.reserve(
            leases=k["leases"],
            leased=k["leased"],
            deliveries=k["deliveries"],
            dead=k["dead"],
            queue=k["queue"],
            seeds=k["seeds"],
            seq=k["seq"],
            progress=k["progress"],
            epoch_key=k["epoch"],
            index=k["index"],
            origin=origin,
            take=take,
            queue_put_back="level",
            seeds_put_back="lpush",
            count=count,
            duration=duration,
            worker="w",
            max_deliveries=max_deliveries,
            reclaim_limit=100,
            epoch="",
        ).run()
        return [reply[i : i + 3] for i in range(0, len(reply), 3)]

    def settle(self, outcomes: Iterable[tuple[str, str]], *, put_back: str = "level") -> list[int]:
        k = self.key
        call = self.scripts.settle(
            leases=k["leases"],
            leased=k["leased"],
            deliveries=k["deliveries"],
            dead=k["dead"],
            queue=k["queue"],
            seeds=k["seeds"],
            progress=k["progress"],
            epoch_key=k["epoch"],
            index=k["index"],
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
            leases=k["leases"],
            leased=k["leased"],
            epoch_key=k["epoch"],
            index=k["index"],
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
                leases=k["leases"],
                leased=k["leased"],
                deliveries=k["deliveries"],
                queue=k["queue"],
                seeds=k["seeds"],
                epoch_key=k["epoch"],
                index=k["index"],
                worker="w",
                queue_put_back="level",
                seeds_put_back="lpush",
                epoch="",
                known=list(known),
            ).run()
        )


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

    leases = crawl.reserve(HUGE)
    assert len(leases) == HUGE
    assert [payload[16:] for _, _, payload in leases] == [b"payload %d" % i for i in range(HUGE)]
    assert {times for _, times, _ in leases} == {1}
    ids = [lease_id.decode() for lease_id, _, _ in leases]
    assert client.zcard(crawl.key["leases"]) == HUGE
    assert client.hlen(crawl.key["leased"]) == HUGE
    assert client.hlen(crawl.key["deliveries"]) == HUGE
    assert client.scard(crawl.key["index"]) == HUGE

    assert crawl.renew(ids) == []
    assert crawl.release(ids) == 0
    assert crawl.settle((i, DONE) for i in ids) == [HUGE, 0, 0, 0, 0]
    for key in ("leases", "leased", "deliveries", "index"):
        assert client.exists(crawl.key[key]) == 0, key


def test_release_hands_back_a_batch_larger_than_a_chunk(crawl: Crawl, client: redis.Redis) -> None:
    crawl.enqueue(_entries(HUGE))
    leases = crawl.reserve(HUGE)
    kept = leases[0][0].decode()
    assert crawl.release([kept]) == HUGE - 1
    assert queued_count(client, crawl.key["queue"]) == HUGE - 1
    assert client.hlen(crawl.key["leased"]) == 1
    # handed back: not counted as a delivery
    assert sorted(client.hvals(crawl.key["deliveries"])) == [b"0"] * (HUGE - 1) + [b"1"]
    assert client.smembers(crawl.key["index"]) == {kept.encode()}


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
    assert (calls["hmget"], calls["hset"], calls["zadd"], calls["sadd"]) == (1, 2, 1, 1)

    ids = [lease_id.decode() for lease_id, _, _ in leases]
    calls = _calls(client, lambda: crawl.renew(ids))
    assert (calls["hmget"], calls["zadd"]) == (1, 1)
    calls = _calls(client, lambda: crawl.settle((i, DONE) for i in ids))
    assert calls.get("hget", 0) == 0
    assert (calls["hmget"], calls["srem"], calls["zrem"], calls["hdel"]) == (1, 1, 1, 2)


def test_an_entry_queued_twice_and_leased_in_one_call_counts_two_deliveries(
    crawl: Crawl, client: redis.Redis
) -> None:
    entry = b"0000000000000007payload"
    client.rpush(crawl.key["queue"], entry, entry)
    leases = crawl.reserve(2, take="lpop")
    assert leases == [[b"0000000000000007", 1, entry], [b"0000000000000007", 2, entry]]
    assert client.hget(crawl.key["deliveries"], "0000000000000007") == b"2"
    assert client.zcard(crawl.key["leases"]) == 1
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
    assert client.hlen(crawl.key["leased"]) == 2


def test_tokens_repeated_in_a_batch_and_refused_parents_decide_as_one_by_one(
    crawl: Crawl, client: redis.Redis
) -> None:
    client.sadd(crawl.key["filter"], b"old")
    client.hset(crawl.key["leased"], "p1", "q|0|w|0000000000000001x")  # ours
    client.hset(crawl.key["leased"], "p2", "q|0|other|0000000000000002x")  # not ours
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
    calls = _calls(client, lambda: crawl.reserve(0, max_deliveries=max_deliveries))
    assert calls.get("hget", 0) == 0
    assert (calls["hmget"], calls["zrem"], calls["hdel"]) == (2, 1, 2 if dead else 1)
    assert queued_count(client, crawl.key["queue"]) == queued
    assert client.llen(crawl.key["dead"]) == dead
    assert client.exists(crawl.key["leases"], crawl.key["leased"]) == 0
    assert client.hlen(crawl.key["deliveries"]) == queued  # kept while the entry is queued
    if dead:
        assert client.hget(crawl.key["progress"], "dead") == str(dead).encode()
        record = json.loads(client.lindex(crawl.key["dead"], 0) or b"")
        assert record["deliveries"] == 1
        assert record["data"] == "payload 0"
    else:  # delivered again: the second delivery of each
        assert {times for _, times, _ in crawl.reserve(60)} == {2}
