"""No hoarding: two workers, a download delay, a few seeds pushed before they start.

The scenario of issue 36 (a scrapy-redis tutorial project's settings): ``DOWNLOAD_DELAY``
of 5 s, seeds read one at a time (``redis_batch_size = 1``), 10 seeds of one
host pushed before two workers start, the second ``--stagger`` seconds after the first (as
processes started by hand or by a deployment do). Scrapy's downloader applies the delay in each
worker on its own, so two workers that share the seeds crawl them twice as fast as one.
A worker that leases every seed while it can start only one per delay makes the other
idle. Figures per scheduler: the pages each worker fetched, the crawl's wall time (the
workers' start to the last page fetched) and whether every page was fetched once.

    python benchmarks/bench_hoarding.py                       # scrapy_dist and scrapy-redis
    python benchmarks/bench_hoarding.py --delay 2 --seeds 6   # a shorter run

Results are written to ``benchmarks/results/hoarding-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent))

from sites import PythonSite  # noqa: E402

from scrapy_dist.testing.redis_server import RedisServer  # noqa: E402
from scrapy_dist.testing.workers import (  # noqa: E402
    final_stats,
    start_workers,
    stop_workers,
    wait_ready,
    wait_workers,
)

PROJECT = BENCH_DIR / "project"
RESULTS = BENCH_DIR / "results"
#: Spider name of each scheduler (``benchproject/spiders.py``).
SPIDERS = {"dist": "dist", "dist-slots": "dist", "sredis": "sredis"}
#: Seconds an idle scrapy-redis worker waits before it closes.
SREDIS_MAX_IDLE = 10


def run(scheduler: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One crawl of ``args.seeds`` seed pages by ``args.workers`` workers of ``scheduler``."""
    spider = SPIDERS[scheduler]
    log_dir = work / scheduler
    log_dir.mkdir()
    site = PythonSite(args.seeds)
    site.start()
    server = RedisServer().start()
    client = server.client()
    settings: dict[str, object] = {
        "REDIS_URL": server.url,
        "DOWNLOAD_DELAY": args.delay,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        "SCHEDULER_PERSIST": False,
    }
    if scheduler.startswith("dist"):
        settings["CLOSE_WHEN_CRAWL_DONE"] = True
    if scheduler == "dist-slots":  # the queue per download slot
        settings["SCHEDULER_QUEUE_CLASS"] = "scrapy_dist.slot_queue.SlotQueue"
    else:
        settings["MAX_IDLE_TIME_BEFORE_CLOSE"] = SREDIS_MAX_IDLE
    workers = []
    try:
        base = site.base_urls[0]
        client.lpush(f"{spider}:start_urls", *[f"{base}/page/{i}" for i in range(args.seeds)])
        started = time.time()
        for index in range(args.workers):
            if index:
                time.sleep(args.stagger)
            workers += start_workers(
                1,
                project_dir=PROJECT,
                spider=spider,
                log_dir=log_dir,
                settings=settings,
                spider_args={"follow": "no", "redis_batch_size": 1},
                stats_setting="BENCH_STATS_FILE",
                first_index=index,
            )
        wait_ready(workers, timeout=120)
        try:
            wait_workers(workers, timeout=args.run_timeout)
            capped = False
        except TimeoutError:
            capped = True
        exited = time.time()
    finally:
        stop_workers(workers, timeout=10)
        client.close()
        server.stop()
        site.stop()
    hits = site.hits()
    per_path = Counter(hit.path for hit in hits)
    stats = final_stats(workers)
    pages = [int((s or {}).get("pages", 0)) for s in stats]
    last = max((hit.time for hit in hits), default=started)
    return {
        "scheduler": scheduler,
        "pages_per_worker": pages,
        "fetched": len(hits),
        "distinct": len(per_path),
        "duplicates": sum(n - 1 for n in per_path.values()),
        "wall_to_last_page_s": round(last - started, 2),
        "wall_to_exit_s": round(exited - started, 2),
        "capped": capped,
        "log_dir": str(log_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=5.0, help="DOWNLOAD_DELAY (5)")
    parser.add_argument("--seeds", type=int, default=10, help="seed pages (10)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument(
        "--stagger", type=float, default=2.0, help="seconds between two workers' starts (2)"
    )
    parser.add_argument("--schedulers", default="dist,sredis")
    parser.add_argument("--run-timeout", type=float, default=300.0)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="scrapy-dist-hoarding-"))
    results = []
    try:
        for scheduler in args.schedulers.split(","):
            result = run(scheduler, args, work)
            results.append(result)
            print(
                f"{scheduler:7} pages per worker {result['pages_per_worker']}, "
                f"{result['distinct']}/{args.seeds} pages, {result['duplicates']} duplicates, "
                f"last page at {result['wall_to_last_page_s']} s, "
                f"exit at {result['wall_to_exit_s']} s{' (capped)' if result['capped'] else ''}"
            )
    finally:
        if not args.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
    by = {r["scheduler"]: r for r in results}
    if "dist" in by and "sredis" in by and by["sredis"]["wall_to_last_page_s"]:
        ratio = by["dist"]["wall_to_last_page_s"] / by["sredis"]["wall_to_last_page_s"]
        print(f"wall time to the last page, scrapy_dist / scrapy-redis: {ratio:.2f}")
    out = args.out or RESULTS / f"hoarding-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args) | {"out": str(out)}, "runs": results}, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
