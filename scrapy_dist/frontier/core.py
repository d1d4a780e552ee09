"""A worker's gateway to its crawl's shared state: the epoch it joined, its writes and
leases, the crawl's progress and completion.

One :class:`Frontier` per crawler (or per shard of a sharded crawl), shared by the
scheduler and the spider (:func:`scrapy_dist.frontier.choice.frontier_for`), who use
it as a :class:`~scrapy_dist.frontier.gateway.CrawlFrontier`. It composes
the worker's :class:`~scrapy_dist.frontier.outbox.Outbox` (enqueues and settlements, sent in
order, kept through an outage), :class:`~scrapy_dist.frontier.leases.LeaseClient` (reserve,
settle, renew, release) and :class:`~scrapy_dist.frontier.trip.Trip`, which sends what they
build: one flush is one round trip that carries the pending enqueues, the settlements
they confirm and a reserve, and hands each reply back to the part that owns it.

Faults (see docs/guarantees.md, "Delivery"): every frontier script carries the
crawl's epoch (``<crawl>:epoch``, :mod:`scrapy_dist.frontier.epoch`): a crawl that finished, was
flushed or evicted refuses the write, and the frontier reports the crawl
:attr:`Frontier.lost` instead of re-creating its state.

(Over 600 lines on purpose: what is left is one concept, the worker's membership of its crawl: the
epoch joined and lost (:meth:`Frontier.gone`), the writes it accepts, and the short
methods through which the scheduler, the spider and
:class:`~scrapy_dist.frontier.shards.ShardedFrontier` (which composes one per shard)
reach the parts it composes; its constructor and :meth:`Frontier.build_one` are a
fifth of it. The round trip is :mod:`scrapy_dist.frontier.trip`, the crawl-wide reads
:mod:`scrapy_dist.frontier.progress`, the deletion of keys
:mod:`scrapy_dist.frontier.deletion`.)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from scrapy.utils.misc import load_object

from scrapy_dist.config.scheduling import check_frontier
from scrapy_dist.deadletter import DeadLetters
from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.background import reactor_running
from scrapy_dist.frontier.deletion import delete_frontier, forget_finished
from scrapy_dist.frontier.epoch import (
    FINISHED,
    REPLACED,
    VANISHED,
    fenced,
    join,
    log_gone,
    why_gone,
)
from scrapy_dist.frontier.events import FrontierEvents
from scrapy_dist.frontier.eviction import check_eviction_policy
from scrapy_dist.frontier.leases import Lease, LeaseClient
from scrapy_dist.frontier.outbox import Outbox
from scrapy_dist.frontier.progress import (
    FINISHED_RECORD_TTL,
    Elsewhere,
    Progress,
    census_call,
    census_of,
    crawl_totals,
    progress_call,
    read_counters,
    read_elsewhere,
)
from scrapy_dist.frontier.registry import new_worker_id
from scrapy_dist.frontier.replication import Replication
from scrapy_dist.frontier.trip import Trip
from scrapy_dist.queue import PriorityQueue, RedisQueue, leasable_queue, unleased_queue
from scrapy_dist.scripts import OtherShards, scripts_for
from scrapy_dist.seeds import SeedQueue
from scrapy_dist.serializers import load_serializer
from scrapy_dist.slot_queue import SlotQueue, payload_slot_of
from scrapy_dist.slots import Limits

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    import redis
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

    from scrapy_dist.config.core import Config
    from scrapy_dist.filters import DupefilterBackend, UnopenedBackend
    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.queue import FilterBackend

__all__ = [
    "FINISHED",
    "REPLACED",
    "VANISHED",
    "Frontier",
    "Lease",
    "fenced",
]

logger = logging.getLogger(__name__)


def recorded_shards(raw: object) -> int | None:
    """The shard count a ``<crawl>:shards`` value holds (``GET``'s reply), or ``None``
    if it holds no count from 1 to ``MAX_SHARDS`` (junk: never trusted, never parsed
    at any length)."""
    from scrapy_dist.config.scheduling import MAX_SHARDS

    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    if not (0 < len(text) <= len(str(MAX_SHARDS)) and text.isdigit() and text.isascii()):
        return None
    count = int(text)
    return count if 1 <= count <= MAX_SHARDS else None


def shared_filter(config: Config, client: redis.Redis, keys: RedisKeys) -> UnopenedBackend | None:
    """The backend of the crawl's shared dupefilter, if the crawl has one (scrapy_dist's
    scheduler and dupefilter; no I/O): a crawl that does not persist deletes its keys
    with the frontier's, and a spider records its seeds' fingerprints there."""
    from scrapy_dist.dupefilter import RFPDupeFilter
    from scrapy_dist.filters import backend_from_config

    try:
        df_cls = load_object(config.components.dupefilter)
    except (ImportError, NameError, ValueError):
        return None
    if not (isinstance(df_cls, type) and issubclass(df_cls, RFPDupeFilter)):
        return None
    if not config.components.dist_scheduler:
        return None
    return backend_from_config(config.dupefilter, client, keys)


class Frontier:
    """The crawl's shared state as one worker sees it: its epoch, writes, leases and
    completion.

    Args:
        client: the crawl's Redis client.
        keys: the crawl's keys.
        queue: the shared request queue.
        seeds: the crawl's seeds key (a seed handed back or failed returns there).
        worker_id: this worker's id, recorded in its leases.
        lease_timeout: seconds a lease lasts without renewal.
        max_deliveries: deliveries of one entry before it is dead-lettered.
        stats: returns the crawler's stats collector (which Scrapy creates after the
            spider, so it is looked up when first needed).
        eviction_check: what to do at open when Redis may evict frontier keys:
            ``"refuse"`` to start, ``"warn"``, or ``"off"``.
        wrongtype_timeout: seconds a queue key of the wrong type is waited for before
            the requests to enqueue into it are dead-lettered.
        eager: send every write at once instead of with the next reserve or flush tick.
        clear_keys: keys of other parts (the crawl's shared dupefilter) deleted with the
            frontier's own when a crawl that does not persist finishes.
        replication: replica confirmations and master checks (``None``: none).
        background: the scheduler's timer may send its flushes from the I/O thread
            (:meth:`flush_later`), off the reactor thread.
        shard_count: the crawl's shards (``SCHEDULER_SHARDS``,
            :mod:`scrapy_dist.frontier.shards`), which shard 0 records.
        index: the shard of its crawl whose keys ``keys`` are (0: the crawl's own keys,
            where its shard count, seeds and completion are recorded; a frontier of
            shard ``i > 0`` neither checks nor records the shard count).
        label: how log lines name this frontier's crawl (default: its keys' crawl name).
        judge: why the crawl's epoch is one found rather than the one joined (default:
            :meth:`why_gone` on this frontier's own keys); a shard ``i > 0`` is judged
            by shard 0, where its crawl's completion is recorded.
        rejoin: joins a new run of the crawl once this frontier saw it finished and
            has new work (default: :meth:`join_epoch`; shard 0 of a sharded crawl
            rejoins every shard).
        events: this frontier's events (:mod:`scrapy_dist.frontier.events`; the same
            its ``replication`` reports to), made by the caller so that the worker's
            parts can subscribe; default: new ones.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        queue: RedisQueue,
        seeds: SeedQueue,
        *,
        worker_id: str,
        lease_timeout: float,
        max_deliveries: int,
        stats: Callable[[], StatsCollector],
        eviction_check: str = "refuse",
        wrongtype_timeout: float = 300.0,
        eager: bool = False,
        clear_keys: Iterable[str] = (),
        replication: Replication | None = None,
        background: bool = False,
        shard_count: int = 1,
        index: int = 0,
        label: str = "",
        judge: Callable[[str], str] | None = None,
        rejoin: Callable[[], object] | None = None,
        events: FrontierEvents | None = None,
    ) -> None:
        check_frontier(eviction_check, lease_timeout, max_deliveries)
        if not getattr(queue, "take", None):
            raise ConfigurationError(f"{type(queue).__name__} is not a queue scrapy_dist can lease")
        self.client = client
        self.keys = keys
        self.queue = queue
        self.seeds = seeds
        self.worker_id = worker_id
        self.lease_timeout = lease_timeout
        self.max_deliveries = max_deliveries
        self._get_stats = stats
        #: Keys deleted when a crawl that does not persist finishes.
        self.clear_keys: list[str] = list(dict.fromkeys([*keys.frontier(), *clear_keys]))
        #: Send every write at once instead of with the next reserve or flush tick.
        self.eager = eager
        self._scripts = scripts_for(client)
        #: This worker's leases: the calls that take, keep and give back entries.
        self.leases = LeaseClient(
            self._scripts,
            keys,
            queue,
            seeds,
            worker_id=worker_id,
            lease_timeout=lease_timeout,
            max_deliveries=max_deliveries,
            stats=stats,
        )
        #: This worker's writes on their way to Redis.
        self.outbox = Outbox(
            client,
            self._scripts,
            queue,
            DeadLetters(client, keys.dead, worker_id),
            crawl=keys.crawl,
            stats=stats,
            wrongtype_timeout=wrongtype_timeout,
        )
        self.eviction_check = eviction_check
        #: The crawl's epoch this worker joined ("" before :meth:`open`).
        self.epoch = ""
        #: Why this worker's crawl is gone (:data:`FINISHED`, :data:`VANISHED`,
        #: :data:`REPLACED`), or ``None`` while it is there.
        self.lost: str | None = None
        #: What this frontier tells the rest of the worker (the crawl lost, leases
        #: taken over, a master changed, a flush landed) and the reads its flushes carry.
        self.events = events or FrontierEvents()
        #: This worker saw its crawl finished, holding nothing (lua/progress.lua).
        self._finished_seen = False
        #: Children confirmed on replicas, the master watched (scrapy_dist.frontier.replication).
        self.replication = replication
        #: Shards of the crawl (``SCHEDULER_SHARDS``, :mod:`scrapy_dist.frontier.shards`).
        self.shard_count = shard_count
        #: The shard of its crawl this frontier is on (0: the crawl's own keys).
        self.index = index
        #: How log lines name this frontier's crawl.
        self.crawl_label = label or keys.crawl
        self._judge = judge
        self._rejoin = rejoin
        #: The timer's flushes may go through the I/O thread (:meth:`flush_later`).
        self.background = background
        #: This frontier's round trips: each flush, and the replies it brings back.
        self.trip = Trip(
            self,
            keys,
            self.outbox,
            self.leases,
            seeds,
            worker_id=worker_id,
            stats=stats,
            events=self.events,
            replication=replication,
        )

    @classmethod
    def build_one(
        cls,
        crawler: Crawler,
        config: Config,
        client: redis.Redis,
        keys: RedisKeys,
        worker_id: str = "",
        *,
        events: FrontierEvents | None = None,
        **extra: Any,
    ) -> Self:
        """A frontier of ``keys`` on ``client`` from the crawler's settings (no I/O),
        reporting to ``events`` (default: new ones); ``extra``: more keyword arguments
        of the class (a shard's ``index``, ...)."""
        queue_cls = config.queue.cls
        requests_key = keys.requests
        if unleased_queue(queue_cls):  # that queue runs in the scheduler, unleased
            queue_cls, requests_key = PriorityQueue, keys.unleased
        queue_cls = leasable_queue(queue_cls, config.queue.path)
        # a queue per slot keeps the slots' delays itself (the spider's attributes count)
        queue_extra: dict[str, Any] = {}
        if issubclass(queue_cls, SlotQueue):
            queue_extra["limits"] = Limits.build(config.politeness, crawler.spider)
            # (built only if the queue moves a priority queue: the scheduler builds
            # its own, and pickle's warning is said once)
            queue_extra["payload_slot"] = payload_slot_of(
                lambda: load_serializer(config.requests.serializer)
            )
            queue_extra["holders"] = keys.holders
        shared = shared_filter(config, client, keys)  # its keys go with the frontier's
        events = events or FrontierEvents()
        return cls(
            client,
            keys,
            queue_cls(client, requests_key, keys.seq, order=config.queue.order, **queue_extra),
            SeedQueue(client, keys.start_urls, config.seeds.kind),
            worker_id=worker_id or new_worker_id(),
            lease_timeout=config.frontier.lease_timeout,
            max_deliveries=config.frontier.max_deliveries,
            stats=lambda: crawler.stats,
            eviction_check=config.frontier.eviction_check,
            wrongtype_timeout=config.frontier.wrongtype_timeout,
            eager=config.frontier.eager,
            background=config.frontier.background,
            # the crawl's history (lua/heartbeat.lua) and its counts per download slot
            # (scrapy_dist/worker/slot_counts.py) go with the frontier, as does the
            # crawl's shared dupefilter
            clear_keys=[
                keys.history,
                keys.slot_sent,
                keys.slot_counts,
                *([] if shared is None else shared.keys()),
            ],
            replication=Replication(
                client,
                replicas=config.replication.wait_replicas,
                timeout=config.replication.wait_timeout,
                crawl=keys.crawl,
                stats=lambda: crawler.stats,
                events=events,
            ),
            events=events,
            **extra,
        )

    @property
    def stats(self) -> StatsCollector:
        """The crawler's stats collector."""
        return self._get_stats()

    # -- connectivity ---------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        """``False`` while Redis is known to be unreachable (since the last failure)."""
        return self.outbox.reachable

    @property
    def pending_writes(self) -> int:
        """Requests to enqueue and leases to settle not yet sent to Redis."""
        return self.outbox.pending_writes

    @property
    def pending_settlements(self) -> int:
        """Leases settled by this worker but not yet sent to Redis (still held)."""
        return self.outbox.pending_settlements

    def settlements_after_flush(self) -> int:
        """Settlements still unsent after the next flush: those queued behind requests
        Redis has not confirmed yet (the others are sent in that flush, before its
        reserve). A sharded crawl counts only this shard's as sent."""
        self.outbox.promote()  # as the flush itself does first
        return max(0, self.pending_settlements - len(self.outbox.ready))

    def call(self, func: Callable[[], Any]) -> Any:
        """Send pending writes, then run one read or write now, noting Redis failures
        (unreachable, or refusing for now) for the backoff.

        Returns:
            What ``func`` returned, or ``None`` when Redis is unreachable or refuses
            (now or still within the backoff pause), or the crawl is :attr:`lost`.

        Raises:
            redis.RedisError: an error that is neither an outage nor a refusal.
        """
        if self.flush() is None:
            return None
        return self.trip.run(func)

    # -- the crawl's epoch ------------------------------------------------------------

    def check_eviction_policy(self, expiring: Sequence[str] = ()) -> None:
        """Refuse (or warn about) a server that may evict frontier keys, as
        ``eviction_check`` says (see :func:`scrapy_dist.frontier.eviction.check_eviction_policy`).

        Raises:
            ConfigurationError: it may, and ``eviction_check`` is ``"refuse"``.
        """
        check_eviction_policy(self.client, self.eviction_check, expiring)

    def join_epoch(self, *, shards_checked: bool = False) -> str:
        """Join the crawl's epoch, creating it if the crawl has none; clear :attr:`lost`.
        At open, shard 0 first checks the crawl's shard count (:meth:`check_shards`),
        unless the caller did (``shards_checked``)."""
        if not self.epoch and self.index == 0 and not shards_checked:
            self.check_shards(self.shard_count)
        self.epoch = join(self.client, self.keys.epoch)
        self.lost = None
        if self.replication is not None:  # who the master is (scrapy_dist.frontier.replication)
            self.replication.remember(self.keys.epoch)
        return self.epoch

    def why_gone(self, found: str) -> str:
        """Why the crawl's epoch is ``found`` rather than the one joined (see
        :func:`scrapy_dist.frontier.epoch.why_gone`), as ``judge`` says if given."""
        if self._judge is not None:
            return self._judge(found)
        return why_gone(self.client, self.keys, found, self.epoch)

    def check_shards(self, count: int = 1) -> None:
        """Make sure the crawl was not started with another ``SCHEDULER_SHARDS`` (its
        ``<crawl>:shards``; a one-shard crawl never writes it); a sharded crawl records
        its count. One round trip.

        Raises:
            ConfigurationError: it was (the other shards' requests would be lost), or
                the key holds junk and this worker has shards.
        """
        key = self.keys.shards
        if count > 1:
            self.client.set(key, count, nx=True)
        raw = self.client.get(key)
        found = 1 if raw is None else recorded_shards(raw)
        if found is None and count > 1:  # (junk reads as one shard, as the CLI reads it)
            junk = cast("bytes", raw)[:40]
            raise ConfigurationError(
                f"{key} holds {junk!r}, not a shard count: run 'scrapy-dist reset' "
                f"for crawl {self.keys.crawl}, or 'redis-cli del {key}' if its "
                "workers all ran with the same SCHEDULER_SHARDS"
            )
        found = found or 1
        if found != count:
            raise ConfigurationError(
                f"crawl {self.keys.crawl} was started with SCHEDULER_SHARDS = {found}, "
                f"and this worker has {count}: its requests are spread over {found} "
                f"shard(s), so run every worker with SCHEDULER_SHARDS = {found} (or reset "
                "the crawl with 'scrapy-dist reset' to start over with another count)"
            )

    def by_filter(
        self, backend: DupefilterBackend, requests: Sequence[Request]
    ) -> list[tuple[DupefilterBackend, list[Request]]]:
        """``requests`` grouped by the dupefilter backend their fingerprints belong in
        (``backend``, the crawl's; a sharded crawl has one per shard)."""
        return [(backend, list(requests))] if requests else []

    def forget_finished(self, *, now: bool) -> None:
        """Delete what a finished crawl that does not persist keeps for its workers
        (now, or let it expire: :func:`~scrapy_dist.frontier.deletion.forget_finished`)."""
        forget_finished(self.client, self.keys, now=now)

    def delete_keys(self, *also: str) -> None:
        """Delete the crawl's frontier keys now (UNLINK: they may be large), every
        shard's in a sharded crawl, a priority queue's levels and every worker's
        holding with it, and the keys ``also``
        (:func:`~scrapy_dist.frontier.deletion.delete_frontier`)."""
        delete_frontier(self.client, self.queue, self.keys.holders, [*self.clear_keys, *also])

    def delete_shard(self) -> bool:
        """Delete the keys of this shard ``i > 0`` of a finished crawl that does not
        persist, its progress hash with them (its counters were added to shard 0's
        when the crawl was marked finished, ``lua/progress.lua``); returns ``True``."""
        self.delete_keys(self.keys.progress)
        return True

    def gone(self, error: BaseException) -> bool:
        """If ``error`` is a script's refusal of another epoch, drop this worker's writes
        (they belong to a crawl that is gone), record why and tell the listeners.

        Returns:
            Whether it was such a refusal.
        """
        found = fenced(error)
        if found is None:
            return False
        if self.lost is not None:
            return True
        state = self.why_gone(found)
        dropped = self.drop(state)
        log_gone(
            state,
            {
                "crawl": self.crawl_label,
                "key": self.keys.epoch,
                "epoch": self.epoch,
                "found": found,
                "n": dropped,
            },
        )
        self.stats.inc_value(f"scheduler/crawl_lost/{state}")
        self.events.crawl_lost(state)
        return True

    def drop(self, state: str) -> int:
        """Drop this frontier's pending writes and forget its leases: its crawl is gone
        (``state``, recorded as :attr:`lost` unless a state is already). Nothing is
        logged and no listener told (the caller's part).

        Returns:
            How many pending writes were dropped.
        """
        dropped = self.outbox.drop()
        self.leases.forget_all()
        if self.lost is None:
            self.lost = state
        return dropped

    # -- writes (the outbox) ----------------------------------------------------------

    @property
    def taken(self) -> set[str]:
        """Leases this worker was found no longer to hold while their requests were
        still in the engine (:attr:`LeaseClient.taken`): their requests' children are
        refused here, and they are not settled. The worker's deliveries mark and unmark
        them in this set."""
        return self.leases.taken

    def refuses(self, parent: str = "", writes: int = 1) -> bool:
        """Whether ``writes`` new writes (requests of ``parent``, a lease id; or
        settlements) are dropped here, each counted: the crawl is :attr:`lost`, or
        this worker no longer holds ``parent`` (:attr:`LeaseClient.taken`)."""
        if self.lost is not None:
            if writes:
                self.stats.inc_value("scheduler/crawl_lost/dropped_writes", writes)
            return True
        if parent and parent in self.leases.taken:
            self.stats.inc_value("scheduler/leases/children_refused", writes)
            return True
        return False

    def enqueue(
        self,
        item: tuple[bytes, float | str, bytes],
        dupefilter: FilterBackend | None,
        on_reply: Callable[[bool], None],
        parent: str = "",
        host: str = "",
    ) -> None:
        """Add one ``(payload, score, fingerprint)`` item to the outbox (``host``, the
        request's, places it in a sharded crawl, :mod:`scrapy_dist.frontier.shards`).

        It is deduplicated and enqueued atomically when the outbox is flushed (with the
        next reserve, on the flush timer, when many are pending, or at once when
        ``eager``); ``on_reply`` then learns whether it was queued or filtered.
        ``parent`` is the lease id of the request whose callback produced it (``""``:
        none): if this worker no longer holds that lease when the item reaches Redis,
        Redis refuses it and the lease is :meth:`taken_over` (``on_reply`` is not
        called).
        """
        if not self.refuses(parent):
            self.place(item, dupefilter, on_reply, parent)

    def place(
        self,
        item: tuple[bytes, float | str, bytes],
        dupefilter: FilterBackend | None,
        on_reply: Callable[[bool], None],
        parent: str = "",
    ) -> None:
        """Place one item in this frontier's own outbox, as :meth:`enqueue` does once
        it accepted it (``parent``: a lease id of this frontier's keys, or ``""``), and
        flush when the outbox is full or writes are ``eager``."""
        if self.outbox.add(item, dupefilter, on_reply, parent) or self.eager:
            self.flush()

    def settle(self, outcomes: Sequence[tuple[str, str]]) -> None:
        """Add lease settlements to the outbox: ``(lease id, outcome)`` with outcome
        ``DONE``, ``HAND_BACK``, ``DEAD_NOW`` + a dead-letter record, ``DEAD_BECAUSE`` +
        a reason (the held entry dead-lettered with it; the four are
        :mod:`scrapy_dist.frontier.wire`'s), or a failure reason.

        A settlement is sent only once Redis has confirmed the enqueue of every request
        added before it (a pipeline runs its calls whatever the previous one answered,
        so an acknowledgement sent with a refused enqueue would outlive the children it
        vouches for): with the same flush when nothing is pending before it, else with
        the next one."""
        if self.refuses(writes=len(outcomes)):
            return
        self.outbox.add_settlements(outcomes)
        if self.eager and outcomes:
            self.flush()

    def flush(self, *, reserve: int = 0, seeds: bool | SeedQueue = False) -> list[Lease] | None:
        """Send pending enqueues, then settlements whose requests are confirmed, then
        (if ``reserve``) lease up to that many requests or seeds: one round trip
        (:meth:`Trip.flush`).

        Returns:
            The new leases (empty if none were asked for or there are none), or
            ``None`` if Redis is unreachable or refuses (the writes stay pending), or
            the crawl is :attr:`lost`.
        """
        return self.trip.flush(reserve=reserve, seeds=seeds)

    def rejoin_if_finished(self, reserve: int, pending: int | None = None) -> None:
        """This worker saw its crawl finish (and its keys go): new work (pending writes,
        ``pending`` if given, else this frontier's; or a reserve of ``reserve``
        entries) joins the new run's epoch (``rejoin``)."""
        pending = self.pending_writes if pending is None else pending
        if self._finished_seen and (pending or reserve):
            self._finished_seen = False
            if self._rejoin is not None:
                self._rejoin()
            else:
                self.join_epoch()

    # -- flushes off the reactor thread (the trip's, scrapy_dist.frontier.background) --

    def can_flush_later(self) -> bool:
        """Whether :meth:`flush_later` sends from the I/O thread: ``background`` is on,
        writes are not ``eager``, and the reactor runs (the reply lands on it)."""
        return self.background and not self.eager and reactor_running()

    def flush_later(
        self, *, reserve: int = 0, then: Callable[[list[Lease]], None] | None = None
    ) -> None:
        """Start a flush on the I/O thread (:meth:`Trip.flush_later`); call only where
        :meth:`can_flush_later`."""
        self.trip.flush_later(reserve=reserve, then=then)

    def land(self, timeout: float = 60.0) -> None:
        """Apply the flush in flight (if any) now (:meth:`Trip.land`)."""
        self.trip.land(timeout)

    def stop_io(self) -> None:
        """Land the flush in flight and end the I/O thread (:meth:`Trip.stop_io`)."""
        self.trip.stop_io()

    @property
    def flying(self) -> bool:
        """Whether a flush is in flight (:attr:`Trip.flying`)."""
        return self.trip.flying

    @property
    def reserving(self) -> int:
        """Entries the flush in flight may bring (:attr:`Trip.reserving`): room this
        worker counts as held until it lands."""
        return self.trip.reserving

    @property
    def found_empty_at(self) -> float:
        """When a reserve of requests last found the queue empty
        (:attr:`Trip.found_empty_at`)."""
        return self.trip.found_empty_at

    @property
    def slot_ready_at(self) -> float | None:
        """When a slot of a queue per slot that waits for its delay is ready
        (:attr:`LeaseClient.slot_ready_at`)."""
        return self.leases.slot_ready_at

    def taken_over(self, refused: dict[str, int]) -> set[str]:
        """Redis refused the requests of these parent leases (id -> how many requests):
        this worker was paused past its lease and another holds them, or will. Log it
        once, count it, and drop what this worker holds for those parents (their
        pending settlements; their requests still in the engine are not settled, and
        their later requests are dropped here, see :attr:`LeaseClient.taken`).

        Returns:
            The parents marked taken: those whose settlement was not pending (their
            requests may still be in the engine). A parent whose settlement was
            pending left the engine: marked, it would stay marked, and the next
            delivery of its entry to this worker (same lease id) would never be
            settled, but kept leased by this worker's renewals.
        """
        ids = set(refused)
        self.leases.forget(ids)
        settled = self.outbox.drop_settlements(ids)
        running = ids.difference(settled)
        self.leases.taken.update(running)
        dropped = len(settled)
        n = sum(refused.values())
        logger.warning(
            "Redis refused %(n)d request(s) produced by %(m)d page(s) whose leases this "
            "worker no longer holds (it was paused, e.g. a stopped process, a long GC or a "
            "network partition, for longer than SCHEDULER_LEASE_TIMEOUT, and they were "
            "taken over): dropped them and %(dropped)d pending settlement(s); the pages' "
            "new holders crawl them",
            {"n": n, "m": len(ids), "dropped": dropped},
        )
        self.stats.inc_value("scheduler/leases/children_refused", n)
        self.stats.inc_value("scheduler/leases/taken_over", len(ids))
        self.events.leases_taken(running)
        return running

    # -- reads ----------------------------------------------------------------------

    def reserve(self, count: int, *, seeds: bool | SeedQueue = False) -> list[Lease]:
        """Send pending writes and lease up to ``count`` requests (or seeds: ``True``
        from the crawl's seeds key, or from this seed queue), reclaiming expired leases
        first; one round trip.

        Returns:
            The leases, in queue order; empty when there is nothing or Redis is
            unreachable.
        """
        leases = self.flush(reserve=count, seeds=seeds)
        if leases == [] and seeds is False:
            self.trip.found_empty()
        return leases or []

    def renew(self, lease_ids: Sequence[str]) -> list[str] | None:
        """Extend the deadlines of these leases in one call.

        Returns:
            The ids of the leases this worker no longer holds (they expired and were
            taken back), or ``None`` if Redis is unreachable or refuses.
        """
        if not lease_ids:
            return []
        call = self.leases.renew_call(lease_ids, self.epoch)
        reply = self.call(call.run)
        if reply is None:
            return None
        return self.leases.renewed(reply)

    def progress(
        self,
        *,
        grace: float,
        clear: bool,
        keep_for: float = FINISHED_RECORD_TTL,
        others: OtherShards | None = None,
    ) -> Progress | None:
        """Where the crawl as a whole stands; marks it finished after ``grace`` seconds of
        emptiness and then, with ``clear``, deletes the frontier (exactly once).
        ``others`` (a sharded crawl): what the other shards hold and have counted (with
        ``clear``, their counters join this shard's when it finishes).

        Returns:
            The progress (:func:`~scrapy_dist.frontier.progress.progress_call`), or
            ``None`` if Redis is unreachable.
        """
        call = progress_call(
            self._scripts,
            self.keys,
            self.queue,
            self.seeds,
            clear_keys=self.clear_keys,
            epoch=self.epoch,
            grace=grace,
            clear=clear,
            keep_for=keep_for,
            others=others,
        )
        reply = self.call(call.run)
        if reply is None:
            return None
        progress = Progress.of(reply)
        if progress.state == "finished":
            self._finished_seen = True
        return progress

    @property
    def shards(self) -> list[Frontier]:
        """The frontiers of the crawl's shards: this one alone (see
        :class:`~scrapy_dist.frontier.shards.ShardedFrontier`)."""
        return [self]

    def census(self) -> OtherShards | None:
        """What this frontier's keys hold and counted (``lua/census.lua``, fenced; one
        round trip): a shard's part of its crawl's progress (:meth:`progress`).

        Returns:
            Its entries queued or leased and its counters, or ``None`` if Redis is
            unreachable, refuses, or the crawl is gone.
        """
        call = census_call(self._scripts, self.keys, self.queue, self.epoch)
        reply = self.call(call.run)
        return None if reply is None else census_of(reply)

    def held_elsewhere(self) -> Elsewhere | None:
        """The leases other workers hold, in every shard, their heartbeats, and the
        requests queued (:func:`~scrapy_dist.frontier.progress.read_elsewhere`).

        Returns:
            What was read, or ``None`` if Redis is unreachable.
        """
        shards = [(shard.client, shard.keys) for shard in self.shards]

        def read() -> Elsewhere:
            return read_elsewhere(self.client, self.keys, shards, self.worker_id, self.queue)

        return cast("Elsewhere | None", self.call(read))

    def totals(self) -> dict[str, int]:
        """The crawl-wide counters (``done``, ``retried``, ``dead``); one written by hand
        reads as 0, a progress key of another type as none
        (:func:`~scrapy_dist.frontier.progress.crawl_totals`)."""
        key = self.keys.progress
        raw = self.call(lambda: read_counters(self.client, key))
        return crawl_totals(cast("dict[bytes, bytes] | Exception | None", raw), key)
