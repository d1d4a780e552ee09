"""Broad crawl: many hosts, one slow host with half the pages, per-host delays (issue 36).

The site: ``--hosts`` loopback addresses ``127.0.0.1``, ``127.0.0.2``, ... (all of
127.0.0.0/8 is loopback on Linux), served by one asyncio test site
(:class:`scrapy_dist.testing.site.TestSite`) bound to each of them on one port. Scrapy's
download slot is the host name, so each address is a slot of its own. The pages are
``/page/<i>`` of the test site's link graph, ``--pages`` of them, every link absolute:
the even pages live on the slow host ``127.0.0.1`` (half the site), the odd ones are
spread in turn over the other hosts. The crawl starts from one seed, page 0 (on the slow
host), and discovers the other hosts through the links.

Delays: ``--slow-delay`` for the slow host (``DOWNLOAD_SLOTS``), ``--fast-delay`` for the
others (``DOWNLOAD_DELAY``), ``DOWNLOAD_DELAY_JITTER = 0``. The site records when it
read every request and for which page (so for which host): the wall time floor is the
longest time any host needs, max over hosts of pages x delay, and the bound on the rate
is total pages / floor.

Configurations (``--configs``, comma-separated):

- ``dist-polite``: scrapy_dist, ``--workers`` workers, ``SCHEDULER_POLITENESS = True``:
  the delays hold for all workers together;
- ``dist-slots``: scrapy_dist, ``--workers`` workers, the queue per download slot
  (``SCHEDULER_QUEUE_CLASS = "scrapy_dist.slot_queue.SlotQueue"``): the frontier itself hands
  out one request of a host per delay, to whichever worker asks;
- ``dist-slots-polite``: ``dist-slots`` with ``SCHEDULER_POLITENESS = True`` too: the
  queue keeps each host's requests in Redis until they are due, the gate holds each
  host's concurrency for all workers and spaces the sends as they reach the downloader;
- ``dist``: scrapy_dist without politeness: each worker applies the delays on its own,
  so a host may get up to ``--workers`` requests per delay;
- ``sredis``: scrapy-redis, ``--workers`` workers, per-worker delays as ``dist``;
- ``scrapy``: one Scrapy process, Scrapy's scheduler with
  ``scrapy.pqueues.DownloaderAwarePriorityQueue`` (the single-process reference).

Figures per configuration: pages/s and its ratio to the bound (``floor / wall``, wall
from the seed's release to the last page read), each host's minimum and 5th-percentile
gap between two requests divided by its delay (as read, and with a new connection's
first request at the time the connection was accepted), pages fetched more than once
and pages never fetched, the time of the last fast-host page, and how long pages waited
from their discovery to their fetch (a fast host's page that waits long waits behind
other hosts' requests).

    python benchmarks/bench_broad.py                        # 400 pages, 200 hosts, 4 workers
    python benchmarks/bench_broad.py --pages 200 --configs dist-polite,scrapy

Results are written to ``benchmarks/results/broad-<time>.json``.
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))

from scrapy_dist.testing.redis_server import RedisServer, free_port  # noqa: E402
from scrapy_dist.testing.site import TestSite, links  # noqa: E402
from scrapy_dist.testing.workers import (  # noqa: E402
    Worker,
    final_stats,
    start_workers,
    stop_workers,
    wait_ready,
    wait_workers,
)

PROJECT = BENCH_DIR / "project"
RESULTS = BENCH_DIR / "results"
CONFIGS = ("dist-slots", "dist-slots-polite", "dist-polite", "dist", "sredis", "scrapy")
#: Spider of each configuration (``benchproject/spiders.py``).
SPIDERS = {
    "dist-slots": "dist",
    "dist-slots-polite": "dist",
    "dist-polite": "dist",
    "dist": "dist",
    "sredis": "sredis",
    "scrapy": "memory",
}
#: Seconds an idle scrapy-redis worker waits before it closes.
SREDIS_MAX_IDLE = 10
#: A host's gaps should be at least this share of its delay.
GAP_TARGET = 0.9


def host_names(count: int) -> list[str]:
    """``127.0.0.1``, ``127.0.0.2``, ...: ``count`` loopback addresses."""
    first = ipaddress.IPv4Address("127.0.0.1")
    return [str(first + k) for k in range(count)]


def host_of_page(page: int, hosts: int) -> int:
    """Index of the host that serves ``page``: 0 (the slow host) for the even pages, the
    others in turn for the odd ones."""
    if page % 2 == 0 or hosts == 1:
        return 0
    return 1 + (page // 2) % (hosts - 1)


class _Connections(set):  # type: ignore[type-arg]
    """The site's set of open connections, which also notes when each was accepted and,
    while a connection's data is handled, which connection it is."""

    def __init__(self, site: BroadSite) -> None:
        super().__init__()
        self.site = site

    def add(self, protocol: Any) -> None:
        super().add(protocol)
        accepted = time.monotonic()
        serial = next(self.site.serials)
        handle = protocol.data_received

        def data_received(data: bytes) -> None:
            self.site.current = (serial, accepted)
            handle(data)

        protocol.data_received = data_received


class BroadSite(TestSite):
    """The test site bound to every one of ``hosts`` on one port, its pages spread over
    them (:func:`host_of_page`) and linked by absolute URLs.

    Besides :meth:`hit_log` (when each request was read), :attr:`sends` holds each
    request's send time as the site sees it: for the first request of a connection, when
    the connection was accepted (a new connection's request reaches the site a connect
    later than one on a kept-alive connection), else when the request was read.
    """

    def __init__(self, pages: int, hosts: list[str]) -> None:
        super().__init__(pages, host=hosts[0], port=free_port())
        self.names = hosts
        # page j links to j on hosts[j % len(self.hosts)]: one entry per page
        self.hosts = [hosts[host_of_page(j, len(hosts))] for j in range(pages)]
        self.host = hosts  # type: ignore[assignment]  # create_server binds every address
        self._connections = _Connections(self)
        self.serials = itertools.count(1)
        self.current: tuple[int, float] = (0, 0.0)
        self.sends: list[tuple[float, str]] = []
        self._served: set[int] = set()

    @property
    def url(self) -> str:
        return f"http://{self.names[0]}:{self.port}"

    def _count(self, target: str) -> None:
        super()._count(target)
        connection, accepted = self.current
        first = connection not in self._served
        self._served.add(connection)
        with self._lock:
            read_at = self._log[-1][0]
            self.sends.append((accepted if first else read_at, self._path(target)))


def page_of(path: str) -> int:
    """The page number of ``/page/<i>``."""
    return int(path.rsplit("/", 1)[1])


def percentile(values: list[float], share: float) -> float:
    """The ``share`` percentile of ``values`` (nearest rank, lower)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def gap_figures(
    log: list[tuple[float, str]], args: argparse.Namespace, names: list[str]
) -> dict[str, Any]:
    """Per host: requests, min and p5 gap between two requests / the host's delay."""
    times: dict[int, list[float]] = defaultdict(list)
    for moment, path in log:
        times[host_of_page(page_of(path), args.hosts)].append(moment)
    per_host: dict[str, dict[str, Any]] = {}
    fast_gaps: list[float] = []
    for host, moments in sorted(times.items()):
        delay = args.slow_delay if host == 0 else args.fast_delay
        moments.sort()
        gaps = [(b - a) / delay for a, b in itertools.pairwise(moments)] if delay else []
        per_host[names[host]] = {
            "requests": len(moments),
            "gaps": len(gaps),
            "min_gap_ratio": round(min(gaps), 3) if gaps else None,
            "p5_gap_ratio": round(percentile(gaps, 0.05), 3) if gaps else None,
        }
        if host:
            fast_gaps += gaps
    slow = per_host.get(names[0], {})
    fast = [v for k, v in per_host.items() if k != names[0] and v["gaps"]]
    fast_mins: list[float] = [v["min_gap_ratio"] for v in fast]
    return {
        "per_host": per_host,
        "slow_min_gap_ratio": slow.get("min_gap_ratio"),
        "slow_p5_gap_ratio": slow.get("p5_gap_ratio"),
        "slow_gaps": slow.get("gaps", 0),
        "fast_min_gap_ratio": min(fast_mins, default=None),
        "fast_p5_gap_ratio": round(percentile(fast_gaps, 0.05), 3) if fast_gaps else None,
        "fast_gaps": len(fast_gaps),
        "fast_hosts_with_gaps": len(fast),
        "fast_hosts_below_target": sum(1 for ratio in fast_mins if ratio < GAP_TARGET),
    }


def lag_figures(log: list[tuple[float, str]], args: argparse.Namespace) -> dict[str, Any]:
    """How long pages waited: from the first read of a page linking to them (their
    discovery, give or take the parse) to their own first read, slow and fast hosts apart.
    A fast host's page that waits long waits behind other requests, not for its host."""
    first: dict[int, float] = {}
    for moment, path in log:
        first.setdefault(page_of(path), moment)
    found: dict[int, float] = {}
    for page, moment in first.items():
        for target in links(page, args.pages):
            found[target] = min(found.get(target, moment), moment)
    result: dict[str, Any] = {}
    for kind in ("slow", "fast"):
        lags = sorted(
            first[page] - found[page]
            for page in first
            if page in found and (host_of_page(page, args.hosts) != 0) == (kind == "fast")
        )
        for name, share in (("p50", 0.5), ("p90", 0.9)):
            result[f"{kind}_lag_{name}_s"] = round(percentile(lags, share), 2) if lags else None
        result[f"{kind}_lag_max_s"] = round(lags[-1], 2) if lags else None
    return result


def settings_of(config: str, args: argparse.Namespace, redis_url: str) -> dict[str, object]:
    """The ``-s`` settings of one configuration's workers."""
    settings: dict[str, object] = {
        "DOWNLOAD_DELAY": args.fast_delay,
        "DOWNLOAD_SLOTS": json.dumps({host_names(1)[0]: {"delay": args.slow_delay}}),
        "DOWNLOAD_DELAY_JITTER": 0,
        "CONCURRENT_REQUESTS": args.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        # every run has its own Redis; and a scrapy-redis worker that closes without
        # persistence deletes the shared queue and dupefilter while the others crawl on
        "SCHEDULER_PERSIST": True,
    }
    if config == "scrapy":
        settings["SCHEDULER_PRIORITY_QUEUE"] = "scrapy.pqueues.DownloaderAwarePriorityQueue"
        return settings
    settings["REDIS_URL"] = redis_url
    if config == "sredis":
        settings["MAX_IDLE_TIME_BEFORE_CLOSE"] = SREDIS_MAX_IDLE
    else:
        settings["CLOSE_WHEN_CRAWL_DONE"] = True
        settings["SCHEDULER_POLITENESS"] = config in ("dist-polite", "dist-slots-polite")
        if config in ("dist-slots", "dist-slots-polite"):
            settings["SCHEDULER_QUEUE_CLASS"] = "scrapy_dist.slot_queue.SlotQueue"
    return settings


def run(config: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One crawl of the broad site by ``config``; its figures."""
    spider = SPIDERS[config]
    log_dir = work / config
    log_dir.mkdir()
    names = host_names(args.hosts)
    site = BroadSite(args.pages, names).start()
    server = RedisServer(directory=log_dir / "redis").start()
    client = server.client()
    settings = settings_of(config, args, server.url)
    gate = log_dir / "gate"
    workers: list[Worker] = []
    capped = False
    try:
        if config == "scrapy":
            spider_args: dict[str, object] = {"start_url": site.page_url(0), "gate": gate}
            count = 1
        else:
            spider_args = {}
            count = args.workers
        workers = start_workers(
            count,
            project_dir=PROJECT,
            spider=spider,
            log_dir=log_dir,
            settings=settings,
            spider_args=spider_args,
            stats_setting="BENCH_STATS_FILE",
        )
        wait_ready(workers, timeout=120)
        started = time.monotonic()
        if config == "scrapy":
            gate.touch()
        else:
            client.lpush(f"{spider}:start_urls", site.page_url(0))
        try:
            wait_workers(workers, timeout=args.run_timeout)
        except TimeoutError:
            capped = True
        exited = time.monotonic()
    finally:
        stop_workers(workers, timeout=10)
        client.close()
        server.stop()
        site.stop()
    log = site.hit_log()
    sends = list(site.sends)
    hits = Counter(path for _, path in log)
    expected = {f"/page/{i}" for i in range(args.pages)}
    last = max((moment for moment, _ in log), default=started)
    wall = last - started
    per_host_pages = Counter(host_of_page(i, args.hosts) for i in range(args.pages))
    floor = max(
        n * (args.slow_delay if host == 0 else args.fast_delay)
        for host, n in per_host_pages.items()
    )
    stats = final_stats(workers)
    fast = [moment for moment, path in log if host_of_page(page_of(path), args.hosts)]
    return {
        "config": config,
        "workers": count,
        "fetched": len(log),
        "distinct": len(set(hits) & expected),
        "duplicates": sum(n - 1 for n in hits.values()),
        "missing": len(expected - set(hits)),
        "wall_s": round(wall, 2),
        "exit_s": round(exited - started, 2),
        "floor_s": round(floor, 2),
        "fast_last_s": round(max(fast) - started, 2) if fast else None,
        "pages_per_s": round(len(set(hits) & expected) / wall, 2) if wall > 0 else None,
        "bound_pages_per_s": round(args.pages / floor, 2),
        "ratio_to_bound": round(floor / wall, 3) if wall > 0 else None,
        "capped": capped,
        "pages_per_worker": [int((s or {}).get("pages", 0)) for s in stats],
        "politeness": {
            name.rsplit("/", 1)[1]: sum(int((s or {}).get("stats", {}).get(name, 0)) for s in stats)
            for name in (
                "scheduler/politeness/granted",
                "scheduler/politeness/refused",
                "scheduler/politeness/round_trips",
                "scheduler/horizon/handed_back",
            )
        },
        **lag_figures(log, args),
        "gaps_read": gap_figures(log, args, names),
        "gaps_sent": gap_figures(sends, args, names),
        "log_dir": str(log_dir),
        "hits": [[round(moment - started, 4), page_of(path)] for moment, path in log],
    }


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    first = results[0]
    print(
        f"{args.pages} pages, {args.hosts} hosts (slow host: {args.pages - args.pages // 2} "
        f"pages at {args.slow_delay} s; the others {args.fast_delay} s), "
        f"floor {first['floor_s']} s, bound {first['bound_pages_per_s']} pages/s"
    )
    header = (
        f"{'config':<12} {'wk':>2} {'pages/s':>7} {'ratio':>5} {'slow min':>8} {'slow p5':>7} "
        f"{'fast min':>8} {'fast p5':>7} {'fast<0.9':>8} {'dup':>4} {'miss':>4} {'wall s':>7} "
        f"{'fast end':>8}"
    )
    for kind, title in (
        ("gaps_read", "gaps between the times the site read two requests of a host"),
        ("gaps_sent", "gaps with a new connection's first request at its accept time"),
    ):
        print(f"\n{title}")
        print(header)
        print("-" * len(header))
        for r in results:
            g = r[kind]
            capped = "*" if r["capped"] else " "
            print(
                f"{r['config']:<12} {r['workers']:>2} {fmt(r['pages_per_s']):>7} "
                f"{fmt(r['ratio_to_bound']):>5} {fmt(g['slow_min_gap_ratio']):>8} "
                f"{fmt(g['slow_p5_gap_ratio']):>7} {fmt(g['fast_min_gap_ratio']):>8} "
                f"{fmt(g['fast_p5_gap_ratio']):>7} "
                f"{g['fast_hosts_below_target']:>3}/{g['fast_hosts_with_gaps']:<4} "
                f"{r['duplicates']:>4} {r['missing']:>4} {r['wall_s']:>6}{capped} "
                f"{fmt(r['fast_last_s']):>8}"
            )
    print("\nseconds from a page's discovery to its fetch (p50 / p90 / max)")
    print(f"{'config':<12} {'slow hosts':>22} {'fast hosts':>22}")
    for r in results:
        slow, fast = (
            " / ".join(fmt(r[f"{kind}_lag_{name}_s"]) for name in ("p50", "p90", "max"))
            for kind in ("slow", "fast")
        )
        print(f"{r['config']:<12} {slow:>22} {fast:>22}")
    print(
        "gaps: between two requests to a host / its delay (target >= 0.9); fast min: worst "
        "fast host; fast p5: over all fast hosts' gaps; fast<0.9: fast hosts with a gap "
        "below 0.9 / fast hosts with two requests or more; ratio: pages/s / bound "
        "(floor / wall); wall and fast end: seconds from the seed's release to the last page "
        "read, of any host and of the fast hosts; * stopped at --run-timeout"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=400, help="site pages (400)")
    parser.add_argument("--hosts", type=int, default=200, help="hosts (200)")
    parser.add_argument("--slow-delay", type=float, default=0.5, help="slow host's delay (0.5)")
    parser.add_argument("--fast-delay", type=float, default=0.05, help="other hosts' (0.05)")
    parser.add_argument("--workers", type=int, default=4, help="workers of dist/sredis (4)")
    parser.add_argument("--concurrency", type=int, default=16, help="CONCURRENT_REQUESTS (16)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=",".join(CONFIGS))
    parser.add_argument("--run-timeout", type=float, default=600.0)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    configs = args.configs.split(",")
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs: {', '.join(sorted(unknown))}")
    if not 2 <= args.hosts <= 2**24 - 2:
        parser.error("--hosts must be 2 or more (and fit in 127.0.0.0/8)")
    work = Path(tempfile.mkdtemp(prefix="scrapy-dist-broad-"))
    results = []
    try:
        for config in configs:
            result = run(config, args, work)
            results.append(result)
            print(
                f"{config}: {result['distinct']}/{args.pages} pages, wall {result['wall_s']} s "
                f"(floor {result['floor_s']} s), exit {result['exit_s']} s",
                flush=True,
            )
    finally:
        if not args.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
    print_table(results, args)
    out = args.out or RESULTS / f"broad-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args) | {"out": str(out)}, "runs": results}, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
