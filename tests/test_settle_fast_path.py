"""settle.lua's fast path (every outcome done, no deliveries hash: one HDEL of the
holding) replies and writes exactly what the general path does on the same state:
ids repeated in one call, ids not held (taken back by another worker), a malformed
record, a holding that is not a hash, calls larger than one chunk of lua/_batch.lua,
a deliveries hash that appears between two calls, and a server at maxmemory."""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis

from scrapy_dist.exceptions import redis_error_text
from scrapy_dist.frontier.wire import DONE, FROM_QUEUE
from scrapy_dist.lua_source import source
from scrapy_dist.scripts import Scripts

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy_dist.testing.redis_server import RedisServer

#: The fast path's block in settle.lua, from its comment to its return.
_FAST_PATH = re.compile(
    r"-- The common call: .*?return \{removed, 0, \w+, 0, n - removed\}\nend\n", re.DOTALL
)


def _general_path_source() -> str:
    """settle.lua without its fast path: every call takes the general path."""
    text, found = _FAST_PATH.subn("", source("settle"))
    assert found == 1, "settle.lua's fast path block moved: update the pattern"
    return text


class Crawl:
    """The keys of one crawl (prefix ``name``) and its scripts, both settle variants."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.scripts = Scripts(client)
        self.general = client.register_script(_general_path_source())
        names = ("queue", "seq", "epoch", "holders", "deliveries", "dead", "seeds", "progress")
        self.key = {k: f"{name}:{k}" for k in (*names, "filter", "leases", "leased")}

    def holding(self, worker: str = "w") -> str:
        return f"{self.key['holders']}:{worker}"

    def enqueue(self, n: int, start: int = 0) -> None:
        k = self.key
        entries = [
            (b"fp%08d" % i, float(i % 3), b"payload %d" % i) for i in range(start, start + n)
        ]
        self.scripts.enqueue(
            queue=k["queue"],
            seq=k["seq"],
            epoch_key=k["epoch"],
            queue_kind="levels",
            filter_kind="set",
            filter_keys=[k["filter"]],
            filter_args=[0],
            entries=entries,
        ).run()

    def reserve(self, count: int, *, worker: str = "w", duration: float = 60.0) -> list[str]:
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
            origin=FROM_QUEUE,
            take="levels",
            queue_put_back="level",
            seeds_put_back="lpush",
            count=count,
            duration=duration,
            worker=worker,
            max_deliveries=3,
            reclaim_limit=100,
            epoch="",
        ).run()
        return [reply[i].decode() for i in range(0, len(reply) - len(reply) % 3, 3)]

    def held(self, worker: str = "w") -> list[str]:
        keys = cast("list[bytes]", self.client.hkeys(self.holding(worker)))
        return [k.decode() for k in keys]

    def _settle_call(self, outcomes: list[tuple[str, str]]) -> Any:
        k = self.key
        return self.scripts.settle(
            holding=self.holding(),
            deliveries=k["deliveries"],
            dead=k["dead"],
            queue=k["queue"],
            seeds=k["seeds"],
            progress=k["progress"],
            epoch_key=k["epoch"],
            worker="w",
            queue_put_back="level",
            seeds_put_back="lpush",
            max_deliveries=3,
            epoch="",
            outcomes=outcomes,
        )

    def settle(self, outcomes: list[tuple[str, str]]) -> Any:
        """settle.lua as shipped; the reply, or the error it raised."""
        try:
            return list(self._settle_call(outcomes).run())
        except redis.ResponseError as e:
            return ("error", redis_error_text(e).split(" script:")[0])

    def settle_general(self, outcomes: list[tuple[str, str]]) -> Any:
        """settle.lua without its fast path; the reply, or the error it raised."""
        call = self._settle_call(outcomes)
        try:
            return list(self.general(keys=call.keys, args=call.args))
        except redis.ResponseError as e:
            return ("error", redis_error_text(e).split(" script:")[0])

    def snapshot(self) -> dict[bytes, bytes]:
        return {
            key: self.client.dump(key) or b""
            for key in self.client.scan_iter(match=f"{self.name}*", count=1000)
        }

    def restore(self, snap: dict[bytes, bytes]) -> None:
        for key in list(self.client.scan_iter(match=f"{self.name}*", count=1000)):
            self.client.delete(key)
        for key, dumped in snap.items():
            self.client.restore(key, 0, dumped)

    def state(self) -> dict[bytes, Any]:
        """Every key of the crawl, read by type (zset scores kept: no clock is read by a
        settle of done outcomes)."""
        c = self.client
        out: dict[bytes, Any] = {}
        for key in c.scan_iter(match=f"{self.name}*", count=1000):
            kind = c.type(key)
            if kind == b"hash":
                out[key] = c.hgetall(key)
            elif kind == b"list":
                out[key] = c.lrange(key, 0, -1)
            elif kind == b"set":
                out[key] = sorted(c.smembers(key))
            elif kind == b"zset":
                out[key] = c.zrange(key, 0, -1, withscores=True)
            else:
                out[key] = c.get(key) if kind == b"string" else kind
        return out

    def both(self, outcomes: list[tuple[str, str]]) -> tuple[Any, Any]:
        """Run both variants on the same state; assert they agree; leave the shipped
        variant's state. Returns (reply, state)."""
        snap = self.snapshot()
        general = self.settle_general(outcomes)
        general_state = self.state()
        self.restore(snap)
        shipped = self.settle(outcomes)
        shipped_state = self.state()
        assert shipped == general, outcomes
        assert shipped_state == general_state, outcomes
        return shipped, shipped_state


@pytest.fixture
def crawl(client: redis.Redis, name: str) -> Crawl:
    return Crawl(client, name)


def _done(ids: list[str]) -> list[tuple[str, str]]:
    return [(i, DONE) for i in ids]


def test_the_fast_path_is_the_path_taken(crawl: Crawl) -> None:
    # the pattern removes exactly the fast path: an all-done call on a fresh holding
    assert 'EXISTS", deliveries) == 0' not in _general_path_source()
    crawl.enqueue(4)
    ids = crawl.reserve(4)
    assert crawl.both(_done(ids))[0] == [4, 0, 0, 0, 0]
    assert int(crawl.client.hget(crawl.key["progress"], "done") or 0) == 4


def test_repeated_and_foreign_ids_reply_as_the_general_path(crawl: Crawl) -> None:
    crawl.enqueue(20)
    mine = crawl.reserve(8)
    theirs = crawl.reserve(6, worker="v")
    outcomes = _done([mine[0], mine[0], mine[1], theirs[0], "nope", mine[2], mine[1], ""])
    reply, state = crawl.both(outcomes)
    assert reply == [3, 0, 0, 0, 5]
    assert len(state[crawl.holding("v").encode()]) == 6  # another worker's: untouched
    # settled again: nothing is ours any more
    assert crawl.both(outcomes)[0] == [0, 0, 0, 0, 8]
    assert int(crawl.client.hget(crawl.key["progress"], "done") or 0) == 3


def test_a_malformed_record_settled_done_counts_as_done(crawl: Crawl) -> None:
    crawl.enqueue(3)
    ids = crawl.reserve(3)
    crawl.client.hset(crawl.holding(), ids[1], "garbage")
    crawl.client.hset(crawl.holding(), "handmade", "")
    assert crawl.both(_done([*ids, "handmade"]))[0] == [4, 0, 0, 0, 0]


def test_a_holding_that_is_not_a_hash_fails_both_paths_alike(crawl: Crawl) -> None:
    crawl.enqueue(3)
    ids = crawl.reserve(3)
    crawl.client.delete(crawl.holding())
    crawl.client.set(crawl.holding(), "x")
    reply, state = crawl.both(_done(ids))
    assert reply[0] == "error"
    assert b"done" not in state.get(crawl.key["progress"].encode(), {})  # nothing counted


def test_calls_larger_than_a_chunk_with_repeats_across_chunks(crawl: Crawl) -> None:
    crawl.enqueue(1500)
    ids = crawl.reserve(1500)
    rng = random.Random(7)
    outcomes = _done(ids[:1200] + ids[:300] + [f"x{i}" for i in range(50)])
    rng.shuffle(outcomes)
    assert crawl.both(outcomes)[0] == [1200, 0, 0, 0, 350]
    assert crawl.client.hlen(crawl.holding()) == 300


def test_a_deliveries_hash_that_appears_between_calls(crawl: Crawl) -> None:
    crawl.enqueue(10)
    ids = crawl.reserve(10)
    assert crawl.both(_done(ids[:3]))[0] == [3, 0, 0, 0, 0]  # no count kept: fast path
    # one fails: its count is kept, the deliveries hash appears
    assert crawl.both([(ids[3], "ValueError: x")])[0] == [0, 1, 0, 0, 0]
    assert crawl.client.hlen(crawl.key["deliveries"]) == 1
    # the rest, all done, now take the general path: the same reply and writes
    assert crawl.both(_done(ids[4:]))[0] == [6, 0, 0, 0, 0]
    again = crawl.reserve(1)  # the failed one, on its second delivery
    assert crawl.both(_done(again))[0] == [1, 0, 0, 0, 0]
    assert crawl.client.exists(crawl.key["deliveries"]) == 0  # its count cleared
    assert int(crawl.client.hget(crawl.key["progress"], "done") or 0) == 10
    assert int(crawl.client.hget(crawl.key["progress"], "retried") or 0) == 1


def test_random_states_reply_and_write_as_the_general_path(crawl: Crawl) -> None:
    rng = random.Random(20261124)
    crawl.enqueue(400)
    for _ in range(60):
        if crawl.client.hlen(crawl.holding()) < 10:
            crawl.reserve(rng.randint(5, 40))
        if rng.random() < 0.3:
            crawl.reserve(rng.randint(1, 5), worker="v")
        held = crawl.held()
        others = crawl.held("v")
        picked = rng.sample(held, rng.randint(0, len(held)))
        picked += rng.choices(picked or [""], k=rng.randint(0, 3))  # repeats
        picked += rng.sample(others, min(len(others), rng.randint(0, 2)))
        picked += [f"gone{rng.randint(0, 9)}" for _ in range(rng.randint(0, 2))]
        rng.shuffle(picked)
        outcomes = _done(picked)
        if rng.random() < 0.2 and outcomes:
            outcomes[rng.randrange(len(outcomes))] = (picked[0], "Boom: x")
        crawl.both(outcomes)
        if crawl.client.llen(crawl.key["dead"]):
            crawl.client.delete(crawl.key["dead"])  # (dead records carry server time)


@pytest.fixture
def small_server(tmp_path: Any) -> Iterator[RedisServer]:
    from scrapy_dist.testing.redis_server import RedisServer

    with RedisServer(directory=tmp_path, extra_args=["--maxmemory-policy", "noeviction"]) as s:
        yield s


def test_at_maxmemory_the_fast_path_settles_and_counts_as_the_general_path(
    small_server: RedisServer,
) -> None:
    client = small_server.client()
    crawl = Crawl(client, "oom")
    crawl.enqueue(30)
    ids = crawl.reserve(30)
    snap = crawl.snapshot()
    results = []
    for settle in (crawl.settle_general, crawl.settle):
        crawl.restore(snap)
        client.config_set("maxmemory", "1")  # far below what is used: every write refused
        try:
            reply = settle(_done(ids[:10]))
        finally:
            client.config_set("maxmemory", "0")
        done = int(client.hget("oom:progress", "done") or 0)
        results.append((reply, client.hlen(crawl.holding()), done))
    client.close()
    assert results[1] == results[0]
    reply, held, done = results[1]
    # what is deleted is counted: deleted and counted, or refused whole
    assert (held, done) in ((20, 10), (30, 0)), results
