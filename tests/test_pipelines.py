"""RedisPipeline and ``scrapy-dist export``: every item stored and exported exactly once."""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import scrapy
from scrapy.utils.serialize import ScrapyJSONEncoder
from scrapy.utils.test import get_crawler
from twisted.internet.defer import Deferred

import scrapy_dist
from scrapy_dist.cli import main
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.pipelines import RedisPipeline
from scrapy_dist.stats import decode_stats
from scrapy_dist.testing.crawl import WorkerCrawl
from scrapy_dist.testing.redis_server import RedisServer
from scrapy_dist.testing.refusals import refuse_noreplicas, refuse_oom, refuse_readonly
from scrapy_dist.testing.site import TestSite
from scrapy_dist.testing.workers import run_cli
from scrapy_dist.writers import ItemWriter

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from scrapy.crawler import Crawler


class Book(scrapy.Item):
    title = scrapy.Field()
    seen = scrapy.Field()


def upper_serializer(item: Any) -> str:
    return str(dict(item)["title"]).upper()


def pipeline(crawler: Crawler) -> RedisPipeline:
    p = RedisPipeline.from_crawler(crawler)
    p.open_spider()
    return p


def test_every_item_is_stored_once_in_order(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    p = pipeline(make_crawler({"REDIS_ITEMS_BATCH_SIZE": 7}))
    seen = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
    items: list[Any] = [{"n": i, "title": "é"} for i in range(1000)]
    items.append(Book(title="Dune", seen=seen))
    returned = [p.process_item(item) for item in items]
    p.close_spider()
    assert [_result(r) for r in returned] == items
    stored = [json.loads(raw) for raw in client.lrange(f"{name}:items", 0, -1)]
    assert stored[:1000] == [{"n": i, "title": "é"} for i in range(1000)]
    # as Scrapy's JSON encoder writes a datetime (its format changed after Scrapy 2.13)
    assert stored[1000] == {"title": "Dune", "seen": json.loads(ScrapyJSONEncoder().encode(seen))}
    assert len(stored) == 1001
    assert p.writer.sent == 1001


def _result(returned: Any) -> Any:
    """What ``process_item`` gave back: the item, or what its Deferred fired with."""
    if isinstance(returned, Deferred):
        assert returned.called, "process_item's Deferred has not fired"
        return returned.result
    return returned


def test_under_scrapy_dists_scheduler_process_item_returns_once_the_item_is_stored(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    """A page is acknowledged once Scrapy is done with it, its items' pipelines
    included: an item buffered for up to REDIS_ITEMS_FLUSH_INTERVAL was lost when the
    worker was killed after the page's acknowledgement had reached Redis (2 runs of 4,
    a 400-page crawl). Under another scheduler it returns at once, as before."""
    waits = pipeline(make_crawler({"REDIS_ITEMS_FLUSH_INTERVAL": 30}))
    returned = waits.process_item({"n": 1})
    assert isinstance(returned, Deferred)
    deadline = time.monotonic() + 10
    while not returned.called and time.monotonic() < deadline:
        time.sleep(0.01)  # sent at once: someone waits for it
    assert returned.called
    assert client.lrange(f"{name}:items", 0, -1) == [b'{"n": 1}']
    waits.close_spider()
    plain = pipeline(make_crawler({"SCHEDULER": "scrapy.core.scheduler.Scheduler"}))
    assert plain.process_item({"n": 2}) == {"n": 2}
    plain.close_spider()


def test_maxlen_key_template_and_serializer(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    p = pipeline(
        make_crawler(
            {
                "REDIS_ITEMS_MAXLEN": 5,
                "REDIS_ITEMS_KEY": "%(spider)s:books",
                "REDIS_ITEMS_SERIALIZER": f"{__name__}.upper_serializer",
                "REDIS_ITEMS_BATCH_SIZE": 3,
            }
        )
    )
    for i in range(20):
        p.process_item({"title": f"t{i}"})
    p.close_spider()
    assert client.lrange(f"{name}:books", 0, -1) == [f"T{i}".encode() for i in range(15, 20)]


def test_items_wait_for_redis_and_are_never_lost(tmp_path: Path) -> None:
    with RedisServer(directory=tmp_path / "redis", appendonly=True) as server:
        client = server.client(socket_timeout=1)
        writer = ItemWriter(client, "x:items", batch_size=10, flush_interval=0.05)
        writer.start()
        for i in range(25):
            writer.put(b"%d" % i)
        deadline = time.monotonic() + 10

        # stored, and the writer has the replies (a loaded machine may deschedule its
        # thread between Redis storing the last batch and the reply being read)
        def stored() -> bool:
            return client.llen("x:items") == 25 and writer.unsent == 0

        while not stored():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.kill()
        started = time.monotonic()
        for i in range(25, 60):
            writer.put(b"%d" % i)  # never blocks, whatever Redis does
        assert time.monotonic() - started < 0.5  # well under the 1 s socket timeout
        time.sleep(0.3)
        assert writer.unsent == 35
        server.restart()
        assert writer.close() == 0
        client = server.client()
        assert client.lrange("x:items", 0, -1) == [b"%d" % i for i in range(60)]


def test_wrong_key_type_is_refused_at_open(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    client.set(f"{name}:items", "x")
    p = RedisPipeline.from_crawler(make_crawler())
    with pytest.raises(ConfigurationError, match="holds a string"):
        p.open_spider()


def test_export_copies_and_moves_items_exactly_once(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    key = f"{name}:items"
    client.rpush(key, *[json.dumps({"n": i}) for i in range(2500)])
    copy = tmp_path / "copy.jl"
    assert main(["export", name, "-o", str(copy), "--redis-url", redis_url]) == 0
    assert [json.loads(line)["n"] for line in copy.read_text().splitlines()] == list(range(2500))
    assert client.llen(key) == 2500

    # workers keep appending while the export moves items out: none lost, none twice
    stop = threading.Event()

    def produce() -> None:
        n = 2500
        while not stop.is_set():
            client.rpush(key, json.dumps({"n": n}))
            n += 1

    producer = threading.Thread(target=produce)
    producer.start()
    moved = tmp_path / "moved.jl"
    try:
        assert main(["export", name, "-o", str(moved), "--delete", "--redis-url", redis_url]) == 0
        assert main(["export", name, "-o", str(moved), "--delete", "--redis-url", redis_url]) == 2
        assert (
            main(
                ["export", name, "-o", str(moved), "--delete", "--append", "--redis-url", redis_url]
            )
            == 0
        )
    finally:
        stop.set()
        producer.join()
    exported = [json.loads(line)["n"] for line in moved.read_text().splitlines()]
    left = [json.loads(raw)["n"] for raw in client.lrange(key, 0, -1)]
    assert exported + left == list(range(len(exported) + len(left)))
    assert len(exported) >= 2500


@pytest.mark.e2e
def test_export_never_moves_items_where_they_could_be_lost(
    redis_url: str, client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """``export --delete -o - | head -2`` removed 1,000 items from Redis for 2 that anyone
    read, and exited 0 (the pipe took the chunk, could not be synced, and the reader
    stopped). A plain ``export`` over the file an earlier ``--delete`` filled truncated
    it: the only copy of those items. Both are refused now, as an operator runs them."""
    key = f"{name}:items"
    client.rpush(key, *[json.dumps({"n": i}) for i in range(2500)])
    url = ["--redis-url", redis_url]

    piped = subprocess.run(
        f"{shlex.quote(sys.executable)} -m scrapy_dist export {name} -o - --delete "
        f"{' '.join(url)} | head -2",
        shell=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(scrapy_dist.__file__).parents[1])},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "--delete writes to a regular file only, not stdout" in piped.stderr
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused = run_cli("export", name, "-o", str(fifo), "--delete", *url, cwd=tmp_path)
    assert refused.returncode == 2
    assert f"--delete writes to a regular file only, not {fifo}" in refused.stderr
    assert client.llen(key) == 2500

    moved = tmp_path / "moved.jl"
    done = run_cli("export", name, "-o", str(moved), "--delete", *url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert client.llen(key) == 0
    client.rpush(key, json.dumps({"n": 2500}))
    again = run_cli("export", name, "-o", str(moved), *url, cwd=tmp_path)
    assert again.returncode == 2
    assert f"{moved} exists and is not empty: pass --append" in again.stderr
    assert len(moved.read_text().splitlines()) == 2500

    added = run_cli("export", name, "-o", str(moved), "--append", *url, cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert [json.loads(line)["n"] for line in moved.read_text().splitlines()] == list(range(2501))
    replaced = run_cli("export", name, "-o", str(moved), "--overwrite", *url, cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert moved.read_text().splitlines() == [json.dumps({"n": 2500})]


# -- Redis refusing writes: kept, retried, said once, counted, never dropped -------


def _wrong_type(client: redis.Redis) -> Callable[[], object]:
    pipe = client.pipeline(transaction=True)
    pipe.rename("x:items", "x:saved")
    pipe.set("x:items", "oops")
    pipe.execute()

    def restore() -> None:  # atomic, or a write in between would be overwritten
        pipe = client.pipeline(transaction=True)
        pipe.delete("x:items")
        pipe.rename("x:saved", "x:items")
        pipe.execute()

    return restore


def writer_of(server: RedisServer, tmp_path: Path, **options: Any) -> ItemWriter:
    crawler = get_crawler(settings_dict={"LOG_LEVEL": "CRITICAL"})
    options = {"batch_size": 10, "flush_interval": 0.05, **options}
    writer = ItemWriter(
        server.client(),
        "x:items",
        rejected_file=str(tmp_path / "%(key)s.rejected.jl"),
        stats=crawler.stats,
        **options,
    )
    writer.start()
    return writer


def wait_for(done: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.redis_server
@pytest.mark.parametrize(
    ("fault", "code"),
    [
        (refuse_oom, "OOM"),
        (refuse_noreplicas, "NOREPLICAS"),
        (refuse_readonly, "READONLY"),
        (_wrong_type, "WRONGTYPE"),
    ],
    ids=["oom", "noreplicas", "readonly", "wrongtype"],
)
def test_items_refused_for_now_are_kept_in_order_and_said_once(
    server: RedisServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    fault: Callable[[redis.Redis], Callable[[], object]],
    code: str,
) -> None:
    admin = server.client()
    writer = writer_of(server, tmp_path)
    writer.put(b"0")
    wait_for(lambda: writer.sent == 1)
    with caplog.at_level(logging.INFO, logger="scrapy_dist.pipelines"):
        restore = fault(admin)
        try:
            for i in range(1, 200):
                writer.put(str(i).encode())
            # several attempts, refused (waited for: a loaded machine may make fewer
            # than two in a fixed time, the second coming 0.5 s after the first)
            collector = writer.stats
            assert collector is not None
            refused = f"items/redis/refused/{code}"
            wait_for(lambda: (collector.get_value(refused) or 0) >= 2)
            assert writer.unsent == 199
        finally:
            restore()
        assert writer.close() == 0
    assert [int(x) for x in admin.lrange("x:items", 0, -1)] == list(range(200))
    stats = writer.stats.get_stats() if writer.stats else {}
    assert stats[f"items/redis/refused/{code}"] >= 2
    assert not (tmp_path / "x_items.rejected.jl").exists()
    lines = [r.getMessage() for r in caplog.records]
    assert sum(f"refuses writes ({code}" in line for line in lines) == 1, lines
    assert sum("stored in x:items again" in line for line in lines) == 1, lines


@pytest.mark.redis_server
def test_items_refused_for_good_are_kept_in_a_file_the_log_names(
    server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    admin = server.client()
    admin.set("x:items", "oops")  # for longer than the wrong type is waited for
    writer = writer_of(server, tmp_path, wrongtype_timeout=0.0)
    with caplog.at_level(logging.INFO, logger="scrapy_dist.pipelines"):
        for i in range(35):
            writer.put(str(i).encode())
        wait_for(lambda: writer.rejected == 35)
        assert writer.close() == 0
    kept = tmp_path / "x_items.rejected.jl"
    assert kept.read_bytes().splitlines() == [str(i).encode() for i in range(35)]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors  # one line, not one per batch
    assert str(kept) in errors[0]
    assert writer.stats is not None
    assert writer.stats.get_value("items/redis/rejected") == 35


@pytest.mark.redis_server
def test_close_keeps_what_redis_still_refuses_and_reports_it(
    server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    admin = server.client()
    p = RedisPipeline(writer_of(server, tmp_path))
    p.close_timeout = 1.0
    restore = refuse_oom(admin)
    try:
        for i in range(25):
            p.process_item({"n": i})
        with caplog.at_level(logging.INFO, logger="scrapy_dist.pipelines"):
            assert p.close_spider() is None  # no reactor running: done on return
    finally:
        restore()
    kept = tmp_path / "x_items.rejected.jl"
    assert [json.loads(line)["n"] for line in kept.read_bytes().splitlines()] == list(range(25))
    report = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("25 item(s)" in line and str(kept) in line for line in report), report


@pytest.mark.redis_server
def test_a_full_buffer_makes_scrapy_wait_instead_of_growing(
    server: RedisServer, tmp_path: Path
) -> None:
    admin = server.client()
    p = RedisPipeline(writer_of(server, tmp_path, buffer_max=20))
    restore = refuse_oom(admin)
    try:
        results = [p.process_item({"n": i}) for i in range(25)]
        assert all(isinstance(r, dict) for r in results[:19])
        waiting = [r for r in results if isinstance(r, Deferred)]
        assert len(waiting) == 6
        fired: list[Any] = []
        for d in waiting:
            d.addCallback(fired.append)
        time.sleep(1.0)
        assert fired == []  # Redis still refuses: Scrapy keeps waiting
    finally:
        restore()
    wait_for(lambda: len(fired) == 6)
    assert [item["n"] for item in fired] == list(range(19, 25))
    p.close_spider()
    assert len(admin.lrange("x:items", 0, -1)) == 25
    assert p.writer.stats is not None
    assert p.writer.stats.get_value("items/redis/backpressure") == 6


PROJECT = Path(__file__).parent / "project"


@pytest.mark.e2e
def test_a_crawl_through_an_oom_window_stores_every_item_once_and_counts_right(
    server: RedisServer, tmp_path: Path
) -> None:
    settings = {
        "CONCURRENT_REQUESTS": 4,
        "SCHEDULER_PREFETCH": 1,
        "SCHEDULER_LEASE_TIMEOUT": 30,
        "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
        "SCHEDULER_WORKER_TIMEOUT": 2,
        "CLOSE_WHEN_CRAWL_DONE": True,
        "CRAWL_DONE_GRACE": 1,
        "SCHEDULER_PERSIST": True,
        "ITEM_PIPELINES": json.dumps({"scrapy_dist.pipelines.RedisPipeline": 300}),
        "STATS_CLASS": "scrapy_dist.stats.RedisStatsCollector",
        "STATS_FLUSH_INTERVAL": 0.5,
        "REDIS_ITEMS_FLUSH_INTERVAL": 0.2,
        "REDIS_ITEMS_REJECTED_FILE": str(tmp_path / "%(key)s.%(pid)s.rejected.jl"),
    }
    with TestSite(pages=600, delay=0.01) as site:
        crawl = WorkerCrawl(server, site, tmp_path, project_dir=PROJECT, settings=settings)
        try:
            crawl.start(2)
            crawl.seed()
            crawl.hit_when(150)
            crawl.client.config_set("maxmemory", 1)  # noeviction: every write refused
            try:
                time.sleep(4)
                assert all(w.returncode is None for w in crawl.workers), crawl.logs()
            finally:
                crawl.client.config_set("maxmemory", 0)
            assert crawl.wait(120) == [0, 0], crawl.logs()
            assert not crawl.missing(), crawl.logs()
            urls = [json.loads(raw)["url"] for raw in crawl.client.lrange("pages:items", 0, -1)]
            assert len(urls) == len(set(urls)) == 600
            assert not list(tmp_path.glob("*.rejected.jl"))
            shared = decode_stats(cast("dict[bytes, bytes]", crawl.client.hgetall("pages:stats")))
            assert shared["item_scraped_count"] == 600
            assert shared["response_received_count"] == sum(site.hits().values())
            assert shared["items/redis/stored"] == 600
            # refusals counted and said, once per worker and outage
            assert shared["items/redis/refused/OOM"] >= 2
            assert shared["stats/redis/refused/OOM"] >= 2
            logs = crawl.full_logs()
            assert logs.count("refuses writes (OOM") >= 2
            # an outage of the items is said once, as its end (a worker whose pages all
            # waited for the frontier during the window had no item to send)
            items_down = logs.count("item(s) for pages:items in memory")
            assert items_down >= 1
            assert logs.count("Items are stored in pages:items again") == items_down, crawl.logs()
            assert logs.count("Stats are written to pages:stats again") == 2, crawl.logs()
            assert "crawl_finished" in logs
        finally:
            crawl.close()


@pytest.mark.e2e
def test_a_worker_killed_mid_crawl_loses_no_item(server: RedisServer, tmp_path: Path) -> None:
    """kill -9 of a worker lost items stored by RedisPipeline: a page's acknowledgement
    reached Redis on the 0.1 s timer, its items up to a second later (2 runs of 4 lost
    one). Now a page is acknowledged only once its items are stored: every page has
    its item, a page the killed worker held is crawled again."""
    settings = {
        "CONCURRENT_REQUESTS": 8,
        "SCHEDULER_LEASE_TIMEOUT": 3,
        "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
        "SCHEDULER_WORKER_TIMEOUT": 2,
        "CLOSE_WHEN_CRAWL_DONE": True,
        "CRAWL_DONE_GRACE": 1,
        "ITEM_PIPELINES": json.dumps({"scrapy_dist.pipelines.RedisPipeline": 300}),
    }
    with TestSite(pages=400, delay=0.01) as site:
        crawl = WorkerCrawl(server, site, tmp_path, project_dir=PROJECT, settings=settings)
        try:
            killed, _ = crawl.start(2)
            crawl.seed()
            crawl.hit_when(120)
            killed.process.kill()
            killed.process.wait(10)
            assert crawl.wait(120)[1] == 0, crawl.logs()
            assert not crawl.missing(), crawl.logs()
            urls = {json.loads(raw)["url"] for raw in crawl.client.lrange("pages:items", 0, -1)}
            assert urls == {site.url + path for path in site.expected_paths()}, crawl.logs()
        finally:
            crawl.close()


@pytest.mark.e2e
def test_a_forced_shutdown_during_an_outage_keeps_the_buffered_items(
    server: RedisServer, tmp_path: Path
) -> None:
    settings = {
        "CONCURRENT_REQUESTS": 4,
        "SCHEDULER_PREFETCH": 1,
        "ITEM_PIPELINES": json.dumps({"scrapy_dist.pipelines.RedisPipeline": 300}),
        "REDIS_ITEMS_FLUSH_INTERVAL": 0.2,
        "REDIS_ITEMS_CLOSE_TIMEOUT": 2,
        "REDIS_ITEMS_REJECTED_FILE": str(tmp_path / "%(key)s.%(pid)s.rejected.jl"),
    }
    with TestSite(pages=600, delay=0.05) as site:
        crawl = WorkerCrawl(server, site, tmp_path, project_dir=PROJECT, settings=settings)
        try:
            (worker,) = crawl.start(1)
            crawl.seed()
            crawl.hit_when(50)
            crawl.client.config_set("maxmemory", 1)
            try:
                time.sleep(2)
                worker.process.send_signal(signal.SIGINT)
                time.sleep(0.5)
                worker.process.send_signal(signal.SIGINT)  # forced: no close_spider
                crawl.wait(60)
            finally:
                crawl.client.config_set("maxmemory", 0)
            stored = [json.loads(raw)["url"] for raw in crawl.client.lrange("pages:items", 0, -1)]
            (kept_file,) = tmp_path.glob("*.rejected.jl")
            kept = [json.loads(line)["url"] for line in kept_file.read_text().splitlines()]
            assert kept, crawl.logs()
            # every page fetched gave one item, stored or kept, not both (but for the
            # responses still downloading when the reactor stopped)
            assert sorted(stored + kept) == sorted(set(stored) | set(kept))
            in_flight = 4 + 1  # CONCURRENT_REQUESTS + SCHEDULER_PREFETCH
            fetched = len(site.hits())
            assert fetched - in_flight <= len(stored) + len(kept) <= fetched, crawl.logs()
            assert f"{len(kept)} item(s) Redis did not take are kept in {kept_file}" in (
                crawl.full_logs()
            )
        finally:
            crawl.close()


def test_a_from_settings_override_that_returns_no_pipeline_is_a_configuration_error(
    make_crawler: Callable[..., Any],
) -> None:
    class Broken(RedisPipeline):
        @classmethod
        def from_settings(cls, settings: Any) -> Any:
            return None

    with pytest.raises(ConfigurationError, match=r"Broken\.from_settings returned None"):
        Broken.from_crawler(make_crawler())


def test_from_settings_builds_the_writer_the_items_settings_ask_for(redis_url: str) -> None:
    """scrapy-redis's factory gave the pipeline a writer with every default: a subclass
    built by it ignored REDIS_ITEMS_MAXLEN and the batch, buffer and close settings."""
    from scrapy.settings import Settings

    settings = Settings(
        {
            "REDIS_URL": redis_url,
            "REDIS_ITEMS_MAXLEN": 50,
            "REDIS_ITEMS_BATCH_SIZE": 7,
            "REDIS_ITEMS_BUFFER_MAX": 900,
            "REDIS_ITEMS_CLOSE_TIMEOUT": 3,
        }
    )
    pipeline = RedisPipeline.from_settings(settings)
    writer = pipeline.writer
    assert (writer.maxlen, writer.batch_size, writer.buffer_max) == (50, 7, 900)
    assert pipeline.close_timeout == 3


class OwnFromCrawler(RedisPipeline):
    """scrapy-redis's own ``from_crawler``, as its users copy it to add to it."""

    counted: object = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        pipeline = cls.from_settings(crawler.settings)
        pipeline.counted = crawler.stats
        return pipeline


class FactoryMixin:
    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cast("Any", cls).from_settings(crawler.settings)


class MixedIn(FactoryMixin, RedisPipeline):
    """A ``from_crawler`` inherited from a mixin that is no pipeline."""


class OnTopOfOwn(OwnFromCrawler):
    """A ``from_crawler`` calling a parent's own one."""

    extra = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        pipeline = super().from_crawler(crawler)
        pipeline.extra = True
        return pipeline


class CopiedFromSettings(RedisPipeline):
    """scrapy-redis 0.9's own ``from_settings``, as its users copy it to add to it: the
    client passed as ``server=``."""

    @classmethod
    def from_settings(cls, settings: Any) -> Any:
        params: dict[str, Any] = {"server": scrapy_dist.connection.from_settings(settings)}
        if settings.get("REDIS_ITEMS_KEY"):
            params["key"] = settings["REDIS_ITEMS_KEY"]
        return cls(**params)


class StaticFromCrawler(RedisPipeline):
    """A ``from_crawler`` written as a staticmethod, building with scrapy-redis's
    ``RedisPipeline(server)``."""

    @staticmethod
    def from_crawler(crawler: Crawler) -> Any:
        return StaticFromCrawler(scrapy_dist.connection.from_settings(crawler.settings))


@pytest.mark.parametrize(
    "cls", [OwnFromCrawler, MixedIn, OnTopOfOwn, CopiedFromSettings, StaticFromCrawler]
)
def test_a_pipeline_from_a_subclass_own_from_crawler_writes_to_the_jobs_list(
    make_crawler: Callable[..., Any], client: redis.Redis, name: str, cls: type[RedisPipeline]
) -> None:
    """A from_crawler that calls from_settings gave a pipeline that knew no crawler: on
    Scrapy 2.19 (no spider passed) its items went to a literal ``%(spider)s:items``, on
    2.13 to ``<spider>:items``, not the job's list; its writer had no stats. A
    staticmethod ``from_crawler``'s pipeline still did; scrapy-redis's ``from_settings``
    copied into a subclass (``cls(server=...)``) raised TypeError."""
    crawler: Crawler = make_crawler({"SCHEDULER_JOB_ID": "j1", "REDIS_ITEMS_FLUSH_INTERVAL": 0.05})
    p = cls.from_crawler(crawler)
    assert p.crawler is crawler
    assert p.key == f"{name}:j1:items"
    assert p.writer.stats is crawler.stats
    assert p.writer.rejected_file.name == f"{name}_j1_items.{os.getpid()}.rejected.jl"
    p.open_spider()
    p.process_item({"n": 1})  # Scrapy >= 2.19: no spider
    p.process_item({"n": 2}, crawler.spider)  # Scrapy 2.13
    p.close_spider()
    assert [json.loads(raw)["n"] for raw in client.lrange(f"{name}:j1:items", 0, -1)] == [1, 2]
    assert not client.exists("%(spider)s:items", f"{name}:items")


class OwnOpenSpider(RedisPipeline):
    """An ``open_spider`` of its own, as scrapy-redis users write it: scrapy-redis's
    pipeline has none, so it calls no ``super()``."""

    def open_spider(self, spider: Any = None) -> None:
        self.opened = True


def test_items_are_sent_when_an_open_spider_override_does_not_call_ours(
    make_crawler: Callable[..., Any], client: redis.Redis, name: str, tmp_path: Path
) -> None:
    """Nothing started the writer's thread: from the ``REDIS_ITEMS_BUFFER_MAX``-th item
    on, Scrapy waited for room that never came (the crawl hung), and at close every
    item went to the rejected file, "Redis did not accept them", none to Redis."""
    crawler = make_crawler(
        {
            "REDIS_ITEMS_FLUSH_INTERVAL": 0.05,
            "REDIS_ITEMS_BUFFER_MAX": 5,
            "REDIS_ITEMS_REJECTED_FILE": str(tmp_path / "%(key)s.jl"),
        }
    )
    p = OwnOpenSpider.from_crawler(crawler)
    p.open_spider(crawler.spider)
    stored: list[Any] = []
    for n in range(8):
        result = p.process_item({"n": n}, crawler.spider)
        if isinstance(result, Deferred):
            result.addCallback(stored.append)
        else:
            stored.append(result)
    deadline = time.monotonic() + 10
    while len(stored) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(stored) == 8  # every item handed back to Scrapy
    p.close_spider(crawler.spider)
    assert [json.loads(raw)["n"] for raw in client.lrange(f"{name}:items", 0, -1)] == list(range(8))
    assert not list(tmp_path.iterdir())


def test_a_pipeline_takes_a_writer_or_a_server_not_both_nor_none(redis_url: str) -> None:
    import redis as redis_py

    server = redis_py.Redis.from_url(redis_url)
    assert RedisPipeline(server=server, key="books:all").key == "books:all"
    with pytest.raises(TypeError, match="a writer or a server"):
        RedisPipeline()
    with pytest.raises(TypeError, match="a writer or a server"):
        RedisPipeline(ItemWriter(server, "a"), server=server)


def test_a_subclass_from_crawler_returning_no_pipeline_is_left_to_scrapy(
    make_crawler: Callable[..., Any],
) -> None:
    class Elsewhere(RedisPipeline):
        @classmethod
        def from_crawler(cls, crawler: Crawler) -> Any:
            return None

    assert Elsewhere.from_crawler(make_crawler()) is None  # build_from_crawler refuses it


class KeepsTemplate(RedisPipeline):
    @classmethod
    def from_settings(cls, settings: Any) -> Any:
        return super().from_settings(settings)


def test_the_rejected_file_follows_the_job_key_a_from_settings_override_gets(
    make_crawler: Callable[..., Any], name: str, tmp_path: Path
) -> None:
    """The writer named its rejected file when built, after the key's template
    (``_(spider)s_items``); the template got the job only afterwards."""
    template = str(tmp_path / "%(key)s.rejected.jl")
    crawler = make_crawler({"SCHEDULER_JOB_ID": "j1", "REDIS_ITEMS_REJECTED_FILE": template})
    p = KeepsTemplate.from_crawler(crawler)
    assert p.key == f"{name}:j1:items"
    assert p.writer.rejected_file == tmp_path / f"{name}_j1_items.rejected.jl"


def test_binding_a_pipeline_built_by_hand_leaves_its_own_key_and_stats(
    make_crawler: Callable[..., Any], redis_url: str
) -> None:
    import redis as redis_py

    crawler = make_crawler({"SCHEDULER_JOB_ID": "j1"})
    stats = get_crawler().stats
    writer = ItemWriter(redis_py.Redis.from_url(redis_url), "books:all", stats=stats)
    p = RedisPipeline(writer)
    p._bind(crawler)
    p._bind(crawler)  # again: nothing changes
    assert (p.key, p.writer.stats, p.crawler) == ("books:all", stats, crawler)
    bad = RedisPipeline(ItemWriter(writer.client, "%(nope)s:items"))
    with pytest.raises(ConfigurationError, match="REDIS_ITEMS_KEY '%\\(nope\\)s:items'"):
        bad._bind(crawler)


class SetsItsKey(RedisPipeline):
    """scrapy-redis's ``key`` is an attribute its users set."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        pipeline = cls.from_settings(crawler.settings)
        pipeline.key = "%(spider)s:custom"
        return pipeline


def test_a_key_a_subclass_sets_in_its_factory_gets_the_jobs_name(
    make_crawler: Callable[..., Any], name: str
) -> None:
    """Setting ``key``, as scrapy-redis users do, raised AttributeError."""
    p = SetsItsKey.from_crawler(make_crawler({"SCHEDULER_JOB_ID": "j1"}))
    assert p.key == p.writer.key == f"{name}:j1:custom"
