"""The one Redis client factory.

Only this module creates clients. A crawler gets one client, shared by the scheduler,
the dupefilter, the spider and every other component (:func:`client_for`). Building a
client does no I/O; :func:`check` is the explicit connectivity test that turns an
unreachable server into :class:`~scrapy_dist.exceptions.RedisUnavailable` naming the
server with its password masked.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit
from weakref import WeakKeyDictionary

import redis
from scrapy.utils.misc import load_object

from scrapy_dist.addon import settings_for
from scrapy_dist.exceptions import ConfigurationError, RedisUnavailable

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

#: scrapy-redis's map of connection settings to client arguments (for code that reads it).
SETTINGS_PARAMS_MAP = {
    "REDIS_URL": "url",
    "REDIS_HOST": "host",
    "REDIS_PORT": "port",
    "REDIS_DB": "db",
    "REDIS_ENCODING": "encoding",
    "REDIS_DECODE_RESPONSES": "decode_responses",
}

#: Client options applied unless ``REDIS_PARAMS`` overrides them.
DEFAULT_PARAMS: dict[str, Any] = {
    "socket_connect_timeout": 5,
    "socket_timeout": 10,
    "health_check_interval": 30,
}

#: URL schemes redis-py understands.
URL_SCHEMES = ("redis", "rediss", "unix")

_clients: WeakKeyDictionary[Crawler, redis.Redis] = WeakKeyDictionary()


def _params(settings: BaseSettings) -> tuple[str | None, dict[str, Any]]:
    """Merge ``REDIS_URL``/``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``/``REDIS_PARAMS``.

    Returns:
        ``(url, kwargs)``: the URL to connect to (``None`` for host/port) and the
        keyword arguments for the client.

    Raises:
        ConfigurationError: settings that name the server twice, differently.
    """
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
        params[name] = int(value) if name in ("port", "db") else value
    if params.get("decode_responses"):
        raise ConfigurationError(
            "REDIS_PARAMS['decode_responses'] must be false: scrapy_dist stores raw bytes"
        )
    return url, params


def client_from_settings(settings: BaseSettings) -> redis.Redis:
    """Build a client from (already defaulted) settings, without connecting.

    Raises:
        ConfigurationError: contradictory or invalid connection settings.
    """
    url, params = _params(settings)
    redis_cls: type[redis.Redis] = redis.Redis
    if "redis_cls" in params:
        cls = params.pop("redis_cls")
        redis_cls = load_object(cls) if isinstance(cls, str) else cls
    try:
        if url:
            return redis_cls.from_url(url, **params)
        return redis_cls(**params)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"invalid Redis connection settings: {e}") from e


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
    crawl should share the crawler's client instead (:func:`client_for`).

    Raises:
        ConfigurationError: contradictory or invalid connection settings.
    """
    url, params = _params(settings)  # (a copy of the settings would copy redis_cls)
    cls = params.get("redis_cls")
    if isinstance(cls, str):
        params["redis_cls"] = load_object(cls)
    if url:
        params["url"] = url
    return get_redis(**params)


#: scrapy-redis's older name of :func:`get_redis_from_settings`.
from_settings = get_redis_from_settings


def client_for(crawler: Crawler) -> redis.Redis:
    """Return the crawler's client, creating it on first use (no I/O)."""
    try:
        return _clients[crawler]
    except KeyError:
        client = _clients[crawler] = client_from_settings(settings_for(crawler))
        return client


def mask_url(url: str) -> str:
    """Return ``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


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
