"""End-to-end crawl benchmark: Scrapy's in-memory scheduler vs scrapy_dist vs scrapy-redis.

Every configuration crawls the same local site (``--pages`` pages, ~10 links per page,
many duplicates) with ``scrapy crawl`` worker processes of ``benchmarks/project``, each
run with its own ``redis-server`` (never the one on 6379), its own site process, and a
latency-injecting proxy in front of Redis for the runs with a round-trip time. Rates,
duplicates and missing pages come from the site's own record of fetches; round trips
from the workers (counted at the redis-py client), commands and memory from the server.

Usage::

    python benchmarks/bench_crawl.py                 # the table: 20,000 pages
    python benchmarks/bench_crawl.py --quick         # a smoke run: 1,000 pages, ~2.5 min
    python benchmarks/bench_crawl.py --scaling       # I/O-bound scaling, 1/2/4 workers
    python benchmarks/bench_crawl.py --stall         # max stall and idle Redis calls
    python benchmarks/bench_crawl.py --all           # all three
    python benchmarks/bench_crawl.py --schedulers memory,dist \
        --variant off:SCHEDULER_BACKGROUND_FLUSH=False \
        --variant on:SCHEDULER_BACKGROUND_FLUSH=True   # scrapy_dist once per variant

Prints one table per part and writes everything as JSON to
``benchmarks/results/crawl-<timestamp>.json``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import scrapy
from latency_proxy import LatencyProxy, measure_rtt
from sites import Hit, NginxSite, PythonSite, find_nginx, measure_capacity, write_pages

from scrapy_dist.testing.redis_server import RedisServer
from scrapy_dist.testing.site import bfs
from scrapy_dist.testing.workers import (
    Worker,
    final_stats,
    start_workers,
    stop_workers,
    wait_ready,
    wait_workers,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

    import redis
    from sites import Site

BENCH_DIR = Path(__file__).resolve().parent
PROJECT = BENCH_DIR / "project"
RESULTS = BENCH_DIR / "results"

#: Scheduler -> (spider name, label in the table).
SCHEDULERS = {
    "memory": ("memory", "scrapy memory"),
    "dist": ("dist", "scrapy_dist"),
    "sredis": ("sredis", "scrapy-redis"),
}
#: scrapy-redis closes a worker after this many idle seconds (its MAX_IDLE_TIME_BEFORE_CLOSE).
SREDIS_MAX_IDLE = 10
#: Server-side delay and per-worker concurrency of the I/O-bound scaling run.
SCALING_DELAY = 0.1
SCALING_CONCURRENCY = 4


@dataclass
class Run:
    """One crawl configuration and what it measured."""

    scheduler: str
    workers: int
    rtt_ms: float
    pages: int
    concurrency: int
    site: str = "nginx"
    delay: float = 0.0
    rtt_measured_ms: float | None = None
    distinct: int = 0
    fetches: int = 0
    seconds: float = 0.0
    pages_per_s: float = 0.0
    ratio: float | None = None
    round_trips_per_page: float | None = None
    #: Milliseconds per page the workers were blocked in synchronous Redis calls.
    wait_ms_per_page: float | None = None
    commands_per_page: float | None = None
    cpu_ms_per_page: float | None = None
    redis_mb: float | None = None
    duplicates: int = 0
    missing: int | None = None
    max_stall_s: float = 0.0
    capped: bool = False
    exit_statuses: list[int | None] = field(default_factory=list)
    top_commands: dict[str, int] = field(default_factory=dict)
    worker_stats: list[dict[str, Any] | None] = field(default_factory=list)
    log_dir: str = ""
    #: Extra Scrapy settings of the workers (``-s``), e.g. ``SCHEDULER_SERIALIZER``.
    settings: dict[str, object] = field(default_factory=dict)
    #: The ``--variant`` label of these settings (``""``: none).
    variant: str = ""
    #: What ``probe.after`` returned (``bench_server.py``: server CPU per script...).
    server: dict[str, Any] = field(default_factory=dict)


class ServerProbe(Protocol):
    """Looks at the crawl's Redis server just before the workers start and after they end."""

    def before(self, client: redis.Redis) -> None: ...

    def after(self, client: redis.Redis) -> dict[str, Any]: ...


def on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    """Turn SIGTERM into KeyboardInterrupt so every ``finally`` stops what it started."""
    raise KeyboardInterrupt


# -- measurements -----------------------------------------------------------------------


def hit_metrics(hits: Sequence[Hit], expected: set[str], copies: int) -> dict[str, Any]:
    """Rates, duplicates, missing pages and the longest stall from the site's fetch record.

    Args:
        hits: Every page fetch.
        expected: Paths every copy of the site should have had fetched.
        copies: Number of independent copies crawled.
    """
    counts: dict[tuple[int, str], int] = {}
    for hit in hits:
        key = (hit.copy, hit.path)
        counts[key] = counts.get(key, 0) + 1
    times = sorted(hit.time for hit in hits)
    seconds = times[-1] - times[0] if len(times) > 1 else 0.0
    stall = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    distinct = len(counts)
    return {
        "distinct": distinct,
        "fetches": len(hits),
        "seconds": seconds,
        "pages_per_s": distinct / seconds if seconds > 0 else 0.0,
        "duplicates": sum(1 for n in counts.values() if n > 1),
        "missing": sum(1 for c in range(copies) for p in expected if (c, p) not in counts),
        "max_stall_s": stall,
    }


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the last ``CONFIG RESETSTAT`` (``INFO commandstats``)."""
    info = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in info.items()
        if isinstance(value, dict)
    }


def per_page_from_workers(
    stats: Sequence[dict[str, Any] | None], pages: int
) -> tuple[float | None, float | None]:
    """Round trips and CPU ms per page, over all workers (None if a worker wrote no stats).

    Round trips: the worker's whole life (start-up, crawl, idle tail, close). CPU: from
    spider opened to its last response (import and start-up excluded, idle tail too).
    """
    if pages <= 0 or any(s is None for s in stats):
        return None, None
    round_trips = 0.0
    cpu = 0.0
    for s in stats:
        assert s is not None
        marks = s["marks"]
        round_trips += marks["close"]["round_trips"]
        if "last" in marks:
            cpu += marks["last"]["cpu"] - marks["open"]["cpu"]
    return round_trips / pages, cpu * 1000 / pages


def wait_per_page(stats: Sequence[dict[str, Any] | None], pages: int) -> float | None:
    """Milliseconds per page the workers spent blocked in synchronous Redis calls from
    spider opened to their last response, summed (None if a worker did not record it)."""
    if pages <= 0:
        return None
    wait = 0.0
    for s in stats:
        marks = None if s is None else s["marks"]
        if marks is None or "redis_wait" not in marks["open"]:
            return None
        if "last" in marks:
            wait += marks["last"]["redis_wait"] - marks["open"]["redis_wait"]
    return wait * 1000 / pages


# -- one crawl ------------------------------------------------------------------------------


class Bench:
    """Runs crawls; owns the generated static site and every process it starts."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="scrapy-dist-bench-"))
        os.chmod(self.work, 0o755)  # nginx workers may run as another user
        self.nginx = None if args.site == "python" else find_nginx()
        if args.site == "nginx" and self.nginx is None:
            raise SystemExit("--site nginx: nginx not found (apt-get install nginx-light)")
        self.roots: dict[int, Path] = {}
        self.site_info: dict[str, Any] = {}

    def close(self) -> None:
        if not self.args.keep_logs:
            shutil.rmtree(self.work, ignore_errors=True)

    def make_site(self, pages: int, copies: int = 1, delay: float = 0.0) -> Site:
        """A fresh site (new ports, empty fetch record): nginx unless a delay is needed."""
        if self.nginx is None or delay > 0:
            return PythonSite(pages, copies=copies, delay=delay)
        root = self.roots.get(pages)
        if root is None:
            root = self.work / f"site-{pages}"
            write_pages(pages, root)
            for path in (root, root / "page"):
                os.chmod(path, 0o755)
            self.roots[pages] = root
        return NginxSite(pages, root, copies=copies, binary=self.nginx)

    def measure_site(self, pages: int) -> None:
        """Record which site server is used and what it serves per second."""
        site = self.make_site(pages)
        site.start()
        try:
            rate, tool = measure_capacity(site.base_urls[0] + "/page/1", seconds=3)
        finally:
            _cleanup_site(site)
        self.site_info = {"server": site.kind, "capacity_rps": round(rate), "measured_with": tool}
        print(f"site: {site.kind}, serves {rate:,.0f} pages/s ({tool}, 3 s, one page)")

    def crawl(self, run: Run, probe: ServerProbe | None = None) -> Run:
        """Run one configuration; fills in and returns ``run``.

        ``probe`` (Redis schedulers only) looks at the server right before ``CONFIG
        RESETSTAT`` and after the workers end and the run's own figures are read; what
        it returns is ``run.server``.
        """
        spider = SCHEDULERS[run.scheduler][0]
        log_dir = self.work / (
            f"{run.scheduler}{'-' + run.variant if run.variant else ''}-w{run.workers}"
            f"-rtt{run.rtt_ms:g}-c{run.concurrency}"
            f"-d{run.delay:g}-p{run.pages}"
        )
        log_dir.mkdir(parents=True, exist_ok=True)
        run.log_dir = str(log_dir)
        memory = run.scheduler == "memory"
        copies = run.workers if memory else 1
        site = self.make_site(run.pages, copies=copies, delay=run.delay)
        run.site = site.kind
        workers: list[Worker] = []
        server: RedisServer | None = None
        proxy: LatencyProxy | None = None
        client: redis.Redis | None = None
        total_calls = 0
        settings: dict[str, object] = {
            "CONCURRENT_REQUESTS": run.concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": run.concurrency,
            **run.settings,
        }
        try:
            site.start()
            if not memory:
                server = RedisServer().start()
                client = server.client(socket_timeout=30)
                url = server.url
                if run.rtt_ms > 0:
                    proxy = start_proxy(server.port, run.rtt_ms / 1000)
                    url = proxy.url
                    run.rtt_measured_ms = round(measure_rtt(proxy.port) * 1000, 3)
                else:
                    run.rtt_measured_ms = round(measure_rtt(server.port) * 1000, 3)
                settings["REDIS_URL"] = url
                if run.scheduler == "dist":
                    settings["CLOSE_WHEN_CRAWL_DONE"] = True
                else:
                    settings["MAX_IDLE_TIME_BEFORE_CLOSE"] = SREDIS_MAX_IDLE
                if probe is not None:
                    probe.before(client)
                client.config_resetstat()
            gate = log_dir / "go"
            for index in range(run.workers):
                spider_args: dict[str, object] = {}
                if memory:
                    spider_args = {"start_url": f"{site.base_urls[index]}/page/0", "gate": gate}
                workers += start_workers(
                    1,
                    project_dir=PROJECT,
                    spider=spider,
                    log_dir=log_dir,
                    settings=settings,
                    spider_args=spider_args,
                    stats_setting="BENCH_STATS_FILE",
                    first_index=index,
                )
            wait_ready(workers, timeout=120)
            if memory:
                gate.touch()
            else:
                assert client is not None
                client.lpush(f"{spider}:start_urls", f"{site.base_urls[0]}/page/0")
            try:
                wait_workers(workers, timeout=self.args.run_timeout)
            except TimeoutError:
                run.capped = True
                stop_workers(workers, timeout=20)
            run.exit_statuses = [w.returncode for w in workers]
            if client is not None:
                calls = command_calls(client)
                calls["config"] = calls.get("config", 0) - 1  # our CONFIG RESETSTAT
                top = sorted(calls.items(), key=lambda kv: -kv[1])
                run.top_commands = {name: n for name, n in top if n > 0}
                total_calls = sum(run.top_commands.values())
                memory_info = client.info("memory")
                run.redis_mb = round(int(memory_info["used_memory"]) / 2**20, 2)
                if probe is not None:  # after the figures above, which its commands would skew
                    run.server = probe.after(client)
        finally:
            stop_workers(workers, timeout=10)
            if proxy is not None:
                proxy.stop()
            if client is not None:
                client.close()
            if server is not None:
                server.stop()
            site.stop()
        expected = {f"/page/{i}" for i in bfs(0, run.pages)}
        metrics = hit_metrics(site.hits(), expected, copies)
        _cleanup_site(site)
        for name, value in metrics.items():
            setattr(run, name, value)
        if run.capped:
            run.missing = None  # a stopped crawl is incomplete by design
        run.worker_stats = final_stats(workers)
        run.round_trips_per_page, run.cpu_ms_per_page = per_page_from_workers(
            run.worker_stats, run.distinct
        )
        run.wait_ms_per_page = wait_per_page(run.worker_stats, run.distinct)
        if run.scheduler == "memory":
            run.round_trips_per_page = run.wait_ms_per_page = None
        if client is not None and run.distinct:
            run.commands_per_page = total_calls / run.distinct
        return run


def start_proxy(upstream_port: int, rtt: float) -> LatencyProxy:
    """A latency proxy calibrated so that a PING through it costs ``rtt`` more than direct.

    The proxy's own overhead (thread hand-offs, ~0.1-0.2 ms) is measured once and taken
    off the delay it is told to add.
    """
    direct = measure_rtt(upstream_port, 200)
    proxy = LatencyProxy(upstream_port, rtt).start()
    added = measure_rtt(proxy.port, 200) - direct
    overshoot = added - rtt
    if overshoot > 0.00005:
        proxy.stop()
        proxy = LatencyProxy(upstream_port, max(0.0, rtt - overshoot)).start()
    return proxy


def _cleanup_site(site: Site) -> None:
    cleanup = getattr(site, "cleanup", None)
    if cleanup is not None:
        cleanup()


# -- the three parts ----------------------------------------------------------------------


def run_table(bench: Bench, args: argparse.Namespace) -> list[Run]:
    schedulers = [s for s in args.schedulers.split(",") if s]
    if "sredis" in schedulers and not _has_scrapy_redis():
        print("scrapy-redis is not installed: skipping it (pip install scrapy-redis)")
        schedulers.remove("sredis")
    worker_counts = [int(w) for w in args.workers.split(",")]
    rtts = [float(r) for r in args.rtt.split(",")]
    variants = args.variant or [("", {})]
    plan: list[Run] = []
    for workers in worker_counts:
        for scheduler in schedulers:
            for rtt in [0.0] if scheduler == "memory" else rtts:
                for name, settings in [("", {})] if scheduler != "dist" else variants:
                    run = Run(scheduler, workers, rtt, args.pages, args.concurrency)
                    run.variant, run.settings = name, dict(settings)
                    plan.append(run)
    runs = []
    for number, run in enumerate(plan, 1):
        label = run_label(run)
        print(
            f"[{number}/{len(plan)}] {label}, {run.workers} worker(s), RTT {run.rtt_ms:g} ms, "
            f"{run.pages} pages ...",
            flush=True,
        )
        started = time.monotonic()
        bench.crawl(run)
        print(
            f"    {run.pages_per_s:,.0f} pages/s, {run.distinct} distinct pages"
            f"{' (capped at --run-timeout)' if run.capped else ''}, "
            f"{time.monotonic() - started:.0f} s",
            flush=True,
        )
        runs.append(run)
    ceilings = {r.workers: r.pages_per_s for r in runs if r.scheduler == "memory"}
    for run in runs:
        if ceilings.get(run.workers):
            run.ratio = run.pages_per_s / ceilings[run.workers]
    print_table(runs)
    return runs


def run_scaling(bench: Bench, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    base = None
    for workers in (1, 2, 4):
        pages = args.scaling_pages * workers
        print(f"[scaling] scrapy_dist, {workers} worker(s), {pages} pages ...", flush=True)
        run = bench.crawl(
            Run("dist", workers, 0.0, pages, args.scaling_concurrency, delay=args.scaling_delay)
        )
        if base is None:
            base = run.pages_per_s
        efficiency = run.pages_per_s / (workers * base) if base else None
        rows.append(
            {
                "workers": workers,
                "pages": pages,
                "pages_per_s": run.pages_per_s,
                "seconds": run.seconds,
                "efficiency": efficiency,
                "duplicates": run.duplicates,
                "missing": run.missing,
                "capped": run.capped,
                "max_stall_s": run.max_stall_s,
                "cpu_ms_per_page": run.cpu_ms_per_page,
                "round_trips_per_page": run.round_trips_per_page,
                "wait_ms_per_page": run.wait_ms_per_page,
            }
        )
    ideal = args.scaling_concurrency / args.scaling_delay
    print()
    print(
        f"I/O-bound scaling: scrapy_dist, {args.scaling_delay * 1000:g} ms per page server-side, "
        f"CONCURRENT_REQUESTS={args.scaling_concurrency} per worker "
        f"(ideal {ideal:g} pages/s/worker), Python site"
    )
    print(
        f"{'workers':>7} {'pages':>7} {'seconds':>8} {'pages/s':>8} {'efficiency':>10} "
        f"{'dup':>4} {'missing':>7}"
    )
    for row in rows:
        eff = row["efficiency"]
        print(
            f"{row['workers']:>7} {row['pages']:>7} {row['seconds']:>8.1f} "
            f"{row['pages_per_s']:>8.1f} {'-' if eff is None else f'{eff:.2f}':>10} "
            f"{row['duplicates']:>4} {_fmt(row['missing'], '{:d}'):>7}"
        )
    return rows


def run_stall(bench: Bench, args: argparse.Namespace, table: list[Run]) -> dict[str, Any]:
    """Issue 7: max stall of a 2-worker crawl, an idle worker's Redis calls per second."""
    two = [r for r in table if r.scheduler == "dist" and r.workers == 2 and r.rtt_ms == 0]
    if two:
        crawl = two[0]
        print(f"[stall] reusing the table's 2-worker scrapy_dist run ({crawl.pages} pages)")
    else:
        print(f"[stall] scrapy_dist, 2 workers, {args.pages} pages ...", flush=True)
        crawl = bench.crawl(Run("dist", 2, 0.0, args.pages, args.concurrency))
    result: dict[str, Any] = {
        "crawl": {
            "pages": crawl.pages,
            "workers": 2,
            "site": crawl.site,
            "max_stall_s": crawl.max_stall_s,
            "pages_per_s": crawl.pages_per_s,
            "duplicates": crawl.duplicates,
            "missing": crawl.missing,
        }
    }
    print(
        f"[idle] one scrapy_dist worker with nothing to do, {args.idle_seconds:g} s ...", flush=True
    )
    result["idle"] = idle_worker(bench, args.idle_seconds)
    idle = result["idle"]
    print()
    print("Issue 7 figures")
    print(
        f"  max stall, 2-worker crawl ({crawl.pages} pages): {crawl.max_stall_s:.3f} s "
        "(longest gap between fetches, all workers merged)"
    )
    print(
        f"  idle worker: {idle['commands_per_s']:.2f} Redis commands/s "
        f"({idle['commands']} in {idle['seconds']:g} s: {idle['by_command']}), "
        f"{idle['round_trips_per_s']:.2f} round trips/s at the client"
    )
    print(
        f"  seed pushed after the idle period: first fetch after "
        f"{_fmt(idle['first_fetch_s'], '{:.3f}')} s"
    )
    return result


def idle_worker(bench: Bench, seconds: float) -> dict[str, Any]:
    """Server-side commands of one idle worker over ``seconds``, then seed-to-fetch time."""
    pages = 200
    log_dir = bench.work / "idle"
    log_dir.mkdir(parents=True, exist_ok=True)
    site = bench.make_site(pages)
    workers: list[Worker] = []
    server = RedisServer()
    try:
        site.start()
        server.start()
        with server.client(socket_timeout=30) as client:
            workers = start_workers(
                1,
                project_dir=PROJECT,
                spider="dist",
                log_dir=log_dir,
                settings={
                    "REDIS_URL": server.url,
                    "MAX_IDLE_TIME_BEFORE_CLOSE": 0,
                    "CLOSE_WHEN_CRAWL_DONE": False,
                },
                stats_setting="BENCH_STATS_FILE",
            )
            wait_ready(workers, timeout=120)
            time.sleep(5)
            before_total = int(client.info("stats")["total_commands_processed"])
            before = command_calls(client)
            started = time.monotonic()
            time.sleep(seconds)
            after = command_calls(client)
            elapsed = time.monotonic() - started
            after_total = int(client.info("stats")["total_commands_processed"])
            # INFO commandstats (1 before, counted in "after") and INFO stats (1 after the
            # first snapshot) are ours; everything else is the worker's.
            delta = {
                name: n - before.get(name, 0)
                for name, n in after.items()
                if n - before.get(name, 0) > 0
            }
            delta["info"] = delta.get("info", 0) - 2
            delta = {name: n for name, n in delta.items() if n > 0}
            total = sum(delta.values())
            processed = after_total - before_total - 2
            pushed = time.time()
            client.lpush("dist:start_urls", f"{site.base_urls[0]}/page/0")
            first = None
            deadline = time.monotonic() + 30
            while first is None and time.monotonic() < deadline:
                hits = site.hits()
                if hits:
                    first = min(hit.time for hit in hits) - pushed
                time.sleep(0.01)
        stop_workers(workers, timeout=20)
        stats = final_stats(workers)[0]
    finally:
        stop_workers(workers, timeout=10)
        server.stop()
        _cleanup_site(site)
    round_trips = None
    if stats is not None:
        marks = stats["marks"]
        life = marks["close"]["time"] - marks["open"]["time"]
        round_trips = marks["close"]["round_trips"] / life if life > 0 else None
    return {
        "seconds": round(elapsed, 1),
        "commands": total,
        "commands_per_s": total / elapsed,
        "total_commands_processed_per_s": processed / elapsed,
        "by_command": delta,
        "round_trips_per_s": round_trips if round_trips is not None else float("nan"),
        "round_trips_note": "client-side, whole worker life (idle + the short crawl after)",
        "first_fetch_s": first,
    }


# -- output -------------------------------------------------------------------------------


def run_label(run: Run) -> str:
    """The scheduler's label in the tables, with the run's ``--variant`` name."""
    label = SCHEDULERS[run.scheduler][1]
    return f"{label} {run.variant}" if run.variant else label


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def print_table(runs: Sequence[Run]) -> None:
    header = (
        f"{'scheduler':<18} {'workers':>7} {'RTT ms':>13} {'pages/s':>8} {'ratio':>6} "
        f"{'RT/page':>8} {'wait ms/p':>9} {'cmd/page':>8} {'CPU ms/p':>8} {'Redis MB':>8} "
        f"{'dup':>4} {'missing':>7} {'stall s':>7}"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in runs:
        rtt = "-" if r.scheduler == "memory" else f"{r.rtt_ms:g} ({r.rtt_measured_ms or 0:.2f})"
        print(
            f"{run_label(r):<18} {r.workers:>7} {rtt:>13} "
            f"{r.pages_per_s:>8.0f}{'*' if r.capped else ' '}{_fmt(r.ratio, '{:.2f}'):>5} "
            f"{_fmt(r.round_trips_per_page, '{:.2f}'):>8} "
            f"{_fmt(r.wait_ms_per_page, '{:.2f}'):>9} "
            f"{_fmt(r.commands_per_page, '{:.1f}'):>8} "
            f"{_fmt(r.cpu_ms_per_page, '{:.2f}'):>8} {_fmt(r.redis_mb, '{:.1f}'):>8} "
            f"{r.duplicates:>4} {_fmt(r.missing, '{:d}'):>7} {r.max_stall_s:>7.3f}"
        )
    if any(r.capped for r in runs):
        print("* stopped at --run-timeout: rate over the pages fetched until then")
    print("RTT ms: injected (measured PING round trip through the proxy, or on loopback)")
    print_round_trip_kinds(runs)
    print_flush_waits(runs)


#: Worker stats that count the scheduler's round trips by kind, and their labels.
ROUND_TRIP_KINDS = {
    "scheduler/redis/round_trips/reserve": "reserve",
    "scheduler/redis/round_trips/flush": "flush",
    "scheduler/redis/round_trips/seeds": "seeds",
    "scheduler/held/full": "(held/full)",
    "scheduler/redis/round_trips/call": "other call",
    "scheduler/refill/timer": "(timer top-ups)",
    "control/reads/carried": "(control reads carried)",
}


def print_round_trip_kinds(runs: Sequence[Run]) -> None:
    """The scheduler's own round trips per page by kind, for the runs whose workers
    count them (the rest of RT/page: seeds, stats, heartbeats, standalone reads)."""
    lines = []
    for r in runs:
        totals: dict[str, float] = {}
        for s in r.worker_stats:
            for key, value in ((s or {}).get("stats") or {}).items():
                if key in ROUND_TRIP_KINDS:
                    totals[key] = totals.get(key, 0) + value
        if not totals or not r.distinct:
            continue
        parts = ", ".join(
            f"{label} {totals[key] / r.distinct:.3f}"
            for key, label in ROUND_TRIP_KINDS.items()
            if key in totals
        )
        lines.append(f"  {run_label(r)} w{r.workers} rtt {r.rtt_ms:g}: {parts}")
    if lines:
        print("Scheduler round trips per page by kind:")
        print("\n".join(lines))


def print_flush_waits(runs: Sequence[Run]) -> None:
    """For the runs whose workers sent flushes from the I/O thread
    (``SCHEDULER_BACKGROUND_FLUSH``): how many, how many the reactor waited for
    (``Trip.land`` with one in flight), and by which call (the workers' record)."""
    lines = []
    for r in runs:
        flushes = waited = 0
        causes: dict[str, list[float]] = {}
        for s in r.worker_stats:
            stats = (s or {}).get("stats") or {}
            flushes += stats.get("scheduler/redis/background_flushes", 0)
            waited += stats.get("scheduler/redis/flush_waited", 0)
            for cause, (n, seconds, arrived) in ((s or {}).get("flush_waited_by") or {}).items():
                entry = causes.setdefault(cause, [0, 0.0, 0])
                entry[0] += n
                entry[1] += seconds
                entry[2] += arrived
        if not flushes or not r.distinct:
            continue
        lines.append(
            f"  {run_label(r)} w{r.workers} rtt {r.rtt_ms:g}: {waited} of {flushes} waited for"
        )
        for cause, (n, seconds, arrived) in sorted(causes.items(), key=lambda kv: -kv[1][1]):
            lines.append(
                f"    {n:>5.0f} x, {seconds * 1000 / r.distinct:.3f} ms/page "
                f"({arrived:.0f} already answered): {cause}"
            )
    if lines:
        print("Flushes in flight waited for by the reactor (Trip.land), by cause:")
        print("\n".join(lines))


def print_targets(runs: Sequence[Run], scaling: Sequence[dict[str, Any]]) -> None:
    """The targets of issue 5, checked against this run's figures."""
    dist = [r for r in runs if r.scheduler == "dist"]
    checks = []
    for r in dist:
        where = f"{r.workers}w RTT {r.rtt_ms:g}"
        if r.round_trips_per_page is not None:
            checks.append(
                (
                    f"round trips/page <= 2 ({where})",
                    r.round_trips_per_page <= 2,
                    f"{r.round_trips_per_page:.2f}",
                )
            )
        if r.ratio is not None:
            floor = 0.95 if r.rtt_ms == 0 else 0.9
            checks.append((f"ratio >= {floor} ({where})", r.ratio >= floor, f"{r.ratio:.2f}"))
    for r in runs:
        if not r.capped and r.scheduler != "sredis":
            label = f"{run_label(r)} {r.workers}w RTT {r.rtt_ms:g}"
            ok = r.duplicates == 0 and r.missing == 0
            checks.append(
                (
                    f"no duplicate, none missing ({label})",
                    ok,
                    f"{r.duplicates} dup, {r.missing} missing",
                )
            )
    for row in scaling:
        if row["efficiency"] is not None and row["workers"] > 1:
            checks.append(
                (
                    f"scaling efficiency >= 0.9 ({row['workers']} workers)",
                    row["efficiency"] >= 0.9,
                    f"{row['efficiency']:.2f}",
                )
            )
    if not checks:
        return
    print()
    print("Targets (issue 5)")
    for name, ok, value in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {name}: {value}")


def _has_scrapy_redis() -> bool:
    try:
        import scrapy_redis  # noqa: F401
    except ImportError:
        return False
    return True


def machine() -> dict[str, Any]:
    def version(name: str) -> str | None:
        with contextlib.suppress(Exception):
            from importlib.metadata import version as dist_version

            return dist_version(name)
        return None

    return {
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "scrapy": scrapy.__version__,
        "redis_py": version("redis"),
        "hiredis": version("hiredis"),
        "scrapy_redis": version("scrapy-redis"),
        "scrapy_dist": version("scrapy-dist"),
        "note": "2 cores, shared, noisy; ratios from one run",
    }


def parse_assignment(text: str) -> tuple[str, str]:
    """``SETTING=VALUE`` -> the setting's name and value."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"not SETTING=VALUE: {text!r}")
    return key, value


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    """``NAME:SETTING=VALUE[,SETTING=VALUE...]`` (``--variant``) -> the name and settings."""
    name, _, assignments = text.partition(":")
    settings: dict[str, object] = dict(map(parse_assignment, filter(None, assignments.split(","))))
    if not name:
        raise argparse.ArgumentTypeError(f"a variant needs a name: {text!r}")
    return name, settings


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=None, help="site size (20000; --quick 1000)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small site, short idle")
    parser.add_argument("--scaling", action="store_true", help="only the I/O-bound scaling run")
    parser.add_argument("--stall", action="store_true", help="only the issue 7 stall/idle figures")
    parser.add_argument("--all", action="store_true", help="table, scaling and stall/idle")
    parser.add_argument("--schedulers", default="memory,dist,sredis", help="memory,dist,sredis")
    parser.add_argument("--workers", default="1,2", help="worker counts of the table (1,2)")
    parser.add_argument("--rtt", default="0,1", help="injected Redis round trips in ms (0,1)")
    parser.add_argument("--concurrency", type=int, default=16, help="CONCURRENT_REQUESTS (16)")
    parser.add_argument(
        "--run-timeout", type=float, default=None, help="seconds before a run is stopped (240)"
    )
    parser.add_argument(
        "--scaling-pages", type=int, default=None, help="pages per worker, scaling (1000)"
    )
    parser.add_argument(
        "--scaling-concurrency",
        type=int,
        default=SCALING_CONCURRENCY,
        help=f"CONCURRENT_REQUESTS per worker, scaling ({SCALING_CONCURRENCY})",
    )
    parser.add_argument(
        "--scaling-delay",
        type=float,
        default=SCALING_DELAY,
        help=f"seconds the site delays each page, scaling ({SCALING_DELAY:g})",
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=None, help="idle measurement (60; --quick 10)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        default=[],
        metavar="NAME:SETTING=VALUE[,SETTING=VALUE]",
        help="run scrapy_dist once per variant, with these worker settings (repeatable)",
    )
    parser.add_argument("--site", choices=("auto", "nginx", "python"), default="auto")
    parser.add_argument("--keep-logs", action="store_true", help="keep worker logs and sites")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (benchmarks/results/)")
    args = parser.parse_args(argv)
    args.pages = args.pages or (1000 if args.quick else 20000)
    args.scaling_pages = args.scaling_pages or (200 if args.quick else 1000)
    args.idle_seconds = args.idle_seconds or (10.0 if args.quick else 60.0)
    args.run_timeout = args.run_timeout or (90.0 if args.quick else 240.0)
    if args.all:
        args.table = args.scaling = args.stall = True
    else:
        args.table = not (args.scaling or args.stall)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / f"crawl-{stamp}.json"
    bench = Bench(args)
    result: dict[str, Any] = {
        "machine": machine(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    print(f"scrapy {scrapy.__version__}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
    runs: list[Run] = []
    scaling: list[dict[str, Any]] = []
    try:
        bench.measure_site(args.pages)
        result["site"] = bench.site_info
        if args.table:
            runs = run_table(bench, args)
            result["runs"] = [asdict(r) for r in runs]
        if args.scaling:
            scaling = run_scaling(bench, args)
            result["scaling"] = scaling
        if args.stall:
            result["stall"] = run_stall(bench, args, runs)
        print_targets(runs, scaling)
    except KeyboardInterrupt:
        print("\ninterrupted: everything started was stopped")
        return 130
    finally:
        bench.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwrote {out}")
    if args.keep_logs:
        print(f"logs kept in {bench.work}")
    with contextlib.suppress(Exception):
        print(f"load average at the end: {statistics.fmean(os.getloadavg()):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
