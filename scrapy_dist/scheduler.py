"""The Redis scheduler: Scrapy's scheduler interface over a shared frontier.

Over ~600 lines on purpose: :class:`Scheduler` is one class, Scrapy's scheduler
interface (``open``, ``close``, ``enqueue_request``, ``next_request``,
``has_pending_requests``, ``__len__``) with scrapy-redis's attributes (``persist``,
``flush_on_start``) and the hooks :class:`~scrapy_dist.unleased.UnleasedScheduler`
overrides. Its parts already live in :mod:`scrapy_dist.worker`; what stays here is
their assembly and the refill that each ``next_request`` decides on (the local buffer,
a reserve now or from the timer, or waiting), which reads and sets the same state.

Every worker of a crawl enqueues into and takes from the same Redis queue. Dedupe and
enqueue are one atomic server-side step (``lua/enqueue.lua``), so a fingerprint is never
recorded for a request that is not queued. Taking a request leases it
(:mod:`scrapy_dist.frontier.core`); the lease is settled once the request has left the
engine (:mod:`scrapy_dist.worker.deliveries`). A request whose callback raised is done, as on
Scrapy's scheduler; ``SCHEDULER_CALLBACK_ERRORS`` can return it for another try with
the error as its reason (``"retry"``) or dead-letter it at once (``"dead"``).

The parts: :class:`~scrapy_dist.worker.deliveries.Deliveries` (the leases this worker holds and
when each is settled), :class:`~scrapy_dist.worker.heartbeat.Heartbeat` (the timer: flushes,
heartbeats, renewals), :class:`~scrapy_dist.worker.membership.Membership` (joining, losing and
leaving the crawl), :class:`~scrapy_dist.unleased.UnleasedScheduler` (a scrapy-redis
queue, unleased) and :class:`~scrapy_dist.worker.startup.FailedScheduler` (a crawl that did not
start). Faults: every call the scheduler makes survives any Redis error (logged and
counted).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, ClassVar, cast

import redis
from scrapy import signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import DontCloseSpider
from scrapy.http import Response
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_dist import deadletter
from scrapy_dist.assembly import assemble
from scrapy_dist.config.scheduling import check_scheduler
from scrapy_dist.connection import describe
from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.exceptions import ConfigurationError, ScrapyDistError, SerializationError
from scrapy_dist.frontier.choice import frontier_for
from scrapy_dist.frontier.registry import WorkerRegistry, crawl_started
from scrapy_dist.frontier.wire import DEAD_NOW
from scrapy_dist.parents import ORDER as PARENTS_ORDER
from scrapy_dist.parents import Links, links_for
from scrapy_dist.politeness import Politeness, slot_naming
from scrapy_dist.queue import unleased_queue
from scrapy_dist.scripts import HistoryKeys
from scrapy_dist.serializers import RequestCodec, RequestPolicy, Serializer, load_serializer
from scrapy_dist.slot_queue import SlotQueue
from scrapy_dist.spiders import RedisSpiderMixin
from scrapy_dist.worker import engine as _engine
from scrapy_dist.worker.batch import BatchSize
from scrapy_dist.worker.control import ControlWatcher, WorkerControl
from scrapy_dist.worker.crawl_delays import CrawlDelays
from scrapy_dist.worker.deliveries import Deliveries
from scrapy_dist.worker.enqueuer import Enqueuer
from scrapy_dist.worker.heartbeat import Heartbeat
from scrapy_dist.worker.horizon import StartHorizon
from scrapy_dist.worker.local import LocalRequests
from scrapy_dist.worker.membership import FRONTIER_LOST, CloseWait, Membership, exit_with
from scrapy_dist.worker.pauses import SlotPauses
from scrapy_dist.worker.refill import Refill
from scrapy_dist.worker.slot_counts import SlotCounts
from scrapy_dist.worker.startup import FailedScheduler, fail_start, raise_if_failed, start_failure

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.statscollectors import StatsCollector
    from twisted.python.failure import Failure
    from typing_extensions import Self

    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.frontier.leases import Lease

__all__ = ["FailedScheduler", "Scheduler"]

logger = logging.getLogger(__name__)

#: Most requests one ``next_request`` drops for ``SCHEDULER_SLOT_PAGE_LIMIT`` before it
#: answers ``None`` and has the engine ask again (each refill may be a round trip).
DROPS_PER_CALL = 32


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
        prefetch: requests leased from Redis per call, at least.
        prefetch_max: requests leased from Redis per call at most, as the engine's
            demand grows (:mod:`scrapy_dist.worker.batch`); ``0``: ``prefetch``.
        heartbeat_interval: seconds between heartbeats and lease renewals.
        flush_interval: seconds pending writes may wait before they are sent; ``0``
            sends each at once.
        start_once: crawl a plain spider's start requests once per crawl, not once
            per worker.
        crawler: the crawler, to report a failed start to (see
            :mod:`scrapy_dist.worker.startup`); without one, :meth:`open` raises instead.
        policy: what a queue entry may decode into (request classes, URL schemes).
        check_engine: run at open; raises if the running Scrapy's engine lacks the
            private state :mod:`scrapy_dist.worker.engine` reads.
        max_held: leases this worker may hold at once (buffered, in the engine, or
            settled and not yet sent); default ``prefetch + 2 * prefetch_max``.
        close_when_done: exit, rather than rejoin, when the crawl finished without
            this worker (``CLOSE_WHEN_CRAWL_DONE``).
        fault_exit_code: exit status of a worker closed with ``frontier_lost``.
        links: the parents of the requests callbacks return
            (:mod:`scrapy_dist.parents`): a callback's requests are then refused by
            Redis once this worker no longer holds its request's lease; ``None``: they
            are fenced by the crawl's epoch only.
        callback_errors: a request whose callback raised is done (``"done"``, as on
            Scrapy's scheduler), returned for another try (``"retry"``) or
            dead-lettered at once (``"dead"``).
        local: where requests that cannot be stored in Redis are kept
            (:mod:`scrapy_dist.worker.local`; default: Scrapy's LIFO memory queues).
        politeness: makes the cluster-wide politeness that gates the buffer, given the
            deliveries (``None``, or a factory returning ``None``: not gated).

    Raises:
        ConfigurationError: the options contradict each other
            (:func:`scrapy_dist.config.scheduling.check_scheduler`).
    """

    #: Whether requests are leased (``False``: :class:`UnleasedScheduler`).
    leased: ClassVar[bool] = True

    def __init__(
        self,
        *,
        frontier: CrawlFrontier,
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
        prefetch_max: int = 0,
        heartbeat_interval: float = 5.0,
        flush_interval: float = 0.1,
        start_once: bool = True,
        crawler: Crawler | None = None,
        policy: RequestPolicy | None = None,
        check_engine: Callable[[], None] | None = None,
        max_held: int | None = None,
        close_when_done: bool = False,
        fault_exit_code: int = 0,
        links: Links | None = None,
        callback_errors: str = "done",
        local: LocalRequests | None = None,
        politeness: Callable[[Deliveries], Politeness | None] | None = None,
        horizon: StartHorizon | None = None,
        slot_counts: SlotCounts | None = None,
    ) -> None:
        check_scheduler(
            prefetch=prefetch,
            prefetch_max=prefetch_max,
            idle_before_close=idle_before_close,
            flush_interval=flush_interval,
            heartbeat_interval=heartbeat_interval,
            worker_timeout=registry.timeout,
            lease_timeout=frontier.lease_timeout,
            callback_errors=callback_errors,
        )
        self.frontier, self.queue, self.registry = frontier, frontier.queue, registry
        self.df, self.serializer, self.dead, self.stats = dupefilter, serializer, dead, stats
        self.policy = policy or RequestPolicy()
        self.check_engine, self.crawler = check_engine, crawler
        self.idle_before_close, self.start_once = idle_before_close, start_once
        self.fault_exit_code = fault_exit_code
        self.links = links
        #: The dupefilter, when its test-and-set runs inside the enqueue script.
        self._shared_df = (
            dupefilter if self.leased and isinstance(dupefilter, RFPDupeFilter) else None
        )
        batch = BatchSize(prefetch, prefetch_max or prefetch)
        self.deliveries = Deliveries(
            frontier,
            in_flight=in_flight,
            stats=stats,
            prefetch=prefetch,
            max_held=max_held if max_held is not None else prefetch + 2 * batch.ceiling,
            on_empty=self._shared_df.forget_local if self._shared_df else lambda: None,
            on_finished=self._left_engine,
            callback_errors=callback_errors,
            local=local,
            batch=batch,
        )
        #: A plain spider's wait, before it closes, for the leases other workers hold
        #: (set at open).
        self._close_wait: CloseWait | None = None
        # -- crawl control (pause, resume, drain: scrapy_dist.control) --
        self.control = WorkerControl(
            ControlWatcher.for_frontier(frontier),
            frontier,
            self.deliveries,
            crawler=crawler,
        )
        self.membership = Membership(
            frontier,
            registry,
            self.deliveries,
            dupefilter,
            shared_df=self._shared_df,
            crawler=crawler,
            persist=persist or not self.leased,
            flush_on_start=flush_on_start,
            close_when_done=close_when_done,
            control=self.control,
        )
        self.heartbeat = Heartbeat(
            frontier,
            registry,
            self.deliveries,
            stats,
            heartbeat_interval=heartbeat_interval,
            flush_interval=flush_interval,
            on_lost=self.membership.after_lost,
            control=self.control,
            # (late bound: the refill policy, built next, reads this timer)
            refill=(lambda: self.refill.top_up()) if self.leased else None,  # noqa: PLW0108
            flush_later=(lambda: self.refill.flush_later()) if self.leased else None,  # noqa: PLW0108
        )
        #: When and how the buffer is refilled (the refill policy).
        #: The crawl's counts per download slot, and its page limit per slot.
        self.slot_counts = slot_counts
        #: The start horizon (SCHEDULER_START_HORIZON): which buffered requests go
        #: to the engine and which back to the queue; or None.
        self.horizon = horizon
        #: robots.txt ``Crawl-delay`` written for a queue per slot (``ROBOTSTXT_OBEY``).
        self.crawl_delays: CrawlDelays | None = None
        self.refill = Refill(
            frontier,
            self.deliveries,
            self.heartbeat,
            self.control,
            stats,
            wake=self._wake,
            waiting=horizon.waiting if horizon is not None else lambda: False,
        )
        frontier.events.on_crawl_lost(self.membership.crawl_lost)
        frontier.events.on_flush_landed(self._wake)
        if self._shared_df is not None:
            # a master that changed may have lost what the seen-cache vouches for
            frontier.events.on_master_changed(self._shared_df.forget_local)
        self.spider: Spider | None = None
        self._codec: RequestCodec | None = None
        #: The way in for the spider's requests; created at open (it needs the spider).
        self._enqueuer: Enqueuer | None = None
        #: Set when this scheduler's start failed: it then behaves as that scheduler.
        self._not_started: FailedScheduler | None = None
        self._last_work = 0.0
        #: When next_request first and last returned None, while it keeps doing so.
        self._empty_since: float | None = None
        self._last_empty = 0.0
        #: Cluster-wide politeness (SCHEDULER_POLITENESS), gating the buffer; or None.
        self.politeness: Politeness | None = (
            politeness(self.deliveries) if politeness is not None else None
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build the scheduler from the crawler's settings.

        Invalid settings are a start-up failure (:func:`scrapy_dist.worker.startup.fail_start`:
        one ERROR line, exit status 1), not an exception that leaves Scrapy's engine
        half-opened: the crawler then gets a :class:`FailedScheduler`.
        """
        try:
            return cls._build(crawler)
        except ConfigurationError as e:
            fail_start(crawler, "configuration_error", f"Cannot start: {e}")
            return cast("Self", FailedScheduler.for_crawler(crawler))

    @classmethod
    def _build(cls, crawler: Crawler) -> Self:
        from scrapy_dist.unleased import UnleasedScheduler

        config = assemble(crawler).config
        queue_cls = config.queue.cls
        # (not issubclass: Scrapy's scheduler metaclass answers it by duck typing)
        if unleased_queue(queue_cls) and UnleasedScheduler not in cls.__mro__:
            return cast("Self", UnleasedScheduler.from_crawler(crawler))
        frontier = frontier_for(crawler)
        polite, pause_max = config.politeness.enabled, config.scheduler.slot_pause_max
        horizon_on = cls.leased and config.scheduler.start_horizon > 0 and not polite
        pauses = None
        if cls.leased and pause_max > 0 and (horizon_on or polite):
            pauses = SlotPauses.for_crawler(
                crawler,
                frontier,
                # the slot as the part that holds its requests back names it
                slot_naming(config.politeness)
                if polite
                else (lambda request: _engine.slot_key(crawler, request) or ""),
                longest=pause_max,
                backoff_after=config.scheduler.slot_backoff_after,
                backoff=config.scheduler.slot_backoff,
                # (the queue per slot names a site's new requests by host, and holds a
                # paused one's in Redis; Scrapy may name its slot by address)
                host_too=isinstance(frontier.queue, SlotQueue),
            )
        counts = None
        if cls.leased and config.scheduler.slot_counts:
            counts = SlotCounts.for_crawler(
                crawler, frontier, limit=config.scheduler.slot_page_limit
            )
        horizon = None
        if horizon_on:
            horizon = StartHorizon.for_crawler(
                crawler,
                frontier,
                config.scheduler.start_horizon,
                config.politeness,
                paused=pauses.left if pauses is not None else lambda key: 0.0,
            )
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
                starts=frontier.keys.starts,
                started=crawl_started(),
                history=HistoryKeys.of(frontier.keys, frontier.queue.kind),
            ),
            dead=DeadLetters(frontier.client, frontier.keys.dead, frontier.worker_id),
            stats=crawler.stats,
            in_flight=lambda: _engine.in_flight(crawler),
            persist=settings.persist,
            flush_on_start=settings.flush_on_start,
            idle_before_close=settings.idle_before_close,
            prefetch=settings.prefetch,
            prefetch_max=settings.prefetch_max,
            heartbeat_interval=config.workers.heartbeat_interval,
            flush_interval=settings.flush_interval,
            start_once=settings.start_once,
            crawler=crawler,
            policy=RequestPolicy.build(config.requests.classes, config.requests.schemes),
            check_engine=lambda: _engine.check_crawler(crawler, downloader=horizon is not None),
            close_when_done=settings.close_when_done,
            fault_exit_code=settings.fault_exit_code,
            max_held=settings.max_held,
            links=links_for(crawler),
            callback_errors=settings.callback_errors,
            local=LocalRequests.for_crawler(crawler),
            # (a scrapy-redis style queue pops in its own order: not gated)
            politeness=(
                (
                    lambda deliveries: Politeness.for_crawler(
                        crawler,
                        frontier,
                        deliveries,
                        paused=pauses.left if pauses is not None else lambda slot: 0.0,
                    )
                )
                if cls.leased
                else None
            ),
            horizon=horizon,
            slot_counts=counts,
        )
        if not cls.leased and config.politeness.enabled:
            logger.warning(
                "SCHEDULER_POLITENESS has no effect with the unleased queue %s: each worker "
                "applies its own limits",
                config.queue.path,
            )
        crawler.signals.connect(scheduler.record_failure, signal=signals.spider_error)
        crawler.signals.connect(scheduler.close_if_failed, signal=signals.spider_idle)
        if isinstance(queue_cls, type) and issubclass(queue_cls, SlotQueue):
            # (with SCHEDULER_POLITENESS too, the gate holds the concurrency and spaces
            # the sends: the queue spaces the leases, and a request leased on time may
            # still wait behind a download in flight)
            if not config.politeness.autothrottle:
                # the queue spaces each slot's requests for the crawl (AutoThrottle sets
                # the downloader's delays itself)
                crawler.signals.connect(
                    scheduler._slot_delay_off, signal=signals.request_reached_downloader
                )
            if config.politeness.robots and isinstance(frontier.queue, SlotQueue):
                scheduler.crawl_delays = CrawlDelays.for_crawler(
                    crawler, frontier, frontier.queue.limits
                )
        return scheduler

    # -- scrapy-redis's attributes ---------------------------------------------------

    @property
    def persist(self) -> bool:
        """Keep the queue and dupefilter when the crawl finishes (``SCHEDULER_PERSIST``;
        settable before :meth:`close`, as with scrapy-redis)."""
        return self.membership.persist

    @persist.setter
    def persist(self, persist: bool) -> None:
        self.membership.persist = persist or not self.leased

    @property
    def flush_on_start(self) -> bool:
        """Clear the crawl at open if no other worker runs (``SCHEDULER_FLUSH_ON_START``;
        settable before :meth:`open`, as with scrapy-redis)."""
        return self.membership.flush_on_start

    @flush_on_start.setter
    def flush_on_start(self, flush_on_start: bool) -> None:
        self.membership.flush_on_start = flush_on_start

    # -- Scrapy's scheduler interface ----------------------------------------------

    def open(self, spider: Spider) -> None:
        """Check Redis and the crawl's keys, join the crawl's worker registry and start
        heartbeats.

        A start-up failure (Redis unreachable or refusing the credentials, a key of the
        wrong type, a Scrapy whose engine lacks what :mod:`scrapy_dist.worker.engine` reads)
        is reported through :func:`scrapy_dist.worker.startup.fail_start`: one ERROR line,
        then the spider closes at once and ``scrapy crawl`` exits 1; this scheduler
        then schedules nothing (as a :class:`FailedScheduler`).

        Raises:
            RedisUnavailable: Redis cannot be reached (only without a crawler).
            ConfigurationError: a key holds a type this crawl cannot use, the engine
                lacks what ``scrapy_dist.worker.engine`` reads, or Redis may evict frontier
                keys (``REDIS_EVICTION_POLICY_CHECK``) (only without a crawler).
        """
        self.spider = spider
        if self.leased and not isinstance(spider, RedisSpiderMixin):
            # (a Redis spider waits itself, for seeds, and before MAX_IDLE_TIME_BEFORE_CLOSE)
            self._close_wait = CloseWait(
                self.frontier, self.heartbeat.heartbeat_interval, live_too=True
            )
        self._codec = RequestCodec(self.serializer, spider, self.policy)
        self._enqueuer = Enqueuer(
            self.frontier,
            self.df,
            shared_df=self._shared_df,
            dead=self.dead,
            stats=self.stats,
            codec=self._codec,
            spider=spider,
            start_once=self.start_once,
            parent_of=self._parent_lease,
            claimed_elsewhere=self._close_wait.expect if self._close_wait else lambda: None,
            signals=self.crawler.signals if self.crawler is not None else None,
            keep_local=self._keep_local,
        )
        if self.crawler is not None and start_failure(self.crawler) is not None:
            self._not_started = FailedScheduler(self.crawler)
            return  # the spider's set-up failed and said why
        try:
            if self.check_engine is not None:
                self.check_engine()
            self.membership.join(spider)
        except (ScrapyDistError, redis.RedisError) as e:
            if self.crawler is None:
                raise
            reason = (
                "configuration_error"
                if isinstance(e, ConfigurationError)
                else ("redis_unavailable")
            )
            message = (
                str(e)
                if isinstance(e, ScrapyDistError)
                else (
                    f"Redis at {describe(self.queue.client)} refused to open crawl "
                    f"{self.frontier.keys.crawl}: {e}"
                )
            )
            fail_start(self.crawler, reason, f"Cannot start: {message}", spider)
            self._not_started = FailedScheduler(self.crawler)
            return
        self.refill.open(self._codec.decode, self._undecodable)
        self.heartbeat.start(spider)
        if self.politeness is not None:
            self.politeness.open(spider)
        if self.leased and self.links is not None and not self.links.installed:
            logger.warning(
                "The spider middleware %(mw)s is not enabled: the requests a callback "
                "returns are fenced by the crawl's epoch only, so a worker paused past "
                "SCHEDULER_LEASE_TIMEOUT may queue the children of pages another worker "
                "took over (add it to SPIDER_MIDDLEWARES at %(order)d, or enable "
                "scrapy_dist.addon.DistAddon)",
                {"mw": "scrapy_dist.parents.ParentLinks", "order": PARENTS_ORDER},
                extra={"spider": spider},
            )

    def _keep_local(self, request: Request) -> None:
        """Keep a request that cannot be stored in Redis in memory, anchored to the
        lease of the page it came from (:mod:`scrapy_dist.worker.local`)."""
        parent = self.links.parent(request) if self.links is not None else None
        self.deliveries.keep_local(request, self.deliveries.anchors_of(parent))

    def _parent_lease(self, request: Request) -> str:
        """The lease id of the request whose callback returned ``request`` while this
        worker holds it in its engine, else ``""``."""
        if self.links is None:
            return ""
        return self.deliveries.lease_of(self.links.parent(request))

    def close_if_failed(self) -> None:
        """``spider_idle``: close a spider whose start failed, with the failure's reason;
        keep it open while the crawl is paused or draining (:mod:`scrapy_dist.control`),
        and a plain spider while other workers hold leases (:class:`CloseWait`).

        Raises:
            CloseSpider: the start failed.
            DontCloseSpider: the crawl is paused or draining, or a plain spider waits.
        """
        raise_if_failed(self.crawler)
        self.control.on_idle()
        if self._close_wait is not None and self._close_wait.holds(self.spider):
            raise DontCloseSpider

    def flush(self) -> None:
        """Delete the crawl's queue, leases and dupefilter now (scrapy-redis's ``flush``).

        Other workers of the crawl lose their queued requests too; a worker flushes at
        start with ``SCHEDULER_FLUSH_ON_START``, and only when it runs alone.
        """
        self.frontier.delete_keys()  # UNLINK (may be large); every shard's (shards)
        if self._shared_df is not None:
            self._shared_df.forget_local()
        elif hasattr(self.df, "clear"):
            self.df.clear()

    def close(self, reason: str) -> None:
        """Stop the timer and leave the crawl (see :meth:`Membership.leave`): settle what
        the engine finished, hand back what it never started, leave the registry; if the
        crawl as a whole is finished and does not persist, delete its shared keys (a
        worker that merely stops never does)."""
        self.heartbeat.stop()
        self.frontier.land()  # the timer's flush in flight: its top-up is handed back
        counts = self.slot_counts
        if counts is not None and counts.unwritten() and self.membership.joined:
            counts.write_now()
            if self.frontier.lost is None:
                self.frontier.flush()  # the counts' last write (a refusal keeps nothing)
        if self.politeness is not None:
            self.politeness.close()
        if reason == FRONTIER_LOST and self.fault_exit_code:
            exit_with(self.fault_exit_code)
        self.membership.leave(reason)
        self.frontier.stop_io()

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
        if self._not_started is not None:
            return self._not_started.enqueue_request(request)
        if self.slot_counts is not None and self._over_limit(request, start=False):
            self.stats.inc_value("scheduler/slot_limit/dropped")
            return False  # (Scrapy's engine sends request_dropped)
        return self._enqueue(request)

    def next_request(self) -> Request | None:
        """Return the next request for this worker, or ``None`` if there is none now (or
        the crawl is paused or draining)."""
        if self._not_started is not None:
            return self._not_started.next_request()
        if self.control.holds():  # crawl control: paused or draining (scrapy_dist.control)
            return None
        for _ in range(DROPS_PER_CALL):
            request = self.deliveries.take_local()  # first, as Scrapy's memory queue
            if request is not None:
                self.stats.inc_value("scheduler/dequeued/memory")
                self.stats.inc_value("scheduler/dequeued")
            else:
                request = self._next()
            if request is None or self.slot_counts is None or not self._over_limit(request):
                break
            self._drop_over_limit(request)
        else:
            # as many dropped as one call may: the engine asks again at once, and the
            # reactor runs meanwhile (each refill may have been a round trip)
            self._wake_engine()
            return None
        if request is not None and self._close_wait is not None:
            self._close_wait.forget()
        return request

    def _over_limit(self, request: Request, *, start: bool = True) -> bool:
        """Whether ``request``'s slot reached ``SCHEDULER_SLOT_PAGE_LIMIT``
        (:meth:`SlotCounts.over`; ``start``: if not, it counts as started). Should the
        check fail, this worker goes on without the limit, with one ERROR, rather than
        lose the request."""
        counts = self.slot_counts
        assert counts is not None
        try:
            return counts.over(request, start=start)
        except Exception:
            logger.exception(
                "The download slot page limit failed; this worker goes on without it "
                "(SCHEDULER_SLOT_PAGE_LIMIT)",
                extra={"spider": self.spider},
            )
            self.stats.inc_value("scheduler/slot_limit/errors")
            counts.limit = 0
            return False

    def _drop_over_limit(self, request: Request) -> None:
        """``request``'s slot reached ``SCHEDULER_SLOT_PAGE_LIMIT``: it is not crawled.
        It left the buffer for the engine, which never gets it, so its lease is settled
        as done with the next settlement; ``request_dropped`` is sent for it (it counts
        as dequeued too)."""
        self.stats.inc_value("scheduler/slot_limit/dropped")
        if self.crawler is not None:
            self.crawler.signals.send_catch_log(
                signals.request_dropped, request=request, spider=self.spider
            )

    def _wake_engine(self) -> None:
        """Have the engine ask for a request again on the reactor's next turn."""
        engine = _engine.engine_of(self.crawler) if self.crawler is not None else None
        if engine is not None:
            _engine.wake(engine)

    def has_pending_requests(self) -> bool:
        """Whether work is pending: buffered, queued in Redis (or Redis unreachable),
        the crawl lost (the timer rejoins or closes), a flush in flight (not waited
        for), or the queue was seen non-empty less than ``SCHEDULER_IDLE_BEFORE_CLOSE``
        seconds ago."""
        if self._not_started is not None:
            return self._not_started.has_pending_requests()
        if self.deliveries.local:
            return True
        try:
            return self._has_pending()
        except redis.RedisError as e:
            logger.warning(
                "Redis error while checking for pending requests: %(error)s",
                {"error": e},
                extra={"spider": self.spider},
            )
            self.stats.inc_value("scheduler/redis/errors")
            return True  # never let a Redis error close the spider

    def __len__(self) -> int:
        if self._not_started is not None:
            return len(self._not_started)
        return self._len() + len(self.deliveries.local)

    # -- the leasing scheduler (UnleasedScheduler overrides these) --------------------

    def _enqueue(self, request: Request) -> bool:
        assert self._enqueuer is not None, "scheduler not open"
        self.deliveries.before_lookup()  # a seen-cache the crawl's end made stale goes now
        return self._enqueuer.enqueue(request)

    def _next(self) -> Request | None:
        deliveries = self.deliveries
        deliveries.settle()
        if self.frontier.lost is not None:
            return None
        if deliveries.buffer and (
            time.monotonic() - deliveries.renewed_at > 2 * self.heartbeat.heartbeat_interval
        ):
            deliveries.renew(self.spider)  # paused? make sure the buffered leases are ours
        if not deliveries.buffer and self.refill.refill():
            self._last_work = time.monotonic()
        if self.politeness is None:
            request = deliveries.take() if self.horizon is None else self._take_guarded()
        else:  # cluster-wide politeness: the first request whose slot has a token
            assert self._codec is not None, "scheduler not open"
            request = self.politeness.take(self._codec.decode, self._undecodable)
        if request is None:
            if self._empty_since is None:
                self._empty_since = time.monotonic()
            self._last_empty = time.monotonic()
            return None
        if self._empty_since is not None:
            self._found_work()
        self.stats.inc_value("scheduler/dequeued/redis")
        self.stats.inc_value("scheduler/dequeued")
        return request

    def _take_guarded(self) -> Request | None:
        """:meth:`_take_soon`; should the horizon fail (a downloader or a slot it cannot
        read), this worker goes on without it, with one ERROR, rather than leave the
        engine's request unanswered (a crawl that hangs)."""
        try:
            return self._take_soon()
        except Exception:
            logger.exception(
                "The start horizon failed; this worker goes on without it "
                "(SCHEDULER_START_HORIZON) and hands its engine every leased request",
                extra={"spider": self.spider},
            )
            self.stats.inc_value("scheduler/horizon/errors")
            self.horizon = None
            return self.deliveries.take()

    def _take_soon(self) -> Request | None:
        """The first buffered request that Scrapy's downloader would start within the
        start horizon; those before it go back to the queue (when none would start
        soon, all of them, and this worker leases nothing until one could). A worker
        alone in the crawl keeps them buffered instead, and leases more while none can
        start soon (:mod:`scrapy_dist.worker.horizon`)."""
        horizon, deliveries = self.horizon, self.deliveries
        assert horizon is not None
        assert self._codec is not None, "scheduler not open"
        while True:
            index, back = horizon.pick(request for _, request in deliveries.buffer)
            if horizon.alone():
                if index is not None:
                    break
                if back and deliveries.refill_more(self._codec.decode, self._undecodable):
                    continue  # other slots' requests may be queued behind these
            else:
                if back:
                    deliveries.hand_back_first(back)
                    self.stats.inc_value("scheduler/horizon/handed_back", back)
                    index = None if index is None else 0
                if index is not None:
                    break
            if back:
                self.refill.hold_off()  # the timer wakes the engine when one may go
            return None
        # counted on its way first: should that fail, the request is still buffered
        horizon.given(deliveries.buffer[index][1])
        return deliveries.take_at(index)

    def _left_engine(self, request: Request) -> None:
        """A request left the engine (before its lease is settled): cluster-wide
        politeness, if on, releases its download token; the start horizon stops
        counting it as on its way to the downloader."""
        if self.politeness is not None:
            self.politeness.finished(request)
        if self.horizon is not None:
            self.horizon.reached(request)

    def _wake(self) -> None:
        """Wake the engine if it was last told there was nothing (:meth:`next_request`
        returned ``None``): it looks at the scheduler again now, not at its next
        heartbeat."""
        if self._empty_since is not None and self.crawler is not None:
            engine = _engine.engine_of(self.crawler)
            if engine is not None:
                _engine.wake(engine)

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

    def _has_pending(self) -> bool:
        frontier = self.frontier
        if self.deliveries.buffer or frontier.lost is not None or frontier.flying:
            # a lost crawl: the timer rejoins or closes with the reason; a flush in
            # flight may bring leases and queue requests (it is not waited for: its
            # landing wakes the engine, which asks again)
            return True
        # a reserve found the queue empty a moment ago: no need to ask (a call sends
        # the pending writes first)
        size = (
            0 if self.refill.found_empty_lately() else self.frontier.call(lambda: len(self.queue))
        )
        if size is None or size > 0:  # unreachable Redis: never let the crawl close
            self._last_work = time.monotonic()
            return True
        return time.monotonic() - self._last_work < self.idle_before_close

    def _len(self) -> int:
        size = self.frontier.call(lambda: len(self.queue))
        return len(self.deliveries.buffer) + (size or 0)

    # -- failures -------------------------------------------------------------------

    def _slot_delay_off(self, request: Request, spider: object = None) -> None:
        """``request_reached_downloader`` with a queue per slot
        (:func:`scrapy_dist.worker.engine.local_delay_off`)."""
        if self.crawler is not None:
            _engine.local_delay_off(self.crawler, request)

    def record_failure(self, failure: Failure, response: object, spider: Spider) -> None:
        """``spider_error``: remember why a callback failed (the exception's type and
        message), to settle its lease with it: returned for another try, or
        dead-lettered (``SCHEDULER_CALLBACK_ERRORS``); an exception whose ``str()``
        raises is recorded with its type only. An errback's error (``response`` is then
        a failure) is not recorded: its request is acknowledged."""
        if isinstance(response, Response) and response.request is not None:
            try:
                message = str(failure.value)
            except Exception:  # its __str__ raised (it acknowledged the request)
                message = "(its message could not be read: str() of it raised)"
            reason = f"{failure.type.__name__ if failure.type else 'Error'}: {message}"
            self.deliveries.record_failure(response.request, reason)

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


def __getattr__(name: str) -> object:
    """``scrapy_dist.scheduler.UnleasedScheduler`` (defined in :mod:`scrapy_dist.unleased`,
    which imports this module)."""
    if name == "UnleasedScheduler":
        from scrapy_dist.unleased import UnleasedScheduler

        return UnleasedScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
