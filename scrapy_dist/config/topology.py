"""Where Redis is: the connection settings merged into one :class:`ConnectionConfig`.

:func:`connection_config` reads one server (``REDIS_URL``, ``REDIS_HOST``/``PORT``/``DB``),
a Redis Cluster (``REDIS_STARTUP_NODES``/``REDIS_MASTER_NODES``, a ``redis+cluster://``
URL) or a master behind Sentinel (``REDIS_SENTINELS``, a ``redis+sentinel://`` URL), with
``REDIS_PARAMS`` for the data nodes in every topology, and refuses settings that name the
servers twice or name two topologies. It does no I/O: :mod:`scrapy_dist.connection` makes
the client from the result.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from scrapy_dist.config.params import DEFAULT_PARAMS, address_setting, check_params
from scrapy_dist.config.reading import load_setting
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

#: URL schemes redis-py understands.
URL_SCHEMES = ("redis", "rediss", "unix")


def mask_url(url: str) -> str:
    """Return ``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


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
        params["db"] = address_setting(settings, "REDIS_DB")
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
            params[name] = address_setting(settings, "REDIS_PORT")
        elif name == "db":
            params[name] = address_setting(settings, "REDIS_DB")
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
