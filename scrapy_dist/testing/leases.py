"""Read the leases of a crawl directly, as tests (and a user at ``redis-cli``) do: the
holders zset and each worker's holding (:mod:`scrapy_dist.keys`, ``lua/_leases.lua``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from scrapy_dist.keys import HOLDERS_SUFFIX
from scrapy_dist.scripts import scripts_for

if TYPE_CHECKING:
    import redis


def _holders(crawl: str) -> str:
    return f"{crawl}{HOLDERS_SUFFIX}"


def leased_count(client: redis.Redis, crawl: str) -> int:
    """The leases held in crawl ``crawl`` (its name, e.g. ``"pages"``): every worker's,
    a previous version's leases zset counted too (``lua/leased.lua``)."""
    call = scripts_for(client).leased(holders=_holders(crawl), previous=f"{crawl}:leases")
    return int(call.run())


def holdings(client: redis.Redis, crawl: str) -> dict[str, dict[str, bytes]]:
    """Worker id -> (lease id -> holding record) of every worker in the holders zset
    that holds leases (a worker enters the zset when it opens, holding none yet)."""
    holders = _holders(crawl)
    found: dict[str, dict[str, bytes]] = {}
    for raw in cast("list[bytes]", client.zrange(holders, 0, -1)):
        worker = raw.decode()
        records = cast("dict[bytes, bytes]", client.hgetall(f"{holders}:{worker}"))
        if records:
            found[worker] = {lease.decode(): record for lease, record in records.items()}
    return found


def lease_ids(client: redis.Redis, crawl: str) -> set[str]:
    """The ids of every lease held in crawl ``crawl``, whoever holds it."""
    return {lease for held in holdings(client, crawl).values() for lease in held}


def held_by(client: redis.Redis, crawl: str, pid: int) -> int:
    """How many leases the worker of process ``pid`` holds (worker ids embed the pid)."""
    return sum(
        len(held) for worker, held in holdings(client, crawl).items() if f":{pid}:" in worker
    )


def deadline(client: redis.Redis, crawl: str, worker: str) -> float | None:
    """The deadline (server time, seconds) of the leases ``worker`` holds, if any."""
    score = client.zscore(_holders(crawl), worker)
    return None if score is None else float(score)
