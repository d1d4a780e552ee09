"""The one Redis client factory.

Only this module creates clients, from the connection settings
(:class:`~scrapy_dist.config.topology.ConnectionConfig`). A crawler gets one client, shared by
the scheduler, the dupefilter, the spider and every other component
(:func:`scrapy_dist.assembly.assemble`). Building a
client does no I/O; :func:`check` is the explicit connectivity test that turns an
unreachable server into :class:`~scrapy_dist.exceptions.RedisUnavailable` naming the
server with its password masked.

Three topologies (:func:`topology`): one server; a master behind Sentinel (redis-py's
``Sentinel.master_for`` client, which finds the new master after a failover); a Redis
Cluster (:class:`ClusterClient`). Every client has the plain :class:`redis.Redis` API:
under Cluster, a crawl's components use :func:`crawl_client`, pinned to the node that
owns the crawl's hash slot (its keys share one hash tag, :mod:`scrapy_dist.keys`), and
code that must visit every key (listing crawls) ``SCAN`` s :func:`primaries`.
:func:`describe` names the topology (nodes or Sentinels and the master's name),
passwords masked.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, cast

import redis
from redis.client import Pipeline
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    TryAgainError,
)
from redis.sentinel import Sentinel, SentinelConnectionPool

from scrapy_dist.config.params import DEFAULT_PARAMS
from scrapy_dist.config.topology import (
    CLUSTER,
    SENTINEL,
    SINGLE,
    URL_SCHEMES,
    ConnectionConfig,
    connection_config,
    mask_url,
)
from scrapy_dist.exceptions import ConfigurationError, RedisUnavailable

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from scrapy.settings import BaseSettings

    from scrapy_dist.keys import RedisKeys

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PARAMS",
    "SETTINGS_PARAMS_MAP",
    "URL_SCHEMES",
    "ClusterClient",
    "SlotMoved",
    "check",
    "client_from_config",
    "client_from_settings",
    "crawl_client",
    "describe",
    "from_settings",
    "get_redis",
    "get_redis_from_settings",
    "mask_url",
    "primaries",
    "topology",
]

#: scrapy-redis's map of connection settings to client arguments (for code that reads it).
SETTINGS_PARAMS_MAP = {
    "REDIS_URL": "url",
    "REDIS_HOST": "host",
    "REDIS_PORT": "port",
    "REDIS_DB": "db",
    "REDIS_ENCODING": "encoding",
    "REDIS_DECODE_RESPONSES": "decode_responses",
}


def client_from_config(connection: ConnectionConfig) -> redis.Redis:
    """Build a client of the configured topology, without connecting.

    One server: a :class:`redis.Redis` (or ``REDIS_PARAMS["redis_cls"]``). Sentinel: the
    master's client from ``Sentinel.master_for`` (a :class:`redis.Redis` whose pool asks
    the Sentinels where the master is, and again after a failover). Cluster: a
    :class:`ClusterClient`, which has the plain :class:`redis.Redis` API; give components
    :func:`crawl_client` of it, which reaches the node owning the crawl's hash slot.

    Raises:
        ConfigurationError: arguments redis-py refuses.
    """
    try:
        if connection.topology == CLUSTER:
            return ClusterClient(connection)
        if connection.topology == SENTINEL:
            return _sentinel_master(connection)
        redis_cls: type[redis.Redis] = connection.redis_cls or redis.Redis
        if connection.url:
            return redis_cls.from_url(connection.url, **connection.params)
        return redis_cls(**connection.params)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"invalid Redis connection settings: {e}") from e


def _sentinel_master(connection: ConnectionConfig) -> redis.Redis:
    """The master's client behind Sentinel (no I/O: the pool asks a Sentinel at connect)."""
    params = dict(connection.params)
    if connection.ssl:
        params["ssl"] = True
    sentinel = Sentinel(
        list(connection.nodes), sentinel_kwargs=dict(connection.sentinel_params), **params
    )
    redis_cls = connection.redis_cls or redis.Redis
    service = str(connection.service_name)
    return cast("redis.Redis", sentinel.master_for(service, redis_class=redis_cls, **params))


def client_from_settings(settings: BaseSettings) -> redis.Redis:
    """Build a client from settings, without connecting (for code without a crawler;
    a crawler's components share its client, :func:`scrapy_dist.assembly.assemble`).

    Raises:
        ConfigurationError: contradictory or invalid connection settings.
    """
    return client_from_config(connection_config(settings))


def get_redis(**kwargs: Any) -> Any:
    """Build a client from keyword arguments, as scrapy-redis's ``get_redis`` does.

    Args:
        **kwargs: ``redis_cls`` (default :class:`redis.Redis`), ``url`` (then
            ``redis_cls.from_url(url, **rest)``), and any client arguments.

    Returns:
        The client (no I/O).
    """
    redis_cls = kwargs.pop("redis_cls", redis.Redis)
    url = kwargs.pop("url", None)
    if url:
        return redis_cls.from_url(url, **kwargs)
    return redis_cls(**kwargs)


def get_redis_from_settings(settings: BaseSettings) -> Any:
    """Build a client from Scrapy settings (scrapy-redis's name for :func:`client_from_settings`).

    ``REDIS_PARAMS`` extends :data:`DEFAULT_PARAMS`; ``REDIS_URL``, ``REDIS_HOST``,
    ``REDIS_PORT`` and ``REDIS_DB`` name the server (the URL wins, with a warning);
    ``REDIS_PARAMS["redis_cls"]`` may be a class or its import path. Under Cluster or
    Sentinel settings, the topology's client (:func:`client_from_config`). Components of
    a crawl share the crawler's client instead (:func:`scrapy_dist.assembly.assemble`).

    Raises:
        ConfigurationError: contradictory or invalid connection settings.
    """
    connection = connection_config(settings)
    if connection.topology != SINGLE:  # Cluster or Sentinel: the topology's client
        return client_from_config(connection)
    params = dict(connection.params)
    if connection.redis_cls is not None:
        params["redis_cls"] = connection.redis_cls
    if connection.url:
        params["url"] = connection.url
    return get_redis(**params)


#: scrapy-redis's older name of :func:`get_redis_from_settings`.
from_settings = get_redis_from_settings


def _auth(kwargs: Mapping[str, Any]) -> str:
    """``user:***@`` / ``:***@`` / ``user@`` / ``""`` for connection kwargs (password masked)."""
    if kwargs.get("password"):
        return f"{kwargs.get('username') or ''}:***@"
    if kwargs.get("username"):
        return f"{kwargs['username']}@"
    return ""


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe(client: Any) -> str:
    """Say which servers ``client`` talks to, password masked, without I/O.

    One server: its URL (``redis://:***@host:6379/0``). Sentinel:
    ``redis+sentinel://:***@s1:26379,s2:26379/<master name>/<db>`` (the Sentinels and the
    master's name). Cluster: ``redis+cluster://:***@n1:7000,n2:7001`` (the startup nodes),
    plus ``(slot S on host:port)`` for a :func:`crawl_client` once it has found the node.
    """
    if isinstance(client, ClusterClient):
        return client.describe()
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    auth = _auth(kwargs)
    db = kwargs.get("db", 0)
    if isinstance(pool, SentinelConnectionPool):
        sentinels = ",".join(
            _hostport(s.connection_pool.connection_kwargs.get("host", "localhost"),
                      s.connection_pool.connection_kwargs.get("port", 26379))
            for s in pool.sentinel_manager.sentinels
        )  # fmt: skip
        ssl = issubclass(pool.connection_class, redis.SSLConnection)
        scheme = "rediss+sentinel" if ssl else "redis+sentinel"
        return f"{scheme}://{auth}{sentinels}/{pool.service_name}/{db}"
    if kwargs.get("path"):
        return f"unix://{auth}{kwargs['path']}?db={db}"
    ssl = issubclass(pool.connection_class, redis.SSLConnection)
    scheme = "rediss" if ssl else "redis"
    return f"{scheme}://{auth}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def topology(client: Any) -> str:
    """``"cluster"``, ``"sentinel"`` or ``"single"``: the topology ``client`` talks to."""
    if isinstance(client, ClusterClient):
        return CLUSTER
    if isinstance(getattr(client, "connection_pool", None), SentinelConnectionPool):
        return SENTINEL
    return SINGLE


def check(client: redis.Redis) -> None:
    """Ping the server once (under Cluster: discover the cluster, then ping the node the
    client points at; behind Sentinel: ask a Sentinel for the master, then ping it).

    Raises:
        RedisUnavailable: the server cannot be reached or refused the connection (the
            credentials, the database number); the message names the server (password
            masked), the cause and the settings to change.
    """
    settings = _settings_named(client)
    try:
        if isinstance(client, ClusterClient):
            client.resolve()  # discover the cluster from any startup node that answers
        client.ping()
    except redis.AuthenticationError as e:
        raise RedisUnavailable(
            f"Redis at {describe(client)} refused the credentials ({e}): check the user "
            f"name and password in {settings}"
        ) from e
    except redis.ResponseError as e:
        if "DB index" not in str(e):  # (the SELECT of the connection's set-up)
            raise _unreachable(client, e, settings) from e
        db = client.connection_pool.connection_kwargs.get("db", 0)
        raise RedisUnavailable(
            f"Redis at {describe(client)} refused database {db} ({e}): the server has "
            "fewer databases (its 'databases' setting); check the database number in "
            f"{_db_settings_named(client)}"
        ) from e
    except (redis.RedisError, RedisClusterException) as e:
        raise _unreachable(client, e, settings) from e


def _unreachable(client: Any, error: Exception, settings: str) -> RedisUnavailable:
    return RedisUnavailable(
        f"cannot reach Redis at {describe(client)} ({error}): check {settings} and that "
        "the servers are running"
    )


def _db_settings_named(client: Any) -> str:
    if topology(client) == SENTINEL:
        return "REDIS_URL (redis+sentinel://.../<master name>/<db>), REDIS_DB or REDIS_PARAMS['db']"
    return "REDIS_URL (redis://host:port/<db>), REDIS_DB or REDIS_PARAMS['db']"


def _settings_named(client: Any) -> str:
    kind = topology(client)
    if kind == CLUSTER:
        return "REDIS_STARTUP_NODES (or REDIS_URL), REDIS_PARAMS, REDIS_CLUSTER_PARAMS"
    if kind == SENTINEL:
        return "REDIS_SENTINELS (or REDIS_URL), REDIS_SENTINEL_PARAMS, REDIS_PARAMS"
    return "REDIS_URL (or REDIS_HOST, REDIS_PORT, REDIS_PARAMS)"


def crawl_client(client: redis.Redis, keys: RedisKeys, extra: Sequence[str] = ()) -> redis.Redis:
    """The client a crawl's components use: under Cluster, a :class:`ClusterClient`
    pinned to the node owning the hash slot of the crawl's keys (every command, pipeline
    and ``EVALSHA`` reaches it; see :class:`ClusterClient`); else ``client`` itself.

    Raises:
        ConfigurationError: under Cluster, the crawl's keys (and ``extra`` keys, such as
            the items key) do not all hash to one slot (:func:`scrapy_dist.keys.crawl_slot`).
    """
    if isinstance(client, ClusterClient):
        from scrapy_dist.keys import crawl_slot

        return client.for_slot(crawl_slot(keys, extra))
    return client


def primaries(client: redis.Redis) -> list[redis.Redis]:
    """One plain client per primary (``SCAN`` each to list every key): the cluster's
    primaries under Cluster (one ``CLUSTER SLOTS`` round trip; the clients belong to
    ``client``: do not close them), else ``[client]``.

    Raises:
        RedisUnavailable: the cluster cannot be reached.
    """
    if isinstance(client, ClusterClient):
        return client.primaries()
    return [client]


class SlotMoved(redis.ConnectionError):
    """The crawl's hash slot is served by another node now (``MOVED``/``ASK`` after a
    failover or while the slot migrates). A :class:`redis.ConnectionError`, so callers
    treat it as the outage it is and retry; the client has turned to the new node."""


#: Errors after which a :class:`ClusterClient` asks the cluster again which node owns
#: its slot (the node may be down, or no longer a primary).
_RERESOLVE = (redis.ConnectionError, redis.TimeoutError, ClusterDownError, TryAgainError)

#: Seconds between two look-ups of the slot's owner after errors.
RESOLVE_INTERVAL = 0.5

#: redis-py before 5.1 turns ``MOVED``/``ASK``/``TRYAGAIN``/``CLUSTERDOWN`` replies into
#: their exception classes only on connections with its cluster parser (later versions
#: always do, and have no such class): the pinned pool's connections use it when it exists.
_CLUSTER_PARSER: dict[str, Any] = (
    {"parser_class": parser}
    if (parser := getattr(redis.cluster, "ClusterParser", None)) is not None
    else {}
)


class _PinnedPool(redis.ConnectionPool):
    """A connection pool to one node that can be turned to another (:meth:`repoint`);
    connections to the old node are closed and never reused."""

    def address(self) -> tuple[str, int]:
        return str(self.connection_kwargs["host"]), int(self.connection_kwargs["port"])

    def repoint(self, host: str, port: int) -> bool:
        """Point new connections at ``host:port``; return whether it changed."""
        with self._lock:
            if (host, port) == self.address():
                return False
            self.connection_kwargs["host"] = host
            self.connection_kwargs["port"] = port
        self.disconnect()
        self.reset()
        return True


class ClusterClient(redis.Redis):
    """A Redis Cluster client with the plain :class:`redis.Redis` API, pinned to one node.

    It talks to one node at a time through an ordinary connection pool, so pipelines
    (``transaction`` or not), ``EVALSHA``/``SCRIPT LOAD``, ``TIME`` and ``WAIT`` work as
    on one server. Made by :func:`client_from_config` (pointed at a primary that
    answers: for commands without keys and for :func:`primaries`) and by
    :meth:`for_slot` (:func:`crawl_client`: pointed at the primary owning the crawl's
    slot, found from the cluster's slot map when first used).

    Redirections and failovers:

    - a command answered ``MOVED`` was not run: the client turns to the node named and
      runs it there once more; a second redirection raises :class:`SlotMoved`;
    - a pipeline with a ``MOVED``/``ASK`` reply turns to the new node and raises
      :class:`SlotMoved` (some of its commands may have run before the slot moved, the
      same uncertainty as a connection lost mid-pipeline, which callers already handle);
    - ``ASK`` (the slot is migrating) raises :class:`SlotMoved`: retry later, the
      migration ends with ``MOVED``;
    - a connection error, a timeout, ``CLUSTERDOWN`` or ``TRYAGAIN`` propagates as it is
      (an outage), and the next command first asks the cluster again who owns the slot
      (at most every :data:`RESOLVE_INTERVAL` seconds), which follows a failover.
    """

    def __init__(
        self,
        connection: ConnectionConfig,
        *,
        slot: int | None = None,
        shared: _ClusterState | None = None,
    ) -> None:
        self._config = connection
        self._shared = shared or _ClusterState(connection)
        self.slot = slot
        host, port = connection.nodes[0]
        kwargs = dict(connection.params)
        kwargs.pop("redis_cls", None)
        if kwargs.pop("ssl", False) or connection.ssl:
            kwargs["connection_class"] = redis.SSLConnection
        self._resolve_lock = threading.Lock()
        self._stale = True  # find the slot's owner (or a live primary) at the first command
        self._resolved_at = 0.0
        super().__init__(
            connection_pool=_PinnedPool(host=host, port=port, **{**_CLUSTER_PARSER, **kwargs})
        )

    # -- topology -------------------------------------------------------------------

    @property
    def redis_cluster(self) -> RedisCluster:
        """The redis-py cluster client (made, and the cluster discovered, on first use).

        Raises:
            RedisUnavailable: no startup node answers.
        """
        return self._shared.cluster()

    def for_slot(self, slot: int) -> ClusterClient:
        """A client sharing this one's cluster view, pinned to the owner of ``slot``."""
        return ClusterClient(self._config, slot=slot, shared=self._shared)

    def primaries(self) -> list[redis.Redis]:
        """One client per primary of the cluster (refreshed slot map)."""
        cluster = self.redis_cluster
        try:
            cluster.nodes_manager.initialize()
        except (redis.RedisError, RedisClusterException) as e:
            raise RedisUnavailable(f"cannot reach Redis at {self.describe()} ({e})") from e
        return [
            cast("redis.Redis", node.redis_connection)
            for node in cluster.get_primaries()  # type: ignore[no-untyped-call]
            if node.redis_connection is not None
        ]

    def node(self) -> str:
        """``host:port`` of the node this client points at now."""
        return _hostport(*self.connection_pool.address())

    def describe(self) -> str:
        """The startup nodes, password masked, and the slot and its node (no I/O)."""
        ssl = issubclass(self.connection_pool.connection_class, redis.SSLConnection)
        scheme = "rediss+cluster" if ssl else "redis+cluster"
        nodes = ",".join(_hostport(h, p) for h, p in self._config.nodes)
        text = f"{scheme}://{_auth(self._config.params)}{nodes}"
        if self.slot is not None:
            where = "not resolved yet" if self._resolved_at == 0.0 else f"on {self.node()}"
            text += f" (crawl slot {self.slot} {where})"
        return text

    def resolve(self) -> None:
        """Ask the cluster which primary owns the slot now and turn to it (without a
        slot: to a primary that answers).

        Raises:
            redis.ConnectionError: the cluster cannot say (no node answers, or the slot
                is not covered): an outage.
        """
        with self._resolve_lock:
            try:
                cluster = self._shared.cluster()
                cluster.nodes_manager.initialize()
                if self.slot is None:  # any primary, for commands without keys
                    owner = cluster.get_primaries()[0]  # type: ignore[no-untyped-call]
                else:
                    owner = cluster.nodes_manager.get_node_from_slot(self.slot)
            except RedisUnavailable as e:
                raise redis.ConnectionError(str(e)) from e
            except (redis.RedisError, RedisClusterException, IndexError) as e:
                raise redis.ConnectionError(
                    f"cannot find the node owning slot {self.slot} of the Redis Cluster at "
                    f"{self.describe()}: {e}"
                ) from e
            self._turn(owner.host, int(owner.port))
            self._stale = False
            self._resolved_at = time.monotonic()

    def _turn(self, host: str, port: int) -> None:
        before = self.node()
        if self.connection_pool.repoint(host, port):
            logger.info(
                "Redis Cluster: slot %(slot)s is served by %(new)s now (was %(old)s)",
                {"slot": self.slot, "new": self.node(), "old": before},
            )

    def _before(self) -> None:
        if self._stale and (
            self._resolved_at == 0.0 or time.monotonic() - self._resolved_at >= RESOLVE_INTERVAL
        ):
            self.resolve()

    def _redirected(self, error: AskError) -> redis.RedisError:
        """Turn to a ``MOVED`` reply's node (an ``ASK``: only note it); the error to raise.

        A pinned client never turns for a key of another slot: that is a misuse (a key
        without the crawl's hash tag), reported as a :class:`redis.ResponseError`.
        """
        if self.slot is not None and error.slot_id != self.slot:
            return redis.ResponseError(
                f"a key of hash slot {error.slot_id} was sent to the client of crawl slot "
                f"{self.slot} ({self.describe()}): every key of a crawl must carry its "
                f"hash tag ({error})"
            )
        if isinstance(error, MovedError):
            self._turn(error.host, int(error.port))
            self._resolved_at = time.monotonic()
            what = f"slot {error.slot_id} moved to {_hostport(error.host, error.port)}"
        else:
            what = f"slot {error.slot_id} is migrating to {_hostport(error.host, error.port)}"
        return SlotMoved(f"Redis Cluster at {self.describe()}: {what}; retry")

    # -- redis.Redis ------------------------------------------------------------------

    connection_pool: _PinnedPool

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self._before()
        for attempt in (1, 2):
            try:
                return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
            except AskError as e:  # MovedError too: the node did not run the command
                moved = self._redirected(e)
                if attempt == 2 or not isinstance(moved, SlotMoved):
                    raise moved from e
                if not isinstance(e, MovedError):
                    raise moved from e
            except _RERESOLVE:
                self._stale = True
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        return _ClusterPipeline(
            self, self.connection_pool, self.response_callbacks, transaction, shard_hint
        )

    def __repr__(self) -> str:
        return f"<ClusterClient {self.describe()}>"


class _ClusterPipeline(Pipeline):
    """A pipeline of a :class:`ClusterClient`: see there for redirections."""

    def __init__(self, owner: ClusterClient, *args: Any) -> None:
        super().__init__(*args)
        self._owner = owner

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self._owner._before()
        try:
            replies = super().execute(raise_on_error)
        except AskError as e:
            raise self._owner._redirected(e) from e
        except _RERESOLVE:
            self._owner._stale = True
            raise
        for reply in replies:
            if isinstance(reply, AskError):
                raise self._owner._redirected(reply) from reply
            if isinstance(reply, (ClusterDownError, TryAgainError)):
                self._owner._stale = True
        return replies


class _ClusterState:
    """The redis-py :class:`RedisCluster` shared by a cluster client and its crawl
    clients, made on first use."""

    def __init__(self, connection: ConnectionConfig) -> None:
        self.connection = connection
        self._cluster: RedisCluster | None = None
        self._lock = threading.Lock()

    def cluster(self) -> RedisCluster:
        with self._lock:
            if self._cluster is None:
                config = self.connection
                cls = config.redis_cls or RedisCluster
                params = {**config.params, **config.cluster_params}
                if config.ssl:
                    params["ssl"] = True
                nodes = [ClusterNode(h, p) for h, p in config.nodes]  # type: ignore[no-untyped-call]
                try:
                    self._cluster = cls(startup_nodes=nodes, **params)
                except (redis.RedisError, RedisClusterException) as e:
                    where = ",".join(_hostport(h, p) for h, p in config.nodes)
                    raise RedisUnavailable(
                        f"cannot reach the Redis Cluster at {where} ({e}): check "
                        "REDIS_STARTUP_NODES (or REDIS_URL) and that the nodes are running"
                    ) from e
            return self._cluster
