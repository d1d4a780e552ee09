"""Distributed crawl demo: several ``scrapy crawl pages`` workers share one Redis frontier.

Starts a throwaway redis-server and a local test site, starts the workers, pushes the
site's first page as the seed once they are waiting, shows progress once a second, and
when the workers have exited by themselves (``CLOSE_WHEN_CRAWL_DONE``: the crawl as a
whole is finished) checks that every page was fetched exactly once. Everything it
started is stopped on exit.

Usage: ``python example/demo.py [--workers 2] [--pages 3000] [--timeout 300]``.
Exit status: 0 if every page was fetched exactly once, no request is left in Redis and
every worker exited cleanly; 1 otherwise; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from scrapy.settings import Settings

from scrapy_dist.testing import (
    RedisServer,
    TestSite,
    alive,
    final_stats,
    start_workers,
    stop_workers,
    wait_ready,
)
from scrapy_dist.testing.queues import queued_count

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

    import redis

    from scrapy_dist.testing import Worker

EXAMPLE_DIR = Path(__file__).resolve().parent
SPIDER = "pages"
SEEDS_KEY = f"{SPIDER}:start_urls"
REQUESTS_KEY = f"{SPIDER}:requests"


def queued_requests(client: redis.Redis, key: str = REQUESTS_KEY) -> int:
    """Number of requests waiting in ``key`` (the priority queue's levels, or a list)."""
    return queued_count(client, key)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Distributed crawl of a local test site by several scrapy_dist workers."
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--pages", type=int, default=3000, help="pages of the site (default 3000)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="give up after this many seconds (300)"
    )
    parser.add_argument(
        "--delay", type=float, default=0.0, help="seconds the site waits before each page (0)"
    )
    parser.add_argument(
        "--max-idle",
        type=float,
        default=None,
        help="MAX_IDLE_TIME_BEFORE_CLOSE for the workers (default: the project's, 5)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or args.pages < 1 or args.timeout <= 0:
        parser.error("--workers, --pages and --timeout must be positive")
    return args


def on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    """Turn SIGTERM into an exception so the ``finally`` blocks stop everything."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo.

    Returns:
        The exit status (see the module docstring).
    """
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.monotonic()
    deadline = started + args.timeout
    log_dir = Path(tempfile.mkdtemp(prefix="scrapy-dist-demo-"))
    server = RedisServer()
    site = TestSite(args.pages, delay=args.delay)
    workers: list[Worker] = []
    try:
        server.start()
        site.start()
        print(f"redis    {server.url} (pid {server.pid}, data in {server.directory})")
        print(f"site     {site.url}/page/0 .. /page/{args.pages - 1}")
        print(f"logs     {log_dir}")
        settings: dict[str, object] = {
            "REDIS_URL": server.url,
            # the crawl's stats shared in Redis: its rate in `scrapy-dist status`
            "STATS_CLASS": "scrapy_dist.stats.RedisStatsCollector",
        }
        if args.max_idle is not None:
            settings["MAX_IDLE_TIME_BEFORE_CLOSE"] = args.max_idle
        workers = start_workers(
            args.workers, project_dir=EXAMPLE_DIR, spider=SPIDER, log_dir=log_dir, settings=settings
        )
        print(f"workers  {args.workers} x scrapy crawl {SPIDER} (pids {_pids(workers)})")
        with server.client() as client:
            # Idle workers look for seeds every SCHEDULER_IDLE_POLL seconds (0.5 s at
            # first), so the crawl starts within about a second of the push.
            wait_ready(workers, timeout=max(1.0, deadline - time.monotonic()))
            client.lpush(SEEDS_KEY, site.page_url(0))
            seeded = time.time()
            print(f"seed     LPUSH {SEEDS_KEY} {site.page_url(0)}")
            timed_out = _watch(workers, site, client, seeded, deadline)
            if timed_out:
                print(f"timeout  after {args.timeout:g} s: killing the workers")
                stop_workers(workers, timeout=2.0)
            left = queued_requests(client)
            leftover_keys = sorted(key.decode() for key in client.scan_iter(f"{SPIDER}:*"))
        ok = _summary(workers, site, seeded, left, leftover_keys, timed_out=timed_out)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the workers, the site and redis")
        return 130
    except (RuntimeError, TimeoutError, OSError) as e:
        print(f"error: {e}")
        print(f"worker logs are kept in {log_dir}")
        return 1
    finally:
        stop_workers(workers, timeout=5.0)
        site.stop()
        server.stop()
    print(f"worker logs are kept in {log_dir}")
    return 0 if ok else 1


def _pids(workers: Sequence[Worker]) -> str:
    return ", ".join(str(worker.pid) for worker in workers)


def _watch(
    workers: Sequence[Worker], site: TestSite, client: redis.Redis, seeded: float, deadline: float
) -> bool:
    """Print a progress line about once a second until every worker has exited.

    Returns:
        True if the deadline passed first.
    """
    while True:
        running = len(alive(workers))
        if not running:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        hits = site.hits()
        print(
            f"[{time.time() - seeded:6.1f}s] fetched {len(hits):>6}/{site.pages} pages, "
            f"{_progress(client)}, {len(alive(workers))}/{len(workers)} workers running",
            flush=True,
        )


def _progress(client: redis.Redis) -> str:
    """The crawl's figures as ``scrapy-dist status pages`` shows them (the same reader,
    :func:`~scrapy_dist.status.read_status`): done, queued, leased, rate."""
    from scrapy_dist.config.core import Config
    from scrapy_dist.status import CrawlLayout, read_status

    config = Config.from_settings(Settings())
    status = read_status(client, CrawlLayout.from_config(config, SPIDER), config)
    rate = "" if status.rates is None else f", {status.rates.pages_per_second:.0f} pages/s"
    return (
        f"status: {status.requests_done:>5} done, {status.queued:>5} queued, "
        f"{status.leased:>3} leased{rate}"
    )


def _summary(
    workers: Sequence[Worker],
    site: TestSite,
    seeded: float,
    left: int,
    leftover_keys: list[str],
    *,
    timed_out: bool,
) -> bool:
    """Print the crawl's summary.

    Returns:
        True if the crawl is correct (see the module docstring).
    """
    hits = site.hits()
    expected = site.expected_paths()
    crawled = set(hits) & expected
    repeated = sorted((path for path in crawled if hits[path] > 1), key=_page_order)
    missing = sorted(expected - crawled, key=_page_order)
    unexpected = sorted(set(hits) - expected, key=_page_order)
    stats = final_stats(workers)
    filtered = sum(int(s.get("dupefilter/filtered", 0)) for s in stats if s)
    items = sum(int(s.get("item_scraped_count", 0)) for s in stats if s)
    per_worker = ", ".join(
        str(s.get("downloader/response_count", 0)) if s else "no stats" for s in stats
    )
    statuses = [worker.returncode for worker in workers]
    first, last = site.first_hit_time(), site.last_hit_time()
    elapsed = max(1e-9, last - seeded) if last is not None else 0.0
    exactly_once = not missing and not repeated and not unexpected

    print()
    print("Summary")
    print(f"  pages crawled (distinct)      {len(crawled)} of {len(expected)} expected")
    print(f"  total fetches                 {sum(hits.values())}")
    print(f"  pages fetched more than once  {len(repeated)}{_sample(repeated)}")
    print(f"  pages missing                 {len(missing)}{_sample(missing)}")
    if unexpected:
        print(f"  unexpected paths fetched      {len(unexpected)}{_sample(unexpected)}")
    print(f"  duplicates filtered           {filtered} (dupefilter/filtered, all workers)")
    print(f"  items scraped                 {items}")
    print(f"  responses per worker          {per_worker}")
    print(f"  worker exit statuses          {', '.join(map(str, statuses))}")
    if elapsed and first is not None:
        print(
            f"  crawl time                    {elapsed:.2f} s (seed push to last page fetch), "
            f"{len(crawled) / elapsed:.0f} pages/s"
        )
        print(
            f"  first page fetched            {first - seeded:.2f} s after the seed push "
            "(worker start-up included)"
        )
    print(f"  each page crawled exactly once: {'yes' if exactly_once else 'no'}")
    print(f"  requests left in Redis        {left}")
    if leftover_keys:
        print(f"  keys left in Redis            {', '.join(leftover_keys)}")

    reasons = []
    if timed_out:
        reasons.append("the crawl did not finish before --timeout")
    if missing:
        reasons.append(f"{len(missing)} pages were never fetched")
    if repeated:
        reasons.append(f"{len(repeated)} pages were fetched more than once")
    if unexpected:
        reasons.append(f"{len(unexpected)} paths outside the site were fetched")
    if left:
        reasons.append(f"{left} requests are left in {REQUESTS_KEY}")
    if any(status != 0 for status in statuses):
        reasons.append("a worker exited with a non-zero status (see its log)")
    if reasons:
        print("Result: FAILED: " + "; ".join(reasons))
        return False
    print("Result: OK")
    return True


def _page_order(path: str) -> tuple[int, str]:
    """Sort key: ``/page/9`` before ``/page/10``; other paths last."""
    number = path.rpartition("/")[2]
    return (int(number), path) if number.isdigit() else (sys.maxsize, path)


def _sample(paths: Sequence[str], size: int = 5) -> str:
    if not paths:
        return ""
    more = ", ..." if len(paths) > size else ""
    return f" ({', '.join(paths[:size])}{more})"


if __name__ == "__main__":
    sys.exit(main())
