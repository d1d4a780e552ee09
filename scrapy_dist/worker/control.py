"""The worker's side of crawl control: reading the state, and acting on it.

The state itself (its hash, its values, how it is read and set) is
:mod:`scrapy_dist.control`'s. Here, each worker reads it every :data:`POLL_INTERVAL`
seconds (one ``HMGET``, :func:`~scrapy_dist.control.read_command`), carried by the
pipeline its scheduler's timer sends anyway (its writes, its reserve), so the read costs
no round trip of its own while the worker crawls; a worker whose timer does not carry it
in time reads it on its own, :data:`CARRY_SLACK` seconds later. :class:`ControlWatcher`
holds the state last read (one per frontier, shared by the scheduler and the spider);
:class:`WorkerControl` makes the scheduler act on it:

- not ``running`` (paused or draining): nothing handed out or reserved, the leases
  buffered but not started handed back to the queue; requests already in the engine
  finish and their acknowledgements and children are still sent; the spider stays open
  when idle and the crawl is never checked for completion;
- ``running`` again: the engine is woken at once;
- ``draining``: once the worker holds nothing and Redis took its pending writes (or
  after ``SCHEDULER_LEASE_TIMEOUT`` seconds of waiting for them), the spider closes with
  the reason :data:`~scrapy_dist.control.DRAINED`; a worker that opens while the crawl
  drains closes at its first tick.

Faults: a read that fails (Redis unreachable, refusing, an ACL) changes nothing: the
worker keeps the state it last read, logs once and retries with a backoff (up to
:data:`READ_BACKOFF_MAX` seconds). A control key that does not hold a valid state is
read as **paused** and logged as an ERROR, repeated every :data:`INVALID_REMINDER`
seconds while it lasts, so a crawl never stops silently.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import redis

from scrapy_dist.control import (
    DRAINED,
    DRAINING,
    FIELDS,
    PAUSED,
    RUNNING,
    ControlState,
    fields_of,
    parse_state,
    read_command,
)
from scrapy_dist.frontier.events import Read
from scrapy_dist.frontier.outbox import Command
from scrapy_dist.worker import engine as _engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.worker.deliveries import Deliveries

__all__ = ["ControlWatcher", "WorkerControl"]

logger = logging.getLogger(__name__)

#: Seconds between two reads of the control state by a worker.
POLL_INTERVAL = 0.5
#: Seconds past a due read that a watcher whose reads the frontier's flushes carry
#: waits for one before it reads on its own (a flush tick is 0.1 s by default).
CARRY_SLACK = 0.25
#: Longest pause between reads while they fail (the pause doubles from POLL_INTERVAL).
READ_BACKOFF_MAX = 5.0
#: Seconds between the ERROR lines of a control key that holds no valid state.
INVALID_REMINDER = 60.0


class ControlWatcher:
    """A worker's view of its crawl's control state, read every :data:`POLL_INTERVAL`
    seconds (see the module docstring for faults). One per frontier
    (:meth:`for_frontier`, which has the frontier's flushes carry the reads: see
    :meth:`rider`), shared by the scheduler and the spider.

    Args:
        client: the crawl's client.
        keys: the crawl's keys.
        stats: returns the crawler's stats collector (``None``: no stats).
        interval: seconds between reads.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        *,
        stats: Callable[[], StatsCollector | None] = lambda: None,
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.client = client
        self.keys = keys
        self._stats = stats
        self.interval = interval
        #: The state last read (``running`` until a read says otherwise).
        self.state = ControlState()
        #: Whether a read has succeeded yet.
        self.read_once = False
        self._next_read = 0.0
        self._failures = 0
        self._error = ""
        self._reminded = 0.0
        #: A frontier's flushes carry the reads (:meth:`rider`, set by
        #: :meth:`for_frontier`): :meth:`poll` then waits :data:`CARRY_SLACK` seconds
        #: past a due read for one before it reads on its own.
        self.carried = False

    @classmethod
    def for_frontier(cls, frontier: CrawlFrontier) -> ControlWatcher:
        """The watcher of this frontier's crawl (made on first use, no I/O); the
        frontier's flushes carry its reads."""
        try:
            return _watchers[frontier]
        except KeyError:
            pass
        watcher = _watchers[frontier] = cls(
            frontier.client, frontier.keys, stats=lambda: frontier.stats
        )
        frontier.events.carry(watcher.rider)
        watcher.carried = True
        return watcher

    def rider(self) -> Read | None:
        """The read for a flush's pipeline to carry when one is due (``None``: not due,
        or reads are failing and backing off, which :meth:`poll` handles)."""
        if self._failures or time.monotonic() < self._next_read:
            return None
        return Read(Command(read_command(self.keys)), self._carried_reply)

    def _carried_reply(self, reply: Any) -> None:
        """The reply (or error) of a read a flush carried."""
        now = time.monotonic()
        if isinstance(reply, redis.ResponseError) and str(reply).startswith("WRONGTYPE"):
            self._read_ok(now, ControlState(PAUSED, problem=f"it is not a hash ({reply})"))
        elif isinstance(reply, Exception):
            error = reply if isinstance(reply, redis.RedisError) else redis.RedisError(reply)
            self._read_failed(now, error)
        else:
            self._inc("control/reads/carried")
            self._read_ok(now, parse_state(fields_of(reply)))

    def holds(self) -> bool:
        """Whether workers must take no new work: the state last read is not
        ``running``; reads it first when due."""
        return not self.poll().running

    def poll(self, *, force: bool = False) -> ControlState:
        """The state, read first if :attr:`interval` has passed since the last read (or
        ``force``, unless reads are failing and backing off)."""
        now = time.monotonic()
        slack = CARRY_SLACK if self.carried and not self._failures else 0.0
        if now >= self._next_read + slack or (force and not self._failures):
            self._read(now)
        return self.state

    def _inc(self, name: str) -> None:
        stats = self._stats()
        if stats is not None:
            stats.inc_value(name)

    def _read(self, now: float) -> None:
        try:
            raw = fields_of(self.client.hmget(self.keys.control, FIELDS))
        except redis.ResponseError as e:
            if str(e).startswith("WRONGTYPE"):
                self._read_ok(now, ControlState(PAUSED, problem=f"it is not a hash ({e})"))
            else:
                self._read_failed(now, e)
            return
        except redis.RedisError as e:
            self._read_failed(now, e)
            return
        self._inc("scheduler/redis/round_trips")
        self._read_ok(now, parse_state(raw))

    def _read_ok(self, now: float, state: ControlState) -> None:
        self._next_read = now + self.interval
        if self._failures:
            logger.info(
                "Crawl control state of %(crawl)s readable again: %(state)s",
                {"crawl": self.keys.crawl, "state": state.describe()},
            )
        self._failures, self._error = 0, ""
        self.read_once = True
        if state.problem and (state != self.state or now - self._reminded >= INVALID_REMINDER):
            self._reminded = now
            self._inc("control/invalid")
            logger.error(
                "Crawl control key %(key)s holds no valid state (%(problem)s): this worker "
                "takes no new work, as if the crawl were paused. Set the state with "
                "scrapy-dist resume|pause|drain (a key of the wrong type must be deleted "
                "first)",
                {"key": self.keys.control, "problem": state.problem},
            )
        self.state = state

    def _read_failed(self, now: float, error: redis.RedisError) -> None:
        self._failures += 1
        self._inc("control/read_errors")
        pause = min(self.interval * 2 ** (self._failures - 1), READ_BACKOFF_MAX)
        self._next_read = now + pause
        kind = f"{type(error).__name__}: {error}"
        if kind != self._error:
            self._error = kind
            unreachable = isinstance(error, (redis.ConnectionError, redis.TimeoutError))
            logger.warning(
                "Cannot read the crawl control state %(key)s (%(why)s%(error)s): keeping "
                "the state last read (%(state)s) and trying again",
                {
                    "key": self.keys.control,
                    "why": "Redis is unreachable: " if unreachable else "",
                    "error": kind,
                    "state": self.state.state,
                },
            )


_watchers: WeakKeyDictionary[CrawlFrontier, ControlWatcher] = WeakKeyDictionary()


class WorkerControl:
    """What the control state makes one worker's scheduler do (see the module
    docstring): nothing handed out while the crawl is not running, the buffered leases
    handed back when it stops running, the engine woken when it runs again, the spider
    closed (:data:`DRAINED`) once a draining worker holds nothing.

    Args:
        watcher: the crawl's control state.
        frontier: the crawl's frontier (settlements of handed-back leases).
        deliveries: the leases this worker holds.
        crawler: the crawler whose engine is woken and whose spider a drain closes
            (``None``: neither).
    """

    def __init__(
        self,
        watcher: ControlWatcher,
        frontier: CrawlFrontier,
        deliveries: Deliveries,
        *,
        crawler: Crawler | None,
    ) -> None:
        self.watcher = watcher
        self.frontier = frontier
        self.deliveries = deliveries
        self.crawler = crawler
        #: The state this worker last acted on.
        self.applied = RUNNING
        #: Set once this worker asked its engine to close because the crawl drains.
        self.closing = False
        self.spider: object = None
        #: When a draining worker that holds nothing first had writes Redis did not take.
        self._unsent_since: float | None = None

    def open(self, spider: object) -> None:
        """Read the state at open (a worker started while the crawl drains closes at
        its first tick) and act on it."""
        self.spider = spider
        state = self.watcher.poll(force=True)
        if state.state == DRAINING:
            logger.warning(
                "Crawl %(crawl)s is draining (%(state)s): this worker takes no work and "
                "exits; run 'scrapy-dist resume %(spider)s' to let workers run again",
                {
                    "crawl": self.frontier.keys.crawl,
                    "state": state.describe(),
                    "spider": getattr(spider, "name", "SPIDER"),
                },
                extra={"spider": spider},
            )
            self.applied = DRAINING
        else:
            self._apply(state)

    @property
    def running(self) -> bool:
        """Whether the crawl runs, as last read and as acted on (no read, no action:
        :meth:`holds` reads and acts first)."""
        return self.applied == RUNNING and self.watcher.state.running

    def holds(self) -> bool:
        """Whether the scheduler must hand out nothing now (acting on a change first)."""
        state = self.watcher.poll()
        if state.state != self.applied:
            self._apply(state)
        return not state.running

    def tick(self) -> None:
        """On the scheduler's timer: read the state when due, act on a change, and
        close a draining worker's spider once it holds nothing and Redis took its
        pending writes (acknowledgements, hand-backs, children), or once it waited
        ``SCHEDULER_LEASE_TIMEOUT`` seconds for them (Redis unreachable or refusing:
        its leases then expire and are re-queued)."""
        self.holds()
        if self.applied != DRAINING or self.closing or not self._holds_nothing():
            self._unsent_since = None
            return
        if self.frontier.pending_writes and not self._waited_for_writes():
            return
        self._close()

    def _waited_for_writes(self) -> bool:
        """Whether a draining worker that holds nothing has waited long enough for
        Redis to take its pending writes (the timer keeps sending them)."""
        now = time.monotonic()
        if self._unsent_since is None:
            self._unsent_since = now
            logger.warning(
                "Crawl %(crawl)s is draining and this worker finished its work, but Redis "
                "has not taken %(n)d pending write(s) (acknowledgements, hand-backs, new "
                "requests): waiting for it up to SCHEDULER_LEASE_TIMEOUT (%(timeout)gs) "
                "before exiting",
                {
                    "crawl": self.frontier.keys.crawl,
                    "n": self.frontier.pending_writes,
                    "timeout": self.frontier.lease_timeout,
                },
                extra={"spider": self.spider},
            )
        return now - self._unsent_since >= self.frontier.lease_timeout

    def allows_completion(self, *, fresh: bool = False) -> bool:
        """Whether the crawl may be checked for completion (it runs); ``fresh`` reads
        the state first (at close)."""
        return self.watcher.poll(force=fresh).running

    def on_idle(self) -> None:
        """``spider_idle``: a crawl that does not run keeps the spider open (a draining
        worker closes from its timer, with :data:`DRAINED`).

        Raises:
            DontCloseSpider: the crawl is paused or draining.
        """
        from scrapy.exceptions import DontCloseSpider

        if self.holds():
            raise DontCloseSpider

    def _holds_nothing(self) -> bool:
        d = self.deliveries
        return not d.out and not d.buffer and not d.in_flight()

    def _apply(self, state: ControlState) -> None:
        before, self.applied = self.applied, state.state
        crawl = self.frontier.keys.crawl
        if state.running:
            if before != RUNNING:
                logger.info(
                    "Crawl %(crawl)s resumed (%(state)s)",
                    {"crawl": crawl, "state": state.describe()},
                    extra={"spider": self.spider},
                )
                self._wake()
            return
        if before == RUNNING:
            handed = self._hand_back()
            logger.info(
                "Crawl %(crawl)s is %(state)s: this worker takes no new work; handed back "
                "%(handed)d buffered request(s); %(out)d in progress finish",
                {
                    "crawl": crawl,
                    "state": state.describe(),
                    "handed": handed,
                    "out": len(self.deliveries.out),
                },
                extra={"spider": self.spider},
            )
        else:
            logger.info(
                "Crawl %(crawl)s is %(state)s",
                {"crawl": crawl, "state": state.describe()},
                extra={"spider": self.spider},
            )

    def _hand_back(self) -> int:
        """Hand the buffered leases back to the queue (through the outbox)."""
        count = len(self.deliveries.buffer)
        if count:
            self.deliveries.hand_back_first(count)
            self.frontier.stats.inc_value("control/handed_back", count)
        return count

    def _wake(self) -> None:
        if self.crawler is None:
            return
        engine = _engine.engine_of(self.crawler)
        if engine is not None:
            _engine.wake(engine)

    def _close(self) -> None:
        self.closing = True
        logger.info(
            "Crawl %(crawl)s is draining and this worker finished its work: closing "
            "(reason %(reason)r)",
            {"crawl": self.frontier.keys.crawl, "reason": DRAINED},
            extra={"spider": self.spider},
        )
        if self.crawler is not None:
            _engine.close_spider(self.crawler, DRAINED)
