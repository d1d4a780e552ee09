"""A user's project crawled by two ``scrapy crawl`` workers, set up each way the docs offer.

Each scenario: a fresh project (``scrapy startproject``), the README's spider (or the
scenario's), an edited ``settings.py``, two workers, seeds pushed through Redis, and
then the site's own counters say whether every page was fetched exactly once.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import DONE_SETTINGS as DONE

if TYPE_CHECKING:
    from conftest import Project, Run

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(first_line: str) -> str:
    """The README's fenced code block whose first line is ``first_line``.

    Raises:
        AssertionError: The README has no such block (it drifted from this test).
    """
    for block in re.findall(r"```\w*\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL):
        if block.startswith(first_line):
            return str(block)
    raise AssertionError(f"README.md has no code block starting with {first_line!r}")


def settings_block(project: Project) -> str:
    """The README's settings block, with ``REDIS_URL`` pointing at the scenario's database."""
    block = readme_block("# settings.py")
    assert 'REDIS_URL = "redis://localhost:6379/0"' in block
    return block.replace("redis://localhost:6379/0", project.redis_url)


def test_readme_settings_block(project: Project) -> None:
    """The README's settings block and spider: two workers, each page once, one item each."""
    project.add_settings(settings_block(project) + DONE)
    workers = project.crawl(2)
    project.seed()
    project.assert_clean_exit(workers)
    project.assert_each_page_once()
    assert project.items() == len(project.site.expected_paths(0))
    assert project.dead() == []
    for worker in workers:
        assert "books:start_urls" in worker.text(), "workers should say which seeds key they read"


def test_addon_alone(project: Project) -> None:
    """``ADDONS`` and ``REDIS_URL`` only: the add-on's classes share the crawl."""
    project.add_settings(
        f'ADDONS = {{"scrapy_dist.addon.DistAddon": 0}}\nREDIS_URL = "{project.redis_url}"\n' + DONE
    )
    workers = project.crawl(2)
    project.seed()
    project.assert_clean_exit(workers)
    project.assert_each_page_once()
    for worker in workers:
        assert "is not Redis-backed" not in worker.text(), worker.tail()


def test_redis_crawl_spider_with_rules(project: Project) -> None:
    """A ``RedisCrawlSpider`` following its rules' links."""
    project.add_settings(settings_block(project) + DONE)
    project.write(
        "books/spiders/books.py",
        "from scrapy.linkextractors import LinkExtractor\n"
        "from scrapy.spiders import Rule\n\n"
        "from scrapy_dist.spiders import RedisCrawlSpider\n\n\n"
        "class BooksSpider(RedisCrawlSpider):\n"
        '    name = "books"\n'
        '    rules = (Rule(LinkExtractor(allow="/page/"), "parse_page", follow=True),)\n\n'
        "    def parse_page(self, response):\n"
        '        yield {"url": response.url}\n',
    )
    workers = project.crawl(2)
    project.seed()
    project.assert_clean_exit(workers)
    project.assert_each_page_once()
    # The seed's own response goes to the rules (parse), the others to parse_page.
    assert project.items() == len(project.site.expected_paths(0)) - 1


@pytest.mark.parametrize("kind", ["list", "set", "zset"])
def test_seeds_of_every_kind(project: Project, kind: str) -> None:
    """Seeds in a list, set or zset, pushed with redis commands and ``scrapy-dist push``."""
    settings = {
        "list": "",
        "set": "REDIS_START_URLS_AS_SET = True\n",
        "zset": "REDIS_START_URLS_AS_ZSET = True\n",
    }[kind]
    # seeds pushed after their pages were crawled through links are filtered here: seeds
    # skip the dupefilter by default now (scrapy-redis's REDIS_START_URLS_DONT_FILTER)
    project.add_settings(
        settings_block(project) + DONE + settings + "REDIS_START_URLS_DONT_FILTER = False\n"
    )
    pushed = project.cli("push", "books", project.page(5))
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    workers = project.crawl(2)
    with project.client() as client:
        if kind == "list":
            client.rpush("books:start_urls", project.page(0), project.page(3))
        elif kind == "set":
            client.sadd("books:start_urls", project.page(0), project.page(3))
        else:
            client.zadd("books:start_urls", {project.page(0): 1, project.page(3): 2})
    project.assert_clean_exit(workers)
    project.assert_each_page_once()
    with project.client() as client:
        assert client.exists("books:start_urls") == 0


BAD_SEEDS = [
    "ftp://x",
    "not a url",
    '{"url": "http://127.0.0.1:1/", "callback": "no_such_method"}',
    '{"url": 5}',
]


def test_bad_seeds_dead_lettered_once_and_crawl_ends(project: Project) -> None:
    """Bad seeds among good ones: each dead-lettered exactly once, the workers exit by themselves.

    The lease timeout is short so that a bad seed whose lease was never settled would
    come back (and be dead-lettered again) well within the crawl.
    """
    project.add_settings(
        settings_block(project)
        + DONE
        + "SCHEDULER_LEASE_TIMEOUT = 3\nSCHEDULER_HEARTBEAT_INTERVAL = 1\n"
    )
    workers = project.crawl(2)
    with project.client() as client:
        for i, bad in enumerate(BAD_SEEDS):
            client.rpush("books:start_urls", project.page(i * 7), bad)
    started = time.monotonic()
    project.wait(workers, timeout=45)
    # A bad seed that was not settled comes back after the lease timeout: give it the time.
    time.sleep(max(0.0, 5 - (time.monotonic() - started)))
    records = [json.loads(raw) for raw in project.dead()]
    assert sorted(r["data"] for r in records) == sorted(BAD_SEEDS), records
    assert all(r["kind"] == "seed" and r["reason"] for r in records), records
    project.assert_clean_exit(workers)
    project.assert_each_page_once(seeds=[i * 7 for i in range(1, len(BAD_SEEDS))])


def test_rerun_of_a_finished_persisted_crawl(project: Project) -> None:
    """A new run of a finished persisted crawl waits for its seeds and crawls them."""
    from scrapy_dist.testing import TestSite

    project.add_settings(settings_block(project) + DONE)
    first = project.crawl(2)
    project.seed()
    project.assert_clean_exit(first)
    project.assert_each_page_once()

    with TestSite(60, delay=0.02) as second_site:
        second = project.crawl(2)
        time.sleep(3)  # longer than CRAWL_DONE_GRACE: the old "finished" must not close them
        still = [run for run in second if run.process.poll() is None]
        assert len(still) == 2, "a new run ended before its seeds came:\n" + "\n".join(
            r.tail() for r in second
        )
        with project.client() as client:
            client.lpush("books:start_urls", second_site.page_url(0))
        project.assert_clean_exit(second)
        assert second_site.hits() == dict.fromkeys(second_site.expected_paths(0), 1)


def test_spider_argument_max_idle_time(project: Project) -> None:
    """``-a max_idle_time=4``: the workers crawl, then close by themselves after 4 idle seconds."""
    project.add_settings(settings_block(project))
    workers = project.crawl(2, spider_args={"max_idle_time": 4})
    project.seed()
    started = time.monotonic()
    project.assert_clean_exit(workers)
    project.assert_each_page_once()
    assert time.monotonic() - started >= 3, "closed before being idle for max_idle_time"


def test_spider_argument_redis_key(project: Project) -> None:
    """``-a redis_key=...``: the workers read their seeds from that key."""
    project.add_settings(settings_block(project) + DONE)
    workers = project.crawl(2, spider_args={"redis_key": "shelf:seeds"})
    with project.client() as client:
        client.lpush("shelf:seeds", project.page(0))
    project.assert_clean_exit(workers)
    project.assert_each_page_once()


def test_spider_name_set_in_init(project: Project) -> None:
    """A spider naming itself in ``__init__``: every key is built from the instance's name."""
    project.add_settings(settings_block(project) + DONE + "SCHEDULER_PERSIST = True\n")
    project.write(
        "books/spiders/books.py",
        "from scrapy_dist.spiders import RedisSpider\n\n\n"
        "class BooksSpider(RedisSpider):\n"
        '    name = "books"\n\n'
        '    def __init__(self, *args, shop="eu", **kwargs):\n'
        "        super().__init__(*args, **kwargs)\n"
        '        self.name = f"books_{shop}"\n\n'
        "    def parse(self, response):\n"
        "        yield from response.follow_all(css='a')\n",
    )
    workers = project.crawl(2, spider_args={"shop": "fr"})
    with project.client() as client:
        client.lpush("books_fr:start_urls", project.page(0))
    project.assert_clean_exit(workers)
    project.assert_each_page_once()
    with project.client() as client:
        keys = set(client.scan_iter(count=1000))
    assert "books_fr:dupefilter" in keys, keys
    assert not {k for k in keys if k.startswith("books:")}, keys


def _one_then_another(project: Project, seeds: int) -> tuple[Run, Run, int]:
    """Start a ``seeds`` worker, wait for its first page, then start a second one.

    Returns:
        The two workers, and how many of the ``seeds`` pages were not fetched yet when
        the second opened.
    """
    (first,) = project.crawl(1, "seeds")
    deadline = time.monotonic() + 60
    while sum(project.site.hits().values()) < 1:
        assert time.monotonic() < deadline, first.tail()
        time.sleep(0.1)
    (second,) = project.crawl(1, "seeds")
    return first, second, seeds - sum(project.site.hits().values())


SEEDS_SPIDER = """
from scrapy_dist.spiders import RedisSpider


class SeedsSpider(RedisSpider):
    name = "seeds"
    redis_batch_size = 1

    def parse(self, response):
        yield {"url": response.url}
"""


def test_a_delayed_host_is_shared_not_hoarded(project: Project) -> None:
    """Issue 36's tutorial project: seeds of one host, ``DOWNLOAD_DELAY = 2``, a worker
    that starts alone (it may keep what it leased: nobody else could send it). Once a
    second worker registers, the first keeps only what its downloader can start within
    the horizon and hands the rest back, so the second crawls its share."""
    from scrapy_dist.testing import run_cli

    def leased() -> dict[str, Any]:
        status = run_cli("status", "seeds", "--json", cwd=project.root)
        assert status.returncode == 0, status.stderr
        return dict(json.loads(status.stdout))

    seeds = 10
    project.use_scrapy_dist()
    project.add_settings("DOWNLOAD_DELAY = 2\n")
    project.write("books/spiders/seeds.py", SEEDS_SPIDER)
    project.seed(*(project.page(i) for i in range(seeds)), key="seeds:start_urls")
    first, second, remaining = _one_then_another(project, seeds)
    # each keeps one in its downloader's slot and the next within the horizon at most
    deadline = time.monotonic() + 20
    while (data := leased())["leased"] > 5 and sum(project.site.hits().values()) < seeds:
        assert time.monotonic() < deadline, (data, first.tail())
        time.sleep(0.3)
    project.assert_clean_exit([first, second])
    assert project.site.hits() == {f"/page/{i}": 1 for i in range(seeds)}
    if remaining >= 4:  # the second opened early enough to be given some
        assert second.items() >= 1, second.tail()
    assert first.items() + second.items() == seeds


def _slow_down_site(retry_after: int | None) -> tuple[Any, list[tuple[float, str, int]]]:
    """A site whose ``/p/0`` answers its first request with 429 and ``Retry-After``
    (``None``: it does not); every other request gets a page. Returns the server and
    its log of hits (when the site read each, its path, the status)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hits: list[tuple[float, str, int]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                first = (
                    retry_after is not None
                    and self.path == "/p/0"
                    and not any(p == "/p/0" for _, p, _ in hits)
                )
                status = 429 if first else 200
                hits.append((time.time(), self.path, status))
            body = b"<html><title>p</title></html>"
            self.send_response(status)
            if first:
                self.send_header("Retry-After", str(retry_after))
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, hits


@pytest.mark.parametrize("polite", [False, True], ids=["horizon", "politeness"])
def test_a_retry_after_pauses_the_host(project: Project, polite: bool) -> None:
    """A 429 with ``Retry-After: 3``: Scrapy retries the page (``RetryMiddleware``), and
    the retry waits for the pause instead of going at once, held by the start horizon or
    by cluster-wide politeness; the crawl does not count as finished meanwhile."""
    server, hits = _slow_down_site(3)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        project.use_scrapy_dist()
        if polite:
            project.add_settings("SCHEDULER_POLITENESS = True")
        project.write("books/spiders/seeds.py", SEEDS_SPIDER)
        project.seed(*(f"{base}/p/{i}" for i in range(4)), key="seeds:start_urls")
        (worker,) = project.crawl(1, "seeds")
        project.assert_clean_exit([worker])
    finally:
        server.shutdown()
    first = [t for t, path, status in hits if path == "/p/0"]
    assert [status for _, path, status in hits if path == "/p/0"] == [429, 200], hits
    assert first[1] - first[0] >= 2.9, hits
    assert sorted(path for _, path, status in hits if status == 200) == [
        f"/p/{i}" for i in range(4)
    ]
    assert worker.items() == 4
    assert "Pausing download slot 127.0.0.1 for 3.0s" in worker.text(), worker.tail()


def test_a_pause_another_worker_wrote_holds_this_worker_back(project: Project) -> None:
    """A slot pause found in Redis (as another worker writes it on a Retry-After) keeps
    this worker from sending to the host until it ends; then every seed is crawled."""
    from scrapy_dist.keys import RedisKeys

    pause = 4.0
    project.use_scrapy_dist()
    project.write("books/spiders/seeds.py", SEEDS_SPIDER)
    with project.client() as client:
        seconds, micros = client.time()
        ends = seconds + micros / 1e6 + pause
        client.zadd(RedisKeys.build("seeds").slot_pauses, {"127.0.0.1": ends * 1000})
        started = time.time()
        client.lpush("seeds:start_urls", *(project.page(i) for i in range(3)))
    (worker,) = project.crawl(1, "seeds")
    project.assert_clean_exit([worker])
    assert project.site.hits() == {f"/page/{i}": 1 for i in range(3)}
    first = project.site.first_hit_time()
    assert first is not None
    assert first >= started + pause - 0.5, (first - started, worker.tail())


def test_a_sites_robots_txt_is_fetched_once_for_the_crawl(project: Project) -> None:
    """``ROBOTSTXT_OBEY`` with the add-on: the first worker fetches the site's
    robots.txt and keeps it in Redis; a worker started later reads it from there."""
    seeds = 8
    project.add_settings(
        f'ADDONS = {{"scrapy_dist.addon.DistAddon": 0}}\nREDIS_URL = "{project.redis_url}"\n'
        + DONE
        + "ROBOTSTXT_OBEY = True\nDOWNLOAD_DELAY = 1\n"
    )
    project.write("books/spiders/seeds.py", SEEDS_SPIDER)
    project.seed(*(project.page(i) for i in range(seeds)), key="seeds:start_urls")
    first, second, remaining = _one_then_another(project, seeds)
    project.assert_clean_exit([first, second])
    assert project.site.hits() == {f"/page/{i}": 1 for i in range(seeds)}
    assert "'robotstxt/shared/stored': 1" in first.text(), first.tail()
    if remaining >= 4 and second.items():  # it met the site after the first stored it
        assert "'robotstxt/shared/hits': 1" in second.text(), second.tail()
        assert "robotstxt/shared/stored" not in second.text(), second.tail()


def test_a_slot_page_limit_stops_the_crawl_of_a_host(project: Project) -> None:
    """``SCHEDULER_SLOT_PAGE_LIMIT``: two workers crawling one host (the README's spider
    follows every link) stop near the limit, within what the other worker started since
    its last write; the rest is dropped, the crawl finishes, and ``status`` counts what
    the site served."""
    from scrapy_dist.testing import run_cli

    limit = 12
    project.add_settings(
        settings_block(project)
        + DONE
        + f"SCHEDULER_SLOT_PAGE_LIMIT = {limit}\nDOWNLOAD_DELAY = 0.2\n"
    )
    workers = project.crawl(2)
    project.seed()
    project.assert_clean_exit(workers)
    served = sum(project.site.hits().values())
    assert served < len(project.site.expected_paths(0))  # (the limit cut the crawl)
    # each worker: one slot at a time, a send every 0.2 s at most: 5 a second
    assert limit <= served <= limit + 2 * 5, (served, workers[0].tail())
    dropped = [re.findall(r"'scheduler/slot_limit/dropped': (\d+)", w.text()) for w in workers]
    assert any(dropped), workers[0].tail()
    assert any("reached SCHEDULER_SLOT_PAGE_LIMIT" in w.text() for w in workers)
    status = run_cli("status", "books", "--json", cwd=project.root)
    assert status.returncode == 0, status.stderr
    (slot,) = json.loads(status.stdout)["slots"]["busiest"]
    assert slot == {
        "slot": "127.0.0.1",
        "sent": served,
        "pages": served,
        "4xx": 0,
        "5xx": 0,
        "failed": 0,
        "started": served,
    }


def test_the_queue_per_slot_spaces_a_host_for_every_worker(project: Project) -> None:
    """``SlotQueue`` with two workers and ``DOWNLOAD_DELAY = 0.4``: the frontier gives
    the host one request per delay, to whichever worker asks; each seed is crawled
    once. At the site, the gaps between requests average at least the delay less 10 %,
    and none is near 0 (two workers given the host at once): a gap is measured from
    the reserves, so a request a busy worker sends late may shorten the next one."""
    server, hits = _slow_down_site(None)
    seeds, delay = 12, 0.4
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        project.use_scrapy_dist()
        project.add_settings(
            'SCHEDULER_QUEUE_CLASS = "scrapy_dist.slot_queue.SlotQueue"\n'
            f"DOWNLOAD_DELAY = {delay}\n"
        )
        project.write("books/spiders/seeds.py", SEEDS_SPIDER)
        project.seed(*(f"{base}/p/{i}" for i in range(seeds)), key="seeds:start_urls")
        workers = project.crawl(2, "seeds")
        project.assert_clean_exit(workers)
    finally:
        server.shutdown()
    assert sorted(path for _, path, _ in hits) == sorted(f"/p/{i}" for i in range(seeds))
    times = sorted(t for t, _, _ in hits)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert sum(gaps) / len(gaps) >= 0.9 * delay, gaps
    assert min(gaps) >= 0.25 * delay, gaps
    assert sum(w.items() for w in workers) == seeds
