"""Failover safety: a worker's new requests confirmed on replicas before the
acknowledgement of the request that produced them, and a master that changed noticed.

**Confirmed on replicas.** Redis replicates asynchronously: a master that fails over
loses the writes its replicas had not received, so a parent acknowledged on it could
outlive the children it vouches for. With ``REDIS_WAIT_REPLICAS`` (by default 1 under
Sentinel or Cluster when the master has a replica), every flush that enqueues requests
sends ``WAIT <replicas> <timeout>`` right after the enqueue, in the same pipeline: the
enqueue script always writes (the epoch rewritten by ``lua/_fence.lua``), so the
``WAIT`` covers it and every write the master took before it, including those of other
workers that made some of these requests duplicates. The acknowledgements queued behind
those requests stay in the outbox until the ``WAIT`` answers with enough replicas. A
``WAIT`` that answers fewer is an outage (``NOREPLICAS``, logged and retried with the
outbox's backoff), never a silent skip: the batch goes back to the front of the outbox,
so the next attempt sends it again, on whichever server is master by then. Sending it
again is safe: the enqueue is an atomic test-and-set on the dupefilter, so requests the
master kept are not queued twice; their callers already had their answer and are not
told again.

**A master that changed.** The worker remembers the master's identity (``run_id`` and
replication id) when it joins the crawl and compares it after every outage and every
:data:`CHECK_INTERVAL` seconds (one round trip: ``INFO server``, ``INFO replication``
and the crawl's epoch). A new identity (a failover, or a restart, with or without its
data) may mean lost writes: the worker logs one line saying so, drops what assumes the
server's state (the dupefilter's seen-cache, through
:meth:`~scrapy_dist.frontier.events.FrontierEvents.master_changed`),
and sends the requests not yet confirmed again (they are still in the outbox). If the
crawl's epoch key is gone with it, the frontier reports the crawl lost
(:mod:`scrapy_dist.frontier.epoch`: the worker stops with ``frontier_lost``), never "finished".

Limits: a request confirmed on one replica is lost if the master and that replica both
fail before another replica receives it; with several replicas the failover must
promote one that confirmed it (Sentinel and Cluster promote the most up-to-date one).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import redis

from scrapy_dist.config.topology import SINGLE
from scrapy_dist.connection import describe, topology
from scrapy_dist.frontier.outbox import Command, refusal
from scrapy_dist.frontier.wire import EPOCH_REFUSAL, NO_EPOCH

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

    from scrapy_dist.frontier.events import FrontierEvents
    from scrapy_dist.frontier.outbox import Batch, Outbox

__all__ = [
    "CHECK_INTERVAL",
    "OUTAGE_CHECK_INTERVAL",
    "Identity",
    "Replication",
]

logger = logging.getLogger(__name__)

#: Seconds between checks of the master's identity while Redis answers.
CHECK_INTERVAL = 5.0
#: Seconds between checks of the master's identity during an outage (at most one per
#: attempt to reach Redis).
OUTAGE_CHECK_INTERVAL = 0.5


class Identity(NamedTuple):
    """Who the master is: its ``run_id`` (new at every start) and its replication id
    (new when it is promoted or starts without its replication history)."""

    run_id: str
    replid: str

    def __str__(self) -> str:
        return f"run_id {self.run_id[:12]}, replication id {self.replid[:12]}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def no_replicas(got: int, wanted: int, timeout: float) -> redis.exceptions.ResponseError:
    """The error a short ``WAIT`` is reported as (a ``NOREPLICAS`` refusal, an outage)."""
    return redis.exceptions.ResponseError(
        f"NOREPLICAS only {got} of {wanted} replica(s) confirmed the new requests within "
        f"{timeout:g}s (REDIS_WAIT_REPLICAS): a replica is down or lagging, or a failover "
        f"is under way; their parents are acknowledged once a replica has them"
    )


class Replication:
    """One worker's replica confirmations and its view of who the master is.

    Args:
        client: the crawl's Redis client (the node owning the crawl's keys).
        replicas: ``REDIS_WAIT_REPLICAS``: replicas to wait for, ``0`` for none, or
            ``None`` to decide from the topology and the master's replicas.
        timeout: ``REDIS_WAIT_TIMEOUT``, seconds one ``WAIT`` may block.
        crawl: the crawl's name (for log messages).
        stats: returns the crawler's stats collector.
        events: the frontier's events, told when the master changed
            (:meth:`FrontierEvents.master_changed`: drop what assumes the server's state).
        check_interval: seconds between identity checks while Redis answers.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        replicas: int | None,
        timeout: float,
        crawl: str,
        stats: Callable[[], StatsCollector],
        events: FrontierEvents,
        check_interval: float = CHECK_INTERVAL,
    ) -> None:
        self.client = client
        self.setting = replicas
        self.timeout = timeout
        self.crawl = crawl
        self._stats = stats
        self.check_interval = check_interval
        self.topology = topology(client)
        #: Replicas each ``WAIT`` asks for now (0: none is sent).
        self.replicas = replicas or 0
        self._events = events
        #: The master this worker writes to, once known.
        self.identity: Identity | None = None
        #: Requests sent whose ``WAIT`` answered short (back in the outbox).
        self.unconfirmed = 0
        #: Whether the server lets this worker read ``INFO`` (identity checks are off
        #: if it does not).
        self.checks = True
        self._next_check = 0.0
        #: Whether Redis was down at the last :meth:`due`.
        self._down = False

    # -- WAIT -------------------------------------------------------------------------

    def wait_call(self) -> Command | None:
        """The ``WAIT`` that follows a flush's enqueue, or ``None`` when off."""
        if self.replicas <= 0:
            return None
        return Command(("WAIT", self.replicas, max(1, round(self.timeout * 1000))))

    def waited(self, answer: Any, batch: Batch | None, outbox: Outbox) -> Exception | None:
        """Take a ``WAIT``'s answer for the enqueue of ``batch`` (``None``: that enqueue
        failed and is handled as such).

        Enough replicas: the batch is confirmed (the outbox may send the settlements
        behind it). Too few, or an error: the batch goes back to the front of the
        outbox (sent again with the next attempt; its callers are not told again), and
        the returned error is the outage to back off on.
        """
        if batch is None or not batch.items:
            return None
        if isinstance(answer, Exception):
            problem: Exception = answer
        else:
            got = int(answer)
            if got >= self.replicas:
                self.unconfirmed = 0
                return None
            problem = no_replicas(got, self.replicas, self.timeout)
        outbox.restore(batch._replace(replies=[_told] * len(batch.items), ready=[]))
        self.unconfirmed = len(batch.items)
        self._stats().inc_value("scheduler/redis/wait_short")
        self._next_check = 0.0  # the master may be changing: look at the next attempt
        return problem

    # -- who the master is ------------------------------------------------------------

    def due(self, outbox: Outbox) -> bool:
        """Whether to check the master's identity before the next flush: at the first
        attempt after an outage began, then at most every :data:`OUTAGE_CHECK_INTERVAL`
        seconds while it lasts, at the first flush after it ended, and every
        :attr:`check_interval` seconds otherwise. (A check during a failover may read
        the old master, demoted, while the flush that ends the outage reaches the new
        one on another connection: the flush after it looks again.)"""
        if not self.checks:
            return False
        down = not outbox.reachable
        if down != self._down:  # an outage began or ended: look at the next attempt
            self._next_check = 0.0
        self._down = down
        return outbox.can_try() and time.monotonic() >= self._next_check

    def _read(self, epoch_key: str) -> tuple[dict[str, Any], dict[str, Any], str] | None:
        """``INFO server``, ``INFO replication`` and the crawl's epoch, in one round trip
        (``None``: the server refuses ``INFO``: identity checks are turned off).

        Raises:
            redis.RedisError: the server is unreachable or refuses for now.
        """
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.info("server")
                pipe.info("replication")
                pipe.get(epoch_key)
                server, replication, epoch = pipe.execute()
        except redis.exceptions.ResponseError as e:
            if _refused_for_now(e):
                raise
            logger.warning(
                "Cannot read INFO from Redis at %(server)s (%(error)s): a failover or a "
                "restart that loses writes will not be noticed by this worker",
                {"server": describe(self.client), "error": e},
            )
            self.checks = False
            return None
        return server, replication, "" if epoch is None else _text(epoch)

    def remember(self, epoch_key: str) -> None:
        """Learn who the master is (at join), and with ``REDIS_WAIT_REPLICAS = None``
        how many replicas to wait for. An unreachable server is learnt at the next
        check."""
        self.identity = None
        try:
            read = self._read(epoch_key)
        except redis.RedisError:
            self._next_check = 0.0
            return
        if read is not None:
            self._learn(read[0], read[1], joined=True)
        self._next_check = time.monotonic() + self.check_interval

    def check(self, outbox: Outbox, epoch_key: str, epoch: str) -> Exception | None:
        """Compare the master's identity with the one remembered (see the module
        docstring). A failure to reach the server is noted as an outage in ``outbox``.

        Returns:
            When the master changed and the crawl's epoch is not ``epoch`` any more,
            the refusal a fenced script would have answered (``EPOCH <found> expected
            <epoch>``), for the frontier's "crawl gone" path; else ``None``.
        """
        try:
            read = self._read(epoch_key)
        except redis.RedisError as e:
            outbox.failed(e)
            return None
        pause = self.check_interval if outbox.reachable else OUTAGE_CHECK_INTERVAL
        self._next_check = time.monotonic() + pause
        if read is None:
            return None
        server, replication, found = read
        before = self.identity
        if not self._learn(server, replication, joined=False) or before is None:
            return None
        if self.identity == before:
            return None
        self._events.master_changed()
        self._stats().inc_value("scheduler/redis/master_changed")
        gone = found != epoch
        logger.warning(
            "The Redis master of crawl %(crawl)s changed (%(before)s -> %(after)s, now "
            "at %(server)s): a failover or a restart, which loses the writes its replicas "
            "had not received. Dropped this worker's dupefilter seen-cache; %(n)d "
            "request(s) not yet confirmed on a replica are sent again; %(epoch)s",
            {
                "crawl": self.crawl,
                "before": before,
                "after": self.identity,
                "server": describe(self.client),
                "n": self.unconfirmed,
                "epoch": (
                    f"the crawl's epoch key {epoch_key} is gone with it (see below)"
                    if gone
                    else f"the crawl's epoch {epoch} is still there"
                ),
            },
        )
        if gone:
            message = f"{EPOCH_REFUSAL} {found or NO_EPOCH} expected {epoch}"
            return redis.exceptions.ResponseError(message)
        return None

    def _learn(self, server: dict[str, Any], replication: dict[str, Any], *, joined: bool) -> bool:
        """Note the identity of a master (``False``: the server is not a master now,
        e.g. an old master being turned into a replica: its writes fail instead) and,
        with ``REDIS_WAIT_REPLICAS = None``, the replicas to wait for."""
        if _text(replication.get("role", "")) != "master":
            return False
        identity = Identity(
            _text(server.get("run_id", "")), _text(replication.get("master_replid", ""))
        )
        changed = self.identity is not None and identity != self.identity
        self.identity = identity
        has = int(replication.get("connected_slaves", 0) or 0)
        if self.setting is None:
            wanted = 1 if self.topology != SINGLE and has >= 1 else 0
            # a replica that goes away never turns WAIT off: that is an outage; a new
            # master without replicas (the old one dead) does, said in one line
            if wanted > self.replicas or joined or changed:
                if wanted < self.replicas:
                    logger.warning(
                        "The new Redis master of crawl %(crawl)s has no replica: new "
                        "requests are not confirmed on a replica until one joins",
                        {"crawl": self.crawl},
                    )
                self.replicas = wanted
        elif joined and has < self.setting:
            logger.warning(
                "REDIS_WAIT_REPLICAS is %(wanted)d but the Redis master of crawl "
                "%(crawl)s has %(has)d replica(s): acknowledgements wait until enough "
                "replicas confirm the requests",
                {"wanted": self.setting, "crawl": self.crawl, "has": has},
            )
        return True


def _told(_queued: bool) -> None:
    """The reply of a request sent again: its caller already had its answer."""


def _refused_for_now(error: redis.exceptions.ResponseError) -> bool:
    return refusal(error) is not None
