"""Cluster-wide politeness driven by hand, for tests: its script called with named
lists, a slot's tokens counted as the script counts them, and the gate
(:class:`~scrapy_dist.politeness.Politeness`) over a stand-in buffer, the test standing
in for the engine, its downloader and its reactor."""

from __future__ import annotations

import hashlib
from collections import deque
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from scrapy import Request

from scrapy_dist.frontier.core import Lease
from scrapy_dist.politeness import Politeness
from scrapy_dist.scripts import scripts_for

if TYPE_CHECKING:
    import redis

    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.slots import Limits

__all__ = ["GateBuffer", "confirm_sent", "gate", "outstanding", "run_script", "take"]


def run_script(
    client: redis.Redis,
    keys: RedisKeys,
    prefix: str,
    *,
    timeout_ms: int = 60_000,
    recover_ms: int = 3_000,
    lookahead_ms: int = 200,
    mark_ms: int = 1_000,
    **lists: Any,
) -> tuple[list[tuple[int, float, float]], list[bytes], list[str]]:
    """One call of ``lua/politeness.lua`` (``lists``: ``confirms``, ``releases``,
    ``turns``, ``waiting``, ``holding``, ``asks`` as
    :meth:`~scrapy_dist.scripts.Scripts.politeness` takes them).

    Returns:
        The grants (``(tokens, ms to the send time, ms before asking again)`` per ask),
        the tokens lost, and the repairs as text (``"<key>\\n<what>"``).
    """
    reply = (
        scripts_for(client)
        .politeness(
            tokens=keys.politeness_tokens,
            busy=keys.politeness_busy,
            next_send=keys.politeness_next,
            pauses=keys.slot_pauses,
            refused=keys.politeness_refused,
            prefix=prefix,
            timeout_ms=timeout_ms,
            recover_ms=recover_ms,
            idle_ms=3_600_000,
            lookahead_ms=lookahead_ms,
            mark_ms=mark_ms,
            **lists,
        )
        .run()
    )
    grants, lost, repairs = reply
    triples = [
        (int(grants[i]), float(grants[i + 1]), float(grants[i + 2]))
        for i in range(0, len(grants), 3)
    ]
    return triples, lost, [r.decode("utf-8", "replace") for r in repairs]


def slot_index(slot: str) -> str:
    """The prefix of ``slot``'s entries in the busy index (``<sha1 of slot>:``)."""
    return hashlib.sha1(slot.encode(), usedforsecurity=False).hexdigest() + ":"


def outstanding(client: redis.Redis, keys: RedisKeys, slot: str) -> int:
    """The tokens of ``slot`` outstanding, as the script counts them."""
    h = slot_index(slot)
    return int(client.zlexcount(keys.politeness_busy, f"[{h}", f"({h[:-1]};"))


class GateBuffer:
    """What :class:`~scrapy_dist.politeness.Politeness` uses of
    :class:`~scrapy_dist.worker.deliveries.Deliveries`: a buffer of leased requests, and
    ``more`` handed out by the next :meth:`refill_more` (requests handed back go first,
    as the queue gives them to the next reserve); ``refills`` counts the refills."""

    def __init__(self, urls: list[str]) -> None:
        self.buffer = deque((Lease(str(i), 1, b""), Request(u)) for i, u in enumerate(urls))
        self.out: list[Request] = []
        self.frontier = SimpleNamespace(found_empty_at=0.0)
        self.more: list[str] = []
        self.refills = 0

    def take_at(self, index: int) -> Request:
        _, request = self.buffer[index]
        del self.buffer[index]
        self.out.append(request)
        return request

    def hand_back_at(self, indexes: list[int]) -> None:
        chosen = set(indexes)
        handed = [r.url for i, (_, r) in enumerate(self.buffer) if i in chosen]
        self.buffer = deque(item for i, item in enumerate(self.buffer) if i not in chosen)
        self.more[:0] = handed

    def refill_more(self, decode: Any, reject: Any) -> bool:
        self.refills += 1
        for url in self.more:
            self.buffer.append((Lease(url, 1, b""), Request(url)))
        added, self.more = bool(self.more), []
        return added


def gate(client: redis.Redis, keys: RedisKeys, buffer: GateBuffer, limits: Limits) -> Politeness:
    """A worker's gate over ``buffer`` (a 30 s token timeout, a 0.05 s flush interval)."""
    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler

    return Politeness(
        client,
        keys,
        buffer,  # type: ignore[arg-type]
        limits,
        stats=MemoryStatsCollector(get_crawler()),
        timeout=30,
        flush_interval=0.05,
    )


def take(politeness: Politeness) -> Request | None:
    """What the engine asks the scheduler: the next request the gate lets through."""
    return politeness.take(lambda data: Request("http://x/"), lambda lease, error: "")


def confirm_sent(politeness: Politeness, request: Request) -> None:
    """What a crawl's downloader and reactor do: ``request_reached_downloader``, then
    (on the reactor's next round) its send stamped and queued for the gate's next call."""
    politeness.sent(request)
    politeness._stamp()
    for delayed in (politeness._stamp_call, politeness._confirm_call):
        if delayed is not None and delayed.active():
            delayed.cancel()
