"""The requests this worker holds, from their lease to its settlement.

A request leased from the crawl's queue is *buffered* here until Scrapy's engine asks
for it, then *out* (in the engine) until it has left the engine: its download, its
callback or errback, and the processing of everything they returned are complete (the
engine's requests in progress, :func:`scrapy_dist.worker.engine.in_flight`). Only then is
its lease *settled*: acknowledged (also when its callback raised, as on Scrapy's
scheduler: ``SCHEDULER_CALLBACK_ERRORS = "done"``), or, when its callback raised,
returned for another try with the error as its reason (``"retry"``) or dead-lettered
at once with it (``"dead"``). A worker holds at most ``max_held`` leases
(buffered, out, or settled but not yet sent), which bounds what a dead or paused
worker makes others crawl again.

Requests that cannot be stored in Redis are kept here too, in memory
(:class:`~scrapy_dist.worker.local.LocalRequests`), and handed to the engine before leased
ones; the leases of the pages they came from (their *anchors*) are settled only once
they have left the engine (:meth:`Deliveries.keep_local`).

:class:`Deliveries` does no Redis I/O of its own: leases, settlements and renewals go
through the :class:`~scrapy_dist.frontier.core.Frontier`, which sends them in batches.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from scrapy_dist.exceptions import SerializationError
from scrapy_dist.frontier.wire import DEAD_BECAUSE, DEAD_NOW, DONE, HAND_BACK
from scrapy_dist.worker.batch import BatchSize
from scrapy_dist.worker.local import LocalRequests

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable

    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.frontier.gateway import CrawlFrontier
    from scrapy_dist.frontier.leases import Lease

logger = logging.getLogger(__name__)

#: Longest failure reason kept with a request (dead-letter records stay readable).
REASON_MAX = 500
#: What a reason must not start with: the marks of the other outcomes of a settlement
#: (an exception class named ``"!Boom"`` made its request a dead letter without it).
OUTCOME_MARKS = (DEAD_NOW, DEAD_BECAUSE, HAND_BACK)
#: ``SCHEDULER_CALLBACK_ERRORS``: a request whose callback raised is done (acknowledged).
CALLBACK_DONE = "done"
#: ``SCHEDULER_CALLBACK_ERRORS``: a request whose callback raised goes back to the queue.
RETRY = "retry"
#: ``SCHEDULER_CALLBACK_ERRORS``: a request whose callback raised is dead-lettered at once.
DEAD = "dead"
#: What follows the error in the reason of a request dead-lettered at once.
DEAD_SUFFIX = " (its callback raised; not retried: SCHEDULER_CALLBACK_ERRORS = 'dead')"


class Deliveries:
    """The leases this worker holds and when each is settled.

    Args:
        frontier: the crawl's frontier, through which leases are taken and settled.
        in_flight: returns the requests the engine is still working on.
        stats: the crawler's stats collector.
        prefetch: requests leased per call, at least (an engine that holds this many
            can wait for a top-up, :mod:`scrapy_dist.worker.refill`).
        max_held: leases this worker may hold at once (see the module docstring).
        batch: the size of each reserve, from ``prefetch`` up as the engine's demand
            grows (:mod:`scrapy_dist.worker.batch`; default: always ``prefetch``).
        on_empty: forgets what this worker knows of the crawl's dupefilter (its
            seen-cache), which a crawl that finishes deletes: called before that
            knowledge is next used (:meth:`before_lookup`) once a settlement (or a
            hand-back of the start horizon) left this worker holding nothing (the
            crawl may then finish), unless a reserve under the same epoch brought
            leases first (the crawl had not finished: Redis refuses a reserve of a
            finished crawl, whose epoch is deleted, and a worker holding leases keeps
            it from finishing).
        on_finished: called with each request that left the engine, before its lease
            is settled (cluster-wide politeness releases its download token).
        callback_errors: the settlement of a request whose callback raised:
            :data:`CALLBACK_DONE` (acknowledged, as on Scrapy's scheduler), :data:`RETRY`
            (returned for another try, up to ``SCHEDULER_MAX_DELIVERIES``) or
            :data:`DEAD` (dead-lettered at once, acknowledged).
        local: the requests kept in memory (default: Scrapy's LIFO memory queue per
            priority).
    """

    def __init__(
        self,
        frontier: CrawlFrontier,
        *,
        in_flight: Callable[[], Collection[Request]],
        stats: StatsCollector,
        prefetch: int,
        max_held: int,
        on_empty: Callable[[], None] = lambda: None,
        on_finished: Callable[[Request], None] = lambda request: None,
        callback_errors: str = CALLBACK_DONE,
        local: LocalRequests | None = None,
        batch: BatchSize | None = None,
    ) -> None:
        self.frontier = frontier
        self.callback_errors = callback_errors
        self.in_flight = in_flight
        self.stats = stats
        self.prefetch = prefetch
        self.max_held = max_held
        self.batch = batch if batch is not None else BatchSize(prefetch, prefetch)
        self.on_empty = on_empty
        #: Leased requests not yet handed to the engine.
        self.buffer: deque[tuple[Lease, Request]] = deque()
        #: Requests handed to the engine -> their lease id.
        self.out: dict[Request, str] = {}
        #: Leases granted to this worker again while a request of their earlier
        #: delivery, taken back from it, is still in the engine (its id is marked taken
        #: until it leaves, and the two deliveries share that id): held and renewed,
        #: buffered once that request has left.
        self.deferred: dict[str, list[tuple[Lease, Request]]] = {}
        #: Requests whose callback raised -> the reason.
        self.failures: dict[Request, str] = {}
        #: Whether this worker said where requests whose callback raised go (once).
        self._told_dead = False
        #: When the leases were last renewed (monotonic seconds).
        self.renewed_at = time.monotonic()
        #: Called with each request that left the engine, before its lease is settled
        #: (cluster-wide politeness releases its download token).
        self.on_finished = on_finished
        #: The crawl epoch when a settlement last left this worker holding nothing,
        #: until :attr:`on_empty` is called or a reserve under it brings leases.
        self._emptied: str | None = None
        #: Requests kept in memory, not handed to the engine yet.
        self.local = local if local is not None else LocalRequests()
        #: Their anchors (the leases of the pages they came from).
        self._anchors: dict[Request, tuple[str, ...]] = {}
        #: Requests kept in memory and handed to the engine -> their anchors.
        self.local_out: dict[Request, tuple[str, ...]] = {}
        #: Lease id -> how many requests kept in memory it anchors.
        self.anchored: dict[str, int] = {}
        #: Leases whose request left the engine while they still anchor requests kept
        #: in memory -> their settlement, sent once the last of those has left too.
        self.waiting: dict[str, str] = {}

    def held(self) -> list[str]:
        """The ids of the leases this worker holds: buffered, deferred, in the engine or
        waiting for the requests kept in memory they anchor."""
        deferred = [lease.id for waiting in self.deferred.values() for lease, _ in waiting]
        buffered = [lease.id for lease, _ in self.buffer]
        return buffered + deferred + list(self.out.values()) + list(self.waiting)

    def _deferred_count(self) -> int:
        return sum(len(waiting) for waiting in self.deferred.values())

    def room(self, *, after_flush: bool = False) -> int:
        """Leases this worker may still take (see ``max_held``); ``after_flush``: once
        the next flush sent the settlements it carries (those whose requests Redis has
        confirmed), as a reserve riding that flush sees it (they run before it). The
        leases a reserve in flight may bring count as held
        (:attr:`Frontier.reserving`)."""
        settlements = (
            self.frontier.settlements_after_flush()
            if after_flush
            else self.frontier.pending_settlements
        )
        held = len(self.buffer) + self._deferred_count() + len(self.out) + settlements
        held += len(self.waiting)
        held += self.frontier.reserving
        return self.max_held - held

    def lease_of(self, request: Request | None) -> str:
        """The lease id of ``request`` if it is in the engine as this worker's, else
        ``""`` (a start request, or a request this worker does not hold)."""
        if request is None:
            return ""
        return self.out.get(request, "")

    def record_failure(self, request: Request, reason: str) -> None:
        """Remember that ``request``'s callback failed, to settle its lease with ``reason``
        (cut to :data:`REASON_MAX` characters, a lone surrogate escaped: Redis takes
        UTF-8 only, and a settlement it cannot encode would fail every flush; one that
        starts with a mark of another outcome, :data:`OUTCOME_MARKS`, after ``"Error "``,
        so it is never read as that outcome); a request this worker does not hold is
        ignored."""
        if request in self.out:
            reason = reason[:REASON_MAX].encode("utf-8", "backslashreplace").decode()
            if reason.startswith(OUTCOME_MARKS):
                reason = "Error " + reason
            self.failures[request] = reason

    def keep_local(self, request: Request, anchors: tuple[str, ...]) -> None:
        """Keep ``request`` in memory (it cannot be stored in Redis) until the engine
        takes it (:meth:`take_local`); the leases ``anchors`` are not settled before
        it has left the engine."""
        self.local.push(request)
        self._anchors[request] = anchors
        for lease_id in anchors:
            self.anchored[lease_id] = self.anchored.get(lease_id, 0) + 1

    def take_local(self) -> Request | None:
        """The next request kept in memory, now in the engine; ``None`` if none is."""
        request = self.local.pop()
        if request is not None:
            self.local_out[request] = self._anchors.pop(request, ())
        return request

    def anchors_of(self, parent: Request | None) -> tuple[str, ...]:
        """The leases that anchor a request kept in memory whose callback's request is
        ``parent``: its lease, or the anchors of ``parent`` if it was kept in memory
        too (none if this worker does not hold it: a start request, or a lease taken
        over). With no parent known, every lease of a request in the engine (and every
        anchor of one kept in memory there): one of them is the page it came from."""
        if parent is not None:
            lease_id = self.out.get(parent)
            return (lease_id,) if lease_id else self.local_out.get(parent, ())
        anchors = list(self.out.values())
        anchors += [lease_id for held in self.local_out.values() for lease_id in held]
        return tuple(dict.fromkeys(anchors))

    def _release(self, anchors: tuple[str, ...], outcomes: list[tuple[str, str]]) -> None:
        """A request kept in memory left the engine: its anchors anchor one fewer; a
        lease that waited for it alone is settled now."""
        for lease_id in anchors:
            left = self.anchored.get(lease_id, 0) - 1
            if left > 0:
                self.anchored[lease_id] = left
                continue
            self.anchored.pop(lease_id, None)
            outcome = self.waiting.pop(lease_id, None)
            if outcome is not None:
                outcomes.append((lease_id, outcome))

    def settle(self) -> None:
        """Settle the leases of the requests the engine is done with (those that anchor
        requests kept in memory once these have left it too)."""
        if not self.out and not self.local_out:
            return
        in_flight = self.in_flight()
        finished = [request for request in self.out if request not in in_flight]
        local_done = [request for request in self.local_out if request not in in_flight]
        if not finished and not local_done:
            return
        outcomes: list[tuple[str, str]] = []
        taken = self.frontier.taken
        for request in finished:
            self.on_finished(request)
            reason = self.failures.pop(request, DONE)
            lease_id = self.out.pop(request)
            if lease_id in taken:  # another worker holds it now: nothing to settle
                taken.discard(lease_id)
                # (a delivery of it granted since to this worker is its own now)
                self.buffer.extendleft(reversed(self.deferred.pop(lease_id, [])))
                continue
            if reason:
                self.stats.inc_value("scheduler/failed_callbacks")
                if self.callback_errors == CALLBACK_DONE:
                    reason = DONE
                elif self.callback_errors == DEAD:
                    reason = self._dead_now(reason)
            if self.anchored.get(lease_id):
                self.waiting[lease_id] = reason  # a request kept in memory is its child
                continue
            outcomes.append((lease_id, reason))
        for request in local_done:
            self._release(self.local_out.pop(request), outcomes)
        self._note_if_empty()
        self.frontier.settle(outcomes)

    def _note_if_empty(self) -> None:
        """After a settlement or a hand-back: if this worker holds nothing now, the
        crawl may finish, so its seen-cache is forgotten before it is next used (see
        ``on_empty``)."""
        if not self.out and not self.buffer and not self.waiting:
            self._emptied = self.frontier.epoch
            if self.frontier.shard_count > 1:  # a reserve vouches for its own shard only
                self.before_lookup()

    def _dead_now(self, reason: str) -> str:
        """The settlement of a request whose callback raised with ``reason``, under
        ``SCHEDULER_CALLBACK_ERRORS = "dead"``: its entry dead-lettered at once with the
        reason (the first time, this worker says where it goes)."""
        if not self._told_dead:
            self._told_dead = True
            logger.info(
                "A request whose callback raised goes to %(dead)s, not back to the queue "
                "(SCHEDULER_CALLBACK_ERRORS = 'dead'); once the spider is fixed, "
                "`scrapy-dist dead requeue` puts such requests back",
                {"dead": self.frontier.keys.dead},
            )
        self.stats.inc_value("scheduler/failed_callbacks/dead")
        return DEAD_BECAUSE + reason + DEAD_SUFFIX

    def before_lookup(self) -> None:
        """Call :attr:`on_empty` if this worker held nothing since it last had it called
        and no reserve under the same epoch brought leases since (see ``on_empty``);
        run before the seen-cache is consulted."""
        if self._emptied is not None:
            self._emptied = None
            self.on_empty()

    def refill(
        self,
        decode: Callable[[bytes], Request],
        reject: Callable[[Lease, SerializationError], str],
    ) -> bool:
        """Lease up to a batch (:attr:`batch`) of requests into the buffer.

        Args:
            decode: rebuilds a request from a queue entry; raises
                :class:`~scrapy_dist.exceptions.SerializationError` if it cannot.
            reject: returns the settlement of a lease whose entry cannot be rebuilt
                (leasing then continues until one can or the queue is empty).

        Returns:
            Whether the buffer holds a request now.
        """
        if not self.buffer:
            self.frontier.land()  # the flush in flight may bring some
        while not self.buffer:
            if not self._reserve(decode, reject):
                return False
        return True

    def refill_more(
        self,
        decode: Callable[[bytes], Request],
        reject: Callable[[Lease, SerializationError], str],
    ) -> bool:
        """Lease up to a batch more requests although the buffer holds some (whose
        slots wait for cluster-wide politeness), within ``max_held``.

        Returns:
            Whether leases were added to the buffer.
        """
        buffered = len(self.buffer)
        return self._reserve(decode, reject) and len(self.buffer) > buffered

    def top_up(
        self,
        decode: Callable[[bytes], Request],
        reject: Callable[[Lease, SerializationError], str],
    ) -> int:
        """Lease more before the buffer runs dry (the scheduler's timer, with the flush
        it sends anyway): when it holds fewer than a batch (:attr:`batch`), up to two
        batches buffered, within ``max_held``; nothing when there is no room.

        Returns:
            How many requests were added to the buffer.
        """
        buffered = len(self.buffer)
        count = self.top_up_count()
        if not count:
            return 0
        self._reserve(decode, reject, count)
        self.stats.inc_value("scheduler/refill/timer")
        return len(self.buffer) - buffered

    def top_up_count(self) -> int:
        """How many requests a top-up leases (see :meth:`top_up`): 0 when the buffer
        holds a batch or more, or there is no room; always 0 with a ``prefetch`` of
        1 (a worker of ``CONCURRENT_REQUESTS`` under 4, by default): it leases one
        request when Scrapy asks for one, never ahead, so that requests come in
        Scrapy's own order (a request this worker just queued is the next it takes)."""
        buffered, size = len(self.buffer), self.batch()
        if buffered >= size or self.prefetch == 1:
            return 0
        room = self.room(after_flush=True)
        if room <= 0:
            return 0
        return min(room, 2 * size - buffered)

    def _reserve(
        self,
        decode: Callable[[bytes], Request],
        reject: Callable[[Lease, SerializationError], str],
        count: int = 0,
    ) -> bool:
        """One reserve of up to ``count`` (else a batch) requests into the buffer:
        ``False`` when there is no room or nothing was leased (the queue is empty, or
        Redis is unreachable). The settlements the same flush sends free their room
        first (after the flush in flight, if any, landed)."""
        self.frontier.land()
        room = self.room(after_flush=True)
        if room <= 0 and self.frontier.pending_settlements:
            self.frontier.flush()  # confirm the requests the acknowledgements wait for
            room = self.room(after_flush=True)
        if room <= 0:
            self.stats.inc_value("scheduler/held/full")
            return False
        leases = self.frontier.reserve(min(count or self.batch(), room))
        if not leases:
            return False
        self.add(leases, decode, reject)
        return True

    def add(
        self,
        leases: list[Lease],
        decode: Callable[[bytes], Request],
        reject: Callable[[Lease, SerializationError], str],
    ) -> int:
        """Buffer the requests of new leases (a reserve's); those that cannot be
        rebuilt are settled with ``reject``'s settlement.

        Returns:
            How many were buffered.
        """
        taken = self.frontier.taken
        started: set[str] = set()
        if taken:
            # a lease taken over and now granted to this worker again is its own once no
            # request of the earlier delivery is in the engine: settled, not skipped (a
            # worker's reserves keep every lease it holds alive: one it never settles
            # would stay leased for good). While one is, the new delivery is deferred:
            # the two share the lease id, which the mark names.
            started = {lease_id for lease_id in self.out.values() if lease_id in taken}
            taken.difference_update(lease.id for lease in leases if lease.id not in started)
        bad = []
        buffered, deferred = len(self.buffer), self._deferred_count()
        for lease in leases:
            try:
                request = decode(lease.data)
            except SerializationError as e:
                bad.append((lease.id, reject(lease, e)))
            else:
                if lease.id in started:
                    self.deferred.setdefault(lease.id, []).append((lease, request))
                else:
                    self.buffer.append((lease, request))
        self.frontier.settle(bad)
        added = len(self.buffer) - buffered + self._deferred_count() - deferred
        emptied = self._emptied
        if added and emptied and emptied == self.frontier.epoch and self.frontier.lost is None:
            self._emptied = None  # leased under the same (fenced) epoch: not finished
        return added

    def take(self) -> Request | None:
        """The next buffered request, now in the engine; ``None`` if none is buffered."""
        if not self.buffer:
            return None
        lease, request = self.buffer.popleft()
        self.out[request] = lease.id
        self.batch.took()
        return request

    def hand_back_first(self, count: int) -> None:
        """Hand the first ``count`` buffered requests back to the queue (their slots
        would not start them soon, :mod:`scrapy_dist.worker.horizon`; the crawl was
        paused), as :meth:`hand_back_at` does."""
        self.hand_back_at(range(count))

    def hand_back_at(self, indexes: Iterable[int]) -> None:
        """Hand the buffered requests at ``indexes`` back to the queue, with the next
        flush; their delivery does not count. They are settled last first: each goes
        back to the end its queue is taken from, so they come out in their order
        again."""
        chosen = set(indexes)
        handed = [(lease.id, HAND_BACK) for i, (lease, _) in enumerate(self.buffer) if i in chosen]
        self.buffer = deque(item for i, item in enumerate(self.buffer) if i not in chosen)
        self._note_if_empty()  # (as after a settlement: the crawl may finish now)
        self.frontier.settle(handed[::-1])

    def take_at(self, index: int) -> Request:
        """The buffered request at ``index`` (0: the next), now in the engine."""
        lease, request = self.buffer[index]
        del self.buffer[index]
        self.out[request] = lease.id
        self.batch.took()
        return request

    def renew(self, spider: object = None) -> None:
        """Renew the leases this worker holds; drop those taken back meanwhile (this
        worker was paused past ``SCHEDULER_LEASE_TIMEOUT``)."""
        lost = self.frontier.renew(self.held())
        if lost is None:
            return
        self.renewed_at = time.monotonic()
        if not lost:
            return
        gone = set(lost)
        buffered = len(self.buffer)
        self.buffer = deque(item for item in self.buffer if item[0].id not in gone)
        dropped = buffered - len(self.buffer)
        dropped += sum(len(self.deferred.pop(lease_id, [])) for lease_id in gone)
        for lease_id in gone:
            self.waiting.pop(lease_id, None)  # its new holder crawls its page again
        started = [request for request, lease_id in self.out.items() if lease_id in gone]
        # kept in the engine's map until they leave it, never settled: what their
        # callbacks still produce is dropped (Redis would refuse it too)
        self.frontier.taken.update(self.out[request] for request in started)
        logger.warning(
            "%(n)d lease(s) of this worker expired and were taken back (was it paused, "
            "e.g. a stopped process, a long GC or a network partition, for longer than "
            "SCHEDULER_LEASE_TIMEOUT?): dropped %(dropped)d buffered request(s); %(started)d "
            "already started are not settled and the requests they produce are dropped "
            "(their downloads may be repeated by the new holders)",
            {"n": len(lost), "dropped": dropped, "started": len(started)},
            extra={"spider": spider},
        )
        self.stats.inc_value("scheduler/leases/dropped_taken_back", dropped)

    def drop_buffered(self) -> int:
        """Forget the buffered (and deferred) leases (their crawl is gone); returns how
        many."""
        buffered = len(self.buffer) + self._deferred_count()
        self.buffer.clear()
        self.deferred.clear()
        return buffered

    def drop_all(self) -> None:
        """Forget every lease held and every request kept in memory (their crawl is
        gone, or this worker closes: nothing more to settle)."""
        self.buffer.clear()
        self.deferred.clear()
        self.out.clear()
        self.failures.clear()
        self.local.clear()
        self._anchors.clear()
        self.local_out.clear()
        self.anchored.clear()
        self.waiting.clear()

    def hand_back(self, spider: object = None) -> int:
        """Settle what the engine finished and hand back everything else held (at
        close: the engine will not start it), the leases that anchor requests kept in
        memory included (their pages are crawled again, and make those requests again);
        returns how many were handed back."""
        self.settle()
        handed = [(lease.id, HAND_BACK) for lease, _ in self.buffer]
        handed += [(lease.id, HAND_BACK) for w in self.deferred.values() for lease, _ in w]
        taken = self.frontier.taken  # another worker holds those now
        handed += [(lease_id, HAND_BACK) for lease_id in self.out.values() if lease_id not in taken]
        handed += [(lease_id, HAND_BACK) for lease_id in self.waiting if lease_id not in taken]
        left = len(self.local) + len(self.local_out)
        if left:
            logger.warning(
                "Closing with %(left)d request(s) kept in memory (they cannot be stored in "
                "Redis) not crawled; the pages they came from that this worker held go "
                "back to the queue",
                {"left": left},
                extra={"spider": spider},
            )
        self.drop_all()
        self.frontier.settle(handed)
        return len(handed)
