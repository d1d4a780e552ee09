"""Cluster-wide politeness (``SCHEDULER_POLITENESS``, scrapy_dist/politeness.py).

From the user's side first: 4 ``scrapy crawl`` workers crawl two hosts of one local
site (``127.0.0.1``, rate-limited by ``DOWNLOAD_DELAY``/``CONCURRENT_REQUESTS_PER_DOMAIN``,
and ``localhost``, unlimited through ``DOWNLOAD_SLOTS``); the site's access log shows
the limits held across all workers while the other host went at full speed. Then the
script against a real redis-server, and the gate's local logic.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.core import Lease
from scrapy_dist.keys import RedisKeys
from scrapy_dist.slots import SLOT_MAX, SPIDER_LIMITS_READ, Limit, Limits, slot_of
from scrapy_dist.testing.crawl import WorkerCrawl, duplicates
from scrapy_dist.testing.politeness import (
    GateBuffer,
    confirm_sent,
    gate,
    outstanding,
    run_script,
    take,
)
from scrapy_dist.testing.refusals import refuse_noreplicas, refuse_oom, refuse_readonly
from scrapy_dist.testing.site import TestSite

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis

    from scrapy_dist.testing.redis_server import RedisServer

PROJECT = Path(__file__).parent / "project"

#: Pages per host, and the seconds a page of the polite host takes to serve (longer
#: than the delay, so the concurrency limit binds too). Host A's 60 pages take about
#: 16 s under its budget, so host B (about 2 s unloaded, CPU-bound) has room to finish
#: before A's last quarter even on a loaded machine (30 pages gave B about 6 s).
A_PAGES, B_PAGES, A_SERVE, B_SERVE = 60, 120, 0.3, 0.02
#: Pages of the one host two workers share, and the seconds each takes to serve (short:
#: the slot's concurrency binds, not the workers' CPU).
FAIR_PAGES, FAIR_SERVE = 600, 0.01


class TwoHostSite:
    """``/p/<i>`` pages on every host name of one port (page 0 links to all others, so
    every worker has work for both hosts at once), with an access log of
    ``(host, path, start, end, User-Agent)``: from when the request was read to when its response
    was ready, within the time its worker held a token (a response's end taken after
    its write, once the worker may have it and given its token to another, showed a
    third page served at once for 0.1 ms: the thread logged late)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, float, float, str]] = []
        self.lock = threading.Lock()
        #: Seconds host A takes to serve page i (``A_SERVE`` unless a test sets it).
        self.a_serve: Callable[[int], float] = lambda i: A_SERVE
        #: Pages of host A (``A_PAGES`` unless a test sets it).
        self.a_pages = A_PAGES
        #: Pages of host A served, by the User-Agent that asked for them.
        self.a_agents: Counter[str] = Counter()
        #: Pages of host B (``B_PAGES`` unless a test sets it).
        self.b_pages = B_PAGES
        #: The robots.txt of each host name that has one (others: 404).
        self.robots: dict[str, str] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                start = time.monotonic()
                host = (self.headers.get("Host") or "").split(":")[0]
                if self.path == "/robots.txt":
                    self._robots(site.robots.get(host))
                    return
                i = int(self.path.rsplit("/", 1)[-1]) if self.path.startswith("/p/") else -1
                a = host == "127.0.0.1"
                pages, serve = (site.a_pages, site.a_serve(i)) if a else (site.b_pages, B_SERVE)
                links = list(range(1, pages)) if i == 0 else []
                body = "".join(f'<a href="/p/{j}">{j}</a>' for j in links)
                data = f"<html><body>{body}</body></html>".encode()
                time.sleep(serve)
                end = time.monotonic()  # (before the client can have the response)
                self.send_response(200 if 0 <= i < pages else 404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with site.lock:
                    agent = self.headers.get("User-Agent") or ""
                    site.log.append((host, self.path, start, end, agent))
                    if a:
                        site.a_agents[agent] += 1

            def _robots(self, text: str | None) -> None:
                data = (text or "").encode()
                self.send_response(200 if text is not None else 404)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, host: str, i: int) -> str:
        return f"http://{host}:{self.port}/p/{i}"

    def entries(self, host: str) -> list[tuple[str, float, float]]:
        with self.lock:
            return sorted((p, s, e) for h, p, s, e, _ in self.log if h == host)

    def first_starts(self, host: str) -> dict[str, float]:
        """When the site read each User-Agent's first request to ``host``."""
        with self.lock:
            starts = sorted((s, agent) for h, _, s, _, agent in self.log if h == host)
        first: dict[str, float] = {}
        for start, agent in starts:
            first.setdefault(agent, start)
        return first

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def max_concurrency(entries: list[tuple[str, float, float]], since: float = -math.inf) -> int:
    """The most pages served at once (from ``since`` on)."""
    events = sorted([(s, 1) for _, s, _ in entries] + [(e, -1) for _, _, e in entries])
    now = top = 0
    for when, step in events:
        now += step
        if when >= since:
            top = max(top, now)
    return top


def mean_gap(entries: list[tuple[str, float, float]]) -> float:
    starts = sorted(s for _, s, _ in entries)
    return (starts[-1] - starts[0]) / (len(starts) - 1)


@pytest.fixture
def two_hosts() -> Iterator[TwoHostSite]:
    site = TwoHostSite()
    yield site
    site.close()


#: The settings of every crawl of these tests: quick to notice a silent worker, ending by
#: themselves soon after the last page.
CRAWL_SETTINGS = {
    "CONCURRENT_REQUESTS": 16,
    "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
    "SCHEDULER_WORKER_TIMEOUT": 2,
    "CLOSE_WHEN_CRAWL_DONE": True,
    "CRAWL_DONE_GRACE": 1,
}


def run_workers(
    server: RedisServer,
    site: TwoHostSite,
    tmp_path: Path,
    settings: dict[str, Any],
    *,
    seeds: list[str],
    workers: int,
) -> str:
    """Crawl ``site`` from ``seeds`` with ``workers`` workers (User-Agents ``worker-0``,
    ``worker-1``...) of :data:`CRAWL_SETTINGS` and ``settings``, to their end; their logs."""
    crawl = WorkerCrawl(
        server,
        site,  # type: ignore[arg-type]
        tmp_path,
        project_dir=PROJECT,
        settings={**CRAWL_SETTINGS, **settings},
    )
    try:
        for n in range(workers):
            crawl.start(1, USER_AGENT=f"worker-{n}")
        crawl.wait_ready()
        for seed in seeds:
            crawl.seed(seed)
        assert crawl.wait(60) == [0] * workers, crawl.logs()
        return crawl.full_logs()
    finally:
        crawl.close()


def crawl_two_hosts(
    server: RedisServer,
    site: TwoHostSite,
    tmp_path: Path,
    *,
    politeness: bool,
    delay: float = 0.2,
    concurrency: int = 2,
    queue: str | None = None,
    **extra: Any,
) -> tuple[list[tuple[str, float, float]], list[tuple[str, float, float]], str]:
    """Crawl both hosts with 4 workers (User-Agents ``worker-0`` to ``worker-3``; host A
    at ``delay`` and ``concurrency``, on ``queue`` if given; ``extra``: more settings);
    returns host A's and B's access log entries and the workers' logs."""
    settings = {
        "SCHEDULER_POLITENESS": politeness,
        **({"SCHEDULER_QUEUE_CLASS": queue} if queue else {}),
        "DOWNLOAD_DELAY": delay,
        "CONCURRENT_REQUESTS_PER_DOMAIN": concurrency,
        "DOWNLOAD_SLOTS": json.dumps({"localhost": {"concurrency": 16, "delay": 0}}),
        **extra,
    }
    seeds = [site.url("127.0.0.1", 0), site.url("localhost", 0)]
    logs = run_workers(server, site, tmp_path, settings, seeds=seeds, workers=4)
    a, b = site.entries("127.0.0.1"), site.entries("localhost")
    # every page once
    assert [p for p, _, _ in a] == sorted(f"/p/{i}" for i in range(A_PAGES)), logs
    assert [p for p, _, _ in b] == sorted(f"/p/{i}" for i in range(B_PAGES)), logs
    return a, b, logs


def duration(entries: list[tuple[str, float, float]]) -> float:
    return max(e for _, _, e in entries) - min(s for _, s, _ in entries)


@pytest.mark.e2e
def test_four_workers_share_one_hosts_budget_and_crawl_another_at_full_speed(
    server: RedisServer, two_hosts: TwoHostSite, tmp_path: Path
) -> None:
    a, b, logs = crawl_two_hosts(server, two_hosts, tmp_path, politeness=True)
    print(
        f"A: max {max_concurrency(a)} at once, mean gap {mean_gap(a):.3f}s, "
        f"{duration(a):.2f}s; B: {duration(b):.2f}s"
    )
    # host A's budget held across all four workers
    assert max_concurrency(a) <= 2
    assert mean_gap(a) >= 0.2
    # host B was not held up behind A: done while A still had many pages to go
    b_done = max(e for _, _, e in b)
    assert sum(1 for _, s, _ in a if s > b_done) >= A_PAGES // 4
    assert logs.count("Cluster-wide politeness on") == 4
    assert "scheduler/politeness/granted" in logs


@pytest.mark.e2e
def test_without_politeness_four_workers_exceed_the_hosts_budget(
    server: RedisServer, two_hosts: TwoHostSite, tmp_path: Path
) -> None:
    a, b, logs = crawl_two_hosts(server, two_hosts, tmp_path, politeness=False)
    print(
        f"A: max {max_concurrency(a)} at once, mean gap {mean_gap(a):.3f}s, "
        f"{duration(a):.2f}s; B: {duration(b):.2f}s"
    )
    assert max_concurrency(a) > 2 or mean_gap(a) < 0.2
    assert "Cluster-wide politeness on" not in logs


SLOT_QUEUE = "scrapy_dist.slot_queue.SlotQueue"


@pytest.mark.e2e
@pytest.mark.parametrize("politeness", [True, False])
def test_with_the_queue_per_slot_the_gate_holds_a_hosts_concurrency_across_workers(
    server: RedisServer, two_hosts: TwoHostSite, tmp_path: Path, politeness: bool
) -> None:
    """The queue per download slot spaces a slot's requests, not its downloads in
    flight: a slot without delay gets its concurrency from each worker's downloader
    (4 workers, 2 each: 8 at once, or more where Scrapy's downloader lets a burst past
    its own limit: 20 measured with Scrapy 2.19), unless the gate holds it for the
    crawl. Beside the queue the gate opens as it does alone, without a warning."""
    a, b, logs = crawl_two_hosts(
        server, two_hosts, tmp_path, politeness=politeness, delay=0, queue=SLOT_QUEUE
    )
    print(f"A: max {max_concurrency(a)} at once, {duration(a):.2f}s; B: {duration(b):.2f}s")
    if politeness:
        assert max_concurrency(a) <= 2
        assert logs.count("Cluster-wide politeness on") == 4
        assert "turn one off" not in logs
        assert "scheduler/politeness/granted" in logs
    else:
        assert max_concurrency(a) > 2
        assert "Cluster-wide politeness on" not in logs


@pytest.mark.e2e
def test_with_concurrent_requests_per_ip_the_gate_holds_an_address_across_workers(
    server: RedisServer, two_hosts: TwoHostSite, tmp_path: Path
) -> None:
    """``127.0.0.1`` and ``localhost`` are one address (Scrapy's resolver gives
    ``localhost`` 127.0.0.1): with ``CONCURRENT_REQUESTS_PER_IP = 2`` and a per-domain
    limit of 16, once every worker has resolved ``localhost`` the site serves at most 2
    pages of both names at once, for the 4 workers together. (Before, the gate limited
    each host name to 16 and each worker's downloader its own 2 per address: 8 at once.)
    Until a worker resolved ``localhost``, its requests count under the host name, as in
    Scrapy, so both names may have 2 each for a moment."""
    a, b, logs = crawl_two_hosts(
        server,
        two_hosts,
        tmp_path,
        politeness=True,
        delay=0,
        concurrency=16,
        CONCURRENT_REQUESTS_PER_IP=2,
        DOWNLOAD_SLOTS="{}",
    )
    both = a + b
    resolved = two_hosts.first_starts("localhost")
    since = max(resolved.values()) + 0.1  # (a page under a host name token ends by then)
    print(
        f"max {max_concurrency(both)} at once, {max_concurrency(both, since)} once every "
        f"worker resolved localhost ({sorted(resolved)}), {duration(both):.2f}s"
    )
    assert max_concurrency(both, since) <= 2
    assert max_concurrency(both) <= 4  # (2 per name at most while some worker had not)
    assert len([e for e in both if e[1] >= since]) > A_PAGES // 2
    assert logs.count("downloads at once per resolved address, for all workers together") == 4
    assert "applied by each worker on its own" not in logs


#: The queue per slot, robots.txt obeyed, 2 downloads at once per address, no delay of
#: its own: what a site's ``Crawl-delay`` does with addresses and host names.
ROBOTS_PER_IP = {
    "SCHEDULER_QUEUE_CLASS": SLOT_QUEUE,
    "ROBOTSTXT_OBEY": True,
    "DOWNLOAD_DELAY": 0,
    "CONCURRENT_REQUESTS_PER_IP": 2,
}


@pytest.mark.e2e
def test_with_the_queue_per_slot_and_per_ip_a_robots_crawl_delay_spaces_the_hosts_requests(
    server: RedisServer, two_hosts: TwoHostSite, tmp_path: Path
) -> None:
    """The queue per slot names a new request's slot by its host (``localhost``); with
    ``CONCURRENT_REQUESTS_PER_IP`` Scrapy's downloader names it by the address
    (``127.0.0.1``). The site's ``Crawl-delay`` is written for the queue's name too, so
    the queue spaces the site's requests for every worker. (Before, it was written under
    the address only, which no queued request was named by: 2 workers crawled the 30
    pages in about 0.3 s.)"""
    two_hosts.b_pages = 30
    two_hosts.robots["localhost"] = "User-agent: *\nCrawl-delay: 0.3\n"
    seeds = [two_hosts.url("localhost", 0)]
    logs = run_workers(server, two_hosts, tmp_path, ROBOTS_PER_IP, seeds=seeds, workers=2)
    pages = two_hosts.entries("localhost")
    assert sorted(p for p, _, _ in pages) == sorted(f"/p/{i}" for i in range(30)), logs
    # the first pages may go before a worker has read robots.txt; the last 20 are spaced
    last = sorted(pages, key=lambda e: e[1])[-20:]
    print(f"mean gap of the last 20 pages {mean_gap(last):.3f}s, all {duration(pages):.2f}s")
    assert mean_gap(last) >= 0.25, logs
    assert "scheduler/slots/crawl_delays" in logs


@pytest.mark.e2e
def test_with_the_queue_per_slot_and_per_ip_a_site_named_by_its_address_keeps_its_crawl_delay(
    server: RedisServer, two_hosts: TwoHostSite, tmp_path: Path
) -> None:
    """``localhost`` (no ``Crawl-delay``) is met first and downloaded in the slot
    ``127.0.0.1``: the name the queue gives ``http://127.0.0.1/``'s requests. That site's
    own ``Crawl-delay`` still spaces them. (Before, the name was taken as known from
    localhost's robots.txt and the site's delay never written: one worker crawled 40 of
    its pages, asking for 1 s, in 0.5 s.)"""
    two_hosts.a_pages, two_hosts.b_pages = 12, 2
    two_hosts.a_serve = lambda i: 0.02
    two_hosts.robots["127.0.0.1"] = "User-agent: *\nCrawl-delay: 0.5\n"
    settings = {**CRAWL_SETTINGS, **ROBOTS_PER_IP}
    crawl = WorkerCrawl(server, two_hosts, tmp_path, project_dir=PROJECT, settings=settings)  # type: ignore[arg-type]
    try:
        crawl.start(1)
        crawl.wait_ready()
        crawl.seed(two_hosts.url("localhost", 0))
        deadline = time.monotonic() + 30
        while len(two_hosts.entries("localhost")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        crawl.seed(two_hosts.url("127.0.0.1", 0))
        assert crawl.wait(60) == [0], crawl.logs()
        logs = crawl.full_logs()
    finally:
        crawl.close()
    pages = two_hosts.entries("127.0.0.1")
    assert sorted(p for p, _, _ in pages) == sorted(f"/p/{i}" for i in range(12)), logs
    # page 0 goes before robots.txt is read, its links once it is: all spaced
    print(f"mean gap {mean_gap(pages):.3f}s, all {duration(pages):.2f}s")
    assert mean_gap(pages) >= 0.4, logs


@pytest.mark.e2e
def test_with_the_queue_per_slot_the_gate_keeps_the_delay_where_the_concurrency_binds(
    server: RedisServer, two_hosts: TwoHostSite, tmp_path: Path
) -> None:
    """The queue spaces host A's requests when it leases them; with one download at once
    and pages served in 0.5 s and 0.2 s in turn, a request leased on time waits behind
    a slow page and would go the moment it ends, 0.2 s after the one before. The gate
    spaces the sends as they reach the downloader: every gap at least the delay.
    (A gate that held only the concurrency beside the queue let about one gap in two
    fall to 0.2 s.)"""
    two_hosts.a_serve = lambda i: 0.5 if i % 2 else 0.2
    delay = 0.3
    a, _, _ = crawl_two_hosts(
        server, two_hosts, tmp_path, politeness=True, delay=delay, concurrency=1, queue=SLOT_QUEUE
    )
    gaps = [t - s for s, t in itertools.pairwise(sorted(s for _, s, _ in a))]
    short = [round(g, 3) for g in gaps if g < 0.9 * delay]
    print(f"A: max {max_concurrency(a)} at once, {len(gaps)} gaps, min {min(gaps):.3f}s, {short}")
    assert max_concurrency(a) <= 1
    # measured where the site read each request: a loaded machine may delay one read
    # and not the next, so a few gaps may look shorter than they were; none by half
    assert min(gaps) >= 0.5 * delay, gaps
    assert len(short) <= len(gaps) // 10, gaps


def one_host_crawl(
    server: RedisServer, site: TwoHostSite, tmp_path: Path, queue: str | None, **settings: Any
) -> WorkerCrawl:
    """Two workers (User-Agents ``worker-0`` and ``worker-1``) of a crawl of host A alone,
    ``FAIR_PAGES`` pages served in ``FAIR_SERVE`` s, the gate holding a concurrency of 2
    without delay, on ``queue`` if given; started and seeded."""
    site.a_pages = FAIR_PAGES
    site.a_serve = lambda i: FAIR_SERVE
    crawl = WorkerCrawl(
        server,
        site,  # type: ignore[arg-type]
        tmp_path,
        project_dir=PROJECT,
        settings={
            "SCHEDULER_POLITENESS": True,
            **({"SCHEDULER_QUEUE_CLASS": queue} if queue else {}),
            "DOWNLOAD_DELAY": 0,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            **CRAWL_SETTINGS,
            **settings,
        },
    )
    try:
        crawl.start(1, USER_AGENT="worker-0")
        crawl.start(1, USER_AGENT="worker-1")
        crawl.wait_ready()
        crawl.seed(site.url("127.0.0.1", 0))
    except BaseException:
        crawl.close()
        raise
    return crawl


@pytest.mark.e2e
@pytest.mark.parametrize("queue", [SLOT_QUEUE, None], ids=["slot_queue", "default_queue"])
def test_two_workers_share_a_one_host_slot_without_delay(
    server: RedisServer, two_hosts: TwoHostSite, tmp_path: Path, queue: str | None
) -> None:
    """Two workers that run the whole crawl share a one-host slot whose concurrency the
    gate holds, with either queue: neither keeps the slot's tokens for itself. (One
    worker crawled 590 of 600 pages, with either queue: the tokens it gave back went
    straight back to it in the same call, so the other always found the slot full.)"""
    crawl = one_host_crawl(server, two_hosts, tmp_path, queue)
    try:
        assert crawl.wait(120) == [0, 0], crawl.logs()
        logs = crawl.full_logs()
    finally:
        crawl.close()
    a = two_hosts.entries("127.0.0.1")
    assert sorted(p for p, _, _ in a) == sorted(f"/p/{i}" for i in range(FAIR_PAGES)), logs
    split = [two_hosts.a_agents[f"worker-{n}"] for n in range(2)]
    print(f"A: {split} pages by worker, max {max_concurrency(a)} at once, {duration(a):.2f}s")
    assert max_concurrency(a) <= 2
    # an even split is half each (measured: 217 to 299 of 600 for the one with fewer); a
    # loaded machine may slow one worker down, never to a fifth
    assert min(split) >= FAIR_PAGES // 5, split


@pytest.mark.e2e
def test_a_worker_killed_holding_its_share_of_a_slot_frees_it_within_the_timeout(
    server: RedisServer, two_hosts: TwoHostSite, tmp_path: Path
) -> None:
    """A worker killed with -9 mid-crawl, holding its share of a one-host slot: its
    tokens expire within ``SCHEDULER_POLITENESS_TIMEOUT``, and from then the survivor
    has the slot's whole concurrency (no mark the killed worker left holds it back
    longer); every page is crawled."""
    timeout = 3.0
    crawl = one_host_crawl(
        server,
        two_hosts,
        tmp_path,
        SLOT_QUEUE,
        SCHEDULER_POLITENESS_TIMEOUT=timeout,
        SCHEDULER_LEASE_TIMEOUT=3,  # (the killed worker's requests come back soon)
    )
    try:
        deadline = time.monotonic() + 60
        while len(two_hosts.entries("127.0.0.1")) < 100:
            assert time.monotonic() < deadline, crawl.logs()
            time.sleep(0.02)
        victim = crawl.workers[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.process.wait()
        killed_at = time.monotonic()
        assert crawl.wait(120) == [-signal.SIGKILL, 0], crawl.logs()
        logs = crawl.full_logs()
    finally:
        crawl.close()
    a = two_hosts.entries("127.0.0.1")
    # (a page in flight when its worker died is crawled again)
    assert {p for p, _, _ in a} == {f"/p/{i}" for i in range(FAIR_PAGES)}, logs
    later = [e for e in a if e[1] > killed_at + timeout + 1.0]
    print(f"after the kill: {len(a) - 100} pages, {len(later)} of them from the timeout on")
    assert len(later) > 50
    assert max_concurrency(later) == 2
    assert max_concurrency(a) <= 2


@pytest.mark.e2e
def test_three_workers_keep_the_delay_between_sends_whatever_the_concurrency(
    server: RedisServer, tmp_path: Path
) -> None:
    """Scrapy's DOWNLOAD_DELAY is between two sends to a slot, whatever
    CONCURRENT_REQUESTS_PER_DOMAIN; across workers, whoever sends. (Three workers at
    concurrency 4 sent bursts: a call granted every free token, with send times spread
    over the workers, and a worker that sent late was followed on time by the next.)"""
    delay = 0.2
    settings = {
        "SCHEDULER_POLITENESS": True,
        "DOWNLOAD_DELAY": delay,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "SCHEDULER_HEARTBEAT_INTERVAL": 0.5,
        "SCHEDULER_WORKER_TIMEOUT": 2,
        "CLOSE_WHEN_CRAWL_DONE": True,
        "CRAWL_DONE_GRACE": 1,
    }
    with TestSite(20, delay=0.1) as site:
        crawl = WorkerCrawl(server, site, tmp_path, project_dir=PROJECT, settings=settings)
        try:
            crawl.start(3)
            crawl.wait_ready()
            crawl.seed()
            assert crawl.wait(60) == [0, 0, 0], crawl.logs()
        finally:
            crawl.close()
        assert not crawl.missing()
        assert duplicates(site.hits()) == 0
        starts = [at for at, _ in site.hit_log()]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    short = [round(g, 3) for g in gaps if g < 0.9 * delay]
    print(f"{len(gaps)} gaps: min {min(gaps):.3f}s, mean {sum(gaps) / len(gaps):.3f}s, {short}")
    # measured where the site read each request: a loaded machine may delay one read
    # and not the next, so a few gaps may look shorter than they were; none by half
    assert min(gaps) >= 0.5 * delay, gaps
    assert len(short) <= len(gaps) // 10, gaps


# -- the script, against a real redis-server ---------------------------------------------


@pytest.fixture
def keys(name: str) -> RedisKeys:
    return RedisKeys(
        crawl=name, requests=f"{name}:requests", dupefilter=f"{name}:df", start_urls=f"{name}:s"
    )


def call(  # noqa: PLR0917 (the script's arguments, for short tests)
    client: redis.Redis,
    keys: RedisKeys,
    prefix: str,
    asks: list[tuple[str, int, int, float]] = [],  # noqa: B006
    releases: list[str] = [],  # noqa: B006
    renewals: list[str] = [],  # noqa: B006
    timeout_ms: int = 60_000,
    confirms: list[tuple[str, float, float]] = [],  # noqa: B006
    holding: list[str] = [],  # noqa: B006
    lookahead_ms: int = 200,
) -> tuple[list[tuple[int, float, float]], list[bytes]]:
    triples, lost, repairs = run_script(
        client,
        keys,
        prefix,
        asks=asks,
        releases=releases,
        waiting=renewals,
        timeout_ms=timeout_ms,
        confirms=confirms,
        holding=holding,
        lookahead_ms=lookahead_ms,
    )
    assert not repairs, repairs
    return triples, lost


def test_grants_up_to_the_concurrency_across_workers(client: redis.Redis, keys: RedisKeys) -> None:
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)])
    assert g[0] == 2
    (g,), _ = call(client, keys, "w2:", [("a.com", 5, 2, 0)])
    assert g[0] == 0  # the other worker holds both
    assert outstanding(client, keys, "a.com") == 2
    # a release frees one for the other worker
    (g,), _ = call(client, keys, "w2:", [("a.com", 5, 2, 0)], releases=["w1:0|a.com"])
    assert g[0] == 1
    # releasing twice (a reply lost and the call sent again) frees nothing twice
    (g,), _ = call(client, keys, "w3:", [("a.com", 5, 2, 0)], releases=["w1:0|a.com"])
    assert g[0] == 0
    assert outstanding(client, keys, "a.com") == 2
    # another slot is not affected
    (g,), _ = call(client, keys, "w3:", [("b.com", 3, 8, 0)])
    assert g[0] == 3


def test_tokens_given_back_go_to_a_worker_refused_a_moment_ago(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """A worker that gives back a slot's tokens in the call that asks for more does not
    get them all straight back while another worker, refused the slot a moment ago,
    holds less than half its concurrency: that one gets its share first. (Each worker
    asks in its own calls: the other found the slot full every time, and one of two
    workers crawled 590 of 600 pages of a host.)"""
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)])
    assert g[0] == 2
    (g,), _ = call(client, keys, "w2:", [("a.com", 5, 2, 0)])
    assert g[0] == 0  # full: w2, holding none, marks the slot
    both = ["w1:0|a.com", "w1:1|a.com"]
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)], releases=both)
    assert g[0] == 1  # its half; the other is kept for w2
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)])
    assert g[0] == 0  # still kept (w1 holds its half: it leaves no mark of its own)
    (g,), _ = call(client, keys, "w2:", [("a.com", 5, 2, 0)])
    assert g[0] == 1
    assert not client.hexists(keys.politeness_refused, "a.com")  # served: the mark goes
    assert outstanding(client, keys, "a.com") == 2
    # each holds its half: a refusal leaves no mark, each gets back what it gives back
    (g,), _ = call(client, keys, "w2:", [("a.com", 5, 2, 0)])
    assert g[0] == 0
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)], releases=["w1:0|a.com"])
    assert g[0] == 1
    assert not client.exists(keys.politeness_refused)


def test_the_first_worker_refused_keeps_its_place(client: redis.Redis, keys: RedisKeys) -> None:
    """With three workers, a later refusal does not take the place of a mark in force
    (each would otherwise keep the slot from the other); once served, the next one
    refused marks the slot."""
    call(client, keys, "w1:", [("a.com", 5, 2, 0)])
    call(client, keys, "w2:", [("a.com", 5, 2, 0)])
    call(client, keys, "w3:", [("a.com", 5, 2, 0)])
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)], releases=["w1:0|a.com"])
    assert g[0] == 0  # kept for w2
    (g,), _ = call(client, keys, "w3:", [("a.com", 5, 2, 0)])
    assert g[0] == 0  # kept for w2, not for w3
    (g,), _ = call(client, keys, "w2:", [("a.com", 5, 2, 0)])
    assert g[0] == 1
    (g,), _ = call(client, keys, "w3:", [("a.com", 5, 2, 0)])
    assert g[0] == 0  # full
    (g,), _ = call(client, keys, "w2:", [("a.com", 5, 2, 0)], releases=["w2:0|a.com"])
    assert g[0] == 0  # w2 gave back its only token: w3 was refused since
    (g,), _ = call(client, keys, "w3:", [("a.com", 5, 2, 0)])
    assert g[0] == 1


def test_a_slot_of_concurrency_one_is_not_marked(client: redis.Redis, keys: RedisKeys) -> None:
    """A worker refused a slot of concurrency 1 leaves no mark: its one token handed from
    worker to worker would idle at each hand-over (2 workers, 300 pages: 25.9 s with
    marks, 21.5 s without), and one download at a time goes at one rate whoever sends."""
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 1, 0)])
    assert g[0] == 1
    (g,), _ = call(client, keys, "w2:", [("a.com", 5, 1, 0)])
    assert g[0] == 0
    assert not client.exists(keys.politeness_refused)
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 1, 0)], releases=["w1:0|a.com"])
    assert g[0] == 1


def test_a_lone_worker_is_never_held_back(client: redis.Redis, keys: RedisKeys) -> None:
    """A worker alone on a slot gets back at once what it gives back (its own refusals
    leave no mark while it holds half the slot's concurrency), and a mark left by a
    worker that went away lasts a moment only."""
    for _ in range(3):
        (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)])
        assert g[0] == 0 or g[0] == 2
    both = ["w1:0|a.com", "w1:1|a.com"]
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)], releases=both)
    assert g[0] == 2
    assert not client.exists(keys.politeness_refused)
    # w2 was refused, then went away: w1 gets half until the mark is a second old
    call(client, keys, "gone:", [("a.com", 5, 2, 0)])
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)], releases=both)
    assert g[0] == 1
    time.sleep(1.1)
    (g,), _ = call(client, keys, "w1:", [("a.com", 5, 2, 0)])
    assert g[0] == 1
    assert not client.exists(keys.politeness_refused)  # (too old: removed when read)


def test_a_slot_with_delay_is_given_one_turn_at_a_time_spaced_from_its_last_send(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """Scrapy's downloader sends one request per slot per delay whatever the
    concurrency: the script grants a slot with delay one turn at a time, the next only
    once the last one's send is confirmed, for a send time a delay after that send."""
    (g,), _ = call(client, keys, "w1:", [("a.com", 3, 3, 200)])
    assert g[:2] == (1, 0)  # one turn, now, however many requests wait
    (g,), _ = call(client, keys, "w2:", [("a.com", 1, 3, 200)])
    assert g[0] == 0  # the first turn is not confirmed sent: nobody gets the next
    # w1 confirms its send, 50 ms after it: the next turn is 200 ms after the send
    call(client, keys, "w1:", confirms=[("w1:0|a.com", 50, 200)])
    (g,), _ = call(client, keys, "w2:", [("a.com", 1, 3, 200)], lookahead_ms=1000)
    assert g[0] == 1
    assert 100 <= g[1] <= 150  # 200 - 50 from the confirmation, less the time since
    assert outstanding(client, keys, "a.com") == 2
    # beyond the lookahead: refused, with when to ask again
    call(client, keys, "w2:", confirms=[("w2:0|a.com", 0, 500)])
    (g,), _ = call(client, keys, "w3:", [("a.com", 1, 3, 200)])
    assert g[0] == 0
    assert 200 <= g[2] <= 300  # 500 from the send, less the lookahead (200)
    # a turn given back unsent frees the slot at once for the next turn
    call(client, keys, "w1:", releases=["w1:0|a.com", "w2:0|a.com"])
    client.delete(keys.politeness_next)
    (g,), _ = call(client, keys, "w3:", [("a.com", 1, 3, 200)])
    assert g[:2] == (1, 0)
    (g,), _ = call(client, keys, "w4:", [("a.com", 1, 3, 200)], releases=["w3:0|a.com"])
    assert g[:2] == (1, 0)  # released unsent: no delay spent


def test_a_paused_slot_is_granted_nothing_until_its_pause_ends(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """A slot paused for every worker (a Retry-After, scrapy_dist/worker/pauses.py) gets
    no token, with or without delay, and the hint says when to ask again; other slots
    are granted as usual, and a pauses key of another type pauses nothing."""
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    client.zadd(keys.slot_pauses, {"a.com": now_ms + 5000, "b.com": now_ms + 5000})
    grants, _ = call(
        client, keys, "w1:", [("a.com", 2, 2, 0), ("b.com", 1, 1, 200), ("c.com", 1, 1, 0)]
    )
    assert [g[0] for g in grants] == [0, 0, 1]
    assert 4000 <= grants[0][2] <= 5000
    assert 4000 <= grants[1][2] <= 5000
    assert client.pttl(keys.slot_pauses) == -1  # the gate leaves the pauses' expiry alone
    client.zadd(keys.slot_pauses, {"a.com": now_ms - 1})  # ended
    (g,), _ = call(client, keys, "w1:", [("a.com", 2, 2, 0)])
    assert g[0] == 2
    client.delete(keys.slot_pauses)
    client.set(keys.slot_pauses, "junk")
    (g,), _ = call(client, keys, "w2:", [("b.com", 1, 1, 200)])
    assert g[0] == 1


def test_a_dead_workers_tokens_expire(client: redis.Redis, keys: RedisKeys) -> None:
    # a 1 s timeout: the second call must come before it, even on a loaded machine
    (g,), _ = call(client, keys, "dead:", [("a.com", 2, 2, 0)], timeout_ms=1000)
    assert g[0] == 2
    (g,), _ = call(client, keys, "live:", [("a.com", 2, 2, 0)])
    assert g[0] == 0
    assert client.hexists(keys.politeness_refused, "a.com")  # live: marks the slot
    time.sleep(1.1)
    (g,), _ = call(client, keys, "live:", [("a.com", 2, 2, 0)])
    assert g[0] == 2
    assert not client.exists(keys.politeness_refused)
    assert outstanding(client, keys, "a.com") == 2
    assert client.zcard(keys.politeness_tokens) == 2


def test_renewal_keeps_tokens_and_reports_lost_ones(client: redis.Redis, keys: RedisKeys) -> None:
    # a 1 s timeout and renewals 0.6 s apart: each comes before the deadline it renews
    # with 0.4 s to spare for a loaded machine (sleeps only ever last longer)
    call(client, keys, "w:", [("a.com", 1, 2, 0)], timeout_ms=1000)
    time.sleep(0.6)
    _, lost = call(client, keys, "w:", renewals=["w:0|a.com", "w:gone|a.com"], timeout_ms=1000)
    assert lost == [b"w:gone|a.com"]
    time.sleep(0.6)  # past the first deadline, within the renewed one
    _, lost = call(client, keys, "w:", renewals=["w:0|a.com"], timeout_ms=1000)
    assert lost == []
    time.sleep(1.2)
    _, lost = call(client, keys, "w:", renewals=["w:0|a.com"], timeout_ms=1000)
    assert lost == [b"w:0|a.com"]
    assert outstanding(client, keys, "a.com") == 0


def test_keys_expire_when_idle_and_old_send_times_are_pruned(
    client: redis.Redis, keys: RedisKeys
) -> None:
    call(client, keys, "w:", [("a.com", 1, 1, 50)], timeout_ms=1000)
    call(client, keys, "w:", confirms=[("w:0|a.com", 0, 50)], timeout_ms=1000)
    assert 0 < client.pttl(keys.politeness_tokens) <= 3_600_000
    assert client.zscore(keys.politeness_next, "a.com") is not None
    time.sleep(1.1)  # a send time is kept a timeout after it passed
    call(client, keys, "w:", releases=["w:0|a.com"], timeout_ms=1000)
    assert client.zscore(keys.politeness_next, "a.com") is None


def test_hostile_slot_names_stay_fields(client: redis.Redis, keys: RedisKeys) -> None:
    for slot in ["a|b|c", "", "{other}:key", "x" * SLOT_MAX, "\x00\n"]:
        (g,), _ = call(client, keys, "w:", [(slot, 1, 1, 0)])
        assert g[0] == 1
        _, _ = call(client, keys, "w:", releases=[f"w:0|{slot}"])
        assert outstanding(client, keys, slot) == 0, slot
    made = {k.decode() for k in client.scan_iter(f"{keys.crawl}*")}
    assert made <= {keys.politeness_tokens, keys.politeness_busy, keys.politeness_next}
    long = Request("http://h/", meta={"download_slot": "y" * 10_000})
    assert slot_of(long).startswith("sha1:")
    assert len(slot_of(long)) < 50
    assert slot_of(Request("http://Example.COM:81/x")) == "example.com"
    assert slot_of(Request("http://e.com/", meta={"download_slot": 7})) == "7"


def test_limits_follow_scrapys_settings() -> None:
    from scrapy.settings import Settings

    from scrapy_dist.settings import Config

    config = Config(
        Settings(
            {
                "SCHEDULER_POLITENESS": True,
                "DOWNLOAD_DELAY": 1.5,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 3,
                "DOWNLOAD_SLOTS": {"fast": {"delay": 0, "concurrency": 20}, "slow": {"delay": 4}},
            }
        )
    ).politeness
    limits = Limits.build(config)
    assert limits.of("other") == Limit(3, 1.5, 0.5)
    assert limits.of("fast") == Limit(20, 0.0, 0.5)
    assert limits.of("slow") == Limit(3, 4.0, 0.5)

    class Spider:
        download_delay = 0.25
        max_concurrent_requests = 1

    # (read from the spider before Scrapy 2.18; from 2.18, the crawler made them settings)
    with_spider = Limit(1, 0.25, 0.5) if SPIDER_LIMITS_READ else Limit(3, 1.5, 0.5)
    assert Limits.build(config, Spider()).of("other") == with_spider
    limits.crawl_delays["other"] = 10.0
    assert limits.of("other").delay == 10.0
    # jitter only ever lengthens the gap: the mean never drops below the delay
    assert all(1502 <= Limit(1, 1.5, 0.5).spacing_ms() <= 2252 for _ in range(200))
    assert Limit(1, 0.0, 0.5).spacing_ms() == 0


#: Crawls one page with each spider below in plain Scrapy (its own scheduler), and prints
#: per spider the concurrency and delay of the downloader slot the page went through,
#: beside those :meth:`Limits.build` gives the slot from the crawler's settings.
SLOT_LIMITS_SCRIPT = """
import json, sys
import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy_dist.settings import Config
from scrapy_dist.slots import Limits

URL = sys.argv[1]
QUIET = {"LOG_ENABLED": False, "TELNETCONSOLE_ENABLED": False, "ROBOTSTXT_OBEY": False,
         "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue"}

class Base(scrapy.Spider):
    async def start(self):
        yield scrapy.Request(URL)

    def parse(self, response):
        slot_name = response.meta["download_slot"]
        slot = self.crawler.engine.downloader.slots[slot_name]
        limit = Limits.build(Config(self.crawler.settings).politeness, self).of(slot_name)
        print(json.dumps({"spider": self.name, "scrapy": [slot.concurrency, slot.delay],
                          "ours": [limit.concurrency, limit.delay]}), flush=True)

class PerIp(Base):
    name = "per_ip"
    max_concurrent_requests = 7
    custom_settings = {**QUIET, "CONCURRENT_REQUESTS_PER_IP": 2}

class Attributes(Base):
    name = "attributes"
    max_concurrent_requests = 3
    download_delay = 0.01
    custom_settings = {**QUIET, "DOWNLOAD_DELAY": 0.5, "CONCURRENT_REQUESTS_PER_DOMAIN": 5}

class Settings(Base):
    name = "settings"
    custom_settings = {**QUIET, "DOWNLOAD_DELAY": 0.02, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}

process = CrawlerProcess(QUIET)
for spider in (PerIp, Attributes, Settings):
    process.crawl(spider)
process.start()
"""


def test_each_slots_limits_are_those_of_scrapys_own_downloader() -> None:
    """Scrapy is the reference: the concurrency and delay :meth:`Limits.build` gives a
    slot are those of the slot Scrapy's downloader made for the same page, with the
    spider's ``max_concurrent_requests`` and ``download_delay`` (read by the downloader
    over every setting before Scrapy 2.18, turned into settings from 2.18, where the
    settings of the spider's ``custom_settings`` win) and ``CONCURRENT_REQUESTS_PER_IP``."""
    import subprocess
    import sys

    with TestSite(1) as site:
        done = subprocess.run(
            [sys.executable, "-c", SLOT_LIMITS_SCRIPT, site.page_url(0)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    found = {r["spider"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert sorted(found) == ["attributes", "per_ip", "settings"], done.stderr[-3000:]
    for spider, seen in found.items():
        assert seen["ours"] == seen["scrapy"], (spider, seen)


def test_with_concurrent_requests_per_ip_a_slot_is_the_hosts_address_once_resolved() -> None:
    """As Scrapy's downloader names it: ``download_slot`` meta first, else the host's
    address once this process resolved it (Scrapy's DNS cache), else the host name."""
    from scrapy.resolver import dnscache
    from scrapy.settings import Settings

    from scrapy_dist.politeness import slot_naming
    from scrapy_dist.settings import Config
    from scrapy_dist.worker import engine as _engine

    addresses = {"a.test": "192.0.2.7"}
    assert slot_of(Request("http://A.test:81/x"), addresses.get) == "192.0.2.7"
    assert slot_of(Request("http://b.test/x"), addresses.get) == "b.test"
    assert slot_of(Request("http://a.test/", meta={"download_slot": "mine"}), addresses.get) == (
        "mine"
    )
    assert slot_of(Request("http://a.test/x")) == "a.test"
    # the gate's naming reads Scrapy's DNS cache with the setting, never without it
    off = Config(Settings({"SCHEDULER_POLITENESS": True})).politeness
    on = Config(Settings({"SCHEDULER_POLITENESS": True, "CONCURRENT_REQUESTS_PER_IP": 2}))
    named = slot_naming(on.politeness)
    assert named(Request("http://resolved.test/")) == "resolved.test"
    dnscache["resolved.test"] = "192.0.2.8"
    dnscache["listed.test"] = ["an address list"]  # (CachingHostnameResolver's entries)
    try:
        assert named(Request("http://resolved.test/")) == "192.0.2.8"
        assert slot_naming(off)(Request("http://resolved.test/")) == "resolved.test"
        assert _engine.resolved_address("listed.test") is None
        assert named(Request("http://listed.test/")) == "listed.test"
    finally:
        dnscache.pop("resolved.test", None)
        dnscache.pop("listed.test", None)


def test_with_concurrent_requests_per_ip_every_slot_has_that_concurrency() -> None:
    """As Scrapy's downloader: ``CONCURRENT_REQUESTS_PER_IP`` over the per-domain limit
    (and over the spider's ``max_concurrent_requests`` from Scrapy 2.18, which makes it
    the per-domain setting; before, the downloader let the attribute win), a
    ``DOWNLOAD_SLOTS`` entry keyed by the address over both; the delay per address slot
    as per host."""
    from scrapy.settings import Settings

    from scrapy_dist.settings import Config

    config = Config(
        Settings(
            {
                "SCHEDULER_POLITENESS": True,
                "DOWNLOAD_DELAY": 0.5,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
                "CONCURRENT_REQUESTS_PER_IP": 2,
                "DOWNLOAD_SLOTS": {"192.0.2.7": {"concurrency": 5}},
            }
        )
    ).politeness

    class Spider:
        max_concurrent_requests = 7

    limits = Limits.build(config)
    assert limits.of("192.0.2.8") == Limit(2, 0.5, 0.5)
    assert limits.of("a.test") == Limit(2, 0.5, 0.5)  # (not resolved yet)
    assert limits.of("192.0.2.7") == Limit(5, 0.5, 0.5)
    limits = Limits.build(config, Spider())
    assert limits.of("192.0.2.8") == Limit(7 if SPIDER_LIMITS_READ else 2, 0.5, 0.5)
    assert limits.of("192.0.2.7") == Limit(5, 0.5, 0.5)


def test_a_token_goes_back_under_the_slot_it_was_granted_for_once_the_host_resolves(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """A host's requests count under its name until the worker resolves it, then under
    its address: the tokens granted for the name go back under the name (the one in
    flight when its download ends, the one not used at once), and the buffered requests
    are asked for under the address."""
    from functools import partial

    buffer = GateBuffer(["http://a.test/1", "http://a.test/2", "http://a.test/3"])
    politeness = gate(client, keys, buffer, Limits(Limit(2, 0.0)))
    addresses: dict[str, str] = {}
    politeness.slot_of = partial(slot_of, address_of=addresses.get)
    first = take(politeness)
    assert first is not None
    assert politeness.out[first].slot == "a.test"
    assert outstanding(client, keys, "a.test") == 2
    addresses["a.test"] = "192.0.2.7"  # its download resolved the host
    time.sleep(0.02)
    second = take(politeness)  # (not the name's token left: it asks for the address's)
    assert second is not None
    assert politeness.out[second].slot == "192.0.2.7"
    assert outstanding(client, keys, "a.test") == 1  # (the unused one went back)
    assert outstanding(client, keys, "192.0.2.7") == 2
    token = politeness.out[first]
    politeness.finished(first)
    politeness.tick()  # (nothing of the name waits: its token goes back within 0.5 s)
    assert politeness.releases == [token.member]
    assert token.member.endswith("|a.test")
    time.sleep(0.6)
    politeness.tick()
    assert outstanding(client, keys, "a.test") == 0
    assert outstanding(client, keys, "192.0.2.7") == 2
    politeness.finished(second)
    assert take(politeness) is buffer.out[-1]  # the third, with the address's token


def test_the_gate_refuses_to_start_where_scrapy_names_no_slot_by_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The address is read from Scrapy's DNS cache, which is no API: a Scrapy whose
    downloader no longer names a slot by it, or without it, refuses to start rather than
    limit other slots than Scrapy's."""
    import scrapy.resolver
    from scrapy.core.downloader import Downloader

    from scrapy_dist.worker import engine as _engine

    downloader = Downloader.__new__(Downloader)  # (get_slot_key reads no more)
    downloader.ip_concurrency = 2
    crawler: Any = SimpleNamespace(engine=SimpleNamespace(downloader=downloader))
    _engine.check_ip_slots(crawler)
    assert "scrapy-dist-probe.invalid" not in scrapy.resolver.dnscache
    downloader.ip_concurrency = 0  # (a downloader that names slots by host name only)
    with pytest.raises(ConfigurationError, match="CONCURRENT_REQUESTS_PER_IP"):
        _engine.check_ip_slots(crawler)
    assert "scrapy-dist-probe.invalid" not in scrapy.resolver.dnscache
    downloader.ip_concurrency = 2
    monkeypatch.delattr(scrapy.resolver, "dnscache")
    with pytest.raises(ConfigurationError, match="dnscache"):
        _engine.check_ip_slots(crawler)


def test_bad_politeness_settings_are_refused() -> None:
    from scrapy.settings import Settings

    from scrapy_dist.exceptions import ConfigurationError
    from scrapy_dist.settings import Config

    for bad in (
        {"CONCURRENT_REQUESTS_PER_DOMAIN": 0},
        {"DOWNLOAD_DELAY": -1},
        {"SCHEDULER_POLITENESS_TIMEOUT": 0},
        {"DOWNLOAD_SLOTS": {"a": {"concurrency": "x"}}},
        {"DOWNLOAD_SLOTS": {"a": 3}},
    ):
        with pytest.raises(ConfigurationError):
            _ = Config(Settings({"SCHEDULER_POLITENESS": True, **bad})).politeness
    # off: Scrapy's own settings are Scrapy's business
    assert not Config(Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 0})).politeness.enabled


# -- the gate (Politeness) with a stand-in buffer, against a real redis-server ------------


def test_a_blocked_slot_does_not_hold_up_another(client: redis.Redis, keys: RedisKeys) -> None:
    limits = Limits(Limit(1, 0.3), {"b.com": Limit(8, 0.0)})
    buffer = GateBuffer(["http://a.com/1", "http://a.com/2", "http://a.com/3", "http://b.com/1"])
    politeness = gate(client, keys, buffer, limits)
    first = take(politeness)  # asks for both slots at once
    assert first is not None
    assert first.url == "http://a.com/1"
    second = take(politeness)
    assert second is not None
    assert second.url == "http://b.com/1"  # a.com waits, b.com does not
    assert take(politeness) is None
    assert [r.url for _, r in buffer.buffer] == ["http://a.com/2", "http://a.com/3"]
    confirm_sent(politeness, first)
    # the buffer holds only a slot Redis refuses: more is leased, other slots go through
    time.sleep(0.06)
    politeness.tick()  # confirms the send; a.com is not asked for: its download fills it
    assert not politeness.confirms
    assert "a.com" in politeness._full()
    assert politeness.stats.get_value("scheduler/politeness/asks_skipped") == 1
    buffer.more = ["http://c.com/1", "http://b.com/2"]
    time.sleep(0.02)  # on-demand calls are at most 4 per flush interval
    third = take(politeness)  # a slot never asked for is asked for at once
    assert third is not None
    assert third.url == "http://c.com/1"
    fourth = take(politeness)  # the same call asked for b.com's second token
    assert fourth is not None
    assert fourth.url == "http://b.com/2"
    # a.com's next turn: once the first download is released, 0.3 s after its send
    politeness.finished(first)
    time.sleep(0.3)
    assert take(politeness) is None  # the engine asks: a.com waits for a turn
    politeness.tick()  # releases and asks on the timer
    assert not politeness.releases
    fifth = take(politeness)
    assert fifth is not None
    assert fifth.url == "http://a.com/2"


# (Not OOM: the script's first write frees memory, and Redis then lets a script finish
# whatever it writes, so OOM never refuses it; the gate goes on under OOM.)
@pytest.mark.parametrize("refuse", [refuse_noreplicas, refuse_readonly])
def test_a_refusing_redis_holds_requests_and_keeps_releases(
    server: RedisServer,
    name: str,
    caplog: pytest.LogCaptureFixture,
    refuse: Callable[[redis.Redis], Callable[[], object]],
) -> None:
    client = server.client()
    keys = RedisKeys(crawl=name, requests="r", dupefilter="d", start_urls="s")
    buffer = GateBuffer(["http://a.com/1", "http://a.com/2"])
    politeness = gate(client, keys, buffer, Limits(Limit(1, 0.0)))
    first = take(politeness)
    assert first is not None
    politeness.finished(first)
    politeness.releases += [t.member for t in politeness.idle.pop("a.com")]  # as after REUSE_MAX
    lift = refuse(client)
    try:
        for _ in range(3):
            time.sleep(0.015)
            politeness._backoff_until = 0  # no waiting in a test
            politeness.tick()
            assert take(politeness) is None
        assert len(buffer.buffer) == 1  # held, not lost
        assert politeness.releases  # still to be sent
    finally:
        lift()
    assert caplog.text.count("Redis did not grant download tokens") == 1
    politeness._backoff_until = 0
    assert politeness.sync()
    assert not politeness.releases
    assert "grants download tokens again" in caplog.text
    second = take(politeness)
    assert second is not None
    assert second.url == "http://a.com/2"
    assert outstanding(client, keys, "a.com") == 1
    client.close()


def test_the_gate_goes_on_under_oom(server: RedisServer, name: str) -> None:
    client = server.client()
    keys = RedisKeys(crawl=name, requests="r", dupefilter="d", start_urls="s")
    buffer = GateBuffer(["http://a.com/1"])
    politeness = gate(client, keys, buffer, Limits(Limit(1, 0.0)))
    lift = refuse_oom(client)
    try:
        assert take(politeness) is not None
    finally:
        lift()
    client.close()


def test_robots_crawl_delay_becomes_the_slots_delay(client: redis.Redis, keys: RedisKeys) -> None:
    from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
    from scrapy.robotstxt import ProtegoRobotParser
    from scrapy.utils.test import get_crawler

    from scrapy_dist.worker import engine as _engine

    crawler = get_crawler(settings_dict={"ROBOTSTXT_OBEY": True, "USER_AGENT": "bot"})
    mw = RobotsTxtMiddleware(crawler)
    body = b"User-agent: *\nCrawl-delay: 0.4\n"
    mw._parsers["a.com"] = ProtegoRobotParser(body, None)
    fake = SimpleNamespace(
        engine=SimpleNamespace(
            downloader=SimpleNamespace(middleware=SimpleNamespace(middlewares=[mw]))
        ),
        settings=crawler.settings,
    )
    _engine.check_robots(fake)  # type: ignore[arg-type]
    assert _engine.robots_crawl_delay(fake, Request("http://a.com/x")) == 0.4  # type: ignore[arg-type]
    assert _engine.robots_crawl_delay(fake, Request("http://b.com/x")) is None  # type: ignore[arg-type]
    buffer = GateBuffer(["http://a.com/1", "http://a.com/2"])
    politeness = gate(client, keys, buffer, Limits(Limit(2, 0.0)))
    politeness.crawl_delay = lambda request: _engine.robots_crawl_delay(fake, request)  # type: ignore[arg-type]
    first = take(politeness)
    assert first is not None
    assert politeness.limits.of("a.com").delay == 0.4
    confirm_sent(politeness, first)
    time.sleep(0.06)
    assert take(politeness) is None
    politeness.tick()  # confirmed: its next turn is 0.4 s after the first send
    assert take(politeness) is None
    time.sleep(0.5)  # (a turn may be granted up to the lookahead before its send time)
    politeness.tick()
    assert take(politeness) is not None
    # a Scrapy that moved the parsers: refuse to start rather than ignore Crawl-delay
    del mw._parsers
    with pytest.raises(ConfigurationError):
        _engine.check_robots(fake)  # type: ignore[arg-type]


def test_tokens_of_requests_handed_back_are_released(client: redis.Redis, keys: RedisKeys) -> None:
    """A pause hands the buffer back (scrapy_dist.control): the tokens granted for those
    requests go back too, rather than being renewed while this worker holds nothing of
    their slot (the host would stay blocked for the others)."""
    buffer = GateBuffer(["http://a.com/1", "http://a.com/2", "http://a.com/3"])
    politeness = gate(client, keys, buffer, Limits(Limit(3, 0.0)))
    first = take(politeness)
    assert first is not None
    assert len(politeness.pending["a.com"]) == 2  # granted, not used yet
    buffer.buffer.clear()  # the crawl was paused: the buffered leases went back
    politeness._renew_at = 0.0  # a renewal is due
    politeness.tick()
    assert not politeness.pending
    assert outstanding(client, keys, "a.com") == 1  # only the one sent
    other = GateBuffer(["http://a.com/2"])
    assert take(gate(client, keys, other, Limits(Limit(3, 0.0)))) is not None
    assert outstanding(client, keys, "a.com") == 2


def test_refills_that_bring_back_only_waiting_slots_come_less_often(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """A worker whose buffered requests all wait hands back those beyond
    ``KEEP_WAITING`` and leases more; when the queue gives back only the same slots'
    requests (one host: the ones just handed back), the next refill waits twice as
    long, up to ``REFILL_WAIT_MAX``; a refill that brings another slot starts over.
    (Before, two workers on one host of concurrency 2 handed back 4,284 leases for
    600 pages, one refill every half flush interval.)"""
    from scrapy_dist.politeness import KEEP_WAITING, REFILL_WAIT_MAX

    limits = Limits(Limit(1, 0.0))
    holder = gate(client, keys, GateBuffer(["http://a.test/x"]), limits)
    assert take(holder) is not None  # another worker holds the slot's one token
    buffer = GateBuffer([f"http://a.test/{i}" for i in range(6)])
    politeness = gate(client, keys, buffer, limits)
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        assert take(politeness) is None
        time.sleep(0.005)
    # every half flush interval (0.025 s) they were 40; waits of 0.025, 0.05, 0.1, 0.2,
    # 0.4 (then 0.8) give at most 7
    assert 1 <= buffer.refills <= 7, buffer.refills
    assert politeness.stats.get_value("scheduler/politeness/refills_of_waiting") == buffer.refills
    assert len(buffer.buffer) >= KEEP_WAITING
    assert politeness._refill_wait <= REFILL_WAIT_MAX
    # another host's request comes with the next refill: the wait starts over
    buffer.more.append("http://b.test/1")
    politeness._refilled_at = 0.0
    picked = take(politeness)
    assert picked is not None
    assert picked.url == "http://b.test/1"
    assert politeness._refill_wait == 0.0


def test_refills_do_not_wait_longer_for_a_while_after_a_slot_left_the_buffer(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """A worker whose last buffered request of a slot went out keeps refilling every
    half flush interval for ``DRAINED_FOR`` seconds, however few slots the refills
    bring: the queue may hold more of that slot, behind the waiting slots' requests
    handed back. (Three workers, a host of delay 0.5 s and another without delay: the
    delayed host lost turns, gaps of 0.8 to 3.3 s between its pages, its 20 pages in
    10.0 to 13.7 s instead of 9.7, while every worker waited up to a second.)"""
    from scrapy_dist.politeness import DRAINED_FOR

    limits = Limits(Limit(1, 0.0))
    holder = gate(client, keys, GateBuffer(["http://b.test/x"]), limits)
    assert take(holder) is not None  # another worker holds b.test's one token
    buffer = GateBuffer(["http://a.test/1"] + [f"http://b.test/{i}" for i in range(6)])
    politeness = gate(client, keys, buffer, limits)
    first = take(politeness)
    assert first is not None
    assert first.url == "http://a.test/1"  # a.test's last buffered request went out
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        assert take(politeness) is None  # b.test waits: refills bring only b.test
        assert politeness._refill_wait <= politeness.flush_interval / 2
        time.sleep(0.005)
    # every half flush interval (0.025 s): about 20; waiting longer, at most 5
    assert buffer.refills >= 8, buffer.refills
    # past DRAINED_FOR the waits grow again
    politeness._drained_at -= DRAINED_FOR
    refills = buffer.refills
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        assert take(politeness) is None
        time.sleep(0.005)
    assert buffer.refills - refills <= 5, buffer.refills - refills
    assert politeness._refill_wait > politeness.flush_interval / 2


def test_a_slot_this_worker_fills_with_its_own_downloads_is_not_asked_for(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """Redis would refuse it: no ask (before, about 100 such asks in a crawl of one
    host), and the slot counts as blocked, so the worker leases other slots' requests."""
    buffer = GateBuffer([f"http://a.test/{i}" for i in range(4)])
    politeness = gate(client, keys, buffer, Limits(Limit(2, 0.0)))
    assert take(politeness) is not None
    assert take(politeness) is not None  # both tokens in this worker's downloads
    assert outstanding(client, keys, "a.test") == 2
    politeness._refilled_at = 0.0
    buffer.more.append("http://b.test/1")
    time.sleep(0.02)  # (a quarter flush interval since the last call: b.test asked at once)
    picked = take(politeness)  # blocked: leases more, and b.test gets its token
    assert picked is not None
    assert picked.url == "http://b.test/1"
    stats = politeness.stats
    assert stats.get_value("scheduler/politeness/refused") is None
    politeness.starved = True
    politeness.sync()  # a.test's two waiting requests: nothing asked
    assert stats.get_value("scheduler/politeness/asks_skipped") == 2
    assert stats.get_value("scheduler/politeness/refused") is None
    politeness.finished(buffer.out[0])  # one download ends: its token is kept for the next
    again = take(politeness)
    assert again is not None
    assert again.url.startswith("http://a.test/")


def test_bad_download_slot_jitter_is_refused() -> None:
    from scrapy.settings import Settings

    from scrapy_dist.settings import Config

    for jitter in ("x", -1, None, float("nan")):
        with pytest.raises(ConfigurationError):
            _ = Config(
                Settings(
                    {"SCHEDULER_POLITENESS": True, "DOWNLOAD_SLOTS": {"a": {"jitter": jitter}}}
                )
            ).politeness


def test_download_slots_are_scrapys_business_with_politeness_off() -> None:
    """Off by default, nothing changes for existing crawls: their DOWNLOAD_SLOTS are not
    checked against politeness's rules."""
    from scrapy.settings import Settings

    from scrapy_dist.settings import Config

    for slots in ({"a": {"concurrency": 0}}, {"a": {"jitter": -1}}, {"a": {"delay": "x"}}):
        assert not Config(Settings({"DOWNLOAD_SLOTS": slots})).politeness.enabled


def test_a_turn_the_engine_does_not_take_in_time_goes_back(
    client: redis.Redis, keys: RedisKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other workers wait for a slot's turn until its holder sends or gives it back:
    one the engine does not take within TURN_GRACE past its send time goes back."""
    from scrapy_dist import politeness as module

    monkeypatch.setattr(module, "TURN_GRACE", 0.05)
    buffer = GateBuffer(["http://a.com/1"])
    politeness = gate(client, keys, buffer, Limits(Limit(2, 0.3)))
    politeness.starved = True
    assert politeness.sync()  # granted on the timer; the engine does not come
    (turn,) = politeness.pending["a.com"]
    assert outstanding(client, keys, "a.com") == 1
    time.sleep(0.1)
    assert take(politeness) is None  # too late: given back, not sent
    assert politeness.releases == [turn.member]
    politeness.starved = False  # (the engine would ask again: this worker's next turn)
    politeness.tick()
    assert outstanding(client, keys, "a.com") == 0
    other = GateBuffer(["http://a.com/2"])
    assert take(gate(client, keys, other, Limits(Limit(2, 0.3)))) is not None  # at once


def test_a_slot_name_redis_cannot_encode_holds_up_nothing(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """A download_slot with a lone surrogate (pickle serializer, a slot built from
    decoded JSON) is named by its SHA-1: the call that asks for it must not fail for
    every other slot."""
    buffer = GateBuffer(["http://b.com/1"])
    buffer.buffer.appendleft(
        (Lease("s", 1, b""), Request("http://a.com/", meta={"download_slot": "x\ud800"}))
    )
    politeness = gate(client, keys, buffer, Limits(Limit(1, 0.0)))
    assert slot_of(buffer.buffer[0][1]).startswith("sha1:")
    first, second = take(politeness), take(politeness)
    assert first is not None
    assert second is not None


def test_a_lost_reply_does_not_leak_a_slots_concurrency(
    client: redis.Redis, keys: RedisKeys
) -> None:
    """The script ran but its reply was lost (a socket timeout): the next call names its
    tokens anew, so the lost grants expire on their own rather than being overwritten
    while the slot's count keeps them (the slot would lose that concurrency for good)."""
    from redis.exceptions import TimeoutError as RedisTimeoutError

    buffer = GateBuffer(["http://a.com/1"])
    politeness = gate(client, keys, buffer, Limits(Limit(2, 0.0)))
    scripts = politeness._scripts
    real = scripts.politeness

    def lost(**kwargs: Any) -> Any:
        call = real(**kwargs)

        class Lost:
            def run(self) -> Any:
                call.run()
                raise RedisTimeoutError("reply lost")

        return Lost()

    scripts.politeness = lost  # type: ignore[method-assign]
    assert take(politeness) is None  # granted in Redis, the reply lost
    scripts.politeness = real  # type: ignore[method-assign]
    politeness._backoff_until = 0.0
    politeness.starved = True
    politeness.tick()
    assert outstanding(client, keys, "a.com") == client.zcard(keys.politeness_tokens) == 2
