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
import re
import socket
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis
import scrapy.utils.defer
from scrapy.utils.serialize import ScrapyJSONEncoder

from scrapy_dist import default_settings
from scrapy_dist.assembly import assemble
from scrapy_dist.config.components import check_items
from scrapy_dist.config.core import Config
from scrapy_dist.connection import ClusterClient, describe, get_redis_from_settings
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.outbox import BACKOFF_MAX, BACKOFF_MIN, UNREACHABLE, refusal
from scrapy_dist.keys import crawl_slot, expect_type, key_type, stream_dead_key

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

#: Seconds closing the spider keeps retrying when Redis is unreachable.
CLOSE_TIMEOUT = 30.0
#: Items buffered before ``process_item`` makes Scrapy wait (back-pressure).
BUFFER_MAX = 10_000


class _Stored(bytes):
    """A serialized item with what to call once it is stored (or kept aside)."""

    on_stored: Callable[[], None]


def rejected_path(template: str, key: str) -> Path:
    """Where items Redis refuses for good are kept: ``template`` with ``%(key)s`` (the
    items list, made safe for a file name) and ``%(pid)s`` filled in."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key)
    return Path(template % {"key": safe, "pid": os.getpid()})


class ItemWriter:
    """Sends serialized items to a Redis list from a background thread, in order.

    Redis unreachable, or refusing writes for now (:data:`~scrapy_dist.frontier.outbox.REFUSALS`:
    OOM, NOREPLICAS, READONLY, LOADING, a key of the wrong type for less than
    ``wrongtype_timeout``...), is an outage: the items stay in the buffer, in order, and
    are retried with the outbox's bounded backoff; one warning when the outage starts,
    one when it ends, and ``items/redis/refused/<CODE>`` or ``items/redis/unreachable``
    counted per failed attempt. A permanent refusal (any other error answer, or a key
    of the wrong type for longer) keeps the refused items aside, one per line, in
    :attr:`rejected_file` (logged with their count; ``items/redis/rejected``).

    Args:
        client: the Redis client (thread-safe: the thread takes its own connection).
        key: the items list.
        maxlen: keep at most this many items in the list (0: all).
        batch_size: items per ``RPUSH``.
        flush_interval: longest time an item waits in the buffer, in seconds.
        buffer_max: unsent items from which :meth:`put` reports a full buffer.
        wrongtype_timeout: seconds a list of the wrong type is waited for.
        rejected_file: the file items refused for good are appended to (template, see
            :func:`rejected_path`).
        stats: the crawler's stats collector, or ``None``.

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
        buffer_max: int = BUFFER_MAX,
        wrongtype_timeout: float = 300.0,
        rejected_file: str = str(default_settings.REDIS_ITEMS_REJECTED_FILE),
        stats: StatsCollector | None = None,
    ) -> None:
        check_items(maxlen, batch_size, flush_interval)
        self.client = client
        self.key = key
        self.maxlen = maxlen
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.buffer_max = max(1, buffer_max)
        self.wrongtype_timeout = wrongtype_timeout
        self._rejected_template = rejected_file
        self.stats = stats
        #: Called from the sending thread when a full buffer has room again.
        self.on_room: Callable[[], None] | None = None
        #: Called from the sending thread with the ``on_stored`` callbacks of items
        #: stored (or kept aside); ``None``: they are called there.
        self.on_done: Callable[[list[Callable[[], None]]], None] | None = None
        #: Send buffered items at once rather than when a batch is full or
        #: ``flush_interval`` old (someone waits for them).
        self.eager = False
        #: Items sent to Redis so far.
        self.sent = 0
        #: Items kept aside in :attr:`rejected_file`.
        self.rejected = 0
        self._buffer: deque[tuple[str, bytes]] = deque()
        self._sending = 0
        self._cond = threading.Condition()
        #: When the oldest buffered item was put.
        self._oldest = 0.0
        self._retry_at = 0.0
        self._backoff = BACKOFF_MIN
        self._down_since: float | None = None
        self._wrongtype_since: float | None = None
        self._full = False
        #: Items are being refused for good (logged once until one is stored).
        self._rejecting = False
        self._closing = False
        self._give_up_at = float("inf")
        self._thread: threading.Thread | None = None

    @property
    def rejected_file(self) -> Path:
        """Where items refused for good are kept: the ``rejected_file`` template filled
        with the writer's :attr:`key` as it is now (a key template filled in after the
        writer was built names the file too)."""
        return rejected_path(self._rejected_template, self.key)

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called."""
        return self._thread is not None

    def start(self) -> None:
        """Start the sending thread."""
        self._thread = threading.Thread(
            target=self._run, name=f"scrapy-dist items {self.key}", daemon=True
        )
        self._thread.start()

    def put(
        self, data: bytes, key: str | None = None, on_stored: Callable[[], None] | None = None
    ) -> bool:
        """Buffer one serialized item for ``key`` (default: the writer's list); never
        blocks on Redis. ``on_stored`` is called once the item is stored or kept in
        :attr:`rejected_file` (through :attr:`on_done`).

        Returns:
            ``True`` if the buffer is full (``buffer_max`` items unsent): the caller
            should wait for :attr:`on_room` before putting more.
        """
        if on_stored is not None:
            data = _Stored(data)
            data.on_stored = on_stored
        with self._cond:
            if not self._buffer:
                self._oldest = time.monotonic()
                self._cond.notify()
            self._buffer.append((key or self.key, data))
            if len(self._buffer) == self.batch_size:
                self._cond.notify()
            if len(self._buffer) + self._sending >= self.buffer_max:
                self._full = True
            return self._full

    @property
    def unsent(self) -> int:
        """Items not yet stored in Redis (buffered or being sent)."""
        with self._cond:
            return len(self._buffer) + self._sending

    @property
    def full(self) -> bool:
        """Whether :meth:`put` reported a full buffer that has not drained since."""
        with self._cond:
            return self._full

    def close(self, timeout: float = CLOSE_TIMEOUT) -> int:
        """Send everything buffered, retrying for up to ``timeout`` seconds while Redis
        fails, stop the thread, and keep what is left in :attr:`rejected_file`.

        Returns:
            The number of items that could be neither stored nor kept in the file.
        """
        with self._cond:
            self._closing = True
            self._give_up_at = time.monotonic() + timeout
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout + 5)
            if self._thread.is_alive():  # stuck in a call to Redis: take what is left
                logger.error("The items thread is stuck in a call to Redis")
        with self._cond:
            left = list(self._buffer)
            self._buffer.clear()
        if not left:
            return self._sending
        reason = f"Redis did not accept them within {timeout:g}s of closing"
        if self._keep_aside(left, reason):
            return self._sending
        return len(left) + self._sending

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
                if self._closing and self._down_since is not None and now >= self._give_up_at:
                    return None
                wake = self._retry_at
                if now >= wake:
                    due = self._oldest + (0.0 if self.eager else self.flush_interval)
                    if self._closing or len(self._buffer) >= self.batch_size or now >= due:
                        count = min(len(self._buffer), self.batch_size)
                        batch = [self._buffer.popleft() for _ in range(count)]
                        self._sending = count
                        return batch
                    wake = due
                self._cond.wait(max(0.0, min(wake, self._give_up_at) - now))

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                retry, error = self._send(batch)
            except Exception as e:  # a bug must not stop the thread: keep the items
                logger.exception(
                    "Unexpected error while storing items in %(key)s", {"key": self.key}
                )
                retry, error = batch, e
            with self._cond:
                self._buffer.extendleft(reversed(retry))
                self._sending = 0
                if retry:
                    self._oldest = time.monotonic()
                room = self._full and len(self._buffer) < self.buffer_max
                if room:
                    self._full = False
            if error is not None:
                self._failed(error)
            elif self._down_since is not None:
                self._recovered()
            if room and self.on_room is not None:
                self.on_room()

    def _send(
        self, batch: list[tuple[str, bytes]]
    ) -> tuple[list[tuple[str, bytes]], Exception | None]:
        """Send one batch: one ``RPUSH`` per run of items for the same list, in order.

        Returns:
            The items to retry (refused for now, or all if Redis could not be reached)
            and the error of that outage (``None`` if there is none).
        """
        runs = self._group(batch)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                self._queue(pipe, runs)
                answers = pipe.execute(raise_on_error=False)
        except redis.RedisError as e:  # unreachable: stored or not, send again
            return batch, e
        retry: list[tuple[str, bytes]] = []
        outage: Exception | None = None
        now = time.monotonic()
        for (key, items), answer in zip(runs, answers, strict=False):
            if not isinstance(answer, Exception):
                with self._cond:
                    self.sent += len(items)
                self._inc("items/redis/stored", len(items))
                self._wrongtype_since = None
                self._rejecting = False
                self._done(items)
                continue
            kept = [(key, data) for data in items]
            if self._for_now(answer, now) or not self._keep_aside(kept, str(answer)):
                retry += kept
                outage = outage or answer
        return retry, outage

    def _group(self, batch: list[tuple[str, bytes]]) -> list[tuple[str, list[bytes]]]:
        """The batch as runs, each sent by one command whose answer is the run's."""
        return _runs(batch)

    def _queue(self, pipe: Any, runs: list[tuple[str, list[bytes]]]) -> None:
        """Queue the commands that store ``runs`` on ``pipe``: the first answer of each
        run is its own (one ``RPUSH`` each), trimming commands after them."""
        for key, items in runs:
            pipe.rpush(key, *items)
        if self.maxlen:
            for key in dict.fromkeys(key for key, _ in runs):
                pipe.ltrim(key, -self.maxlen, -1)

    def _for_now(self, error: Exception, now: float) -> bool:
        """Whether a run's error answer is a refusal for now (retry) rather than for good."""
        code = refusal(error)
        if code == "WRONGTYPE":
            if self._wrongtype_since is None:
                self._wrongtype_since = now
            # for too long: an operator's mistake that stays
            return now - self._wrongtype_since < self.wrongtype_timeout
        return code is not None or not isinstance(error, redis.exceptions.ResponseError)

    def _keep_aside(self, items: list[tuple[str, bytes]], reason: str) -> bool:
        """Append items Redis will not take to :attr:`rejected_file` (one per line, as
        they would be stored) and say so.

        Returns:
            Whether they were written.
        """
        try:
            self.rejected_file.parent.mkdir(parents=True, exist_ok=True)
            with self.rejected_file.open("ab") as f:
                for _, data in items:
                    f.write(data + b"\n")
        except OSError as e:
            logger.error(
                "Could not keep %(n)d item(s) Redis refused (%(reason)s) in %(file)s: %(error)s",
                {"n": len(items), "reason": reason, "file": self.rejected_file, "error": e},
            )
            return False
        with self._cond:
            self.rejected += len(items)
        self._inc("items/redis/rejected", len(items))
        self._done([data for _, data in items])
        # one line per run of refusals (closing reports the total)
        logger.log(
            logging.DEBUG if self._rejecting else logging.ERROR,
            "Could not store %(n)d item(s) in %(key)s (%(reason)s): they are kept in "
            "%(file)s, one per line%(more)s",
            {
                "n": len(items),
                "key": items[0][0],
                "reason": reason,
                "file": self.rejected_file,
                "more": "" if self._rejecting else ", as will be the next ones refused so",
            },
        )
        self._rejecting = True
        return True

    def _done(self, items: list[bytes]) -> None:
        """Items stored or kept aside: call their ``on_stored`` callbacks."""
        callbacks = [data.on_stored for data in items if isinstance(data, _Stored)]
        if not callbacks:
            return
        if self.on_done is not None:
            self.on_done(callbacks)
        else:
            for callback in callbacks:
                callback()

    def _failed(self, error: Exception) -> None:
        """An outage: one warning when it starts, then a growing pause before the next try."""
        now = time.monotonic()
        code = refusal(error) or ("" if isinstance(error, UNREACHABLE) else "ERR")
        if self._down_since is None:
            self._down_since = now
            self._backoff = BACKOFF_MIN
            what = f"refuses writes ({code}: {error})" if code else f"is unreachable ({error})"
            logger.warning(
                "Redis at %(server)s %(what)s: keeping %(n)d item(s) for %(key)s in "
                "memory, in order, and retrying with backoff up to %(max)ds",
                {
                    "server": describe(self.client),
                    "what": what,
                    "n": self.unsent,
                    "key": self.key,
                    "max": BACKOFF_MAX,
                },
            )
        else:
            self._backoff = min(self._backoff * 2, BACKOFF_MAX)
        with self._cond:
            self._retry_at = now + self._backoff
        self._inc(f"items/redis/refused/{code}" if code else "items/redis/unreachable")

    def _recovered(self) -> None:
        assert self._down_since is not None
        logger.warning(
            "Items are stored in %(key)s again after %(s).1fs",
            {"key": self.key, "s": time.monotonic() - self._down_since},
        )
        self._down_since = None
        with self._cond:
            self._retry_at = 0.0

    def _inc(self, stat: str, count: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(stat, count)


def _runs(batch: list[tuple[str, bytes]]) -> list[tuple[str, list[bytes]]]:
    """Consecutive items for the same list, grouped (one ``RPUSH`` each), in order."""
    runs: list[tuple[str, list[bytes]]] = []
    for key, data in batch:
        if runs and runs[-1][0] == key:
            runs[-1][1].append(data)
        else:
            runs.append((key, [data]))
    return runs


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


class StreamWriter(ItemWriter):
    """An :class:`ItemWriter` that adds each item to a Redis Stream (``XADD``, pipelined
    per batch) as an entry ``{"item": <serialized item>, **fields}``, capped near
    ``stream_maxlen`` entries (``MAXLEN ~``) if set. Refusals and outages are handled as
    for the list (the items stay buffered, in order).

    Args:
        client: the Redis client.
        key: the stream.
        fields: the other fields of every entry (``spider``, ``worker``).
        stream_maxlen: approximate cap of the stream (0: none).
        kwargs: as for :class:`ItemWriter` (but ``maxlen``).
    """

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        *,
        fields: dict[str, str] | None = None,
        stream_maxlen: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, key, **kwargs)
        if stream_maxlen < 0:
            raise ConfigurationError(
                f"REDIS_ITEMS_STREAM_MAXLEN cannot be negative ({stream_maxlen})"
            )
        #: The other fields of every entry.
        self.fields: dict[str | bytes, str | bytes] = {}
        self.fields.update(fields or {})
        self.stream_maxlen = stream_maxlen

    def _group(self, batch: list[tuple[str, bytes]]) -> list[tuple[str, list[bytes]]]:
        return [(key, [data]) for key, data in batch]  # one XADD, one answer, per item

    def _queue(self, pipe: Any, runs: list[tuple[str, list[bytes]]]) -> None:
        for key, (data,) in runs:
            entry: dict[str | bytes, str | bytes] = {"item": data, **self.fields}
            if self.stream_maxlen:
                pipe.xadd(key, entry, maxlen=self.stream_maxlen, approximate=True)
            else:
                pipe.xadd(key, entry)


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
