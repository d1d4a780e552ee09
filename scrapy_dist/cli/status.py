"""``scrapy-dist status`` and ``scrapy-dist jobs``: one crawl's state, or every crawl's.

Both read through :func:`scrapy_dist.status.read_status`, the reader the metrics
extension uses too.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import redis

from scrapy_dist.cli._context import (
    EXIT_OK,
    Context,
    err,
    in_transition,
    out,
    positive,
    report_absent,
    when,
)
from scrapy_dist.cli._crawls import find_crawls
from scrapy_dist.cli.items import stream_lines
from scrapy_dist.config.topology import CLUSTER
from scrapy_dist.connection import SlotMoved, crawl_client, topology
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.keys import key_type, slot_name

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Mapping, Sequence

    from scrapy_dist.config.core import Config
    from scrapy_dist.status import CrawlStatus

    #: A crawl's status, or ``(crawl, why it cannot be read)``.
    Shown = CrawlStatus | tuple[str, str]


def _ago(seconds: float) -> str:
    return f"{seconds:.1f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def _shard_lines(status: CrawlStatus) -> list[str]:
    """One line per shard of a sharded crawl (``SCHEDULER_SHARDS``)."""
    return [
        f"  shard {shard['shard']:<5}{shard['queued']:>9}  queued, {shard['leased']} leased, "
        f"{shard['done']} done, {shard['dead']} dead letters"
        + ("" if shard.get("fingerprints") is None else f", {shard['fingerprints']} fingerprints")
        + f"  ({shard['crawl']})"
        for shard in status.shards
    ]


def _recrawl_lines(recrawl_after: float | None) -> list[str]:
    """The dupefilter's recrawl window (``DUPEFILTER_RECRAWL_AFTER``), if it has one."""
    if recrawl_after is None:
        return []
    return [
        f"  {'':<11}{'':>9}  recrawl window: {recrawl_after:g} s (a fingerprint counts as "
        "seen that long, then its page is fetched again)"
    ]


def _dupefilter_lines(status: CrawlStatus, row: str) -> list[str]:
    """The dupefilter's size (every shard's), its recrawl window and a Bloom filter's fill."""
    lines: list[str] = []
    df = status.dupefilter
    if df is None:
        lines.append(row.format("dupefilter", 0, "(none yet)"))
    else:
        note = f"fingerprints in {df.key} ({df.backend})"
        if status.shards:
            note = f"fingerprints in the {len(status.shards)} shards' {df.key}... ({df.backend})"
        lines.append(row.format("dupefilter", df.count, note))
        lines += _recrawl_lines(df.recrawl_after)
        if df.capacity:
            lines.append(
                f"  {'':<11}{'':>9}  Bloom: {df.count / df.capacity:.2%} of capacity "
                f"{df.capacity}, estimated false-positive rate {df.fpr_estimate:.3g} "
                f"(configured {df.error_rate:.3g}, {df.stages} filter(s))"
            )
    return lines


def _set_aside_lines(status: CrawlStatus) -> list[str]:
    """The keys and progress fields scripts set aside (written by hand), if any."""
    count = len(status.set_aside) + len(status.set_aside_fields)
    if not count:
        return []
    pad = f"  {'':<11}{'':>9}  "
    lines = [
        f"  {'set aside':<11}{count:>9}  found holding what the crawl cannot read (written "
        "by hand?) and kept aside: inspect, then delete them (`reset` deletes them too)"
    ]
    lines += [pad + key for key in status.set_aside]
    lines += [f"{pad}progress field {n} = {v!r}" for n, v in status.set_aside_fields.items()]
    return lines


#: Paused slots named in the text (the JSON has them all).
PAUSES_SHOWN = 5


def _pause_lines(status: CrawlStatus) -> list[str]:
    """The slots paused for every worker (a Retry-After, a run of 429/503), longest
    first."""
    pauses = status.paused_slots
    if not pauses:
        return []
    shown = ", ".join(
        f"{slot} ({left:.0f}s left)" for slot, left in list(pauses.items())[:PAUSES_SHOWN]
    )
    more = f", and {len(pauses) - PAUSES_SHOWN} more" if len(pauses) > PAUSES_SHOWN else ""
    return [f"  paused slots: {shown}{more} (asked to slow down: 429/503)"]


#: Busiest slots named in the text (the JSON has :data:`scrapy_dist.status.BUSIEST_SLOTS`).
SLOTS_SHOWN = 5


def _slot_lines(status: CrawlStatus) -> list[str]:
    """The download slots with the most requests sent, with their pages, 4xx, 5xx and
    failed requests."""
    if not status.busiest_slots:
        return []
    lines = [f"  download slots: {status.slots_counted} counted; most requests sent:"]
    for row in status.busiest_slots[:SLOTS_SHOWN]:
        lines.append(
            f"    {row['slot']}: {row['sent']} sent, {row['pages']} pages "
            f"({row['4xx']} 4xx, {row['5xx']} 5xx), {row['failed']} failed"
        )
    return lines


def _queue_slot_lines(status: CrawlStatus) -> list[str]:
    """A queue per download slot's slots: how many, the next ready by priority and the
    first waiting ones with the seconds until they are ready."""
    slots = status.queue_slots
    if not slots:
        return []
    lines = [
        f"  queue slots: {slots['ready']} ready, {slots['waiting']} waiting for their delay "
        "or pause"
    ]
    for row in slots["listed"][: 2 * SLOTS_SHOWN]:
        when_ready = "ready" if not row["ready_in"] else f"ready in {row['ready_in']:g} s"
        name = slot_name(row["slot"])
        if name in status.paused_slots:
            when_ready = f"paused, {when_ready}"
        lines.append(f"    {name or '(no host)'}: {row['queued']} queued, {when_ready}")
    return lines


def render_status(status: CrawlStatus, *, all_stats: bool = False) -> str:
    """The human-readable form of a crawl's status."""
    lines = [f"crawl {status.crawl}  at {status.redis}  [{status.shown_state}]"]
    if not status.exists:
        lines.append("  (no key of this crawl exists)")
    elif status.state == "waiting" and not status.seeds:
        lines.append(
            f"  (waiting for seeds: push one with redis-cli lpush {status.seeds_key} URL, "
            f"or scrapy-dist push {status.crawl.partition(':')[0]} URL)"
        )
    elif status.state == "idle" and status.progress.get("finished_at"):
        lines.append(
            f"  (empty, marked finished {when(status.progress.get('finished_at'))}, but "
            f"{len(status.live_workers())} live worker(s) may take more seeds: finished "
            "once they leave)"
        )
    elif status.state == "idle":
        lines.append(
            "  (empty, not marked finished: a worker with CLOSE_WHEN_CRAWL_DONE marks it "
            "CRAWL_DONE_GRACE s after the last page, any worker when it closes)"
        )
    row = "  {:<11}{:>9}  {}"
    lines.append(
        row.format("seeds", status.seeds, f"waiting in {status.seeds_key} ({status.seeds_kind})")
    )
    lines.append(
        row.format("queued", status.queued, f"in {status.queue_key} ({status.queue_kind})")
    )
    lines.append(row.format("leased", status.leased, "held by workers"))
    lines.append(row.format("dead", status.dead, f"in {status.dead_key}"))
    p = status.progress
    done_note = "requests"
    seeds_done = int(p.get("seeds_done", 0))
    if seeds_done:
        done_note += f" (and {seeds_done} seed(s) turned into requests)"
    done_note += f"; retried {int(p.get('retried', 0))}, dead-lettered {int(p.get('dead', 0))}"
    if p.get("finished_at"):
        done_note += f"; finished {when(p.get('finished_at'))}"
    lines.append(row.format("done", status.requests_done, done_note))
    lines += _dupefilter_lines(status, row)
    lines += _items_lines(status, row)
    lines += _rate_lines(status)
    lines += _worker_lines(status, row)
    lines += _control_lines(status)
    lines += _pause_lines(status)
    lines += _queue_slot_lines(status)
    lines += _slot_lines(status)
    lines += _shard_lines(status)
    lines += _set_aside_lines(status)
    if all_stats and status.stats:
        lines.append("  stats:")
        for name, value in status.stats.items():
            lines.append(f"    {name}: {value!r}")
    return "\n".join(lines)


def _items_lines(status: CrawlStatus, row: str) -> list[str]:
    """Items stored in the items list (or "not stored in Redis" when it does not
    exist), items scraped (the shared stats, up to ``STATS_FLUSH_INTERVAL`` behind) and
    the items stream."""
    scraped = status.stats.get("item_scraped_count")
    # scraped: the shared stats, written every STATS_FLUSH_INTERVAL; stored: now (and
    # what earlier runs left in the list)
    scraped_note = "" if scraped is None else f"{scraped} scraped (at the last stats flush)"
    if status.items_exist:
        note = f"stored in {status.items_key}" + (f"; {scraped_note}" if scraped_note else "")
        lines = [row.format("items", status.items_stored, note)]
    elif scraped is not None:
        lines = [row.format("items", scraped, f"scraped (not stored in {status.items_key})")]
    else:
        lines = []
    return lines + stream_lines(status.item_stream)


def _rate_lines(status: CrawlStatus) -> list[str]:
    """Pages and items per second over the time observed, or why there is no rate."""
    r = status.rates
    if r is None:
        return [
            f"  {'rate':<11}{'n/a':>9}  (the crawl's stats are not in Redis: set STATS_CLASS "
            "= 'scrapy_dist.stats.RedisStatsCollector' in the workers' settings)"
        ]
    if not r.window:
        return [f"  {'rate':<11}{'-':>9}  (no page fetched yet)"]
    return [
        f"  {'rate':<11}{r.pages_per_second:>9.1f}  pages/s, "
        f"{r.items_per_second:.1f} items/s over the last {r.window:g} s"
    ]


def _worker_lines(status: CrawlStatus, row: str) -> list[str]:
    """The workers: live, silent (missed two heartbeats) with the countdown until the
    leases they hold return (``SCHEDULER_LEASE_TIMEOUT``), gone; and how many leases of
    silent workers came back."""
    rows = status.worker_rows()
    # live as --json, the page and the metrics count them (heartbeat within
    # SCHEDULER_WORKER_TIMEOUT), the silent ones among them named: the text used to count
    # only the others, and said "0 live" of a crawl whose metrics said 2 workers
    silent = status.silent_workers()
    note = "live" + (f", {silent} of them silent" if silent else "")
    registered = f"(of {len(status.workers)} registered)"
    lines = [row.format("workers", len(status.live_workers()), f"{note} {registered}")]
    pad = f"  {'':<11}{'':>9}  "
    for r in rows:
        heard = "no heartbeat" if r["age"] is None else f"heartbeat {_ago(r['age'])}"
        held, left = r["leases"], r["leases_return_in"]
        if r["state"] == "live":
            text = f"{heard}, {held} lease(s)" if held else heard
        else:
            text = f"{r['state']}: {heard}"
            if held and left:
                text += (
                    f"; its {held} lease(s) return to the queue in {left:.0f} s "
                    "(SCHEDULER_LEASE_TIMEOUT after its last renewal)"
                )
            elif held:
                text += (
                    f"; its {held} lease(s) expired: the next reserve of any worker returns them"
                )
            else:
                text += "; holds no lease"
        lines.append(f"{pad}{r['id']}  {text}")
    reclaimed = int(status.progress.get("reclaimed", 0))
    if reclaimed:
        lines.append(f"{pad}{reclaimed} expired lease(s) of silent workers came back to the queue")
    return lines


def _control_lines(status: CrawlStatus) -> list[str]:
    """The crawl control row (:mod:`scrapy_dist.control`): its state, since when, by
    whom and why."""
    control = status.control
    if control is None:
        return [f"  {'control':<11}{'?':>9}  (could not be read)"]
    note = control.describe().partition(" ")[2] or "(never paused)"
    if control.problem:
        note += ": workers take no work; set the state with scrapy-dist pause|resume|drain"
    return [f"  {'control':<11}{control.state:>9}  {note}"]


def _warn_untagged_seeds(client: redis.Redis, seeds: str) -> None:
    """Under Redis Cluster, say on stderr if seeds wait in the crawl's seeds key without
    its hash tag (``books:start_urls`` for ``{books}:start_urls``): the workers never
    read them."""
    if topology(client) != CLUSTER or not seeds.startswith("{"):
        return
    tag, _, rest = seeds[1:].partition("}")
    untagged = tag + rest
    try:
        kind = key_type(client, untagged)
    except redis.RedisError:
        return
    if kind != "none":
        err(
            f"scrapy-dist: warning: {untagged!r} exists ({kind}), but under Redis Cluster "
            f"this crawl reads its seeds from {seeds!r}: push there (redis-cli -c lpush "
            f"'{seeds}' URL, or scrapy-dist push)"
        )


def cmd_status(ctx: Context, args: argparse.Namespace) -> int:
    """Show one crawl's state, or every crawl's. A crawl with no keys is shown as
    ``absent`` (a state, so the exit status is 0) and reported on stderr with the
    crawls that exist."""
    from scrapy_dist.status import read_status

    absent = False
    if args.spider is not None:
        layout, config, _ = ctx.layout(args.spider)
        client = ctx.crawl_client(config, layout)
        _warn_untagged_seeds(ctx.client(config), layout.seeds)

        def read() -> list[Shown]:
            nonlocal absent
            if args.watch:  # a key turned unreadable mid-watch is shown, not the end
                shown = _or_error(layout.keys.crawl, lambda: read_status(client, layout, config))
                if isinstance(shown, tuple):
                    return [shown]
                status = shown
            else:
                status = read_status(client, layout, config)
            if not status.exists and not absent:
                report_absent(client, layout, config)
            absent = not status.exists
            return [status]
    else:
        config, _ = ctx.config()
        client = ctx.client(config)
        redis_keys = ctx.redis_keys()

        def read() -> list[Shown]:
            return [
                _status_or_error(client, crawl, config, redis_keys=redis_keys)
                for crawl in find_crawls(client, config, redis_keys=redis_keys)
            ]

    try:
        return _show(args, read)
    except KeyboardInterrupt:
        if args.watch:  # how --watch ends, whether it was reading or sleeping
            return EXIT_OK
        raise


def _show(args: argparse.Namespace, read: Callable[[], list[Shown]]) -> int:
    """Print the statuses ``read`` gives, once, or every ``--interval`` with ``--watch``."""
    from scrapy_dist.status import json_default, json_safe

    tty = sys.stdout.isatty()
    while True:
        statuses: Sequence[Shown] = read()
        if args.json:
            payload: Any = (
                _as_dict(statuses[0])
                if args.spider is not None
                else {"crawls": [_as_dict(s) for s in statuses]}
            )
            out(json.dumps(json_safe(payload), default=json_default, allow_nan=False))
        else:
            text = "\n\n".join(_render(s, all_stats=args.stats) for s in statuses)
            if not statuses:
                text = "no crawl found in Redis"
            if args.watch and tty:
                sys.stdout.write("\x1b[H\x1b[2J")
                text += f"\n\n(every {args.interval:g} s; Ctrl-C to stop)"
            elif args.watch:
                text += "\n"
            out(text)
        sys.stdout.flush()
        if not args.watch:
            return EXIT_OK
        time.sleep(args.interval)


def _status_or_error(
    client: redis.Redis,
    crawl: str,
    config: Config,
    *,
    dupefilter: bool = True,
    redis_keys: Mapping[str, str] | None = None,
) -> Shown:
    """Crawl ``crawl``'s status, or ``(crawl, why it cannot be read)``: one crawl whose
    keys were written by hand, or whose spider's own settings differ (a seeds set where
    the project's settings expect a list), must not hide every other crawl. Its seeds
    key is its spider's ``redis_key`` (``redis_keys``: spider -> template) if it has one."""
    from dataclasses import replace

    from scrapy_dist.status import CrawlLayout, read_status

    def read() -> CrawlStatus:
        layout = CrawlLayout.for_crawl(config, crawl)
        template = (redis_keys or {}).get(crawl.partition(":")[0])
        if template:
            keys = replace(layout.keys, start_urls=layout.keys.start_urls_key(template))
            layout = replace(layout, keys=keys, seeds=keys.start_urls)
        return read_status(crawl_client(client, layout.keys), layout, config, dupefilter=dupefilter)

    return _or_error(crawl, read)


def _or_error(crawl: str, read: Callable[[], CrawlStatus]) -> Shown:
    """``read()``, or ``(crawl, why it cannot be read)`` if a key of the crawl holds
    another type or cannot be read (the settings' wrong type, ``WRONGTYPE``, an ACL)."""
    try:
        return read()
    except ConfigurationError as e:
        return crawl, str(e)
    except redis.exceptions.NoPermissionError:
        return crawl, "no permission to read this crawl's keys (Redis ACL of this user)"
    except redis.exceptions.ResponseError as e:
        return crawl, in_transition(e) or f"Redis answered: {e}"
    except SlotMoved as e:  # this crawl's slot is being moved: the others can be read
        return crawl, str(e)


def _as_dict(status: Shown) -> dict[str, Any]:
    if isinstance(status, tuple):
        return {"crawl": status[0], "error": status[1]}
    return status.as_dict()


def _render(status: Shown, *, all_stats: bool) -> str:
    if isinstance(status, tuple):
        return f"crawl {status[0]}  [error]\n  {status[1]}"
    return render_status(status, all_stats=all_stats)


def cmd_jobs(ctx: Context, args: argparse.Namespace) -> int:
    """List the crawls in Redis (``SCAN``) with their main counts."""
    config, _ = ctx.config()
    client = ctx.client(config)
    redis_keys = ctx.redis_keys()
    rows = []
    for crawl in find_crawls(client, config, redis_keys=redis_keys):
        spider, _, job = crawl.partition(":")
        row: dict[str, Any] = {"crawl": crawl, "spider": spider, "job": job or None}
        status = _status_or_error(client, crawl, config, dupefilter=False, redis_keys=redis_keys)
        if isinstance(status, tuple):
            row["error"] = status[1]
        else:
            row.update(
                state=status.state,
                seeds=status.seeds,
                queued=status.queued,
                leased=status.leased,
                dead=status.dead,
                workers=len(status.live_workers()),
                done=status.requests_done,
                items=status.items_stored,
            )
        rows.append(row)
    if args.json:
        out(json.dumps(rows))
        return EXIT_OK
    if not rows:
        out("no crawl found in Redis")
        return EXIT_OK
    columns = [
        "spider",
        "job",
        "state",
        "seeds",
        "queued",
        "leased",
        "dead",
        "workers",
        "done",
        "items",
    ]
    table = [[c.upper() for c in columns]]
    for row in rows:
        if "error" in row:
            table.append([row["spider"], row["job"] or "-", f"error: {row['error']}"])
        else:
            table.append([str(row[c]) if row[c] is not None else "-" for c in columns])
    full = [r for r in table if len(r) == len(columns)]
    widths = [max(len(r[i]) for r in full) for i in range(len(columns))]
    for r in table:
        out("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
    return EXIT_OK


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``status`` and ``jobs`` to the subcommands."""
    status = commands.add_parser(
        "status",
        parents=[common],
        help="show a crawl's state (all crawls without SPIDER)",
        description="Seeds waiting, queued, leased, dead letters, progress, dupefilter "
        "size (Bloom fill and estimated false-positive rate), items, crawl rate over the "
        "last minute, live workers and their heartbeats.",
    )
    status.add_argument("spider", metavar="SPIDER", nargs="?")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument(
        "--interval",
        type=positive,
        default=2.0,
        metavar="SECONDS",
        help="seconds between refreshes with --watch (default 2)",
    )
    status.add_argument("--stats", action="store_true", help="also list every crawl stat")
    status.set_defaults(func=cmd_status)

    jobs = commands.add_parser("jobs", parents=[common], help="list the crawls in Redis")
    jobs.add_argument("--json", action="store_true", help="print a JSON list")
    jobs.set_defaults(func=cmd_jobs)
