"""Slot pauses: a site that asks the crawl to slow down is left alone by every worker.

A ``429`` or ``503`` response with a ``Retry-After`` header (seconds, or an HTTP date)
pauses its download slot for as long as it asks, at most ``SCHEDULER_SLOT_PAUSE_MAX``
seconds; a run of ``SCHEDULER_SLOT_BACKOFF_AFTER`` such responses without one, in a row
at one worker, pauses it for ``SCHEDULER_SLOT_BACKOFF`` seconds, doubled for each run
after (any other response of the slot ends the run and the doubling). A pause is
written to the crawl's ``<crawl>:slots:paused`` (``lua/slot_pauses.lua``, server time,
so clocks need not agree), which every worker reads about once a second with a flush it
sends anyway; the worker that saw the response pauses the slot at once.

A paused slot's requests are not sent: the start horizon (:mod:`scrapy_dist.worker.horizon`)
counts the pause as a wait, so a worker hands them back to the queue and takes other
slots' requests, and they are leased again when the pause ends; with
``SCHEDULER_POLITENESS``, the shared gate (``lua/politeness.lua``) grants no token of a
paused slot before its pause ends (a token granted before may still be used). Scrapy's
own retries of those responses (``RetryMiddleware``) go through the queue like any
request and wait too. With neither (``SCHEDULER_START_HORIZON = 0`` without politeness)
there are no pauses.

The slot name comes from the request (its host, or ``meta["download_slot"]``): it is
only a member of the zset, never part of a key name, and a long one is named by its
SHA-1 (:func:`scrapy_dist.slots.bound_slot`). With the queue per download slot, the
host's name is paused too where the slot has another (``host_too``).
"""

from __future__ import annotations

import email.utils
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals

from scrapy_dist.frontier.events import Read
from scrapy_dist.frontier.outbox import Command
from scrapy_dist.lua_source import source
from scrapy_dist.slots import bound_slot, host_slot

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.frontier.gateway import CrawlFrontier

__all__ = ["SlotPauses", "retry_after"]

logger = logging.getLogger(__name__)

#: Responses that ask a client to slow down.
SLOW_DOWN = (429, 503)
#: Seconds between two reads of the crawl's pauses.
READ_EVERY = 1.0


def retry_after(value: bytes | str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` header value asks for (delta-seconds or an HTTP
    date), or ``None`` when absent or unreadable; never negative."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None or when.tzinfo is None:
        return None
    seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


class SlotPauses:
    """The pauses in force for this worker, and the responses that start them.

    Args:
        frontier: the crawl's frontier (its client, keys and flushes).
        slot_key: the download slot key of a request (Scrapy's downloader's).
        stats: the crawler's stats collector.
        longest: ``SCHEDULER_SLOT_PAUSE_MAX`` seconds.
        backoff_after: ``SCHEDULER_SLOT_BACKOFF_AFTER`` (0: runs never pause a slot).
        backoff: ``SCHEDULER_SLOT_BACKOFF`` seconds.
        host_too: pause a request's host name too where its slot has another name (an
            address, with ``CONCURRENT_REQUESTS_PER_IP``): the queue per download slot
            names a site's new requests by their host, and holds them in Redis then.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        frontier: CrawlFrontier,
        slot_key: Callable[[Request], str],
        stats: StatsCollector,
        *,
        longest: float,
        backoff_after: int,
        backoff: float,
        host_too: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.frontier = frontier
        self.slot_key = slot_key
        self.host_too = host_too
        self.stats = stats
        self.longest_ms = max(1, round(longest * 1000))
        self.backoff_after = backoff_after
        self.backoff = backoff
        self.clock = clock
        #: Stored slot name -> monotonic time its pause ends.
        self.until: dict[str, float] = {}
        #: Pauses to write: stored slot name -> milliseconds.
        self._to_write: dict[str, int] = {}
        #: The pauses a flush carries, until its reply (a flush that fails as a whole
        #: brings none: the next read sends them again; a pause written twice is one).
        self._writing: dict[str, int] | None = None
        #: Slot -> 429/503 responses in a row without Retry-After, and runs so far.
        self._run: dict[str, int] = {}
        self._runs: dict[str, int] = {}
        self._next_read = 0.0

    @classmethod
    def for_crawler(
        cls,
        crawler: Crawler,
        frontier: CrawlFrontier,
        slot_key: Callable[[Request], str],
        *,
        longest: float,
        backoff_after: int,
        backoff: float,
        host_too: bool = False,
    ) -> SlotPauses:
        """The pauses of a crawler's scheduler: its responses watched, its frontier's
        flushes carrying the reads."""
        assert crawler.stats is not None
        pauses = cls(
            frontier,
            slot_key,
            crawler.stats,
            longest=longest,
            backoff_after=backoff_after,
            backoff=backoff,
            host_too=host_too,
        )
        crawler.signals.connect(pauses.downloaded, signal=signals.response_downloaded)
        frontier.events.carry(pauses.rider)
        return pauses

    def left(self, slot: str) -> float:
        """Seconds left of ``slot``'s pause (0: not paused)."""
        stored = bound_slot(slot)
        until = self.until.get(stored)
        if until is None:
            return 0.0
        left = until - self.clock()
        if left <= 0:
            del self.until[stored]
            return 0.0
        return left

    # -- responses ------------------------------------------------------------------------

    def downloaded(self, response: Response, request: Request, spider: object = None) -> None:
        """``response_downloaded`` (before the downloader middlewares, which may turn a
        429 or 503 into a retry): a 429 or 503 may pause its slot (module docstring)."""
        if response.status not in SLOW_DOWN and not (self._run or self._runs):
            return  # (every response passes here: no slot to read while no run is open)
        slot = bound_slot(self.slot_key(request))
        if response.status not in SLOW_DOWN:
            self._run.pop(slot, None)
            self._runs.pop(slot, None)
            return
        host = host_slot(request) if self.host_too else slot
        asked = retry_after(response.headers.get(b"Retry-After"))
        if asked is not None:
            self._run.pop(slot, None)
            self.pause(slot, asked, f"Retry-After on a {response.status}", host=host)
            return
        if not self.backoff_after:
            return
        self._run[slot] = self._run.get(slot, 0) + 1
        if self._run[slot] < self.backoff_after:
            return
        self._run[slot] = 0
        runs = self._runs[slot] = self._runs.get(slot, 0) + 1
        self.pause(
            slot,
            self.backoff * 2 ** min(runs - 1, 30),
            f"{self.backoff_after} responses {response.status} or 429/503 in a row",
            host=host,
        )

    def pause(self, slot: str, seconds: float, why: str, *, host: str | None = None) -> None:
        """Pause ``slot`` (stored name) for ``seconds`` (at most the longest pause) here
        at once, and for every worker with the next flush; the same for ``host``, the
        slot of the request's host name, where it is another name (see ``host_too``)."""
        ms = min(self.longest_ms, max(0, round(seconds * 1000)))
        if not ms:
            return
        until = self.clock() + ms / 1000
        names = dict.fromkeys((slot, host or slot))
        for name in names:
            if until > self.until.get(name, 0.0):
                self.until[name] = until
            self._to_write[name] = max(ms, self._to_write.get(name, 0))
        self._next_read = 0.0  # the next flush carries the write
        self.stats.inc_value("scheduler/slots/paused")
        logger.info(
            "Pausing download slot %(slot)s for %(s).1fs for every worker (%(why)s)",
            {"slot": " and ".join(names), "s": ms / 1000, "why": why},
        )

    # -- Redis ----------------------------------------------------------------------------

    def rider(self) -> Read | None:
        """The read (and the writes) for a flush to carry, about once a second, or at
        once when this worker paused a slot."""
        now = self.clock()
        if now < self._next_read:
            return None
        self._next_read = now + READ_EVERY
        if self._writing is not None:  # its flush brought no reply
            self._keep(self._writing)
        writes, self._to_write = self._to_write, {}
        self._writing = writes
        args: list[str | int] = [self.longest_ms]
        for slot, ms in writes.items():
            args += [slot, ms]
        # EVAL, not EVALSHA: a plain command in the flush's pipeline, whatever the
        # server's script cache holds (a failover or restart empties it)
        command = ("EVAL", source("slot_pauses"), 1, self.frontier.keys.slot_pauses, *args)
        return Read(Command(command), lambda reply: self._read(reply, writes))

    def _keep(self, writes: dict[str, int]) -> None:
        """Pauses that were not written wait for the next read."""
        for slot, ms in writes.items():
            self._to_write[slot] = max(ms, self._to_write.get(slot, 0))

    def _read(self, reply: Any, writes: dict[str, int]) -> None:
        if self._writing is writes:
            self._writing = None
        if isinstance(reply, Exception):
            self._keep(writes)  # sent again with the next read
            self.stats.inc_value("scheduler/slots/read_errors")
            return
        now = self.clock()
        found: dict[str, float] = {}
        for i in range(1, len(reply) - 1, 2):
            name = reply[i].decode("utf-8", "replace") if isinstance(reply[i], bytes) else reply[i]
            found[str(name)] = now + int(reply[i + 1]) / 1000
        for slot, until in found.items():
            if until > self.until.get(slot, 0.0):
                self.until[slot] = until
