"""Cluster-wide politeness: what it costs in Redis round trips per page, and that it holds.

Crawls the local test site (``--pages`` pages, one host) with ``--workers`` ``scrapy
crawl`` workers of ``benchmarks/project`` (spider ``dist``), each configuration with its
own ``redis-server`` (never the one on 6379) and site:

- ``off``: ``SCHEDULER_POLITENESS = False`` (the baseline);
- ``on, not binding``: politeness on with a limit the crawl never reaches
  (``CONCURRENT_REQUESTS_PER_DOMAIN`` above all workers' concurrency, no delay): the
  pure cost of the gate;
- ``on, delay``: politeness on with ``DOWNLOAD_DELAY = --delay``: the site's request
  rate must stay at or below ``1 / delay`` for all workers together.

Round trips are counted at the redis-py client of each worker, over its whole life
(``benchproject.extensions.BenchStats``). Usage::

    python benchmarks/bench_politeness.py               # 2,000 pages, 2 workers
    python benchmarks/bench_politeness.py --pages 5000 --workers 4

Prints one table and writes it as JSON to ``benchmarks/results/politeness-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from scrapy_dist.testing.redis_server import RedisServer
from scrapy_dist.testing.site import TestSite, bfs
from scrapy_dist.testing.workers import (
    final_stats,
    start_workers,
    stop_workers,
    wait_ready,
    wait_workers,
)

HERE = Path(__file__).parent
PROJECT = HERE / "project"


def run(name: str, settings: dict[str, object], args: argparse.Namespace) -> dict[str, Any]:
    """One crawl of the whole site; its figures."""
    with tempfile.TemporaryDirectory(prefix="bench-politeness-") as tmp:
        log_dir = Path(tmp)
        server = RedisServer(directory=log_dir / "redis").start()
        site = TestSite(pages=args.pages, delay=args.site_delay).start()
        workers = []
        try:
            common = {
                "REDIS_URL": server.url,
                "CLOSE_WHEN_CRAWL_DONE": True,
                "CRAWL_DONE_GRACE": 1,
                "CONCURRENT_REQUESTS": args.concurrency,
                **settings,
            }
            workers = start_workers(
                args.workers,
                project_dir=PROJECT,
                spider="dist",
                log_dir=log_dir,
                settings=common,
                stats_setting="BENCH_STATS_FILE",
            )
            wait_ready(workers, timeout=120)
            client = server.client()
            started = time.monotonic()
            client.lpush("dist:start_urls", site.page_url(0))
            wait_workers(workers, timeout=args.timeout)
            client.close()
            stats = final_stats(workers)
            hits = site.hits()
        finally:
            stop_workers(workers, timeout=10)
            site.stop()
            server.stop()
    pages = len(bfs(0, args.pages))
    first = min(s["marks"]["open"]["time"] for s in stats if s)
    last = max(s["marks"]["last"]["time"] for s in stats if s and "last" in s["marks"])
    round_trips = sum(s["marks"]["close"]["round_trips"] for s in stats if s)
    gated = sum(s["stats"].get("scheduler/redis/round_trips", 0) for s in stats if s)
    return {
        "run": name,
        "pages": pages,
        "fetched": sum(hits.values()),
        "missing": pages - len(hits),
        "crawl_s": round(last - first, 2),
        "wall_s": round(time.monotonic() - started, 2),
        "pages_per_s": round(pages / max(last - first, 1e-9), 1),
        "round_trips_per_page": round(round_trips / pages, 3),
        "scheduler_round_trips_per_page": round(gated / pages, 3),
        "duplicates": sum(n - 1 for n in hits.values() if n > 1),
        "politeness_calls_per_page": {
            why: round(
                sum(s["stats"].get(f"scheduler/politeness/calls/{why}", 0) for s in stats if s)
                / pages,
                3,
            )
            for why in ("asks", "releases", "renewals")
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16, help="CONCURRENT_REQUESTS")
    parser.add_argument("--site-delay", type=float, default=0.01, help="seconds per page")
    parser.add_argument("--delay", type=float, default=0.005, help="DOWNLOAD_DELAY of 'on, delay'")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    everyone = args.workers * args.concurrency
    runs = [
        ("off", {"SCHEDULER_POLITENESS": False, "CONCURRENT_REQUESTS_PER_DOMAIN": everyone}),
        (
            "on, not binding",
            {"SCHEDULER_POLITENESS": True, "CONCURRENT_REQUESTS_PER_DOMAIN": everyone},
        ),
        (
            f"on, delay {args.delay}",
            {
                "SCHEDULER_POLITENESS": True,
                "CONCURRENT_REQUESTS_PER_DOMAIN": everyone,
                "DOWNLOAD_DELAY": args.delay,
            },
        ),
    ]
    results = [run(name, settings, args) for name, settings in runs]
    print(f"{args.pages} pages, {args.workers} workers x {args.concurrency} requests, one host")
    print(f"{'run':<18} {'pages/s':>8} {'crawl s':>8} {'missing':>8} {'RT/page':>8}")
    for r in results:
        print(
            f"{r['run']:<18} {r['pages_per_s']:>8} {r['crawl_s']:>8} {r['missing']:>8} "
            f"{r['round_trips_per_page']:>8}"
        )
    base = results[0]["round_trips_per_page"]
    for r in results[1:]:
        print(
            f"{r['run']}: {r['round_trips_per_page'] / base:.2f}x the round trips per page of off"
        )
    out = HERE / "results" / f"politeness-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(f"wrote {out.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
