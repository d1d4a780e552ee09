"""The ``scrapy-dist`` command: seed, watch and repair distributed crawls.

Run inside a Scrapy project (a directory with ``scrapy.cfg``, or below one) it reads
the project's settings and spiders, so it builds exactly the keys the workers use
(``REDIS_URL``, key templates, job or timestamp, the spider's ``redis_key``, the seed
mode, the queue class); outside a project it uses scrapy_dist's defaults and accepts
any spider name. ``--redis-url``, ``-s NAME=VALUE`` and ``--job`` override settings.

Commands (``scrapy-dist COMMAND --help`` describes each)::

    push SPIDER [URL ...] [--file FILE]   validate seeds and push the valid ones
    status [SPIDER] [--json] [--watch]    seeds, queue, leases, dead letters, workers...
    dead list|requeue|purge SPIDER         inspect and repair the dead-letter list
    reset SPIDER [--yes]                   delete one crawl's (or job's) keys
    jobs [--json]                          the crawls present in Redis (SCAN)
    export SPIDER --output FILE            write the items list as JSON lines
    metrics SPIDER [--port P] [--once]     serve the crawl's Prometheus metrics

Exit codes: 0 success; 1 the command ran but did not do everything it was asked
(invalid seed lines, dead records that cannot be requeued, a reset refused because
workers are alive or not confirmed, a reset or purge refused without ``--yes`` when
stdin is not a terminal) or Redis is unreachable; 2 usage or configuration
errors (bad arguments, unknown spider, a key of the wrong type); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, TYPE_CHECKING, Any, cast

import redis

from scrapy_dist import deadletter
from scrapy_dist.exceptions import ConfigurationError, InvalidSeed, RedisUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from scrapy import Spider
    from scrapy.settings import BaseSettings

    from scrapy_dist.monitor import CrawlLayout, CrawlStatus
    from scrapy_dist.seeds import SeedQueue
    from scrapy_dist.settings import Config

#: Exit status: the command did everything it was asked.
EXIT_OK = 0
#: Exit status: it ran but did not do everything (see the module docstring), or Redis
#: is unreachable.
EXIT_FAILED = 1
#: Exit status: bad arguments or settings, unknown spider, a key of the wrong type.
EXIT_USAGE = 2
#: Exit status: interrupted (Ctrl-C).
EXIT_INTERRUPTED = 130

#: Seeds per ``RPUSH``/``SADD``/``ZADD``, and commands per pipeline.
PUSH_CHUNK, PUSH_PIPELINE = 1_000, 10
#: Invalid seed lines reported one by one; the rest are counted.
MAX_REPORTED = 20
#: Dead-letter records and items read per round trip.
READ_CHUNK = 1_000
#: Inputs from this size on get a progress bar (when stderr is a terminal).
PROGRESS_BYTES = 1 << 20


class CommandError(Exception):
    """A failure to report as one line, with the exit status to return."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


# -- settings, spiders, client ----------------------------------------------------------


@dataclass
class Context:
    """Settings and the spider of one invocation, resolved as a worker would."""

    args: argparse.Namespace
    project: bool = False
    #: The client, once :meth:`client` connected.
    connected: redis.Redis | None = field(default=None, repr=False)
    #: Whether the "not inside a project" warning was given.
    warned: bool = False

    def raw_settings(self) -> BaseSettings:
        """Project settings (or Scrapy's defaults outside a project) with the options."""
        from scrapy.settings import Settings
        from scrapy.utils.project import get_project_settings, inside_project

        self.project = inside_project()
        settings: BaseSettings = get_project_settings() if self.project else Settings()
        for item in self.args.set or ():
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"-s expects NAME=VALUE, not {item!r}")
            settings.set(name, value, priority="cmdline")
        if self.args.redis_url:
            settings.set("REDIS_URL", self.args.redis_url, priority="cmdline")
        if self.args.job is not None:
            settings.set("SCHEDULER_JOB_ID", self.args.job or None, priority="cmdline")
            settings.set("SCHEDULER_JOB_TIMESTAMP", None, priority="cmdline")
        return settings

    def settings(self, spider: str | None = None) -> tuple[Config, type[Spider] | None]:
        """The config of the settings (with scrapy_dist's defaults and, inside a project,
        the spider's own ``custom_settings``); and the spider class (``None`` outside a
        project).

        Raises:
            CommandError: the project has no spider of that name.
        """
        from scrapy_dist.settings import Config

        settings = self.raw_settings()
        spidercls = None
        if spider is not None and self.project:
            spidercls = _load_spider(settings, spider)
            spidercls.update_settings(settings)
        config = Config.from_settings(settings)
        if not self.project and not self._redis_given() and not self.warned:
            self.warned = True
            _err(
                "scrapy-dist: warning: not inside a Scrapy project (no scrapy.cfg here or "
                "above), so scrapy_dist's default settings are used, with Redis at "
                f"{_server(config)}; run it in the project's directory, or give --redis-url"
            )
        return config, spidercls

    def layout(self, spider: str) -> tuple[CrawlLayout, Config, type[Spider] | None]:
        """The crawl's layout, its config and the spider class."""
        from scrapy_dist.monitor import CrawlLayout

        config, spidercls = self.settings(spider)
        return CrawlLayout.from_config(config, spider, spidercls), config, spidercls

    def client(self, config: Config) -> redis.Redis:
        """A client of the settings' Redis, checked with one ``PING``.

        Raises:
            RedisUnavailable: the server cannot be reached.
        """
        if self.connected is None:
            from scrapy_dist.connection import check, client_from_config

            client = client_from_config(config.connection)
            check(client)
            self.connected = client
        return self.connected

    def _redis_given(self) -> bool:
        """Whether the options name the Redis server (``--redis-url`` or ``-s REDIS_...``)."""
        named = {item.partition("=")[0] for item in self.args.set or ()}
        return bool(self.args.redis_url) or any(name.startswith("REDIS_") for name in named)


def _server(config: Config) -> str:
    """The Redis server the settings name, password masked (no I/O)."""
    from scrapy_dist.connection import client_from_config, describe

    client = client_from_config(config.connection)
    try:
        return describe(client)
    finally:
        client.close()


def _load_spider(settings: BaseSettings, name: str) -> type[Spider]:
    from scrapy.utils.misc import load_object

    loader = load_object(settings["SPIDER_LOADER_CLASS"]).from_settings(settings.frozencopy())
    try:
        return cast("type[Spider]", loader.load(name))
    except KeyError:
        known = ", ".join(sorted(loader.list())) or "none"
        raise CommandError(
            f"unknown spider {name!r} in this Scrapy project (its spiders: {known})"
        ) from None


def _confirm(question: str, assume_yes: bool) -> bool:
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise CommandError(
            f"{question} Refusing without --yes: stdin is not a terminal", EXIT_FAILED
        )
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


# -- push -----------------------------------------------------------------------------


class ProgressBar:
    """A one-line progress bar on a terminal, redrawn at most 10 times a second.

    Args:
        stream: the terminal.
        total: total bytes, or ``None`` if unknown (then only lines are counted).
    """

    WIDTH = 30

    def __init__(self, stream: IO[str], total: int | None) -> None:
        self.stream = stream
        self.total = total
        self._next = 0.0

    def update(self, lines: int, done: int, *, force: bool = False) -> None:
        """Show ``lines`` lines read, ``done`` bytes of :attr:`total`."""
        now = time.monotonic()
        if now < self._next and not force:
            return
        self._next = now + 0.1
        if self.total:
            share = min(1.0, done / self.total)
            bar = "#" * int(share * self.WIDTH)
            text = f"\r[{bar:<{self.WIDTH}}] {share:6.1%}  {lines:,} lines"
        else:
            text = f"\r{lines:,} lines"
        self.stream.write(text)
        self.stream.flush()

    def finish(self, lines: int, done: int) -> None:
        """Draw the final state and end the line."""
        self.update(lines, done, force=True)
        self.stream.write("\n")
        self.stream.flush()


def _input_lines(args: argparse.Namespace) -> Iterator[tuple[str, bytes, int]]:
    """``(label, raw line, bytes read so far)`` from the URL arguments, then the file."""
    for number, url in enumerate(args.urls, 1):
        yield f"argument {number}", os.fsencode(url), 0
    path = args.file
    if path is None and args.urls:
        return
    if path is None:
        if sys.stdin.isatty():
            raise CommandError("no seeds given: pass URLs, --file FILE, or lines on stdin")
        path = "-"
    stream = sys.stdin.buffer if path == "-" else _open_input(path)
    with contextlib.ExitStack() as stack:
        if stream is not sys.stdin.buffer:
            stack.enter_context(stream)
        done = 0
        for number, line in enumerate(stream, 1):
            done += len(line)
            yield f"line {number}", line, done


def _open_input(path: str) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as e:
        raise CommandError(f"cannot read {path}: {e.strerror}") from e


def _input_size(args: argparse.Namespace) -> int | None:
    """Bytes to read (0 for URL arguments only), or ``None`` if unknown (a pipe)."""
    try:
        if args.file not in (None, "-"):
            return os.path.getsize(args.file)
        if args.file is None and args.urls:
            return 0
        info = os.fstat(sys.stdin.fileno())
    except (OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


@dataclass
class PushReport:
    """What ``push`` did."""

    key: str
    kind: str
    pushed: int = 0
    new: int = 0
    invalid: int = 0
    blank: int = 0
    errors: list[str] = field(default_factory=list)


class SeedPusher:
    """Validates seed lines like the spider does and pushes the valid ones in input
    order, in pipelined batches.

    Args:
        seeds: the crawl's seeds key (``None`` for a dry run).
        report: where the counts go.
        encoding: ``REDIS_ENCODING``.
        spidercls: the spider class, to check callbacks (``None`` outside a project).
        score: the seeds' score in zset mode.
    """

    def __init__(
        self,
        seeds: SeedQueue | None,
        report: PushReport,
        *,
        encoding: str,
        spidercls: type[Spider] | None,
        score: float,
        extra_as_formdata: bool = True,
        allowed_meta: Sequence[str] = (),
    ) -> None:
        self.seeds = seeds
        self.allowed_meta = frozenset(allowed_meta)
        self.report = report
        self.encoding = encoding
        self.extra_as_formdata = extra_as_formdata
        self.spidercls = spidercls
        self.score = score
        self._batch: list[bytes] = []

    def add(self, label: str, raw: bytes) -> None:
        """Validate one line; batch it if valid, count (and keep the reason) if not."""
        from scrapy_dist.seeds import check_callbacks, parse_seed

        data = raw.strip()
        if not data:
            self.report.blank += 1
            return
        try:
            seed = parse_seed(
                data, self.encoding, allowed_meta=self.allowed_meta,
                extra_as_formdata=self.extra_as_formdata,
            )
            if self.spidercls is not None:
                check_callbacks(seed, self.spidercls)
        except InvalidSeed as e:
            self.report.invalid += 1
            if len(self.report.errors) < MAX_REPORTED:
                self.report.errors.append(f"{label}: {e}")
            return
        self._batch.append(data)
        if len(self._batch) >= PUSH_CHUNK * PUSH_PIPELINE:
            self.flush()

    def flush(self) -> None:
        """Push the batch: one pipeline of commands of :data:`PUSH_CHUNK` seeds."""
        batch, self._batch = self._batch, []
        if self.seeds is not None and batch:
            with self.seeds.client.pipeline(transaction=False) as pipe:
                for start in range(0, len(batch), PUSH_CHUNK):
                    self.seeds.push(batch[start : start + PUSH_CHUNK], self.score, pipe=pipe)
                replies = pipe.execute()
            added = len(batch) if self.seeds.kind == "list" else sum(int(n) for n in replies)
            self.report.new += added
        self.report.pushed += len(batch)


def cmd_push(ctx: Context, args: argparse.Namespace) -> int:
    from scrapy_dist.seeds import SeedQueue

    layout, settings, spidercls = ctx.layout(args.spider)
    _warn_not_redis_spider(spidercls, layout.seeds)
    seeds = None
    if not args.dry_run:
        seeds = SeedQueue(ctx.client(settings), layout.seeds, layout.seeds_kind)
        seeds.check_type()
    report = PushReport(layout.seeds, layout.seeds_kind)
    extra_as_formdata = settings.seeds.extra_formdata
    pusher = SeedPusher(seeds, report, encoding=settings.seeds.encoding,
                        spidercls=spidercls, score=args.score,
                        extra_as_formdata=extra_as_formdata,
                        allowed_meta=sorted(settings.seeds.allowed_meta))  # fmt: skip
    size = _input_size(args)
    bar = None
    if sys.stderr.isatty() and not args.quiet and (size is None or size >= PROGRESS_BYTES):
        bar = ProgressBar(sys.stderr, size)
    lines = done = 0
    for label, raw, done in _input_lines(args):
        lines += 1
        pusher.add(label, raw)
        if bar is not None:
            bar.update(lines, done)
    pusher.flush()
    if bar is not None:
        bar.finish(lines, done)
    _print_push(report, args)
    return EXIT_FAILED if report.invalid else EXIT_OK


def _warn_not_redis_spider(spidercls: type[Spider] | None, key: str) -> None:
    """Warn when the project's spider never reads seeds from Redis."""
    from scrapy_dist.spiders import RedisSpiderMixin

    if spidercls is None or issubclass(spidercls, RedisSpiderMixin):
        return
    _err(
        f"scrapy-dist: warning: spider {spidercls.name!r} ({spidercls.__module__}."
        f"{spidercls.__qualname__}) is not a Redis spider, so its workers never read "
        f"{key!r}; make it a scrapy_dist.spiders.RedisSpider (or RedisCrawlSpider, "
        "RedisSpiderMixin) to crawl these seeds"
    )


def _print_push(report: PushReport, args: argparse.Namespace) -> None:
    for line in report.errors:
        _err(line)
    if report.invalid > len(report.errors):
        _err(f"... and {report.invalid - len(report.errors)} more invalid line(s)")
    if args.json:
        _out(json.dumps({
            "key": report.key, "type": report.kind, "pushed": report.pushed,
            "new": report.new, "invalid": report.invalid, "blank": report.blank,
            "dry_run": args.dry_run,
        }))  # fmt: skip
        return
    verb = "valid (dry run, nothing pushed)" if args.dry_run else "pushed"
    text = f"{verb} {report.pushed} seed(s) to {report.key!r} ({report.kind})"
    if report.kind != "list" and not args.dry_run:
        text += f", {report.new} new"
    text += f"; invalid {report.invalid}"
    if report.blank:
        text += f"; {report.blank} blank line(s) skipped"
    _out(text)


# -- status -------------------------------------------------------------------------


def _ago(seconds: float) -> str:
    return f"{seconds:.1f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def render_status(status: CrawlStatus, *, all_stats: bool = False) -> str:
    """The human-readable form of a crawl's status."""
    lines = [f"crawl {status.crawl}  at {status.redis}  [{status.state}]"]
    if not status.exists:
        lines.append("  (no key of this crawl exists)")
    elif status.state == "idle":
        lines.append(
            "  (empty, not marked finished: a worker with CLOSE_WHEN_CRAWL_DONE marks it "
            "CRAWL_DONE_GRACE s after the last page, any worker when it closes)"
        )
    row = "  {:<11}{:>9}  {}"
    lines.append(row.format("seeds", status.seeds,
                            f"waiting in {status.seeds_key} ({status.seeds_kind})"))  # fmt: skip
    lines.append(row.format("queued", status.queued,
                            f"in {status.queue_key} ({status.queue_kind})"))  # fmt: skip
    lines.append(row.format("leased", status.leased, "held by workers"))
    lines.append(row.format("dead", status.dead, f"in {status.dead_key}"))
    p = status.progress
    done_note = f"retried {int(p.get('retried', 0))}, dead-lettered {int(p.get('dead', 0))}"
    if p.get("finished_at"):
        done_note += f"; finished {_when(p.get('finished_at'))}"
    lines.append(row.format("done", int(p.get("done", 0)), done_note))
    df = status.dupefilter
    if df is None:
        lines.append(row.format("dupefilter", 0, "(none yet)"))
    else:
        note = f"fingerprints in {df.key} ({df.backend})"
        lines.append(row.format("dupefilter", df.count, note))
        if df.capacity:
            lines.append(
                f"  {'':<11}{'':>9}  Bloom: {df.count / df.capacity:.2%} of capacity "
                f"{df.capacity}, estimated false-positive rate {df.fpr_estimate:.3g} "
                f"(configured {df.error_rate:.3g}, {df.stages} filter(s))"
            )
    scraped = status.stats.get("item_scraped_count")
    items_note = f"stored in {status.items_key}"
    if scraped is not None:
        items_note += f"; {scraped} scraped"
    lines.append(row.format("items", status.items_stored, items_note))
    if status.rates is None:
        lines.append(f"  {'rate':<11}{'n/a':>9}  (needs STATS_CLASS = "
                     "'scrapy_dist.stats.RedisStatsCollector')")  # fmt: skip
    else:
        r = status.rates
        lines.append(f"  {'rate':<11}{r.pages_per_second:>9.1f}  pages/s, "
                     f"{r.items_per_second:.1f} items/s over the last {r.window} s")  # fmt: skip
    live = status.live_workers()
    lines.append(row.format("workers", len(live), f"live (of {len(status.workers)} registered)"))
    for worker, beat in sorted(status.workers.items()):
        age = max(0.0, status.time - beat)
        gone = "" if worker in live else " (gone)"
        lines.append(f"  {'':<11}{'':>9}  {worker}  heartbeat {_ago(age)}{gone}")
    if all_stats and status.stats:
        lines.append("  stats:")
        for name, value in status.stats.items():
            lines.append(f"    {name}: {value!r}")
    return "\n".join(lines)


def cmd_status(ctx: Context, args: argparse.Namespace) -> int:
    from scrapy_dist.monitor import CrawlLayout, find_crawls, json_default, read_status

    if args.spider is not None:
        layout, settings, _ = ctx.layout(args.spider)
        client = ctx.client(settings)

        def read() -> list[CrawlStatus]:
            return [read_status(client, layout, settings)]
    else:
        settings, _ = ctx.settings()
        client = ctx.client(settings)

        def read() -> list[CrawlStatus]:
            return [read_status(client, CrawlLayout.for_crawl(settings, crawl), settings)
                    for crawl in find_crawls(client, settings)]  # fmt: skip

    tty = sys.stdout.isatty()
    while True:
        statuses = read()
        if args.json:
            payload: Any = (statuses[0].as_dict() if args.spider is not None
                            else {"crawls": [s.as_dict() for s in statuses]})  # fmt: skip
            _out(json.dumps(payload, default=json_default))
        else:
            text = "\n\n".join(render_status(s, all_stats=args.stats) for s in statuses)
            if not statuses:
                text = "no crawl found in Redis"
            if args.watch and tty:
                sys.stdout.write("\x1b[H\x1b[2J")
                text += f"\n\n(every {args.interval:g} s; Ctrl-C to stop)"
            elif args.watch:
                text += "\n"
            _out(text)
        sys.stdout.flush()
        if not args.watch:
            return EXIT_OK
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:  # how --watch ends
            return EXIT_OK


# -- jobs -----------------------------------------------------------------------------


def cmd_jobs(ctx: Context, args: argparse.Namespace) -> int:
    from scrapy_dist.monitor import CrawlLayout, find_crawls, read_status

    settings, _ = ctx.settings()
    client = ctx.client(settings)
    rows = []
    for crawl in find_crawls(client, settings):
        spider, _, job = crawl.partition(":")
        row: dict[str, Any] = {"crawl": crawl, "spider": spider, "job": job or None}
        try:
            status = read_status(client, CrawlLayout.for_crawl(settings, crawl), settings,
                                 dupefilter=False)  # fmt: skip
        except ConfigurationError as e:
            row["error"] = str(e)
        except redis.exceptions.NoPermissionError:
            row["error"] = "no permission to read this crawl's keys (Redis ACL of this user)"
        else:
            row.update(
                state=status.state, seeds=status.seeds, queued=status.queued,
                leased=status.leased, dead=status.dead, workers=len(status.live_workers()),
                done=int(status.progress.get("done", 0)), items=status.items_stored,
            )  # fmt: skip
        rows.append(row)
    if args.json:
        _out(json.dumps(rows))
        return EXIT_OK
    if not rows:
        _out("no crawl found in Redis")
        return EXIT_OK
    columns = ["spider", "job", "state", "seeds", "queued", "leased", "dead", "workers",
               "done", "items"]  # fmt: skip
    table = [[c.upper() for c in columns]]
    for row in rows:
        if "error" in row:
            table.append([row["spider"], row["job"] or "-", f"error: {row['error']}"])
        else:
            table.append([str(row[c]) if row[c] is not None else "-" for c in columns])
    full = [r for r in table if len(r) == len(columns)]
    widths = [max(len(r[i]) for r in full) for i in range(len(columns))]
    for r in table:
        _out("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
    return EXIT_OK


# -- dead letters -------------------------------------------------------------------


def _record_url(record: dict[str, Any]) -> str:
    if isinstance(record.get("url"), str):
        return str(record["url"])
    data = deadletter.data_of(record)
    if data is None:
        return ""
    text = data.decode("utf-8", "replace")
    if record.get("kind") == "request":
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(text).get("url", ""))
    return text if len(text) <= 200 else text[:200] + "..."


def cmd_dead_list(ctx: Context, args: argparse.Namespace) -> int:
    layout, settings, _ = ctx.layout(args.spider)
    client = ctx.client(settings)
    key = layout.keys.dead
    _check_key(client, key, "list", "dead letters")
    total = int(client.llen(key))
    shown = 0
    if not args.json:
        _out(f"{key}: {total} record(s)")
    for index, raw in _iter_list(client, key, total):
        record = deadletter.parse(raw)
        if args.kind and record.get("kind") != args.kind:
            continue
        if args.limit and shown >= args.limit:
            break
        shown += 1
        if args.json:
            _out(json.dumps({"index": index, **record}, ensure_ascii=False))
            continue
        when = _when(record["time"]) if isinstance(record.get("time"), (int, float)) else ""
        _out(f"#{index:<5} {record.get('kind', '?'):<8} {when}  {_record_url(record)}")
        _out(f"       {record.get('reason', '')}")
    if not args.json and args.limit and shown >= args.limit and total > shown:
        _out(f"(first {shown} shown; --limit 0 shows all)")
    return EXIT_OK


def _iter_list(client: redis.Redis, key: str, total: int) -> Iterator[tuple[int, bytes]]:
    for start in range(0, total, READ_CHUNK):
        chunk = cast("list[bytes]", client.lrange(key, start, min(start + READ_CHUNK, total) - 1))
        for offset, raw in enumerate(chunk):
            yield start + offset, raw
        if len(chunk) < READ_CHUNK:
            return


def _check_key(client: redis.Redis, key: str, expected: str, role: str) -> None:
    from scrapy_dist.monitor import check_type

    actual = client.type(key)
    check_type(key, actual.decode() if isinstance(actual, bytes) else str(actual), expected, role)


@dataclass
class _Requeue:
    """What to do with the records read in one transaction."""

    requests: list[tuple[bytes, float, bytes]] = field(default_factory=list)
    #: The requests' records, and their numbers as ``dead list`` showed them.
    request_records: list[tuple[int, bytes]] = field(default_factory=list)
    seeds: list[bytes] = field(default_factory=list)
    seed_records: list[tuple[int, bytes]] = field(default_factory=list)
    #: Positions in the list now of the records to remove.
    chosen: list[int] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    read: int = 0


class Requeuer:
    """Puts dead-letter records back where they came from, atomically with their removal.

    Each batch runs in a ``WATCH``/``MULTI`` transaction on the dead-letter list: the
    records are read, then pushed (requests with the enqueue script and no dedupe, as
    their fingerprints are recorded already; seeds with the seed mode's command) and
    removed in one ``MULTI``, retried if a worker appended a record meanwhile. So a
    record is requeued exactly once, even with two operators at work. Should Redis
    refuse a push inside the transaction, its records are appended to the list again.

    Args:
        client: the crawl's Redis client.
        layout: the crawl's keys and types.
        settings: the config (serializer, encoding).
        spidercls: the spider class if known (to check seed callbacks).
        kind: requeue only records of this kind (``"request"``, ``"seed"``), or all.
    """

    def __init__(
        self,
        client: redis.Redis,
        layout: CrawlLayout,
        settings: Config,
        spidercls: type[Spider] | None,
        kind: str | None,
    ) -> None:
        from scrapy_dist.seeds import SeedQueue
        from scrapy_dist.serializers import RequestPolicy, load_serializer

        self.client = client
        self.key = layout.keys.dead
        self.queue = layout.queue_cls(client, layout.keys.requests, layout.keys.seq)
        self.seeds = SeedQueue(client, layout.seeds, layout.seeds_kind)
        self.serializer = load_serializer(settings.requests.serializer)
        self.policy = RequestPolicy.build(settings.requests.classes, settings.requests.schemes)
        self.encoding = settings.seeds.encoding
        self.extra_as_formdata = settings.seeds.extra_formdata
        self.allowed_meta = settings.seeds.allowed_meta
        self.spidercls = spidercls
        self.kind = kind
        self.tombstone = f"\x00scrapy-dist requeue {secrets.token_hex(8)}"
        #: Requests and seeds requeued so far.
        self.requests = self.seeds_done = 0
        #: ``(index, reason)`` of the records left in the list.
        self.skipped: list[tuple[int, str]] = []

    def _plan(self, plan: _Requeue, index: int, position: int, raw: bytes | None) -> None:
        """Decide about the record numbered ``index`` (now at ``position``)."""
        from scrapy import Request

        from scrapy_dist.seeds import check_callbacks, parse_seed

        if raw is None:
            plan.skipped.append((index, "no such record"))
            return
        record = deadletter.parse(raw)
        kind = record.get("kind")
        if self.kind and kind != self.kind:
            return
        data = deadletter.data_of(record)
        if data is None:
            plan.skipped.append((index, f"{kind} record without data"))
        elif kind == "seed":
            try:
                seed = parse_seed(
                    data, self.encoding, allowed_meta=self.allowed_meta,
                    extra_as_formdata=self.extra_as_formdata,
                )
                if self.spidercls is not None:
                    check_callbacks(seed, self.spidercls)
            except InvalidSeed as e:
                plan.skipped.append((index, f"seed is still invalid: {e}"))
                return
            plan.seeds.append(data)
            plan.seed_records.append((index, raw))
            plan.chosen.append(position)
        elif kind == "request":
            try:
                obj = self.serializer.loads(data)
                request = Request(str(obj["url"]), priority=int(obj.get("priority", 0)))
            except (ValueError, TypeError, KeyError, OverflowError) as e:
                plan.skipped.append((index, f"not a serialized request ({e})"))
                return
            refusal = self._refusal(obj)
            if refusal:
                plan.skipped.append((index, f"request is still invalid: {refusal}"))
                return
            plan.requests.append((data, self.queue.score(request), b""))
            plan.request_records.append((index, raw))
            plan.chosen.append(position)
        else:
            plan.skipped.append((index, f"unknown record kind {kind!r}"))

    def _refusal(self, obj: dict[str, Any]) -> str | None:
        """Why a worker would dead-letter this request again (``None``: it would not)."""
        from scrapy_dist import callbacks
        from scrapy_dist.serializers import check_priority

        try:
            self.policy.request_class(obj.get("_class"))
            self.policy.check_url(obj.get("url"))
            check_priority(obj.get("priority", 0))
        except ValueError as e:
            return str(e)
        for name in ("callback", "errback"):
            if obj.get(name) and self.spidercls is not None:
                reason = callbacks.refusal(self.spidercls, obj[name], public_only=False)
                if reason:
                    return f"{name} {reason}"
        return None

    def _run(self, read: Callable[[Any], _Requeue]) -> _Requeue:
        """Read and plan under ``WATCH``, then push and remove in one ``MULTI``."""
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(self.key)  # type: ignore[no-untyped-call]
                    plan = read(pipe)
                    pipe.multi()
                    if plan.requests:
                        self.queue.enqueue_call(plan.requests).run(pipe)
                    if plan.seeds:
                        self.seeds.push(plan.seeds, pipe=pipe)
                    for index in plan.chosen:
                        pipe.lset(self.key, index, self.tombstone)
                    if plan.chosen:
                        pipe.lrem(self.key, 0, self.tombstone)
                    replies = pipe.execute(raise_on_error=False)
                except redis.WatchError:
                    continue
                break
        failed: list[bytes] = []
        for name in ("requests", "seeds"):
            if not getattr(plan, name):
                continue
            reply = replies.pop(0)
            if isinstance(reply, Exception):
                records = plan.request_records if name == "requests" else plan.seed_records
                failed += [raw for _, raw in records]
                plan.skipped += [(i, f"Redis refused the push ({reply}); the record was "
                                     "appended to the list again") for i, _ in records]  # fmt: skip
                setattr(plan, name, [])
        if failed:
            self.client.rpush(self.key, *failed)
        self.requests += len(plan.requests)
        self.seeds_done += len(plan.seeds)
        self.skipped += plan.skipped
        return plan

    def indexes(self, indexes: Sequence[int]) -> None:
        """Requeue the records at these positions of the list.

        Raises:
            CommandError: an index is past the end of the list.
        """
        wanted = sorted(set(indexes))

        def read(pipe: Any) -> _Requeue:
            length = int(pipe.llen(self.key))
            bad = [i for i in wanted if not 0 <= i < length]
            if bad:
                raise CommandError(
                    f"no record #{bad[0]} in {self.key} ({length} record(s): 0..{length - 1})"
                )
            plan = _Requeue()
            for index in wanted:
                self._plan(plan, index, index, pipe.lindex(self.key, index))
            return plan

        self._run(read)

    def _read_chunk(self, pipe: Any, examined: int, start: int, count: int) -> _Requeue:
        raws = pipe.lrange(self.key, start, start + count - 1)
        plan = _Requeue(read=len(raws))
        for offset, raw in enumerate(raws):
            self._plan(plan, examined + offset, start + offset, raw)
        return plan

    def all(self) -> None:
        """Requeue every record present now (records added meanwhile are left)."""
        total = int(self.client.llen(self.key))
        examined = position = 0
        while examined < total:
            count = min(READ_CHUNK, total - examined)
            plan = self._run(partial(self._read_chunk, examined=examined, start=position,
                                     count=count))  # fmt: skip
            if not plan.read:
                break
            examined += plan.read
            position += plan.read - len(plan.chosen)


def cmd_dead_requeue(ctx: Context, args: argparse.Namespace) -> int:
    layout, settings, spidercls = ctx.layout(args.spider)
    client = ctx.client(settings)
    _check_key(client, layout.keys.dead, "list", "dead letters")
    _check_key(client, layout.keys.requests, layout.queue_kind, "queue")
    _check_key(client, layout.seeds, layout.seeds_kind, "seeds")
    requeuer = Requeuer(client, layout, settings, spidercls, args.kind)
    if args.all:
        requeuer.all()
    else:
        requeuer.indexes(args.index)
    left = int(client.llen(layout.keys.dead))
    for index, reason in requeuer.skipped:
        _err(f"#{index}: not requeued: {reason}")
    if args.json:
        _out(json.dumps({"requests": requeuer.requests, "seeds": requeuer.seeds_done,
                         "skipped": len(requeuer.skipped), "left": left}))  # fmt: skip
    else:
        _out(
            f"requeued {requeuer.requests} request(s) to {layout.keys.requests!r} and "
            f"{requeuer.seeds_done} seed(s) to {layout.seeds!r}; "
            f"{len(requeuer.skipped)} skipped; {left} record(s) left in {layout.keys.dead!r}"
        )
    return EXIT_FAILED if requeuer.skipped else EXIT_OK


def cmd_dead_purge(ctx: Context, args: argparse.Namespace) -> int:
    layout, settings, _ = ctx.layout(args.spider)
    client = ctx.client(settings)
    key = layout.keys.dead
    _check_key(client, key, "list", "dead letters")
    count = int(client.llen(key))
    if not count:
        _out(f"{key} is empty")
        return EXIT_OK
    if not _confirm(f"Delete the {count} record(s) of {key!r}?", args.yes):
        _err("not purged")
        return EXIT_FAILED
    with client.pipeline(transaction=True) as pipe:
        pipe.llen(key)
        pipe.delete(key)
        purged, _ = pipe.execute()
    _out(f"purged {int(purged)} record(s) from {key!r}")
    return EXIT_OK


# -- reset ----------------------------------------------------------------------------


def cmd_reset(ctx: Context, args: argparse.Namespace) -> int:
    from scrapy_dist.backends import backend_from_config
    from scrapy_dist.monitor import scan_owned

    layout, settings, _ = ctx.layout(args.spider)
    client = ctx.client(settings)
    crawl = layout.keys.crawl
    backend_keys = backend_from_config(settings.dupefilter, client, layout.keys).keys()
    present = scan_owned(client, layout, backend_keys)
    if not present:
        _out(f"crawl {crawl!r} has no keys at {_describe(client)}")
        return EXIT_OK
    live = _live_workers(client, layout)
    if live and not args.force:
        raise CommandError(
            f"crawl {crawl!r} has {len(live)} live worker(s) ({', '.join(live[:3])}): stop "
            "them first, or pass --force to delete their crawl under them",
            EXIT_FAILED,
        )
    _err(f"crawl {crawl!r} at {_describe(client)}: {len(present)} key(s)")
    for key in present[:30]:
        _err(f"  {key}")
    if len(present) > 30:
        _err(f"  ... and {len(present) - 30} more")
    if not _confirm(f"Delete these {len(present)} key(s)?", args.yes):
        _err("nothing deleted")
        return EXIT_FAILED
    deleted = 0
    for start in range(0, len(present), READ_CHUNK):
        deleted += int(client.unlink(*present[start : start + READ_CHUNK]))
    _out(f"deleted {deleted} key(s) of crawl {crawl!r}")
    return EXIT_OK


def _describe(client: redis.Redis) -> str:
    from scrapy_dist.connection import describe

    return describe(client)


def _live_workers(client: redis.Redis, layout: CrawlLayout) -> list[str]:
    """Workers of the crawl with a recent heartbeat (none if the key is not a hash)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.hgetall(layout.keys.workers)
        (seconds, micros), workers = pipe.execute(raise_on_error=False)
    if isinstance(workers, Exception):
        return []
    now = seconds + micros / 1e6
    return sorted(w.decode() for w, beat in workers.items()
                  if now - float(beat) <= layout.worker_timeout)  # fmt: skip


# -- export ---------------------------------------------------------------------------


def cmd_export(ctx: Context, args: argparse.Namespace) -> int:
    layout, settings, _ = ctx.layout(args.spider)
    client = ctx.client(settings)
    key = layout.items
    _check_key(client, key, "list", "items")
    to_stdout = args.output == "-"
    if args.delete and not to_stdout and not args.append and _non_empty(args.output):
        raise CommandError(
            f"{args.output} exists: pass --append, or choose another file (with --delete, "
            "overwriting it would lose the items an earlier export removed from Redis)"
        )
    total = int(client.llen(key))
    with contextlib.ExitStack() as stack:
        if to_stdout:
            stream: IO[bytes] = sys.stdout.buffer
        else:
            try:
                stream = stack.enter_context(open(args.output, "ab" if args.append else "wb"))
            except OSError as e:
                raise CommandError(f"cannot write {args.output}: {e.strerror}") from e
        exported = (_export_delete if args.delete else _export_copy)(client, key, total, stream)
    verb = "moved" if args.delete else "copied"
    _err(f"{verb} {exported} item(s) from {key!r} to {'stdout' if to_stdout else args.output}")
    return EXIT_OK


def _non_empty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _export_copy(client: redis.Redis, key: str, total: int, stream: IO[bytes]) -> int:
    exported = 0
    for _, raw in _iter_list(client, key, total):
        stream.write(raw + b"\n")
        exported += 1
    stream.flush()
    return exported


def _export_delete(client: redis.Redis, key: str, total: int, stream: IO[bytes]) -> int:
    """Write the first ``total`` items, removing each chunk from Redis only once it is
    on disk: a crash can repeat a chunk in the file, never lose one."""
    exported = 0
    while exported < total:
        count = min(READ_CHUNK, total - exported)
        chunk = cast("list[bytes]", client.lrange(key, 0, count - 1))
        if not chunk:
            break
        stream.write(b"".join(raw + b"\n" for raw in chunk))
        stream.flush()
        with contextlib.suppress(OSError, ValueError):
            os.fsync(stream.fileno())
        client.ltrim(key, len(chunk), -1)
        exported += len(chunk)
    return exported


# -- metrics --------------------------------------------------------------------------


def cmd_metrics(ctx: Context, args: argparse.Namespace) -> int:
    from scrapy_dist.monitor import CONTENT_TYPE, gauges, prometheus_text, read_status

    layout, settings, _ = ctx.layout(args.spider)
    client = ctx.client(settings)
    crawl = layout.keys.crawl

    def render() -> str:
        try:
            status = read_status(client, layout, settings)
        except (redis.RedisError, ConfigurationError) as e:
            _err(f"cannot read crawl {crawl!r}: {e}")
            status = None
        return prometheus_text(crawl, gauges(status))

    if args.once:
        sys.stdout.write(render())
        return EXIT_OK
    cache = _Cached(render, args.interval)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0].rstrip("/") != "/metrics":
                self.send_error(404, "scrape /metrics")
                return
            body = cache.get().encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    try:
        server = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as e:
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from e
    host, port = server.server_address[:2]
    _err(f"metrics of crawl {crawl!r} on http://{host!s}:{port}/metrics (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # how it is meant to stop
        pass
    finally:
        server.server_close()
    return EXIT_OK


class _Cached:
    """A value recomputed at most every ``interval`` seconds, safe across threads."""

    def __init__(self, compute: Callable[[], str], interval: float) -> None:
        self.compute = compute
        self.interval = interval
        self._lock = threading.Lock()
        self._value = ""
        self._at = -float("inf")

    def get(self) -> str:
        with self._lock:
            if time.monotonic() - self._at >= self.interval:
                self._value = self.compute()
                self._at = time.monotonic()
            return self._value


# -- the parser -----------------------------------------------------------------------


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _add_common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default: Any = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("settings")
    group.add_argument(
        "--redis-url", metavar="URL", default=default, help="Redis to use (overrides REDIS_URL)"
    )
    group.add_argument(
        "-s", "--set", metavar="NAME=VALUE", action="append",
        default=default if suppress else [],
        help="set a Scrapy setting, as 'scrapy crawl -s' does (repeatable)",
    )  # fmt: skip
    group.add_argument(
        "--job", metavar="JOB", default=default,
        help="the job's crawl (SCHEDULER_JOB_ID): keys <spider>:<job>:...",
    )  # fmt: skip


_Commands = Any  # argparse's private _SubParsersAction


def _push_parser(commands: _Commands, common: argparse.ArgumentParser) -> None:
    push = commands.add_parser(
        "push", parents=[common], help="validate seeds and push the valid ones",
        description="Push seeds (plain URLs or JSON objects, one per line) to the crawl's "
        "seeds key, in input order and in the crawl's seed mode (list, set or zset). "
        "Lines are validated as the spider validates them; invalid lines are reported "
        "with their line numbers and not pushed (exit code 1).",
    )  # fmt: skip
    push.add_argument("spider", metavar="SPIDER")
    push.add_argument("urls", metavar="URL", nargs="*", help="seeds given as arguments")
    push.add_argument(
        "-f", "--file", metavar="FILE", help="read seeds from FILE ('-': stdin, the default)"
    )
    push.add_argument(
        "--score", type=float, default=0.0,
        help="score of the seeds in zset mode (the highest is read first)",
    )  # fmt: skip
    push.add_argument("--dry-run", action="store_true", help="validate only, push nothing")
    push.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    push.add_argument("--json", action="store_true", help="print the summary as JSON")
    push.set_defaults(func=cmd_push)


def _status_parsers(commands: _Commands, common: argparse.ArgumentParser) -> None:
    status = commands.add_parser(
        "status", parents=[common], help="show a crawl's state (all crawls without SPIDER)",
        description="Seeds waiting, queued, leased, dead letters, progress, dupefilter "
        "size (Bloom fill and estimated false-positive rate), items, crawl rate over the "
        "last minute, live workers and their heartbeats.",
    )  # fmt: skip
    status.add_argument("spider", metavar="SPIDER", nargs="?")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument(
        "--interval", type=_positive, default=2.0, metavar="SECONDS",
        help="seconds between refreshes with --watch (default 2)",
    )  # fmt: skip
    status.add_argument("--stats", action="store_true", help="also list every crawl stat")
    status.set_defaults(func=cmd_status)

    jobs = commands.add_parser("jobs", parents=[common], help="list the crawls in Redis")
    jobs.add_argument("--json", action="store_true", help="print a JSON list")
    jobs.set_defaults(func=cmd_jobs)

    metrics = commands.add_parser(
        "metrics", parents=[common], help="serve the crawl's Prometheus metrics",
        description="Serve the crawl-wide gauges of the PrometheusMetrics extension "
        "without a worker (e.g. to scale a crawl up from zero workers).",
    )  # fmt: skip
    metrics.add_argument("spider", metavar="SPIDER")
    metrics.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    metrics.add_argument("--port", type=int, default=9410, help="TCP port (default 9410)")
    metrics.add_argument(
        "--interval", type=_positive, default=5.0, metavar="SECONDS",
        help="read Redis at most this often (default 5)",
    )  # fmt: skip
    metrics.add_argument("--once", action="store_true", help="print the metrics and exit")
    metrics.set_defaults(func=cmd_metrics)


def _dead_parsers(commands: _Commands, common: argparse.ArgumentParser) -> None:
    dead = commands.add_parser("dead", help="inspect and repair the dead-letter list")
    actions = dead.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("list", parents=[common], help="show records")
    show.add_argument("spider", metavar="SPIDER")
    show.add_argument("--limit", type=int, default=20, help="records shown (0: all)")
    show.add_argument("--kind", choices=("request", "seed"), help="only this kind")
    show.add_argument("--json", action="store_true", help="one JSON record per line")
    show.set_defaults(func=cmd_dead_list)

    requeue = actions.add_parser(
        "requeue", parents=[common], help="put records back in the queue or the seeds",
        description="Requests go back to the request queue with their priority, seeds "
        "to the seeds key; each record is removed from the list in the same transaction. "
        "Records that cannot be requeued (invalid seeds, unreadable requests) stay, are "
        "reported, and make the exit code 1.",
    )  # fmt: skip
    requeue.add_argument("spider", metavar="SPIDER")
    which = requeue.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every record")
    which.add_argument(
        "--index", type=int, nargs="+", metavar="I",
        help="records at these positions (as 'dead list' numbers them)",
    )  # fmt: skip
    requeue.add_argument("--kind", choices=("request", "seed"), help="only this kind")
    requeue.add_argument("--json", action="store_true", help="print the summary as JSON")
    requeue.set_defaults(func=cmd_dead_requeue)

    purge = actions.add_parser("purge", parents=[common], help="delete every record")
    purge.add_argument("spider", metavar="SPIDER")
    purge.add_argument("-y", "--yes", action="store_true", help="do not ask")
    purge.set_defaults(func=cmd_dead_purge)


def _data_parsers(commands: _Commands, common: argparse.ArgumentParser) -> None:
    reset = commands.add_parser(
        "reset", parents=[common], help="delete one crawl's (or job's) keys",
        description="Delete every key of one crawl: queue, seeds, dupefilter (Bloom "
        "segments included), leases, workers, progress, dead letters, items, stats. "
        "Other crawls, including other jobs of the same spider, are untouched. Refused "
        "while workers of the crawl are alive, unless --force.",
    )  # fmt: skip
    reset.add_argument("spider", metavar="SPIDER")
    reset.add_argument("-y", "--yes", action="store_true", help="do not ask")
    reset.add_argument("--force", action="store_true", help="even with live workers")
    reset.set_defaults(func=cmd_reset)

    export = commands.add_parser(
        "export", parents=[common], help="write the items list as JSON lines",
        description="Write the items stored by RedisPipeline, oldest first, one per line. "
        "With --delete, each chunk is removed from Redis once it is written and synced.",
    )  # fmt: skip
    export.add_argument("spider", metavar="SPIDER")
    export.add_argument(
        "-o", "--output", metavar="FILE", required=True, help="file to write ('-': stdout)"
    )
    export.add_argument("--delete", action="store_true", help="remove exported items")
    export.add_argument("--append", action="store_true", help="append to FILE")
    export.set_defaults(func=cmd_export)


def _version() -> str:
    """``scrapy-dist X (Scrapy Y, redis-py Z, Python V)``, without importing Scrapy."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from scrapy_dist import __version__

    try:
        scrapy_version = version("scrapy")
    except PackageNotFoundError:  # pragma: no cover - Scrapy is a requirement
        scrapy_version = "?"
    return (
        f"scrapy-dist {__version__} (Scrapy {scrapy_version}, redis-py "
        f"{redis.__version__}, Python {platform.python_version()})"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``scrapy-dist``."""
    parser = argparse.ArgumentParser(
        prog="scrapy-dist",
        description="Seed, watch and repair scrapy_dist crawls in Redis. Inside a Scrapy "
        "project, its settings and spiders are used.",
        epilog="Commands: push, status, jobs, dead list|requeue|purge, reset, export, "
        "metrics; 'scrapy-dist COMMAND --help' describes each. Exit codes: 0 ok; "
        "1 partly done, refused (also a destructive command without --yes when stdin is "
        "not a terminal) or Redis unreachable; 2 usage or configuration error; "
        "130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=_version())
    _add_common(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, suppress=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _push_parser(commands, common)
    _status_parsers(commands, common)
    _dead_parsers(commands, common)
    _data_parsers(commands, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``scrapy-dist`` with ``argv`` (default: the process's arguments).

    Returns:
        The exit status (see the module docstring).
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        # argparse cannot take push's URLs after options: "push books --job j1 URL..."
        if extra and args.command == "push" and not any(a.startswith("-") for a in extra):
            args.urls += extra
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help, or a usage error argparse has reported
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    ctx = Context(args)
    try:
        return int(args.func(ctx, args))
    except CommandError as e:
        _err(f"scrapy-dist: error: {e}")
        return e.code
    except RedisUnavailable as e:
        _err(f"scrapy-dist: error: {e}")
        return EXIT_FAILED
    except (redis.ConnectionError, redis.TimeoutError) as e:
        where = _describe(ctx.connected) if ctx.connected is not None else "the configured Redis"
        _err(f"scrapy-dist: error: lost Redis at {where}: {e}")
        return EXIT_FAILED
    except ConfigurationError as e:
        _err(f"scrapy-dist: error: {e}")
        return EXIT_USAGE
    except redis.exceptions.NoPermissionError as e:
        _err(f"scrapy-dist: error: no permission (Redis ACL of this user): {e}")
        return EXIT_FAILED
    except redis.ResponseError as e:
        code = EXIT_USAGE if str(e).startswith("WRONGTYPE") else EXIT_FAILED
        _err(f"scrapy-dist: error: Redis answered: {e}")
        return code
    except KeyboardInterrupt:
        _err("")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. piped into head
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
