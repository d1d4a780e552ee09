"""The start horizon: a worker keeps only the leased requests it can start soon.

Scrapy's engine takes requests from the scheduler while its downloader has room, and the
downloader holds a request of a slot with a download delay until the delay since the
slot's last send has passed: one request per delay. A worker that hands its engine
every request it leased keeps a delayed slot's requests to itself for many delays while
another worker, whose own copy of the slot is free, could send them now (ten seeds of
one host with ``DOWNLOAD_DELAY = 5``: one worker crawled all ten, 5 s apart, and the
other idled).

So the scheduler hands the engine a buffered request only when Scrapy's downloader would
start it within ``SCHEDULER_START_HORIZON`` seconds (:meth:`StartHorizon.pick`): its
slot's delay since the last send, the requests queued in the slot, and the requests of
the slot this worker handed to the engine that have not reached the downloader yet.
Buffered requests met before it whose slot would make them wait longer are handed back
to the queue, where any worker leases them (this one too, once its slot is ready). When
nothing buffered can start soon, the worker leases nothing until the first of those
slots is within the horizon, and the engine is woken then (:attr:`StartHorizon.until`).

A worker alone in the crawl (the registry holds no other worker, read about once a
second with a flush it sends anyway) has nobody to hand requests to: it keeps them
buffered (leased, renewed) rather than in Scrapy's downloader, and when none of them
can start soon it leases more, within its bound of held leases, so that other slots'
requests queued behind them are found, as Scrapy's own scheduler would. Once another
worker registers, the requests that cannot start soon go back at the engine's next
request (the timer wakes it).

A slot without a delay is never held back (unless it is paused for every worker:
:mod:`scrapy_dist.worker.pauses`), nor are requests kept in memory or start requests
(they are not leased). With cluster-wide politeness the shared gate spaces the
slots instead (:mod:`scrapy_dist.politeness`), and this part is not built.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

from scrapy import signals

from scrapy_dist.frontier.events import Read
from scrapy_dist.frontier.outbox import Command
from scrapy_dist.worker import engine as _engine

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from scrapy_dist.config.scheduling import PolitenessConfig
    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.worker.engine import SlotState

__all__ = ["StartHorizon"]

#: Seconds between two reads of how many workers the crawl's registry holds.
READ_EVERY = 1.0


class StartHorizon:
    """Which buffered request the engine gets, and which go back (module docstring).

    Args:
        seconds: the horizon (``SCHEDULER_START_HORIZON``, > 0).
        slot_of: what Scrapy's downloader knows of a request's slot
            (:func:`scrapy_dist.worker.engine.slot_state`).
        delay_of: the download delay of a slot key the downloader has no slot for yet
            (the settings' and the spider's, as Scrapy will make it).
        paused: seconds left of a slot key's pause for every worker
            (:meth:`scrapy_dist.worker.pauses.SlotPauses.left`; default: none).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        seconds: float,
        slot_of: Callable[[Request], SlotState],
        delay_of: Callable[[str], float],
        *,
        paused: Callable[[str], float] = lambda key: 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if seconds <= 0:
            raise ValueError(f"the start horizon must be positive, not {seconds}")
        self.seconds = seconds
        self.slot_of = slot_of
        self.delay_of = delay_of
        self.paused = paused
        self.clock = clock
        #: Monotonic time before which this worker leases nothing: nothing it held could
        #: start soon (0: no such wait).
        self.until = 0.0
        #: Whether other workers are registered in the crawl (until a read says none
        #: is: requests that cannot start soon are handed back).
        self.others = True
        self._next_read = 0.0
        #: Requests handed to the engine that have not reached the downloader -> slot.
        self._on_way: dict[Request, str] = {}
        self._on_way_by_slot: Counter[str] = Counter()

    @classmethod
    def for_crawler(
        cls,
        crawler: Crawler,
        frontier: CrawlFrontier,
        seconds: float,
        slots: PolitenessConfig,
        paused: Callable[[str], float] = lambda key: 0.0,
    ) -> Self:
        """The horizon of a crawler's scheduler: reading its downloader's slots, with the
        delays of slots not made yet from ``slots`` (Scrapy's settings of download slots
        and the spider's ``download_delay``), counting a request as arrived when it
        reaches the downloader; ``paused``: the slots' pauses. The frontier's flushes
        carry the reads of the crawl's registry."""
        from scrapy_dist.slots import Limits

        limits: list[Limits] = []  # built once the spider is known

        def delay_of(key: str) -> float:
            if not limits:
                limits.append(Limits.build(slots, crawler.spider))
            return limits[0].of(key).delay

        horizon = cls(
            seconds,
            lambda request: _engine.slot_state(crawler, request),
            delay_of,
            paused=paused,
        )
        crawler.signals.connect(horizon.reached, signal=signals.request_reached_downloader)
        workers = frontier.keys.workers
        frontier.events.carry(lambda: horizon.rider(workers))
        return horizon

    def alone(self) -> bool:
        """Whether the crawl's registry held no other worker at the last read."""
        return not self.others

    def rider(self, workers: str) -> Read | None:
        """The read of the registry's size (``workers``: its key) for a flush to carry,
        about once a second."""
        now = self.clock()
        if now < self._next_read:
            return None
        self._next_read = now + READ_EVERY
        return Read(Command(("HLEN", workers)), self._registered)

    def _registered(self, reply: object) -> None:
        """The registry's size (an error: unknown, as if others were there)."""
        others = not isinstance(reply, int) or reply > 1
        if others and not self.others:
            self.until = 0.0  # the engine is woken: what cannot start soon goes back
        self.others = others

    def waiting(self) -> bool:
        """Whether this worker should lease nothing now (see :attr:`until`)."""
        return self.clock() < self.until

    def start_in(self, request: Request) -> float:
        """Seconds until Scrapy's downloader would start ``request`` if the engine took
        it now (0 for a slot without a delay)."""
        return self._start_in(self.slot_of(request))

    def _start_in(self, state: SlotState) -> float:
        ahead = self._on_way_by_slot.get(state.key, 0)
        if not ahead:
            return state.wait
        return state.wait + ahead * (state.delay if state.exists else self.delay_of(state.key))

    def hold(self, request: Request) -> float:
        """Seconds before ``request`` may go to the engine (0 or less: now): until its
        slot would start it within the horizon (the downloader holds it the rest of
        the way) and its slot's pause has ended (the downloader knows nothing of it)."""
        return self._hold(self.slot_of(request))

    def _hold(self, state: SlotState) -> float:
        return max(self._start_in(state) - self.seconds, self.paused(state.key))

    def pick(self, requests: Iterable[Request]) -> tuple[int | None, int]:
        """The first of ``requests`` (the buffer, in order) that would start within the
        horizon, and how many before it would not (those go back to the queue). Each
        request's slot is read once; a slot met again is not judged again.

        Returns:
            ``(index or None, count to hand back)``. When no request would start soon,
            :attr:`until` is set to when the first of them may go (:meth:`hold`).
        """
        soonest: float | None = None
        checked: dict[str, float] = {}
        count = 0
        for index, request in enumerate(requests):
            count += 1
            state = self.slot_of(request)
            hold = checked.get(state.key)
            if hold is None:
                hold = checked[state.key] = self._hold(state)
            if hold <= 0:
                self.until = 0.0
                return index, index
            soonest = hold if soonest is None else min(soonest, hold)
        if soonest is None:
            return None, 0
        self.until = self.clock() + soonest
        return None, count

    def given(self, request: Request) -> None:
        """``request`` was handed to the engine: until it reaches the downloader, it
        counts as one more request ahead in its slot."""
        key = self.slot_of(request).key
        self._on_way[request] = key
        self._on_way_by_slot[key] += 1

    def reached(self, request: Request, spider: object = None) -> None:
        """``request_reached_downloader`` (or ``request`` left the engine without): the
        downloader's own slot counts it from now on."""
        key = self._on_way.pop(request, None)
        if key is not None:
            self._on_way_by_slot[key] -= 1
            if self._on_way_by_slot[key] <= 0:
                del self._on_way_by_slot[key]
