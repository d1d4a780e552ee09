"""The ``scrapy-dist`` command: seed, watch and repair distributed crawls.

Run inside a Scrapy project (a directory with ``scrapy.cfg``, or below one) it reads
the project's settings and spiders, so it builds exactly the keys the workers use
(``REDIS_URL``, key templates, job or timestamp, the spider's ``redis_key``, the seed
mode, the queue class); outside a project it uses scrapy_dist's defaults and accepts
any spider name. ``--redis-url``, ``-s NAME=VALUE`` and ``--job`` override settings.
A ``SCHEDULER_JOB_TIMESTAMP`` stamp is taken from the Redis server's clock, as workers
take it.

Commands (``scrapy-dist COMMAND --help`` describes each), one module each::

    push SPIDER [URL ...] [--file FILE]   validate seeds and push the valid ones  (push)
    status [SPIDER] [--json] [--watch]    seeds, queue, leases, dead letters...   (status)
    jobs [--json]                          the crawls present in Redis (SCAN)      (status)
    metrics SPIDER [--port P] [--once]     serve the crawl's Prometheus metrics    (metrics)
    dead list|requeue|purge SPIDER         inspect and repair the dead-letter list (dead)
    reset SPIDER [--yes]                   delete one crawl's (or job's) keys      (data)
    export SPIDER --output FILE            write the items list as JSON lines      (data)
    pause|resume|drain SPIDER [--wait]     steer a running crawl                   (control)
    items tail|replay|lag|groups|dead SPIDER  the items stream and its groups     (items)
    web SPIDER [--actions] [--port P]      a live page of the crawl, JSON views   (web)

Exit codes: 0 success; 1 the command ran but did not do everything it was asked
(invalid seed lines, dead records that cannot be requeued, a reset refused because
workers are alive or not confirmed, a reset or purge refused without ``--yes`` when
stdin is not a terminal, ``dead``, ``reset`` or ``export`` pointed at a crawl that has
no keys, an ``export`` whose output could not be written whole) or Redis is unreachable
(or refused the database number); 2 usage or configuration errors (bad arguments,
unknown spider, a setting redis-py would refuse, a key of the wrong type); 130
interrupted. A crawl with no keys is
always reported on stderr, with the crawls that exist; ``status`` and ``metrics`` show
it (state ``absent``) and exit 0, and ``push`` starts it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import redis

from scrapy_dist.cli import control, data, dead, items, metrics, push, status, web
from scrapy_dist.cli._context import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Context,
    describe,
    drop_stdout,
    err,
    in_transition,
)
from scrapy_dist.connection import SlotMoved
from scrapy_dist.exceptions import ConfigurationError, RedisUnavailable, redis_error_text

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def _add_common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default: Any = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("settings")
    group.add_argument(
        "--redis-url", metavar="URL", default=default, help="Redis to use (overrides REDIS_URL)"
    )
    group.add_argument(
        "-s",
        "--set",
        metavar="NAME=VALUE",
        action="append",
        default=default if suppress else [],
        help="set a Scrapy setting, as 'scrapy crawl -s' does (repeatable)",
    )
    group.add_argument(
        "--job",
        metavar="JOB",
        default=default,
        help="the job's crawl (SCHEDULER_JOB_ID): keys <spider>:<job>:...",
    )


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
        "metrics, pause, resume, drain, items, web; 'scrapy-dist COMMAND --help' describes "
        "each. Exit codes: 0 ok; "
        "1 partly done, refused (also a destructive command without --yes when stdin is "
        "not a terminal), dead/reset/export of a crawl with no keys, an export that could "
        "not write its output, or Redis unreachable; 2 usage or "
        "configuration error; "
        "130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=_version())
    _add_common(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, suppress=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (push, status, metrics, dead, data, control, items, web):
        module.add_parsers(commands, common)
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
        err(f"scrapy-dist: error: {e}")
        return e.code
    except RedisUnavailable as e:
        err(f"scrapy-dist: error: {e}")
        return EXIT_FAILED
    except (redis.ConnectionError, redis.TimeoutError) as e:
        where = describe(ctx.connected) if ctx.connected is not None else "the configured Redis"
        # SlotMoved names itself: the crawl's slot moves, Redis is not lost
        lost = "" if isinstance(e, SlotMoved) else f"lost Redis at {where}: "
        err(f"scrapy-dist: error: {lost}{e}")
        return EXIT_FAILED
    except ConfigurationError as e:
        err(f"scrapy-dist: error: {e}")
        return EXIT_USAGE
    except redis.exceptions.NoPermissionError as e:
        err(f"scrapy-dist: error: no permission (Redis ACL of this user): {e}")
        return EXIT_FAILED
    except redis.ResponseError as e:
        wrongtype = redis_error_text(e).startswith("WRONGTYPE")
        code = EXIT_USAGE if wrongtype else EXIT_FAILED
        # a cluster in transition (TRYAGAIN...) is said as such: retrying ends it
        err(f"scrapy-dist: error: {in_transition(e) or f'Redis answered: {e}'}")
        return code
    except KeyboardInterrupt:
        err("")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. piped into head
        drop_stdout()
        return EXIT_OK
