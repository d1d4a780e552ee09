"""``scrapy-dist items tail|replay|lag|groups|dead SPIDER``: the items stream of
:class:`~scrapy_dist.pipelines.RedisStreamPipeline` and its consumer groups.

``tail`` and ``replay`` print entries as JSON lines ``{"id", "time", "item", ...}``
(the item parsed if it is JSON, else its text; never unpickled), and change nothing.
Entries are untrusted: one that cannot be shown (an item nested too deep to decode or
print) is reported on stderr, with the reason :class:`~scrapy_dist.streams.ItemConsumer`
gives, and the others are printed.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, cast

from scrapy_dist.cli._context import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    Context,
    confirm,
    err,
    out,
    positive,
)

if TYPE_CHECKING:
    import argparse

    import redis

    from scrapy_dist.config.core import Config
    from scrapy_dist.status import CrawlLayout
    from scrapy_dist.stream_admin import StreamState


def _count(text: str) -> int:
    """An ``argparse`` type: a whole number of entries, 0 or more."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"cannot be negative: {text!r}")
    return value


def _timeout(text: str) -> float:
    """An ``argparse`` type: seconds above 0 (``inf`` allowed, ``nan`` not: it would
    never end the wait it bounds)."""
    import argparse
    import math

    value = positive(text)
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    return value


#: Longest single wait of ``tail``, in seconds (so Ctrl-C and --timeout are seen).
TAIL_BLOCK = 1.0


def stream_lines(stream: StreamState | None) -> list[str]:
    """Lines of ``scrapy-dist status`` for the items stream: length, dead entries and
    each group's lag and pending count (none without a stream)."""
    if stream is None:
        return []
    row = "  {:<11}{:>9}  {}"
    lines = [row.format("stream", stream.length, f"entries in {stream.key}")]
    lines.append(row.format("", stream.dead, f"dead in {stream.dead_key}"))
    for g in stream.groups:
        lag = "?" if g.lag is None else str(g.lag)
        lines.append(
            f"  {'':<11}{'':>9}  group {g.name}: lag {lag}, pending {g.pending}, "
            f"{len(g.consumers)} consumer(s)"
        )
    return lines


def _open(ctx: Context, args: argparse.Namespace) -> tuple[redis.Redis, CrawlLayout, Config]:
    """The client of the crawl's stream, its layout and config; the stream checked to
    be absent or a stream."""
    from scrapy_dist.cli._context import check_key
    from scrapy_dist.connection import crawl_client

    layout, config, _ = ctx.layout(args.spider)
    stream = layout.items_stream
    client = crawl_client(ctx.client(config), layout.keys, extra=(stream,))
    check_key(client, stream, "stream", "items stream")
    return client, layout, config


def _record(entry_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """An entry as a JSON-able record (its item parsed when it is JSON, else its text).

    Raises:
        MalformedItem: the item's decoding failed other than as text that is not JSON
            (JSON nested too deep: ``ItemConsumer`` dead-letters it for that reason).
    """
    from scrapy_dist.streams import MalformedItem, checked_item

    record: dict[str, Any] = {"id": entry_id, "time": int(entry_id.partition("-")[0]) / 1000}
    for name, value in fields.items():
        if name == "item":
            try:
                record["item"] = checked_item(value)
            except MalformedItem as e:
                if not isinstance(e.__cause__, ValueError):
                    raise
                record["item"] = value
        else:
            record[name] = value
    return record


def _print(stream: str, entry_id: str, fields: dict[str, str]) -> bool:
    """Print an entry as one JSON line; one that cannot be shown is reported on stderr.

    Returns:
        Whether it was printed.
    """
    from scrapy_dist.cli.dead import json_line
    from scrapy_dist.streams import MalformedItem

    try:
        line = json_line(_record(entry_id, fields))
    except MalformedItem as e:
        reason = str(e)
    except RecursionError as e:  # decoded, too deep to encode again
        reason = f"malformed item: {type(e).__name__}: {e}"
    else:
        out(line)
        return True
    err(f"entry {entry_id} of {stream!r} not printed: {reason}")
    return False


def cmd_tail(ctx: Context, args: argparse.Namespace) -> int:
    """Print new entries as they come (from ``--from``; default: only new ones), until
    ``--count`` entries, ``--timeout`` seconds without one, or Ctrl-C."""
    from scrapy_dist.stream_admin import COUNT_CHUNK, read_range, to_stream_id

    client, layout, _ = _open(ctx, args)
    stream = layout.items_stream
    shown = 0
    position = to_stream_id(args.start)
    if position not in ("$", "+"):  # the backlog first
        for entry_id, fields in read_range(client, stream, position, count=args.count):
            _print(stream, entry_id, fields)
            shown += 1
            position = entry_id
        if position == "-":  # nothing yet: XREAD takes no "-", follow from the start
            position = "0-0"
    else:
        last = cast("list[Any]", client.xrevrange(stream, "+", "-", count=1))
        position = last[0][0].decode() if last else "0-0"
    idle_since = time.monotonic()
    while args.count is None or shown < args.count:
        if args.timeout is not None and time.monotonic() - idle_since >= args.timeout:
            break
        want = None if args.count is None else min(args.count - shown, COUNT_CHUNK)
        reply = client.xread({stream: position}, count=want, block=int(TAIL_BLOCK * 1000))
        for _, entries in cast("list[Any]", reply or []):
            for raw_id, raw in entries:
                entry_id = raw_id.decode()
                _print(stream, entry_id, {_t(k): _t(v) for k, v in raw.items()})
                shown += 1
                position = entry_id
                idle_since = time.monotonic()
    return EXIT_OK


def _t(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def cmd_replay(ctx: Context, args: argparse.Namespace) -> int:
    """Print the entries from ``--since`` to ``--until``; with ``--group``, move the
    group back to ``--since`` instead, so its consumers read them all again."""
    from scrapy_dist.stream_admin import read_range, set_group_position, to_stream_id

    client, layout, _ = _open(ctx, args)
    stream = layout.items_stream
    if args.group:
        if args.until != "+":
            raise CommandError("--until cannot be used with --group (a group reads to the end)")
        groups = {_t(g["name"]) for g in _groups(client, stream)}
        if args.group not in groups:
            raise CommandError(f"no group {args.group!r} on {stream!r}", EXIT_FAILED)
        start = to_stream_id(args.since)
        if not confirm(f"Make group {args.group!r} read {stream!r} again from {start}?", args.yes):
            err("nothing changed")
            return EXIT_FAILED
        set_group_position(client, stream, args.group, start)
        out(f"group {args.group!r} of {stream!r} reads again from {start}")
        return EXIT_OK
    shown = bad = 0
    for entry_id, fields in read_range(client, stream, args.since, args.until, count=args.count):
        bad += not _print(stream, entry_id, fields)
        shown += 1
    unshown = f" ({bad} not printed, reported above)" if bad else ""
    err(f"{shown} entr{'y' if shown == 1 else 'ies'} of {stream!r}{unshown}")
    return EXIT_OK


def _groups(client: redis.Redis, stream: str) -> list[dict[str, Any]]:
    if not client.exists(stream):
        return []
    groups: list[dict[str, Any]] = client.xinfo_groups(stream)
    return groups


def cmd_lag(ctx: Context, args: argparse.Namespace) -> int:
    """Each group's lag, pending count, last delivered id and consumers (idle times)."""
    from scrapy_dist.stream_admin import stream_state

    client, layout, _ = _open(ctx, args)
    state = stream_state(client, layout.items_stream)
    groups = [] if state is None else state.groups
    if args.group:
        groups = [g for g in groups if g.name == args.group]
    if args.json:
        payload = None if state is None else state.as_dict()
        if payload is not None:
            payload["groups"] = [g.as_dict() for g in groups]
        out(json.dumps({"stream": layout.items_stream, "state": payload}))
        return EXIT_OK
    if state is None:
        out(f"no items stream {layout.items_stream!r} (RedisStreamPipeline writes it)")
        return EXIT_OK
    out(
        f"stream {state.key}: {state.length} entries (first {state.first_id or '-'}, last "
        f"{state.last_id or '-'}), {state.dead} dead in {state.dead_key}"
    )
    if not groups:
        out("no consumer group" + (f" named {args.group!r}" if args.group else ""))
    for g in groups:
        lag = "? (more than counted)" if g.lag is None else str(g.lag)
        read = "-" if g.entries_read is None else g.entries_read
        out(
            f"group {g.name}: lag {lag}, pending {g.pending}, last delivered "
            f"{g.last_delivered}, entries read {read}"
        )
        for c in g.consumers:
            out(f"  consumer {c.name}: pending {c.pending}, idle {c.idle:.1f} s")
    return EXIT_OK


def cmd_groups(ctx: Context, args: argparse.Namespace) -> int:
    """List the groups; or create one (``--create``), move one (``--set-id``), delete
    one (``--delete``)."""
    from scrapy_dist.stream_admin import create_group, set_group_position, to_stream_id

    client, layout, _ = _open(ctx, args)
    stream = layout.items_stream
    if args.create:
        start = to_stream_id(args.start)
        made = create_group(client, stream, args.create, start)
        out(
            f"group {args.create!r} of {stream!r} "
            + (f"created, reading from {start}" if made else "exists: left as it is")
        )
        return EXIT_OK
    if args.set_id:
        set_group_position(client, stream, args.set_id, args.start)
        out(f"group {args.set_id!r} of {stream!r} reads from {to_stream_id(args.start)}")
        return EXIT_OK
    if args.delete:
        if not confirm(
            f"Delete group {args.delete!r} of {stream!r} (its pending items included)?",
            args.yes,
        ):
            err("nothing deleted")
            return EXIT_FAILED
        done = int(client.xgroup_destroy(stream, args.delete)) if client.exists(stream) else 0
        out(f"group {args.delete!r} " + ("deleted" if done else "did not exist"))
        return EXIT_OK if done else EXIT_FAILED
    names = [_t(g["name"]) for g in _groups(client, stream)]
    if args.json:
        out(json.dumps(names))
    else:
        for name in names:
            out(name)
    return EXIT_OK


def cmd_dead(ctx: Context, args: argparse.Namespace) -> int:
    """List the dead stream's entries; ``--requeue`` some (or ``--all``) to the stream;
    ``--purge`` it."""
    from scrapy_dist.cli.dead import json_line
    from scrapy_dist.keys import stream_dead_key
    from scrapy_dist.stream_admin import check_id, dead_entries, requeue_dead

    client, layout, config = _open(ctx, args)
    stream = layout.items_stream
    dead = stream_dead_key(stream)
    from scrapy_dist.cli._context import check_key

    check_key(client, dead, "stream", "dead items stream")
    if args.purge:
        total = int(client.xlen(dead))
        if not confirm(f"Delete the {total} entries of {dead!r}?", args.yes):
            err("nothing deleted")
            return EXIT_FAILED
        client.delete(dead)
        out(f"deleted {total} dead entr{'y' if total == 1 else 'ies'}")
        return EXIT_OK
    if args.requeue or args.all:
        ids = [check_id(i) for i in args.requeue or ()]
        if args.all:
            ids = [entry_id for entry_id, _ in dead_entries(client, stream)]
        moved = missing = 0
        for entry_id in ids:
            new = requeue_dead(client, stream, entry_id, config.items.stream_maxlen)
            if new is None:
                missing += 1
                err(f"no dead entry {entry_id}")
            else:
                moved += 1
        summary = {"requeued": moved, "missing": missing}
        out(json.dumps(summary) if args.json else f"requeued {moved} to {stream!r}")
        return EXIT_OK if not missing else EXIT_FAILED
    limit = None if args.limit == 0 else args.limit
    for entry_id, fields in dead_entries(client, stream, count=limit):
        if args.json:
            _print(dead, entry_id, fields)
        else:
            reason = fields.get("dead_reason", "")
            item = fields.get("item", "")
            if len(item) > 120:
                item = item[:117] + "..."
            out(
                f"{entry_id}  from {fields.get('dead_id', '?')} group "
                f"{fields.get('dead_group', '?')}, {fields.get('dead_deliveries', '?')} "
                f"deliveries: {reason}\n    {json_line(item)}"
            )
    return EXIT_OK


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``items tail|replay|lag|groups|dead`` to the subcommands."""
    items = commands.add_parser(
        "items",
        help="the items stream (RedisStreamPipeline): tail, replay, lag, groups, dead",
    )
    actions = items.add_subparsers(dest="action", metavar="ACTION", required=True)

    tail = actions.add_parser(
        "tail",
        parents=[common],
        help="print new items as they come (like tail -f)",
        description="Print the items stream's new entries as JSON lines until --count "
        "entries, --timeout seconds without one, or Ctrl-C. Reads only (no group).",
    )
    tail.add_argument("spider", metavar="SPIDER")
    tail.add_argument(
        "--from",
        dest="start",
        default="$",
        metavar="POSITION",
        help="start here (an id, ms, ISO time or 2h ago; default $: new entries only)",
    )
    tail.add_argument("-n", "--count", type=_count, default=None, help="stop after N entries")
    tail.add_argument("--timeout", type=_timeout, default=None, metavar="SECONDS",
                      help="stop after this long without a new entry")  # fmt: skip
    tail.add_argument("--json", action="store_true", help="JSON lines (the default output)")
    tail.set_defaults(func=cmd_tail)

    replay = actions.add_parser(
        "replay",
        parents=[common],
        help="print the items from a time or id; or make a group read them again",
        description="Print the entries from --since to --until (both inclusive; an id "
        "1700000000000-0, Unix ms, an ISO time 2026-11-23T10:00 in UTC unless zoned, or a "
        "time ago such as 2h). With --group, move that consumer group back to --since "
        "instead (XGROUP SETID): its consumers read every entry since again.",
    )
    replay.add_argument("spider", metavar="SPIDER")
    replay.add_argument("--since", default="-", metavar="POSITION", help="first (default -)")
    replay.add_argument("--until", default="+", metavar="POSITION", help="last (default +)")
    replay.add_argument("-n", "--count", type=_count, default=None, help="at most N entries")
    replay.add_argument("--group", metavar="GROUP", help="move this group back instead")
    replay.add_argument("-y", "--yes", action="store_true", help="do not ask (with --group)")
    replay.add_argument("--json", action="store_true", help="JSON lines (the default output)")
    replay.set_defaults(func=cmd_replay)

    lag = actions.add_parser(
        "lag",
        parents=[common],
        help="each consumer group's lag, pending items and consumers",
        description="Per group: lag (entries not yet delivered to it, exact), pending "
        "(delivered, not acknowledged), last delivered id, and each consumer's pending "
        "items and idle time.",
    )
    lag.add_argument("spider", metavar="SPIDER")
    lag.add_argument("--group", metavar="GROUP", help="only this group")
    lag.add_argument("--json", action="store_true", help="print one JSON object")
    lag.set_defaults(func=cmd_lag)

    groups = actions.add_parser(
        "groups", parents=[common], help="list, create, move or delete consumer groups"
    )
    groups.add_argument("spider", metavar="SPIDER")
    which = groups.add_mutually_exclusive_group()
    which.add_argument("--create", metavar="GROUP", help="create a group (from --from)")
    which.add_argument("--set-id", metavar="GROUP", help="make a group read from --from")
    which.add_argument("--delete", metavar="GROUP", help="delete a group")
    groups.add_argument(
        "--from",
        dest="start",
        default="0",
        metavar="POSITION",
        help="where --create/--set-id start (0: every entry, $: new ones, an id or a time)",
    )
    groups.add_argument("-y", "--yes", action="store_true", help="do not ask (--delete)")
    groups.add_argument("--json", action="store_true", help="print a JSON list")
    groups.set_defaults(
        func=cmd_groups, writes=lambda args: bool(args.create or args.set_id or args.delete)
    )

    dead = actions.add_parser(
        "dead",
        parents=[common],
        help="list, requeue or purge the dead items stream",
        description="Items a consumer rejected max_deliveries times, delivered that often "
        "without acknowledgement, or malformed, with the reason. --requeue adds them to "
        "the stream again as new entries (every group reads them again).",
    )
    dead.add_argument("spider", metavar="SPIDER")
    dead.add_argument("--limit", type=_count, default=20, help="entries shown (0: all)")
    action = dead.add_mutually_exclusive_group()
    action.add_argument("--requeue", nargs="+", metavar="ID", help="requeue these dead ids")
    action.add_argument("--all", action="store_true", help="requeue every dead entry")
    action.add_argument("--purge", action="store_true", help="delete the dead stream")
    dead.add_argument("-y", "--yes", action="store_true", help="do not ask (--purge)")
    dead.add_argument("--json", action="store_true", help="JSON lines / JSON summary")
    dead.set_defaults(
        func=cmd_dead, writes=lambda args: bool(args.requeue or args.all or args.purge)
    )
