"""What the frontier costs the Redis server: memory per queued request and per lease, and
CPU, commands and round trips per crawled page, split by script (issue 15).

Each figure is taken twice in one run, with the request encoding of before issue 15 (every
attribute, long names: ``benchproject.legacy.LongFormSerializer``) and with today's compact
one (the default ``SCHEDULER_SERIALIZER = "json"``), and given as a ratio.

Usage::

    python benchmarks/bench_server.py                   # memory, then the two crawls
    python benchmarks/bench_server.py --memory-only     # memory only (seconds)
    python benchmarks/bench_server.py --pages 10000 --entries 10000
    python benchmarks/bench_server.py --encodings after --out after.json   # compact only
    python benchmarks/bench_server.py --compare before.json after.json      # two runs

**Memory** (``--entries`` N, default 10,000): N distinct requests for 67-character URLs
(``Request(url, callback=spider.parse)``, and the same with ``meta={"depth": 3}`` as the
crawl's links carry) pushed through each queue class's own enqueue script into a fresh
key; ``MEMORY USAGE key SAMPLES 0`` / N. Then every entry of the priority queue is leased
with ``lua/reserve.lua`` (one worker, batches of 500) and the lease keys (the holders
zset of deadlines, the worker's holding hash, the delivery counts hash) are measured the
same way.

**Crawl** (``--pages``, default 10,000): one ``scrapy crawl dist`` worker over the
benchmark site (``bench_crawl.Bench``), once per encoding, with ``SLOWLOG`` recording
every command (``slowlog-log-slower-than 0``): the time of each ``EVALSHA`` is grouped by
script; ``INFO cpu`` (``used_cpu_sys + used_cpu_user``) gives the server's whole CPU,
and the same less what the server uses idle over as long (measured for ``IDLE_SECONDS``
before the crawl: its timer, which a faster crawl spreads over more pages) its marginal
CPU per page;
``INFO commandstats`` the commands it ran (inside scripts included). Recording every
command costs the server ~1 µs per top-level command: included in the CPU figures, on
both sides.

Writes ``benchmarks/results/server-<timestamp>.json``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_crawl import Bench, Run, on_sigterm, parse_assignment
from bench_crawl import parse_args as crawl_args
from scrapy import Request, Spider

from scrapy_dist.frontier.wire import FROM_QUEUE
from scrapy_dist.lua_source import NAMES, source
from scrapy_dist.queue import FifoQueue, LifoQueue, PriorityQueue, RedisQueue
from scrapy_dist.scripts import scripts_for
from scrapy_dist.serializers import JsonSerializer, RequestCodec
from scrapy_dist.slot_queue import SlotQueue
from scrapy_dist.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Sequence

    import redis

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR / "project"))

#: The encoding before issue 15 (benchmarks/project/benchproject/legacy.py).
LongFormSerializer: Any = importlib.import_module("benchproject.legacy").LongFormSerializer

RESULTS = BENCH_DIR / "results"
LEGACY = "benchproject.legacy.LongFormSerializer"
#: Encoding label -> the serializer a worker is told to use.
ENCODINGS = {"before": LEGACY, "after": "json"}
QUEUES: dict[str, type[RedisQueue]] = {
    "priority": PriorityQueue,
    "fifo": FifoQueue,
    "lifo": LifoQueue,
    "slots": SlotQueue,
}
BATCH = 500
#: Seconds the server's CPU is measured idle before each crawl, for the marginal figure.
IDLE_SECONDS = 5.0


def url67(i: int) -> str:
    """A distinct 67-character URL."""
    url = f"https://www.example.com/catalogue/category/books/page-{i:08d}.html"
    assert len(url) == 67
    return url


class BenchSpider(Spider):
    name = "bench"

    def parse(self, response: Any) -> None: ...


def _serializer(label: str) -> JsonSerializer:
    return LongFormSerializer() if label == "before" else JsonSerializer()


# -- memory --------------------------------------------------------------------------


def memory(entries: int) -> dict[str, Any]:
    """Bytes per queued request (each queue class) and per lease, both encodings."""
    server = RedisServer().start()
    result: dict[str, Any] = {}
    try:
        client = server.client()
        spider = BenchSpider()
        for label in ENCODINGS:
            codec = RequestCodec(_serializer(label), spider)
            for variant, meta in (("link", None), ("link+depth", {"depth": 3})):
                requests = [
                    Request(url67(i), callback=spider.parse, meta=meta) for i in range(entries)
                ]
                payloads = [codec.encode(r) for r in requests]
                row: dict[str, Any] = {"payload_bytes": sum(map(len, payloads)) / entries}
                for name, cls in QUEUES.items():
                    key = f"m:{label}:{variant}:{name}"
                    queue = cls(client, key, f"{key}:seq")
                    for start in range(0, entries, BATCH):
                        chunk = range(start, min(start + BATCH, entries))
                        queue.push([(payloads[i], queue.score(requests[i]), b"") for i in chunk])
                    assert len(queue) == entries
                    sizes = queue_key_sizes(client, key)
                    row[name] = sum(sizes.values()) / entries
                    largest = max(sizes, key=lambda k: sizes[k])
                    row[f"{name}_encoding"] = client.object("encoding", largest).decode()
                    if name in ("priority", "slots"):
                        by_key = lease_bytes(client, queue, key, entries)
                        suffix = "" if name == "priority" else f"_{name}"
                        row[f"lease{suffix}"] = sum(by_key.values())
                        if not suffix:
                            row.update({f"lease_{k}": v for k, v in by_key.items()})
                    client.unlink(key, f"{key}:seq", *sizes)
                result.setdefault(label, {})[variant] = row
        client.close()
    finally:
        server.stop()
    for variant in result["after"]:
        before, after = result["before"][variant], result["after"][variant]
        result.setdefault("ratio", {})[variant] = {
            k: after[k] / before[k] if before[k] else 1.0
            for k in after
            if isinstance(after[k], float)
        }
    return result


def queue_key_sizes(client: redis.Redis, key: str) -> dict[str, int]:
    """``MEMORY USAGE`` of every key a queue ``key`` occupies: the key itself and the keys
    named after it (a priority queue's levels and their index), its sequence counter
    aside; whatever the version of the package that wrote them."""
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", key) + "*"
    names = {key, *(k.decode() for k in client.scan_iter(match=pattern, count=1000))}
    names.discard(f"{key}:seq")
    return {name: client.memory_usage(name, samples=0) or 0 for name in names}


def lease_bytes(client: redis.Redis, queue: RedisQueue, key: str, entries: int) -> dict[str, float]:
    """Lease every entry of ``queue`` to one worker; bytes per lease of each lease key."""
    keys = {
        "holders": f"{key}:holders",
        "holding": f"{key}:holders:w1",
        "deliveries": f"{key}:deliveries",
    }
    scripts = scripts_for(client)
    leased = 0
    while leased < entries:
        reply = scripts.reserve(
            **keys,
            previous=(f"{key}:leases", f"{key}:leased"),
            dead=f"{key}:dead",
            queue=key,
            seeds=f"{key}:seeds",
            seq=f"{key}:seq",
            progress=f"{key}:progress",
            epoch_key=f"{key}:epoch",
            origin=FROM_QUEUE,
            take=queue.take,
            queue_put_back=queue.put_back,
            seeds_put_back="lpush",
            count=BATCH,
            duration=3600,
            worker="w1",
            max_deliveries=5,
            reclaim_limit=100,
            epoch="",
            take_args=queue.take_args(),
        ).run()
        got = len(reply) // 3
        if got == 0:
            raise RuntimeError(f"reserve leased nothing after {leased} of {entries}")
        leased += got
    sizes = {name: (client.memory_usage(k, samples=0) or 0) / entries for name, k in keys.items()}
    client.unlink(*keys.values())
    return sizes


# -- server CPU per crawled page --------------------------------------------------------


def script_names() -> dict[str, str]:
    """SHA1 -> script name, as ``EVALSHA`` names them."""
    return {hashlib.sha1(source(name).encode()).hexdigest(): name for name in NAMES}


#: The slow log's form of an argument it cut: its first 128 bytes, then this.
_CUT = re.compile(rb"\.\.\. \((\d+) more bytes\)")


def eval_name(text: bytes) -> str:
    """The name of the script an ``EVAL`` in the slow log runs (``text``: the logged
    command after ``EVAL``). The log keeps 128 bytes of an argument and says how many
    more there were, and every script starts alike: a script is known by its length
    (no two have the same)."""
    cut = _CUT.search(text)
    size = 128 + int(cut.group(1)) if cut else len(text)
    for name in NAMES:
        if len(source(name).encode()) == size:
            return name
    return hashlib.sha1(text).hexdigest()[:8]


class ServerCost:
    """The ``bench_crawl`` probe: the server's CPU over the crawl and, with ``slowlog``,
    every command it ran (``SLOWLOG`` at threshold 0) for the split by script.

    A command a script runs is logged by ``SLOWLOG`` too, from client ``?:0``, just
    before the script's own entry: that is how the commands inside each script are
    attributed to it.
    """

    def __init__(self, slowlog: bool, idle_seconds: float = IDLE_SECONDS) -> None:
        self.slowlog = slowlog
        self.idle_seconds = idle_seconds
        #: The server's CPU seconds per second while no worker runs (its timer, the
        #: probe's client), measured by :meth:`before`.
        self.idle_rate = 0.0
        self.cpu0 = 0.0
        self.started = 0.0

    @staticmethod
    def cpu(client: redis.Redis) -> float:
        info = client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def before(self, client: redis.Redis) -> None:
        if self.idle_seconds > 0:
            cpu0, wall0 = self.cpu(client), time.monotonic()
            time.sleep(self.idle_seconds)
            self.idle_rate = (self.cpu(client) - cpu0) / (time.monotonic() - wall0)
        if self.slowlog:
            client.config_set("slowlog-max-len", 5_000_000)
            client.config_set("slowlog-log-slower-than", 0)
            client.slowlog_reset()
        self.cpu0 = self.cpu(client)
        self.started = time.monotonic()

    def after(self, client: redis.Redis) -> dict[str, Any]:
        cpu = self.cpu(client) - self.cpu0
        wall = time.monotonic() - self.started
        result: dict[str, Any] = {
            "cpu_seconds": cpu,
            "wall_seconds": wall,
            "idle_cpu_seconds": self.idle_rate * wall,
        }
        if not self.slowlog:
            return result
        entries = client.slowlog_get(-1)
        client.config_set("slowlog-log-slower-than", 10_000)
        client.slowlog_reset()
        names = script_names()
        top: dict[str, dict[str, int]] = {}
        inside: dict[str, dict[str, dict[str, int]]] = {}
        pending: list[tuple[str, int]] = []
        for entry in sorted(entries, key=lambda e: int(e["id"])):
            words = entry["command"].split(b" ", 2)
            command = words[0].decode().lower()
            duration = int(entry["duration"])
            if entry["client_address"] == b"?:0":  # run by a script
                pending.append((command, duration))
                continue
            if command in ("evalsha", "eval") and len(words) > 1:
                if command == "eval":
                    name = "script:" + eval_name(entry["command"][5:])
                else:
                    sha = words[1].decode()
                    name = "script:" + names.get(sha, sha[:8])
                rows = inside.setdefault(name, {})
                for inner, usec in pending:
                    row = rows.setdefault(inner, {"calls": 0, "usec": 0})
                    row["calls"] += 1
                    row["usec"] += usec
            else:
                name = command
            pending = []
            if name in ("slowlog", "info", "config"):
                continue  # this probe's, and bench_crawl's own
            row = top.setdefault(name, {"calls": 0, "usec": 0})
            row["calls"] += 1
            row["usec"] += duration
        result.update({"top_level": top, "inside_scripts": inside, "slowlog_entries": len(entries)})
        return result


def crawl(
    pages: int,
    run_timeout: float,
    encodings: Sequence[str] = tuple(ENCODINGS),
    settings: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One worker crawling ``pages`` pages, per encoding, twice: once for the server's
    CPU (nothing recorded), once with every command recorded for the split by script.
    ``settings`` are the worker's own on top (``--set``)."""
    args = crawl_args(["--pages", str(pages), "--run-timeout", str(run_timeout)])
    bench = Bench(args)
    result: dict[str, Any] = {}
    try:
        for label in encodings:
            serializer = ENCODINGS[label]
            runs = []
            for slowlog in (False, True):
                what = "split by script (SLOWLOG)" if slowlog else "CPU"
                print(f"[crawl] 1 worker, {pages} pages, encoding {label}: {what} ...", flush=True)
                run = Run("dist", 1, 0.0, pages, args.concurrency)
                run.settings = {"SCHEDULER_SERIALIZER": serializer, **(settings or {})}
                bench.crawl(run, probe=ServerCost(slowlog))
                print(
                    f"    {run.pages_per_s:,.0f} pages/s, {run.distinct} pages, "
                    f"missing {run.missing}, dup {run.duplicates}; Redis CPU "
                    f"{run.server['cpu_seconds'] * 1e6 / max(run.distinct, 1):.1f} µs/page",
                    flush=True,
                )
                runs.append(run)
            result[label] = summarize(*runs)
    finally:
        bench.close()
    return result


def summarize(plain: Run, logged: Run) -> dict[str, Any]:
    pages = max(plain.distinct, 1)
    lpages = max(logged.distinct, 1)
    server = logged.server
    scripts = {
        name: {
            "calls_per_page": row["calls"] / lpages,
            "us_per_call": row["usec"] / row["calls"],
            "us_per_page": row["usec"] / lpages,
            "inside": {
                inner: {
                    "calls_per_call": r["calls"] / row["calls"],
                    "us_per_call": r["usec"] / r["calls"],
                    "us_per_page": r["usec"] / lpages,
                }
                for inner, r in sorted(
                    server["inside_scripts"].get(name, {}).items(), key=lambda kv: -kv[1]["usec"]
                )
            },
        }
        for name, row in sorted(server["top_level"].items(), key=lambda kv: -kv[1]["usec"])
    }
    return {
        "pages": plain.distinct,
        "pages_per_s": plain.pages_per_s,
        "missing": plain.missing,
        "duplicates": plain.duplicates,
        "cpu_us_per_page": plain.server["cpu_seconds"] * 1e6 / pages,
        # what the crawl added to an idle server's CPU (its timer runs at any rate): the
        # cost per page that sets how many pages/s one core serves
        "cpu_us_per_page_marginal": (
            plain.server["cpu_seconds"] - plain.server.get("idle_cpu_seconds", 0.0)
        )
        * 1e6
        / pages,
        "cpu_us_per_page_recorded": server["cpu_seconds"] * 1e6 / lpages,
        "command_us_per_page": sum(r["usec"] for r in server["top_level"].values()) / lpages,
        "commands_per_page": plain.commands_per_page,
        "round_trips_per_page": plain.round_trips_per_page,
        "redis_mb": plain.redis_mb,
        "by_command": scripts,
        "logged_run": {
            "pages": logged.distinct,
            "missing": logged.missing,
            "dup": logged.duplicates,
        },
    }


# -- cost of one script call, by batch size ---------------------------------------------


def script_calls(counts: Sequence[int] = (0, 1, 5, 20), calls: int = 300) -> dict[str, Any]:
    """Server time of ``reserve`` and ``settle`` calls by the number of leases each
    handles, on a priority queue of 20,000 compact entries: ``µs/call`` (``INFO
    commandstats``, the script with what it runs), ``inner`` (the commands it ran, as
    ``commandstats`` times them) and the server's CPU per call (``INFO cpu``: round trip
    and event loop included). The difference between ``µs/call`` and ``inner`` is the
    script's own cost, mostly the price of each ``redis.call``."""
    server = RedisServer().start()
    rows: dict[str, Any] = {}
    try:
        client = server.client()
        spider = BenchSpider()
        codec = RequestCodec(JsonSerializer(), spider)
        queue = PriorityQueue(client, "c:q", "c:seq")
        for start in range(0, 20_000, BATCH):
            queue.push(
                [
                    (codec.encode(Request(url67(i), callback=spider.parse)), 0.0, b"")
                    for i in range(start, start + BATCH)
                ]
            )
        client.set("c:epoch", "E")
        keys = {
            "holding": "c:holders:w1",
            "deliveries": "c:deliveries",
            "dead": "c:dead",
            "queue": "c:q",
            "seeds": "c:seeds",
            "progress": "c:progress",
            "epoch_key": "c:epoch",
        }
        scripts = scripts_for(client)
        trivial = client.register_script("return 1")
        rows["trivial"] = _measure(client, trivial, calls)
        for count in counts:
            ids: list[bytes] = []

            def reserve(count: int = count, ids: list[bytes] = ids) -> None:
                reply = scripts.reserve(
                    **keys,
                    holders="c:holders",
                    previous=("c:leases", "c:leased"),
                    seq="c:seq",
                    origin=FROM_QUEUE,
                    take=queue.take,
                    queue_put_back=queue.put_back,
                    seeds_put_back="lpush",
                    count=count,
                    duration=3600,
                    worker="w1",
                    max_deliveries=5,
                    reclaim_limit=100,
                    epoch="E",
                ).run()
                ids += reply[0::3]

            rows[f"reserve {count}"] = _measure(client, reserve, calls, count)
            if not count:
                continue
            batches = [ids[i : i + count] for i in range(0, len(ids), count)]

            def settle(batches: list[list[bytes]] = batches) -> None:
                batch = batches.pop()
                scripts.settle(
                    **{k: v for k, v in keys.items()},
                    worker="w1",
                    queue_put_back=queue.put_back,
                    seeds_put_back="lpush",
                    max_deliveries=5,
                    epoch="E",
                    outcomes=[(i.decode(), "") for i in batch],
                ).run()

            rows[f"settle {count}"] = _measure(client, settle, len(batches), count)
        for links in (1, 20):
            enqueue_calls = [0]

            def enqueue(links: int = links, done: list[int] = enqueue_calls) -> None:
                # ``links`` new links per call, each a distinct URL, into the priority
                # queue with the exact set filter (the crawl's defaults)
                first = 100_000 + done[0] * links
                done[0] += 1
                entries = [
                    (
                        hashlib.sha1(url67(i).encode()).digest(),
                        0.0,
                        codec.encode(Request(url67(i), callback=spider.parse)),
                    )
                    for i in range(first, first + links)
                ]
                scripts.enqueue(
                    queue="c:q",
                    seq="c:seq",
                    epoch_key="c:epoch",
                    queue_kind=queue.kind,
                    filter_kind="set",
                    filter_keys=["c:fp"],
                    filter_args=[0],
                    entries=entries,
                    epoch="E",
                ).run()

            rows[f"enqueue {links}"] = _measure(client, enqueue, calls, links)
        client.close()
    finally:
        server.stop()
    return rows


def _measure(client: redis.Redis, call: Any, calls: int, items: int = 0) -> dict[str, float]:
    client.config_resetstat()
    cpu0 = ServerCost.cpu(client)
    for _ in range(calls):
        call()
    cpu = ServerCost.cpu(client) - cpu0
    stats = client.info("commandstats")
    evalsha = stats["cmdstat_evalsha"]
    ours = ("cmdstat_evalsha", "cmdstat_config|resetstat", "cmdstat_info")
    inner = sum(
        int(v["usec"]) for name, v in stats.items() if isinstance(v, dict) and name not in ours
    )
    row = {
        "us_per_call": float(evalsha["usec_per_call"]),
        "inner_us_per_call": inner / calls,
        "cpu_us_per_call": cpu * 1e6 / calls,
        "commands_per_call": sum(
            int(v["calls"]) for name, v in stats.items() if isinstance(v, dict) and name not in ours
        )
        / calls,
    }
    if items:
        row["cpu_us_per_item"] = row["cpu_us_per_call"] / items
    return row


def print_calls(rows: dict[str, Any]) -> None:
    print()
    print(
        "One script call, by leases (or links) per call (priority queue of 20,000 compact entries)"
    )
    print(
        f"  {'call':<12} {'µs/call':>8} {'inner µs':>9} {'cmds':>6} {'CPU µs/call':>12} "
        f"{'CPU µs/item':>13}"
    )
    for name, row in rows.items():
        per = row.get("cpu_us_per_item")
        print(
            f"  {name:<12} {row['us_per_call']:>8.1f} {row['inner_us_per_call']:>9.1f} "
            f"{row['commands_per_call']:>6.1f} {row['cpu_us_per_call']:>12.1f} "
            f"{'-' if per is None else f'{per:.1f}':>13}"
        )


# -- output ---------------------------------------------------------------------------


def print_memory(result: dict[str, Any]) -> None:
    print()
    print("Redis memory per queued request / per lease (bytes, MEMORY USAGE / N), 67-char URL")
    cols = ("payload_bytes", "priority", "fifo", "lifo", "slots", "lease", "lease_slots")
    print(f"{'request':<12} {'encoding':<8} " + " ".join(f"{c:>13}" for c in cols))
    print("(slots: SlotQueue, every URL of one host; lease_slots: a lease of its entries)")
    for variant in result["after"]:
        for label in ("before", "after", "ratio"):
            row = result[label][variant]
            cells = " ".join(
                f"{row[c]:>13.2f}" if label == "ratio" else f"{row[c]:>13.1f}" for c in cols
            )
            print(f"{variant:<12} {label:<8} {cells}")
    print("Per lease, by key (bytes, after): holders zset, the worker's holding, delivery counts")
    for variant, row in result["after"].items():
        parts = ", ".join(
            f"{k} {row[f'lease_{k}']:.1f}" for k in ("holders", "holding", "deliveries")
        )
        print(f"  {variant:<12} {parts}")


def print_crawl(result: dict[str, Any]) -> None:
    if "before" not in result or "after" not in result:
        for label, figures in result.items():  # one encoding: its figures alone
            print_crawl({"before": figures, "after": figures})
            print(f"  (encoding {label} only: before = after)")
        return
    before, after = result["before"], result["after"]
    print()
    print("Per crawled page (one worker, loopback): before -> after (ratio)")
    for key in (
        "cpu_us_per_page",
        "cpu_us_per_page_marginal",
        "cpu_us_per_page_recorded",
        "command_us_per_page",
        "commands_per_page",
        "round_trips_per_page",
        "pages_per_s",
        "redis_mb",
    ):
        b, a = before[key], after[key]
        ratio = a / b if b else float("nan")
        print(f"  {key:<26} {b:>9.2f} -> {a:>9.2f}  ({ratio:.2f})")
    print()
    print("Top-level commands by server time (SLOWLOG run), after; inside each script below it")
    print(
        f"  {'command':<22} {'calls/page':>10} {'µs/call':>9} {'µs/page':>9}"
        "   before: µs/call µs/page"
    )
    for name, row in after["by_command"].items():
        was = before["by_command"].get(name)
        then = "-" if was is None else f"{was['us_per_call']:.1f} {was['us_per_page']:.2f}"
        print(
            f"  {name:<22} {row['calls_per_page']:>10.3f} {row['us_per_call']:>9.1f} "
            f"{row['us_per_page']:>9.2f}   {then}"
        )
        for inner, r in list(row["inside"].items())[:6]:
            print(
                f"      {inner:<18} {r['calls_per_call']:>10.2f}/call {r['us_per_call']:>6.2f} "
                f"{r['us_per_page']:>9.2f}"
            )


#: The per-page figures compared between two runs (``--compare``).
PER_PAGE = (
    "cpu_us_per_page",
    "cpu_us_per_page_marginal",
    "cpu_us_per_page_recorded",
    "command_us_per_page",
    "commands_per_page",
    "round_trips_per_page",
    "pages_per_s",
    "redis_mb",
)


def compare(before_path: Path, after_path: Path) -> None:
    """Print two runs' figures (e.g. the code before and after a change, run back to
    back) as before -> after (ratio): per crawled page for each encoding both crawled,
    the split by script, one script call by leases per call, and bytes per lease."""
    before, after = (json.loads(p.read_text()) for p in (before_path, after_path))

    def line(name: str, b: float, a: float, width: int = 26) -> None:
        ratio = a / b if b else float("nan")
        print(f"  {name:<{width}} {b:>9.2f} -> {a:>9.2f}  ({ratio:.2f})")

    print(f"before: {before_path.name}; after: {after_path.name}")
    for label in after.get("crawl", {}):
        b, a = before.get("crawl", {}).get(label), after["crawl"][label]
        if b is None:
            continue
        print()
        print(f"Per crawled page, encoding {label}: before -> after (ratio)")
        for key in PER_PAGE:
            if key in b and key in a:  # (a run older than a figure lacks it)
                line(key, b[key], a[key])
        print(
            f"  pages {b['pages']} -> {a['pages']}, missing {b['missing']} -> "
            f"{a['missing']}, twice {b['duplicates']} -> {a['duplicates']}"
        )
        print("Server time by script (recorded run): µs/page, and commands run per call")
        for name, row in a["by_command"].items():
            was = b["by_command"].get(name)
            if was is None or not name.startswith("script:"):
                continue
            line(f"{name} µs/page", was["us_per_page"], row["us_per_page"])
            line(f"{name} µs/call", was["us_per_call"], row["us_per_call"])
            cmds = [sum(r["calls_per_call"] for r in x["inside"].values()) for x in (was, row)]
            line(f"{name} commands/call", *cmds)
    print()
    print("One script call: server CPU µs per call (round trip included)")
    for name, row in after.get("script_calls", {}).items():
        was = before.get("script_calls", {}).get(name)
        if was is not None:
            line(name, was["cpu_us_per_call"], row["cpu_us_per_call"])
    print("One script call: commands run per call")
    for name, row in after.get("script_calls", {}).items():
        was = before.get("script_calls", {}).get(name)
        if was is not None:
            line(name, was["commands_per_call"], row["commands_per_call"])
    print()
    print("Bytes per lease (compact encoding)")
    for variant, row in after.get("memory", {}).get("after", {}).items():
        was = before.get("memory", {}).get("after", {}).get(variant)
        if was is not None:
            line(variant, was["lease"], row["lease"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=10_000, help="queued requests (10000)")
    parser.add_argument("--pages", type=int, default=10_000, help="site size (10000)")
    parser.add_argument("--run-timeout", type=float, default=300.0)
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument(
        "--encodings",
        default=",".join(ENCODINGS),
        help="encodings crawled, of 'before' (long form) and 'after' (compact): before,after",
    )
    parser.add_argument(
        "--set",
        action="append",
        type=parse_assignment,
        default=[],
        metavar="NAME=VALUE",
        help="a Scrapy setting of the crawls' worker (repeatable): --set SCHEDULER_PREFETCH=16",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("BEFORE", "AFTER"),
        help="print two runs' JSON files as before -> after (ratio), run nothing",
    )
    args = parser.parse_args(argv)
    if args.compare:
        compare(*args.compare)
        return 0
    settings = dict(args.set)
    encodings = [e for e in args.encodings.split(",") if e]
    if not encodings or any(e not in ENCODINGS for e in encodings):
        parser.error(f"--encodings: a comma-separated list of {', '.join(ENCODINGS)}")
    signal.signal(signal.SIGTERM, on_sigterm)
    out = args.out or RESULTS / f"server-{time.strftime('%Y%m%d-%H%M%S')}.json"
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    try:
        result["memory"] = memory(args.entries)
        print_memory(result["memory"])
        result["script_calls"] = script_calls()
        print_calls(result["script_calls"])
        if not args.memory_only:
            result["crawl"] = crawl(args.pages, args.run_timeout, encodings, settings)
            print_crawl(result["crawl"])
    except KeyboardInterrupt:
        print("\ninterrupted: everything started was stopped")
        return 130
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
