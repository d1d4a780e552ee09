"""The same crawl with three schedulers: follow every link, one small item per page.

- ``memory``: Scrapy's own in-memory scheduler and dupefilter, one process
  (``-a start_url=URL``); the ceiling the distributed schedulers are measured against.
- ``dist``: scrapy_dist, seeds from the Redis list ``dist:start_urls``.
- ``sredis``: scrapy-redis, seeds from ``sredis:start_urls``; defined only when
  ``scrapy_redis`` is installed.

``-a gate=PATH`` makes a spider wait until ``PATH`` exists before it yields anything, so
the benchmark can start several worker processes and release them together;
``-a follow=no`` makes it crawl its seeds only (``bench_hoarding.py``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast

from scrapy import Request, Spider
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.task import deferLater

from scrapy_dist.spiders import RedisSpider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy.http import Response, TextResponse

_GATE_POLL = 0.01


async def wait_for_gate(path: str | None) -> None:
    """Return once ``path`` exists (at once if ``path`` is empty)."""
    from twisted.internet import reactor  # the installed one: never import it at the top

    while path and not os.path.exists(path):
        await maybe_deferred_to_future(deferLater(reactor, _GATE_POLL, lambda: None))


class PagesParser(Spider):
    """The callback every benchmark spider shares."""

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """One small item, then a request for every link of the page (none with
        ``-a follow=no``)."""
        yield {"url": response.url}
        if getattr(self, "follow", "yes") == "no":
            return
        # the site's pages are HTML: Scrapy gives a TextResponse, which has css=
        yield from cast("TextResponse", response).follow_all(css="a", callback=self.parse)


class MemorySpider(PagesParser):
    """Scrapy's in-memory scheduler: ``scrapy crawl memory -a start_url=URL [-a gate=PATH]``."""

    name = "memory"
    custom_settings = {  # noqa: RUF012 (the attribute Scrapy reads)
        "SCHEDULER": "scrapy.core.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
    }

    def __init__(
        self, start_url: str | None = None, gate: str | None = None, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if not start_url:
            raise ValueError("pass the first page with -a start_url=URL")
        self.start_url = start_url
        self.gate = gate

    async def start(self) -> AsyncIterator[Any]:
        """The start page, through the dupefilter like a seed of the Redis spiders."""
        await wait_for_gate(self.gate)
        yield Request(self.start_url, callback=self.parse)


class DistSpider(PagesParser, RedisSpider):
    """scrapy_dist: ``scrapy crawl dist``, then ``LPUSH dist:start_urls URL``."""

    name = "dist"
    custom_settings = {  # noqa: RUF012
        "SCHEDULER": "scrapy_dist.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_dist.dupefilter.RFPDupeFilter",
    }


try:
    from scrapy_redis.spiders import RedisSpider as ScrapyRedisSpider
except ImportError:  # scrapy-redis is optional
    pass
else:

    class SRedisSpider(PagesParser, ScrapyRedisSpider):  # type: ignore[misc]
        """scrapy-redis: ``scrapy crawl sredis``, then ``LPUSH sredis:start_urls URL``."""

        name = "sredis"
        custom_settings = {  # noqa: RUF012
            "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        }
