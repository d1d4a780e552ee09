"""What every command shares: exit codes, output, and the :class:`Context` of one
invocation (settings, spider, client and crawl layout, resolved as a worker would)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis
    from scrapy import Spider
    from scrapy.settings import BaseSettings

    from scrapy_dist.config.core import Config
    from scrapy_dist.status import CrawlLayout

#: Exit status: the command did everything it was asked.
EXIT_OK = 0
#: Exit status: it ran but did not do everything (see :mod:`scrapy_dist.cli`), or Redis
#: is unreachable.
EXIT_FAILED = 1
#: Exit status: bad arguments or settings, unknown spider, a key of the wrong type.
EXIT_USAGE = 2
#: Exit status: interrupted (Ctrl-C).
EXIT_INTERRUPTED = 130

#: The environment variable that names the Redis to use, below ``--redis-url``.
REDIS_URL_VARIABLE = "REDIS_URL"

#: Dead-letter records, items and keys read or deleted per round trip.
READ_CHUNK = 1_000
#: Crawls named when a command is pointed at a crawl that has no keys.
MAX_CRAWLS_NAMED = 10


class CommandError(Exception):
    """A failure to report as one line, with the exit status to return."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def out(text: str = "") -> None:
    """Write one line to stdout."""
    sys.stdout.write(text + "\n")


def err(text: str) -> None:
    """Write one line to stderr."""
    sys.stderr.write(text + "\n")


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
        redis_url = self.args.redis_url or os.environ.get(REDIS_URL_VARIABLE)
        if redis_url:
            settings.set("REDIS_URL", redis_url, priority="cmdline")
            # the URL names the whole topology: it replaces the project's nodes/Sentinels
            for name in ("REDIS_STARTUP_NODES", "REDIS_MASTER_NODES", "REDIS_SENTINELS"):
                settings.set(name, None, priority="cmdline")
        if self.args.job is not None:
            settings.set("SCHEDULER_JOB_ID", self.args.job or None, priority="cmdline")
            settings.set("SCHEDULER_JOB_TIMESTAMP", None, priority="cmdline")
        return settings

    def config(self, spider: str | None = None) -> tuple[Config, type[Spider] | None]:
        """The config of the settings (with scrapy_dist's defaults and, inside a
        project, the spider's own ``custom_settings``); and the spider class (``None``
        outside a project).

        Raises:
            CommandError: the project has no spider of that name.
            ConfigurationError: invalid settings.
        """
        from scrapy_dist.config.core import Config

        settings = self.raw_settings()
        spidercls = None
        if spider is not None and self.project:
            spidercls = _load_spider(settings, spider)
            spidercls.update_settings(settings)
        config = Config.from_settings(settings)
        if not self.project and not self._redis_given():
            if writes(self.args):
                raise CommandError(
                    "not inside a Scrapy project (no scrapy.cfg here or above), and no "
                    f"Redis named: this command writes, so it will not guess "
                    f"({_server(config)}); run it in the project's directory, or give "
                    f"--redis-url or the {REDIS_URL_VARIABLE} environment variable"
                )
            if not self.warned:
                self.warned = True
                err(
                    "scrapy-dist: warning: not inside a Scrapy project (no scrapy.cfg here "
                    "or above), so scrapy_dist's default settings are used, with Redis at "
                    f"{_server(config)}; run it in the project's directory, or give "
                    f"--redis-url or {REDIS_URL_VARIABLE}"
                )
        return config, spidercls

    def redis_keys(self) -> dict[str, str]:
        """The ``redis_key`` of each spider of the project that has one (the first, for a
        list of keys): the seeds key template of its crawls. Empty outside a project, or
        if the project's spiders cannot be loaded (said on stderr)."""
        from scrapy.utils.misc import load_object

        settings = self.raw_settings()
        if not self.project:
            return {}
        try:
            loader = load_object(settings["SPIDER_LOADER_CLASS"]).from_settings(
                settings.frozencopy()
            )
            spiders = {name: loader.load(name) for name in loader.list()}
        except Exception as e:  # (a spider module that fails to import: its own error)
            err(
                "scrapy-dist: warning: cannot load the project's spiders "
                f"({type(e).__name__}: {e}), so their redis_key is not known"
            )
            return {}
        found = {}
        for name, spidercls in spiders.items():
            template = getattr(spidercls, "redis_key", None)
            if isinstance(template, (list, tuple)):
                template = template[0] if template else None
            if template and isinstance(template, str):
                found[name] = template
        return found

    def layout(
        self, spider: str, *, connect: bool = True
    ) -> tuple[CrawlLayout, Config, type[Spider] | None]:
        """The crawl's layout, its config and the spider class.

        With ``SCHEDULER_JOB_TIMESTAMP`` (and no ``--job``) the stamp is taken from the
        Redis server's clock, as a worker takes it (:func:`scrapy_dist.keys.server_time`),
        so a machine whose clock is off names the crawl the workers use; ``connect=False``
        (a dry run, which needs no Redis) takes it from the local clock.

        Raises:
            RedisUnavailable: the stamp needs the server's clock and Redis is unreachable.
        """
        from scrapy_dist.keys import server_time
        from scrapy_dist.status import CrawlLayout

        config, spidercls = self.config(spider)
        now = None
        if connect and config.keys.job_timestamp:
            now = server_time(self.client(config))
        layout = CrawlLayout.from_config(config, spider, spidercls, now=now)
        return layout, config, spidercls

    def client(self, config: Config) -> redis.Redis:
        """A client of the config's Redis, checked with one ``PING``.

        Raises:
            RedisUnavailable: the server cannot be reached.
        """
        if self.connected is None:
            from scrapy_dist.connection import check, client_from_config

            client = client_from_config(config.connection)
            check(client)
            self.connected = client
        return self.connected

    def crawl_client(self, config: Config, layout: CrawlLayout) -> redis.Redis:
        """A client for the crawl's keys: :meth:`client` itself, or under Redis Cluster
        one pinned to the node owning the crawl's hash slot
        (:func:`~scrapy_dist.connection.crawl_client`), so ``MOVED`` replies are followed,
        never mistaken for a key's type.

        Raises:
            RedisUnavailable: the server cannot be reached.
            ConfigurationError: under Cluster, the crawl's keys are not in one slot.
        """
        from scrapy_dist.connection import crawl_client

        return crawl_client(self.client(config), layout.keys, extra=(layout.seeds, layout.items))

    def _redis_given(self) -> bool:
        """Whether the invocation names the Redis server (``--redis-url``, the
        ``REDIS_URL`` environment variable, or ``-s REDIS_...``)."""
        named = {item.partition("=")[0] for item in self.args.set or ()}
        return bool(self.args.redis_url or os.environ.get(REDIS_URL_VARIABLE)) or any(
            name.startswith("REDIS_") for name in named
        )


def writes(args: argparse.Namespace) -> bool:
    """Whether the invocation changes anything in Redis (a command's ``writes``
    default: a bool, or a function of the arguments)."""
    value = getattr(args, "writes", False)
    return bool(value(args) if callable(value) else value)


def drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of a stdout that
    failed (a closed pipe, a full disk) does not print a second error."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def crawl_exists(client: redis.Redis, layout: CrawlLayout) -> bool:
    """Whether any key the crawl's layout names exists (one ``EXISTS``)."""
    return bool(client.exists(*layout.owned()))


def report_absent(
    client: redis.Redis,
    layout: CrawlLayout,
    config: Config,
    *,
    label: str = "warning",
    same_spider: bool = False,
) -> None:
    """Say on stderr that the crawl has no keys, and name the crawls that do exist
    (found with ``SCAN``, :func:`~scrapy_dist.cli._crawls.find_crawls`): a mistyped spider or
    job, or a ``SCHEDULER_JOB_TIMESTAMP`` stamp that is not the workers', shows at once.

    With ``same_spider``, only the spider's other crawls (its jobs) are named, and
    nothing is said if it has none.
    """
    from scrapy_dist.cli._crawls import find_crawls

    crawl = layout.keys.crawl
    crawls = find_crawls(client, config)
    if same_spider:
        spider = crawl.partition(":")[0]
        crawls = [c for c in crawls if c.partition(":")[0] == spider]
        if not crawls:
            return
    if not crawls:
        present = "no crawl found in Redis"
    else:
        named = ", ".join(crawls[:MAX_CRAWLS_NAMED])
        more = len(crawls) - MAX_CRAWLS_NAMED
        present = f"crawls in Redis: {named}" + (f" and {more} more" if more > 0 else "")
    err(
        f"scrapy-dist: {label}: crawl {crawl!r} has no keys at {describe(client)} "
        f"({present}; --job JOB picks a job's crawl)"
    )


def require_crawl(client: redis.Redis, layout: CrawlLayout, config: Config) -> bool:
    """``True`` if the crawl has keys; else report it (:func:`report_absent`) and return
    ``False``: the command then exits :data:`EXIT_FAILED` having changed nothing."""
    if crawl_exists(client, layout):
        return True
    report_absent(client, layout, config)
    return False


def describe(client: redis.Redis) -> str:
    """The client's server, password masked (no I/O)."""
    from scrapy_dist.connection import describe as describe_client

    return describe_client(client)


def _server(config: Config) -> str:
    """The Redis server the config names, password masked (no I/O)."""
    from scrapy_dist.connection import client_from_config

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


def confirm(question: str, assume_yes: bool) -> bool:
    """Ask on the terminal (``True`` at once with ``assume_yes``).

    Raises:
        CommandError: no ``assume_yes`` and stdin is not a terminal (exit status 1).
    """
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise CommandError(
            f"{question} Refusing without --yes: stdin is not a terminal", EXIT_FAILED
        )
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def iter_list(client: redis.Redis, key: str, total: int) -> Iterator[tuple[int, bytes]]:
    """``(index, value)`` of the first ``total`` values of a list, :data:`READ_CHUNK` per
    round trip."""
    for start in range(0, total, READ_CHUNK):
        chunk = cast("list[bytes]", client.lrange(key, start, min(start + READ_CHUNK, total) - 1))
        for offset, raw in enumerate(chunk):
            yield start + offset, raw
        if len(chunk) < READ_CHUNK:
            return


def check_key(client: redis.Redis, key: str, expected: str | tuple[str, ...], role: str) -> None:
    """Make sure ``key`` is absent or of the ``expected`` Redis type (or one of them).

    Raises:
        ConfigurationError: it holds another type (exit status 2).
    """
    from scrapy_dist.keys import check_type, key_type

    check_type(key, key_type(client, key), expected, role)


def when(timestamp: float | None) -> str:
    """A timestamp as local ``YYYY-MM-DD HH:MM:SS`` (empty for none; one the platform
    cannot show, written by hand, as the number)."""
    if not timestamp:
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    except (OverflowError, OSError, ValueError):
        return str(timestamp)


def tcp_port(text: str) -> int:
    """An ``argparse`` type: a TCP port number, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 to 65535, not {value}")
    return value


def positive(text: str) -> float:
    """An ``argparse`` type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


#: What a refusal of a Redis Cluster in transition means to the operator, by code.
_IN_TRANSITION = {
    "TRYAGAIN": "the crawl's hash slot is being moved to another cluster node (a reshard)",
    "CLUSTERDOWN": "the cluster is down (a master lost, or slots not served)",
    "MASTERDOWN": "the node lost its master",
}


def in_transition(error: BaseException) -> str | None:
    """What a Redis Cluster refusal that waiting ends (``TRYAGAIN``, ``CLUSTERDOWN``,
    ``MASTERDOWN``: redis-py strips the code from the message) means, or None."""
    from scrapy_dist.frontier.outbox import refusal

    code = refusal(error)
    if code not in _IN_TRANSITION:
        return None
    return f"{_IN_TRANSITION[code]} ({code}: {error}): retry when it is over"
