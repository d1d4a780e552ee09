"""A worker's seen-cache against crawls that finish and start again under it.

First as a user runs it: a throwaway Scrapy project, one ``scrapy crawl`` worker that
stays up (``CLOSE_WHEN_CRAWL_DONE = False``) and, per run, one that closes when the
crawl is done and so finishes it (``SCHEDULER_PERSIST = False``: its dupefilter is
deleted); the seed pushed again for each run: every run must fetch every page again
(a fingerprint the worker that stays up cached in a run before would drop it silently).

Then, driven by hand: a worker that holds nothing while its crawl finishes and the
next run starts before it looks again finds the crawl gone with its seen-cache, and
rejoins the next run rather than closing; and one left holding nothing by the start
horizon's hand-back (not by a settlement) forgets its seen-cache too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
from scrapy import Request

from scrapy_dist.frontier.epoch import FINISHED
from scrapy_dist.testing import TestSite, start_workers, stop_workers, wait_ready, wait_workers
from scrapy_dist.testing.engine import HeldRequests
from scrapy_dist.worker.engine import SlotState

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    import redis
    from scrapy.crawler import Crawler

    from scrapy_dist.scheduler import Scheduler
    from scrapy_dist.testing import Worker

PAGES = 40
RUNS = 4
RUN_TIMEOUT = 90.0
URL = "https://example.com/"

SPIDER = """
from scrapy_dist.spiders import RedisSpider


class PagesSpider(RedisSpider):
    name = "{name}"

    def parse(self, response):
        yield from response.follow_all(css="a", callback=self.parse)
"""

SETTINGS = """
BOT_NAME = "again"
SPIDER_MODULES = ["again.spiders"]
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
ADDONS = {{"scrapy_dist.addon.DistAddon": 0}}
REDIS_URL = "{redis_url}"
CRAWL_DONE_GRACE = 0.5
SCHEDULER_PERSIST = False
"""


@pytest.fixture
def project(tmp_path: Path, name: str, redis_url: str) -> Path:
    root = tmp_path / "project"
    package = root / "again"
    (package / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = again.settings\n")
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text("")
    (package / "settings.py").write_text(SETTINGS.format(redis_url=redis_url))
    (package / "spiders" / "pages.py").write_text(SPIDER.format(name=name))
    return root


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    stop_workers(started)


def start(workers: list[Worker], project: Path, name: str, **settings: object) -> Worker:
    """Start one worker of the project and wait until it opened its spider."""
    [worker] = start_workers(
        1,
        project_dir=project,
        spider=name,
        log_dir=project.parent,
        settings=settings,
        stats_setting=None,
        first_index=len(workers),
    )
    workers.append(worker)
    wait_ready([worker], timeout=RUN_TIMEOUT)
    return worker


@pytest.mark.e2e
@pytest.mark.parametrize("background", [False, True], ids=["reactor", "background"])
def test_a_worker_that_stays_up_crawls_every_page_of_every_run(
    project: Path, name: str, client: redis.Redis, workers: list[Worker], *, background: bool
) -> None:
    flush = {"SCHEDULER_BACKGROUND_FLUSH": background}
    stays = start(workers, project, name, CLOSE_WHEN_CRAWL_DONE=False, **flush)
    with TestSite(PAGES, delay=0.01) as site:
        every = site.expected_paths()
        for number in range(RUNS):
            site.reset_hits()
            closes = start(workers, project, name, CLOSE_WHEN_CRAWL_DONE=True, **flush)
            client.lpush(f"{name}:start_urls", site.page_url(0))
            assert wait_workers([closes], RUN_TIMEOUT) == [0], closes.log_tail(30)
            time.sleep(1.0)  # time for any extra fetch to show
            hits = site.hits()
            assert set(hits) == every, (number, sorted(every - set(hits)), stays.log_tail(30))
            assert set(hits.values()) == {1}, (number, hits)
    assert stays.process.poll() is None, stays.log_tail(60)


def _open(crawler: Crawler, holding: set[Request]) -> Scheduler:
    """A scheduler opened for ``crawler`` whose engine holds ``holding``."""
    return HeldRequests(crawler, holding=holding).scheduler


def test_an_idle_worker_rejoins_a_finished_crawl_whose_next_run_began_first(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """The crawl finishes while this worker holds nothing (another worker closes and
    finds it empty), and a worker started next begins a new run before this one looks
    again: its next reserve is refused under the old epoch. Its run finished, so it
    drops its seen-cache and rejoins (it waits for seeds: ``CLOSE_WHEN_CRAWL_DONE`` is
    off), as when it looks before the next run begins; it does not close as if its
    crawl had been flushed and replaced."""
    settings = {"SCHEDULER_FLUSH_INTERVAL": 0, "SCHEDULER_PREFETCH": 1}
    holding: set[Request] = set()
    idle = _open(make_crawler(settings), holding)
    assert idle.enqueue_request(Request(URL))
    request = idle.next_request()
    assert request is not None
    holding.add(request)
    assert not idle.enqueue_request(Request(URL))  # known locally
    holding.clear()
    assert idle.next_request() is None  # holds nothing now
    closing = _open(make_crawler(settings), set())
    closing.close("finished")  # finds the crawl empty: finished, its keys deleted
    assert client.hexists(closing.frontier.keys.progress, "finished_at")
    starting = _open(make_crawler(settings), set())  # the next run
    assert starting.enqueue_request(Request(f"{URL}next"))
    assert idle.next_request() is None  # refused under the old epoch
    assert idle.frontier.lost == FINISHED
    idle.membership.after_lost()
    assert idle.frontier.lost is None
    assert idle.frontier.epoch == starting.frontier.epoch
    assert idle.enqueue_request(Request(URL))  # the next run crawls it again
    assert idle.next_request() is not None
    starting.close("finished")
    idle.close("finished")


def test_a_worker_the_start_horizon_left_holding_nothing_forgets_its_seen_cache(
    make_crawler: Callable[..., Crawler], client: redis.Redis
) -> None:
    """The engine finished this worker's request while a second one stayed buffered;
    its slot would hold it 5 s, so the start horizon hands it back and the worker holds
    nothing. Another worker crawls it and finishes the crawl, and the next run begins:
    a URL this worker cached in the run before is new again (a hand-back that empties
    the worker counts as a settlement that does: the crawl may finish meanwhile)."""
    settings = {"SCHEDULER_FLUSH_INTERVAL": 0, "SCHEDULER_PREFETCH": 2}
    holding: set[Request] = set()
    idle = _open(make_crawler(settings), holding)
    assert idle.horizon is not None
    # as if another worker were registered (none reads it here): what cannot start soon
    # goes back rather than staying buffered
    idle.horizon.rider = lambda workers: None  # type: ignore[method-assign]
    idle.horizon.others = True
    later = "https://example.org/"
    idle.horizon.slot_of = lambda request: (
        SlotState("example.org", True, 5.0, 5.0)
        if request.url == later
        else SlotState("example.com", True, 0.0, 0.0)
    )
    assert idle.enqueue_request(Request(URL))
    assert idle.enqueue_request(Request(later))
    request = idle.next_request()
    assert request is not None
    assert request.url == URL
    holding.add(request)
    holding.clear()
    idle.deliveries.settle()  # the engine is done with it; `later` is still buffered
    assert idle.next_request() is None  # `later` would wait 5 s: handed back
    assert not idle.deliveries.held()
    idle.frontier.flush()
    other = _open(make_crawler(settings), set())
    taken = other.next_request()
    assert taken is not None
    assert taken.url == later
    other.deliveries.settle()
    other.close("finished")  # finds the crawl empty: finished, its keys deleted
    assert client.hexists(other.frontier.keys.progress, "finished_at")
    starting = _open(make_crawler(settings), set())  # the next run
    assert starting.enqueue_request(Request(f"{URL}next"))
    assert idle.enqueue_request(Request(URL))  # the next run crawls it again
    starting.close("finished")
    idle.close("finished")
