"""Spiders that read their seeds from Redis and wait for more.

``RedisSpider`` and ``RedisCrawlSpider`` read seeds from the crawl's seeds key (a list by
default; a set or sorted set by setting) in batches of ``redis_batch_size``. Seeds are
leased like requests: a seed leaves Redis only once the requests made from it are
enqueued (or it was recorded as invalid), so a worker killed mid-batch loses none.

Seeds are fetched at start (unless the spider defines its own ``start_requests()`` or
``start()``: then those are its start requests), whenever the worker has spare capacity
and nothing queued (Scrapy's ``scheduler_empty`` signal, rate-limited), and when it is
idle (``spider_idle``, where the spider refuses to close with
:class:`~scrapy.exceptions.DontCloseSpider`). While idle, the worker looks for new work in
Redis every ``SCHEDULER_IDLE_POLL`` seconds (after five minutes without work, backing off
to ``SCHEDULER_IDLE_POLL_MAX``), so requests queued by other workers, expired leases and
seeds pushed by a user start within about a second. A worker closes after
``MAX_IDLE_TIME_BEFORE_CLOSE`` seconds of real idleness (measured from the last moment it
had work; ``0`` waits forever), though not while workers that stopped beating hold
leases (:class:`~scrapy_dist.worker.membership.CloseWait`: it takes them when they
expire), or, with ``CLOSE_WHEN_CRAWL_DONE``, once the crawl as a whole is finished.

A seed that cannot become a request is logged with the reason, counted
(``seeds/invalid``) and appended to the crawl's dead-letter list; the rest of its batch
is still processed.

Over ~500 lines on purpose: :class:`RedisSpiderMixin` is scrapy-redis's spider API in one
class (users subclass it and override its hooks: ``start_requests``, ``next_requests``,
``make_request_from_data``, ``schedule_next_requests``, ``spider_idle``), and its seed
reading and idle handling share one state (when seeds were last polled, when the worker
last had work).
"""

from __future__ import annotations

import codecs
import logging
import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from scrapy import Request, Spider, signals
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.spiders import CrawlSpider

from scrapy_dist import deadletter
from scrapy_dist.assembly import assemble
from scrapy_dist.config.components import check_seed_batch_size
from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.exceptions import (
    ConfigurationError,
    InvalidSeed,
    InvalidSpiderAttribute,
)
from scrapy_dist.frontier.choice import frontier_for
from scrapy_dist.frontier.wire import DEAD_NOW, DONE
from scrapy_dist.queue import unleased_queue
from scrapy_dist.seeds import SeedQueue, parse_seed, request_from_seed
from scrapy_dist.worker import engine as _engine
from scrapy_dist.worker.control import ControlWatcher
from scrapy_dist.worker.membership import CloseWait
from scrapy_dist.worker.startup import fail_start, raise_if_failed, start_failure

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable

    from scrapy.crawler import Crawler
    from twisted.internet.task import LoopingCall
    from typing_extensions import Self

    from scrapy_dist.frontier.core import Lease


logger = logging.getLogger(__name__)

#: Shortest and longest pause between seed polls while seeds keep coming back empty.
SEED_POLL_MIN, SEED_POLL_MAX = 0.05, 0.25
#: Seconds between checks whether an idle worker is due to look for work (no I/O).
TICK = 0.1
#: Seconds without work after which the pause may grow to ``SCHEDULER_IDLE_POLL_MAX``.
IDLE_LONG = 300.0
#: Seconds between two looks, by an idle worker under Redis Cluster, for seeds pushed to
#: the crawl's seeds key without its hash tag (warned of while it waits).
UNTAGGED_WARN_EVERY = 60.0
#: Most seeds one call may lease (``redis_batch_size``): a batch is popped by one
#: server-side step, which blocks Redis for every worker while it runs, and becomes
#: requests in this worker's memory at once; far larger counts Redis refuses outright.
BATCH_SIZE_MAX = 100_000


class RedisSpiderMixin(Spider):
    """Reads seeds from Redis; see the module docstring for when.

    Class attributes a spider may set (each falls back to its setting):
    ``redis_key`` (a key template, default ``REDIS_START_URLS_KEY``; or a list of
    them, read in that order: a key is read only while the ones before it are empty),
    ``redis_batch_size`` (at most :data:`BATCH_SIZE_MAX`), ``redis_encoding``,
    ``max_idle_time``.
    """

    redis_key: str | list[str] | None = None
    redis_batch_size: int | None = None
    redis_encoding: str | None = None
    max_idle_time: float | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        """The spider, set up for Redis; an invalid Redis attribute is a start-up
        failure (one ERROR line, the crawl exits 1), not a traceback."""
        spider = super().from_crawler(crawler, *args, **kwargs)
        try:
            spider.setup_redis(crawler)
        except InvalidSpiderAttribute as e:
            fail_start(crawler, "configuration_error", f"Cannot start: {e}", spider)
        return spider

    def setup_redis(self, crawler: Crawler | None = None) -> None:
        """Check the spider's own attributes (``-a`` arguments arrive as strings) and
        connect the signals; no settings, no I/O.

        Scrapy creates the spider before it applies add-ons, so everything that needs
        settings is set up by :meth:`open_redis` once they are final (at
        ``spider_opened``).

        Raises:
            ValueError: no crawler (:class:`ValueError`, as scrapy-redis's), or an
                invalid attribute (:class:`~scrapy_dist.exceptions.InvalidSpiderAttribute`,
                which :meth:`from_crawler` reports as a start-up failure, see
                :mod:`scrapy_dist.worker.startup`).
        """
        if getattr(self, "_redis_set_up", False):
            return  # a second call does nothing (scrapy-redis's contract)
        crawler = crawler or getattr(self, "crawler", None)
        if crawler is None:
            raise ValueError("crawler is required")
        self._redis_set_up = True
        self._redis_open = False
        self._idle_ticker: LoopingCall | None = None
        self._idle_since: float | None = None
        self._next_poll = 0.0
        self._poll_pause = SEED_POLL_MIN
        self._next_wake = 0.0
        #: When the scheduler last had nothing for this worker (None: it had work since).
        self._starved_since: float | None = None
        #: When an idle worker next looks for seeds pushed to the untagged key.
        self._untagged_next = 0.0
        crawler.signals.connect(self._on_scheduler_empty, signal=signals.scheduler_empty)
        crawler.signals.connect(self._on_activity, signal=signals.request_reached_downloader)
        crawler.signals.connect(self._on_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._on_closed, signal=signals.spider_closed)
        # the public hook, so a spider that overrides spider_idle() is called (as in
        # scrapy-redis)
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)
        self._check_attributes()

    def start_requests(self) -> Iterable[Request]:
        """One batch of seed requests (scrapy-redis's entry point; Scrapy >= 2.13 calls
        :meth:`start`, which also waits for the requests to be enqueued before it
        acknowledges their seeds)."""
        return self.next_requests()

    def _check_attributes(self) -> None:
        """Coerce the Redis attributes a spider argument may set, or explain why not.

        Raises:
            InvalidSpiderAttribute: a value of the wrong kind.
        """
        keys = self.redis_key if isinstance(self.redis_key, (list, tuple)) else [self.redis_key]
        if self.redis_key is not None and (
            not keys or not all(isinstance(k, str) and k.strip() for k in keys)
        ):
            empty = " (a list of keys empty after normalization)" if not keys else ""
            raise InvalidSpiderAttribute(
                f"spider attribute redis_key={self.redis_key!r} must be a non-empty key "
                f"name or template such as '%(name)s:start_urls'{empty}"
            )
        self.redis_batch_size = _number(
            self.redis_batch_size, "redis_batch_size", int, 1, most=BATCH_SIZE_MAX
        )
        self.max_idle_time = _number(self.max_idle_time, "max_idle_time", float, 0.0)
        if self.redis_encoding is not None:
            try:
                codecs.lookup(str(self.redis_encoding))
            except LookupError as e:
                raise InvalidSpiderAttribute(
                    f"spider attribute redis_encoding={self.redis_encoding!r} is not a "
                    "known text encoding"
                ) from e

    def open_redis(self) -> None:
        """Set up from the crawler's final settings (idempotent; no I/O): the frontier
        and its keys (named after this spider instance and its ``redis_key``), batch
        size, idle handling. Runs at ``spider_opened``, or when first needed; not
        after a failed start.

        Raises:
            RuntimeError: the settings are not final yet.
        """
        if self._redis_open or self._failed:
            return
        crawler = self.crawler
        config = assemble(crawler).config
        self.frontier = frontier_for(crawler)
        self.seeds = self.frontier.seeds
        #: One seed queue per key of ``redis_key``, in priority order (the frontier's
        #: own seeds key first).
        self.seed_queues = [self.seeds] + [
            SeedQueue(self.frontier.client, self.frontier.keys.start_urls_key(t), self.seeds.kind)
            for t in (self.redis_key[1:] if isinstance(self.redis_key, (list, tuple)) else [])
        ]
        #: The seeds key last read.
        self._seeds_read = self.seeds.key
        #: The seeds key(s), expanded (scrapy-redis's attribute).
        self.redis_key = (
            [q.key for q in self.seed_queues]
            if isinstance(self.redis_key, (list, tuple))
            else self.seeds.key
        )
        #: Seeds that do not say ``dont_filter`` get this (``REDIS_START_URLS_DONT_FILTER``).
        self.seeds_dont_filter = config.seeds.dont_filter
        #: scrapy-redis's JSON seeds: unknown fields are form data
        #: (``REDIS_START_URLS_EXTRA_FORMDATA``).
        self.seeds_extra_formdata = config.seeds.extra_formdata
        self.redis_batch_size = int(self.redis_batch_size or config.seeds.batch_size)
        self.redis_encoding = self.redis_encoding or config.seeds.encoding
        self.seed_allowed_meta = config.seeds.allowed_meta
        spider = config.spider
        if self.max_idle_time is None:
            self.max_idle_time = spider.max_idle_time
        self.close_when_done = spider.close_when_done
        self.done_grace = spider.done_grace
        # an unleased (scrapy-redis style) queue is invisible to the crawl's progress:
        # never delete the crawl's keys on its account
        self.persist = spider.persist or unleased_queue(config.queue.cls)
        self.idle_poll = spider.idle_poll
        self.idle_poll_max = spider.idle_poll_max
        self._wake_pause = self.idle_poll
        frontier = self.frontier
        self.dead_letters = DeadLetters(frontier.client, frontier.keys.dead, frontier.worker_id)
        #: The crawl's control state: no seeds are read while it is paused or draining.
        self._control = ControlWatcher.for_frontier(frontier)
        #: What a worker about to idle out waits for (workers killed holding leases).
        self._close_wait = CloseWait(frontier, config.workers.heartbeat_interval, live_too=False)
        self._redis_open = True
        check_seed_batch_size(self.redis_batch_size)

    @property
    def server(self) -> redis.Redis:
        """The crawl's Redis client (scrapy-redis's attribute); reading it sets the
        spider up from the final settings if it is not yet (see :meth:`open_redis`)."""
        self.open_redis()
        return self.frontier.client

    @property
    def _failed(self) -> bool:
        return start_failure(getattr(self, "crawler", None)) is not None

    async def start(self) -> AsyncIterator[Any]:
        """Yield the requests of the seeds waiting in Redis now; later ones are fetched
        as the worker has room (see the module docstring). A spider that defines its
        own ``start_requests()`` gets what that yields instead (each worker yields it;
        the shared dupefilter keeps one of each request that does not say
        ``dont_filter``), and its seeds only as it has room. Nothing if the start
        failed. (A spider that defines its own ``start()`` gets that, from Scrapy.)
        """
        if self._failed:
            return
        if type(self).start_requests is not RedisSpiderMixin.start_requests:
            # the spider's own start requests, as scrapy-redis (and Scrapy < 2.13)
            # crawl them; seeds come as the worker has room and when it is idle
            for request in self.start_requests():
                yield request
            return
        if self._own_next_requests():
            for request in self._from_own_next_requests():
                yield request
            return
        requests, settled = self.take_seeds()
        for request in requests:
            yield request
        # the engine enqueued each request before asking for the next item
        self.frontier.settle(settled)

    def make_request_from_data(self, data: bytes) -> Request | Iterable[Request] | None:
        """Turn one raw seed into a request (see :mod:`scrapy_dist.seeds` for the formats).

        Override to read another format; raise :class:`~scrapy_dist.exceptions.InvalidSeed`
        (or any exception) to send the seed to the dead-letter list, return ``None`` to
        skip it.
        """
        self.open_redis()
        seed = parse_seed(
            data,
            self.redis_encoding or "utf-8",
            allowed_meta=self.seed_allowed_meta,
            extra_as_formdata=self.seeds_extra_formdata,
        )
        if seed.dont_filter is None:
            seed = replace(seed, dont_filter=self.seeds_dont_filter)
        return request_from_seed(seed, self)

    def take_seeds(self) -> tuple[list[Request], list[tuple[str, str]]]:
        """Lease one batch of seeds and build their requests.

        Returns:
            The requests, and the settlements of the seed leases, to pass to
            ``self.frontier.settle()`` once the requests are enqueued. Bad seeds are
            already in the dead-letter list.
        """
        self.open_redis()
        leases = self._reserve_seeds()
        requests: list[Request] = []
        settled: list[tuple[str, str]] = []
        for lease in leases:
            try:
                result = self.make_request_from_data(lease.data)
                if result is None:
                    self.crawler.stats.inc_value("seeds/skipped")
                else:
                    requests += [result] if isinstance(result, Request) else list(result)
            except Exception as e:  # a bad seed must not take its batch down
                settled.append((lease.id, self._reject_seed(lease.data, e)))
            else:
                settled.append((lease.id, DONE))
        if leases:
            self.crawler.stats.inc_value("seeds/fetched", len(leases))
            logger.debug(
                "Read %(n)d seed(s) from %(key)s",
                {"n": len(leases), "key": self._seeds_read},
                extra={"spider": self},
            )
        return requests, settled

    def _reserve_seeds(self) -> list[Lease]:
        """Lease a batch of seeds from the first key of ``redis_key`` that has any.

        A seed handed back or expired returns to the first key. None while the crawl is
        paused or draining (:mod:`scrapy_dist.control`).
        """
        assert self.redis_batch_size is not None
        leases: list[Lease] = []
        if self._control.holds():  # crawl control: paused or draining
            return leases
        for seeds in self.seed_queues:
            self._seeds_read = seeds.key
            leases = self.frontier.reserve(self.redis_batch_size, seeds=seeds)
            if leases:
                break
        return leases

    def next_requests(self) -> list[Request]:
        """Take one batch of seeds and return their requests (scrapy-redis's name).

        The seeds are settled at once, so use this only where the requests are enqueued
        right away; :meth:`schedule_next_requests` does both.
        """
        requests, settled = self.take_seeds()
        self.frontier.settle(settled)
        self.frontier.flush()
        return requests

    def _reject_seed(self, data: bytes, error: Exception) -> str:
        """Log and count a seed that cannot become a request.

        Returns:
            The settlement of its lease: dead-letter it with its record, in the same
            server-side step that settles the lease, so it is recorded exactly once.
        """
        if isinstance(error, InvalidSeed):
            reason = str(error)
        else:
            reason = f"{type(error).__name__}: {error}"
        logger.warning(
            "Invalid seed %(data)r: %(reason)s (kept in %(dead)s)",
            {"data": data[:200], "reason": reason, "dead": self.dead_letters.key},
            exc_info=not isinstance(error, InvalidSeed),
            extra={"spider": self},
        )
        self.crawler.stats.inc_value("seeds/invalid")
        record = self.dead_letters.record(deadletter.SEED, reason, data, key=self._seeds_read)
        return DEAD_NOW + record.decode("utf-8")

    def schedule_next_requests(self) -> int:
        """Take one batch of seeds and hand their requests to the engine; a spider that
        overrides :meth:`next_requests` (scrapy-redis's hook, e.g. to read its own
        Redis structure) gets what that returns instead, as in scrapy-redis.

        Returns:
            The number of requests scheduled; 0 if there were no seeds or Redis is
            unreachable (the caller polls again later).
        """
        if self._own_next_requests():
            own = self._from_own_next_requests()
            for request in own:
                self.crawler.engine.crawl(request)
            return len(own)
        requests, settled = self.take_seeds()
        for request in requests:
            self.crawler.engine.crawl(request)
        self.frontier.settle(settled)
        return len(requests)

    def _own_next_requests(self) -> bool:
        """Whether the spider overrides :meth:`next_requests` (then start-up, room for
        seeds and idleness call it, as scrapy-redis does)."""
        return type(self).next_requests is not RedisSpiderMixin.next_requests

    def _from_own_next_requests(self) -> list[Request]:
        """What the spider's own :meth:`next_requests` gives, as a list."""
        return list(self.next_requests() or ())

    def count_size(self, key: str) -> int:
        """The number of seeds in ``key`` in the seed mode (``LLEN``, ``SCARD`` or
        ``ZCARD``), scrapy-redis's helper for ``spider_idle`` and ``next_requests``
        overrides."""
        return len(SeedQueue(self.server, key, self.seeds.kind))

    def fetch_data(self, name: str, batch_size: int | None = None) -> list[bytes]:
        """Pop up to ``batch_size`` (default ``redis_batch_size``) raw seeds from ``name``
        in the seed mode, scrapy-redis's helper for ``next_requests`` overrides.

        Popped, not leased: a seed taken this way is lost if the worker dies before its
        request is enqueued. scrapy_dist's own path (:meth:`take_seeds`) leases them.
        """
        count = self.redis_batch_size if batch_size is None else batch_size
        return SeedQueue(self.server, name, self.seeds.kind).pop(int(count or 1))

    # -- signals --------------------------------------------------------------------

    def _on_opened(self, spider: Spider) -> None:
        if spider is not self or self._failed:
            return
        try:
            _engine.check_crawler(self.crawler)  # before the idle ticker wakes the engine
            self.open_redis()
        except ConfigurationError as e:
            fail_start(self.crawler, "configuration_error", f"Cannot start: {e}", self)
            return
        from twisted.internet.task import LoopingCall  # the reactor is installed by now

        self._idle_ticker = LoopingCall(self._idle_tick)
        self._idle_ticker.start(TICK, now=False)

    def _on_closed(self, spider: Spider) -> None:
        if spider is self and self._idle_ticker is not None and self._idle_ticker.running:
            self._idle_ticker.stop()

    def _on_activity(self, *_: Any, **__: Any) -> None:
        self._idle_since = None
        self._starved_since = None
        self._wake_pause = self.idle_poll

    def _idle_tick(self) -> None:
        """While the scheduler has nothing for this worker, wake the engine now and then
        so it looks in Redis for work (other workers' requests, expired leases, seeds)
        and, when idle, runs its idle handling: every ``SCHEDULER_IDLE_POLL`` seconds, and
        after five minutes without work with a pause doubling up to
        ``SCHEDULER_IDLE_POLL_MAX``."""
        if self._starved_since is None:
            return
        now = time.monotonic()
        if now < self._next_wake:
            return
        self._next_wake = now + self._wake_pause
        if now - self._starved_since > IDLE_LONG:
            self._wake_pause = min(self._wake_pause * 2, self.idle_poll_max)
        self.crawler.stats.inc_value("scheduler/idle/wakeups")
        _engine.wake(self.crawler.engine)

    def _on_scheduler_empty(self) -> None:
        if self._failed or not self._redis_open:
            return
        if self._starved_since is None:
            self._starved_since = time.monotonic()
        self._poll_seeds()

    def _poll_seeds(self) -> int:
        """Fetch a batch of seeds, unless the last look found none a moment ago (the
        pause doubles from ``SEED_POLL_MIN`` to ``SEED_POLL_MAX`` while none come), or
        a flush is in flight (``SCHEDULER_BACKGROUND_FLUSH``: a reserve would wait for
        it on the reactor thread; the next look after it lands does it).

        Returns:
            The number of requests scheduled.
        """
        now = time.monotonic()
        if now < self._next_poll or self.frontier.flying:
            return 0
        scheduled = self.schedule_next_requests()
        if scheduled:
            self._poll_pause = SEED_POLL_MIN
            self._next_poll = now
        else:
            self._next_poll = now + self._poll_pause
            self._poll_pause = min(self._poll_pause * 2, SEED_POLL_MAX)
        return scheduled

    def spider_idle(self) -> None:
        """``spider_idle``: fetch seeds; close when the crawl is finished (with
        ``CLOSE_WHEN_CRAWL_DONE``) or after ``max_idle_time``; otherwise stay open.
        A spider whose start failed closes with the failure's reason. A Redis error
        never closes the spider: it is logged, counted, and the spider stays open; so
        does a crawl found gone (the scheduler rejoins or closes it with its reason), and
        a crawl that is paused or draining (:mod:`scrapy_dist.control`).

        Raises:
            DontCloseSpider: the spider stays open.
            CloseSpider: the crawl is finished, or the start failed.
        """
        raise_if_failed(self.crawler)
        if self.frontier.lost is not None:
            raise DontCloseSpider
        if self._control.holds():  # paused or draining: never idle out, never "finished"
            self._idle_since = None
            raise DontCloseSpider
        try:
            self._idle()
        except redis.RedisError as e:
            logger.warning(
                "Redis error while idle, staying open: %(error)s",
                {"error": e},
                extra={"spider": self},
            )
            self.crawler.stats.inc_value("scheduler/idle/redis_errors")
            raise DontCloseSpider from e

    def _idle(self) -> None:
        if self._poll_seeds():
            self._idle_since = None
            raise DontCloseSpider
        self._warn_untagged_seeds()
        if not self.frontier.reachable:
            raise DontCloseSpider  # never give up on a crawl because Redis is away
        if self.close_when_done:
            progress = self.frontier.progress(grace=self.done_grace, clear=not self.persist)
            if progress is not None and progress.state == "finished":
                totals = self.frontier.totals()
                logger.info(
                    "Crawl %(crawl)s is finished: %(done)d requests and seeds completed, "
                    "%(retried)d retried, %(dead)d dead-lettered; closing",
                    {
                        "crawl": self.frontier.keys.crawl,
                        "done": totals.get("done", 0),
                        "retried": totals.get("retried", 0),
                        "dead": totals.get("dead", 0),
                    },
                    extra={"spider": self},
                )
                raise CloseSpider("crawl_finished")
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        idle = now - self._idle_since
        if self.max_idle_time and idle >= self.max_idle_time:
            if self._close_wait.holds(self):
                raise DontCloseSpider
            logger.info(
                "Idle for %(idle).1fs with no seeds in %(key)s (MAX_IDLE_TIME_BEFORE_CLOSE="
                "%(max)s): closing",
                {"idle": idle, "key": self.redis_key, "max": self.max_idle_time},
                extra={"spider": self},
            )
            return
        raise DontCloseSpider

    def _warn_untagged_seeds(self) -> None:
        """Under Redis Cluster the crawl's seeds key carries its hash tag
        (``{books}:start_urls``); seeds pushed to the untagged key (``books:start_urls``,
        as scrapy-redis's tutorials show) are never read: while this worker waits for
        seeds, say so, naming both keys, at most every :data:`UNTAGGED_WARN_EVERY`
        seconds (one length read on the untagged key's node each time)."""
        now = time.monotonic()
        if now < self._untagged_next:
            return
        self._untagged_next = now + UNTAGGED_WARN_EVERY
        keys = self.frontier.keys
        for seeds in self.seed_queues:
            untagged = keys.untagged(seeds.key)
            if untagged is None:
                continue
            waiting = len(SeedQueue(assemble(self.crawler).topology_client, untagged, seeds.kind))
            if waiting:
                logger.warning(
                    "%(n)d seed(s) wait in %(untagged)s, which this crawl does not read: "
                    "under Redis Cluster its keys carry the hash tag, so seeds go to "
                    "%(key)s (push them with 'scrapy-dist push %(spider)s', or to that key)",
                    {"n": waiting, "untagged": untagged, "key": seeds.key, "spider": self.name},
                    extra={"spider": self},
                )
                self.crawler.stats.set_value("seeds/untagged_waiting", waiting)

    #: The former name of :meth:`spider_idle`.
    _on_idle = spider_idle


#: scrapy-redis's name of :class:`RedisSpiderMixin`.
RedisMixin = RedisSpiderMixin


_N = TypeVar("_N", int, float)


def _number(
    value: Any, name: str, kind: Callable[[str], _N], least: _N, most: _N | None = None
) -> _N | None:
    """A spider attribute that must be a number of at least ``least`` (and at most
    ``most``, if given; ``None``: unset); ``-a`` arguments arrive as strings.

    Raises:
        InvalidSpiderAttribute: not such a number.
    """
    if value is None:
        return None
    what = "an integer" if kind is int else "a number"
    try:
        number = kind(str(value).strip()) if isinstance(value, str) else kind(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if (
        number is None
        or isinstance(value, bool)
        or math.isnan(number)
        or number < least
        or (most is not None and number > most)
    ):
        bounds = f"at least {least}" + (f" and at most {most}" if most is not None else "")
        raise InvalidSpiderAttribute(
            f"spider attribute {name}={value!r} must be {what} of {bounds}"
        )
    return number


class RedisSpider(RedisSpiderMixin, Spider):
    """A :class:`~scrapy.Spider` whose seeds come from Redis."""


class RedisCrawlSpider(RedisSpiderMixin, CrawlSpider):
    """A :class:`~scrapy.spiders.CrawlSpider` whose seeds come from Redis."""
