"""Items as a Redis Stream, consumed: consumer groups, acknowledgement, reclaim, dead items.

:class:`~scrapy_dist.pipelines.RedisStreamPipeline` adds every item to
``<crawl>:items:stream`` (``REDIS_ITEMS_STREAM_KEY``) as an entry
``{"item": <JSON>, "spider": ..., "worker": ...}``. Downstream programs read it with an
:class:`ItemConsumer`: each *group* (one per purpose: "store", "index"...) reads every
item once; the consumers of a group share its items. An item read is *pending* until
acknowledged (:meth:`ItemConsumer.ack`); the items of a consumer that died are taken
over by another one of its group once idle for ``min_idle`` seconds (``XAUTOCLAIM``),
so a crash loses none (at-least-once: a consumer killed between storing an item and
acknowledging it sees it again). An item rejected (:meth:`ItemConsumer.reject`) or
delivered ``max_deliveries`` times without acknowledgement moves to ``<stream>:dead-letters``
with the reason, atomically (``lua/item_stream.lua``); so do malformed entries.

Stream entries are untrusted input: the item is decoded with :func:`json.loads` (or
the ``decode`` given), never unpickled, never imported.

Redis >= 6.2 (``XAUTOCLAIM``, exclusive ranges). A stream read without consuming it
(its state, its groups' lag, positions, replay, the dead stream) is
:mod:`scrapy_dist.stream_admin`'s.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import redis

from scrapy_dist.exceptions import ConfigurationError, ScrapyDistError
from scrapy_dist.frontier.outbox import BACKOFF_MAX, BACKOFF_MIN, UNREACHABLE, refusal
from scrapy_dist.keys import stream_dead_key
from scrapy_dist.scripts import scripts_for
from scrapy_dist.stream_admin import (
    GroupState,
    check_id,
    create_group,
    entry_fields,
    group_states,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

#: Longest ``min_idle`` of an :class:`ItemConsumer`, in seconds (``XAUTOCLAIM`` takes
#: milliseconds as a signed 64-bit number).
MAX_MIN_IDLE = (2**63 - 1) // 1000 / 1000


class StreamEntry(NamedTuple):
    """One item read from the stream.

    Attributes:
        id: the entry id (``<ms>-<seq>``): acknowledge or reject it by this id.
        item: the decoded item (a ``dict`` with the default JSON encoding).
        fields: every field of the entry, as text (``spider``, ``worker``...).
        deliveries: times the group delivered it (1 the first time; more after a
            reclaim or a rejection).
    """

    id: str
    item: Any
    fields: dict[str, str]
    deliveries: int = 1

    @property
    def time(self) -> float:
        """When the entry was added (Unix time from its id)."""
        return int(self.id.partition("-")[0]) / 1000


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def decode_item(raw: bytes | str) -> Any:
    """The default item decoder: JSON (never pickle)."""
    return json.loads(raw)


class MalformedItem(ScrapyDistError, ValueError):
    """A stream entry whose item cannot be decoded; the message is the reason (what
    :class:`ItemConsumer` records in the dead stream) and the decoder's error, if any,
    is the cause."""


def checked_item(raw: bytes | str | None, decode: Callable[[bytes], Any] = decode_item) -> Any:
    """The item of an entry's ``item`` field (``None``: the entry has none), decoded with
    ``decode``: the guards every reader of the stream applies to untrusted entries.

    Raises:
        MalformedItem: no ``item`` field, or ``decode`` raised anything (an item of
            JSON nested deeper than Python's recursion limit raises ``RecursionError``,
            which is no ``ValueError``).
    """
    if raw is None:
        raise MalformedItem("malformed entry: no 'item' field")
    try:
        return decode(raw if isinstance(raw, bytes) else str(raw).encode("utf-8"))
    except Exception as e:  # untrusted data: any decoder failure is the entry's
        raise MalformedItem(f"malformed item: {type(e).__name__}: {e}"[:500]) from e


class ItemConsumer:
    """One consumer of one group of an items stream.

    Args:
        client: a client of the crawl's Redis.
        stream: the items stream (``<crawl>:items:stream``).
        group: the consumer group (created at the first read if absent, from
            ``start``).
        consumer: this consumer's name, unique in the group and stable across restarts
            (a restarted consumer first gets back its own pending items).
        min_idle: seconds an item stays pending with a consumer before another consumer
            of the group takes it over (the consumer is presumed dead): longer than the
            longest processing of one batch.
        max_deliveries: deliveries after which an item not acknowledged (rejected, or
            its consumers died) goes to the dead stream.
        start: where a group created here starts (``"0"``: every item in the stream).
        decode: ``raw item -> item`` (default JSON; it must not run code from data).

    Use::

        consumer = ItemConsumer(client, "books:items:stream", "store", "store-1")
        while True:
            for entry in consumer.read(count=100, block=5):
                save(entry.item)
                consumer.ack(entry.id)

    :meth:`read` and :meth:`ack` raise ``redis.RedisError`` when Redis is unreachable
    or refuses; nothing is lost then (see :meth:`ack`): retry after a pause.
    """

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        group: str,
        consumer: str,
        *,
        min_idle: float = 60.0,
        max_deliveries: int = 5,
        start: str = "0",
        decode: Callable[[bytes], Any] = decode_item,
    ) -> None:
        if not group or not consumer:
            raise ConfigurationError("an item consumer needs a group and a consumer name")
        if not 0 <= min_idle <= MAX_MIN_IDLE or max_deliveries < 1:  # nan fails too
            raise ConfigurationError(
                f"min_idle must be 0 to {MAX_MIN_IDLE:.0f} seconds (not {min_idle!r}) and "
                f"max_deliveries >= 1 (not {max_deliveries!r})"
            )
        self.client = client
        self.stream = stream
        self.dead_key = stream_dead_key(stream)
        self.group = group
        self.consumer = consumer
        self.min_idle = min_idle
        self.max_deliveries = max_deliveries
        self.start = start
        self.decode = decode
        self._scripts = scripts_for(client)
        self._group_ready = False
        #: Our own pending entries are read back first (after a restart).
        self._own_from: str | None = "0"
        self._claim_from = "0-0"
        #: Acknowledgements not yet accepted by Redis (sent again by every call).
        self._unacked: set[str] = set()
        #: Items read, acknowledged, moved to the dead stream, reclaimed; items the stream
        #: trimmed away before they were processed.
        self.counts = {"read": 0, "acked": 0, "dead": 0, "reclaimed": 0, "trimmed": 0}

    # -- reading -----------------------------------------------------------------------

    def ensure_group(self) -> None:
        """Create the group (and stream) if needed, once."""
        if not self._group_ready:
            create_group(self.client, self.stream, self.group, self.start)
            self._group_ready = True

    def read(self, count: int = 100, block: float | None = None) -> list[StreamEntry]:
        """Up to ``count`` items to process: first this consumer's own pending ones (after
        a restart), then items idle ``min_idle`` seconds with a dead consumer of the group
        (taken over), then new ones, waiting up to ``block`` seconds for some
        (``None``: do not wait).

        Items delivered more than ``max_deliveries`` times, and malformed entries, go to
        the dead stream instead of being returned.

        Raises:
            redis.RedisError: Redis failed; retry later (nothing was lost).
        """
        self.flush_acks()
        try:
            self.ensure_group()
            try:
                return self._read(count, block)
            except redis.ResponseError as e:
                if not str(e).startswith("NOGROUP"):
                    raise
            # the stream or the group was deleted meanwhile: create it again
            self._group_ready = False
            self.ensure_group()
            return self._read(count, block)
        except BaseException as e:
            # what was delivered and not returned is pending: take it back first next time
            self._own_from = "0"
            if isinstance(e, redis.ResponseError) and str(e).startswith("WRONGTYPE"):
                raise self._wrong_type(e) from e
            raise

    def _wrong_type(self, error: redis.ResponseError) -> Exception:
        """The error to raise for a ``WRONGTYPE`` from the items stream: one naming the
        key (an operator wrote another type there; nothing is read from it)."""
        from scrapy_dist.keys import key_type

        try:
            kind = key_type(self.client, self.stream)
        except redis.RedisError:
            return error
        if kind in ("stream", "none"):
            return error
        return ConfigurationError(
            f"Redis key {self.stream!r} (items stream) holds a {kind}, not a stream: "
            f"nothing can be read from it (delete it if it is garbage)"
        )

    def _read(self, count: int, block: float | None) -> list[StreamEntry]:
        entries: list[StreamEntry] = []
        if self._own_from is not None:
            entries += self._read_own(count)
        if len(entries) < count:
            entries += self._reclaim(count - len(entries))
        if len(entries) < count and not entries:
            entries += self._read_new(count - len(entries), block)
        elif len(entries) < count:
            entries += self._read_new(count - len(entries), None)
        # an own pending entry may also be reclaimed in the same call (min_idle 0)
        unique = {e.id: e for e in reversed(entries)}
        return self._checked([e for e in entries if unique.get(e.id) is e])

    def _read_own(self, count: int) -> list[StreamEntry]:
        assert self._own_from is not None
        reply = self._xreadgroup(self._own_from, count, None)
        raw = reply[0][1] if reply else []
        if len(raw) < count:
            self._own_from = None  # all caught up: only new ones from now on
        else:
            self._own_from = _text(raw[-1][0])
        return self._entries(raw, redelivered=True)

    def _reclaim(self, count: int) -> list[StreamEntry]:
        reply: Any = self.client.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            int(self.min_idle * 1000),
            start_id=self._claim_from,
            count=count,
        )
        self._claim_from = _text(reply[0])
        claimed = reply[1]
        if len(reply) > 2 and reply[2]:  # Redis 7: ids trimmed away, removed from the PEL
            self.counts["trimmed"] += len(reply[2])
            logger.warning(
                "%(n)d pending item(s) of group %(group)s were trimmed from %(stream)s "
                "before being acknowledged (REDIS_ITEMS_STREAM_MAXLEN too small?)",
                {"n": len(reply[2]), "group": self.group, "stream": self.stream},
            )
        entries = self._entries(claimed, redelivered=True)
        self.counts["reclaimed"] += len(entries)
        return entries

    def _read_new(self, count: int, block: float | None) -> list[StreamEntry]:
        reply = self._xreadgroup(">", count, block)
        return self._entries(reply[0][1] if reply else [], redelivered=False)

    def _xreadgroup(self, start: str, count: int, block: float | None) -> list[Any]:
        ms = None if block is None else max(1, int(block * 1000))
        reply = self.client.xreadgroup(
            self.group, self.consumer, {self.stream: start}, count=count, block=ms
        )
        return cast("list[Any]", reply or [])

    def _entries(self, raw: Iterable[Any], *, redelivered: bool) -> list[StreamEntry]:
        """Raw ``(id, fields)`` pairs as entries; deliveries read from ``XPENDING`` for
        redelivered ones; an id whose entry is gone (trimmed) is acknowledged."""
        entries: list[StreamEntry] = []
        gone: list[str] = []
        unnamed = False
        for entry_id, fields in raw:
            if entry_id is None:  # Redis 6.2: a trimmed pending entry, its id not given
                unnamed = True
                continue
            eid = _text(entry_id)
            if not fields:  # a pending entry the stream trimmed (no entry has no field)
                gone.append(eid)
                continue
            # the item as Redis holds it (bytes) until decoded by _checked: a binary
            # REDIS_ITEMS_SERIALIZER's output must reach ``decode`` byte for byte
            item = next((v for k, v in fields.items() if _text(k) == "item"), None)
            entries.append(StreamEntry(eid, item, entry_fields(fields), 1))
        if unnamed:
            gone += self._trimmed_pending()
        if gone:
            self.counts["trimmed"] += len(gone)
            self.client.xack(self.stream, self.group, *gone)
        if redelivered and entries:
            counts = self._deliveries([e.id for e in entries])
            entries = [e._replace(deliveries=counts.get(e.id, 1)) for e in entries]
        self.counts["read"] += len(entries)
        return entries

    def _trimmed_pending(self, count: int = 1000) -> list[str]:
        """The ids this consumer has pending whose entries the stream trimmed away (up to
        ``count`` pending ids looked at): Redis 6.2's ``XAUTOCLAIM`` answers nil for
        such an entry and keeps it pending, where Redis 7 names and drops it."""
        rows = self.client.xpending_range(
            self.stream, self.group, min="-", max="+", count=count, consumername=self.consumer
        )
        ids = [_text(r["message_id"]) for r in rows]
        with self.client.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.xrange(self.stream, min=entry_id, max=entry_id, count=1)
            found = pipe.execute()
        return [entry_id for entry_id, entries in zip(ids, found, strict=True) if not entries]

    def _deliveries(self, ids: list[str]) -> dict[str, int]:
        """Delivery counts of pending entries (one pipelined ``XPENDING`` per id)."""
        with self.client.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.xpending_range(self.stream, self.group, min=entry_id, max=entry_id, count=1)
            replies = pipe.execute()
        return {_text(r["message_id"]): int(r["times_delivered"]) for rows in replies for r in rows}

    def _checked(self, entries: list[StreamEntry]) -> list[StreamEntry]:
        """Decode each item; dead-letter the malformed and those delivered too often."""
        good = []
        for entry in entries:
            if entry.deliveries > self.max_deliveries:
                self.dead(
                    entry.id, f"delivered {entry.deliveries - 1} time(s) without acknowledgement"
                )
                continue
            try:
                item = checked_item(entry.item, self.decode)
            except MalformedItem as e:
                self.dead(entry.id, str(e))
                continue
            good.append(entry._replace(item=item))
        return good

    # -- settling ----------------------------------------------------------------------

    def ack(self, *ids: str) -> int:
        """Acknowledge processed items: the group will not deliver them again.

        An acknowledgement Redis does not take (unreachable, refusing) is kept and sent
        again by the next :meth:`read`, :meth:`ack` or :meth:`flush_acks`; it is never
        dropped (were it lost with the process, the item would be delivered again: at
        least once).

        Returns:
            Entries newly acknowledged by this call (a reclaimed item another consumer
            acknowledged meanwhile is not counted).

        Raises:
            redis.RedisError: Redis failed (the ids are kept, see above).
        """
        for entry_id in ids:
            self._unacked.add(check_id(entry_id))
        return self.flush_acks()

    def flush_acks(self) -> int:
        """Send the acknowledgements Redis has not taken yet.

        Raises:
            redis.RedisError: Redis failed (they stay kept).
        """
        if not self._unacked:
            return 0
        ids = sorted(self._unacked, key=_id_key)
        done = int(self.client.xack(self.stream, self.group, *ids))
        self._unacked.difference_update(ids)
        self.counts["acked"] += done
        return done

    @property
    def unacked(self) -> int:
        """Acknowledgements waiting for Redis."""
        return len(self._unacked)

    def reject(self, entry_id: str, reason: str) -> bool:
        """Give an item back: the group delivers it again at once (to any consumer's
        next :meth:`read`), until it was delivered ``max_deliveries`` times; then it goes
        to the dead stream with ``reason``.

        Returns:
            Whether it went to the dead stream.
        """
        outcome = self._move(entry_id, reason, self.max_deliveries)
        if outcome == "retry":
            self._claim_from = "0-0"  # take it back from the start of the pending list
        if outcome == "dead":
            self.counts["dead"] += 1
        return outcome == "dead"

    def dead(self, entry_id: str, reason: str) -> bool:
        """Move a pending item to the dead stream now, with ``reason``, and acknowledge
        it (one atomic step).

        Returns:
            Whether it moved (``False``: no longer pending in the group).
        """
        moved = self._move(entry_id, reason, 0) == "dead"
        if moved:
            self.counts["dead"] += 1
            logger.warning(
                "Item %(id)s of %(stream)s moved to %(dead)s: %(reason)s",
                {"id": entry_id, "stream": self.stream, "dead": self.dead_key, "reason": reason},
            )
        return moved

    def _move(self, entry_id: str, reason: str, max_deliveries: int) -> str:
        """Run ``lua/item_stream.lua`` on a pending entry: its outcome (``"gone"`` if the
        stream or the group was deleted meanwhile: nothing is pending any more, and the
        next :meth:`read` creates the group again)."""
        try:
            reply = self._scripts.item_stream_dead(
                stream=self.stream,
                dead=self.dead_key,
                group=self.group,
                entry_id=check_id(entry_id),
                reason=str(reason)[:2000],
                consumer=self.consumer,
                max_deliveries=max_deliveries,
            ).run()
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            self._group_ready = False
            return "gone"
        if len(reply) > 3:
            logger.error(
                "Dead items stream %(dead)s held a %(kind)s, not a stream: renamed to "
                "%(aside)s (inspect it, then delete it); dead items go to a new stream",
                {"dead": self.dead_key, "kind": _text(reply[4]), "aside": _text(reply[3])},
            )
        return _text(reply[0])

    def state(self) -> GroupState | None:
        """This consumer's group (``None`` if it does not exist yet)."""
        try:
            groups = group_states(self.client, self.stream)
        except redis.ResponseError:
            return None
        return next((g for g in groups if g.name == self.group), None)

    def run(
        self,
        handle: Callable[[StreamEntry], None],
        *,
        count: int = 100,
        block: float = 5.0,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Process items until ``stop()`` is true: ``handle(entry)`` each, then
        acknowledge it; an exception from ``handle`` rejects the item (its text is the
        reason). Redis failures pause with a growing backoff (up to 30 s) and go on:
        nothing read is lost, no acknowledgement dropped."""
        backoff = BACKOFF_MIN
        while not stop():
            try:
                entries = self.read(count=count, block=block)
                for entry in entries:
                    try:
                        handle(entry)
                    except Exception as e:  # the item's fault: reject it
                        logger.warning("Item %(id)s rejected: %(e)r", {"id": entry.id, "e": e})
                        self.reject(entry.id, f"{type(e).__name__}: {e}")
                    else:
                        self.ack(entry.id)
                backoff = BACKOFF_MIN
            except (*UNREACHABLE, redis.ResponseError) as e:
                if isinstance(e, redis.ResponseError) and refusal(e) is None:
                    raise
                logger.warning("Redis failed (%(e)s): retrying in %(s).1fs", {"e": e, "s": backoff})
                self._own_from = "0"  # take back at once what was read and not settled
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
