"""Fault injection: worker processes crawl a local site while workers or Redis fail.

Each test runs its own redis-server (some kill it), a local test site whose pages
answer after a small delay (so a crawl lasts a few seconds and faults land mid-crawl),
and ``scrapy crawl`` worker processes of ``tests/project``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from scrapy_dist.testing import leases
from scrapy_dist.testing.crawl import WorkerCrawl, duplicates
from scrapy_dist.testing.site import TestSite

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy_dist.testing.redis_server import RedisServer
    from scrapy_dist.testing.workers import Worker

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).parent / "project"
CONCURRENCY = 4
PREFETCH = 1
#: Settings every worker of these tests gets: fast leases, exit when the crawl is done.
FAST = {
    "CONCURRENT_REQUESTS": CONCURRENCY,
    "SCHEDULER_PREFETCH": PREFETCH,
    "SCHEDULER_LEASE_TIMEOUT": 3,
    "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
    "SCHEDULER_WORKER_TIMEOUT": 2,
    "SCHEDULER_MAX_DELIVERIES": 3,
    "CLOSE_WHEN_CRAWL_DONE": True,
    "CRAWL_DONE_GRACE": 1,
    "SCHEDULER_PERSIST": False,
}


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    with TestSite(pages=400, delay=0.02) as s:
        yield s


class Crawl(WorkerCrawl):
    """Workers of one crawl (``tests/project``, FAST settings); all stopped at teardown."""

    def __init__(self, server: RedisServer, site: TestSite, log_dir: Path) -> None:
        super().__init__(server, site, log_dir, project_dir=PROJECT, settings=FAST)

    def assert_complete(self) -> dict[str, int]:
        hits = self.site.hits()
        missing = self.site.expected_paths() - set(hits)
        assert not missing, f"{len(missing)} pages never fetched, e.g. {sorted(missing)[:5]}"
        assert leases.leased_count(self.client, "pages") == 0, "requests left leased"
        assert self.client.exists("pages:requests") == 0, "requests left queued"
        return hits

    def held_by(self, worker: Worker) -> int:
        """How many requests and seeds ``worker`` holds leased (worker ids embed the pid)."""
        return leases.held_by(self.client, "pages", worker.pid)


@pytest.fixture
def crawl(server: RedisServer, fresh_site: TestSite, tmp_path: Path) -> Iterator[Crawl]:
    c = Crawl(server, fresh_site, tmp_path)
    yield c
    c.close()


def test_kill_9_workers_at_random_moments(crawl: Crawl) -> None:
    rng = random.Random(os.getpid())
    crawl.start(3)
    crawl.seed()
    kills = held = 0
    for fetched in sorted(rng.sample(range(40, 300), 2)):
        crawl.hit_when(fetched)
        victim = rng.choice([w for w in crawl.workers if w.returncode is None])
        os.kill(victim.pid, signal.SIGKILL)
        victim.process.wait()
        kills += 1
        held += crawl.held_by(victim)  # its leases stay until they expire
        crawl.start(1)  # a replacement joins the running crawl
    codes = crawl.wait()
    assert sorted(codes) == [-signal.SIGKILL] * kills + [0] * (len(codes) - kills), crawl.logs()
    hits = crawl.assert_complete()
    # only what the killed workers held can be fetched twice
    assert duplicates(hits) <= held, (duplicates(hits), held)


def test_redis_killed_and_restarted_from_its_aof(crawl: Crawl, server: RedisServer) -> None:
    crawl.start(2)
    crawl.seed()
    crawl.hit_when(100)
    leased = leases.leased_count(crawl.client, "pages")
    server.kill()
    time.sleep(2)
    server.restart()
    assert crawl.wait() == [0, 0], crawl.logs()
    hits = crawl.assert_complete()
    # leases outlive their 3 s timeout during the outage: what was held (plus one
    # reserve per worker under way at the kill) may be fetched again, nothing more
    assert duplicates(hits) <= leased + 2 * PREFETCH, (duplicates(hits), leased)
    assert "unreachable" in crawl.full_logs()


def test_redis_unreachable_for_10_seconds(crawl: Crawl, server: RedisServer) -> None:
    # a frozen server accepts connections and never answers, like a network partition
    crawl.start(2, SCHEDULER_LEASE_TIMEOUT=60, REDIS_PARAMS=json.dumps({"socket_timeout": 1}))
    crawl.seed()
    crawl.hit_when(100)
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        time.sleep(10)
        assert all(w.returncode is None for w in crawl.workers), crawl.logs()
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert crawl.wait() == [0, 0], crawl.logs()
    crawl.assert_complete()


def test_a_page_whose_callback_raises_is_crawled_once_as_on_scrapys_scheduler(
    crawl: Crawl,
) -> None:
    """The default SCHEDULER_CALLBACK_ERRORS ("done"): Scrapy logs the error, the page
    is fetched once and acknowledged (it was fetched SCHEDULER_MAX_DELIVERIES times,
    its items scraped again each time)."""
    crawl.start(2, spider_args={"fail_on": "/page/7"})
    crawl.seed()
    assert crawl.wait() == [0, 0], crawl.logs()
    hits = crawl.site.hits()
    assert hits["/page/7"] == 1
    assert crawl.client.llen("pages:dead") == 0
    assert "ValueError: poison page /page/7" in crawl.full_logs()
    missing = crawl.site.expected_paths() - set(hits)
    assert len(missing) < 5, missing


def test_poison_page_ends_in_dead_letters(crawl: Crawl) -> None:
    crawl.start(2, spider_args={"fail_on": "/page/7"}, SCHEDULER_CALLBACK_ERRORS="retry")
    crawl.seed()
    assert crawl.wait() == [0, 0], crawl.logs()
    hits = crawl.site.hits()
    assert hits["/page/7"] == FAST["SCHEDULER_MAX_DELIVERIES"]
    [record] = [json.loads(d) for d in crawl.client.lrange("pages:dead", 0, -1)]
    assert record["kind"] == "request"
    assert "ValueError: poison page /page/7" in record["reason"]
    assert json.loads(record["data"])["url"].endswith("/page/7")
    # the rest of the crawl completed: every page not reachable only through page 7
    missing = crawl.site.expected_paths() - set(hits)
    assert len(missing) < 5, missing


def test_with_callback_errors_dead_a_killed_workers_requests_still_come_back(
    crawl: Crawl,
) -> None:
    """``SCHEDULER_CALLBACK_ERRORS = "dead"`` dead-letters the page whose callback
    raised, fetched once (the setting did not exist: it was fetched 3 times), and only
    it: the requests a worker killed with -9 held come back when their leases expire
    and are crawled, as with "retry" (``SCHEDULER_MAX_DELIVERIES = 1``, the workaround
    before, dead-lettered them)."""
    options = {"SCHEDULER_CALLBACK_ERRORS": "dead"}
    crawl.start(2, spider_args={"fail_on": "/page/7"}, **options)
    crawl.seed()
    crawl.hit_when(100)
    victim = crawl.workers[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.process.wait()
    held = crawl.held_by(victim)
    assert held > 0  # mid-crawl: its leases are what must come back
    crawl.start(1, spider_args={"fail_on": "/page/7"}, **options)
    assert crawl.wait() == [-signal.SIGKILL, 0, 0], crawl.logs()
    hits = crawl.site.hits()
    assert hits["/page/7"] == 1
    [record] = [json.loads(d) for d in crawl.client.lrange("pages:dead", 0, -1)]
    assert json.loads(record["data"])["url"].endswith("/page/7")
    assert record["reason"].startswith("ValueError: poison page /page/7")
    assert record["deliveries"] == 1
    missing = crawl.site.expected_paths() - set(hits)
    assert len(missing) < 5, missing  # only what is reachable through page 7 alone
    assert leases.leased_count(crawl.client, "pages") == 0
    assert duplicates(hits) <= held, (duplicates(hits), held)


def test_one_worker_stops_early_the_other_finishes(
    crawl: Crawl, monkeypatch: pytest.MonkeyPatch
) -> None:
    # slower pages (the 320 left last over 4 s for the other worker alone), so the other
    # is still crawling when the early one has finished its graceful shutdown
    monkeypatch.setattr(crawl.site, "delay", 0.05)
    early, late = crawl.start(2)
    crawl.seed()
    crawl.hit_when(80)
    os.kill(early.pid, signal.SIGINT)  # graceful: finish in-flight, hand back the rest
    assert early.process.wait(30) == 0
    assert crawl.client.exists("pages:dupefilter") == 1  # shared state intact
    assert late.returncode is None
    assert crawl.wait() == [0, 0], crawl.logs()
    hits = crawl.assert_complete()
    assert duplicates(hits) == 0
    assert crawl.client.exists("pages:dupefilter", "pages:requests", "pages:seq") == 0


def test_workers_exit_by_themselves_when_the_crawl_is_done(crawl: Crawl) -> None:
    crawl.start(2)
    crawl.seed()
    assert crawl.wait() == [0, 0], crawl.logs()
    exited = time.time()
    last_hit = crawl.site.last_hit_time()
    assert last_hit is not None
    assert exited - last_hit < 8, "workers lingered after the last page"
    hits = crawl.assert_complete()
    assert duplicates(hits) == 0
    logs = crawl.full_logs()
    assert logs.count("is finished:") >= 1, logs
    assert "crawl_finished" in logs
