"""Requests kept in this worker's memory because they cannot be stored in Redis.

Scrapy's own scheduler keeps a request its disk queue cannot take in its memory queue
(stat ``scheduler/unserializable``); ours does the same with a request Redis cannot
carry: a ``Request`` in ``meta``, a lambda callback, a URL scheme queue entries may not
use (``SCHEDULER_URL_SCHEMES``). Such a request is crawled by the worker that made it,
before the requests it leased (Scrapy's memory queue comes before its disk queue), in
priority order, and in the order ``SCHEDULER_MEMORY_QUEUE`` gives among equals.

It is *anchored* to the leases of the pages it came from: those leases stay held, and
renewed, until it has left the engine, so a worker killed meanwhile loses nothing (the
pages come back, and crawling them again makes it again). Its parent's lease is known
from :class:`~scrapy_dist.parents.ParentLinks`; without the middleware, every lease of
a page in the engine at that moment anchors it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.squeues import LifoMemoryQueue
from scrapy.utils.misc import build_from_crawler, load_object

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.pqueues import QueueProtocol
    from typing_extensions import Self


class LocalRequests:
    """A priority queue of requests in memory, one downstream queue per priority, as
    Scrapy's ``ScrapyPriorityQueue`` keeps its memory queue.

    Args:
        queue_cls: the queue class of one priority (Scrapy's memory queues: its
            ``LifoMemoryQueue`` by default).
        crawler: the crawler the queues are built from (``build_from_crawler``);
            ``None``: built with no arguments.
    """

    def __init__(self, queue_cls: type | None = None, crawler: Crawler | None = None) -> None:
        self.queue_cls = queue_cls or LifoMemoryQueue
        self.crawler = crawler
        self.queues: dict[int, QueueProtocol] = {}
        self._size = 0

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> Self:
        """Queues of the crawler's ``SCHEDULER_MEMORY_QUEUE`` class, as Scrapy's
        scheduler keeps its memory queue."""
        return cls(load_object(crawler.settings["SCHEDULER_MEMORY_QUEUE"]), crawler)

    def _queue(self, priority: int) -> QueueProtocol:
        key = f"local/{priority}"
        if self.crawler is None:
            return self.queue_cls()  # type: ignore[no-any-return]
        return build_from_crawler(self.queue_cls, self.crawler, key)  # type: ignore[no-any-return]

    def push(self, request: Request) -> None:
        """Keep ``request``."""
        priority = -request.priority
        queue = self.queues.get(priority)
        if queue is None:
            queue = self.queues[priority] = self._queue(priority)
        queue.push(request)
        self._size += 1

    def pop(self) -> Request | None:
        """The request of highest priority, or ``None``."""
        if not self.queues:
            return None
        priority = min(self.queues)
        queue = self.queues[priority]
        request = queue.pop()
        if not len(queue):
            queue.close()
            del self.queues[priority]
        if request is not None:
            self._size -= 1
        return request

    def clear(self) -> int:
        """Forget every request; returns how many there were."""
        size = self._size
        for queue in self.queues.values():
            queue.close()
        self.queues.clear()
        self._size = 0
        return size

    def __len__(self) -> int:
        return self._size
