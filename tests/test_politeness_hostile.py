"""Cluster-wide politeness (scrapy_dist/politeness.py, lua/politeness.lua) against its
keys lost, evicted or written by hand: every key the script reads, deleted, of another
type, with scores no worker writes and members no worker names. The state heals (from
what the workers hold, or by expiry) and says what it did once; no slot stalls.

From the user's side first: ``scrapy crawl`` workers whose keys are attacked mid-crawl
fetch every page once and log one ERROR naming the key; then the script against each
attack, on a real redis-server.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_dist.keys import RedisKeys
from scrapy_dist.slots import Limit, Limits
from scrapy_dist.testing.crawl import WorkerCrawl, duplicates
from scrapy_dist.testing.politeness import (
    GateBuffer,
    gate,
    outstanding,
    run_script,
    slot_index,
    take,
)
from scrapy_dist.testing.site import TestSite

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis

    from scrapy_dist.testing.redis_server import RedisServer

PROJECT = Path(__file__).parent / "project"

pytestmark = pytest.mark.redis_server


# -- from the user's side: two workers, a key attacked mid-crawl ---------------------------


@pytest.fixture
def site() -> Iterator[TestSite]:
    with TestSite(80, delay=0.02) as running:
        yield running


#: Attacks of issue 34, as Redis commands run in one transaction mid-crawl: the key each
#: one hits (the ERROR must name it).
MID_CRAWL_ATTACKS: dict[str, tuple[list[tuple[str, ...]], str]] = {
    # the tokens deleted, the index of what is outstanding left: its host stalled for
    # good, silently (the count of outstanding tokens never came down)
    "tokens deleted": ([("DEL", "pages:polite:tokens")], "pages:polite:tokens"),
    # a count that is no number: the script failed on every call, for every host
    "busy garbled": (
        [("DEL", "pages:polite:busy"), ("HSET", "pages:polite:busy", "127.0.0.1", "abc")],
        "pages:polite:busy",
    ),
}


@pytest.mark.e2e
@pytest.mark.parametrize("attack", sorted(MID_CRAWL_ATTACKS))
def test_a_politeness_key_lost_or_garbled_mid_crawl_heals_with_one_error(
    server: RedisServer, site: TestSite, tmp_path: Path, attack: str
) -> None:
    commands, key = MID_CRAWL_ATTACKS[attack]
    settings = {
        "SCHEDULER_POLITENESS": True,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
        "SCHEDULER_WORKER_TIMEOUT": 2,
        "CLOSE_WHEN_CRAWL_DONE": True,
        "CRAWL_DONE_GRACE": 1,
    }
    crawl = WorkerCrawl(server, site, tmp_path, project_dir=PROJECT, settings=settings)
    try:
        crawl.start(2)
        crawl.wait_ready()
        crawl.seed()
        crawl.hit_when(15)
        with crawl.client.pipeline(transaction=True) as pipe:
            for command in commands:
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]
            pipe.execute()
        assert crawl.wait(60) == [0, 0], crawl.logs()
        logs = crawl.full_logs()
    finally:
        crawl.close()
    assert not crawl.missing(), logs
    assert duplicates(site.hits()) == 0
    # one ERROR says what was repaired (a loaded machine may add others: Redis slow to
    # answer a worker is an outage of its own, said as such)
    repairs = [line for line in logs.splitlines() if " ERROR: " in line and "Redis key" in line]
    assert len(repairs) == 1, [line for line in logs.splitlines() if " ERROR: " in line]
    assert f"Redis key {key} " in repairs[0]


# -- the script, against each attack ------------------------------------------------------


@pytest.fixture
def keys(name: str) -> RedisKeys:
    return RedisKeys(
        crawl=name, requests=f"{name}:requests", dupefilter=f"{name}:df", start_urls=f"{name}:s"
    )


SENT = "w1:0|a.com"  # w1's turn of a.com, sent: in flight while the key is attacked

#: attack name -> (commands of the attack, given the keys; the key the repair names, or
#: None: nothing to repair, the garbage does no harm or just expires)
ATTACKS: dict[
    str, tuple[Callable[[RedisKeys], list[tuple[Any, ...]]], Callable[[RedisKeys], str] | None]
] = {
    "tokens deleted": (lambda k: [("DEL", k.politeness_tokens)], lambda k: k.politeness_tokens),
    "tokens a string": (
        lambda k: [("DEL", k.politeness_tokens), ("SET", k.politeness_tokens, "x")],
        lambda k: k.politeness_tokens,
    ),
    "tokens a hash": (
        lambda k: [("DEL", k.politeness_tokens), ("HSET", k.politeness_tokens, "a", "b")],
        lambda k: k.politeness_tokens,
    ),
    "token due never": (
        lambda k: [("ZADD", k.politeness_tokens, "+inf", "x|a.com")],
        lambda k: k.politeness_tokens,
    ),
    "held token due in 1e300 ms": (
        lambda k: [("ZADD", k.politeness_tokens, "1e300", SENT)],
        lambda k: k.politeness_tokens,
    ),
    "token not UTF-8, due in 1e15 ms": (
        lambda k: [("ZADD", k.politeness_tokens, "1e15", b"\xff\xfe|\xc3")],
        lambda k: k.politeness_tokens,
    ),
    "token not UTF-8, expired": (
        lambda k: [("ZADD", k.politeness_tokens, "-inf", b"\xff\xfe\xc3")],
        None,
    ),
    "busy deleted": (lambda k: [("DEL", k.politeness_busy)], lambda k: k.politeness_busy),
    "busy a string": (
        lambda k: [("DEL", k.politeness_busy), ("SET", k.politeness_busy, "abc")],
        lambda k: k.politeness_busy,
    ),
    "busy a hash with no number": (
        lambda k: [("DEL", k.politeness_busy), ("HSET", k.politeness_busy, "a.com", "abc")],
        lambda k: k.politeness_busy,
    ),
    "busy a list": (
        lambda k: [("DEL", k.politeness_busy), ("RPUSH", k.politeness_busy, "1")],
        lambda k: k.politeness_busy,
    ),
    "busy scored inf": (
        lambda k: [("ZADD", k.politeness_busy, "inf", "garbage")],
        lambda k: k.politeness_busy,
    ),
    "busy: a token of nobody's, in a.com's range": (
        lambda k: [("ZADD", k.politeness_busy, 0, slot_index("a.com") + "s|ghost|a.com")],
        lambda k: k.politeness_tokens,  # given a short deadline: it expires
    ),
    "busy: a malformed entry in a.com's range": (
        lambda k: [("ZADD", k.politeness_busy, 0, slot_index("a.com") + "zz")],
        lambda k: k.politeness_busy,
    ),
    "busy: an entry of no slot, not UTF-8": (
        lambda k: [("ZADD", k.politeness_busy, 0, b"\xff\xfe:s|\xc3")],
        None,  # in no slot's range: counted nowhere
    ),
    "next deleted": (lambda k: [("DEL", k.politeness_next)], lambda k: k.politeness_next),
    "next a string": (
        lambda k: [("DEL", k.politeness_next), ("SET", k.politeness_next, "1")],
        lambda k: k.politeness_next,
    ),
    "next at +inf": (
        lambda k: [("ZADD", k.politeness_next, "+inf", "a.com")],
        lambda k: k.politeness_next,
    ),
    "next in 1e18 ms": (
        lambda k: [("ZADD", k.politeness_next, "1e18", "a.com")],
        lambda k: k.politeness_next,
    ),
    "next at -inf": (lambda k: [("ZADD", k.politeness_next, "-inf", "a.com")], None),
    "refused a string": (
        lambda k: [("SET", k.politeness_refused, "x")],
        lambda k: k.politeness_refused,
    ),
    "refused a zset": (
        lambda k: [("ZADD", k.politeness_refused, 1, "b.com")],
        lambda k: k.politeness_refused,
    ),
    "next of a slot not UTF-8, in 1e15 ms": (
        lambda k: [("ZADD", k.politeness_next, "1e15", b"\xff\xfe")],
        lambda k: k.politeness_next,
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_attack_on_a_politeness_key_is_repaired_once_and_stalls_no_slot(
    client: redis.Redis, keys: RedisKeys, attack: str
) -> None:
    commands, named = ATTACKS[attack]
    delay, recover = 100, 300
    # w1 holds a.com's turn, sent (its download runs): the state every attack hits
    (grant,), _, repairs = run_script(client, keys, "w1:", asks=[("a.com", 1, 2, delay)])
    assert grant[0] == 1
    run_script(client, keys, "w1:", confirms=[(SENT, 0, delay)])
    assert not repairs
    for command in commands(keys):
        client.execute_command(*command)  # type: ignore[no-untyped-call]
    # any worker's next call: w1 renews what it holds, w2 asks
    _, _, repairs = run_script(
        client, keys, "w2:", recover_ms=recover, holding=[SENT], asks=[("a.com", 1, 2, delay)]
    )
    _, _, again = run_script(client, keys, "w3:", recover_ms=recover, asks=[("b.com", 1, 1, 0)])
    keys_named = {r.partition("\n")[0] for r in repairs}
    if named is None:
        assert not repairs
    else:
        assert keys_named == {named(keys)}, repairs
    assert not again, again  # said once
    # w1's download ends: a.com goes on (within the recovery time and a delay)
    run_script(client, keys, "w1:", releases=[SENT])
    deadline = time.monotonic() + 5
    granted = 0
    while not granted:
        assert time.monotonic() < deadline, (
            f"a.com stalled: {client.zrange(keys.politeness_busy, 0, -1)}"
        )
        time.sleep(0.05)
        (grant,), _, _ = run_script(
            client, keys, "w4:", recover_ms=recover, asks=[("a.com", 1, 2, delay)]
        )
        granted = grant[0]
        if granted:
            run_script(client, keys, "w4:", releases=["w4:0|a.com"])  # (a turn of its own)
    while outstanding(client, keys, "a.com"):  # what nobody holds expires
        assert time.monotonic() < deadline, client.zrange(keys.politeness_busy, 0, -1)
        time.sleep(0.05)
        run_script(client, keys, "w4:", recover_ms=recover)


def test_marks_that_are_no_marks_are_removed_and_hold_nothing_back(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """A mark of a slot refused (``polite:refused``) written by hand, malformed, for no
    tokens or from far ahead, holds no worker back: it is removed, once said, when its
    slot is asked for; one of a slot nobody asks for does no harm; and a hash grown past
    its bound of marks starts over (marks are hints: losing them costs a moment of
    sharing, never a limit)."""
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    garbage = {
        "a.com": "junk",
        "b.com": f"{now_ms}|0|w9:",  # no tokens kept
        "c.com": f"{now_ms + 10**12}|1|w9:",  # from far ahead
        "d.com": f"{now_ms}|x|w9:",
        "e.com": b"\xff\xfe|\xc3",  # not UTF-8
        "untouched.com": "junk",
    }
    client.hset(keys.politeness_refused, mapping=garbage)  # type: ignore[arg-type]
    slots = ["a.com", "b.com", "c.com", "d.com", "e.com"]
    grants, _, repairs = run_script(client, keys, "w1:", asks=[(s, 2, 2, 0) for s in slots])
    assert [g[0] for g in grants] == [2] * 5
    assert repairs == [
        f"{keys.politeness_refused}\n5 mark(s) that are no marks (written by hand): removed"
    ]
    assert client.hkeys(keys.politeness_refused) == [b"untouched.com"]
    # past the bound, the marks start over with the new one
    with client.pipeline(transaction=False) as pipe:
        for i in range(10_000):
            pipe.hset(keys.politeness_refused, f"s{i}.com", "junk")
        pipe.execute()
    (grant,), _, _ = run_script(client, keys, "w2:", asks=[("a.com", 1, 2, 0)])
    assert grant[0] == 0  # w1 holds both
    assert client.hkeys(keys.politeness_refused) == [b"a.com"]


def test_a_mark_keeps_half_the_slot_at_most_and_never_outlasts_its_moment(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """A mark written by hand (or by a worker with a larger concurrency for the slot)
    that keeps more than half the slot keeps half: the others get the rest (one keeping
    99 tokens of 8 kept them all); a count no worker could write is no mark (removed,
    said once); and a mark from ahead of the server's clock is none (one 0.9 s ahead
    held the slot back for 1.9 s)."""
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    client.hset(
        keys.politeness_refused,
        mapping={
            "a.com": f"{now_ms}|99|w9:",
            "b.com": f"{now_ms}|{10**20}|w9:",
            "c.com": f"{now_ms + 900}|1|w9:",
        },
    )
    slots = [("a.com", 8, 8, 0), ("b.com", 8, 8, 0), ("c.com", 2, 2, 0)]
    grants, _, repairs = run_script(client, keys, "w1:", asks=slots)
    assert [g[0] for g in grants] == [4, 8, 2]
    assert repairs == [
        f"{keys.politeness_refused}\n1 mark(s) that are no marks (written by hand): removed"
    ]
    assert client.hkeys(keys.politeness_refused) == [b"a.com"]


def test_a_lost_index_blocks_a_turn_not_yet_sent_until_its_holder_confirms(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """The busy index rebuilt from the tokens takes a token due within the recovery time
    for a turn not yet sent: no other turn of its slot is granted before its holder
    confirms its send (a short gap between two sends otherwise)."""
    (grant,), _, _ = run_script(client, keys, "w1:", asks=[("a.com", 1, 4, 100)])
    assert grant[0] == 1
    client.delete(keys.politeness_busy)
    (grant,), _, repairs = run_script(client, keys, "w2:", asks=[("a.com", 1, 4, 100)])
    assert grant[0] == 0
    assert [r.partition("\n")[0] for r in repairs] == [keys.politeness_busy]
    run_script(client, keys, "w1:", confirms=[("w1:0|a.com", 0, 100)])
    (grant,), _, _ = run_script(client, keys, "w2:", asks=[("a.com", 1, 4, 100)])
    assert grant[0] == 1
    assert 50 <= grant[1] <= 100  # a delay after the confirmation


def test_a_lost_send_time_keeps_the_next_turn_a_delay_away(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """``next`` deleted while tokens are outstanding: the last send of a slot whose
    downloads all ended is not known; its next turn is a delay from the repair."""
    run_script(client, keys, "w1:", asks=[("a.com", 1, 4, 200), ("b.com", 1, 4, 0)])
    run_script(client, keys, "w1:", confirms=[("w1:0|a.com", 0, 200)], releases=["w1:0|a.com"])
    client.delete(keys.politeness_next)  # b.com's token is still outstanding
    (grant,), _, repairs = run_script(
        client, keys, "w2:", asks=[("a.com", 1, 4, 200)], lookahead_ms=1000
    )
    assert [r.partition("\n")[0] for r in repairs] == [keys.politeness_next]
    assert grant[0] == 1
    assert 150 <= grant[1] <= 200


def test_tokens_a_worker_holds_come_back_when_every_key_was_lost(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """All three keys gone (a restart without data, FLUSHDB): each worker's next renewal
    adds again the tokens it has in flight, and says so."""
    run_script(client, keys, "w1:", asks=[("a.com", 2, 2, 0)])
    client.delete(keys.politeness_tokens, keys.politeness_busy, keys.politeness_next)
    _, _, repairs = run_script(client, keys, "w1:", holding=["w1:0|a.com", "w1:1|a.com"])
    assert [r.partition("\n")[0] for r in repairs] == [keys.politeness_tokens]
    assert "2 token(s)" in repairs[0]
    assert outstanding(client, keys, "a.com") == 2
    (grant,), _, _ = run_script(client, keys, "w2:", asks=[("a.com", 1, 2, 0)])
    assert grant[0] == 0  # their concurrency is theirs again


def test_a_repair_is_one_error_line_of_the_worker_that_made_it(
    client: redis.Redis, keys: RedisKeys, caplog: pytest.LogCaptureFixture
) -> None:
    buffer = GateBuffer(["http://a.com/1", "http://a.com/2", "http://a.com/3"])
    politeness = gate(client, keys, buffer, Limits(Limit(2, 0.0)))
    assert take(politeness) is not None
    client.delete(keys.politeness_tokens)
    client.zadd(keys.politeness_tokens, {"x|b.com": float("inf")})
    with caplog.at_level(logging.ERROR, logger="scrapy_dist.politeness"):
        for _ in range(3):
            politeness._renew_at = 0.0
            politeness.tick()
            time.sleep(0.01)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, caplog.text
    assert keys.politeness_tokens in errors[0].getMessage()
    assert "further ahead" in errors[0].getMessage()
    assert politeness.stats.get_value("scheduler/politeness/repaired") == 2  # two repairs
