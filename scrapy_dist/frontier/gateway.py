"""What the worker's Scrapy-facing parts use of their crawl's frontier.

:class:`CrawlFrontier` is the whole surface the scheduler, the spider, the deliveries,
the enqueuer, the heartbeat, the membership and the control watcher reach: the crawl's
identity (keys, client, queue, seeds, this worker's id and lease terms), its state
(lost, reachable, pending writes, the flush in flight), the writes (enqueue, settle),
the round trips (flush, reserve, renew, one call) and the crawl-wide reads (progress,
totals, leases held elsewhere). Two classes are one:
:class:`~scrapy_dist.frontier.core.Frontier`, a crawl on one set of keys, and
:class:`~scrapy_dist.frontier.shards.ShardedFrontier`, which composes one
:class:`~scrapy_dist.frontier.core.Frontier` per shard
(:func:`~scrapy_dist.frontier.choice.frontier_for` builds the one a crawler gets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import redis
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.filters import DupefilterBackend
    from scrapy_dist.frontier.events import FrontierEvents
    from scrapy_dist.frontier.leases import Lease
    from scrapy_dist.frontier.progress import Elsewhere, Progress
    from scrapy_dist.frontier.replication import Replication
    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.queue import FilterBackend, RedisQueue
    from scrapy_dist.seeds import SeedQueue

__all__ = ["CrawlFrontier"]


class CrawlFrontier(Protocol):
    """A crawl's shared state as one worker sees it (see the module docstring; each
    member's contract is :class:`~scrapy_dist.frontier.core.Frontier`'s)."""

    #: Why the crawl is gone (``finished``, ``vanished``, ``replaced``), or ``None``.
    lost: str | None
    #: Send every write at once instead of with the next reserve or flush tick.
    eager: bool

    # -- identity ------------------------------------------------------------------

    @property
    def client(self) -> redis.Redis: ...
    @property
    def keys(self) -> RedisKeys: ...
    @property
    def queue(self) -> RedisQueue: ...
    @property
    def seeds(self) -> SeedQueue: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def lease_timeout(self) -> float: ...
    @property
    def max_deliveries(self) -> int: ...
    @property
    def shard_count(self) -> int: ...
    @property
    def epoch(self) -> str: ...
    @property
    def clear_keys(self) -> list[str]: ...
    @property
    def stats(self) -> StatsCollector: ...
    @property
    def replication(self) -> Replication | None: ...

    # -- state ---------------------------------------------------------------------

    @property
    def reachable(self) -> bool: ...
    @property
    def pending_writes(self) -> int: ...
    @property
    def pending_settlements(self) -> int: ...
    @property
    def taken(self) -> set[str]: ...
    @property
    def flying(self) -> bool: ...
    @property
    def reserving(self) -> int: ...
    @property
    def found_empty_at(self) -> float: ...
    @property
    def events(self) -> FrontierEvents: ...

    def settlements_after_flush(self) -> int: ...
    def can_flush_later(self) -> bool: ...

    # -- joining and leaving the crawl ---------------------------------------------

    def check_eviction_policy(self, expiring: Sequence[str] = ()) -> None: ...
    def join_epoch(self, *, shards_checked: bool = False) -> str: ...
    def forget_finished(self, *, now: bool) -> None: ...
    def delete_keys(self, *also: str) -> None: ...

    # -- writes and round trips ----------------------------------------------------

    def by_filter(
        self, backend: DupefilterBackend, requests: Sequence[Request]
    ) -> list[tuple[DupefilterBackend, list[Request]]]: ...
    def enqueue(
        self,
        item: tuple[bytes, float | str, bytes],
        dupefilter: FilterBackend | None,
        on_reply: Callable[[bool], None],
        parent: str = "",
        host: str = "",
    ) -> None: ...
    def settle(self, outcomes: Sequence[tuple[str, str]]) -> None: ...
    def flush(self, *, reserve: int = 0, seeds: bool | SeedQueue = False) -> list[Lease] | None: ...
    def flush_later(
        self, *, reserve: int = 0, then: Callable[[list[Lease]], None] | None = None
    ) -> None: ...
    def land(self, timeout: float = 60.0) -> None: ...
    def stop_io(self) -> None: ...
    def reserve(self, count: int, *, seeds: bool | SeedQueue = False) -> list[Lease]: ...
    def renew(self, lease_ids: Sequence[str]) -> list[str] | None: ...
    def call(self, func: Callable[[], Any]) -> Any: ...

    # -- crawl-wide reads ----------------------------------------------------------

    def progress(self, *, grace: float, clear: bool) -> Progress | None: ...
    def held_elsewhere(self) -> Elsewhere | None: ...
    def totals(self) -> dict[str, int]: ...
