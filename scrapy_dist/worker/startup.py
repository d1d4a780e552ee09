"""Start-up failures: one ERROR line that names the cause, a clean close, exit status 1.

When a worker cannot start (Redis unreachable or refusing the credentials, a key of the
wrong type, an invalid setting or spider argument), raising from the scheduler's
``open`` or the spider's set-up makes Scrapy tear down a half-opened engine, which
buries the one line that matters under a cascade of tracebacks ("Scraper slot not
assigned", ...) and, on Scrapy 2.13, still exits 0. Instead, the component that finds
the problem calls :func:`fail_start`: the cause is logged once at ERROR, the scheduler
and the spider do no further Redis work, the spider closes at its first idle moment
with the failure's reason (``CloseSpider``), and once the engine has stopped the
crawler reports a failed bootstrap, which Scrapy's ``crawl`` command turns into exit
status 1 (on every Scrapy version we support).

A crawler whose scheduler could not even be built (invalid scheduler settings) gets
:class:`FailedScheduler`, the one scheduler of a crawl that did not start; a scheduler
whose ``open`` failed behaves as one (it delegates to it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from scrapy import signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import CloseSpider

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class StartFailure:
    """Why a crawler could not start.

    Args:
        crawler: the crawler that failed to start.
        reason: the close reason, e.g. ``"redis_unavailable"``.
        message: what went wrong and which setting to change.
    """

    def __init__(self, crawler: Crawler, reason: str, message: str) -> None:
        self.crawler = crawler
        self.reason = reason
        self.message = message

    def engine_stopped(self) -> None:
        """Make Scrapy count the crawl as not bootstrapped: its ``crawl`` command (and
        ``CrawlerProcess.bootstrap_failed``) read a crawler without a spider so."""
        self.crawler.spider = None


_failures: WeakKeyDictionary[Crawler, StartFailure] = WeakKeyDictionary()


def fail_start(crawler: Crawler, reason: str, message: str, spider: Any = None) -> None:
    """Record that ``crawler`` cannot start and log why, once (later failures of the same
    start are consequences and stay silent)."""
    if crawler in _failures:
        return
    failure = _failures[crawler] = StartFailure(crawler, reason, message)
    logger.error("%(message)s", {"message": message}, extra={"spider": spider})
    crawler.signals.connect(failure.engine_stopped, signal=signals.engine_stopped)


def start_failure(crawler: Crawler | None) -> StartFailure | None:
    """The crawler's start-up failure, if it had one."""
    return _failures.get(crawler) if crawler is not None else None


def raise_if_failed(crawler: Crawler | None) -> None:
    """``spider_idle``: close a spider whose start failed, with the failure's reason.

    Raises:
        CloseSpider: the start failed.
    """
    failure = start_failure(crawler)
    if failure is not None:
        raise CloseSpider(failure.reason)


class FailedScheduler(BaseScheduler):
    """The scheduler of a crawl that did not start: it schedules nothing and closes the
    spider at its first idle moment with the failure's reason.

    Args:
        crawler: the crawler whose start failed (:func:`fail_start` was called).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> FailedScheduler:
        """The scheduler Scrapy gets when the real one cannot be built: it listens to
        ``spider_idle`` to close the spider."""
        scheduler = cls(crawler)
        crawler.signals.connect(scheduler.close_if_failed, signal=signals.spider_idle)
        return scheduler

    def close_if_failed(self) -> None:
        """``spider_idle``: close the spider.

        Raises:
            CloseSpider: always, with the start failure's reason.
        """
        raise_if_failed(self.crawler)
        raise CloseSpider("configuration_error")  # not reached: fail_start was called

    def has_pending_requests(self) -> bool:
        """Never: nothing is scheduled."""
        return False

    def enqueue_request(self, request: Request) -> bool:
        """Refuse ``request``: the crawl did not start."""
        return False

    def next_request(self) -> Request | None:
        """Nothing."""
        return None

    def __len__(self) -> int:
        """Nothing is scheduled."""
        return 0
