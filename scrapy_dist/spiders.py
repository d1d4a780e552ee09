"""Spiders that read their seeds from Redis and wait for more.

``RedisSpider`` and ``RedisCrawlSpider`` read seeds from the crawl's seeds key (a list by
default; a set or sorted set by setting) in batches of ``redis_batch_size``. Seeds are
fetched at start, whenever the worker has spare capacity and nothing queued (Scrapy's
``scheduler_empty`` signal, rate-limited), and when it is idle (``spider_idle``, where
the spider also refuses to close with :class:`~scrapy.exceptions.DontCloseSpider`). A
worker closes after ``MAX_IDLE_TIME_BEFORE_CLOSE`` seconds of real idleness, measured
from the last moment it had work; ``0`` keeps it waiting for seeds forever.

A seed that cannot become a request is logged with the reason, counted
(``seeds/invalid``) and appended to the crawl's dead-letter list; the rest of its batch
is still processed.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request, Spider, signals
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.spiders import CrawlSpider

from scrapy_dist import deadletter
from scrapy_dist.addon import settings_for
from scrapy_dist.connection import client_for
from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.exceptions import ConfigurationError, InvalidSeed
from scrapy_dist.keys import keys_for
from scrapy_dist.seeds import SeedQueue, parse_seed, request_from_seed

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: Shortest and longest pause between seed polls while seeds keep coming back empty.
SEED_POLL_MIN, SEED_POLL_MAX = 0.05, 1.0


class RedisSpiderMixin(Spider):
    """Reads seeds from Redis; see the module docstring for when.

    Class attributes a spider may set (each falls back to its setting):
    ``redis_key`` (a key template, default ``REDIS_START_URLS_KEY``),
    ``redis_batch_size``, ``redis_encoding``, ``max_idle_time``.
    """

    redis_key: str | None = None
    redis_batch_size: int | None = None
    redis_encoding: str | None = None
    max_idle_time: float | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.setup_redis(crawler)
        return spider

    def setup_redis(self, crawler: Crawler) -> None:
        """Read the settings, build the seeds queue and connect the signals (no I/O)."""
        settings = settings_for(crawler)
        keys = keys_for(crawler)
        #: The crawl's Redis client (scrapy-redis's attribute name).
        self.server = client_for(crawler)
        self.redis_key = keys.start_urls_key(self.redis_key) if self.redis_key else keys.start_urls
        self.redis_batch_size = int(
            self.redis_batch_size
            or settings.getint("REDIS_START_URLS_BATCH_SIZE")
            or settings.getint("CONCURRENT_REQUESTS")
        )
        if self.redis_batch_size < 1:
            raise ConfigurationError("REDIS_START_URLS_BATCH_SIZE must be at least 1")
        self.redis_encoding = self.redis_encoding or settings.get("REDIS_ENCODING")
        if self.max_idle_time is None:
            self.max_idle_time = settings.getfloat("MAX_IDLE_TIME_BEFORE_CLOSE")
        self.seeds = SeedQueue(self.server, self.redis_key, SeedQueue.kind_from_settings(settings))
        self.dead_letters = DeadLetters(self.server, keys.dead)
        self._idle_since: float | None = None
        self._next_poll = 0.0
        self._poll_pause = SEED_POLL_MIN
        crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        crawler.signals.connect(self._on_scheduler_empty, signal=signals.scheduler_empty)
        crawler.signals.connect(self._on_activity, signal=signals.request_reached_downloader)

    async def start(self) -> AsyncIterator[Any]:
        """Yield the requests of the seeds waiting in Redis now; later ones are fetched
        as the worker has room (see the module docstring).

        Raises:
            CloseSpider: the seeds key holds the wrong Redis type for the seed mode.
        """
        try:
            self.seeds.check_type()
        except ConfigurationError as e:
            logger.error("%(error)s", {"error": e}, extra={"spider": self})
            raise CloseSpider("seeds_key_wrong_type") from e
        for request in self.next_requests():
            yield request

    def make_request_from_data(self, data: bytes) -> Request | Iterable[Request] | None:
        """Turn one raw seed into a request (see :mod:`scrapy_dist.seeds` for the formats).

        Override to read another format; raise :class:`~scrapy_dist.exceptions.InvalidSeed`
        (or any exception) to send the seed to the dead-letter list, return ``None`` to
        skip it.
        """
        seed = parse_seed(data, self.redis_encoding or "utf-8")
        return request_from_seed(seed, self)

    def next_requests(self) -> list[Request]:
        """Pop one batch of seeds and return their requests; bad seeds go to the
        dead-letter list."""
        assert self.redis_batch_size is not None
        raw = self.seeds.pop(self.redis_batch_size)
        requests: list[Request] = []
        for data in raw:
            try:
                result = self.make_request_from_data(data)
                if result is None:
                    self.crawler.stats.inc_value("seeds/skipped")
                    continue
                requests += [result] if isinstance(result, Request) else list(result)
            except Exception as e:  # a bad seed must not take its batch down
                self._reject_seed(data, e)
        if raw:
            self.crawler.stats.inc_value("seeds/fetched", len(raw))
            logger.debug(
                "Read %(n)d seed(s) from %(key)s",
                {"n": len(raw), "key": self.redis_key},
                extra={"spider": self},
            )
        return requests

    def _reject_seed(self, data: bytes, error: Exception) -> None:
        if isinstance(error, InvalidSeed):
            reason = str(error)
        else:
            reason = f"{type(error).__name__}: {error}"
        logger.warning(
            "Invalid seed %(data)r: %(reason)s (kept in %(dead)s)",
            {"data": data[:200], "reason": reason, "dead": self.dead_letters.key},
            exc_info=not isinstance(error, InvalidSeed),
            extra={"spider": self},
        )
        self.crawler.stats.inc_value("seeds/invalid")
        self.dead_letters.add(deadletter.SEED, reason, data, key=self.redis_key)

    def schedule_next_requests(self) -> int:
        """Fetch one batch of seeds and hand their requests to the engine.

        Returns:
            The number of requests scheduled; 0 if there were no seeds or Redis failed
            (logged; the caller polls again later).
        """
        try:
            requests = self.next_requests()
        except redis.RedisError as e:
            logger.warning(
                "Could not read seeds from Redis: %(error)s", {"error": e}, extra={"spider": self}
            )
            return 0
        for request in requests:
            self.crawler.engine.crawl(request)
        return len(requests)

    def _on_activity(self, *_: Any, **__: Any) -> None:
        self._idle_since = None

    def _on_scheduler_empty(self) -> None:
        now = time.monotonic()
        if now < self._next_poll:
            return
        if self.schedule_next_requests():
            self._poll_pause = SEED_POLL_MIN
            self._next_poll = now
        else:
            self._next_poll = now + self._poll_pause
            self._poll_pause = min(self._poll_pause * 2, SEED_POLL_MAX)

    def _on_idle(self) -> None:
        """``spider_idle``: fetch seeds; stay open unless idle past ``max_idle_time``."""
        if self.schedule_next_requests():
            self._idle_since = None
            raise DontCloseSpider
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        idle = now - self._idle_since
        if self.max_idle_time and idle >= self.max_idle_time:
            logger.info(
                "Idle for %(idle).1fs with no seeds in %(key)s (MAX_IDLE_TIME_BEFORE_CLOSE="
                "%(max)s): closing",
                {"idle": idle, "key": self.redis_key, "max": self.max_idle_time},
                extra={"spider": self},
            )
            return
        raise DontCloseSpider


class RedisSpider(RedisSpiderMixin, Spider):
    """A :class:`~scrapy.Spider` whose seeds come from Redis."""


class RedisCrawlSpider(RedisSpiderMixin, CrawlSpider):
    """A :class:`~scrapy.spiders.CrawlSpider` whose seeds come from Redis."""
