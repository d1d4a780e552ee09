"""Read and write a request queue's entries directly, whatever its layout, as tests
(and a user at ``redis-cli``) do: a list for the FIFO and LIFO queues, or a priority
queue's levels (:mod:`scrapy_dist.keys`, ``lua/_levels.lua``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from scrapy_dist.keys import LEVELS_MARKER, level_key, level_name, levels_key
from scrapy_dist.scripts import scripts_for

if TYPE_CHECKING:
    from collections.abc import Mapping

    import redis

    from scrapy_dist.frontier.gateway import CrawlFrontier


def _type(client: redis.Redis, key: str) -> str:
    kind = client.type(key)
    return kind.decode() if isinstance(kind, bytes) else str(kind)


def queued_entries(client: redis.Redis, key: str) -> list[bytes]:
    """The entries of queue ``key`` in the order they come out: a priority queue's from
    its highest level down, oldest first in each, then those of a previous version's
    zset still at the key, by score; a list's from its tail (the FIFO queue's order)."""
    kind = _type(client, key)
    if kind == "list":
        return list(reversed(cast("list[bytes]", client.lrange(key, 0, -1))))
    entries: list[bytes] = []
    for raw in cast("list[bytes]", client.zrange(levels_key(key), 0, -1)):
        level = level_key(key, raw.decode())
        entries += reversed(cast("list[bytes]", client.lrange(level, 0, -1)))
    if kind == "zset":  # (a previous version's queue, being moved into levels)
        entries += cast("list[bytes]", client.zrange(key, 0, -1))
    return entries


def queued_count(client: redis.Redis, key: str) -> int:
    """How many entries queue ``key`` holds (those :func:`queued_entries` reads), counted
    without reading them: one ``LLEN`` per priority level."""
    kind = _type(client, key)
    if kind == "list":
        return int(client.llen(key))
    names = cast("list[bytes]", client.zrange(levels_key(key), 0, -1))
    count = 0
    for raw in names:
        count += int(client.llen(level_key(key, raw.decode())))
    if kind == "zset":  # (a previous version's queue, being moved into levels)
        count += int(client.zcard(key))
    return count


def push_raw(client: redis.Redis, key: str, entries: Mapping[bytes, float]) -> None:
    """Push raw ``entry -> score`` entries at the tail of priority queue ``key``'s levels
    (and index them), as a user would by hand: no id is added, nothing is checked."""
    client.set(key, LEVELS_MARKER)
    for entry, score in entries.items():
        name = level_name(score)
        client.lpush(level_key(key, name), entry)
        client.zadd(levels_key(key), {name: score})


def join_flushing(client: redis.Redis, frontier: CrawlFrontier, worker: str = "w") -> bool:
    """Join ``frontier``'s crawl as worker ``worker`` with ``SCHEDULER_FLUSH_ON_START``
    (``lua/join.lua``, no other worker alive within 10 s): whether it flushed."""
    keys = frontier.keys
    call = scripts_for(client).join(
        workers=keys.workers,
        progress=keys.progress,
        starts=keys.starts,
        flush_keys=frontier.clear_keys,
        worker=worker,
        timeout=10,
        flush=True,
        age=0,
    )
    return bool(cast("list[int]", call.run())[1])
