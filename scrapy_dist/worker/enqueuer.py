"""The way in: from a request Scrapy schedules to an entry in the crawl's shared queue.

A request is dropped before any round trip when it is a known duplicate (this worker's
seen-cache of the shared dupefilter, or a local dupefilter) or when its crawl is gone.
A request that cannot be stored in Redis is kept in this worker's memory, as Scrapy's
scheduler keeps what its disk queue cannot take (:mod:`scrapy_dist.worker.local`: warned
about once, counted as ``scheduler/unserializable`` and ``scheduler/enqueued/memory``;
its fingerprint is recorded in the shared dupefilter first, one round trip). Otherwise
it is handed to the frontier, which sends it with the next batch; the dedupe and the
push are then one server-side step.

Start requests of a plain spider (``SCHEDULER_START_ONCE``) are crawled once per run
of the crawl: each worker adds a start request's fingerprint to the run's set of start
requests (``<crawl>:starts``, cleared by ``lua/join.lua`` when a run starts or a worker
joins alone); the one whose add Redis answers "new" queues the request unfiltered (not
recorded in the dupefilter, as on Scrapy's scheduler), the others drop theirs.
Redis's answer decides, so the order in which the workers joined does not matter. The
n-th start request of one fingerprint claims ``<fingerprint>:<n>``: a spider that starts
one URL twice crawls it twice, as on Scrapy's scheduler. The claim covers the start
request itself only: the request queued is marked (``meta[START_CLAIMED]``), and a
retry, redirect or any copy of it carries the mark and is scheduled as any request.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy import signals

from scrapy_dist import deadletter
from scrapy_dist.exceptions import SerializationError
from scrapy_dist.frontier.shards import host_of
from scrapy_dist.spiders import RedisSpiderMixin

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.signalmanager import SignalManager
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.deadletter import DeadLetters
    from scrapy_dist.dupefilter import RFPDupeFilter
    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.serializers import RequestCodec

logger = logging.getLogger(__name__)

#: ``meta`` key of a start request this worker claimed for the run
#: (``SCHEDULER_START_ONCE``): its copies (retries, redirects) are not claimed again.
START_CLAIMED = "scrapy_dist_start_claimed"


class Enqueuer:
    """Sends one spider's requests to the crawl's shared queue.

    Args:
        frontier: the crawl's frontier, which batches the writes.
        dupefilter: the crawl's dupefilter.
        shared_df: the dupefilter, when its test-and-set runs inside the enqueue script
            (``None``: the dupefilter is asked locally, with ``request_seen``).
        dead: the crawl's dead-letter list.
        stats: the crawler's stats collector.
        codec: turns the spider's requests into bytes.
        spider: the spider whose requests these are.
        start_once: crawl a plain spider's start requests once per run of the crawl.
        parent_of: the lease id of the request whose callback returned a request
            (``""``: none); Redis refuses the request once this worker no longer
            holds that lease.
        claimed_elsewhere: called when another worker of the run claimed a start
            request of this one (it queues it with its next flush).
        signals: the crawler's signals, to send ``request_dropped`` for a duplicate
            Redis finds after :meth:`enqueue` returned (Scrapy's engine sends it for
            those :meth:`enqueue` refuses).
        keep_local: keeps a request that cannot be stored in Redis in this worker's
            memory (``None``: it is dead-lettered instead).
    """

    def __init__(
        self,
        frontier: CrawlFrontier,
        dupefilter: BaseDupeFilter,
        *,
        shared_df: RFPDupeFilter | None,
        dead: DeadLetters,
        stats: StatsCollector,
        codec: RequestCodec,
        spider: Spider,
        start_once: bool,
        parent_of: Callable[[Request], str] = lambda request: "",
        claimed_elsewhere: Callable[[], None] = lambda: None,
        signals: SignalManager | None = None,
        keep_local: Callable[[Request], None] | None = None,
    ) -> None:
        self.frontier = frontier
        self.df = dupefilter
        self.shared_df = shared_df
        self.dead = dead
        self.stats = stats
        self.codec = codec
        self.spider = spider
        self.start_once = start_once
        self.parent_of = parent_of
        self.claimed_elsewhere = claimed_elsewhere
        self.signals = signals
        self.keep_local = keep_local
        self._logunser = True
        #: Start requests of each fingerprint this worker claimed or lost so far.
        self._starts: dict[bytes, int] = {}

    def enqueue(self, request: Request) -> bool:
        """Send ``request`` unless it is a known duplicate (see the module docstring).

        Returns:
            ``False`` if the request is a duplicate known before sending (or, when
            every write is sent at once, Redis's answer) or cannot be stored; else
            ``True``: duplicates Redis finds in a batch are logged and counted as
            ``dupefilter/filtered`` when it answers, and ``request_dropped`` is sent
            for them then.
        """
        if self.frontier.lost is not None:
            # produced by a request of a crawl that is gone: it must not start another
            self.stats.inc_value("scheduler/crawl_lost/dropped_requests")
            return False
        shared = self.shared_df
        fingerprint = b""
        dont_filter = request.dont_filter
        if dont_filter and shared is not None and self._once_per_crawl(request):
            claimed = self._claim_start(shared, request)
            if not claimed:
                if claimed is not None:  # another worker of this run queues it
                    self.df.log(request, self.spider)
                    self.claimed_elsewhere()
                return False
        if shared is not None and not dont_filter:
            fingerprint = shared.fingerprint(request)
            if shared.seen_locally(fingerprint):  # known duplicate: not even serialized
                self.df.log(request, self.spider)
                return False
        try:
            payload = self.codec.encode(request)
        except SerializationError as e:
            return self.keep_in_memory(request, e, fingerprint=fingerprint)
        # a local dupefilter records what it is asked about: ask only once it can be stored
        if shared is None and not dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        outcome: list[bool] = []
        returned = False

        def on_reply(queued: bool) -> None:
            outcome.append(queued)
            if fingerprint and shared is not None:
                shared.remember(fingerprint, queued)  # recorded in Redis either way
            if not queued:
                self.df.log(request, self.spider)
                if returned:  # Scrapy was told it was stored: tell what the engine would
                    self._dropped(request)
                return
            self.stats.inc_value("scheduler/enqueued/redis")
            self.stats.inc_value("scheduler/enqueued")

        item = (payload, self.frontier.queue.score(request), fingerprint)
        self.frontier.enqueue(
            item,
            shared.backend if shared else None,
            on_reply,
            self.parent_of(request),
            host=host_of(request) if self.frontier.shard_count > 1 else "",
        )
        # batched (the default): Redis answers at the next flush, so duplicates it finds
        # are logged and counted then, and Scrapy is told the request was stored
        returned = True
        return outcome[0] if outcome else True

    def _dropped(self, request: Request) -> None:
        """Send ``request_dropped`` for ``request``, as Scrapy's engine does for a request
        its scheduler refuses."""
        if self.signals is not None:
            self.signals.send_catch_log(
                signals.request_dropped, request=request, spider=self.spider
            )

    def _once_per_crawl(self, request: Request) -> bool:
        """Whether ``request`` is a start request Scrapy marked ``dont_filter`` that
        the crawl's workers should crawl once between them (``SCHEDULER_START_ONCE``):
        the start requests of a spider that does not read its seeds from Redis."""
        return (
            self.start_once
            and bool(request.meta.get("is_start_request"))
            and START_CLAIMED not in request.meta
            and not isinstance(self.spider, RedisSpiderMixin)
        )

    def _claim_start(self, shared: RFPDupeFilter, request: Request) -> bool | None:
        """Add a start request's fingerprint to the run's start requests: Redis's answer
        decides which worker queues it. As on Scrapy's scheduler, a ``dont_filter``
        start request is not recorded in the dupefilter (a link back to it is crawled
        once more).

        Returns:
            ``True`` if this worker is the first of the run to add it (it queues the
            request unfiltered), ``False`` if another worker did, ``None`` if Redis
            cannot be reached (the request is not stored: Scrapy drops it, and the
            worker's next start issues it again).
        """
        fingerprint = shared.fingerprint(request)
        nth = self._starts.get(fingerprint, 0) + 1
        claim = fingerprint if nth == 1 else fingerprint + b":%d" % nth
        key, client = self.frontier.keys.starts, self.frontier.client
        added = self.frontier.call(lambda: client.sadd(key, claim))
        if added is None:
            return None
        self._starts[fingerprint] = nth
        if added:
            request.meta[START_CLAIMED] = True
        return bool(added)

    def keep_in_memory(
        self,
        request: Request,
        error: SerializationError,
        *,
        fingerprint: bytes = b"",
        deduped: bool = False,
    ) -> bool:
        """Keep a request that cannot be stored in Redis in memory, unless it is a
        duplicate (its fingerprint is recorded in the crawl's dupefilter first: one
        round trip; Redis unreachable, it is kept). ``deduped``: the caller has asked
        the dupefilter already.

        Returns:
            Whether it was kept (``False``: a duplicate, or dead-lettered with no
            memory to keep it in).
        """
        if self.keep_local is None:
            self.unserializable(request, error)
            return False
        if not (deduped or request.dont_filter or self._new_here(request, fingerprint)):
            self.df.log(request, self.spider)
            return False
        if self._logunser:
            logger.warning(
                "Unable to serialize request: %(request)s - reason: %(reason)s - it is "
                "kept in this worker's memory and crawled by this worker alone, as "
                "Scrapy's scheduler keeps what its disk queue cannot take (no more "
                "unserializable requests will be logged; see the stat "
                "'scheduler/unserializable')",
                {"request": request, "reason": error},
                extra={"spider": self.spider},
            )
            self._logunser = False
        self.stats.inc_value("scheduler/unserializable")
        self.stats.inc_value("scheduler/enqueued/memory")
        self.stats.inc_value("scheduler/enqueued")
        self.keep_local(request)
        return True

    def _new_here(self, request: Request, fingerprint: bytes) -> bool:
        """Record ``request``'s fingerprint in the crawl's dupefilter now (it will not
        reach the enqueue script): whether it was new (or Redis could not say)."""
        shared = self.shared_df
        if shared is None:
            return not self.df.request_seen(request)
        fingerprint = fingerprint or shared.fingerprint(request)
        ((backend, _),) = self.frontier.by_filter(shared.backend, [request])  # its shard's
        new = self.frontier.call(lambda: backend.add(fingerprint))
        if new is None:
            return True  # Redis unreachable: crawled, at worst twice
        shared.remember(fingerprint, new)
        return bool(new)

    def unserializable(self, request: Request, error: SerializationError) -> None:
        """Log (once), count and dead-letter a request that cannot be serialized."""
        if self._logunser:
            logger.error(
                "Unable to serialize request: %(request)s - reason: %(reason)s - it is "
                "recorded in %(dead)s and will not be crawled (no more unserializable "
                "requests will be logged; see the stat 'scheduler/unserializable'). "
                "Requests are JSON: put plain values in meta and cb_kwargs (dict(item), "
                "not an Item), or opt in to pickle with SCHEDULER_SERIALIZER = "
                "'scrapy_dist.picklecompat' on a Redis nobody else can write to",
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
