"""Scrapy's download slots as the frontier names and limits them: a request's slot
(:func:`slot_of`, bounded for Redis by :func:`bound_slot`) and each slot's delay,
concurrency and jitter (:class:`Limits`, from Scrapy's settings). Shared by the
cluster-wide politeness gate (:mod:`scrapy_dist.politeness`), the queue per download
slot (:mod:`scrapy_dist.slot_queue`) and the worker's counts and pauses per slot."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import scrapy
from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

    from scrapy_dist.config.scheduling import PolitenessConfig

#: Longest slot name used as is; a longer one is replaced by ``sha1:<hex>``.
SLOT_MAX = 200
#: Whether this Scrapy's downloader reads the spider's ``download_delay`` and
#: ``max_concurrent_requests`` attributes itself, over ``DOWNLOAD_DELAY`` and both
#: concurrency settings (before 2.18). Scrapy 2.18 deprecated them: its crawler sets
#: them as the settings at spider priority, where nothing set them at that priority.
SPIDER_LIMITS_READ = scrapy.version_info[:2] < (2, 18)
#: Milliseconds added to a slot's delay after a send: the time between the request
#: reaching Scrapy's downloader and leaving on the wire is not taken from the next gap.
SPACING_MARGIN_MS = 2.0


def slot_of(request: Request, address_of: Callable[[str], str | None] | None = None) -> str:
    """The download slot of ``request`` as Scrapy's downloader names it
    (``meta["download_slot"]``, else the URL's host name), bounded to :data:`SLOT_MAX`
    characters; one longer, or without a UTF-8 form, is named by its SHA-1.

    Args:
        request: the request.
        address_of: with ``CONCURRENT_REQUESTS_PER_IP``, the host's address once this
            process resolved it, else ``None``
            (:func:`scrapy_dist.worker.engine.resolved_address`): a request without
            ``download_slot`` is then named by its host's address when known, by the
            host name before, as Scrapy's downloader does.
    """
    raw: Any = request.meta.get("download_slot")
    if raw is None:
        raw = urlparse_cached(request).hostname or ""
        if address_of is not None:
            raw = address_of(raw) or raw
    return bound_slot(str(raw))


def host_slot(request: Request) -> str:
    """The slot of ``request``'s host name, as the queue per download slot names a new
    request's (one without ``meta["download_slot"]``). Scrapy's downloader may have
    named it otherwise (by the host's address, with ``CONCURRENT_REQUESTS_PER_IP``)."""
    return bound_slot(urlparse_cached(request).hostname or "")


def bound_slot(slot: str) -> str:
    """``slot`` as Redis keeps it (a zset member): as it is, or, when longer than
    :data:`SLOT_MAX` characters or without a UTF-8 form, ``sha1:`` and its SHA-1."""
    if len(slot) > SLOT_MAX or (not slot.isascii() and _unencodable(slot)):
        digest = hashlib.sha1(slot.encode("utf-8", "surrogatepass"), usedforsecurity=False)
        slot = "sha1:" + digest.hexdigest()
    return slot


def _unencodable(slot: str) -> bool:
    """Whether ``slot`` has no UTF-8 form (a lone surrogate): Redis could not be sent it."""
    try:
        slot.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@dataclass(frozen=True)
class Limit:
    """One slot's cluster-wide limits: ``concurrency`` tokens at most, send times at least
    ``delay`` seconds apart (``jitter``: up to ``delay * jitter`` more, at random)."""

    concurrency: int
    delay: float
    jitter: float = 0.0

    def spacing_ms(self) -> float:
        """The spacing after one send, in ms: never below the delay, so every gap between
        sends is at least ``delay`` whatever the jitter."""
        if not self.delay:
            return 0.0
        extra = random.uniform(0, self.jitter) if self.jitter else 0.0
        return round(self.delay * (1 + extra) * 1000 + SPACING_MARGIN_MS, 3)


@dataclass
class Limits:
    """The limits of each slot: ``DOWNLOAD_SLOTS``, else the defaults; a robots.txt
    ``Crawl-delay`` (``crawl_delays``, per slot) raises a slot's delay."""

    default: Limit
    slots: dict[str, Limit] = field(default_factory=dict)
    crawl_delays: dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(cls, config: PolitenessConfig, spider: object = None) -> Limits:
        """From the settings, as Scrapy's downloader sets its slots: with
        ``CONCURRENT_REQUESTS_PER_IP`` above 0, it is every slot's concurrency (the
        slots are then addresses once resolved), else the per-domain limit; a
        ``DOWNLOAD_SLOTS`` entry over both. The spider's ``download_delay`` and
        ``max_concurrent_requests`` attributes: before Scrapy 2.18 its downloader
        reads them over both settings (:data:`SPIDER_LIMITS_READ`); from 2.18 its
        crawler has already made them ``DOWNLOAD_DELAY`` and
        ``CONCURRENT_REQUESTS_PER_DOMAIN``, unless those are set at spider priority."""
        delay = config.delay
        concurrency = config.per_ip if config.per_ip > 0 else config.concurrency
        if SPIDER_LIMITS_READ:
            delay = float(getattr(spider, "download_delay", delay))
            concurrency = int(getattr(spider, "max_concurrent_requests", concurrency))
        default = Limit(max(1, concurrency), max(0.0, delay), min(1.0, config.jitter))
        slots = {}
        for name, values in config.slots.items():
            jitter = values.get("jitter")
            if jitter is None and "randomize_delay" in values:
                jitter = 0.5 if values["randomize_delay"] else 0.0
            slots[str(name)] = Limit(
                max(1, int(values.get("concurrency", default.concurrency))),
                max(0.0, float(values.get("delay", default.delay))),
                min(1.0, float(default.jitter if jitter is None else jitter)),
            )
        return cls(default, slots)

    def of(self, slot: str) -> Limit:
        limit = self.slots.get(slot, self.default)
        crawl_delay = self.crawl_delays.get(slot, 0.0)
        if crawl_delay > limit.delay:
            return Limit(limit.concurrency, crawl_delay, limit.jitter)
        return limit
