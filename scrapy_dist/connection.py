"""The one Redis client factory.

Only this module creates clients, from the connection settings
(:class:`~scrapy_dist.settings.ConnectionConfig`). A crawler gets one client, shared by
the scheduler, the dupefilter, the spider and every other component
(:func:`scrapy_dist.assembly.assemble`). Building a
client does no I/O; :func:`check` is the explicit connectivity test that turns an
unreachable server into :class:`~scrapy_dist.exceptions.RedisUnavailable` naming the
server with its password masked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from scrapy_dist.exceptions import ConfigurationError, RedisUnavailable
from scrapy_dist.settings import (
    DEFAULT_PARAMS,
    URL_SCHEMES,
    ConnectionConfig,
    connection_config,
    mask_url,
)

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_PARAMS",
    "SETTINGS_PARAMS_MAP",
    "URL_SCHEMES",
    "check",
    "client_from_config",
    "client_from_settings",
    "describe",
    "from_settings",
    "get_redis",
    "get_redis_from_settings",
    "mask_url",
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
    """Build a client from the connection settings, without connecting.

    Raises:
        ConfigurationError: arguments redis-py refuses.
    """
    redis_cls: type[redis.Redis] = connection.redis_cls or redis.Redis
    try:
        if connection.url:
            return redis_cls.from_url(connection.url, **connection.params)
        return redis_cls(**connection.params)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"invalid Redis connection settings: {e}") from e


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
    ``REDIS_PARAMS["redis_cls"]`` may be a class or its import path. Components of a
    crawl share the crawler's client instead (:func:`scrapy_dist.assembly.assemble`).

    Raises:
        ConfigurationError: contradictory or invalid connection settings.
    """
    connection = connection_config(settings)
    params = dict(connection.params)
    if connection.redis_cls is not None:
        params["redis_cls"] = connection.redis_cls
    if connection.url:
        params["url"] = connection.url
    return get_redis(**params)


#: scrapy-redis's older name of :func:`get_redis_from_settings`.
from_settings = get_redis_from_settings


def describe(client: redis.Redis) -> str:
    """Say which server ``client`` talks to, as a URL with any password masked."""
    kwargs = client.connection_pool.connection_kwargs
    auth = ""
    if kwargs.get("password"):
        auth = f"{kwargs.get('username') or ''}:***@"
    elif kwargs.get("username"):
        auth = f"{kwargs['username']}@"
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{auth}{kwargs['path']}?db={db}"
    ssl = issubclass(client.connection_pool.connection_class, redis.SSLConnection)
    scheme = "rediss" if ssl else "redis"
    return f"{scheme}://{auth}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def check(client: redis.Redis) -> None:
    """Ping the server once.

    Raises:
        RedisUnavailable: the server cannot be reached or refused the connection; the
            message names the server (password masked), the cause and the settings
            to change.
    """
    try:
        client.ping()
    except redis.AuthenticationError as e:
        raise RedisUnavailable(
            f"Redis at {describe(client)} refused the credentials ({e}): check the user "
            "name and password in REDIS_URL (or REDIS_PARAMS)"
        ) from e
    except redis.RedisError as e:
        raise RedisUnavailable(
            f"cannot reach Redis at {describe(client)} ({e}): check REDIS_URL (or "
            "REDIS_HOST, REDIS_PORT, REDIS_PARAMS) and that the server is running"
        ) from e
