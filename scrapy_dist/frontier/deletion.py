"""Deleting a crawl's frontier keys: all of them at once (a flush at start, a reset, a
finished crawl that does not persist), or, once such a crawl finished, the records it
keeps for its workers.

Contract: :func:`delete_frontier` leaves no worker's holding behind, even while other
workers reserve (the holders zset is watched, and what it names is unlinked in the same
transaction); :func:`forget_finished` deletes, or lets expire, only what a finished
crawl keeps so that a worker of that run learns it finished rather than was lost. Both
use ``UNLINK`` (the keys may be large). The
:class:`~scrapy_dist.frontier.core.Frontier` decides when (its ``delete_keys``,
``forget_finished``); nothing here keeps state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import redis

from scrapy_dist.frontier.progress import FINISHED_RECORD_TTL

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.queue import RedisQueue

__all__ = ["DELETE_ATTEMPTS", "delete_frontier", "forget_finished"]

#: Transactions :func:`delete_frontier` tries while workers add holdings under it; the
#: last is sent unwatched.
DELETE_ATTEMPTS = 10


def delete_frontier(
    client: redis.Redis, queue: RedisQueue, holders: str, keys: Iterable[str]
) -> None:
    """Delete a frontier now: ``queue`` (a priority queue's levels with it), every
    worker's holding that the holders zset ``holders`` names, and ``keys`` (in one
    transaction with the holders zset, so a holding granted meanwhile goes too)."""
    queue.clear()
    with client.pipeline() as pipe:
        for attempt in range(DELETE_ATTEMPTS):
            # the holders zset is watched: a worker's reserve that adds a holding
            # after it was read makes the transaction fail, and it is read again
            # (else its holding would stay, named by no holders zset)
            if attempt < DELETE_ATTEMPTS - 1:
                pipe.watch(holders)  # type: ignore[no-untyped-call]
            try:
                workers = cast("list[bytes]", client.zrange(holders, 0, -1))
            except redis.ResponseError:  # not a zset (written by hand): no holders
                workers = []
            pipe.multi()
            holdings = (holders.encode() + b":" + w for w in workers)
            pipe.unlink(*keys, *holdings)
            try:
                pipe.execute()
            except redis.WatchError:
                continue
            return


def forget_finished(client: redis.Redis, keys: RedisKeys, *, now: bool) -> None:
    """Delete what a finished crawl that does not persist keeps for its workers: its
    progress record (which tells a worker of that run that it finished rather than
    was lost), the holders zset a leaving worker re-created and the worker registry.
    ``now``: no worker of the run is left, so a crawl stopped cleanly leaves no key
    behind, as scrapy-redis's does; else they expire with the progress record (a
    day), a killed worker's registry entry with them."""
    records = (keys.progress, keys.holders, keys.workers)
    if now:
        client.unlink(*records)
        return
    with client.pipeline(transaction=False) as pipe:
        for key in records[1:]:
            pipe.expire(key, FINISHED_RECORD_TTL)
        pipe.execute()
