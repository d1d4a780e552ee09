"""The lease client: the calls by which one worker takes, keeps and gives back entries.

Taking a request or a seed moves it into the worker's holding, ``<crawl>:holders:<worker>``,
and gives every lease the worker holds one deadline in ``<crawl>:holders``
(``lua/reserve.lua``, ``lua/_leases.lua``). The worker renews its leases (``lua/renew.lua``) and
settles each one when Scrapy is done with it (``lua/settle.lua``): acknowledged
(:data:`DONE`), returned for another try with the failure's reason, dead-lettered at
once (:data:`DEAD_NOW` with a record, :data:`DEAD_BECAUSE` with a reason), or handed
back untouched at shutdown (:data:`HAND_BACK`).
Leases whose worker died expire and return to the queue with their delivery count;
past ``SCHEDULER_MAX_DELIVERIES`` they go to the dead-letter list. Leases granted by a
call whose reply was lost are handed back (``lua/release.lua``).

:class:`LeaseClient` builds these calls (through :class:`~scrapy_dist.scripts.Scripts`)
and reads their replies, and so tracks the leases it grants until they are settled; the
:class:`~scrapy_dist.frontier.core.Frontier` sends the calls (through its outbox, or at
once) and keeps the crawl's epoch that fences them.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import redis

from scrapy_dist.exceptions import ConfigurationError
from scrapy_dist.frontier.registry import previous_version_running
from scrapy_dist.frontier.wire import (
    ENTRY_ID_LEN,
    FROM_QUEUE,
    FROM_SEEDS,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Sequence

    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.queue import RedisQueue
    from scrapy_dist.scripts import ScriptCall, Scripts
    from scrapy_dist.seeds import SeedQueue

__all__ = [
    "RECLAIM_LIMIT",
    "Held",
    "Lease",
    "LeaseClient",
    "held_by_others",
    "refuse_beside_previous",
]

logger = logging.getLogger(__name__)

#: Expired leases reclaimed per reserve call, at most.
RECLAIM_LIMIT = 100


def refuse_beside_previous(
    client: redis.Redis,
    keys: RedisKeys,
    worker_id: str,
    lease_timeout: float,
    alive: Callable[[], list[str]],
) -> None:
    """Refuse to start beside a running worker of the previous version: it writes its
    leases to ``<crawl>:leases``/``<crawl>:leased``, which this version only reclaims when
    they expire, and knows nothing of this version's holdings (it could mark the crawl
    finished while they hold requests). Checked when a worker opens, before it registers.

    This worker first enters the holders zset (with an empty holding, for
    ``lease_timeout`` seconds), which no previous version writes: a running worker found
    there is of this version, so workers of this version started together do not refuse
    each other.

    Raises:
        ConfigurationError: the previous version's leases zset holds leases while
            workers of the crawl not in the holders zset are registered as running.
    """
    seconds, micros = client.time()
    client.zadd(keys.holders, {worker_id: seconds + micros / 1e6 + lease_timeout})
    held = int(client.zcard(keys.leases))
    if not held:
        return
    running = alive()
    if running:
        scores = client.zmscore(keys.holders, running)
        running = [w for w, score in zip(running, scores, strict=True) if score is None]
    if running:
        raise ConfigurationError(
            f"Redis key {keys.leases!r} holds {held} lease(s) a previous version of "
            "scrapy_dist granted, and "
            + previous_version_running(running, "it takes their leases back as they expire")
        )


class Held(NamedTuple):
    """The leases one worker holds, as another worker sees them (:func:`held_by_others`)."""

    #: How many.
    leases: int
    #: Their deadline (server time, seconds): a killed worker's return to the queue
    #: once it passes and a reserve takes them back.
    until: float


def held_by_others(client: redis.Redis, keys: RedisKeys, skip: Collection[str]) -> dict[str, Held]:
    """The leases held in ``keys``'s holdings by workers not in ``skip``, by worker (a
    worker holding none is left out). A holders zset or a holding of another type
    (written by hand) holds none: a reserve sets it aside when it expires. Two round
    trips."""
    try:
        holders = cast(
            "list[tuple[bytes, float]]", client.zrange(keys.holders, 0, -1, withscores=True)
        )
    except redis.ResponseError:
        return {}
    # (a member written by hand may not be UTF-8: its holding is named by its bytes)
    others = [(w, deadline) for w, deadline in holders if w.decode(errors="replace") not in skip]
    if not others:
        return {}
    prefix = keys.holding("").encode()
    with client.pipeline(transaction=False) as pipe:
        for worker, _ in others:
            pipe.hlen(prefix + worker)
        sizes = pipe.execute(raise_on_error=False)
    return {
        worker.decode(errors="replace"): Held(size, deadline)
        for (worker, deadline), size in zip(others, sizes, strict=True)
        if isinstance(size, int) and size > 0
    }


class Lease(NamedTuple):
    """An entry this worker holds: its lease id, how often it was delivered, its data
    (a request payload, or a raw seed)."""

    id: str
    deliveries: int
    data: bytes


class LeaseClient:
    """The lease calls of one worker on one crawl.

    Args:
        scripts: the scripts bound to the crawl's client.
        keys: the crawl's keys.
        queue: the request queue (its :attr:`~scrapy_dist.queue.RedisQueue.take` and
            ``put_back`` commands are the scripts').
        seeds: the crawl's seeds key, where a seed handed back or failed returns.
        worker_id: this worker's id, recorded in its leases.
        lease_timeout: seconds a lease lasts without renewal.
        max_deliveries: deliveries of one entry before it is dead-lettered.
        stats: returns the crawler's stats collector.
    """

    def __init__(
        self,
        scripts: Scripts,
        keys: RedisKeys,
        queue: RedisQueue,
        seeds: SeedQueue,
        *,
        worker_id: str,
        lease_timeout: float,
        max_deliveries: int,
        stats: Callable[[], StatsCollector],
    ) -> None:
        self._scripts = scripts
        self.keys = keys
        self.queue = queue
        self.seeds = seeds
        self.worker_id = worker_id
        self.lease_timeout = lease_timeout
        self.max_deliveries = max_deliveries
        self._stats = stats
        #: The ids of the leases this client received, until Redis answers their
        #: settlement or a renewal finds them taken back (buffered, in Scrapy's engine,
        #: or settled in the outbox): what a release never hands back.
        self.held: set[str] = set()
        #: A reply was lost: Redis may have leased entries this worker never received.
        self.reply_lost = False
        #: Leases this worker was found no longer to hold (a renewal found them taken
        #: back, or Redis refused the requests their callbacks produced) while their
        #: requests may still be in its engine: those are not settled, and what their
        #: callbacks produce is dropped. Cleared by :meth:`settled_locally`.
        self.taken: set[str] = set()
        #: When the first slot of a queue per slot that waits for its delay is ready
        #: (monotonic seconds), as the last reserve of requests that got less than it
        #: asked said; ``None``: no such slot, or the last reserve got all it asked.
        self.slot_ready_at: float | None = None

    @property
    def holding(self) -> str:
        """This worker's holding: the hash of the leases it holds."""
        return self.keys.holding(self.worker_id)

    # -- reserve ----------------------------------------------------------------------

    def reserve_call(self, count: int, epoch: str, seeds: SeedQueue | None = None) -> ScriptCall:
        """Lease up to ``count`` requests, or seeds of ``seeds`` (reclaiming expired
        leases first); read the reply with :meth:`leases`."""
        k = self.keys
        return self._scripts.reserve(
            holders=k.holders,
            holding=self.holding,
            deliveries=k.deliveries,
            dead=k.dead,
            queue=self.queue.key,
            seeds=(self.seeds if seeds is None else seeds).key,
            seq=k.seq,
            progress=k.progress,
            epoch_key=k.epoch,
            previous=(k.leases, k.leased),
            origin=FROM_QUEUE if seeds is None else FROM_SEEDS,
            take=self.queue.take if seeds is None else seeds.take,
            queue_put_back=self.queue.put_back,
            seeds_put_back=self.seeds.put_back,
            count=count,
            duration=self.lease_timeout,
            worker=self.worker_id,
            max_deliveries=self.max_deliveries,
            reclaim_limit=RECLAIM_LIMIT,
            epoch=epoch,
            take_args=self.queue.take_args() if seeds is None else (),
            take_keys=self.queue.take_keys(k) if seeds is None else (),
        )

    def leases(self, reply: Any, *, seeds: bool) -> list[Lease]:
        """The leases in a reserve's reply (a request's data is its payload, without
        the entry id), now :attr:`held`. A reply that ends with one element more (one
        more than a multiple of three) names how many expired leases of silent workers
        the call put back: said once, and counted as ``scheduler/leases/reclaimed``.
        Two more (a queue per slot): that count, then the ms until its first waiting
        slot is ready (:attr:`slot_ready_at`)."""
        out = []
        end = len(reply) - len(reply) % 3
        if end < len(reply) and int(reply[end]):
            self._reclaimed(int(reply[end]))
        self.slot_ready_at = (
            time.monotonic() + int(reply[end + 1]) / 1000 if len(reply) - end == 2 else None
        )
        for i in range(0, end, 3):
            entry: bytes = reply[i + 2]
            data = entry if seeds else entry[ENTRY_ID_LEN:]
            out.append(Lease(reply[i].decode(), int(reply[i + 1]), data))
        self.held.update(lease.id for lease in out)
        return out

    def _reclaimed(self, n: int) -> None:
        """A reserve of this worker put back ``n`` expired leases (a worker went silent,
        or this one let its own lapse): say so, and count them."""
        self._stats().inc_value("scheduler/leases/reclaimed", n)
        logger.info(
            "Took back %(n)d expired lease(s) of a silent worker: their requests went back "
            "to the queue and their pages will be crawled again",
            {"n": n},
        )

    def forget(self, lease_ids: Iterable[str]) -> None:
        """These leases are no longer this worker's (settled, or taken back)."""
        self.held.difference_update(lease_ids)

    def forget_all(self) -> None:
        """The crawl is gone, and every lease with it."""
        self.held.clear()
        self.taken.clear()
        self.reply_lost = False

    def settled_locally(self, lease_ids: Iterable[str]) -> list[str]:
        """The requests of these leases left the engine: those :attr:`taken` over are
        forgotten (nothing to settle).

        Returns:
            The ids of the leases to settle (those not taken over).
        """
        keep = []
        for lease_id in lease_ids:
            if lease_id in self.taken:
                self.taken.discard(lease_id)
            else:
                keep.append(lease_id)
        return keep

    # -- settle -----------------------------------------------------------------------

    def settle_call(self, outcomes: Sequence[tuple[str, str]], epoch: str) -> ScriptCall:
        """Settle ``(lease id, outcome)`` pairs; read the reply with :meth:`settled`."""
        k = self.keys
        return self._scripts.settle(
            holding=self.holding,
            deliveries=k.deliveries,
            dead=k.dead,
            queue=self.queue.key,
            seeds=self.seeds.key,
            progress=k.progress,
            epoch_key=k.epoch,
            worker=self.worker_id,
            queue_put_back=self.queue.put_back,
            seeds_put_back=self.seeds.put_back,
            max_deliveries=self.max_deliveries,
            epoch=epoch,
            outcomes=outcomes,
        )

    def settled(self, reply: Any, outcomes: Sequence[tuple[str, str]]) -> None:
        """Note a settlement's reply: these leases are no longer held; count them in
        the stats, and warn about leases lost meanwhile."""
        self.forget(lease_id for lease_id, _ in outcomes)
        done, retried, dead, handed, lost = (int(x) for x in reply)
        stats = self._stats()
        for name, n in (
            ("acked", done),
            ("retried", retried),
            ("dead", dead),
            ("handed_back", handed),
            ("lease_lost", lost),
        ):
            if n:
                stats.inc_value(f"scheduler/leases/{name}", n)
        if lost:
            logger.warning(
                "%(n)d lease(s) had expired and were taken back before this worker settled "
                "them (raise SCHEDULER_LEASE_TIMEOUT if requests take that long): those "
                "requests may be crawled twice",
                {"n": lost},
            )

    # -- renew ------------------------------------------------------------------------

    def renew_call(self, lease_ids: Sequence[str], epoch: str) -> ScriptCall:
        """Extend the deadline of this worker's leases, and ask which of ``lease_ids`` it
        no longer holds; read the reply with :meth:`renewed`."""
        k = self.keys
        return self._scripts.renew(
            holders=k.holders,
            holding=self.holding,
            epoch_key=k.epoch,
            worker=self.worker_id,
            duration=self.lease_timeout,
            epoch=epoch,
            lease_ids=lease_ids,
        )

    def renewed(self, reply: Any) -> list[str]:
        """The ids of the leases a renewal found taken back (counted in the stats, and
        no longer held)."""
        lost = [i.decode() if isinstance(i, bytes) else str(i) for i in reply]
        self.forget(lost)
        if lost:
            self._stats().inc_value("scheduler/leases/lost_on_renew", len(lost))
        return lost

    # -- release ----------------------------------------------------------------------

    def release_call(self, epoch: str) -> ScriptCall:
        """Hand back this worker's leases that it does not know it holds (not
        :attr:`held`: granted by a call whose reply was lost). Read the reply with
        :meth:`released`."""
        k = self.keys
        return self._scripts.release(
            holding=self.holding,
            deliveries=k.deliveries,
            queue=self.queue.key,
            seeds=self.seeds.key,
            epoch_key=k.epoch,
            dead=k.dead,
            progress=k.progress,
            queue_put_back=self.queue.put_back,
            seeds_put_back=self.seeds.put_back,
            epoch=epoch,
            worker=self.worker_id,
            known=self.held,
        )

    def released(self, reply: Any) -> None:
        """Note a release's reply: the reply loss is dealt with (log and count)."""
        self.reply_lost = False
        released = int(reply)
        if released:
            logger.info(
                "Handed back %(n)d request(s) or seed(s) leased by a call whose reply was "
                "lost with the connection",
                {"n": released},
            )
            self._stats().inc_value("scheduler/leases/released_unknown", released)
