"""robots.txt fetched once per crawl, not once per worker.

With ``ROBOTSTXT_OBEY``, Scrapy's ``RobotsTxtMiddleware`` fetches a site's robots.txt the
first time its process meets the site: N workers fetch it N times, outside any shared
politeness limit. :class:`SharedRobotsTxt`, a downloader middleware (enabled by the
add-on, or at 110 in ``DOWNLOADER_MIDDLEWARES``), keeps what a worker fetched in the
crawl's ``<crawl>:robots`` hash for ``ROBOTSTXT_SHARED_TTL`` seconds, and answers the
other workers' robots.txt requests from it, so that each site's robots.txt is fetched
about once per crawl. Scrapy's middleware still parses and applies it in every worker,
as it does; only the download is shared. Two workers that meet a new site at the same
moment may both fetch it.

A robots.txt request is recognized by the mark Scrapy's middleware puts on it
(``meta["dont_obey_robotstxt"]``) and its path ``/robots.txt``. A response is kept when
its status is below 500 (a 404 means "no rules", as Scrapy reads it) and its body at
most :data:`MAX_BODY` bytes (longer ones are fetched by each worker); errors and 5xx
are not kept, so the next worker tries again. What is read from Redis is untrusted: a
record that does not parse is ignored (counted ``robotstxt/shared/garbage``) and the
site fetched; its body only ever reaches the robots.txt parser, as a fetched one would.
A Redis error never fails the request: the site is fetched (``robotstxt/shared/errors``).

Stored format, one hash field per site (``scheme://netloc``): ``b"1|<fetched, seconds
since the epoch>|<status>|" + zlib(body)``. The hash expires ``ROBOTSTXT_SHARED_TTL``
after its last write.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import TYPE_CHECKING, Any

import redis
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

__all__ = ["MAX_BODY", "SharedRobotsTxt", "decode_record", "encode_record"]

logger = logging.getLogger(__name__)

#: Longest robots.txt body shared (Google reads the first 500 KiB of one).
MAX_BODY = 512 * 1024
#: The version tag of the stored format.
FORMAT = b"1"
#: The flag of a response answered from the crawl's copy.
FLAG = "shared robots.txt"


def encode_record(fetched: float, status: int, body: bytes) -> bytes:
    """The stored form of a robots.txt response (see the module docstring)."""
    return b"|".join((FORMAT, b"%d" % int(fetched), b"%d" % status, zlib.compress(body)))


def decode_record(value: bytes) -> tuple[float, int, bytes] | None:
    """``(fetched, status, body)`` of a stored record, or ``None`` when it does not
    parse (written by hand, another version, a body that does not decompress or is
    too long)."""
    parts = value.split(b"|", 3)
    if len(parts) != 4 or parts[0] != FORMAT:
        return None
    try:
        fetched, status = float(parts[1]), int(parts[2])
        inflater = zlib.decompressobj()
        body = inflater.decompress(parts[3], MAX_BODY + 1)
    except (ValueError, zlib.error):
        return None
    if not 100 <= status < 500 or len(body) > MAX_BODY or inflater.unconsumed_tail:
        return None
    return fetched, status, body


def _site(request: Request) -> str:
    url = urlparse_cached(request)
    return f"{url.scheme}://{url.netloc}"


def is_robots_request(request: Request) -> bool:
    """Whether ``request`` is Scrapy's robots middleware's own robots.txt request."""
    return bool(request.meta.get("dont_obey_robotstxt")) and (
        urlparse_cached(request).path == "/robots.txt"
    )


class SharedRobotsTxt:
    """The downloader middleware that shares robots.txt downloads (module docstring).

    Args:
        client: the crawl's Redis client.
        key: the crawl's ``<crawl>:robots`` hash.
        ttl: seconds a kept robots.txt is used (``ROBOTSTXT_SHARED_TTL``).
        stats: the crawler's stats collector.
    """

    def __init__(self, client: redis.Redis, key: str, ttl: float, stats: StatsCollector) -> None:
        self.client, self.key, self.ttl, self.stats = client, key, ttl, stats
        self._failing = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Off (``NotConfigured``) without ``ROBOTSTXT_OBEY`` or with a TTL of 0."""
        if not crawler.settings.getbool("ROBOTSTXT_OBEY"):
            raise NotConfigured("ROBOTSTXT_OBEY is off")
        from scrapy_dist.assembly import assemble

        parts = assemble(crawler)
        ttl = parts.config.politeness.robots_ttl
        if ttl <= 0:
            raise NotConfigured("ROBOTSTXT_SHARED_TTL is 0")
        assert crawler.stats is not None
        return cls(parts.client, parts.keys.robots, ttl, crawler.stats)

    def process_request(self, request: Request, spider: Any = None) -> Response | None:
        """A robots.txt request another worker already fetched: answered from Redis."""
        if not is_robots_request(request):
            return None
        try:
            value = self.client.hget(self.key, _site(request))
        except redis.RedisError as e:
            self._failed(e)
            return None
        self._recovered()
        if value is None:
            return None
        record = decode_record(value) if isinstance(value, bytes) else None
        if record is None:
            self.stats.inc_value("robotstxt/shared/garbage")
            return None
        fetched, status, body = record
        if not 0 <= time.time() - fetched < self.ttl:
            return None
        self.stats.inc_value("robotstxt/shared/hits")
        return Response(request.url, status=status, body=body, request=request, flags=[FLAG])

    def process_response(
        self, request: Request, response: Response, spider: Any = None
    ) -> Response:
        """A robots.txt this worker fetched: kept for the others."""
        if (
            not is_robots_request(request)
            or FLAG in response.flags
            or response.status >= 500
            or len(response.body) > MAX_BODY
        ):
            return response
        record = encode_record(time.time(), response.status, response.body)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hset(self.key, _site(request), record)
                pipe.expire(self.key, max(1, round(self.ttl)))
                pipe.execute()
        except redis.RedisError as e:
            self._failed(e)
            return response
        self._recovered()
        self.stats.inc_value("robotstxt/shared/stored")
        return response

    def _failed(self, error: redis.RedisError) -> None:
        self.stats.inc_value("robotstxt/shared/errors")
        if not self._failing:
            self._failing = True
            logger.warning(
                "Cannot share robots.txt through Redis (%(error)s): this worker fetches "
                "each site's robots.txt itself until Redis answers again",
                {"error": error},
            )

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            logger.info("robots.txt is shared through Redis again")
