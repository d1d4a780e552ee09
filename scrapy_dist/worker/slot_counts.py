"""Counts of requests per download slot for the whole crawl, and the per-slot page limit.

Every worker counts, per download slot (Scrapy's downloader's: ``meta["download_slot"]``,
else the host), the requests it sent (they reached the downloader, past every
downloader middleware), the responses it received (``pages``), those of them with a
status from 400 to 499 (``4xx``) and from 500 (``5xx``), and the requests that left the
downloader without a response (``failed``: a timeout, a DNS error, a refused
connection). About once a second, a flush it sends anyway adds them to the crawl's
(``lua/slot_counts.lua``): ``<crawl>:slots:sent`` ranks the slots by requests sent,
``<crawl>:slots:counts`` holds the other counts. ``status`` shows the busiest slots. A
count that could not be written (Redis refused the flush) is kept and sent with the
next.

``SCHEDULER_SLOT_PAGE_LIMIT = N`` stops a slot once the crawl started N of its
requests: the scheduler drops a leased request of such a slot instead of handing it to
the engine (:meth:`SlotCounts.over`). A request *started* was handed to an engine (it
may still wait in the downloader for its slot's delay); each worker counts its own at
once, and writes them and reads the crawl's (``started``) with its flushes, about four
times a second. The workers together may still start a little more than N: what the
others started of that slot since their last write and this worker's last read.

The slot name comes from the request: it is only a member of a zset and part of a hash
field, never part of a key name, and a long one is named by its SHA-1
(:func:`scrapy_dist.politeness.bound_slot`).
"""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from typing import TYPE_CHECKING, Any

from scrapy import signals

from scrapy_dist.frontier.events import Read
from scrapy_dist.frontier.outbox import Command
from scrapy_dist.frontier.wire import EPOCH_REFUSAL
from scrapy_dist.lua_source import source
from scrapy_dist.slots import bound_slot, slot_of
from scrapy_dist.worker import engine as _engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.frontier.gateway import CrawlFrontier

__all__ = ["COUNTS", "SlotCounts"]

logger = logging.getLogger(__name__)

#: The counts kept per slot besides the requests sent, in the order they are sent
#: (``started``: handed to an engine, counted with a limit only).
COUNTS = ("pages", "4xx", "5xx", "failed", "started")
#: The count the limit reads.
STARTED = "started"
#: Seconds between two writes of the counts; with a limit, between two writes and
#: reads.
WRITE_EVERY = 1.0
LIMIT_WRITE_EVERY = 0.25
#: Most slots whose crawl-wide requests started one flush reads (those this worker
#: started last), and most slots whose counts one flush writes (the rest wait for the
#: next).
READ_MAX = 1000
WRITE_MAX = 1000
#: Most slots whose requests started this worker remembers (those it started last): a
#: slot forgotten and met again is judged on what the next read says of it.
STARTED_MAX = 10_000


class SlotCounts:
    """This worker's counts per download slot, on their way to the crawl's, and the
    crawl's requests sent per slot as last read (see the module docstring).

    Args:
        frontier: the crawl's frontier (its keys and flushes).
        slot_key: the download slot key of a request (Scrapy's downloader's).
        stats: the crawler's stats collector.
        limit: ``SCHEDULER_SLOT_PAGE_LIMIT`` (0: no limit).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        frontier: CrawlFrontier,
        slot_key: Callable[[Request], str],
        stats: StatsCollector,
        *,
        limit: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.frontier = frontier
        self.slot_key = slot_key
        self.stats = stats
        self.limit = limit
        self.clock = clock
        #: Stored slot name -> counts not written yet: sent, then :data:`COUNTS`.
        self._unwritten: dict[str, list[int]] = {}
        #: The counts of the write a flush carries, until its reply says they were
        #: written (a flush that fails as a whole brings no reply: the next write sends
        #: them again).
        self._writing: dict[str, list[int]] | None = None
        #: With a limit: stored slot name -> the crawl's requests started at the last
        #: read, plus this worker's since (the slots started last come last).
        self.started: dict[str, int] = {}
        #: Requests that reached the downloader and got a response.
        self._answered: weakref.WeakSet[Request] = weakref.WeakSet()
        #: Slots over the limit this worker said so of.
        self._told: set[str] = set()
        self._next_write = 0.0

    @classmethod
    def for_crawler(cls, crawler: Crawler, frontier: CrawlFrontier, *, limit: int) -> SlotCounts:
        """The counts of a crawler's scheduler: its downloader's signals counted (the
        slot as its downloader names it; before the engine opens, by the same rule,
        :func:`~scrapy_dist.politeness.slot_of`), its frontier's flushes carrying the
        writes."""

        def slot_key(request: Request) -> str:
            key = _engine.slot_key(crawler, request)
            return slot_of(request) if key is None else key

        assert crawler.stats is not None
        counts = cls(frontier, slot_key, crawler.stats, limit=limit)
        connect = crawler.signals.connect
        connect(counts.reached, signal=signals.request_reached_downloader)
        connect(counts.downloaded, signal=signals.response_downloaded)
        connect(counts.left, signal=signals.request_left_downloader)
        frontier.events.carry(counts.rider)
        return counts

    def _count(self, request: Request, index: int, slot: str | None = None) -> str:
        if slot is None:
            slot = bound_slot(self.slot_key(request))
        counts = self._unwritten.get(slot)
        if counts is None:
            counts = self._unwritten[slot] = [0] * (1 + len(COUNTS))
        counts[index] += 1
        return slot

    # -- the downloader's signals -------------------------------------------------------

    def reached(self, request: Request, spider: object = None) -> None:
        """``request_reached_downloader``: one more request sent of its slot."""
        self._count(request, 0)

    def downloaded(self, response: Response, request: Request, spider: object = None) -> None:
        """``response_downloaded``: one more page of its slot (and a 4xx or a 5xx)."""
        self._answered.add(request)
        self._count(request, 1)
        if 400 <= response.status < 500:
            self._count(request, 2)
        elif response.status >= 500:
            self._count(request, 3)

    def left(self, request: Request, spider: object = None) -> None:
        """``request_left_downloader``: without a response, one more failed."""
        if request in self._answered:
            self._answered.discard(request)
        else:
            self._count(request, 4)

    # -- the limit ----------------------------------------------------------------------

    def over(self, request: Request, *, start: bool = True) -> bool:
        """Whether ``request``'s slot reached ``SCHEDULER_SLOT_PAGE_LIMIT`` (requests
        started by the crawl, as last read, and by this worker since): the first time of
        a slot, this worker says so. ``False`` with ``start``: the request goes to the
        engine, and counts as started."""
        if not self.limit:
            return False
        slot = bound_slot(self.slot_key(request))
        started = self.started.pop(slot, 0)
        self.started[slot] = started  # (last: the slots read are those started last)
        if len(self.started) > STARTED_MAX:
            del self.started[next(iter(self.started))]
        if started < self.limit:
            if start:
                self.started[slot] = started + 1
                self._count(request, 1 + COUNTS.index(STARTED), slot)
            return False
        if slot not in self._told:
            if len(self._told) >= STARTED_MAX:
                self._told.clear()  # (said again, at worst)
            self._told.add(slot)
            logger.info(
                "Download slot %(slot)s reached SCHEDULER_SLOT_PAGE_LIMIT (%(limit)d "
                "requests started by the crawl): its requests are dropped",
                {"slot": slot, "limit": self.limit},
            )
        return True

    # -- Redis ----------------------------------------------------------------------------

    def write_now(self) -> None:
        """Make the next flush carry the counts (this worker closes)."""
        self._next_write = 0.0

    def unwritten(self) -> bool:
        """Whether counts wait for a write (or for the reply of theirs)."""
        return bool(self._unwritten or self._writing)

    def _take_back(self, writes: dict[str, list[int]]) -> None:
        """Counts that were not written go back to those waiting for the next write."""
        for slot, counts in writes.items():
            kept = self._unwritten.setdefault(slot, [0] * len(counts))
            for i, n in enumerate(counts):
                kept[i] += n

    def rider(self) -> Read | None:
        """The write of the counts (and, with a limit, the read of the slots' requests
        started) for a flush to carry, about once a second (four times with a limit);
        at most :data:`WRITE_MAX` slots' counts at once."""
        now = self.clock()
        if now < self._next_write or not (self._unwritten or self._writing or self.started):
            return None
        self._next_write = now + (LIMIT_WRITE_EVERY if self.limit else WRITE_EVERY)
        if self._writing is not None:  # its flush brought no reply: sent again now
            self._take_back(self._writing)
        writes: dict[str, list[int]] = {}
        for slot in list(itertools.islice(self._unwritten, WRITE_MAX)):
            writes[slot] = self._unwritten.pop(slot)
        self._writing = writes
        reads = list(itertools.islice(reversed(self.started), READ_MAX))
        args: list[str | int] = [self.frontier.epoch, len(writes), len(COUNTS), *COUNTS]
        for slot, counts in writes.items():
            args += [slot, *counts]
        args += [STARTED, *reads]
        keys = self.frontier.keys
        # EVAL, not EVALSHA: a plain command in the flush's pipeline, whatever the
        # server's script cache holds (a failover or restart empties it)
        command = (
            "EVAL", source("slot_counts"), 3, keys.slot_sent, keys.slot_counts, keys.epoch, *args
        )  # fmt: skip
        return Read(Command(command), lambda reply: self._read(reply, writes, reads))

    def _read(self, reply: Any, writes: dict[str, list[int]], reads: list[str]) -> None:
        if self._writing is writes:
            self._writing = None
        if isinstance(reply, Exception):
            if str(reply).startswith(EPOCH_REFUSAL):
                # the crawl's run they belong to is over (finished, flushed): not written
                self.stats.inc_value("scheduler/slots/count_writes_fenced")
                self.started.clear()
                return
            self._take_back(writes)  # sent again with the next write
            self.stats.inc_value("scheduler/slots/count_errors")
            return
        at = 1 + COUNTS.index(STARTED)
        for slot, crawl_started in zip(reads, reply, strict=False):
            # the read includes this call's write; this worker's starts since are not in it
            since = self._unwritten.get(slot)
            self.started[slot] = int(crawl_started) + (since[at] if since else 0)
        self.stats.inc_value("scheduler/slots/count_writes")
