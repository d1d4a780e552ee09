"""Sending serialized items to Redis for the item pipelines (:mod:`scrapy_dist.pipelines`).

:class:`ItemWriter` buffers items and sends them from a background thread, one
``RPUSH`` per run of items for one list, trimming to ``maxlen`` if set;
:class:`StreamWriter` adds each as a stream entry (``XADD``). Both keep items in order
through outages and refusals, retrying with the outbox's backoff, and keep what Redis
refuses for good, or what is still unsent when closing times out, in a rejected file.
An item handed in as :class:`Stored` is confirmed (``on_stored``) once Redis has it or
the rejected file does.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from scrapy_dist import default_settings
from scrapy_dist.config.components import check_items
from scrapy_dist.connection import describe
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.outbox import BACKOFF_MAX, BACKOFF_MIN, UNREACHABLE, refusal

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

#: Seconds closing the spider keeps retrying when Redis is unreachable.
CLOSE_TIMEOUT = 30.0
#: Items buffered before ``process_item`` makes Scrapy wait (back-pressure).
BUFFER_MAX = 10_000


class Stored(bytes):
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
            data = Stored(data)
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
        callbacks = [data.on_stored for data in items if isinstance(data, Stored)]
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
