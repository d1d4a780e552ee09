"""redis-py's client options as the settings give them, checked before any connection.

``REDIS_PARAMS``, ``REDIS_CLUSTER_PARAMS`` and ``REDIS_SENTINEL_PARAMS`` (and the Sentinels'
``sentinel_kwargs``) go to redis-py, which refuses a value of the wrong kind only when it
connects; :func:`check_params` reports it at once, naming the setting and the key.
:func:`address_setting` reads ``REDIS_PORT`` and ``REDIS_DB``; :data:`DEFAULT_PARAMS` are
the options every client starts from.
"""

from __future__ import annotations

import codecs
import math
import os
from typing import TYPE_CHECKING, Any

from scrapy_dist.config.reading import load_setting
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping

    from scrapy.settings import BaseSettings

#: Client options applied unless ``REDIS_PARAMS`` overrides them.
DEFAULT_PARAMS: dict[str, Any] = {
    "socket_connect_timeout": 5,
    "socket_timeout": 10,
    "health_check_interval": 30,
}


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


#: The whole-number settings of a server's address, each with its check.
_ADDRESS_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "REDIS_PORT": _port_problem,
    "REDIS_DB": _db_problem,
}


def address_setting(settings: BaseSettings, setting: str) -> int:
    """``REDIS_PORT`` or ``REDIS_DB``, a whole number.

    Raises:
        ConfigurationError: it is none, or out of range.
    """
    value = settings.get(setting)
    number = _whole(value)
    why = _ADDRESS_CHECKS[setting](value) if number is not None else "is not a whole number"
    if why or number is None:
        raise ConfigurationError(f"{setting} = {value!r} {why}")
    return number
