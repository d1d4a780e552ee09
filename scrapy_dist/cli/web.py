"""``scrapy-dist web SPIDER``: serve a live page of the crawl (:mod:`scrapy_dist.web`).

Binds 127.0.0.1 by default and is read-only; ``--actions`` adds pause, resume, drain,
requeue and purge, guarded by a token printed in the page's address (after ``#``, so
never sent to a server or kept in its logs) and, with ``--auth USER:PASSWORD`` (or
``SCRAPY_DIST_WEB_AUTH``), basic auth. Actions on an address other machines can reach
need ``--auth``. Runs until interrupted (exit 0), or ``--once`` prints the summary's
JSON and exits.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from typing import TYPE_CHECKING, Any

from scrapy_dist.cli._context import (
    EXIT_OK,
    CommandError,
    Context,
    crawl_exists,
    out,
    positive,
    report_absent,
)
from scrapy_dist.control import default_by
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    import argparse

#: The environment variables of the action token and of basic auth.
TOKEN_VARIABLE, AUTH_VARIABLE = "SCRAPY_DIST_WEB_TOKEN", "SCRAPY_DIST_WEB_AUTH"


def cmd_web(ctx: Context, args: argparse.Namespace) -> int:
    """Serve the page until interrupted (see the module docstring)."""
    from scrapy_dist.web.server import WebServer
    from scrapy_dist.web.views import Dashboard

    layout, config, spidercls = ctx.layout(args.spider)
    client = ctx.crawl_client(config, layout)
    if not crawl_exists(client, layout):
        report_absent(client, layout, config)  # the page shows it absent until it starts
    dashboard = Dashboard(client, layout, config, spidercls)
    if args.once:
        out(json.dumps(dashboard.summary(), default=str))
        return EXIT_OK
    auth = args.auth or os.environ.get(AUTH_VARIABLE) or None
    if auth is not None and ":" not in auth:
        raise CommandError("--auth expects USER:PASSWORD")
    token = os.environ.get(TOKEN_VARIABLE) or secrets.token_urlsafe(24)
    try:
        server = WebServer(
            dashboard,
            host=args.host,
            port=args.port,
            actions=args.actions,
            token=token,
            auth=auth,
            refresh=args.refresh,
            by=f"web:{default_by()}",
        )
    except ConfigurationError as e:
        raise CommandError(str(e)) from None
    except OSError as e:
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {e}", 1) from None
    server.start()
    url = server.url + (f"#token={token}" if args.actions else "")
    mode = "actions enabled" if args.actions else "read-only (--actions to steer)"
    out(f"crawl {layout.keys.crawl}: {url}  ({mode}; Ctrl-C stops)")
    sys.stdout.flush()  # (a pipe: whoever started it reads the address now)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``web`` to the subcommands."""
    parser = commands.add_parser(
        "web",
        parents=[common],
        help="serve a live page of the crawl (workers, frontier, dead letters, control)",
        description="Serve a live page of the crawl, with a JSON twin of every view "
        "(/api/summary, workers, frontier, dead, history, control). Read-only unless "
        "--actions; actions need the token printed in the address, and --auth on an "
        "address other machines can reach.",
    )
    parser.add_argument("spider", metavar="SPIDER")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=9411, help="port (9411; 0: any free)")
    parser.add_argument(
        "--actions", action="store_true", help="enable pause/resume/drain, requeue and purge"
    )
    parser.add_argument(
        "--auth",
        metavar="USER:PASSWORD",
        help=f"basic auth on every request (or {AUTH_VARIABLE}; needed for --actions "
        "on a non-loopback address)",
    )
    parser.add_argument(
        "--refresh", type=positive, default=1.0, metavar="SECONDS", help="page refresh (1)"
    )
    parser.add_argument("--once", action="store_true", help="print the summary JSON and exit")
    parser.set_defaults(func=cmd_web, writes=lambda args: args.actions)
