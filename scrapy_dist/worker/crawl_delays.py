"""robots.txt ``Crawl-delay`` for a queue per download slot: a site's ``Crawl-delay`` that
asks for more than its slot's delay (``DOWNLOAD_SLOTS``, else the default) becomes the
slot's delay in the queue's delays hash (``<queue>:delays``), so that every worker's
reserves space the site's requests by it (``lua/_levels.lua`` take_slots).

A worker learns a site's ``Crawl-delay`` once Scrapy's ``RobotsTxtMiddleware`` has read
its robots.txt (:func:`scrapy_dist.worker.engine.robots_crawl_delay`), looked up when a
request of the site reaches the downloader; the write rides the next flush, and one
that got no reply is sent again with the next. Every :data:`REWRITE_EVERY` seconds the
worker writes all it knows again: the hash goes with the crawl's frontier when the crawl
finishes or is flushed, and a worker that stays up crawls the next run with it. A
delay over :data:`~scrapy_dist.frontier.wire.SLOT_DELAY_MAX` is cut to it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scrapy import signals

from scrapy_dist.frontier.events import Read
from scrapy_dist.frontier.outbox import Command
from scrapy_dist.frontier.wire import SLOT_DELAY_MAX
from scrapy_dist.keys import SLOTS_DELAYS_SUFFIX, slot_id
from scrapy_dist.lua_source import source
from scrapy_dist.slots import host_slot, slot_of
from scrapy_dist.worker import engine as _engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.slots import Limits

#: Seconds between two writes of every ``Crawl-delay`` this worker knows.
REWRITE_EVERY = 30.0


class CrawlDelays:
    """The ``Crawl-delay`` of each slot this worker met, written to the queue's delays
    hash when it is longer than the slot's own delay.

    Args:
        crawl_delay: a request's site's ``Crawl-delay`` once read (``None``: not yet).
        limits: each slot's delay from the settings.
        key: the queue's delays hash.
        clock: monotonic seconds (tests give their own).
    """

    def __init__(
        self,
        crawl_delay: Any,
        limits: Limits,
        key: str,
        stats: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.crawl_delay = crawl_delay
        self.limits = limits
        self.key = key
        self.stats = stats
        self.clock = clock
        #: Host names whose site's delay is known (written, or no longer than their own).
        self._known: set[str] = set()
        #: Slots Scrapy's downloader named otherwise than by the host (an address, a
        #: ``download_slot``) whose delay is known: the first of their sites' read.
        self._known_slots: set[str] = set()
        #: The names (escaped) written as a host's name: over what Redis holds, where a
        #: name Scrapy's downloader gave (an address) goes only where it holds none.
        self._hosts: set[str] = set()
        #: The delays written (escaped slot -> seconds), written again now and then.
        self._written: dict[str, float] = {}
        self._to_write: dict[str, float] = {}
        self._writing: dict[str, float] | None = None
        self._rewrite_at = clock() + REWRITE_EVERY

    @classmethod
    def for_crawler(cls, crawler: Crawler, frontier: CrawlFrontier, limits: Limits) -> Self:
        """Those of a crawler's worker whose queue is a queue per slot (its robots
        middleware checked now: a Scrapy that renamed its parsers fails loudly)."""
        _engine.check_robots(crawler)
        delays = cls(
            lambda request: _engine.robots_crawl_delay(crawler, request),
            limits,
            frontier.queue.key + SLOTS_DELAYS_SUFFIX,
            stats=crawler.stats,
        )
        crawler.signals.connect(delays.reached, signal=signals.request_reached_downloader)
        frontier.events.carry(delays.rider)
        return delays

    def reached(self, request: Request, spider: object = None) -> None:
        """``request_reached_downloader``: note its site's ``Crawl-delay`` once read,
        for each name the queue may give the site's requests: the slot Scrapy's
        downloader gave this one (``meta["download_slot"]``, which a retry keeps) and
        the host name (a new request's, as :func:`~scrapy_dist.slot_queue.payload_slot_of`
        names it). They differ with ``CONCURRENT_REQUESTS_PER_IP`` (Scrapy names the
        slot by the host's address) or a ``download_slot`` of the spider's.

        A host name is known by its own site's robots.txt only: the address another
        host resolved to may also be a host's name (``http://127.0.0.1/`` beside
        ``http://localhost/``), whose own ``Crawl-delay`` is still read then. A name
        written both ways keeps the longer delay."""
        slot, host = slot_of(request), host_slot(request)
        names = [slot] if slot != host and slot not in self._known_slots else []
        if host not in self._known:
            names.append(host)
        if not names:
            return
        delay = self.crawl_delay(request)
        if delay is None:  # robots.txt not read yet
            return
        delay = min(delay, SLOT_DELAY_MAX)
        for name in names:
            (self._known if name == host else self._known_slots).add(name)
            if delay > self.limits.of(name).delay:
                self.limits.crawl_delays[name] = delay
                self._to_write[slot_id(name)] = delay
                if name == host:
                    self._hosts.add(slot_id(name))

    def rider(self) -> Read | None:
        """The write for a flush to carry, when there is one."""
        if self._writing is not None:  # its flush brought no reply: again
            self._to_write = {**self._writing, **self._to_write}
        if self._written and self.clock() >= self._rewrite_at:
            self._rewrite_at = self.clock() + REWRITE_EVERY
            self._to_write = {**self._written, **self._to_write}
        if not self._to_write:
            self._writing = None
            return None
        writes, self._to_write = self._to_write, {}
        self._writing = writes
        args: list[str | int] = []
        for slot, delay in writes.items():
            args += [slot, repr(delay), "h" if slot in self._hosts else "s"]
        # EVAL, not EVALSHA: a plain command in the flush's pipeline, whatever the
        # server's script cache holds (a failover or restart empties it)
        command = ("EVAL", source("crawl_delays"), 1, self.key, *args)
        return Read(Command(command), lambda reply: self._replied(reply, writes))

    def _replied(self, reply: Any, writes: dict[str, float]) -> None:
        if self._writing is writes:
            self._writing = None
        if isinstance(reply, Exception):
            self._to_write = {**writes, **self._to_write}
            return
        new = [slot for slot in writes if slot not in self._written]
        self._written.update(writes)
        if new and self.stats is not None:
            self.stats.inc_value("scheduler/slots/crawl_delays", len(new))
