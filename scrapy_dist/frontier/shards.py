"""A sharded frontier (``SCHEDULER_SHARDS = N > 1``): one crawl's queue, leases and
dupefilter spread over N hash tags, so that on a Redis Cluster a crawl's Redis work
spreads over N masters.

- **Placement by host**: a request goes to shard ``mmh3(host) % N``
  (:func:`shard_of`), so a host's requests, and a URL's fingerprint, always meet in one
  shard: its dupefilter there decides. Shard 0 is the crawl's usual keys, which also
  keep the seeds, the workers, the dead letters of seeds, the items and the stats;
  shards ``1..N-1`` have keys of their own (:func:`scrapy_dist.keys.shard_keys`).
- **One frontier per shard**: each shard is a :class:`~scrapy_dist.frontier.core.Frontier`
  on its own keys (and, under Cluster, on a client pinned to its node): its own epoch
  (every script is fenced by its shard's copy), outbox, leases, renewals
  and hand-backs, replica ``WAIT``. :class:`ShardedFrontier` composes them (it is no
  frontier itself) and routes to them through their public methods, listening to their
  events (a crawl found gone, leases taken over, a master changed). A lease id of shard
  ``i > 0`` is ``#<i>:<id>`` for the worker's engine and is routed back to its shard.
- **Acknowledgements across shards**: a settlement is held until every other shard has
  confirmed every request added before it (the children of that page, whatever shard
  they went to); then it joins its own shard's outbox, which sends it after that
  shard's own earlier requests. A request sent to another shard than its parent's is
  not fenced by the parent's lease (a script sees one slot only).
- **Reserving in turn**: shards are asked round-robin; a shard found empty is skipped
  for :data:`EMPTY_SKIP` seconds, so empty shards cost no round trip per reserve.
- **Completion across shards**: every other shard is counted (``lua/census.lua``,
  fenced) and shard 0's ``lua/progress.lua`` adds their counts: the crawl is finished
  only when every shard is empty and unleased for the grace period; a shard that cannot
  be read makes the answer unknown, never "finished".
- **Shard count**: recorded in ``<crawl>:shards`` at open; a worker with another count
  refuses to start (:meth:`Frontier.check_shards`).

(Over 600 lines on purpose: one concept, a crawl spread over shards, in two halves: the
worker's :class:`ShardedFrontier`, a fifth of which is one-line properties naming what is
shard 0's, and the reads of a sharded crawl that the command line and ``status`` share.)
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import mmh3
import redis
from scrapy.utils.httpobj import urlparse_cached

from scrapy_dist.connection import ClusterClient, crawl_client
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.core import Frontier, recorded_shards, shared_filter
from scrapy_dist.frontier.events import FrontierEvents
from scrapy_dist.frontier.progress import FINISHED_RECORD_TTL, Elsewhere, Progress, read_elsewhere
from scrapy_dist.frontier.registry import new_worker_id
from scrapy_dist.keys import crawl_slot, shard_keys
from scrapy_dist.queue import unleased_queue
from scrapy_dist.scripts import OtherShards

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.assembly import Parts
    from scrapy_dist.config.scheduling import KeysConfig
    from scrapy_dist.filters import DupefilterBackend, UnopenedBackend
    from scrapy_dist.frontier.leases import Lease
    from scrapy_dist.frontier.replication import Replication
    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.queue import FilterBackend, RedisQueue
    from scrapy_dist.seeds import SeedQueue

#: Seconds a shard found empty is not asked again by a reserve (unless all were).
EMPTY_SKIP = 1.0

#: How a lease id of shard ``i > 0`` starts: ``#<i>:``.
ID_MARK = "#"


def shard_of(host: str, count: int) -> int:
    """The shard of a request to ``host`` among ``count`` (MurmurHash3 of the lowercase
    host name, port excluded, modulo ``count``): stable across workers and runs."""
    if count <= 1:
        return 0
    return int(mmh3.hash(host.lower().encode("utf-8", "surrogatepass"), 0, signed=False)) % count


def host_of(request: Request) -> str:
    """The host name of ``request``'s URL (``""`` if it has none)."""
    return urlparse_cached(request).hostname or ""


def split_id(lease_id: str) -> tuple[int, str]:
    """``(shard, id in that shard)`` of a lease id (see :func:`join_id`)."""
    if lease_id.startswith(ID_MARK):
        head, sep, raw = lease_id[1:].partition(":")
        if sep and head.isdigit():
            return int(head), raw
    return 0, lease_id


def join_id(index: int, raw: str) -> str:
    """The lease id a worker uses for lease ``raw`` of shard ``index``."""
    return raw if index == 0 else f"{ID_MARK}{index}:{raw}"


class AllShards:
    """Shard 0's request queue, whose length is that of every shard's queue together
    (one call per shard): what the scheduler asks when it wonders whether work is
    pending; opened, it opens every shard's queue. Everything else is shard 0's
    queue's."""

    def __init__(self, first: RedisQueue, others: Sequence[RedisQueue]) -> None:
        self._first = first
        self._others = list(others)

    def __len__(self) -> int:
        return len(self._first) + sum(len(q) for q in self._others)

    def open(self, alive: Callable[[], list[str]] | None = None) -> int:
        """Open every shard's queue (:meth:`~scrapy_dist.queue.RedisQueue.open`, each
        told the crawl's live workers): the entries moved in all."""
        return self._first.open(alive) + sum(q.open(alive) for q in self._others)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._first, name)


class ShardedFrontier:
    """The worker's gateway to every shard of a sharded crawl (see the module
    docstring): the scheduler and the spider use it as a
    :class:`~scrapy_dist.frontier.gateway.CrawlFrontier`, as they would one
    :class:`Frontier`. It composes one :class:`Frontier` per shard (``shards[0]``
    on the crawl's own keys), routes to them through their public methods and
    listens to them (a crawl found gone, leases taken over, a master changed); what
    is the crawl's alone (its keys, seeds, client, epoch, completion) is shard 0's.

    Args:
        shards: the frontiers of shards ``0..N-1``, in order (built with their
            ``index``; shard 0 with the shard count, the others judged by shard 0,
            see :meth:`build`).
        filters: the shared dupefilters' backends of shards ``1..N-1`` before they
            are opened (``None``: no shared dupefilter), opened when the crawl is joined.
        flush_on_start: at open, a worker that finds shard 0 flushed flushes the
            other shards too.
    """

    def __init__(
        self,
        shards: Sequence[Frontier],
        *,
        filters: Sequence[UnopenedBackend | None] = (),
        flush_on_start: bool = False,
    ) -> None:
        if len(shards) < 2:
            raise ValueError("a sharded frontier needs at least two shards")
        #: Shard 0: the crawl's own keys.
        self.main = shards[0]
        #: Shards ``1..N-1``.
        self.others: list[Frontier] = list(shards[1:])
        self.shard_count = len(shards)
        self.flush_on_start = flush_on_start
        #: Why the crawl is gone (any shard found it gone), or ``None``.
        self.lost: str | None = None
        #: The crawl's events: shard 0's, which the other shards' are told to.
        self.events = self.main.events
        #: Send every write at once instead of with the next reserve or flush tick.
        self.eager = self.main.eager
        #: What the scheduler asks the queue (its length) is every shard's.
        self.queue = cast("RedisQueue", AllShards(self.main.queue, [s.queue for s in self.others]))
        #: Unopened dupefilter backends of shards ``1..``, by shard.
        self._unopened = dict(enumerate(filters, 1))
        #: Opened dupefilter backends of shards ``1..``, by shard.
        self._filters: dict[int, DupefilterBackend] = {}
        #: Requests added per shard (for the acknowledgement barrier).
        self._adds: list[int] = [0] * self.shard_count
        #: Settlements waiting for other shards: (requests added per shard when it was
        #: settled, its shard, its (raw id, outcome) pairs).
        self._held: list[tuple[list[int], int, list[tuple[str, str]]]] = []
        self._next = 0
        self._empty_at: list[float] = [-EMPTY_SKIP] * self.shard_count
        self.events.on_crawl_lost(self._crawl_lost)  # first: before the worker's parts hear it
        for shard in self.others:
            shard.events.on_crawl_lost(self._shard_lost)
            shard.events.on_leases_taken(partial(self._taken, shard.index))
            # a shard's master changed: so did the crawl's
            shard.events.on_master_changed(self.events.master_changed)

    @classmethod
    def build(cls, crawler: Crawler, parts: Parts) -> ShardedFrontier:
        """The sharded frontier of a crawler (no I/O): shard 0 on the crawl's client,
        each other shard a :class:`Frontier` on a client for its own slot, whose
        crawl, when its epoch is gone, shard 0 judges (where completion is recorded);
        shard 0, seeing the crawl finished and new work, rejoins every shard."""
        config = parts.config
        count = config.frontier.shards
        if unleased_queue(config.queue.cls):
            raise ConfigurationError(
                f"SCHEDULER_SHARDS = {count} needs one of scrapy_dist's leased queues, not "
                f"the unleased {config.queue.path}: a scrapy-redis style queue pops "
                "from one key"
            )
        every = shard_keys(parts.keys, config.keys, count)
        worker_id = new_worker_id()
        gateway: ShardedFrontier

        def judge(found: str) -> str:  # called once the crawl runs: ``main`` is built
            return main.why_gone(found)

        def rejoin() -> str:  # called once the crawl runs: ``gateway`` is built
            return gateway.join_epoch()

        main = Frontier.build_one(
            crawler,
            config,
            parts.client,
            parts.keys,
            worker_id,
            events=FrontierEvents(),  # the crawl's
            shard_count=count,
            rejoin=rejoin,
        )
        shards = [main]
        filters: list[UnopenedBackend | None] = []
        for index, keys in enumerate(every[1:], 1):
            client = crawl_client(parts.topology_client, keys)
            label = f"{parts.keys.crawl} (shard {index})"  # its keys' crawl name is the shard's
            shards.append(
                Frontier.build_one(
                    crawler, config, client, keys, worker_id, index=index, label=label, judge=judge
                )
            )
            filters.append(shared_filter(config, client, keys))
        gateway = cls(shards, filters=filters, flush_on_start=config.scheduler.flush_on_start)
        return gateway

    def shard(self, index: int) -> Frontier:
        """Shard ``index`` (0: :attr:`main`)."""
        return self.main if index == 0 else self.others[index - 1]

    @property
    def shards(self) -> list[Frontier]:
        """Every shard's frontier, shard 0 first."""
        return [self.main, *self.others]

    # -- what is the crawl's: shard 0's -----------------------------------------------

    @property
    def client(self) -> redis.Redis:
        return self.main.client

    @property
    def keys(self) -> RedisKeys:
        return self.main.keys

    @property
    def seeds(self) -> SeedQueue:
        return self.main.seeds

    @property
    def worker_id(self) -> str:
        return self.main.worker_id

    @property
    def lease_timeout(self) -> float:
        return self.main.lease_timeout

    @property
    def max_deliveries(self) -> int:
        return self.main.max_deliveries

    @property
    def clear_keys(self) -> list[str]:
        return self.main.clear_keys

    @property
    def stats(self) -> StatsCollector:
        return self.main.stats

    @property
    def epoch(self) -> str:
        """Shard 0's epoch (every shard has its own copy, fencing its scripts)."""
        return self.main.epoch

    @property
    def replication(self) -> Replication | None:
        """Shard 0's (every shard's master that changed is told to :attr:`events`)."""
        return self.main.replication

    @property
    def taken(self) -> set[str]:
        """Leases taken over in any shard, by the ids the worker uses (:func:`join_id`)."""
        return self.main.taken

    def forget_finished(self, *, now: bool) -> None:
        self.main.forget_finished(now=now)

    # -- state -----------------------------------------------------------------------

    def can_flush_later(self) -> bool:
        """Never: a sharded crawl sends its timer's flushes on the reactor thread (the
        acknowledgement barrier across shards is not kept for flushes in flight)."""
        return False

    def flush_later(
        self, *, reserve: int = 0, then: Callable[[list[Lease]], None] | None = None
    ) -> None:
        """Not available (:meth:`can_flush_later` is ``False``)."""
        raise RuntimeError("a sharded crawl sends no flush from the I/O thread")

    @property
    def flying(self) -> bool:
        return False

    @property
    def reserving(self) -> int:
        return 0

    @property
    def found_empty_at(self) -> float:
        """When a reserve last found every shard asked empty (shard 0's record)."""
        return self.main.found_empty_at

    @property
    def slot_ready_at(self) -> float | None:
        """The first shard's slot ready (:attr:`Frontier.slot_ready_at`)."""
        times = [t for t in (s.slot_ready_at for s in self.shards) if t is not None]
        return min(times) if times else None

    def land(self, timeout: float = 60.0) -> None:
        """Nothing to land (no flush is sent from the I/O thread)."""

    def stop_io(self) -> None:
        for shard in self.shards:
            shard.stop_io()

    @property
    def reachable(self) -> bool:
        return all(s.reachable for s in self.shards)

    @property
    def _held_count(self) -> int:
        """Settlements held until other shards confirm the requests before them."""
        return sum(len(group) for _, _, group in self._held)

    @property
    def pending_writes(self) -> int:
        return self._held_count + sum(s.pending_writes for s in self.shards)

    @property
    def pending_settlements(self) -> int:
        return self._held_count + sum(s.pending_settlements for s in self.shards)

    def settlements_after_flush(self) -> int:
        """Settlements still unsent after the next flush: held for other shards, or
        queued behind requests a shard has not confirmed yet."""
        return self._held_count + sum(s.settlements_after_flush() for s in self.shards)

    def _crawl_lost(self, state: str) -> None:
        """Shard 0, or through :meth:`_shard_lost` another, found the crawl gone: drop
        every shard's writes and leases (the worker's parts hear it next)."""
        if self.lost is None:
            self.lost = state
            self._drop_all(state)

    def _shard_lost(self, state: str) -> None:
        """Shard ``i > 0`` found the crawl gone: so is this worker's crawl (told once)."""
        if self.lost is None:
            self.events.crawl_lost(state)

    def _taken(self, index: int, running: set[str]) -> None:
        """Shard ``index`` marked these parent leases taken: so does the worker, by
        their ids (:func:`join_id`), which its requests carry."""
        self.taken.update(join_id(index, raw) for raw in running)

    def _drop_all(self, state: str) -> None:
        """The crawl is gone (``state``): drop every shard's writes and leases, and
        the settlements held."""
        self._held = []
        for shard in self.shards:
            shard.drop(state)

    # -- open ------------------------------------------------------------------------

    def check_eviction_policy(self, expiring: Sequence[str] = ()) -> None:
        self.main.check_eviction_policy(expiring)
        for shard in self.others:
            shard.check_eviction_policy()

    def check_shards(self, count: int) -> None:
        """Make sure the crawl was started with ``count`` shards, recording it if it
        has no count (shard 0's ``<crawl>:shards``, :meth:`Frontier.check_shards`)."""
        self.main.check_shards(count)

    def join_epoch(self, *, shards_checked: bool = False) -> str:
        """Join the epoch of every shard (a worker that flushes at start and finds
        shard 0 flushed flushes the others too, once the shard count is checked), and
        open their dupefilters; clear :attr:`lost`."""
        if not self.main.epoch:
            if not shards_checked:
                self.check_shards(self.shard_count)
            if self.flush_on_start and not self.client.exists(self.keys.epoch):
                for shard in self.others:
                    shard.delete_keys()
        epoch = self.main.join_epoch(shards_checked=True)
        for shard in self.others:
            shard.join_epoch()
            self._opened(shard.index)
        self.lost = None
        return epoch

    def delete_keys(self, *also: str) -> None:
        self.main.delete_keys(*also)
        for shard in self.others:
            shard.delete_keys()

    # -- writes ----------------------------------------------------------------------

    def refuses(self, parent: str = "", writes: int = 1) -> bool:
        """Whether these writes are dropped here (see :meth:`Frontier.refuses`)."""
        if self.lost is not None:
            if writes:
                self.stats.inc_value("scheduler/crawl_lost/dropped_writes", writes)
            return True
        return self.main.refuses(parent, writes)

    def _filter(self, index: int, backend: FilterBackend | None) -> FilterBackend | None:
        if backend is None or index == 0:
            return backend
        return self._opened(index)

    def _opened(self, index: int) -> DupefilterBackend | None:
        """Shard ``index``'s dupefilter backend, opened on first use."""
        found = self._filters.get(index)
        if found is None:  # not opened yet (opened when the crawl is joined)
            unopened = self._unopened.get(index)
            if unopened is None:
                return None
            found = self._filters[index] = unopened.open()
        return found

    def by_filter(
        self, backend: DupefilterBackend, requests: Sequence[Request]
    ) -> list[tuple[DupefilterBackend, list[Request]]]:
        groups: dict[int, list[Request]] = {}
        for request in requests:
            groups.setdefault(shard_of(host_of(request), self.shard_count), []).append(request)
        out = []
        for index, group in sorted(groups.items()):
            found = backend if index == 0 else self._opened(index)
            if found is not None:
                out.append((found, group))
        return out

    def enqueue(
        self,
        item: tuple[bytes, float | str, bytes],
        dupefilter: FilterBackend | None,
        on_reply: Callable[[bool], None],
        parent: str = "",
        host: str = "",
    ) -> None:
        """Add a request to the outbox of its host's shard (see :meth:`Frontier.enqueue`;
        its parent lease fences it only when the parent is in the same shard)."""
        if self.refuses(parent):
            return
        index = shard_of(host, self.shard_count)
        origin, raw = split_id(parent)
        self._adds[index] += 1
        target = self.shard(index)
        target.place(
            item, self._filter(index, dupefilter), on_reply, raw if origin == index else ""
        )

    def settle(self, outcomes: Sequence[tuple[str, str]]) -> None:
        """Hold settlements until every other shard confirmed the requests added before
        them, then add them to their shard's outbox (see the module docstring)."""
        if self.refuses(writes=len(outcomes)):
            return
        groups: dict[int, list[tuple[str, str]]] = {}
        for lease_id, outcome in outcomes:
            index, raw = split_id(lease_id)
            if index >= self.shard_count:  # not a lease of this crawl's shards
                continue
            groups.setdefault(index, []).append((raw, outcome))
        mark = list(self._adds)
        for index, group in groups.items():
            self._held.append((mark, index, group))
        self._release()
        if self.eager and outcomes:
            self.flush()

    def _confirmed(self, index: int) -> int:
        """Requests of shard ``index`` Redis has confirmed (or that left its outbox for
        good): the outbox confirms them in order, so these are the first ones added."""
        return self._adds[index] - self.shard(index).outbox.pending_items

    def _release(self) -> None:
        """Move held settlements whose other shards confirmed their requests to their
        own shard's outbox."""
        keep = []
        confirmed = [self._confirmed(i) for i in range(self.shard_count)]
        for mark, index, group in self._held:
            if all(confirmed[j] >= mark[j] for j in range(self.shard_count) if j != index):
                self.shard(index).outbox.add_settlements(group)
            else:
                keep.append((mark, index, group))
        self._held = keep

    def flush(self, *, reserve: int = 0, seeds: bool | SeedQueue = False) -> list[Lease] | None:
        """Send every shard's pending writes (and the settlements they release), then
        lease up to ``reserve`` requests from the shards in turn (seeds: from shard 0).

        Returns:
            As :meth:`Frontier.flush`; ``None`` when no shard could be asked.
        """
        if self.lost is not None:
            return None
        self.main.rejoin_if_finished(reserve, pending=self.pending_writes)
        reserving = reserve > 0 and seeds is False
        ask = self._reserve_order() if reserving else [0]
        for index, shard in enumerate(self.shards):  # the first asked carries its own writes
            if index != ask[0] and shard.pending_writes:
                self._release()
                shard.flush()
                if self.lost is not None:
                    return None
        self._release()
        if not reserving:
            leases = self.main.flush(reserve=reserve, seeds=seeds)
            self._release()
            return leases
        return self._reserve_in_turn(reserve, ask)

    def _reserve_order(self) -> list[int]:
        """The shards to ask for requests, in turn from the one after the last that had
        some, skipping those found empty in the last :data:`EMPTY_SKIP` seconds (if all
        were, the one found empty longest ago)."""
        n = self.shard_count
        now = time.monotonic()
        order = [(self._next + k) % n for k in range(n)]
        ask = [i for i in order if now - self._empty_at[i] >= EMPTY_SKIP]
        return ask or [min(order, key=lambda i: self._empty_at[i])]

    def _reserve_in_turn(self, count: int, ask: list[int]) -> list[Lease] | None:
        """Lease from the first shard of ``ask`` that has requests (each asked also
        sends its pending writes)."""
        answered = False
        for index in ask:
            got = self.shard(index).flush(reserve=count)
            self._release()
            if self.lost is not None:
                return None
            if got is None:  # that shard is unreachable or refuses: ask the next
                continue
            answered = True
            if got:
                self._next = (index + 1) % self.shard_count
                return [lease._replace(id=join_id(index, lease.id)) for lease in got]
            self._empty_at[index] = time.monotonic()
        return [] if answered else None

    def reserve(self, count: int, *, seeds: bool | SeedQueue = False) -> list[Lease]:
        """Send pending writes and lease up to ``count`` requests from the shards in
        turn (or seeds, from shard 0); see :meth:`Frontier.reserve`."""
        leases = self.flush(reserve=count, seeds=seeds)
        if leases == [] and seeds is False:
            self.main.trip.found_empty()
        return leases or []

    def call(self, func: Callable[[], Any]) -> Any:
        """Send every shard's pending writes, then run one call now on shard 0's
        client (see :meth:`Frontier.call`)."""
        if self.flush() is None:
            return None
        return self.main.trip.run(func)

    def renew(self, lease_ids: Sequence[str]) -> list[str] | None:
        """Renew leases in each shard holding some (one call per such shard; shard 0's
        after every shard's pending writes).

        Returns:
            The ids of leases no longer held, or ``None`` if a shard could not be asked.
        """
        groups: dict[int, list[str]] = {}
        for lease_id in lease_ids:
            index, raw = split_id(lease_id)
            if index < self.shard_count:
                groups.setdefault(index, []).append(raw)
        lost: list[str] = []
        failed = False
        for index, raws in sorted(groups.items()):
            if index == 0 and self.flush() is None:
                failed = True
                continue
            reply = self.shard(index).renew(raws)
            if reply is None:
                failed = True
            else:
                lost += [join_id(index, raw) for raw in reply]
        return None if failed else lost

    # -- reads ----------------------------------------------------------------------

    def others_census(self) -> OtherShards | None:
        """What shards ``1..N-1`` hold and counted, together (one call each), or
        ``None`` if one cannot be read (unreachable, refusing, or its crawl gone)."""
        busy = done = dead = retried = 0
        for shard in self.others:
            counted = shard.census()
            if counted is None:
                return None
            busy, done = busy + counted.busy, done + counted.done
            dead, retried = dead + counted.dead, retried + counted.retried
        return OtherShards(busy, done, dead, retried)

    def progress(
        self,
        *,
        grace: float,
        clear: bool,
        keep_for: float = FINISHED_RECORD_TTL,
    ) -> Progress | None:
        """Where the crawl stands across every shard (see :meth:`Frontier.progress`):
        ``None`` if a shard cannot be read. A finished crawl that does not persist
        deletes every shard's keys, their progress hashes too: their counters were
        added to shard 0's when it was marked finished (``lua/progress.lua``), so what
        is left is shard 0's record of the whole crawl, read alone by ``status`` once
        ``<crawl>:shards`` is gone, and never a count a later run would take for its
        own."""
        if self.lost is not None:
            return None
        counted = self.others_census()
        if counted is None or self.flush() is None:
            return None
        progress = self.main.progress(grace=grace, clear=clear, keep_for=keep_for, others=counted)
        if progress is not None and progress.state == "finished" and clear:
            deleted = [shard.call(shard.delete_shard) for shard in self.others]  # each tried
            if all(deleted):
                self.call(self._others_deleted)
        return progress

    def _others_deleted(self) -> None:
        """The other shards' progress hashes are gone, their counters in shard 0's
        (``lua/progress.lua``): they count from 0 again (``others_base``), in shard 0's
        progress hash if it still exists (it may have expired: none is created)."""
        key = self.keys.progress

        def forget(pipe: redis.client.Pipeline) -> None:
            if pipe.type(key) in (b"hash", "hash"):
                pipe.multi()
                pipe.hset(key, "others_base", 0)

        self.client.transaction(forget, key)

    def held_elsewhere(self) -> Elsewhere | None:
        """The leases other workers hold in every shard, their heartbeats, and the
        requests queued in every shard (see :meth:`Frontier.held_elsewhere`)."""
        shards = [(shard.client, shard.keys) for shard in self.shards]

        def read() -> Elsewhere:
            return read_elsewhere(self.client, self.keys, shards, self.worker_id, self.queue)

        return cast("Elsewhere | None", self.call(read))

    def totals(self) -> dict[str, int]:
        """The crawl-wide counters, every shard's added (see :meth:`Frontier.totals`)."""
        self.flush()
        totals = self.main.totals()
        for shard in self.others:
            for name, value in shard.totals().items():
                totals[name] = totals.get(name, 0) + value
        return totals


# -- reading a sharded crawl (the command line, status, metrics) -----------------------------


def shard_count(client: redis.Redis, keys: RedisKeys) -> int:
    """The shard count a crawl's workers recorded (``<crawl>:shards``; 1 if none, or if
    that key holds something else, such as junk or a count above ``MAX_SHARDS``)."""
    try:
        raw = client.get(keys.shards)
    except redis.ResponseError:  # WRONGTYPE: not a sharded crawl's count
        return 1
    return 1 if raw is None else recorded_shards(raw) or 1


def shard_client(client: redis.Redis, keys: RedisKeys) -> redis.Redis:
    """A client for a shard's keys: under Cluster one pinned to its slot's owner, else
    ``client`` itself."""
    if isinstance(client, ClusterClient):
        return client.for_slot(crawl_slot(keys))
    return client


def other_shards(
    client: redis.Redis, keys: RedisKeys, config: KeysConfig, configured: int = 1
) -> list[tuple[redis.Redis, RedisKeys]]:
    """Shards ``1..N-1`` of a crawl (none for a one-shard crawl), each with a client for
    its keys, N read from the crawl's ``<crawl>:shards`` (one round trip), or when it
    records none, ``configured`` (the reader's ``SCHEDULER_SHARDS``): a crawl that does
    not persist deletes that record when it finishes, and its other shards may still
    hold dead letters (and keys set aside) for the command line to show and reset."""
    count = shard_count(client, keys)
    every = shard_keys(keys, config, configured if count == 1 else count)
    return [(shard_client(client, k), k) for k in every[1:]]
