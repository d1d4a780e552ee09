"""Request queues over Redis: FIFO, LIFO and priority.

A queue stores entries ``<16-digit id><payload>``. The id comes from the crawl's
sequence counter, so two identical payloads (``dont_filter=True`` twice) are two
entries, and in :class:`PriorityQueue` requests of equal priority come out first-in
first-out. Pushing goes through ``lua/enqueue.lua``, which also deduplicates when
given a dupefilter backend: dedupe and enqueue are one atomic step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, cast

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.scripts import scripts_for

if TYPE_CHECKING:
    from collections.abc import Sequence

    import redis
    from redis.client import Pipeline
    from scrapy import Request

#: Length of the id that prefixes every entry.
ENTRY_ID_LEN = 16


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


class RedisQueue:
    """Base of the request queues; subclasses say how entries are stored and popped.

    Args:
        client: the crawl's Redis client.
        key: the queue key.
        seq_key: the crawl's sequence counter key.
    """

    #: Redis type of the queue key, as ``TYPE`` reports it.
    kind: ClassVar[str]

    def __init__(self, client: redis.Redis, key: str, seq_key: str) -> None:
        self.client = client
        self.key = key
        self.seq_key = seq_key
        self._enqueue = scripts_for(client).enqueue

    def score(self, request: Request) -> float:
        """The zset score of ``request`` (ignored by list queues)."""
        return 0.0

    def enqueue_call(
        self,
        items: Sequence[tuple[bytes, float, bytes]],
        dupefilter: FilterBackend | None = None,
        fence: tuple[str, str] | None = None,
    ) -> tuple[list[str], list[bytes | str | int | float]]:
        """The ``KEYS`` and ``ARGV`` of ``lua/enqueue.lua`` for these items (see :meth:`push`).

        Args:
            items: ``(payload, score, fingerprint)`` items.
            dupefilter: the dupefilter backend that tests and records fingerprints.
            fence: ``(epoch key, epoch)``: the call is refused unless the crawl's epoch
                is this one (a worker's writes); ``None`` for an unfenced caller.
        """
        # an unfenced call passes the sequence key where the epoch key goes (not read)
        epoch_key, epoch = fence or (self.seq_key, "")
        keys = [self.key, self.seq_key, epoch_key]
        args: list[bytes | str | int | float]
        if dupefilter is None:
            args = [self.kind, "none", 0]
            for payload, score, _ in items:
                args += (b"", score, payload)
        else:
            keys += dupefilter.script_keys()
            extra = dupefilter.script_args()
            args = [self.kind, dupefilter.kind, len(extra), *extra]
            token = dupefilter.token
            for payload, score, fingerprint in items:
                args += (token(fingerprint) if fingerprint else b"", score, payload)
        args.append(epoch)
        return keys, args

    def push(
        self,
        items: Sequence[tuple[bytes, float, bytes]],
        dupefilter: FilterBackend | None = None,
    ) -> list[bool]:
        """Enqueue ``(payload, score, fingerprint)`` items in one atomic call.

        With a ``dupefilter``, an item whose fingerprint is not empty is queued only if
        the fingerprint was new, and the fingerprint is recorded in the same step.

        Returns:
            One flag per item: ``True`` if queued, ``False`` if filtered as seen.
        """
        if not items:
            return []
        keys, args = self.enqueue_call(items, dupefilter)
        return [bool(flag) for flag in self._enqueue(keys=keys, args=args)]

    def pop(self, count: int = 1) -> list[bytes]:
        """Remove and return up to ``count`` payloads, in queue order."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete every entry."""
        (pipe or self.client).delete(self.key)

    def check_type(self) -> None:
        """Make sure the key, if it exists, has the type this queue stores.

        Raises:
            ConfigurationError: the key holds another type, e.g. a list left by a
                FIFO queue while ``SCHEDULER_QUEUE_CLASS`` now names the priority queue.
        """
        actual = self.client.type(self.key)
        actual = actual.decode() if isinstance(actual, bytes) else str(actual)
        if actual not in ("none", self.kind):
            raise ConfigurationError(
                f"Redis key {self.key!r} holds a {actual} but {type(self).__name__} stores "
                f"a {self.kind}; delete the key or choose the matching SCHEDULER_QUEUE_CLASS"
            )


class _ListQueue(RedisQueue):
    kind = "list"

    def _pop(self, count: int) -> list[bytes] | None:
        raise NotImplementedError

    def pop(self, count: int = 1) -> list[bytes]:
        return [split_entry(entry)[1] for entry in self._pop(count) or ()]

    def __len__(self) -> int:
        return int(self.client.llen(self.key))


class FifoQueue(_ListQueue):
    """First in, first out: ``LPUSH`` then ``RPOP``."""

    def _pop(self, count: int) -> list[bytes] | None:
        return cast("list[bytes] | None", self.client.rpop(self.key, count))


class LifoQueue(_ListQueue):
    """Last in, first out: ``LPUSH`` then ``LPOP``."""

    def _pop(self, count: int) -> list[bytes] | None:
        return cast("list[bytes] | None", self.client.lpop(self.key, count))


class PriorityQueue(RedisQueue):
    """Highest ``request.priority`` first, first-in first-out among equals (a zset)."""

    kind = "zset"

    def score(self, request: Request) -> float:
        return float(-request.priority)

    def pop(self, count: int = 1) -> list[bytes]:
        popped = cast("list[tuple[bytes, float]]", self.client.zpopmin(self.key, count))
        return [split_entry(member)[1] for member, _ in popped]

    def __len__(self) -> int:
        return int(self.client.zcard(self.key))
