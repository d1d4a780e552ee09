"""The round trip: one flush builds one pipeline, sends it, and hands each reply to the
part that owns it.

A :class:`Trip` belongs to one :class:`~scrapy_dist.frontier.core.Frontier`, which
builds it in its constructor and hands it the parts it sends for: the outbox (enqueues
and settlements, :mod:`scrapy_dist.frontier.outbox`), the lease client (reserves,
:mod:`scrapy_dist.frontier.leases`) and the replication (``WAIT``,
:mod:`scrapy_dist.frontier.replication`). Its contract:

- **One route down**: :meth:`Trip.flush` (on this thread) or :meth:`Trip.flush_later`
  (on the I/O thread, :mod:`scrapy_dist.frontier.background`) prepares the calls in
  order (enqueue, ``WAIT``, settle, reserve, the riders' reads) and sends them in one
  pipeline through the outbox. At most one flush is in flight; every synchronous flush
  first lands it (:meth:`Trip.land`).
- **One route up**: the pipeline's answers come back as one typed result,
  :class:`Landing` (one field per call of :class:`Calls`), and
  :meth:`Trip._hand_over` hands each to the part that owns it: the outbox learns what
  was queued, filtered or refused (and the frontier which parents' leases were taken
  over), the replication what the ``WAIT`` confirmed, the lease client what was
  settled or leased, a carried read its reply. A whole pipeline that failed puts its
  batch back in the outbox (an outage, with its backoff). A fenced reply (the crawl's
  epoch is gone) is the frontier's to judge (:meth:`Owner.gone`).
- The trip never changes the frontier's state; it reads the epoch joined and whether
  the crawl is lost (:class:`Owner`), and tells it what a reply means.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

import redis

from scrapy_dist.frontier.background import IOThread, call_from_thread
from scrapy_dist.frontier.outbox import UNREACHABLE, Batch, Command, Outbox, refusal
from scrapy_dist.scripts import Fence

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.frontier.events import FrontierEvents, Read
    from scrapy_dist.frontier.leases import Lease, LeaseClient
    from scrapy_dist.frontier.replication import Replication
    from scrapy_dist.keys import RedisKeys
    from scrapy_dist.scripts import ScriptCall
    from scrapy_dist.seeds import SeedQueue

__all__ = ["Owner", "Trip"]

logger = logging.getLogger(__name__)


class Owner(Protocol):
    """What a :class:`Trip` reads of the frontier that owns it, and tells it."""

    #: The crawl's epoch the worker joined (every script is fenced by it).
    epoch: str
    #: Why the crawl is gone, or ``None`` while it is there.
    lost: str | None

    def gone(self, error: BaseException) -> bool:
        """Whether ``error`` is a refusal of another epoch (then the crawl is gone)."""
        ...

    def rejoin_if_finished(self, reserve: int) -> None:
        """Join a new run's epoch before new work, if the crawl was seen finished."""
        ...

    def taken_over(self, refused: dict[str, int]) -> set[str]:
        """Redis refused the requests of these parent leases (id -> how many)."""
        ...


class Calls(NamedTuple):
    """The calls of one flush, in pipeline order: the enqueue, the ``WAIT`` that
    confirms it on replicas, the settlements (with the outcomes they carry), the
    reserve (of seeds or requests), then the reads other parts have carried. Each is
    ``None`` (or empty) when the flush does not send it."""

    enqueue: ScriptCall | None = None
    wait: Command | None = None
    settle: ScriptCall | None = None
    outcomes: Sequence[tuple[str, str]] = ()
    reserve: ScriptCall | None = None
    seeds: bool = False
    reads: Sequence[Read] = ()

    def __bool__(self) -> bool:
        return any(c is not None for c in (self.enqueue, self.settle, self.reserve)) or bool(
            self.reads
        )

    def pipeline(self) -> list[ScriptCall | Command]:
        """What the pipeline sends, in order."""
        first = [self.enqueue, self.wait, self.settle, self.reserve]
        return [c for c in first if c is not None] + [read.command for read in self.reads]


class Landing(NamedTuple):
    """What one flush brought back, by call (see :class:`Calls`): each the reply, the
    exception that call answered with, or ``None`` when it was not sent. The trip
    hands each to the part that owns it (:meth:`Trip._hand_over`): the enqueue's flags
    to the outbox (queued, filtered, or refused because the parent's lease was taken
    over), the ``WAIT`` to the replication, the settlement's counts and the reserve's
    leases to the lease client, each read to the part that carried it."""

    enqueued: Any = None
    waited: Any = None
    settled: Any = None
    reserved: Any = None
    reads: Sequence[Any] = ()

    @classmethod
    def of(cls, calls: Calls, answers: list[Any]) -> Landing:
        """The answers of ``calls``' pipeline, one per call in order, by call."""
        it = iter(answers)
        return cls(
            enqueued=None if calls.enqueue is None else next(it),
            waited=None if calls.wait is None else next(it),
            settled=None if calls.settle is None else next(it),
            reserved=None if calls.reserve is None else next(it),
            reads=tuple(it),
        )


class _Gone(Exception):
    """A fenced answer: the crawl is gone, nothing more of the flush is handed over."""


class _Prepared(NamedTuple):
    """A flush ready to send: its calls, the outbox's batch they carry, and how many
    entries its reserve asks for."""

    calls: Calls
    batch: Batch
    reserve: int


class _Flight(NamedTuple):
    """A flush sent by the I/O thread (:mod:`scrapy_dist.frontier.background`), not yet applied."""

    prepared: _Prepared
    future: Future[Any]
    #: Gets the leases its reserve brought (empty: none), when it asked for any.
    then: Callable[[list[Lease]], None] | None


class Trip:
    """One frontier's round trips to Redis (see the module docstring).

    Args:
        owner: the frontier that owns it: its epoch, whether its crawl is lost, and
            what a fenced reply or a refused child means for it.
        keys: the frontier's keys (its epoch key fences every call).
        outbox: the frontier's writes, which each flush takes its batch from.
        leases: the frontier's lease client, which builds its settle and reserve
            calls and reads their replies.
        seeds: the crawl's seeds key (a reserve of seeds with ``seeds=True``).
        worker_id: this worker's id (names its I/O thread).
        stats: returns the crawler's stats collector.
        events: the frontier's events: each flush carries the reads due
            (:meth:`FrontierEvents.reads`), and a flush in flight that was applied is
            told (:meth:`FrontierEvents.flush_landed`).
        replication: replica confirmations and master checks (``None``: none).
    """

    def __init__(
        self,
        owner: Owner,
        keys: RedisKeys,
        outbox: Outbox,
        leases: LeaseClient,
        seeds: SeedQueue,
        *,
        worker_id: str,
        stats: Callable[[], StatsCollector],
        events: FrontierEvents,
        replication: Replication | None = None,
    ) -> None:
        self._owner = owner
        self._events = events
        self._keys = keys
        self._outbox = outbox
        self._leases = leases
        self._seeds = seeds
        self._worker_id = worker_id
        self._get_stats = stats
        self._replication = replication
        #: When a reserve of requests last found the queue empty (and nothing was
        #: pending); monotonic seconds; ``-inf`` once enqueues were sent since.
        self.found_empty_at = -math.inf
        self._io: IOThread | None = None
        #: The flush the I/O thread sends, until its reply is applied (at most one).
        self._flight: _Flight | None = None

    @property
    def stats(self) -> StatsCollector:
        """The crawler's stats collector."""
        return self._get_stats()

    def found_empty(self) -> None:
        """A reserve of requests found nothing to lease (noted in :attr:`found_empty_at`)."""
        self.found_empty_at = time.monotonic()

    # -- one call now ---------------------------------------------------------------

    def run(self, func: Callable[[], Any]) -> Any:
        """Run one read or write now, on this thread, noting Redis failures
        (unreachable, or refusing for now) for the backoff.

        Returns:
            What ``func`` returned, or ``None`` when Redis is unreachable or refuses,
            or the crawl is gone.

        Raises:
            redis.RedisError: an error that is neither an outage nor a refusal.
        """
        done, result = self._now(func)
        if not done:
            return None
        self._outbox.recovered()
        self.stats.inc_value("scheduler/redis/round_trips")
        self.stats.inc_value("scheduler/redis/round_trips/call")
        return result

    def _now(self, func: Callable[[], Any]) -> tuple[bool, Any]:
        """Run one call now: ``(True, its result)``, or ``(False, None)`` when Redis is
        unreachable or refuses (noted for the backoff) or the crawl is gone.

        Raises:
            redis.RedisError: an error that is neither an outage nor a refusal.
        """
        try:
            return True, func()
        except UNREACHABLE as e:
            self._outbox.failed(e)
        except redis.exceptions.ResponseError as e:
            if self._owner.gone(e):
                return False, None
            if refusal(e) is None:
                raise
            self._outbox.failed(e)
        return False, None

    # -- one flush ------------------------------------------------------------------

    def flush(self, *, reserve: int = 0, seeds: bool | SeedQueue = False) -> list[Lease] | None:
        """Send pending enqueues, then settlements whose requests are confirmed, then
        (if ``reserve``) lease up to that many requests or seeds: one round trip, on
        this thread, after the flush in flight (if any) has landed (:meth:`land`).

        Args:
            reserve: how many entries to lease (0: none).
            seeds: lease seeds rather than requests: ``True`` from the crawl's seeds
                key, or from this seed queue.

        Returns:
            The new leases (empty if none were asked for or there are none), or
            ``None`` if Redis is unreachable or refuses (the writes stay pending), or
            the crawl is lost.
        """
        self.land()
        prepared = self._prepare(reserve, seeds=seeds)
        if not isinstance(prepared, _Prepared):
            return prepared
        try:
            answers = self._outbox.send(prepared.calls.pipeline())
        except redis.RedisError as e:  # whatever it is, the work stays in the outbox
            return self._apply(prepared, seeds, None, e)
        except BaseException:
            self._outbox.landed()
            self._outbox.restore(prepared.batch)
            raise
        return self._apply(prepared, seeds, answers, None)

    # -- flushes off the reactor thread (scrapy_dist.frontier.background) -----------

    @property
    def flying(self) -> bool:
        """Whether a flush is in flight (sent by the I/O thread, reply not applied)."""
        return self._flight is not None

    @property
    def reserving(self) -> int:
        """Entries the reserve of the flush in flight may bring (0: none in flight):
        room this worker counts as held until it lands."""
        return 0 if self._flight is None else self._flight.prepared.reserve

    def flush_later(
        self, *, reserve: int = 0, then: Callable[[list[Lease]], None] | None = None
    ) -> None:
        """Start a flush (as :meth:`flush`, of requests only) on the I/O thread, unless
        one is in flight already or there is nothing to send; its reply is applied on
        the reactor thread when it arrives, or by :meth:`land`, whichever comes first.
        Until then its batch is in flight (:attr:`Outbox.flying`): not resent, not
        confirmed, its settlements' leases still held, and settlements added meanwhile
        wait behind its enqueues. Call only where the reactor runs.

        Args:
            reserve: how many requests to lease (0: none).
            then: gets the leases the reserve brought (empty: none or no reply), on
                the reactor thread, when ``reserve`` is asked.
        """
        if self._flight is not None:
            return
        prepared = self._prepare(reserve, seeds=False)
        if not isinstance(prepared, _Prepared):
            if then is not None and reserve and prepared is not None:
                then(prepared)
            return
        if self._io is None:
            self._io = IOThread(f"scrapy-dist-io-{self._worker_id}")
        calls = prepared.calls.pipeline()
        outbox = self._outbox
        future = self._io.submit(lambda: outbox.send(calls))
        flight = self._flight = _Flight(prepared, future, then)
        self.stats.inc_value("scheduler/redis/background_flushes")
        future.add_done_callback(lambda _: call_from_thread(lambda: self._arrived(flight)))

    def land(self, timeout: float = 60.0) -> None:
        """Wait for the flush in flight (if any) and apply its reply now, on this
        thread; a flush not answered within ``timeout`` seconds is taken as a lost
        reply (its writes go back to the outbox, and leases its reserve may have
        brought are handed back later: :meth:`_release_unknown`)."""
        flight = self._flight
        if flight is None:
            return
        self.stats.inc_value("scheduler/redis/flush_waited")
        done, _ = wait([flight.future], timeout)
        if not done:
            self._landed(flight, redis.TimeoutError(f"no reply within {timeout:g}s"))
            return
        self._landed(flight)

    def stop_io(self) -> None:
        """Land the flush in flight, if any, and end the I/O thread (at close; a later
        :meth:`flush_later` starts it again)."""
        self.land()
        if self._io is not None:
            self._io.stop()

    def _arrived(self, flight: _Flight) -> None:
        """The I/O thread's reply to ``flight``, on the reactor thread: applied unless
        :meth:`land` did it first; an error applying it is logged and counted as the
        timer's (the reactor must not see it)."""
        try:
            self._landed(flight)
        except Exception:
            self.stats.inc_value("scheduler/timer/errors")
            logger.exception("Scheduler timer: applying a flush's reply failed")

    def _landed(self, flight: _Flight, error: Exception | None = None) -> None:
        """Apply the reply of ``flight`` (once: a later call for it does nothing)."""
        if self._flight is not flight:
            return
        self._flight = None
        answers: list[Any] | None = None
        if error is None:
            error = cast("Exception | None", flight.future.exception())
            if error is None:
                answers = flight.future.result()
        leases = self._apply(flight.prepared, False, answers, error)
        if flight.then is not None and flight.prepared.reserve:
            if leases == []:
                self.found_empty()
            flight.then(leases or [])
        self._events.flush_landed()

    # -- one flush, in three steps ----------------------------------------------------

    def _prepare(self, reserve: int, *, seeds: bool | SeedQueue) -> _Prepared | list[Lease] | None:
        """Everything before a flush's round trip: the calls, the batch taken out of
        the outbox (now :attr:`Outbox.flying`).

        Returns:
            What to send, or the flush's result when nothing is sent (``[]``: nothing
            to send; ``None``: the crawl is lost, or Redis within a backoff).
        """
        owner = self._owner
        if owner.lost is not None:
            return None
        outbox = self._outbox
        owner.rejoin_if_finished(reserve)
        outbox.promote()  # nothing unconfirmed before them any more?
        if self._leases.reply_lost and outbox.can_try():
            self._release_unknown()
            if owner.lost is not None:
                return None
        replication = self._replication
        if replication is not None and replication.due(outbox):
            gone = replication.check(outbox, self._keys.epoch, owner.epoch)
            if gone is not None and owner.gone(gone):  # the master changed, the crawl went
                return None
        calls = self._calls(reserve, seeds=seeds)
        if not calls:
            return []
        if not outbox.can_try():
            return None
        return _Prepared(calls, outbox.take(), reserve)

    def _apply(
        self,
        prepared: _Prepared,
        seeds: bool | SeedQueue,
        answers: list[Any] | None,
        error: Exception | None,
    ) -> list[Lease] | None:
        """Everything after a flush's round trip: its batch is no longer in flight;
        hand each answer to its call, or (``error``: the pipeline failed as a whole)
        put the batch back and note the outage. Returns as :meth:`flush`."""
        outbox = self._outbox
        outbox.landed()
        calls, batch, reserve = prepared
        if self._owner.lost is not None:  # found gone meanwhile: its writes were dropped
            return None
        if error is not None or answers is None:
            outbox.restore(batch)
            lost_reserve = reserve > 0 and isinstance(error, UNREACHABLE)
            self._leases.reply_lost = self._leases.reply_lost or lost_reserve
            outbox.failed(error or redis.RedisError("no reply"))
            return None
        self.stats.inc_value("scheduler/redis/round_trips")
        kind = "flush" if not reserve else "reserve" if seeds is False else "seeds"
        self.stats.inc_value(f"scheduler/redis/round_trips/{kind}")
        leases = self._hand_over(calls, Landing.of(calls, answers), batch)
        if self._owner.lost is not None:
            return None
        outbox.promote()  # every request added before these settlements is confirmed?
        return leases

    def _calls(self, reserve: int, *, seeds: bool | SeedQueue) -> Calls:
        """The calls of one flush: enqueue (and its ``WAIT``), settle, reserve (each if
        needed), then the reads due."""
        epoch = self._owner.epoch
        fence = Fence(self._keys.epoch, epoch, self._leases.holding)
        enqueue = self._outbox.enqueue_call(fence)
        wait = None
        if enqueue is not None:
            # what a reserve found empty before these enqueues says nothing of now
            self.found_empty_at = -math.inf
            replication = self._replication
            # confirmed on replicas before the settlements behind it
            wait = replication.wait_call() if replication is not None else None
        ready = self._outbox.ready
        settle = self._leases.settle_call(ready, epoch) if ready else None
        reserve_call = None
        source = None if seeds is False else self._seeds if seeds is True else seeds
        if reserve > 0:
            reserve_call = self._leases.reserve_call(reserve, epoch, source)
        return Calls(
            enqueue=enqueue,
            wait=wait,
            settle=settle,
            outcomes=ready,
            reserve=reserve_call,
            seeds=source is not None,
            # after the writes: the enqueue stays the first call
            reads=self._events.reads(),
        )

    def _hand_over(self, calls: Calls, landing: Landing, batch: Batch) -> list[Lease] | None:
        """Hand each answer of ``landing`` to the part that owns it, in pipeline order;
        a refusal is an outage (its work goes back to the outbox), a fenced answer the
        owner's to judge (the crawl gone: nothing more is handed over).

        Returns:
            The leases the reserve brought (empty: none asked or none), or ``None`` if
            the reserve was refused or the crawl is gone.
        """
        outbox, leases = self._outbox, self._leases
        problems: list[Exception | None] = []
        got: list[Lease] | None = []
        try:
            if calls.enqueue is not None:
                problems.append(self._enqueue_landed(landing.enqueued, batch))
            if calls.wait is not None and self._replication is not None:  # replication.py
                enqueued = not isinstance(landing.enqueued, Exception)
                batch_waited = batch if enqueued else None
                problems.append(self._replication.waited(landing.waited, batch_waited, outbox))
            if calls.settle is not None:
                if isinstance(landing.settled, Exception):
                    problems.append(self._failed("settle", landing.settled, batch))
                else:
                    leases.settled(landing.settled, calls.outcomes)
            if calls.reserve is not None:
                if isinstance(landing.reserved, Exception):
                    problems.append(self._failed("reserve", landing.reserved, batch))
                    got = None
                else:
                    got = leases.leases(landing.reserved, seeds=calls.seeds)
        except _Gone:
            return None
        for read, reply in zip(calls.reads, landing.reads, strict=True):
            read.on_reply(reply)  # another part's read: its reply, or error, is its own
        problem = next((p for p in reversed(problems) if p is not None), None)
        if problem is not None:
            outbox.failed(problem)
        else:
            outbox.recovered()
        return got

    def _enqueue_landed(self, flags: Any, batch: Batch) -> Exception | None:
        """The enqueue's answer to the outbox (which requests were queued, filtered or
        refused); requests refused because this worker no longer holds their parents'
        leases make those leases taken over (:meth:`Owner.taken_over`).

        Returns:
            The outage it was, if one (see :meth:`_failed`).
        """
        if isinstance(flags, Exception):
            return self._failed("enqueue", flags, batch)
        refused = self._outbox.enqueued(flags)
        if refused:
            self._owner.taken_over(refused)
        return None

    def _failed(self, kind: str, error: Exception, batch: Batch) -> Exception | None:
        """Call ``kind`` answered ``error``: a fenced answer ends the hand-over (the
        crawl is gone, :class:`_Gone`); a refusal for now is an outage, returned for
        the backoff; anything else the outbox rejects (a rejected settlement will not
        be sent: its leases are forgotten)."""
        if self._owner.gone(error):
            raise _Gone
        if self._outbox.failed_call(kind, error, batch):
            return error
        if kind == "settle":
            self._leases.forget(lease_id for lease_id, _ in batch.ready)
        return None

    def _release_unknown(self) -> None:
        """Hand back leases Redis granted in a call whose reply never arrived (run before
        the next call, when every reply received so far has been handed over). Leases
        this worker holds anywhere (buffer, engine, outbox) are not handed back."""
        self._leases.reply_lost = False
        done, reply = self._now(self._leases.release_call(self._owner.epoch).run)
        if done:
            self._leases.released(reply)
        elif self._owner.lost is None:  # an outage: try again with the next call
            self._leases.reply_lost = True
