"""Request queues over Redis: FIFO, LIFO and priority.

A queue stores entries ``<16-digit id><payload>`` (:data:`ENTRY_ID_LEN` digits, a
constant the Lua scripts share). The id comes from the crawl's sequence counter, so two
identical payloads (``dont_filter=True`` twice) are two entries. FIFO and LIFO queues are
one list; :class:`PriorityQueue` is one list per priority level plus an index of the
levels (``lua/_levels.lua``), so that requests of equal priority come out first-in
first-out and a queued request costs what a list entry costs. Pushing
goes through ``lua/enqueue.lua``, which also deduplicates when given a dupefilter
backend: dedupe and enqueue are one atomic step. Each queue class names the commands
that take entries from its head and put one back (:attr:`RedisQueue.take`,
:attr:`RedisQueue.put_back`): the lease scripts run them, and so does :meth:`pop`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import redis
from scrapy import Request as _Request

from scrapy_dist.exceptions import ConfigurationError, redis_error_text
from scrapy_dist.frontier.registry import previous_version_running
from scrapy_dist.frontier.wire import ENTRY_ID_LEN
from scrapy_dist.keys import LEVELS_MARKER, expect_type, key_type, level_key, levels_key
from scrapy_dist.scripts import Fence, ScriptCall, scripts_for
from scrapy_dist.serializers import JsonSerializer, RequestCodec

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from redis.client import Pipeline
    from scrapy import Request, Spider

    from scrapy_dist.keys import RedisKeys


class FilterBackend(Protocol):
    """The part of a dupefilter backend the enqueue script needs (``lua/enqueue.lua``)."""

    #: The filter kind the script understands (``"set"``, ...).
    kind: ClassVar[str]

    def script_keys(self) -> list[str]:
        """Keys the script's dedupe step touches, in the order the script expects."""
        ...

    def script_args(self) -> list[str | int | float]:
        """Backend-wide arguments of the dedupe step (sizes, hash counts...)."""
        ...

    def token(self, fingerprint: bytes) -> bytes:
        """What the script tests and sets for one request fingerprint."""
        ...


def split_entry(entry: bytes) -> tuple[bytes, bytes]:
    """Split a queue entry into ``(id, payload)``."""
    return entry[:ENTRY_ID_LEN], entry[ENTRY_ID_LEN:]


class Base:
    """scrapy-redis's per-spider queue interface: ``push(request)``, ``pop(timeout)``,
    ``__len__``, ``clear``, with ``_encode_request``/``_decode_request`` around the
    serializer.

    A class written against it works as a Python queue over Redis; the scheduler only
    runs :class:`RedisQueue` subclasses, whose entries it leases (see docs/migration.md).

    Args:
        server: a Redis client.
        spider: the spider whose requests are queued (callbacks are stored by name).
        key: the queue key; ``%(spider)s`` is replaced by the spider's name.
        serializer: an object with ``dumps``/``loads``; default JSON (scrapy-redis's
            default is pickle: name ``scrapy_dist.picklecompat`` for it).
    """

    def __init__(
        self, server: redis.Redis, spider: Spider, key: str, serializer: Any = None
    ) -> None:
        serializer = JsonSerializer() if serializer is None else serializer
        for method in ("loads", "dumps"):
            if not hasattr(serializer, method):
                raise TypeError(f"serializer does not implement {method!r}: {serializer!r}")
        self.server = server
        self.spider: Spider | None = spider
        self.key = key % {"spider": spider.name}
        self.serializer = serializer
        self._codec: RequestCodec | None = RequestCodec(serializer, spider)

    def _codec_or_fail(self) -> RequestCodec:
        if self._codec is None:
            raise TypeError(f"{type(self).__name__} built without a spider stores no requests")
        return self._codec

    def _encode_request(self, request: Request) -> bytes:
        """Serialize ``request`` (``request.to_dict`` then ``serializer.dumps``).

        Raises:
            SerializationError: the request cannot be stored.
        """
        return self._codec_or_fail().encode(request)

    def _decode_request(self, encoded_request: bytes) -> Request:
        """Rebuild a request from :meth:`_encode_request`'s output.

        Raises:
            SerializationError: the data is corrupt or names a missing callback.
        """
        return self._codec_or_fail().decode(encoded_request)

    def __len__(self) -> int:
        raise NotImplementedError

    def __bool__(self) -> bool:
        """Always true: ``len()`` is a Redis round trip, never a truth test."""
        return True

    def push(self, request: Any, dupefilter: Any = None) -> Any:
        """Push a request."""
        raise NotImplementedError

    def pop(self, timeout: int = 0) -> Request | None:
        """Pop a request, or ``None``."""
        raise NotImplementedError

    def clear(self) -> None:
        """Delete the queue."""
        self.server.delete(self.key)


def unleased_queue(cls: object) -> bool:
    """Whether ``cls`` is a queue written against scrapy-redis's :class:`Base` (its own
    ``push``/``pop``) rather than a :class:`RedisQueue` the frontier can lease from."""
    return isinstance(cls, type) and issubclass(cls, Base) and not issubclass(cls, RedisQueue)


class RedisQueue(Base):
    """Base of the request queues; subclasses say how entries are stored and popped.

    Built ``(client, key, seq_key)`` by the frontier, or scrapy-redis's way
    ``(server, spider, key, serializer=None)`` for scripts that push or pop requests
    themselves (entries are numbered from ``<key prefix>:seq``, as a worker's are from
    the crawl's ``seq`` key, so both read each other's entries).

    Args:
        client: the crawl's Redis client.
        key: the queue key (or the spider, scrapy-redis's way).
        seq_key: the crawl's sequence counter key (or the queue key, scrapy-redis's way).
        serializer: scrapy-redis's way only: the request serializer (default JSON).
    """

    #: How the scripts store entries: ``"list"`` (one list at the queue key) or
    #: ``"levels"`` (a list per priority level, ``lua/_levels.lua``).
    kind: ClassVar[str]
    #: The Redis types the queue key may hold, as ``TYPE`` reports them (the first is
    #: what this version writes).
    key_types: ClassVar[tuple[str, ...]]
    #: The command that takes entries from the head of the queue (``lua/reserve.lua``
    #: runs it to lease them, :meth:`pop_payloads` to pop them); lowercase.
    take: ClassVar[str]
    #: The command that puts an entry back at the head (a lease handed back, failed or
    #: expired; ``lua/_leases.lua``); lowercase.
    put_back: ClassVar[str]

    def __init__(
        self,
        client: redis.Redis,
        key: Any,
        seq_key: Any = None,
        serializer: Any = None,
        *,
        order: str = "ff",
    ) -> None:
        #: How requests of equal priority are ordered (a priority queue's; see
        #: :class:`~scrapy_dist.config.scheduling.QueueConfig`).
        self.order = order
        if isinstance(key, str):
            self.client = self.server = client
            self.key = key
            self.seq_key = seq_key
            self.spider = None
            self._codec = None
        else:  # scrapy-redis's (server, spider, key, serializer)
            super().__init__(client, key, seq_key, serializer)
            self.client = client
            prefix = self.key[: -len(":requests")] if self.key.endswith(":requests") else self.key
            self.seq_key = f"{prefix}:seq"
        self._scripts = scripts_for(client)

    def score(self, request: Request) -> float | str:
        """The score of ``request`` (``-priority``: the priority queue's level; ignored by
        list queues; a queue per slot's names the slot too)."""
        return 0.0

    def take_args(self) -> list[str | int | float]:
        """What :attr:`take` reads after ``lua/reserve.lua``'s other arguments (none but
        a queue per slot's)."""
        return []

    def take_keys(self, keys: RedisKeys) -> list[str]:
        """The keys of the crawl ``keys`` that :attr:`take` reads after
        ``lua/reserve.lua``'s others (none but a queue per slot's)."""
        return []

    def enqueue_call(
        self,
        items: Sequence[tuple[bytes, float | str, bytes]],
        dupefilter: FilterBackend | None = None,
        fence: tuple[str, str] | Fence | None = None,
    ) -> ScriptCall:
        """The call of ``lua/enqueue.lua`` that pushes these items (see :meth:`push`).

        Args:
            items: ``(payload, score, fingerprint)`` items.
            dupefilter: the dupefilter backend that tests and records fingerprints.
            fence: ``(epoch key, epoch)`` or a :class:`~scrapy_dist.scripts.Fence`: the
                call is refused unless the crawl's epoch is this one (a worker's
                writes), and an item whose parent lease the worker no longer holds is
                refused; ``None`` for an unfenced caller.
        """
        # an unfenced call passes the sequence key where the epoch key goes (not read)
        fenced = Fence(*fence).kwargs() if fence else Fence(self.seq_key, "").kwargs()
        enqueue = self._scripts.enqueue
        if dupefilter is None:
            return enqueue(
                queue=self.key,
                seq=self.seq_key,
                queue_kind=self.kind,
                entries=[(b"", score, payload) for payload, score, _ in items],
                **fenced,
            )
        filter_keys = dupefilter.script_keys()  # (may refresh the backend's view: first)
        token = dupefilter.token
        return enqueue(
            queue=self.key,
            seq=self.seq_key,
            queue_kind=self.kind,
            filter_kind=dupefilter.kind,
            filter_keys=filter_keys,
            filter_args=dupefilter.script_args(),
            entries=[(token(fp) if fp else b"", score, payload) for payload, score, fp in items],
            **fenced,
        )

    def push(
        self,
        items: Sequence[tuple[bytes, float | str, bytes]] | Request,
        dupefilter: FilterBackend | None = None,
    ) -> list[bool]:
        """Enqueue ``(payload, score, fingerprint)`` items in one atomic call, or one
        request (scrapy-redis's ``push(request)``, never filtered).

        With a ``dupefilter``, an item whose fingerprint is not empty is queued only if
        the fingerprint was new, and the fingerprint is recorded in the same step.

        Returns:
            One flag per item: ``True`` if queued, ``False`` if filtered as seen.
        """
        if isinstance(items, _Request):
            items = [(self._encode_request(items), self.score(items), b"")]
        if not items:
            return []
        return [bool(flag) for flag in self.enqueue_call(items, dupefilter).run()]

    def pop_payloads(self, count: int = 1) -> list[bytes]:
        """Remove and return up to ``count`` payloads, in queue order."""
        raise NotImplementedError

    def pop(self, timeout: int = 0) -> Request | None:
        """Remove the next request and return it (scrapy-redis's ``pop``; ``timeout``
        is accepted and ignored: it never blocks). Workers never pop: they lease.

        Raises:
            TypeError: the queue was built without a spider.
            SerializationError: the entry cannot be rebuilt (it is gone from Redis).
        """
        if self.spider is None:
            raise TypeError("pop() needs a queue built with a spider; use pop_payloads()")
        payloads = self.pop_payloads(1)
        return self._decode_request(payloads[0]) if payloads else None

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete every entry (``UNLINK``: a queue may be large)."""
        (pipe or self.client).unlink(self.key)

    def check_type(self) -> str:
        """Make sure the key, if it exists, has a type this queue stores; return the type
        it holds (``"none"`` if absent).

        Raises:
            ConfigurationError: the key holds another type, e.g. a list left by a
                FIFO queue while ``SCHEDULER_QUEUE_CLASS`` now names the priority queue.
        """
        kind = key_type(self.client, self.key)
        expect_type(
            self.key,
            kind,
            self.key_types,
            lambda actual: (
                f"Redis key {self.key!r} holds a {actual} but {type(self).__name__} stores "
                f"a {self.key_types[0]}; delete the key or choose the matching "
                "SCHEDULER_QUEUE_CLASS"
            ),
        )
        return kind

    #: What :meth:`open` moved, for the log line that says how many (none here).
    moved_how: ClassVar[str] = ""

    def open(self, alive: Callable[[], list[str]] | None = None) -> int:
        """Make the queue ready for a worker when it opens (:meth:`check_type`; the
        priority queue also moves a previous version's queue into levels).

        Args:
            alive: the crawl's live workers (``WorkerRegistry.alive``), asked before a
                previous version's queue is moved: none may run (``None``: not asked).

        Returns:
            The number of entries moved (0 for a queue that needs no move).

        Raises:
            ConfigurationError: the key holds a type this queue cannot use.
        """
        self.check_type()
        return 0


def leasable_queue(cls: object, path: object) -> type[RedisQueue]:
    """Return ``cls``, the class ``SCHEDULER_QUEUE_CLASS`` (set as ``path``) names, if the
    frontier can lease from it.

    Raises:
        ConfigurationError: it is not a :class:`RedisQueue` subclass.
    """
    if not (isinstance(cls, type) and issubclass(cls, RedisQueue)):
        raise ConfigurationError(
            f"SCHEDULER_QUEUE_CLASS {path!r} is not a scrapy_dist.queue.RedisQueue "
            "subclass (FifoQueue, LifoQueue, PriorityQueue)"
        )
    return cls


class _ListQueue(RedisQueue):
    """A list: entries are pushed with ``LPUSH`` (``lua/enqueue.lua``)."""

    kind = "list"
    key_types = ("list",)

    def _pop(self, count: int) -> list[bytes] | None:
        raise NotImplementedError

    def pop_payloads(self, count: int = 1) -> list[bytes]:
        return [split_entry(entry)[1] for entry in self._pop(count) or ()]

    def __len__(self) -> int:
        return int(self.client.llen(self.key))


class FifoQueue(_ListQueue):
    """First in, first out: ``LPUSH`` then ``RPOP``; put back with ``RPUSH``."""

    take = "rpop"
    put_back = "rpush"

    def _pop(self, count: int) -> list[bytes] | None:
        return cast("list[bytes] | None", self.client.rpop(self.key, count))


class LifoQueue(_ListQueue):
    """Last in, first out: ``LPUSH`` then ``LPOP``; put back with ``LPUSH``."""

    take = "lpop"
    put_back = "lpush"

    def _pop(self, count: int) -> list[bytes] | None:
        return cast("list[bytes] | None", self.client.lpop(self.key, count))


class PriorityQueue(RedisQueue):
    """Highest ``request.priority`` first; among equals in the order Scrapy's scheduler
    gives them (``order``, from ``SCHEDULER_MEMORY_QUEUE`` and
    ``SCHEDULER_START_MEMORY_QUEUE``: by default last in first out, start requests first
    in first out and after the other requests of their priority).

    One list per priority level, ``<key>:level:<n>``, and an index of the levels that
    hold entries, the zset ``<key>:levels`` (score = -priority; start requests kept
    apart have levels of their own, scored ``-priority + 0.5``, or ``- 0.5`` where the
    running Scrapy serves them first); the queue key holds
    :data:`~scrapy_dist.keys.LEVELS_MARKER` (see ``lua/_levels.lua`` and
    :mod:`scrapy_dist.keys`). Entries are pushed at the tail of their level and taken
    from the head (first in first out) or the tail (last in first out) of the highest
    levels; one put back (a lease handed back, failed or expired) goes to the head of
    its level: it comes out next among its equals first in first out, last in last
    out.

    A queue written by a previous version (a zset of entries at the key) is moved into
    levels by :meth:`open` (:meth:`migrate`).
    """

    kind = "levels"
    #: The marker; or a previous version's zset, which :meth:`migrate` moves.
    key_types: ClassVar[tuple[str, ...]] = ("string", "zset")
    put_back = "level"
    #: Entries :meth:`migrate` moves per script call (each call blocks Redis briefly).
    MIGRATE_BATCH = 1000
    #: What :meth:`open` moved, for the log line that says how many.
    moved_how: ClassVar[str] = (
        "from the priority queue a previous version of scrapy_dist wrote (one zset) into levels"
    )

    #: Largest priority whose start level (``-priority + 0.5``) a score keeps exact.
    START_PRIORITY_MAX = 2**52

    @property
    def take(self) -> str:  # type: ignore[override]
        """``lua/reserve.lua``'s way of taking: the levels, in :attr:`order`."""
        return "levels" if self.order[:2] == "ff" else f"levels:{self.order[:2]}"

    def score(self, request: Request) -> float | str:
        priority = request.priority
        if (
            self.order[2:] in ("s", "S")
            and request.meta.get("is_start_request")
            and abs(priority) < self.START_PRIORITY_MAX
        ):
            # after the other requests of its priority, or before them (Scrapy 2.13)
            return -priority + (0.5 if self.order[2:] == "s" else -0.5)
        return float(-priority)

    def pop_payloads(self, count: int = 1) -> list[bytes]:
        popped = cast("list[bytes]", self._scripts.pop(queue=self.key, count=count).run())
        return [split_entry(entry)[1] for entry in popped]

    def __len__(self) -> int:
        return int(self._scripts.queued(queue=self.key, queue_kind=self.kind).run())

    @property
    def levels_key(self) -> str:
        """The index of the levels (a zset of level name -> score)."""
        return levels_key(self.key)

    def levels(self) -> list[tuple[str, int]]:
        """``(level key, entries)`` of each level in the index, highest priority first
        (two round trips; for tools and tests)."""
        names = [
            n.decode() if isinstance(n, bytes) else str(n)
            for n in cast("list[bytes]", self.client.zrange(self.levels_key, 0, -1))
        ]
        keys = [level_key(self.key, name) for name in names]
        with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.llen(key)
            sizes = pipe.execute()
        return [(key, int(n)) for key, n in zip(keys, sizes, strict=True)]

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete every entry: the levels, the index and the marker (the levels are read
        first, so a level created meanwhile is left)."""
        levels = [key for key, _ in self.levels()]
        (pipe or self.client).unlink(self.key, self.levels_key, *levels)

    def migrate(self) -> int:
        """Move a previous version's queue (a zset of entries at the key) into levels,
        :attr:`MIGRATE_BATCH` entries per atomic call (``lua/migrate.lua``), and write
        the marker; an absent key gets the marker too. Safe to stop and run again, and
        to run from several workers at once.

        Returns:
            The number of entries moved by this call.

        Raises:
            ConfigurationError: the key holds a string that is not the marker.
        """
        moved = 0
        while True:
            call = self._scripts.migrate(queue=self.key, count=self.MIGRATE_BATCH)
            try:
                done, left = (int(n) for n in cast("list[int]", call.run()))
            except redis.ResponseError as e:
                if not redis_error_text(e).startswith("WRONGTYPE"):
                    raise
                raise ConfigurationError(
                    f"Redis key {self.key!r} is not a priority queue: {e}; delete the key "
                    "or choose the matching SCHEDULER_QUEUE_CLASS"
                ) from e
            moved += done
            if not left:
                return moved

    def check_type(self) -> str:
        """Make sure the key is absent, a previous version's zset, or holds the marker;
        return its type.

        Raises:
            ConfigurationError: it holds another type, or a string that is not the marker.
        """
        kind = super().check_type()
        value = self.client.get(self.key) if kind == "string" else None
        if value is not None and value != LEVELS_MARKER.encode():
            raise ConfigurationError(
                f"Redis key {self.key!r} holds the string {value[:40]!r}, not the marker of a "
                f"{type(self).__name__} ({LEVELS_MARKER!r}); delete the key or choose the "
                "matching SCHEDULER_QUEUE_CLASS"
            )
        return kind

    def open(self, alive: Callable[[], list[str]] | None = None) -> int:
        """Check the key's type, then :meth:`migrate`; a previous version's queue only
        if ``alive`` names no live worker (those registered before the move are a
        previous version's: this version registers after it). A previous version's
        worker that runs on after the move loses the leases it hands back or reclaims
        (its scripts delete a lease, then fail to put it back on the marker).

        Raises:
            ConfigurationError: the key holds another type than the marker or a zset,
                or holds a previous version's queue while workers of the crawl run.
        """
        if self.check_type() == "zset" and alive is not None:
            running = alive()
            # a worker of this version registers after its move: one that opened at the
            # same time and registered since has moved the queue (the marker is back)
            if running and key_type(self.client, self.key) == "zset":
                raise ConfigurationError(
                    f"Redis key {self.key!r} holds the priority queue a previous version of "
                    "scrapy_dist wrote, and "
                    + previous_version_running(running, "it moves the queue into levels at open")
                )
        return self.migrate()


#: scrapy-redis's old names.
SpiderQueue = FifoQueue
SpiderStack = LifoQueue
SpiderPriorityQueue = PriorityQueue
