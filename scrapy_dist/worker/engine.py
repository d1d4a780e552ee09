"""The only reads of Scrapy's private engine state, checked at open.

Two things scrapy_dist needs have no public API in Scrapy:

- which requests the engine is still working on (``engine._slot.inprogress``): a lease
  is acknowledged only once its request has left the engine, callback output and all;
- waking the engine to look at its scheduler now (``engine._slot.nextcall.schedule()``)
  rather than on its 5-second heartbeat.

Both live in the engine's ``_slot``: public as ``slot`` before Scrapy 2.13, private
since (2.13 is the oldest Scrapy this package supports). Should a Scrapy release rename
them again, reading them with a default would acknowledge every request before its
download, silently; :func:`check` refuses to start instead, naming the Scrapy version.
The scheduler runs it when it opens and the Redis spiders when they open
(``spider_opened``), each before it first reads the engine;
``tests/test_hostile_input.py`` pins the refusal.

The start horizon (``SCHEDULER_START_HORIZON``, :mod:`scrapy_dist.worker.horizon`)
reads the downloader's slots (``engine.downloader.slots``, ``get_slot_key``, and a
slot's ``delay``, ``lastseen`` and ``queue``): public names of Scrapy's downloader, but
not a documented API, so :func:`check_downloader` refuses to start without them too.

With ``SCHEDULER_POLITENESS`` and ``ROBOTSTXT_OBEY``, the robots.txt ``Crawl-delay`` a
site asks for is read from Scrapy's robots middleware's parsers
(``RobotsTxtMiddleware._parsers``), checked the same way when politeness opens
(:func:`check_robots`). With ``SCHEDULER_POLITENESS`` and ``CONCURRENT_REQUESTS_PER_IP``,
the address of a host is read from Scrapy's DNS cache (``scrapy.resolver.dnscache``,
:func:`resolved_address`), as Scrapy's downloader names a slot by it; :func:`check_ip_slots`
makes sure at open that the downloader still does. Nothing else in the package reads a
private attribute of Scrapy's.

The engine is also asked for two things through its public API, here too: the
crawler's engine if it has one (:func:`engine_of`) and closing the spider
(:func:`close_spider`, which Scrapy 2.14 made a coroutine).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import scrapy
from scrapy.utils.defer import deferred_from_coro

from scrapy_dist.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Collection

    from scrapy import Request
    from scrapy.crawler import Crawler

#: ``(attribute path, what it must be)`` read on a running engine.
REQUIRED = (
    ("_slot", "the engine's slot"),
    ("_slot.inprogress", "a collection of the requests in progress"),
    ("_slot.nextcall.schedule", "a callable that wakes the engine"),
)


#: What a download slot of Scrapy's downloader must have for :func:`slot_state`.
SLOT_ATTRIBUTES = ("delay", "lastseen", "queue")
#: A slot's ``lastseen`` above this is a ``time.time()`` (Scrapy 2.13), else a
#: ``time.monotonic()`` (2.14 and later; the host's uptime, far below it).
_WALL_CLOCK_FROM = 1e9


@dataclass(frozen=True)
class SlotState:
    """What Scrapy's downloader knows of one request's download slot.

    Attributes:
        key: the slot's key (``get_slot_key``: ``download_slot`` meta, else the host), as
            text (meta may name any object).
        exists: whether the downloader has the slot (it makes it on the slot's first
            request).
        delay: the slot's download delay (its mean, before any jitter); 0 when it does
            not exist yet.
        wait: seconds until the downloader would start a request that reached the slot
            now: the rest of the delay since its last send, and one delay for each
            request queued in it before.
    """

    key: str
    exists: bool
    delay: float
    wait: float


def engine_of(crawler: Crawler) -> Any:
    """The crawler's engine, or ``None`` before the crawl starts (Scrapy >= 2.14 raises)."""
    try:
        return crawler.engine
    except RuntimeError:
        return None


def close_spider(crawler: Crawler, reason: str) -> None:
    """Ask the crawler's engine to close its spider with ``reason``."""
    engine = crawler.engine
    closer = getattr(engine, "close_spider_async", None)  # Scrapy >= 2.14
    if closer is not None:
        deferred_from_coro(closer(reason=reason))
    else:
        assert crawler.spider is not None
        engine.close_spider(crawler.spider, reason)


def check(engine: Any) -> None:
    """Make sure ``engine`` (an open engine) has the private state scrapy_dist reads.

    Raises:
        ConfigurationError: an attribute is missing; the message names the Scrapy
            version and the attribute.
    """
    for path, meaning in REQUIRED:
        obj = engine
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        ok = obj is not None and (
            callable(obj)
            if path.endswith("schedule")
            else hasattr(obj, "__contains__")
            if path.endswith("inprogress")
            else True
        )
        if not ok:
            raise ConfigurationError(
                f"Scrapy {scrapy.__version__} has no engine.{path} ({meaning}), which "
                "scrapy_dist reads to acknowledge a request only after Scrapy is done with "
                "it: this Scrapy version is not supported yet; refusing to start rather "
                "than acknowledge requests before they are downloaded"
            )


def check_downloader(engine: Any) -> None:
    """Make sure ``engine``'s downloader has what :func:`slot_state` reads.

    Raises:
        ConfigurationError: something is missing; the message names the Scrapy version.
    """
    from scrapy.core.downloader import Slot

    downloader = getattr(engine, "downloader", None)
    missing = ""
    if not isinstance(getattr(downloader, "slots", None), dict):
        missing = "engine.downloader.slots (a dict of download slots)"
    elif not callable(getattr(downloader, "get_slot_key", None)):
        missing = "engine.downloader.get_slot_key() (the download slot of a request)"
    else:
        params = inspect.signature(Slot.__init__).parameters
        required = {"randomize_delay": False} if _required(params, "randomize_delay") else {}
        slot = Slot(concurrency=1, delay=0.0, **required)
        for name in SLOT_ATTRIBUTES:
            if not hasattr(slot, name):
                missing = f"scrapy.core.downloader.Slot.{name}"
    if missing:
        raise ConfigurationError(
            f"Scrapy {scrapy.__version__} has no {missing}, which scrapy_dist reads to "
            "lease only what a worker can start soon (SCHEDULER_START_HORIZON): this Scrapy "
            "version is not supported with it yet; set SCHEDULER_START_HORIZON = 0 to "
            "start without it"
        )


def _required(params: Any, name: str) -> bool:
    param = params.get(name)
    return param is not None and param.default is inspect.Parameter.empty


def _slot_key(downloader: Any, request: Request) -> tuple[Any, str]:
    """``request``'s download slot key as ``downloader`` names it (its public
    ``get_slot_key``): as given (what its ``slots`` are keyed by) and as text (a
    request's meta may name any object as its slot, Scrapy 2.13 even None)."""
    raw = downloader.get_slot_key(request)
    return raw, raw if isinstance(raw, str) else str(raw)


def slot_state(crawler: Crawler, request: Request) -> SlotState:
    """What the crawler's downloader knows of ``request``'s download slot (see
    :class:`SlotState`; checked by :func:`check_downloader` at open). Before the
    engine opens there is no slot: a request would start at once."""
    engine = engine_of(crawler)
    downloader = getattr(engine, "downloader", None)
    if downloader is None:
        return SlotState("", False, 0.0, 0.0)
    raw, key = _slot_key(downloader, request)
    slot = downloader.slots.get(raw)
    if slot is None:
        return SlotState(key, False, 0.0, 0.0)
    delay = float(slot.delay or 0.0)
    if not delay:
        return SlotState(key, True, 0.0, 0.0)
    lastseen = float(slot.lastseen or 0.0)
    now = time.time() if lastseen > _WALL_CLOCK_FROM else time.monotonic()
    first = max(0.0, lastseen + delay - now) if lastseen else 0.0
    return SlotState(key, True, delay, first + len(slot.queue) * delay)


def slot_key(crawler: Crawler, request: Request) -> str | None:
    """``request``'s download slot key as the crawler's downloader names it, as text;
    ``None`` before the engine opens, or with a downloader that has no
    ``get_slot_key``."""
    downloader = getattr(engine_of(crawler), "downloader", None)
    if not callable(getattr(downloader, "get_slot_key", None)):
        return None
    return _slot_key(downloader, request)[1]


def local_delay_off(crawler: Crawler, request: Request) -> None:
    """Set the delay of ``request``'s download slot in the crawler's downloader to 0:
    the frontier spaced the slot's requests for the whole crawl already, and Scrapy's
    own per-worker delay would only add to it. Called as the request reaches the
    downloader (``request_reached_downloader``); a slot not made yet is left (its
    first request starts at once anyway)."""
    downloader = getattr(engine_of(crawler), "downloader", None)
    if downloader is None:
        return
    slot = downloader.slots.get(_slot_key(downloader, request)[0])
    if slot is not None and slot.delay:
        slot.delay = 0.0


def check_crawler(crawler: Crawler, *, downloader: bool = False) -> None:
    """:func:`check` the crawler's engine, if it has one open (and, with ``downloader``,
    :func:`check_downloader`).

    Raises:
        ConfigurationError: the engine is open and lacks what this module reads (the
            message names the Scrapy version).
    """
    engine = engine_of(crawler)
    if engine is not None:
        check(engine)
        if downloader:
            check_downloader(engine)


def in_flight(crawler: Crawler) -> Collection[Request]:
    """The requests the crawler's engine is still working on (empty before it opens).

    A request stays in the slot from the moment it is taken from the scheduler until
    its download, callback or errback, and the processing of everything they returned
    (new requests enqueued, items handed to the pipelines) are complete.
    """
    engine = engine_of(crawler)
    slot = engine._slot if engine is not None else None
    return slot.inprogress if slot is not None else ()


def wake(engine: Any) -> None:
    """Ask the engine to look at its scheduler now rather than at its next heartbeat
    (which calls the same method); nothing if it has no open slot."""
    slot = engine._slot
    if slot is not None:
        slot.nextcall.schedule()


#: A host name no resolver answers (RFC 2606) and an address of documentation
#: (RFC 5737): the probe of :func:`check_ip_slots`.
_PROBE_HOST, _PROBE_ADDRESS = "scrapy-dist-probe.invalid", "192.0.2.1"


def _dnscache() -> Any:
    """Scrapy's DNS cache (``scrapy.resolver.dnscache``), or ``None`` without one."""
    import scrapy.resolver

    cache = getattr(scrapy.resolver, "dnscache", None)
    return cache if callable(getattr(cache, "get", None)) else None


def resolved_address(host: str) -> str | None:
    """The address Scrapy's DNS cache holds for ``host`` once this process resolved it
    (what Scrapy's downloader names the host's slot by with
    ``CONCURRENT_REQUESTS_PER_IP``), else ``None``; ``None`` too for an entry that is
    not one address (``CachingHostnameResolver`` keeps lists, which Scrapy's
    downloader cannot name a slot by)."""
    cache = _dnscache()
    address = cache.get(host) if cache is not None else None
    return address if isinstance(address, str) else None


def check_ip_slots(crawler: Crawler) -> None:
    """Make sure the crawler's downloader names a host's slot by the address Scrapy's
    DNS cache holds for it, where :func:`resolved_address` reads it (a made-up host is
    put in the cache for the check and taken out). A cache that keeps nothing
    (``DNSCACHE_ENABLED = False``) names no slot by address, for either.

    Raises:
        ConfigurationError: Scrapy has no ``scrapy.resolver.dnscache``, or its
            downloader names a slot otherwise (the message names the Scrapy version).
    """
    from scrapy import Request

    cache = _dnscache()
    downloader: Any = getattr(engine_of(crawler), "downloader", None)
    agrees = cache is not None
    if agrees and callable(getattr(downloader, "get_slot_key", None)):
        cache[_PROBE_HOST] = _PROBE_ADDRESS
        try:
            if cache.get(_PROBE_HOST) == _PROBE_ADDRESS:
                key = downloader.get_slot_key(Request(f"http://{_PROBE_HOST}/"))
                agrees = key == resolved_address(_PROBE_HOST)
        finally:
            cache.pop(_PROBE_HOST, None)
    if not agrees:
        raise ConfigurationError(
            f"Scrapy {scrapy.__version__} does not name a download slot by the address in "
            "scrapy.resolver.dnscache with CONCURRENT_REQUESTS_PER_IP, which scrapy_dist "
            "reads to hold that limit for all workers with SCHEDULER_POLITENESS: this "
            "Scrapy version is not supported with both yet; refusing to start rather "
            "than limit other slots than Scrapy's"
        )


def _robots_middleware(crawler: Crawler) -> Any:
    """Scrapy's ``RobotsTxtMiddleware`` instance of the crawler's downloader, if enabled."""
    from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware

    engine = engine_of(crawler)
    manager = getattr(getattr(engine, "downloader", None), "middleware", None)
    for mw in getattr(manager, "middlewares", ()):
        if isinstance(mw, RobotsTxtMiddleware):
            return mw
    return None


def check_robots(crawler: Crawler) -> None:
    """Make sure Scrapy's robots middleware keeps its parsers where
    :func:`robots_crawl_delay` reads them (``RobotsTxtMiddleware._parsers``), for
    cluster-wide politeness with ``ROBOTSTXT_OBEY``.

    Raises:
        ConfigurationError: the middleware is enabled and lacks them (the message
            names the Scrapy version).
    """
    mw = _robots_middleware(crawler)
    if mw is not None and not isinstance(getattr(mw, "_parsers", None), dict):
        raise ConfigurationError(
            f"Scrapy {scrapy.__version__}'s RobotsTxtMiddleware has no _parsers dict, "
            "which scrapy_dist reads for robots.txt Crawl-delay with SCHEDULER_POLITENESS: "
            "this Scrapy version is not supported with both yet; refusing to start rather "
            "than ignore Crawl-delay"
        )


def robots_crawl_delay(crawler: Crawler, request: Request) -> float | None:
    """The robots.txt ``Crawl-delay`` for this crawl's user agent of ``request``'s
    site, once Scrapy's robots middleware has read it; else ``None``."""
    from scrapy.utils.httpobj import urlparse_cached

    mw = _robots_middleware(crawler)
    parsers = getattr(mw, "_parsers", None)
    if not isinstance(parsers, dict):
        return None
    parser = parsers.get(urlparse_cached(request).netloc)
    crawl_delay = getattr(parser, "crawl_delay", None)
    if not callable(crawl_delay):  # Scrapy < 2.18: its parsers' backends have it
        backend = getattr(parser, "rp", None)
        crawl_delay = getattr(backend, "crawl_delay", None) or getattr(
            backend, "get_crawl_delay", None
        )
    if not callable(crawl_delay):
        return None  # not read yet (a Deferred), none, or a parser without Crawl-delay
    agent = crawler.settings.get("ROBOTSTXT_USER_AGENT") or crawler.settings.get("USER_AGENT")
    try:
        delay = crawl_delay(agent or "*")
    except Exception:  # a third-party parser's failure is not the crawl's
        return None
    return float(delay) if isinstance(delay, (int, float)) and delay > 0 else 0.0
