"""``scrapy-dist pause|resume|drain SPIDER``: steer a running crawl
(:mod:`scrapy_dist.control`).

Each command sets the crawl's control state (who: ``--by``, default ``user@host``; why:
``--reason``) and says what it was before; setting the state a crawl already has
changes nothing. Workers act on it within about half a second. ``--wait`` then waits
until the workers have done so: for ``pause``, until no live worker holds a lease (what
was in progress finished and was acknowledged, buffers handed back); for ``drain``,
also until every worker exited. Exit status 1 if that takes longer than ``--timeout``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scrapy_dist.cli._context import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    Context,
    crawl_exists,
    err,
    out,
    positive,
    report_absent,
)
from scrapy_dist.control import (
    BY_MAX,
    DRAINING,
    PAUSED,
    REASON_MAX,
    RUNNING,
    CrawlControl,
    check_text,
    set_state,
)
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    import argparse

    import redis

    from scrapy_dist.config.core import Config

#: Command -> the state it sets.
COMMANDS = {"pause": PAUSED, "resume": RUNNING, "drain": DRAINING}


def cmd_control(ctx: Context, args: argparse.Namespace) -> int:
    """Set the crawl's control state (see the module docstring)."""
    state = COMMANDS[args.command]
    layout, config, _ = ctx.layout(args.spider)
    client = ctx.crawl_client(config, layout)
    if not crawl_exists(client, layout):
        _refuse_a_stamp_of_now(client, layout.keys.crawl, args.spider, config)
        # pausing a crawl before its workers start is fine: say so, and go on
        report_absent(client, layout, config)
    control = CrawlControl(client, layout.keys, worker_timeout=config.workers.worker_timeout)
    try:
        before, after = set_state(client, layout.keys, state, by=args.by, reason=args.reason)
    except ConfigurationError as e:
        raise CommandError(str(e)) from None
    changed = after is not before
    result: dict[str, Any] = {
        "crawl": layout.keys.crawl,
        "key": layout.keys.control,
        "changed": changed,
        "before": before.as_dict(),
        "state": after.as_dict(),
    }
    if not args.json:
        if changed:
            out(f"crawl {layout.keys.crawl}: {before.state} -> {after.describe()}")
        else:
            out(f"crawl {layout.keys.crawl}: already {after.describe()}")
    status = EXIT_OK
    if args.wait and state != RUNNING:
        found = control.wait_settled(exited=state == DRAINING, timeout=args.timeout)
        result["leased"], result["workers"] = found.leased, found.workers
        done = found.leased == 0 and (state != DRAINING or found.workers == 0)
        result["settled"] = done
        if not done:
            status = EXIT_FAILED
            err(
                f"scrapy-dist: after {args.timeout:g} s, {found.leased} lease(s) still held "
                f"and {found.workers} worker(s) live"
            )
        elif not args.json:
            what = "every worker exited" if state == DRAINING else "in-flight work finished"
            out(f"crawl {layout.keys.crawl}: {what}, nothing leased")
    if args.json:
        out(json.dumps(result))
    return status


def _refuse_a_stamp_of_now(client: redis.Redis, crawl: str, spider: str, config: Config) -> None:
    """Refuse to steer crawl ``crawl``, which has no keys, when its name is the
    ``SCHEDULER_JOB_TIMESTAMP`` stamp of this moment and the spider has crawls in Redis:
    the stamp rolled over since the workers took theirs, so the command would miss their
    crawl and leave a state for the next one to find (a drain just after midnight with a
    daily stamp drains tomorrow's crawl).

    Raises:
        CommandError: exit code 1, naming the spider's crawls (pass ``--job``).
    """
    from scrapy_dist.cli._crawls import find_crawls

    if not config.keys.job_timestamp:
        return
    crawls = [c for c in find_crawls(client, config) if c.partition(":")[0] == spider]
    if crawls:
        raise CommandError(
            f"crawl {crawl!r} has no keys: SCHEDULER_JOB_TIMESTAMP names it from the clock "
            f"now, and the crawls of {spider!r} in Redis are {', '.join(crawls)}; pass "
            "--job with the one to steer (nothing was changed)",
            EXIT_FAILED,
        )


def _seconds(text: str) -> float:
    """An ``argparse`` type: a finite number of seconds above 0."""
    import argparse
    import math

    value = positive(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number: {text!r}")
    return value


def _text(most: int, what: str) -> Any:
    """An ``argparse`` type: printable text of at most ``most`` characters."""
    import argparse

    def parse(value: str) -> str:
        try:
            return check_text(value, what, most)
        except ConfigurationError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``pause``, ``resume`` and ``drain`` to the subcommands."""
    helps = {
        "pause": (
            "stop every worker taking new requests (in-flight ones finish)",
            "Workers stop taking requests and seeds within about a second; requests "
            "already in progress finish and are acknowledged; buffered ones are handed "
            "back to the queue. Workers stay up, and the crawl is never marked finished "
            "while paused. 'resume' continues.",
        ),
        "resume": (
            "let a paused or drained crawl's workers take work again",
            "Workers that are up continue within about a second; after a drain, start "
            "workers again.",
        ),
        "drain": (
            "finish in-flight work, hand back the rest, and make every worker exit",
            "Workers take nothing more, finish what is in progress, hand back what they "
            "buffered and exit with the close reason 'drained' (status 0); the queue keeps "
            "the rest. Workers started while the crawl drains exit at once: 'resume' "
            "lets them run.",
        ),
    }
    for name, (summary, description) in helps.items():
        parser = commands.add_parser(name, parents=[common], help=summary, description=description)
        parser.add_argument("spider", metavar="SPIDER")
        parser.add_argument(
            "--reason",
            type=_text(REASON_MAX, "--reason"),
            default="",
            help=f"why (shown by 'status'; at most {REASON_MAX} characters)",
        )
        parser.add_argument(
            "--by",
            type=_text(BY_MAX, "--by"),
            default=None,
            help="who (default: user@host)",
        )
        if name != "resume":
            parser.add_argument(
                "--wait",
                action="store_true",
                help="wait until the workers have done it (exit 1 after --timeout)",
            )
            parser.add_argument(
                "--timeout",
                type=_seconds,
                default=60.0,
                metavar="SECONDS",
                help="seconds --wait waits (default 60)",
            )
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
        parser.set_defaults(func=cmd_control, wait=False, timeout=60.0, writes=True)
