"""A scheduler driven by hand, as Scrapy's engine drives it, for tests of the frontier.

:class:`HeldRequests` opens scrapy_dist's :class:`~scrapy_dist.scheduler.Scheduler` for
a crawler and stands in for the engine: the requests it *holds* are exactly those the
test took and has not finished, so the scheduler's view of what is in flight is the
test's. Nothing runs by itself but the scheduler's own timer (stop it with
:meth:`HeldRequests.close`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.http import Response
from scrapy.utils.misc import build_from_crawler

from scrapy_dist.frontier.core import Frontier
from scrapy_dist.parents import ParentLinks
from scrapy_dist.scheduler import Scheduler

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_dist.frontier.gateway import CrawlFrontier

__all__ = ["HeldRequests"]


def one_shard(frontier: CrawlFrontier) -> Frontier:
    """``frontier`` as the one-shard :class:`Frontier` it is, for tests of the parts
    below the gateway (its outbox, its leases).

    Raises:
        TypeError: it is a sharded crawl's.
    """
    if not isinstance(frontier, Frontier):
        raise TypeError(f"the frontier is a {type(frontier).__name__}, not one shard's")
    return frontier


class HeldRequests:
    """A scheduler whose engine holds exactly the requests the test says it holds.

    Args:
        crawler: a crawler whose spider is set (its settings choose the scheduler's).
        started: when the worker's process started (monotonic seconds), for tests of
            the start-up grace; ``None`` keeps the scheduler's own.
        holding: the set that stands for what the engine holds (default: a new one),
            for tests that fill it themselves.
    """

    def __init__(
        self,
        crawler: Crawler,
        started: float | None = None,
        *,
        holding: set[Request] | None = None,
    ) -> None:
        # the spider middleware Scrapy builds before it opens the scheduler
        self.links = ParentLinks.from_crawler(crawler)
        self.scheduler: Scheduler = build_from_crawler(Scheduler, crawler)
        if started is not None:
            self.scheduler.registry.started = started
        self.holding: set[Request] = set() if holding is None else holding
        self.scheduler.deliveries.in_flight = lambda: self.holding
        assert crawler.spider is not None
        self.scheduler.open(crawler.spider)

    def take(self) -> Request | None:
        """The scheduler's next request, now held by the engine (``None``: none)."""
        request = self.scheduler.next_request()
        if request is not None:
            self.holding.add(request)
        return request

    def returns(self, parent: Request, *children: Request) -> None:
        """``parent``'s callback returns ``children``: through the spider middleware
        to the scheduler, as Scrapy's scraper sends them."""
        response = Response(parent.url, request=parent)
        for child in self.links.process_spider_output(response, children):
            self.scheduler.enqueue_request(child)

    def finish(self, request: Request) -> None:
        """The engine is done with ``request``: the scheduler settles what it can."""
        self.holding.discard(request)
        self.scheduler.deliveries.settle()

    @property
    def frontier(self) -> CrawlFrontier:
        return self.scheduler.frontier

    @property
    def one_shard(self) -> Frontier:
        """The worker's frontier as the one-shard :class:`Frontier` it is
        (:func:`one_shard`)."""
        return one_shard(self.scheduler.frontier)

    def close(self) -> None:
        """Stop the scheduler's timer (the scheduler itself stays open)."""
        ticker = self.scheduler.heartbeat.ticker
        if ticker is not None and ticker.running:
            ticker.stop()
