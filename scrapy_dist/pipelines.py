"""Items to Redis: every item as one JSON line in the crawl's items list.

``ITEM_PIPELINES = {"scrapy_dist.pipelines.RedisPipeline": 300}`` appends each item,
serialized with Scrapy's ``ScrapyJSONEncoder`` (or ``REDIS_ITEMS_SERIALIZER``), to
``<spider>:items`` (``REDIS_ITEMS_KEY``), where every worker's items meet in the order
each worker produced them. ``scrapy-dist export`` writes the list to a JSON-lines file.

``process_item`` serializes the item (so later changes to it do not leak in); a
background thread sends the buffered items with one ``RPUSH`` per batch of
``REDIS_ITEMS_BATCH_SIZE``, trimming the list to ``REDIS_ITEMS_MAXLEN`` items if set.
Under scrapy_dist's scheduler, ``process_item`` returns once the item is stored (or
kept in the rejected file), so the page it came from, which is acknowledged only
once Scrapy is done with it, is never acknowledged before its items are in Redis: a
worker killed meanwhile loses no item (its page is crawled again). Items are then
sent as soon as they come: a batch is what came while the last was on its way. Under
another scheduler it returns at once, and a batch is sent at least every
``REDIS_ITEMS_FLUSH_INTERVAL`` seconds. Redis unreachable or refusing writes for now
(OOM, NOREPLICAS, READONLY, LOADING...: :data:`scrapy_dist.frontier.outbox.REFUSALS`) is an
outage: the items stay buffered, in order, and are retried with the outbox's backoff.
When ``REDIS_ITEMS_BUFFER_MAX`` items are unsent, ``process_item`` returns a Deferred
that fires once there is room (back-pressure). Items Redis refuses for good, and those
still unsent ``REDIS_ITEMS_CLOSE_TIMEOUT`` seconds into closing, are kept in
``REDIS_ITEMS_REJECTED_FILE``, which the log names.

Delivery: each item is sent once; only a batch whose reply was lost after Redis stored
it (a connection cut at that moment) is sent again, so under such faults an item may be
stored twice, never lost while the worker lives.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import socket
import weakref
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis
import scrapy.utils.defer
from scrapy.utils.serialize import ScrapyJSONEncoder

from scrapy_dist import default_settings
from scrapy_dist.assembly import assemble
from scrapy_dist.config.core import Config
from scrapy_dist.connection import ClusterClient, get_redis_from_settings
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.keys import crawl_slot, expect_type, key_type, stream_dead_key
from scrapy_dist.writers import (
    CLOSE_TIMEOUT,
    ItemWriter,
    StreamWriter,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from scrapy_dist.assembly import Parts
    from scrapy_dist.config.components import ItemsConfig

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_F = TypeVar("_F", bound="Callable[..., Any]")
#: Scrapy awaits what pipeline methods return (and deprecates Deferreds).
_AWAITS_COROUTINES = hasattr(scrapy.utils.defer, "ensure_awaitable")


def _for_scrapy(waiter: Deferred[_T]) -> Awaitable[_T]:
    """What a pipeline method returns to wait for ``waiter``: a coroutine where Scrapy
    awaits them (it deprecates Deferreds since it has ``ensure_awaitable``), the Deferred
    on older Scrapy or when no reactor runs (a script or test)."""
    from twisted.internet import reactor

    if not (_AWAITS_COROUTINES and reactor.running):
        return waiter
    from scrapy.utils.defer import maybe_deferred_to_future

    async def wait() -> _T:
        return await maybe_deferred_to_future(waiter)

    return wait()


#: ``from_crawler`` functions that bind the pipeline they return to the crawler.
_BINDING: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


def _binds(factory: _F) -> _F:
    """Mark ``factory`` (a ``from_crawler`` function) as binding what it returns."""
    _BINDING.add(factory)
    return factory


def _binding(factory: _F, *, static: bool = False) -> _F:
    """``factory`` (a subclass's own ``from_crawler`` function: a classmethod's, or a
    staticmethod's when ``static``), binding the pipeline it returns to the crawler
    (:meth:`RedisPipeline._bind`)."""

    @functools.wraps(factory)
    def from_crawler(*args: Any, **kwargs: Any) -> Any:
        pipeline = factory(*args, **kwargs)
        if isinstance(pipeline, RedisPipeline):
            pipeline._bind(args[0] if static else args[1])
        return pipeline

    return _binds(cast("_F", from_crawler))


def _json_serializer() -> Callable[[Any], str]:
    return ScrapyJSONEncoder(ensure_ascii=False).encode


class RedisPipeline:
    """Appends every item to the crawl's items list in Redis (see the module docstring).

    Args:
        writer: sends the serialized items.
        serialize: ``item -> str`` (or bytes).

    scrapy-redis's ``RedisPipeline(server, key=..., serialize_func=...)`` works too,
    ``server`` by position or by name.

    Raises:
        TypeError: neither a writer nor a server was given, or both.
    """

    def __init__(
        self,
        writer: ItemWriter | redis.Redis | None = None,
        serialize: Callable[[Any], str | bytes] | str | None = None,
        serialize_func: Callable[[Any], str | bytes] | None = None,
        *,
        key: str | None = None,
        server: redis.Redis | None = None,
    ) -> None:
        if writer is None:
            writer = server
        elif server is not None:
            writer = None  # both: refused below
        if writer is None:
            raise TypeError(f"{type(self).__name__}() needs a writer or a server (one of them)")
        if not isinstance(writer, ItemWriter):
            # scrapy-redis's RedisPipeline(server, key=PIPELINE_KEY, serialize_func=...)
            if isinstance(serialize, str):
                key, serialize = serialize, None
            writer = self._writer_for(writer, key)
        serialize = serialize_func or serialize or _json_serializer()
        self.writer = writer
        #: Seconds closing keeps retrying while Redis fails (``REDIS_ITEMS_CLOSE_TIMEOUT``).
        self.close_timeout = CLOSE_TIMEOUT
        #: ``process_item`` calls waiting for room in the writer's buffer.
        self._waiting: list[Deferred[Any]] = []
        self._closed = False
        #: The crawler (set by :meth:`from_crawler`; ``None`` when built by hand).
        self.crawler: Crawler | None = None
        writer.on_room = self._room
        if not callable(getattr(type(self), "serialize", None)):  # not overridden
            self.serialize = serialize

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own ``from_crawler`` (scrapy-redis's users write one that calls
        :meth:`from_settings`, which knows no crawler) is wrapped so that the pipeline
        it returns is bound to the crawler (:meth:`_bind`), as :meth:`from_crawler`'s
        is; a staticmethod's too (``from_crawler(crawler)``). Any other ``from_crawler``
        is left as it is."""
        super().__init_subclass__(**kwargs)
        factory = inspect.getattr_static(cls, "from_crawler", None)
        if isinstance(factory, classmethod) and factory.__func__ not in _BINDING:
            cls.from_crawler = classmethod(_binding(factory.__func__))  # type: ignore[method-assign, assignment]
        elif isinstance(factory, staticmethod) and factory.__func__ not in _BINDING:
            bound = staticmethod(_binding(factory.__func__, static=True))
            cls.from_crawler = bound  # type: ignore[method-assign]

    def _writer_for(self, client: redis.Redis, key: str | None) -> ItemWriter:
        """The writer of a pipeline given a client rather than a writer."""
        return ItemWriter(client, key or str(default_settings.REDIS_ITEMS_KEY))

    #: The setting of the key template (named in errors about it).
    _KEY_SETTING = "REDIS_ITEMS_KEY"

    @classmethod
    def _key_template(cls, config: Config) -> str:
        """The template of the pipeline's key (``REDIS_ITEMS_KEY``)."""
        return config.keys.items

    @classmethod
    def _check_slot(cls, parts: Parts, key: str) -> None:
        """Raise :class:`ConfigurationError` if ``key`` cannot be written with the
        crawl's client (the items list is checked with the crawl's keys)."""

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """scrapy-redis's factory: a new client, the key template (``REDIS_ITEMS_KEY``,
        or ``REDIS_ITEMS_STREAM_KEY`` for :class:`RedisStreamPipeline`; filled in by
        :meth:`item_key`, or with the crawl's job once the pipeline is bound to a
        crawler), ``REDIS_ITEMS_SERIALIZER`` and the other ``REDIS_ITEMS_*`` settings
        (maximum length, batches, buffer, rejected file, close timeout)."""
        config = Config.from_settings(settings)
        return cls._writing_to(
            get_redis_from_settings(config.settings), cls._key_template(config), config.items
        )

    @classmethod
    @_binds
    def from_crawler(cls, crawler: Crawler) -> Self:
        """The pipeline of the crawl's items key and client, bound to the crawler
        (:meth:`_bind`). A subclass that overrides :meth:`from_settings` (scrapy-redis's
        ``from_crawler`` calls it) is built by its override instead, as in scrapy-redis,
        and then bound.

        Raises:
            ConfigurationError: the override returned something else than a pipeline.
        """
        if cls.from_settings.__func__ is RedisPipeline.from_settings.__func__:  # type: ignore[attr-defined]
            parts = assemble(crawler)
            key = parts.keys.custom(cls._key_template(parts.config), cls._KEY_SETTING)
            cls._check_slot(parts, key)
            pipeline = cls._writing_to(parts.client, key, parts.config.items, crawler.stats)
        else:
            pipeline = cls.from_settings(crawler.settings)
            if not isinstance(pipeline, RedisPipeline):
                raise ConfigurationError(
                    f"{cls.__module__}.{cls.__qualname__}.from_settings returned "
                    f"{pipeline!r}, not a pipeline"
                )
        pipeline._bind(crawler)
        return pipeline

    @classmethod
    def _writing_to(
        cls,
        client: redis.Redis,
        key: str,
        items: ItemsConfig,
        stats: StatsCollector | None = None,
    ) -> Self:
        """A pipeline writing to ``key`` (a template :meth:`item_key` fills, or a key)
        with the ``REDIS_ITEMS_*`` settings ``items``."""
        serialize = items.serializer or _json_serializer()
        pipeline = cls(
            cls._writer(client, key, items, stats), cast("Callable[[Any], str | bytes]", serialize)
        )
        pipeline.close_timeout = items.close_timeout
        return pipeline

    @classmethod
    def _writer(
        cls, client: redis.Redis, key: str, items: ItemsConfig, stats: StatsCollector | None
    ) -> ItemWriter:
        """The writer of :meth:`_writing_to`."""
        return ItemWriter(
            client,
            key,
            maxlen=items.maxlen,
            batch_size=items.batch_size,
            flush_interval=items.flush_interval,
            buffer_max=items.buffer_max,
            wrongtype_timeout=items.wrongtype_timeout,
            rejected_file=items.rejected_file,
            stats=stats,
        )

    def _bind(self, crawler: Crawler) -> None:
        """Make the pipeline the crawl's, however it was built: a key template it kept
        gets the crawl's name (``%(spider)s:items`` is ``<spider>:<job>:items`` under a
        job, as :meth:`from_crawler`'s; the rejected file follows), the writer gets the
        crawler's stats if it has none, and :attr:`crawler` is set (Scrapy >= 2.19 passes
        no spider to ``process_item``: :meth:`item_key` gets the crawler's). Binding
        again changes nothing.

        Raises:
            ConfigurationError: the key template has an unknown placeholder.
        """
        writer = self.writer
        parts = assemble(crawler)
        if "%(" in writer.key:
            writer.key = parts.keys.custom(writer.key, self._KEY_SETTING)
        if writer.stats is None:
            writer.stats = crawler.stats
        if parts.config.components.dist_scheduler:
            # a page is acknowledged once Scrapy is done with it: process_item waits
            # until its item is stored, so the page is never acknowledged before
            writer.eager = True
            writer.on_done = self._stored
        self.crawler = crawler

    @property
    def key(self) -> str:
        """The items list (the stream's, for :class:`RedisStreamPipeline`); settable,
        as scrapy-redis's attribute is: a template set in a subclass's factory or
        ``__init__`` gets the crawl's name when the pipeline is bound to its crawler."""
        return self.writer.key

    @key.setter
    def key(self, key: str) -> None:
        self.writer.key = key

    @property
    def server(self) -> redis.Redis:
        """The items' Redis client (scrapy-redis's attribute)."""
        return self.writer.client

    def _spider(self, spider: Spider | None) -> Spider | None:
        """``spider``, or the crawler's: Scrapy >= 2.19 calls ``process_item(item)``
        without it, and an ``item_key(item, spider)`` override reads ``spider.name``."""
        if spider is not None or self.crawler is None:
            return spider
        return cast("Spider | None", getattr(self.crawler, "spider", None))

    def open_spider(self, spider: Spider | None = None) -> None:
        """Check the items key and start the sending thread.

        Raises:
            ConfigurationError: the key holds something other than a list.
        """
        self._check_key("list", "RedisPipeline appends items to a list", "REDIS_ITEMS_KEY")
        self._start()

    def _check_key(self, expected: str, what: str, setting: str) -> None:
        """Raise :class:`ConfigurationError` if the key holds another type than
        ``expected`` (an unreachable Redis passes: the scheduler reports it, and the
        writer retries)."""
        try:
            actual = key_type(self.writer.client, self.key)
        except redis.RedisError:
            actual = "none"
        expect_type(
            self.key,
            actual,
            expected,
            lambda kind: (
                f"Redis key {self.key!r} holds a {kind}, but {what}: delete it or set "
                f"{setting} to another key"
            ),
        )

    def _start(self) -> None:
        """Start the sending thread (and close at a forced shutdown)."""
        self.writer.start()
        from twisted.internet import reactor

        # a forced shutdown (a second Ctrl-C) stops the reactor without closing the
        # spider: the buffered items are then sent or kept in the file all the same
        if reactor.running:
            trigger = reactor.addSystemEventTrigger
            trigger("before", "shutdown", self._at_shutdown)  # type: ignore[arg-type]

    def _at_shutdown(self) -> None:
        if not self._closed:
            self._close()

    def process_item(self, item: Any, spider: Spider | None = None) -> Any:
        """Serialize ``item`` and buffer it for the list :meth:`item_key` names; a
        subclass that defines scrapy-redis's ``_process_item(item, spider)`` gets that
        called on a thread instead, as in scrapy-redis. Starts sending if
        :meth:`open_spider` did not (a subclass's override that does not call it).

        Returns:
            ``item`` at once; or, when ``REDIS_ITEMS_BUFFER_MAX`` items are unsent
            (Redis slower than the crawl, or refusing), a Deferred that fires with it
            once the buffer has room: Scrapy waits for it, so the crawl slows down
            instead of the buffer growing without bound.
        """
        if type(self)._process_item is not RedisPipeline._process_item:
            # scrapy-redis's storage hook, overridden by a subclass: run on a thread, as
            # scrapy-redis does (its writes, through self.server, are its own; the
            # buffered writer is not used)
            from twisted.internet import threads

            call = threads.deferToThread(self._process_item, item, self._spider(spider))
            return _for_scrapy(call)
        if not self.writer.started:
            # an open_spider override that did not call this one (scrapy-redis's
            # RedisPipeline has none to call): nothing would send the items
            self._start()
        data = self._serialize(item)
        key = self.item_key(item, self._spider(spider))
        raw = data.encode("utf-8") if isinstance(data, str) else data
        from twisted.internet.defer import Deferred

        if self.writer.eager:  # under scrapy_dist's scheduler: returns once stored
            stored: Deferred[Any] = Deferred()
            stored.addCallback(lambda _: item)
            self.writer.put(raw, key, on_stored=lambda: stored.callback(None))
            return _for_scrapy(stored)
        full = self.writer.put(raw, key)
        if not full:
            return item

        waiter: Deferred[Any] = Deferred()
        waiter.addCallback(lambda _: item)
        self._waiting.append(waiter)
        if self.writer.stats is not None:
            self.writer.stats.inc_value("items/redis/backpressure")
        if not self.writer.full:  # drained in the meantime
            self._release()
        return _for_scrapy(waiter)

    def _room(self) -> None:
        """The writer's buffer has room again (called from its thread)."""
        from twisted.internet import reactor

        if reactor.running:
            reactor.callFromThread(self._release)
        else:  # no reactor (a script or test): fire here
            self._release()

    def _stored(self, callbacks: list[Callable[[], None]]) -> None:
        """Items were stored (called from the writer's thread): their ``process_item``
        calls return, on the reactor's thread."""
        from twisted.internet import reactor

        def fire() -> None:
            for callback in callbacks:
                callback()

        if reactor.running:
            reactor.callFromThread(fire)
        else:  # no reactor (a script or test): fire here
            fire()

    def _release(self) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            waiter.callback(None)

    def _process_item(self, item: Any, spider: Spider | None) -> Any:
        """scrapy-redis's storage step: append ``item`` to the list :meth:`item_key`
        names, now, with one ``RPUSH`` (on the thread a subclass's override runs on).
        Only an override that calls ``super()._process_item()`` reaches it; the
        pipeline's own path buffers items and appends them in batches."""
        data = self._serialize(item)
        self.server.rpush(self.item_key(item, spider), data)
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

    def close_spider(self, spider: Spider | None = None) -> Awaitable[None] | None:
        """Send every buffered item, retrying while Redis fails for up to
        ``REDIS_ITEMS_CLOSE_TIMEOUT`` seconds; keep what is left in the writer's
        rejected file and report its count and path.

        Returns:
            In a running reactor, an awaitable (:func:`_for_scrapy`) done when done (the
            wait happens in a thread, so the worker's timers go on); otherwise ``None``,
            when done.
        """
        from twisted.internet import reactor, threads

        self._release()  # nothing more will come: let Scrapy finish
        if reactor.running:
            return _for_scrapy(threads.deferToThread(self._close))
        self._close()
        return None

    def _close(self) -> None:
        self._closed = True
        lost = self.writer.close(self.close_timeout)
        if lost:
            logger.error(
                "%(n)d item(s) for %(key)s could be neither stored in Redis nor kept in "
                "%(file)s: they are lost",
                {"n": lost, "key": self.key, "file": self.writer.rejected_file},
            )
        if self.writer.rejected:
            logger.error(
                "%(n)d item(s) Redis did not take are kept in %(file)s (one per line; "
                "push them back to %(key)s when Redis accepts them)",
                {"n": self.writer.rejected, "file": self.writer.rejected_file, "key": self.key},
            )
        logger.info("Stored %(n)d item(s) in %(key)s", {"n": self.writer.sent, "key": self.key})


class RedisStreamPipeline(RedisPipeline):
    """Adds every item to the crawl's items stream, ``<crawl>:items:stream``
    (``REDIS_ITEMS_STREAM_KEY``), for consumer groups (:mod:`scrapy_dist.streams`).

    ``ITEM_PIPELINES = {"scrapy_dist.pipelines.RedisStreamPipeline": 300}``. Each entry
    is ``{"item": <JSON>, "spider": <spider>, "worker": <host:pid>}`` (the item
    serialized as :class:`RedisPipeline` does). Batching, back-pressure, outages and
    refusals, the rejected file and closing are :class:`RedisPipeline`'s. With
    ``REDIS_ITEMS_STREAM_MAXLEN`` the stream is capped near that many entries (``XADD
    MAXLEN ~``: the oldest go, read or not); without, it grows until trimmed (a warning
    says so when the spider opens). A subclass's ``from_settings`` or ``from_crawler``
    builds it as :class:`RedisPipeline`'s do.
    """

    def _writer_for(self, client: redis.Redis, key: str | None) -> ItemWriter:
        return StreamWriter(client, key or str(default_settings.REDIS_ITEMS_STREAM_KEY))

    _KEY_SETTING = "REDIS_ITEMS_STREAM_KEY"

    @classmethod
    def _key_template(cls, config: Config) -> str:
        """The template of the items stream (``REDIS_ITEMS_STREAM_KEY``)."""
        return config.items.stream_key

    @classmethod
    def _check_slot(cls, parts: Parts, key: str) -> None:
        if isinstance(parts.topology_client, ClusterClient):
            # the crawl's client is pinned to its slot: a stream elsewhere would only
            # ever get MOVED (an endless outage), so refuse it now, naming it
            crawl_slot(parts.keys, (key, stream_dead_key(key)))

    @classmethod
    def _writer(
        cls, client: redis.Redis, key: str, items: ItemsConfig, stats: StatsCollector | None
    ) -> ItemWriter:
        return StreamWriter(
            client,
            key,
            stream_maxlen=items.stream_maxlen,
            batch_size=items.batch_size,
            flush_interval=items.flush_interval,
            buffer_max=items.buffer_max,
            wrongtype_timeout=items.wrongtype_timeout,
            rejected_file=items.rejected_file,
            stats=stats,
        )

    def _bind(self, crawler: Crawler) -> None:
        """As :meth:`RedisPipeline._bind`; entries also get the ``spider`` and ``worker``
        fields (unless the writer has its own)."""
        super()._bind(crawler)
        if isinstance(self.writer, StreamWriter):
            fields = self.writer.fields
            fields.setdefault("spider", str(getattr(crawler.spidercls, "name", "") or ""))
            fields.setdefault("worker", f"{socket.gethostname()}:{os.getpid()}")

    def open_spider(self, spider: Spider | None = None) -> None:
        """Check the stream key, warn if the stream is uncapped, start sending.

        Raises:
            ConfigurationError: the key holds something other than a stream.
        """
        self._check_key(
            "stream", "RedisStreamPipeline adds items to a stream", "REDIS_ITEMS_STREAM_KEY"
        )
        if not getattr(self.writer, "stream_maxlen", 0):
            logger.warning(
                "The items stream %(key)s has no cap (REDIS_ITEMS_STREAM_MAXLEN = 0): it "
                "grows with every item, acknowledged or not, until trimmed (XTRIM); set "
                "REDIS_ITEMS_STREAM_MAXLEN to keep the last N (unread ones too)",
                {"key": self.key},
            )
        self._start()
