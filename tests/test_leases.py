"""The lease client on a real Redis: reserve, settle, renew and release, as one worker
makes them (:mod:`scrapy_dist.frontier.leases`), and what one worker reads of the others'
leases."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, cast

import pytest

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.choice import frontier_for
from scrapy_dist.frontier.leases import (
    LeaseClient,
    held_by_others,
    refuse_beside_previous,
)
from scrapy_dist.frontier.registry import new_worker_id
from scrapy_dist.frontier.wire import DEAD_BECAUSE, DONE, HAND_BACK
from scrapy_dist.scripts import scripts_for
from scrapy_dist.testing.queues import queued_entries

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

    from scrapy_dist.frontier.leases import Lease


class Crawl:
    """One crawl's keys on the test's Redis, and lease clients of its workers."""

    def __init__(self, crawler: Crawler) -> None:
        frontier = frontier_for(crawler)
        self.client = frontier.client
        self.keys = frontier.keys
        self.queue = frontier.queue
        self.seeds = frontier.seeds
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.epoch = frontier.join_epoch()

    def worker(self, *, max_deliveries: int = 3) -> LeaseClient:
        return LeaseClient(
            scripts_for(self.client),
            self.keys,
            self.queue,
            self.seeds,
            worker_id=new_worker_id(),
            lease_timeout=60,
            max_deliveries=max_deliveries,
            stats=lambda: self.stats,
        )

    def push(self, *payloads: bytes) -> None:
        assert self.queue.push([(p, 0.0, b"") for p in payloads]) == [True] * len(payloads)

    def reserve(self, leases: LeaseClient, count: int, *, seeds: bool = False) -> list[Lease]:
        call = leases.reserve_call(count, self.epoch, self.seeds if seeds else None)
        return leases.leases(call.run(), seeds=seeds)

    def settle(self, leases: LeaseClient, outcomes: list[tuple[str, str]]) -> None:
        leases.settled(leases.settle_call(outcomes, self.epoch).run(), outcomes)

    def expire(self, leases: LeaseClient) -> None:
        """The worker of ``leases`` stopped renewing long ago: its deadline is past."""
        self.client.zadd(self.keys.holders, {leases.worker_id: 0})

    def queued(self) -> list[bytes]:
        """The payloads queued, in the order they come out."""
        return [entry[16:] for entry in queued_entries(self.client, self.queue.key)]

    def holding(self, leases: LeaseClient) -> set[str]:
        return {k.decode() for k in cast("list[bytes]", self.client.hkeys(leases.holding))}

    def count(self, name: str) -> Any:
        return self.stats.get_value(f"scheduler/leases/{name}")


@pytest.fixture
def crawl(make_crawler: Callable[..., Crawler]) -> Crawl:
    return Crawl(make_crawler({"SCHEDULER_QUEUE_CLASS": "scrapy_dist.queue.FifoQueue"}))


def test_a_reserve_leases_entries_in_queue_order_and_holds_them(crawl: Crawl) -> None:
    crawl.push(b"a", b"b", b"c")
    leases = crawl.worker()
    got = crawl.reserve(leases, 2)
    assert [(lease.data, lease.deliveries) for lease in got] == [(b"a", 1), (b"b", 1)]
    assert leases.held == {lease.id for lease in got}
    assert crawl.holding(leases) == leases.held
    assert crawl.queued() == [b"c"]
    seconds, micros = crawl.client.time()
    deadline = crawl.client.zscore(crawl.keys.holders, leases.worker_id)
    assert deadline is not None
    assert 50 < deadline - (seconds + micros / 1e6) <= 60


def test_a_seed_is_leased_raw(crawl: Crawl) -> None:
    crawl.client.lpush(crawl.keys.start_urls, b"https://example.com/")
    leases = crawl.worker()
    (seed,) = crawl.reserve(leases, 5, seeds=True)
    assert seed.data == b"https://example.com/"  # no entry id to strip
    assert seed.id in leases.held
    assert crawl.client.llen(crawl.keys.start_urls) == 0


def test_an_acknowledged_lease_is_gone_and_counted(crawl: Crawl) -> None:
    crawl.push(b"a", b"b")
    leases = crawl.worker()
    first, second = crawl.reserve(leases, 2)
    crawl.settle(leases, [(first.id, DONE)])
    assert leases.held == {second.id}
    assert crawl.holding(leases) == {second.id}
    assert crawl.queued() == []
    assert crawl.count("acked") == 1


def test_a_failed_lease_returns_for_another_try_with_its_delivery_count(crawl: Crawl) -> None:
    crawl.push(b"a")
    leases = crawl.worker()
    (lease,) = crawl.reserve(leases, 1)
    crawl.settle(leases, [(lease.id, "TimeoutError: took too long")])
    assert leases.held == set()
    assert crawl.queued() == [b"a"]
    assert crawl.count("retried") == 1
    (again,) = crawl.reserve(leases, 1)
    assert (again.id, again.deliveries) == (lease.id, 2)


def test_a_lease_failed_at_its_last_delivery_is_dead_lettered_with_the_reason(
    crawl: Crawl,
) -> None:
    crawl.push(b"a")
    leases = crawl.worker(max_deliveries=2)
    for _ in range(2):
        (lease,) = crawl.reserve(leases, 1)
        crawl.settle(leases, [(lease.id, "Boom")])
    assert crawl.queued() == []
    assert crawl.count("retried") == 1
    assert crawl.count("dead") == 1
    (record,) = crawl.client.lrange(crawl.keys.dead, 0, -1)
    assert "Boom" in json.loads(record)["reason"]


def test_dead_because_dead_letters_at_once_with_the_reason(crawl: Crawl) -> None:
    crawl.push(b"a")
    leases = crawl.worker()
    (lease,) = crawl.reserve(leases, 1)
    crawl.settle(leases, [(lease.id, DEAD_BECAUSE + "ValueError: bad page")])
    assert crawl.queued() == []
    assert crawl.count("dead") == 1
    (record,) = crawl.client.lrange(crawl.keys.dead, 0, -1)
    assert "ValueError: bad page" in json.loads(record)["reason"]


def test_a_lease_handed_back_returns_untouched(crawl: Crawl) -> None:
    crawl.push(b"a")
    leases = crawl.worker()
    (lease,) = crawl.reserve(leases, 1)
    crawl.settle(leases, [(lease.id, HAND_BACK)])
    assert crawl.queued() == [b"a"]
    assert crawl.count("handed_back") == 1
    (again,) = crawl.reserve(leases, 1)
    assert again.deliveries == 1  # a hand-back is not a delivery


def test_settling_a_lease_taken_back_meanwhile_warns_and_leaves_it_to_its_new_holder(
    crawl: Crawl, caplog: pytest.LogCaptureFixture
) -> None:
    crawl.push(b"a")
    paused, other = crawl.worker(), crawl.worker()
    (lease,) = crawl.reserve(paused, 1)
    crawl.expire(paused)
    (taken,) = crawl.reserve(other, 1)  # reclaims the expired lease, then leases it
    assert (taken.id, taken.deliveries) == (lease.id, 2)
    with caplog.at_level(logging.WARNING):
        crawl.settle(paused, [(lease.id, DONE)])
    assert crawl.count("lease_lost") == 1
    assert crawl.count("acked") is None
    assert "taken back" in caplog.text
    assert paused.held == set()
    assert crawl.holding(other) == {lease.id}


def test_a_reserve_that_takes_back_expired_leases_says_how_many_once(
    crawl: Crawl, caplog: pytest.LogCaptureFixture
) -> None:
    crawl.push(b"a", b"b", b"c")
    silent, survivor = crawl.worker(), crawl.worker()
    assert len(crawl.reserve(silent, 2)) == 2
    crawl.expire(silent)
    with caplog.at_level(logging.INFO, logger="scrapy_dist.frontier.leases"):
        taken = crawl.reserve(survivor, 5)  # reclaims a and b, then leases all three
    assert sorted(lease.data for lease in taken) == [b"a", b"b", b"c"]
    assert survivor.held == {lease.id for lease in taken}
    assert crawl.count("reclaimed") == 2
    said = [r.getMessage() for r in caplog.records if "expired lease" in r.getMessage()]
    assert said == [
        "Took back 2 expired lease(s) of a silent worker: their requests went back to the "
        "queue and their pages will be crawled again"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scrapy_dist.frontier.leases"):
        assert crawl.reserve(survivor, 1) == []  # nothing expired: nothing said
    assert "expired lease" not in caplog.text
    assert crawl.count("reclaimed") == 2


def test_a_reserve_that_only_reclaims_grants_nothing_and_says_so(crawl: Crawl) -> None:
    crawl.push(b"a")
    silent, survivor = crawl.worker(), crawl.worker()
    crawl.reserve(silent, 1)
    crawl.expire(silent)
    assert crawl.reserve(survivor, 0) == []  # the reply is the count alone
    assert crawl.queued() == [b"a"]
    assert crawl.count("reclaimed") == 1


def test_a_renewal_extends_the_deadline(crawl: Crawl) -> None:
    crawl.push(b"a")
    leases = crawl.worker()
    (lease,) = crawl.reserve(leases, 1)
    crawl.client.zadd(crawl.keys.holders, {leases.worker_id: 1})
    assert leases.renewed(leases.renew_call([lease.id], crawl.epoch).run()) == []
    seconds, _ = crawl.client.time()
    deadline = crawl.client.zscore(crawl.keys.holders, leases.worker_id)
    assert deadline is not None
    assert deadline > seconds + 50
    assert leases.held == {lease.id}


def test_a_renewal_names_the_leases_taken_back_and_forgets_them(crawl: Crawl) -> None:
    crawl.push(b"a", b"b")
    paused, other = crawl.worker(), crawl.worker()
    first, second = crawl.reserve(paused, 2)
    crawl.expire(paused)
    crawl.reserve(other, 1)  # reclaims both, leases one back
    lost = paused.renewed(paused.renew_call([first.id, second.id], crawl.epoch).run())
    assert sorted(lost) == sorted([first.id, second.id])
    assert paused.held == set()
    assert crawl.count("lost_on_renew") == 2


def test_a_release_hands_back_only_the_leases_the_worker_does_not_know(
    crawl: Crawl, caplog: pytest.LogCaptureFixture
) -> None:
    crawl.push(b"known", b"unknown")
    leases = crawl.worker()
    crawl.reserve(leases, 1)
    leases.reserve_call(1, crawl.epoch).run()  # its reply lost: never read
    leases.reply_lost = True
    with caplog.at_level(logging.INFO):
        leases.released(leases.release_call(crawl.epoch).run())
    assert not leases.reply_lost
    assert crawl.queued() == [b"unknown"]
    assert crawl.holding(leases) == leases.held
    assert crawl.count("released_unknown") == 1
    assert "Handed back 1 request(s)" in caplog.text


def test_leases_taken_over_are_not_settled_when_their_requests_finish(crawl: Crawl) -> None:
    leases = crawl.worker()
    leases.taken.update({"a", "b"})
    assert leases.settled_locally(["a", "c"]) == ["c"]
    assert leases.taken == {"b"}


def test_forget_all_drops_every_lease_and_the_lost_reply(crawl: Crawl) -> None:
    crawl.push(b"a")
    leases = crawl.worker()
    crawl.reserve(leases, 1)
    leases.taken.add("x")
    leases.reply_lost = True
    leases.forget_all()
    assert (leases.held, leases.taken, leases.reply_lost) == (set(), set(), False)


def test_held_by_others_counts_each_other_workers_leases(crawl: Crawl) -> None:
    crawl.push(b"a", b"b", b"c")
    me, other, idle = crawl.worker(), crawl.worker(), crawl.worker()
    crawl.reserve(me, 1)
    crawl.reserve(other, 2)
    crawl.client.zadd(crawl.keys.holders, {idle.worker_id: 1})  # holds nothing
    deadline = crawl.client.zscore(crawl.keys.holders, other.worker_id)
    found = held_by_others(crawl.client, crawl.keys, {me.worker_id})
    assert list(found) == [other.worker_id]
    assert found[other.worker_id].leases == 2
    assert found[other.worker_id].until == deadline


def test_held_by_others_reads_a_holders_key_of_another_type_as_none(crawl: Crawl) -> None:
    crawl.client.set(crawl.keys.holders, b"by hand")
    assert held_by_others(crawl.client, crawl.keys, set()) == {}


def _refuse(crawl: Crawl, worker: str, alive: list[str]) -> None:
    refuse_beside_previous(crawl.client, crawl.keys, worker, 60, lambda: alive)


def test_a_worker_starts_beside_no_previous_version_and_enters_the_holders(crawl: Crawl) -> None:
    _refuse(crawl, "w1", ["w0"])  # no previous version's leases: nothing to ask
    assert crawl.client.zscore(crawl.keys.holders, "w1") is not None
    assert crawl.client.hlen(crawl.keys.holding("w1")) == 0


def test_a_worker_refuses_to_start_beside_a_previous_version_holding_leases(
    crawl: Crawl,
) -> None:
    crawl.client.zadd(crawl.keys.leases, {"0000000000000001": 1e12})
    with pytest.raises(ConfigurationError, match="previous version"):
        _refuse(crawl, "w1", ["old"])


def test_workers_of_this_version_started_together_do_not_refuse_each_other(
    crawl: Crawl,
) -> None:
    crawl.client.zadd(crawl.keys.leases, {"0000000000000001": 1e12})
    _refuse(crawl, "w1", [])
    _refuse(crawl, "w2", ["w1"])  # w1 entered the holders: it is of this version
    assert crawl.client.zscore(crawl.keys.holders, "w2") is not None
