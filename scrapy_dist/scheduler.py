"""The Redis scheduler: Scrapy's scheduler interface over a shared frontier.

Every worker of a crawl enqueues into and takes from the same Redis queue. Dedupe and
enqueue are one atomic server-side step (``lua/enqueue.lua``), so a fingerprint is never
recorded for a request that is not queued. Taking a request leases it
(:mod:`scrapy_dist.frontier`); the lease is settled once Scrapy is done with the request,
i.e. once it has left the engine: its callback output fully processed and every request
it produced enqueued, or it failed for good. A request whose callback raised is returned
for another try with the error as its reason, up to ``SCHEDULER_MAX_DELIVERIES``.

Faults: the scheduler's timer and every call it makes survive any Redis error (logged
and counted). A worker holds at most ``CONCURRENT_REQUESTS + 2 * SCHEDULER_PREFETCH``
leases (buffered, in the engine, or settled but not yet sent), which bounds what a dead
or paused worker makes others crawl again. When its leases were taken back (the worker
was paused past ``SCHEDULER_LEASE_TIMEOUT``) it drops the buffered ones; when its crawl
is gone (:attr:`Frontier.lost`) it drops everything it holds and rejoins (the crawl
finished) or stops with the reason ``frontier_lost``.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any, cast

import redis
from scrapy import signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import CloseSpider
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_dist import _engine, deadletter
from scrapy_dist.assembly import assemble
from scrapy_dist.connection import check, describe
from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.exceptions import ConfigurationError, ScrapyDistError, SerializationError
from scrapy_dist.frontier import DEAD_NOW, DONE, FINISHED, HAND_BACK, Frontier, Lease
from scrapy_dist.queue import Base, unleased_queue
from scrapy_dist.seeds import similar_seed_keys
from scrapy_dist.serializers import RequestCodec, RequestPolicy, Serializer, load_serializer
from scrapy_dist.settings import check_scheduler
from scrapy_dist.spiders import RedisSpiderMixin
from scrapy_dist.startup import fail_start, start_failure
from scrapy_dist.workers import WorkerRegistry, crawl_started

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.task import LoopingCall
    from twisted.python.failure import Failure
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: Longest failure reason kept with a request (dead-letter records stay readable).
REASON_MAX = 500
#: Seconds for which a reserve that found the queue empty answers "nothing pending".
EMPTY_FRESH = 0.25
#: Flushes tried at close (requests, then the acknowledgements they confirm, retries).
CLOSE_FLUSHES = 5
#: Close reason of a worker whose crawl's frontier vanished (see :attr:`Frontier.lost`).
FRONTIER_LOST = "frontier_lost"


def close_spider(crawler: Crawler, reason: str) -> None:
    """Ask the crawler's engine to close its spider with ``reason``."""
    engine = crawler.engine
    closer = getattr(engine, "close_spider_async", None)  # Scrapy >= 2.14
    if closer is not None:
        deferred_from_coro(closer(reason=reason))
    else:
        assert crawler.spider is not None
        engine.close_spider(crawler.spider, reason)


def exit_with(status: int) -> None:
    """Make this process exit with ``status`` once it ends (``scrapy crawl`` exits 0
    whatever the close reason): logging is flushed first."""

    def _exit() -> None:
        logging.shutdown()
        os._exit(status)

    atexit.register(_exit)


def engine_in_flight(crawler: Crawler) -> Collection[Request]:
    """The requests the crawler's engine is still working on (see
    :func:`scrapy_dist._engine.in_flight`, the one place that reads the engine)."""
    return _engine.in_flight(crawler)


def check_engine(crawler: Crawler) -> None:
    """Refuse to run on a Scrapy whose engine lacks what :mod:`scrapy_dist._engine` reads.

    Raises:
        ConfigurationError: the engine is open and lacks it (the message names the version).
    """
    engine = _engine.engine_of(crawler)
    if engine is not None:
        _engine.check(engine)


class Scheduler(BaseScheduler):
    """A Scrapy scheduler whose queue and dupefilter are shared through Redis.

    Args:
        frontier: this worker's gateway to the crawl's shared state.
        dupefilter: the crawl's dupefilter; an :class:`RFPDupeFilter` dedupes inside
            the enqueue script, any other is asked first, locally.
        serializer: turns request dicts into bytes.
        registry: this worker's handle on the crawl's worker registry.
        dead: the crawl's dead-letter list.
        stats: the crawler's stats collector.
        in_flight: returns the requests the engine is still working on.
        persist: keep the queue and dupefilter when the crawl finishes.
        flush_on_start: clear the queue and dupefilter at open if no other worker runs.
        idle_before_close: seconds to keep reporting pending work after the queue was
            last seen non-empty.
        prefetch: requests leased from Redis per call.
        heartbeat_interval: seconds between heartbeats and lease renewals.
        flush_interval: seconds pending writes may wait before they are sent; ``0``
            sends each at once.
        start_once: crawl a plain spider's start requests once per crawl, not once
            per worker.
        crawler: the crawler, to report a failed start to (see
            :mod:`scrapy_dist.startup`); without one, :meth:`open` raises instead.
        policy: what a queue entry may decode into (request classes, URL schemes).
        check_engine: run at open; raises if the running Scrapy's engine lacks the
            private state ``in_flight`` reads.
        max_held: leases this worker may hold at once (buffered, in the engine, or
            settled and not yet sent); default ``2 * prefetch`` more than it buffers.
        close_when_done: exit, rather than rejoin, when the crawl finished without
            this worker (``CLOSE_WHEN_CRAWL_DONE``).
        fault_exit_code: exit status of a worker closed with ``frontier_lost``.
    """

    def __init__(
        self,
        *,
        frontier: Frontier,
        dupefilter: BaseDupeFilter,
        serializer: Serializer,
        registry: WorkerRegistry,
        dead: DeadLetters,
        stats: StatsCollector,
        in_flight: Callable[[], Collection[Request]],
        persist: bool = False,
        flush_on_start: bool = False,
        idle_before_close: float = 0.0,
        prefetch: int = 1,
        heartbeat_interval: float = 5.0,
        flush_interval: float = 0.1,
        start_once: bool = True,
        crawler: Crawler | None = None,
        policy: RequestPolicy | None = None,
        check_engine: Callable[[], None] | None = None,
        max_held: int | None = None,
        close_when_done: bool = False,
        fault_exit_code: int = 0,
    ) -> None:
        check_scheduler(
            prefetch=prefetch,
            idle_before_close=idle_before_close,
            worker_timeout=registry.timeout,
            heartbeat_interval=heartbeat_interval,
            lease_timeout=frontier.lease_timeout,
            flush_interval=flush_interval,
        )
        self.frontier = frontier
        self.queue = frontier.queue
        self.df = dupefilter
        self.serializer = serializer
        self.policy = policy or RequestPolicy()
        self.check_engine = check_engine
        self.registry = registry
        self.dead = dead
        self.stats = stats
        self.in_flight = in_flight
        self.persist = persist
        self.flush_on_start = flush_on_start
        self.start_once = start_once
        self._joined_running = False
        self.idle_before_close = idle_before_close
        self.prefetch = prefetch
        self.heartbeat_interval = heartbeat_interval
        self.flush_interval = flush_interval
        self._next_beat = 0.0
        #: The dupefilter, when its test-and-set runs inside the enqueue script.
        self._shared_df = dupefilter if isinstance(dupefilter, RFPDupeFilter) else None
        self.spider: Spider | None = None
        self._codec: RequestCodec | None = None
        #: Leased requests not yet handed to the engine.
        self._buffer: deque[tuple[Lease, Request]] = deque()
        #: Requests handed to the engine -> their lease id.
        self._out: dict[Request, str] = {}
        #: Requests whose callback raised -> the reason.
        self._failures: dict[Request, str] = {}
        self._last_work = 0.0
        #: When next_request first and last returned None, while it keeps doing so.
        self._empty_since: float | None = None
        self._last_empty = 0.0
        self._logunser = True
        self.crawler = crawler
        #: Runs the ticks; created at open (creating it imports the reactor).
        self._ticker: LoopingCall | None = None
        #: Whether open joined the crawl (a failed start did not).
        self._joined = False
        self.max_held = max_held if max_held is not None else 3 * prefetch
        self.close_when_done = close_when_done
        self.fault_exit_code = fault_exit_code
        #: When this worker last renewed its leases (monotonic seconds).
        self._renewed_at = time.monotonic()
        #: The timer's last run, to notice a pause of the whole process.
        self._ticked_at = time.monotonic()
        #: The error the timer last logged (each kind is logged once in a row).
        self._tick_error = ""
        self._closing = False
        frontier.on_lost.append(self._crawl_lost)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the scheduler from the crawler's settings.

        Invalid settings are a start-up failure (:func:`scrapy_dist.startup.fail_start`:
        one ERROR line, exit status 1), not an exception that leaves Scrapy's engine
        half-opened: the crawler then gets a scheduler that schedules nothing.
        """
        try:
            return cls._build(crawler)
        except ConfigurationError as e:
            fail_start(crawler, "configuration_error", f"Cannot start: {e}")
            return cast("Self", FailedScheduler(crawler))

    @classmethod
    def _build(cls, crawler: Crawler) -> Self:
        config = assemble(crawler).config
        queue_cls = config.queue.cls
        # (not issubclass: Scrapy's scheduler metaclass answers it by duck typing)
        if unleased_queue(queue_cls) and UnleasedScheduler not in cls.__mro__:
            return cast("Self", UnleasedScheduler.from_crawler(crawler))
        frontier = Frontier.for_crawler(crawler)
        dupefilter: BaseDupeFilter = build_from_crawler(
            load_object(config.components.dupefilter), crawler
        )
        settings = config.scheduler
        scheduler = cls(
            frontier=frontier,
            dupefilter=dupefilter,
            serializer=load_serializer(config.requests.serializer),
            registry=WorkerRegistry(
                frontier.client,
                frontier.keys.workers,
                frontier.worker_id,
                timeout=config.workers.worker_timeout,
                frontier=frontier.clear_keys,
                progress=frontier.keys.progress,
                started=crawl_started(),
            ),
            dead=DeadLetters(frontier.client, frontier.keys.dead, frontier.worker_id),
            stats=crawler.stats,
            in_flight=lambda: engine_in_flight(crawler),
            persist=settings.persist,
            flush_on_start=settings.flush_on_start,
            idle_before_close=settings.idle_before_close,
            prefetch=settings.prefetch,
            heartbeat_interval=config.workers.heartbeat_interval,
            flush_interval=settings.flush_interval,
            start_once=settings.start_once,
            crawler=crawler,
            policy=RequestPolicy.build(config.requests.classes, config.requests.schemes),
            check_engine=lambda: check_engine(crawler),
            close_when_done=settings.close_when_done,
            fault_exit_code=settings.fault_exit_code,
            max_held=settings.max_held,
        )
        crawler.signals.connect(scheduler.record_failure, signal=signals.spider_error)
        crawler.signals.connect(scheduler.close_if_failed, signal=signals.spider_idle)
        return scheduler

    # -- Scrapy's scheduler interface ----------------------------------------------

    def open(self, spider: Spider) -> None:
        """Check Redis and the crawl's keys, join the crawl's worker registry and start
        heartbeats.

        A start-up failure (Redis unreachable or refusing the credentials, a key of the
        wrong type, a Scrapy whose engine lacks what :mod:`scrapy_dist._engine` reads)
        is reported through :func:`scrapy_dist.startup.fail_start`: one ERROR line,
        then the spider closes at once and ``scrapy crawl`` exits 1.

        Raises:
            RedisUnavailable: Redis cannot be reached (only without a crawler).
            ConfigurationError: a key holds a type this crawl cannot use, the engine
                lacks what ``scrapy_dist._engine`` reads, or Redis may evict frontier
                keys (``REDIS_EVICTION_POLICY_CHECK``) (only without a crawler).
        """
        self.spider = spider
        self._codec = RequestCodec(self.serializer, spider, self.policy)
        if start_failure(self.crawler) is not None:
            return  # the spider's set-up failed and said why
        try:
            if self.check_engine is not None:
                self.check_engine()
            self._join(spider)
        except (ScrapyDistError, redis.RedisError) as e:
            if self.crawler is None:
                raise
            reason = "configuration_error" if isinstance(e, ConfigurationError) else (
                "redis_unavailable"
            )
            message = str(e) if isinstance(e, ScrapyDistError) else (
                f"Redis at {describe(self.queue.client)} refused to open crawl "
                f"{self.frontier.keys.crawl}: {e}"
            )
            fail_start(self.crawler, reason, f"Cannot start: {message}", spider)
            return
        from twisted.internet.task import LoopingCall

        self._next_beat = time.monotonic() + self.heartbeat_interval
        self._renewed_at = self._ticked_at = time.monotonic()
        self._ticker = LoopingCall(self._tick)
        self._ticker.start(self.flush_interval or self.heartbeat_interval, now=False)

    def _join(self, spider: Spider) -> None:
        check(self.queue.client)
        self.queue.check_type()
        self.frontier.seeds.check_type()
        shared = self._shared_df
        expiring = shared.keys() if shared is not None and shared.ttl else []
        self.frontier.check_eviction_policy(expiring)
        self.df.open()
        if self._shared_df is None:
            logger.warning(
                "DUPEFILTER_CLASS %(cls)s is not Redis-backed: each worker filters only "
                "what it saw itself, so workers will crawl the same pages. Use "
                "scrapy_dist.dupefilter.RFPDupeFilter.",
                {"cls": type(self.df).__name__},
                extra={"spider": spider},
            )
        others, flushed = self.registry.join(flush=self.flush_on_start)
        #: Another worker was running this crawl when this one joined.
        self._joined_running = others > 0
        self._joined = True
        if flushed:
            logger.info(
                "Flushed crawl %(crawl)s (SCHEDULER_FLUSH_ON_START)",
                {"crawl": self.frontier.keys.crawl},
                extra={"spider": spider},
            )
        elif self.flush_on_start:
            logger.warning(
                "SCHEDULER_FLUSH_ON_START is set but %(n)d other worker(s) of this crawl "
                "are running: joining their crawl instead of flushing it",
                {"n": others},
                extra={"spider": spider},
            )
        self.frontier.join_epoch()
        keys = self.frontier.keys
        logger.info(
            "Worker %(worker)s joined crawl %(crawl)s at %(server)s (%(size)d queued "
            "requests; %(others)d other worker(s)); seeds key %(seeds)s (%(kind)s), "
            "queue %(queue)s, dupefilter %(df)s, dead letters %(dead)s",
            {
                "worker": self.registry.worker_id,
                "crawl": keys.crawl,
                "server": describe(self.queue.client),
                "size": len(self.queue),
                "others": others,
                "seeds": self.frontier.seeds.key,
                "kind": self.frontier.seeds.kind,
                "queue": self.queue.key,
                "df": keys.dupefilter,
                "dead": keys.dead,
            },
            extra={"spider": spider},
        )
        queued = len(self.queue)
        if queued:  # scrapy-redis's message, which users grep their logs for
            spider.logger.info("Resuming crawl (%(n)d requests scheduled)", {"n": queued})
        self._hint_misspelled_seeds(spider)

    def _hint_misspelled_seeds(self, spider: Spider) -> None:
        """If the seeds key is empty, name keys with a similar name that hold seeds (one
        ``SCAN`` of at most :data:`~scrapy_dist.seeds.HINT_SCAN_COUNT` keys, at open only)."""
        seeds = self.frontier.seeds
        try:
            similar = [] if len(seeds) else similar_seed_keys(self.queue.client, seeds.key)
        except redis.RedisError as e:  # e.g. an ACL user without SCAN: only a hint lost
            logger.debug("No seeds key hint: %(error)s", {"error": e})
            return
        if similar:
            logger.warning(
                "Seeds key %(key)s is empty, but %(similar)s exist(s): were seeds pushed to "
                "the wrong key? (the seeds key is REDIS_START_URLS_KEY or the spider's "
                "redis_key)",
                {"key": seeds.key, "similar": ", ".join(similar)},
                extra={"spider": spider},
            )

    def close_if_failed(self) -> None:
        """``spider_idle``: close a spider whose start failed, with the failure's reason.

        Raises:
            CloseSpider: the start failed.
        """
        failure = start_failure(self.crawler)
        if failure is not None:
            raise CloseSpider(failure.reason)

    def flush(self) -> None:
        """Delete the crawl's queue, leases and dupefilter now (scrapy-redis's ``flush``).

        Other workers of the crawl lose their queued requests too; a worker flushes at
        start with ``SCHEDULER_FLUSH_ON_START``, and only when it runs alone.
        """
        self.frontier.client.unlink(*self.frontier.clear_keys)  # UNLINK: may be large
        if self._shared_df is not None:
            self._shared_df.forget_local()
        elif hasattr(self.df, "clear"):
            self.df.clear()

    def close(self, reason: str) -> None:
        """Settle what the engine finished, hand back what it never started, leave the
        registry; if the crawl as a whole is finished and does not persist, delete its
        shared keys (a worker that merely stops never does)."""
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        if reason == FRONTIER_LOST and self.fault_exit_code:
            exit_with(self.fault_exit_code)
        if not self._joined:
            return  # a failed start: nothing was taken, nothing to leave
        if self.frontier.lost is not None:
            # nothing it holds belongs to a crawl that is there: leave, send nothing
            self._buffer.clear()
            self._out.clear()
            try:
                self.registry.leave()
            except redis.RedisError as e:
                logger.warning("Could not leave the worker registry: %(error)s", {"error": e})
            self.df.close(reason)
            return
        self._settle()
        handed = [(lease.id, HAND_BACK) for lease, _ in self._buffer]
        handed += [(lease_id, HAND_BACK) for lease_id in self._out.values()]
        self._buffer.clear()
        self._out.clear()
        self.frontier.settle(handed)
        if handed:
            logger.info(
                "Handed %(n)d unstarted request(s) back to the shared queue",
                {"n": len(handed)},
                extra={"spider": self.spider},
            )
        # requests first, then the acknowledgements Redis has confirmed them for
        for _ in range(CLOSE_FLUSHES):
            if not self.frontier.pending_writes or self.frontier.flush() is None:
                break
        if self.frontier.pending_writes:
            logger.error(
                "Redis is unreachable: %(n)d write(s) could not be sent before closing; "
                "the leases they would have settled expire after SCHEDULER_LEASE_TIMEOUT "
                "and their requests are crawled again",
                {"n": self.frontier.pending_writes},
                extra={"spider": self.spider},
            )
        self.frontier.call(self.registry.leave)
        progress = self.frontier.progress(grace=0, clear=not self.persist)
        if progress is not None:
            self._log_close(progress.state, progress)
        self.df.close(reason)

    def _log_close(self, state: str, progress: Any) -> None:
        if state == "finished" and not self.persist:
            logger.info(
                "Crawl %(crawl)s is finished: deleted its queue, leases and dupefilter "
                "(SCHEDULER_PERSIST is off)",
                {"crawl": self.frontier.keys.crawl},
                extra={"spider": self.spider},
            )
        elif state == "busy":
            logger.info(
                "Crawl %(crawl)s goes on without this worker: %(queued)d queued, "
                "%(leased)d leased, %(seeds)d seeds waiting",
                {
                    "crawl": self.frontier.keys.crawl,
                    "queued": progress.queued,
                    "leased": progress.leased,
                    "seeds": progress.seeds,
                },
                extra={"spider": self.spider},
            )

    def enqueue_request(self, request: Request) -> bool:
        """Store ``request`` in the shared queue unless it is a duplicate.

        Requests are sent in batches (``SCHEDULER_FLUSH_INTERVAL``), together with the
        settlement of the request that produced them. Returns ``False`` if the request
        is a duplicate known before sending (this worker's seen-cache, a local
        dupefilter, or, with ``SCHEDULER_FLUSH_INTERVAL = 0``, Redis's answer) or cannot be
        stored (Scrapy then fires ``request_dropped``), else ``True``; duplicates Redis
        finds in a batch are logged and counted as ``dupefilter/filtered``. A request that
        cannot be serialized is logged, counted as ``scheduler/unserializable``,
        recorded in the dead-letter list, and not marked as seen.
        """
        assert self._codec is not None, "scheduler not open"
        assert self.spider is not None
        if not self._joined:
            return False  # a failed start: nothing goes to Redis
        if self.frontier.lost is not None:
            # produced by a request of a crawl that is gone: it must not start another
            self.stats.inc_value("scheduler/crawl_lost/dropped_requests")
            return False
        shared = self._shared_df
        fingerprint = b""
        dont_filter = request.dont_filter
        if dont_filter and shared is not None and self._once_per_crawl(request):
            if self._joined_running:
                dont_filter = False  # the crawl's first worker issued it: filter it
            elif not self._record_start(shared, request):
                return False
        if shared is not None and not dont_filter:
            fingerprint = shared.fingerprint(request)
            if shared.seen_locally(fingerprint):  # known duplicate: not even serialized
                self.df.log(request, self.spider)
                return False
        try:
            payload = self._codec.encode(request)
        except SerializationError as e:
            self._unserializable(request, e)
            return False
        # a local dupefilter records what it is asked about: ask only once it can be stored
        if shared is None and not dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        outcome: list[bool] = []

        def on_reply(queued: bool) -> None:
            outcome.append(queued)
            if fingerprint and shared is not None:
                shared.remember(fingerprint)  # recorded in Redis either way
            if not queued:
                assert self.spider is not None
                self.df.log(request, self.spider)
                return
            self.stats.inc_value("scheduler/enqueued/redis")
            self.stats.inc_value("scheduler/enqueued")

        item = (payload, self.queue.score(request), fingerprint)
        self.frontier.enqueue(item, shared.backend if shared else None, on_reply)
        # batched (the default): Redis answers at the next flush, so duplicates it finds
        # are logged and counted then, and Scrapy is told the request was stored
        return outcome[0] if outcome else True

    def _once_per_crawl(self, request: Request) -> bool:
        """Whether ``request`` is a start request Scrapy marked ``dont_filter`` that
        the crawl's workers should crawl once between them (``SCHEDULER_START_ONCE``):
        the start requests of a spider that does not read its seeds from Redis."""
        return (
            self.start_once
            and bool(request.meta.get("is_start_request"))
            and not isinstance(self.spider, RedisSpiderMixin)
        )

    def _record_start(self, shared: RFPDupeFilter, request: Request) -> bool:
        """Record a start request's fingerprint before it is queued unfiltered, so the
        workers joining later filter theirs and links back to it are filtered.

        Returns:
            ``False`` if Redis cannot be reached (the request is not stored: Scrapy
            drops it, and the worker's next start issues it again).
        """
        fingerprint = shared.fingerprint(request)
        if self.frontier.call(lambda: shared.backend.add(fingerprint)) is None:
            return False
        shared.remember(fingerprint)
        return True

    def next_request(self) -> Request | None:
        """Return the next request for this worker, or ``None`` if there is none now."""
        if not self._joined:
            return None
        self._settle()
        if self.frontier.lost is not None:
            return None
        if self._buffer and time.monotonic() - self._renewed_at > 2 * self.heartbeat_interval:
            self._renew()  # paused? make sure the buffered leases are still ours
        if not self._buffer:
            self._refill()
        if not self._buffer:
            if self._empty_since is None:
                self._empty_since = time.monotonic()
            self._last_empty = time.monotonic()
            return None
        if self._empty_since is not None:
            self._found_work()
        lease, request = self._buffer.popleft()
        self._out[request] = lease.id
        self.stats.inc_value("scheduler/dequeued/redis")
        self.stats.inc_value("scheduler/dequeued")
        return request

    def _found_work(self) -> None:
        """Record how long this worker may have waited while work was in Redis: the
        work arrived at some point after the last time the scheduler found none."""
        assert self._empty_since is not None
        now = time.monotonic()
        idle, waited = now - self._empty_since, now - self._last_empty
        self._empty_since = None
        self.stats.max_value("scheduler/idle/max_wait_with_work", round(waited, 3))
        logger.debug(
            "Found work after %(idle).2fs without; it waited at most %(waited).2fs",
            {"idle": idle, "waited": waited},
            extra={"spider": self.spider},
        )

    def has_pending_requests(self) -> bool:
        if not self._joined:
            return False
        if self._buffer or self.frontier.lost is not None:
            return True  # a lost crawl: the timer rejoins or closes with the reason
        try:
            return self._pending()
        except redis.RedisError as e:
            logger.warning(
                "Redis error while checking for pending requests: %(error)s",
                {"error": e},
                extra={"spider": self.spider},
            )
            self.stats.inc_value("scheduler/redis/errors")
            return True  # never let a Redis error close the spider

    def _pending(self) -> bool:
        if (
            not self.frontier.pending_writes
            and time.monotonic() - self.frontier.found_empty_at < EMPTY_FRESH
        ):
            size = 0  # a reserve found the queue empty a moment ago: no need to ask
        else:
            size = self.frontier.call(lambda: len(self.queue))  # sends pending writes first
        if size is None or size > 0:  # unreachable Redis: never let the crawl close
            self._last_work = time.monotonic()
            return True
        return time.monotonic() - self._last_work < self.idle_before_close

    def __len__(self) -> int:
        size = self.frontier.call(lambda: len(self.queue))
        return len(self._buffer) + (size or 0)

    # -- leases ---------------------------------------------------------------------

    def record_failure(self, failure: Failure, response: Any, spider: Spider) -> None:
        """``spider_error``: remember why a callback failed, to settle its lease with it."""
        if isinstance(response, Response) and response.request in self._out:
            reason = f"{failure.type.__name__ if failure.type else 'Error'}: {failure.value}"
            self._failures[response.request] = reason[:REASON_MAX]

    def _settle(self) -> None:
        """Settle the leases of requests the engine is done with."""
        if not self._out:
            return
        in_flight = self.in_flight()
        finished = [request for request in self._out if request not in in_flight]
        if not finished:
            return
        outcomes = []
        for request in finished:
            reason = self._failures.pop(request, DONE)
            outcomes.append((self._out.pop(request), reason))
            if reason:
                self.stats.inc_value("scheduler/failed_callbacks")
        if not self._out and not self._buffer and self._shared_df is not None:
            # holding nothing: the crawl may finish and its dupefilter be deleted
            self._shared_df.forget_local()
        self.frontier.settle(outcomes)

    def _refill(self) -> None:
        """Lease up to ``prefetch`` requests; entries that cannot be rebuilt go to the
        dead-letter list, and leasing continues until one can or the queue is empty."""
        assert self._codec is not None
        while not self._buffer:
            room = self._room()
            if room <= 0 and self.frontier.pending_settlements:
                self.frontier.flush()  # send the acknowledgements that fill the room
                room = self._room()
            if room <= 0:
                self.stats.inc_value("scheduler/held/full")
                return
            leases = self.frontier.reserve(min(self.prefetch, room))
            if not leases:
                return
            bad = []
            for lease in leases:
                try:
                    request = self._codec.decode(lease.data)
                except SerializationError as e:
                    bad.append((lease.id, self._undecodable(lease, e)))
                else:
                    self._buffer.append((lease, request))
            self.frontier.settle(bad)
        self._last_work = time.monotonic()

    def _room(self) -> int:
        """Leases this worker may still take (see ``max_held``)."""
        held = len(self._buffer) + len(self._out) + self.frontier.pending_settlements
        return self.max_held - held

    def _held(self) -> list[str]:
        """The ids of the leases this worker holds: buffered or in the engine."""
        return [lease.id for lease, _ in self._buffer] + list(self._out.values())

    def _renew(self) -> None:
        """Renew the leases this worker holds; drop those taken back meanwhile."""
        lost = self.frontier.renew(self._held())
        if lost is None:
            return
        self._renewed_at = time.monotonic()
        if not lost:
            return
        gone = set(lost)
        buffered = len(self._buffer)
        self._buffer = deque(item for item in self._buffer if item[0].id not in gone)
        dropped = buffered - len(self._buffer)
        started = [request for request, lease_id in self._out.items() if lease_id in gone]
        for request in started:
            del self._out[request]
            self._failures.pop(request, None)
        logger.warning(
            "%(n)d lease(s) of this worker expired and were taken back (was it paused, "
            "e.g. a stopped process, a long GC or a network partition, for longer than "
            "SCHEDULER_LEASE_TIMEOUT?): dropped %(dropped)d buffered request(s); %(started)d "
            "already started may be crawled twice",
            {"n": len(lost), "dropped": dropped, "started": len(started)},
            extra={"spider": self.spider},
        )
        self.stats.inc_value("scheduler/leases/dropped_taken_back", dropped)

    def _tick(self) -> None:
        """Every flush interval: settle and send pending writes; every heartbeat
        interval also heartbeat and renew the leases this worker holds. No error ends
        the timer: each is logged (once in a row) and counted."""
        try:
            self._tick_once()
        except Exception as e:  # the timer must survive anything, Redis errors first
            self.stats.inc_value("scheduler/timer/errors")
            kind = f"{type(e).__name__}: {e}"
            if kind != self._tick_error:
                self._tick_error = kind
                logger.error(
                    "Scheduler timer: %(error)s (heartbeats, renewals and flushes go on)",
                    {"error": kind},
                    exc_info=not isinstance(e, redis.RedisError),
                    extra={"spider": self.spider},
                )
        else:
            self._tick_error = ""

    def _tick_once(self) -> None:
        now = time.monotonic()
        gap, self._ticked_at = now - self._ticked_at, now
        if gap > self.frontier.lease_timeout and self.frontier.lost is None:
            logger.warning(
                "This worker did not run for %(gap).1fs (longer than SCHEDULER_LEASE_TIMEOUT "
                "%(lease)gs): checking which leases it still holds",
                {"gap": gap, "lease": self.frontier.lease_timeout},
                extra={"spider": self.spider},
            )
            self._renew()
        self._settle()
        if self.frontier.lost is not None:
            self._after_lost()
            return
        self.frontier.flush()
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat_interval
            self.frontier.call(self.registry.heartbeat)
            self._renew()

    # -- a crawl that is gone --------------------------------------------------------

    def _crawl_lost(self, state: str) -> None:
        """The crawl is gone (:attr:`Frontier.lost`): drop what this worker holds of it
        (buffer, seen-cache); what the engine still runs finishes, and the requests it
        produces are dropped."""
        buffered, started = len(self._buffer), len(self._out)
        self._buffer.clear()
        if self._shared_df is not None:
            self._shared_df.forget_local()
        if buffered or started:
            logger.warning(
                "Crawl %(crawl)s is %(state)s: dropped the %(buffered)d buffered request(s) "
                "this worker still held; %(started)d already started finish, and what they "
                "produce is dropped",
                {
                    "crawl": self.frontier.keys.crawl,
                    "state": state,
                    "buffered": buffered,
                    "started": started,
                },
                extra={"spider": self.spider},
            )
        self._closing = False

    def _after_lost(self) -> None:
        """Once the engine finished what it held of a lost crawl: rejoin the crawl if
        it finished (or exit, with ``CLOSE_WHEN_CRAWL_DONE``), else close the spider
        with the reason ``frontier_lost``."""
        if self._out or self._closing or self.crawler is None:
            return
        if self.frontier.lost == FINISHED and not self.close_when_done:
            epoch = self.frontier.join_epoch()
            logger.info(
                "Rejoined crawl %(crawl)s (epoch %(epoch)s)",
                {"crawl": self.frontier.keys.crawl, "epoch": epoch},
                extra={"spider": self.spider},
            )
            return
        self._closing = True
        reason = "crawl_finished" if self.frontier.lost == FINISHED else FRONTIER_LOST
        close_spider(self.crawler, reason)

    # -- failures -------------------------------------------------------------------

    def _undecodable(self, lease: Lease, error: SerializationError) -> str:
        """Log and count a queued request that cannot be rebuilt.

        Returns:
            The settlement of its lease: dead-letter it with its record, in the same
            server-side step that settles the lease (so it is recorded exactly once).
        """
        logger.error(
            "Dropped a queued request that cannot be rebuilt (%(error)s); it is in %(dead)s",
            {"error": error, "dead": self.dead.key},
            extra={"spider": self.spider},
        )
        self.stats.inc_value("scheduler/undecodable")
        record = self.dead.record(deadletter.REQUEST, str(error), lease.data, lease.deliveries)
        return DEAD_NOW + record.decode("utf-8")

    def _unserializable(self, request: Request, error: SerializationError) -> None:
        if self._logunser:
            logger.error(
                "Unable to serialize request: %(request)s - reason: %(reason)s - it is "
                "recorded in %(dead)s and will not be crawled (no more unserializable "
                "requests will be logged; see the stat 'scheduler/unserializable')",
                {"request": request, "reason": error, "dead": self.dead.key},
                extra={"spider": self.spider},
            )
            self._logunser = False
        self.stats.inc_value("scheduler/unserializable")
        self.frontier.call(
            lambda: self.dead.add(
                deadletter.REQUEST, f"unserializable: {error}", repr(request), url=request.url
            )
        )


class UnleasedScheduler(Scheduler):
    """The scheduler for a ``SCHEDULER_QUEUE_CLASS`` written against scrapy-redis's
    :class:`~scrapy_dist.queue.Base` (its own ``push``/``pop``/``__len__``).

    Such a queue's ``pop`` removes the request from Redis, so nothing is leased: a worker
    that dies loses the requests it took, as with scrapy-redis (a warning says so at
    open). The dupefilter is asked before each push (``request_seen``); seeds, workers,
    dead letters and stats work as with the leasing scheduler; nothing is deleted when a
    worker closes. Built by :meth:`Scheduler.from_crawler` when the queue class is one.
    """

    _queue_cls: type[Base]
    _queue_key: str

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        scheduler = super().from_crawler(crawler)
        if UnleasedScheduler not in type(scheduler).__mro__:
            return scheduler  # a failed start (FailedScheduler)
        config = assemble(crawler).config
        scheduler._queue_cls = config.queue.cls
        scheduler._queue_key = config.keys.requests
        scheduler._shared_df = None  # asked with request_seen() before each push
        scheduler.persist = True  # the crawl's progress cannot see into that queue
        return scheduler

    def open(self, spider: Spider) -> None:
        """Build the queue for ``spider``, then open as the leasing scheduler does."""
        key = self.frontier.keys.custom(self._queue_key, "SCHEDULER_QUEUE_KEY")
        self.custom: Base = self._queue_cls(
            server=self.frontier.client, spider=spider, key=key, serializer=self.serializer
        )
        logger.warning(
            "SCHEDULER_QUEUE_CLASS %(cls)s pops requests out of Redis (scrapy-redis's "
            "queue API): requests a worker has taken are lost if it dies. Subclass "
            "scrapy_dist.queue.FifoQueue, LifoQueue or PriorityQueue to have them leased",
            {"cls": self._queue_cls.__name__},
            extra={"spider": spider},
        )
        super().open(spider)

    def enqueue_request(self, request: Request) -> bool:
        """Push ``request`` with the queue's ``push`` unless the dupefilter saw it."""
        assert self.spider is not None, "scheduler not open"
        if not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        try:
            self.custom.push(request)
        except SerializationError as e:
            self._unserializable(request, e)
            return False
        self.stats.inc_value("scheduler/enqueued/redis")
        self.stats.inc_value("scheduler/enqueued")
        return True

    def next_request(self) -> Request | None:
        """The queue's next request (``pop``), or ``None``."""
        try:
            request = self.custom.pop(0)
        except SerializationError as e:
            logger.error(
                "Dropped a queued request that cannot be rebuilt: %(error)s",
                {"error": e},
                extra={"spider": self.spider},
            )
            self.stats.inc_value("scheduler/undecodable")
            return None
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
            self.stats.inc_value("scheduler/dequeued")
        return request

    def has_pending_requests(self) -> bool:
        return len(self) > 0

    def __len__(self) -> int:
        return len(self.custom)


class FailedScheduler(BaseScheduler):
    """The scheduler of a crawler whose scheduler settings are invalid: it schedules
    nothing and closes the spider at its first idle moment with the failure's reason."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        crawler.signals.connect(self.close_if_failed, signal=signals.spider_idle)

    def close_if_failed(self) -> None:
        """``spider_idle``: close the spider.

        Raises:
            CloseSpider: always, with the start failure's reason.
        """
        failure = start_failure(self.crawler)
        raise CloseSpider(failure.reason if failure is not None else "configuration_error")

    def has_pending_requests(self) -> bool:
        """Never: nothing is scheduled."""
        return False

    def enqueue_request(self, request: Request) -> bool:
        """Refuse ``request``: the crawl did not start."""
        return False

    def next_request(self) -> Request | None:
        """Nothing."""
        return None
