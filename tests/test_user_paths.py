"""The paths a Scrapy user takes, run as the user runs them: a project in a temp dir,
``scrapy crawl`` workers (or a script) as processes, seeds pushed through Redis, the
local test site counting every fetch.

Each test pins one bug of a first-time user's path (issue 10): the add-on alone, a
script, bad seeds with ``CLOSE_WHEN_CRAWL_DONE``, a second run of a finished crawl,
spider arguments and start-up failures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from typing import TYPE_CHECKING, Any, cast

import pytest

from scrapy_dist.testing import TestSite, run_cli, start_workers, stop_workers, wait_workers
from scrapy_dist.testing.crawl import duplicates
from scrapy_dist.testing.leases import held_by, leased_count
from scrapy_dist.testing.queues import queued_count

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import redis

    from scrapy_dist.testing import Worker

pytestmark = pytest.mark.e2e

PAGES = 40
#: Seconds a run of a few workers may take, start-up included, on a loaded machine.
RUN_TIMEOUT = 90.0

SPIDER = """
from scrapy_dist.spiders import RedisSpider


class BooksSpider(RedisSpider):
    name = "{name}"

    def parse(self, response):
        yield {{"url": response.url}}
        yield from response.follow_all(css="a", callback=self.parse)
"""

#: A settings block with the add-on alone, as docs/deployment.md uses it.
ADDON_SETTINGS = """
BOT_NAME = "books"
SPIDER_MODULES = ["books.spiders"]
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
ADDONS = {{"scrapy_dist.addon.DistAddon": 0}}
REDIS_URL = "{redis_url}"
CLOSE_WHEN_CRAWL_DONE = True
CRAWL_DONE_GRACE = 1
"""


@pytest.fixture
def site() -> Iterator[TestSite]:
    with TestSite(PAGES, delay=0.02) as s:
        yield s


@pytest.fixture
def project(tmp_path: Path, name: str, redis_url: str) -> Path:
    """A Scrapy project as a user writes it: settings with the add-on, one Redis spider."""
    root = tmp_path / "project"
    package = root / "books"
    (package / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = books.settings\n")
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text("")
    (package / "settings.py").write_text(ADDON_SETTINGS.format(redis_url=redis_url))
    (package / "spiders" / "books.py").write_text(SPIDER.format(name=name))
    return root


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    stop_workers(started)


def run(
    workers: list[Worker], project: Path, name: str, count: int = 2, **options: Any
) -> list[Worker]:
    new = start_workers(
        count,
        project_dir=project,
        spider=name,
        log_dir=project.parent,
        stats_setting=None,
        first_index=len(workers),
        **options,
    )
    workers.extend(new)
    return new


def logs(workers: list[Worker]) -> str:
    return "\n".join(w.log_tail(40) for w in workers)


def log_text(worker: Worker) -> str:
    return worker.log_file.read_text(encoding="utf-8", errors="replace")


def test_the_addon_alone_crawls_each_page_once(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """Settings read while Scrapy builds the spider (before add-ons) are never reused."""
    both = run(workers, project, name)
    client.lpush(f"{name}:start_urls", site.page_url(0))
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    hits = site.hits()
    assert set(hits) == site.expected_paths()
    assert set(hits.values()) == {1}, hits
    for worker in both:
        assert "not Redis-backed" not in log_text(worker)


def test_bad_seeds_are_dead_lettered_once_and_the_crawl_finishes(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """A rejected seed's lease is settled with its dead letter, so it never comes back
    and the crawl finishes; short leases would bring an unsettled seed back."""
    settings = {"SCHEDULER_LEASE_TIMEOUT": 3, "SCHEDULER_HEARTBEAT_INTERVAL": 0.5}
    client.rpush(f"{name}:start_urls", "ftp://x", site.page_url(0), "{oops")
    both = run(workers, project, name, settings=settings)
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    dead = [json.loads(r) for r in client.lrange(f"{name}:dead", 0, -1)]
    assert sorted(d["data"] for d in dead) == ["ftp://x", "{oops"]
    assert all(d["kind"] == "seed" for d in dead)
    assert set(site.hits().values()) == {1}
    assert leased_count(client, name) == 0


def test_a_second_run_of_a_finished_persisted_crawl_waits_for_its_seeds(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    settings = {"SCHEDULER_PERSIST": True}
    client.lpush(f"{name}:start_urls", site.page_url(0))
    assert wait_workers(run(workers, project, name, settings=settings), RUN_TIMEOUT) == [0, 0]
    assert client.hexists(f"{name}:progress", "finished_at")

    second = run(workers, project, name, settings=settings)
    time.sleep(6)  # the old run's "finished" mark made new workers exit within a second
    assert [w.returncode for w in second] == [None, None], logs(second)
    client.lpush(f"{name}:start_urls", site.page_url(0) + "?again")  # a page not seen yet
    assert wait_workers(second, RUN_TIMEOUT) == [0, 0], logs(second)
    assert site.hits()["/page/0"] == 2  # the persisted dupefilter kept the rest
    assert int(client.hget(f"{name}:progress", "done") or 0) > PAGES


def test_a_run_after_the_progress_key_was_overwritten_by_hand_waits_for_its_seeds(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """A finished crawl whose progress hash the operator then overwrote (SET): the next
    run's first worker set the key aside and counted the run as having settled one, so
    its workers, started before the seeds, closed as finished within the grace, having
    crawled nothing. Now status reads it as waiting, the run waits for its seeds."""
    client.lpush(f"{name}:start_urls", site.page_url(0))
    assert wait_workers(run(workers, project, name), RUN_TIMEOUT) == [0, 0], logs(workers)
    # finished: its record gone with its last worker (a clean stop), or kept for a worker
    # still registered when the last one left
    progress = f"{name}:progress"
    assert not client.exists(progress) or client.hexists(progress, "finished_at")
    client.set(progress, "oops")  # a hand-written SET on the wrong key
    status = run_cli("status", name, "--json", cwd=project)
    assert json.loads(status.stdout)["state"] == "waiting", status.stderr

    second = run(workers, project, name)
    time.sleep(6)  # CRAWL_DONE_GRACE = 1: they closed as finished within 3 s
    assert [w.returncode for w in second] == [None, None], logs(second)
    status = run_cli("status", name, "--json", cwd=project)
    assert json.loads(status.stdout)["state"] == "waiting", status.stdout
    client.lpush(f"{name}:start_urls", site.page_url(0))
    assert wait_workers(second, RUN_TIMEOUT) == [0, 0], logs(second)
    assert set(site.hits().values()) == {2}  # every page again (PERSIST off)
    assert client.get(f"{name}:progress:wrongtype") == b"oops"


def test_spider_arguments_are_coerced_and_name_the_keys(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """``-a max_idle_time=2`` is a number of seconds; ``-a redis_key=`` names the seeds key."""
    key = f"{name}:custom:seeds"
    [worker] = run(
        workers,
        project,
        name,
        count=1,
        settings={"CLOSE_WHEN_CRAWL_DONE": False},
        spider_args={"max_idle_time": "2", "redis_key": "%(name)s:custom:seeds"},
    )
    client.lpush(key, site.page_url(0))
    assert wait_workers([worker], RUN_TIMEOUT) == [0], logs(workers)
    text = log_text(worker)
    assert "Traceback" not in text
    assert "MAX_IDLE_TIME_BEFORE_CLOSE=2.0" in text
    assert f"seeds key {key} (list)" in text
    assert set(site.hits()) == site.expected_paths()


def test_a_bad_spider_argument_is_one_error_and_exit_1(
    project: Path, name: str, workers: list[Worker]
) -> None:
    [worker] = run(workers, project, name, count=1, spider_args={"max_idle_time": "soon"})
    assert wait_workers([worker], RUN_TIMEOUT) == [1], logs(workers)
    text = log_text(worker)
    errors = [line for line in text.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, text
    assert "max_idle_time='soon'" in errors[0]
    assert "Traceback" not in text


#: A Redis spider with start requests of its own, written the two ways Scrapy offers.
OWN_START = {
    "start_requests": """
    def start_requests(self):
        yield Request(self.first)
""",
    "start": """
    async def start(self):
        yield Request(self.first)
""",
}

OWN_START_SPIDER = """
from scrapy import Request
from scrapy_dist.spiders import RedisSpider


class BooksSpider(RedisSpider):
    name = "{name}"
    first = "{first}"
{method}
    def parse(self, response):
        yield {{"url": response.url}}
        yield from response.follow_all(css="a", callback=self.parse)
"""


@pytest.mark.parametrize("method", sorted(OWN_START))
def test_a_redis_spider_with_its_own_start_requests_crawls_them_and_its_seeds(
    project: Path,
    name: str,
    client: redis.Redis,
    site: TestSite,
    workers: list[Worker],
    *,
    method: str,
) -> None:
    """As with scrapy-redis, a spider's own start requests are crawled (each worker
    issues them, the shared dupefilter keeps one), and seeds pushed to Redis still
    arrive as the workers have room or are idle."""
    spider = project / "books" / "spiders" / "books.py"
    first = site.page_url(0) + "?start"  # no page links to it
    spider.write_text(OWN_START_SPIDER.format(name=name, first=first, method=OWN_START[method]))
    client.lpush(f"{name}:start_urls", site.page_url(0) + "?seed")
    both = run(workers, project, name)
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    hits = site.hits()
    assert set(hits) == site.expected_paths(), logs(workers)
    # the start request and the seed (no page links to page 0)
    assert hits.pop("/page/0") == 2, logs(workers)
    assert set(hits.values()) == {1}, hits
    assert client.llen(f"{name}:start_urls") == 0


#: The two ways a scrapy-redis user's workers close by themselves without
#: ``CLOSE_WHEN_CRAWL_DONE``: a plain ``scrapy.Spider`` (only ``SCHEDULER`` set) closes when
#: the queue runs dry, a Redis spider after ``MAX_IDLE_TIME_BEFORE_CLOSE``.
IDLE_OUT_SPIDERS = {
    "plain spider": """
import scrapy


class BooksSpider(scrapy.Spider):
    name = "{name}"
    start_urls = ["{start}"]

    def parse(self, response):
        yield {{"url": response.url}}
        yield from response.follow_all(css="a", callback=self.parse)
""",
    "MAX_IDLE_TIME_BEFORE_CLOSE": """
from scrapy_dist.spiders import RedisSpider


class BooksSpider(RedisSpider):
    name = "{name}"
    custom_settings = {{"MAX_IDLE_TIME_BEFORE_CLOSE": 1}}

    def parse(self, response):
        yield {{"url": response.url}}
        yield from response.follow_all(css="a", callback=self.parse)
""",
}


@pytest.mark.parametrize("spider_kind", sorted(IDLE_OUT_SPIDERS))
def test_a_worker_closing_when_idle_first_takes_back_a_killed_workers_leases(
    project: Path, name: str, client: redis.Redis, workers: list[Worker], *, spider_kind: str
) -> None:
    """Two workers; one is killed with -9 mid-crawl. The other, once it has nothing
    left, used to close (the plain spider at once, the Redis spider after its idle
    time) while the killed worker's leases were still pending: the crawl ended
    unfinished, their pages never parsed. It now waits for them to expire, crawls them,
    and says what it waits for."""
    settings = {
        "CLOSE_WHEN_CRAWL_DONE": False,
        "CONCURRENT_REQUESTS": 4,
        "SCHEDULER_PREFETCH": 1,
        "SCHEDULER_LEASE_TIMEOUT": 10,
        "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
        "SCHEDULER_WORKER_TIMEOUT": 2,
    }
    with TestSite(300, delay=0.03) as site:
        spider = IDLE_OUT_SPIDERS[spider_kind].format(name=name, start=site.page_url(0))
        (project / "books" / "spiders" / "books.py").write_text(spider)
        victim, survivor = run(workers, project, name, settings=settings)
        if spider_kind != "plain spider":  # (whose start URL is its own)
            client.lpush(f"{name}:start_urls", site.page_url(0))
        deadline = time.monotonic() + RUN_TIMEOUT
        while sum(site.hits().values()) < 200:  # of 300: what is left takes under 10 s
            assert time.monotonic() < deadline, logs(workers)
            time.sleep(0.05)
        victim.process.kill()
        victim.process.wait()
        held = held_by(client, name, victim.pid)
        assert held > 0, logs(workers)
        assert wait_workers([survivor], RUN_TIMEOUT) == [0], logs(workers)
        hits = site.hits()
    assert set(hits) == site.expected_paths(), logs(workers)
    # every request settled (parsed: done), none dead, none left leased or queued
    assert leased_count(client, name) == 0, logs(workers)
    assert queued_count(client, f"{name}:requests") == 0, logs(workers)
    assert client.llen(f"{name}:dead") == 0, logs(workers)
    assert duplicates(hits) <= held, (duplicates(hits), held)
    assert "Not closing yet" in log_text(survivor), log_text(survivor)[-3000:]


#: scrapy-redis's hooks as its users override them: next_requests() reading the
#: project's own Redis structure, spider_idle() looking at the seeds with count_size().
OWN_NEXT_REQUESTS_SPIDER = """
from scrapy_dist.spiders import RedisSpider


class JobsSpider(RedisSpider):
    name = "{name}"

    def next_requests(self):
        jobs = self.name + ":jobs"
        for field, url in self.server.hgetall(jobs).items():
            if self.server.hdel(jobs, field):
                yield self.make_request_from_data(url)

    def spider_idle(self):
        self.logger.info("idle with %d seed(s) waiting", self.count_size(self.redis_key))
        super().spider_idle()

    def parse(self, response):
        yield {{"url": response.url}}
        yield from response.follow_all(css="a", callback=self.parse)
"""


def test_a_spider_with_its_own_next_requests_and_spider_idle_crawls_what_they_give(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """A spider that overrides next_requests() to read its own hash crawled nothing (the
    override was never called: both workers finished at once), and one whose
    spider_idle() called scrapy-redis's count_size() failed on every idle signal."""
    spider = project / "books" / "spiders" / "books.py"
    spider.write_text(OWN_NEXT_REQUESTS_SPIDER.format(name=name))
    client.hset(f"{name}:jobs", mapping={"home": site.page_url(0)})
    both = run(workers, project, name)
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    hits = site.hits()
    assert set(hits) == site.expected_paths(), logs(workers)
    assert set(hits.values()) == {1}, hits
    assert not client.exists(f"{name}:jobs")
    text = "".join(log_text(w) for w in both)
    assert "idle with 0 seed(s) waiting" in text, logs(workers)
    assert "Error caught on signal handler" not in text, logs(workers)


#: scrapy-redis's pipeline hooks, as its users override them: item_key(), its
#: storage step _process_item(), and from_settings() (which its from_crawler calls).
ITEM_KEY_PIPELINE = """
import json

from scrapy_dist.pipelines import RedisPipeline, RedisStreamPipeline


class ByParityPipeline(RedisPipeline):
    def item_key(self, item, spider):
        page = int(item["url"].rsplit("/", 1)[1])
        return "%s:items:%s" % (spider.name, "even" if page % 2 == 0 else "odd")


class ByUrlPipeline(RedisPipeline):
    def _process_item(self, item, spider):
        self.server.hset(spider.name + ":byurl", item["url"], json.dumps(dict(item)))
        return item


class AllItemsPipeline(RedisPipeline):
    @classmethod
    def from_settings(cls, settings):
        from scrapy_dist.connection import from_settings

        return cls(from_settings(settings), key=settings["ALL_ITEMS_KEY"])


class TaggedPipeline(RedisPipeline):
    @classmethod
    def from_settings(cls, settings):
        pipeline = super().from_settings(settings)
        pipeline.tag = "custom"
        return pipeline


class DecoratingPipeline(RedisPipeline):
    def item_key(self, item, spider):
        return "%s:tagged" % spider.name

    def _process_item(self, item, spider):
        item = dict(item, tag="decorated")
        return super()._process_item(item, spider)


class StreamPerSpider(RedisStreamPipeline):
    def item_key(self, item, spider):
        return "%s:mystream" % spider.name
"""


def test_the_pipeline_hooks_scrapy_redis_users_override_are_called(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """Scrapy 2.19 calls ``process_item(item)`` without the spider: an ``item_key(item,
    spider)`` override then got ``None``, failed on ``spider.name`` for every item, and
    no item was stored. ``_process_item`` and ``from_settings`` overrides were ignored
    without a word: the items went to ``<spider>:items``."""
    (project / "books" / "pipelines.py").write_text(ITEM_KEY_PIPELINE)
    pipelines = json.dumps(
        {
            "books.pipelines.ByParityPipeline": 300,
            "books.pipelines.ByUrlPipeline": 310,
            "books.pipelines.AllItemsPipeline": 320,
            "books.pipelines.TaggedPipeline": 330,
            "books.pipelines.StreamPerSpider": 340,
            "books.pipelines.DecoratingPipeline": 350,
        }
    )
    settings = {
        "ITEM_PIPELINES": pipelines,
        "ALL_ITEMS_KEY": f"{name}:all",
        "SCHEDULER_JOB_ID": "j1",
        "REDIS_ITEMS_STREAM_MAXLEN": 1000,
    }
    both = run(workers, project, name, settings=settings)
    client.lpush(f"{name}:j1:start_urls", site.page_url(0))
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    stored = {
        parity: [json.loads(raw)["url"] for raw in client.lrange(f"{name}:items:{parity}", 0, -1)]
        for parity in ("even", "odd")
    }
    assert len(stored["even"]) + len(stored["odd"]) == PAGES, logs(workers)
    assert all(int(url.rsplit("/", 1)[1]) % 2 == 0 for url in stored["even"])
    assert all(int(url.rsplit("/", 1)[1]) % 2 == 1 for url in stored["odd"])
    assert "Error processing" not in "".join(log_text(w) for w in both)
    assert client.hlen(f"{name}:byurl") == PAGES  # the _process_item override stored them
    assert client.llen(f"{name}:all") == PAGES  # the from_settings override's key
    # a from_settings override that keeps the template gets the job's list, as the
    # plain pipeline does (it went to <spider>:items, which no job command sees)
    assert client.llen(f"{name}:j1:items") == PAGES
    assert not client.exists(f"{name}:items")
    assert client.xlen(f"{name}:mystream") == PAGES  # a stream pipeline's item_key too
    # an override that decorates the item and hands it to scrapy-redis's own step
    tagged = [json.loads(raw) for raw in client.lrange(f"{name}:tagged", 0, -1)]
    assert len(tagged) == PAGES
    assert {item["tag"] for item in tagged} == {"decorated"}


#: Pipelines built by their own factories, as scrapy-redis users write them: a
#: from_crawler that calls from_settings (scrapy-redis's own, copied to add to it), and
#: from_settings overrides of the stream pipeline (one keeping the stream's template,
#: one naming its own stream).
OWN_FACTORY_PIPELINES = """
import json

from scrapy_dist.connection import from_settings
from scrapy_dist.pipelines import RedisPipeline, RedisStreamPipeline


class CountingPipeline(RedisPipeline):
    @classmethod
    def from_crawler(cls, crawler):
        pipeline = cls.from_settings(crawler.settings)
        pipeline.stats = crawler.stats
        return pipeline


class UpperStreamPipeline(RedisStreamPipeline):
    @classmethod
    def from_settings(cls, settings):
        pipeline = super().from_settings(settings)
        pipeline.serialize = lambda item: json.dumps({"URL": item["url"].upper()})
        return pipeline


class OwnStreamPipeline(RedisStreamPipeline):
    @classmethod
    def from_settings(cls, settings):
        return cls(from_settings(settings), key=settings["OWN_STREAM_KEY"])
"""


def test_pipelines_built_by_their_own_factories_store_in_the_jobs_keys(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """A from_crawler calling from_settings stored every item in a literal
    ``%(spider)s:items`` list on Scrapy 2.19 (and in ``<spider>:items``, not the job's
    list, on 2.13); a RedisStreamPipeline's from_settings override was never called."""
    (project / "books" / "pipelines.py").write_text(OWN_FACTORY_PIPELINES)
    pipelines = {
        "books.pipelines.CountingPipeline": 300,
        "books.pipelines.UpperStreamPipeline": 310,
        "books.pipelines.OwnStreamPipeline": 320,
    }
    settings = {
        "ITEM_PIPELINES": json.dumps(pipelines),
        "SCHEDULER_JOB_ID": "j1",
        "OWN_STREAM_KEY": f"{name}:own-stream",
        "REDIS_ITEMS_STREAM_MAXLEN": 1000,
    }
    both = run(workers, project, name, settings=settings)
    client.lpush(f"{name}:j1:start_urls", site.page_url(0))
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    assert "Error processing" not in "".join(log_text(w) for w in both)
    urls = sorted(json.loads(raw)["url"] for raw in client.lrange(f"{name}:j1:items", 0, -1))
    assert urls == sorted(site.page_url(i) for i in range(PAGES)), client.keys("*items*")
    assert not client.exists("%(spider)s:items", f"{name}:items")
    entries = cast(
        "list[tuple[bytes, dict[bytes, bytes]]]", client.xrange(f"{name}:j1:items:stream")
    )
    assert sorted(json.loads(fields[b"item"])["URL"] for _, fields in entries) == [
        url.upper() for url in urls
    ]
    assert {fields[b"spider"] for _, fields in entries} == {name.encode()}
    assert client.xlen(f"{name}:own-stream") == PAGES
    assert not client.exists(f"{name}:items:stream", "%(spider)s:items:stream")


#: More pipelines as scrapy-redis users write them: a staticmethod from_crawler;
#: scrapy-redis 0.9's from_settings copied (the client passed as ``server=``) with
#: open_spider and close_spider of its own (scrapy-redis's pipeline has none, so they
#: call no super()); a mixin's from_crawler reaching the pipeline's by super(); a stream
#: pipeline with its own __init__. Next to Scrapy's FilesPipeline.
USER_PIPELINES = """
from scrapy_dist import connection
from scrapy_dist.pipelines import RedisPipeline, RedisStreamPipeline


class StaticPipeline(RedisPipeline):
    @staticmethod
    def from_crawler(crawler):
        return StaticPipeline(connection.from_settings(crawler.settings), "%(spider)s:static")


class CopiedPipeline(RedisPipeline):
    @classmethod
    def from_settings(cls, settings):
        params = {"server": connection.from_settings(settings), "key": "%(spider)s:copied"}
        return cls(**params)

    def open_spider(self, spider):
        self.count = 0

    def process_item(self, item, spider=None):
        self.count += 1
        return super().process_item(item, spider)

    def close_spider(self, spider):
        spider.logger.info("copied pipeline saw %d items", self.count)


class Counting:
    @classmethod
    def from_crawler(cls, crawler):
        pipeline = super().from_crawler(crawler)
        pipeline.counting = True
        return pipeline


class MixedPipeline(Counting, RedisPipeline):
    @classmethod
    def from_settings(cls, settings):
        pipeline = super().from_settings(settings)
        pipeline.key = "%(spider)s:mixed"
        return pipeline


class OwnInitStream(RedisStreamPipeline):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.extra = True
"""


def test_pipelines_scrapy_redis_users_write_store_every_item_in_the_jobs_keys(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """scrapy-redis's ``from_settings`` copied into a subclass (``cls(server=...)``)
    failed every worker at start (TypeError); with it fixed, its ``open_spider`` of its
    own left the writer unstarted (the crawl hung once the buffer was full), and a
    staticmethod ``from_crawler``'s items went to a literal ``%(spider)s:static`` on
    Scrapy 2.19, to ``<spider>:static`` (not the job's) on 2.13."""
    (project / "books" / "pipelines.py").write_text(USER_PIPELINES)
    pipelines = {
        "scrapy.pipelines.files.FilesPipeline": 1,
        "books.pipelines.StaticPipeline": 300,
        "books.pipelines.CopiedPipeline": 310,
        "books.pipelines.MixedPipeline": 320,
        "books.pipelines.OwnInitStream": 330,
        "scrapy_dist.pipelines.RedisPipeline": 340,
    }
    # Scrapy 2.13's FilesPipeline creates its store without exist_ok: two workers
    # starting at once raced on it (FileExistsError)
    (project / "files").mkdir()
    settings = {
        "ITEM_PIPELINES": json.dumps(pipelines),
        "FILES_STORE": str(project / "files"),
        "SCHEDULER_JOB_ID": "j1",
        "REDIS_ITEMS_STREAM_MAXLEN": 1000,
        "REDIS_ITEMS_BUFFER_MAX": 5,  # a full buffer is met
    }
    both = run(workers, project, name, settings=settings)
    client.lpush(f"{name}:j1:start_urls", site.page_url(0))
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    text = "".join(log_text(w) for w in both)
    assert "Traceback" not in text, logs(workers)
    expected = sorted(site.page_url(i) for i in range(PAGES))
    for suffix in ("static", "copied", "mixed", "items"):
        raw = client.lrange(f"{name}:j1:{suffix}", 0, -1)
        assert sorted(json.loads(r)["url"] for r in raw) == expected, (suffix, logs(workers))
    assert client.xlen(f"{name}:j1:items:stream") == PAGES
    assert not client.keys("%(spider)s*") + client.keys(f"{name}:static")
    assert "rejected" not in text


#: A pipeline built by its own factory whose items Redis refuses for good (its list
#: holds a string): they are kept in the rejected file of the pipeline's list.
REFUSED_PIPELINES = {
    "from_settings": """
from scrapy_dist.pipelines import RedisPipeline


class BlockedPipeline(RedisPipeline):
    @classmethod
    def from_settings(cls, settings):
        return super().from_settings(settings)

    def item_key(self, item, spider):
        return spider.name + ":blocked"
""",
    "from_crawler": """
from scrapy_dist.pipelines import RedisPipeline


class BlockedPipeline(RedisPipeline):
    @classmethod
    def from_crawler(cls, crawler):
        return cls.from_settings(crawler.settings)

    def item_key(self, item, spider):
        return spider.name + ":blocked"
""",
}


@pytest.mark.parametrize("factory", sorted(REFUSED_PIPELINES))
def test_a_pipeline_built_by_its_own_factory_keeps_refused_items_under_its_jobs_list(
    project: Path,
    name: str,
    client: redis.Redis,
    site: TestSite,
    workers: list[Worker],
    *,
    tmp_path: Path,
    factory: str,
) -> None:
    """The rejected file of a pipeline built by a from_settings override was named
    after the key's template (``_(spider)s_items.rejected.jl``), not the job's list."""
    (project / "books" / "pipelines.py").write_text(REFUSED_PIPELINES[factory])
    kept = tmp_path / "rejected"
    settings = {
        "ITEM_PIPELINES": json.dumps({"books.pipelines.BlockedPipeline": 300}),
        "SCHEDULER_JOB_ID": "j1",
        "SCHEDULER_WRONGTYPE_TIMEOUT": 0,
        "REDIS_ITEMS_REJECTED_FILE": str(kept / "%(key)s.rejected.jl"),
    }
    client.set(f"{name}:blocked", "not a list")
    both = run(workers, project, name, settings=settings)
    client.lpush(f"{name}:j1:start_urls", site.page_url(0))
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    files = sorted(p.name for p in kept.iterdir())
    assert files == [f"{name}_j1_items.rejected.jl"], files
    lines = (kept / files[0]).read_bytes().splitlines()
    assert sorted(json.loads(line)["url"] for line in lines) == sorted(
        site.page_url(i) for i in range(PAGES)
    )


#: A spider whose seeds are in its own format: page numbers, not URLs.
OWN_FORMAT_SPIDER = """
import scrapy

from scrapy_dist.spiders import RedisSpider


class PagesByNumber(RedisSpider):
    name = "{name}"

    def make_request_from_data(self, data):
        return scrapy.Request("{base}/page/%d" % int(data), dont_filter=True)

    def parse(self, response):
        yield {{"url": response.url}}
"""


def test_push_gives_a_spider_with_its_own_seed_format_its_lines_as_given(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """`scrapy-dist push pages 5 6 7` for a spider whose make_request_from_data reads
    page numbers refused every line ("URL '5' must start with http://"), with no way to
    push them; `--raw` pushes them as given (the spider's own method validates them),
    and the refusal says so."""
    spider = project / "books" / "spiders" / "books.py"
    base = site.page_url(0).rsplit("/page/", 1)[0]
    spider.write_text(OWN_FORMAT_SPIDER.format(name=name, base=base))
    refused = run_cli("push", name, "5", "6", "seven", cwd=project)
    assert refused.returncode == 1  # validated as scrapy_dist's format by default
    assert "reads seeds with its own make_request_from_data: if its" in refused.stderr
    assert "--raw pushes the lines as given" in refused.stderr
    assert not client.exists(f"{name}:start_urls")
    pushed = run_cli("push", name, "5", "6", "seven", "--raw", cwd=project)
    assert pushed.returncode == 0, pushed.stderr
    assert client.lrange(f"{name}:start_urls", 0, -1) == [b"5", b"6", b"seven"]
    both = run(workers, project, name)
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    assert site.hits() == {"/page/5": 1, "/page/6": 1}
    [record] = [json.loads(r) for r in client.lrange(f"{name}:dead", 0, -1)]
    assert record["data"] == "seven"


def test_a_batch_size_redis_cannot_take_is_one_error_naming_the_argument(
    project: Path, name: str, workers: list[Worker]
) -> None:
    [worker] = run(workers, project, name, count=1, spider_args={"redis_batch_size": 10**9})
    assert wait_workers([worker], RUN_TIMEOUT) == [1], logs(workers)
    text = log_text(worker)
    errors = [line for line in text.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, text
    assert "redis_batch_size=" in errors[0]
    assert "at most" in errors[0]
    assert "Traceback" not in text


@pytest.mark.parametrize(
    "problem",
    [
        "unreachable",
        "unreachable, all in Redis",
        "wrong key type",
        "a typo in a number",
        "a queue class that does not exist",
        "a callback errors choice that does not exist",
    ],
)
def test_a_start_up_failure_is_one_error_line_and_exit_1(
    project: Path, name: str, client: redis.Redis, workers: list[Worker], problem: str
) -> None:
    settings: dict[str, Any] = {}
    if problem.startswith("unreachable"):
        settings["REDIS_URL"] = "redis://:secret@127.0.0.1:1/0"
    if problem == "unreachable, all in Redis":
        settings["STATS_CLASS"] = "scrapy_dist.stats.RedisStatsCollector"
        settings["ITEM_PIPELINES"] = json.dumps({"scrapy_dist.pipelines.RedisPipeline": 300})
        settings["SCHEDULER_JOB_TIMESTAMP"] = "%Y%m%d"
    elif problem == "wrong key type":
        client.sadd(f"{name}:start_urls", "https://example.com/")
    elif problem == "a typo in a number":  # was a ValueError traceback naming no setting
        settings["SCHEDULER_WORKER_TIMEOUT"] = "3o"
    elif problem == "a queue class that does not exist":
        settings["SCHEDULER_QUEUE_CLASS"] = "scrapy_dist.queue.PriorityQueu"
    elif problem == "a callback errors choice that does not exist":
        settings["SCHEDULER_CALLBACK_ERRORS"] = "deadletter"
    [worker] = run(workers, project, name, count=1, settings=settings)
    assert wait_workers([worker], RUN_TIMEOUT) == [1], logs(workers)
    text = log_text(worker) + worker.output_file.read_text(errors="replace")
    errors = [line for line in text.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, text
    assert "Traceback" not in text
    assert "secret" not in text
    if problem.startswith("unreachable"):
        assert "REDIS_URL" in errors[0]
        assert "redis://:***@127.0.0.1:1/0" in errors[0]
    elif problem == "a typo in a number":
        assert "SCHEDULER_WORKER_TIMEOUT = '3o' is not a number" in errors[0]
    elif problem == "a queue class that does not exist":
        assert "SCHEDULER_QUEUE_CLASS = 'scrapy_dist.queue.PriorityQueu' cannot be" in errors[0]
    elif problem == "a callback errors choice that does not exist":
        assert (
            "SCHEDULER_CALLBACK_ERRORS must be one of 'done', 'retry', 'dead', not 'deadletter'"
            in errors[0]
        )
    else:
        assert "REDIS_START_URLS_AS_SET" in errors[0]
        assert client.scard(f"{name}:start_urls") == 1  # left alone


SCRIPT = """
import sys
from scrapy.settings import Settings
sys.path.insert(0, {project!r})
from books.spiders.books import BooksSpider

settings = Settings()
settings.setmodule("books.settings", priority="project")
settings.set("LOG_FILE", {log!r})
kind = sys.argv[1]
if kind == "CrawlerProcess":
    from scrapy.crawler import CrawlerProcess
    process = CrawlerProcess(settings)
    process.crawl(BooksSpider)
    process.start()
elif kind == "AsyncCrawlerProcess":
    from scrapy.crawler import AsyncCrawlerProcess
    process = AsyncCrawlerProcess(settings)
    process.crawl(BooksSpider)
    process.start()
else:
    from scrapy.crawler import CrawlerRunner
    from scrapy.utils.log import configure_logging
    from scrapy.utils.reactor import install_reactor
    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    from twisted.internet import reactor
    configure_logging(settings)
    runner = CrawlerRunner(settings)
    runner.crawl(BooksSpider).addBoth(lambda _: reactor.stop())
    reactor.run()
"""


def _has_async_crawler_process() -> bool:
    import scrapy.crawler

    return hasattr(scrapy.crawler, "AsyncCrawlerProcess")


@pytest.mark.parametrize("kind", ["CrawlerProcess", "AsyncCrawlerProcess", "CrawlerRunner"])
def test_a_spider_run_from_a_script(
    project: Path, name: str, client: redis.Redis, site: TestSite, kind: str
) -> None:
    """Nothing touches the reactor before Scrapy installs its own."""
    if kind == "AsyncCrawlerProcess" and not _has_async_crawler_process():
        pytest.skip("AsyncCrawlerProcess needs Scrapy >= 2.14")
    log = project / f"{kind}.log"
    script = project / "run.py"
    script.write_text(textwrap.dedent(SCRIPT.format(project=str(project), log=str(log))))
    client.lpush(f"{name}:start_urls", site.page_url(0))
    done = subprocess.run(
        [sys.executable, str(script), kind],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    text = log.read_text(errors="replace") if log.exists() else ""
    assert done.returncode == 0, done.stderr + text
    assert "does not match" not in done.stderr + text
    assert set(site.hits()) == site.expected_paths(), done.stderr + text
    assert set(site.hits().values()) == {1}


def test_creating_a_redis_spider_does_not_import_the_reactor(tmp_path: Path) -> None:
    """Scrapy 2.13 installs its reactor after it creates the spider."""
    code = textwrap.dedent("""
        import sys
        from scrapy.crawler import Crawler
        from scrapy_dist.spiders import RedisSpider

        class S(RedisSpider):
            name = "s"

        crawler = Crawler(S, {"REDIS_URL": "redis://127.0.0.1:1/0"})
        crawler.crawling = True  # as Crawler.crawl() does before creating the spider
        S.from_crawler(crawler)
        assert "twisted.internet.reactor" not in sys.modules, "the reactor was imported"
    """)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


#: A spider with a bug on some pages: its callback yields the page's item and links,
#: then raises.
BROKEN_PAGES_SPIDER = """
from scrapy_dist.spiders import RedisSpider


class BooksSpider(RedisSpider):
    name = "{name}"
    broken = {broken!r}

    def parse(self, response):
        page = int(response.url.rsplit("/", 1)[1])
        yield {{"url": response.url}}
        yield from response.follow_all(css="a", callback=self.parse)
        if page in self.broken:
            raise ValueError("page %d is broken" % page)
"""

#: The pages whose callback raises.
BROKEN = frozenset(range(2, PAGES, 5))


def _items_per_url(client: redis.Redis, name: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for raw in client.lrange(f"{name}:items", 0, -1):
        url = json.loads(raw)["url"]
        counts[url] = counts.get(url, 0) + 1
    return counts


@pytest.mark.parametrize("setting", ["dead", "retry"])
def test_a_callback_that_raises_is_crawled_once_and_dead_lettered_with_the_setting(  # noqa: PLR0917
    project: Path,
    name: str,
    client: redis.Redis,
    site: TestSite,
    workers: list[Worker],
    setting: str,
) -> None:
    """A callback with a bug on some pages: with SCHEDULER_CALLBACK_ERRORS = "dead" each
    such page is fetched once, dead-lettered once with the error, its item and links
    (yielded before the error) kept once; the crawl finishes. Its records go back with
    `scrapy-dist dead requeue` once the spider is fixed. (The setting did not exist:
    each page was fetched 3 times and its item stored 3 times, "retry" still does.)"""
    spider = project / "books" / "spiders" / "books.py"
    spider.write_text(BROKEN_PAGES_SPIDER.format(name=name, broken=sorted(BROKEN)))
    settings = {
        "SCHEDULER_CALLBACK_ERRORS": setting,
        "SCHEDULER_PERSIST": True,
        "ITEM_PIPELINES": json.dumps({"scrapy_dist.pipelines.RedisPipeline": 300}),
    }
    client.lpush(f"{name}:start_urls", site.page_url(0))
    both = run(workers, project, name, settings=settings)
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    broken_urls = {site.page_url(i) for i in BROKEN}
    tries = 1 if setting == "dead" else 3  # SCHEDULER_MAX_DELIVERIES
    hits = site.hits()
    assert set(hits) == site.expected_paths(), logs(workers)  # the links of broken pages too
    assert hits == {
        path: tries if site.page_url(0).replace("/page/0", path) in broken_urls else 1
        for path in hits
    }
    items = _items_per_url(client, name)
    assert items == {url: tries if url in broken_urls else 1 for url in items}
    assert len(items) == PAGES
    dead = [json.loads(raw) for raw in client.lrange(f"{name}:dead", 0, -1)]
    assert sorted(json.loads(record["data"])["url"] for record in dead) == sorted(broken_urls)
    for record in dead:
        page = int(json.loads(record["data"])["url"].rsplit("/", 1)[1])
        assert record["kind"] == "request"
        assert record["reason"].startswith(f"ValueError: page {page} is broken"), record
        assert record["deliveries"] == tries
        assert ("SCHEDULER_MAX_DELIVERIES" in record["reason"]) == (setting == "retry")
    assert int(client.hget(f"{name}:progress", "dead") or 0) == len(BROKEN)
    assert int(client.hget(f"{name}:progress", "retried") or 0) == (tries - 1) * len(BROKEN)
    assert leased_count(client, name) == 0
    if setting == "retry":
        return

    # the spider is fixed; the operator requeues the dead letters and runs it again
    spider.write_text(BROKEN_PAGES_SPIDER.format(name=name, broken=[]))
    done = run_cli("dead", "requeue", name, "--all", cwd=project)
    assert done.returncode == 0, done.stderr
    assert f"requeued {len(BROKEN)} request(s)" in done.stdout + done.stderr
    again = run(workers, project, name, settings=settings)
    assert wait_workers(again, RUN_TIMEOUT) == [0, 0], logs(again)
    hits = site.hits()
    assert hits == {
        path: 2 if site.page_url(0).replace("/page/0", path) in broken_urls else 1 for path in hits
    }
    assert client.llen(f"{name}:dead") == 0
    items = _items_per_url(client, name)
    assert items == {url: 2 if url in broken_urls else 1 for url in items}


#: A spider whose page 0 also makes requests that fail without a callback raising: a
#: download error its errback handles, a request a downloader middleware ignores, a
#: page the site answers 404; page 3's callback raises.
NOT_CALLBACK_ERRORS_SPIDER = """
import scrapy

from scrapy_dist.spiders import RedisSpider


class BooksSpider(RedisSpider):
    name = "{name}"

    def parse(self, response):
        yield {{"url": response.url}}
        if response.url.endswith("/page/0"):
            yield scrapy.Request("{closed}", callback=self.never, errback=self.handled)
            yield response.follow("/page/1?ignore", callback=self.never)
            yield response.follow("/page/{missing}", callback=self.never)
        yield from response.follow_all(css="a", callback=self.parse)
        if response.url.endswith("/page/3"):
            raise ValueError("page 3 is broken")

    def never(self, response):
        raise AssertionError("called back: %s" % response.url)

    def handled(self, failure):  # (Scrapy 2.13.0 drops what an errback returns)
        self.logger.info("handled %s: %s", failure.request.url, failure.type.__name__)
"""

IGNORING_MIDDLEWARE = """
from scrapy.exceptions import IgnoreRequest


class IgnoreMarked:
    def process_request(self, request, spider=None):
        if request.url.endswith("?ignore"):
            raise IgnoreRequest("marked to be ignored")
        return None
"""


def test_only_a_callback_that_raises_is_dead_lettered_with_the_setting(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """With SCHEDULER_CALLBACK_ERRORS = "dead", a download error an errback handles, a
    request a downloader middleware ignores (IgnoreRequest) and a 404 page are
    acknowledged as before (each tried once, nothing dead-lettered): only the page whose
    callback raised is dead-lettered, once. (It was crawled 3 times, the setting
    unknown.)"""
    closed = "http://127.0.0.1:1/closed"  # nothing listens on port 1: connection refused
    spider = project / "books" / "spiders" / "books.py"
    spider.write_text(NOT_CALLBACK_ERRORS_SPIDER.format(name=name, closed=closed, missing=PAGES))
    (project / "books" / "middlewares.py").write_text(IGNORING_MIDDLEWARE)
    settings = {
        "SCHEDULER_CALLBACK_ERRORS": "dead",
        "ITEM_PIPELINES": json.dumps({"scrapy_dist.pipelines.RedisPipeline": 300}),
        "DOWNLOADER_MIDDLEWARES": json.dumps({"books.middlewares.IgnoreMarked": 1}),
        "RETRY_TIMES": 1,
    }
    client.lpush(f"{name}:start_urls", site.page_url(0))
    both = run(workers, project, name, settings=settings)
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    hits = site.hits()
    assert hits.pop(f"/page/{PAGES}") == 1  # the 404: answered once, not retried
    assert set(hits) == site.expected_paths()
    assert set(hits.values()) == {1}, hits  # /page/1?ignore never reached the site
    assert client.llen(f"{name}:items") == PAGES
    [record] = [json.loads(raw) for raw in client.lrange(f"{name}:dead", 0, -1)]
    assert json.loads(record["data"])["url"] == site.page_url(3)
    assert record["reason"].startswith("ValueError: page 3 is broken")
    assert record["deliveries"] == 1
    assert int(client.hget(f"{name}:progress", "retried") or 0) == 0
    text = "".join(log_text(w) for w in both)
    assert "called back" not in text
    [handled] = [line for line in text.splitlines() if f"handled {closed}: " in line]
    assert handled.endswith("ConnectionRefusedError")  # (DownloadConnection... on 2.19)


#: A spider whose page 3 raises an error whose message holds bytes that are not UTF-8
#: (decoded with ``surrogateescape``, as ``os.fsdecode`` does).
NOT_UTF8_ERROR_SPIDER = """
from scrapy_dist.spiders import RedisSpider


class BooksSpider(RedisSpider):
    name = "{name}"

    def parse(self, response):
        yield {{"url": response.url}}
        yield from response.follow_all(css="a", callback=self.parse)
        if response.url.endswith("/page/3"):
            raise ValueError(b"no such file: caf\\xe9".decode("utf-8", "surrogateescape"))
"""


def test_a_callback_error_whose_message_is_not_utf8_does_not_stall_the_crawl(
    project: Path, name: str, client: redis.Redis, site: TestSite, workers: list[Worker]
) -> None:
    """The error's reason went into the settlement as it was: redis-py could not encode
    it, so every flush of that worker failed from then on (its requests and
    acknowledgements kept, never sent): the crawl stalled, the workers never finished.
    The reason is stored with the byte escaped."""
    spider = project / "books" / "spiders" / "books.py"
    spider.write_text(NOT_UTF8_ERROR_SPIDER.format(name=name))
    client.lpush(f"{name}:start_urls", site.page_url(0))
    both = run(workers, project, name, settings={"SCHEDULER_CALLBACK_ERRORS": "dead"})
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    hits = site.hits()
    assert set(hits) == site.expected_paths()
    assert set(hits.values()) == {1}, hits
    [record] = [json.loads(raw) for raw in client.lrange(f"{name}:dead", 0, -1)]
    assert record["reason"].startswith("ValueError: no such file: caf\\udce9 (")


UNPRINTABLE_ERROR_SPIDER = """
from scrapy_dist.spiders import RedisSpider


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")


class BooksSpider(RedisSpider):
    name = "{name}"

    def parse(self, response):
        yield {{"url": response.url}}
        yield from response.follow_all(css="a", callback=self.parse)
        if response.url.endswith("/page/3"):
            raise Unprintable()
"""


@pytest.mark.parametrize("setting", ["dead", "retry"])
def test_a_callback_error_that_cannot_be_printed_is_still_settled_as_a_failure(  # noqa: PLR0917
    project: Path,
    name: str,
    client: redis.Redis,
    site: TestSite,
    workers: list[Worker],
    setting: str,
) -> None:
    """An exception whose __str__ raises: the scheduler's spider_error handler raised
    building its reason (Scrapy logged it and went on), so the request was acknowledged
    as done: neither retried nor dead-lettered, whatever SCHEDULER_CALLBACK_ERRORS. It
    is settled as a failure, with its type as the reason."""
    spider = project / "books" / "spiders" / "books.py"
    spider.write_text(UNPRINTABLE_ERROR_SPIDER.format(name=name))
    client.lpush(f"{name}:start_urls", site.page_url(0))
    both = run(workers, project, name, settings={"SCHEDULER_CALLBACK_ERRORS": setting})
    assert wait_workers(both, RUN_TIMEOUT) == [0, 0], logs(workers)
    tries = 1 if setting == "dead" else 3  # SCHEDULER_MAX_DELIVERIES
    hits = site.hits()
    assert set(hits) == site.expected_paths()
    assert hits["/page/3"] == tries
    [record] = [json.loads(raw) for raw in client.lrange(f"{name}:dead", 0, -1)]
    assert json.loads(record["data"])["url"] == site.page_url(3)
    assert record["reason"].startswith("Unprintable: (its message could not be read"), record
    assert record["deliveries"] == tries
