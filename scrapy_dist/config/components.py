"""The component classes Scrapy builds, and the sections of the components beside the
scheduler, each with its checks.

``ComponentsConfig`` (``SCHEDULER``, ``DUPEFILTER_CLASS``), ``SeedsConfig`` and
``SpiderConfig`` (a Redis spider's seeds and idle handling), ``DupefilterConfig``
(backend, Bloom size, recrawl window), ``ItemsConfig``, ``StatsConfig`` and
``MetricsConfig``. Each ``_<section>(settings)`` parses one section of
:class:`scrapy_dist.config.core.Config`; each ``check_*`` raises
:class:`~scrapy_dist.exceptions.ConfigurationError` naming the setting, for the config and
for a component built directly with the same values.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

from scrapy_dist.config.reading import load_setting
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

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


def components_config(s: BaseSettings) -> ComponentsConfig:
    scheduler = s.get("SCHEDULER")
    return ComponentsConfig(
        scheduler=scheduler,
        dupefilter=s.get("DUPEFILTER_CLASS"),
        dist_scheduler=is_dist_scheduler(scheduler),
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


def seeds_config(s: BaseSettings) -> SeedsConfig:
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


def spider_config(s: BaseSettings) -> SpiderConfig:
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


def dupefilter_config(s: BaseSettings) -> DupefilterConfig:
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


def items_config(s: BaseSettings) -> ItemsConfig:
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


def stats_config(s: BaseSettings) -> StatsConfig:
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


def metrics_config(s: BaseSettings) -> MetricsConfig:
    enabled = s.getbool("METRICS_ENABLED")
    if not enabled:
        return MetricsConfig(False, str(s.get("METRICS_HOST")), 0, 0.0)
    port = s.getint("METRICS_PORT")
    interval = s.getfloat("METRICS_INTERVAL")
    check_metrics(port, interval)
    return MetricsConfig(True, str(s.get("METRICS_HOST")), port, interval)
