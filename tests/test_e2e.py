"""End-to-end crawls: ``scrapy crawl`` worker processes of the example project share one Redis.

Each crawl runs real worker processes against a private redis-server and a local
:class:`~scrapy_dist.testing.TestSite`, and is checked with the site's hit counters:
every page must be fetched exactly once, however the work was split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.request import fingerprint

from scrapy_dist.serializers import JsonSerializer, RequestCodec
from scrapy_dist.testing import TestSite
from scrapy_dist.testing.crawl import WorkerCrawl
from scrapy_dist.testing.queues import queued_count

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    import redis

    from scrapy_dist.testing import RedisServer, Worker

pytestmark = [pytest.mark.e2e, pytest.mark.redis_server]

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "example"
PAGES = 1500
SPIDER = "pages"
SEEDS_KEY = "pages:start_urls"
REQUESTS_KEY = "pages:requests"
DUPEFILTER_KEY = "pages:dupefilter"
#: Seconds the site waits per page in the two-worker crawl. A worker that opens with
#: nothing to do looks for work (seeds, queued requests) again only on Scrapy's 5 s
#: engine heartbeat, so the worker that did not get the seed joins up to 5 s after the
#: crawl starts: the crawl must last longer than that. One worker alone (16 concurrent
#: requests) needs 1500 * 0.15 / 16 = 14 s, so the second one always gets a share.
SHARED_CRAWL_DELAY = 0.15
CRAWL_TIMEOUT = 90.0


@dataclass
class Crawl:
    """What one crawl left behind."""

    workers: list[Worker]
    hits: dict[str, int]
    stats: list[dict[str, Any]]
    keys: dict[str, str] = field(default_factory=dict)  # key -> Redis type, after the crawl

    def fetched(self) -> set[str]:
        """Paths fetched at least once."""
        return set(self.hits)

    def total(self, stat: str) -> int:
        """Sum of one stat over the workers."""
        return sum(int(stats.get(stat, 0)) for stats in self.stats)


@pytest.fixture(scope="module")
def e2e_site() -> Iterator[TestSite]:
    with TestSite(PAGES) as site:
        yield site


@pytest.fixture(scope="module")
def e2e_client(module_server: RedisServer) -> Iterator[redis.Redis]:
    with module_server.client(decode_responses=True) as client:
        yield client


@pytest.fixture(scope="module")
def crawl(
    module_server: RedisServer,
    e2e_site: TestSite,
    e2e_client: redis.Redis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., Crawl]]:
    """Run one crawl on a clean Redis and a reset site; returns what it left behind.

    Every worker started is stopped at teardown if it still runs.
    """
    started: list[WorkerCrawl] = []

    def run(
        workers: int = 2,
        *,
        site: TestSite | None = None,
        spider: str = SPIDER,
        settings: Mapping[str, object] | None = None,
        spider_args: Mapping[str, object] | None = None,
        delay: float = 0.0,
        seed: bool = True,
        prepare: Callable[[], object] | None = None,
    ) -> Crawl:
        site = site or e2e_site
        e2e_client.flushdb()
        if prepare is not None:  # what the crawl finds in Redis when its workers start
            prepare()
        site.reset_hits()
        site.delay = delay
        running = WorkerCrawl(
            module_server,
            site,
            tmp_path_factory.mktemp(spider),
            project_dir=EXAMPLE_DIR,
            spider=spider,
            settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2, **(settings or {})},
            stats_setting="DEMO_STATS_FILE",
        )
        started.append(running)
        try:
            running.start(workers, spider_args=spider_args)
            if seed:
                # Seed while the workers start (see SHARED_CRAWL_DELAY): one of them takes
                # it as it opens, instead of on its first idle heartbeat, 5 s later.
                e2e_client.lpush(SEEDS_KEY, site.page_url(0))
            running.wait_ready(timeout=CRAWL_TIMEOUT)
            statuses = running.wait(timeout=CRAWL_TIMEOUT)
        finally:
            running.stop(timeout=5.0)
        assert statuses == [0] * workers, running.logs(15)
        keys = {str(key): str(e2e_client.type(key)) for key in e2e_client.scan_iter("*")}
        return Crawl(running.workers, site.hits(), [w.stats() for w in running.workers], keys)

    try:
        yield run
    finally:
        for running in started:
            running.close()
        e2e_site.delay = 0.0


@pytest.fixture(scope="module")
def shared_crawl(crawl: Callable[..., Crawl]) -> Crawl:
    """Two scrapy_dist workers crawl the site from one seed (run once for the module)."""
    return crawl(2, delay=SHARED_CRAWL_DELAY)


def test_two_workers_fetch_every_page_exactly_once(shared_crawl: Crawl, e2e_site: TestSite) -> None:
    expected = e2e_site.expected_paths()
    assert len(expected) == PAGES
    missing = expected - shared_crawl.fetched()
    assert not missing, f"{len(missing)} pages never fetched, e.g. {sorted(missing)[:5]}"
    repeated = {path: n for path, n in shared_crawl.hits.items() if n > 1}
    assert not repeated, f"{len(repeated)} pages fetched more than once"
    assert shared_crawl.fetched() == expected


def test_two_workers_share_the_work(shared_crawl: Crawl) -> None:
    responses = [int(stats.get("downloader/response_count", 0)) for stats in shared_crawl.stats]
    assert all(count > 0 for count in responses), responses
    assert sum(responses) == PAGES


def test_two_workers_flushing_on_the_reactor_thread_fetch_every_page_once(
    crawl: Callable[..., Crawl],
) -> None:
    # SCHEDULER_BACKGROUND_FLUSH = False: every flush waited on the reactor thread (none
    # went through the I/O thread), and every page was fetched once
    pages = 500
    with TestSite(pages) as small_site:
        done = crawl(2, site=small_site, settings={"SCHEDULER_BACKGROUND_FLUSH": False})
        assert done.fetched() == small_site.expected_paths()
    assert set(done.hits.values()) == {1}
    assert done.total("scheduler/redis/background_flushes") == 0


def test_the_default_flushes_off_the_reactor_thread(shared_crawl: Crawl) -> None:
    # SCHEDULER_BACKGROUND_FLUSH is on by default: the timers' flushes of both workers
    # went through their I/O threads
    flushes = [
        int(stats.get("scheduler/redis/background_flushes", 0)) for stats in shared_crawl.stats
    ]
    assert all(n > 0 for n in flushes), flushes


def test_two_workers_scrape_one_item_per_page(shared_crawl: Crawl) -> None:
    assert shared_crawl.total("item_scraped_count") == PAGES
    assert shared_crawl.total("dupefilter/filtered") > 0  # the graph has many duplicate links


def test_two_workers_remove_the_crawl_state(shared_crawl: Crawl) -> None:
    assert REQUESTS_KEY not in shared_crawl.keys
    assert DUPEFILTER_KEY not in shared_crawl.keys
    assert SEEDS_KEY not in shared_crawl.keys  # the seed was consumed


def test_scrapy_default_scheduler_crawls_the_same_pages(
    shared_crawl: Crawl, crawl: Callable[..., Crawl], e2e_site: TestSite
) -> None:
    local = crawl(
        1, spider="pages_local", spider_args={"start_url": e2e_site.page_url(0)}, seed=False
    )
    assert local.stats[0]["scheduler/enqueued"] > 0
    assert not local.keys, "Scrapy's own scheduler must not touch Redis"
    assert local.fetched() == shared_crawl.fetched() == e2e_site.expected_paths()
    assert set(local.hits.values()) == {1}
    assert local.total("item_scraped_count") == shared_crawl.total("item_scraped_count")


def test_persist_keeps_the_dupefilter_and_empties_the_queue(
    crawl: Callable[..., Crawl], e2e_client: redis.Redis
) -> None:
    pages = 500  # a smaller site: this crawl checks what is left in Redis
    with TestSite(pages) as small_site:
        persisted = crawl(2, site=small_site, settings={"SCHEDULER_PERSIST": True})
        assert persisted.fetched() == small_site.expected_paths()
    assert set(persisted.hits.values()) == {1}
    assert persisted.keys.get(REQUESTS_KEY) in (None, "string", "list")
    assert e2e_client.exists(REQUESTS_KEY) == 0 or _size(e2e_client, REQUESTS_KEY) == 0
    assert persisted.keys.get(DUPEFILTER_KEY) == "set"
    # every page but the seed, which skips the dupefilter and is not recorded (as Scrapy
    # records no dont_filter request; no page links back to it)
    assert e2e_client.scard(DUPEFILTER_KEY) == pages - 1


def _size(client: redis.Redis, key: str) -> int:
    return queued_count(client, key)


# -- the priority queue (one list per priority level) -----------------------------------


@pytest.mark.parametrize("order", [1, -1])
def test_two_workers_crawl_every_page_once_in_depth_priority_order(
    crawl: Callable[..., Crawl], order: int
) -> None:
    """``DEPTH_PRIORITY = 1`` (shallow pages first) keeps the crawl shallow, as a FIFO
    queue would; ``DEPTH_PRIORITY = -1`` (deep pages first) sends it deep, each page
    fetched being one found by the page fetched just before: the shared queue hands
    the highest priority out first (two workers, two requests at a time each, so that
    the order shows; measured 6 and 27-34 levels deep)."""
    pages = 500
    with TestSite(pages) as small_site:
        done = crawl(
            2,
            site=small_site,
            settings={"DEPTH_PRIORITY": order, "CONCURRENT_REQUESTS": 2},
            delay=0.005,
        )
        assert done.fetched() == small_site.expected_paths()
    assert set(done.hits.values()) == {1}
    depth = max(int(stats.get("request_depth_max", 0)) for stats in done.stats)
    if order > 0:  # breadth first: the site's shortest paths are a few links long
        assert depth <= 12, depth
    else:  # depth first: 27-34 levels measured (the site's deepest path: 126, one
        # request at a time); 30 failed now and then under load
        assert depth >= 20, depth


def test_a_queue_written_by_the_previous_version_is_crawled_once(
    crawl: Callable[..., Crawl], module_server: RedisServer
) -> None:
    """The previous version's priority queue (one zset of ``<id><payload>`` entries,
    score = -priority), its dupefilter recording every queued request: two workers of
    this version open at once, move it into levels between them, and crawl every entry
    once, highest priority first; no seed."""
    pages = 300
    with TestSite(pages) as small_site, module_server.client() as client:
        spider = Spider("pages")
        codec = RequestCodec(JsonSerializer(), spider)
        paths = sorted(small_site.expected_paths(), key=lambda p: int(p.rsplit("/", 1)[1]))
        priority = {path: int(path.rsplit("/", 1)[1]) % 3 for path in paths}

        def old_queue() -> None:
            entries, fingerprints = {}, []
            for n, path in enumerate(paths, 1):
                request = Request(small_site.url + path, priority=priority[path])
                entries[b"%016d" % n + codec.encode(request)] = -request.priority
                fingerprints.append(fingerprint(request))
            client.zadd(REQUESTS_KEY, entries)
            client.sadd(DUPEFILTER_KEY, *fingerprints)
            client.set("pages:seq", len(paths))

        done = crawl(2, site=small_site, seed=False, prepare=old_queue, delay=0.01)
        assert done.fetched() == set(paths)
    assert set(done.hits.values()) == {1}
    assert done.total("item_scraped_count") == pages
    moved = [
        int(m.group(1))
        for w in done.workers
        for m in re.finditer(r"Moved (\d+) queued request", w.log_file.read_text())
    ]
    assert sum(moved) == pages, moved  # each entry moved once, by one worker or the other
    # highest priority first: on average the priority-2 pages came before the 1s, the 0s
    rank = {path: i for i, path in enumerate(done.hits)}
    mean = [
        sum(rank[p] for p in paths if priority[p] == level) / (pages / 3) for level in (2, 1, 0)
    ]
    assert mean == sorted(mean), mean
