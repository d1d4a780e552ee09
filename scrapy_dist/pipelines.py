"""Items to Redis: every item as one JSON line in the crawl's items list.

``ITEM_PIPELINES = {"scrapy_dist.pipelines.RedisPipeline": 300}`` appends each item,
serialized with Scrapy's ``ScrapyJSONEncoder`` (or ``REDIS_ITEMS_SERIALIZER``), to
``<spider>:items`` (``REDIS_ITEMS_KEY``), where every worker's items meet in the order
each worker produced them. ``scrapy-dist export`` writes the list to a JSON-lines file.

The pipeline never waits for Redis: ``process_item`` serializes the item (so later
changes to it do not leak in) and returns it at once; a background thread sends the
buffered items with one ``RPUSH`` per batch of ``REDIS_ITEMS_BATCH_SIZE``, at least
every ``REDIS_ITEMS_FLUSH_INTERVAL`` seconds, trimming the list to ``REDIS_ITEMS_MAXLEN``
items if set. If Redis is unreachable the items stay buffered and are retried with
backoff. Closing the spider sends everything left before it returns.

Delivery: each item is sent once; only a batch whose reply was lost after Redis stored
it (a connection cut at that moment) is sent again, so under such faults an item may be
stored twice, never lost while the worker lives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, cast

import redis
from scrapy.utils.misc import load_object
from scrapy.utils.serialize import ScrapyJSONEncoder

from scrapy_dist import default_settings
from scrapy_dist.assembly import assemble
from scrapy_dist.connection import get_redis_from_settings
from scrapy_dist.keys import expect_type, key_type
from scrapy_dist.settings import Config, check_items

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: First and longest pause between attempts to send items after a failure (seconds).
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0
#: Seconds closing the spider keeps retrying when Redis is unreachable.
CLOSE_TIMEOUT = 30.0


class ItemWriter:
    """Sends serialized items to a Redis list from a background thread, in order.

    Args:
        client: the Redis client (thread-safe: the thread takes its own connection).
        key: the items list.
        maxlen: keep at most this many items in the list (0: all).
        batch_size: items per ``RPUSH``.
        flush_interval: longest time an item waits in the buffer, in seconds.

    Raises:
        ConfigurationError: a negative ``maxlen``, a ``batch_size`` below 1 or a
            non-positive ``flush_interval``.
    """

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        *,
        maxlen: int = 0,
        batch_size: int = 100,
        flush_interval: float = 1.0,
    ) -> None:
        check_items(maxlen, batch_size, flush_interval)
        self.client = client
        self.key = key
        self.maxlen = maxlen
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        #: Items sent to Redis so far.
        self.sent = 0
        self._buffer: deque[tuple[str, bytes]] = deque()
        self._sending = 0
        self._cond = threading.Condition()
        #: When the oldest buffered item was put.
        self._oldest = 0.0
        self._retry_at = 0.0
        self._failing = False
        self._closing = False
        self._give_up_at = float("inf")
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the sending thread."""
        self._thread = threading.Thread(
            target=self._run, name=f"scrapy-dist items {self.key}", daemon=True
        )
        self._thread.start()

    def put(self, data: bytes, key: str | None = None) -> None:
        """Buffer one serialized item for ``key`` (default: the writer's list); never
        blocks on Redis."""
        with self._cond:
            if not self._buffer:
                self._oldest = time.monotonic()
                self._cond.notify()
            self._buffer.append((key or self.key, data))
            if len(self._buffer) == self.batch_size:
                self._cond.notify()

    @property
    def unsent(self) -> int:
        """Items not yet stored in Redis (buffered or being sent)."""
        with self._cond:
            return len(self._buffer) + self._sending

    def close(self, timeout: float = CLOSE_TIMEOUT) -> int:
        """Send everything buffered, retrying for up to ``timeout`` seconds while Redis
        fails, and stop the thread.

        Returns:
            The number of items that could not be stored (0 unless Redis stayed
            unreachable).
        """
        with self._cond:
            self._closing = True
            self._give_up_at = time.monotonic() + timeout
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout + 5)
        return self.unsent

    def _next_batch(self) -> list[tuple[str, bytes]] | None:
        """Wait until a batch is due: full, as old as the flush interval, or closing.

        Returns:
            The batch, or ``None`` once closed with nothing left (or given up).
        """
        with self._cond:
            while True:
                now = time.monotonic()
                if not self._buffer:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                if self._closing and self._failing and now >= self._give_up_at:
                    return None
                wake = self._retry_at
                if now >= wake:
                    due = self._oldest + self.flush_interval
                    if self._closing or len(self._buffer) >= self.batch_size or now >= due:
                        count = min(len(self._buffer), self.batch_size)
                        batch = [self._buffer.popleft() for _ in range(count)]
                        self._sending = count
                        return batch
                    wake = due
                self._cond.wait(max(0.0, min(wake, self._give_up_at) - now))

    def _run(self) -> None:
        backoff = BACKOFF_MIN
        while (batch := self._next_batch()) is not None:
            if self._send(batch):
                backoff = BACKOFF_MIN
                continue
            with self._cond:
                self._buffer.extendleft(reversed(batch))
                self._sending = 0
                self._oldest = time.monotonic()
                self._retry_at = time.monotonic() + backoff
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _send(self, batch: list[tuple[str, bytes]]) -> bool:
        # one RPUSH per run of items for the same list, in order
        runs: list[tuple[str, list[bytes]]] = []
        for key, data in batch:
            if runs and runs[-1][0] == key:
                runs[-1][1].append(data)
            else:
                runs.append((key, [data]))
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for key, items in runs:
                    pipe.rpush(key, *items)
                if self.maxlen:
                    for key in dict.fromkeys(key for key, _ in runs):
                        pipe.ltrim(key, -self.maxlen, -1)
                pipe.execute()
        except redis.RedisError as e:
            if not self._failing:
                logger.warning(
                    "Could not store %(n)d item(s) in %(key)s (%(error)s); keeping them "
                    "and retrying with backoff",
                    {"n": self.unsent, "key": self.key, "error": e},
                )
            self._failing = True
            return False
        if self._failing:
            logger.info("Items are stored in %(key)s again", {"key": self.key})
        with self._cond:
            self._failing = False
            self._sending = 0
            self.sent += len(batch)
        return True


def _json_serializer() -> Callable[[Any], str]:
    return ScrapyJSONEncoder(ensure_ascii=False).encode


class RedisPipeline:
    """Appends every item to the crawl's items list in Redis (see the module docstring).

    Args:
        writer: sends the serialized items.
        serialize: ``item -> str`` (or bytes).
    """

    def __init__(
        self,
        writer: ItemWriter | redis.Redis,
        serialize: Callable[[Any], str | bytes] | str | None = None,
        serialize_func: Callable[[Any], str | bytes] | None = None,
        *,
        key: str | None = None,
    ) -> None:
        if not isinstance(writer, ItemWriter):
            # scrapy-redis's RedisPipeline(server, key=PIPELINE_KEY, serialize_func=...)
            if isinstance(serialize, str):
                key, serialize = serialize, None
            writer = ItemWriter(writer, key or str(default_settings.REDIS_ITEMS_KEY))
        serialize = serialize_func or serialize or _json_serializer()
        self.writer = writer
        if not callable(getattr(type(self), "serialize", None)):  # not overridden
            self.serialize = serialize

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """scrapy-redis's factory: a new client, ``REDIS_ITEMS_KEY`` (a template filled
        in by :meth:`item_key`) and ``REDIS_ITEMS_SERIALIZER``."""
        config = Config.from_settings(settings)
        path = config.settings.get("REDIS_ITEMS_SERIALIZER")
        return cls(
            get_redis_from_settings(config.settings),
            key=config.keys.items,
            serialize_func=load_object(path) if path else None,
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        parts = assemble(crawler)
        items = parts.config.items
        serialize = items.serializer or _json_serializer()
        writer = ItemWriter(
            parts.client,
            parts.keys.custom(parts.config.keys.items, "REDIS_ITEMS_KEY"),
            maxlen=items.maxlen,
            batch_size=items.batch_size,
            flush_interval=items.flush_interval,
        )
        return cls(writer, cast("Callable[[Any], str | bytes]", serialize))

    @property
    def key(self) -> str:
        """The items list."""
        return self.writer.key

    def open_spider(self, spider: Spider | None = None) -> None:
        """Check the items key and start the sending thread.

        Raises:
            ConfigurationError: the key holds something other than a list.
        """
        try:
            actual = key_type(self.writer.client, self.key)
        except redis.RedisError:
            actual = "none"  # unreachable: the scheduler reports it; the writer retries
        expect_type(
            self.key,
            actual,
            "list",
            lambda kind: (
                f"Redis key {self.key!r} holds a {kind}, but RedisPipeline appends items to "
                "a list: delete it or set REDIS_ITEMS_KEY to another key"
            ),
        )
        self.writer.start()

    def process_item(self, item: Any, spider: Spider | None = None) -> Any:
        """Serialize ``item`` and buffer it for the list :meth:`item_key` names; return
        it unchanged at once."""
        data = self._serialize(item)
        key = self.item_key(item, spider)
        self.writer.put(data.encode("utf-8") if isinstance(data, str) else data, key)
        return item

    def _serialize(self, item: Any) -> str | bytes:
        """``item`` as text or bytes (override this, or ``serialize``, to change it)."""
        return cast("Callable[[Any], str | bytes]", self.serialize)(item)

    def item_key(self, item: Any, spider: Spider | None) -> str:
        """The list ``item`` goes to (scrapy-redis's hook: override it to send items to
        other lists by item or spider). Default: the pipeline's list."""
        key = self.key
        if "%(" in key and spider is not None:
            key = key % {"spider": spider.name}
        return key

    def close_spider(self, spider: Spider | None = None) -> None:
        """Send every buffered item before returning (retrying while Redis is away,
        for up to :data:`CLOSE_TIMEOUT` seconds)."""
        lost = self.writer.close()
        if lost:
            logger.error(
                "Redis is unreachable: %(n)d item(s) could not be stored in %(key)s",
                {"n": lost, "key": self.key},
            )
        logger.info("Stored %(n)d item(s) in %(key)s", {"n": self.writer.sent, "key": self.key})
