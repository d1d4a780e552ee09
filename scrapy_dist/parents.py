"""Which request produced each request a callback returns: its *parent*.

A worker's enqueue of a callback's requests carries the lease id of their parent, and
Redis refuses them if the worker no longer holds that lease (``lua/enqueue.lua``): a
worker paused past ``SCHEDULER_LEASE_TIMEOUT`` whose leases were taken over does not
queue the children of the pages it held when it resumes; their new holders do.

Scrapy hands the scheduler a request without saying which response it came from; the
one public place that sees both is a spider middleware. :class:`ParentLinks` (installed
by :class:`~scrapy_dist.addon.DistAddon`, or named in ``SPIDER_MIDDLEWARES``) records
the link, weakly, for the scheduler to read. Requests that no callback returned (start
requests, seeds, redirects and retries made by downloader middlewares) have no parent
and are fenced by the crawl's epoch only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from scrapy import Request

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Iterator

    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

__all__ = ["Links", "ParentLinks", "links_for"]

#: Where ``SPIDER_MIDDLEWARES`` puts :class:`ParentLinks`: nearest the engine, so it
#: sees the requests every other middleware let through.
ORDER = 0


class Links:
    """The parents of one crawler's requests (weak: a link goes with its child)."""

    def __init__(self) -> None:
        self._parents: WeakKeyDictionary[Request, Request] = WeakKeyDictionary()
        #: Whether a :class:`ParentLinks` middleware records links for this crawler.
        self.installed = False

    def link(self, child: Request, parent: Request) -> None:
        """Record that ``parent``'s callback returned ``child``."""
        if child is not parent:
            self._parents[child] = parent

    def parent(self, child: Request) -> Request | None:
        """The request whose callback returned ``child``, or ``None``."""
        return self._parents.get(child)


_by_crawler: WeakKeyDictionary[Crawler, Links] = WeakKeyDictionary()


def links_for(crawler: Crawler) -> Links:
    """The crawler's links (created on first use)."""
    try:
        return _by_crawler[crawler]
    except KeyError:
        links = _by_crawler[crawler] = Links()
        return links


class ParentLinks:
    """Spider middleware: links each request a callback returns to the request of the
    response it was called with (see the module docstring)."""

    def __init__(self, links: Links) -> None:
        self.links = links
        links.installed = True

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """The middleware of ``crawler``'s links."""
        return cls(links_for(crawler))

    def _link(self, response: Response | None, output: Any) -> Any:
        parent = getattr(response, "request", None)
        if isinstance(output, Request) and isinstance(parent, Request):
            self.links.link(output, parent)
        return output

    def process_spider_output(
        self, response: Response, result: Iterable[Any], spider: object = None
    ) -> Iterator[Any]:
        """Link and pass on every request of ``result``."""
        for output in result:
            yield self._link(response, output)

    async def process_spider_output_async(
        self, response: Response, result: AsyncIterator[Any], spider: object = None
    ) -> AsyncIterator[Any]:
        """Link and pass on every request of ``result`` (asynchronous callbacks)."""
        async for output in result:
            yield self._link(response, output)
