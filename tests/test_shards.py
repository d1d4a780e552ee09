"""The sharded frontier (``SCHEDULER_SHARDS``), from the user's side first: ``scrapy
crawl`` workers of a throwaway project crawl a local site whose pages link across three
host names (so their requests spread over three shards) on a plain redis-server and on
the session's 3-master Cluster (also through a kill -9 of a shard's master): each page
once. Then placement, completion and acknowledgement order across shards.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis
from scrapy import Request

from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.choice import frontier_for
from scrapy_dist.frontier.core import Frontier
from scrapy_dist.frontier.shards import ShardedFrontier, host_of, join_id, shard_of, split_id
from scrapy_dist.keys import RedisKeys, shard_crawl, shard_keys, slot_of
from scrapy_dist.scripts import scripts_for
from scrapy_dist.settings import KeysConfig
from scrapy_dist.testing import TestSite, run_cli, start_workers, stop_workers, wait_workers
from scrapy_dist.testing.engine import HeldRequests
from scrapy_dist.testing.leases import leased_count
from scrapy_dist.testing.queues import queued_count
from scrapy_dist.testing.topology import make_project, run_crawl, stats

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from scrapy.crawler import Crawler

    from scrapy_dist.testing import ClusterServers

PAGES = 1500
#: Names of 127.0.0.1 whose requests go to shards 0, 1 and 2 of 3.
HOSTS = ["127.0.0.1", "127.0.1", "0x7f000001"]


def test_the_hosts_of_the_test_site_cover_three_shards() -> None:
    assert [shard_of(h, 3) for h in HOSTS] == [0, 1, 2]


# -- user's side: scrapy crawl workers -------------------------------------------------------


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    with TestSite(PAGES) as served:
        served.hosts = HOSTS
        yield served


def _crawl_settings(**extra: object) -> dict[str, object]:
    return {"SCHEDULER_SHARDS": 3, "SCHEDULER_JOB_ID": uuid.uuid4().hex[:8], **extra}


@pytest.mark.redis_server
@pytest.mark.e2e
def test_two_workers_with_three_shards_on_one_server_crawl_every_page_once(
    redis_url: str, site: TestSite, tmp_path: Path
) -> None:
    project = make_project(tmp_path / "p", f"REDIS_URL = {redis_url!r}")
    settings = _crawl_settings()
    client = redis.Redis.from_url(redis_url)
    seeds = f"pages:{settings['SCHEDULER_JOB_ID']}:start_urls"

    def seed(url: str) -> None:
        client.lpush(seeds, url)

    result = run_crawl(project, site, tmp_path, seed, settings=settings)
    assert result.statuses == [0, 0], result.figures()
    assert not result.missing, result.figures()
    assert result.duplicates == 0, result.figures()
    assert sum(int(s.get("downloader/response_count", 0)) for s in stats(result)) == PAGES
    crawl = f"pages:{settings['SCHEDULER_JOB_ID']}"
    # every shard was used, and the crawl left no frontier key behind (PERSIST off)
    left = [k.decode() for k in client.scan_iter(match=f"{crawl}*")]
    frontier = (":requests", ":epoch", ":holders")
    assert not [k for k in left if k.endswith(frontier) or ":holders:" in k], left
    # what is left is the crawl's own progress record, which counts every shard's
    # pages: the other shards' progress hashes went with their keys
    assert left == [f"{crawl}:progress"], left
    assert int(client.hget(f"{crawl}:progress", "done") or 0) == PAGES + 1  # and the seed
    client.close()


@pytest.mark.redis_server
@pytest.mark.e2e
def test_a_finished_sharded_crawl_reads_whole_resets_whole_and_runs_again_from_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    """Two workers, three shards, PERSIST off. <crawl>:shards went with the frontier,
    so status read shard 0's counters alone (a third of the pages), reset left
    <crawl>#shard1:progress and #shard2's, and the next run's workers, started before
    its seed, took those old counts for their own: the crawl was marked finished within
    the grace and they closed, having crawled nothing."""
    project = make_project(tmp_path / "p", f"REDIS_URL = {redis_url!r}\nSCHEDULER_SHARDS = 3")
    job = uuid.uuid4().hex[:8]
    crawl, cli = f"pages:{job}", ["-s", f"SCHEDULER_JOB_ID={job}"]
    client = redis.Redis.from_url(redis_url)

    def status() -> dict[str, Any]:
        done = run_cli("status", "pages", "--json", *cli, cwd=project)
        assert done.returncode == 0, done.stderr
        return cast("dict[str, Any]", json.loads(done.stdout))

    with TestSite(60) as small:
        small.hosts = HOSTS
        seed = small.page_url(0)

        def push(url: str) -> None:
            client.lpush(f"{crawl}:start_urls", url)

        result = run_crawl(project, small, tmp_path, push, settings={"SCHEDULER_JOB_ID": job})
        assert result.statuses == [0, 0], result.figures()
        assert not result.missing, result.figures()
        first = status()
        # 60 pages; the seed, done once its request was queued, is counted apart
        assert (first["state"], first["progress"]["done"]) == ("finished", 60), first
        assert first["progress"]["seeds_done"] == 1, first
        reset = run_cli("reset", "pages", "--yes", *cli, cwd=project)
        assert reset.returncode == 0, reset.stderr
        assert [k for k in client.scan_iter(match=f"{crawl}*")] == []

        (tmp_path / "second").mkdir()
        second = start_workers(
            2, project_dir=project, spider="pages", log_dir=tmp_path / "second",
            settings={"SCHEDULER_JOB_ID": job, "MAX_IDLE_TIME_BEFORE_CLOSE": 0},
            stats_setting=None,
        )  # fmt: skip
        try:
            time.sleep(7)  # CRAWL_DONE_GRACE = 2: they closed as finished within 4 s
            assert [w.returncode for w in second] == [None, None]
            assert status()["state"] == "waiting"
            small.reset_hits()
            push(seed)
            assert wait_workers(second, 90) == [0, 0]
        finally:
            stop_workers(second)
        assert set(small.hits().values()) == {1}
        assert len(small.hits()) == 60
        again = status()
        assert (again["state"], again["progress"]["done"]) == ("finished", 60), again
    client.close()


@pytest.fixture
def clean(redis_cluster: ClusterServers) -> Iterator[ClusterServers]:
    """The session's cluster, healthy, with no key of crawl ``pages`` (before and after)."""
    redis_cluster.wait_ok()

    def wipe() -> None:
        with redis_cluster.client() as client:
            for node in client.get_primaries():
                conn = client.get_redis_connection(node)
                for key in conn.scan_iter(match="*pages*"):
                    conn.unlink(key)

    wipe()
    yield redis_cluster
    redis_cluster.wait_ok(60)
    wipe()


@pytest.fixture(scope="module")
def cluster_project(
    redis_cluster: ClusterServers, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    nodes = [f"127.0.0.1:{port}" for _, port in redis_cluster.startup_nodes]
    return make_project(
        tmp_path_factory.mktemp("shards-project"), f"REDIS_STARTUP_NODES = {nodes!r}"
    )


def _cluster_crawl(
    cluster: ClusterServers, site: TestSite, project: Path, tmp_path: Path, **kwargs: Any
) -> tuple[Any, str]:
    settings = _crawl_settings()
    crawl = f"{{pages:{settings['SCHEDULER_JOB_ID']}}}"

    def seed(url: str) -> None:
        with cluster.client() as client:
            client.lpush(f"{crawl}:start_urls", url)

    return run_crawl(project, site, tmp_path, seed, settings=settings, **kwargs), crawl


@pytest.mark.redis_server
@pytest.mark.e2e
def test_two_workers_with_three_shards_on_a_cluster_crawl_every_page_once(
    clean: ClusterServers, site: TestSite, cluster_project: Path, tmp_path: Path
) -> None:
    result, crawl = _cluster_crawl(clean, site, cluster_project, tmp_path)
    assert result.statuses == [0, 0], result.figures()
    assert not result.missing, result.figures()
    assert result.duplicates == 0, result.figures()
    # the three shards live on the three masters
    masters = {clean.master_for(f"{shard_crawl(crawl, i, 3)}:requests") for i in range(3)}
    assert len(masters) == 3


@pytest.mark.redis_server
@pytest.mark.e2e
@pytest.mark.slow
def test_kill_9_of_a_shards_master_loses_no_page(
    clean: ClusterServers, site: TestSite, cluster_project: Path, tmp_path: Path
) -> None:
    """kill -9 of shard 1's master mid-crawl: its replica takes over; children were
    confirmed on that shard's replica (WAIT) before their parents' acknowledgements."""
    site.delay = 0.01
    killed = []
    crawl_box: list[str] = []

    def kill() -> None:
        settings_crawl = crawl_box[0]
        master = clean.master_for(f"{shard_crawl(settings_crawl, 1, 3)}:requests")
        killed.append(master)
        clean.kill(master)

    settings = _crawl_settings()
    crawl = f"{{pages:{settings['SCHEDULER_JOB_ID']}}}"
    crawl_box.append(crawl)

    def seed(url: str) -> None:
        with clean.client() as client:
            client.lpush(f"{crawl}:start_urls", url)

    try:
        result = run_crawl(
            cluster_project, site, tmp_path, seed, settings=settings, during=kill,
            during_after=PAGES // 4,
        )  # fmt: skip
    finally:
        site.delay = 0.0
        for node in killed:
            with contextlib.suppress(Exception):
                clean.restart(node, timeout=60)
    print("shards=3, kill -9 of shard 1's master:", result.figures())
    assert result.statuses == [0, 0], result.figures()
    assert not result.missing, result.figures()


# -- placement and keys (no server) ----------------------------------------------------------


def test_a_hosts_requests_stay_in_one_shard() -> None:
    assert shard_of("Example.COM", 3) == shard_of("example.com", 3)
    assert host_of(Request("http://Example.com:8080/a?b")) == "example.com"
    spread = [shard_of(f"host{i}.example", 3) for i in range(3000)]
    assert all(spread.count(i) > 900 for i in range(3))  # placement spreads hosts evenly
    assert shard_of("anything", 1) == 0


def test_lease_ids_carry_their_shard() -> None:
    assert split_id(join_id(2, "0000000000000042")) == (2, "0000000000000042")
    assert join_id(0, "s123") == "s123"  # shard 0's ids are today's
    assert split_id("s0123456789abcde") == (0, "s0123456789abcde")
    assert split_id("#x:1") == (0, "#x:1")


def test_one_shard_keeps_todays_keys_and_three_land_on_three_slot_ranges() -> None:
    config = KeysConfig(
        requests="%(spider)s:requests", dupefilter="%(spider)s:dupefilter",
        start_urls="%(name)s:start_urls", items="%(spider)s:items", job_id=None,
        job_timestamp=None, hash_tag=True,
    )  # fmt: skip
    keys = RedisKeys.build("books", hash_tag=True)
    assert shard_keys(keys, config, 1) == [keys]
    every = shard_keys(keys, config, 3)
    assert every[0] is keys
    thirds = {slot_of(k.requests) * 3 // 16384 for k in every}
    assert len(thirds) == 3
    for k in every:  # each shard's keys share its own slot
        assert len({slot_of(name) for name in (*k.frontier(), k.holding("w"), k.progress)}) == 1
    plain = shard_keys(RedisKeys.build("books"), config, 3)
    assert [k.requests for k in plain] == [
        "books:requests", "books#shard1:requests", "books#shard2:requests",
    ]  # fmt: skip


# -- the frontier across shards (the session's redis-server) -------------------------------

FAST = {
    "SCHEDULER_LEASE_TIMEOUT": 5,
    "SCHEDULER_HEARTBEAT_INTERVAL": 0.15,
    "SCHEDULER_WORKER_TIMEOUT": 1,
    "SCHEDULER_FLUSH_INTERVAL": 0,
    "SCHEDULER_PREFETCH": 1,
}


#: A worker, as its tests drive it.
Worker = HeldRequests


@pytest.fixture
def worker(make_crawler: Callable[..., Crawler]) -> Iterator[Callable[..., Worker]]:
    made: list[Worker] = []

    def make(settings: dict[str, Any] | None = None) -> Worker:
        made.append(Worker(make_crawler({**FAST, **(settings or {})})))
        return made[-1]

    yield make
    for w in made:
        w.close()


@pytest.fixture
def sharded(worker: Callable[..., Worker]) -> Callable[..., Worker]:
    def make(**settings: Any) -> Worker:
        w = worker({"SCHEDULER_SHARDS": 3, **settings})
        assert isinstance(w.frontier, ShardedFrontier)
        return w

    return make


def _url(shard: int, path: str) -> str:
    return f"http://{HOSTS[shard]}/{path}"


@pytest.mark.redis_server
def test_completion_waits_for_every_shard(
    sharded: Callable[..., Worker], client: redis.Redis
) -> None:
    w = sharded()
    f = w.frontier
    assert isinstance(f, ShardedFrontier)
    w.scheduler.enqueue_request(Request(_url(0, "a")))
    w.scheduler.enqueue_request(Request(_url(2, "b")))
    assert queued_count(client, f.others[1].keys.requests) == 1  # placed by host
    taken = [w.take(), w.take()]
    assert all(r is not None for r in taken)
    first = taken[0]
    assert first is not None
    w.finish(first)
    progress = f.progress(grace=0, clear=True)
    assert progress is not None
    assert progress.state == "busy"  # one shard holds a lease
    second = taken[1]
    assert second is not None
    w.finish(second)
    progress = f.progress(grace=0.2, clear=True)
    assert progress is not None
    assert progress.state == "idle"
    # one shard cannot be read: never "finished"
    dead = redis.Redis(port=1, socket_connect_timeout=0.2)
    shard = f.others[0]
    real = shard._scripts
    shard._scripts = scripts_for(dead)
    time.sleep(0.25)
    assert f.progress(grace=0.2, clear=True) is None
    shard._scripts = real
    shard.outbox._retry_at = 0.0
    progress = f.progress(grace=0.2, clear=True)
    assert progress is not None
    assert progress.state == "finished"
    assert f.totals() == {"done": 2}
    for k in (f.keys, *(s.keys for s in f.others)):  # every shard's keys are gone
        assert client.exists(k.requests, k.epoch, k.holders, k.holding(f.worker_id)) == 0


@pytest.mark.redis_server
def test_a_shard_finding_the_crawl_finished_names_the_crawl(
    sharded: Callable[..., Worker], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    w = sharded()
    f = w.frontier
    assert isinstance(f, ShardedFrontier)
    w.scheduler.enqueue_request(Request(_url(1, "a")))
    taken = w.take()
    assert taken is not None
    # the crawl finished without this worker: shard 0 records it, shard 1's epoch is gone
    client.hset(f.keys.progress, "finished_at", 1)
    client.unlink(f.others[0].keys.epoch)
    with caplog.at_level("INFO", logger="scrapy_dist.frontier.epoch"):
        w.finish(taken)
    assert f.lost == "finished"
    said = [r.getMessage() for r in caplog.records if "by another worker" in r.getMessage()]
    assert said, caplog.text
    assert f"Crawl {f.keys.crawl} (shard 1) was finished by another worker" in said[0]
    assert "#shard" not in said[0].split(" was finished")[0]


@pytest.mark.redis_server
def test_children_of_a_lease_taken_over_in_another_shard_are_refused(
    sharded: Callable[..., Worker], client: redis.Redis
) -> None:
    """A page leased from shard 1 is taken over while its worker is paused: Redis
    refuses its children in shard 1, and the worker marks the page taken by the lease
    id its engine knows (``#1:...``), so its later children, whatever their shard, are
    dropped before they are sent."""
    w, other = sharded(), sharded()
    f = w.frontier
    assert isinstance(f, ShardedFrontier)
    w.scheduler.enqueue_request(Request(_url(1, "parent")))
    parent = w.take()
    assert parent is not None
    lease_id = w.scheduler.deliveries.lease_of(parent)
    assert split_id(lease_id)[0] == 1
    shard = f.others[0]  # shard 1
    client.zadd(shard.keys.holders, {f.worker_id: 0})  # its lease expired
    taken = other.take()
    assert taken is not None
    assert taken.url == parent.url
    w.returns(parent, Request(_url(1, "child/1")))  # refused by shard 1
    assert lease_id in f.taken
    w.returns(parent, Request(_url(2, "child/2")))  # known taken over: not even sent
    stats = w.scheduler.stats
    assert stats.get_value("scheduler/leases/taken_over") == 1
    assert stats.get_value("scheduler/leases/children_refused") == 2
    assert f.pending_writes == 0
    assert queued_count(client, f.others[1].keys.requests) == 0


@pytest.mark.redis_server
def test_a_parents_ack_waits_for_its_childs_shard(
    sharded: Callable[..., Worker], client: redis.Redis
) -> None:
    w = sharded(SCHEDULER_FLUSH_INTERVAL=0.1)
    f = w.frontier
    assert isinstance(f, ShardedFrontier)
    f.eager = False
    for s in f.shards:
        s.eager = False
    w.scheduler.enqueue_request(Request(_url(0, "parent")))
    f.flush()
    parent = w.take()
    assert parent is not None
    child_shard = f.others[0]  # shard 1
    queue = child_shard.queue.key
    client.set(queue, b"not a queue")  # shard 1 refuses the child's enqueue (WRONGTYPE)
    w.returns(parent, Request(_url(1, "child")))
    w.finish(parent)
    for _ in range(3):
        f.flush()
        child_shard.outbox._retry_at = 0.0
    assert leased_count(client, f.keys.crawl) == 1  # the parent is still leased in shard 0
    assert f.pending_settlements == 1
    client.delete(queue)  # the operator fixes the key
    f.flush()  # the child is confirmed in shard 1, which releases the ack
    f.flush()
    assert queued_count(client, queue) == 1
    assert leased_count(client, f.keys.crawl) == 0
    assert f.pending_writes == 0


@pytest.mark.redis_server
def test_another_shard_count_for_a_running_crawl_is_refused(
    sharded: Callable[..., Worker], make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    w = sharded()
    assert client.get(w.frontier.keys.shards) == b"3"
    for count in (1, 2):
        other = frontier_for(make_crawler({"SCHEDULER_SHARDS": count}))
        with pytest.raises(ConfigurationError, match="started with SCHEDULER_SHARDS = 3"):
            other.join_epoch()


@pytest.mark.redis_server
def test_a_sharded_worker_checks_the_shard_count_once_as_it_joins(
    make_crawler: Callable[..., Crawler], monkeypatch: pytest.MonkeyPatch
) -> None:
    # one SET NX and one GET at open, not twice (the sharded join and shard 0's)
    frontier = frontier_for(make_crawler({**FAST, "SCHEDULER_SHARDS": 3}))
    assert isinstance(frontier, ShardedFrontier)
    checked: list[int] = []
    real = frontier.check_shards

    def check_shards(count: int = 1) -> None:
        checked.append(count)
        real(count)

    monkeypatch.setattr(frontier, "check_shards", check_shards)
    frontier.join_epoch()
    assert checked == [3]
    frontier.join_epoch()  # joined already: no check
    assert checked == [3]


@pytest.mark.redis_server
def test_a_one_shard_crawl_keeps_todays_frontier(
    worker: Callable[..., Worker], client: redis.Redis
) -> None:
    w = worker()
    assert type(w.frontier) is Frontier
    assert client.exists(w.frontier.keys.shards) == 0


@pytest.mark.redis_server
def test_the_command_line_sees_and_resets_every_shard(  # noqa: PLR0917
    sharded: Callable[..., Worker],
    client: redis.Redis,
    redis_url: str,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from scrapy_dist.cli import main

    w = sharded()
    f = w.frontier
    assert isinstance(f, ShardedFrontier)
    for shard in range(3):
        w.scheduler.enqueue_request(Request(_url(shard, "a")))
    client.rpush(f.others[1].keys.dead, b'{"kind": "request", "reason": "boom", "url": "u"}')
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    common = ["-s", f"REDIS_URL={redis_url}"]
    assert main(["status", name, *common]) == 0
    out = capsys.readouterr().out
    assert "queued" in out
    assert out.count("shard ") == 3, out
    assert out.count("1 fingerprints") == 3, out
    assert re.search(r"dupefilter\s+3\s+fingerprints in the 3 shards'", out), out
    assert main(["status", name, "--json", *common]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["queue"]["queued"] == 3
    assert [s["queued"] for s in status["shards"]] == [1, 1, 1]
    # every shard's dupefilter counted, each shown on its line
    assert status["dupefilter"]["size"] == 3
    assert [s["fingerprints"] for s in status["shards"]] == [1, 1, 1]
    # a key a script set aside in shard 2 is listed, and reset takes it
    aside = f.others[1].keys.seq + ":wrongtype"
    client.set(aside, b"junk")
    assert main(["status", name, "--json", *common]) == 0
    assert json.loads(capsys.readouterr().out)["set_aside"]["keys"] == [aside]
    assert main(["dead", "list", name, *common]) == 0
    assert "boom" in capsys.readouterr().out
    # a real record in shard 1's list goes back to shard 1's queue
    entry = f.others[0].queue.pop_payloads(1)[0]
    record = DeadLetters(client, f.others[0].keys.dead).record("request", "x", entry)
    client.rpush(f.others[0].keys.dead, record)
    assert main(["dead", "requeue", name, "--index", "0", "--shard", "9", *common]) == 2
    assert main(["dead", "requeue", name, "--all", *common]) == 1  # "u" is no request
    out = capsys.readouterr().out
    assert f"requeued 1 request(s) to {f.others[0].keys.requests!r}" in out, out
    assert queued_count(client, f.others[0].keys.requests) == 1
    assert client.llen(f.others[1].keys.dead) == 1
    assert main(["dead", "purge", name, "--yes", *common]) == 0
    assert client.llen(f.others[1].keys.dead) == 0
    capsys.readouterr()
    assert main(["jobs", *common]) == 0
    jobs = capsys.readouterr().out
    assert name in jobs
    assert "#shard" not in jobs
    w.scheduler.close("finished")
    client.delete(f.keys.workers)
    assert main(["reset", name, "--yes", *common]) == 0
    capsys.readouterr()
    for part in f.shards:
        assert client.exists(part.keys.requests, part.keys.epoch, part.keys.dead) == 0
    assert client.exists(aside) == 0


@pytest.mark.redis_server
def test_a_finished_crawl_that_does_not_persist_leaves_one_record_the_cli_reads_whole(  # noqa: PLR0917
    sharded: Callable[..., Worker],
    client: redis.Redis,
    redis_url: str,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Its other shards' progress hashes outlived <crawl>:shards (kept for a day): read
    by no command, left by reset, counted by the next run as its own. Their counters now
    join shard 0's when the crawl is marked finished and go with their keys; a shard's
    dead letters, which stay, are found through the operator's SCHEDULER_SHARDS."""
    from scrapy_dist.cli import main

    w = sharded()
    f = w.frontier
    assert isinstance(f, ShardedFrontier)
    for shard in range(3):
        w.scheduler.enqueue_request(Request(_url(shard, "a")))
    for _ in range(3):
        taken = w.take()
        assert taken is not None
        w.finish(taken)
    client.hincrby(f.others[0].keys.progress, "retried", 2)  # as settle.lua counts them
    client.hincrby(f.others[1].keys.progress, "dead", 1)
    client.rpush(f.others[1].keys.dead, b'{"kind": "request", "reason": "boom", "url": "u"}')
    client.hset(f.keys.progress, "retried", b"junk")  # written by hand: read as 0
    progress = f.progress(grace=0, clear=True)
    assert progress is not None
    assert progress.state == "finished"
    assert client.exists(f.keys.shards) == 0
    assert client.exists(*(s.keys.progress for s in f.others)) == 0
    record = client.hgetall(f.keys.progress)
    assert (record[b"done"], record[b"dead"], record[b"retried"]) == (b"3", b"1", b"2")
    assert record[b"others_base"] == b"0"  # the other shards count from 0 again
    assert record[b"retried:wrongtype"] == b"junk"
    assert f.totals() == {"done": 3, "retried": 2, "dead": 1}
    w.close()
    client.delete(f.keys.workers)

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    common = ["-s", f"REDIS_URL={redis_url}", "-s", "SCHEDULER_SHARDS=3"]
    assert main(["status", name, "--json", *common]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["state"] == "finished"
    assert status["progress"] | {"idle_since": 0, "finished_at": 0} == {
        "done": 3, "seeds_done": 0, "retried": 2, "dead": 1, "idle_since": 0, "finished_at": 0,
    }  # fmt: skip
    assert status["dead"]["records"] == 1
    assert main(["reset", name, "--yes", *common]) == 0
    capsys.readouterr()
    assert [k for k in client.scan_iter(match=f"{name}*")] == []


@pytest.mark.redis_server
def test_a_shard_whose_keys_outlive_its_finished_crawl_is_not_counted_by_the_next_run(
    sharded: Callable[..., Worker], client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finishing worker could not delete shard 2's keys (its Redis away, or the
    worker killed between the calls): its counters, already in shard 0's, stay there
    too. The next run, started before its seeds, never takes them for its own (it
    would be marked finished at once, having crawled nothing); shard 1's went."""
    w = sharded()
    f = w.frontier
    assert isinstance(f, ShardedFrontier)
    for shard in range(3):
        w.scheduler.enqueue_request(Request(_url(shard, "a")))
    for _ in range(3):
        taken = w.take()
        assert taken is not None
        w.finish(taken)

    def away(*_: object) -> None:
        raise redis.ConnectionError("shard 2's master is away")

    monkeypatch.setattr(f.others[1], "delete_keys", away)
    progress = f.progress(grace=0, clear=True)
    assert progress is not None
    assert progress.state == "finished"
    assert client.exists(f.others[0].keys.progress) == 0
    assert client.hget(f.others[1].keys.progress, "done") == b"1"  # left behind
    assert client.hget(f.keys.progress, "done") == b"3"
    monkeypatch.undo()
    w.close()
    client.delete(f.keys.workers)

    time.sleep(0.01)  # the next run's worker starts after the crawl finished
    nxt = sharded().frontier
    for _ in range(2):
        progress = nxt.progress(grace=0, clear=True)
        assert progress is not None
        assert progress.state == "waiting"


def test_every_key_of_a_list_form_redis_key_gets_the_crawl_tag() -> None:
    keys = RedisKeys.build("books", hash_tag=True)
    assert keys.start_urls_key("books:urgent") == "{books}:urgent"
    assert keys.start_urls_key("%(name)s:later") == "{books}:later"
    assert keys.start_urls_key("other:seeds") == "other:seeds"  # another crawl's: refused at open
    assert RedisKeys.build("books").start_urls_key("books:urgent") == "books:urgent"


@pytest.mark.parametrize("value", ["abc", 0, -1, 65, True, "2.5"])
def test_a_bad_shard_count_is_one_clear_error(value: object) -> None:
    from scrapy.settings import Settings

    from scrapy_dist.settings import Config

    with pytest.raises(ConfigurationError, match="SCHEDULER_SHARDS must be an integer"):
        _ = Config.from_settings(Settings({"SCHEDULER_SHARDS": value})).frontier
    assert Config.from_settings(Settings({"SCHEDULER_SHARDS": "3"})).frontier.shards == 3


@pytest.mark.redis_server
def test_the_scheduler_sees_work_in_any_shard(sharded: Callable[..., Worker]) -> None:
    w = sharded()
    w.scheduler.enqueue_request(Request(_url(2, "only")))
    w.frontier.flush()
    assert isinstance(w.frontier, ShardedFrontier)
    w.frontier.main.trip.found_empty_at = 0.0
    assert len(w.frontier.queue) == 1
    assert w.scheduler.has_pending_requests()


def test_the_other_shards_are_not_crawls_of_their_own() -> None:
    from scrapy_dist.keys import is_shard_crawl

    assert is_shard_crawl(shard_crawl("books", 1, 3))
    assert is_shard_crawl(shard_crawl("{books}", 2, 3)[1:-1])
    assert is_shard_crawl(shard_crawl("{books}", 2, 3))
    assert not is_shard_crawl("books")
    assert not is_shard_crawl("books:shard1")  # a job named "shard1"


@pytest.mark.redis_server
@pytest.mark.parametrize("junk", ["abc", "-1", "0", "100000", "9" * 5000, " 3"])
def test_a_junk_recorded_shard_count_is_no_count(
    junk: str, client: redis.Redis, name: str, make_crawler: Callable[..., Crawler]
) -> None:
    from scrapy.settings import Settings

    from scrapy_dist.frontier.shards import other_shards, shard_count
    from scrapy_dist.settings import Config

    keys = RedisKeys.build(name)
    client.set(keys.shards, junk)
    started = time.monotonic()
    assert shard_count(client, keys) == 1  # read as a one-shard crawl's (status, reset...)
    assert other_shards(client, keys, Config.from_settings(Settings()).keys) == []
    assert time.monotonic() - started < 1
    # a worker with shards is refused with one clear error naming the key, no traceback
    frontier = frontier_for(make_crawler({"SCHEDULER_SHARDS": 3}))
    assert isinstance(frontier, ShardedFrontier)
    with pytest.raises(ConfigurationError, match="not a shard count"):
        frontier.check_shards(3)


@pytest.mark.redis_server
def test_a_worker_moves_every_shards_previous_queue_into_levels(
    sharded: Callable[..., Worker], client: redis.Redis
) -> None:
    first = sharded()
    f = first.frontier
    assert isinstance(f, ShardedFrontier)
    # shard 2's queue as the previous version wrote it: one zset of <id><payload>
    queue = f.others[1].keys.requests
    client.delete(queue)
    client.zadd(queue, {b"%016d" % 1 + b'{"url": "http://c.example/x"}': 0})
    assert queued_count(client, queue) == 1
    # the upgrade: no worker of the crawl runs while the previous version's queue is
    # moved (one that runs refuses the move: test_levels_hostile)
    first.close()
    client.hdel(f.keys.workers, f.worker_id)
    second = sharded()  # opens every shard's queue
    assert client.type(queue) == b"string"
    assert queued_count(client, queue) == 1
    assert len(second.frontier.queue) == 1  # every shard's, counted by lua/queued.lua
