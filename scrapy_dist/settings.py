"""scrapy_dist's settings, read once and validated here.

:class:`Config` is the one view components have of the settings: a frozen object
built once per crawler (by :func:`scrapy_dist.assembly.assemble`) from the crawler's
*final* settings with every unset scrapy_dist setting at its default
(:mod:`scrapy_dist.default_settings`), or from a :class:`~scrapy.settings.Settings`
object for code without a crawler (the CLI: :meth:`Config.from_settings`). Every
setting is read and parsed here, and every check of a setting's value raises its
:class:`~scrapy_dist.exceptions.ConfigurationError` here (the ``check_*`` functions also
serve components built directly); components receive plain values. What only another
module can judge stays there: whether a class is a leasable queue
(:func:`scrapy_dist.queue.leasable_queue`), a serializer or request class imports
(:mod:`scrapy_dist.serializers`), a Bloom size is feasible (:mod:`scrapy_dist.dupefilter`),
a key template expands (:func:`scrapy_dist.keys.expand`), redis-py accepts the client
options (:mod:`scrapy_dist.connection`).

Sections group the settings of one concept (``config.connection``, ``config.keys``,
``config.components``, ``config.queue``, ``config.frontier``, ``config.workers``,
``config.scheduler``, ``config.requests``, ``config.seeds``, ``config.spider``,
``config.dupefilter``, ``config.items``, ``config.stats``, ``config.metrics``). A
section is parsed, and validated, the first time it is read, then kept: an invalid
setting fails the component that uses it, at the moment it is built, as it always has
(a bad ``METRICS_PORT`` does not stop a crawl whose metrics are off).

Scrapy builds the spider *before* it applies add-ons, so the settings a spider sees in
``from_crawler`` are not final: :meth:`Config.from_crawler` refuses to read them until
they are (:func:`settings_final`).

This module imports nothing else of the package but its exceptions and defaults. It is
longer than the package's other modules on purpose: it is the one place that reads
and checks every setting (about seventy), section by section.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import json
import logging
import math
import os
from dataclasses import FrozenInstanceError, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

from scrapy_dist import default_settings
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping

    from scrapy.crawler import Crawler

_T = TypeVar("_T")

logger = logging.getLogger(__name__)

#: Client options applied unless ``REDIS_PARAMS`` overrides them.
DEFAULT_PARAMS: dict[str, Any] = {
    "socket_connect_timeout": 5,
    "socket_timeout": 10,
    "health_check_interval": 30,
}

#: URL schemes redis-py understands.
URL_SCHEMES = ("redis", "rediss", "unix")

#: Smallest ``DUPEFILTER_RECRAWL_AFTER``, in milliseconds (a generation of the Bloom
#: backends' window must last at least a millisecond).
RECRAWL_MIN_MS = 100
#: Largest ``DUPEFILTER_RECRAWL_AFTER``, in seconds (1,000 years): the scripts compute
#: expiry times in ms as Lua numbers, which Redis receives as 14 significant digits.
RECRAWL_MAX_SECONDS = 1000 * 365 * 86400

#: Values of ``DUPEFILTER_BACKEND``.
BACKENDS = ("set", "bloom", "bitmap", "redisbloom", "auto", "buckets")

#: Values of ``BLOOM_ON_FULL``.
ON_FULL = ("grow", "refuse")

#: Values of ``REDIS_EVICTION_POLICY_CHECK``.
EVICTION_CHECKS = ("refuse", "warn", "off")

#: Values of ``SCHEDULER_CALLBACK_ERRORS``: the request is done (as on Scrapy's
#: scheduler), returned for another try, or dead-lettered at once.
CALLBACK_ERRORS = ("done", "retry", "dead")


def with_defaults(settings: BaseSettings) -> BaseSettings:
    """Return a copy of ``settings`` in which every unset scrapy_dist setting has its default."""
    resolved = settings.copy()
    resolved.frozen = False  # a copy of a frozen crawler's settings starts frozen
    resolved.setmodule(default_settings, "default")
    return resolved


def load_setting(setting: str, path: str) -> Any:
    """The object at import path ``path``, named by ``setting``.

    Raises:
        ConfigurationError: nothing can be imported there; the message names the setting.
    """
    try:
        return load_object(path)
    except Exception as e:  # (also an error raised by the module while it is imported)
        raise ConfigurationError(
            f"{setting} = {path!r} cannot be imported: {type(e).__name__}: {e}"
        ) from None


def settings_final(crawler: Crawler) -> bool:
    """Whether the crawler's settings are final (its add-ons applied).

    Scrapy's ``Crawler.crawl()`` marks the crawler as crawling, creates the spider, then
    applies the add-ons, builds the stats collector and the extensions, and freezes the
    settings. So the settings are not final only while a crawling crawler has no spider
    yet, i.e. during the spider's own ``__init__``/``from_crawler``. (A crawler that is
    not crawling, such as one from ``scrapy.utils.test.get_crawler``, has applied its
    add-ons already.)
    """
    return bool(
        crawler.settings.frozen
        or getattr(crawler, "spider", None) is not None
        or not getattr(crawler, "crawling", False)
    )


def mask_url(url: str) -> str:
    """Return ``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


# -- sections ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionConfig:
    """Where Redis is: one server (``REDIS_URL``, ``REDIS_HOST``/``PORT``/``DB``), a Redis
    Cluster (``REDIS_STARTUP_NODES``/``REDIS_MASTER_NODES``, ``REDIS_CLUSTER_PARAMS``, or
    a ``redis+cluster://`` URL) or a master behind Sentinel (``REDIS_SENTINELS``,
    ``REDIS_SENTINEL_PARAMS``, or a ``redis+sentinel://`` URL); ``REDIS_PARAMS`` applies
    to the connections to the data nodes in every topology.

    Attributes:
        url: the URL to connect to, single server only (``None``: host/port in :attr:`params`).
        params: keyword arguments of the data nodes' connections (``redis_cls`` removed);
            under Cluster and Sentinel without ``host``/``port``.
        redis_cls: ``REDIS_PARAMS["redis_cls"]``, imported (``None``: redis-py's).
        topology: :data:`SINGLE`, :data:`CLUSTER` or :data:`SENTINEL`.
        nodes: Cluster: the startup nodes; Sentinel: the Sentinels; as ``(host, port)``.
        service_name: Sentinel: the master's name.
        sentinel_params: Sentinel: keyword arguments of the connections to the Sentinels.
        cluster_params: Cluster: keyword arguments of ``RedisCluster`` beyond :attr:`params`.
        ssl: Cluster and Sentinel: TLS to the data nodes (``rediss+...`` URLs).
    """

    url: str | None
    params: dict[str, Any]
    redis_cls: Any = None
    topology: str = "single"
    nodes: tuple[tuple[str, int], ...] = ()
    service_name: str | None = None
    sentinel_params: dict[str, Any] = field(default_factory=dict)
    cluster_params: dict[str, Any] = field(default_factory=dict)
    ssl: bool = False


#: Topologies of :class:`ConnectionConfig`.
SINGLE, CLUSTER, SENTINEL = "single", "cluster", "sentinel"

#: URL schemes of the topologies redis-py has no URL for (the ``redis+sentinel://`` form
#: is the one kombu/Celery, Redis-Sentinel-Url and prefect-redis use).
TOPOLOGY_SCHEMES = {
    "redis+sentinel": (SENTINEL, False),
    "rediss+sentinel": (SENTINEL, True),
    "redis+cluster": (CLUSTER, False),
    "rediss+cluster": (CLUSTER, True),
}

#: Default port of a Redis node and of a Sentinel.
REDIS_PORT, SENTINEL_PORT = 6379, 26379

#: Keys of ``REDIS_SENTINEL_PARAMS`` (and URL options) that authenticate to the Sentinels.
_SENTINEL_AUTH = ("sentinel_username", "sentinel_password")


def parse_nodes(value: Any, setting: str, default_port: int) -> tuple[tuple[str, int], ...]:
    """Parse a list of nodes: ``"host:port"`` strings (a string may list several,
    comma-separated, or be a JSON list; ``[v6]:port`` for IPv6), ``(host, port)`` pairs or
    ``{"host": ..., "port": ...}`` dicts; ``port`` defaults to ``default_port``.

    Raises:
        ConfigurationError: an entry that is none of these, or an invalid port.
    """
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        # -s REDIS_STARTUP_NODES='["a:7000", "b:7000"]' (JSON only, never code); a
        # "[::1]:7000" (an IPv6 node) is not JSON and stays a string
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, (dict, tuple)) and _is_one_node(value):
        value = [value]
    nodes = [_parse_node(entry, setting, default_port) for entry in value or ()]
    return tuple(dict.fromkeys(nodes))


def _parse_node(entry: Any, setting: str, default_port: int) -> tuple[str, int]:
    """One entry of :func:`parse_nodes`."""
    host: Any
    port: Any
    if isinstance(entry, str):
        text = entry.strip()
        if text.startswith("["):  # [v6]:port
            host, _, rest = text[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else default_port
        elif text.count(":") == 1:
            host, port = text.split(":")
        else:
            host, port = text, default_port
    elif isinstance(entry, dict):
        host, port = entry.get("host"), entry.get("port", default_port)
    elif isinstance(entry, (tuple, list)) and len(entry) in (1, 2):
        host, port = entry[0], entry[1] if len(entry) == 2 else default_port
    else:
        host, port = None, None
    try:
        port = int(port)
    except (TypeError, ValueError):
        port = -1
    if not host or not isinstance(host, str) or not 0 < port < 65536:
        raise ConfigurationError(
            f'{setting} entry {entry!r} is not a node: use "host:port", '
            '(host, port) or {"host": ..., "port": ...}'
        )
    return host, port


def _is_one_node(value: Any) -> bool:
    if isinstance(value, dict):
        return "host" in value
    return len(value) == 2 and isinstance(value[0], str) and not isinstance(value[1], str)


def _topology_url(url: str) -> tuple[str, bool, tuple[tuple[str, int], ...], dict[str, Any], str]:
    """Parse a ``redis+sentinel://`` or ``redis+cluster://`` URL.

    ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db][?opts]``
    (the user and password are the master's; ``sentinel_username``/``sentinel_password``
    options authenticate to the Sentinels); ``redis+cluster://[[user]:password@]host:port
    [,host:port...][/?opts]``. Other options are redis-py's URL options.

    Returns:
        ``(topology, ssl, nodes, params, service_name)``.
    """
    from urllib.parse import parse_qsl, urlencode

    from redis.connection import parse_url

    scheme, rest = url.split("://", 1)
    topology, ssl = TOPOLOGY_SCHEMES[scheme.lower()]
    netloc, _, path = rest.partition("/")
    path, _, query = path.partition("?")
    if "?" in netloc:  # no path: redis+cluster://host:port?opts
        netloc, _, query = netloc.partition("?")
    userinfo, _, hosts = netloc.rpartition("@")
    default_port = SENTINEL_PORT if topology == SENTINEL else REDIS_PORT
    nodes = parse_nodes(hosts, f"REDIS_URL {mask_url(url)!r}", default_port)
    if not nodes:
        raise ConfigurationError(f"REDIS_URL {mask_url(url)!r} names no host")
    segments = [s for s in path.split("/") if s]
    service = segments[0] if segments else ""
    if topology == CLUSTER and segments:
        if segments != ["0"]:
            raise ConfigurationError(
                f"REDIS_URL {mask_url(url)!r}: a Redis Cluster has only database 0"
            )
        segments = []
        service = ""
    if len(segments) > 2:
        raise ConfigurationError(
            f"REDIS_URL {mask_url(url)!r}: expected /service_name[/db] after the Sentinels"
        )
    options = parse_qsl(query, keep_blank_values=True)
    extra = {k: v for k, v in options if k in _SENTINEL_AUTH}
    if topology == SENTINEL and extra.get("service_name") is None:
        service = dict(options).get("service_name", service)
    options = [(k, v) for k, v in options if k not in _SENTINEL_AUTH and k != "service_name"]
    db = segments[1] if len(segments) == 2 else ""
    auth = f"{userinfo}@" if userinfo else ""
    try:
        params = parse_url(f"redis://{auth}placeholder/{db}?{urlencode(options)}")  # type: ignore[no-untyped-call]
    except ValueError as e:
        raise ConfigurationError(f"REDIS_URL {mask_url(url)!r}: {e}") from e
    params.pop("host", None)
    params.pop("port", None)
    params.update(extra)
    return topology, ssl, nodes, params, service


def connection_config(settings: BaseSettings) -> ConnectionConfig:
    """Merge the connection settings (the settings need not have scrapy_dist's defaults):
    ``REDIS_URL``/``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``/``REDIS_PARAMS`` for one
    server, plus ``REDIS_STARTUP_NODES``/``REDIS_MASTER_NODES``/``REDIS_CLUSTER_PARAMS``
    for a Cluster, ``REDIS_SENTINELS``/``REDIS_SENTINEL_PARAMS`` for Sentinel.

    Raises:
        ConfigurationError: settings that name the server twice, differently, or name two
            topologies (a URL and nodes, Sentinels and a Cluster...).
    """
    url = settings.get("REDIS_URL") or None
    scheme = urlsplit(url).scheme.lower() if url and "://" in url else ""
    startup = settings.get("REDIS_STARTUP_NODES")
    masters = settings.get("REDIS_MASTER_NODES")
    sentinels = settings.get("REDIS_SENTINELS")
    cluster_params = settings.getdict("REDIS_CLUSTER_PARAMS")
    sentinel_params = settings.getdict("REDIS_SENTINEL_PARAMS")
    named = [
        name
        for name, value in (
            ("REDIS_STARTUP_NODES", startup),
            ("REDIS_MASTER_NODES", masters),
            ("REDIS_SENTINELS", sentinels),
        )
        if value
    ]
    if url and named:
        raise ConfigurationError(
            f"REDIS_URL ({mask_url(url)}) and {' and '.join(named)} both name the Redis "
            "servers; set only one of them"
        )
    if len(named) > 1:
        raise ConfigurationError(
            f"{' and '.join(named)} are both set; name the Redis servers once (a Cluster's "
            "nodes, or the Sentinels of a master)"
        )
    if scheme in TOPOLOGY_SCHEMES or named:
        return _topology_config(settings, url, named, cluster_params, sentinel_params)
    if cluster_params or sentinel_params:
        unused = "REDIS_CLUSTER_PARAMS" if cluster_params else "REDIS_SENTINEL_PARAMS"
        raise ConfigurationError(
            f"{unused} is set but no "
            + (
                "Cluster nodes are named (REDIS_STARTUP_NODES or a redis+cluster:// URL)"
                if cluster_params
                else "Sentinels are named (REDIS_SENTINELS or a redis+sentinel:// URL)"
            )
        )
    single = _single_config(settings)
    if single.redis_cls is not None and _is_cluster_class(single.redis_cls):
        # REDIS_PARAMS = {"redis_cls": "redis.cluster.RedisCluster"}: a Cluster of the
        # URL's (or REDIS_HOST's) node.
        params = dict(single.params)
        if single.url:
            from redis.connection import parse_url

            params.update(parse_url(single.url))  # type: ignore[no-untyped-call]
        host, port = params.pop("host", "localhost"), int(params.pop("port", REDIS_PORT))
        _check_cluster_db(params.pop("db", 0), "REDIS_URL")
        return ConnectionConfig(
            None, params, single.redis_cls, CLUSTER, ((host, port),),
            ssl=bool(single.url and single.url.startswith("rediss:")),
        )  # fmt: skip
    return single


def _is_cluster_class(cls: Any) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(cls, type) and issubclass(cls, RedisCluster)


def _check_cluster_db(db: Any, setting: str) -> None:
    if str(db or 0) != "0":
        raise ConfigurationError(
            f"{setting} selects database {db}, but a Redis Cluster has only database 0"
        )


def _topology_config(
    settings: BaseSettings,
    url: str | None,
    named: list[str],
    cluster_params: dict[str, Any],
    sentinel_params: dict[str, Any],
) -> ConnectionConfig:
    """The Cluster or Sentinel part of :func:`connection_config`."""
    user_params = settings.getdict("REDIS_PARAMS")
    check_params(user_params, "REDIS_PARAMS")
    check_params(cluster_params, "REDIS_CLUSTER_PARAMS")
    check_params(sentinel_params, "REDIS_SENTINEL_PARAMS")
    _check_no_address(settings, user_params, named, url)
    params = {**DEFAULT_PARAMS, **user_params}
    redis_cls = params.pop("redis_cls", None)
    if isinstance(redis_cls, str):
        redis_cls = load_setting("REDIS_PARAMS['redis_cls']", redis_cls)
    service = ""
    ssl = False
    if url:
        topology, ssl, nodes, url_params, service = _topology_url(url)
        params.update(url_params)
    elif named[0] == "REDIS_SENTINELS":
        topology = SENTINEL
        nodes = parse_nodes(settings.get("REDIS_SENTINELS"), "REDIS_SENTINELS", SENTINEL_PORT)
    else:
        topology = CLUSTER
        nodes = parse_nodes(settings.get(named[0]), named[0], REDIS_PORT)
    if not nodes:
        raise ConfigurationError(f"{named[0] if named else 'REDIS_URL'} names no node")
    if settings.get("REDIS_DB") is not None:
        params["db"] = _setting_value(settings, "REDIS_DB", _db_problem)
    sentinel_kwargs: dict[str, Any] = {}
    if topology == CLUSTER:
        _cluster_part(params, redis_cls, sentinel_params)
    else:
        service, sentinel_kwargs = _sentinel_part(
            params, redis_cls, service, cluster_params, sentinel_params
        )
    if params.get("decode_responses") or cluster_params.get("decode_responses"):
        raise ConfigurationError(
            "REDIS_PARAMS['decode_responses'] must be false: scrapy_dist stores raw bytes"
        )
    return ConnectionConfig(
        None,
        params,
        redis_cls,
        topology,
        nodes,
        service or None,
        {k: v for k, v in sentinel_kwargs.items() if v is not None},
        dict(cluster_params),
        ssl,
    )


def _check_no_address(
    settings: BaseSettings, user_params: dict[str, Any], named: list[str], url: str | None
) -> None:
    """Refuse a server address next to a Cluster's nodes or the Sentinels."""
    for setting in ("REDIS_HOST", "REDIS_PORT"):
        if settings.get(setting) is not None:
            where = named[0] if named else f"a {urlsplit(str(url)).scheme}:// REDIS_URL"
            raise ConfigurationError(
                f"{setting} is set together with {where}; the Cluster nodes or Sentinels "
                "name the servers, remove it"
            )
    for name in ("host", "port", "url"):
        if name in user_params:
            raise ConfigurationError(
                f"REDIS_PARAMS[{name!r}] is set together with a Cluster or Sentinel "
                "topology, which names the servers; remove it"
            )


def _cluster_part(params: dict[str, Any], redis_cls: Any, sentinel_params: dict[str, Any]) -> None:
    """The Cluster part of :func:`_topology_config` (removes ``db`` from ``params``)."""
    if sentinel_params:
        raise ConfigurationError(
            "REDIS_SENTINEL_PARAMS is set but the settings name a Redis Cluster; "
            "use Sentinels or a Cluster, not both"
        )
    if redis_cls is not None and not _is_cluster_class(redis_cls):
        raise ConfigurationError(
            f"REDIS_PARAMS['redis_cls'] {redis_cls!r} is not a redis.cluster.RedisCluster"
        )
    _check_cluster_db(params.pop("db", 0), "REDIS_DB or REDIS_PARAMS['db']")


def _sentinel_part(
    params: dict[str, Any],
    redis_cls: Any,
    service: str,
    cluster_params: dict[str, Any],
    sentinel_params: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """The Sentinel part of :func:`_topology_config`: the master's name and the
    Sentinels' connection options; moves the master's options of
    ``REDIS_SENTINEL_PARAMS`` into ``params``."""
    if cluster_params:
        raise ConfigurationError(
            "REDIS_CLUSTER_PARAMS is set but the settings name Sentinels; "
            "use Sentinels or a Cluster, not both"
        )
    if _is_cluster_class(redis_cls):
        raise ConfigurationError(
            "REDIS_PARAMS['redis_cls'] is a RedisCluster but the settings name Sentinels"
        )
    sentinel_params = dict(sentinel_params)
    given = sentinel_params.pop("service_name", None)
    if given and service and given != service:
        raise ConfigurationError(
            f"REDIS_URL names the Sentinel service {service!r} and "
            f"REDIS_SENTINEL_PARAMS['service_name'] {given!r}; set only one"
        )
    service = str(given or service)
    if not service:
        raise ConfigurationError(
            "Redis Sentinel needs the master's name: set "
            "REDIS_SENTINEL_PARAMS['service_name'] (or end a redis+sentinel:// URL "
            "with /service_name)"
        )
    sentinel_kwargs = dict(sentinel_params.pop("sentinel_kwargs", None) or {})
    auth = {k: params.pop(k) for k in _SENTINEL_AUTH if k in params}
    auth.update({k: sentinel_params.pop(k) for k in _SENTINEL_AUTH if k in sentinel_params})
    for key, value in auth.items():
        sentinel_kwargs[key.removeprefix("sentinel_")] = value
    params.update(sentinel_params)  # the master's connection options
    for option in ("socket_connect_timeout", "socket_timeout"):
        sentinel_kwargs.setdefault(option, params.get(option))
    return service, sentinel_kwargs


def _whole(value: Any) -> int | None:
    """``value`` as the whole number redis-py's ``int(value)`` makes of it, or ``None``
    if it is none (a bool, a fraction, text that is no number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, (int, str, bytes)):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _port_problem(value: Any) -> str | None:
    port = _whole(value)
    return None if port is not None and 0 < port < 65536 else "is not a TCP port (1 to 65535)"


def _db_problem(value: Any) -> str | None:
    if value is None:
        return None
    db = _whole(value)
    return None if db is not None and db >= 0 else "is not a database number (0 or more)"


def _seconds_problem(value: Any) -> str | None:
    if value is None or (isinstance(value, (int, float)) and 0 <= value < math.inf):
        return None
    return "is not a number of seconds (0 or more, or None)"


def _interval_problem(value: Any) -> str | None:
    if value is None or (isinstance(value, (int, float)) and math.isfinite(value)):
        return None
    return "is not a number of seconds (or None)"


def _max_connections_problem(value: Any) -> str | None:
    if value is None or (isinstance(value, int) and value >= 0):
        return None
    return "is not a number of connections (0 or more, or None)"


def _protocol_problem(value: Any) -> str | None:
    return None if value is None or _whole(value) in (2, 3) else "is not a RESP version (2 or 3)"


def _read_size_problem(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return None
    return "is not a number of bytes (1 or more)"


def _host_problem(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) else "is not a host name (a string)"


def _path_problem(value: Any) -> str | None:
    if value is None or isinstance(value, (str, bytes, os.PathLike)):
        return None
    return "is not a path (a string)"


def _mapping_problem(value: Any) -> str | None:
    return None if value is None or isinstance(value, dict) else "is not a dict (or None)"


def _errors_problem(value: Any) -> str | None:
    if isinstance(value, (list, tuple, set, frozenset)) and all(
        isinstance(e, type) and issubclass(e, BaseException) for e in value
    ):
        return None
    return None if value is None else "is not a list of exception classes (or None)"


def _retry_problem(value: Any) -> str | None:
    if value is None or hasattr(value, "call_with_retry"):
        return None
    return "is not a redis.retry.Retry (or None)"


def _error_handler_problem(value: Any) -> str | None:
    try:
        codecs.lookup_error(value)
    except (LookupError, TypeError):
        return "is not a codec error handler ('strict', 'replace'...)"
    return None


def _client_name_problem(value: Any) -> str | None:
    if isinstance(value, str) and any(not "!" <= c <= "~" for c in value):
        return "contains a space or a character Redis refuses in a client name"
    return None


#: The client arguments whose values redis-py (or the server, at connect) refuses when
#: of the wrong kind, each with a check that says why (``None``: accepted). Keys not
#: named here are given to redis-py unchecked, as scrapy-redis did.
_PARAM_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "port": _port_problem,
    "db": _db_problem,
    "socket_timeout": _seconds_problem,
    "socket_connect_timeout": _seconds_problem,
    "health_check_interval": _interval_problem,
    "max_connections": _max_connections_problem,
    "protocol": _protocol_problem,
    "socket_read_size": _read_size_problem,
    "host": _host_problem,
    "unix_socket_path": _path_problem,
    "socket_keepalive_options": _mapping_problem,
    "retry_on_error": _errors_problem,
    "retry": _retry_problem,
    "encoding_errors": _error_handler_problem,
    "client_name": _client_name_problem,
}


def check_params(params: Mapping[str, Any], setting: str, unused: Collection[str] = ()) -> None:
    """Check the values of client arguments redis-py would refuse only when it connects
    (a ``socket_timeout`` of ``"abc"``, a port that is no number), so that they are
    reported at once, naming the setting and the key. Values redis-py converts itself
    (a port ``"6379"``) pass, and so do keys it is not known to check, and the keys in
    ``unused``: values redis-py never reads (a port next to a URL or a Unix socket).

    A ``redis_cls`` of the user's own (a class whose ``__init__`` is not redis-py's)
    gets the values as they are, unchecked: it may read them otherwise.

    Raises:
        ConfigurationError: a value redis-py would refuse.
    """
    if not _redis_py_reads(params.get("redis_cls")):
        return
    for key, value in params.items():
        check = _PARAM_CHECKS.get(key) if key not in unused else None
        problem = check(value) if check is not None else None
        if problem:
            raise ConfigurationError(f"{setting}[{key!r}] = {value!r} {problem}")
    if isinstance(params.get("sentinel_kwargs"), dict):  # the Sentinels' connections
        check_params(params["sentinel_kwargs"], f"{setting}['sentinel_kwargs']")


def _redis_py_reads(redis_cls: Any) -> bool:
    """Whether a client of ``redis_cls`` (``REDIS_PARAMS['redis_cls']``: a class, a
    dotted path or ``None``) takes its arguments as redis-py's own ``Redis`` or
    ``RedisCluster`` does (its ``__init__`` is theirs)."""
    import redis
    from redis.cluster import RedisCluster

    if redis_cls is None:
        return True
    if isinstance(redis_cls, str):
        redis_cls = load_setting("REDIS_PARAMS['redis_cls']", redis_cls)
    init = getattr(redis_cls, "__init__", None)
    return init is redis.Redis.__init__ or init is RedisCluster.__init__


def _setting_value(
    settings: BaseSettings, setting: str, problem: Callable[[Any], str | None]
) -> int:
    """``REDIS_PORT`` or ``REDIS_DB``, a whole number.

    Raises:
        ConfigurationError: it is none, or out of range.
    """
    value = settings.get(setting)
    number = _whole(value)
    why = problem(value) if number is not None else "is not a whole number"
    if why or number is None:
        raise ConfigurationError(f"{setting} = {value!r} {why}")
    return number


def _unused_params(url: str | None, params: Mapping[str, Any]) -> set[str]:
    """The ``REDIS_PARAMS`` keys redis-py never reads for one server: the host and port
    next to a URL (ignored with a warning) or a Unix socket, and what the URL sets
    itself (its query arguments), which wins over ``REDIS_PARAMS``."""
    if not url:
        return {"host", "port"} if params.get("unix_socket_path") is not None else set()
    return {"host", "port", *parse_qs(urlsplit(url).query)}


def _socket_path_as_text(params: dict[str, Any]) -> None:
    """Make a ``unix_socket_path`` given as a path object text, which redis-py needs."""
    if isinstance(params.get("unix_socket_path"), os.PathLike):
        params["unix_socket_path"] = os.fspath(params["unix_socket_path"])


def _single_config(settings: BaseSettings) -> ConnectionConfig:
    """The single-server part of :func:`connection_config`."""
    params = dict(DEFAULT_PARAMS)
    user_params = settings.getdict("REDIS_PARAMS")
    params.update(user_params)
    url = settings.get("REDIS_URL") or None
    params_url = params.pop("url", None)
    if url and params_url and url != params_url:
        raise ConfigurationError(
            "REDIS_URL and REDIS_PARAMS['url'] name different servers; set only one"
        )
    url = url or params_url
    check_params(user_params, "REDIS_PARAMS", _unused_params(url, user_params))
    explicit = {
        name: settings.get(setting)
        for name, setting in (("host", "REDIS_HOST"), ("port", "REDIS_PORT"), ("db", "REDIS_DB"))
        if settings.get(setting) is not None
    }
    if url:
        both = sorted(
            [f"REDIS_{name.upper()}" for name in explicit]
            + [f"REDIS_PARAMS[{name!r}]" for name in ("host", "port") if name in user_params]
        )
        if both and not settings.getbool("REDIS_URL_PRECEDENCE", True):
            raise ConfigurationError(
                f"REDIS_URL is set together with {', '.join(both)}; put the whole address "
                "in REDIS_URL or use the separate settings, not both"
            )
        if both:
            logger.warning(
                "REDIS_URL is set together with %(others)s: connecting to %(url)s and "
                "ignoring %(others)s (REDIS_URL_PRECEDENCE = False makes this an error)",
                {"others": ", ".join(both), "url": mask_url(url)},
            )
            explicit = {}
            params.pop("host", None)
            params.pop("port", None)
        if urlsplit(url).scheme not in URL_SCHEMES:
            raise ConfigurationError(
                f"REDIS_URL {mask_url(url)!r} must start with redis://, rediss:// or unix://"
            )
    for name, value in explicit.items():
        if name in user_params and str(user_params[name]) != str(value):
            raise ConfigurationError(
                f"REDIS_{name.upper()}={value!r} contradicts REDIS_PARAMS[{name!r}]="
                f"{user_params[name]!r}"
            )
        if name == "port":
            params[name] = _setting_value(settings, "REDIS_PORT", _port_problem)
        elif name == "db":
            params[name] = _setting_value(settings, "REDIS_DB", _db_problem)
        else:
            params[name] = value
    if params.get("decode_responses"):
        raise ConfigurationError(
            "REDIS_PARAMS['decode_responses'] must be false: scrapy_dist stores raw bytes"
        )
    _socket_path_as_text(params)
    redis_cls = params.pop("redis_cls", None)
    if isinstance(redis_cls, str):
        redis_cls = load_setting("REDIS_PARAMS['redis_cls']", redis_cls)
    return ConnectionConfig(url, params, redis_cls)


@dataclass(frozen=True)
class KeysConfig:
    """Key templates (``%(spider)s`` is the crawl name) and the job that isolates runs.

    Attributes:
        requests: ``SCHEDULER_QUEUE_KEY``.
        dupefilter: ``SCHEDULER_DUPEFILTER_KEY``.
        start_urls: ``REDIS_START_URLS_KEY``.
        items: ``REDIS_ITEMS_KEY``.
        job_id: ``SCHEDULER_JOB_ID`` (``None``: unset).
        job_timestamp: ``SCHEDULER_JOB_TIMESTAMP``, a ``strftime`` pattern (``None``: unset).
        hash_tag: ``REDIS_KEY_HASH_TAG``: wrap the crawl name in ``{...}`` (``None``: only
            under Redis Cluster).
    """

    requests: str
    dupefilter: str
    start_urls: str
    items: str
    job_id: str | None
    job_timestamp: str | None
    hash_tag: bool | None = None


def _keys(s: BaseSettings) -> KeysConfig:
    job_id = s.get("SCHEDULER_JOB_ID")
    pattern = s.get("SCHEDULER_JOB_TIMESTAMP")
    if job_id and pattern:
        raise ConfigurationError(
            "SCHEDULER_JOB_ID and SCHEDULER_JOB_TIMESTAMP are both set; use one of them"
        )
    return KeysConfig(
        requests=s["SCHEDULER_QUEUE_KEY"],
        dupefilter=s["SCHEDULER_DUPEFILTER_KEY"],
        start_urls=s["REDIS_START_URLS_KEY"],
        items=s["REDIS_ITEMS_KEY"],
        job_id=str(job_id) if job_id else None,
        job_timestamp=str(pattern) if pattern else None,
        hash_tag=None if s.get("REDIS_KEY_HASH_TAG") is None else s.getbool("REDIS_KEY_HASH_TAG"),
    )


@dataclass(frozen=True)
class ComponentsConfig:
    """The component classes Scrapy builds, as set: ``SCHEDULER``, ``DUPEFILTER_CLASS``;
    and whether the scheduler is scrapy_dist's (or a subclass of it)."""

    scheduler: Any
    dupefilter: Any
    dist_scheduler: bool = False


#: scrapy_dist's scheduler, by import path.
DIST_SCHEDULER = "scrapy_dist.scheduler.Scheduler"


def is_dist_scheduler(scheduler: Any) -> bool:
    """Whether ``scheduler`` (the ``SCHEDULER`` setting: a path or a class) is
    scrapy_dist's scheduler or a subclass of it (found by name, so that this module
    does not import the scheduler; not ``issubclass()``: Scrapy's scheduler metaclass
    answers it by duck typing)."""
    try:
        cls = load_object(scheduler) if isinstance(scheduler, str) else scheduler
    except (ImportError, NameError, ValueError, AttributeError):
        return False
    return isinstance(cls, type) and any(
        f"{c.__module__}.{c.__qualname__}" == DIST_SCHEDULER for c in cls.__mro__
    )


def _components(s: BaseSettings) -> ComponentsConfig:
    scheduler = s.get("SCHEDULER")
    return ComponentsConfig(
        scheduler=scheduler,
        dupefilter=s.get("DUPEFILTER_CLASS"),
        dist_scheduler=is_dist_scheduler(scheduler),
    )


@dataclass(frozen=True)
class QueueConfig:
    """``SCHEDULER_QUEUE_CLASS``: as set (``path``, for messages) and imported (``cls``).
    Whether the class is one the frontier can lease is :mod:`scrapy_dist.queue`'s to say.

    Attributes:
        order: how the priority queue orders requests of equal priority, as Scrapy's
            scheduler does: two letters, ``"l"`` (last in, first out) or ``"f"``, for
            requests (``SCHEDULER_MEMORY_QUEUE``) and for start requests
            (``SCHEDULER_START_MEMORY_QUEUE``); a third when start requests are kept
            apart (the start queue is set, as by default): ``"s"``, after the other
            requests of their priority (Scrapy >= 2.14), or ``"S"``, before them
            (Scrapy 2.13), as the running Scrapy's scheduler orders them
            (:func:`start_requests_first`).
    """

    path: Any
    cls: Any
    order: str = "ff"


def memory_queue_order(spec: Any, setting: str) -> str:
    """``"f"`` if ``spec`` (a memory queue class or its path) is first in, first out
    (a subclass of queuelib's ``FifoMemoryQueue``), else ``"l"`` (Scrapy's default,
    ``LifoMemoryQueue``, and any other class).

    Raises:
        ConfigurationError: the path cannot be imported.
    """
    from queuelib.queue import FifoMemoryQueue, LifoMemoryQueue

    cls = load_setting(setting, spec) if isinstance(spec, str) else spec
    if not isinstance(cls, type) or issubclass(cls, LifoMemoryQueue):  # (a Fifo subclass)
        return "l"
    return "f" if issubclass(cls, FifoMemoryQueue) else "l"


@functools.cache
def start_requests_first() -> bool:
    """Whether the running Scrapy's scheduler serves a start request before another
    request of the same priority (Scrapy 2.13; later versions serve it after), read
    from its own priority queue: one of each pushed, which comes out first. A Scrapy
    whose queue cannot be asked so is logged, and taken for the later order."""
    from scrapy import Request
    from scrapy.pqueues import ScrapyPriorityQueue
    from scrapy.squeues import FifoMemoryQueue

    try:
        queue = ScrapyPriorityQueue(None, FifoMemoryQueue, "", start_queue_cls=FifoMemoryQueue)  # type: ignore[arg-type]
        queue.push(Request("http://order.invalid/other"))
        queue.push(Request("http://order.invalid/start", meta={"is_start_request": True}))
        first = queue.pop()
    except Exception as e:  # (a Scrapy whose priority queue changed)
        logger.warning(
            "Cannot read the order of start requests from Scrapy's priority queue "
            "(%(error)s): start requests come after the other requests of their priority",
            {"error": e},
        )
        return False
    return first is not None and first.url.endswith("/start")


def _queue(s: BaseSettings) -> QueueConfig:
    path = s["SCHEDULER_QUEUE_CLASS"]
    order = memory_queue_order(s.get("SCHEDULER_MEMORY_QUEUE"), "SCHEDULER_MEMORY_QUEUE")
    start = s.get("SCHEDULER_START_MEMORY_QUEUE")
    if start:  # start requests apart, in their own order
        order += memory_queue_order(start, "SCHEDULER_START_MEMORY_QUEUE")
        order += "S" if start_requests_first() else "s"
    else:  # as any request
        order += "f"
    return QueueConfig(
        path,
        load_setting("SCHEDULER_QUEUE_CLASS", path) if isinstance(path, str) else path,
        order,
    )


@dataclass(frozen=True)
class FrontierConfig:
    """Leases and the frontier's checks (``SCHEDULER_LEASE_TIMEOUT``,
    ``SCHEDULER_MAX_DELIVERIES``, ``REDIS_EVICTION_POLICY_CHECK``,
    ``SCHEDULER_WRONGTYPE_TIMEOUT``), and whether its writes are sent at once
    (``eager``: ``SCHEDULER_FLUSH_INTERVAL`` is 0; the scheduler checks the interval)."""

    lease_timeout: float
    max_deliveries: int
    eviction_check: str
    wrongtype_timeout: float
    eager: bool = False
    #: ``SCHEDULER_SHARDS``: hash tags the crawl's queue, leases and dupefilter spread over.
    shards: int = 1
    #: ``SCHEDULER_BACKGROUND_FLUSH``: the timer's flushes go through an I/O thread.
    background: bool = False


def check_frontier(eviction_check: str, lease_timeout: float, max_deliveries: int) -> None:
    """Check ``REDIS_EVICTION_POLICY_CHECK``, ``SCHEDULER_LEASE_TIMEOUT`` and
    ``SCHEDULER_MAX_DELIVERIES`` (also given to a frontier built directly).

    Raises:
        ConfigurationError: a value out of range.
    """
    if eviction_check not in EVICTION_CHECKS:
        raise ConfigurationError(
            f"REDIS_EVICTION_POLICY_CHECK must be 'refuse', 'warn' or 'off', not {eviction_check!r}"
        )
    if lease_timeout <= 0:
        raise ConfigurationError(f"SCHEDULER_LEASE_TIMEOUT must be positive ({lease_timeout})")
    if max_deliveries < 1:
        raise ConfigurationError(f"SCHEDULER_MAX_DELIVERIES must be at least 1 ({max_deliveries})")


def _frontier(s: BaseSettings) -> FrontierConfig:
    eviction_check = str(s.get("REDIS_EVICTION_POLICY_CHECK"))
    lease_timeout = s.getfloat("SCHEDULER_LEASE_TIMEOUT")
    max_deliveries = s.getint("SCHEDULER_MAX_DELIVERIES")
    check_frontier(eviction_check, lease_timeout, max_deliveries)
    return FrontierConfig(
        lease_timeout=lease_timeout,
        max_deliveries=max_deliveries,
        eviction_check=eviction_check,
        wrongtype_timeout=s.getfloat("SCHEDULER_WRONGTYPE_TIMEOUT"),
        eager=s.getfloat("SCHEDULER_FLUSH_INTERVAL") == 0,
        shards=_shards(s),
        background=s.getbool("SCHEDULER_BACKGROUND_FLUSH"),
    )


#: The most shards a crawl may have (each is a set of keys and a script call per flush).
MAX_SHARDS = 64


def _shards(s: BaseSettings) -> int:
    """``SCHEDULER_SHARDS``: an integer from 1 to :data:`MAX_SHARDS`.

    Raises:
        ConfigurationError: anything else.
    """
    raw = s.get("SCHEDULER_SHARDS", 1)
    try:
        shards = int(str(raw).strip()) if not isinstance(raw, bool) else None
    except ValueError:
        shards = None
    if shards is None or not 1 <= shards <= MAX_SHARDS:
        raise ConfigurationError(
            f"SCHEDULER_SHARDS must be an integer from 1 to {MAX_SHARDS}, not {raw!r}"
        )
    return shards


@dataclass(frozen=True)
class WorkersConfig:
    """The worker registry: ``SCHEDULER_HEARTBEAT_INTERVAL``, ``SCHEDULER_WORKER_TIMEOUT``."""

    heartbeat_interval: float
    worker_timeout: float


def _workers(s: BaseSettings) -> WorkersConfig:
    return WorkersConfig(
        heartbeat_interval=s.getfloat("SCHEDULER_HEARTBEAT_INTERVAL"),
        worker_timeout=s.getfloat("SCHEDULER_WORKER_TIMEOUT"),
    )


@dataclass(frozen=True)
class ReplicationConfig:
    """Children confirmed on replicas before their parent's acknowledgement
    (:mod:`scrapy_dist.frontier.replication`): ``REDIS_WAIT_REPLICAS`` (``None``: decided by the
    topology) and ``REDIS_WAIT_TIMEOUT``."""

    wait_replicas: int | None
    wait_timeout: float


def check_replication(wait_replicas: int | None, wait_timeout: float) -> None:
    """Check ``REDIS_WAIT_REPLICAS`` and ``REDIS_WAIT_TIMEOUT``.

    Raises:
        ConfigurationError: a value out of range.
    """
    if wait_replicas is not None and wait_replicas < 0:
        raise ConfigurationError(
            f"REDIS_WAIT_REPLICAS must be None, 0 (off) or a number of replicas ({wait_replicas})"
        )
    if not wait_timeout > 0 or math.isinf(wait_timeout):
        raise ConfigurationError(
            f"REDIS_WAIT_TIMEOUT must be a positive number of seconds ({wait_timeout})"
        )


def _replication(s: BaseSettings) -> ReplicationConfig:
    raw = s.get("REDIS_WAIT_REPLICAS")
    try:
        replicas = None if raw is None or raw == "" else int(raw)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"REDIS_WAIT_REPLICAS must be None, 0 (off) or a number of replicas ({raw!r})"
        ) from None
    try:
        timeout = s.getfloat("REDIS_WAIT_TIMEOUT")
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"REDIS_WAIT_TIMEOUT must be a positive number of seconds "
            f"({s.get('REDIS_WAIT_TIMEOUT')!r})"
        ) from None
    check_replication(replicas, timeout)
    return ReplicationConfig(wait_replicas=replicas, wait_timeout=timeout)


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's settings.

    Attributes:
        prefetch: requests leased per call (``SCHEDULER_PREFETCH``, or half of
            ``CONCURRENT_REQUESTS``).
        max_held: most requests a worker holds (``CONCURRENT_REQUESTS + 2 * prefetch``).
        callback_errors: what a request whose callback raised becomes
            (``SCHEDULER_CALLBACK_ERRORS``, one of :data:`CALLBACK_ERRORS`).
    """

    prefetch: int
    max_held: int
    persist: bool
    flush_on_start: bool
    idle_before_close: float
    flush_interval: float
    start_once: bool
    close_when_done: bool
    fault_exit_code: int
    callback_errors: str = "done"


def check_scheduler(
    *,
    prefetch: int,
    idle_before_close: float,
    worker_timeout: float,
    heartbeat_interval: float,
    lease_timeout: float,
    flush_interval: float,
    callback_errors: object = "done",
) -> None:
    """Check the scheduler's values (also given to a scheduler built directly).

    Raises:
        ConfigurationError: a value out of range, or timeouts too short for the
            heartbeat.
    """
    if prefetch < 1:
        raise ConfigurationError(f"SCHEDULER_PREFETCH must be at least 1, not {prefetch}")
    if idle_before_close < 0:
        raise ConfigurationError(
            f"SCHEDULER_IDLE_BEFORE_CLOSE cannot be negative ({idle_before_close})"
        )
    if worker_timeout < 2 * heartbeat_interval:
        raise ConfigurationError(
            f"SCHEDULER_WORKER_TIMEOUT ({worker_timeout}s) must be at least twice "
            f"SCHEDULER_HEARTBEAT_INTERVAL ({heartbeat_interval}s)"
        )
    if lease_timeout < 3 * heartbeat_interval:
        raise ConfigurationError(
            f"SCHEDULER_LEASE_TIMEOUT ({lease_timeout}s) must be at least three "
            f"times SCHEDULER_HEARTBEAT_INTERVAL ({heartbeat_interval}s), which is how "
            "often leases are renewed"
        )
    if flush_interval < 0:
        raise ConfigurationError(f"SCHEDULER_FLUSH_INTERVAL cannot be negative ({flush_interval})")
    if not isinstance(callback_errors, str) or callback_errors not in CALLBACK_ERRORS:
        raise ConfigurationError(
            "SCHEDULER_CALLBACK_ERRORS must be one of "
            f"{', '.join(map(repr, CALLBACK_ERRORS))}, not {callback_errors!r}"
        )


def _scheduler(
    s: BaseSettings, workers: WorkersConfig, frontier: FrontierConfig
) -> SchedulerConfig:
    concurrency = s.getint("CONCURRENT_REQUESTS")
    prefetch = s.getint("SCHEDULER_PREFETCH") or max(1, concurrency // 2)
    idle_before_close = s.getfloat("SCHEDULER_IDLE_BEFORE_CLOSE")
    flush_interval = s.getfloat("SCHEDULER_FLUSH_INTERVAL")
    callback_errors = s.get("SCHEDULER_CALLBACK_ERRORS")
    if isinstance(callback_errors, str):  # (as other choices: "Dead" and " dead" too)
        callback_errors = callback_errors.strip().lower()
    check_scheduler(
        prefetch=prefetch,
        idle_before_close=idle_before_close,
        worker_timeout=workers.worker_timeout,
        heartbeat_interval=workers.heartbeat_interval,
        lease_timeout=frontier.lease_timeout,
        flush_interval=flush_interval,
        callback_errors=callback_errors,
    )
    return SchedulerConfig(
        prefetch=prefetch,
        max_held=concurrency + 2 * prefetch,
        persist=s.getbool("SCHEDULER_PERSIST"),
        flush_on_start=s.getbool("SCHEDULER_FLUSH_ON_START"),
        idle_before_close=idle_before_close,
        flush_interval=flush_interval,
        start_once=s.getbool("SCHEDULER_START_ONCE"),
        close_when_done=s.getbool("CLOSE_WHEN_CRAWL_DONE"),
        fault_exit_code=s.getint("SCHEDULER_FAULT_EXIT_CODE"),
        callback_errors=str(callback_errors),
    )


@dataclass(frozen=True)
class PolitenessConfig:
    """Cluster-wide politeness (``SCHEDULER_POLITENESS``, :mod:`scrapy_dist.politeness`),
    with Scrapy's own settings of download slots.

    Attributes:
        enabled: ``SCHEDULER_POLITENESS``.
        delay: ``DOWNLOAD_DELAY`` (seconds between sends to one slot).
        concurrency: ``CONCURRENT_REQUESTS_PER_DOMAIN``.
        jitter: ``DOWNLOAD_DELAY_JITTER`` (or ``RANDOMIZE_DOWNLOAD_DELAY``: 0.5 or 0).
        slots: ``DOWNLOAD_SLOTS``: slot -> ``{"delay", "concurrency", "jitter"}``.
        timeout: ``SCHEDULER_POLITENESS_TIMEOUT``.
        per_ip: ``CONCURRENT_REQUESTS_PER_IP`` (not applied cluster-wide).
        autothrottle: ``AUTOTHROTTLE_ENABLED``.
        robots: ``ROBOTSTXT_OBEY`` (``Crawl-delay`` then counts).
    """

    enabled: bool
    delay: float
    concurrency: int
    jitter: float
    slots: dict[str, dict[str, Any]]
    timeout: float
    per_ip: int
    autothrottle: bool
    robots: bool


def check_politeness(delay: float, concurrency: int, timeout: float) -> None:
    """Check the politeness values.

    Raises:
        ConfigurationError: a negative delay, a concurrency below 1, a timeout below 1 s.
    """
    if delay < 0 or not math.isfinite(delay):
        raise ConfigurationError(f"DOWNLOAD_DELAY must be a number >= 0, not {delay}")
    if concurrency < 1:
        raise ConfigurationError(
            f"CONCURRENT_REQUESTS_PER_DOMAIN must be at least 1 with SCHEDULER_POLITENESS, "
            f"not {concurrency}"
        )
    if timeout < 1 or not math.isfinite(timeout):
        raise ConfigurationError(
            f"SCHEDULER_POLITENESS_TIMEOUT must be at least 1 second, not {timeout}"
        )


def _politeness(s: BaseSettings) -> PolitenessConfig:
    jitter = s.getfloat("DOWNLOAD_DELAY_JITTER", 0.5)
    randomize = s.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    if randomize > (s.getpriority("DOWNLOAD_DELAY_JITTER") or 0):
        jitter = 0.5 if s.getbool("RANDOMIZE_DOWNLOAD_DELAY") else 0.0
    slots = s.getdict("DOWNLOAD_SLOTS")
    enabled = s.getbool("SCHEDULER_POLITENESS")
    for slot, values in slots.items() if enabled else ():  # off: Scrapy's business
        if not isinstance(values, dict):
            raise ConfigurationError(f"DOWNLOAD_SLOTS[{slot!r}] must be a dict, not {values!r}")
        try:
            check_politeness(float(values.get("delay", 0)), int(values.get("concurrency", 1)), 1)
            slot_jitter = float(values.get("jitter", 0))
            if slot_jitter < 0 or not math.isfinite(slot_jitter):
                raise ConfigurationError(f"jitter must be a number >= 0, not {slot_jitter}")
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"DOWNLOAD_SLOTS[{slot!r}]: {e}") from None
        except ConfigurationError as e:
            raise ConfigurationError(f"DOWNLOAD_SLOTS[{slot!r}]: {e}") from None
    config = PolitenessConfig(
        enabled=enabled,
        delay=s.getfloat("DOWNLOAD_DELAY"),
        concurrency=s.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
        jitter=max(0.0, jitter),
        slots=slots,
        timeout=s.getfloat("SCHEDULER_POLITENESS_TIMEOUT"),
        per_ip=s.getint("CONCURRENT_REQUESTS_PER_IP"),
        autothrottle=s.getbool("AUTOTHROTTLE_ENABLED"),
        robots=s.getbool("ROBOTSTXT_OBEY"),
    )
    if config.enabled:
        check_politeness(config.delay, config.concurrency, config.timeout)
    return config


@dataclass(frozen=True)
class RequestsConfig:
    """What queue entries hold and may decode into.

    Attributes:
        serializer: ``SCHEDULER_SERIALIZER`` as set (resolved by
            :func:`scrapy_dist.serializers.load_serializer`).
        classes: ``SCHEDULER_REQUEST_CLASSES`` as set (import paths or classes).
        schemes: ``SCHEDULER_URL_SCHEMES``.
    """

    serializer: Any
    classes: tuple[Any, ...]
    schemes: tuple[str, ...]


def _requests(s: BaseSettings) -> RequestsConfig:
    return RequestsConfig(
        serializer=s.get("SCHEDULER_SERIALIZER"),
        classes=tuple(s.getlist("SCHEDULER_REQUEST_CLASSES")),
        schemes=tuple(s.getlist("SCHEDULER_URL_SCHEMES", ["http", "https"])),
    )


@dataclass(frozen=True)
class SeedsConfig:
    """Seeds read from Redis.

    Attributes:
        kind: ``"list"``, ``"set"`` or ``"zset"`` (``REDIS_START_URLS_AS_SET``/``_AS_ZSET``).
        batch_size: seeds per read (``REDIS_START_URLS_BATCH_SIZE``, or
            ``CONCURRENT_REQUESTS``); a spider's ``redis_batch_size`` overrides it.
        encoding: ``REDIS_ENCODING``.
        dont_filter: ``REDIS_START_URLS_DONT_FILTER``.
        extra_formdata: ``REDIS_START_URLS_EXTRA_FORMDATA``.
        allowed_meta: ``SEED_ALLOWED_META``.
    """

    kind: str
    batch_size: int
    encoding: str
    dont_filter: bool
    extra_formdata: bool
    allowed_meta: frozenset[str]


def _seeds(s: BaseSettings) -> SeedsConfig:
    as_set = s.getbool("REDIS_START_URLS_AS_SET")
    as_zset = s.getbool("REDIS_START_URLS_AS_ZSET")
    if as_set and as_zset:
        logger.warning(
            "REDIS_START_URLS_AS_SET and REDIS_START_URLS_AS_ZSET are both set: reading "
            "seeds from a set, as scrapy-redis does; unset one of them"
        )
    return SeedsConfig(
        kind="set" if as_set else "zset" if as_zset else "list",
        batch_size=s.getint("REDIS_START_URLS_BATCH_SIZE") or s.getint("CONCURRENT_REQUESTS"),
        encoding=str(s.get("REDIS_ENCODING")),
        dont_filter=s.getbool("REDIS_START_URLS_DONT_FILTER"),
        extra_formdata=s.getbool("REDIS_START_URLS_EXTRA_FORMDATA"),
        allowed_meta=frozenset(s.getlist("SEED_ALLOWED_META")),
    )


@dataclass(frozen=True)
class SpiderConfig:
    """A Redis spider's idle handling (``MAX_IDLE_TIME_BEFORE_CLOSE``,
    ``CLOSE_WHEN_CRAWL_DONE``, ``CRAWL_DONE_GRACE``, ``SCHEDULER_IDLE_POLL``/``_MAX``,
    ``SCHEDULER_PERSIST``)."""

    max_idle_time: float
    close_when_done: bool
    done_grace: float
    persist: bool
    idle_poll: float
    idle_poll_max: float


def check_seed_batch_size(batch_size: int) -> None:
    """Raise :class:`ConfigurationError` unless seeds are read at least one at a time
    (``REDIS_START_URLS_BATCH_SIZE``, or the spider's ``redis_batch_size``)."""
    if batch_size < 1:
        raise ConfigurationError("REDIS_START_URLS_BATCH_SIZE must be at least 1")


def _spider(s: BaseSettings) -> SpiderConfig:
    idle_poll = s.getfloat("SCHEDULER_IDLE_POLL")
    if idle_poll <= 0:
        raise ConfigurationError("SCHEDULER_IDLE_POLL must be positive")
    return SpiderConfig(
        max_idle_time=s.getfloat("MAX_IDLE_TIME_BEFORE_CLOSE"),
        close_when_done=s.getbool("CLOSE_WHEN_CRAWL_DONE"),
        done_grace=s.getfloat("CRAWL_DONE_GRACE"),
        persist=s.getbool("SCHEDULER_PERSIST"),
        idle_poll=idle_poll,
        idle_poll_max=max(idle_poll, s.getfloat("SCHEDULER_IDLE_POLL_MAX")),
    )


@dataclass(frozen=True)
class BloomSize:
    """The first Bloom stage as set: ``bits`` and ``hash_number`` (``BLOOMFILTER_BIT``,
    ``BLOOMFILTER_HASH_NUMBER``) when ``bits`` is set, else ``capacity`` at
    ``error_rate`` (``BLOOM_CAPACITY``, ``BLOOM_ERROR_RATE``)."""

    bits: int | None = None
    hash_number: int = 0
    capacity: int = 0
    error_rate: float = 0.0


@dataclass(frozen=True)
class DupefilterConfig:
    """The dupefilter's settings.

    Attributes:
        backend: ``DUPEFILTER_BACKEND``, lower case, one of :data:`BACKENDS`.
        ttl: ``DUPEFILTER_TTL`` in seconds (``None``: never expires).
        on_full: ``BLOOM_ON_FULL`` (checked unless the backend is ``"set"``).
        bloom: the Bloom size (``None`` with the ``"set"`` backend).
        local_cache: ``DUPEFILTER_LOCAL_CACHE`` (``None``: on, exact only by choice).
        local_cache_size: ``DUPEFILTER_LOCAL_CACHE_SIZE``.
        debug: ``DUPEFILTER_DEBUG``.
        standalone_per_run: ``DUPEFILTER_STANDALONE_PER_RUN``.
        capacity: ``DUPEFILTER_CAPACITY``, else ``BLOOM_CAPACITY``: fingerprints the
            ``"buckets"`` backend sizes its bucket count for.
        recrawl_after: ``DUPEFILTER_RECRAWL_AFTER`` in seconds: how long a fingerprint
            counts as seen (``None``: forever).
    """

    backend: str
    ttl: float | None
    on_full: str
    bloom: BloomSize | None
    local_cache: bool | None
    local_cache_size: int
    debug: bool
    standalone_per_run: bool
    capacity: int = 10_000_000
    recrawl_after: float | None = None


def _capacity(s: BaseSettings) -> int:
    raw = s.get("DUPEFILTER_CAPACITY")
    try:
        capacity = s.getint("BLOOM_CAPACITY") if raw is None or raw == "" else int(raw)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"DUPEFILTER_CAPACITY must be an integer: {raw!r}") from e
    if capacity < 1:
        raise ConfigurationError(f"DUPEFILTER_CAPACITY must be at least 1: {capacity!r}")
    return capacity


def _ttl(raw: Any) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        ttl = float(raw)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"DUPEFILTER_TTL must be a number of seconds: {raw!r}") from e
    if ttl < 0 or math.isnan(ttl):
        raise ConfigurationError(f"DUPEFILTER_TTL cannot be negative: {raw!r}")
    return ttl or None


def recrawl_after(raw: Any) -> float | None:
    """``DUPEFILTER_RECRAWL_AFTER`` in seconds, or ``None`` (unset: seen forever).

    Raises:
        ConfigurationError: not a number, not finite, not above 0, or above
            :data:`RECRAWL_MAX_SECONDS`.
    """
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raise ConfigurationError(f"DUPEFILTER_RECRAWL_AFTER must be a number of seconds: {raw!r}")
    try:
        seconds = float(raw)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(
            f"DUPEFILTER_RECRAWL_AFTER must be a number of seconds (7 days: 604800): {raw!r}"
        ) from e
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(
            f"DUPEFILTER_RECRAWL_AFTER must be a number of seconds above 0 (unset it for "
            f"'seen forever'): {raw!r}"
        )
    if seconds < 0.001 * RECRAWL_MIN_MS:
        raise ConfigurationError(
            f"DUPEFILTER_RECRAWL_AFTER must be at least {0.001 * RECRAWL_MIN_MS:g} seconds: {raw!r}"
        )
    if seconds > RECRAWL_MAX_SECONDS:
        raise ConfigurationError(
            f"DUPEFILTER_RECRAWL_AFTER must be at most {RECRAWL_MAX_SECONDS} seconds (1,000 "
            f"years; unset it for 'seen forever'): {raw!r}"
        )
    return seconds


def _bloom(s: BaseSettings) -> BloomSize:
    bit = s.get("BLOOMFILTER_BIT")
    try:
        if bit is not None and bit != "":
            return BloomSize(bits=int(bit), hash_number=s.getint("BLOOMFILTER_HASH_NUMBER"))
        return BloomSize(
            capacity=s.getint("BLOOM_CAPACITY"), error_rate=s.getfloat("BLOOM_ERROR_RATE")
        )
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"invalid Bloom dupefilter size: {e}") from e


def _dupefilter(s: BaseSettings) -> DupefilterConfig:
    mode = str(s.get("DUPEFILTER_BACKEND")).lower()
    if mode not in BACKENDS:
        raise ConfigurationError(
            f"DUPEFILTER_BACKEND must be one of {', '.join(map(repr, BACKENDS))}, not {mode!r}"
        )
    ttl = _ttl(s.get("DUPEFILTER_TTL"))
    window = recrawl_after(s.get("DUPEFILTER_RECRAWL_AFTER"))
    if window is not None and ttl is not None:
        raise ConfigurationError(
            "DUPEFILTER_TTL and DUPEFILTER_RECRAWL_AFTER cannot be combined: the window "
            "already forgets each fingerprint after DUPEFILTER_RECRAWL_AFTER seconds, in "
            "bounded memory; unset DUPEFILTER_TTL"
        )
    on_full = str(s.get("BLOOM_ON_FULL")).lower()
    bloom = None
    if mode not in ("set", "buckets"):
        check_on_full(on_full)
        bloom = _bloom(s)
    wanted = s.get("DUPEFILTER_LOCAL_CACHE")
    return DupefilterConfig(
        backend=mode,
        ttl=ttl,
        on_full=on_full,
        bloom=bloom,
        local_cache=None if wanted is None else s.getbool("DUPEFILTER_LOCAL_CACHE"),
        local_cache_size=s.getint("DUPEFILTER_LOCAL_CACHE_SIZE"),
        debug=s.getbool("DUPEFILTER_DEBUG"),
        standalone_per_run=s.getbool("DUPEFILTER_STANDALONE_PER_RUN"),
        capacity=_capacity(s),
        recrawl_after=window,
    )


def check_on_full(on_full: str) -> None:
    """Raise :class:`ConfigurationError` unless ``on_full`` is one of :data:`ON_FULL`
    (``BLOOM_ON_FULL``, also given to a Bloom backend built directly)."""
    if on_full not in ON_FULL:
        raise ConfigurationError(f"BLOOM_ON_FULL must be 'grow' or 'refuse', not {on_full!r}")


@dataclass(frozen=True)
class ItemsConfig:
    """The item pipeline's settings (the items key is ``config.keys.items``).

    Attributes:
        serializer: ``REDIS_ITEMS_SERIALIZER``, imported (``None``: JSON lines).
        serializer_path: ``REDIS_ITEMS_SERIALIZER`` as set.
    """

    maxlen: int
    batch_size: int
    flush_interval: float
    serializer: Any
    serializer_path: Any
    buffer_max: int = 10_000
    close_timeout: float = 30.0
    rejected_file: str = "%(key)s.%(pid)s.rejected.jl"
    wrongtype_timeout: float = 300.0
    #: ``REDIS_ITEMS_STREAM_KEY``: the items stream's template (``RedisStreamPipeline``).
    stream_key: str = "%(spider)s:items:stream"
    #: ``REDIS_ITEMS_STREAM_MAXLEN``: approximate cap of the items stream (0: none).
    stream_maxlen: int = 0


def check_items(maxlen: int, batch_size: int, flush_interval: float) -> None:
    """Check ``REDIS_ITEMS_MAXLEN``, ``REDIS_ITEMS_BATCH_SIZE`` and
    ``REDIS_ITEMS_FLUSH_INTERVAL`` (also given to an item writer built directly).

    Raises:
        ConfigurationError: a negative maxlen, a batch size below 1 or a non-positive
            interval.
    """
    if maxlen < 0:
        raise ConfigurationError(f"REDIS_ITEMS_MAXLEN cannot be negative ({maxlen})")
    if batch_size < 1:
        raise ConfigurationError(f"REDIS_ITEMS_BATCH_SIZE must be at least 1 ({batch_size})")
    if flush_interval <= 0:
        raise ConfigurationError(f"REDIS_ITEMS_FLUSH_INTERVAL must be positive ({flush_interval})")


def _items(s: BaseSettings) -> ItemsConfig:
    path = s.get("REDIS_ITEMS_SERIALIZER")
    serializer = load_setting("REDIS_ITEMS_SERIALIZER", path) if path else None
    if serializer is not None and not callable(serializer):
        raise ConfigurationError(f"REDIS_ITEMS_SERIALIZER {path!r} is not a function")
    maxlen = s.getint("REDIS_ITEMS_MAXLEN")
    batch_size = s.getint("REDIS_ITEMS_BATCH_SIZE")
    flush_interval = s.getfloat("REDIS_ITEMS_FLUSH_INTERVAL")
    check_items(maxlen, batch_size, flush_interval)
    buffer_max = s.getint("REDIS_ITEMS_BUFFER_MAX")
    if buffer_max < 1:
        raise ConfigurationError(f"REDIS_ITEMS_BUFFER_MAX must be at least 1 ({buffer_max})")
    close_timeout = s.getfloat("REDIS_ITEMS_CLOSE_TIMEOUT")
    if close_timeout < 0:
        raise ConfigurationError(f"REDIS_ITEMS_CLOSE_TIMEOUT cannot be negative ({close_timeout})")
    rejected_file = str(s.get("REDIS_ITEMS_REJECTED_FILE"))
    try:
        rejected_file % {"key": "k", "pid": 1}
    except (KeyError, ValueError, TypeError) as e:
        raise ConfigurationError(
            f"REDIS_ITEMS_REJECTED_FILE {rejected_file!r} may use only %(key)s and %(pid)s ({e})"
        ) from None
    return ItemsConfig(
        maxlen,
        batch_size,
        flush_interval,
        serializer,
        path,
        buffer_max=buffer_max,
        close_timeout=close_timeout,
        rejected_file=rejected_file,
        wrongtype_timeout=s.getfloat("SCHEDULER_WRONGTYPE_TIMEOUT"),
        stream_key=str(s.get("REDIS_ITEMS_STREAM_KEY") or "%(spider)s:items:stream"),
        stream_maxlen=_stream_maxlen(s),
    )


def _stream_maxlen(s: BaseSettings) -> int:
    maxlen = s.getint("REDIS_ITEMS_STREAM_MAXLEN")
    if maxlen < 0:
        raise ConfigurationError(f"REDIS_ITEMS_STREAM_MAXLEN cannot be negative ({maxlen})")
    return maxlen


@dataclass(frozen=True)
class StatsConfig:
    """``STATS_FLUSH_INTERVAL``: seconds between writes of a worker's stats to Redis;
    ``STATS_CLOSE_TIMEOUT``: seconds closing retries the last write while Redis fails."""

    flush_interval: float
    close_timeout: float = 10.0


def check_stats_interval(flush_interval: float) -> None:
    """Raise :class:`ConfigurationError` unless ``STATS_FLUSH_INTERVAL`` is positive."""
    if flush_interval <= 0:
        raise ConfigurationError(
            f"STATS_FLUSH_INTERVAL must be a positive number of seconds ({flush_interval})"
        )


def _stats(s: BaseSettings) -> StatsConfig:
    flush_interval = s.getfloat("STATS_FLUSH_INTERVAL")
    check_stats_interval(flush_interval)
    close_timeout = s.getfloat("STATS_CLOSE_TIMEOUT")
    if close_timeout < 0:
        raise ConfigurationError(f"STATS_CLOSE_TIMEOUT cannot be negative ({close_timeout})")
    return StatsConfig(flush_interval, close_timeout)


@dataclass(frozen=True)
class MetricsConfig:
    """The metrics server (``METRICS_*``); host, port and interval are checked only
    when ``enabled``."""

    enabled: bool
    host: str
    port: int
    interval: float


def check_metrics(port: int, interval: float) -> None:
    """Check ``METRICS_PORT`` and ``METRICS_INTERVAL`` (also given to the extension
    built directly).

    Raises:
        ConfigurationError: a non-positive interval or a port out of range.
    """
    if interval <= 0:
        raise ConfigurationError(f"METRICS_INTERVAL must be positive ({interval})")
    if not 0 <= port < 65536:
        raise ConfigurationError(f"METRICS_PORT must be a TCP port number ({port})")


def _metrics(s: BaseSettings) -> MetricsConfig:
    enabled = s.getbool("METRICS_ENABLED")
    if not enabled:
        return MetricsConfig(False, str(s.get("METRICS_HOST")), 0, 0.0)
    port = s.getint("METRICS_PORT")
    interval = s.getfloat("METRICS_INTERVAL")
    check_metrics(port, interval)
    return MetricsConfig(True, str(s.get("METRICS_HOST")), port, interval)


# -- the config -------------------------------------------------------------------------


class _CheckedSettings(BaseSettings):
    """Settings whose typed getters raise :class:`ConfigurationError` naming the setting
    and its value (Scrapy's raise a bare ``ValueError``: ``-s
    SCHEDULER_WORKER_TIMEOUT=abc`` ended a worker or a command with a traceback that
    named no setting)."""

    def _typed(self, kind: str, name: Any, read: Callable[[], _T]) -> _T:
        try:
            return read()
        except (ValueError, TypeError, OverflowError) as e:
            raise ConfigurationError(f"{name} = {self.get(name)!r} is not {kind} ({e})") from None

    def getbool(self, name: Any, default: bool = False) -> bool:
        return self._typed(
            "a boolean", name, lambda: super(_CheckedSettings, self).getbool(name, default)
        )

    def getint(self, name: Any, default: int = 0) -> int:
        return self._typed(
            "an integer", name, lambda: super(_CheckedSettings, self).getint(name, default)
        )

    def getfloat(self, name: Any, default: float = 0.0) -> float:
        return self._typed(
            "a number", name, lambda: super(_CheckedSettings, self).getfloat(name, default)
        )

    def getlist(self, name: Any, default: Any = None) -> list[Any]:
        return self._typed(
            "a list", name, lambda: super(_CheckedSettings, self).getlist(name, default)
        )

    def getdict(self, name: Any, default: Any = None) -> dict[Any, Any]:
        return self._typed(
            "a dict", name, lambda: super(_CheckedSettings, self).getdict(name, default)
        )


class Config:
    """scrapy_dist's settings of one crawler (or one CLI run), frozen.

    Build it with :meth:`from_crawler` or :meth:`from_settings`; each section (see the
    module docstring) is parsed and validated the first time it is read.

    Raises (on reading a section):
        ConfigurationError: a setting of that section is invalid; the message names it.
    """

    _settings: BaseSettings

    def __init__(self, settings: BaseSettings) -> None:
        resolved = _CheckedSettings()
        resolved.update(with_defaults(settings))  # (each setting keeps its priority)
        resolved.freeze()
        object.__setattr__(self, "_settings", resolved)

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}: Config is frozen")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}: Config is frozen")

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Config:
        """The config of ``settings`` (a project's, for the CLI), with the defaults."""
        return cls(settings)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Config:
        """The config of the crawler's final settings. Call it once per crawler (through
        :func:`scrapy_dist.assembly.assemble`).

        Raises:
            RuntimeError: the settings are not final yet (read from a spider's
                ``__init__``/``from_crawler``, before Scrapy applied the add-ons); read
                them from ``spider_opened`` on.
        """
        if not settings_final(crawler):
            raise RuntimeError(
                "scrapy_dist settings were read before Scrapy applied the add-ons (from a "
                "spider's __init__ or from_crawler); read them from spider_opened on"
            )
        return cls(crawler.settings)

    def with_values(self, values: Mapping[str, Any]) -> Config:
        """A new config of the same settings with ``values`` (setting name -> value)
        overriding them, e.g. to read a crawl another configuration wrote."""
        settings = self._settings.copy()
        settings.frozen = False
        settings.update(dict(values), priority=100)
        return Config(settings)

    @property
    def settings(self) -> BaseSettings:
        """The settings read, frozen, with scrapy_dist's defaults (for Scrapy's own
        settings and code that still takes settings)."""
        return self._settings

    @cached_property
    def connection(self) -> ConnectionConfig:
        return connection_config(self.settings)

    @cached_property
    def keys(self) -> KeysConfig:
        return _keys(self.settings)

    @cached_property
    def components(self) -> ComponentsConfig:
        return _components(self.settings)

    @cached_property
    def queue(self) -> QueueConfig:
        return _queue(self.settings)

    @cached_property
    def frontier(self) -> FrontierConfig:
        return _frontier(self.settings)

    @cached_property
    def workers(self) -> WorkersConfig:
        return _workers(self.settings)

    @cached_property
    def replication(self) -> ReplicationConfig:
        return _replication(self.settings)

    @cached_property
    def scheduler(self) -> SchedulerConfig:
        return _scheduler(self.settings, self.workers, self.frontier)

    @cached_property
    def requests(self) -> RequestsConfig:
        return _requests(self.settings)

    @cached_property
    def seeds(self) -> SeedsConfig:
        return _seeds(self.settings)

    @cached_property
    def spider(self) -> SpiderConfig:
        return _spider(self.settings)

    @cached_property
    def dupefilter(self) -> DupefilterConfig:
        return _dupefilter(self.settings)

    @cached_property
    def items(self) -> ItemsConfig:
        return _items(self.settings)

    @cached_property
    def stats(self) -> StatsConfig:
        return _stats(self.settings)

    @cached_property
    def metrics(self) -> MetricsConfig:
        return _metrics(self.settings)

    @cached_property
    def politeness(self) -> PolitenessConfig:
        return _politeness(self.settings)

    def validate(self) -> Config:
        """Parse every section now (e.g. for a CLI check); return ``self``.

        Raises:
            ConfigurationError: the first invalid setting.
        """
        for name in SECTIONS:
            getattr(self, name)
        return self


#: The sections of :class:`Config`, in the order :meth:`Config.validate` reads them.
SECTIONS = (
    "connection",
    "keys",
    "components",
    "queue",
    "frontier",
    "workers",
    "replication",
    "scheduler",
    "requests",
    "seeds",
    "spider",
    "dupefilter",
    "items",
    "stats",
    "metrics",
    "politeness",
)
