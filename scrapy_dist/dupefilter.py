"""Request fingerprint dupefilter over Redis, shared by every worker of a crawl.

:class:`RFPDupeFilter` hashes requests with the crawler's ``request_fingerprinter`` (so
``REQUEST_FINGERPRINTER_CLASS`` applies) and keeps them in a backend of
:mod:`scrapy_dist.filters`, chosen by ``DUPEFILTER_BACKEND``: the exact set, a bitmap
Bloom filter, RedisBloom, or (``"bloom"``, ``"auto"``) whichever suits the server.
In front of it sits a per-worker cache (:class:`LocalSet`, or a
:class:`~scrapy_dist.bloom.LocalBloom` for Bloom backends) of fingerprints already
recorded, which saves their round trips.

Under scrapy_dist's scheduler the test-and-set runs inside the enqueue script,
atomically with the push (``lua/enqueue.lua``); used with Scrapy's own scheduler,
:meth:`RFPDupeFilter.request_seen` makes one round trip (``lua/dupefilter.lua``); both
scripts use the filters of ``lua/_filters.lua``. The Bloom backends count their
insertions; the filter reports count, capacity and estimated false-positive rate as
stats, warns when the count passes the capacity, and then grows or refuses
(``BLOOM_ON_FULL``), never degrading silently. The filter never deletes its keys on
close: the scheduler decides, by ``SCHEDULER_PERSIST``, when a crawl's state goes.

With a recrawl window (``DUPEFILTER_RECRAWL_AFTER``, :mod:`scrapy_dist.filters.window`)
a fingerprint counts as seen only for that long, by the server's clock; the local
cache then only holds fingerprints this worker found new, and forgets them before
Redis does (never "seen" past the window).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, cast

import redis
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.request import RequestFingerprinter, referer_str

from scrapy_dist.assembly import assemble
from scrapy_dist.bloom import BloomParams, LocalBloom
from scrapy_dist.config.core import Config
from scrapy_dist.connection import get_redis_from_settings
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.filters import (
    BackendChoice,
    DupefilterBackend,
    DupefilterFull,
    SetBackend,
    UnopenedBackend,
    backend_from_config,
    bloom_params_from_config,
)
from scrapy_dist.keys import standalone_dupefilter_key

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol
    from typing_extensions import Self

    from scrapy_dist.filters import FilterState

#: :class:`DupefilterFull` is raised by :meth:`RFPDupeFilter.request_seen`: importable
#: from here, where users meet it.
__all__ = ["DupefilterFull", "LocalSet", "RFPDupeFilter"]

logger = logging.getLogger(__name__)


#: Seconds between refreshes of the filter's stats (one round trip each).
STATS_INTERVAL = 10.0

#: The local cache's false-positive rate, as a share of the Bloom error rate: the
#: cache adds at most this fraction to the crawl's error budget.
LOCAL_ERROR_SHARE = 0.01


class LocalSet:
    """An exact per-worker seen-cache: the raw fingerprints themselves (about 100 bytes
    each), emptied when it holds ``capacity``. Used with the exact set backend, where a
    Bloom cache would add false positives the set does not have."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._seen: set[bytes] = set()

    def __contains__(self, fingerprint: bytes) -> bool:
        return fingerprint in self._seen

    def add(self, fingerprint: bytes) -> None:
        """Remember ``fingerprint``."""
        self._seen.add(fingerprint)

    @property
    def count(self) -> int:
        """Fingerprints held."""
        return len(self._seen)

    def clear(self) -> None:
        """Forget everything."""
        self._seen.clear()


class RFPDupeFilter(BaseDupeFilter):
    """Scrapy dupefilter whose fingerprints live in Redis, shared by every worker.

    Args:
        backend: where fingerprints are stored, or (``"bloom"``, ``"auto"``) a
            :class:`~scrapy_dist.filters.BackendChoice` that picks the backend at
            :meth:`open`.
        fingerprinter: the crawler's request fingerprinter.
        debug: log every filtered request, not only the first (``DUPEFILTER_DEBUG``).
        stats: the crawler's stats collector.
        local: an in-memory cache of fingerprints this worker already knows are
            recorded in Redis, to skip their serialization and round trip; ``None`` to
            always ask Redis. A :class:`LocalSet` (exact) for the set backend; a
            :class:`~scrapy_dist.bloom.LocalBloom` for Bloom backends, whose false
            positives are requests never crawled, so it is sized well below the
            crawl's error budget. It is cleared when it reaches its capacity, and
            whenever the filter in Redis may have expired.
        local_exact_off: replace a Bloom ``local`` by an exact one at :meth:`open` if
            the backend turns out to be the exact set (``"auto"`` without RedisBloom).
        ttl: ``DUPEFILTER_TTL``, which the local cache must follow.
        stats_interval: seconds between refreshes of the filter's stats.
    """

    #: The logger :meth:`log` writes to (scrapy-redis's attribute).
    logger = logger

    def __init__(
        self,
        backend: DupefilterBackend | BackendChoice | redis.Redis,
        fingerprinter: RequestFingerprinterProtocol | str | None = None,
        debug: bool = False,
        *,
        key: str | None = None,
        stats: StatsCollector | None = None,
        local: LocalBloom | LocalSet | None = None,
        local_exact_off: bool = False,
        ttl: float | None = None,
        stats_interval: float = STATS_INTERVAL,
        clear_on_close: bool = False,
    ) -> None:
        if isinstance(fingerprinter, str) or key is not None:
            # scrapy-redis's RFPDupeFilter(server, key, debug): a set at ``key``, which
            # close() deletes, as there
            key = key if key is not None else cast("str", fingerprinter)
            backend = SetBackend(cast("redis.Redis", backend), key)
            fingerprinter = None
            clear_on_close = True
        configured = cast("DupefilterBackend | BackendChoice", backend)
        if fingerprinter is None or isinstance(fingerprinter, str):
            fingerprinter = RequestFingerprinter()
        #: What the settings named, before :meth:`open` (for :meth:`keys`).
        self._configured: UnopenedBackend = configured
        self._backend = None if isinstance(configured, BackendChoice) else configured
        #: The Redis client and the fingerprints key (scrapy-redis's attributes).
        self.server: redis.Redis | None = getattr(configured, "client", None)
        self.key: str | None = getattr(configured, "key", None)
        self.clear_on_close = clear_on_close
        self.local = local
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.stats = stats
        self.logdupes = True
        self.ttl = ttl
        self.stats_interval = stats_interval
        self._local_exact_off = local_exact_off
        #: Last state read from Redis (``None`` before :meth:`open`).
        self.last_state: FilterState | None = None
        self._opened = False
        self._next_refresh = math.inf
        self._local_until = math.inf
        self._stages_reported = 1
        self._reported_over = False
        self._reported_full = False
        self._reported_rate = False
        #: With a recrawl window: seconds a record surely counts as seen (from the
        #: backend, at :meth:`open`), when the local cache was last emptied, and the
        #: fingerprints asked about since (-> when), which it may learn.
        self.seen_for: float | None = None
        self._cache_since = -math.inf
        self._asked: dict[bytes, float] = {}

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """A standalone filter (scrapy-redis's factory): a new client and a key of its
        own, ``dupefilter:<timestamp>:<random>`` (:func:`.keys.standalone_dupefilter_key`),
        deleted at :meth:`close`."""
        server = get_redis_from_settings(settings)
        key = standalone_dupefilter_key(int(time.time()))
        return cls(server, key=key, debug=Config.from_settings(settings).dupefilter.debug)

    @classmethod
    def from_spider(cls, spider: Spider) -> Self:
        """A filter over the spider's ``SCHEDULER_DUPEFILTER_KEY`` set (scrapy-redis's
        factory); like any filter built from a server and a key, :meth:`close` deletes it."""
        config = Config.from_settings(spider.settings)
        key = config.keys.dupefilter % {"spider": spider.name}
        return cls(get_redis_from_settings(config.settings), key=key, debug=config.dupefilter.debug)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Under scrapy_dist's scheduler: the crawl's shared filter, never deleted by a
        worker. Under another scheduler (Scrapy's own), with
        ``DUPEFILTER_STANDALONE_PER_RUN`` (the default): :meth:`from_settings`'s per-run
        filter, as in scrapy-redis; without it, the crawl's shared filter."""
        parts = assemble(crawler)
        config = parts.config.dupefilter
        if config.recrawl_after is not None and not parts.config.scheduler.persist:
            logger.warning(
                "DUPEFILTER_RECRAWL_AFTER is set but SCHEDULER_PERSIST is not: a finished "
                "crawl deletes its dupefilter, so the next run crawls every page again "
                "whatever the window. Set SCHEDULER_PERSIST = True for periodic crawls"
            )
        if config.standalone_per_run and not parts.config.components.dist_scheduler:
            return cls.from_settings(parts.config.settings)
        backend = backend_from_config(config, parts.client, parts.keys)
        mode = config.backend
        wanted = config.local_cache
        size = config.local_cache_size
        local: LocalBloom | LocalSet | None = None
        enabled = wanted is None or wanted
        if enabled and size > 0 and (mode in ("set", "buckets") or config.bloom is None):
            local = LocalSet(size)
        elif enabled and size > 0 and config.bloom is not None:
            rate = bloom_params_from_config(config.bloom).error_rate * LOCAL_ERROR_SHARE
            try:
                local = LocalBloom(BloomParams.from_capacity(size, rate))
            except ValueError as e:
                raise ConfigurationError(f"invalid DUPEFILTER_LOCAL_CACHE_SIZE: {e}") from e
        return cls(
            backend,
            crawler.request_fingerprinter,
            debug=config.debug,
            stats=crawler.stats,
            local=local,
            local_exact_off=wanted is None,
            ttl=config.ttl,
        )

    @property
    def backend(self) -> DupefilterBackend:
        """The backend that holds the fingerprints.

        Raises:
            RuntimeError: the backend is still to be chosen (``"bloom"``, ``"auto"``):
                call :meth:`open` first.
        """
        if self._backend is None:
            raise RuntimeError(
                "the dupefilter backend is chosen when it opens: call RFPDupeFilter.open() first"
            )
        return self._backend

    def keys(self) -> list[str]:
        """Every key the filter may own, before :meth:`open` as after (for a backend
        still to be chosen, every candidate's). No I/O."""
        return self._configured.keys()

    def expiring_keys(self) -> list[str]:
        """The filter's keys when they expire (``DUPEFILTER_TTL``, or a recrawl window,
        whose zset and generations expire), else none: what a ``volatile-*`` eviction
        policy may delete (checked at start). No I/O."""
        windowed = getattr(self._configured, "window", None) is not None or any(
            getattr(getattr(self._configured, name, None), "window", None) is not None
            for name in ("bitmap", "redisbloom")
        )
        return self.keys() if self.ttl or windowed else []

    def _current(self) -> UnopenedBackend:
        """The backend if known, else the choice (never tested for truth: a backend's
        ``__len__`` is a round trip)."""
        return self._backend if self._backend is not None else self._configured

    def open(self) -> None:
        """Open the backend (choosing it, for ``"bloom"``/``"auto"``) and read its state.

        Raises:
            ConfigurationError: the dupefilter key holds another backend's data, or a
                Bloom filter with other parameters, or RedisBloom is missing.
        """
        self._backend = self._current().open()
        exact = self.backend.kind in ("set", "zset")
        if self._local_exact_off and exact and self.local is not None:
            self.local = LocalSet(self._local_capacity())  # "auto" chose the exact set
        self.seen_for = getattr(self.backend, "seen_for", None)
        self._opened = True
        self._refresh(time.monotonic())

    def close(self, reason: str = "") -> None:
        """Report the filter's final state (stats). Deletes the fingerprints only for a
        filter built scrapy-redis's way (from a server and a key, or by
        :meth:`from_settings`): the crawl's shared filter is never deleted here."""
        if self.clear_on_close:
            self.clear()
        if not self._opened:
            return
        collect = getattr(self._backend, "collect", None)
        if collect is not None:
            # the buckets of a generation the crawl left (finished, flushed, expired)
            try:
                collect()
            except redis.RedisError as e:
                logger.warning("Could not delete old dupefilter buckets: %(error)s", {"error": e})
        try:
            self._refresh(time.monotonic())
        except redis.RedisError as e:
            logger.debug("Could not read the dupefilter's final state: %(error)s", {"error": e})

    def fingerprint(self, request: Request) -> bytes:
        """The raw fingerprint of ``request``: the crawler's fingerprinter, or an
        overridden :meth:`request_fingerprint` (scrapy-redis's hook) encoded as bytes."""
        hook = self.request_fingerprint
        if getattr(hook, "__func__", None) is RFPDupeFilter.request_fingerprint:
            return self.fingerprinter.fingerprint(request)
        value = hook(request)
        return value.encode() if isinstance(value, str) else bytes(value)

    def request_fingerprint(self, request: Request) -> str:
        """The fingerprint of ``request`` as hex text (scrapy-redis's hook: override it,
        in a subclass or on the instance, to change how requests are told apart)."""
        return self.fingerprinter.fingerprint(request).hex()

    def seen_locally(self, fingerprint: bytes) -> bool:
        """Whether this worker already knows ``fingerprint`` is recorded in Redis.

        Also refreshes the filter's stats every ``stats_interval`` seconds (one round
        trip; a failure is logged and retried next time). With ``DUPEFILTER_TTL`` the
        local cache is only trusted until the filter in Redis may have expired.
        """
        now = time.monotonic()
        if now >= self._next_refresh:
            self._tick(now)
        local = self.local
        if local is not None and self.seen_for is not None:
            self._window_tick(now)
        if local is not None and now < self._local_until and fingerprint in local:
            if self.stats is not None:
                self.stats.inc_value("dupefilter/local/hits")
            return True
        if local is not None and self.seen_for is not None:
            if len(self._asked) >= self._local_capacity():
                self._asked.clear()
            self._asked[fingerprint] = now
        return False

    def _window_tick(self, now: float) -> None:
        """With a recrawl window: empty the local cache every ``seen_for`` seconds. It
        only learns fingerprints asked about since it was emptied and found new, each
        recorded in Redis after it was asked about, so still seen there until the next
        emptying at least."""
        if now >= self._cache_since + cast("float", self.seen_for):
            if self.local is not None:
                self.local.clear()
            self._asked.clear()
            self._cache_since = now

    def remember(self, fingerprint: bytes, new: bool | None = None) -> None:
        """Note that ``fingerprint`` is now recorded in Redis (it was queued or filtered).

        Args:
            fingerprint: the raw fingerprint.
            new: whether Redis found it new (recorded it now), if known. With a recrawl
                window only those are cached (a duplicate's record may be about to
                leave the window), and only if asked about since the cache was emptied.
        """
        local = self.local
        if local is None or time.monotonic() >= self._local_until:
            return
        if self.seen_for is not None:
            asked = self._asked.pop(fingerprint, None)
            if new is not True or asked is None or asked < self._cache_since:
                return
        if local.count >= self._local_capacity():
            local.clear()
        local.add(fingerprint)

    def forget_local(self) -> None:
        """Empty the local cache. The scheduler calls this before the cache is next used
        once the worker held no request, unless a reserve under the same crawl epoch
        brought it leases first (:class:`~scrapy_dist.worker.deliveries.Deliveries`): a finished
        crawl deletes its dupefilter only when no worker holds anything, so no worker can
        then trust fingerprints it cached before."""
        if self.local is not None and self.local.count:
            self.local.clear()
        self._asked.clear()

    def _local_capacity(self) -> int:
        local = self.local
        if isinstance(local, LocalSet):
            return local.capacity
        return local.params.capacity if local is not None else 0

    def request_seen(self, request: Request) -> bool:
        """Record the request's fingerprint; return ``True`` if it was already there.

        Raises:
            DupefilterFull: a full Bloom filter refused it (``BLOOM_ON_FULL = "refuse"``).
        """
        fingerprint = self.fingerprint(request)
        if self.seen_locally(fingerprint):
            return True
        new = self.backend.add(fingerprint)
        self.remember(fingerprint, new)
        return not new

    def clear(self) -> None:
        """Forget every fingerprint of this crawl (every candidate's keys, if the
        backend is still to be chosen)."""
        self._current().clear()
        if self.local is not None:
            self.local.clear()

    def log(self, request: Request, spider: Spider) -> None:
        """Log a filtered request (the first only, unless ``DUPEFILTER_DEBUG``) and count it."""
        if self.debug:
            self.logger.debug(
                "Filtered duplicate request: %(request)s (referer: %(referer)s)",
                {"request": request, "referer": referer_str(request)},
                extra={"spider": spider},
            )
        elif self.logdupes:
            self.logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be "
                "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": spider},
            )
            self.logdupes = False
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")

    # -- the filter's state ------------------------------------------------------

    def _tick(self, now: float) -> None:
        try:
            self._refresh(now)
        except redis.RedisError as e:
            self._next_refresh = now + self.stats_interval
            logger.warning("Could not refresh the dupefilter's state: %(error)s", {"error": e})

    def _refresh(self, now: float) -> None:
        """Read the state (one round trip), publish it as stats, warn, and renew the
        local cache's validity under ``DUPEFILTER_TTL``."""
        self._next_refresh = now + self.stats_interval
        state = self.backend.state()
        self.last_state = state
        if self.stats is not None:
            for name, value in state.stats().items():
                self.stats.set_value(name, value)
        self._report(state)
        if self.local is not None and self.ttl is not None:
            if now >= self._local_until or self._local_until == math.inf:
                # What the cache learns from now on is recorded in the filter alive
                # now, which expires in expires_in (or later: the state was read after
                # `now`), or in one created later, which lives the whole TTL.
                self.local.clear()
                left = state.expires_in if state.expires_in is not None else self.ttl
                self._local_until = now + left
            self._next_refresh = min(self._next_refresh, self._local_until)

    def _report(self, state: FilterState) -> None:
        """Log once per event: past the capacity, each growth, full, error rate too high."""
        if state.design_capacity is None:
            return
        args = {
            "key": state.key,
            "count": state.count,
            "design": state.design_capacity,
            "capacity": state.capacity,
            "stages": state.stages,
            "fpr": state.fpr_estimate,
            "rate": state.error_rate,
        }
        if state.count > state.design_capacity and not self._reported_over:
            self._reported_over = True
            then = (
                "it grows into bigger, stricter filters (BLOOM_ON_FULL = 'grow')"
                if state.on_full == "grow"
                else "new fingerprints are refused (BLOOM_ON_FULL = 'refuse')"
            )
            logger.warning(
                "Bloom dupefilter %(key)s holds %(count)d fingerprints, more than its "
                "capacity of %(design)d (BLOOM_CAPACITY): %(then)s. Size the next crawl "
                "for at least this many",
                {**args, "then": then},
            )
        if state.stages > self._stages_reported:
            self._stages_reported = state.stages
            logger.warning(
                "Bloom dupefilter %(key)s grew to %(stages)d filters: capacity %(capacity)d, "
                "%(count)d fingerprints, estimated false-positive rate %(fpr).3g "
                "(configured %(rate).3g)",
                args,
            )
        if state.full and not self._reported_full:
            self._reported_full = True
            logger.error(
                "Bloom dupefilter %(key)s is full (%(count)d fingerprints, %(stages)d "
                "filter(s)) and cannot grow: requests with new fingerprints are refused",
                args,
            )
        if state.fpr_estimate > 2 * state.error_rate and not self._reported_rate:
            self._reported_rate = True
            logger.warning(
                "Bloom dupefilter %(key)s: estimated false-positive rate %(fpr).3g is more "
                "than twice the configured %(rate).3g; about that share of new pages is "
                "skipped as if seen",
                args,
            )
