"""The parts every component of a crawler shares, assembled once per crawler.

:func:`assemble` builds, the first time a component's ``from_crawler`` asks, the
crawler's :class:`~scrapy_dist.config.core.Config` (from its final settings), its one Redis
client (:mod:`scrapy_dist.connection`), its keys (:mod:`scrapy_dist.keys`, named after
the spider instance and stamped on the Redis server's clock) and the scripts registered
on that client (:mod:`scrapy_dist.scripts`), and returns the same :class:`Parts` after
that (each part is made when first needed). Only ``from_crawler`` methods call it;
constructors receive the parts.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from functools import cached_property
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary, ref

from scrapy_dist.config.core import Config
from scrapy_dist.connection import client_from_config, crawl_client
from scrapy_dist.keys import hash_tag_on, keys_from_config, server_time
from scrapy_dist.scripts import Scripts, scripts_for

if TYPE_CHECKING:
    import redis
    from scrapy.crawler import Crawler

    from scrapy_dist.keys import RedisKeys


class Parts:
    """What the components of one crawler share, each made the first time it is needed
    and then kept (building the client and the keys does no I/O, except the one
    ``TIME`` call of a timestamped job), so a component that needs only settings never
    trips over another part's invalid settings.

    Attributes:
        config: the crawler's settings, parsed.
        topology_client: the client of the configured topology (one server, Sentinel's
            master, or a Redis Cluster), for commands that are not the crawl's.
        client: the crawl's client (:func:`~scrapy_dist.connection.crawl_client`):
            :attr:`topology_client` itself, or under Cluster a client pinned to the node
            owning the crawl's hash slot, after checking that every key of the crawl
            hashes to that slot.
        keys: the crawl's key names (hash-tagged under Cluster).
        scripts: the Lua scripts, registered on :attr:`client`.
    """

    config: Config
    _crawler: ref[Crawler]

    def __init__(self, crawler: Crawler, config: Config) -> None:
        object.__setattr__(self, "_crawler", ref(crawler))
        object.__setattr__(self, "config", config)

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}: Parts are frozen")

    @cached_property
    def topology_client(self) -> redis.Redis:
        return client_from_config(self.config.connection)

    @cached_property
    def client(self) -> redis.Redis:
        items = self.keys.custom(self.config.keys.items, "REDIS_ITEMS_KEY")
        return crawl_client(self.topology_client, self.keys, extra=(items, *self._more_seeds()))

    def _more_seeds(self) -> list[str]:
        """The seeds keys of a list-form ``redis_key`` after its first (which is
        :attr:`keys`' ``start_urls``), to be checked in the crawl's slot too."""
        crawler = self._crawler()
        spider = getattr(crawler, "spider", None) if crawler is not None else None
        templates = getattr(spider, "redis_key", None)
        if not isinstance(templates, (list, tuple)):
            return []
        return [self.keys.start_urls_key(str(t)) for t in templates[1:] if t]

    @cached_property
    def keys(self) -> RedisKeys:
        crawler = self._crawler()
        if crawler is None:  # pragma: no cover - parts outlive their crawler only in misuse
            raise RuntimeError("the crawler of these parts is gone")
        spider = getattr(crawler, "spider", None)
        name = spider.name if spider is not None else crawler.spidercls.name
        now = server_time(self.topology_client) if self.config.keys.job_timestamp else None
        redis_key = getattr(spider, "redis_key", None)
        return keys_from_config(
            self.config.keys, name, now, redis_key=redis_key, hash_tag=hash_tag_on(self.config)
        )

    @cached_property
    def scripts(self) -> Scripts:
        return scripts_for(self.client)


_assembled: WeakKeyDictionary[Crawler, Parts] = WeakKeyDictionary()


def assemble(crawler: Crawler) -> Parts:
    """Return the crawler's parts, assembling them on first use.

    The crawl is named after the spider *instance* (a spider may set its ``name`` in
    ``__init__``; before there is one, after the spider class), and a spider's
    ``redis_key`` (a class attribute or ``-a redis_key=``) names its seeds key. With
    ``SCHEDULER_JOB_TIMESTAMP``, the stamp is taken from the Redis server's clock (one
    ``TIME`` call, when the keys are first needed), so workers whose clocks disagree
    still join the same crawl, and every component agrees on it even if the crawl runs
    past a stamp boundary.

    Raises:
        RuntimeError: the settings are not final yet (see
            :meth:`scrapy_dist.config.core.Config.from_crawler`).
    """
    try:
        return _assembled[crawler]
    except KeyError:
        pass
    parts = _assembled[crawler] = Parts(crawler, Config.from_crawler(crawler))
    return parts
