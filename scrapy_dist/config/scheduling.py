"""The sections the scheduler and its frontier read, each with its checks.

``KeysConfig`` (key templates, the job), ``QueueConfig`` (the queue class and the order
of equal priorities), ``FrontierConfig`` (leases, shards), ``WorkersConfig``,
``ReplicationConfig``, ``SchedulerConfig``, ``PolitenessConfig`` and ``RequestsConfig``.
Each ``_<section>(settings)`` parses one section of
:class:`scrapy_dist.config.core.Config`; each ``check_*`` raises
:class:`~scrapy_dist.exceptions.ConfigurationError` naming the setting, for the config and
for a component built directly with the same values.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_dist.config.reading import load_setting
from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

#: Values of ``REDIS_EVICTION_POLICY_CHECK``.
EVICTION_CHECKS = ("refuse", "warn", "off")

#: Values of ``SCHEDULER_CALLBACK_ERRORS``: the request is done (as on Scrapy's
#: scheduler), returned for another try, or dead-lettered at once.
CALLBACK_ERRORS = ("done", "retry", "dead")


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


def keys_config(s: BaseSettings) -> KeysConfig:
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


def queue_config(s: BaseSettings) -> QueueConfig:
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


def frontier_config(s: BaseSettings) -> FrontierConfig:
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


def workers_config(s: BaseSettings) -> WorkersConfig:
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


def replication_config(s: BaseSettings) -> ReplicationConfig:
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
        prefetch: requests leased per call at least (``SCHEDULER_PREFETCH``, or half of
            ``CONCURRENT_REQUESTS``).
        prefetch_max: requests leased per call at most, as the engine's demand grows
            (``SCHEDULER_PREFETCH_MAX``, or four times ``prefetch``; ``prefetch`` itself
            when that is 1, :mod:`scrapy_dist.worker.batch`).
        max_held: most requests a worker holds (``CONCURRENT_REQUESTS + 2 *
            prefetch_max``).
        callback_errors: what a request whose callback raised becomes
            (``SCHEDULER_CALLBACK_ERRORS``, one of :data:`CALLBACK_ERRORS`).
        start_horizon: ``SCHEDULER_START_HORIZON`` (0: off).
        slot_pause_max, slot_backoff_after, slot_backoff: ``SCHEDULER_SLOT_PAUSE_MAX``
            (0: no pauses), ``SCHEDULER_SLOT_BACKOFF_AFTER``, ``SCHEDULER_SLOT_BACKOFF``.
        slot_counts: ``SCHEDULER_SLOT_COUNTS``, count requests per download slot for the
            crawl (:mod:`scrapy_dist.worker.slot_counts`).
        slot_page_limit: ``SCHEDULER_SLOT_PAGE_LIMIT`` (0: no limit).
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
    prefetch_max: int = 0
    start_horizon: float = 0.0
    slot_pause_max: float = 0.0
    slot_backoff_after: int = 0
    slot_backoff: float = 0.0
    slot_counts: bool = False
    slot_page_limit: int = 0


def check_scheduler(
    *,
    prefetch: int,
    idle_before_close: float,
    worker_timeout: float,
    heartbeat_interval: float,
    lease_timeout: float,
    flush_interval: float,
    callback_errors: object = "done",
    prefetch_max: int = 0,
) -> None:
    """Check the scheduler's values (also given to a scheduler built directly;
    ``prefetch_max`` 0: ``prefetch``).

    Raises:
        ConfigurationError: a value out of range, or timeouts too short for the
            heartbeat.
    """
    if prefetch < 1:
        raise ConfigurationError(f"SCHEDULER_PREFETCH must be at least 1, not {prefetch}")
    if prefetch_max and prefetch_max < prefetch:
        raise ConfigurationError(
            f"SCHEDULER_PREFETCH_MAX ({prefetch_max}) cannot be lower than "
            f"SCHEDULER_PREFETCH ({prefetch}); set them equal for batches of a fixed size"
        )
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


def prefetch_ceiling(prefetch: int, prefetch_max: int) -> int:
    """The most requests one reserve leases (``SCHEDULER_PREFETCH_MAX``; ``0``: four
    times ``prefetch``), given the least (``prefetch``); a ``prefetch`` of 1 never grows.
    Both are checked against each other by :func:`check_scheduler`.

    Raises:
        ConfigurationError: ``prefetch_max`` is negative.
    """
    if prefetch_max < 0:
        raise ConfigurationError(
            f"SCHEDULER_PREFETCH_MAX cannot be negative ({prefetch_max}; 0 means four "
            "times SCHEDULER_PREFETCH)"
        )
    if prefetch <= 1:
        return prefetch
    return prefetch_max or 4 * prefetch


def scheduler_config(
    s: BaseSettings, workers: WorkersConfig, frontier: FrontierConfig
) -> SchedulerConfig:
    concurrency = s.getint("CONCURRENT_REQUESTS")
    prefetch = s.getint("SCHEDULER_PREFETCH") or max(1, concurrency // 2)
    prefetch_max = prefetch_ceiling(prefetch, s.getint("SCHEDULER_PREFETCH_MAX"))
    idle_before_close = s.getfloat("SCHEDULER_IDLE_BEFORE_CLOSE")
    flush_interval = s.getfloat("SCHEDULER_FLUSH_INTERVAL")
    callback_errors = s.get("SCHEDULER_CALLBACK_ERRORS")
    start_horizon = s.getfloat("SCHEDULER_START_HORIZON")
    if not 0 <= start_horizon < float("inf"):  # (NaN too)
        raise ConfigurationError(
            "SCHEDULER_START_HORIZON must be a finite number of seconds, 0 or more (0 turns "
            f"it off), not {start_horizon}"
        )
    slot_pause_max = s.getfloat("SCHEDULER_SLOT_PAUSE_MAX")
    slot_backoff_after = s.getint("SCHEDULER_SLOT_BACKOFF_AFTER")
    slot_backoff = s.getfloat("SCHEDULER_SLOT_BACKOFF")
    for name, value in (
        ("SCHEDULER_SLOT_PAUSE_MAX", slot_pause_max),
        ("SCHEDULER_SLOT_BACKOFF_AFTER", slot_backoff_after),
        ("SCHEDULER_SLOT_BACKOFF", slot_backoff),
    ):
        if not value >= 0 or value == float("inf"):
            raise ConfigurationError(f"{name} must be a finite number of 0 or more, not {value}")
    slot_counts = s.getbool("SCHEDULER_SLOT_COUNTS")
    slot_page_limit = s.getint("SCHEDULER_SLOT_PAGE_LIMIT")
    if slot_page_limit < 0:
        raise ConfigurationError(
            f"SCHEDULER_SLOT_PAGE_LIMIT cannot be negative ({slot_page_limit}; 0: no limit)"
        )
    if slot_page_limit and not slot_counts:
        raise ConfigurationError(
            "SCHEDULER_SLOT_PAGE_LIMIT needs SCHEDULER_SLOT_COUNTS = True (the limit is "
            "judged on the crawl's counts of requests sent per slot)"
        )
    if isinstance(callback_errors, str):  # (as other choices: "Dead" and " dead" too)
        callback_errors = callback_errors.strip().lower()
    check_scheduler(
        prefetch=prefetch,
        prefetch_max=prefetch_max,
        idle_before_close=idle_before_close,
        worker_timeout=workers.worker_timeout,
        heartbeat_interval=workers.heartbeat_interval,
        lease_timeout=frontier.lease_timeout,
        flush_interval=flush_interval,
        callback_errors=callback_errors,
    )
    return SchedulerConfig(
        prefetch=prefetch,
        max_held=concurrency + 2 * prefetch_max,
        prefetch_max=prefetch_max,
        persist=s.getbool("SCHEDULER_PERSIST"),
        flush_on_start=s.getbool("SCHEDULER_FLUSH_ON_START"),
        idle_before_close=idle_before_close,
        flush_interval=flush_interval,
        start_once=s.getbool("SCHEDULER_START_ONCE"),
        close_when_done=s.getbool("CLOSE_WHEN_CRAWL_DONE"),
        fault_exit_code=s.getint("SCHEDULER_FAULT_EXIT_CODE"),
        callback_errors=str(callback_errors),
        start_horizon=start_horizon,
        slot_pause_max=slot_pause_max,
        slot_backoff_after=slot_backoff_after,
        slot_backoff=slot_backoff,
        slot_counts=slot_counts,
        slot_page_limit=slot_page_limit,
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
        per_ip: ``CONCURRENT_REQUESTS_PER_IP`` (above 0: slots by address, this concurrency).
        autothrottle: ``AUTOTHROTTLE_ENABLED``.
        robots: ``ROBOTSTXT_OBEY`` (``Crawl-delay`` then counts).
        robots_ttl: ``ROBOTSTXT_SHARED_TTL``: seconds a robots.txt one worker fetched
            serves the others (0: each fetches its own).
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
    robots_ttl: float = 0.0


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


def politeness_config(s: BaseSettings) -> PolitenessConfig:
    robots_ttl = s.getfloat("ROBOTSTXT_SHARED_TTL")
    if not 0 <= robots_ttl < float("inf"):
        raise ConfigurationError(
            f"ROBOTSTXT_SHARED_TTL must be a finite number of seconds, 0 or more, not {robots_ttl}"
        )
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
        robots_ttl=robots_ttl,
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


def requests_config(s: BaseSettings) -> RequestsConfig:
    return RequestsConfig(
        serializer=s.get("SCHEDULER_SERIALIZER"),
        classes=tuple(s.getlist("SCHEDULER_REQUEST_CLASSES")),
        schemes=tuple(s.getlist("SCHEDULER_URL_SCHEMES", ["http", "https"])),
    )
