"""The refill policy: when the buffer of leased requests is refilled, and by which flush.

An engine asking for a request (:meth:`Refill.refill`) finds the buffer empty: it is
refilled now, on the reactor thread (a reserve: one round trip the reactor waits for),
or later, without blocking the reactor, while the engine still holds enough requests to
keep this worker busy:

- **with the timer's flush** (:meth:`Refill.top_up`, on the timer's tick): the engine
  holds at least ``prefetch`` requests, the timer ticks and Redis answers; the flush the
  tick sends anyway carries the reserve, and the engine is woken when requests arrive;
- **from the I/O thread** (``SCHEDULER_BACKGROUND_FLUSH``,
  :meth:`~scrapy_dist.frontier.core.Frontier.flush_later`): a flush with a top-up is in
  flight or is started now; its landing wakes the engine.

The timer's own flush goes through the I/O thread too when it can
(:meth:`Refill.flush_later`), carrying a top-up when the buffer runs low. A top-up that
lands after the scheduler closed, or while the crawl is paused, draining or lost, is
handed back. The scheduler owns the engine's side (waking it); this module decides.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from scrapy_dist.frontier.wire import HAND_BACK

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.exceptions import SerializationError
    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.frontier.leases import Lease
    from scrapy_dist.worker.control import WorkerControl
    from scrapy_dist.worker.deliveries import Deliveries
    from scrapy_dist.worker.heartbeat import Heartbeat

    #: Rebuilds a request from a queue entry (raises SerializationError).
    Decode = Callable[[bytes], Request]
    #: The settlement of a lease whose request cannot be rebuilt.
    Reject = Callable[[Lease, SerializationError], str]

__all__ = ["EMPTY_FRESH", "Refill"]


def _reactor_call_later(delay: float, func: Callable[[], None]) -> object:
    """Twisted's reactor's ``callLater``."""
    from twisted.internet import reactor

    return reactor.callLater(delay, func)  # type: ignore[arg-type]


logger = logging.getLogger(__name__)

#: Seconds for which a reserve that found the queue empty answers "nothing pending"
#: (with nothing of this worker's to enqueue since): no new top-up, no length read.
EMPTY_FRESH = 0.25


class Refill:
    """The refill policy of one scheduler (see the module docstring).

    Args:
        frontier: the crawl's frontier.
        deliveries: the worker's leases and buffer.
        heartbeat: the scheduler's timer (its flush interval, whether it ticks, whether
            it stopped).
        control: the worker's side of crawl control (top-ups only while running).
        stats: the crawler's stats collector.
        wake: wakes the engine if it was last told there was nothing.
        waiting: whether this worker should lease nothing now, because nothing it
            held could start soon (:meth:`scrapy_dist.worker.horizon.StartHorizon.waiting`);
            the timer wakes the engine when that ends.
    """

    def __init__(
        self,
        frontier: CrawlFrontier,
        deliveries: Deliveries,
        heartbeat: Heartbeat,
        control: WorkerControl,
        stats: StatsCollector,
        *,
        wake: Callable[[], None],
        waiting: Callable[[], bool] = lambda: False,
        call_later: Callable[[float, Callable[[], None]], object] | None = None,
    ) -> None:
        self.frontier = frontier
        self.deliveries = deliveries
        self.heartbeat = heartbeat
        self.control = control
        self.stats = stats
        self._wake = wake
        self._waiting = waiting
        #: A refill was refused because of :attr:`_waiting`: wake the engine when it ends.
        self._held_off = False
        #: The slot-ready time (``frontier.slot_ready_at``) the engine was last woken for,
        #: and the one an alarm is set for.
        self._ready_seen: float | None = None
        self._armed_for: float | None = None
        self._call_later = call_later or _reactor_call_later
        #: How to rebuild a lease's request, and the settlement of one that cannot be
        #: rebuilt; set at :meth:`open` (``None``: not open, no top-up).
        self._decode: tuple[Decode, Reject] | None = None
        #: An engine's refill left an empty buffer for the timer's top-up.
        self.deferred = False

    def open(self, decode: Decode, reject: Reject) -> None:
        """Start refilling with these (the scheduler opened and joined the crawl)."""
        self._decode = (decode, reject)

    # -- an engine's request ---------------------------------------------------------

    def refill(self) -> bool:
        """The engine found the buffer empty: refill it now, or leave it for a flush to
        come (see the module docstring).

        Returns:
            Whether a refill now brought requests.
        """
        if self._decode is None:
            raise RuntimeError("scheduler not open")
        if self._waiting():
            self.hold_off()
            return False
        if self._later():
            self.deferred = True
            self.stats.inc_value("scheduler/refill/deferred")
            return False
        if self._in_flight():
            self.stats.inc_value("scheduler/refill/in_flight")
            return False
        refilled = bool(self.deliveries.refill(*self._decode))
        self._arm()
        return refilled

    def _later(self) -> bool:
        """Whether an empty buffer may wait for the timer's top-up (at most one flush
        interval; the timer then wakes the engine) rather than block the reactor on a
        reserve now: the engine still holds at least ``prefetch`` requests, whose
        responses keep this worker busy meanwhile, the timer ticks (it ran within two
        flush intervals) and Redis is reachable. An engine holding fewer is never left
        waiting: it reserves now."""
        return (
            self.heartbeat.flush_interval > 0
            and self.heartbeat.ticking()
            and self.deliveries.prefetch > 1  # (1: leased when asked, never ahead)
            and len(self.deliveries.out) >= self.deliveries.prefetch
            and self.frontier.reachable
        )

    def _in_flight(self) -> bool:
        """Whether an empty buffer may wait for a flush sent from the I/O thread
        (``SCHEDULER_BACKGROUND_FLUSH``) rather than block the reactor: one is in
        flight and its top-up may refill the buffer, or the engine still holds requests
        (their responses keep this worker busy meanwhile; with no flush in flight, one
        with a top-up is started now). Its reply's landing wakes the engine. An engine
        that holds nothing, with no top-up in flight, has nothing to do meanwhile: it
        reserves now, on the reactor thread.

        A busy engine whose last reserve found the queue empty (within
        :data:`EMPTY_FRESH` seconds, nothing of this worker's to enqueue since) starts
        no top-up: the timer's next flush carries one. Each landing wakes the engine,
        which would ask again at once: a round trip after another for as long as its
        downloads last."""
        frontier, busy = self.frontier, bool(self.deliveries.out)
        if not frontier.can_flush_later():
            return False
        if frontier.flying:
            return busy or frontier.reserving > 0
        count = self.deliveries.top_up_count() if busy else 0
        if not count:
            return False
        if self.found_empty_lately():
            self.deferred = True  # the timer's next flush tops up (and wakes the engine)
            return True
        frontier.flush_later(reserve=count, then=self._topped_up)
        return frontier.flying

    def found_empty_lately(self) -> bool:
        """Whether a reserve found the queue empty within :data:`EMPTY_FRESH` seconds,
        with nothing of this worker's to enqueue since."""
        frontier, now = self.frontier, time.monotonic()
        ready_at = frontier.slot_ready_at
        if ready_at is not None and now >= ready_at:  # a slot's delay ended since
            return False
        return not frontier.pending_writes and now - frontier.found_empty_at < EMPTY_FRESH

    # -- the timer ---------------------------------------------------------------------

    def top_up(self) -> None:
        """The timer, before its flush: lease more while the buffer runs low, riding the
        flush the tick sends anyway (only when it has writes to send: never a round trip
        of its own), so that an engine's request rarely finds the buffer empty and
        blocks the reactor on a reserve; and wake the engine if it was last told there
        was nothing (else it would wait for its own heartbeat). Nothing while the crawl
        is paused or draining, lost, or the scheduler is not open."""
        self._wait_ended()
        self._slot_ready()
        if self._decode is None or not self._due():
            return
        self._woken(self.deliveries.top_up(*self._decode))

    def _due(self) -> bool:
        """Whether the timer's flush should carry a top-up (see :meth:`top_up`)."""
        if self._decode is None or self.frontier.lost is not None:
            return False
        if not self.control.running or self._waiting():
            return False
        deferred, self.deferred = self.deferred, False
        return bool(self.frontier.pending_writes or deferred)

    def flush_later(self) -> bool:
        """The timer's flush, with its top-up (:meth:`top_up`), sent from the I/O
        thread (:meth:`~scrapy_dist.frontier.core.Frontier.flush_later`); nothing while
        one is in flight (its reply lands first). ``False`` when the frontier cannot
        (the timer then flushes on the reactor thread)."""
        self._wait_ended()
        self._slot_ready()
        frontier = self.frontier
        if not frontier.can_flush_later():
            return False
        if frontier.flying:
            return True
        count = self.deliveries.top_up_count() if self._due() else 0
        if count:
            self.stats.inc_value("scheduler/refill/timer")
            self.stats.inc_value("scheduler/refill/background")
        frontier.flush_later(reserve=count, then=self._topped_up if count else None)
        return True

    def _topped_up(self, leases: list[Lease]) -> None:
        """The leases a top-up in flight brought: buffered, or handed back when the
        scheduler closed, the crawl stopped running or was lost meanwhile."""
        if (
            self.heartbeat.stopped
            or self._decode is None
            or self.frontier.lost is not None
            or not self.control.running
        ):
            self.frontier.settle([(lease.id, HAND_BACK) for lease in leases])
            return
        self._woken(self.deliveries.add(leases, *self._decode))

    def hold_off(self) -> None:
        """Nothing held could start soon (``waiting``): the timer wakes the engine when
        this worker may lease again."""
        self._held_off = True

    def _wait_ended(self) -> None:
        """Wake the engine once a refill refused while nothing held could start soon
        (``waiting``) may lease again: it asks for a request, and its refill leases."""
        if self._held_off and not self._waiting():
            self._held_off = False
            self._wake()

    def _slot_ready(self) -> None:
        """Wake the engine once the slot a queue per slot said was waiting for its
        delay is ready (once per reply that said so): it asks, and its refill leases.
        Called by the timer, and by the alarm :meth:`_arm` sets."""
        ready_at = self.frontier.slot_ready_at
        if ready_at is not None and ready_at != self._ready_seen and time.monotonic() >= ready_at:
            self._ready_seen = ready_at
            self._wake()
        self._arm()

    def _arm(self) -> None:
        """Set an alarm for when the waiting slot the last reserve named is ready (not
        the timer's next tick: a slot's turn that goes late lengthens every gap of it)."""
        ready_at = self.frontier.slot_ready_at
        if ready_at is None or ready_at in (self._armed_for, self._ready_seen):
            return
        self._armed_for = ready_at
        self._call_later(max(0.0, ready_at - time.monotonic()), self._slot_ready)

    def _woken(self, added: int) -> None:
        """Wake the engine when ``added`` requests were buffered."""
        if added:
            self._wake()
