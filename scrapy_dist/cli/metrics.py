"""``scrapy-dist metrics``: serve a crawl's Prometheus gauges without a worker, with the
metrics extension's renderer and server (:mod:`scrapy_dist.metrics`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from scrapy_dist.cli._context import (
    EXIT_OK,
    CommandError,
    Context,
    crawl_exists,
    err,
    positive,
    report_absent,
    tcp_port,
)

if TYPE_CHECKING:
    import argparse

    from scrapy_dist.status import CrawlStatus


def cmd_metrics(ctx: Context, args: argparse.Namespace) -> int:
    """Print the metrics once (``--once``) or serve them until Ctrl-C. A crawl with no
    keys is reported on stderr (its gauges are zeros, as for ``status``: exit status 0)."""
    from scrapy_dist.metrics import CrawlMetrics, MetricsServer
    from scrapy_dist.status import read_status

    layout, config, _ = ctx.layout(args.spider)
    client = ctx.crawl_client(config, layout)
    crawl = layout.keys.crawl

    def read() -> CrawlStatus:
        return read_status(client, layout, config)

    metrics = CrawlMetrics(crawl, read, max_age=args.interval)
    if not crawl_exists(client, layout):
        report_absent(client, layout, config)
    if args.once:
        sys.stdout.write(metrics.render())
        return EXIT_OK
    try:
        server = MetricsServer(args.host, args.port, metrics.render)
    except OSError as e:
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from e
    err(f"metrics of crawl {crawl!r} on http://{args.host}:{server.port}/metrics (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # how it is meant to stop
        pass
    finally:
        server.server_close()
    return EXIT_OK


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``metrics`` to the subcommands."""
    metrics = commands.add_parser(
        "metrics",
        parents=[common],
        help="serve the crawl's Prometheus metrics",
        description="Serve the crawl-wide gauges of the PrometheusMetrics extension "
        "without a worker (e.g. to scale a crawl up from zero workers).",
    )
    metrics.add_argument("spider", metavar="SPIDER")
    metrics.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    metrics.add_argument(
        "--port", type=tcp_port, default=9410, help="TCP port (default 9410; 0: any free one)"
    )
    metrics.add_argument(
        "--interval",
        type=positive,
        default=5.0,
        metavar="SECONDS",
        help="read Redis at most this often (default 5)",
    )
    metrics.add_argument("--once", action="store_true", help="print the metrics and exit")
    metrics.set_defaults(func=cmd_metrics)
