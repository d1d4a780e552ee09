"""Benchmark the dupefilter backends: memory, checks per second, round trips, local cache.

Run ``python benchmarks/bench_dupefilters.py`` (``--quick`` for a smaller run). It starts
its own throwaway ``redis-server`` (``scrapy_dist.testing.RedisServer``; never port
6379), prints three tables and writes them as JSON to
``benchmarks/results/dupefilters.json``.

1. **Memory**: Redis memory per fingerprint once 1M and 10M fingerprints are recorded,
   for the exact set, the bitmap Bloom filter at ``--error-rate`` sized for exactly that
   many, and RedisBloom when the server has it (``--redis-server`` can name a Redis 8
   binary). Measured as ``MEMORY USAGE`` of the filter's keys (what the allocator
   gave them) and as the growth of the server's ``used_memory`` (each row on a fresh
   server, warmed up with a filter of the same kind, so only the filter differs).
2. **Checks**: test-and-set calls per second on a filter holding 1M fingerprints (half
   the checks known, half new), and round trips per check counted on the client's
   socket, on loopback and through ``latency_proxy.py`` (``--rtt-ms``, Redis "on another
   host"). The baseline is scrapy-redis-bloomfilter's algorithm: one ``GETBIT`` round
   trip per hash to test, then one ``SETBIT`` per hash to add, not atomic.
3. **Local cache**: a site whose every page links to the same 10 navigation pages and to
   10 content pages, crawled breadth-first by 1 and 4 workers, each link handled as the
   scheduler does (``seen_locally`` -> enqueue script -> ``remember``): round trips to
   Redis and Redis CPU per page with and without ``DUPEFILTER_LOCAL_CACHE``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request
from scrapy.utils.test import get_crawler

from scrapy_dist.bloom import BloomParams, LocalBloom, fit_segments
from scrapy_dist.dupefilter import LOCAL_ERROR_SHARE, RFPDupeFilter
from scrapy_dist.filters import (
    BitmapBloomBackend,
    BucketsBackend,
    DupefilterBackend,
    RedisBloomBackend,
    SetBackend,
    has_redisbloom,
)
from scrapy_dist.filters.buckets import bits_for, bucket_index, stored
from scrapy_dist.keys import RedisKeys, bucket_key
from scrapy_dist.queue import FifoQueue
from scrapy_dist.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency_proxy import LatencyProxy, measure_rtt

RESULTS = Path(__file__).resolve().parent / "results" / "dupefilters.json"
CHUNK = 5_000


class CountingConnection(redis.Connection):
    """A connection that counts what it sends: one send per command or pipeline."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]  # redis-py: unannotated


def counting_client(port: int) -> redis.Redis:
    """A client counting its sends; ``close()`` closes its connections too."""
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=port, connection_class=CountingConnection, socket_timeout=60
    )
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def chunks(seed: int, count: int) -> Iterator[list[bytes]]:
    """``count`` random 20-byte fingerprints, ``CHUNK`` at a time, reproducible."""
    rng = random.Random(seed)
    for start in range(0, count, CHUNK):
        blob = rng.randbytes(20 * min(CHUNK, count - start))
        yield [blob[i : i + 20] for i in range(0, len(blob), 20)]


class NaiveBloom:
    """scrapy-redis-bloomfilter's algorithm: one round trip per bit, not atomic.

    ``request_seen`` reads the ``k`` bits with ``k`` ``GETBIT`` calls (all of them, as
    ``exists`` does) and, if one is 0, sets all ``k`` with ``k`` ``SETBIT`` calls. It
    uses the same offsets and key as an unsplit :class:`BitmapBloomBackend`, so both
    run on the same bits.
    """

    def __init__(self, client: redis.Redis, key: str, params: BloomParams) -> None:
        self.client = client
        self.key = key
        self.params = params

    def add(self, fingerprint: bytes) -> bool:
        offsets = self.params.offsets(fingerprint)
        exist = 1
        for offset in offsets:
            exist &= int(self.client.getbit(self.key, offset))
        if exist:
            return False
        for offset in offsets:
            self.client.setbit(self.key, offset, 1)
        return True


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def key_memory(client: redis.Redis, keys: list[str]) -> int:
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.memory_usage(key, samples=0)
        return sum(int(size or 0) for size in pipe.execute())


# --- 1. memory ----------------------------------------------------------------------


def fill_set(client: redis.Redis, key: str, count: int) -> None:
    with client.pipeline(transaction=False) as pipe:
        for chunk in chunks(1, count):
            for i in range(0, len(chunk), 1_000):
                pipe.sadd(key, *chunk[i : i + 1_000])
            pipe.execute()


def fill_backend(backend: DupefilterBackend, count: int) -> int:
    new = 0
    for chunk in chunks(1, count):
        new += sum(backend.add_many(chunk))
    return new


def warm_up(port: int, kind: str, count: int, error_rate: float) -> None:
    """Fill and delete a filter of ``count`` fingerprints of ``kind``."""
    client = counting_client(port)
    keys = RedisKeys.build("bench-warm-up")
    params = BloomParams.from_capacity(count, error_rate)
    backend: DupefilterBackend
    if kind == "set":
        backend = SetBackend(client, keys.dupefilter)
    elif kind.startswith("buckets"):
        backend = BucketsBackend(client, keys.dupefilter, capacity=count).open()
    elif kind == "bitmap":
        backend = BitmapBloomBackend(client, keys, params).open()
    else:
        backend = RedisBloomBackend(client, keys.dupefilter, params).open()
    fill_backend(backend, count)
    backend.clear()
    client.close()


def memory_row(
    binary: str | None, kind: str, count: int, *, error_rate: float
) -> dict[str, Any] | None:
    """Fill a fresh filter with ``count`` fingerprints; measure what Redis spends on it.

    Each row runs on a server of its own, so nothing another row left or freed counts.
    A filter of the same kind (up to 1M fingerprints) is filled and deleted first: the
    memory a server keeps once it has run many script calls (up to about 0.6 MB on Redis
    7.0, whatever the filter) is then not counted as the filter's. The filling client
    is closed and the script cache emptied (``SCRIPT FLUSH``) before measuring.
    """
    with RedisServer(binary=binary) as server:
        client = server.client()
        if kind == "redisbloom" and not has_redisbloom(client, "bench-probe"):
            return None
        keys = RedisKeys.build(f"bench-mem-{kind}")
        warm_up(server.port, kind, min(count, 1_000_000), error_rate)
        client.script_flush()
        before = used_memory(client)
        filler = counting_client(server.port)
        started = time.perf_counter()
        backend: DupefilterBackend
        if kind == "set":
            backend = SetBackend(filler, keys.dupefilter)
            fill_set(filler, keys.dupefilter, count)
        elif kind.startswith("buckets"):
            # "buckets-over": sized for a quarter of what it holds (4x past capacity)
            capacity = count // 4 if kind == "buckets-over" else count
            backend = BucketsBackend(filler, keys.dupefilter, capacity=capacity).open()
            fill_backend(backend, count)
        elif kind == "bitmap":
            params = fit_segments(BloomParams.from_capacity(count, error_rate))
            backend = BitmapBloomBackend(filler, keys, params).open()
            fill_backend(backend, count)
        else:
            params = BloomParams.from_capacity(count, error_rate)
            backend = RedisBloomBackend(filler, keys.dupefilter, params).open()
            fill_backend(backend, count)
        elapsed = time.perf_counter() - started
        state = backend.state()
        filler.close()
        client.script_flush()
        time.sleep(0.2)
        grown = used_memory(client) - before
        candidates = backend.keys()
        if isinstance(backend, BucketsBackend):
            candidates += backend.current_bucket_keys()
        owned = [key for key in candidates if client.exists(key)]
        usage = key_memory(client, owned)
        client.close()
    return {
        "backend": kind,
        "fingerprints": count,
        "recorded": state.count,
        "keys": len(owned),
        "bytes_per_fingerprint": round(grown / count, 3),
        "memory_usage_per_fingerprint": round(usage / count, 3),
        "fpr_estimate": state.fpr_estimate,
        "fill_per_second": round(count / elapsed),
    }


def exact_cpu_row(
    binary: str | None, kind: str, count: int, checks: int, *, capacity: int | None = None
) -> dict[str, Any]:
    """Redis CPU per test-and-set through the enqueue script, on a fresh server whose
    exact filter (``set`` or ``buckets``) holds ``count`` fingerprints: ``checks``
    fingerprints, half recorded and half new, in batches of 100 (``INFO cpu`` of the
    server before and after; the client's time is not counted)."""
    with RedisServer(binary=binary) as server:
        client = server.client()
        keys = RedisKeys.build(f"bench-cpu-{kind}")
        backend: DupefilterBackend
        if kind == "set":
            backend = SetBackend(client, keys.dupefilter)
            fill_set(client, keys.dupefilter, count)
        else:
            backend = BucketsBackend(client, keys.dupefilter, capacity=capacity or count).open()
            fill_backend(backend, count)
        known = [fp for chunk in chunks(1, checks // 2) for fp in chunk]
        fresh = [fp for chunk in chunks(99, checks - len(known)) for fp in chunk]
        workload = [fp for pair in zip(known, fresh, strict=False) for fp in pair]
        queue = FifoQueue(client, keys.requests, keys.seq)
        cpu = client.info("cpu")
        before = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
        started = time.perf_counter()
        for i in range(0, len(workload), 100):
            batch = workload[i : i + 100]
            queue.push([(b"p", 0.0, fp) for fp in batch], backend)
        elapsed = time.perf_counter() - started
        cpu = client.info("cpu")
        after = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
        client.close()
    return {
        "backend": kind if capacity is None else f"{kind} (sized for {capacity:,})",
        "fingerprints": count,
        "redis_cpu_us_per_check": round((after - before) / len(workload) * 1e6, 2),
        "checks_per_second": round(len(workload) / elapsed),
    }


def layout_row(
    binary: str | None, layout: str, count: int, capacity: int | None = None
) -> dict[str, Any]:
    """Memory of the buckets' layout written directly (pipelined, no script): ``list``
    (what the backend does: ``RPUSH``) or ``hash`` (``HSET`` field = the stored bytes,
    value = ""), at the bits the backend would use for ``capacity`` (default ``count``):
    why lists."""
    bits = bits_for(capacity or count)
    with RedisServer(binary=binary) as server:
        client = server.client()
        before = used_memory(client)
        with client.pipeline(transaction=False) as pipe:
            for chunk in chunks(1, count):
                for fp in chunk:
                    key = bucket_key("bench:df", "1", bucket_index(fp, bits))
                    if layout == "list":
                        pipe.rpush(key, stored(fp, bits))
                    else:
                        pipe.hset(key, stored(fp, bits), b"")
                pipe.execute()
        time.sleep(0.2)
        grown = used_memory(client) - before
        encodings = {
            client.object("encoding", bucket_key("bench:df", "1", i)) for i in range(0, 2**bits, 97)
        }
        client.close()
    return {
        "backend": f"{layout} buckets, raw" + (f", sized for {capacity:,}" if capacity else ""),
        "fingerprints": count,
        "keys": 2**bits,
        "bytes_per_fingerprint": round(grown / count, 3),
        "encodings": ",".join(sorted(str(e, "ascii") for e in encodings if e)),
    }


def run_exact(binary: str | None, sizes: list[int], checks: int) -> dict[str, Any]:
    """Memory and Redis CPU of the two exact backends, and their ratios (one run).

    Memory at every size (``buckets-over``, 4x past its capacity, at the smallest); CPU
    at the smallest size (filling 10M through the script three more times would take
    longer than the memory rows together).
    """
    memory, cpu = [], []
    for count in sizes:
        for kind in ("set", "buckets", "buckets-over")[: 3 if count == sizes[0] else 2]:
            row = memory_row(binary, kind, count, error_rate=0.001)  # (unused: exact)
            if row is not None:
                memory.append(row)
                print(table([row], MEMORY_COLUMNS), flush=True)
    size = sizes[0]
    for layout, capacity in (
        ("list", None),
        ("hash", None),
        ("list", size // 4),
        ("hash", size // 4),
    ):
        row = layout_row(binary, layout, size, capacity)
        memory.append(row)
        print(
            table(
                [row],
                [*MEMORY_COLUMNS[:1], "fingerprints", "keys", "bytes_per_fingerprint", "encodings"],
            ),
            flush=True,
        )
    for kind, capacity in (("set", None), ("buckets", None), ("buckets", size // 4)):
        row = exact_cpu_row(binary, kind, size, checks, capacity=capacity)
        cpu.append(row)
        print(table([row], EXACT_CPU_COLUMNS), flush=True)
    ratios = {}
    for count in sizes:
        rows = {row["backend"]: row for row in memory if row["fingerprints"] == count}
        if "set" in rows and "buckets" in rows:
            ratios[f"buckets/set bytes at {count}"] = round(
                rows["buckets"]["bytes_per_fingerprint"] / rows["set"]["bytes_per_fingerprint"], 3
            )
    if len(cpu) >= 2:
        ratios["buckets/set redis cpu per check"] = round(
            cpu[1]["redis_cpu_us_per_check"] / cpu[0]["redis_cpu_us_per_check"], 2
        )
        ratios["buckets 4x past capacity / buckets cpu"] = round(
            cpu[2]["redis_cpu_us_per_check"] / cpu[1]["redis_cpu_us_per_check"], 2
        )
    return {"memory": memory, "cpu": cpu, "ratios": ratios}


EXACT_CPU_COLUMNS = ["backend", "fingerprints", "redis_cpu_us_per_check", "checks_per_second"]


# --- 2. checks ----------------------------------------------------------------------


def time_checks(
    add: Callable[[bytes], bool], workload: list[bytes], batch: Callable[..., Any] | None = None
) -> tuple[float, float]:
    """Run the workload; return (checks per second, round trips per check)."""
    sends = CountingConnection.sends
    started = time.perf_counter()
    if batch is None:
        for fp in workload:
            add(fp)
    else:
        for i in range(0, len(workload), 100):
            batch(workload[i : i + 100])
    elapsed = time.perf_counter() - started
    return len(workload) / elapsed, (CountingConnection.sends - sends) / len(workload)


def check_rows(
    port: int, *, error_rate: float, checks: int, naive_checks: int, redisbloom: bool, seed: int
) -> list[dict[str, Any]]:
    """Checks per second on filters holding 1M fingerprints, from a client on ``port``.

    The filters are filled on first use and kept (a later call, e.g. through the latency
    proxy, reuses them); ``seed`` picks the new fingerprints of the workload.
    """
    client = counting_client(port)
    count = 1_000_000
    params = BloomParams.from_capacity(count, error_rate)
    keys = RedisKeys.build("bench-checks")
    set_key = f"{keys.dupefilter}:set"
    backends: dict[str, DupefilterBackend] = {
        "set": SetBackend(client, set_key),
        "bitmap": BitmapBloomBackend(client, keys, params).open(),
    }
    if redisbloom:
        backends["redisbloom"] = RedisBloomBackend(client, f"{keys.dupefilter}:bf", params).open()
    for name, backend in backends.items():
        if backend.state().count < count:
            if name == "set":
                fill_set(client, set_key, count)
            else:
                fill_backend(backend, count)
    known = [fp for chunk in chunks(1, checks + naive_checks) for fp in chunk]
    fresh = [fp for chunk in chunks(seed, checks + naive_checks) for fp in chunk]
    half = checks // 2
    workloads = {
        "one call per check": known[:half] + fresh[:half],
        "100 per call": known[half:checks] + fresh[half:checks],
    }
    for workload in workloads.values():
        random.Random(seed).shuffle(workload)
    rows = []
    for name, backend in backends.items():
        for mode, workload in workloads.items():
            batch = backend.add_many if mode == "100 per call" else None
            rate, trips = time_checks(backend.add, workload, batch)
            rows.append(
                {
                    "backend": name,
                    "mode": mode,
                    "checks_per_second": round(rate),
                    "round_trips_per_check": round(trips, 3),
                }
            )
    naive = NaiveBloom(client, keys.bloom_segment(0, 0), params)
    extra = naive_checks // 2
    naive_workload = known[checks : checks + extra] + fresh[checks : checks + extra]
    random.Random(seed).shuffle(naive_workload)
    rate, trips = time_checks(naive.add, naive_workload)
    rows.append(
        {
            "backend": "naive bitmap (1 round trip per bit)",
            "mode": "one call per check",
            "checks_per_second": round(rate),
            "round_trips_per_check": round(trips, 2),
        }
    )
    client.close()
    return rows


# --- 3. local cache -----------------------------------------------------------------


def site_links(pages: int, seed: int = 6) -> list[list[int]]:
    """Page -> linked pages: the 10 navigation pages, then 10 content pages."""
    rng = random.Random(seed)
    return [list(range(10)) + [rng.randrange(10, pages) for _ in range(10)] for _ in range(pages)]


def crawl_site(
    port: int, pages: int, workers: int, *, local: bool, remember_filtered: bool, batched: bool
) -> dict[str, Any]:
    """Crawl the site breadth-first with ``workers`` dupefilters sharing one bitmap."""
    client = counting_client(port)
    name = f"bench-site-{workers}-{int(local)}-{int(remember_filtered)}-{int(batched)}"
    keys = RedisKeys.build(name)
    params = fit_segments(BloomParams.from_capacity(1_000_000, 0.001))
    fingerprinter = get_crawler().request_fingerprinter
    filters = []
    for _ in range(workers):
        cache = None
        if local:
            cache = LocalBloom(BloomParams.from_capacity(100_000, 0.001 * LOCAL_ERROR_SHARE))
        backend = BitmapBloomBackend(client, keys, params).open()
        filters.append(RFPDupeFilter(backend, fingerprinter, local=cache))
    for dupefilter in filters:
        dupefilter.open()
    queue = FifoQueue(client, keys.requests, keys.seq)
    links = site_links(pages)
    requests = [Request(f"https://site.example/page/{i}") for i in range(pages)]
    payload = b"x" * 300  # about a serialized request
    frontier = [0]
    seen = {0}
    crawled = local_hits = 0
    sends = CountingConnection.sends
    usec = int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))
    started = time.perf_counter()
    while frontier:
        page = frontier.pop(0)
        dupefilter = filters[crawled % workers]
        crawled += 1
        outgoing = []
        for target in links[page]:
            fp = dupefilter.fingerprint(requests[target])
            if dupefilter.seen_locally(fp):
                local_hits += 1
                continue
            outgoing.append((target, fp))
        groups = [outgoing] if batched else [[item] for item in outgoing]
        for group in groups:
            if not group:
                continue
            flags = queue.push([(payload, 0.0, fp) for _, fp in group], dupefilter.backend)
            for (target, fp), queued in zip(group, flags, strict=True):
                if queued or remember_filtered:
                    dupefilter.remember(fp)
                if queued and target not in seen:
                    seen.add(target)
                    frontier.append(target)
    elapsed = time.perf_counter() - started
    trips = CountingConnection.sends - sends
    cpu = int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0)) - usec
    filters[0].backend.clear()
    queue.clear()
    client.delete(keys.seq)
    client.close()
    return {
        "workers": workers,
        "local_cache": local,
        "remember_filtered": remember_filtered,
        "one_call_per_page": batched,
        "pages": crawled,
        "round_trips_per_page": round(trips / crawled, 2),
        "redis_cpu_us_per_page": round(cpu / crawled, 1),
        "local_hits_per_page": round(local_hits / crawled, 2),
        "us_per_page": round(elapsed / crawled * 1e6),
    }


def run_checks(port: int, args: argparse.Namespace, redisbloom: bool) -> list[dict[str, Any]]:
    """The checks table: on loopback, then through the latency proxy."""
    rows = [
        {**row, "rtt": "loopback"}
        for row in check_rows(
            port,
            error_rate=args.error_rate,
            checks=args.checks,
            naive_checks=args.naive_checks,
            redisbloom=redisbloom,
            seed=10,
        )
    ]
    if args.rtt_ms > 0:
        with LatencyProxy(port, args.rtt_ms / 1000) as proxy:
            label = f"{measure_rtt(proxy.port) * 1000:.2f} ms"
            rows += [
                {**row, "rtt": label}
                for row in check_rows(
                    proxy.port,
                    error_rate=args.error_rate,
                    checks=max(200, args.checks // 20),
                    naive_checks=max(40, args.naive_checks // 20),
                    redisbloom=redisbloom,
                    seed=11,
                )
            ]
    return rows


def run_site(port: int, pages: int) -> list[dict[str, Any]]:
    """The local-cache table: 1 and 4 workers, cache off / on / on remembering filtered."""
    rows = []
    for workers in (1, 4):
        for local, remember_filtered in ((False, False), (True, False), (True, True)):
            for batched in (False, True):
                rows.append(
                    crawl_site(
                        port,
                        pages,
                        workers,
                        local=local,
                        remember_filtered=remember_filtered,
                        batched=batched,
                    )
                )
    return rows


# --- report -------------------------------------------------------------------------


MEMORY_COLUMNS = [
    "backend",
    "fingerprints",
    "memory_usage_per_fingerprint",
    "bytes_per_fingerprint",
    "keys",
    "fill_per_second",
]
CHECK_COLUMNS = ["rtt", "backend", "mode", "checks_per_second", "round_trips_per_check"]
SITE_COLUMNS = [
    "workers",
    "local_cache",
    "remember_filtered",
    "one_call_per_page",
    "round_trips_per_page",
    "redis_cpu_us_per_page",
    "local_hits_per_page",
    "us_per_page",
]


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    if not rows:
        return "(not run)"
    widths = [max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += [
        "  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True))
        for r in rows
    ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000", help="fingerprints, comma-separated")
    parser.add_argument("--error-rate", type=float, default=0.001)
    parser.add_argument("--checks", type=int, default=20_000)
    parser.add_argument("--naive-checks", type=int, default=2_000)
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="0 to skip the proxy runs")
    parser.add_argument("--pages", type=int, default=2_000)
    parser.add_argument("--redis-server", default=None, help="redis-server binary to run")
    parser.add_argument("--quick", action="store_true", help="sizes 100k,1M; fewer checks")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--sections",
        default="memory,checks,site",
        help="which parts to run (comma-separated; 'exact': set vs buckets, memory and CPU)",
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.checks, args.naive_checks, args.pages = "100000,1000000", 4_000, 400, 500
    sizes = [int(size) for size in args.sizes.split(",")]
    results: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "error_rate": args.error_rate,
    }
    with RedisServer(binary=args.redis_server) as server:
        client = server.client()
        version = client.info("server")["redis_version"]
        allocator = client.info("memory").get("mem_allocator", "?")
        results["redis"] = f"{version} ({allocator})"
        redisbloom = has_redisbloom(client, "bench-probe")
        results["redisbloom"] = redisbloom
        print(f"redis {results['redis']}; RedisBloom: {'yes' if redisbloom else 'no'}")

        sections = set(args.sections.split(","))
        if "exact" in sections:
            results["exact"] = run_exact(args.redis_server, sizes, args.checks)
            print(json.dumps(results["exact"]["ratios"], indent=2), flush=True)
        memory = []
        for count in sizes if "memory" in sections else []:
            for kind in ("set", "bitmap", "redisbloom"):
                row = memory_row(args.redis_server, kind, count, error_rate=args.error_rate)
                if row is not None:
                    memory.append(row)
        results["memory"] = memory
        print(table(memory, MEMORY_COLUMNS), end="\n\n", flush=True)

        checks = []
        if "checks" in sections:
            checks = run_checks(server.port, args, redisbloom)
        results["checks"] = checks
        print(table(checks, CHECK_COLUMNS), end="\n\n", flush=True)

        site = run_site(server.port, args.pages) if "site" in sections else []
        results["local_cache"] = site
        print(table(site, SITE_COLUMNS), end="\n\n", flush=True)
        client.close()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
