"""The Redis scheduler: Scrapy's scheduler interface over a shared frontier.

Every worker of a crawl enqueues into and dequeues from the same Redis queue.
Dedupe and enqueue are one atomic server-side step (``lua/enqueue.lua``), so a
fingerprint is never recorded for a request that is not queued. Workers register in
the crawl's worker registry; with ``SCHEDULER_PERSIST = False`` the shared keys are
deleted only by the last live worker to leave, never by one that stops early.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

import redis
from scrapy.core.scheduler import BaseScheduler
from scrapy.utils.misc import load_object
from twisted.internet.task import LoopingCall

from scrapy_dist import deadletter
from scrapy_dist.addon import settings_for
from scrapy_dist.connection import check, client_for, describe
from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.dupefilter import RFPDupeFilter
from scrapy_dist.exceptions import ConfigurationError, SerializationError
from scrapy_dist.keys import keys_for
from scrapy_dist.queue import RedisQueue
from scrapy_dist.serializers import RequestCodec, Serializer, load_serializer
from scrapy_dist.workers import WorkerRegistry, new_worker_id

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class Scheduler(BaseScheduler):
    """A Scrapy scheduler whose queue and dupefilter are shared through Redis.

    Args:
        queue: the shared request queue.
        dupefilter: the crawl's dupefilter; an :class:`RFPDupeFilter` dedupes inside
            the enqueue script, any other is asked first, locally.
        serializer: turns request dicts into bytes.
        registry: this worker's handle on the crawl's worker registry.
        dead: the crawl's dead-letter list.
        stats: the crawler's stats collector.
        persist: keep the queue and dupefilter when the crawl ends.
        flush_on_start: clear the queue and dupefilter at open if no other worker runs.
        idle_before_close: seconds to keep reporting pending work after the queue was
            last seen non-empty.
        prefetch: requests taken from Redis per call.
        heartbeat_interval: seconds between registry heartbeats.
    """

    def __init__(
        self,
        *,
        queue: RedisQueue,
        dupefilter: BaseDupeFilter,
        serializer: Serializer,
        registry: WorkerRegistry,
        dead: DeadLetters,
        stats: StatsCollector,
        persist: bool = False,
        flush_on_start: bool = False,
        idle_before_close: float = 0.0,
        prefetch: int = 1,
        heartbeat_interval: float = 5.0,
    ) -> None:
        if prefetch < 1:
            raise ConfigurationError(f"SCHEDULER_PREFETCH must be at least 1, not {prefetch}")
        if idle_before_close < 0:
            raise ConfigurationError(
                f"SCHEDULER_IDLE_BEFORE_CLOSE cannot be negative ({idle_before_close})"
            )
        if registry.timeout < 2 * heartbeat_interval:
            raise ConfigurationError(
                f"SCHEDULER_WORKER_TIMEOUT ({registry.timeout}s) must be at least twice "
                f"SCHEDULER_HEARTBEAT_INTERVAL ({heartbeat_interval}s)"
            )
        self.queue = queue
        self.df = dupefilter
        self.serializer = serializer
        self.registry = registry
        self.dead = dead
        self.stats = stats
        self.persist = persist
        self.flush_on_start = flush_on_start
        self.idle_before_close = idle_before_close
        self.prefetch = prefetch
        self.heartbeat_interval = heartbeat_interval
        #: The dupefilter, when its test-and-set runs inside the enqueue script.
        self._shared_df = dupefilter if isinstance(dupefilter, RFPDupeFilter) else None
        self.spider: Spider | None = None
        self._codec: RequestCodec | None = None
        self._buffer: deque[tuple[bytes, Request]] = deque()
        self._last_work = 0.0
        self._logunser = True
        self._heartbeat = LoopingCall(self._beat)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = settings_for(crawler)
        client = client_for(crawler)
        keys = keys_for(crawler)
        queue_cls = load_object(settings["SCHEDULER_QUEUE_CLASS"])
        if not (isinstance(queue_cls, type) and issubclass(queue_cls, RedisQueue)):
            raise ConfigurationError(
                f"SCHEDULER_QUEUE_CLASS {settings['SCHEDULER_QUEUE_CLASS']!r} is not a "
                "scrapy_dist.queue.RedisQueue subclass (FifoQueue, LifoQueue, PriorityQueue)"
            )
        dupefilter_cls = load_object(settings["DUPEFILTER_CLASS"])
        dupefilter: BaseDupeFilter = dupefilter_cls.from_crawler(crawler)
        frontier = [keys.requests, keys.seq]
        if isinstance(dupefilter, RFPDupeFilter):
            frontier += dupefilter.backend.keys()
        worker_id = new_worker_id()
        return cls(
            queue=queue_cls(client, keys.requests, keys.seq),
            dupefilter=dupefilter,
            serializer=load_serializer(settings.get("SCHEDULER_SERIALIZER")),
            registry=WorkerRegistry(
                client,
                keys.workers,
                worker_id,
                timeout=settings.getfloat("SCHEDULER_WORKER_TIMEOUT"),
                frontier=frontier,
            ),
            dead=DeadLetters(client, keys.dead, worker_id),
            stats=crawler.stats,
            persist=settings.getbool("SCHEDULER_PERSIST"),
            flush_on_start=settings.getbool("SCHEDULER_FLUSH_ON_START"),
            idle_before_close=settings.getfloat("SCHEDULER_IDLE_BEFORE_CLOSE"),
            prefetch=settings.getint("SCHEDULER_PREFETCH"),
            heartbeat_interval=settings.getfloat("SCHEDULER_HEARTBEAT_INTERVAL"),
        )

    def open(self, spider: Spider) -> None:
        """Check Redis, join the crawl's worker registry and start heartbeats.

        Raises:
            RedisUnavailable: Redis cannot be reached.
            ConfigurationError: the queue key holds a type this queue cannot use.
        """
        self.spider = spider
        self._codec = RequestCodec(self.serializer, spider)
        check(self.queue.client)
        self.queue.check_type()
        if self._shared_df is None:
            logger.warning(
                "DUPEFILTER_CLASS %(cls)s is not Redis-backed: each worker filters only "
                "what it saw itself, so workers will crawl the same pages. Use "
                "scrapy_dist.dupefilter.RFPDupeFilter.",
                {"cls": type(self.df).__name__},
                extra={"spider": spider},
            )
        others, flushed = self.registry.join(flush=self.flush_on_start)
        if flushed:
            logger.info(
                "Flushed crawl %(crawl)s (SCHEDULER_FLUSH_ON_START)",
                {"crawl": self.registry.key},
                extra={"spider": spider},
            )
        elif self.flush_on_start:
            logger.warning(
                "SCHEDULER_FLUSH_ON_START is set but %(n)d other worker(s) of this crawl "
                "are running: joining their crawl instead of flushing it",
                {"n": others},
                extra={"spider": spider},
            )
        logger.info(
            "Worker %(worker)s joined the crawl at %(server)s (queue %(queue)s: %(size)d "
            "requests; %(others)d other worker(s))",
            {
                "worker": self.registry.worker_id,
                "server": describe(self.queue.client),
                "queue": self.queue.key,
                "size": len(self.queue),
                "others": others,
            },
            extra={"spider": spider},
        )
        self._heartbeat.start(self.heartbeat_interval, now=False)
        self.df.open()

    def close(self, reason: str) -> None:
        """Hand back buffered requests, leave the registry, and delete the shared keys
        if this was the last worker and the crawl does not persist."""
        if self._heartbeat.running:
            self._heartbeat.stop()
        try:
            self._return_buffer()
            remaining, cleared = self.registry.leave(clear=not self.persist)
        except redis.RedisError as e:
            logger.error(
                "Could not leave the crawl cleanly, Redis failed: %(error)s",
                {"error": e},
                extra={"spider": self.spider},
            )
        else:
            if cleared:
                logger.info(
                    "Last worker of the crawl left: deleted its queue and dupefilter "
                    "(SCHEDULER_PERSIST is off)",
                    extra={"spider": self.spider},
                )
            elif not self.persist:
                logger.info(
                    "%(n)d worker(s) still running: the shared queue and dupefilter stay",
                    {"n": remaining},
                    extra={"spider": self.spider},
                )
        self.df.close(reason)

    def enqueue_request(self, request: Request) -> bool:
        """Store ``request`` in the shared queue unless it is a duplicate.

        Returns ``True`` if the request was queued, ``False`` if it was filtered as a
        duplicate or cannot be stored (Scrapy then fires ``request_dropped``). A request
        that cannot be serialized is logged, counted as ``scheduler/unserializable``,
        recorded in the dead-letter list, and not marked as seen.
        """
        assert self._codec is not None, "scheduler not open"
        assert self.spider is not None
        try:
            payload = self._codec.encode(request)
        except SerializationError as e:
            self._unserializable(request, e)
            return False
        shared = self._shared_df
        fingerprint = b""
        if request.dont_filter:
            pass
        elif shared is not None:
            fingerprint = shared.fingerprint(request)
            if shared.seen_locally(fingerprint):
                self.df.log(request, self.spider)
                return False
        elif self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        item = (payload, self.queue.score(request), fingerprint)
        [queued] = self.queue.push([item], shared.backend if shared is not None else None)
        if fingerprint and shared is not None:
            shared.remember(fingerprint)
        if not queued:
            self.df.log(request, self.spider)
            return False
        self.stats.inc_value("scheduler/enqueued/redis")
        self.stats.inc_value("scheduler/enqueued")
        return True

    def next_request(self) -> Request | None:
        """Return the next request for this worker, or ``None`` if the queue is empty."""
        if not self._buffer:
            self._refill()
        if not self._buffer:
            return None
        _, request = self._buffer.popleft()
        self.stats.inc_value("scheduler/dequeued/redis")
        self.stats.inc_value("scheduler/dequeued")
        return request

    def has_pending_requests(self) -> bool:
        if self._buffer or len(self.queue) > 0:
            self._last_work = time.monotonic()
            return True
        return time.monotonic() - self._last_work < self.idle_before_close

    def __len__(self) -> int:
        return len(self._buffer) + len(self.queue)

    def _refill(self) -> None:
        """Take up to ``prefetch`` requests from Redis; entries that cannot be rebuilt go
        to the dead-letter list, and taking continues until one can or the queue is empty."""
        assert self._codec is not None
        while not self._buffer:
            payloads = self.queue.pop(self.prefetch)
            if not payloads:
                return
            for payload in payloads:
                try:
                    request = self._codec.decode(payload)
                except SerializationError as e:
                    self._undecodable(payload, e)
                else:
                    self._buffer.append((payload, request))
        self._last_work = time.monotonic()

    def _undecodable(self, payload: bytes, error: SerializationError) -> None:
        logger.error(
            "Dropped a queued request that cannot be rebuilt (%(error)s); it is in %(dead)s",
            {"error": error, "dead": self.dead.key},
            extra={"spider": self.spider},
        )
        self.dead.add(deadletter.REQUEST, str(error), payload)
        self.stats.inc_value("scheduler/undecodable")

    def _return_buffer(self) -> None:
        """Push requests taken from Redis but not handed to Scrapy back to the queue."""
        if not self._buffer:
            return
        items = [(payload, self.queue.score(request), b"") for payload, request in self._buffer]
        self.queue.push(items)
        logger.info(
            "Returned %(n)d prefetched request(s) to the shared queue",
            {"n": len(items)},
            extra={"spider": self.spider},
        )
        self._buffer.clear()

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
        self.dead.add(
            deadletter.REQUEST, f"unserializable: {error}", repr(request), url=request.url
        )

    def _beat(self) -> None:
        try:
            self.registry.heartbeat()
        except redis.RedisError as e:
            logger.warning(
                "Heartbeat to Redis failed: %(error)s",
                {"error": e},
                extra={"spider": self.spider},
            )
