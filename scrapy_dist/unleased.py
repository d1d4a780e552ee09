"""The scheduler for a queue written against scrapy-redis's queue API.

A ``SCHEDULER_QUEUE_CLASS`` that subclasses :class:`~scrapy_dist.queue.Base` directly
(its own ``push``/``pop``/``__len__``) pops requests out of Redis, so nothing is leased:
a worker that dies loses the requests it took, as with scrapy-redis (a warning says so
at open). :meth:`Scheduler.from_crawler <scrapy_dist.scheduler.Scheduler.from_crawler>`
builds an :class:`UnleasedScheduler` for such a queue.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

from scrapy_dist.assembly import assemble
from scrapy_dist.exceptions import SerializationError
from scrapy_dist.scheduler import Scheduler

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from scrapy_dist.queue import Base

logger = logging.getLogger(__name__)


class UnleasedScheduler(Scheduler):
    """The scheduler for a ``SCHEDULER_QUEUE_CLASS`` written against scrapy-redis's
    :class:`~scrapy_dist.queue.Base` (its own ``push``/``pop``/``__len__``).

    Such a queue's ``pop`` removes the request from Redis, so nothing is leased: a worker
    that dies loses the requests it took, as with scrapy-redis (a warning says so at
    open). The dupefilter is asked before each push (``request_seen``); seeds, workers,
    dead letters and stats work as with the leasing scheduler; nothing is deleted when a
    worker closes. Built by :meth:`Scheduler.from_crawler` when the queue class is one.
    """

    leased: ClassVar[bool] = False
    _queue_cls: type[Base]
    _queue_key: str

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        scheduler = super().from_crawler(crawler)
        if UnleasedScheduler not in type(scheduler).__mro__:
            return scheduler  # a failed start (FailedScheduler)
        config = assemble(crawler).config
        scheduler._queue_cls = config.queue.cls
        scheduler._queue_key = config.keys.requests
        return scheduler

    def open(self, spider: Spider) -> None:
        """Build the queue for ``spider``, then open as the leasing scheduler does."""
        key = self.frontier.keys.custom(self._queue_key, "SCHEDULER_QUEUE_KEY")
        self.custom: Base = self._queue_cls(
            server=self.frontier.client, spider=spider, key=key, serializer=self.serializer
        )
        logger.warning(
            "SCHEDULER_QUEUE_CLASS %(cls)s pops requests out of Redis (scrapy-redis's "
            "queue API): requests a worker has taken are lost if it dies. Subclass "
            "scrapy_dist.queue.FifoQueue, LifoQueue or PriorityQueue to have them leased",
            {"cls": self._queue_cls.__name__},
            extra={"spider": spider},
        )
        super().open(spider)

    def _enqueue(self, request: Request) -> bool:
        """Push ``request`` with the queue's ``push`` unless the dupefilter saw it."""
        assert self.spider is not None, "scheduler not open"
        if not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        try:
            self.custom.push(request)
        except SerializationError as e:
            assert self._enqueuer is not None
            return self._enqueuer.keep_in_memory(request, e, deduped=True)
        self.stats.inc_value("scheduler/enqueued/redis")
        self.stats.inc_value("scheduler/enqueued")
        return True

    def _next(self) -> Request | None:
        """The queue's next request (``pop``), or ``None``."""
        try:
            request = self.custom.pop(0)
        except SerializationError as e:
            logger.error(
                "Dropped a queued request that cannot be rebuilt: %(error)s",
                {"error": e},
                extra={"spider": self.spider},
            )
            self.stats.inc_value("scheduler/undecodable")
            return None
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
            self.stats.inc_value("scheduler/dequeued")
        return request

    def _has_pending(self) -> bool:
        """Whether the queue holds requests."""
        return len(self.custom) > 0

    def _len(self) -> int:
        """Requests in the queue."""
        return len(self.custom)
