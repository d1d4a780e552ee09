"""Spiders that crawl every page of a :class:`scrapy_dist.testing.TestSite`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.http import TextResponse

from scrapy_dist.spiders import RedisSpider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy.http import Response


class PagesParser(Spider):
    """The callback both spiders share: one item per page, then follow every link."""

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """Yield the page's item, then a request for each of its links (HTML pages only)."""
        if not isinstance(response, TextResponse):
            return
        yield {"url": response.url, "title": response.css("title::text").get()}
        yield from response.follow_all(css="a", callback=self.parse)


class PagesSpider(PagesParser, RedisSpider):
    """Follows every link of the site; one item per page.

    Seeds are read from the Redis list ``pages:start_urls``; run as many
    ``scrapy crawl pages`` workers as you like against the same ``REDIS_URL``.
    """

    name = "pages"


class LocalPagesSpider(PagesParser):
    """The same crawl in one process with Scrapy's own scheduler and dupefilter.

    A reference for the distributed crawl: ``scrapy crawl pages_local -a start_url=URL``.

    Args:
        start_url: The first page.
    """

    name = "pages_local"
    custom_settings = {  # noqa: RUF012 (the attribute Scrapy reads)
        "SCHEDULER": "scrapy.core.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
    }

    def __init__(self, start_url: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not start_url:
            raise ValueError("pass the first page with -a start_url=URL")
        self.start_urls = [start_url]

    async def start(self) -> AsyncIterator[Any]:
        """Yield the start page through the dupefilter, as scrapy_dist does with seeds.

        Scrapy's default start requests skip the dupefilter (``dont_filter=True``), so
        a start page that other pages link to would be fetched twice.
        """
        for url in self.start_urls:
            yield Request(url, callback=self.parse)
