"""Per-worker benchmark figures: pages, CPU time, Redis round trips and the time the
reactor waited for them.

Round trips are counted at the client: every ``send_packed_command`` of a redis-py
connection (sync or asyncio) is one request/response exchange; a pipeline or a script
call sends once. The wait is the wall time spent inside a synchronous connection's
``send_packed_command`` and ``read_response`` (a blocking call blocks the reactor).
The wrappers are installed when this module is imported, which Scrapy does while
building the crawler, before any Redis component talks to Redis.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis.asyncio.connection
import redis.connection
from scrapy import signals
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Request, Response
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: Round trips to Redis made by this process so far.
ROUND_TRIPS = [0]
#: Seconds the reactor thread spent waiting in synchronous Redis calls so far, and for
#: a flush in flight (``Trip.land``); the I/O thread's calls
#: (``SCHEDULER_BACKGROUND_FLUSH``) block no one: not counted.
WAIT = [0.0]
#: The reactor's waits for a flush in flight (``Trip.land`` called while one is in
#: flight), by cause: the chain of scrapy_dist calls that landed it (outermost first)
#: -> [waits, seconds waited, waits whose reply had already arrived].
WAITED_BY: dict[str, list[float]] = {}


def _add_wait(started: float) -> None:
    if threading.current_thread() is threading.main_thread():
        WAIT[0] += time.perf_counter() - started


def _count_sync(method: Any) -> Any:
    @functools.wraps(method)
    def send_packed_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        ROUND_TRIPS[0] += 1
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            _add_wait(started)

    send_packed_command.counting = True  # type: ignore[attr-defined]
    return send_packed_command


def _time_sync(method: Any) -> Any:
    @functools.wraps(method)
    def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            _add_wait(started)

    read_response.counting = True  # type: ignore[attr-defined]
    return read_response


def _count_async(method: Any) -> Any:
    @functools.wraps(method)
    async def send_packed_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        ROUND_TRIPS[0] += 1
        return await method(self, *args, **kwargs)

    send_packed_command.counting = True  # type: ignore[attr-defined]
    return send_packed_command


def _cause() -> str:
    """The scrapy_dist calls (outermost first, ``module.function``) on the stack above
    ``Trip.land``, with the first caller outside scrapy_dist before them."""
    import sys

    frame = sys._getframe(2)  # (skip _cause and the wrapper)
    names: list[str] = []
    outside = ""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("scrapy_dist."):
            names.append(f"{module.removeprefix('scrapy_dist.')}.{frame.f_code.co_name}")
        elif names:
            outside = f"{module.rsplit('.', 1)[-1]}.{frame.f_code.co_name}"
            break
        frame = frame.f_back  # type: ignore[assignment]
    chain = " > ".join(reversed(names))
    return f"{outside} > {chain}" if outside else chain


def _count_land(method: Any) -> Any:
    @functools.wraps(method)
    def land(self: Any, *args: Any, **kwargs: Any) -> Any:
        flight = getattr(self, "_flight", None)
        if flight is None or threading.current_thread() is not threading.main_thread():
            return method(self, *args, **kwargs)
        arrived = flight.future.done()
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            waited = time.perf_counter() - started
            WAIT[0] += waited
            entry = WAITED_BY.setdefault(_cause(), [0, 0.0, 0])
            entry[0] += 1
            entry[1] += waited
            entry[2] += int(arrived)

    land.counting = True  # type: ignore[attr-defined]
    return land


def _install() -> None:
    for cls, wrap in (
        (redis.connection.AbstractConnection, _count_sync),
        (redis.asyncio.connection.AbstractConnection, _count_async),
    ):
        method = cls.send_packed_command
        if not getattr(method, "counting", False):
            cls.send_packed_command = wrap(method)  # type: ignore[method-assign]
    read = redis.connection.AbstractConnection.read_response
    if not getattr(read, "counting", False):
        redis.connection.AbstractConnection.read_response = _time_sync(read)  # type: ignore[method-assign]
    from scrapy_dist.frontier.trip import Trip

    land = getattr(Trip, "land", None)  # the reactor waiting for a flush in flight
    if land is not None and not getattr(land, "counting", False):
        Trip.land = _count_land(land)  # type: ignore[method-assign]


_install()


class BenchStats:
    """Writes this worker's figures as JSON to the ``BENCH_STATS_FILE`` setting at close.

    Every figure is taken at three moments: spider opened, last response received, and
    spider closed (``open``, ``last``, ``close``): ``cpu`` (``time.process_time()``,
    user + system seconds of this process), ``round_trips`` and ``time`` (wall clock).
    """

    def __init__(self, crawler: Crawler, path: Path) -> None:
        self.crawler = crawler
        self.path = path
        self.pages = 0
        self.marks: dict[str, dict[str, float]] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        path = crawler.settings.get("BENCH_STATS_FILE")
        if not path:
            raise NotConfigured("BENCH_STATS_FILE is not set")
        extension = cls(crawler, Path(path))
        crawler.signals.connect(extension.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(extension.response_received, signal=signals.response_received)
        crawler.signals.connect(extension.spider_closed, signal=signals.spider_closed)
        return extension

    def _mark(self, name: str) -> None:
        self.marks[name] = {
            "cpu": time.process_time(),
            "round_trips": ROUND_TRIPS[0],
            "redis_wait": WAIT[0],
            "time": time.time(),
        }

    def spider_opened(self, spider: Spider) -> None:
        self._mark("open")

    def response_received(self, response: Response, request: Request, spider: Spider) -> None:
        self.pages += 1
        self._mark("last")

    def spider_closed(self, spider: Spider, reason: str) -> None:
        self._mark("close")
        assert self.crawler.stats is not None
        stats = self.crawler.stats.get_stats()
        wanted = ("downloader/", "scheduler/", "dupefilter/", "item_scraped_count", "seeds/")
        record = {
            "pages": self.pages,
            "reason": reason,
            "marks": self.marks,
            "flush_waited_by": WAITED_BY,
            "stats": {
                key: value
                for key, value in stats.items()
                if key.startswith(wanted) and isinstance(value, (int, float))
            },
        }
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps(record, indent=2, sort_keys=True))
        temporary.replace(self.path)
        logger.info("Wrote the benchmark stats to %s", self.path)
