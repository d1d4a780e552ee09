"""Redis Cluster, from the user's side: ``scrapy crawl`` workers of a throwaway project
whose settings name the cluster's nodes crawl a local site (each page once), also
through a ``CLUSTER FAILOVER`` and a ``kill -9`` of the crawl's master; then the client
itself (hash slot, redirections, failover) on the session's 3-master cluster.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy.settings import Settings

from scrapy_dist.connection import (
    ClusterClient,
    SlotMoved,
    check,
    client_from_config,
    crawl_client,
    describe,
    primaries,
)
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.keys import RedisKeys, crawl_slot, keys_from_settings, slot_of
from scrapy_dist.settings import connection_config
from scrapy_dist.testing import TestSite
from scrapy_dist.testing.redis_server import free_port
from scrapy_dist.testing.topology import make_project, run_crawl, stats

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from scrapy_dist.testing import ClusterServers

pytestmark = [pytest.mark.redis_server]

PAGES = 2000
TAG = "{pages}"
SEEDS = f"{TAG}:start_urls"


def nodes_setting(cluster: ClusterServers) -> str:
    return ",".join(f"{host}:{port}" for host, port in cluster.startup_nodes)


def cluster_client(cluster: ClusterServers, **settings: object) -> redis.Redis:
    config = connection_config(Settings({"REDIS_STARTUP_NODES": cluster.startup_nodes, **settings}))
    return client_from_config(config)


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


# -- settings and keys (no server) --------------------------------------------------------


def test_keys_carry_the_crawl_hash_tag_under_cluster() -> None:
    keys = keys_from_settings(Settings({"REDIS_STARTUP_NODES": ["h:1"]}), "books")
    assert keys.crawl == "{books}"
    assert keys.requests == "{books}:requests"
    assert keys.start_urls == "{books}:start_urls"
    assert keys.holders == "{books}:holders"
    assert keys.holding("w1") == "{books}:holders:w1"
    assert keys.bloom_segment(0, 1) == "{books}:dupefilter:0:1"
    assert len({slot_of(key) for key in keys.every()}) == 1
    plain = keys_from_settings(Settings({}), "books")
    assert plain.requests == "books:requests"  # a single server's keys are unchanged


def test_job_keys_share_one_tag_per_job() -> None:
    keys = keys_from_settings(
        Settings({"REDIS_STARTUP_NODES": ["h:1"], "SCHEDULER_JOB_ID": "run7"}), "books"
    )
    assert keys.requests == "{books:run7}:requests"


def test_a_key_template_without_the_crawl_name_is_refused_at_open() -> None:
    keys = RedisKeys.build("books", dupefilter="global:dupefilter", hash_tag=True)
    with pytest.raises(ConfigurationError, match=r"'global:dupefilter' is in slot \d+"):
        crawl_slot(keys)
    keys = RedisKeys.build("books", hash_tag=True)
    with pytest.raises(ConfigurationError, match="REDIS_ITEMS_KEY"):
        crawl_slot(keys, extra=["all-items"])
    assert crawl_slot(keys, extra=["{books}:items"]) == slot_of("books")


def test_a_literal_redis_key_gets_the_tag() -> None:
    from scrapy_dist.keys import keys_from_config
    from scrapy_dist.settings import Config

    config = Config.from_settings(Settings({"REDIS_STARTUP_NODES": ["h:1"]}))
    keys = keys_from_config(config.keys, "books", redis_key="books:seeds", hash_tag=True)
    assert keys.start_urls == "{books}:seeds"
    keys = keys_from_config(config.keys, "books", redis_key="%(name)s:urls", hash_tag=True)
    assert keys.start_urls == "{books}:urls"


# -- the client -------------------------------------------------------------------------


def test_crawl_client_reaches_the_slot_owner_with_pipelines_scripts_and_time(
    clean: ClusterServers,
) -> None:
    client = cluster_client(clean)
    keys = RedisKeys.build("pages", hash_tag=True)
    crawl = crawl_client(client, keys)
    assert isinstance(crawl, ClusterClient)
    assert "not resolved yet" in describe(crawl)
    crawl.lpush(keys.start_urls, b"u1")
    owner = clean.master_for(keys.requests)
    assert describe(crawl).endswith(
        f"(crawl slot {slot_of(keys.requests)} on 127.0.0.1:{owner.port})"
    )
    script = crawl.register_script("return redis.call('LLEN', KEYS[1])")
    assert script(keys=[keys.start_urls]) == 1
    with crawl.pipeline(transaction=True) as pipe:
        pipe.time()
        pipe.rpush(keys.start_urls, b"u2")
        pipe.llen(keys.start_urls)
        assert pipe.execute()[1:] == [2, 2]
    # the one seeds list is where redis-cli -c would put it
    with clean.client() as plain:
        assert plain.llen(SEEDS) == 2
    client.close()


def test_describe_names_the_nodes_and_masks_the_password(redis_cluster: ClusterServers) -> None:
    client = cluster_client(redis_cluster, REDIS_PARAMS={"password": "s3cret"})
    text = describe(client)
    assert text.startswith("redis+cluster://:***@127.0.0.1:")
    assert "s3cret" not in text
    assert text.count(",") == len(redis_cluster.nodes) - 1


def test_primaries_lists_each_master_once(redis_cluster: ClusterServers) -> None:
    redis_cluster.wait_ok()
    client = cluster_client(redis_cluster)
    ports = sorted(int(c.connection_pool.connection_kwargs["port"]) for c in primaries(client))
    assert ports == sorted(node.port for node in redis_cluster.masters())
    client.close()


def test_an_unreachable_cluster_is_one_clear_error() -> None:
    config = connection_config(Settings({"REDIS_STARTUP_NODES": ["127.0.0.1:1"]}))
    client = client_from_config(config)  # no I/O yet
    with pytest.raises(Exception, match=r"cannot reach .*127\.0\.0\.1:1"):
        check(client)


def test_a_key_of_another_slot_never_turns_the_crawl_client(clean: ClusterServers) -> None:
    client = cluster_client(clean)
    crawl = crawl_client(client, RedisKeys.build("pages", hash_tag=True))
    crawl.ping()
    before = describe(crawl)
    other = next(
        k for k in (f"k{i}" for i in range(100)) if clean.master_for(k) != clean.master_for(SEEDS)
    )
    with pytest.raises(redis.ResponseError, match="hash tag"):
        crawl.get(other)
    assert describe(crawl) == before
    client.close()


@pytest.mark.slow
def test_the_crawl_client_follows_a_failover(
    clean: ClusterServers, caplog: pytest.LogCaptureFixture
) -> None:
    client = cluster_client(clean)
    keys = RedisKeys.build("pages", hash_tag=True)
    crawl = crawl_client(client, keys)
    crawl.rpush(keys.start_urls, b"a")
    master = clean.master_for(keys.requests)
    replica = clean.replicas(master)[0]
    clean.failover(replica)
    with caplog.at_level(logging.INFO, logger="scrapy_dist.connection"):
        assert crawl.llen(keys.start_urls) == 1  # MOVED: not run, turned and run again
    assert f"on 127.0.0.1:{replica.port}" in describe(crawl)
    assert "is served by" in caplog.text
    # a pipeline that meets MOVED raises an outage (SlotMoved is a ConnectionError)
    clean.failover(master)
    with crawl.pipeline(transaction=False) as pipe:
        pipe.llen(keys.start_urls)
        with pytest.raises(SlotMoved):
            pipe.execute(raise_on_error=False)
    assert crawl.llen(keys.start_urls) == 1
    client.close()


# -- crawls -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    with TestSite(PAGES) as served:
        yield served


@pytest.fixture(scope="module")
def project(redis_cluster: ClusterServers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    nodes = [f"127.0.0.1:{port}" for _, port in redis_cluster.startup_nodes]
    return make_project(
        tmp_path_factory.mktemp("cluster-project"), f"REDIS_STARTUP_NODES = {nodes!r}"
    )


def seeder(cluster: ClusterServers):  # type: ignore[no-untyped-def]
    def seed(url: str) -> None:
        with cluster.client() as client:
            client.lpush(SEEDS, url)

    return seed


@pytest.mark.e2e
def test_two_workers_crawl_every_page_once_on_a_cluster(
    clean: ClusterServers, site: TestSite, project: Path, tmp_path: Path
) -> None:
    result = run_crawl(project, site, tmp_path, seeder(clean))
    assert result.statuses == [0, 0], result.figures()
    assert not result.missing, result.figures()
    assert result.duplicates == 0, result.figures()
    responses = [int(s.get("downloader/response_count", 0)) for s in stats(result)]
    assert sum(responses) == PAGES
    log = result.workers[0].log_file.read_text()
    assert "redis+cluster://" in log  # the worker log names the topology


@pytest.mark.e2e
@pytest.mark.slow
def test_a_crawl_survives_cluster_failover_of_its_master(
    clean: ClusterServers, site: TestSite, project: Path, tmp_path: Path
) -> None:
    site.delay = 0.02

    def failover() -> None:
        master = clean.master_for(SEEDS)
        clean.failover(clean.replicas(master)[0])

    try:
        result = run_crawl(
            project, site, tmp_path, seeder(clean), during=failover, during_after=PAGES // 4
        )
    finally:
        site.delay = 0.0
    print("CLUSTER FAILOVER:", result.figures())
    assert result.statuses == [0, 0], result.figures()
    assert not result.missing, result.figures()
    logs = "".join(w.log_file.read_text() for w in result.workers)
    assert "is served by" in logs  # the workers turned to the new master mid-crawl


@pytest.mark.e2e
@pytest.mark.slow
def test_a_crawl_survives_kill_9_of_its_master(
    clean: ClusterServers, site: TestSite, project: Path, tmp_path: Path
) -> None:
    """kill -9 of the crawl's master: a replica takes over after the node timeout. Writes
    the master acknowledged but had not yet replicated are lost with it (what Redis
    replication is); the figures are printed for the report."""
    site.delay = 0.02
    killed = []

    def kill() -> None:
        master = clean.master_for(SEEDS)
        killed.append(master)
        clean.kill(master)

    try:
        result = run_crawl(
            project, site, tmp_path, seeder(clean), during=kill, during_after=PAGES // 4
        )
    finally:
        site.delay = 0.0
        for node in killed:
            with contextlib.suppress(Exception):
                clean.restart(node, timeout=60)
    print("kill -9:", result.figures())
    assert result.statuses == [0, 0], result.figures()
    logs = "".join(w.log_file.read_text() for w in result.workers)
    assert "is served by" in logs  # the workers turned to the promoted replica
    # the children of every acknowledged page were confirmed on the replica (WAIT)
    assert not result.missing, result.figures()


def _computed_first(key: bytes) -> bool:
    """Sort key: the keys scripts reach by a name they compute (a priority queue's
    levels and their index, workers' holdings) before those the scripts declare."""
    return not (b":level" in key or b":holders:" in key)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("order", [None, _computed_first], ids=["server-order", "computed-first"])
def test_a_crawl_survives_a_reshard_of_its_slot(
    clean: ClusterServers,
    site: TestSite,
    project: Path,
    tmp_path: Path,
    order: Callable[[bytes], bool] | None,
) -> None:
    """The crawl's slot moved to another master mid-crawl, one key at a time (as
    ``redis-cli --cluster reshard`` does), so the workers meet it half moved: ``ASK``,
    ``TRYAGAIN``, and keys a script reaches by a computed name that are already on the
    target."""
    site.delay = 0.02
    moves: list[int] = []

    def reshard() -> None:
        slot = slot_of(SEEDS)
        source = clean.master_for(SEEDS)
        target = next(node for node in clean.masters() if node.port != source.port)
        moves.append(clean.migrate_slot(slot, target, pause=0.2, order=order))

    seed = seeder(clean)

    def seeds(url: str) -> None:
        seed("not a url")  # dead-lettered at once: the dead-letter list is there to write to
        seed(url)

    try:
        result = run_crawl(project, site, tmp_path, seeds, during=reshard, during_after=PAGES // 4)
    finally:
        site.delay = 0.0
    print("RESHARD:", moves, result.figures())
    assert moves, "the reshard did not run"
    assert moves[0] > 3, moves  # the crawl's keys moved, one at a time
    assert result.statuses == [0, 0], result.figures()
    assert not result.missing, result.figures()
    # TRYAGAIN was read as a permanent refusal: the flush's requests were dead-lettered
    # (and its acknowledgements dropped, so pages were fetched again)
    with clean.client() as client:
        dead = client.lrange(f"{TAG}:dead", 0, -1)
    assert len(dead) == 1, dead[:3]
    assert b"not a url" in dead[0]
    assert result.duplicates == 0, result.figures()
    logs = "".join(w.log_file.read_text() for w in result.workers)
    assert "is served by" in logs  # the workers turned to the slot's new master
    assert "rejected" not in logs


# -- the scrapy-dist command on a cluster ---------------------------------------------------


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """Call ``main(args)`` in-process outside any project; returns (code, stdout, stderr)."""
    from scrapy_dist.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)

    def call(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return call


def test_cli_push_status_jobs_dead_export_reset_on_a_cluster(
    clean: ClusterServers,
    run: Any,
) -> None:
    url = "redis+cluster://" + nodes_setting(clean)
    code, out, err = run("--redis-url", url, "push", "pages", "https://a.example/1")
    assert code == 0, err
    with clean.client() as plain:  # where `redis-cli -c lpush '{pages}:start_urls'` pushes
        assert plain.lrange(SEEDS, 0, -1) == [b"https://a.example/1"]
        plain.rpush(f"{TAG}:items", b'{"url": "https://a.example/1"}')
        plain.rpush(f"{TAG}:dead", b'{"reason": "test", "kind": "request"}')
        # another crawl, another slot (most likely another master): found by SCAN of each
        plain.lpush("{other}:start_urls", b"https://b.example/")
    with clean.client() as plain:  # the single-server habit: not read under Cluster
        plain.lpush("pages:start_urls", b"https://a.example/lost")
    code, out, err = run("--redis-url", url, "status", "pages")
    assert code == 0, err
    assert "'pages:start_urls' exists (list)" in err
    assert "'{pages}:start_urls'" in err
    with clean.client() as plain:
        plain.delete("pages:start_urls")
    assert "redis+cluster://" in out
    assert "WRONGTYPE" not in out + err
    assert "holds" not in err  # no MOVED mistaken for a key of another type
    code, out, err = run("--redis-url", url, "jobs")
    assert code == 0, err
    assert "pages" in out
    assert "other" in out
    code, out, err = run("--redis-url", url, "dead", "list", "pages")
    assert code == 0, err
    assert "1 record" in out
    code, out, err = run("--redis-url", url, "export", "pages", "-o", "-")
    assert code == 0, err
    assert "a.example/1" in out
    code, out, err = run("--redis-url", url, "metrics", "pages", "--once")
    assert code == 0, err
    assert "scrapy_dist" in out
    code, out, err = run("--redis-url", url, "reset", "pages", "--yes")
    assert code == 0, err
    with clean.client() as plain:
        assert not plain.exists(SEEDS, f"{TAG}:items", f"{TAG}:dead")
        assert plain.exists("{other}:start_urls")
        plain.delete("{other}:start_urls")


def test_cli_names_an_unreachable_cluster_on_one_line(run: Any) -> None:
    code, _, err = run("--redis-url", "redis+cluster://:pw@127.0.0.1:1", "status", "pages")
    assert code == 1
    assert "redis+cluster://:***@127.0.0.1:1" in err
    assert "pw@" not in err


def test_cli_in_the_project_reads_its_cluster_settings(
    clean: ClusterServers, project: Path
) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "scrapy_dist", "push", "pages", "https://a.example/2"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert SEEDS in done.stdout + done.stderr  # the report names the tagged key
    with clean.client() as plain:
        assert plain.lrange(SEEDS, 0, -1) == [b"https://a.example/2"]


@pytest.mark.e2e
def test_a_worker_refuses_keys_outside_the_crawls_slot(
    redis_cluster: ClusterServers, tmp_path: Path
) -> None:
    import subprocess
    import sys

    nodes = [f"127.0.0.1:{port}" for _, port in redis_cluster.startup_nodes]
    project = make_project(
        tmp_path, f"REDIS_STARTUP_NODES = {nodes!r}\nSCHEDULER_DUPEFILTER_KEY = 'dupefilter'"
    )
    done = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "pages"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "'dupefilter' is in slot 7167" in done.stderr
    assert "'{pages}'" in done.stderr  # the tag to use


def test_a_migrating_slot_is_an_outage_not_a_turn(clean: ClusterServers) -> None:
    """``ASK`` (the crawl's slot is being moved to another master): the command was not
    run; the client raises :class:`SlotMoved` (a ConnectionError: callers retry) and stays
    on the slot's owner until the migration ends with ``MOVED``."""
    client = cluster_client(clean)
    keys = RedisKeys.build("pages", hash_tag=True)
    crawl = crawl_client(client, keys)
    crawl.ping()
    before = describe(crawl)
    slot = slot_of(keys.requests)
    source = clean.master_for(keys.requests)
    target = next(node for node in clean.masters() if node.port != source.port)
    with source.client() as src, target.client() as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        try:
            with pytest.raises(SlotMoved, match="migrating"):
                crawl.get(keys.epoch)  # absent on the source: ASK
            assert describe(crawl) == before
        finally:
            src.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            dst.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
    assert crawl.get(keys.epoch) is None
    client.close()


def test_a_dead_first_startup_node_is_skipped(redis_cluster: ClusterServers) -> None:
    redis_cluster.wait_ok()
    nodes = [("127.0.0.1", free_port()), *redis_cluster.startup_nodes]
    client = client_from_config(connection_config(Settings({"REDIS_STARTUP_NODES": nodes})))
    check(client)
    assert client.time()[0] > 0
    crawl = crawl_client(client, RedisKeys.build("pages", hash_tag=True))
    assert crawl.exists("{pages}:nothing") == 0
    client.close()


def test_cli_mid_reshard_says_the_slot_is_moving_and_changes_nothing(
    clean: ClusterServers, run: Any
) -> None:
    """The crawl's slot half moved (its dead-letter list on the new master, its seeds and
    items not yet): ``dead list``, ``export`` and ``reset`` printed Redis's bare "Multiple
    keys request during rehashing of slot" (redis-py strips the TRYAGAIN code), or "lost
    Redis", which do not tell the operator that a reshard is under way and that retrying
    ends it; nothing is changed."""
    url = "redis+cluster://" + nodes_setting(clean)
    code, _, err = run("--redis-url", url, "push", "pages", "https://a.example/1")
    assert code == 0, err
    with clean.client() as plain:
        plain.rpush(f"{TAG}:items", b'{"url": "https://a.example/1"}')
        plain.rpush(f"{TAG}:dead", b'{"reason": "test", "kind": "request"}')
        plain.lpush("{pages-neighbour}:start_urls", b"https://b.example/")  # another crawl
    slot = slot_of(SEEDS)
    source = clean.master_for(SEEDS)
    target = next(node for node in clean.masters() if node.port != source.port)
    with source.client() as src, target.client() as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", f"{TAG}:dead")
        try:
            for args in (
                ["dead", "list", "pages"],
                ["export", "pages", "-o", "-"],
                ["reset", "pages", "--yes"],
            ):
                code, out, err = run("--redis-url", url, *args)
                assert code == 1, (args, out, err)
                assert "being moved to another cluster node" in err or "is migrating" in err
                assert "retry" in err, (args, err)
                assert "lost Redis" not in err, (args, err)
            # every crawl's status: the one whose slot moves must not hide the others
            code, out, err = run("--redis-url", url, "status")
            assert "{pages-neighbour}" in out, (code, out, err)
            assert "is migrating" in out + err, (code, out, err)
            assert src.exists(f"{TAG}:items", SEEDS) == 2
            assert dst.keys(f"{TAG}:dead") == [f"{TAG}:dead".encode()]
        finally:  # end the move as a reshard does
            left = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if left:
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *left)
            for node in clean.masters():
                with node.client() as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    code, out, err = run("--redis-url", url, "dead", "list", "pages")
    assert code == 0, err
    assert "1 record" in out
    with clean.client() as plain:
        plain.delete("{pages-neighbour}:start_urls")


@pytest.mark.e2e
def test_seeds_pushed_to_the_untagged_key_are_named_while_the_crawl_waits(
    clean: ClusterServers, site: TestSite, project: Path, tmp_path: Path
) -> None:
    """Under Cluster the crawl reads {pages}:start_urls; seeds pushed to
    pages:start_urls, as scrapy-redis's tutorials show, waited for ever while the
    workers idled without a word. The waiting worker now names both keys."""
    from scrapy_dist.testing.workers import start_workers, stop_workers, wait_ready

    site.reset_hits()  # (the site is the module's)
    with clean.client() as client:
        client.lpush("pages:start_urls", site.page_url(0))
    [worker] = start_workers(
        1,
        project_dir=project,
        spider="pages",
        log_dir=tmp_path,
        settings={"CLOSE_WHEN_CRAWL_DONE": False},
        stats_setting=None,
    )
    try:
        wait_ready([worker], timeout=60)
        deadline = time.monotonic() + 30
        line = "1 seed(s) wait in pages:start_urls, which this crawl does not read"
        while line not in worker.log_file.read_text():
            assert time.monotonic() < deadline, worker.log_tail(30)
            time.sleep(0.2)
        assert f"seeds go to {SEEDS}" in worker.log_file.read_text()
        assert sum(site.hits().values()) == 0
    finally:
        stop_workers([worker], timeout=5.0)


def test_the_reads_a_flush_carries_for_pauses_and_the_horizon_reach_the_crawl_slot(
    clean: ClusterServers,
) -> None:
    """The slot pauses' EVAL and the registry's HLEN are plain commands in a flush's
    pipeline (scrapy_dist/worker/pauses.py, horizon.py): on a cluster they go to the
    crawl slot's owner like the scripts."""
    from types import SimpleNamespace

    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler

    from scrapy_dist.worker.horizon import StartHorizon
    from scrapy_dist.worker.pauses import SlotPauses

    client = cluster_client(clean)
    keys = RedisKeys.build("pages", hash_tag=True)
    crawl = crawl_client(client, keys)
    frontier: Any = SimpleNamespace(keys=keys)
    stats = MemoryStatsCollector(get_crawler())
    pauses = SlotPauses(
        frontier, lambda r: "busy.example", stats, longest=60, backoff_after=0, backoff=1
    )
    pauses.pause("busy.example", 30, "a test")
    horizon = StartHorizon(1.0, lambda r: None, lambda key: 0.0)  # type: ignore[arg-type,return-value]
    crawl.hset(keys.workers, mapping={"w1": 1, "w2": 2})
    reads = [pauses.rider(), horizon.rider(keys.workers)]
    with crawl.pipeline(transaction=False) as pipe:
        for read in reads:
            assert read is not None
            pipe.execute_command(*read.command.args)  # type: ignore[no-untyped-call]
        replies = pipe.execute(raise_on_error=False)
    for read, reply in zip(reads, replies, strict=True):
        assert read is not None
        read.on_reply(reply)
    assert 29 < pauses.left("busy.example") <= 30
    assert not stats.get_value("scheduler/slots/read_errors")
    assert not horizon.alone()
    owner = clean.master_for(keys.requests)
    with owner.client() as plain:
        assert plain.zscore(keys.slot_pauses, "busy.example") is not None
    client.close()
