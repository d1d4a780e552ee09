"""A worker's gateway to its crawl's shared state: leases, acknowledgements, completion.

One :class:`Frontier` per crawler, shared by the scheduler and the spider. Writes
(enqueues and lease settlements) go through an ordered outbox: they are sent at once,
in order, and if Redis cannot be reached they stay in memory and are retried with a
bounded exponential backoff, so a Redis outage neither crashes nor closes the crawl and
a parent's acknowledgement never overtakes the requests it produced.

Delivery (see the README, "Delivery guarantee"): taking a request or a seed moves it
into ``<crawl>:leases`` with a deadline (``lua/reserve.lua``). The worker renews the
leases it holds, and settles each one when Scrapy is done with it (``lua/settle.lua``):
acknowledged, returned for another try with the failure's reason, or handed back
untouched at shutdown. Leases whose worker died expire and return to the queue with
their delivery count; past ``SCHEDULER_MAX_DELIVERIES`` they go to the dead-letter list.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast
from weakref import WeakKeyDictionary

import redis

from scrapy_dist.addon import settings_for
from scrapy_dist.connection import client_for, describe
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.keys import keys_for
from scrapy_dist.queue import FifoQueue, LifoQueue, PriorityQueue, RedisQueue
from scrapy_dist.scripts import scripts_for
from scrapy_dist.seeds import SeedQueue
from scrapy_dist.workers import new_worker_id

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from redis.client import Pipeline
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.queue import FilterBackend

logger = logging.getLogger(__name__)

#: Outcome of a lease: Scrapy is done with it.
DONE = ""
#: Outcome of a lease: give it back untouched (not counted as a delivery).
HAND_BACK = "~"

#: First and longest pause between attempts to reach Redis after a failure (seconds).
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0
#: Expired leases reclaimed per reserve call, at most.
RECLAIM_LIMIT = 100

#: Errors that mean "Redis is not reachable right now": keep the work, retry later.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)

_by_crawler: WeakKeyDictionary[Crawler, Frontier] = WeakKeyDictionary()


class Lease(NamedTuple):
    """An entry this worker holds: its lease id, how often it was delivered, its data
    (a request payload, or a raw seed)."""

    id: str
    deliveries: int
    data: bytes


class Progress(NamedTuple):
    """Where the crawl as a whole stands (see ``lua/progress.lua``)."""

    #: ``"busy"``, ``"waiting"`` (nothing settled yet), ``"idle"`` or ``"finished"``.
    state: str
    queued: int
    seeds: int
    leased: int


@dataclass
class _Op:
    """One outbox write: how to send it, and what to do with its reply."""

    send: Callable[[Pipeline | None], Any]
    on_reply: Callable[[Any], None]


#: How a request goes back to each queue, and how each seed mode is read and returned.
_QUEUE_TAKE = {FifoQueue: ("rpop", "rpush"), LifoQueue: ("lpop", "lpush"),
               PriorityQueue: ("zpopmin", "zadd")}  # fmt: skip
_SEED_TAKE = {"list": ("lpop", "lpush"), "set": ("spop", "sadd"), "zset": ("zpopmax", "zadd")}


class Frontier:
    """Leases, settlements, the write outbox and crawl completion for one worker.

    Args:
        client: the crawl's Redis client.
        keys: the crawl's keys.
        queue: the shared request queue.
        seeds: the crawl's seeds key.
        worker_id: this worker's id, recorded in its leases.
        lease_timeout: seconds a lease lasts without renewal.
        max_deliveries: deliveries of one entry before it is dead-lettered.
        stats: returns the crawler's stats collector (which Scrapy creates after the
            spider, so it is looked up when first needed).
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        queue: RedisQueue,
        seeds: SeedQueue,
        *,
        worker_id: str,
        lease_timeout: float,
        max_deliveries: int,
        stats: Callable[[], StatsCollector],
    ) -> None:
        if lease_timeout <= 0:
            raise ConfigurationError(f"SCHEDULER_LEASE_TIMEOUT must be positive ({lease_timeout})")
        if max_deliveries < 1:
            raise ConfigurationError(
                f"SCHEDULER_MAX_DELIVERIES must be at least 1 ({max_deliveries})"
            )
        take = next((v for cls, v in _QUEUE_TAKE.items() if isinstance(queue, cls)), None)
        if take is None:
            raise ConfigurationError(f"{type(queue).__name__} is not a queue scrapy_dist can lease")
        self.client = client
        self.keys = keys
        self.queue = queue
        self.seeds = seeds
        self.worker_id = worker_id
        self.lease_timeout = lease_timeout
        self.max_deliveries = max_deliveries
        self._get_stats = stats
        #: Keys deleted when a crawl that does not persist finishes.
        self.clear_keys: list[str] = list(keys.frontier())
        self._take, self._give_back = take
        self._scripts = scripts_for(client)
        self._outbox: deque[_Op] = deque()
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_MIN

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> Frontier:
        """The crawler's frontier, built on first use from its settings (no I/O)."""
        try:
            return _by_crawler[crawler]
        except KeyError:
            pass
        from scrapy.utils.misc import load_object

        settings = settings_for(crawler)
        client = client_for(crawler)
        keys = keys_for(crawler)
        queue_cls = load_object(settings["SCHEDULER_QUEUE_CLASS"])
        if not (isinstance(queue_cls, type) and issubclass(queue_cls, RedisQueue)):
            raise ConfigurationError(
                f"SCHEDULER_QUEUE_CLASS {settings['SCHEDULER_QUEUE_CLASS']!r} is not a "
                "scrapy_dist.queue.RedisQueue subclass (FifoQueue, LifoQueue, PriorityQueue)"
            )
        frontier = _by_crawler[crawler] = cls(
            client,
            keys,
            queue_cls(client, keys.requests, keys.seq),
            SeedQueue(client, keys.start_urls, SeedQueue.kind_from_settings(settings)),
            worker_id=new_worker_id(),
            lease_timeout=settings.getfloat("SCHEDULER_LEASE_TIMEOUT"),
            max_deliveries=settings.getint("SCHEDULER_MAX_DELIVERIES"),
            stats=lambda: crawler.stats,
        )
        return frontier

    @property
    def stats(self) -> StatsCollector:
        """The crawler's stats collector."""
        return self._get_stats()

    # -- connectivity ---------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        """``False`` while Redis is known to be unreachable (since the last failure)."""
        return self._down_since is None

    def _can_try(self) -> bool:
        return self._down_since is None or time.monotonic() >= self._retry_at

    def _failed(self, error: Exception) -> None:
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
            self._backoff = BACKOFF_MIN
            logger.warning(
                "Redis at %(server)s is unreachable (%(error)s): keeping %(n)d pending "
                "write(s) in memory and retrying with backoff up to %(max)ds",
                {
                    "server": describe(self.client),
                    "error": error,
                    "n": len(self._outbox),
                    "max": BACKOFF_MAX,
                },
            )
        else:
            self._backoff = min(self._backoff * 2, BACKOFF_MAX)
        self._retry_at = now + self._backoff
        self.stats.inc_value("scheduler/redis/unreachable")

    def _recovered(self) -> None:
        if self._down_since is not None:
            logger.warning(
                "Redis at %(server)s is reachable again after %(s).1fs",
                {"server": describe(self.client), "s": time.monotonic() - self._down_since},
            )
            self._down_since = None

    def call(self, func: Callable[[], Any]) -> Any:
        """Run one read or write now, noting Redis failures for the backoff.

        Returns:
            What ``func`` returned, or ``None`` when Redis is unreachable (now or still
            within the backoff pause).
        """
        if not self._can_try() or not self.flush():
            return None
        try:
            result = func()
        except UNREACHABLE as e:
            self._failed(e)
            return None
        self._recovered()
        return result

    # -- writes (ordered outbox) ----------------------------------------------------

    def flush(self) -> bool:
        """Send every pending write, in order, in one round trip.

        Returns:
            ``True`` if nothing is left pending.
        """
        if not self._outbox:
            return True
        if not self._can_try():
            return False
        ops = list(self._outbox)
        replies: list[Any]
        try:
            if len(ops) == 1:
                try:
                    replies = [ops[0].send(None)]
                except UNREACHABLE:
                    raise
                except redis.RedisError as e:
                    replies = [e]
            else:
                with self.client.pipeline(transaction=False) as pipe:
                    for op in ops:
                        op.send(pipe)
                    replies = pipe.execute(raise_on_error=False)
        except UNREACHABLE as e:
            self._failed(e)
            return False
        self._recovered()
        for _ in ops:
            self._outbox.popleft()
        for op, reply in zip(ops, replies, strict=True):
            if isinstance(reply, Exception):
                self._rejected(reply)
            else:
                op.on_reply(reply)
        return True

    def _rejected(self, error: Exception) -> None:
        """Redis answered a write with an error: it cannot succeed by retrying."""
        logger.error(
            "Redis rejected a write to crawl %(crawl)s: %(error)s",
            {"crawl": self.keys.crawl, "error": error},
        )
        self.stats.inc_value("scheduler/redis/rejected")

    def _write(self, op: _Op) -> bool:
        self._outbox.append(op)
        return self.flush()

    def enqueue(
        self,
        items: Sequence[tuple[bytes, float, bytes]],
        dupefilter: FilterBackend | None,
        on_reply: Callable[[list[bool]], None],
    ) -> bool:
        """Enqueue ``(payload, score, fingerprint)`` items (deduplicated atomically).

        ``on_reply`` receives one flag per item (queued or filtered) once Redis has them.

        Returns:
            ``True`` if they reached Redis now, ``False`` if they wait in the outbox.
        """

        def send(pipe: Pipeline | None) -> Any:
            return self.queue.push(items, dupefilter, pipe=pipe)

        def reply(flags: Any) -> None:
            on_reply([bool(flag) for flag in flags] if flags else [])

        return self._write(_Op(send, reply))

    def settle(self, outcomes: Sequence[tuple[str, str]]) -> bool:
        """Settle leases: ``(lease id, outcome)`` with outcome :data:`DONE`,
        :data:`HAND_BACK` or a failure reason. Sent after every earlier write.

        Returns:
            ``True`` if sent now, ``False`` if it waits in the outbox.
        """
        if not outcomes:
            return True
        args: list[str | int] = [self.worker_id, self._give_back, _SEED_TAKE[self.seeds.kind][1],
                                 self.max_deliveries]  # fmt: skip
        for lease_id, outcome in outcomes:
            args += (lease_id, outcome)
        keys = self._lease_keys()

        def send(pipe: Pipeline | None) -> Any:
            return self._scripts.settle(keys=keys, args=args, client=pipe)

        return self._write(_Op(send, self._count_settled))

    def _count_settled(self, reply: Any) -> None:
        done, retried, dead, handed, lost = (int(x) for x in reply)
        for name, n in (("acked", done), ("retried", retried), ("dead", dead),
                        ("handed_back", handed), ("lease_lost", lost)):  # fmt: skip
            if n:
                self.stats.inc_value(f"scheduler/leases/{name}", n)
        if lost:
            logger.warning(
                "%(n)d lease(s) had expired and were taken back before this worker settled "
                "them (raise SCHEDULER_LEASE_TIMEOUT if requests take that long): those "
                "requests may be crawled twice",
                {"n": lost},
            )

    def _lease_keys(self) -> list[str]:
        k = self.keys
        return [k.leases, k.leased, k.deliveries, k.dead, self.queue.key, self.seeds.key,
                k.progress]  # fmt: skip

    # -- reads ----------------------------------------------------------------------

    def reserve(self, count: int, *, seeds: bool = False) -> list[Lease]:
        """Lease up to ``count`` requests (or seeds), reclaiming expired leases first.

        Returns:
            The leases, in queue order; empty when there is nothing or Redis is
            unreachable.
        """
        k = self.keys
        take = _SEED_TAKE[self.seeds.kind][0] if seeds else self._take
        args = ["s" if seeds else "q", take, self._give_back, _SEED_TAKE[self.seeds.kind][1],
                count, self.lease_timeout, self.worker_id, self.max_deliveries,
                RECLAIM_LIMIT]  # fmt: skip
        keys = [k.leases, k.leased, k.deliveries, k.dead, self.queue.key, self.seeds.key, k.seq,
                k.progress]  # fmt: skip
        reply = self.call(lambda: self._scripts.reserve(keys=keys, args=args))
        if not reply:
            return []
        leases = []
        for i in range(0, len(reply), 3):
            lease_id = reply[i].decode()
            entry: bytes = reply[i + 2]
            leases.append(Lease(lease_id, int(reply[i + 1]), entry if seeds else entry[16:]))
        return leases

    def renew(self, lease_ids: Sequence[str]) -> int:
        """Extend the deadlines of these leases in one call; returns how many were renewed."""
        if not lease_ids:
            return 0
        keys = [self.keys.leases, self.keys.leased]
        args: list[str | float] = [self.worker_id, self.lease_timeout, *lease_ids]
        return int(self.call(lambda: self._scripts.renew(keys=keys, args=args)) or 0)

    def progress(self, *, grace: float, clear: bool, keep_for: float = 86400) -> Progress | None:
        """Where the crawl as a whole stands; marks it finished after ``grace`` seconds of
        emptiness and then, with ``clear``, deletes the frontier (exactly once).

        Returns:
            The progress, or ``None`` if Redis is unreachable.
        """
        k = self.keys
        keys = [self.queue.key, self.seeds.key, k.leases, k.progress, *self.clear_keys]
        args: list[str | int | float] = [
            self.queue.kind, self.seeds.kind, grace, int(clear), int(keep_for)
        ]
        reply = self.call(lambda: self._scripts.progress(keys=keys, args=args))
        if reply is None:
            return None
        state, queued, seeds, leased, _ = reply
        return Progress(state.decode(), int(queued), int(seeds), int(leased))

    def totals(self) -> dict[str, int]:
        """The crawl-wide counters (``done``, ``retried``, ``dead``)."""
        reply = self.call(lambda: self.client.hgetall(self.keys.progress))
        raw = cast("dict[bytes, bytes] | None", reply)
        return {
            name.decode(): int(float(value))
            for name, value in (raw or {}).items()
            if name in (b"done", b"retried", b"dead")
        }

    @property
    def pending_writes(self) -> int:
        """Writes waiting in the outbox for Redis to come back."""
        return len(self._outbox)
