"""Request fingerprint dupefilter over Redis.

:class:`RFPDupeFilter` hashes requests with the crawler's
``request_fingerprinter`` (so ``REQUEST_FINGERPRINTER_CLASS`` applies) and keeps the
raw digests in a backend. Under scrapy_dist's scheduler the test-and-set happens inside
the enqueue script, atomically with the push; used with Scrapy's own scheduler,
:meth:`RFPDupeFilter.request_seen` makes one round trip. The filter never deletes its
key on close: the scheduler decides, by ``SCHEDULER_PERSIST``, when a crawl's state goes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.request import referer_str

from scrapy_dist.addon import settings_for
from scrapy_dist.connection import client_for
from scrapy_dist.keys import keys_for

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol
    from typing_extensions import Self

    from scrapy_dist.bloom import LocalBloom

logger = logging.getLogger(__name__)


class SetBackend:
    """Exact fingerprint storage: a Redis set of raw digests (``SADD`` tells if new)."""

    kind: ClassVar[str] = "set"

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client = client
        self.key = key

    def script_keys(self) -> list[str]:
        """Keys the enqueue script's dedupe step touches."""
        return [self.key]

    def script_args(self) -> list[str | int | float]:
        """The set needs no backend-wide arguments."""
        return []

    def token(self, fingerprint: bytes) -> bytes:
        """The set stores the raw fingerprint."""
        return fingerprint

    def keys(self) -> list[str]:
        """Every key this backend owns."""
        return [self.key]

    def add(self, fingerprint: bytes) -> bool:
        """Record ``fingerprint``; return ``True`` if it was not recorded before."""
        return bool(self.client.sadd(self.key, fingerprint))

    def __contains__(self, fingerprint: bytes) -> bool:
        # redis-py annotates members as str; any bytes-like value is sent as is.
        return bool(self.client.sismember(self.key, fingerprint))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return int(self.client.scard(self.key))

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Forget every fingerprint."""
        (pipe or self.client).delete(self.key)


class RFPDupeFilter(BaseDupeFilter):
    """Scrapy dupefilter whose fingerprints live in Redis, shared by every worker.

    Args:
        backend: where fingerprints are stored.
        fingerprinter: the crawler's request fingerprinter.
        debug: log every filtered request, not only the first (``DUPEFILTER_DEBUG``).
        stats: the crawler's stats collector.
        local: an in-memory filter of fingerprints this worker already knows are
            recorded in Redis, to skip their round trip; ``None`` to always ask Redis.
    """

    def __init__(
        self,
        backend: SetBackend,
        fingerprinter: RequestFingerprinterProtocol,
        *,
        debug: bool = False,
        stats: StatsCollector | None = None,
        local: LocalBloom | None = None,
    ) -> None:
        self.backend = backend
        self.local = local
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.stats = stats
        self.logdupes = True

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        keys = keys_for(crawler)
        return cls(
            SetBackend(client_for(crawler), keys.dupefilter),
            crawler.request_fingerprinter,
            debug=settings_for(crawler).getbool("DUPEFILTER_DEBUG"),
            stats=crawler.stats,
        )

    def fingerprint(self, request: Request) -> bytes:
        """The raw fingerprint of ``request``."""
        return self.fingerprinter.fingerprint(request)

    def seen_locally(self, fingerprint: bytes) -> bool:
        """Whether this worker already knows ``fingerprint`` is recorded in Redis."""
        return self.local is not None and fingerprint in self.local

    def remember(self, fingerprint: bytes) -> None:
        """Note that ``fingerprint`` is now recorded in Redis (it was queued or filtered)."""
        if self.local is not None:
            self.local.add(fingerprint)

    def request_seen(self, request: Request) -> bool:
        """Record the request's fingerprint; return ``True`` if it was already there."""
        return not self.backend.add(self.fingerprint(request))

    def clear(self) -> None:
        """Forget every fingerprint of this crawl."""
        self.backend.clear()

    def log(self, request: Request, spider: Spider) -> None:
        """Log a filtered request (the first only, unless ``DUPEFILTER_DEBUG``) and count it."""
        if self.debug:
            logger.debug(
                "Filtered duplicate request: %(request)s (referer: %(referer)s)",
                {"request": request, "referer": referer_str(request)},
                extra={"spider": spider},
            )
        elif self.logdupes:
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be "
                "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": spider},
            )
            self.logdupes = False
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")
