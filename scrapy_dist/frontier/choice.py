"""Which frontier a crawler gets, built once per crawler: one
:class:`~scrapy_dist.frontier.core.Frontier` on the crawl's keys, or with
``SCHEDULER_SHARDS = N > 1`` a :class:`~scrapy_dist.frontier.shards.ShardedFrontier`
over N of them.

It sits above both so that the frontier of one shard needs not know that sharded crawls
exist; both are a :class:`~scrapy_dist.frontier.gateway.CrawlFrontier`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from scrapy_dist.assembly import assemble
from scrapy_dist.frontier.core import Frontier
from scrapy_dist.frontier.shards import ShardedFrontier

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_dist.frontier.gateway import CrawlFrontier

__all__ = ["frontier_for"]

_by_crawler: WeakKeyDictionary[Crawler, CrawlFrontier] = WeakKeyDictionary()


def frontier_for(crawler: Crawler) -> CrawlFrontier:
    """The crawler's frontier, built on first use from its settings (no I/O), by the
    scheduler or the spider, whichever asks first: nothing it needs comes from either.
    It is ``eager`` when ``SCHEDULER_FLUSH_INTERVAL`` is 0, and a crawl that does not
    persist deletes the crawl's shared dupefilter with it."""
    try:
        return _by_crawler[crawler]
    except KeyError:
        pass
    parts = assemble(crawler)
    frontier: CrawlFrontier
    if parts.config.frontier.shards > 1:
        frontier = ShardedFrontier.build(crawler, parts)
    else:
        frontier = Frontier.build_one(crawler, parts.config, parts.client, parts.keys)
    _by_crawler[crawler] = frontier
    return frontier
