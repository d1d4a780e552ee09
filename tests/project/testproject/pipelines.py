"""An item pipeline for the end-to-end tests: holds each item ``SLOW_ITEMS_DELAY``
seconds without blocking, so responses wait in Scrapy's scraper (as with a slow
database) while downloads go on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet import reactor
from twisted.internet.task import deferLater

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred
    from typing_extensions import Self


class SlowPipeline:
    def __init__(self, delay: float) -> None:
        self.delay = delay

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler.settings.getfloat("SLOW_ITEMS_DELAY", 0.2))

    def process_item(self, item: Any, spider: Any = None) -> Deferred[Any]:
        return deferLater(reactor, self.delay, lambda: item)
