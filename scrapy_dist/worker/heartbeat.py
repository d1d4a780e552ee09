"""The scheduler's timer: flushes, heartbeats and lease renewals.

Every flush interval the timer settles what the engine finished and sends pending
writes, with a reserve that tops up the scheduler's buffer when it runs low (so the
engine rarely finds it empty and waits for a reserve of its own), and with the crawl's
control state when its read is due (:class:`~scrapy_dist.worker.control.ControlWatcher`): one
round trip, sent from the worker's I/O thread when the scheduler can
(``flush_later``, :mod:`scrapy_dist.frontier.background`: the reactor then goes on running the
engine; a tick while that flush is in flight sends nothing more); every heartbeat
interval it also heartbeats in the crawl's worker registry and
renews the leases this worker holds. Each tick also reads the crawl's control state
when due and acts on it (:class:`~scrapy_dist.worker.control.WorkerControl`: pause, resume,
drain). A timer that did not run for longer than a lease
lasts (the process was paused) first checks which leases it still holds. No error
ends the timer: each is logged (once in a row) and counted as
``scheduler/timer/errors``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import redis

from scrapy_dist.stats import ITEMS_STAT, PAGES_STAT

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector
    from twisted.internet.task import LoopingCall

    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.frontier.registry import WorkerRegistry
    from scrapy_dist.worker.control import WorkerControl
    from scrapy_dist.worker.deliveries import Deliveries

logger = logging.getLogger(__name__)


class Heartbeat:
    """Runs the scheduler's periodic work (see the module docstring).

    Args:
        frontier: the crawl's frontier (writes to send, leases to renew).
        registry: this worker's handle on the crawl's worker registry.
        deliveries: the leases this worker holds.
        stats: the crawler's stats collector.
        heartbeat_interval: seconds between heartbeats and lease renewals.
        flush_interval: seconds between flushes; ``0`` ticks every heartbeat.
        on_lost: called on each tick while the crawl is gone
            (:attr:`Frontier.lost`) instead of flushing and heartbeating.
        control: the crawl's control state, acted on each tick (``None``: none).
        refill: called each tick before the flush; leases more into the scheduler's
            buffer with it when the buffer runs low (``None``: plain flushes).
        flush_later: called each tick instead of ``refill`` and the flush: starts the
            tick's flush (with its top-up) on the I/O thread and returns ``True``, or
            returns ``False`` when it cannot (the tick then flushes on this thread);
            ``None``: never.
    """

    def __init__(
        self,
        frontier: CrawlFrontier,
        registry: WorkerRegistry,
        deliveries: Deliveries,
        stats: StatsCollector,
        *,
        heartbeat_interval: float,
        flush_interval: float,
        on_lost: Callable[[], None],
        control: WorkerControl | None = None,
        refill: Callable[[], None] | None = None,
        flush_later: Callable[[], bool] | None = None,
    ) -> None:
        self.frontier = frontier
        self.registry = registry
        self.deliveries = deliveries
        self.stats = stats
        self.heartbeat_interval = heartbeat_interval
        self.flush_interval = flush_interval
        self.on_lost = on_lost
        self.control = control
        self.refill = refill
        self.flush_later = flush_later
        #: Runs the ticks; created by :meth:`start` (creating it imports the reactor).
        self.ticker: LoopingCall | None = None
        #: The spider named in log records.
        self.spider: object = None
        self._next_beat = 0.0
        #: The timer's last run, to notice a pause of the whole process.
        self._ticked_at = time.monotonic()
        #: Ticks run so far.
        self._ticks = 0
        #: The error the timer last logged (each kind is logged once in a row).
        self._error = ""
        #: Set by :meth:`stop`; a tick during which the scheduler closed (a drain closes
        #: the spider from the tick, and the engine may close it at once) stops there.
        self.stopped = False

    def start(self, spider: object) -> None:
        """Start ticking (the first heartbeat is one interval from now)."""
        from twisted.internet.task import LoopingCall

        self.spider = spider
        self._next_beat = time.monotonic() + self.heartbeat_interval
        self.deliveries.renewed_at = self._ticked_at = time.monotonic()
        self.ticker = LoopingCall(self.tick)
        self.ticker.start(self.flush_interval or self.heartbeat_interval, now=False)

    def stop(self) -> None:
        """Stop ticking (nothing if it is not running); the tick under way, if any,
        neither heartbeats nor renews after this."""
        self.stopped = True
        if self.ticker is not None and self.ticker.running:
            self.ticker.stop()

    def tick(self) -> None:
        """One run of the timer; logs and counts any error instead of raising it (a
        ``LoopingCall`` would stop)."""
        try:
            self._tick()
        except Exception as e:  # the timer must survive anything, Redis errors first
            self.stats.inc_value("scheduler/timer/errors")
            kind = f"{type(e).__name__}: {e}"
            if kind != self._error:
                self._error = kind
                logger.error(
                    "Scheduler timer: %(error)s (heartbeats, renewals and flushes go on)",
                    {"error": kind},
                    exc_info=not isinstance(e, redis.RedisError),
                    extra={"spider": self.spider},
                )
        else:
            self._error = ""

    def ticking(self) -> bool:
        """Whether the timer runs and ticked within the last two flush intervals (a
        reactor too busy to run it, or a timer not started, does not count)."""
        period = self.flush_interval or self.heartbeat_interval
        return (
            self.ticker is not None
            and self.ticker.running
            and self._ticks > 0
            and time.monotonic() - self._ticked_at < 2 * period
        )

    def _figures(self) -> tuple[int, int, int]:
        """This worker's pages, items and buffered requests, for the crawl's history."""

        def count(name: str) -> int:
            value = self.stats.get_value(name, 0)
            return int(value) if isinstance(value, (int, float)) else 0

        return count(PAGES_STAT), count(ITEMS_STAT), len(self.deliveries.buffer)

    def _tick(self) -> None:
        now = time.monotonic()
        self._ticks += 1
        gap, self._ticked_at = now - self._ticked_at, now
        if gap > self.frontier.lease_timeout and self.frontier.lost is None:
            logger.warning(
                "This worker did not run for %(gap).1fs (longer than SCHEDULER_LEASE_TIMEOUT "
                "%(lease)gs): checking which leases it still holds",
                {"gap": gap, "lease": self.frontier.lease_timeout},
                extra={"spider": self.spider},
            )
            self.deliveries.renew(self.spider)
        self.deliveries.settle()
        if self.frontier.lost is not None:
            self.on_lost()
            return
        if self.flush_later is None or not self.flush_later():
            if self.refill is not None:
                self.refill()  # a reserve that carries the tick's writes (and reads)
            self.frontier.flush()  # what is left (nothing, if the reserve sent it all)
        if self.control is not None:
            self.control.tick()
            if self.stopped:  # the drain closed the scheduler: it left the registry
                return
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat_interval
            self.frontier.call(lambda: self.registry.heartbeat(self._figures()))
            self.deliveries.renew(self.spider)
