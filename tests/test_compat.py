"""scrapy-redis compatibility: its names, hooks and default behaviours.

A scrapy-redis project renamed to scrapy_dist must run unchanged: first as a user runs
it (``scrapy crawl`` workers of a project written the scrapy-redis way), then name by
name. ``make compat`` runs scrapy-redis's own test suite and example project.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from typing import TYPE_CHECKING, Any, cast

import pytest
from scrapy import Request, Spider, signals
from scrapy.exceptions import DontCloseSpider
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_dist import connection, defaults, picklecompat, utils
from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.pipelines import RedisPipeline
from scrapy_dist.queue import (
    Base,
    FifoQueue,
    LifoQueue,
    PriorityQueue,
    SpiderPriorityQueue,
    SpiderQueue,
    SpiderStack,
)
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.spiders import RedisMixin, RedisSpider, RedisSpiderMixin
from scrapy_dist.testing import TestSite, start_workers, stop_workers, wait_workers

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import redis
    from scrapy.crawler import Crawler

# -- as a user runs it: scrapy crawl workers of a scrapy-redis style project -------------

SETTINGS = """
BOT_NAME = "legacy"
SPIDER_MODULES = ["legacy.spiders"]
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
SCHEDULER = "scrapy_dist.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_dist.dupefilter.RFPDupeFilter"
SCHEDULER_PERSIST = True
SCHEDULER_SERIALIZER = "scrapy_dist.picklecompat"
ITEM_PIPELINES = {"scrapy_dist.pipelines.RedisPipeline": 300}
CLOSE_WHEN_CRAWL_DONE = True
"""

SPIDERS = """
from scrapy import Spider
from scrapy_dist.spiders import RedisSpider


class Follow(RedisSpider):
    name = "follow"

    def parse(self, response):
        yield {"url": response.url, "job": response.meta.get("job-id")}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href)


class Plain(Spider):
    name = "plain"

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href)
"""


def make_project(root: Path, extra: str = "") -> Path:
    """A Scrapy project written the scrapy-redis way (renamed), in ``root``."""
    package = root / "legacy"
    (package / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = legacy.settings\n")
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(SETTINGS + textwrap.dedent(extra))
    (package / "spiders" / "__init__.py").write_text(SPIDERS)
    return root


def set_start_url(project: Path, url: str) -> None:
    """Give the project's plain spider ``start_urls = [url]``."""
    spiders = project / "legacy" / "spiders" / "__init__.py"
    plain = '    name = "plain"\n'
    spiders.write_text(SPIDERS.replace(plain, f"{plain}    start_urls = [{url!r}]\n"))


def crawl(
    project: Path, spider: str, logs: Path, settings: dict[str, Any], count: int = 1
) -> list[str]:
    """Run ``count`` workers of ``spider`` to the end; return their logs."""
    logs.mkdir(parents=True, exist_ok=True)
    workers = start_workers(
        count,
        project_dir=project,
        spider=spider,
        log_dir=logs,
        settings=settings,
        stats_setting=None,
    )
    try:
        assert wait_workers(workers, timeout=60) == [0] * count, workers[0].log_tail()
    finally:
        stop_workers(workers)
    return [w.log_file.read_text() for w in workers]


@pytest.mark.e2e
def test_scrapy_redis_project_runs_unchanged(
    tmp_path: Path, redis_url: str, client: redis.Redis, name: str
) -> None:
    """REDIS_URL with REDIS_HOST, the picklecompat serializer, scrapy-redis's JSON seed
    and a seed pushed again by a recurring crawl: all as in scrapy-redis."""
    project = make_project(tmp_path / "project")
    # REDIS_HOST/REDIS_PORT point nowhere: the URL wins, with a warning
    settings = {
        "REDIS_URL": redis_url,
        "REDIS_HOST": "unreachable.invalid",
        "REDIS_PORT": 1,
        "SCHEDULER_JOB_ID": name,
    }
    seeds = f"follow:{name}:start_urls"
    with TestSite(pages=30) as site:
        client.lpush(
            seeds,
            json.dumps(
                {"url": site.page_url(0), "meta": {"job-id": "j1"}, "url_cookie_key": "abc"}
            ),
        )
        (log,) = crawl(project, "follow", tmp_path / "run1", settings)
        assert "REDIS_URL is set together with REDIS_HOST, REDIS_PORT" in log
        assert "SCHEDULER_SERIALIZER uses pickle" in log
        hits = site.hits()
        assert set(hits) == site.expected_paths()
        # the seed's URL carries its form data (/page/0?url_cookie_key=abc); no page
        # links back to page 0: every page is fetched once
        assert hits.pop("/page/0") == 1
        assert set(hits.values()) == {1}
        items = [json.loads(i) for i in client.lrange(f"follow:{name}:items", 0, -1)]
        seed_item = next(i for i in items if "url_cookie_key=abc" in i["url"])
        assert seed_item["job"] == "j1"

        # a recurring crawl pushes a URL crawled before: it is crawled again
        client.lpush(seeds, site.page_url(5))
        crawl(project, "follow", tmp_path / "run2", settings)
        assert site.hits()["/page/5"] == 2
        assert client.llen(f"follow:{name}:dead") == 0


QUEUES = """
from scrapy_dist.queue import Base


class ListQueue(Base):
    def push(self, request):
        self.server.lpush(self.key, self._encode_request(request))

    def pop(self, timeout=0):
        data = self.server.rpop(self.key)
        return self._decode_request(data) if data else None

    def __len__(self):
        return self.server.llen(self.key)
"""


@pytest.mark.e2e
def test_custom_base_queue_crawls_unleased_with_two_workers(
    tmp_path: Path, redis_url: str, client: redis.Redis, name: str
) -> None:
    project = make_project(tmp_path / "project")
    (project / "legacy" / "queues.py").write_text(QUEUES)
    settings = {
        "REDIS_URL": redis_url,
        "SCHEDULER_JOB_ID": name,
        "SCHEDULER_PERSIST": False,
        "SCHEDULER_QUEUE_CLASS": "legacy.queues.ListQueue",
    }
    with TestSite(pages=60, delay=0.05) as site:
        client.lpush(f"follow:{name}:start_urls", site.page_url(0))
        logs = crawl(project, "follow", tmp_path / "logs", settings, count=2)
        hits = site.hits()
    assert all("requests a worker has taken are lost if it dies" in log for log in logs)
    assert set(hits) == site.expected_paths()
    assert set(hits.values()) == {1}
    assert client.scard(f"follow:{name}:dupefilter") > 0  # kept: nothing deleted at close


@pytest.mark.e2e
def test_plain_spider_start_url_once_with_two_workers(
    tmp_path: Path, redis_url: str, client: redis.Redis, name: str
) -> None:
    project = make_project(tmp_path / "project")
    # slow pages, so the crawl lasts longer than the gap between the workers' starts
    with TestSite(pages=60, delay=1.0) as site:
        set_start_url(project, site.page_url(0))
        settings = {"REDIS_URL": redis_url, "SCHEDULER_JOB_ID": name, "CLOSE_WHEN_CRAWL_DONE": True}
        crawl(project, "plain", tmp_path / "logs", settings, count=2)
        hits = site.hits()
    assert set(hits) == site.expected_paths()
    assert hits["/page/0"] == 1  # each worker's start request, crawled once in all


@pytest.mark.e2e
def test_standalone_dupefilter_forgets_between_runs(
    tmp_path: Path, redis_url: str, client: redis.Redis
) -> None:
    """RFPDupeFilter with Scrapy's own scheduler: a per-run key, deleted at close."""
    project = make_project(tmp_path / "project")
    with TestSite(pages=20) as site:
        set_start_url(project, site.page_url(0))
        settings = {"REDIS_URL": redis_url, "SCHEDULER": "scrapy.core.scheduler.Scheduler"}
        for run in (1, 2):
            crawl(project, "plain", tmp_path / f"run{run}", settings)
            # every page again on the second run (the start page is fetched once more
            # per run, through the links back to it: Scrapy's start requests are never
            # filtered or recorded, as with Scrapy's own dupefilter)
            hits = site.hits()
            assert {v for p, v in hits.items() if p != "/page/0"} == {run}
    assert list(client.scan_iter(match="dupefilter:*")) == []


# -- names --------------------------------------------------------------------------------


def test_scrapy_redis_names() -> None:
    import scrapy_dist

    assert scrapy_dist.get_redis is connection.get_redis
    assert connection.from_settings is connection.get_redis_from_settings
    assert isinstance(connection.get_redis(), defaults.REDIS_CLS)
    assert defaults.SCHEDULER_QUEUE_KEY == "%(spider)s:requests"
    assert defaults.DUPEFILTER_KEY == "dupefilter:%(timestamp)s"
    assert picklecompat.loads(picklecompat.dumps({"a": b"b"})) == {"a": b"b"}
    assert utils.bytes_to_str(b"\xc1", "latin1") == "\xc1"
    assert (SpiderQueue, SpiderStack, SpiderPriorityQueue) == (FifoQueue, LifoQueue, PriorityQueue)
    assert RedisMixin is RedisSpiderMixin
    assert list(inspect.signature(RFPDupeFilter).parameters)[:3] == [
        "backend",
        "fingerprinter",
        "debug",
    ]
    assert callable(Scheduler.flush)


def test_redis_params_and_url_precedence(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings({"REDIS_URL": "redis://:pw@h:7/3", "REDIS_HOST": "x", "REDIS_PORT": 1})
    kwargs = connection.get_redis_from_settings(settings).connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("h", 7, 3)
    assert "REDIS_URL is set together with" in caplog.text


# -- the dupefilter ----------------------------------------------------------------------


def test_dupefilter_from_server_and_key(client: redis.Redis, name: str) -> None:
    df = RFPDupeFilter(client, f"{name}:fp", debug=True)
    assert not df.request_seen(Request("https://e.com/"))
    assert df.request_seen(Request("https://e.com/"))
    assert client.scard(f"{name}:fp") == 1
    df.close()  # scrapy-redis's close(reason="") deletes the key
    assert not client.exists(f"{name}:fp")


def test_request_fingerprint_hook_is_used_by_the_scheduler(
    make_crawler: Callable[..., Crawler],
) -> None:
    class NoQuery(RFPDupeFilter):
        def request_fingerprint(self, request: Request) -> str:
            return request.url.split("?")[0]

    path = f"{__name__}.NoQuery"
    globals()["NoQuery"] = NoQuery
    crawler = make_crawler({"DUPEFILTER_CLASS": path, "SCHEDULER_FLUSH_INTERVAL": 0})
    scheduler = build_from_crawler(Scheduler, crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    try:
        assert scheduler.enqueue_request(Request("https://e.com/a?x=1"))
        assert not scheduler.enqueue_request(Request("https://e.com/a?x=2"))
    finally:
        scheduler.close("finished")


def test_standalone_dupefilter_uses_a_per_run_key(redis_url: str) -> None:
    crawler = get_crawler(Spider, {"REDIS_URL": redis_url})
    df = build_from_crawler(RFPDupeFilter, crawler)
    assert df.key is not None
    assert df.key.startswith("dupefilter:")
    assert df.clear_on_close
    # two crawls opened in the same second: scrapy-redis's key was shared, and the
    # second skipped the pages the first had seen
    other = build_from_crawler(RFPDupeFilter, get_crawler(Spider, {"REDIS_URL": redis_url}))
    assert other.key != df.key


# -- queues, scheduler, spider and pipeline hooks ----------------------------------------


class _Spider(Spider):
    name = "q"

    def parse(self, response: Any) -> Any:
        return None


def test_queue_pushed_the_scrapy_redis_way_is_leased_by_a_worker(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    crawler = make_crawler({"SCHEDULER_FLUSH_INTERVAL": 0})
    spider = crawler.spider
    assert spider is not None
    queue = PriorityQueue(client, spider, "%(spider)s:requests")
    queue.push(Request("https://e.com/low", priority=1, callback=spider.parse))
    queue.push(Request("https://e.com/high", priority=5, callback=spider.parse))
    assert len(queue) == 2
    scheduler = build_from_crawler(Scheduler, crawler)
    scheduler.open(spider)
    try:
        first = scheduler.next_request()
        assert first is not None
        assert first.url == "https://e.com/high"
    finally:
        scheduler.close("shutdown")
    assert queue.pop() is not None  # the other one, popped scrapy-redis's way
    assert queue.pop() is None


class ListQueue(Base):
    """A queue written against scrapy-redis's ``Base``, as a user would."""

    def push(self, request: Any, dupefilter: Any = None) -> None:
        self.server.lpush(self.key, self._encode_request(request))

    def pop(self, timeout: int = 0) -> Request | None:
        data = cast("bytes | None", self.server.rpop(self.key))  # bytes replies
        return self._decode_request(data) if data else None

    def __len__(self) -> int:
        return int(self.server.llen(self.key))


def test_custom_queue_on_base_encodes_requests(client: redis.Redis, name: str) -> None:
    spider = _Spider(name=name)
    queue = ListQueue(client, spider, "%(spider)s:custom")
    queue.push(Request("https://e.com/", meta={"a": 1}, callback=spider.parse))
    assert len(queue) == 1
    out = queue.pop()
    assert out is not None
    assert (out.meta, out.callback) == ({"a": 1}, spider.parse)
    queue.clear()


def test_custom_queue_class_runs_unleased(
    make_crawler: Callable[..., Crawler], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    crawler = make_crawler({"SCHEDULER_QUEUE_CLASS": f"{__name__}.ListQueue"})
    scheduler = build_from_crawler(Scheduler, crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    try:
        assert "requests a worker has taken are lost if it dies" in caplog.text
        assert scheduler.enqueue_request(Request("https://e.com/1"))
        assert not scheduler.enqueue_request(Request("https://e.com/1"))  # dupefilter
        assert scheduler.enqueue_request(Request("https://e.com/2"))
        assert client.llen(f"{crawler.spider.name}:requests") == 2  # the user's own list
        assert scheduler.has_pending_requests()
        first, second = scheduler.next_request(), scheduler.next_request()
        assert first is not None
        assert second is not None
        assert [first.url, second.url] == ["https://e.com/1", "https://e.com/2"]
        assert not scheduler.has_pending_requests()
    finally:
        scheduler.close("finished")


def test_scheduler_flush(make_crawler: Callable[..., Crawler], client: redis.Redis) -> None:
    crawler = make_crawler({"SCHEDULER_FLUSH_INTERVAL": 0})
    scheduler = build_from_crawler(Scheduler, crawler)
    assert crawler.spider is not None
    scheduler.open(crawler.spider)
    try:
        assert scheduler.enqueue_request(Request("https://e.com/"))
        assert len(scheduler) == 1
        scheduler.flush()
        assert len(scheduler) == 0
        assert scheduler.enqueue_request(Request("https://e.com/"))  # forgotten too
    finally:
        scheduler.close("shutdown")


class _IdleSpider(RedisSpider):
    def spider_idle(self) -> None:
        self.idled = True
        raise DontCloseSpider


def test_overridden_spider_idle_is_called(make_crawler: Callable[..., Crawler]) -> None:
    crawler = make_crawler(spidercls=_IdleSpider)
    crawler.signals.send_catch_log(signals.spider_idle, spider=crawler.spider)
    assert isinstance(crawler.spider, _IdleSpider)
    assert crawler.spider.idled


def _seed(spider: Spider | None, data: bytes) -> Request:
    """The one request a Redis spider makes of the seed ``data``."""
    assert isinstance(spider, RedisSpider)
    request = spider.make_request_from_data(data)
    assert isinstance(request, Request)
    return request


def test_seeds_skip_the_dupefilter_by_default(make_crawler: Callable[..., Crawler]) -> None:
    spider = make_crawler(spidercls=RedisSpider).spider
    assert _seed(spider, b"https://e.com/").dont_filter
    json_seed = b'{"url": "https://e.com/", "dont_filter": false}'
    assert not _seed(spider, json_seed).dont_filter
    off = make_crawler({"REDIS_START_URLS_DONT_FILTER": False}, spidercls=RedisSpider).spider
    assert not _seed(off, b"https://e.com/").dont_filter


def test_scrapy_redis_json_seed(make_crawler: Callable[..., Crawler]) -> None:
    spider = make_crawler(spidercls=RedisSpider).spider
    seed = {"url": "https://e.com/", "meta": {"job-id": "1"}, "url_cookie_key": "k"}
    request = _seed(spider, json.dumps(seed).encode())
    assert (request.method, request.url) == ("GET", "https://e.com/?url_cookie_key=k")
    assert request.meta["job-id"] == "1"


def test_pipeline_item_key_hook(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    class PerKind(RedisPipeline):
        def item_key(self, item: Any, spider: Spider | None) -> str:
            return f"{name}:items:{item['kind']}"

    crawler = make_crawler()
    pipeline = build_from_crawler(PerKind, crawler)
    pipeline.open_spider(crawler.spider)
    for kind in ("a", "b", "a"):
        pipeline.process_item({"kind": kind}, crawler.spider)
    pipeline.close_spider(crawler.spider)
    assert client.llen(f"{name}:items:a") == 2
    assert client.llen(f"{name}:items:b") == 1


class _TwoKeys(RedisSpider):
    redis_key = ["%(name)s:urgent", "%(name)s:start_urls"]  # noqa: RUF012 - as users write it


def test_redis_key_list_is_read_in_priority_order(
    make_crawler: Callable[..., Crawler], client: redis.Redis, name: str
) -> None:
    spider = make_crawler({"REDIS_START_URLS_BATCH_SIZE": 2}, spidercls=_TwoKeys).spider
    assert isinstance(spider, _TwoKeys)
    assert spider.redis_key == [f"{name}:urgent", f"{name}:start_urls"]
    client.rpush(f"{name}:start_urls", "https://e.com/n1", "https://e.com/n2")
    client.rpush(f"{name}:urgent", "https://e.com/u1")
    batches = [[r.url for r in spider.next_requests()] for _ in range(3)]
    assert batches == [["https://e.com/u1"], ["https://e.com/n1", "https://e.com/n2"], []]


def test_status_reads_the_first_of_several_seed_keys() -> None:
    from scrapy_dist.addon import with_defaults
    from scrapy_dist.status import CrawlLayout

    layout = CrawlLayout.from_settings(with_defaults(Settings()), "books", _TwoKeys)
    assert layout.seeds == "books:urgent"
