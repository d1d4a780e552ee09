"""What the page shows beside :func:`~scrapy_dist.status.read_status`'s figures: the
Redis server's memory and eviction policy (with the warning a worker gives when it opens,
:func:`scrapy_dist.frontier.eviction.eviction_risk`), the refusals the workers counted in
the crawl's shared stats, and the oldest entries of the request queue.

Every read is bounded whatever the crawl's size: one ``INFO memory``; for the queue one
``ZRANGE`` of one name at each end of a priority queue's levels and one ``LINDEX`` per
list read (never the queue itself).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

import redis

from scrapy_dist.frontier.eviction import eviction_risk
from scrapy_dist.frontier.wire import ENTRY_ID_LEN
from scrapy_dist.keys import SLOTS_READY_SUFFIX, level_key, levels_key, slot_queue_key

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy_dist.status import CrawlLayout, CrawlStatus

#: Characters of a queued payload shown when it names no URL (not JSON, say).
RAW_SHOWN = 200


def memory(client: redis.Redis, expiring: list[str]) -> dict[str, Any]:
    """The server's memory used and ``maxmemory`` (0: no limit), in bytes, its
    ``maxmemory-policy``, and ``warning``: what that policy may evict of the crawl
    (``expiring``: its keys with an expiry), ``None`` if nothing. One ``INFO memory``
    (``CONFIG`` is often disabled on managed servers; ``INFO`` is not). ``error``: why
    it could not be read."""
    try:
        info = client.info("memory")
    except redis.RedisError as e:
        return {"error": str(e) or type(e).__name__}
    used, limit = info.get("used_memory"), info.get("maxmemory")
    policy = str(info.get("maxmemory_policy", ""))
    return {
        "used": used,
        "peak": info.get("used_memory_peak"),
        "max": limit,
        "fill": used / limit
        if isinstance(used, int) and isinstance(limit, int) and limit
        else None,
        "policy": policy or None,
        "warning": eviction_risk(policy, expiring) if policy else None,
        "error": None,
    }


def expiring_keys(status: CrawlStatus) -> list[str]:
    """The crawl's keys with an expiry: its dupefilter, with ``DUPEFILTER_TTL``."""
    df = status.dupefilter
    return [df.key] if df is not None and df.expires_in is not None else []


def refusals(stats: Mapping[str, Any]) -> dict[str, float]:
    """The crawl-wide counters of refusals the workers kept (``*refused*``: Redis
    refused a write, with its error code; requests or children refused; politeness
    refusals), by name; empty when there are none or no shared stats."""
    return {
        name: value
        for name, value in sorted(stats.items())
        if "refused" in name and isinstance(value, int | float) and not isinstance(value, bool)
    }


def _entry(raw: object, key: str, priority: float | None) -> dict[str, Any]:
    """A queue entry as the page shows it: its id, its request's URL if its payload is
    JSON (the default serializer), else the start of the payload."""
    data = raw if isinstance(raw, bytes) else str(raw).encode()
    payload = data[ENTRY_ID_LEN:]
    url = None
    try:
        decoded = json.loads(payload)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("url"), str):
        url = decoded["url"]
    return {
        "key": key,
        "priority": priority,
        "id": data[:ENTRY_ID_LEN].decode(errors="replace"),
        "url": url,
        "raw": None if url else payload[:RAW_SHOWN].decode(errors="replace"),
    }


def oldest_entries(client: redis.Redis, layout: CrawlLayout) -> list[dict[str, Any]]:
    """The oldest entry of the request queue: a list's; a priority queue's of its most
    urgent level (the next one a reserve takes) and of its least urgent (the one waiting
    longest when higher levels keep coming). Entries are pushed at the left of their
    list, so the oldest is at the right (``LINDEX -1``). Entries carry no time: their
    age is not known. Two round trips at most; nothing if the queue is empty or of
    another type (written by hand)."""
    queue = layout.keys.requests
    lists: list[tuple[str, float | None]] = []
    try:
        if layout.queue_kind == "levels":
            with client.pipeline(transaction=False) as pipe:
                pipe.zrange(layout.keys.request_levels, 0, 0, withscores=True)
                pipe.zrange(layout.keys.request_levels, -1, -1, withscores=True)
                ends = pipe.execute()
            names = dict.fromkeys(cast("list[tuple[bytes, float]]", ends[0] + ends[1]))
            for name, score in names:
                lists.append((level_key(queue, name.decode(errors="replace")), -score or 0.0))
        elif layout.queue_kind == "list":
            lists.append((queue, None))
        elif layout.queue_kind == "slots":  # the first ready slot's most urgent level
            for slot in cast("list[bytes]", client.zrange(queue + SLOTS_READY_SUFFIX, 0, 0)):
                slot_queue = slot_queue_key(queue, slot.decode(errors="replace"))
                top = client.zrange(levels_key(slot_queue), 0, 0, withscores=True)
                for name, score in cast("list[tuple[bytes, float]]", top):
                    lists.append(
                        (level_key(slot_queue, name.decode(errors="replace")), -score or 0.0)
                    )
        if not lists:
            return []
        with client.pipeline(transaction=False) as pipe:
            for key, _ in lists:
                pipe.lindex(key, -1)
            found = pipe.execute(raise_on_error=False)
    except redis.ResponseError:  # the levels index of another type: nothing shown
        return []
    return [
        _entry(raw, key, priority)
        for (key, priority), raw in zip(lists, found, strict=True)
        if isinstance(raw, bytes | str)
    ]
