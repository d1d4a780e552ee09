"""Failover safety (scrapy_dist.frontier.replication): children confirmed on a replica before their
parent's acknowledgement, and a master that changed (failover, restart) noticed.

On real servers: the session's redis-server (a master without replicas, so every WAIT
falls short), a server of one test restarted with and without its data, and the
session's Sentinel set failed over while a worker writes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_dist.connection import topology
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters import backend_from_config
from scrapy_dist.frontier.core import VANISHED, Frontier
from scrapy_dist.frontier.epoch import FINISHED, why_gone
from scrapy_dist.frontier.events import FrontierEvents
from scrapy_dist.frontier.replication import Replication
from scrapy_dist.frontier.wire import DONE
from scrapy_dist.keys import RedisKeys
from scrapy_dist.queue import FifoQueue
from scrapy_dist.seeds import SeedQueue
from scrapy_dist.settings import SENTINEL, SINGLE, Config
from scrapy_dist.testing import TestSite
from scrapy_dist.testing.leases import lease_ids, leased_count
from scrapy_dist.testing.topology import make_project, run_crawl

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.filters import DupefilterBackend
    from scrapy_dist.testing import ClusterServers, RedisServer
    from scrapy_dist.testing.redis_cluster import ClusterNodeServer
    from scrapy_dist.testing.redis_sentinel import SentinelServers

pytestmark = pytest.mark.redis_server


class Worker:
    """One worker's frontier and dupefilter backend on ``client``, built as the crawler
    builds them, with replica confirmations as given."""

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        *,
        replicas: int | None,
        timeout: float = 0.2,
        check_interval: float = 5.0,
    ) -> None:
        self.stats: StatsCollector = get_crawler().stats
        keys = RedisKeys.build(name)
        events = FrontierEvents()
        self.replication = Replication(
            client,
            replicas=replicas,
            timeout=timeout,
            crawl=keys.crawl,
            stats=lambda: self.stats,
            events=events,
            check_interval=check_interval,
        )
        self.changes: list[str] = []
        events.on_master_changed(lambda: self.changes.append("changed"))
        self.frontier = Frontier(
            client,
            keys,
            FifoQueue(client, keys.requests, keys.seq),
            SeedQueue(client, keys.start_urls),
            worker_id=f"w-{name}",
            lease_timeout=60,
            max_deliveries=3,
            stats=lambda: self.stats,
            replication=self.replication,
            events=events,
        )
        config = Config.from_settings(Settings())
        self.backend: DupefilterBackend = backend_from_config(
            config.dupefilter, client, keys
        ).open()
        self.frontier.join_epoch()
        self.replies: list[bool] = []

    def add(self, *urls: str) -> None:
        for url in urls:
            item = (f'{{"url": "{url}"}}'.encode(), 0.0, url.encode())
            self.frontier.enqueue(item, self.backend, self.replies.append)

    def flush_until_sent(self, timeout: float) -> None:
        """Flush (as the scheduler's timer does) until nothing waits in the outbox."""
        deadline = time.monotonic() + timeout
        while self.frontier.pending_writes:
            assert time.monotonic() < deadline, f"still {self.frontier.pending_writes} pending"
            self.frontier.flush()
            time.sleep(0.05)


def queued(client: redis.Redis, worker: Worker) -> list[bytes]:
    entries: list[bytes] = client.lrange(worker.frontier.queue.key, 0, -1)  # type: ignore[assignment]
    return [e[16:] for e in entries]


def leased(client: redis.Redis, worker: Worker) -> set[str]:
    """The ids of the leases held in ``worker``'s crawl, whoever holds them."""
    return lease_ids(client, worker.frontier.keys.crawl)


# -- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"REDIS_WAIT_REPLICAS": -1}, "REDIS_WAIT_REPLICAS"),
        ({"REDIS_WAIT_REPLICAS": "two"}, "REDIS_WAIT_REPLICAS"),
        ({"REDIS_WAIT_TIMEOUT": 0}, "REDIS_WAIT_TIMEOUT"),
        ({"REDIS_WAIT_TIMEOUT": "soon"}, "REDIS_WAIT_TIMEOUT"),
    ],
)
def test_bad_wait_settings_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _ = Config.from_settings(Settings(values)).replication


def test_wait_settings_default_to_the_topology() -> None:
    config = Config.from_settings(Settings()).replication
    assert (config.wait_replicas, config.wait_timeout) == (None, 1.0)
    assert (
        Config.from_settings(Settings({"REDIS_WAIT_REPLICAS": "2"})).replication.wait_replicas == 2
    )


def test_auto_is_off_on_a_single_server(client: redis.Redis, name: str) -> None:
    worker = Worker(client, name, replicas=None)
    assert topology(client) == SINGLE
    assert worker.replication.replicas == 0
    assert worker.replication.wait_call() is None
    assert worker.replication.identity is not None  # the master is watched all the same


# -- a WAIT that falls short ---------------------------------------------------------------


def test_a_short_wait_holds_the_parents_ack_and_sends_its_children_again(
    client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker(client, name, replicas=0)
    frontier = worker.frontier
    worker.add("https://example.com/parent")
    (parent,) = frontier.reserve(1)
    assert leased(client, worker) == {parent.id}

    # this server has no replica: asking for one makes every WAIT fall short
    worker.replication.replicas = 1
    worker.add("https://example.com/a", "https://example.com/b")
    frontier.settle([(parent.id, DONE)])
    with caplog.at_level(logging.WARNING):
        frontier.flush()
    assert not frontier.reachable  # an outage, not a silent skip
    assert "NOREPLICAS only 0 of 1 replica(s)" in caplog.text
    assert worker.stats.get_value("scheduler/redis/wait_short") == 1
    assert worker.stats.get_value("scheduler/redis/refused/NOREPLICAS") == 1
    # the children reached the master, the parent's acknowledgement did not
    assert sorted(queued(client, worker)) == [
        b'{"url": "https://example.com/a"}',
        b'{"url": "https://example.com/b"}',
    ]
    assert leased(client, worker) == {parent.id}
    assert frontier.pending_writes == 3  # the batch kept, the acknowledgement behind it
    assert frontier.pending_settlements == 1

    time.sleep(0.6)  # the backoff; the next attempt falls short again
    frontier.flush()
    assert not frontier.reachable
    assert leased(client, worker) == {parent.id}

    worker.replication.replicas = 0  # confirmed from now on
    worker.flush_until_sent(5)
    assert leased(client, worker) == set()  # acknowledged once confirmed
    assert len(queued(client, worker)) == 2  # sent three times, queued once
    assert worker.replies == [True, True, True]  # each told once (parent, a, b)


def test_a_settlement_with_no_children_is_not_held(client: redis.Redis, name: str) -> None:
    worker = Worker(client, name, replicas=0)
    worker.add("https://example.com/p")
    (lease,) = worker.frontier.reserve(1)
    worker.replication.replicas = 1
    worker.frontier.settle([(lease.id, DONE)])
    assert worker.frontier.flush() == []  # no enqueue, no WAIT
    assert leased(client, worker) == set()


def test_a_wait_redone_after_a_script_flush_still_covers_the_enqueue(
    client: redis.Redis, name: str
) -> None:
    worker = Worker(client, name, replicas=0)
    worker.add("https://example.com/p")
    worker.frontier.flush()
    client.script_flush()
    worker.replication.replicas = 1
    worker.add("https://example.com/q")
    worker.frontier.flush()  # the WAIT is redone after the enqueue: still short
    assert not worker.frontier.reachable
    assert worker.frontier.pending_writes == 1


# -- a master that changed -------------------------------------------------------------------


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_master_restarted_with_its_data_is_noticed(
    server: RedisServer, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = server.client()
    worker = Worker(client, name, replicas=0)
    before = worker.replication.identity
    worker.add("https://example.com/a")
    worker.frontier.flush()
    server.restart()  # the AOF keeps the crawl

    def flushed() -> bool:
        worker.frontier.flush()
        return bool(worker.changes)

    with caplog.at_level(logging.WARNING):
        _until(flushed, 15, "the restart to be noticed")
    assert worker.replication.identity != before
    assert worker.frontier.lost is None
    assert "The Redis master of crawl" in caplog.text
    assert f"the crawl's epoch {worker.frontier.epoch} is still there" in caplog.text
    assert worker.stats.get_value("scheduler/redis/master_changed") == 1
    worker.add("https://example.com/b")
    worker.flush_until_sent(5)
    assert len(queued(client, worker)) == 2
    client.close()


def test_a_master_restarted_without_its_data_stops_the_crawl(
    server: RedisServer, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = server.client()
    worker = Worker(client, name, replicas=0, check_interval=0.2)
    worker.add("https://example.com/a")
    worker.frontier.flush()
    client.flushall()  # what a restart without persistence leaves
    server.restart()

    def noticed() -> bool:
        worker.frontier.flush()
        return worker.frontier.lost is not None

    with caplog.at_level(logging.WARNING):
        _until(noticed, 15, "the lost crawl to be noticed")
    assert worker.frontier.lost == VANISHED  # stops with frontier_lost, never "finished"
    assert worker.changes == ["changed"]
    assert "is gone with it" in caplog.text
    assert "vanished" in caplog.text
    client.close()


@pytest.mark.parametrize(
    ("finished_at", "state"),
    [
        (b"1795000000.25", FINISHED),
        (b"2026-11-23 18:00", VANISHED),
        (b"nan", VANISHED),
        (b"1_000", VANISHED),
        (b"0x10", VANISHED),
        (None, VANISHED),
    ],
)
def test_a_crawl_whose_epoch_is_gone_finished_only_if_it_has_a_completion_time(
    client: redis.Redis, name: str, finished_at: bytes | None, state: str
) -> None:
    """A worker finding its crawl's epoch gone reads it as finished (a quiet close) only
    if a completion time is recorded; one written by hand (not a number) is none, as
    lua/progress.lua reads it: the frontier vanished (an ERROR, ``frontier_lost``)."""
    keys = RedisKeys(crawl=name, requests="r", dupefilter="d", start_urls="s")
    if finished_at is not None:
        client.hset(keys.progress, "finished_at", finished_at)
    assert why_gone(client, keys, "none", joined="e1") == state


# -- a real failover behind Sentinel ----------------------------------------------------


@pytest.mark.slow
def test_a_sentinel_failover_loses_no_child_and_acknowledges_after_it(
    redis_sentinel: SentinelServers, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    sentinel = redis_sentinel.client(socket_timeout=5)
    client = sentinel.master_for(redis_sentinel.service_name, socket_timeout=5)
    assert topology(client) == SENTINEL
    old = redis_sentinel.master()
    worker = Worker(client, name, replicas=None, timeout=0.5)
    assert worker.replication.replicas == 1  # the master has a replica: on by default
    frontier = worker.frontier
    worker.add("https://example.com/parent")
    (parent,) = frontier.reserve(1)

    new = redis_sentinel.failover()  # the old master takes writes until it is demoted
    assert new is not old
    children = [f"https://example.com/{i}" for i in range(50)]
    worker.add(*children)
    frontier.settle([(parent.id, DONE)])
    with caplog.at_level(logging.WARNING):
        frontier.flush()  # written on the old master alone: not confirmed
        assert not frontier.reachable
        # the old master is demoted and throws those writes away; the worker follows
        # the new master, notices it, sends the children again, then the parent's ack
        worker.flush_until_sent(90)
    assert "The Redis master of crawl" in caplog.text
    redis_sentinel.wait_agreed(60)
    with new.client() as direct:
        assert direct.llen(frontier.queue.key) == len(children)
        assert leased_count(direct, frontier.keys.crawl) == 0
        assert direct.hget(frontier.keys.progress, "done") == b"1"
        direct.delete(*frontier.keys.every(), worker.backend.keys()[0])
    client.close()


# -- from the user's side: scrapy crawl workers behind Sentinel --------------------------

PAGES = 3000
#: docs/guarantees.md's bound on pages fetched twice, per worker and stall:
#: CONCURRENT_REQUESTS + 2 * SCHEDULER_PREFETCH_MAX of the example project (16, and four
#: times the default prefetch of 8).
BOUND = 16 + 2 * 32
#: Its bound for a failover, which counts as an outage of every worker (its item 4): twice
#: the stall bound per worker, for the crawl's 2 workers (the leases the old master granted
#: and the settlements it took, after the replica's last write, are all handed out again).
FAILOVER_BOUND = 2 * 2 * BOUND


@pytest.fixture
def clean(redis_sentinel: SentinelServers) -> Iterator[SentinelServers]:
    redis_sentinel.wait_agreed(60)
    with redis_sentinel.master().client() as client:
        client.flushdb()
    yield redis_sentinel
    redis_sentinel.wait_agreed(60)
    with redis_sentinel.master().client() as client:
        client.flushdb()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sentinel_failover_mid_crawl_loses_no_page(
    clean: SentinelServers, tmp_path: Path
) -> None:
    """``SENTINEL FAILOVER`` while 2 workers crawl 3,000 pages: the old master takes
    writes until the Sentinels demote it, then throws them away; nothing is lost, the
    workers notice the new master, go on and finish."""
    settings = (
        f"REDIS_SENTINELS = {[f'{h}:{p}' for h, p in clean.sentinel_addresses]!r}\n"
        f"REDIS_SENTINEL_PARAMS = {{'service_name': {clean.service_name!r}}}"
    )
    project = make_project(tmp_path, settings)

    def seed(url: str) -> None:
        with clean.master().client() as client:
            client.lpush("pages:start_urls", url)

    def failover() -> None:
        clean.failover()

    with TestSite(PAGES, delay=0.02) as site:
        result = run_crawl(
            project,
            site,
            tmp_path,
            seed,
            settings={"SCHEDULER_LEASE_TIMEOUT": 60},
            during=failover,
            during_after=PAGES // 4,
        )
    print("SENTINEL FAILOVER:", result.figures())
    assert result.statuses == [0, 0], result.figures()
    assert not result.missing, result.figures()
    assert result.duplicates <= FAILOVER_BOUND, result.figures()
    logs = "".join(w.log_file.read_text() for w in result.workers)
    assert "The Redis master of crawl pages changed" in logs, result.figures()
    assert "NOREPLICAS" in logs  # the old master's writes were never acknowledged on


@pytest.fixture
def clean_cluster(redis_cluster: ClusterServers) -> Iterator[ClusterServers]:
    """The session's cluster, healthy, with no key of crawl ``pages`` (before and after)."""

    def wipe() -> None:
        redis_cluster.wait_ok(60)
        with redis_cluster.client() as client:
            for node in client.get_primaries():
                conn = client.get_redis_connection(node)
                for key in conn.scan_iter(match="*pages*"):
                    conn.unlink(key)

    wipe()
    yield redis_cluster
    wipe()


@pytest.mark.e2e
@pytest.mark.slow
def test_kill_9_of_the_crawls_cluster_master_loses_no_page(
    clean_cluster: ClusterServers, tmp_path: Path
) -> None:
    """``kill -9`` of the master owning the crawl's slot while 2 workers crawl: a replica
    takes over after the node timeout. Every request whose parent was acknowledged had
    reached that replica (WAIT), so nothing is lost."""
    cluster = clean_cluster
    nodes = [f"127.0.0.1:{port}" for _, port in cluster.startup_nodes]
    project = make_project(tmp_path, f"REDIS_STARTUP_NODES = {nodes!r}")
    seeds = "{pages}:start_urls"
    killed: list[ClusterNodeServer] = []

    def seed(url: str) -> None:
        with cluster.client() as client:
            client.lpush(seeds, url)

    def kill() -> None:
        master = cluster.master_for(seeds)
        killed.append(master)
        cluster.kill(master)

    try:
        with TestSite(2000, delay=0.02) as site:
            result = run_crawl(project, site, tmp_path, seed, during=kill, during_after=500)
    finally:
        for node in killed:
            cluster.restart(node, timeout=60)
    print("kill -9 (cluster):", result.figures())
    assert result.statuses == [0, 0], result.figures()
    assert not result.missing, result.figures()
    assert result.duplicates <= FAILOVER_BOUND, result.figures()


def test_a_server_that_refuses_info_turns_the_checks_off_not_the_crawl(
    server: RedisServer, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with server.client() as admin:
        admin.acl_setuser(
            "crawler", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-info"]
        )
    client = redis.Redis(port=server.port, username="crawler", password="pw")
    with caplog.at_level(logging.WARNING):
        worker = Worker(client, name, replicas=0)
    assert "Cannot read INFO" in caplog.text
    assert not worker.replication.checks
    worker.add("https://example.com/a")
    worker.flush_until_sent(5)
    assert len(queued(client, worker)) == 1
    client.close()


def test_an_outage_with_nothing_to_send_checks_the_master_at_a_modest_pace(
    server: RedisServer, name: str
) -> None:
    client = server.client(socket_timeout=2)
    worker = Worker(client, name, replicas=0)
    server.kill()
    worker.frontier.reserve(1)  # no server: an outage
    assert not worker.frontier.reachable
    server.restart()
    time.sleep(0.6)  # the backoff
    with server.client() as admin:
        admin.config_resetstat()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # the scheduler's flush timer, nothing to send
            worker.frontier.flush()
            time.sleep(0.02)
        calls = admin.info("commandstats").get("cmdstat_info", {}).get("calls", 0)
    # one check per half second (two INFO each), not one per tick
    assert 2 <= calls <= 8
    client.close()


def test_the_flush_after_an_outage_ended_checks_the_master(client: redis.Redis) -> None:
    """A check during a failover can read the old master, demoted, while the flush that
    ends the outage reaches the new one: the next flush looks again, whenever the
    last check was."""
    from types import SimpleNamespace

    replication = Replication(
        client,
        replicas=None,
        timeout=0.5,
        crawl="c",
        stats=lambda: get_crawler().stats,
        events=FrontierEvents(),
        check_interval=3600,
    )
    outbox: Any = SimpleNamespace(reachable=True, can_try=lambda: True)
    assert replication.due(outbox)  # never checked
    replication._next_check = time.monotonic() + 3600  # (as a check leaves it)
    assert not replication.due(outbox)
    outbox.reachable = False
    assert replication.due(outbox)  # an outage began
    replication._next_check = time.monotonic() + 3600
    assert not replication.due(outbox)
    outbox.reachable = True
    assert replication.due(outbox)  # it ended: the next flush looks again
