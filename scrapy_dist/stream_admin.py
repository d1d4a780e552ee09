"""The items stream as status and the command line read and steer it, without consuming.

Positions in a stream as users type them (:func:`to_stream_id`, :func:`check_id`); the
state of a stream and of its consumer groups (:func:`stream_state`,
:func:`group_states`: length, dead entries, pending, lag); groups created and moved
(:func:`create_group`, :func:`set_group_position`: replay); entries read by range
without a group, changing nothing (:func:`read_range`); the dead stream read and its
entries requeued (:func:`dead_entries`, :func:`requeue_dead`). Consuming the stream,
acknowledging and rejecting items, is :class:`scrapy_dist.streams.ItemConsumer`'s.

Lag (:func:`group_states`) is Redis 7's ``XINFO GROUPS`` ``lag`` where it can be taken
as it is, else counted (exactly, up to :data:`COUNT_LIMIT` entries). Redis >= 6.2.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

import redis

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.keys import check_type, key_type, stream_dead_key
from scrapy_dist.scripts import scripts_for

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Entries counted per ``XRANGE`` when Redis cannot tell a group's lag.
COUNT_CHUNK = 1_000
#: Entries counted at most per group when Redis cannot tell its lag.
COUNT_LIMIT = 1_000_000
#: A stream entry id.
_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
_MS = re.compile(r"^\d{1,20}$")
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def check_id(text: str) -> str:
    """``text`` if it is a full stream id (``<ms>-<seq>``).

    Raises:
        ConfigurationError: it is not.
    """
    if not _ID.match(text) or not _fits(text):
        raise ConfigurationError(f"not a stream entry id (<ms>-<seq>): {text!r}")
    return text


#: The largest part of a stream id (Redis ids are two unsigned 64-bit numbers).
_U64_MAX = 2**64 - 1


def _fits(entry_id: str) -> bool:
    """Whether both parts of ``entry_id`` fit in 64 bits (Redis refuses larger ones)."""
    return all(int(part) <= _U64_MAX for part in entry_id.split("-"))


def to_stream_id(text: str, *, end: bool = False, now: float | None = None) -> str:
    """A position in a stream from what a user types.

    Accepted: an entry id ``1700000000000-0``; a Unix time in milliseconds
    ``1700000000000``; an ISO 8601 time ``2026-11-23T10:00`` (UTC unless it names its
    zone); a time ago ``90s``, ``30m``, ``2h``, ``1d``; ``-`` and ``+`` (the first and
    last entries) and ``$`` / ``0`` as Redis takes them. A time is the first entry of
    that millisecond, or its last with ``end`` (for an inclusive ``--until``).

    Raises:
        ConfigurationError: none of these.
    """
    text = text.strip()
    if text in ("-", "+", "$", "0"):
        return text
    if _ID.match(text):
        return check_id(text)
    if _MS.match(text):
        ms = int(text)
        if ms > _U64_MAX:
            raise ConfigurationError(f"not a stream position: {text!r} (beyond any time)")
    elif match := _AGO.match(text):
        ms = int(
            ((now if now is not None else time.time()) - float(match[1]) * _UNITS[match[2]]) * 1000
        )
    else:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigurationError(
                f"not a stream position: {text!r} (an id 1700000000000-0, milliseconds, an "
                "ISO time 2026-11-23T10:00, or a time ago such as 2h)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        ms = int(when.timestamp() * 1000)
    ms = max(ms, 0)
    return f"{ms}-18446744073709551615" if end else f"{ms}-0"


def entry_fields(raw: dict[Any, Any] | None) -> dict[str, str]:
    """The fields of a stream entry as Redis answers them, as text."""
    return {_text(k): _text(v) for k, v in (raw or {}).items()}


@dataclass
class ConsumerState:
    """One consumer of a group (``XINFO CONSUMERS``)."""

    name: str
    pending: int
    idle: float


@dataclass
class GroupState:
    """One consumer group of an items stream.

    Attributes:
        name: the group.
        pending: entries delivered to its consumers and not acknowledged.
        lag: entries of the stream the group has not been delivered yet (``None``: more
            than :data:`COUNT_LIMIT`, not counted).
        last_delivered: the id of the last entry delivered to the group.
        entries_read: entries the group read (``None`` before Redis 7).
        consumers: its consumers.
        lag_source: ``"redis"`` (``XINFO``'s ``lag``) or ``"counted"``.
    """

    name: str
    pending: int
    lag: int | None
    last_delivered: str
    entries_read: int | None = None
    consumers: list[ConsumerState] = field(default_factory=list)
    lag_source: str = "redis"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StreamState:
    """An items stream and its groups (``None`` from :func:`stream_state` if absent)."""

    key: str
    length: int
    dead_key: str
    dead: int
    first_id: str | None
    last_id: str | None
    groups: list[GroupState]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["groups"] = [g.as_dict() for g in self.groups]
        return data


def count_after(
    client: redis.Redis, stream: str, after: str, limit: int = COUNT_LIMIT
) -> int | None:
    """Entries of ``stream`` with an id above ``after``, counted with ``XRANGE`` (``None``
    if more than ``limit``)."""
    start = "-" if after in ("0", "0-0") else f"({after}"
    counted = 0
    while counted <= limit:
        chunk = cast("list[Any]", client.xrange(stream, start, "+", count=COUNT_CHUNK))
        counted += len(chunk)
        if len(chunk) < COUNT_CHUNK:
            return counted
        start = f"({_text(chunk[-1][0])}"
    return None


def _redis_lag_exact(client: redis.Redis, stream: str) -> bool:
    """Whether ``XINFO GROUPS``' ``lag`` can be taken as it is: no entry was ever removed
    from ``stream`` (``entries-added`` equals its length). Redis 7 does not see entries
    trimmed (``MAXLEN``, ``XTRIM``) between a group's position and the next entry it
    delivers: it counts them as still to read, for good."""
    info = {_text(k): v for k, v in cast("dict[Any, Any]", client.xinfo_stream(stream)).items()}
    added = info.get("entries-added")
    return added is not None and int(added) == int(info.get("length", -1))


def group_states(
    client: redis.Redis, stream: str, *, consumers: bool = True, limit: int = COUNT_LIMIT
) -> list[GroupState]:
    """The consumer groups of ``stream``, with exact lag and pending counts.

    Lag is ``XINFO GROUPS``' ``lag`` (Redis >= 7) when Redis can tell it exactly; else
    (Redis 6.2, Redis 7 after deletions it cannot see past, or a stream that lost
    entries to trimming, where Redis's non-zero lag may count them) the entries after
    the group's last delivered id, counted (:func:`count_after`).
    """
    raw_groups = cast("list[dict[Any, Any]]", client.xinfo_groups(stream))
    trusted = bool(raw_groups) and _redis_lag_exact(client, stream)
    groups = []
    for raw in raw_groups:
        info = {_text(k): v for k, v in raw.items()}
        raw_name = info["name"]  # as Redis has it: a name that is not UTF-8 is asked as such
        name = _text(raw_name)
        last = _text(info.get("last-delivered-id", "0-0"))
        lag = info.get("lag")
        source = "redis"
        if lag is None or not trusted:
            lag = count_after(client, stream, last, limit)
            source = "counted"
        entries_read = info.get("entries-read")
        group = GroupState(
            name=name,
            pending=int(info.get("pending", 0)),
            lag=None if lag is None else int(lag),
            last_delivered=last,
            entries_read=None if entries_read is None else int(entries_read),
            lag_source=source,
        )
        if consumers:
            for c in cast("list[dict[Any, Any]]", client.xinfo_consumers(stream, raw_name)):
                ci = {_text(k): v for k, v in c.items()}
                group.consumers.append(
                    ConsumerState(_text(ci["name"]), int(ci["pending"]), int(ci["idle"]) / 1000)
                )
        groups.append(group)
    return groups


def stream_state(client: redis.Redis, stream: str, *, consumers: bool = True) -> StreamState | None:
    """The stream's length, dead entries and groups; ``None`` if it does not exist.

    Raises:
        ConfigurationError: the key holds something other than a stream.
    """
    dead = stream_dead_key(stream)
    kind = key_type(client, stream)
    if kind == "none":
        return None
    check_type(stream, kind, "stream", "items stream")
    check_type(dead, key_type(client, dead), "stream", "dead items stream")
    with client.pipeline(transaction=False) as pipe:
        pipe.xlen(stream)
        pipe.xlen(dead)
        pipe.xrange(stream, "-", "+", count=1)
        pipe.xrevrange(stream, "+", "-", count=1)
        length, dead_count, first, last = pipe.execute()
    return StreamState(
        key=stream,
        length=int(length),
        dead_key=dead,
        dead=int(dead_count),
        first_id=_text(first[0][0]) if first else None,
        last_id=_text(last[0][0]) if last else None,
        groups=group_states(client, stream, consumers=consumers),
    )


def create_group(client: redis.Redis, stream: str, group: str, start: str = "0") -> bool:
    """Create ``group`` on ``stream`` (and the stream if absent), reading from ``start``
    (:func:`to_stream_id`: ``"0"`` every item, ``"$"`` only new ones, an id or a time).

    Returns:
        ``False`` if the group existed (left as it is).
    """
    position = to_stream_id(start)
    try:
        client.xgroup_create(stream, group, id="0" if position == "-" else position, mkstream=True)
    except redis.ResponseError as e:
        if str(e).startswith("BUSYGROUP"):
            return False
        raise
    return True


def set_group_position(client: redis.Redis, stream: str, group: str, start: str) -> None:
    """Move ``group`` to ``start`` (``XGROUP SETID``): it reads again every entry after
    it (replay; its pending entries stay pending)."""
    position = to_stream_id(start)
    if position in ("-", "0-0"):
        position = "0"
    if position not in ("$", "0", "+"):
        # SETID takes the last id delivered: one below the first to read again
        ms, _, seq = position.partition("-")
        position = (
            f"{ms}-{int(seq) - 1}"
            if int(seq)
            else (f"{int(ms) - 1}-18446744073709551615" if int(ms) else "0")
        )
    client.xgroup_setid(stream, group, position)


def read_range(
    client: redis.Redis,
    stream: str,
    since: str = "-",
    until: str = "+",
    *,
    count: int | None = None,
    chunk: int = COUNT_CHUNK,
) -> Iterator[tuple[str, dict[str, str]]]:
    """``(id, fields)`` of the entries from ``since`` to ``until`` (inclusive, positions
    as :func:`to_stream_id` takes them), oldest first, ``chunk`` per ``XRANGE``: replay
    without a group (nothing is acknowledged or changed)."""
    start = to_stream_id(since)
    end = to_stream_id(until, end=True)
    given = 0
    while count is None or given < count:
        want = chunk if count is None else min(chunk, count - given)
        entries = cast("list[Any]", client.xrange(stream, start, end, count=want))
        for entry_id, raw in entries:
            yield _text(entry_id), entry_fields(raw)
        given += len(entries)
        if len(entries) < want:
            return
        start = f"({_text(entries[-1][0])}"


def dead_entries(
    client: redis.Redis, stream: str, *, count: int | None = None
) -> Iterator[tuple[str, dict[str, str]]]:
    """``(dead id, fields)`` of the dead stream's entries, oldest first."""
    return read_range(client, stream_dead_key(stream), count=count)


def requeue_dead(client: redis.Redis, stream: str, dead_id: str, maxlen: int = 0) -> str | None:
    """Move a dead entry back to ``stream`` as a new entry (its ``dead_*`` fields
    removed, ``requeued_from`` added): every group reads it again.

    Returns:
        The new entry's id, or ``None`` if the dead stream has no such entry.
    """
    reply = (
        scripts_for(client)
        .item_stream_requeue(
            stream=stream, dead=stream_dead_key(stream), dead_id=check_id(dead_id), maxlen=maxlen
        )
        .run()
    )
    return _text(reply[1]) if _text(reply[0]) == "requeued" else None
