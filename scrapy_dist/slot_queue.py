"""The queue per download slot: :class:`SlotQueue`, a :class:`~scrapy_dist.queue.
PriorityQueue` per download slot with the slots' turns kept in Redis (``lua/_levels.lua``'s
slots section holds the layout and the rules; :mod:`scrapy_dist.keys` the key names).

Choose it with ``SCHEDULER_QUEUE_CLASS = "scrapy_dist.slot_queue.SlotQueue"``
(docs/politeness.md).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, cast

import redis
from scrapy import Request

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.wire import FROM_QUEUE, SLOT_DELAY_MAX
from scrapy_dist.keys import (
    LEVELS_MARKER,
    SLOTS_MARKER,
    SLOTS_READY_SUFFIX,
    SLOTS_REST_SUFFIX,
    SLOTS_WAIT_SUFFIX,
    level_key,
    levels_key,
    slot_id,
    slot_queue_key,
    slots_index_keys,
)
from scrapy_dist.queue import PriorityQueue, RedisQueue, split_entry
from scrapy_dist.serializers import JsonSerializer
from scrapy_dist.slots import Limit, Limits, bound_slot, slot_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis.client import Pipeline

    from scrapy_dist.keys import RedisKeys


def payload_slot_of(serializer: Callable[[], Any] | None = None) -> Callable[[bytes], str]:
    """The download slot of a queued request's payload, as the serializer
    ``serializer()`` gives (default: JSON; asked for at the first payload, so that a
    queue that moves nothing never builds it) reads it: ``meta["download_slot"]``, else
    its URL's host, as :func:`slot_of` names it. The function raises what the
    serializer raises for a payload that is not a request's, or
    ``KeyError``/``ValueError``."""
    built: list[Any] = []

    def slot(payload: bytes) -> str:
        if not built:
            built.append(serializer() if serializer is not None else JsonSerializer())
        obj = built[0].loads(payload)
        meta = obj.get("meta")
        return slot_of(Request(str(obj["url"]), meta=meta if isinstance(meta, dict) else None))

    return slot


def slot_queued(client: redis.Redis, queue: str, slot: str) -> int:
    """Entries queued in ``slot`` (escaped) of queue per slot ``queue``: the lengths of
    its levels (two round trips; a key of another type counts none)."""
    try:
        names = client.zrange(levels_key(slot_queue_key(queue, slot)), 0, -1)
    except redis.ResponseError:  # (written by hand: another type)
        return 0
    if not names:
        return 0
    with client.pipeline(transaction=False) as pipe:
        for name in cast("list[bytes]", names):
            pipe.llen(level_key(slot_queue_key(queue, slot), name.decode()))
        lengths = pipe.execute(raise_on_error=False)
    return sum(n for n in lengths if isinstance(n, int))


class SlotQueue(PriorityQueue):
    """One priority queue per download slot, and the slots' turns kept in Redis: a
    request of a slot with a delay is leased only when the slot's delay since its last
    lease has passed, to whichever worker asks then, so ``DOWNLOAD_DELAY`` (and
    ``DOWNLOAD_SLOTS``'s delays) hold for the whole crawl; a busy slot's requests never
    fill a worker's buffer while other slots wait. Highest priority first across the
    ready slots, then within a slot as :class:`PriorityQueue` orders them.

    The slot is Scrapy's (``meta["download_slot"]``, else the URL's host:
    :func:`scrapy_dist.slots.slot_of`). Layout and rules: ``lua/_levels.lua``'s
    slots section, :mod:`scrapy_dist.keys` (``<key>:ready``, ``:wait``, ``:resting``,
    ``:queued``, ``:delays``, ``:slot:<slot>``).

    Args (besides :class:`RedisQueue`'s):
        limits: each slot's delay and concurrency (``DOWNLOAD_DELAY``,
            ``DOWNLOAD_SLOTS``, ``CONCURRENT_REQUESTS_PER_DOMAIN``, the spider's
            attributes); ``None``: Scrapy's defaults (no delay).
        payload_slot: the slot of a queued request's payload, for :meth:`migrate`
            (default: :func:`payload_slot_of` JSON).
        holders: the crawl's holders zset, for :meth:`migrate` (``None``: the leases
            held are not given their slot).
    """

    kind = "slots"
    key_types = ("string",)
    put_back = "slot"
    moved_how = "from the priority queue (PriorityQueue) it ran with into download slots"

    def __init__(
        self,
        client: redis.Redis,
        key: Any,
        seq_key: Any = None,
        serializer: Any = None,
        *,
        order: str = "ff",
        limits: Limits | None = None,
        payload_slot: Callable[[bytes], str] | None = None,
        holders: str | None = None,
    ) -> None:
        super().__init__(client, key, seq_key, serializer, order=order)
        self.limits = limits or Limits(Limit(8, 0.0, 0.0))
        #: ``DOWNLOAD_SLOTS``'s delays, as :meth:`take_args` sends them.
        self._own_delays: list[str | float] = []
        for name, limit in self.limits.slots.items():
            self._own_delays += [slot_id(bound_slot(name)), min(limit.delay, SLOT_DELAY_MAX)]
        #: The download slot of a queued request's payload (:meth:`migrate`): by
        #: default, a JSON payload's ``meta["download_slot"]``, else its URL's host.
        self.payload_slot = payload_slot or payload_slot_of()
        #: The crawl's holders zset: :meth:`migrate` gives the leases its workers hold
        #: their slot (``None``: it does not).
        self.holders = holders
        self._draws = random.Random()

    @property
    def take(self) -> str:  # type: ignore[override]
        """``lua/reserve.lua``'s way of taking: the ready slots, in :attr:`order`."""
        return "slots" if self.order[:2] == "ff" else f"slots:{self.order[:2]}"

    def score(self, request: Request) -> str:
        """``"<score>@<slot>"``: the priority queue's score and the request's slot
        (escaped, :func:`~scrapy_dist.keys.slot_id`), as ``lua/enqueue.lua`` reads it."""
        return f"{super().score(request)!r}@{slot_id(slot_of(request))}"

    def take_args(self) -> list[str | int | float]:
        """The default delay, jitter and concurrency, a seed for the jitter's draws,
        then each ``DOWNLOAD_SLOTS`` slot and its delay (``lua/_levels.lua``
        slot_rules): they travel with every reserve, so that no flush of the crawl's
        keys can lose them."""
        default = self.limits.default
        return [
            default.delay,
            default.jitter,
            default.concurrency,
            self._draws.randint(1, 2**31 - 2),
            *self._own_delays,
        ]

    def take_keys(self, keys: RedisKeys) -> list[str]:
        """The crawl's slot pauses: a paused slot waits until its pause ends."""
        return [keys.slot_pauses]

    def pop_payloads(self, count: int = 1) -> list[bytes]:
        """Pop what a worker could lease now (a slot waiting for its delay is not
        popped), highest priority first."""
        popped = self._scripts.pop(queue=self.key, count=count, take_args=self.take_args()).run()
        return [split_entry(entry)[1] for entry in cast("list[bytes]", popped)]

    def __len__(self) -> int:
        return int(self._scripts.queued(queue=self.key, queue_kind=self.kind).run())

    def slot_levels_key(self, slot: str) -> str:
        """The levels index of ``slot``, named as the queue stores it (escaped)."""
        return levels_key(slot_queue_key(self.key, slot))

    def indexed_slots(self) -> list[str]:
        """Every slot the indexes name (ready, waiting, resting), escaped
        (:func:`~scrapy_dist.keys.slot_id`); reads them whole (for tools, tests and
        :meth:`clear`; an index of another type names none)."""
        slots: dict[str, None] = {}
        for suffix in (SLOTS_READY_SUFFIX, SLOTS_WAIT_SUFFIX, SLOTS_REST_SUFFIX):
            try:
                members = cast("list[bytes]", self.client.zrange(self.key + suffix, 0, -1))
            except redis.ResponseError:  # (another type, written by hand: no slots)
                continue
            for member in members:
                slots[member.decode()] = None
        return list(slots)

    def sizes(self) -> dict[str, int]:
        """Entries queued per slot that holds any (escaped names), counted from each
        slot's levels (for tools and tests: reads every slot)."""
        found = {}
        for slot in self.indexed_slots():
            queued = slot_queued(self.client, self.key, slot)
            if queued:
                found[slot] = queued
        return found

    def levels(self) -> list[tuple[str, int]]:
        """``(level key, entries)`` of every slot's levels (for tools and tests)."""
        out = []
        for slot in self.indexed_slots():
            out += PriorityQueue(
                self.client, slot_queue_key(self.key, slot), order=self.order
            ).levels()
        return out

    def clear(self, pipe: Pipeline | None = None) -> None:
        """Delete every entry: each slot's levels, the indexes and the marker."""
        slots = self.indexed_slots()
        keys = [self.key, *slots_index_keys(self.key)]
        for slot in slots:
            keys += [
                key
                for key, _ in PriorityQueue(self.client, slot_queue_key(self.key, slot)).levels()
            ]
            keys.append(levels_key(slot_queue_key(self.key, slot)))
        (pipe or self.client).unlink(*keys)

    def check_type(self) -> str:
        """Make sure the key is absent or holds this queue's marker; return its type.

        Raises:
            ConfigurationError: it holds anything else (a priority queue's marker: the
                crawl's queue was written with another ``SCHEDULER_QUEUE_CLASS``; see
                docs/migration.md).
        """
        kind = RedisQueue.check_type(self)
        value = self.client.get(self.key) if kind == "string" else None
        if value is not None and value != SLOTS_MARKER.encode():
            raise ConfigurationError(
                f"Redis key {self.key!r} holds {value[:40]!r}, not the marker of a "
                f"{type(self).__name__} ({SLOTS_MARKER!r}): the crawl's queue was written "
                "with another SCHEDULER_QUEUE_CLASS; finish or delete it, or choose that "
                "class again (docs/migration.md)"
            )
        return kind

    def open(self, alive: Callable[[], list[str]] | None = None) -> int:
        """Check the key; move a priority queue found there into slots (:meth:`migrate`)
        if ``alive`` names no live worker.

        Returns:
            The number of entries moved.

        Raises:
            ConfigurationError: the key holds another queue, or a priority queue while
                workers of the crawl run (they may still lease from it).
        """
        moved = 0
        if self._levels_at_key():
            running = alive() if alive is not None else []
            if running:
                raise ConfigurationError(
                    f"Redis key {self.key!r} holds the priority queue of a crawl that "
                    f"{len(running)} worker(s) registered as running may still use with "
                    f"another SCHEDULER_QUEUE_CLASS ({', '.join(running[:3])}); stop them "
                    f"(or let the crawl finish), then open it with {type(self).__name__}, "
                    "which moves the queue into slots. A worker killed without stopping "
                    "counts as running until SCHEDULER_WORKER_TIMEOUT seconds after its "
                    "last heartbeat ('scrapy-dist status' calls it silent): start again "
                    "after that (docs/migration.md)"
                )
            moved = self.migrate()
        self.check_type()
        return moved

    def _levels_at_key(self) -> bool:
        """Whether the key holds a priority queue's marker (:class:`PriorityQueue`)."""
        return bool(
            self.client.type(self.key) == b"string"
            and self.client.get(self.key) == LEVELS_MARKER.encode()
        )

    def migrate(self) -> int:
        """Move a priority queue at the key into slots, :attr:`MIGRATE_BATCH` entries per
        atomic call (``lua/to_slots.lua``), oldest first within each level, the slot of
        each read from its payload (:attr:`payload_slot`; one that cannot be read goes
        to the slot ``""``). Safe to stop and run again, and to run from several
        workers at once.

        Returns:
            The number of entries moved by this call.
        """
        moved = 0
        levels = PriorityQueue(self.client, self.key, self.seq_key)
        while self._levels_at_key():
            top = cast(
                "list[tuple[bytes, float]]",
                self.client.zrange(levels.levels_key, 0, 0, withscores=True),
            )
            if not top:  # (an empty priority queue: the call below writes the marker)
                name, score = "0", 0.0
            else:
                name, score = top[0][0].decode(), top[0][1]
            key = level_key(self.key, name)
            raw = cast("list[bytes]", self.client.lrange(key, -self.MIGRATE_BATCH, -1))
            entries = [
                (entry, f"{score!r}@{slot_id(self._payload_slot(split_entry(entry)[1]))}")
                for entry in reversed(raw)
            ]
            done, _ = (
                int(n)
                for n in cast(
                    "list[int]",
                    self._scripts.to_slots(queue=self.key, level=name, entries=entries).run(),
                )
            )
            moved += max(0, done)
        if self.holders is not None:
            self._slot_leases(self.holders)
        return moved

    def _slot_leases(self, holders: str) -> int:
        """Give the leases held from the priority queue their slot (``lua/slot_leases.lua``):
        each worker's holding that ``holders`` names, a record without a slot rewritten
        with the one its payload names. Returns how many."""
        done = 0
        for worker in cast("list[bytes]", self.client.zrange(holders, 0, -1)):
            holding = f"{holders}:{worker.decode()}"
            records = []
            for lease_id, record in cast(
                "dict[bytes, bytes]", self.client.hgetall(holding)
            ).items():
                origin, score, payload = (
                    record.split(b"|", 2) if record.count(b"|") >= 2 else (b"", b"", b"")
                )
                if origin != FROM_QUEUE.encode() or b"@" in score:
                    continue
                slot = slot_id(self._payload_slot(payload)).encode()
                records.append((lease_id, record, b"%s|%s@%s|%s" % (origin, score, slot, payload)))
            if records:
                done += int(self._scripts.slot_leases(holding=holding, records=records).run())
        return done

    def _payload_slot(self, payload: bytes) -> str:
        """The download slot of a queued request's payload, or ``""``."""
        try:
            return self.payload_slot(payload)
        except Exception:  # a payload that does not decode: a worker dead-letters it
            return ""
